"""Bounded exact repair of one tempo layer: warm-started MILPs within a time budget.

Private module used by :mod:`straggler.solvers.dispatch.tempo`. When tempo's makespan is more than a
threshold above its certified lower bound, :func:`repair_layer` spends at most a budget of
seconds on MILPs of the layer, built from the library's own pieces
(:func:`~straggler.formulations.dispatch_milp.build_dispatch_milp`, tightened, with the
current makespan as upper bound, and the HiGHS backend
:func:`~straggler.solvers.highs.solve_milp`, unchanged), each warm-started with the best
dispatch so far, in this order:

1. **Every expert whole** (at most ``RESTRICTED_SHARES[0]`` of the budget): the MILP with
   each expert's tokens on one replica (``x = n_e z``), except experts the upper bound
   forces to split. A balanced partition with activation caps, which HiGHS solves far
   faster than the whole model, and infeasible within milliseconds when splits are needed.
2. **tempo's splits only** (at most ``RESTRICTED_SHARES[1]``): experts tempo splits may
   split again, every other one stays whole.
3. **The whole layer** (the rest of the budget): its dual bound is a certified lower bound
   on the optimum (the model keeps every dispatch at or below its upper bound, hence every
   optimum) and raises the reported bound.

The restricted MILPs only search: their optimum and dual bound say nothing about the
layer's, so neither is reported. The sequence stops as soon as the makespan meets the bound.

MILP shares are fractional; each is turned into whole tokens by largest remainders (every
share rounds to its floor or ceiling, so no tile count grows and a share below one token
may vanish), and the token LP on that support (the exact token flow,
:func:`~straggler.solvers.dispatch._token_lp_fast.support_rebalance_kernel`) is kept when it is
better. A result replaces the current shares only when its makespan is strictly lower, so
the repair never makes a layer worse.

Status: ``"optimal"`` only when the layer is proved optimal: the returned makespan meets
the returned lower bound (the input bound raised to the whole layer's MILP dual bound, less
a relative 1e-9 for HiGHS's tolerances) within the tolerance under which ``solve_dispatch``
calls a layer OPTIMAL, or the whole layer's MILP proved its optimum (HiGHS status OPTIMAL at
:data:`REPAIR_MIP_GAP`, the standard of ``method="milp"``) and the whole-token dispatch
reaches it. A MILP that proved its optimum over fractional shares while the whole-token
dispatch stays above it is ``"improved"`` or ``"unchanged"`` (``milp_status`` says
``"OPTIMAL"``): the whole-token optimum may lie above the fractional one, and nothing here
proves where it is. A restricted MILP's optimum never counts.

Why this form and not neighbourhood MILPs over the GPUs that set the makespan (every
better dispatch measured changes 9-20 activations on 6-15 GPUs):
``benchmarks/tempo_outliers.py`` measures both, and other HiGHS options, on the layers
tempo leaves above 0.1%.

HiGHS stops on wall-clock time, so a layer whose MILP runs into the budget may differ
between runs on a loaded machine; a layer whose MILP finishes inside it does not.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import NamedTuple

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem, evaluate
from ...formulations.dispatch_milp import build_dispatch_milp, live_pairs
from ..highs import solve_milp
from ._backend import SUPPORT_FRACTIONAL, SUPPORT_REBALANCE
from .method import OPTIMALITY_RTOL

__all__ = ["Repair", "repair_layer", "whole_tokens"]

#: HiGHS stops at this relative gap (the repair targets gaps of 1e-3).
REPAIR_MIP_GAP = 1e-5
#: Relative safety taken off a HiGHS dual bound before it is reported as certified.
DUAL_RTOL = 1e-9
#: Most of the budget (fractions) each restricted MILP may take before the whole layer's:
#: every expert whole, then only tempo's split experts split.
RESTRICTED_SHARES = (0.25, 0.35)


class Repair(NamedTuple):
    """What :func:`repair_layer` did to one layer."""

    shares: np.ndarray
    """Dispatch ``(n_experts, n_gpus)``, the repaired one or the input: whole tokens (int64),
    or float64 with ``fractional``."""
    makespan: float
    lower_bound: float
    """The input bound, raised to the whole-layer MILP's dual bound when it has one."""
    status: str
    """``"optimal"`` (proved optimal: the makespan meets ``lower_bound``, or the whole
    layer's MILP proved its optimum and whole tokens reach it), ``"improved"`` (lower, not
    proved optimal) or ``"unchanged"``."""
    runtime_s: float
    milp_status: str
    """The whole-layer MILP's :class:`~straggler.formulations.results.Status` name
    (``"OPTIMAL"``: it proved its optimum over fractional shares within
    :data:`REPAIR_MIP_GAP`), or ``"NOT_RUN"`` (a restricted MILP already met the bound, or
    took the budget)."""


