"""Kernel or reference (straggler.solvers.dispatch._backend): same results, the ski-rental rule, and
the typed certificate solve_dispatch takes from tempo instead of recomputing the bound."""

import time

import numpy as np
import pytest
from numba import njit
from straggler.formulations import CostModel, DispatchProblem, InvalidInputError
from straggler.runtime.commands import compare as compare_mod
from straggler.sim import make_decode_problem
from straggler.solvers import certified_lower_bound, solve_dispatch
from straggler.solvers.dispatch import _backend
from straggler.solvers.dispatch import solve as dispatch_mod
from straggler.solvers.dispatch._backend import Pair, kernel_mode, set_kernel_mode

_CASES = [
    (make_decode_problem(n_layers=1, seed=3).layer(0), CostModel.preset("dsv3_a_offline")),
    (
        make_decode_problem("qwen3_235b", n_gpus=4, tokens_per_gpu=96, n_layers=1, seed=1),
        CostModel.preset("qwen3_235b_b_tile"),
    ),
    (
        DispatchProblem(counts=[130, 221, 7], replicas=[[1, 1, 1], [1, 1, 0], [0, 0, 1]]),
        CostModel.preset("dsv2_lite_a_serving"),
    ),
    (
        make_decode_problem("qwen3_30b", n_gpus=4, tokens_per_gpu=64, n_layers=3, seed=2),
        CostModel.preset("qwen3_30b_a_offline"),
    ),
]


def _same(a, b):
    assert np.array_equal(a.shares, b.shares) and a.shares.dtype == b.shares.dtype
    assert np.array_equal(a.makespan, b.makespan)
    assert np.array_equal(a.lower_bound, b.lower_bound)
    assert np.array_equal(a.gpu_time, b.gpu_time)
    assert a.status == b.status


@pytest.mark.parametrize("method", ["tempo", "round_robin", "semi_matching", "metro"])
@pytest.mark.parametrize("case", range(len(_CASES)))
def test_references_give_the_kernels_results_bit_for_bit(method, case):
    problem, cost = _CASES[case]
    with kernel_mode("kernel"):
        k = solve_dispatch(problem, cost, method=method, repair_budget_s=0) if method == "tempo" \
            else solve_dispatch(problem, cost, method=method)  # fmt: skip
    with kernel_mode("reference"):
        r = solve_dispatch(problem, cost, method=method, repair_budget_s=0) if method == "tempo" \
            else solve_dispatch(problem, cost, method=method)  # fmt: skip
    _same(k, r)
    assert k.reference_s == 0.0
    if method in ("tempo", "round_robin", "semi_matching"):
        assert r.reference_s > 0  # the method's own kernels ran as references
    if method == "tempo":
        drop = ("repair_runtime_s",)
        layers = lambda x: x.extras["layers"] if problem.is_stack else [x.extras]  # noqa: E731
        for a, b in zip(layers(k), layers(r)):
            # repr: NaN entries (candidates that were not scored) compare equal
            assert repr({k_: v for k_, v in a.items() if k_ not in drop}) == repr(
                {k_: v for k_, v in b.items() if k_ not in drop}
            )


def _fresh_pair(reference, budget_s):
    def body(x):
        s = 0.0
        for v in x:
            s += v
        return s

    return Pair(njit(cache=False)(body), reference, budget_s)


def test_auto_rents_the_reference_then_buys_the_kernel():
    calls = []

    def reference(x):
        calls.append(1)
        time.sleep(0.02)
        return float(sum(x))

    pair = _fresh_pair(reference, budget_s=0.1)
    x = np.arange(4.0)
    for _ in range(12):
        assert pair(x) == 6.0
    # the references ran until their seconds reached the budget, then the kernel compiled
    assert 3 <= pair.reference_calls == len(calls) <= 6
    assert pair.reference_s >= 0.1 and pair.kernel.signatures
    assert pair.uses_kernel() and pair.ready()


