"""solvers.place_experts: EPLB's three maps, distinct, deterministic, never worse than its
EPLB starts under tempo's exact layer bound on the window it is built on; its search's
kernels equal their plain references and its Hall score bounds tempo's layer bound."""

import numpy as np
import pytest
from straggler.formulations import CostModel, DispatchProblem
from straggler.formulations.errors import InvalidInputError
from straggler.sim.workloads.batches import sample_counts, zipf_popularity
from straggler.solvers import place_experts, solve_dispatch
from straggler.solvers.placement.eplb import rebalance_experts


def _window(E=32, L=2, n=12, skew=1.2, tokens=256, seed=0):
    rng = np.random.default_rng(seed)
    pop = zipf_popularity(E, skew, n_layers=L, rng=rng)
    return np.stack([sample_counts(pop, n_tokens=tokens, top_k=4, rng=rng) for _ in range(n)])


def _tempo_mean(hist, p2l, g, cost):
    tot = 0.0
    for c in hist:
        p = DispatchProblem.from_placement(c, p2l, g)
        tot += float(np.sum(solve_dispatch(p, cost, method="tempo").makespan))
    return tot / len(hist)


def _bound_mean(hist, p2l, g, cost):
    """Mean of tempo's exact layer bound (token LP and semi-matching) over the window's
    batches, summed over the layers."""
    from straggler.solvers.placement.place import _mask_from_p2l, _Scorer

    E = hist.shape[-1]
    return sum(
        _Scorer(np.rint(hist[:, l]).astype(np.int64), cost)(_mask_from_p2l(p2l[l], E, g))
        for l in range(hist.shape[1])
    )


def _check_maps(p2l, l2p, cnt, E, P, g):
    L = p2l.shape[0]
    assert p2l.shape == (L, P) and cnt.shape == (L, E)
    per = P // g
    for l in range(L):
        for h in range(g):
            slots = p2l[l, h * per : (h + 1) * per]
            assert len(set(slots.tolist())) == per  # never two replicas on one GPU
        np.testing.assert_array_equal(np.bincount(p2l[l], minlength=E), cnt[l])
        for e in range(E):
            phys = l2p[l, e][l2p[l, e] >= 0]
            assert phys.size == cnt[l, e] and (p2l[l, phys] == e).all()
    assert (cnt >= 1).all()


@pytest.mark.parametrize("method", ["greedy", "local_search", "eplb"])
def test_maps_distinct_and_deterministic(method):
    hist = _window()
    out = place_experts(hist, 40, 1, 1, 4, cost="qwen3_30b_a_offline", method=method)
    _check_maps(*out, E=32, P=40, g=4)
    again = place_experts(hist, 40, 1, 1, 4, cost="qwen3_30b_a_offline", method=method)
    for a, b in zip(out, again):
        np.testing.assert_array_equal(a, b)


def test_eplb_method_is_eplb_distinct():
    hist = _window()
    p2l, _, cnt = place_experts(hist, 40, 1, 1, 4, method="eplb")
    ref, _, ref_cnt = rebalance_experts(hist.mean(axis=0), 40, 1, 1, 4, distinct=True)
    np.testing.assert_array_equal(cnt, ref_cnt)
    for l in range(2):
        for h in range(4):
            assert sorted(p2l[l, h * 10 : h * 10 + 10]) == sorted(ref[l, h * 10 : h * 10 + 10])


@pytest.mark.parametrize("seed", range(3))
def test_never_worse_than_start_on_its_window(seed):
    cost = CostModel.preset("qwen3_30b_a_offline")
    hist = _window(seed=seed, tokens=512)
    kw = dict(cost=cost, n_samples=len(hist), n_resamples=0)
    ls = place_experts(hist, 40, 1, 1, 4, method="local_search", **kw)[0]
    ep = place_experts(hist, 40, 1, 1, 4, method="eplb", **kw)[0]
    assert _bound_mean(hist, ls, 4, cost) <= _bound_mean(hist, ep, 4, cost)


