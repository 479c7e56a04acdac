"""A second exact backend for Problem 1 on OR-Tools CP-SAT (the ``ortools`` extra).

CP-SAT solves integer programs only, so the dispatch MILP is restated on a grid: shares are
multiples of ``1/scale`` token and times are integers in units of ``1/D`` us. Selected by
``solve_dispatch(..., method="milp", backend="cpsat")``.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem, basic_lower_bound, evaluate
from ...formulations.dispatch_milp import _builder_iv, live_pairs
from ...formulations.errors import BackendUnavailableError
from ...formulations.results import Status
from ...formulations.validation import check_array, check_int, check_real, check_time_limit
from ..highs import MilpSolution

__all__ = ["solve_dispatch_cpsat", "DEFAULT_SCALE", "grid_error", "time_unit"]

#: Shares are multiples of ``1/DEFAULT_SCALE`` token.
DEFAULT_SCALE = 16
#: Cost parameters are read as fractions with denominators up to this.
MAX_DENOMINATOR = 10**6


def _import_cp_model():
    try:
        from ortools.sat.python import cp_model
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise BackendUnavailableError(
            "The CP-SAT backend needs OR-Tools: pip install 'straggler[ortools]'."
        ) from exc
    return cp_model


def _frac(v: float) -> Fraction:
    return Fraction(repr(float(v))).limit_denominator(MAX_DENOMINATOR)


def time_unit(cost: CostModel, scale: int) -> tuple[int, bool]:
    """``(D, exact)``: the least ``D`` making every time coefficient of the grid model an
    integer (``D*a, D*b, D*b2, D*c, D*c2`` and ``D*beta/scale, D*gamma/scale``), and whether
    every parameter equals the decimal fraction it was read as.

    Examples
    --------
    >>> time_unit(CostModel(a=0, b=15, c=0, beta=0.1), 16)
    (160, True)
    """
    a, b, b2, c, beta = (_frac(v) for v in (cost.a, cost.b, cost.b2, cost.c, cost.beta))
    vals = [a, b, b2, c, beta / scale]
    if cost.has_traffic:
        vals += [_frac(cost.c2), _frac(cost.gamma) / scale]
    D = 1
    for v in vals:
        D = D * v.denominator // math.gcd(D, v.denominator)
    raw = [cost.a, cost.b, cost.b2, cost.c, cost.beta] + (
        [cost.c2, cost.gamma] if cost.has_traffic else []
    )
    exact = all(float(_frac(v)) == float(v) for v in raw)
    return D, exact


def grid_error(problem: DispatchProblem, cost: CostModel, scale: int) -> float:
    """How much the grid optimum may exceed the true optimum:
    ``max(beta, gamma) * max_g(#live replicas on g) / scale``.

    Examples
    --------
    >>> p = DispatchProblem(counts=[5, 1], replicas=[[1, 1], [1, 0]])
    >>> grid_error(p, CostModel(a=0, b=1, c=0, beta=0.5), 10)
    0.1
    """
    _, g_idx = live_pairs(problem)
    per = np.bincount(g_idx, minlength=problem.n_gpus).max(initial=0)
    slope = max(s for _, s in cost.token_pieces)
    return float(slope * per / scale)


def solve_dispatch_cpsat(
    problem: DispatchProblem,
    cost: CostModel,
    *,
    time_limit: float = 10.0,
    mip_rel_gap: float = 1e-4,
    threads: int = 1,
    seed: int = 0,
    warm_start=None,
    scale: int = DEFAULT_SCALE,
) -> MilpSolution:
    """Solve one layer exactly on the ``1/scale``-token grid with CP-SAT.

    Model (all integer): ``y_eg = scale * x_eg`` in ``[0, scale*n_e]`` on live replica entries,
    ``z_eg`` boolean with ``y <= scale*n_e*z``, tile counts ``t`` with
    ``scale*tile*t >= y``, ``z <= t <= ceil(n_e/tile) z`` when ``b2 > 0``, every expert
    covered, ``sum_g y_eg = scale*n_e``, and ``M`` (units of ``1/D`` us, :func:`time_unit`)
    above ``D*(a + b G_g + b2 (T_g - G_g))``, ``D*c + (D*beta/scale) * sum_e y_eg`` and the
    traffic piece on every GPU.

    Parameters
    ----------
    problem : DispatchProblem
        One layer.
    cost : CostModel
    time_limit, mip_rel_gap, threads, seed
        CP-SAT's ``max_time_in_seconds`` (less the model's building time),
        ``relative_gap_limit``, ``num_workers``,
        ``random_seed``.
    warm_start : ndarray (n_experts, n_gpus), optional
        A dispatch given to CP-SAT as a hint.
    scale : int, default :data:`DEFAULT_SCALE`

    Returns
    -------
    MilpSolution
        ``x`` is the shares matrix flattened (``extras["shares"]`` holds it as a matrix);
        ``objective`` the evaluator's makespan of it; ``dual_bound`` a bound valid for the
        **real** problem (below).

    Notes
    -----
    *What the grid costs.* Take a real optimum; floor each share to the grid and give the
    ``d_e < #replicas`` missing units of expert ``e`` to its entries with a fractional part
    (one each). Every share moves by less than ``1/scale``, no share becomes positive, and
    no share crosses a tile boundary upward (a fractional share rounds up to at most the
    next grid point, and tile boundaries are grid points). So ``G`` and ``T`` do not grow
    and ``N_g`` grows by less than ``(#live replicas on g)/scale``: the grid optimum exceeds
    the real one by less than :func:`grid_error`. CP-SAT's bound ``B`` is for the grid
    problem; the reported ``dual_bound`` is ``max(B - grid_error, basic_lower_bound)``,
    valid for the real problem, and the status is OPTIMAL only when the makespan is within
    ``mip_rel_gap`` of that bound (``extras["grid_status"]`` keeps CP-SAT's own verdict).
    Costs are read as decimal fractions (denominator <= 1e6); ``extras["exact_costs"]``
    says whether that reading is exact.

    Raises
    ------
    BackendUnavailableError
        OR-Tools is not installed.
    """
    cp_model = _import_cp_model()
    func = "solve_dispatch_cpsat"
    _builder_iv(problem, cost, func)
    time_limit = check_time_limit(time_limit, func)
    mip_rel_gap = check_real(mip_rel_gap, "mip_rel_gap", func, lo=0, hi=1, hi_open=True)
    threads = check_int(threads, "threads", func, lo=1)
    seed = check_int(seed, "seed", func, lo=0, hi=2**31 - 1)
    scale = check_int(scale, "scale", func, lo=1)
    if warm_start is not None:
        want = (problem.n_experts, problem.n_gpus)
        warm_start = check_array(warm_start, "warm_start", func, ndim=2, shape=want, lo=0)
    t0 = time.perf_counter()
    n = problem.counts.astype(np.int64)
    e_idx, g_idx = live_pairs(problem)
    P = e_idx.size
    g = problem.n_gpus
    D, exact_costs = time_unit(cost, scale)
    fa, fb, fb2, fc, fbeta = (_frac(v) for v in (cost.a, cost.b, cost.b2, cost.c, cost.beta))
    m = cp_model.CpModel()
    y = [m.NewIntVar(0, int(n[e_idx[k]] * scale), f"y{k}") for k in range(P)]
    z = [m.NewBoolVar(f"z{k}") for k in range(P)]
    for k in range(P):
        m.Add(y[k] <= int(n[e_idx[k]] * scale) * z[k])
    for e in np.flatnonzero(n > 0):
        ks = np.flatnonzero(e_idx == e)
        m.Add(sum(y[k] for k in ks) == int(n[e] * scale))
        m.AddBoolOr([z[k] for k in ks])
    t = None
    if cost.has_tiles:
        t = []
        for k in range(P):
            kmax = math.ceil(n[e_idx[k]] / cost.tile)
            tk = m.NewIntVar(0, kmax, f"t{k}")
            m.Add(scale * cost.tile * tk >= y[k])
            m.Add(tk >= z[k])
            m.Add(tk <= kmax * z[k])
            t.append(tk)
    lb = float(basic_lower_bound(problem, cost))
    hi = int(D * (float(cost.a) + float(cost.b) * P + float(cost.b2) * n.sum() + 1)) + int(
        D * (max(float(cost.c), float(cost.c2 or 0)) + max(cost.beta, cost.gamma or 0) * n.sum())
    )
    M = m.NewIntVar(0, hi + 1, "M")
    pieces = [(fc, fbeta)]
    if cost.has_traffic:
        pieces.append((_frac(cost.c2), _frac(cost.gamma)))
    for gg in range(g):
        ks = np.flatnonzero(g_idx == gg)
        act = int(fa * D) + int(fb * D) * sum(z[k] for k in ks)
        if t is not None:
            act += int(fb2 * D) * sum(t[k] - z[k] for k in ks)
        m.Add(M >= act)
        for c0, slope in pieces:
            m.Add(M >= int(c0 * D) + int(slope * D / scale) * sum(y[k] for k in ks))
    m.Minimize(M)
    if warm_start is not None:
        w = np.asarray(warm_start, dtype=float)
        for k in range(P):
            v = int(round(w[e_idx[k], g_idx[k]] * scale))
            m.AddHint(y[k], v)
            m.AddHint(z[k], int(v > 0))
    solver = cp_model.CpSolver()
    prm = solver.parameters
    # the time limit covers building the model too
    prm.max_time_in_seconds = max(time_limit - (time.perf_counter() - t0), 1e-6)
    prm.num_workers = int(threads)
    prm.random_seed = int(seed)
    prm.relative_gap_limit = float(mip_rel_gap)
    prm.log_search_progress = False
    st = solver.Solve(m)
    runtime = time.perf_counter() - t0
    name = solver.StatusName(st)
    has_x = st in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    err = grid_error(problem, cost, scale)
    grid_bound = solver.BestObjectiveBound() / D if has_x or st == cp_model.UNKNOWN else -math.inf
    dual = max(grid_bound - err, lb) if math.isfinite(grid_bound) else lb
    extras = {
        "branches": int(solver.NumBranches()),
        "scale": int(scale),
        "time_unit": int(D),
        "grid_error": err,
        "grid_bound": grid_bound,
        "grid_status": name,
        "exact_costs": exact_costs,
    }
    if not has_x:
        status = {cp_model.INFEASIBLE: Status.INFEASIBLE, cp_model.MODEL_INVALID: Status.ERROR}.get(
            st, Status.NO_SOLUTION
        )
        return MilpSolution(
            status=status,
            x=None,
            objective=math.inf,
            dual_bound=dual,
            gap=math.inf,
            runtime_s=runtime,
            backend="cpsat",
            raw_status=name,
            extras=extras,
        )
    shares = np.zeros((problem.n_experts, g))
    yv = np.array([solver.Value(v) for v in y], dtype=float)
    shares[e_idx, g_idx] = yv / scale
    obj = float(evaluate(problem, cost, shares).makespan)
    dual = min(dual, obj)
    gap = (obj - dual) / max(abs(obj), 1e-12)
    status = Status.OPTIMAL if gap <= mip_rel_gap + 1e-12 else Status.FEASIBLE
    extras["shares"] = shares
    return MilpSolution(
        status=status,
        x=shares.ravel(),
        objective=obj,
        dual_bound=dual,
        gap=gap,
        runtime_s=runtime,
        backend="cpsat",
        raw_status=name,
        extras=extras,
    )
