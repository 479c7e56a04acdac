"""Exact pieces of Problem 1: the token LP (Lemma 1, LPLB's objective ``min max_g N_g``,
:func:`solve_token_lp`) and the cheap incumbents the ``"milp"`` method starts from
(:func:`whole_expert_greedy`, the even split). The ``"milp"`` method itself,
:class:`~straggler.solvers.dispatch.milp.MilpDispatch`, warm-starts from any registered method
by name, so it sits with the name table above the baselines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem
from ...formulations.dispatch_milp import build_token_lp, live_pairs
from ...formulations.errors import StragglerError, param_error
from ...formulations.results import Status
from ...formulations.validation import (
    check_bool,
    check_time_limit,
    check_type,
)
from ..highs import solve_milp

__all__ = ["solve_token_lp", "TokenLPSolution", "whole_expert_greedy"]


def whole_expert_greedy(problem: DispatchProblem, cost: CostModel) -> np.ndarray:
    """Incumbent seed: experts whole, by decreasing tokens, each to the replica GPU whose
    modeled time after adding it is smallest (ties: lowest GPU index).

    Examples
    --------
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> x = whole_expert_greedy(p, CostModel(a=0, b=15, c=0, beta=0.1))
    >>> x.sum(axis=0).tolist()
    [660.0, 120.0]
    """
    func = "whole_expert_greedy"
    check_type(problem, "problem", func, DispatchProblem, "a single-layer DispatchProblem")
    check_type(cost, "cost", func, CostModel, "a CostModel")
    if problem.is_stack:
        raise param_error(
            "problem", func, "a single-layer DispatchProblem", f"a stack of {problem.n_layers}"
        )
    n = problem.counts
    G = np.zeros(problem.n_gpus)
    N = np.zeros(problem.n_gpus)
    T = np.zeros(problem.n_gpus)
    x = np.zeros((problem.n_experts, problem.n_gpus))
    k = np.ceil(n / cost.tile)
    for e in np.argsort(-n, kind="stable"):
        if n[e] == 0:
            break
        gs = np.flatnonzero(problem.replicas[e])
        t = cost.time(G[gs] + 1, N[gs] + n[e], T[gs] + k[e])
        g = gs[int(np.argmin(t))]
        G[g] += 1
        N[g] += n[e]
        T[g] += k[e]
        x[e, g] = n[e]
    return x


def _uniform_split(problem: DispatchProblem) -> np.ndarray:
    rep = problem.replicas.astype(float)
    cnt = rep.sum(axis=1, keepdims=True)
    return np.where(cnt > 0, rep * problem.counts[:, None] / np.maximum(cnt, 1), 0.0)


@dataclass(frozen=True, eq=False, kw_only=True)
class TokenLPSolution:
    """What :func:`solve_token_lp` returns with ``full_output=True``."""

    shares: np.ndarray
    """A feasible dispatch ``(n_experts, n_gpus)``, clean and exactly conserving."""
    value: float
    """The largest per-GPU token count of ``shares`` (``min max_g N_g`` when OPTIMAL)."""
    status: Status
    """OPTIMAL (HiGHS proved the LP optimum) or FEASIBLE (the time limit came first)."""
    raw_status: str
    """HiGHS's model status."""
    fallback: str | None = None
    """Where the shares come from when HiGHS returned no primal solution (else None)."""


def solve_token_lp(
    problem: DispatchProblem,
    cost: CostModel | None = None,
    *,
    time_limit: float = 10.0,
    full_output: bool = False,
):
    """Lemma 1: a dispatch minimizing the most tokens on any GPU, solved exactly by HiGHS.

    Parameters
    ----------
    problem : DispatchProblem
        One layer.
    cost : CostModel, optional
        Unused by the objective; accepted for a uniform signature.
    time_limit : float, default 10
        Seconds, model building included.
    full_output : bool, default False
        Return a ``TokenLPSolution`` (with the status) instead of ``(shares, value)``.

    Returns
    -------
    shares : ndarray (n_experts, n_gpus)
        Clean (no share below ``1e-9 n_e``), exactly conserving.
    value : float
        ``min max_g N_g`` (the largest per-GPU token count of ``shares``).

    With ``full_output=True``, one ``TokenLPSolution``. At the time limit it holds
    HiGHS's incumbent, or, when HiGHS has no primal solution yet, LPLB's own fallback (each
    expert split evenly over its replicas, ``fallback`` says so), with status FEASIBLE.

    Raises
    ------
    InvalidInputError
        Not a single-layer problem, or a bad time limit.
    StragglerError
        ``full_output=False`` and HiGHS did not prove the LP optimal in time (the pair
        ``(shares, value)`` promises the optimum).

    Examples
    --------
    >>> p = DispatchProblem(counts=[6, 2], replicas=[[1, 1], [1, 0]])
    >>> x, v = solve_token_lp(p)
    >>> v, x.sum(axis=0).tolist()
    (4.0, [4.0, 4.0])
    >>> solve_token_lp(p, time_limit=1e-9, full_output=True).status.name
    'FEASIBLE'
    """
    func = "solve_token_lp"
    t0 = time.perf_counter()
    check_type(problem, "problem", func, DispatchProblem, "a single-layer DispatchProblem")
    if problem.is_stack:
        raise param_error(
            "problem", func, "a single-layer DispatchProblem", f"a stack of {problem.n_layers}"
        )
    if cost is not None:
        check_type(cost, "cost", func, CostModel, "a CostModel or None")
    time_limit = check_time_limit(time_limit, func)
    full_output = check_bool(full_output, "full_output", func)
    model = build_token_lp(problem, cost)
    if not live_pairs(problem)[0].size:
        sol = TokenLPSolution(
            shares=np.zeros((problem.n_experts, problem.n_gpus)),
            value=0.0,
            status=Status.OPTIMAL,
            raw_status="no tokens",
        )
    else:
        left = time_limit - (time.perf_counter() - t0)
        res = solve_milp(model, time_limit=left) if left > 0 else None
        fallback = None
        if res is not None and res.x is not None:
            shares = model.decode(res.x)
        else:
            shares = _uniform_split(problem)
            fallback = "LPLB's fallback: every expert split evenly over its replicas"
        sol = TokenLPSolution(
            shares=shares,
            value=float(shares.sum(axis=0).max()),
            status=Status.OPTIMAL if res is not None and res.status is Status.OPTIMAL
            else Status.FEASIBLE,
            raw_status="time limit reached before HiGHS ran" if res is None else res.raw_status,
            fallback=fallback,
        )  # fmt: skip
    if full_output:
        return sol
    if sol.status is not Status.OPTIMAL:
        raise StragglerError(f"{func}: HiGHS did not solve the token LP ({sol.raw_status}).")
    return sol.shares, sol.value