def test_search_can_improve():
    """The moves matter: on a mixed-regime window (128 experts, 8 GPUs, 512 tokens per GPU,
    s = 1.5) the search lowers tempo's mean makespan on the window (it is not a no-op)."""
    cost = CostModel.preset("qwen3_30b_a_offline")
    hist = _window(E=128, seed=0, tokens=4096, skew=1.5, n=16)
    ls = place_experts(hist, 160, 1, 1, 8, cost=cost, method="local_search", max_evals=80)[0]
    ep = place_experts(hist, 160, 1, 1, 8, cost=cost, method="eplb")[0]
    assert _tempo_mean(hist, ls, 8, cost) < _tempo_mean(hist, ep, 8, cost)


@pytest.mark.parametrize("method", ["greedy", "local_search"])
def test_two_nodes_keep_replicas_on_their_node(method):
    """EPLB's group-to-node packing is kept: each node holds the experts EPLB gives it."""
    hist = _window(E=32)
    p2l, _, _ = place_experts(hist, 48, 4, 2, 4, method=method)
    ep, _, _ = place_experts(hist, 48, 4, 2, 4, method="eplb")
    for l in range(2):
        for half in (slice(0, 24), slice(24, 48)):
            assert set(p2l[l, half].tolist()) == set(ep[l, half].tolist())


@pytest.mark.parametrize(
    "args, kw",
    [
        ((np.zeros((2, 2, 3, 4)), 8, 1, 1, 2), {}),
        ((np.ones((2, 8)), 9, 1, 1, 2), {}),
        ((np.ones((2, 8)), 40, 1, 1, 2), {}),  # 20 slots per GPU > 8 experts
        ((np.ones((2, 8)), 8, 1, 1, 2), {"method": "annealing"}),
        ((np.ones((2, 8)), 6, 1, 1, 2), {"method": "greedy"}),  # fewer slots than experts
        ((np.ones((2, 8)), 20, 4, 2, 4), {"method": "greedy"}),  # 5 slots, 4 experts a node
        ((np.ones((2, 9)), 10, 2, 2, 2), {"method": "greedy"}),  # 9 experts in 2 groups
        ((-np.ones((2, 8)), 8, 1, 1, 2), {}),
        ((np.ones((2, 8)), 8, 1, 1, 2), {"cost": 3}),
        ((np.ones((2, 8)), 8, 1, 1, 2), {"patience": 0}),
    ],
)
def test_bad_input(args, kw):
    with pytest.raises(InvalidInputError):
        place_experts(*args, **kw)


def test_repair_fills_duplicates_distinctly():
    from straggler.solvers.placement.place import _mask_from_p2l, _repair

    # upstream EPLB puts two replicas of the hot expert on GPU 0 (slots 0-2)
    p2l, _, _ = rebalance_experts([[9, 1, 1, 1]], 6, 1, 1, 2)
    assert p2l[0].tolist() == [0, 0, 3, 0, 1, 2]
    mask = _mask_from_p2l(p2l[0], 4, 2)
    assert mask.sum(axis=0).tolist() == [2, 3]  # the duplicate collapsed
    fixed = _repair(mask, np.array([9.0, 1, 1, 1]), np.zeros(2, dtype=np.int64), 3)
    assert fixed.sum(axis=0).tolist() == [3, 3] and (fixed >= mask).all()
    assert fixed[:, 0].tolist() == [True, True, False, True]  # expert 1: best 1/1, lowest index


