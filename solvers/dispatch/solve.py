"""``solve_dispatch``: the one entry point of Problem 1 (TEMPO §3.1)."""

from __future__ import annotations

import functools
import threading
import time

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import CONSERVATION_RTOL, DispatchProblem, check_shares
from ...formulations.errors import InfeasibleSharesError, StragglerError
from ...formulations.results import DispatchResult, Status, worst_status
from ...formulations.validation import check_rng, check_time_limit, check_type
from .._numba.compile import JitTimer
from ._backend import SCORE, reference_seconds
from .bounds import validated_bound
from .method import OPTIMALITY_RTOL, LayerSolution
from .registry import make_method

__all__ = ["solve_dispatch", "solve_layers", "DEFAULT_METHOD"]

#: The method used when none is named: tempo_fast (TEMPO §4.2,
#: ``straggler.solvers.dispatch.tempo``).
DEFAULT_METHOD = "tempo"

#: Kept importable for code written before ``formulations.validation``: the same checks.
as_rng = check_rng


def _solve_dispatch_iv(problem, cost, method, time_limit, rng, options):
    """Validated ``(name, method instance, time_limit, Generator)`` of a solve_dispatch call."""
    func = "solve_dispatch"
    check_type(
        problem, "problem", func, DispatchProblem,
        "a DispatchProblem (see DispatchProblem(counts=, replicas=))",
    )  # fmt: skip
    check_type(cost, "cost", func, CostModel, "a CostModel (e.g. CostModel.preset(name))")
    time_limit = check_time_limit(time_limit, func)
    gen = _entropy() if rng is None else check_rng(rng, func)
    name = DEFAULT_METHOD if method is None else method
    return name, _method(name, options, func), time_limit, gen


_ENTROPY: list = []
_ENTROPY_LOCK = threading.Lock()


def _entropy() -> np.random.Generator:
    """``rng=None``: one Generator seeded from OS entropy once per process (unpredictable,
    like a fresh one per call, without the ~20 us of seeding each call)."""
    if not _ENTROPY:
        with _ENTROPY_LOCK:
            if not _ENTROPY:
                _ENTROPY.append(np.random.default_rng())
    return _ENTROPY[0]


def _method(name, options: dict, func: str):
    """``make_method(name, options)``, one instance per distinct hashable options for
    methods that are frozen dataclasses (immutable hyperparameters, so sharing is safe;
    validating and building one costs ~15 us per call otherwise), kept in
    :data:`_METHODS`."""
    # the option's type is part of the key: ``1 == True`` and ``hash(1) == hash(True)``, so
    # without it an instance built for ``seed=True`` would serve ``seed=1`` unchecked
    items = []
    for k, v in options.items():  # (a loop: a comprehension's frame costs more, cold)
        items.append((k, type(v).__qualname__, v))
    items.sort()
    key = (name, tuple(items))
    try:
        solver = _METHODS.get(key, _NOT_BUILT)
    except TypeError:  # an unhashable name or option value: built (and refused) each call
        return make_method(name, options, func)
    if solver is _NOT_BUILT:
        solver = make_method(name, options, func)  # (bad options raise: nothing is kept)
        if len(_METHODS) >= _METHODS_MAX:
            _METHODS.clear()
        _METHODS[key] = solver if type(solver).__dataclass_params__.frozen else None
        return solver
    return make_method(name, options, func) if solver is None else solver


#: The shared method instances by ``(name, options)`` (None: a method that is not a frozen
#: dataclass, built each call), at most ``_METHODS_MAX`` of them (emptied when full).
_METHODS: dict = {}
_METHODS_MAX = 256
_NOT_BUILT = object()


