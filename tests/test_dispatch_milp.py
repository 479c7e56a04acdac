"""The dispatch MILP and the token LP as data: encode/decode against the evaluator, no solver."""

import numpy as np
import pytest
from straggler.formulations import (
    CostModel,
    DispatchProblem,
    InvalidInputError,
    build_dispatch_milp,
    build_token_lp,
    check_shares,
    evaluate,
)

COSTS = [
    CostModel(a=0, b=15, c=0, beta=0.1),
    CostModel(a=3.5, b=2.0, c=4.0, beta=0.05),
    CostModel(a=1.0, b=3.0, c=2.0, beta=0.02, b2=1.5, tile=4),
    CostModel(a=1.0, b=3.0, c=2.0, beta=0.02, b2=0.7, tile=4, c2=5.0, gamma=0.08),
    CostModel(a=0.0, b=1.0, c=0.0, beta=0.0, c2=1.0, gamma=0.3),
]


def random_instance(rng, full):
    E = int(rng.integers(1, 9))
    g = int(rng.integers(1, 5))
    counts = rng.integers(0, 40, size=E)
    counts[rng.random(E) < 0.2] = 0
    if full:
        rep = np.ones((E, g), bool)
    else:
        rep = rng.random((E, g)) < 0.5
        rep[np.arange(E), rng.integers(0, g, size=E)] = True
    return DispatchProblem(counts=counts, replicas=rep)


def random_shares(rng, p):
    """A random feasible dispatch: random support on the replicas, integer or fractional."""
    x = np.zeros((p.n_experts, p.n_gpus))
    for e in range(p.n_experts):
        gs = np.flatnonzero(p.replicas[e])
        if p.counts[e] == 0:
            continue
        keep = gs[rng.random(gs.size) < 0.6]
        if keep.size == 0:
            keep = gs[:1]
        w = rng.random(keep.size) + 0.01
        if rng.random() < 0.5:
            w = np.floor(w * 10) + 1
        x[e, keep] = p.counts[e] * w / w.sum()
        x[e, keep[-1]] += p.counts[e] - x[e].sum()
    return x


@pytest.mark.parametrize("tightened", [False, True])
@pytest.mark.parametrize("ci", range(len(COSTS)))
def test_encode_feasible_and_objective_matches_evaluator(tightened, ci):
    cost = COSTS[ci]
    rng = np.random.default_rng(ci)
    for i in range(40):
        p = random_instance(rng, full=i % 2 == 0)
        for _ in range(3):
            s = random_shares(rng, p)
            check_shares(p, s)
            mk = evaluate(p, cost, s).makespan
            ub = mk * (1 + rng.random()) if tightened and i % 3 else (mk if tightened else None)
            m = build_dispatch_milp(p, cost, tightened=tightened, upper_bound=ub)
            v = m.encode(s)
            assert m.violation(v) <= 1e-9 * max(1.0, mk)
            assert m.objective(v) == pytest.approx(mk, rel=1e-12, abs=1e-12)
            # decode gives back the same dispatch up to a relabelling of symmetric GPUs
            d = m.decode(v)
            check_shares(p, d)
            assert evaluate(p, cost, d).makespan == pytest.approx(mk, rel=1e-12, abs=1e-12)


def test_tightened_has_more_rows_and_integer_counts():
    p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    cost = CostModel(a=0, b=15, c=0, beta=0.1)
    naive = build_dispatch_milp(p, cost, tightened=False)
    tight = build_dispatch_milp(p, cost, upper_bound=66.0)
    assert "K" in tight.blocks and "K" not in naive.blocks
    assert tight.integrality[tight.blocks["K"]].all()
    assert {"cover", "count_total", "symmetry"} <= set(tight.row_blocks)
    # big-M from the bound: no GPU carries more than (UB - c) / beta tokens
    assert tight.col_upper[tight.blocks["x"]].max() == 600.0
    capped = build_dispatch_milp(p, cost, upper_bound=40.0)
    assert capped.col_upper[capped.blocks["x"]].max() == pytest.approx(400.0, rel=1e-6)
    # activation cap: 15 K <= 66
    assert tight.col_upper[tight.blocks["K"]].tolist() == [4.0, 4.0]
    # M >= a + b*ceil(7/2) = 60 (basic lower bound)
    assert tight.col_lower[tight.blocks["M"]][0] == pytest.approx(60.0)


def test_decode_snaps_tiny_and_off_shares():
    p = DispatchProblem(counts=[10, 4], replicas=[[1, 1], [1, 1]])
    cost = CostModel(a=0, b=1, c=0, beta=0.1)
    m = build_dispatch_milp(p, cost, tightened=False)
    v = m.encode(np.array([[10.0, 0.0], [2.0, 2.0]]))
    xc, zc = m.blocks["x"], m.blocks["z"]
    v[xc[1]] = 1e-12  # a tiny share with z = 0: dropped
    v[xc[0]] = 10.0 - 1e-12
    s = m.decode(v)
    assert s[0].tolist() == [10.0, 0.0]
    assert s[1].sum() == 4.0
    v[zc[3]] = 0.0  # activation off: its share moves to the other replica
    assert m.decode(v)[1].tolist() == [4.0, 0.0]


def test_decode_keeps_tile_counts():
    p = DispatchProblem(counts=[8], replicas=[[1, 1]])
    cost = CostModel(a=0, b=1, c=0, beta=0.1, b2=1.0, tile=4)
    m = build_dispatch_milp(p, cost)
    v = m.encode(np.array([[4.0, 4.0]]))
    v[m.blocks["x"]] = [4.0 + 1e-6, 4.0 - 1e-6]  # a solver's rounding at a tile boundary
    s = m.decode(v)
    assert s.sum() == 8.0 and evaluate(p, cost, s).T.tolist() == [1, 1]


@pytest.mark.parametrize("seed", range(5))
def test_token_lp_encode(seed):
    rng = np.random.default_rng(100 + seed)
    for i in range(30):
        p = random_instance(rng, full=i % 2 == 0)
        s = random_shares(rng, p)
        m = build_token_lp(p)
        v = m.encode(s)
        assert m.violation(v) <= 1e-9 * max(1.0, p.counts.sum())
        assert m.objective(v) == pytest.approx(s.sum(axis=0).max())
        check_shares(p, m.decode(v))


def test_bad_input():
    p = DispatchProblem(counts=[[1, 2]], replicas=[[1, 1], [1, 1]])
    cost = CostModel(a=0, b=1, c=0, beta=0.1)
    with pytest.raises(InvalidInputError, match="'problem'.*single-layer"):
        build_dispatch_milp(p, cost)
    with pytest.raises(InvalidInputError, match="'cost'"):
        build_dispatch_milp(p.layer(0), "cost")
    with pytest.raises(InvalidInputError, match="'upper_bound'"):
        build_dispatch_milp(p.layer(0), cost, upper_bound=float("nan"))
    with pytest.raises(InvalidInputError, match="'problem'"):
        build_token_lp([1, 2])
