"""The exact dispatch method against a brute-force oracle, the token LP, and honest limits."""

import math

import numpy as np
import pytest
from straggler.formulations import (
    CostModel,
    DispatchProblem,
    InvalidInputError,
    InvalidOptionError,
    Status,
    StragglerError,
    check_shares,
    evaluate,
)
from straggler.proofs.brute import brute_force_dispatch
from straggler.solvers import solve_dispatch, solve_token_lp

COSTS = {
    "two_piece": CostModel(a=0, b=15, c=0, beta=0.1),
    "intercepts": CostModel(a=3.5, b=2.0, c=4.0, beta=0.05),
    "tiles": CostModel(a=1.0, b=3.0, c=2.0, beta=0.02, b2=1.5, tile=4),
    "all_three": CostModel(a=1.0, b=3.0, c=2.0, beta=0.02, b2=0.7, tile=4, c2=5.0, gamma=0.08),
    "traffic": CostModel(a=0.5, b=1.0, c=0.0, beta=0.01, c2=1.0, gamma=0.3),
}


def random_instance(rng, *, full, max_e, max_g, max_n):
    E = int(rng.integers(1, max_e + 1))
    g = int(rng.integers(1, max_g + 1))
    counts = rng.integers(0, max_n + 1, size=E)
    counts[rng.random(E) < 0.15] = 0
    if rng.random() < 0.3:  # ties
        counts[:] = counts[0]
    if full:
        rep = np.ones((E, g), bool)
    else:
        rep = rng.random((E, g)) < 0.5
        rep[np.arange(E), rng.integers(0, g, size=E)] = True
    return DispatchProblem(counts=counts, replicas=rep)


def scaled_cost(cost, rng):
    """Random positive rescaling of b (and b2) so activation and tokens trade off."""
    f = float(rng.choice([0.05, 0.2, 1.0, 3.0]))
    return cost.replace(b=cost.b * f, b2=cost.b2 * f)


def check_against_oracle(seed, cost_name, full, **size):
    rng = np.random.default_rng(seed)
    cost = scaled_cost(COSTS[cost_name], rng)
    p = random_instance(rng, full=full, **size)
    opt, _ = brute_force_dispatch(p, cost)
    for tightened in (True, False):
        res = solve_dispatch(p, cost, method="milp", mip_rel_gap=0.0, tightened=tightened)
        check_shares(p, res.shares)
        assert res.status is Status.OPTIMAL, (seed, cost_name, tightened)
        assert res.makespan == pytest.approx(opt, rel=1e-6, abs=1e-9), (seed, cost_name, tightened)
        assert res.makespan == pytest.approx(evaluate(p, cost, res.shares).makespan, rel=1e-12)
        assert res.lower_bound <= opt * (1 + 1e-9) + 1e-9, (seed, cost_name, tightened)
        # OPTIMAL is certified by the reported bound
        assert res.makespan <= res.lower_bound + 1e-6 * max(1.0, opt), (seed, cost_name)


# default: 5 costs x 2 replication kinds x 12 seeds = 120 instances
@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("cost_name", sorted(COSTS))
def test_milp_equals_brute_force(cost_name, full):
    for seed in range(12):
        check_against_oracle(seed, cost_name, full, max_e=3, max_g=3, max_n=14)


@pytest.mark.slow
@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("cost_name", sorted(COSTS))
def test_milp_equals_brute_force_sweep(cost_name, full):
    for seed in range(1000, 1060):
        # with tiles every tile vector is enumerated too: keep those instances smaller
        max_e = 3 if COSTS[cost_name].has_tiles else 4
        max_n = 8 if COSTS[cost_name].has_tiles else 16
        check_against_oracle(seed, cost_name, full, max_e=max_e, max_g=3, max_n=max_n)


def test_fig1b_toy():
    p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    cost = CostModel(a=0, b=15, c=0, beta=0.1)
    for tightened in (True, False):
        res = solve_dispatch(p, cost, method="milp", tightened=tightened)
        assert res.status is Status.OPTIMAL and res.success
        assert res.makespan == pytest.approx(60.0, abs=1e-9)
        assert res.lower_bound == pytest.approx(60.0, abs=1e-6)
        # only the hot expert is split
        assert (res.shares[1:] > 0).sum() == 6 and (res.shares[0] > 0).sum() == 2


