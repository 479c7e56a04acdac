"""straggler-plan: logs in, placement and tables out, in every engine's layout."""

import importlib
import importlib.util
import json
import os

import numpy as np
import pytest
from straggler.formulations import CostModel, DispatchProblem, evaluate
from straggler.proofs.engine_strategies import write_demo_dumps
from straggler.runtime.commands.plan import main
from straggler.runtime.engines import (
    read_engine_log,
    read_moe_load_balancer,
    read_sglang_init_location,
    read_vllm_state,
    write_sglang_init_location,
)
from straggler.runtime.plan import _table_split, plan
from straggler.solvers import fit_cost_model
from straggler.solvers.dispatch.calibration import write_calibration_log

# the module, not the function straggler.sim re-exports under the same name
plan_cmd = importlib.import_module("straggler.runtime.commands.plan")
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_ST = importlib.util.find_spec("safetensors") is not None
ENGINES = tuple(e for e, ok in (("sglang", HAS_TORCH), ("vllm", True), ("trtllm", HAS_ST)) if ok)
ARGS = ["--gpus", "8", "--slots", "80", "--no-progress"]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    return write_demo_dumps(tmp_path_factory.mktemp("dumps"), engines=ENGINES)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_reads_to_the_same_plan(dumps, engine, tmp_path, capsys):
    rec = dumps["recording"]
    log = read_engine_log(dumps[engine])
    np.testing.assert_array_equal(log.counts, rec["logical_counts"])
    out = tmp_path / "out"
    assert main([dumps[engine], *ARGS, "--out", str(out), "--holdout", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "planned on 8 batches, scored on 8 held-out batches" in text
    assert "vLLM balancedness" in text and "worst 4 layers" in text
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["engine"] == engine and report["meta"]["held_out"]
    # the same recording gives the same modeled figures whatever engine wrote it
    ref = getattr(test_every_engine_reads_to_the_same_plan, "ref", None)
    figures = [round(r["table_us"], 9) for r in report["layers"]]
    if ref is None:
        test_every_engine_reads_to_the_same_plan.ref = figures
    else:
        assert figures == ref


def test_written_placement_and_tables_are_consistent(dumps, tmp_path):
    for fmt in ("sglang", "vllm", "trtllm", "eplb"):
        out = tmp_path / fmt
        assert main([dumps["vllm"], *ARGS, "--out", str(out), "--format", fmt]) == 0
        tables = np.load(out / "dispatch_tables.npz")
        p2l = tables["physical_to_logical"]
        if fmt == "sglang":
            back = read_sglang_init_location(str(out / "init_expert_location.json"))
        elif fmt == "vllm":
            back = read_vllm_state([out / "eplb_state.json"])  # maps only: no loads
        elif fmt == "trtllm":
            back = read_moe_load_balancer(out / "moe_load_balancer.yaml")
        else:
            back = read_engine_log(out / "eplb_maps.json")
        np.testing.assert_array_equal(back.physical_to_logical, p2l)
    prob, l2p, cnt = tables["probabilities"], tables["logical_to_physical"], tables["logical_count"]
    assert prob.shape == l2p.shape and prob.shape[:2] == (4, 64)
    np.testing.assert_allclose(prob.sum(axis=-1), 1.0)  # every expert has a replica
    for layer in range(4):
        for e in range(64):
            slots = l2p[layer, e, : cnt[layer, e]]
            assert (p2l[layer, slots] == e).all()
            assert (prob[layer, e, cnt[layer, e] :] == 0).all()


def test_table_is_never_worse_than_even_on_its_batches(dumps):
    log = read_engine_log(dumps["vllm"])
    cost = CostModel.preset("dsv3_a_offline")
    res = plan(log, n_gpus=8, n_slots=80, cost=cost)
    for row in res["layers"]:
        cand = row["candidates_fit_us"]
        assert cand[row["table_choice"]] == min(cand.values())
        assert cand[row["table_choice"]] <= cand["even"]
        assert row["lower_bound_us"] <= row["tempo_us"] + 1e-9
        # the reported table figure is the written table applied to the batches
        assert row["table_us"] == pytest.approx(cand[row["table_choice"]])
    # recompute one layer's table figure from the written probabilities
    p2l = res["tables"]["physical_to_logical"]
    p = DispatchProblem.from_placement(log.counts[:, 2], p2l[2], 8)
    prob = res["tables"]["probabilities"][2]
    l2p, cnt = res["tables"]["logical_to_physical"][2], res["tables"]["logical_count"][2]
    q = np.zeros((64, 8))
    for e in range(64):
        for j in range(cnt[e]):
            q[e, l2p[e, j] // 10] += prob[e, j]
    ev = evaluate(p, cost, p.counts[:, :, None] * q[None])
    assert float(np.mean(ev.makespan)) == pytest.approx(res["layers"][2]["table_us"])


def test_table_split_uniform_where_no_shares():
    q = _table_split(np.array([[3.0, 1.0], [0.0, 0.0]]), np.array([0, 1, 1, 0, 1, 1]), 2)
    np.testing.assert_allclose(q, [[0.75, 0.25], [2 / 4, 2 / 4]])


def test_recorded_placement_is_kept(dumps, tmp_path):
    out = tmp_path / "o"
    args = [dumps["vllm"], "--gpus", "8", "--placement", "recorded", "--no-progress"]
    assert main([*args, "--out", str(out), "--format", "vllm"]) == 0
    rec = dumps["recording"]
    back = read_vllm_state([out / "eplb_state.json"])
    np.testing.assert_array_equal(back.physical_to_logical, rec["maps"][-1][1])
    assert main([*args, "--slots", "96"]) == 2  # disagrees with the recorded 80 slots


def test_calibration_inputs(dumps, tmp_path, capsys):
    G = np.repeat([1.0, 2, 4, 8, 16], 5)
    N = G * np.tile([1, 16, 128, 512, 2048], 5)
    t = CostModel(a=5, b=10, c=20, beta=0.05).time(G, N)
    write_calibration_log(tmp_path / "log.csv", G, N, t)
    fit_cost_model(G, N, t, bootstrap=10, rng=0).save(tmp_path / "fit.json")
    for cal in ("log.csv", "fit.json"):
        assert main([dumps["vllm"], *ARGS, "--calibration", str(tmp_path / cal), "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["meta"]["cost"]["b"] == pytest.approx(10.0)
    assert main([dumps["vllm"], *ARGS, "--calibration", str(tmp_path / "missing.json")]) == 2


def test_placement_only_and_bad_arguments(dumps, tmp_path, capsys):
    loc = write_sglang_init_location(
        tmp_path / "loc.json", physical_to_logical=dumps["recording"]["maps"][0][1]
    )
    assert main([loc, *ARGS]) == 2
    assert "a placement only" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing"), *ARGS]) == 2
    for bad in (["--gpus", "6", "--nodes", "4"], ["--holdout", "1.5"], ["--gpus", "0"]):
        with pytest.raises(SystemExit) as e:
            main([dumps["vllm"], "--gpus", "8", *bad])
        assert e.value.code == 2
    assert main([dumps["vllm"], "--gpus", "7", "--no-progress"]) == 2  # 64 slots on 7 GPUs


def test_plot_progress_and_compile_notice(dumps, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    png = tmp_path / "heat.png"
    assert main([dumps["vllm"], "--gpus", "8", "--slots", "80", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    err = capsys.readouterr().err
    assert "tempo" in err  # a progress bar (tqdm) or the plain counter

    # a first run (kernels neither compiled nor cached): one line says the references run
    monkeypatch.setattr(plan_cmd, "needs_compile", lambda: True)
    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)  # no tqdm: plain counter
    assert main([dumps["vllm"], "--gpus", "8", "--slots", "80"]) == 0
    err = capsys.readouterr().err
    assert "kernels are not compiled yet: their plain-Python references run first" in err
    assert "tempo: layer 4/4" in err
    monkeypatch.setattr(plan_cmd, "needs_compile", lambda: False)
    assert main([dumps["vllm"], "--gpus", "8", "--slots", "80", "--no-progress"]) == 0
    assert "not compiled" not in capsys.readouterr().err


@pytest.mark.skipif(not HAS_ST, reason="safetensors not installed")
def test_cross_engine_sglang_rows_follow_layer_ids(dumps, tmp_path):
    out = tmp_path / "o"
    assert main([dumps["trtllm"], *ARGS, "--out", str(out), "--format", "sglang"]) == 0
    m = read_sglang_init_location(str(out / "init_expert_location.json")).physical_to_logical
    assert m.shape == (7, 80)  # TensorRT-LLM's MoE layers 3..6 at their model index
    np.testing.assert_array_equal(m[0], np.arange(80) % 64)  # trivial rows elsewhere
    tables = np.load(out / "dispatch_tables.npz")
    np.testing.assert_array_equal(m[3:], tables["physical_to_logical"])
    assert os.path.exists(out / "report.json")


def test_plan_refuses_bad_input_by_name(dumps):
    from straggler.formulations import InvalidInputError, InvalidOptionError

    log = read_engine_log(dumps["vllm"])
    cost = CostModel.preset("dsv3_a_offline")
    cases = [
        (dict(log="x"), "'log' parameter"),
        (dict(n_gpus=0), "'n_gpus' parameter"),
        (dict(n_nodes=3), "'n_nodes' parameter"),
        (dict(n_gpus=7), "'num_replicas' parameter of rebalance_experts"),
        (dict(n_gpus=7, placement="recorded"), "'n_gpus' parameter of plan must divide the 80"),
        (dict(holdout=1.0), "'holdout' parameter"),
        (dict(cost="dsv3"), "'cost' parameter"),
        (dict(placement="recorded", n_slots=96), "'n_slots' parameter"),
    ]
    for kw, match in cases:
        args = dict(log=log, n_gpus=8, n_slots=80, cost=cost) | kw
        with pytest.raises(InvalidInputError, match=match):
            plan(args.pop("log"), **args)
    with pytest.raises(InvalidOptionError, match="'placement' parameter"):
        plan(log, n_gpus=8, cost=cost, placement="magic")
    placement_only = read_engine_log(
        '{"physical_to_logical_map": ' + json.dumps(log.physical_to_logical.tolist()) + "}"
    )
    with pytest.raises(InvalidInputError, match="recorded loads"):
        plan(placement_only, n_gpus=8, cost=cost)


def test_place_experts_placement(dumps, tmp_path):
    """``--placement place_experts``: the written placement is the one place_experts builds on
    the planning batches, with no expert twice on one GPU."""
    from straggler.solvers import place_experts

    out = tmp_path / "pe"
    args = [dumps["vllm"], *ARGS, "--placement", "place_experts", "--format", "eplb"]
    assert main([*args, "--out", str(out)]) == 0
    maps = json.loads((out / "eplb_maps.json").read_text())
    p2l = np.asarray(maps["phy2log"])
    log = read_engine_log(dumps["vllm"])
    want, _, _ = place_experts(log.counts, 80, 1, 1, 8, cost="dsv3_a_offline")
    np.testing.assert_array_equal(p2l, want)
    per_gpu = p2l.reshape(p2l.shape[0], 8, -1)
    for row in per_gpu.reshape(-1, per_gpu.shape[-1]):
        assert len(set(row.tolist())) == row.size


def test_previous_max_moves_and_the_rebalance_line(dumps, tmp_path, capsys):
    """``--previous MAP --max-moves K``: plans from the placement in force with at most K
    replicas moved per layer, and reports whether to rebalance on the held-out batches."""
    from straggler.solvers import place_experts
    from straggler.solvers.placement.place import moved_replicas

    first = tmp_path / "first"
    assert main([dumps["vllm"], *ARGS, "--out", str(first), "--format", "eplb"]) == 0
    prev_file = first / "eplb_maps.json"
    prev = np.asarray(json.loads(prev_file.read_text())["phy2log"])
    capsys.readouterr()
    out = tmp_path / "moved"
    args = [dumps["vllm"], *ARGS, "--previous", str(prev_file), "--max-moves", "3"]
    assert main([*args, "--holdout", "0.5", "--out", str(out), "--format", "eplb"]) == 0
    text = capsys.readouterr().out
    line = [x for x in text.splitlines() if x.startswith("rebalance: ")]
    assert len(line) == 1 and "held-out batches" in line[0] and "at most 3" in line[0]
    p2l = np.asarray(json.loads((out / "eplb_maps.json").read_text())["phy2log"])
    # at most 3 moved per layer besides the refills of the duplicate replicas upstream EPLB
    # (the default placement of the first run) put on one GPU
    dup = [p2l.shape[1] - len({(e, i // 10) for i, e in enumerate(row)}) for row in prev]
    assert (moved_replicas(prev, p2l) <= 3 + np.array(dup)).all()
    log = read_engine_log(dumps["vllm"])
    want = place_experts(log.counts[:8], 80, 1, 1, 8, cost="dsv3_a_offline", previous=prev,
                         max_moves=3)[0]  # fmt: skip
    np.testing.assert_array_equal(p2l, want)
    report = json.loads((out / "report.json").read_text())
    r = report["rebalance"]
    assert r["moved_replicas"] == int(moved_replicas(prev, p2l).sum())
    assert r["rebalance"] == (r["gain_us"] > 0 and r["moved_replicas"] > 0)
    # the verdict alone, for a full EPLB plan from the same placement: no move, no rebalance
    res = plan(log, n_gpus=8, n_slots=80, cost=CostModel.preset("dsv3_a_offline"),
               previous=prev)  # fmt: skip
    assert res["rebalance"]["moved_replicas"] == 0 and not res["rebalance"]["rebalance"]
    assert "no, keep the placement in force" in res["rebalance"]["line"]
    # usage errors exit 2 with one line
    for bad in (["--max-moves", "3"], ["--previous", str(prev_file), "--max-moves", "-1"],
                [*args[1:], "--placement", "recorded"]):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main([dumps["vllm"], *ARGS, *bad])
        assert e.value.code == 2
    assert main([dumps["vllm"], *ARGS, "--previous", str(tmp_path / "missing.json")]) == 2
    with pytest.raises(Exception, match="max_moves"):
        plan(log, n_gpus=8, n_slots=80, cost=CostModel.preset("dsv3_a_offline"), max_moves=2)


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_outputs_checked_before_the_work_and_usage_errors_are_one_line(
    dumps, tmp_path, capsys, monkeypatch
):
    called = []
    monkeypatch.setattr("straggler.runtime.plan.plan", lambda *a, **k: called.append(1))
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for bad in (
        ["--out", str(a_file)],
        ["--out", str(a_file / "sub")],
        ["--plot", str(tmp_path)],
        ["--plot", str(a_file / "x.png")],
    ):
        assert main([dumps["vllm"], *ARGS, *bad]) == 2
        assert "--" in _one_line(capsys.readouterr().err)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        assert main([dumps["vllm"], *ARGS, "--out", str(ro / "out")]) == 2
        assert "not writable" in _one_line(capsys.readouterr().err)
    assert called == []  # refused before any work
    for bad in (["--gpus", "x"], ["--holdout", "1.5"], ["--bogus"], ["--worst", "-1"]):
        with pytest.raises(SystemExit) as e:
            main([dumps["vllm"], "--gpus", "8", *bad])
        assert e.value.code == 2
        assert _one_line(capsys.readouterr().err).startswith("straggler-plan: error:")


def test_a_failed_write_leaves_the_output_directory_as_it_was(dumps, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.json").write_text("old")
    import straggler.runtime.plan as plan_mod

    def fail(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plan_mod.np, "savez", fail)
    assert main([dumps["vllm"], *ARGS, "--out", str(out), "--format", "vllm"]) == 2
    assert "No space left" in _one_line(capsys.readouterr().err)
    assert sorted(os.listdir(out)) == ["report.json"]
    assert (out / "report.json").read_text() == "old"
    assert main([dumps["vllm"], *ARGS, "--out", str(tmp_path / "new"), "--format", "vllm"]) == 2
    assert not (tmp_path / "new").exists()


def test_input_format_skips_detection(dumps, tmp_path, capsys):
    import shutil

    from straggler.runtime.engines import detect_format

    d = tmp_path / "mixed"
    shutil.copytree(dumps["vllm"], d)
    (d / "expert_distribution_recorder_1.0_0.pt").write_bytes(b"a stray SGLang dump")
    assert detect_format(d) == "sglang"  # detection takes the stray file
    log = read_engine_log(d, format="vllm")  # forced: the stray file is never read
    assert log.engine == "vllm" and log.has_loads
    assert main([str(d), *ARGS, "--input-format", "vllm", "--json"]) == 0


def test_absurd_slot_counts_are_refused_before_any_work(dumps, capsys):
    assert main([dumps["vllm"], "--gpus", "8", "--slots", str(10**7), "--no-progress"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "--slots" in err and "[64, 512]" in err  # 64 experts, 8 GPUs x 64 experts


def test_torch_twins_without_torch_are_refused_before_any_work(
    dumps, tmp_path, capsys, monkeypatch
):
    import importlib.util as iu

    real = iu.find_spec
    monkeypatch.setattr(
        iu, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    monkeypatch.setattr("straggler.runtime.plan.plan", lambda *a, **k: pytest.fail("ran"))
    assert main([dumps["vllm"], *ARGS, "--out", str(tmp_path / "o"), "--torch"]) == 2
    assert "--torch" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()


def test_report_says_when_tempo_ran_as_its_reference(dumps, capsys):
    """A solve time measured on the plain-Python references (kernels not compiled yet) is
    said to be one, with what gives kernel times; with the kernels, nothing is added."""
    from straggler.solvers.dispatch._backend import kernel_mode

    for mode, said in (("reference", True), ("kernel", False)):
        with kernel_mode(mode):
            assert main([dumps["vllm"], *ARGS, "--holdout", "0.5"]) == 0
        text = capsys.readouterr().out
        assert ("ran as its plain-Python reference" in text) is said, mode
        assert ("run straggler-warmup once" in text) is said, mode
