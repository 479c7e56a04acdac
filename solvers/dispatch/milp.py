"""The ``"milp"`` dispatch method: TEMPO's MILP (Appendix A) solved to a proven gap.

:class:`MilpDispatch` solves
:func:`~straggler.formulations.dispatch_milp.build_dispatch_milp` with HiGHS (or CP-SAT,
``backend="cpsat"``), seeded by a cheap incumbent whose makespan also tightens the model. Its
``warm_start`` names any registered method, so this module sits with the name table
(:mod:`straggler.solvers.dispatch.registry`, which it reads at call time: the table lists it),
above the baselines.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ...formulations.dispatch import check_shares, evaluate_arrays
from ...formulations.dispatch_milp import build_dispatch_milp
from ...formulations.errors import (
    InfeasibleSharesError,
    InvalidInputError,
    StragglerError,
)
from ...formulations.results import Status
from ...formulations.validation import (
    check_bool,
    check_choice,
    check_int,
    check_real,
)
from ..highs import solve_milp
from .exact import _uniform_split, solve_token_lp, whole_expert_greedy
from .method import LayerSolution

__all__ = ["MilpDispatch"]

_BACKENDS = ("highs", "cpsat")

#: Relative slack on top of ``mip_rel_gap`` when checking a reported optimum against its
#: dual bound (HiGHS's feasibility tolerances leave ~1e-7 relative between them).
_GAP_SLACK = 1e-6


def _registry():
    """:mod:`straggler.solvers.dispatch.registry`, imported when first needed: its table
    imports this module."""
    from . import registry

    return registry


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
            h = _registry().make_method(self.warm_start, {})
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
        names = [n for n in _registry().dispatch_methods() if n != "milp"]
        out["warm_start"] = check_choice(m.warm_start, "warm_start", func, names)
    return out
