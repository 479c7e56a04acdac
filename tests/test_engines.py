"""Engine files: every format round-tripped through files written as the engine writes them,
folded through the map in force, detected, and refused cleanly when damaged."""

import importlib.util
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from straggler.formulations import InvalidInputError
from straggler.proofs.engine_strategies import (
    file_bytes_mutations,
    malformed_arrays,
    synthetic_recording,
)
from straggler.runtime.engines import (
    EngineLog,
    detect_format,
    fold_physical_counts,
    read_engine_log,
    read_eplb_maps,
    read_moe_load_balancer,
    read_sglang_init_location,
    read_sglang_recorder,
    read_trtllm_statistics,
    read_vllm_state,
    sglang_per_token_record,
    vllm_maps,
    write_eplb_maps,
    write_moe_load_balancer,
    write_sglang_detail_dump,
    write_sglang_init_location,
    write_sglang_stat_dump,
    write_trtllm_statistics,
    write_vllm_state,
)
from straggler.runtime.engines._common import save_json, save_pt
from straggler.runtime.engines._yaml import dump_yaml, parse_yaml
from straggler.solvers.placement.eplb import rebalance_experts

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_ST = importlib.util.find_spec("safetensors") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed (runtime extra)")
needs_st = pytest.mark.skipif(not HAS_ST, reason="safetensors not installed (runtime extra)")
FUZZ = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)


@pytest.fixture(scope="module")
def rec():
    return synthetic_recording(n_passes=6, seed=3)


@pytest.fixture(scope="module")
def rec_rebalanced():
    return synthetic_recording(n_passes=6, rebalance_at=3, seed=4)


# --- SGLang -------------------------------------------------------------------------------


def _write_sglang_detail(d, rec, *, per_token, last_map=None):
    P = rec["n_slots"]
    last = rec["maps"][-1][1] if last_map is None else last_map
    for r in range(rec["n_gpus"]):
        records = []
        for f in range(rec["n_passes"]):
            if per_token:
                records.append(sglang_per_token_record(f, rec["physical_ids"][f][r], P))
            else:
                records.append(
                    {"forward_pass_id": f, "global_physical_count": rec["physical_counts"][r, f]}
                )
        # ranks dump at slightly different times, as SGLang's do
        write_sglang_detail_dump(d, records, last, rank=r, timestamp=1.7e9 + 0.001 * r)


@needs_torch
@pytest.mark.parametrize("per_token", [False, True])
def test_sglang_detail_round_trip(tmp_path, rec, per_token):
    _write_sglang_detail(tmp_path, rec, per_token=per_token)
    log = read_engine_log(tmp_path)
    assert log.engine == "sglang"
    assert log.kind == ("sglang_per_token" if per_token else "sglang_per_pass")
    np.testing.assert_array_equal(log.counts, rec["logical_counts"])
    np.testing.assert_array_equal(log.physical_to_logical, rec["maps"][0][1])
    assert log.n_ranks == rec["n_gpus"] and log.n_experts == rec["n_experts"]
    assert log.batch_ids.tolist() == list(range(rec["n_passes"]))
    assert log.top_k == (rec["top_k"] if per_token else None)
    # one rank's file alone is a valid (partial) recording of that rank's tokens
    one = next(f for f in os.listdir(tmp_path) if f.endswith("_0.pt"))
    part = read_sglang_recorder(tmp_path / one)
    np.testing.assert_array_equal(part.counts, rec["rank_logical_counts"][0])


@needs_torch
def test_sglang_folds_through_the_map_in_force(tmp_path, rec_rebalanced):
    """Passes 0-2 ran under map A, 3-5 under map B; the dump keeps only B."""
    rec = rec_rebalanced
    (a_start, map_a), (b_start, map_b) = rec["maps"]
    assert not np.array_equal(map_a, map_b)
    _write_sglang_detail(tmp_path, rec, per_token=False)
    truth = rec["logical_counts"]
    folded_by_last = read_engine_log(tmp_path).counts
    np.testing.assert_array_equal(folded_by_last[3:], truth[3:])
    assert not np.array_equal(folded_by_last[:3], truth[:3])  # B misattributes A's passes
    log = read_engine_log(tmp_path, physical_to_logical={a_start: map_a, b_start: map_b})
    np.testing.assert_array_equal(log.counts, truth)
    np.testing.assert_array_equal(log.physical_to_logical, map_b)
    with pytest.raises(InvalidInputError, match="cover forward pass 0"):
        read_engine_log(tmp_path, physical_to_logical={3: map_b})


