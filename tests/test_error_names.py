"""An error names the argument the caller passed, and the function the caller called: never
a parameter of a function called in turn, never a raw error of a library underneath (a
failed write, a tensor without data, a function pickle cannot send)."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from straggler.formulations import CostModel, DispatchProblem, InvalidInputError
from straggler.sim.experiments.rebalance import rebalance_frontier
from straggler.sim.experiments.sweep import sweep
from straggler.solvers import CalibrationResult, fit_cost_model, route_batch, solve_dispatch

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch")


def test_milp_names_cost_not_an_internal_upper_bound():
    p = DispatchProblem(counts=[50, 30, 20], replicas=np.ones((3, 2), bool))
    for kw in (dict(b=1e20), dict(a=1e30)):
        with pytest.raises(InvalidInputError) as exc:
            solve_dispatch(p, CostModel(**(dict(a=0, b=1, c=0, beta=0.1) | kw)), method="milp")
        assert "'cost' parameter of solve_dispatch(method='milp')" in str(exc.value)
        assert "upper_bound" not in str(exc.value)


@pytest.mark.parametrize("cap", [np.nan, [1.0, np.nan], 0.0, -3.0])
def test_route_batch_names_kv_capacity(cap):
    with pytest.raises(InvalidInputError, match="'kv_capacity' parameter of route_batch"):
        route_batch([5], np.zeros((2, 2)), [1, 1], kv_capacity=cap)


PREV = [[7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4]]
HIST = np.ones((3, 1, 8), dtype=np.int64)


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(history=np.zeros((0, 1, 8), np.int64)), "history"),
        (dict(history=np.zeros((3, 1, 0), np.int64)), "history"),
        (dict(score_on=np.ones((2, 1, 7), np.int64)), "score_on"),
        (dict(score_on=np.ones((0, 1, 8), np.int64)), "score_on"),
        (dict(cost="no_such_preset"), "cost"),
        (dict(cost=3), "cost"),
        (dict(num_gpus=5), "num_replicas"),
        (dict(num_groups=3), "num_groups"),
        (dict(n_samples=0), "n_samples"),
        (dict(budgets=[-1]), "budgets"),
    ],
)
def test_rebalance_frontier_names_its_own_parameters(kw, name):
    args = dict(history=HIST, previous=PREV, num_replicas=12, num_groups=1, num_nodes=1)
    args |= dict(num_gpus=4) | kw
    with pytest.raises(InvalidInputError, match=f"'{name}' parameter of rebalance_frontier"):
        rebalance_frontier(**args)


def test_fit_cost_model_checks_meta_and_tile_first(tmp_path):
    G = np.repeat([1.0, 2, 4, 8], 4)
    N = G * np.tile([1.0, 8, 64, 512], 4)
    t = CostModel(a=5, b=7, c=9, beta=0.2).time(G, N)
    for meta in ([1, 2], {"a": object()}, {1: "x"}, {"x": float("nan")}):
        with pytest.raises(InvalidInputError, match="'meta' parameter of fit_cost_model"):
            fit_cost_model(G, N, t, bootstrap=0, meta=meta)
    with pytest.raises(InvalidInputError, match="'tile' parameter of fit_cost_model"):
        fit_cost_model(G, N, t, bootstrap=0, tile=2**60)
    fit = fit_cost_model(G, N, t, bootstrap=0, meta={"gpu": "H20", "n": [1, 2]})
    fit.save(tmp_path / "fit.json")
    assert CalibrationResult.load(tmp_path / "fit.json").meta == {"gpu": "H20", "n": [1, 2]}


_FULL_DISK = textwrap.dedent(
    """
    import os, resource, signal, sys, numpy as np
    from straggler.formulations import WriteError
    from straggler.runtime.engines import write_sglang_stat_dump, write_trtllm_statistics
    from straggler.runtime.engines._common import save_json
    d = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    calls = {
        "pt": lambda: write_sglang_stat_dump(d, np.ones((100, 4, 64)), timestamp=1.0),
        "set": lambda: write_trtllm_statistics(
            os.path.join(d, "t"), np.ones((1, 20, 4, 64)), layer_ids=range(4), top_k=1
        ),
        "json": lambda: save_json({"a": list(range(5000))}, os.path.join(d, "x.json")),
    }
    for name, call in calls.items():
        try:
            call()
            print(name, "WROTE")
        except WriteError as exc:
            print(name, str(exc).replace(d, "<d>"))
    print("left", sorted(os.listdir(d)))
    """
)


@needs_torch
@pytest.mark.skipif(importlib.util.find_spec("safetensors") is None, reason="safetensors")
def test_a_failed_write_is_one_error_naming_the_file(tmp_path):
    """A full disk (here: a file-size limit) raises torch's RuntimeError from
    inline_container.cc, safetensors' SafetensorError or an OSError inside the writers:
    each reaches the caller as one WriteError (an OSError and a StragglerError) naming the
    file, nothing left."""
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"PYTHONWARNINGS": "ignore"},
    )
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["pt"].startswith("Cannot write <d>/expert_distribution_recorder_1.0.pt:"), out
    assert lines["set"].startswith("Cannot write <d>/t/rank0.safetensors:"), out
    assert lines["json"].startswith("Cannot write <d>/x.json: File too large"), out
    assert lines["left"] == "[]", out


@needs_torch
def test_tensors_without_data_are_refused_naming_the_parameter():
    import torch
    from straggler.runtime import TablePublisher
    from straggler.runtime.converters import to_sglang_lp

    l2p = np.array([[[0, 1], [2, -1]]])
    pub = TablePublisher(l2p, device="cpu")
    before = pub.snapshot()
    for bad in (torch.empty((1, 2, 2), device="meta"), torch.ones((1, 2, 2)).to_sparse()):
        with pytest.raises(InvalidInputError, match="'probs' parameter of TablePublisher.publish"):
            pub.publish(bad)
        with pytest.raises(InvalidInputError, match="'log2phy' parameter of TablePublisher.reset"):
            pub.reset(bad.long() if bad.layout == torch.strided else bad)
        with pytest.raises(InvalidInputError, match="'sglang_log2phy' parameter of to_sglang_lp"):
            to_sglang_lp(l2p, np.ones((1, 2, 2)), sglang_log2phy=bad)
    np.testing.assert_array_equal(pub.snapshot(), before)  # a refused call changed nothing
    pub.publish(torch.ones((1, 2, 2), dtype=torch.bfloat16))  # read exactly, as float32


def _module_level(x):
    return {"y": x}


def test_sweep_refuses_a_func_it_cannot_send_to_its_workers():
    def nested(x):
        return {"y": x}

    for func in (lambda x: {"y": x}, nested):
        with pytest.raises(InvalidInputError, match="'func' parameter of sweep.*pickle"):
            sweep(func, {"x": [1, 2]}, backend="process", progress=False)
    # the same function runs serially
    assert sweep(nested, {"x": [1, 2]}, backend="serial", progress=False).column("y").tolist() == [
        1,
        2,
    ]


@pytest.mark.skipif(importlib.util.find_spec("safetensors") is None, reason="safetensors")
@pytest.mark.parametrize("bad", [0, -1, 2.5, "4"])
def test_engine_readers_check_n_experts_before_the_files(tmp_path, bad):
    """n_experts is checked as an int >= 1 first; a value the files then disagree with
    named the files' field (meta_info.json's 'num_experts', a map's range)."""
    from straggler.runtime.engines import (
        read_engine_log,
        read_moe_load_balancer,
        read_trtllm_statistics,
        write_moe_load_balancer,
        write_trtllm_statistics,
    )

    d = tmp_path / "stats"
    write_trtllm_statistics(d, np.ones((1, 1, 1, 4), np.int64), layer_ids=[0], top_k=1)
    yaml = write_moe_load_balancer(tmp_path / "lb.yaml", [[0, 1, 2, 3]], layer_ids=[0])
    for read, path in (
        (read_trtllm_statistics, d),
        (read_engine_log, d),
        (read_moe_load_balancer, yaml),
    ):
        with pytest.raises(InvalidInputError, match="'n_experts' parameter"):
            read(path, n_experts=bad)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch")
def test_the_sglang_reader_checks_n_experts_before_the_maps(tmp_path):
    from straggler.runtime.engines import read_sglang_recorder, write_sglang_detail_dump

    rec = [{"forward_pass_id": 0, "global_physical_count": np.array([[1, 1, 0, 0]])}]
    m = np.array([[0, 1, 2, 3]])
    path = write_sglang_detail_dump(tmp_path, rec, m, rank=0, timestamp=1.0)
    with pytest.raises(InvalidInputError, match="'n_experts' parameter"):
        read_sglang_recorder(path, physical_to_logical=m, n_experts=0)