def test_stack_and_zero_layers():
    counts = np.array([[5, 0, 3], [0, 0, 0]])
    p = DispatchProblem(counts=counts, replicas=np.ones((3, 2), bool))
    cost = CostModel(a=1, b=2, c=0.5, beta=0.1)
    res = solve_dispatch(p, cost, method="milp")
    assert res.shares.shape == (2, 3, 2)
    assert res.makespan[1] == pytest.approx(1.0)  # idle layer: max(a, c)
    check_shares(p, res.shares)


def test_warm_start_and_bad_options():
    p = DispatchProblem(counts=[9, 4, 4, 1], replicas=np.ones((4, 3), bool))
    cost = CostModel(a=0, b=1, c=0, beta=0.3)
    res = solve_dispatch(p, cost, method="milp", warm_start="token_lp", mip_rel_gap=0.0)
    assert res.makespan == pytest.approx(brute_force_dispatch(p, cost)[0], rel=1e-6)
    for bad in (
        dict(gap=0.1),
        dict(backend="gurobi"),
        dict(warm_start="nope"),
        dict(mip_rel_gap=-1),
        dict(threads=0),
        dict(tightened="yes"),
    ):
        with pytest.raises(InvalidInputError):
            solve_dispatch(p, cost, method="milp", **bad)
    with pytest.raises(InvalidOptionError, match="gap"):
        solve_dispatch(p, cost, method="milp", gap=0.1)
    for tl in (0, -1.0, float("nan"), "1"):
        with pytest.raises(InvalidInputError, match="time_limit"):
            solve_dispatch(p, cost, method="milp", time_limit=tl)


def hard_instance():
    """Theorem 1's reduction of a 40-number balanced partition: HiGHS cannot prove the
    optimum of this two-GPU instance in seconds (odd weights, no perfect split)."""
    from straggler.proofs.reduction import partition_to_dispatch

    w = np.random.default_rng(0).integers(10**5, 10**6, 40) * 2 + 1
    problem, cost, _ = partition_to_dispatch(w)
    return problem, cost


@pytest.mark.parametrize("tightened", [True, False])
def test_time_limit_is_reached_and_honest(tightened):
    """The limit is actually reached (HiGHS reports it), the incumbent comes back FEASIBLE
    with success False, a finite bound below it and an honest gap."""
    p, cost = hard_instance()
    res = solve_dispatch(
        p, cost, method="milp", time_limit=0.3, mip_rel_gap=0.0, tightened=tightened
    )
    check_shares(p, res.shares)
    assert res.extras["raw_status"] == "Time limit reached"
    assert res.status is Status.FEASIBLE and not res.success
    assert math.isfinite(res.lower_bound) and res.lower_bound < res.makespan
    assert 0 < res.extras["gap"] <= 1
    assert res.makespan == pytest.approx(evaluate(p, cost, res.shares).makespan)


def test_time_limit_before_the_backend_runs():
    """A limit spent on seeding and model building: the best seed comes back FEASIBLE with
    the reason in extras, and the backend is never started past its limit."""
    p, cost = hard_instance()
    res = solve_dispatch(p, cost, method="milp", time_limit=1e-6)
    check_shares(p, res.shares)
    assert res.status is Status.FEASIBLE and not res.success
    assert res.extras["solver_runtime_s"] == 0.0
    assert "before the backend ran" in res.extras["fallback"]
    assert res.lower_bound <= res.makespan


def test_no_incumbent_falls_back_honestly(monkeypatch):
    """A backend that finds nothing: seed shares returned, NO_SOLUTION kept, success False."""
    import straggler.solvers.dispatch.milp as milp
    from straggler.solvers.highs import MilpSolution

    real = milp.solve_milp

    def nothing(model, **kw):
        if not model.is_mip:  # the token-LP seed still solves
            return real(model, **kw)
        return MilpSolution(
            status=Status.NO_SOLUTION,
            x=None,
            objective=math.inf,
            dual_bound=1.0,
            gap=math.inf,
            runtime_s=0.0,
            raw_status="Time limit reached",
        )

    monkeypatch.setattr(milp, "solve_milp", nothing)
    p = DispatchProblem(counts=[6, 2], replicas=[[1, 1], [1, 0]])
    res = solve_dispatch(p, CostModel(a=0, b=1, c=0, beta=0.5), method="milp")
    assert res.status is Status.NO_SOLUTION and not res.success
    assert "fallback" in res.extras
    check_shares(p, res.shares)


