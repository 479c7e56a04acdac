"""A3 round-robin and its restricted variant: kernel == reference, Theorem 2, a3_bound."""

import numpy as np
import pytest
from hypothesis import given, target
from hypothesis import strategies as st
from straggler.formulations import (
    CostModel,
    DispatchProblem,
    InvalidInputError,
    check_shares,
    evaluate,
)
from straggler.proofs.conjecture import exact_optimum
from straggler.proofs.strategies import dispatch_instances, replica_masks, token_counts
from straggler.solvers import certified_lower_bound, dispatch_methods, solve_dispatch
from straggler.solvers.dispatch._round_robin import a3_kernel, a3_reference
from straggler.solvers.dispatch.round_robin import a3_bound, a3_paper_term, round_robin_shares


@st.composite
def _raw(draw):
    E = draw(st.integers(1, 12))
    g = draw(st.integers(1, 5))
    return draw(token_counts(E)), draw(replica_masks(E, g)), draw(st.booleans())


@given(_raw())
def test_kernel_equals_reference(inst):
    counts, rep, full = inst
    if full:
        rep = np.ones_like(rep)
    k = a3_kernel(counts, rep, full)
    p = a3_kernel.py_func(counts, rep, full)
    r = a3_reference(counts, rep, full)
    assert np.array_equal(k, p) and np.array_equal(k, r)


def test_dispatch_and_routing_round_robin_names_are_distinct():
    """``round_robin`` names a dispatch method (TEMPO's A3) and a routing policy (SGLang's
    DP round-robin); their code names differ, so neither import shadows the other."""
    from straggler.baselines.routing import sglang as sglang_routers
    from straggler.solvers.dispatch import _backend, _round_robin

    dispatch = set(_round_robin.__all__) | set(_backend.__all__)
    assert not dispatch & set(sglang_routers.__all__)
    assert _backend.A3.kernel is a3_kernel
    # the public strings stay: one per namespace
    assert sglang_routers.ROUND_ROBIN.name == "round_robin"
    assert "round_robin" in dispatch_methods()


def test_a3_rule_and_ties():
    # ranks: e1 (9), e3 (7), then the tie e0/e4 (5) by lower index, then e2
    s = round_robin_shares([5, 9, 1, 7, 5], np.ones((5, 2), bool))
    assert np.argmax(s, axis=1).tolist() == [0, 0, 0, 1, 1]
    # zeros are never placed
    s = round_robin_shares([0, 3], np.ones((2, 3), bool))
    assert s.tolist() == [[0, 0, 0], [3, 0, 0]]


def test_fewest_rule():
    # e1 (9) only on GPU 0; e0 (5) to GPU 1 (fewer experts); e2 (1): tie on experts, GPU 1
    # has fewer tokens
    s = round_robin_shares([5, 9, 1], [[1, 1], [1, 0], [1, 1]])
    assert np.argmax(s, axis=1).tolist() == [1, 0, 1]
    with pytest.raises(InvalidInputError, match="'problem'"):
        round_robin_shares([5, 9], [[1, 1], [1, 0]], rule="a3")
    with pytest.raises(InvalidInputError, match="'rule'"):
        round_robin_shares([5, 9], [[1, 1], [1, 0]], rule="snake")


@given(dispatch_instances(max_experts=6, max_gpus=3, full=True))
def test_theorem2_against_the_exact_optimum(inst):
    """M(A3) <= OPT + delta, and the stronger M(A3) <= LB + delta the proof gives."""
    p, cost = inst
    res = solve_dispatch(p, cost, method="round_robin")
    check_shares(p, res.shares)
    delta = a3_bound(p, cost)
    opt = exact_optimum(p, cost)
    lb = certified_lower_bound(p, cost)
    tol = 1e-9 * max(1.0, opt + delta)
    assert lb <= opt + tol
    assert res.makespan <= lb + delta + tol
    assert res.makespan <= opt + delta + tol
    if opt + delta > 0:
        target(res.makespan / (opt + delta), label="M(A3)/(OPT+delta)")


def test_paper_term_fails_when_b2_exceeds_b():
    """With b2 > b the paper's term is not a bound; a3_bound's corrected term is."""
    p = DispatchProblem(counts=[8] * 20, replicas=np.ones((20, 2), bool))
    cost = CostModel(a=0, b=1, c=0, beta=0, b2=10, tile=4)
    m = evaluate(p, cost, round_robin_shares(p.counts, p.replicas)).makespan
    opt = exact_optimum(p, cost)
    assert m == 110.0 and opt == pytest.approx(20.0)
    assert m > opt + a3_paper_term(p, cost)  # 110 > 20 + 11
    assert m <= opt + a3_bound(p, cost) + 1e-9  # 110 <= 20 + 11 + 90


def test_a3_bound_terms():
    p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    assert a3_bound(p, CostModel(a=0, b=15, c=0, beta=0.1)) == 60.0
    assert a3_bound(p, CostModel(a=0, b=15, c=0, beta=0.1, b2=5, tile=128)) == 60.0
    assert a3_bound(p, CostModel(a=0, b=15, c=0, beta=0.01, b2=5, tile=128)) == 15 + 5 * 4
    assert a3_bound(p, CostModel(a=0, b=1, c=0, beta=0.01, c2=0, gamma=1.0)) == 600.0
    empty = DispatchProblem(counts=[0, 0], replicas=np.ones((2, 2), bool))
    assert a3_bound(empty, CostModel(a=1, b=1, c=0, beta=1)) == 0.0


def test_restricted_conjecture_counterexample():
    """The conjecture is false: the hand-built counterexample, with OPT from two oracles."""
    from straggler.proofs.conjecture import COUNTEREXAMPLE, check_conjecture, support_optimum

    p, cost = COUNTEREXAMPLE["problem"], COUNTEREXAMPLE["cost"]
    assert support_optimum(p, cost) == 4.0 == exact_optimum(p, cost)
    chk = check_conjecture(p, cost)
    assert (chk.makespan, chk.opt, chk.term) == (6.0, 4.0, 1.0) and chk.violated


def test_conjecture_search_plumbing():
    from straggler.proofs.conjecture import check_conjecture, random_search, targeted_search

    r = random_search(5, seed=0)
    assert r["n"] + r["unproved"] == 5 and r["violations"] <= r["n"]
    first = r["first_counterexample"]
    assert (r["violations"] > 0) == (first is not None)
    assert first is None or check_conjecture(first[1], first[2]).violated
    # the control: A3 under full replication obeys Theorem 2, so the search finds nothing
    a3 = random_search(5, seed=0, full=True, rule="a3")
    assert a3["n"] == 5 and a3["violations"] == 0 and a3["first_counterexample"] is None
    assert a3["max_excess"] <= 1e-9
    t = targeted_search(5, seed=0, shrink=False)
    assert t["examples"] + t["unproved"] >= 1
    assert t["worst"] is None or t["worst"][0].term > 0


@pytest.mark.slow
def test_targeted_search_refutes_the_conjecture():
    """hypothesis target() finds (and shrinks) a violation on arbitrary restricted masks."""
    from straggler.proofs.conjecture import check_conjecture, targeted_search

    r = targeted_search(400, seed=1, max_experts=10)
    assert r["counterexample"] is not None
    chk, p, cost = r["counterexample"]
    assert check_conjecture(p, cost).violated
