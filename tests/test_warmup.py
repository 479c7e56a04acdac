"""Cold start: the warm-up reaches every dispatch kernel, and compile time is never run time."""

import json
import os
import time

import numpy as np
import pytest
from numba import njit
from straggler.formulations import CostModel, DispatchProblem, InvalidInputError
from straggler.sim.warmup import dispatch_kernels, eplb_kernels, main, needs_compile, warmup
from straggler.solvers import registry, solve_dispatch
from straggler.solvers._compile import JitTimer, merged_length
from straggler.solvers.registry import LayerSolution


def test_warmup_reaches_every_dispatch_kernel():
    rep = warmup(routing=False, simulator=False)
    assert rep.missed_kernels == ()
    kernels = dispatch_kernels()
    # every kernel solve_dispatch calls from Python: tempo's four, the bounds', A3's
    assert len(kernels) >= 6
    assert all(k.signatures for k in kernels.values())
    assert not needs_compile()
    eplb = eplb_kernels()
    assert len(eplb) == 2 and all(k.signatures for k in eplb.values())
    names = [s.name for s in rep.steps]
    assert names == [f"solve_dispatch[{m}]" for m in registry.dispatch_methods()] + [
        "rebalance_experts"
    ]
    assert rep.jit_s <= rep.total_s + 1e-6 and rep.compile_s <= rep.jit_s + 1e-6


def test_after_warmup_the_default_instance_compiles_nothing():
    from straggler.sim import make_decode_problem

    warmup(routing=False, simulator=False, methods=["tempo", "milp"])
    p = make_decode_problem(n_layers=2)
    cost = CostModel.preset("dsv3_a_offline")
    for method in ("tempo", "milp"):
        for problem in (p, p.layer(0)):
            with JitTimer() as jt:
                res = solve_dispatch(problem, cost, method=method)
            assert jt.compile_s == 0.0 and res.compile_s == jt.jit_s == 0.0, method


def _fresh_kernel():
    """A kernel numba has never seen: a new function object each call, so it compiles."""

    def body(x):
        s = 0.0
        for v in x:
            s += v * v
        return s

    return njit(cache=False)(body)


def test_jit_timer_measures_compilation_and_merges_threads():
    k = _fresh_kernel()
    with JitTimer() as jt:
        t = time.perf_counter()
        k(np.ones(3))
        wall = time.perf_counter() - t
    assert 0 < jt.compile_s <= jt.jit_s <= wall + 1e-6
    assert any(name.endswith("body") for name in jt.compiled)
    with JitTimer() as again:
        k(np.ones(3))
    assert again.jit_s == 0.0 and again.compiled == {}
    assert merged_length([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0


def test_runtime_excludes_compilation(monkeypatch):
    """A method whose first call compiles a kernel: runtime_s leaves the compile out and
    compile_s reports it (both times from the same call)."""
    import dataclasses

    kernel = _fresh_kernel()

    @dataclasses.dataclass(frozen=True)
    class Probe:
        def solve(self, problem, cost, *, time_limit, rng):
            kernel(np.ones(2))
            x = np.zeros((problem.n_experts, problem.n_gpus))
            x[:, 0] = problem.counts
            return LayerSolution(shares=x)

    monkeypatch.setitem(registry._DISPATCH, "jit_probe", Probe)  # removed after the test
    p = DispatchProblem(counts=[3, 1], replicas=[[1, 0], [1, 1]])
    res = solve_dispatch(p, CostModel(a=0, b=1, c=0, beta=0), method="jit_probe")
    assert res.compile_s > 0.01
    assert res.runtime_s < res.compile_s
    again = solve_dispatch(p, CostModel(a=0, b=1, c=0, beta=0), method="jit_probe")
    assert again.compile_s == 0.0


def test_warmup_validates_and_the_cli_reports(capsys):
    with pytest.raises(InvalidInputError, match="'methods' parameter of warmup"):
        warmup(methods=["nope"])
    with pytest.raises(InvalidInputError, match="'dispatch' parameter of warmup"):
        warmup(dispatch=1)
    with pytest.raises(InvalidInputError, match="'policies'"):
        warmup(dispatch=False, simulator=False, policies=["jsq", "lifo"])
    assert main(["--no-routing", "--no-simulator", "--methods", "round_robin", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in out["steps"]] == ["solve_dispatch[round_robin]", "rebalance_experts"]
    assert {"total_s", "jit_s", "compile_s", "kernels", "cache_dir"} <= set(out)


def test_warmup_runs_without_the_jit():
    """With ``NUMBA_DISABLE_JIT=1`` (the plain-Python functions serve) the warm-up runs and
    reports no missed kernel: nothing compiles, so nothing can be missed."""
    import subprocess
    import sys

    code = (
        "from straggler.sim import warmup\n"
        "r = warmup(routing=False, simulator=False, methods=['round_robin'])\n"
        "print(r.missed_kernels)\n"
    )
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "()"