def _own_masks(solver, sols) -> list:
    """The mask each layer's shares lie on when the method does not keep to the problem's:
    ``LayerSolution.replicas``, or, for a method marked ``moves_weights`` (MoonEP, LPLB with
    its own placement), the ``extras["replicas"]`` it reports; None where the problem's."""
    moves = getattr(type(solver), "moves_weights", False)
    out = []
    for s in sols:
        mask = s.replicas
        if mask is None and moves:
            mask = s.extras.get("replicas")
        out.append(None if mask is None else np.asarray(mask, dtype=bool))
    return out


def _reporting_problem(problem: DispatchProblem, masks) -> DispatchProblem:
    """The problem the results are scored and certified on: ``problem`` itself, or, where a
    method dispatched on a mask of its own (see :func:`_own_masks`), the problem on it."""
    if all(m is None for m in masks):
        return problem
    masks = [problem.layer(l).replicas if m is None else m for l, m in enumerate(masks)]
    rep = np.stack(masks) if problem.is_stack else masks[0]
    return DispatchProblem(counts=problem.counts, replicas=rep, gpu_node=problem.gpu_node)


def _layer_bound(
    report: DispatchProblem, l: int, cost, sol: LayerSolution, own_mask, makespan: float
) -> float:
    """The certified bound of layer ``l`` combined with the method's own: the method's
    :class:`~straggler.solvers.dispatch.method.BoundCertificate` when it computed one on the
    problem's own mask (``tempo`` does), else
    :func:`~straggler.solvers.certified_lower_bound` computed here, its bounds B8 and B9 tried
    from the method's ``makespan`` (a feasible dispatch's: where the method is optimal, they
    usually prove it)."""
    if own_mask and sol.certificate is not None:
        lb = sol.certificate.bound
    else:
        lb = validated_bound(report.layer(l) if report.is_stack else report, cost, makespan)
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
        ``status``, ``method``, ``runtime_s`` (the method's wall time, JIT compilation
        excluded), ``compile_s`` (numba JIT seconds during the call, kept apart) and method
        ``extras`` (for stacks, ``extras["layers"]`` holds each layer's extras and
        ``extras["layer_status"]``). A method that creates replicas (``moonep``) is scored,
        checked and certified on the mask its shares lie on (``extras["replicas"]``), so
        ``lower_bound <= makespan`` holds for every result.

    Raises
    ------
    InvalidInputError
        Bad problem, cost, time limit or rng, or a bad option value.
    InvalidOptionError
        Unknown method or option.
    StragglerError
        A method returned an infeasible dispatch or a bound above its makespan (a bug in
        the library, never the caller's input).

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
    with JitTimer() as jit:  # every JIT second of the call: compile_s, never runtime_s
        name, solver, time_limit, gen = _solve_dispatch_iv(
            problem, cost, method, time_limit, rng, options
        )
        fields, (t0, t1, ref) = solve_layers(problem, cost, name, solver, time_limit, gen)
    runtime = max(t1 - t0 - jit.jit_within(t0, t1), 0.0)
    return DispatchResult(
        method=name, runtime_s=runtime, compile_s=jit.jit_s, reference_s=ref, **fields
    )


def solve_layers(problem: DispatchProblem, cost: CostModel, name: str, solver, time_limit, rng):
    """The layer loop of :func:`solve_dispatch` on validated input: the method's layers
    (``solve_stack`` when it has one and ``problem`` is a stack), then the independent
    checks and scoring of :func:`_score`.

    For callers that validated once and solve many windows with one method instance
    (:class:`~straggler.runtime.SolverWorker`). ``solver`` is a method instance
    (``registry.make_method``), ``rng`` a Generator. Returns the fields of the
    :class:`DispatchResult` but ``method``, ``runtime_s``, ``compile_s`` and
    ``reference_s``, and ``(t0, t1, reference_s)``: the ``perf_counter`` readings around the
    method's own work and the seconds plain-Python references ran inside it.
    """
    stack = problem.is_stack
    layers = list(problem.layers()) if stack else None
    r0 = reference_seconds()
    t0 = time.perf_counter()
    if not stack:
        sols = [solver.solve(problem, cost, time_limit=time_limit, rng=rng)]
    elif hasattr(solver, "solve_stack"):
        sols = solver.solve_stack(layers, cost, time_limit=time_limit, rng=rng)
    else:
        sols = [solver.solve(p, cost, time_limit=time_limit, rng=rng) for p in layers]
    t1 = time.perf_counter()
    ref = reference_seconds() - r0
    return _score(problem, cost, name, solver, sols), (t0, t1, ref)


@functools.lru_cache(maxsize=64)
def _score_cost_of(cost: CostModel) -> np.ndarray:
    return np.append(cost.as_array(), 1.0 if cost.has_traffic else 0.0)


#: The last cost model and its array, as one tuple (threads replace it whole).
_LAST_COST: list = [(None, None)]


def _score_cost(cost: CostModel) -> np.ndarray:
    """``cost.as_array()`` and the traffic flag:
    :func:`~straggler.solvers.dispatch._score.score_kernel`'s cost, once per (frozen,
    hashable) cost model; the last one by identity (hashing a model's fields costs a
    microsecond, a third of a small layer's scoring)."""
    last, array = _LAST_COST[0]
    if last is not cost:
        array = _score_cost_of(cost)
        _LAST_COST[0] = (cost, array)
    return array


def _check_and_evaluate(report: DispatchProblem, cost: CostModel, shares: np.ndarray):
    """Whether ``shares`` is feasible on ``report``, and the evaluator's per-GPU times
    ``(L, g)`` (equal to ``evaluate_arrays``'s bit for bit), in one pass over the stack."""
    ok, times = SCORE(shares, report.replicas, report.counts, _score_cost(cost), CONSERVATION_RTOL)
    return bool(ok), times


def _score(problem, cost, name, solver, sols) -> dict:
    """The method's layers scored by the independent evaluator on the mask they lie on,
    checked, certified: the fields of the :class:`DispatchResult`."""
    stack = problem.is_stack
    if stack:
        shares = np.stack([np.asarray(s.shares, dtype=float) for s in sols])
    else:
        # a fresh, writeable copy either way (C order: the score kernel views it as a stack)
        shares = np.array(sols[0].shares, dtype=float, order="C")
    masks = _own_masks(solver, sols)
    report = _reporting_problem(problem, masks)
    ok, times = _check_and_evaluate(report, cost, shares)
    if not ok:
        try:
            check_shares(report, shares)
        except InfeasibleSharesError as exc:
            raise StragglerError(
                f"solve_dispatch: the method {name!r} returned an infeasible dispatch ({exc}); "
                "this is a bug in the method."
            ) from exc
    # (for one layer, Python's max of a short list: numpy's reduction costs microseconds)
    makespans = times.max(axis=-1) if stack else None
    mks = makespans.tolist() if stack else [max(times[0].tolist())]
    bounds = []
    statuses = []
    for l, (s, m, mk) in enumerate(zip(sols, masks, mks)):  # (loops: cheaper than frames)
        lb = _layer_bound(report, l, cost, s, m is None, mk)
        if lb > mk * (1 + OPTIMALITY_RTOL) + 1e-9:
            raise StragglerError(
                f"solve_dispatch: the certified lower bound {lb!r} of layer {l} exceeds the "
                f"makespan {mk!r} of the method {name!r} on the mask it was scored on; "
                "a bound is invalid (this is a bug)."
            )
        bounds.append(lb)
        statuses.append(_status(s, mk, lb))
    if not stack:
        return dict(
            shares=shares,
            makespan=mks[0],
            gpu_time=times[0],
            lower_bound=bounds[0],
            status=statuses[0],
            extras=dict(sols[0].extras),
        )
    return dict(
        shares=shares,
        makespan=makespans,
        gpu_time=times,
        lower_bound=np.array(bounds),
        status=worst_status(statuses),
        extras={"layers": [s.extras for s in sols], "layer_status": statuses},
    )
