"""Exact methods of Problem 1: the ``"milp"`` dispatch method and the token LP (Lemma 1).

``"milp"`` solves :func:`~straggler.formulations.dispatch_milp.build_dispatch_milp` with
HiGHS (or CP-SAT, ``backend="cpsat"``), seeded by a cheap incumbent whose makespan also
tightens the model. :func:`solve_token_lp` solves LPLB's objective ``min max_g N_g``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from numbers import Real

import numpy as np

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem, check_shares, evaluate
from ..formulations.dispatch_milp import build_dispatch_milp, build_token_lp, live_pairs
from ..formulations.errors import (
    InfeasibleSharesError,
    InvalidOptionError,
    StragglerError,
    param_error,
)
from ..formulations.results import Status
from .dispatch import check_time_limit
from .highs import solve_milp
from .registry import LayerSolution, make_method, register_dispatch_method

__all__ = ["MilpDispatch", "solve_token_lp", "whole_expert_greedy"]

_BACKENDS = ("highs", "cpsat")


#: Relative slack on top of ``mip_rel_gap`` when checking a reported optimum against its
#: dual bound (HiGHS's feasibility tolerances leave ~1e-7 relative between them).
_GAP_SLACK = 1e-6


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


@register_dispatch_method("milp")
@dataclass(frozen=True)
class MilpDispatch:
    """Exact dispatch: the MILP of TEMPO Appendix A, solved to a proven gap.

    Parameters
    ----------
    tightened : bool, default True
        Tightened formulation (integer activation counts, instance big-M, cover, bound and
        symmetry rows); False: the plain big-M model.
    mip_rel_gap : float, default 1e-4
        Relative gap at which the search stops with OPTIMAL (0 for oracle use).
    threads : int, default 1
    seed : int, default 0
    warm_start : str or None
        Name of a registered heuristic whose dispatch seeds the search (in addition to the
        built-in seeds: whole-expert greedy, the even split and the token LP optimum; the
        best of them is used).
    backend : {"highs", "cpsat"}

    Notes
    -----
    The best seed's makespan UB tightens the model (``M <= UB``, big-M and activation caps
    derived from it, see ``build_dispatch_milp``) and is passed as the first incumbent.
    When the backend returns no incumbent (time limit), the best seed is returned with
    status NO_SOLUTION (``success`` False) and ``extras["fallback"]`` saying so.
    """

    tightened: bool = True
    mip_rel_gap: float = 1e-4
    threads: int = 1
    seed: int = 0
    warm_start: str | None = None
    backend: str = "highs"

    def __post_init__(self) -> None:
        func = "solve_dispatch(method='milp')"
        if not isinstance(self.tightened, (bool, np.bool_)):
            raise param_error("tightened", func, "a bool", repr(self.tightened))
        g = self.mip_rel_gap
        if not isinstance(g, Real) or isinstance(g, bool) or not (0 <= g < 1):
            raise param_error("mip_rel_gap", func, "a number in [0, 1)", repr(g))
        for name in ("threads", "seed"):
            v = getattr(self, name)
            if (
                not isinstance(v, (int, np.integer))
                or isinstance(v, bool)
                or v < (name == "threads")
            ):
                raise param_error(name, func, "a non-negative integer (threads >= 1)", repr(v))
        if self.backend not in _BACKENDS:
            raise InvalidOptionError(
                f"The 'backend' parameter of {func} must be one of {list(_BACKENDS)}. "
                f"Got {self.backend!r} instead."
            )
        if self.warm_start is not None:
            if self.warm_start == "milp":
                raise InvalidOptionError(
                    f"The 'warm_start' parameter of {func} must name a heuristic, not 'milp'."
                )
            make_method(self.warm_start, {}, func)  # raises on an unknown name

    def _seeds(self, problem, cost, time_limit, rng):
        seeds = {
            "greedy": whole_expert_greedy(problem, cost),
            "uniform": _uniform_split(problem),
        }
        if problem.counts.any():
            try:
                seeds["token_lp"] = solve_token_lp(problem, time_limit=time_limit)[0]
            except StragglerError:  # the LP ran out of time: seed from the others
                pass
        if self.warm_start is not None:
            h = make_method(self.warm_start, {})
            x = np.asarray(
                h.solve(problem, cost, time_limit=time_limit, rng=rng).shares, dtype=float
            )
            try:
                check_shares(problem, x)
            except InfeasibleSharesError as exc:
                raise StragglerError(
                    f"The warm_start heuristic {self.warm_start!r} returned an infeasible "
                    f"dispatch: {exc}"
                ) from exc
            seeds[self.warm_start] = x
        scored = {k: evaluate(problem, cost, v).makespan for k, v in seeds.items()}
        best = min(scored, key=lambda k: (scored[k], k != self.warm_start))
        return best, seeds[best], float(scored[best])

    def solve(self, problem, cost, *, time_limit, rng) -> LayerSolution:
        t0 = time.perf_counter()
        seed_name, seed_x, ub = self._seeds(problem, cost, time_limit, rng)
        left = max(time_limit - (time.perf_counter() - t0), 1e-3)
        model = build_dispatch_milp(
            problem, cost, tightened=self.tightened, upper_bound=ub if self.tightened else None
        )
        warm = model.encode(seed_x)
        if self.backend == "highs":
            opts = dict(mip_rel_gap=self.mip_rel_gap, threads=self.threads, seed=self.seed)
            # solve_milp re-solves unseeded if HiGHS hands back a stale warm start
            sol = solve_milp(model, time_limit=left, warm_start=warm, **opts)
        else:
            from .cpsat import solve_dispatch_cpsat

            sol = solve_dispatch_cpsat(
                problem,
                cost,
                time_limit=left,
                mip_rel_gap=self.mip_rel_gap,
                threads=self.threads,
                seed=self.seed,
                warm_start=seed_x,
            )
        extras = {
            "backend": sol.backend,
            "raw_status": sol.raw_status,
            "dual_bound": sol.dual_bound,
            "node_count": sol.extras.get("mip_node_count", sol.extras.get("branches", 0)),
            "solver_runtime_s": sol.runtime_s,
            "tightened": self.tightened,
            "seed": seed_name,
            "seed_makespan": ub,
            "n_rows": model.n_rows,
            "n_cols": model.n_cols,
            "resolved_stale_warm_start": sol.extras.get("resolved_stale_warm_start", False),
        }
        extras.update({k: v for k, v in sol.extras.items() if k not in extras and k != "shares"})
        if sol.x is None:
            shares = seed_x
            extras["fallback"] = (
                f"the backend returned no incumbent ({sol.raw_status}); these shares are the "
                f"{seed_name!r} seed, not a backend solution"
            )
        else:
            shares = sol.extras["shares"] if "shares" in sol.extras else model.decode(sol.x)
            # decoding can only lose to the seed through rounding; never return worse
            if evaluate(problem, cost, shares).makespan > ub:
                shares = seed_x
                extras["decoded_worse_than_seed"] = True
        mk = float(evaluate(problem, cost, shares).makespan)
        dual = float(sol.dual_bound) if math.isfinite(sol.dual_bound) else -math.inf
        status = sol.status
        if (
            status is Status.OPTIMAL
            and mk > dual + (self.mip_rel_gap + _GAP_SLACK) * abs(mk) + 1e-9
        ):
            # never claim optimality the bound does not certify
            status = Status.FEASIBLE
            extras["optimality_not_certified"] = True
        dual = min(dual, mk)
        extras["gap"] = (mk - dual) / max(abs(mk), 1e-12) if math.isfinite(dual) else math.inf
        extras["runtime_s"] = time.perf_counter() - t0
        return LayerSolution(shares=shares, status=status, lower_bound=dual, extras=extras)


def solve_token_lp(
    problem: DispatchProblem, cost: CostModel | None = None, *, time_limit: float = 10.0
) -> tuple[np.ndarray, float]:
    """Lemma 1: a dispatch minimizing the most tokens on any GPU, solved exactly by HiGHS.

    Parameters
    ----------
    problem : DispatchProblem
        One layer.
    cost : CostModel, optional
        Unused by the objective; accepted for a uniform signature.
    time_limit : float, default 10

    Returns
    -------
    shares : ndarray (n_experts, n_gpus)
        Clean (no share below ``1e-9 n_e``), exactly conserving.
    value : float
        ``min max_g N_g`` (the largest per-GPU token count of ``shares``).

    Raises
    ------
    InvalidInputError
        Not a single-layer problem, or a bad time limit.
    StragglerError
        HiGHS did not prove the LP optimal in time.

    Examples
    --------
    >>> p = DispatchProblem(counts=[6, 2], replicas=[[1, 1], [1, 0]])
    >>> x, v = solve_token_lp(p)
    >>> v, x.sum(axis=0).tolist()
    (4.0, [4.0, 4.0])
    """
    func = "solve_token_lp"
    check_time_limit(time_limit, func)
    model = build_token_lp(problem, cost)
    if not live_pairs(problem)[0].size:
        return np.zeros((problem.n_experts, problem.n_gpus)), 0.0
    sol = solve_milp(model, time_limit=float(time_limit))
    if sol.status is not Status.OPTIMAL:
        raise StragglerError(f"{func}: HiGHS did not solve the token LP ({sol.raw_status}).")
    shares = model.decode(sol.x)
    return shares, float(shares.sum(axis=0).max())