@pytest.mark.parametrize("seed", range(20))
def test_token_lp_value_is_min_max_tokens(seed):
    rng = np.random.default_rng(seed)
    p = random_instance(rng, full=seed % 2 == 0, max_e=5, max_g=3, max_n=30)
    x, v = solve_token_lp(p)
    check_shares(p, x)
    assert x.sum(axis=0).max() == v
    # the exact value: a MILP with b = 0 minimizes max_g beta*N_g
    res = solve_dispatch(p, CostModel(a=0, b=0, c=0, beta=1.0), method="milp", mip_rel_gap=0)
    assert v == pytest.approx(res.makespan, rel=1e-9, abs=1e-9)
    assert not ((x > 0) & (x < 1e-9 * p.counts[:, None])).any()


def test_token_lp_bad_input():
    p = DispatchProblem(counts=[1], replicas=[[1]])
    with pytest.raises(InvalidInputError, match="time_limit"):
        solve_token_lp(p, time_limit=0)
    with pytest.raises(InvalidInputError, match="problem"):
        solve_token_lp(DispatchProblem(counts=[[1]], replicas=[[1]]))


# --- token_lp baseline (LPLB) ------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_token_lp_baseline_is_feasible_and_not_better_than_milp(seed):
    rng = np.random.default_rng(500 + seed)
    p = random_instance(rng, full=seed % 2 == 0, max_e=6, max_g=4, max_n=50)
    cost = COSTS["two_piece"]
    res = solve_dispatch(p, cost, method="token_lp")
    check_shares(p, res.shares)
    assert res.status in (Status.HEURISTIC, Status.OPTIMAL)
    assert res.extras["max_tokens"] == pytest.approx(solve_token_lp(p)[1], rel=1e-12)
    opt = solve_dispatch(p, cost, method="milp", mip_rel_gap=0)
    assert res.makespan >= opt.makespan - 1e-9
    assert not ((res.shares > 0) & (res.shares < 1e-9 * p.counts[:, None])).any()


@pytest.mark.parametrize(
    "topology, n_gpus, gpu_node",
    [
        ("ring", 5, None),
        ("cube", 8, None),
        ("cube", 16, None),
        ("hypercube", 16, None),
        ("torus", 8, [0, 0, 0, 0, 1, 1, 1, 1]),
        ("torus", 6, [0, 0, 1, 1, 2, 2]),
    ],
)
def test_token_lp_topologies(topology, n_gpus, gpu_node):
    from straggler.baselines.dispatch.token_lp import restrict_to_topology, topology_r2o

    rng = np.random.default_rng(n_gpus)
    E = 3 * n_gpus
    rep = rng.random((E, n_gpus)) < 0.4
    rep[np.arange(E), np.arange(E) % n_gpus] = True
    p = DispatchProblem(counts=rng.integers(1, 100, size=E), replicas=rep, gpu_node=gpu_node)
    r2o = topology_r2o(topology, n_gpus, p.gpu_node)
    # every redundant column is a permutation: each GPU's experts get one copy per column
    for j in range(r2o.shape[1]):
        assert sorted(r2o[:, j]) == list(range(n_gpus))
    assert (r2o != np.arange(n_gpus)[:, None]).all()
    mask = restrict_to_topology(p, topology)
    assert (mask <= rep).all() and (mask.sum(axis=1) <= 2).all()
    for e in range(E):
        o = np.flatnonzero(rep[e])[0]
        allowed = {o} | {r for r in range(n_gpus) if o in r2o[r]}
        assert set(np.flatnonzero(mask[e])) <= allowed and mask[e, o]
    res = solve_dispatch(p, COSTS["two_piece"], method="token_lp", topology=topology)
    check_shares(p, res.shares)
    assert not (res.shares[~mask] > 0).any()
    # fewer copies can only raise the token LP's value
    assert res.extras["max_tokens"] >= solve_token_lp(p)[1] - 1e-9


def test_token_lp_topology_errors():
    p = DispatchProblem(counts=[3, 4, 5], replicas=np.ones((3, 6), bool))
    cost = COSTS["two_piece"]
    for topology in ("cube", "hypercube", "torus"):
        with pytest.raises(InvalidInputError, match=topology):
            solve_dispatch(p, cost, method="token_lp", topology=topology)
    with pytest.raises(InvalidOptionError, match="topology"):
        solve_dispatch(p, cost, method="token_lp", topology="mesh")
    bad_nodes = DispatchProblem(counts=[1], replicas=np.ones((1, 4), bool), gpu_node=[0, 1, 0, 1])
    with pytest.raises(InvalidInputError, match="torus"):
        solve_dispatch(bad_nodes, cost, method="token_lp", topology="torus")
    one = DispatchProblem(counts=[1], replicas=[[True]])
    with pytest.raises(InvalidInputError, match="ring"):
        solve_dispatch(one, cost, method="token_lp", topology="ring")


