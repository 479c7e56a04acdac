"""``solve_dispatch``: the one entry point of Problem 1 (TEMPO §3.1)."""

from __future__ import annotations

import math
import time
from numbers import Real

import numpy as np

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem, evaluate
from ..formulations.errors import param_error
from ..formulations.results import DispatchResult, Status, worst_status
from .bounds import certified_lower_bound
from .registry import LayerSolution, make_method

__all__ = ["solve_dispatch", "DEFAULT_METHOD", "as_rng", "check_time_limit"]

#: The method used when none is named: tempo_fast (TEMPO §4.2, ``straggler.solvers.tempo``).
DEFAULT_METHOD = "tempo"
#: Relative slack under which a makespan equal to a certified bound counts as proved optimal.
OPTIMALITY_RTOL = 1e-9


def as_rng(rng, func: str = "solve_dispatch") -> np.random.Generator:
    """Normalize ``rng`` (None, an int seed or a Generator) to a Generator."""
    if rng is None or isinstance(rng, np.random.Generator):
        return np.random.default_rng(rng)
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise param_error("rng", func, "None, a non-negative int seed or a numpy Generator", repr(rng))


def _validate(problem, cost, time_limit) -> None:
    func = "solve_dispatch"
    if not isinstance(problem, DispatchProblem):
        raise param_error(
            "problem",
            func,
            "a DispatchProblem (see DispatchProblem(counts=, replicas=))",
            type(problem).__name__,
        )
    if not isinstance(cost, CostModel):
        raise param_error("cost", func, "a CostModel", type(cost).__name__)
    check_time_limit(time_limit, func)


def check_time_limit(time_limit, func: str) -> None:
    """Raise unless ``time_limit`` is a positive number of seconds."""
    if (
        not isinstance(time_limit, Real)
        or isinstance(time_limit, bool)
        or not (time_limit > 0)
        or math.isnan(time_limit)
    ):
        raise param_error("time_limit", func, "a positive number of seconds", repr(time_limit))


def _layer_bound(problem, cost, sol: LayerSolution) -> float:
    """The certified bound combined with the method's own (reusing the exact semi-matching
    and token-LP values a method like ``tempo`` computed with the library's kernels)."""
    lb = certified_lower_bound(
        problem,
        cost,
        semi_matching_value=sol.extras.get("semi_matching_value"),
        token_lp_value=sol.extras.get("token_lp_value"),
    )
    return max(lb, float(sol.lower_bound))


def _status(sol: LayerSolution, makespan: float, lb: float) -> Status:
    if sol.status is Status.HEURISTIC and makespan <= lb * (1 + OPTIMALITY_RTOL) + 1e-12:
        return Status.OPTIMAL
    return sol.status


def solve_dispatch(
    problem: DispatchProblem,
    cost: CostModel,
    *,
    method: str | None = None,
    time_limit: float = 10.0,
    rng=None,
    **options,
) -> DispatchResult:
    """Dispatch every expert's tokens to its replicas, minimizing the modeled makespan.

    .. math::

        \\min_x \\max_g \\max(a + b G_g + b_2 (T_g - G_g),\\; c + \\beta N_g,\\; c_2 + \\gamma N_g)

    subject to ``sum_g x[e, g] = n[e]``, ``x >= 0``, ``x[e, g] = 0`` off the replica mask.

    Parameters
    ----------
    problem : DispatchProblem
        One layer, or a stack of layers (solved layer by layer; stacked result).
    cost : CostModel
    method : str, optional
        A registered name (see :func:`~straggler.solvers.dispatch_methods`): exact
        ``"milp"`` and ``"token_lp"``, and every baseline (``"static"``, ``"uniform"``,
        ``"metro"``, ``"llep"``, ...). Default :data:`DEFAULT_METHOD`.
    time_limit : float, default 10
        Seconds per layer for exact methods; a method that hits it returns its incumbent
        with status FEASIBLE (``success`` False) and its proved bound.
    rng : None, int or numpy.random.Generator
        Randomness for randomized methods (same seed, same result).
    **options
        Hyperparameters of the chosen method; unknown names raise.

    Returns
    -------
    DispatchResult
        ``shares`` of shape ``(n_experts, n_gpus)`` (or ``(n_layers, n_experts, n_gpus)``),
        the evaluator's ``makespan`` and ``gpu_time``, a certified ``lower_bound``,
        ``status``, ``method``, ``runtime_s`` and method ``extras`` (for stacks,
        ``extras["layers"]`` holds each layer's extras and ``extras["layer_status"]``).

    Raises
    ------
    InvalidInputError
        Bad problem, cost, time limit or rng.
    InvalidOptionError
        Unknown method or option.

    Examples
    --------
    TEMPO Fig. 1b: one hot expert of 600 tokens, six of 30, two GPUs, ``b = 15``,
    ``beta = 0.1``. Splitting only the hot expert gives the optimum, 60 us:

    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> cost = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> res = solve_dispatch(p, cost, method="milp")
    >>> round(res.makespan, 6), res.status.name
    (60.0, 'OPTIMAL')
    """
    _validate(problem, cost, time_limit)
    name = DEFAULT_METHOD if method is None else method
    solver = make_method(name, options)
    gen = as_rng(rng)
    t0 = time.perf_counter()
    layers = list(problem.layers())
    if hasattr(solver, "solve_stack") and problem.is_stack:
        sols = solver.solve_stack(layers, cost, time_limit=float(time_limit), rng=gen)
    else:
        sols = [solver.solve(p, cost, time_limit=float(time_limit), rng=gen) for p in layers]
    runtime = time.perf_counter() - t0
    shares = np.stack([np.asarray(s.shares, dtype=float) for s in sols])
    bounds = np.array([_layer_bound(p, cost, s) for p, s in zip(layers, sols)])
    ev = evaluate(problem, cost, shares if problem.is_stack else shares[0])
    makespans = np.atleast_1d(ev.makespan)
    statuses = [_status(s, m, lb) for s, m, lb in zip(sols, makespans, bounds)]
    if not problem.is_stack:
        return DispatchResult(
            shares=shares[0],
            makespan=float(ev.makespan),
            gpu_time=ev.times,
            lower_bound=float(bounds[0]),
            status=statuses[0],
            method=name,
            runtime_s=runtime,
            extras=dict(sols[0].extras),
        )
    return DispatchResult(
        shares=shares,
        makespan=makespans,
        gpu_time=ev.times,
        lower_bound=bounds,
        status=worst_status(statuses),
        method=name,
        runtime_s=runtime,
        extras={"layers": [s.extras for s in sols], "layer_status": statuses},
    )