def whole_tokens(problem: DispatchProblem, cost: CostModel, shares) -> np.ndarray:
    """A whole-token dispatch close to fractional ``shares`` (int64).

    Largest remainders per expert: every share becomes its floor, and the expert's missing
    tokens go one each to its shares with the largest fractional parts (ties: lower GPU
    index), so every share ends at its floor or ceiling. The token LP on the resulting
    support (:func:`~straggler.solvers.dispatch._token_lp_fast.support_rebalance_kernel`) replaces
    it
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
    y, _, _ = SUPPORT_REBALANCE(counts, x, cost.as_array())
    return y


def _times(problem, cost, x):
    return np.asarray(evaluate(problem, cost, x).times, dtype=float)


def _milp(problem, cost, x, ub, time_limit, free=None):
    """The tightened MILP of ``problem`` warm-started with whole-token ``x`` (makespan ub).

    ``free``: a boolean per expert; when given, every other expert is kept whole (its
    shares ``x = n_e z``: on one replica) wherever the model lets a share hold all its
    tokens, a restriction whose optimum and dual bound say nothing about the layer's. The
    warm start is offered only where it satisfies the restriction.
    """
    model = build_dispatch_milp(problem, cost, tightened=True, upper_bound=ub)
    warm = True
    if free is not None:
        e_idx, _ = live_pairs(problem)
        xcols = model.blocks["x"]
        whole = (model.col_upper[xcols] >= problem.counts[e_idx]) & ~free[e_idx]
        lower = model.row_lower.copy()
        lower[np.arange(model.n_rows)[model.row_blocks["link"]][whole]] = 0.0  # x - n z = 0
        model = dataclasses.replace(model, row_lower=lower)
        split = (x > 0).sum(axis=1) > 1
        warm = not (split & ~free).any()
    return model, solve_milp(
        model,
        time_limit=max(time_limit, 1e-3),
        mip_rel_gap=REPAIR_MIP_GAP,
        threads=1,
        warm_start=model.encode(x) if warm else None,
    )


def repair_layer(
    problem: DispatchProblem,
    cost: CostModel,
    shares,
    *,
    budget_s: float,
    lower_bound: float,
    fractional: bool = False,
) -> Repair:
    """Repair one layer's dispatch within ``budget_s`` seconds (module notes): the returned
    shares are the input's unless a MILP found a strictly better dispatch; the bound is the
    input's, raised to the whole layer's MILP dual bound.

    With ``fractional``, the input may be fractional, and each MILP solution, once in whole
    tokens, is also rebalanced by the exact (fractional) token LP on its support
    (:func:`~straggler.solvers.dispatch._token_lp_fast.support_fractional_kernel`), kept when
    lower; otherwise shares are whole tokens throughout.

    Examples
    --------
    Three experts on two GPUs, floor-bound (``b = 10``): one GPU holding all three costs
    30; the repair finds 20 (two experts on one GPU, one on the other), and the MILP's dual
    bound proves it optimal.

    >>> p = DispatchProblem(counts=[4, 4, 4], replicas=np.ones((3, 2), bool))
    >>> r = repair_layer(p, CostModel(a=0, b=10, c=0, beta=0.01), [[4, 0]] * 3,
    ...                  budget_s=5.0, lower_bound=10.0)
    >>> r.makespan, r.status, round(r.lower_bound, 6)
    (20.0, 'optimal', 20.0)
    """
    t0 = time.perf_counter()
    x = np.asarray(shares, dtype=np.float64 if fractional else np.int64).copy()
    best = float(_times(problem, cost, x).max())
    lb = float(lower_bound)
    improved = False
    milp_status = "NOT_RUN"

    def proved():
        return best <= lb * (1 + OPTIMALITY_RTOL) + 1e-12  # solve_dispatch's OPTIMAL rule

    def take(model, sol):
        nonlocal x, best, improved
        if sol.x is not None:
            y = whole_tokens(problem, cost, model.decode(sol.x))
            if fractional:
                y, _, _ = SUPPORT_FRACTIONAL(problem.counts, y, cost.as_array())
            m = float(_times(problem, cost, y).max())
            if m < best:
                x, best, improved = y, m, True

    # Restricted MILPs first (module notes): every expert whole, then tempo's splits only.
    split = (x > 0).sum(axis=1) > 1
    for share, free in zip(RESTRICTED_SHARES, (np.zeros_like(split), split)):
        left = float(budget_s) - (time.perf_counter() - t0)
        if proved() or left <= 0:
            break
        take(*_milp(problem, cost, x, best, min(left, share * float(budget_s)), free))
    left = float(budget_s) - (time.perf_counter() - t0)
    milp_proved = False
    if not proved() and left > 0:
        model, sol = _milp(problem, cost, x, best, left)
        milp_status = sol.status.name
        if math.isfinite(sol.dual_bound):
            # (less a relative 1e-9: HiGHS's bound carries its feasibility tolerances)
            lb = max(lb, min(float(sol.dual_bound) * (1 - DUAL_RTOL), best))
        take(model, sol)
        # HiGHS proved its optimum (within REPAIR_MIP_GAP) and whole tokens reach it
        milp_proved = sol.status.name == "OPTIMAL" and best <= sol.objective * (1 + 1e-9) + 1e-9
    lb = min(lb, best)
    if proved() or milp_proved:
        status = "optimal"
    else:
        status = "improved" if improved else "unchanged"
    return Repair(
        shares=x,
        makespan=best,
        lower_bound=lb,
        status=status,
        runtime_s=time.perf_counter() - t0,
        milp_status=milp_status,
    )
