"""A brute-force oracle for Problem 1 on tiny instances, independent of the MILP.

For a fixed activation support (which replicas carry tokens) and, with tiles, a fixed
tile count for each active replica, the activation floor of every GPU is a constant and
what remains is a linear program in the shares (``scipy.optimize.linprog``). Enumerating
every support and tile vector and keeping the best LP value gives the optimum.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.optimize import linprog

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem
from ..formulations.errors import InvalidInputError, param_error
from ..formulations.validation import check_type

__all__ = ["brute_force_dispatch", "BRUTE_MAX_EXPERTS", "BRUTE_MAX_GPUS", "BRUTE_MAX_COMBINATIONS"]

#: Largest instances accepted (live experts, GPUs, enumerated combinations).
BRUTE_MAX_EXPERTS = 6
BRUTE_MAX_GPUS = 3
BRUTE_MAX_COMBINATIONS = 50_000


def _expert_options(n_e: int, gpus: np.ndarray, cost: CostModel):
    """Every (gpus, tiles) an expert may use: non-empty replica subsets, and with tiles every
    tile count ``1..ceil(n_e/tile)`` per chosen replica whose capacity covers ``n_e``."""
    out = []
    kmax = math.ceil(n_e / cost.tile)
    for r in range(1, gpus.size + 1):
        for sub in itertools.combinations(gpus.tolist(), r):
            if not cost.has_tiles:
                out.append((sub, (1,) * r))
                continue
            for ts in itertools.product(range(1, kmax + 1), repeat=r):
                if sum(ts) * cost.tile >= n_e:
                    out.append((sub, ts))
    return out


def brute_force_dispatch(problem: DispatchProblem, cost: CostModel):
    """The optimal makespan of one tiny layer, by enumeration.

    For every support ``S`` (a non-empty set of replica GPUs per live expert) and, when
    ``b2 > 0``, every tile count ``t_eg in 1..ceil(n_e/tile)`` on it, the LP

    .. math::

        \\min M \\;\\text{s.t.}\\; M \\ge a + b|S_g| + b_2 \\textstyle\\sum_{e}(t_{eg} - 1),\\;
        M \\ge c + \\beta N_g,\\; M \\ge c_2 + \\gamma N_g,\\;
        \\sum_{g \\in S_e} x_{eg} = n_e,\\; 0 \\le x_{eg} \\le \\text{tile}\\, t_{eg}

    is solved by ``linprog``; the answer is the least LP value. It is exact: an optimal
    dispatch has some support and tile vector whose LP admits it (value ``<= OPT``), and any
    LP solution, scored by the evaluator, costs at most its LP value (a share that ends up
    zero or in fewer tiles only lowers the floor), so ``>= OPT``.

    Parameters
    ----------
    problem : DispatchProblem
        One layer with at most :data:`BRUTE_MAX_EXPERTS` experts with tokens and
        :data:`BRUTE_MAX_GPUS` GPUs, and at most :data:`BRUTE_MAX_COMBINATIONS` combinations.
    cost : CostModel

    Returns
    -------
    value : float
        The optimal makespan.
    shares : ndarray (n_experts, n_gpus)
        A dispatch attaining it (up to LP tolerance).

    Raises
    ------
    InvalidInputError
        An instance above the size limits, or not a single layer.

    Examples
    --------
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> brute_force_dispatch(p, CostModel(a=0, b=15, c=0, beta=0.1))[0]
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidInputError: The 'problem' parameter of ...
    >>> p = DispatchProblem(counts=[60, 3, 3], replicas=np.ones((3, 2), bool))
    >>> v, x = brute_force_dispatch(p, CostModel(a=0, b=1.5, c=0, beta=0.1))
    >>> round(v, 9)
    3.3
    """
    func = "brute_force_dispatch"
    check_type(problem, "problem", func, DispatchProblem, "a single-layer DispatchProblem")
    check_type(cost, "cost", func, CostModel, "a CostModel")
    if problem.is_stack:
        raise param_error(
            "problem", func, "a single-layer DispatchProblem", f"a stack of {problem.n_layers}"
        )
    n = problem.counts
    live = np.flatnonzero(n > 0)
    g = problem.n_gpus
    if live.size > BRUTE_MAX_EXPERTS or g > BRUTE_MAX_GPUS:
        raise param_error(
            "problem",
            func,
            f"tiny (at most {BRUTE_MAX_EXPERTS} experts with tokens and {BRUTE_MAX_GPUS} GPUs)",
            f"{live.size} live experts on {g} GPUs",
        )
    options = [_expert_options(int(n[e]), np.flatnonzero(problem.replicas[e]), cost) for e in live]
    total = math.prod(len(o) for o in options)
    if total > BRUTE_MAX_COMBINATIONS:
        raise InvalidInputError(
            f"The 'problem' parameter of {func} must have at most {BRUTE_MAX_COMBINATIONS} "
            f"support/tile combinations. Got {total} instead."
        )
    pieces = cost.token_pieces
    idle = max([cost.a] + [c0 for c0, _ in pieces])
    best = math.inf
    best_x = np.zeros((problem.n_experts, g))
    if live.size == 0:
        return float(idle), best_x
    for combo in itertools.product(*options):
        floor = np.full(g, cost.a)
        for sub, ts in combo:
            for gg, t in zip(sub, ts):
                floor[gg] += cost.b + cost.b2 * (t - 1)
        lb = float(floor.max())
        if lb >= best:
            continue
        # LP over the shares of the chosen entries and M (last column)
        ents = [(e, gg, t) for e, (sub, ts) in zip(live, combo) for gg, t in zip(sub, ts)]
        k = len(ents)
        c = np.zeros(k + 1)
        c[-1] = 1.0
        a_ub, b_ub = [], []
        for c0, slope in pieces:
            for gg in range(g):
                row = np.zeros(k + 1)
                row[-1] = -1.0
                for j, (_, g2, _) in enumerate(ents):
                    if g2 == gg:
                        row[j] = slope
                a_ub.append(row)
                b_ub.append(-c0)
        a_eq = np.zeros((live.size, k + 1))
        for j, (e, _, _) in enumerate(ents):
            a_eq[np.searchsorted(live, e), j] = 1.0
        bounds = [
            (0.0, float(min(n[e], cost.tile * t)) if cost.has_tiles else float(n[e]))
            for e, _, t in ents
        ] + [(max(lb, idle), None)]
        res = linprog(
            c,
            A_ub=np.array(a_ub),
            b_ub=np.array(b_ub),
            A_eq=a_eq,
            b_eq=n[live].astype(float),
            bounds=bounds,
            method="highs",
        )
        if res.status == 0 and res.fun < best:
            best = float(res.fun)
            best_x = np.zeros((problem.n_experts, g))
            for j, (e, gg, _) in enumerate(ents):
                best_x[e, gg] = max(res.x[j], 0.0)
    return best, best_x
