"""The routing MILPs: encode/objective without solving, and optima against brute force."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from straggler.formulations.routing import (
    apply_assignment,
    check_assignment,
    f_score,
    horizon_f_score,
    imbalance,
)
from straggler.formulations.routing_milp import build_fscore_knapsack_milp, build_joint_tick_milp
from straggler.solvers import routing_policies
from straggler.solvers.highs import solve_milp
from straggler.solvers.routing.route import route_batch

small = st.integers(0, 20)


@st.composite
def ticks(draw, max_g=3, max_n=4):
    G = draw(st.integers(1, max_g))
    n = draw(st.integers(0, max_n))
    s = np.array(draw(st.lists(small, min_size=n, max_size=n)), float)
    L = np.array(draw(st.lists(st.integers(0, 40), min_size=G, max_size=G)), float)
    cap = np.array(draw(st.lists(st.integers(0, 3), min_size=G, max_size=G)), np.int64)
    return s, L, cap


def _all_assignments(s, L, cap):
    G = L.size
    for a in itertools.product(range(-1, G), repeat=s.size):
        a = np.array(a, dtype=np.int64)
        if np.all(np.bincount(a[a >= 0], minlength=G) <= cap):
            yield a


@given(tick=ticks(max_n=5), must=st.booleans(), data=st.data())
def test_joint_encode_is_feasible_and_scores_the_imbalance(tick, must, data):
    s, L, cap = tick
    mdl = build_joint_tick_milp(s, L, cap, must_place=must)
    feasible = list(_all_assignments(s, L, cap))
    if must:
        k = min(s.size, int(cap.sum()))
        feasible = [a for a in feasible if (a >= 0).sum() == k]
    a = data.draw(st.sampled_from(feasible))
    x = mdl.encode(a)
    assert mdl.violation(x) <= 1e-9
    assert mdl.objective(x) == imbalance(apply_assignment(L, a, s))
    assert mdl.decode(x).tolist() == a.tolist()


@settings(max_examples=25)
@given(tick=ticks())
def test_joint_must_place_optimum_equals_brute_force_and_bounds_br0(tick):
    s, L, cap = tick
    mdl = build_joint_tick_milp(s, L, cap, must_place=True)
    sol = solve_milp(mdl, mip_rel_gap=0, time_limit=10)
    k = min(s.size, int(cap.sum()))
    brute = min(
        imbalance(apply_assignment(L, a, s))
        for a in _all_assignments(s, L, cap)
        if (a >= 0).sum() == k
    )
    assert abs(sol.objective - brute) <= 1e-6
    a = mdl.decode(sol.x)
    check_assignment(a, s, cap)
    for policy in routing_policies():  # the optimum bounds every policy's must-place tick
        d = route_batch(s, L, cap, policy=policy, rng=0)
        if d.n_placed == k:
            assert d.imbalance >= brute - 1e-9, policy


@settings(max_examples=25)
@given(tick=ticks())
def test_joint_free_optimum_never_worse_than_placing_nothing(tick):
    s, L, cap = tick
    sol = solve_milp(build_joint_tick_milp(s, L, cap), mip_rel_gap=0, time_limit=10)
    brute = min(imbalance(apply_assignment(L, a, s)) for a in _all_assignments(s, L, cap))
    assert abs(sol.objective - brute) <= 1e-6
    assert sol.objective <= imbalance(L) + 1e-9


@settings(max_examples=30)
@given(
    s=st.lists(small, min_size=1, max_size=5),
    m=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    G=st.integers(1, 5),
    k=st.integers(1, 5),
    alpha=st.sampled_from([1.0, 0.5]),
    gamma=st.sampled_from([1.0, 0.5]),
)
def test_knapsack_optimum_equals_brute_force(s, m, G, k, alpha, gamma):
    mdl = build_fscore_knapsack_milp(s, m, G, k, alpha=alpha, gamma=gamma)
    sol = solve_milp(mdl, mip_rel_gap=0, time_limit=10)
    best = max(
        horizon_f_score(sum(c), m, alpha=alpha, beta=float(G), gamma=gamma)
        for size in range(1, min(k, len(s)) + 1)
        for c in itertools.combinations(s, size)
    )
    assert abs(-sol.objective - best) <= 1e-6
    q = mdl.decode(sol.x)
    assert 1 <= len(q) <= k
    x = mdl.encode(q)
    assert mdl.violation(x) <= 1e-9
    if len(m) == 1 and alpha == 1.0:
        assert abs(-mdl.objective(x) - f_score(sum(s[i] for i in q), m[0], G)) <= 1e-9
