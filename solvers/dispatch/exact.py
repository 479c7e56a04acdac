"""Exact methods of Problem 1: the ``"milp"`` dispatch method and the token LP (Lemma 1).

``"milp"`` solves :func:`~straggler.formulations.dispatch_milp.build_dispatch_milp` with
HiGHS (or CP-SAT, ``backend="cpsat"``), seeded by a cheap incumbent whose makespan also
tightens the model. :func:`solve_token_lp` solves LPLB's objective ``min max_g N_g``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem, check_shares, evaluate_arrays
from ...formulations.dispatch_milp import build_dispatch_milp, build_token_lp, live_pairs
from ...formulations.errors import (
    InfeasibleSharesError,
    InvalidInputError,
    StragglerError,
    param_error,
)
from ...formulations.results import Status
from ...formulations.validation import (
    check_bool,
    check_choice,
    check_int,
    check_real,
    check_time_limit,
    check_type,
)
from ..highs import solve_milp
from .registry import LayerSolution, dispatch_methods, make_method

__all__ = ["MilpDispatch", "solve_token_lp", "TokenLPSolution", "whole_expert_greedy"]

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
        for name, value in _milp_dispatch_iv(self).items():
            object.__setattr__(self, name, value)

    def _seeds(self, problem, cost, deadline, rng):
        """The built-in seeds (and the ``warm_start`` heuristic's), best first on ties to
        ``warm_start``. Whole-expert greedy and the even split always run (microseconds to
        milliseconds); the token LP and the heuristic only while time is left."""
        seeds = {
            "greedy": whole_expert_greedy(problem, cost),
            "uniform": _uniform_split(problem),
        }
        left = deadline - time.perf_counter()
        if problem.counts.any() and left > 0:
            lp = solve_token_lp(problem, time_limit=left, full_output=True)
            if lp.status is Status.OPTIMAL:  # at its limit the LP offers nothing new
                seeds["token_lp"] = lp.shares
        left = deadline - time.perf_counter()
        if self.warm_start is not None and left > 0:
            h = make_method(self.warm_start, {})
            x = np.asarray(h.solve(problem, cost, time_limit=left, rng=rng).shares, dtype=float)
            try:
                check_shares(problem, x)
            except InfeasibleSharesError as exc:
                raise StragglerError(
                    f"The warm_start heuristic {self.warm_start!r} returned an infeasible "
                    f"dispatch: {exc}"
                ) from exc
            seeds[self.warm_start] = x
        scored = {k: evaluate_arrays(problem, cost, v).makespan for k, v in seeds.items()}
        best = min(scored, key=lambda k: (scored[k], k != self.warm_start))
        return best, seeds[best], float(scored[best])

    def _out_of_time(self, problem, cost, seed_name, seed_x, ub, model, t0) -> LayerSolution:
        """The time limit ran out before the backend could run: the best seed is the
        incumbent (status FEASIBLE, no proof; ``solve_dispatch`` adds its certified bound)."""
        extras = {
            "backend": self.backend,
            "raw_status": "time limit reached before the backend ran",
            "dual_bound": -math.inf,
            "node_count": 0,
            "solver_runtime_s": 0.0,
            "tightened": self.tightened,
            "seed": seed_name,
            "seed_makespan": ub,
            "n_rows": model.n_rows,
            "n_cols": model.n_cols,
            "resolved_stale_warm_start": False,
            "fallback": (
                f"the time limit ran out before the backend ran; these shares are the "
                f"{seed_name!r} seed, not a backend solution"
            ),
            "gap": math.inf,
            "runtime_s": time.perf_counter() - t0,
        }
        return LayerSolution(shares=seed_x, status=Status.FEASIBLE, extras=extras)

    def solve(self, problem, cost, *, time_limit, rng) -> LayerSolution:
        # time_limit covers everything: seeds, model building and the backend
        t0 = time.perf_counter()
        deadline = t0 + time_limit
        if self.backend == "highs":
            _check_highs_slopes(cost)
        seed_name, seed_x, ub = self._seeds(problem, cost, deadline, rng)
        if self.backend == "highs":
            _check_highs_times(ub)
        model = build_dispatch_milp(
            problem, cost, tightened=self.tightened, upper_bound=ub if self.tightened else None
        )
        left = deadline - time.perf_counter()
        if left <= 0:
            return self._out_of_time(problem, cost, seed_name, seed_x, ub, model, t0)
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
            if evaluate_arrays(problem, cost, shares).makespan > ub:
                shares = seed_x
                extras["decoded_worse_than_seed"] = True
        mk = float(evaluate_arrays(problem, cost, shares).makespan)
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


#: HiGHS's ``large_matrix_value``: it refuses a constraint matrix with a larger coefficient.
HIGHS_LARGE_MATRIX_VALUE = 1e15
#: HiGHS's ``infinite_bound``: it reads a bound or a right-hand side this large as infinite.
HIGHS_INFINITE_BOUND = 1e20
_MILP_FUNC = "solve_dispatch(method='milp')"


def _check_highs_slopes(cost) -> None:
    """The slopes of ``cost`` are coefficients of the MILP's matrix: each must stay below
    :data:`HIGHS_LARGE_MATRIX_VALUE`, or HiGHS refuses the model."""
    for name in ("b", "b2", "beta", "gamma"):
        v = getattr(cost, name)
        if v is not None and v >= HIGHS_LARGE_MATRIX_VALUE:
            raise InvalidInputError(
                f"The 'cost' parameter of {_MILP_FUNC} must have slopes below "
                f"{HIGHS_LARGE_MATRIX_VALUE:g} us (HiGHS refuses larger matrix coefficients: "
                f"its large_matrix_value). Got {name}={v:.6g} instead."
            )


def _check_highs_times(makespan: float) -> None:
    """The MILP bounds every GPU's time by the seed's makespan: it must stay below
    :data:`HIGHS_INFINITE_BOUND`, which HiGHS reads as infinite."""
    if not makespan < HIGHS_INFINITE_BOUND:
        raise InvalidInputError(
            f"The 'cost' parameter of {_MILP_FUNC} must keep the problem's times below "
            f"{HIGHS_INFINITE_BOUND:g} us (HiGHS reads larger bounds as infinite: its "
            f"infinite_bound). Got a dispatch of makespan {makespan:.6g} us instead."
        )


def _milp_dispatch_iv(m: MilpDispatch) -> dict:
    """Validated options of the ``milp`` method."""
    func = "solve_dispatch(method='milp')"
    out = {
        "tightened": check_bool(m.tightened, "tightened", func),
        "mip_rel_gap": check_real(m.mip_rel_gap, "mip_rel_gap", func, lo=0, hi=1, hi_open=True),
        "threads": check_int(m.threads, "threads", func, lo=1),
        "seed": check_int(m.seed, "seed", func, lo=0, hi=2**31 - 1),
        "backend": check_choice(m.backend, "backend", func, _BACKENDS),
    }
    if m.warm_start is not None:
        names = [n for n in dispatch_methods() if n != "milp"]
        out["warm_start"] = check_choice(m.warm_start, "warm_start", func, names)
    return out


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