def test_resampled_batches_are_scored():
    """The search also scores batches resampled expert by expert from the window: each
    expert's counts are ones it had in the window, seeded, and they change the result."""
    from straggler.solvers.placement.place import _resample

    hist = _window(seed=4, tokens=512, skew=1.5)
    extra = _resample(hist[:, 0], 32, 0)
    assert extra.shape == (32, 32)
    for e in range(32):  # every count is one the expert had in some batch of the window
        assert np.isin(extra[:, e], hist[:, 0, e]).all()
    np.testing.assert_array_equal(extra, _resample(hist[:, 0], 32, 0))
    # each expert's counts are the window's, each batch used n / T times (T divides n)
    T = hist.shape[0]
    twice = _resample(hist[:, 0], 2 * T, 0)
    for e in range(32):
        np.testing.assert_array_equal(np.sort(twice[:, e]), np.sort(np.tile(hist[:, 0, e], 2)))
    other = _window(E=64, L=1, n=8, seed=5, tokens=512)  # where the resamples matter
    kw = dict(cost="qwen3_30b_a_offline")
    kw = dict(kw, method="local_search")
    alone = place_experts(other, 80, 1, 1, 8, n_resamples=0, **kw)[0]
    assert not np.array_equal(alone, place_experts(other, 80, 1, 1, 8, **kw)[0])


