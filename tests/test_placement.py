"""solvers.place_experts: EPLB's three maps, distinct, deterministic, never worse than its
start under tempo on the window it is built on."""

import numpy as np
import pytest
from straggler.formulations import CostModel, DispatchProblem
from straggler.formulations.errors import InvalidInputError
from straggler.sim.workload import sample_counts, zipf_popularity
from straggler.solvers import place_experts, solve_dispatch
from straggler.solvers.eplb import rebalance_experts


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


@pytest.mark.parametrize("method", ["local_search", "eplb"])
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
    ls = place_experts(hist, 40, 1, 1, 4, **kw)[0]
    ep = place_experts(hist, 40, 1, 1, 4, method="eplb", **kw)[0]
    assert _tempo_mean(hist, ls, 4, cost) <= _tempo_mean(hist, ep, 4, cost) + 1e-9


def test_search_can_improve():
    """The moves matter: on a mixed-regime window (128 experts, 8 GPUs, 512 tokens per GPU,
    s = 1.5) the search lowers tempo's mean makespan on the window (it is not a no-op)."""
    cost = CostModel.preset("qwen3_30b_a_offline")
    hist = _window(E=128, seed=0, tokens=4096, skew=1.5, n=16)
    ls = place_experts(hist, 160, 1, 1, 8, cost=cost, max_evals=80)[0]
    ep = place_experts(hist, 160, 1, 1, 8, cost=cost, method="eplb")[0]
    assert _tempo_mean(hist, ls, 8, cost) < _tempo_mean(hist, ep, 8, cost)


def test_two_nodes_keep_replicas_on_their_node():
    hist = _window(E=32)
    p2l, _, _ = place_experts(hist, 48, 4, 2, 4)
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
        ((np.ones((2, 8)), 8, 1, 1, 2), {"method": "greedy"}),
        ((-np.ones((2, 8)), 8, 1, 1, 2), {}),
        ((np.ones((2, 8)), 8, 1, 1, 2), {"cost": 3}),
    ],
)
def test_bad_input(args, kw):
    with pytest.raises(InvalidInputError):
        place_experts(*args, **kw)


def test_repair_fills_duplicates_distinctly():
    from straggler.solvers.placement import _mask_from_p2l, _repair

    # upstream EPLB puts two replicas of the hot expert on GPU 0 (slots 0-2)
    p2l, _, _ = rebalance_experts([[9, 1, 1, 1]], 6, 1, 1, 2)
    assert p2l[0].tolist() == [0, 0, 3, 0, 1, 2]
    mask = _mask_from_p2l(p2l[0], 4, 2)
    assert mask.sum(axis=0).tolist() == [2, 3]  # the duplicate collapsed
    fixed = _repair(mask, np.array([9.0, 1, 1, 1]), np.zeros(2, dtype=np.int64), 3)
    assert fixed.sum(axis=0).tolist() == [3, 3] and (fixed >= mask).all()
    assert fixed[:, 0].tolist() == [True, True, False, True]  # expert 1: best 1/1, lowest index


def test_never_worse_than_repaired_upstream_on_its_window():
    from straggler.solvers.placement import _maps, _mask_from_p2l, _repair

    cost = CostModel.preset("qwen3_30b_a_offline")
    hist = _window(seed=4, tokens=512, skew=1.5)
    ls = place_experts(hist, 40, 1, 1, 4, cost=cost, n_samples=len(hist), n_resamples=0)[0]
    up, _, _ = rebalance_experts(hist.mean(axis=0), 40, 1, 1, 4)
    masks = np.stack(
        [
            _repair(_mask_from_p2l(up[l], 32, 4), hist.mean(axis=0)[l], np.zeros(4, int), 10)
            for l in range(2)
        ]
    )
    rep = _maps(masks, 10)[0]
    assert _tempo_mean(hist, ls, 4, cost) <= _tempo_mean(hist, rep, 4, cost) + 1e-9


def test_resampled_batches_are_scored_and_guarded():
    """The search also scores batches resampled expert by expert from the window; with them
    the placement is never worse than its start under tempo on the window plus them."""
    from straggler.solvers.placement import _resample

    cost = CostModel.preset("qwen3_30b_a_offline")
    hist = _window(seed=4, tokens=512, skew=1.5)
    extra = _resample(hist[:, 0], 32, 0)
    assert extra.shape == (32, 32)
    for e in range(32):  # every count is one the expert had in some batch of the window
        assert np.isin(extra[:, e], hist[:, 0, e]).all()
    np.testing.assert_array_equal(extra, _resample(hist[:, 0], 32, 0))
    kw = dict(cost=cost, n_samples=len(hist))
    ls = place_experts(hist[:, :1], 40, 1, 1, 4, **kw)[0]
    ep = place_experts(hist[:, :1], 40, 1, 1, 4, method="eplb", **kw)[0]
    scored = np.concatenate([hist[:, :1], extra[:, None]])
    assert _tempo_mean(scored, ls, 4, cost) <= _tempo_mean(scored, ep, 4, cost) + 1e-9
    other = _window(seed=2, tokens=1024, skew=1.5)  # where the resamples change the result
    alone = place_experts(other, 40, 1, 1, 4, n_resamples=0, cost=cost)[0]
    assert not np.array_equal(alone, place_experts(other, 40, 1, 1, 4, cost=cost)[0])