@needs_torch
def test_sglang_stat_round_trip_drops_unfilled_steps(tmp_path, rec):
    lc = np.zeros((10, rec["n_layers"], rec["n_experts"]), dtype=np.int64)
    lc[[1, 4, 5, 7, 8, 9]] = rec["logical_counts"]  # a circular buffer, partly filled
    path = write_sglang_stat_dump(tmp_path, lc, average_utilization_rate=0.75, timestamp=1.7e9)
    assert os.path.basename(path) == "expert_distribution_recorder_1700000000.0.pt"
    for where in (tmp_path, path):
        log = read_engine_log(where)
        assert log.kind == "sglang_stat"
        np.testing.assert_array_equal(log.counts, rec["logical_counts"])
        assert log.batch_ids.tolist() == [1, 4, 5, 7, 8, 9]
        assert log.extras["average_utilization_rate_over_window"] == 0.75


@needs_torch
def test_sglang_rank_disagreements_are_refused(tmp_path, rec):
    _write_sglang_detail(tmp_path, rec, per_token=False)
    os.remove(next(tmp_path / f for f in os.listdir(tmp_path) if f.endswith("_3.pt")))
    # without rank 3 the other ranks are a consistent (smaller) recording
    assert read_engine_log(tmp_path).n_ranks == 3
    # a rank-3 file of another recording (another map, one pass) does not fit in
    other = rec["maps"][0][1][:, ::-1].copy()
    write_sglang_detail_dump(
        tmp_path,
        [{"forward_pass_id": 1, "global_physical_count": rec["physical_counts"][3, 1]}],
        other,
        rank=3,
        timestamp=1.8e9,
    )
    with pytest.raises(InvalidInputError, match="ranks"):
        read_engine_log(tmp_path)
    # and the same pass of the same rank twice is refused too
    write_sglang_detail_dump(
        tmp_path,
        [{"forward_pass_id": 1, "global_physical_count": rec["physical_counts"][3, 1]}],
        other,
        rank=3,
        timestamp=1.9e9,
    )
    with pytest.raises(InvalidInputError, match="repeats forward pass 1 of rank 3"):
        read_engine_log(tmp_path)


@needs_torch
def test_sglang_per_token_counts_must_match_their_ids(tmp_path, rec):
    r = sglang_per_token_record(0, rec["physical_ids"][0][0], rec["n_slots"])
    r["global_physical_count"] = r["global_physical_count"] + 1
    # the writer refuses what its reader refuses, and writes nothing
    with pytest.raises(InvalidInputError, match="'global_physical_count' parameter"):
        write_sglang_detail_dump(tmp_path, [r], rec["maps"][0][1], rank=0)
    assert os.listdir(tmp_path) == []
    r.update(rank=0, gatherer_key="primary")
    raw = {"records": [r], "last_physical_to_logical_map": rec["maps"][0][1]}
    save_pt(raw, tmp_path / "expert_distribution_recorder_1.0_0.pt")
    with pytest.raises(InvalidInputError, match="'global_physical_count' field"):
        read_engine_log(tmp_path)


