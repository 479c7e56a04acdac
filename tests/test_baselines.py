"""Every registered dispatch method through one checker; each baseline's defining behaviour."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from straggler.baselines.dispatch.llep import llep_plan
from straggler.baselines.dispatch.metro import metro_exact, metro_greedy
from straggler.baselines.dispatch.moonep import MoonEP, moonep_plan
from straggler.formulations import (
    BackendUnavailableError,
    CostModel,
    DispatchProblem,
    InvalidInputError,
    InvalidOptionError,
    Status,
    check_shares,
    evaluate,
)
from straggler.sim.workloads.batches import make_decode_problem
from straggler.solvers import dispatch_methods, solve_dispatch
from straggler.solvers.dispatch.registry import get_dispatch_method

FIG1B = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
FIG1B_COST = CostModel(a=0, b=15, c=0, beta=0.1)


def _random_instance(seed, n_experts, n_gpus, *, p_extra=0.3, zipf=1.0, scale=60):
    rng = np.random.default_rng(seed)
    rep = rng.random((n_experts, n_gpus)) < p_extra
    rep[np.arange(n_experts), rng.integers(n_gpus, size=n_experts)] = True
    pop = 1.0 / np.arange(1, n_experts + 1) ** zipf
    counts = rng.poisson(scale * rng.permutation(pop) / pop.mean())
    return DispatchProblem(counts=counts, replicas=rep)


def _instances():
    """(id, problem, cost): full and restricted replication, zero counts, one GPU, stacks."""
    restricted = DispatchProblem(
        counts=[50, 0, 7, 7, 130, 1],
        replicas=[[1, 1, 0], [0, 0, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1], [0, 0, 1]],
    )
    three_term = CostModel(a=2, b=3, c=1, beta=0.05, b2=1, tile=8, c2=0.5, gamma=0.02)
    stack = DispatchProblem(
        counts=[[9, 0, 4, 12], [0, 3, 3, 20]],
        replicas=np.array(
            [
                [[1, 0], [0, 1], [1, 1], [0, 1]],
                [[1, 1], [1, 0], [0, 1], [1, 0]],
            ],
            bool,
        ),
    )
    return [
        ("fig1b", FIG1B, FIG1B_COST),
        ("restricted_tiles_traffic", restricted, three_term),
        ("one_gpu", DispatchProblem(counts=[5, 0, 3], replicas=np.ones((3, 1), bool)), FIG1B_COST),
        ("all_zero", DispatchProblem(counts=[0, 0], replicas=np.ones((2, 2), bool)), FIG1B_COST),
        ("stack", stack, CostModel(a=1, b=4, c=0, beta=0.5)),
        ("random_16x4", _random_instance(7, 16, 4), CostModel.preset("dsv3_a_offline")),
    ]


INSTANCES = _instances()
_OPT: dict[str, np.ndarray] = {}


def _optimum(iid, problem, cost):
    """Per-layer optimum from the MILP (None when it is not registered or not proved)."""
    if "milp" not in dispatch_methods():
        return None
    if iid not in _OPT:
        res = solve_dispatch(problem, cost, method="milp", time_limit=20, mip_rel_gap=0)
        _OPT[iid] = np.atleast_1d(res.makespan) if res.status is Status.OPTIMAL else None
    return _OPT[iid]


@pytest.mark.parametrize("method", dispatch_methods())
def test_every_method_is_feasible_and_scored_by_the_evaluator(method):
    """Each registered method, on every instance: feasible shares, evaluator's makespan,
    a lower bound under it, never below the MILP optimum (methods on the replica mask)."""
    for iid, problem, cost in INSTANCES:
        where = f"method {method!r} on instance {iid!r}"
        try:
            res = solve_dispatch(problem, cost, method=method, time_limit=10, rng=0)
        except BackendUnavailableError as exc:  # an optional backend is not installed
            pytest.skip(f"{where}: {exc}")
        cls = get_dispatch_method(method)
        moves = getattr(cls, "moves_weights", False)
        mask = problem.replicas
        if moves:  # weight-moving methods report the mask they dispatched on
            layers = res.extras["layers"] if problem.is_stack else [res.extras]
            mask = np.stack([x["replicas"] for x in layers]).reshape(problem.replicas.shape)
            if not getattr(cls, "own_placement", False):  # others only add replicas
                assert (mask >= problem.replicas).all(), where
        try:
            check_shares(DispatchProblem(counts=problem.counts, replicas=mask), res.shares)
        except Exception as exc:
            raise AssertionError(f"{where}: infeasible shares: {exc}") from exc
        ev = evaluate(problem, cost, res.shares)
        assert np.allclose(res.makespan, ev.makespan), where
        assert np.allclose(res.gpu_time, ev.times), where
        assert res.method == method, where
        assert res.status in (Status.OPTIMAL, Status.HEURISTIC, Status.FEASIBLE), where
        if moves:
            continue
        mk = np.atleast_1d(res.makespan)
        lb = np.atleast_1d(res.lower_bound)
        assert (lb <= mk * (1 + 1e-9) + 1e-9).all(), f"{where}: bound {lb} above {mk}"
        opt = _optimum(iid, problem, cost)
        if opt is not None:
            assert (mk >= opt * (1 - 1e-7) - 1e-7).all(), f"{where}: {mk} below optimum {opt}"


# --- TEMPO Fig. 1b: the paper's three numbers ---------------------------------------------


def test_fig1b_uniform_105_metro_69_optimum_60():
    assert solve_dispatch(FIG1B, FIG1B_COST, method="uniform").makespan == 105.0
    assert solve_dispatch(FIG1B, FIG1B_COST, method="uniform", integer=False).makespan == 105.0
    assert solve_dispatch(FIG1B, FIG1B_COST, method="metro").makespan == 69.0
    # METRO's exact variant only guarantees max G = 4; both 4/3 splits of the 7 experts are
    # METRO-optimal: the hot expert with three cold ones (69) or with two (66)
    exact = solve_dispatch(FIG1B, FIG1B_COST, method="metro", exact=True)
    assert exact.extras["max_G"] == 4 and exact.makespan in (66.0, 69.0)
    if "milp" in dispatch_methods():
        assert solve_dispatch(FIG1B, FIG1B_COST, method="milp").makespan == pytest.approx(60.0)


@pytest.mark.parametrize(
    "method, options",
    [
        ("static", {}),
        ("static", {"rule": "random"}),
        ("static", {"rule": "first"}),
        ("static", {"version": "same_gpu"}),
        ("sglang_dynamic", {}),
        ("sglang_dynamic", {"version": "uniform"}),
        ("vllm_ep", {}),
        ("vllm_ep", {"version": "modulo"}),
        ("vllm_ep", {"version": "random"}),
        ("sglang_lp", {}),
        ("lplb", {}),
        ("lplb", {"solver": "ipm"}),
        ("uniform", {}),
        ("metro", {}),
        ("metro", {"exact": True}),
        ("metro", {"order": "index"}),
        ("llep", {"min_chunk": 8}),
        ("llep", {"min_chunk": 8, "threshold": None}),
        ("moonep", {}),
    ],
)
def test_whole_token_baselines(method, options):
    """The real systems split by tokens: whole-token shares, conserved exactly."""
    p = make_decode_problem("qwen3_30b", n_gpus=4, tokens_per_gpu=16, n_layers=2, seed=3)
    res = solve_dispatch(p, FIG1B_COST, method=method, **options)
    assert (res.shares == np.round(res.shares)).all(), method
    assert (res.shares.sum(axis=-1) == p.counts).all(), method


# --- uniform ------------------------------------------------------------------------------


def test_uniform_integer_and_fluid_splits():
    p = DispatchProblem(counts=[7, 1, 0, 6], replicas=[[1, 1, 1], [1, 0, 1], [1, 1, 0], [0, 1, 1]])
    cost = CostModel(a=0, b=1, c=0, beta=0)
    x = solve_dispatch(p, cost, method="uniform").shares
    assert x.tolist() == [[3, 2, 2], [1, 0, 0], [0, 0, 0], [0, 3, 3]]
    y = solve_dispatch(p, cost, method="uniform", integer=False).shares
    assert np.allclose(y, [[7 / 3] * 3, [0.5, 0, 0.5], [0, 0, 0], [0, 3, 3]])
    # the fluid split activates both replicas of the 1-token expert, the integer one does not
    assert evaluate(p, cost, y).G.tolist() == [2, 2, 3]
    assert evaluate(p, cost, x).G.tolist() == [2, 2, 2]


# --- static -------------------------------------------------------------------------------


def test_static_first_replica_is_lowest_gpu():
    p = DispatchProblem(counts=[5, 3, 0], replicas=[[0, 1, 1], [1, 0, 1], [1, 1, 1]])
    x = solve_dispatch(p, FIG1B_COST, method="static", rule="first").shares
    assert x.tolist() == [[0, 5, 0], [3, 0, 0], [0, 0, 0]]


def test_static_random_is_a_fixed_table():
    rep = np.ones((6, 4), bool)
    a = solve_dispatch(
        DispatchProblem(counts=[5, 3, 1, 2, 9, 4], replicas=rep),
        FIG1B_COST,
        method="static",
        rule="random",
        seed=3,
    )
    b = solve_dispatch(
        DispatchProblem(counts=[1, 1, 7, 8, 2, 6], replicas=rep),
        FIG1B_COST,
        method="static",
        rule="random",
        seed=3,
        rng=99,
    )
    # same seed and mask: the same replica for every expert, whatever the batch and rng
    assert ((a.shares > 0) == (b.shares > 0)).all()
    assert ((a.shares > 0).sum(axis=1) == 1).all()
    tables = {
        tuple(
            solve_dispatch(
                DispatchProblem(counts=[1] * 6, replicas=rep),
                FIG1B_COST,
                method="static",
                rule="random",
                seed=s,
            ).shares.argmax(axis=1)
        )
        for s in range(10)
    }
    assert len(tables) > 1  # the seed matters


def test_static_bad_options():
    with pytest.raises(InvalidOptionError, match="'rule'"):
        solve_dispatch(FIG1B, FIG1B_COST, method="static", rule="nearest")


# --- METRO --------------------------------------------------------------------------------


def _max_g(gpu_of, counts, n_gpus):
    live = counts > 0
    return int(np.bincount(gpu_of[live], minlength=n_gpus).max()) if live.any() else 0


def _brute_min_max_g(counts, rep):
    live = np.flatnonzero(counts > 0)
    best = 0 if live.size == 0 else live.size
    for choice in itertools.product(*[np.flatnonzero(rep[e]) for e in live]):
        best = min(best, int(np.bincount(np.array(choice), minlength=rep.shape[1]).max()))
    return best


def test_metro_exact_equals_brute_force_and_beats_greedy():
    worse = 0
    for seed in range(150):
        rng = np.random.default_rng(seed)
        E, g = int(rng.integers(1, 8)), int(rng.integers(1, 4))
        p = _random_instance(seed, E, g, p_extra=float(rng.random()), scale=5)
        n, rep = p.counts, p.replicas
        greedy, exact = metro_greedy(n, rep), metro_exact(n, rep)
        for gpu_of in (greedy, exact):
            live = n > 0
            assert rep[np.flatnonzero(live), gpu_of[live]].all(), seed
            assert (gpu_of[~live] == -1).all()
        opt = _brute_min_max_g(n, rep)
        assert _max_g(exact, n, g) == opt, seed
        assert _max_g(greedy, n, g) >= opt, seed
        worse += _max_g(greedy, n, g) > opt
    assert worse > 0  # the instances are hard enough to separate greedy from exact


def test_metro_greedy_order_and_ties():
    # descending tokens (ties: lower expert first), least activated GPU (ties: lower index)
    rep = np.array([[1, 1], [1, 1], [1, 1], [0, 1]], bool)
    assert metro_greedy(np.array([5, 9, 5, 1]), rep).tolist() == [1, 0, 0, 1]


# --- LLEP ---------------------------------------------------------------------------------


def test_llep_cap_and_pending_native_load():
    # N = 16 on 2 GPUs: cap = int(1.1 * 8) = 8; every expert is native to GPU 0. Expert 0
    # (9 tokens) sees GPU 0's effective load 7 (the 7 tokens of experts still pending), keeps
    # 1 and spills 8; the others then fit on GPU 0 exactly.
    x, cap = llep_plan(np.array([9, 3, 2, 2]), np.ones((4, 2), bool), min_chunk=1)
    assert cap == 8
    assert x.tolist() == [[1, 8], [3, 0], [2, 0], [2, 0]]


def test_llep_min_chunk():
    rep = np.ones((1, 3), bool)
    # N = 30 on 3 GPUs: cap 11; native keeps 11, 19 spill
    x, _ = llep_plan(np.array([30]), rep, min_chunk=10)
    assert x.tolist() == [[11, 11, 8]]  # chunk 11 >= 10, then the remainder 8 is allowed
    x, _ = llep_plan(np.array([30]), rep, min_chunk=12)
    # no helper can take a chunk of 12: the whole remainder goes to the least-loaded
    # helper (tie: lower index), over the cap
    assert x.tolist() == [[11, 19, 0]]


def test_llep_spills_only_to_replicas_and_single_replica_stays_whole():
    rep = np.array([[1, 0, 1], [0, 1, 0], [1, 0, 0]], bool)
    x, cap = llep_plan(np.array([40, 2, 3]), rep, min_chunk=1)
    assert cap == int(1.1 * 15)
    assert x.tolist() == [[13, 0, 27], [0, 2, 0], [3, 0, 0]]
    assert (x[~rep] == 0).all()
    x, _ = llep_plan(np.array([40, 2, 3]), np.eye(3, dtype=bool), min_chunk=1)
    assert x.tolist() == [[40, 0, 0], [0, 2, 0], [0, 0, 3]]


def test_llep_whole_tokens_and_bad_options():
    p = _random_instance(3, 32, 8, scale=200)
    x = solve_dispatch(p, FIG1B_COST, method="llep", min_chunk=16).shares
    assert (x == np.round(x)).all()
    # a bad value is an InvalidInputError (the validation module's), an unknown choice its
    # subclass InvalidOptionError
    with pytest.raises(InvalidInputError, match="'cap_factor'"):
        solve_dispatch(p, FIG1B_COST, method="llep", cap_factor=0)
    with pytest.raises(InvalidInputError, match="'min_chunk'"):
        solve_dispatch(p, FIG1B_COST, method="llep", min_chunk=0.5)


# --- MoonEP -------------------------------------------------------------------------------


@given(
    st.integers(1, 6).flatmap(
        lambda g: st.tuples(
            st.just(g),
            st.lists(st.integers(0, 300), min_size=g, max_size=4 * g),
            st.integers(0, 2**31),
        )
    )
)
def test_moonep_invariants(args):
    g, counts, seed = args
    counts = np.array(counts)
    rng = np.random.default_rng(seed)
    rep = rng.random((counts.size, g)) < 0.3
    rep[np.arange(counts.size), rng.integers(g, size=counts.size)] = True
    alloc, home, quota = moonep_plan(counts, rep)
    N = counts.sum()
    # conservation, non-negativity, perfect balance (targets N // g, +1 for the first N % g)
    assert (alloc >= 0).all()
    assert (alloc.sum(axis=1) == counts).all()
    target = np.full(g, N // g)
    target[: N % g] += 1
    assert (alloc.sum(axis=0) == target).all()
    # each receiving rank is fed by one donor; tokens leave only from an expert's home
    assert ((quota > 0).sum(axis=0) <= 1).all()
    for e in range(counts.size):
        off = np.flatnonzero(alloc[e] > 0)
        assert set(off) <= {home[e]} | set(np.flatnonzero(quota[home[e]] > 0))
    # at most two segments per local expert slot: own experts plus one donor's experts
    own = np.bincount(home, minlength=g)
    for d in range(g):
        donors = np.flatnonzero(quota[:, d] > 0)
        bound = own[d] + (own[donors[0]] if donors.size else 0)
        assert (alloc[:, d] > 0).sum() <= bound


def test_moonep_accounting_and_augmented_mask():
    rep = np.zeros((7, 2), bool)
    rep[:4, 0] = True
    rep[4:, 1] = True
    p = DispatchProblem(counts=[600] + [30] * 6, replicas=rep)
    res = solve_dispatch(p, FIG1B_COST, method="moonep")
    ex = res.extras
    assert res.shares.sum(axis=0).tolist() == [390.0, 390.0]
    assert ex["moved_replicas"].sum() == ex["n_moved"] == 1 and ex["moved_replicas"][0, 1]
    with pytest.raises(Exception, match="zero where no replica"):
        check_shares(p, res.shares)  # a weight moved: off the problem's mask
    check_shares(DispatchProblem(counts=p.counts, replicas=ex["replicas"]), res.shares)
    assert res.makespan == ex["makespan_weight_free"] == 60.0
    assert ex["makespan_charged"] == 60.0 + 4 * 15.0
    assert np.allclose(ex["gpu_time_charged"], res.gpu_time + [0, 60.0])
    free = solve_dispatch(p, FIG1B_COST, method="moonep", charge_ratio=0)
    assert free.extras["makespan_charged"] == free.makespan
    # no move when the home placement is already balanced
    p = DispatchProblem(counts=[5, 5], replicas=np.eye(2, dtype=bool))
    assert solve_dispatch(p, FIG1B_COST, method="moonep").extras["n_moved"] == 0
    assert MoonEP.moves_weights


def test_moonep_uses_static_replicas_without_charge():
    # expert 0's segment lands on GPU 1, which already holds a replica of it
    p = DispatchProblem(counts=[10, 0], replicas=[[1, 1], [0, 1]])
    res = solve_dispatch(p, FIG1B_COST, method="moonep")
    assert res.shares.tolist() == [[5, 5], [0, 0]]
    assert res.extras["n_moved"] == 0
    check_shares(p, res.shares)