def test_auto_interrupts_a_long_reference_and_runs_the_kernel():
    def reference(x):
        time.sleep(30)  # the interval timer cuts this off at the budget
        return -1.0

    pair = _fresh_pair(reference, budget_s=0.2)
    t = time.perf_counter()
    assert pair(np.arange(3.0)) == 3.0  # the kernel's answer, not the reference's
    assert time.perf_counter() - t < 10
    assert pair.reference_calls == 1 and 0.15 <= pair.reference_s < 5
    assert pair.kernel.signatures


def test_modes_are_validated_and_restored():
    with pytest.raises(InvalidInputError, match="'mode' parameter of set_kernel_mode"):
        set_kernel_mode("fast")
    assert _backend.get_kernel_mode() == "auto"
    with kernel_mode("reference"):
        assert _backend.get_kernel_mode() == "reference"
        assert not _backend.all_ready(_backend.TEMPO)
    assert _backend.get_kernel_mode() == "auto"
    pair = _fresh_pair(lambda x: 0.0, budget_s=10)
    with kernel_mode("kernel"):
        assert pair(np.ones(2)) == 2.0 and pair.reference_calls == 0


def test_tempo_hands_its_certified_bound_over_and_it_is_not_recomputed(monkeypatch):
    problem, cost = _CASES[0]
    want = certified_lower_bound(problem, cost)

    def boom(*a, **k):
        raise AssertionError("solve_dispatch recomputed the bound tempo certified")

    monkeypatch.setattr(dispatch_mod, "validated_bound", boom)
    res = solve_dispatch(problem, cost, method="tempo", repair_budget_s=0)
    # (B8 tried from tempo's makespan, the certificate from the token-LP dispatch's: both
    # meet the optimum here)
    assert res.lower_bound == want == res.makespan
    stack = solve_dispatch(_CASES[3][0], _CASES[3][1], method="tempo", repair_budget_s=0)
    assert stack.lower_bound.shape == (3,)
    with pytest.raises(AssertionError, match="recomputed"):  # other methods: computed here
        solve_dispatch(problem, cost, method="metro")


def test_compare_runs_the_references_on_a_cold_cache_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(compare_mod, "needs_compile", lambda: True)
    with kernel_mode("reference"):
        argv = ["--methods", "tempo,round_robin", "--gpus", "2", "--tokens-per-gpu", "4"]
        assert compare_mod.main(argv) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("kernels not compiled yet")
    assert "^ runtime of the plain-Python references" in out
    monkeypatch.setattr(compare_mod, "needs_compile", lambda: False)
    compare_mod.main(["--methods", "round_robin", "--gpus", "2", "--tokens-per-gpu", "4"])
    out = capsys.readouterr().out
    assert "kernels not compiled" not in out and "^" not in out


def test_method_instances_are_shared_only_when_frozen(monkeypatch):
    import dataclasses

    from straggler.solvers.dispatch import registry
    from straggler.solvers.dispatch.method import LayerSolution

    assert dispatch_mod._method("tempo", {}, "f") is dispatch_mod._method("tempo", {}, "f")
    assert dispatch_mod._method("tempo", {"tau": 0.0}, "f").tau == 0.0

    @dataclasses.dataclass
    class Counting:  # mutable: each call must get its own instance
        calls: int = 0

        def solve(self, problem, cost, *, time_limit, rng):
            self.calls += 1
            x = np.zeros((problem.n_experts, problem.n_gpus))
            x[:, 0] = problem.counts
            return LayerSolution(shares=x, extras={"calls": self.calls})

    monkeypatch.setitem(registry._DISPATCH, "counting", Counting)
    p = DispatchProblem(counts=[3, 1], replicas=[[1, 0], [1, 1]])
    cost = CostModel(a=0, b=1, c=0, beta=0)
    for _ in range(3):
        assert solve_dispatch(p, cost, method="counting").extras["calls"] == 1