def test_sglang_init_location_forms(tmp_path, rec):
    p2l = rec["maps"][0][1]
    j = write_sglang_init_location(tmp_path / "loc.json", physical_to_logical=p2l)
    assert json.loads(open(j).read()) == {"physical_to_logical_map": p2l.tolist()}
    for arg in (j, json.dumps({"physical_to_logical_map": p2l.tolist()})):
        log = read_sglang_init_location(arg)
        assert log.kind == "sglang_init_mapping" and not log.has_loads
        np.testing.assert_array_equal(log.physical_to_logical, p2l)
    assert detect_format(j) == "sglang"
    lc = rec["logical_counts"][0]
    log = read_engine_log(json.dumps({"logical_count": lc.tolist(), "rank": 0, "x": 1}))
    np.testing.assert_array_equal(log.counts, lc[None])  # 2-D: one step, as SGLang unsqueezes
    with pytest.raises(InvalidInputError, match="only 'physical_to_logical_map'"):
        read_engine_log(json.dumps({"physical_to_logical_map": p2l.tolist(), "logical_count": 1}))
    with pytest.raises(InvalidInputError, match="trivial"):
        read_sglang_init_location("trivial")
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        read_sglang_init_location("{not json")


@needs_torch
def test_sglang_init_location_pt(tmp_path, rec):
    p2l = rec["maps"][0][1]
    pt = write_sglang_init_location(tmp_path / "loc.pt", physical_to_logical=p2l)
    import torch

    obj = torch.load(pt, weights_only=True)  # what SGLang does with it
    assert list(obj) == ["physical_to_logical_map"]
    assert obj["physical_to_logical_map"].dtype == torch.int64
    np.testing.assert_array_equal(read_engine_log(pt).physical_to_logical, p2l)
    cnt = write_sglang_init_location(tmp_path / "cnt.pt", logical_count=rec["logical_counts"])
    np.testing.assert_array_equal(read_engine_log(cnt).counts, rec["logical_counts"])


# --- vLLM ---------------------------------------------------------------------------------


def _vllm_states(rec, *, layout, step):
    """Each rank's EplbState after the passes: window rows written at a wrapping step."""
    G, P, L = rec["n_gpus"], rec["n_slots"], rec["n_layers"]
    p2l = rec["maps"][0][1]
    W = rec["n_passes"] + 2  # two unfilled rows
    per = P // G
    states = []
    for r in range(G):
        win = np.zeros((W, L, per if layout == "local" else P), dtype=np.int64)
        for f in range(rec["n_passes"]):
            row = (step + f) % W
            if layout == "local":  # the first vLLM versions: tokens received by local slots
                win[row] = rec["physical_counts"][:, f, :, r * per : (r + 1) * per].sum(axis=0)
            else:  # later ones: the rank's own tokens on every slot
                win[row] = rec["physical_counts"][r, f]
        state = dict(vllm_maps(p2l, rec["n_experts"]))
        state.update(
            expert_load_window=win,
            expert_load_pass=np.zeros(win.shape[1:], dtype=np.int64),
            expert_load_window_step=(step + rec["n_passes"]) % W,
        )
        states.append(state)
    return states


@pytest.mark.parametrize("ext", [".json", ".pt", ".safetensors"])
@pytest.mark.parametrize("layout", ["local", "global"])
def test_vllm_round_trip(tmp_path, rec, ext, layout):
    if ext == ".pt" and not HAS_TORCH or ext == ".safetensors" and not HAS_ST:
        pytest.skip("optional backend missing")
    for r, st_ in enumerate(_vllm_states(rec, layout=layout, step=5)):
        write_vllm_state(tmp_path / f"eplb_state_rank{r}{ext}", st_)
    assert detect_format(tmp_path) == "vllm"
    log = read_engine_log(tmp_path)
    assert log.kind == "vllm_state" and log.n_ranks == rec["n_gpus"]
    assert log.extras["load_layout"] == layout
    np.testing.assert_array_equal(log.counts, rec["logical_counts"])  # in time order
    np.testing.assert_array_equal(log.physical_to_logical, rec["maps"][0][1])


