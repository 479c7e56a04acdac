"""Rebalance that moves little: place_experts from the placement in force (budget, price,
exact reference), moved_replicas, real loads, drifting windows, vLLM's slot-preserving rule,
the frontier."""

import numpy as np
import pytest
from straggler.formulations import CostModel, DispatchProblem
from straggler.formulations.errors import InvalidInputError
from straggler.sim import drifting_windows
from straggler.solvers import solve_dispatch
from straggler.solvers.placement.eplb import rebalance_experts
from straggler.solvers.placement.place import _mask_from_p2l, _Scorer, moved_replicas, place_experts

COST = CostModel.preset("qwen3_30b_a_offline")


def _window(E=32, L=2, n=12, skew=1.2, tokens=512, seed=0, drift=0.0, windows=1):
    return drifting_windows(
        n_windows=windows, window=n, n_layers=L, n_experts=E, n_tokens=tokens, top_k=4,
        skew=skew, drift=drift, rng=seed,
    )  # fmt: skip


def _tempo_mean(hist, p2l, g, cost=COST):
    tot = 0.0
    for c in hist:
        p = DispatchProblem.from_placement(c, p2l, g)
        tot += float(np.sum(solve_dispatch(p, cost, method="tempo", repair_budget_s=0.0).makespan))
    return tot / len(hist)


def _check(p2l, l2p, cnt, E, P, g):
    per = P // g
    for l in range(p2l.shape[0]):
        for h in range(g):
            assert len(set(p2l[l, h * per : (h + 1) * per].tolist())) == per
        np.testing.assert_array_equal(np.bincount(p2l[l], minlength=E), cnt[l])
        for e in range(E):
            phys = l2p[l, e][l2p[l, e] >= 0]
            assert phys.size == cnt[l, e] and (p2l[l, phys] == e).all()
    assert (cnt >= 1).all()


def _objective(hist, mask, prev_mask, price, n_samples):
    s = _Scorer(np.rint(hist[:n_samples]).astype(np.int64), COST)
    return s(mask) + price * int((mask & ~prev_mask).sum())


# ---------------------------------------------------------------- moves from previous


def _drifted(seed=0):
    w = _window(seed=seed, drift=3.0, windows=2, skew=1.4, tokens=4096)
    prev = place_experts(w[0], 40, 1, 1, 4, cost=COST, method="eplb")[0]
    return w, prev


@pytest.mark.parametrize("k", [0, 1, 3, 8])
def test_budget_is_respected_and_maps_are_valid(k):
    w, prev = _drifted()
    out = place_experts(w[1], 40, 1, 1, 4, cost=COST, previous=prev, max_moves=k)
    _check(*out, E=32, P=40, g=4)
    assert (moved_replicas(prev, out[0]) <= k).all()
    again = place_experts(w[1], 40, 1, 1, 4, cost=COST, previous=prev, max_moves=k)
    for a, b in zip(out, again):
        np.testing.assert_array_equal(a, b)


def test_zero_budget_keeps_the_placement_and_moves_buy_makespan():
    w, prev = _drifted()
    same = place_experts(w[1], 40, 1, 1, 4, cost=COST, previous=prev, max_moves=0)[0]
    np.testing.assert_array_equal(same, prev)
    moved = place_experts(w[1], 40, 1, 1, 4, cost=COST, previous=prev, max_moves=6)[0]
    assert moved_replicas(prev, moved).sum() > 0
    assert _tempo_mean(w[1], moved, 4) < _tempo_mean(w[1], prev, 4)


def test_move_cost_trades_moves_for_makespan():
    w, prev = _drifted()
    free = place_experts(w[1], 40, 1, 1, 4, cost=COST, previous=prev, move_cost=0.0)[0]
    dear = place_experts(w[1], 40, 1, 1, 4, cost=COST, previous=prev, move_cost=1e6)[0]
    np.testing.assert_array_equal(dear, prev)
    assert moved_replicas(prev, free).sum() > 0


def test_without_budget_previous_only_arranges_slots():
    w, prev = _drifted()
    fresh = place_experts(w[1], 40, 1, 1, 4, cost=COST)
    kept = place_experts(w[1], 40, 1, 1, 4, cost=COST, previous=prev)
    _check(*kept, E=32, P=40, g=4)
    for l in range(2):
        for h in range(4):
            sl = slice(10 * h, 10 * h + 10)
            assert set(kept[0][l, sl].tolist()) == set(fresh[0][l, sl].tolist())
            stay = np.isin(prev[l, sl], kept[0][l, sl])
            np.testing.assert_array_equal(kept[0][l, sl][stay], prev[l, sl][stay])
    assert (moved_replicas(prev, kept[0]) <= moved_replicas(prev, fresh[0])).all()
    # the three maps are accepted for previous
    three = place_experts(w[1], 40, 1, 1, 4, cost=COST, previous=(prev, None, None))
    np.testing.assert_array_equal(three[0], kept[0])