def test_token_lp_seed_timeout_is_not_fatal(monkeypatch):
    """A token-LP seed that stops at its limit is not used as a seed; the solve goes on."""
    import straggler.solvers.dispatch.exact as exact

    real = exact.solve_token_lp

    def out_of_time(problem, *args, **kw):
        assert kw.get("full_output")
        return real(problem, time_limit=1e-9, full_output=True)

    monkeypatch.setattr(exact, "solve_token_lp", out_of_time)
    p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    res = solve_dispatch(p, CostModel(a=0, b=15, c=0, beta=0.1), method="milp")
    assert res.status is Status.OPTIMAL and res.makespan == pytest.approx(60.0)
    assert res.extras["seed"] in ("greedy", "uniform")


def test_token_lp_at_its_time_limit_is_feasible_not_an_error():
    """token_lp with a tiny time limit returns, rather than raising StragglerError,
    its incumbent (here LPLB's even-split fallback) with status FEASIBLE, success False."""
    p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    cost = CostModel(a=0, b=15, c=0, beta=0.1)
    res = solve_dispatch(p, cost, method="token_lp", time_limit=1e-6)
    check_shares(p, res.shares)
    assert res.status is Status.FEASIBLE and not res.success
    assert "fallback" in res.extras and res.lower_bound <= res.makespan
    sol = solve_token_lp(p, time_limit=1e-9, full_output=True)
    assert sol.status is Status.FEASIBLE and sol.fallback is not None
    np.testing.assert_array_equal(sol.shares, res.shares)
    with pytest.raises(StragglerError, match="did not solve"):
        solve_token_lp(p, time_limit=1e-9)  # the (shares, value) pair promises the optimum
    ok = solve_token_lp(p, full_output=True)
    assert ok.status is Status.OPTIMAL and ok.fallback is None and ok.value == 390.0


# An EPLB-placed decode batch (sim.workload, skew 0, E=64, 16 GPUs, 64 tokens per GPU) on
# which HiGHS 1.16 with presolve reports "Optimal" at 59.12 yet returns the warm-start vector
# (73.9): the milp method must notice and solve again.
STALE_COUNTS = [
    122, 130, 143, 116, 129, 108, 136, 104, 133, 165, 133, 120, 116, 106, 157, 149,
    124, 73, 152, 151, 98, 140, 132, 133, 145, 125, 118, 103, 115, 175, 154, 89,
    114, 106, 127, 140, 125, 169, 108, 133, 119, 148, 168, 111, 139, 155, 124, 99,
    132, 131, 130, 94, 167, 129, 117, 124, 151, 119, 67, 141, 127, 97, 161, 126,
]  # fmt: skip
STALE_GPUS = [
    [7], [13], [13, 14], [9], [4], [5], [1], [8], [15], [0], [0], [2], [2, 14], [12], [10],
    [7, 11], [1], [4], [12], [2], [3], [6], [10], [7], [0, 15], [11], [14], [2], [15], [4],
    [1, 2], [1, 4], [9], [5], [13], [3], [8], [15], [0, 4], [8, 12], [9, 10], [5, 11], [1],
    [14], [0], [7], [10], [11], [9], [13], [6], [7, 12], [11], [5], [9, 10], [3, 13], [12],
    [8], [14], [6], [3, 15], [6, 8], [3], [5, 6],
]  # fmt: skip


def test_stale_warm_start_is_detected():
    rep = np.zeros((64, 16), bool)
    for e, gs in enumerate(STALE_GPUS):
        rep[e, gs] = True
    p = DispatchProblem(counts=STALE_COUNTS, replicas=rep)
    cost = CostModel.preset("dsv3_a_offline")
    res = solve_dispatch(p, cost, method="milp")
    assert res.status is Status.OPTIMAL
    # 64 experts on 16 GPUs: at least 4 activations somewhere, and 4 each is attainable
    assert res.makespan == pytest.approx(4 * 14.78, rel=1e-9)
    assert res.makespan <= res.lower_bound * (1 + 1e-4) + 1e-9