def test_vllm_maps_must_agree(tmp_path, rec):
    states = _vllm_states(rec, layout="local", step=0)
    bad = dict(states[1])
    bad["physical_to_logical_map"] = bad["physical_to_logical_map"][:, ::-1].copy()
    # the writer refuses maps its reader refuses (and writes nothing) ...
    with pytest.raises(InvalidInputError, match="'logical_to_physical_map' parameter"):
        write_vllm_state(tmp_path / "s_rank1.json", bad)
    assert not os.path.exists(tmp_path / "s_rank1.json")
    # ... and the reader refuses them in a file written otherwise
    for r, st_ in enumerate(states):
        save_json(bad if r == 1 else st_, tmp_path / f"s_rank{r}.json")
    with pytest.raises(InvalidInputError, match="logical_to_physical_map|rank 0's map"):
        read_vllm_state(tmp_path)
    os.remove(tmp_path / "s_rank1.json")
    with pytest.raises(InvalidInputError, match="one per rank"):
        read_vllm_state(tmp_path)
    l2p = dict(states[0])
    l2p["logical_replica_count"] = l2p["logical_replica_count"] + 1
    with pytest.raises(InvalidInputError, match="'logical_replica_count' parameter"):
        write_vllm_state(tmp_path / "x_rank0.json", l2p)
    save_json(l2p, tmp_path / "x_rank0.json")
    with pytest.raises(InvalidInputError, match="'logical_replica_count' field"):
        read_vllm_state([tmp_path / "x_rank0.json"])


def test_vllm_maps_layout():
    m = vllm_maps([[0, 1, 2, 3, 0, 1], [0, 2, 0, 1, 0, 3]], 4, width=None)
    assert m["logical_to_physical_map"].shape == (2, 4, 3)  # num_redundant_experts + 1
    wide = vllm_maps([[0, 1, 2, 3, 0, 1], [0, 2, 0, 1, 0, 3]], 4)["logical_to_physical_map"]
    assert wide.shape == (2, 4, 1024) and (wide[..., 3:] == -1).all()  # vLLM's tensor
    assert np.array_equal(wide[..., :3], m["logical_to_physical_map"])
    assert m["logical_to_physical_map"][0].tolist() == [
        [0, 4, -1],
        [1, 5, -1],
        [2, -1, -1],
        [3, -1, -1],
    ]


@pytest.mark.parametrize("width, bound", [(2**40, "1024"), (1025, "1024"), (1, "2"), (2.5, "")])
def test_vllm_maps_refuses_a_width_up_front(width, bound):
    """A width past max(1024, slots) would allocate L x E x width (2**40: 24 TiB), one
    below the most replicas cannot hold the map: refused naming width and the bound."""
    p2l = [[0, 1, 2, 0]]
    with pytest.raises(InvalidInputError, match=rf"'width' parameter of vllm_maps.*{bound}"):
        vllm_maps(p2l, 3, width=width)
    assert vllm_maps(p2l, 3, width=1024)["logical_to_physical_map"].shape == (1, 3, 1024)
    wide = [list(range(3)) + [0] * 2000]  # 2003 slots: as wide as the slots is allowed
    assert vllm_maps(wide, 3, width=2003)["logical_to_physical_map"].shape == (1, 3, 2003)


# --- TensorRT-LLM -------------------------------------------------------------------------


@needs_st
def test_trtllm_statistics_round_trip(tmp_path, rec):
    layers = [3, 4, 5]
    iters = [100, 101, 102, 103, 104, 105]
    files = write_trtllm_statistics(
        tmp_path, rec["rank_logical_counts"], layer_ids=layers, iter_ids=iters, top_k=2
    )
    (tmp_path / "cooccurrence_rank0.safetensors").write_bytes(b"ignored")
    assert json.loads(open(files[0]).read()) == {
        "num_experts": 16,
        "num_experts_per_token": 2,
        "straggler_rank_files": [f"rank{r}.safetensors" for r in range(4)],
    }
    for where in (tmp_path, tmp_path / "rank1.safetensors", tmp_path / "meta_info.json"):
        log = read_engine_log(where)
        assert log.kind == "trtllm_statistics" and log.top_k == 2 and log.n_ranks == 4
        np.testing.assert_array_equal(log.counts, rec["logical_counts"])
        assert log.layer_ids.tolist() == layers and log.batch_ids.tolist() == iters
    part = read_trtllm_statistics(tmp_path, iter_start=102, iter_stop=104)
    np.testing.assert_array_equal(part.counts, rec["logical_counts"][2:4])


