"""Bounded exact repair of one tempo layer: warm-started MILPs within a time budget.

Private module used by :mod:`straggler.solvers.tempo`. When tempo's makespan is more than a
threshold above its certified lower bound, :func:`repair_layer` spends at most a budget of
seconds on two exact steps, built from the library's own MILP pieces
(:func:`~straggler.formulations.dispatch_milp.build_dispatch_milp` and the HiGHS backend
:func:`~straggler.solvers.highs.solve_milp`, unchanged):

1. **Bottleneck neighbourhood.** ``S`` is the set of GPUs at the makespan together with
   every GPU holding a replica of an expert that has tokens on them. The sub-problem keeps
   the shares outside ``S`` fixed and re-dispatches, over ``S`` only, each expert's tokens
   that lie in ``S``: a :class:`~straggler.formulations.DispatchProblem` on the GPUs of
   ``S`` (a GPU's time depends only on its own shares, so the sub-problem is exact for
   them). Its MILP is warm-started with the current shares and bounded above by the
   current makespan; an improvement is taken and the step repeats on the new bottleneck,
   while half the budget lasts and the neighbourhood is new and smaller than the layer.
2. **The whole layer**, with what is left of the budget: the same MILP on all GPUs,
   warm-started with the best shares so far. Its dual bound is a certified lower bound on
   the optimum (the model keeps every dispatch at or below its upper bound, hence every
   optimum).

MILP shares are fractional; each is turned into whole tokens by largest remainders (every
share rounds to its floor or ceiling, so no tile count grows and a share below one token
may vanish), and the token LP on that support (the exact token flow,
:func:`~straggler.solvers._token_lp_fast.support_rebalance_kernel`) is kept when it is
better. A result replaces the current shares only when its makespan is strictly lower, so
the repair never makes a layer worse. It is deterministic up to the time limits (HiGHS
stops on wall-clock time).
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem, evaluate
from ..formulations.dispatch_milp import build_dispatch_milp
from ..formulations.results import Status
from ._token_lp_fast import support_rebalance_kernel
from .highs import solve_milp

__all__ = ["Repair", "repair_layer", "whole_tokens"]

#: HiGHS stops at this relative gap (the repair targets gaps of 1e-3).
REPAIR_MIP_GAP = 1e-5
#: Relative safety taken off a HiGHS dual bound before it is reported as certified.
DUAL_RTOL = 1e-9


class Repair(NamedTuple):
    """What :func:`repair_layer` did to one layer."""

    shares: np.ndarray
    """Whole-token dispatch ``(n_experts, n_gpus)`` (int64): the repaired one, or the input."""
    makespan: float
    lower_bound: float
    """The input bound, raised to the whole-layer MILP's dual bound when it has one."""
    status: str
    """``"optimal"`` (the whole-layer MILP proved its optimum), ``"improved"`` or
    ``"unchanged"``."""
    sub_solves: int
    """Bottleneck-neighbourhood MILPs solved."""
    runtime_s: float


def whole_tokens(problem: DispatchProblem, cost: CostModel, shares) -> np.ndarray:
    """A whole-token dispatch close to fractional ``shares`` (int64).

    Largest remainders per expert: every share becomes its floor, and the expert's missing
    tokens go one each to its shares with the largest fractional parts (ties: lower GPU
    index), so every share ends at its floor or ceiling. The token LP on the resulting
    support (:func:`~straggler.solvers._token_lp_fast.support_rebalance_kernel`) replaces it
    when its makespan is lower.

    Examples
    --------
    >>> p = DispatchProblem(counts=[5], replicas=[[1, 1]])
    >>> whole_tokens(p, CostModel(a=0, b=0, c=0, beta=1), [[2.5, 2.5]]).tolist()
    [[3, 2]]
    """
    xc = np.asarray(shares, dtype=float)
    counts = np.asarray(problem.counts, dtype=np.int64)
    x = np.floor(xc + 1e-9).astype(np.int64)
    x[xc <= 0] = 0
    for e in np.flatnonzero(counts):
        rem = int(counts[e] - x[e].sum())
        if rem > 0:
            frac = np.where(xc[e] > 0, xc[e] - x[e], -np.inf)
            for h in np.argsort(-frac, kind="stable")[:rem]:
                x[e, h] += 1
        elif rem < 0:  # (fractional input summing above n_e)
            for h in np.argsort(-x[e], kind="stable")[:-rem]:
                x[e, h] -= 1
    y, _, _ = support_rebalance_kernel(counts, x, cost.as_array())
    return y


