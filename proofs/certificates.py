"""Executable certificates: which guarantee applies to a dispatch result, and does it hold.

:func:`certify` recomputes everything from the problem and the shares (never trusting the
result's own numbers) and checks, with a relative tolerance of ``1e-9``:

* always: the shares are feasible, the reported makespan is the evaluator's, and
  ``lower_bound <= makespan`` (and ``lower_bound <= OPT`` when ``opt`` is given);
* ``round_robin`` under full replication (A3): Theorem 2, ``M(A3) <= REF + delta``;
* ``tempo`` under full replication, with its ensemble on (the A3 candidate computed):
  Proposition 1, ``M(A*) <= (REF + delta)/(1 - tau)``;
  and, when the result's extras carry the candidate makespans, the exact ensemble rule
  ``M(A*) <= min(M(A_H), min_C M(C)/(1 - tau), M(exact token-LP dispatch))``; when tempo
  returned the exact token-LP dispatch without running its stages, that it meets the
  certified bound recomputed here;
* ``semi_matching`` with ``c = beta = b2 = 0`` and no traffic: Lemma 2,
  ``M = a + b*SM``;
* ``token_lp`` with ``a = b = b2 = 0``: Lemma 1, ``M = max(c + beta*V, c2 + gamma*V)``
  with ``V`` the token-LP value.

``delta`` is :func:`~straggler.solvers.dispatch.round_robin.a3_bound`. ``REF`` is ``opt`` when
given,
else the certified lower bound of :func:`~straggler.solvers.certified_lower_bound`; the
latter is a stronger check that the proofs still guarantee (Theorem 2's proof bounds
``M(A3)`` by the averaging bound plus ``delta``, and the certified bound dominates it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem, check_shares, evaluate
from ..formulations.errors import InfeasibleSharesError, param_error
from ..formulations.results import DispatchResult
from ..formulations.validation import check_array, check_real, check_type
from ..solvers.dispatch.bounds import certified_lower_bound
from ..solvers.dispatch.exact import solve_token_lp
from ..solvers.dispatch.registry import dispatch_methods, get_dispatch_method
from ..solvers.dispatch.round_robin import a3_bound, is_full_replication
from ..solvers.dispatch.semi_matching import semi_matching

__all__ = ["Certificate", "certify", "RTOL"]

#: Relative tolerance of every inequality check.
RTOL = 1e-9


@dataclass(frozen=True)
class Certificate:
    """The verdict of :func:`certify`.

    ``guarantee`` names the strongest guarantee that applies, ``lhs <= rhs`` is its
    inequality, ``holds`` is True when *every* check in ``details["checks"]`` holds.
    """

    guarantee: str
    holds: bool
    lhs: float
    rhs: float
    details: dict = field(default_factory=dict)


def _le(lhs, rhs):
    return bool(lhs <= rhs + RTOL * max(1.0, abs(rhs)))


def _scored_problem(problem, method, extras, checks):
    """The problem a result is scored on: the problem itself, or, for a method that moves
    weights (``moonep``) or places its own replicas (``lplb``), the problem on the mask it
    reports (for ``moonep`` a superset of the problem's)."""
    cls = get_dispatch_method(method, "certify") if method in dispatch_methods() else None
    if cls is None or not getattr(cls, "moves_weights", False):
        return problem
    mask = np.asarray(extras.get("replicas", problem.replicas), dtype=bool)
    ok = mask.shape == problem.replicas.shape
    if not getattr(cls, "own_placement", False):  # MoonEP only adds replicas
        ok = ok and bool((mask | ~problem.replicas).all())
        checks["augmented mask contains the problem's"] = (0.0, 0.0, ok)
    if not ok:
        return problem
    return DispatchProblem(counts=problem.counts, replicas=mask, gpu_node=problem.gpu_node)


def _certify_layer(problem, cost, shares, makespan, lower_bound, result, extras, tau, opt):
    method = result.method
    checks: dict[str, tuple[float, float, bool]] = {}
    problem = _scored_problem(problem, method, extras, checks)
    try:
        check_shares(problem, shares)
        feasible = True
    except InfeasibleSharesError:
        feasible = False
    checks["feasible"] = (0.0, 0.0, feasible)
    m = float(evaluate(problem, cost, shares).makespan)
    checks["makespan is the evaluator's"] = (
        float(makespan),
        m,
        _le(float(makespan), m) and _le(m, float(makespan)),
    )
    lb = float(lower_bound)
    checks["lower_bound <= makespan"] = (lb, m, _le(lb, m))
    guarantee, main = "lower_bound <= makespan", (lb, m)
    if opt is not None:
        checks["lower_bound <= OPT"] = (lb, float(opt), _le(lb, float(opt)))
        checks["OPT <= makespan"] = (float(opt), m, _le(float(opt), m))
    full = is_full_replication(problem)
    ref = float(opt) if opt is not None else certified_lower_bound(problem, cost)
    delta = a3_bound(problem, cost)
    if method == "round_robin" and full and extras.get("rule", "a3") == "a3":
        guarantee, main = "Theorem 2: M(A3) <= OPT + delta", (m, ref + delta)
    elif method == "tempo":
        cands_from = [
            k
            for k in ("makespan_lp", "makespan_a3")
            if k in extras and math.isfinite(float(extras[k]))
        ]
        cands = [float(extras[k]) for k in cands_from]
        exact = float(extras.get("makespan_lp_exact", math.nan))
        heuristic = float(extras.get("makespan_heuristic", math.nan))
        if math.isfinite(heuristic):
            rule = min([heuristic] + [c / (1 - tau) for c in cands])
            if math.isfinite(exact):  # the exact token-LP dispatch, taken when lower
                rule = min(rule, exact)
            checks["Proposition 1: M(A*) <= min(M(A_H), min_C M(C)/(1-tau))"] = (
                m,
                rule,
                _le(m, rule),
            )
        elif extras.get("stages_skipped"):
            # the exact token-LP dispatch met the certified bound: stages 1-5 never ran, and
            # the dispatch must be optimal by the bound recomputed here
            lb_here = certified_lower_bound(problem, cost)
            checks["stages skipped: M(A*) <= certified bound"] = (m, lb_here, _le(m, lb_here))
        # Proposition 1 bounds tempo through its A3 candidate: with the ensemble off
        # (makespan_a3 is nan) only the universal checks apply. A dispatch returned without
        # the stages meets the certified bound, so it is optimal and meets it too.
        if full and ("makespan_a3" in cands_from or extras.get("stages_skipped")):
            guarantee = "Proposition 1: M(A*) <= (OPT + delta)/(1 - tau)"
            main = (m, (ref + delta) / (1 - tau))
    elif method == "semi_matching" and cost.c == cost.beta == cost.b2 == 0 and not cost.has_traffic:
        sm = semi_matching(problem.replicas, np.asarray(problem.counts) > 0)[1]
        guarantee, main = "Lemma 2: M = a + b*SM", (m, cost.a + cost.b * sm)
    elif method == "token_lp" and cost.a == cost.b == cost.b2 == 0 and result.success:
        # (at its time limit the token LP returns an incumbent, FEASIBLE: no Lemma 1)
        _, v = solve_token_lp(problem, cost)
        rhs = max(t0 + s * v for t0, s in cost.token_pieces)
        guarantee, main = "Lemma 1: M = max_k(c_k + beta_k * V_LP)", (m, rhs)
    if guarantee not in checks:
        checks[guarantee] = (main[0], main[1], _le(*main))
    holds = all(v[2] for v in checks.values())
    details = {"checks": checks, "reference": ref, "delta": delta, "full_replication": full}
    return Certificate(guarantee=guarantee, holds=holds, lhs=main[0], rhs=main[1], details=details)


def _certify_iv(problem, cost, result, tau, opt):
    func = "certify"
    check_type(problem, "problem", func, DispatchProblem, "a DispatchProblem")
    check_type(cost, "cost", func, CostModel, "a CostModel")
    check_type(result, "result", func, DispatchResult, "a DispatchResult (from solve_dispatch)")
    want = problem.counts.shape + (problem.n_gpus,)
    if np.shape(result.shares) != want:
        raise param_error(
            "result", func, f"a result for this problem (shares of shape {want})",
            f"shares of shape {np.shape(result.shares)}",
        )  # fmt: skip
    tau = check_real(tau, "tau", func, lo=0, hi=1, hi_open=True)
    if opt is not None:
        if problem.is_stack:
            opt = check_array(opt, "opt", func, shape=(problem.n_layers,), lo=0)
        else:
            opt = check_real(opt, "opt", func, lo=0)
        _check_opt_below_result(problem, cost, result, opt)
    return tau, opt


def _check_opt_below_result(problem, cost, result, opt) -> None:
    """``opt`` is no optimum where the result's own shares are feasible for ``problem``
    with a smaller makespan (the evaluator's): refused, naming ``opt``, instead of a
    certificate that merely fails."""
    layers = list(problem.layers()) if problem.is_stack else [problem]
    opts = list(np.asarray(opt, dtype=float).reshape(-1))
    shares = result.shares if problem.is_stack else [result.shares]
    for l, (p, o, x) in enumerate(zip(layers, opts, shares)):
        try:
            check_shares(p, x)
        except InfeasibleSharesError:
            continue  # no feasible makespan to compare with (the certificate says so)
        m = float(evaluate(p, cost, x).makespan)
        if not _le(o, m):
            where = f" for layer {l}" if problem.is_stack else ""
            raise param_error(
                "opt",
                "certify",
                f"at most the makespan of a feasible dispatch, as an optimum is (the result's "
                f"own shares are feasible with makespan {m!r}{where})",
                repr(o),
            )


def certify(
    problem: DispatchProblem,
    cost: CostModel,
    result: DispatchResult,
    *,
    tau: float = 0.01,
    opt=None,
) -> Certificate:
    """State which guarantee applies to ``result`` and verify it.

    Parameters
    ----------
    problem, cost
        The instance the result was computed for.
    result : DispatchResult
        From :func:`~straggler.solvers.solve_dispatch` (one layer or a stack).
    tau : float, default 0.01
        The switching tolerance the ``tempo`` result was computed with.
    opt : float or array_like, optional
        The exact optimum (per layer); without it the certified lower bound stands in. An
        ``opt`` above the makespan of the result's own shares, where they are feasible, is
        no optimum and is refused.

    Returns
    -------
    Certificate
        For a stack, ``lhs``/``rhs`` are arrays, ``holds`` is the conjunction over layers
        and ``details["layers"]`` holds each layer's certificate.

    Raises
    ------
    InvalidInputError
        A problem, cost or result of the wrong kind or shape, ``tau`` outside ``[0, 1)``,
        an ``opt`` that is negative, of the wrong shape, or above the result's feasible
        makespan.

    Examples
    --------
    >>> from straggler.solvers import solve_dispatch
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> cost = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> cert = certify(p, cost, solve_dispatch(p, cost, method="round_robin"))
    >>> cert.guarantee, cert.holds, cert.lhs, cert.rhs
    ('Theorem 2: M(A3) <= OPT + delta', True, 69.0, 120.0)
    """
    tau, opt = _certify_iv(problem, cost, result, tau, opt)
    if not problem.is_stack:
        return _certify_layer(
            problem,
            cost,
            result.shares,
            result.makespan,
            result.lower_bound,
            result,
            result.extras,
            tau,
            opt,
        )
    opts = [None] * problem.n_layers if opt is None else list(opt)
    layer_extras = result.extras.get("layers", [{}] * problem.n_layers)
    certs = [
        _certify_layer(
            p,
            cost,
            result.shares[l],
            result.makespan[l],
            result.lower_bound[l],
            result,
            layer_extras[l],
            tau,
            opts[l],
        )
        for l, p in enumerate(problem.layers())
    ]
    names = sorted({c.guarantee for c in certs})
    return Certificate(
        guarantee="; ".join(names),
        holds=all(c.holds for c in certs),
        lhs=np.array([c.lhs for c in certs]),
        rhs=np.array([c.rhs for c in certs]),
        details={"layers": certs},
    )
