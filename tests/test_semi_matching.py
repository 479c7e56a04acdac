"""Optimal semi-matching (Lemma 2): kernel == reference, optimality by brute force, witness."""

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from straggler.formulations import CostModel, DispatchProblem, InvalidInputError, evaluate
from straggler.proofs.strategies import replica_masks
from straggler.solvers import solve_dispatch
from straggler.solvers.dispatch._semi_matching import semi_matching_kernel, semi_matching_reference
from straggler.solvers.dispatch.semi_matching import semi_matching, semi_matching_witness


def _brute(rep, live):
    E, g = rep.shape
    choices = [np.flatnonzero(rep[e]).tolist() if live[e] else [-1] for e in range(E)]
    best = None
    for pick in itertools.product(*choices):
        load = np.bincount([h for h in pick if h >= 0], minlength=g)
        v = int(load.max(initial=0))
        best = v if best is None else min(best, v)
    return best


@st.composite
def _instances(draw, max_experts=7, max_gpus=4):
    E = draw(st.integers(1, max_experts))
    g = draw(st.integers(1, max_gpus))
    rep = draw(replica_masks(E, g))
    live = np.array(draw(st.lists(st.booleans(), min_size=E, max_size=E)))
    return rep, live


@given(_instances())
def test_kernel_equals_reference_and_brute_force(inst):
    rep, live = inst
    k = semi_matching_kernel(rep, live)
    p = semi_matching_kernel.py_func(rep, live)
    r = semi_matching_reference(rep, live)
    for x, y in ((k, p), (k, r)):
        assert np.array_equal(x[0], y[0]) and x[1] == y[1] and np.array_equal(x[2], y[2])
    assign, value = semi_matching(rep, live)
    assert value == _brute(rep, live)
    # feasible: every live expert on one of its replicas, dead experts unassigned
    for e in range(rep.shape[0]):
        assert (assign[e] == -1) if not live[e] else rep[e, assign[e]]
    load = np.bincount(assign[assign >= 0], minlength=rep.shape[1])
    assert int(load.max(initial=0)) == value


@given(_instances(max_experts=12, max_gpus=6))
def test_witness_certifies_optimality(inst):
    rep, live = inst
    _, value, y = semi_matching_witness(rep, live)
    inside = live & ~(rep & ~y).any(axis=1)  # live experts with every replica in Y
    assert y.any()
    assert -(-int(inside.sum()) // int(y.sum())) == value


def test_large_instance_matches_reference():
    rng = np.random.default_rng(3)
    E, g = 256, 16
    rep = rng.random((E, g)) < 0.08
    rep[np.arange(E), rng.integers(0, g, E)] = True
    live = rng.random(E) < 0.7
    k = semi_matching_kernel(rep, live)
    r = semi_matching_reference(rep, live)
    assert np.array_equal(k[0], r[0]) and k[1] == r[1] and np.array_equal(k[2], r[2])


def test_bad_input():
    with pytest.raises(InvalidInputError, match="'replicas'"):
        semi_matching(np.ones(3, bool), [True] * 3)
    with pytest.raises(InvalidInputError, match="'live'"):
        semi_matching(np.ones((3, 2), bool), [True] * 2)
    with pytest.raises(InvalidInputError, match="live expert 1"):
        semi_matching(np.array([[1, 0], [0, 0]], bool), [True, True])


def test_method_is_exact_in_the_activation_limit():
    """Lemma 2: with c = beta = 0 the semi_matching method is optimal (vs the MILP)."""
    rng = np.random.default_rng(0)
    cost = CostModel(a=2, b=5, c=0, beta=0)
    for _ in range(5):
        rep = rng.random((8, 3)) < 0.5
        rep[np.arange(8), rng.integers(0, 3, 8)] = True
        p = DispatchProblem(counts=rng.integers(0, 30, 8), replicas=rep)
        sm = solve_dispatch(p, cost, method="semi_matching")
        opt = solve_dispatch(p, cost, method="milp", mip_rel_gap=0.0)
        assert sm.makespan == pytest.approx(opt.makespan, rel=1e-9)
        assert sm.status.name == "OPTIMAL"  # makespan meets the certified bound a + b*SM
        assert evaluate(p, cost, sm.shares).makespan == sm.makespan