def _times(problem, cost, x):
    return np.asarray(evaluate(problem, cost, x).times, dtype=float)


def _neighbourhood(problem, x, times):
    """The GPUs at the makespan and every GPU holding a replica of an expert on them."""
    m = times.max()
    at_m = times >= m * (1 - 1e-12)
    experts = (x[:, at_m] > 0).any(axis=1)
    return np.flatnonzero(at_m | problem.replicas[experts].any(axis=0))


def _milp(problem, cost, x, ub, time_limit):
    """The tightened MILP of ``problem`` warm-started with whole-token ``x`` (makespan ub)."""
    model = build_dispatch_milp(problem, cost, tightened=True, upper_bound=ub)
    return model, solve_milp(
        model,
        time_limit=max(time_limit, 1e-3),
        mip_rel_gap=REPAIR_MIP_GAP,
        threads=1,
        warm_start=model.encode(x),
    )


def _sub_step(problem, cost, x, S, time_limit):
    """Re-dispatch the tokens inside GPU set S over S; whole-token result or None."""
    inside = np.zeros(problem.n_gpus, bool)
    inside[S] = True
    live = (problem.counts > 0) & problem.replicas[:, S].any(axis=1)
    F = np.flatnonzero(live)
    counts = x[F][:, S].sum(axis=1)
    sub = DispatchProblem(counts=counts, replicas=problem.replicas[F][:, S])
    xs = x[F][:, S]
    ub = float(evaluate(sub, cost, xs).makespan)
    model, sol = _milp(sub, cost, xs, ub, time_limit)
    if sol.x is None:
        return None
    y = x.copy()
    y[np.ix_(F, S)] = whole_tokens(sub, cost, model.decode(sol.x))
    return y


def repair_layer(
    problem: DispatchProblem,
    cost: CostModel,
    shares,
    *,
    budget_s: float,
    lower_bound: float,
) -> Repair:
    """Repair one layer's whole-token dispatch within ``budget_s`` seconds (module notes).

    Examples
    --------
    Three experts on two GPUs, floor-bound (``b = 10``): one GPU holding all three costs
    30; the repair finds 20 (two experts on one GPU, one on the other), which the MILP
    proves optimal.

    >>> p = DispatchProblem(counts=[4, 4, 4], replicas=np.ones((3, 2), bool))
    >>> r = repair_layer(p, CostModel(a=0, b=10, c=0, beta=0.01), [[4, 0]] * 3,
    ...                  budget_s=5.0, lower_bound=10.0)
    >>> r.makespan, r.status, round(r.lower_bound, 6)
    (20.0, 'optimal', 20.0)
    """
    t0 = time.perf_counter()
    deadline = t0 + float(budget_s)
    x = np.asarray(shares, dtype=np.int64).copy()
    times = _times(problem, cost, x)
    m0 = best = float(times.max())
    lb = float(lower_bound)
    n_sub = 0
    seen = set()
    while time.perf_counter() < t0 + 0.5 * budget_s:
        S = _neighbourhood(problem, x, times)
        key = S.tobytes()
        if S.size >= problem.n_gpus or key in seen:
            break
        seen.add(key)
        y = _sub_step(problem, cost, x, S, t0 + 0.5 * budget_s - time.perf_counter())
        n_sub += 1
        if y is None:
            break
        ty = _times(problem, cost, y)
        if ty.max() >= best:
            break
        x, times, best = y, ty, float(ty.max())
    status = "improved" if best < m0 else "unchanged"
    left = deadline - time.perf_counter()
    if left > 0 and best > lb:
        model, sol = _milp(problem, cost, x, best, left)
        if math.isfinite(sol.dual_bound):
            # (less a relative 1e-9: HiGHS's bound carries its feasibility tolerances)
            lb = max(lb, min(float(sol.dual_bound) * (1 - DUAL_RTOL), best))
        if sol.x is not None:
            y = whole_tokens(problem, cost, model.decode(sol.x))
            ty = _times(problem, cost, y)
            if ty.max() < best:
                x, best, status = y, float(ty.max()), "improved"
        if sol.status is Status.OPTIMAL:
            status = "optimal"
    return Repair(
        shares=x,
        makespan=best,
        lower_bound=min(lb, best),
        status=status,
        sub_solves=n_sub,
        runtime_s=time.perf_counter() - t0,
    )