def _random_layout(rng):
    """A random distinct placement holding every expert, and batches with zeros and ties."""
    E, g = int(rng.integers(3, 12)), int(rng.integers(1, 5))
    per = int(rng.integers(-(-E // g), E + 1))
    while True:
        slots = np.array([np.sort(rng.choice(E, per, replace=False)) for _ in range(g)])
        if np.unique(slots).size == E:
            break
    counts = rng.poisson(rng.uniform(0, 30, E), size=(int(rng.integers(1, 6)), E))
    counts[:, rng.random(E) < 0.3] = 0
    return slots.astype(np.int64), counts.astype(np.int64)


_COSTS = [CostModel.preset("dsv3_a_offline"), CostModel.preset("qwen3_30b_a_offline"),
          CostModel(a=16.4, b=2.99, c=15.6, beta=0.0179, c2=25, gamma=0.1)]  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_hall_score_bounds_tempos_layer_bound(seed):
    """The Hall score is a lower bound of the mean exact layer bound (token LP and optimal
    semi-matching), and equals it when every expert has one replica."""
    from straggler.solvers.placement._kernels import hall_score_kernel
    from straggler.solvers.placement.place import _cost_args, _Scorer

    rng = np.random.default_rng(seed)
    slots, counts = _random_layout(rng)
    cost = _COSTS[seed % 3]
    mask = np.zeros((counts.shape[1], slots.shape[0]), bool)
    mask[slots, np.arange(slots.shape[0])[:, None]] = True
    hall = hall_score_kernel(slots, counts, counts.mean(0), 0.0, *_cost_args(cost))
    exact = _Scorer(counts, cost)(mask)
    assert hall <= exact * (1 + 1e-12)
    if (mask.sum(axis=1) == 1).all():
        assert hall == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_search_kernels_equal_their_references(seed):
    """kernel == its py_func == the plain reference, bit for bit: the Hall score, the
    search (slots, score, evaluations; one and two nodes) and EPLB's distinct packing."""
    from straggler.solvers.placement import _eplb_kernels as ek
    from straggler.solvers.placement import _kernels as pk
    from straggler.solvers.placement.place import _cost_args

    rng = np.random.default_rng(seed)
    slots, counts = _random_layout(rng)
    args = (counts.mean(0), [0.0, 0.5, 1.0][seed % 3], *_cost_args(_COSTS[seed % 3]))
    g = slots.shape[0]
    hk = pk.hall_score_kernel
    scores = [f(slots, counts, *args) for f in (hk, getattr(hk, "py_func", hk))]
    assert scores[0] == scores[1] == pk.hall_score_reference(slots, counts, *args)
    nodes = np.arange(g) // 2 if seed % 2 and g % 2 == 0 else np.zeros(g, np.int64)
    stats = ((counts > 0).mean(0), counts.mean(0), np.stack([counts.max(0) * 1.0, counts.mean(0)]))
    sk = pk.placement_search_kernel
    outs = [
        f(slots, counts, *stats, nodes, *args[1:], 60, [5, 12, 1000][seed % 3])
        for f in (sk, getattr(sk, "py_func", sk), pk.placement_search_reference)
    ]  # fmt: skip
    for other in outs[1:]:
        np.testing.assert_array_equal(outs[0][0], other[0])
        assert outs[0][1:] == other[1:]
    assert outs[0][1] <= scores[0]
    # EPLB's distinct packing: labels with at most m items each, integer weights (ties)
    m = int(rng.integers(1, 5))
    labels = np.concatenate([rng.permutation(m * 3) % (m + 2) for _ in range(2)]).reshape(2, -1)
    w = np.round(rng.random(labels.shape) * 6).astype(np.float32)
    cases = [(w, labels, m), (np.array([[3, 3, 7, 7, 8, 2]], np.float32), [[0, 1, 2, 3, 4, 4]], 3)]
    dk = ek.packing_distinct_kernel
    for w, labels, m in cases:  # the second one takes the swap repair
        labels = np.asarray(labels, dtype=np.int64)
        order = np.argsort(-w, axis=-1, kind="stable")
        outs = [
            f(w, order, labels, m)
            for f in (dk, getattr(dk, "py_func", dk), ek.packing_distinct_reference)
        ]  # fmt: skip
        for other in outs[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(outs[0], other))


@pytest.mark.parametrize("seed", range(12))
def test_search_ends_where_no_candidate_improves(seed):
    """Rejected candidates are skipped until a full pass: when the search stops before its
    budget, a new search from its result finds nothing (same slots, same score, one full
    round of evaluations) though it skips nothing."""
    from straggler.solvers.placement import _kernels as pk
    from straggler.solvers.placement.place import _cost_args

    rng = np.random.default_rng(seed)
    slots, counts = _random_layout(rng)
    g = slots.shape[0]
    stats = ((counts > 0).mean(0), counts.mean(0), np.stack([counts.max(0) * 1.0, counts.mean(0)]))
    args = (np.zeros(g, np.int64), 0.5, *_cost_args(_COSTS[seed % 3]))
    sk = pk.placement_search_kernel
    end, score, evals = sk(slots, counts, *stats, *args, 10_000, 10_000)
    assert evals < 10_000
    again, score2, evals2 = sk(end, counts, *stats, *args, 10_000, 10_000)
    np.testing.assert_array_equal(again, end)
    assert score2 == score and evals2 <= evals


def test_warmup_reaches_the_placement_kernels():
    from straggler.runtime.warmup import warmup
    from straggler.solvers.placement.place import placement_kernels

    rep = warmup(dispatch=False, routing=False, simulator=False, placement=True)
    assert [s.name for s in rep.steps] == ["place_experts"]
    assert len(placement_kernels()) == 7
    assert all(k.signatures for k in placement_kernels().values())
    with pytest.raises(InvalidInputError):
        warmup(placement="yes")


@pytest.mark.parametrize("seed", range(4))
def test_search_from_scratch_against_the_exhaustive_optimum(seed):
    """6 experts, 3 GPUs of 3 slots: the exhaustive reference (the exact layer bound's
    optimum on the window) is never beaten, and the search never ends above either EPLB
    start under that bound."""
    from straggler.solvers.placement.place import _mask_from_p2l, _Scorer

    rng = np.random.default_rng(seed)
    hist = rng.poisson(rng.choice([200.0, 60, 20, 5, 1, 0.5], 6, replace=False), (4, 1, 6))
    score = _Scorer(hist[:, 0], CostModel.preset("qwen3_30b_a_offline"))
    kw = dict(cost="qwen3_30b_a_offline", n_samples=4)
    vals = {
        m: score(_mask_from_p2l(place_experts(hist, 9, 1, 1, 3, method=m, **kw)[0][0], 6, 3))
        for m in ("exhaustive", "local_search", "eplb")
    }
    assert vals["exhaustive"] <= vals["local_search"] <= vals["eplb"]


def test_score_by_hand():
    """Two GPUs, expert 0 on both, 1 on GPU 0, 2 on GPU 1, time = max(G, N), batch
    (4, 3, 1). Hall bound: max(ceil(3 / 2), (4 + 3 + 1) / 2) = 4. Greedy dispatch: rigid
    loads G = (1, 1), N = (3, 1); expert 0 whole ends at max(2, 7) = 7 on GPU 0, max(2, 5)
    = 5 on GPU 1, split (2 + 2) at max(5, 3) = 5, not lower: whole on GPU 1, makespan 5."""
    from straggler.solvers.placement import _kernels as pk

    slots = np.array([[0, 1], [0, 2]], np.int64)
    counts = np.array([[4, 3, 1]], np.int64)
    cost = (0.0, 1.0, 0.0, 1.0, 0.0, 0.0, False)
    for w, want in ((0.0, 4.0), (1.0, 5.0), (0.5, 4.5)):
        for f in (pk.hall_score_kernel, pk.hall_score_reference):
            assert f(slots, counts, np.array([4.0, 3, 1]), w, *cost) == want


def _random_window(rng):
    """A window ``(T, L, E)`` with dead experts, spikes and ties, each expert's node (one or
    two nodes, each holding E / n_nodes experts) and a layout the greedy placement can fill:
    ``(counts, expert_node, n_nodes, P, g)``."""
    n_nodes, gpn = int(rng.integers(1, 3)), int(rng.integers(1, 5))
    epn = int(rng.integers(1, 9))
    per = int(rng.integers(-(-epn // gpn), epn + 1))  # fits, no expert twice on a GPU
    T, L, E = int(rng.integers(1, 5)), int(rng.integers(1, 3)), epn * n_nodes
    counts = rng.poisson(rng.choice([0.0, 0.5, 3, 30, 300], E), size=(T, L, E))
    node = np.stack([rng.permutation(np.repeat(np.arange(n_nodes), epn)) for _ in range(L)])
    return (
        counts.astype(np.int64),
        node.astype(np.int64),
        n_nodes,
        per * gpn * n_nodes,
        gpn * n_nodes,
    )


def _check_greedy(out, expert_node, n_nodes, P, g):
    """Distinct, every expert placed, exact slot counts, each replica on its expert's node."""
    p2l, l2p, cnt = out
    L, E = cnt.shape
    _check_maps(p2l, l2p, cnt, E, P, g)
    gpn, per = g // n_nodes, P // g
    assert (cnt <= gpn).all()
    for l in range(L):
        for h in range(g):
            assert (expert_node[l, p2l[l, h * per : (h + 1) * per]] == h // gpn).all()


# one instance where a late replicated expert finds room only on GPUs that hold it: the
# one swap of the packing (three-term cost, two nodes)
_SWAP_CASE = (
    np.array([[[0, 0, 29, 33, 304, 6, 3, 3, 0, 4, 316, 4, 0, 23]],
              [[0, 1, 32, 28, 325, 3, 4, 3, 0, 2, 291, 3, 0, 30]]], np.int64),
    np.array([[1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 0, 1, 1, 0]], np.int64), 2, 20, 4,
)  # fmt: skip


@pytest.mark.parametrize("seed", [*range(40), "swap"])
def test_greedy_kernel_equals_its_reference(seed):
    """kernel == its py_func == the plain reference, bit for bit (all three maps), and the
    placement keeps every constraint."""
    from straggler.solvers.placement import _greedy as pg
    from straggler.solvers.placement.place import _cost_args

    if seed == "swap":
        case, cost, alpha = _SWAP_CASE, _COSTS[2], 2.0
    else:
        case, cost = _random_window(np.random.default_rng(seed)), _COSTS[seed % 3]
        alpha = [2.0, 0.5, 4.0][seed % 3]
    args = (*case, alpha, 0.2, *_cost_args(cost))
    k = pg.greedy_placement_kernel
    outs = [f(*args) for f in (k, getattr(k, "py_func", k), pg.greedy_placement_reference)]
    for other in outs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(outs[0], other))
    _check_greedy(outs[0], *case[1:])


def test_greedy_swap_case_takes_the_swap():
    """The pinned instance does reach the swap: packing without it leaves a replica with
    room only on GPUs that hold its expert (the reference, stopped there, raises)."""
    import inspect

    from straggler.solvers.placement import _greedy as pg
    from straggler.solvers.placement.place import _cost_args

    src = inspect.getsource(pg.greedy_placement_reference)
    src = src.replace(
        "else:  # the one swap", "else:  # the one swap\n" + " " * 24 + "raise KeyError"
    )
    ns = {"np": np}
    exec(src, ns)
    with pytest.raises(KeyError):
        ns["greedy_placement_reference"](*_SWAP_CASE, 2.0, 0.2, *_cost_args(_COSTS[2]))


def test_greedy_is_the_default_from_scratch():
    """Without a move budget the default is the greedy placement (with ``previous``: its
    slots arranged as before); with one, the rebalance keeps the local search's target."""
    hist = _window(E=32)
    kw = dict(cost="qwen3_30b_a_offline")
    greedy = place_experts(hist, 40, 1, 1, 4, method="greedy", **kw)
    for a, b in zip(place_experts(hist, 40, 1, 1, 4, **kw), greedy):
        np.testing.assert_array_equal(a, b)
    old = place_experts(hist, 40, 1, 1, 4, method="eplb", **kw)[0]
    kept = place_experts(hist, 40, 1, 1, 4, previous=old, **kw)[0]
    for l in range(2):
        for h in range(4):
            assert sorted(kept[l, 10 * h : 10 * h + 10]) == sorted(
                greedy[0][l, 10 * h : 10 * h + 10]
            )
    moves = dict(previous=old, max_moves=3, **kw)
    np.testing.assert_array_equal(
        place_experts(hist, 40, 1, 1, 4, **moves)[0],
        place_experts(hist, 40, 1, 1, 4, method="local_search", **moves)[0],
    )


def test_greedy_spreads_replica_sets():
    """Every expert live in every batch, equal loads: 128 experts, 8 GPUs of 20 slots, so 32
    experts get a second replica. Packed by load alone (``spread=0``) their replica pairs
    fall on few GPU pairs; with the spread term no two GPUs share more than two of them, and
    tempo's makespan meets the floor ``ceil(128 / 8) = 16`` activations in every batch."""
    from straggler.solvers.placement import _greedy as pg
    from straggler.solvers.placement.place import _cost_args

    cost = CostModel.preset("qwen3_30b_a_offline")
    rng = np.random.default_rng(0)
    hist = rng.poisson(60, size=(8, 1, 128)) + 1
    args = (hist, np.zeros((1, 128), np.int64), 1, 160, 8, 2.0)

    def pair_counts(p2l):
        on = np.zeros((128, 8), bool)
        on[p2l[0], np.arange(160) // 20] = True
        rep = on[on.sum(1) == 2]
        return rep.T.astype(int) @ rep.astype(int) - np.diag(rep.sum(0))

    packed = pg.greedy_placement_kernel(*args, 0.0, *_cost_args(cost))[0]
    spread = pg.greedy_placement_kernel(*args, 0.2, *_cost_args(cost))[0]
    assert pair_counts(packed).max() > 2 >= pair_counts(spread).max()
    floor = cost.b * 16
    for c in hist[:4]:
        p = DispatchProblem.from_placement(c, spread, 8)
        assert float(np.sum(solve_dispatch(p, cost, method="tempo").makespan)) == pytest.approx(
            floor
        )