@needs_st
@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_trtllm_reads_what_safetensors_torch_writes(tmp_path, rec):
    import safetensors.torch
    import torch

    write_trtllm_statistics(tmp_path, rec["rank_logical_counts"][:1], layer_ids=[0, 1, 2], top_k=2)
    t = {
        f"{i}_{l}": torch.from_numpy(rec["rank_logical_counts"][1, i, l].astype(np.int32))
        for i in range(rec["n_passes"])
        for l in range(3)
    }
    safetensors.torch.save_file(t, str(tmp_path / "rank1.safetensors"))
    # meta_info.json as TensorRT-LLM writes it (no manifest: every rank file counts)
    (tmp_path / "meta_info.json").write_text('{"num_experts": 16, "num_experts_per_token": 2}')
    log = read_engine_log(tmp_path)
    np.testing.assert_array_equal(log.counts, rec["rank_logical_counts"][:2].sum(axis=0))


@needs_st
def test_trtllm_statistics_refusals(tmp_path, rec):
    from straggler.runtime.engines._common import save_safetensors

    write_trtllm_statistics(tmp_path, rec["rank_logical_counts"], layer_ids=[3, 4, 5], top_k=2)
    save_safetensors({"0_3": np.zeros(16, np.int32)}, tmp_path / "rank2.safetensors")
    with pytest.raises(InvalidInputError, match="same '\\{iter\\}_\\{layer\\}' keys"):
        read_trtllm_statistics(tmp_path)
    save_safetensors({"0_3": np.zeros(15, np.int32)}, tmp_path / "rank2.safetensors")
    with pytest.raises(InvalidInputError, match="shape \\(16,\\)"):
        read_trtllm_statistics(tmp_path)
    save_safetensors({"iter0": np.zeros(16, np.int32)}, tmp_path / "rank2.safetensors")
    with pytest.raises(InvalidInputError, match="keyed"):
        read_trtllm_statistics(tmp_path)
    for r in range(4):
        save_safetensors(
            {"0_3": np.zeros(16, np.int32), "1_4": np.zeros(16, np.int32)},
            tmp_path / f"rank{r}.safetensors",
        )
    with pytest.raises(InvalidInputError, match="every layer in every iteration"):
        read_trtllm_statistics(tmp_path)
    (tmp_path / "meta_info.json").write_text("null")
    with pytest.raises(InvalidInputError, match="null"):
        read_trtllm_statistics(tmp_path)


def test_moe_load_balancer_round_trip(tmp_path, rec):
    p2l = rec["maps"][0][1]
    path = write_moe_load_balancer(tmp_path / "moe_load_balancer.yaml", p2l, layer_ids=[3, 4, 5])
    assert detect_format(path) == "trtllm" and detect_format(tmp_path) == "trtllm"
    log = read_moe_load_balancer(path)
    np.testing.assert_array_equal(log.physical_to_logical, p2l)
    assert log.layer_ids.tolist() == [3, 4, 5] and log.extras["layer_updates_per_iter"] == 0


def test_moe_load_balancer_matches_pyyaml(tmp_path, rec):
    """Written exactly as generate_eplb_config.py's yaml.dump; read exactly as safe_load."""
    yaml = pytest.importorskip("yaml")
    p2l = rec["maps"][0][1]
    cfg = {
        "num_slots": int(p2l.shape[1]),
        "initial_global_assignments": {i + 3: [int(x) for x in row] for i, row in enumerate(p2l)},
        "layer_updates_per_iter": 0,
    }

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(
        list, lambda d, data: d.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True)
    )
    theirs = yaml.dump(cfg, Dumper=Dumper, width=float("inf"))
    assert dump_yaml(cfg) == theirs
    for text in (
        theirs,
        yaml.safe_dump(cfg),  # block sequences
        yaml.safe_dump(cfg, default_flow_style=None),  # wrapped flow sequences
        "# plan\n---\nnum_slots: 288   # 8 per rank\nlayer_updates_per_iter: 2\n",
        "a: {x: 1, y: [1, 2]}\nb: 'it''s'\nc: \"q\"\nd: ~\ne: 1.5e3\nf: true\ng: -3\n",
        "h: 1.5e+3\ni: 0x1F\nj: 017\nk: yes\nl: .inf\nm: 3.\nn: 1_000\n",
    ):
        assert parse_yaml(text) == yaml.safe_load(text), text


