"""Theorem 1's reduction in both directions, and the certificate function."""

import dataclasses
import itertools

import numpy as np
import pytest
from straggler.formulations import CostModel, DispatchProblem, evaluate
from straggler.proofs.certificates import certify
from straggler.proofs.conjecture import exact_optimum, support_optimum
from straggler.proofs.reduction import (
    dispatch_from_partition,
    has_balanced_partition,
    partition_from_dispatch,
    partition_to_dispatch,
)
from straggler.solvers import solve_dispatch


def _weight_lists():
    rng = np.random.default_rng(11)
    out = [[1, 1], [1, 2], [3, 1, 1, 1], [2, 1, 1, 2], [5, 5, 1, 1], [4, 3, 2, 1, 1, 1]]
    for m in (2, 4, 4, 6, 6, 6):
        out.append(rng.integers(1, 9, m).tolist())
    return out


@pytest.mark.parametrize("w", _weight_lists())
def test_reduction_both_directions(w):
    """Balanced partition exists <=> a dispatch with makespan <= T exists."""
    p, cost, T = partition_to_dispatch(w)
    tol = 1e-9 * T
    # independent oracle (support enumeration, no LP solver) and the MILP agree
    opt = support_optimum(p, cost)
    assert exact_optimum(p, cost) == pytest.approx(opt, rel=1e-7)
    assert has_balanced_partition(w) == (opt <= T + tol)
    # (<=): every balanced partition gives a dispatch of makespan exactly T
    m = len(w)
    for s in itertools.combinations(range(m), m // 2):
        if 2 * sum(w[i] for i in s) == sum(w):
            assert evaluate(p, cost, dispatch_from_partition(w, s)).makespan == pytest.approx(T)
    # (=>): an optimal dispatch within budget splits nothing and is a balanced partition
    res = solve_dispatch(p, cost, method="milp", mip_rel_gap=0.0)
    if res.makespan <= T + tol:
        s = partition_from_dispatch(res.shares)
        assert s is not None and len(s) == m // 2 and 2 * sum(w[i] for i in s) == sum(w)


def test_reduction_other_budget():
    p, cost, T = partition_to_dispatch([2, 1, 1, 2], T=7.5)
    assert (cost.b, cost.beta, T) == (3.75, 2.5, 7.5)
    assert support_optimum(p, cost) == pytest.approx(7.5)


def _inst(full=True):
    rep = np.ones((6, 3), bool) if full else np.array([[1, 0, 0], [1, 1, 0]] * 3, bool)
    return DispatchProblem(counts=[50, 9, 9, 7, 3, 0], replicas=rep)


@pytest.mark.parametrize("method", ["round_robin", "semi_matching", "milp"])
def test_certificates_hold(method):
    cost = CostModel(a=2, b=5, c=1, beta=0.5)
    p = _inst()
    res = solve_dispatch(p, cost, method=method)
    opt = exact_optimum(p, cost)
    for o in (None, opt):
        cert = certify(p, cost, res, opt=o)
        assert cert.holds, cert.details
    if method == "round_robin":
        assert cert.guarantee.startswith("Theorem 2")


def test_lemma_certificates():
    p = _inst(full=False)
    cert = certify(
        p,
        CostModel(a=1, b=2, c=0, beta=0),
        solve_dispatch(p, CostModel(a=1, b=2, c=0, beta=0), method="semi_matching"),
    )
    assert cert.guarantee.startswith("Lemma 2") and cert.holds and cert.lhs == cert.rhs


def test_certificates_catch_false_claims():
    cost = CostModel(a=2, b=5, c=1, beta=0.5)
    p = _inst()
    res = solve_dispatch(p, cost, method="round_robin")
    fake = dataclasses.replace(res, lower_bound=res.makespan + 1)
    assert not certify(p, cost, fake).holds
    # a "tempo" result claiming a heuristic better than what it returned
    fake = dataclasses.replace(res, method="tempo", extras={"makespan_heuristic": res.makespan / 2})
    cert = certify(p, cost, fake)
    assert not cert.holds
    # an infeasible dispatch
    bad = res.shares.copy()
    bad[0, 0] += 1
    assert not certify(p, cost, dataclasses.replace(res, shares=bad)).holds


def test_an_opt_above_the_results_own_makespan_is_refused():
    """An optimum is at most the makespan of any feasible dispatch, the result's own
    included: an opt above it is a wrong argument (refused, naming opt), not a certificate
    that fails; an infeasible result has no makespan to compare with."""
    from straggler.formulations import InvalidInputError

    cost = CostModel(a=2, b=5, c=1, beta=0.5)
    p = _inst()
    res = solve_dispatch(p, cost, method="round_robin")
    with pytest.raises(InvalidInputError, match="'opt' parameter of certify.*feasible"):
        certify(p, cost, res, opt=res.makespan * 2)
    assert certify(p, cost, res, opt=res.makespan).holds  # equal: the result is optimal
    bad = res.shares.copy()
    bad[0, 0] += 1
    assert not certify(p, cost, dataclasses.replace(res, shares=bad), opt=1e9).holds
    stack = DispatchProblem(counts=[[50, 9, 9], [1, 2, 3]], replicas=np.ones((3, 2), bool))
    rs = solve_dispatch(stack, cost, method="round_robin")
    with pytest.raises(InvalidInputError, match="layer 1"):
        certify(stack, cost, rs, opt=[0.0, rs.makespan[1] + 1])


def test_stack_certificate():
    cost = CostModel(a=2, b=5, c=1, beta=0.5)
    p = DispatchProblem(counts=[[50, 9, 9], [1, 2, 3]], replicas=np.ones((3, 2), bool))
    cert = certify(p, cost, solve_dispatch(p, cost, method="round_robin"))
    assert cert.holds and cert.lhs.shape == (2,)


def test_lemma1_certificate():
    cost = CostModel(a=0, b=0, c=3, beta=0.5, c2=1, gamma=0.75)
    p = _inst(full=False)
    cert = certify(p, cost, solve_dispatch(p, cost, method="token_lp"))
    assert cert.guarantee.startswith("Lemma 1") and cert.holds
    assert cert.lhs == pytest.approx(cert.rhs, rel=1e-9)


def test_proposition1_needs_the_ensemble():
    """Proposition 1 bounds tempo through its A3 candidate; with the ensemble off the
    certificate claims only the universal checks (the fuzz suite's counter-example: three
    one-token experts on two GPUs, seed only, lands all on one GPU, 0.3 > (0.15+0.1)/0.99)."""
    p = DispatchProblem(counts=[1, 1, 1], replicas=np.ones((3, 2), bool))
    cost = CostModel(a=0, b=0, c=0, beta=0.1)
    off = dict(chains=False, local_search=False, ensemble=False, fractional=False)
    res = solve_dispatch(p, cost, method="tempo", **off)
    cert = certify(p, cost, res)
    assert cert.holds and cert.guarantee == "lower_bound <= makespan", cert.details
    cert = certify(p, cost, solve_dispatch(p, cost, method="tempo"))
    assert cert.holds and cert.guarantee.startswith("Proposition 1")