def test_duplicates_of_previous_are_refilled():
    hist = _window(L=1)[0]
    up = rebalance_experts(hist.mean(axis=0), 40, 1, 1, 4)[0]
    dup = sum(len(set(up[0, 10 * h : 10 * h + 10].tolist())) < 10 for h in range(4))
    assert dup  # upstream EPLB puts two replicas of a hot expert on one GPU here
    out = place_experts(hist, 40, 1, 1, 4, cost=COST, previous=up, max_moves=0)
    _check(*out, E=32, P=40, g=4)


def test_search_reaches_the_exact_optimum_on_small_cases():
    # 6 experts, 3 GPUs of 3 slots (C(6,3)^3 = 8000 placements): the exhaustive reference is
    # never beaten, and the search never ends above its start.
    rng = np.random.default_rng(0)
    reached = 0
    for _ in range(4):
        hist = rng.poisson(rng.choice([200.0, 60, 20, 5, 1, 0.5], 6, replace=False), (4, 1, 6))
        prev = np.array([[0, 1, 2, 3, 4, 5, 0, 1, 2]])
        pm = _mask_from_p2l(prev[0], 6, 3)
        for k in (1, 2):
            kw = dict(cost=COST, previous=prev, max_moves=k, n_samples=4)
            ex = place_experts(hist, 9, 1, 1, 3, method="exhaustive", **kw)[0]
            ls = place_experts(hist, 9, 1, 1, 3, **kw)[0]
            assert moved_replicas(prev, ex)[0] <= k and moved_replicas(prev, ls)[0] <= k
            v_ex = _objective(hist[:, 0], _mask_from_p2l(ex[0], 6, 3), pm, 0.0, 4)
            v_ls = _objective(hist[:, 0], _mask_from_p2l(ls[0], 6, 3), pm, 0.0, 4)
            assert v_ex <= v_ls + 1e-9
            assert v_ls <= _objective(hist[:, 0], pm, pm, 0.0, 4) + 1e-9
            reached += v_ls <= v_ex + 1e-9
    assert reached >= 4  # the search finds the optimum on most of these 8 cases


def test_real_loads_are_accepted():
    hist = _window(L=1)[0].astype(float)
    ints = place_experts(hist, 40, 1, 1, 4, cost=COST)
    np.testing.assert_array_equal(place_experts(hist.astype(np.int64), 40, 1, 1, 4, cost=COST)[0],
                                  ints[0])  # fmt: skip
    out = place_experts(hist * 0.999 + 0.25, 40, 1, 1, 4, cost=COST)  # means, not tokens
    _check(*out, E=32, P=40, g=4)


@pytest.mark.parametrize(
    "kw",
    [
        {"max_moves": 2},  # no previous
        {"move_cost": 1.0},  # no previous
        {"previous": np.zeros((2, 40), int), "max_moves": 1},  # experts missing
        {"previous": np.zeros((2, 39), int)},  # wrong shape
        {"previous": np.full((2, 40), 32)},  # expert out of range
        {"previous": "prev", "max_moves": -1},
        {"previous": "prev", "move_cost": -1.0},
        {"previous": "prev", "move_cost": float("nan")},
        {"method": "exhaustive"},  # too large to enumerate
    ],
)
def test_bad_rebalance_input(kw):
    w, prev = _drifted()
    if isinstance(kw.get("previous"), str):
        kw = dict(kw, previous=prev)
    with pytest.raises(InvalidInputError):
        place_experts(w[1], 40, 1, 1, 4, cost=COST, **kw)


def test_moved_replicas_counts_changed_slots():
    assert moved_replicas([[0, 1, 2, 3]], [[0, 1, 2, 3]]).tolist() == [0]
    assert moved_replicas([[0, 1], [1, 0]], [[1, 0], [1, 0]]).tolist() == [2, 0]
    with pytest.raises(InvalidInputError):
        moved_replicas([[0, 1]], [[0, 1, 2]])


# ---------------------------------------------------------------- drifting windows