@pytest.mark.parametrize(
    "text, match",
    [
        ("num_slots: 4\ninitial_global_assignments:\n  3: [0, 1, 2]\n", "shape"),
        (
            "num_slots: 4\ninitial_global_assignments:\n  3: [0, 1, 1, 1]\n  4: [0, 2, 2, 1]\n",
            "no slot for expert 2 in layer 3",
        ),
        ("num_slots: 2\nep: 4\ninitial_global_assignments:\n  0: [0, 1]\n", "rejects"),
        ("num_slots: 2\n", "initial_global_assignments"),
        ("a: &x 1\nb: *x\n", "line 1"),
        ("a: |\n  text\n", "line 1"),
        ("initial_global_assignments:\n  3: [0, 1\n", "unterminated"),
        ("a: 1\na: 2\n", "duplicate key"),
        ("a: 1\n  b: 2\n", "indentation"),
    ],
)
def test_moe_load_balancer_refusals(tmp_path, text, match):
    p = tmp_path / "moe_load_balancer.yaml"
    p.write_text(text)
    with pytest.raises(InvalidInputError, match=match):
        read_moe_load_balancer(p)


# --- DeepSeek EPLB ------------------------------------------------------------------------


@pytest.mark.parametrize("ext", [".json", ".pt"])
def test_eplb_maps_round_trip(tmp_path, rec, ext):
    if ext == ".pt" and not HAS_TORCH:
        pytest.skip("torch not installed")
    w = rec["logical_counts"].sum(axis=0)
    phy2log, log2phy, logcnt = rebalance_experts(w, 20, 1, 1, 4)
    path = write_eplb_maps(tmp_path / f"maps{ext}", phy2log, log2phy, logcnt, weight=w)
    assert detect_format(path) == "eplb"
    log = read_eplb_maps(path)
    np.testing.assert_array_equal(log.physical_to_logical, phy2log)
    np.testing.assert_array_equal(log.extras["log2phy"], log2phy)
    np.testing.assert_array_equal(log.counts, w[None])
    bad = log2phy.copy()
    bad[0, :, 0] = bad[0, ::-1, 0]
    with pytest.raises(InvalidInputError, match="log2phy|logcnt"):
        write_eplb_maps(tmp_path / "bad.json", phy2log, bad, logcnt)


# --- detection, folding, damaged files ----------------------------------------------------


def test_fold_physical_counts_and_empty_slots():
    out = fold_physical_counts([[[5, 1, 2, 0]], [[1, 1, 1, 0]]], [[0, 1, 0, -1]], 2)
    assert out.tolist() == [[[7, 1]], [[2, 1]]]
    with pytest.raises(InvalidInputError, match="empty slot"):
        fold_physical_counts([[1, 0, 0, 3]], [[0, 1, 0, -1]], 2)


def test_detection_refuses_the_unknown(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InvalidInputError, match="Cannot tell"):
        detect_format(tmp_path)
    with pytest.raises(InvalidInputError, match="Cannot tell"):
        read_engine_log(tmp_path / "notes.txt")
    (tmp_path / "x.json").write_text('{"foo": 1}')
    with pytest.raises(InvalidInputError, match="keys \\['foo'\\]"):
        read_engine_log(tmp_path / "x.json")
    with pytest.raises(InvalidInputError, match="No such"):
        read_engine_log(tmp_path / "missing.pt")
    with pytest.raises(
        InvalidInputError, match="SGLang.s --init-expert-location form, not a vllm file"
    ):
        read_engine_log('{"physical_to_logical_map": [[0]]}', format="vllm")


