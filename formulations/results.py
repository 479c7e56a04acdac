"""Result types shared by every solver and baseline: dispatch (:class:`DispatchResult`) and
routing (:class:`RoutingResult`), in one vocabulary (``status``, ``success``, ``runtime_s``,
``extras``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Status", "DispatchResult", "RoutingResult", "worst_status"]


class Status(enum.Enum):
    """Outcome of a solve. Map backend codes through one table; never read ``kOk`` as optimal."""

    OPTIMAL = "optimal"
    """The returned solution is proved optimal (within the requested gap, 0 by default)."""

    HEURISTIC = "heuristic"
    """A feasible solution from a method that does not try to prove optimality (a heuristic
    or a baseline policy). Its certified ``lower_bound`` and gap are still reported."""

    FEASIBLE = "feasible"
    """An exact method stopped at a limit (time, nodes) with an incumbent but no proof."""

    NO_SOLUTION = "no_solution"
    """An exact method stopped at a limit before finding any feasible solution."""

    INFEASIBLE = "infeasible"
    """The model has no feasible solution."""

    ERROR = "error"
    """The backend failed (numerical trouble, solver error)."""

    @property
    def success(self) -> bool:
        """True when a usable solution was produced and the method finished as intended."""
        return self in (Status.OPTIMAL, Status.HEURISTIC)


_ORDER = [
    Status.OPTIMAL,
    Status.HEURISTIC,
    Status.FEASIBLE,
    Status.NO_SOLUTION,
    Status.INFEASIBLE,
    Status.ERROR,
]


def worst_status(statuses) -> Status:
    """The least favourable of several statuses (used for a stack of layers)."""
    statuses = list(statuses)
    if not statuses:
        return Status.OPTIMAL
    return max(statuses, key=_ORDER.index)


@dataclass(frozen=True, eq=False, kw_only=True)
class DispatchResult:
    """What every dispatch method returns.

    Attributes
    ----------
    shares : ndarray, shape (n_experts, n_gpus) or (n_layers, n_experts, n_gpus)
        Tokens of expert ``e`` sent to GPU ``g`` (float64; integral for whole-token methods).
    makespan : float or ndarray (n_layers,)
        Modeled makespan ``max_g t_g`` in microseconds, from the independent evaluator.
    gpu_time : ndarray, shape (n_gpus,) or (n_layers, n_gpus)
        Modeled time of each GPU.
    lower_bound : float or ndarray (n_layers,)
        A certified lower bound on the optimal makespan (never above the optimum).
    status : Status
        For a stack, the least favourable layer status (each layer's in ``extras``).
    method : str
        Registered name of the method that produced the result.
    runtime_s : float
        Wall-clock seconds spent in the method (all layers). Input validation, scoring by the
        evaluator and JIT compilation are excluded (a first call that compiles reports the
        same ``runtime_s`` as a warm one); :class:`RoutingResult` uses the same definition.
    extras : dict
        Method-specific details (MILP gap, dual bound, stage switches, ...).
    compile_s : float
        Seconds numba spent compiling kernels, or loading them from its disk cache, during
        the call (0 once the kernels are in memory; see ``straggler.runtime.warmup``). Never
        part of ``runtime_s``.
    reference_s : float
        Of ``runtime_s``, the seconds the plain-Python references ran in place of kernels
        not compiled yet (a one-shot call on a cold cache, ``straggler.solvers.dispatch._backend``:
        same results, slower); 0 once the kernels are compiled.
    """

    shares: np.ndarray
    makespan: Any
    gpu_time: np.ndarray
    lower_bound: Any
    status: Status
    method: str
    runtime_s: float
    extras: dict = field(default_factory=dict)
    compile_s: float = 0.0
    reference_s: float = 0.0

    @property
    def success(self) -> bool:
        """True when ``status`` is OPTIMAL or HEURISTIC."""
        return self.status.success

    @property
    def gap(self):
        """Relative gap ``(makespan - lower_bound) / makespan`` (0 where the makespan is 0)."""
        m = np.asarray(self.makespan, dtype=float)
        lb = np.asarray(self.lower_bound, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.where(m > 0, (m - lb) / np.where(m > 0, m, 1.0), 0.0)
        return float(g) if g.ndim == 0 else g


@dataclass(frozen=True, eq=False, kw_only=True)
class RoutingResult:
    """What every routing policy returns for one tick (:func:`~straggler.solvers.route_batch`).

    The routing counterpart of :class:`DispatchResult`: the decision, its objective, the
    per-resource values, ``status``, the registered name, ``runtime_s`` and ``extras``.

    Attributes
    ----------
    assignment : ndarray of int64, shape (n_pool,)
        Replica of each pool request, ``-1`` when it stays in the pool.
    imbalance : float
        ``I = G*max L - sum L`` on current loads (column 0) after adding the placed prefill
        lengths (the objective, as ``makespan`` is for dispatch).
    imbalance_before : float
        The same before the tick.
    loads : ndarray of float64, shape (G,)
        Current loads after the tick (as ``gpu_time`` is for dispatch).
    n_placed : int
    status : Status
        HEURISTIC: a policy makes a feasible decision without proving it optimal.
    policy : str
        Registered name of the policy.
    stage : int
        BR-0/BR-H: 1 when the tick started in Stage 1 (``S_tot > S_greedy``), else 2; 0 for
        policies without stages.
    runtime_s : float
        Wall-clock seconds spent in the policy: the kernel and the tick summary. Input
        validation (in Python and the kernel's value pass) and JIT compilation are excluded,
        as in :class:`DispatchResult`.
    extras : dict
        ``carry`` (the policy's memory for the next tick, pass it back as ``carry=``),
        ``next_cursor`` for round-robin, ``s_greedy`` for the staged policies.
    """

    assignment: np.ndarray
    imbalance: float
    imbalance_before: float
    loads: np.ndarray
    n_placed: int
    status: Status
    policy: str
    stage: int
    runtime_s: float
    extras: dict = field(default_factory=dict)

    @property
    def success(self) -> bool:
        """True when ``status`` is OPTIMAL or HEURISTIC."""
        return self.status.success

    @property
    def imbalance_after(self) -> float:
        """The same as :attr:`imbalance` (the name ``RoutingDecision`` used)."""
        return self.imbalance