def test_drifting_windows_keep_the_skew_and_drift():
    w = drifting_windows(
        n_windows=3, window=40, n_layers=1, n_experts=64, n_tokens=2048, top_k=4, skew=1.0,
        drift=1.0, kappa=None, rng=1,
    )  # fmt: skip
    assert (w.sum(axis=3) == 2048 * 4).all()
    means = w.mean(axis=1)[:, 0]
    # the sorted loads (the skew) stay, which experts are hot changes
    srt = np.sort(means, axis=1)
    assert np.abs(srt[0] - srt[2]).max() < 0.2 * srt[0].max()
    assert np.argsort(-means[0])[:4].tolist() != np.argsort(-means[2])[:4].tolist()
    still = drifting_windows(
        n_windows=2, window=40, n_layers=1, n_experts=64, n_tokens=2048, top_k=4, skew=1.0,
        drift=0.0, kappa=None, rng=1,
    )  # fmt: skip
    m = still.mean(axis=1)[:, 0]
    assert np.argsort(-m[0])[:3].tolist() == np.argsort(-m[1])[:3].tolist()
    with pytest.raises(InvalidInputError):
        drifting_windows(
            n_windows=1, window=1, n_layers=1, n_experts=8, n_tokens=8, top_k=2, skew=1.0,
            drift=-0.5,
        )  # fmt: skip


# ---------------------------------------------------------------- vLLM's rule, the frontier


def test_preserve_intragpu_slots_by_hand():
    from straggler.solvers.placement.eplb import preserve_intragpu_slots

    # GPU 0: new [2, 1], old [1, 4]: 1 keeps slot 0, 2 fills slot 1. GPU 1: new [0, 3],
    # old [3, 5]: 3 keeps slot 2, 0 fills slot 3.
    out = preserve_intragpu_slots(np.array([[2, 1, 0, 3]]), 2, np.array([[1, 4, 3, 5]]))
    assert out.tolist() == [[1, 2, 3, 0]]
    # duplicates: the old slots' order decides which copy is kept where
    out = preserve_intragpu_slots(np.array([[0, 0, 1]]), 1, np.array([[1, 2, 0]]))
    assert out.tolist() == [[1, 0, 0]]


def test_vllm_rule_keeps_eplb_sets_and_moves_fewer():
    w, prev = _drifted()
    mean = w[1].mean(axis=0)
    plain = rebalance_experts(mean, 40, 1, 1, 4, version="vllm")[0]
    kept, l2p, cnt = rebalance_experts(
        mean, 40, 1, 1, 4, version="vllm", old_physical_to_logical=prev
    )
    for l in range(2):
        for h in range(4):
            sl = slice(10 * h, 10 * h + 10)
            assert sorted(kept[l, sl].tolist()) == sorted(plain[l, sl].tolist())
        for e in range(32):
            phys = l2p[l, e][l2p[l, e] >= 0]
            assert phys.size == cnt[l, e] and (kept[l, phys] == e).all()
    assert moved_replicas(prev, kept).sum() < moved_replicas(prev, plain).sum()


def test_frontier_spans_zero_moves_to_eplb_and_is_measured():
    from straggler.sim import rebalance_frontier, tempo_makespan

    w, prev = _drifted()
    fr = rebalance_frontier(w[1], prev, 40, 1, 1, 4, cost=COST, score_on=w[1], budgets=[0, 1, 4])
    assert fr.moves[0] == 0 and fr.makespan[0] == pytest.approx(fr.points["previous"][1])
    assert (np.diff(fr.moves) >= 0).all()
    assert fr.makespan[-1] < fr.makespan[0]  # moves buy makespan on this drifted window
    assert fr.points["vllm_eplb"][0] <= fr.points["eplb"][0]
    assert fr.points["vllm_eplb"][1] == pytest.approx(fr.points["eplb"][1])  # same GPU sets
    assert fr.points["eplb"][1] == pytest.approx(
        tempo_makespan(w[1], rebalance_experts(w[1].mean(axis=0), 40, 1, 1, 4)[0], 4, COST)
    )
    assert 0 < fr.gain_captured(int(fr.moves[-1])) <= 10
    default = rebalance_frontier(w[1][:4], prev, 40, 1, 1, 4, cost=COST)
    assert (
        default.budgets[0] == 0
        and default.budgets[-1]
        == moved_replicas(prev, rebalance_experts(w[1][:4].mean(axis=0), 40, 1, 1, 4)[0]).max()
    )


def test_frontier_plot():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from straggler.sim import rebalance_frontier

    w, prev = _drifted()
    fr = rebalance_frontier(w[1][:4], prev, 40, 1, 1, 4, cost=COST, budgets=[0, 2])
    ax = fr.plot()
    assert len(ax.lines) == 1 + len(fr.points)


def test_frontier_refuses_bad_input_by_name():
    from straggler.sim import rebalance_frontier

    w, prev = _drifted()
    for kw, name in (
        (dict(budgets=[-1]), "budgets"),
        (dict(score_on=np.zeros((2, 3))), "score_on"),
    ):
        with pytest.raises(InvalidInputError, match=name):
            rebalance_frontier(w[1][:4], prev, 40, 1, 1, 4, cost=COST, **kw)
    with pytest.raises(InvalidInputError, match="previous"):
        rebalance_frontier(w[1][:4], prev[:, :39], 40, 1, 1, 4, cost=COST)