def _valid_files(tmp, rec):
    """One valid file of every single-file kind: (path, bytes)."""
    out = {}
    p2l = rec["maps"][0][1]
    out["init.json"] = write_sglang_init_location(tmp / "init.json", physical_to_logical=p2l)
    out["moe_load_balancer.yaml"] = write_moe_load_balancer(tmp / "moe_load_balancer.yaml", p2l)
    w = rec["logical_counts"].sum(axis=0)
    out["maps.json"] = write_eplb_maps(tmp / "maps.json", *rebalance_experts(w, 20, 1, 1, 4))
    st0 = _vllm_states(rec, layout="global", step=0)[0]
    out["v_rank0.json"] = write_vllm_state(tmp / "v_rank0.json", st0)
    if HAS_TORCH:
        out["stat.pt"] = write_sglang_stat_dump(tmp / "s", rec["logical_counts"], timestamp=1.0)
        out["init.pt"] = write_sglang_init_location(tmp / "init.pt", physical_to_logical=p2l)
    if HAS_ST:
        out["v_rank0.safetensors"] = write_vllm_state(tmp / "v_rank0.safetensors", st0)
    return {k: (v, open(v, "rb").read()) for k, v in out.items()}


class _Files(dict):
    def __repr__(self):  # keep hypothesis's failure reports short
        return f"<{len(self)} valid files>"


@pytest.fixture(scope="module")
def valid_files(tmp_path_factory, rec):
    return _Files(_valid_files(tmp_path_factory.mktemp("valid"), rec))


@FUZZ
@given(data=st.data())
def test_damaged_files_give_clean_errors(tmp_path_factory, valid_files, data):
    name = data.draw(st.sampled_from(sorted(valid_files)))
    path, good = valid_files[name]
    damaged = data.draw(file_bytes_mutations(good))
    d = tmp_path_factory.mktemp("damaged")
    target = d / os.path.basename(path)
    target.write_bytes(damaged)
    try:
        log = read_engine_log(target)
    except InvalidInputError as exc:
        assert str(target) in str(exc) or "inline" in str(exc) or "Cannot tell" in str(exc), exc
    else:  # a damage that leaves a valid file (e.g. YAML cut at a line end) reads as one
        assert isinstance(log, EngineLog)


# (file, field, axes whose length the reader can check against the rest of the file)
FIELDS = [
    ("init.json", "physical_to_logical_map", ()),  # a map alone: any shape is a placement
    ("maps.json", "phy2log", (0, 1)),
    ("maps.json", "logcnt", (0, 1)),
    ("maps.json", "log2phy", (0, 1)),
    ("v_rank0.json", "physical_to_logical_map", (0, 1)),
    ("v_rank0.json", "expert_load_window", (1, 2)),  # the window length is free
    ("v_rank0.json", "logical_replica_count", (0, 1)),
]


@FUZZ
@given(data=st.data())
def test_wrong_shapes_and_types_name_the_field(tmp_path_factory, valid_files, data):
    name, field, fixed = data.draw(st.sampled_from(FIELDS))
    obj = json.loads(valid_files[name][1])
    shape = np.asarray(obj[field]).shape
    obj[field] = data.draw(malformed_arrays(shape, fixed_dims=fixed))
    d = tmp_path_factory.mktemp("shapes")
    target = d / name

    def conv(x):
        return x.tolist() if isinstance(x, np.ndarray) else x

    try:
        text = json.dumps({k: conv(v) for k, v in obj.items()})
    except ValueError:
        return
    target.write_text(text)
    with pytest.raises(InvalidInputError) as exc:
        read_engine_log(target)
    msg = str(exc.value)
    assert str(target) in msg
    # the damaged field, or the field of the same file it no longer agrees with
    assert any(f"'{k}' field" in msg for k in obj), msg
    assert " must " in msg, msg
