"""CP-SAT backend: same optima as HiGHS within the grid tolerance, valid bounds."""

import builtins

import numpy as np
import pytest
from straggler.formulations import (
    BackendUnavailableError,
    CostModel,
    DispatchProblem,
    InvalidInputError,
    Status,
    check_shares,
)
from straggler.solvers import solve_dispatch

pytest.importorskip("ortools")

from straggler.solvers.dispatch.cpsat import grid_error, solve_dispatch_cpsat  # noqa: E402

COSTS = [
    CostModel(a=0, b=15, c=0, beta=0.1),
    CostModel(a=3.5, b=2.0, c=4.0, beta=0.05),
    CostModel(a=1.0, b=3.0, c=2.0, beta=0.02, b2=1.5, tile=4),
    CostModel(a=1.0, b=3.0, c=2.0, beta=0.02, b2=0.7, tile=4, c2=5.0, gamma=0.08),
    CostModel.preset("qwen3_235b_b_tile").replace(tile=8),
]


def instance(rng):
    E = int(rng.integers(1, 7))
    g = int(rng.integers(1, 4))
    counts = rng.integers(0, 40, size=E)
    rep = rng.random((E, g)) < 0.6
    rep[np.arange(E), rng.integers(0, g, size=E)] = True
    return DispatchProblem(counts=counts, replicas=rep)


@pytest.mark.parametrize("ci", range(len(COSTS)))
def test_cpsat_matches_highs(ci):
    cost = COSTS[ci]
    rng = np.random.default_rng(ci)
    for _ in range(8):
        p = instance(rng)
        h = solve_dispatch(p, cost, method="milp", mip_rel_gap=0.0)
        c = solve_dispatch(p, cost, method="milp", mip_rel_gap=0.0, backend="cpsat")
        check_shares(p, c.shares)
        assert h.status is Status.OPTIMAL
        assert c.extras["grid_status"] == "OPTIMAL"
        tol = grid_error(p, cost, c.extras["scale"])
        # the grid optimum lies in [OPT, OPT + grid_error]; a returned seed can only be better
        assert h.makespan - 1e-6 <= c.makespan <= h.makespan + tol + 1e-6
        assert c.lower_bound <= h.makespan + 1e-6


def test_fig1b_toy_cpsat():
    p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    res = solve_dispatch(p, CostModel(a=0, b=15, c=0, beta=0.1), method="milp", backend="cpsat")
    assert res.status is Status.OPTIMAL and res.makespan == pytest.approx(60.0)


def test_direct_call_and_bad_scale():
    p = DispatchProblem(counts=[7, 2], replicas=[[1, 1], [1, 0]])
    cost = CostModel(a=0, b=1, c=0, beta=0.5)
    sol = solve_dispatch_cpsat(p, cost, scale=2, mip_rel_gap=0.0)
    # on the half-token grid the optimum splits 7 tokens to balance 4.5 / 4.5 tokens
    assert sol.extras["shares"].sum(axis=0).tolist() == [4.5, 4.5]
    with pytest.raises(InvalidInputError, match="scale"):
        solve_dispatch_cpsat(p, cost, scale=0)


def test_missing_ortools_is_reported(monkeypatch):
    real_import = builtins.__import__

    def fake(name, *args, **kw):
        if name.startswith("ortools"):
            raise ImportError("no ortools")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", fake)
    p = DispatchProblem(counts=[1], replicas=[[1]])
    with pytest.raises(BackendUnavailableError, match=r"straggler\[ortools\]"):
        solve_dispatch(p, CostModel(a=0, b=1, c=0, beta=1), method="milp", backend="cpsat")
