"""Property tests of every dispatch method against the exact optimum (hypothesis).

Feasibility, ``lower_bound <= OPT <= heuristic``, Theorem 2 (round_robin) and Proposition 1
(tempo) against the MILP optimum at ``mip_rel_gap = 0``, invariance under permuting
experts and GPUs, determinism, and no mutation of inputs.
"""

import numpy as np
import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st
from straggler.formulations import check_shares, evaluate
from straggler.formulations.dispatch import DispatchProblem
from straggler.proofs.certificates import certify
from straggler.proofs.conjecture import exact_optimum
from straggler.proofs.strategies import dispatch_instances
from straggler.solvers import (
    a3_bound,
    certified_lower_bound,
    dispatch_methods,
    semi_matching,
    solve_dispatch,
)
from straggler.solvers.dispatch.registry import get_dispatch_method

# moonep replays a weight-moving policy (it creates replicas on the fly) and lplb builds its
# own placement, so neither is a dispatch of the given instance (moves_weights): each is
# checked by its own tests.
HEURISTICS = [
    m
    for m in dispatch_methods()
    if m != "milp" and not getattr(get_dispatch_method(m), "moves_weights", False)
]
RTOL = 1e-9


def _le(x, y):
    return x <= y + RTOL * max(1.0, abs(y))


@settings(max_examples=25)
@given(dispatch_instances(max_experts=5, max_gpus=3))
def test_every_method_feasible_and_above_the_optimum(inst):
    p, cost = inst
    opt = exact_optimum(p, cost)
    lb = certified_lower_bound(p, cost)
    assert _le(lb, opt)
    for name in HEURISTICS:
        res = solve_dispatch(p, cost, method=name, rng=0)
        check_shares(p, res.shares)
        m = evaluate(p, cost, res.shares).makespan
        assert m == pytest.approx(res.makespan, rel=1e-12, abs=1e-12), name
        assert _le(res.lower_bound, opt), name
        assert _le(opt, m), name
        assert certify(p, cost, res, opt=opt).holds, name


@given(dispatch_instances(max_experts=6, max_gpus=3, full=True))
def test_theorem2_and_proposition1(inst):
    p, cost = inst
    opt = exact_optimum(p, cost)
    delta = a3_bound(p, cost)
    rr = solve_dispatch(p, cost, method="round_robin")
    assert _le(rr.makespan, opt + delta)
    if opt + delta > 0:
        target(rr.makespan / (opt + delta), label="M(A3)/(OPT+delta)")
    for tau in (0.0, 0.01):
        tp = solve_dispatch(p, cost, method="tempo", tau=tau, rng=0)
        assert _le(tp.makespan, (opt + delta) / (1 - tau))
        cert = certify(p, cost, tp, tau=tau, opt=opt)
        assert cert.holds and cert.guarantee.startswith("Proposition 1"), cert.details
        if tp.extras["stages_skipped"]:  # the exact token-LP dispatch met the bound
            assert _le(tp.makespan, opt) and tp.status.name == "OPTIMAL"
            continue
        # the exact ensemble rule against the candidates it scored
        h = tp.extras["makespan_heuristic"]
        cands = [tp.extras[k] for k in ("makespan_lp", "makespan_a3")]
        cands = [c for c in cands if np.isfinite(c)]
        rule = min([h, tp.extras["makespan_lp_exact"]] + [c / (1 - tau) for c in cands])
        assert _le(tp.makespan, rule)


@st.composite
def _permuted(draw):
    p, cost = draw(dispatch_instances(max_experts=6, max_gpus=3))
    pe = np.array(draw(st.permutations(range(p.n_experts))))
    pg = np.array(draw(st.permutations(range(p.n_gpus))))
    q = DispatchProblem(counts=p.counts[pe], replicas=p.replicas[pe][:, pg])
    return p, q, cost


@settings(max_examples=20)
@given(_permuted())
def test_permutation_invariance(inst):
    """Exact invariance of OPT, the bounds, SM and M(A3); tie effects allowed elsewhere."""
    p, q, cost = inst
    assert certified_lower_bound(p, cost) == certified_lower_bound(q, cost)
    assert a3_bound(p, cost) == a3_bound(q, cost)
    assert semi_matching(p.replicas, p.counts > 0)[1] == semi_matching(q.replicas, q.counts > 0)[1]
    assert exact_optimum(p, cost) == pytest.approx(exact_optimum(q, cost), rel=1e-7, abs=1e-7)
    if p.replicas[p.counts > 0].all():
        # A3 loads depend only on the multiset of counts (equal counts are interchangeable)
        m1 = solve_dispatch(p, cost, method="round_robin").makespan
        m2 = solve_dispatch(q, cost, method="round_robin").makespan
        assert m1 == m2


@settings(max_examples=15)
@given(dispatch_instances(max_experts=6, max_gpus=3))
def test_deterministic_and_inputs_untouched(inst):
    p, cost = inst
    counts, rep = p.counts.copy(), p.replicas.copy()
    for name in HEURISTICS:
        a = solve_dispatch(p, cost, method=name, rng=3)
        b = solve_dispatch(p, cost, method=name, rng=3)
        assert np.array_equal(a.shares, b.shares), name
    assert np.array_equal(p.counts, counts) and np.array_equal(p.replicas, rep)
    # kernels on writable inputs leave them unchanged
    from straggler.solvers.dispatch._bounds import lower_bound_kernel
    from straggler.solvers.dispatch._round_robin import a3_kernel
    from straggler.solvers.dispatch._semi_matching import semi_matching_kernel

    c2, r2, live = counts.copy(), rep.copy(), counts > 0
    semi_matching_kernel(r2, live)
    a3_kernel(c2, r2, False)
    lower_bound_kernel(c2, r2, cost.as_array(), 1)
    assert (
        np.array_equal(c2, counts) and np.array_equal(r2, rep) and np.array_equal(live, counts > 0)
    )
