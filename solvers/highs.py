"""The one HiGHS backend for every formulation of the library.

:func:`solve_milp` passes a :class:`~straggler.formulations.MilpModel` to HiGHS through
``HighsLp``/``passModel``, sets options by name, maps ``getModelStatus()`` through one
table, and reports the incumbent, the objective, the dual bound and the gap. The HiGHS
banner and log never reach the user's output (``output_flag`` off).
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field

import highspy
import numpy as np

from ..formulations.milp import MilpModel
from ..formulations.results import Status
from ..formulations.validation import (
    check_array,
    check_bool,
    check_choice,
    check_int,
    check_options,
    check_real,
    check_time_limit,
    check_type,
)

__all__ = ["MilpSolution", "solve_milp", "HIGHS_OPTIONS"]

#: Options accepted by name, with their HiGHS option names.
HIGHS_OPTIONS = {
    "time_limit": "time_limit",
    "mip_rel_gap": "mip_rel_gap",
    "mip_abs_gap": "mip_abs_gap",
    "threads": "threads",
    "seed": "random_seed",
    "random_seed": "random_seed",
    "presolve": "presolve",
    "node_limit": "mip_max_nodes",
    "output_flag": "output_flag",
}


@dataclass(frozen=True, eq=False, kw_only=True)
class MilpSolution:
    """What a backend returns for a :class:`MilpModel`."""

    status: Status
    x: np.ndarray | None
    """Incumbent column vector (None without one)."""
    objective: float
    """``c @ x + offset`` of the incumbent (inf without one)."""
    dual_bound: float
    """Proven lower bound on the optimum (``-inf`` when none is known)."""
    gap: float
    """``(objective - dual_bound) / |objective|`` (inf without an incumbent)."""
    runtime_s: float
    backend: str = "highs"
    raw_status: str = ""
    extras: dict = field(default_factory=dict)


_BANNER_SHOWN = False


def _new_highs() -> highspy.Highs:
    """A quiet ``Highs`` instance.

    HiGHS prints its banner from C++ on the first construction in a process, before any
    option can be set; we point the process's stdout at /dev/null for that one call.
    """
    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(devnull)
        _BANNER_SHOWN = True
    h.setOptionValue("output_flag", False)
    h.setOptionValue("log_to_console", False)
    return h


def _status_of(h: highspy.Highs, has_x: bool) -> Status:
    ms = h.getModelStatus()
    S = highspy.HighsModelStatus
    table = {
        S.kOptimal: Status.OPTIMAL,
        S.kInfeasible: Status.INFEASIBLE,
        S.kUnboundedOrInfeasible: Status.INFEASIBLE,
        S.kUnbounded: Status.ERROR,
        S.kTimeLimit: Status.FEASIBLE,
        S.kIterationLimit: Status.FEASIBLE,
        S.kSolutionLimit: Status.FEASIBLE,
        S.kInterrupt: Status.FEASIBLE,
        S.kObjectiveBound: Status.FEASIBLE,
        S.kObjectiveTarget: Status.FEASIBLE,
    }
    st = table.get(ms, Status.ERROR)
    if st is Status.FEASIBLE and not has_x:
        st = Status.NO_SOLUTION
    if st is Status.OPTIMAL and not has_x:
        st = Status.ERROR
    return st


def _model_lp(model: MilpModel) -> highspy.HighsLp:
    lp = highspy.HighsLp()
    lp.num_col_ = model.n_cols
    lp.num_row_ = model.n_rows
    lp.col_cost_ = np.asarray(model.c, dtype=np.float64)
    inf = highspy.kHighsInf
    lp.col_lower_ = np.where(np.isfinite(model.col_lower), model.col_lower, -inf)
    lp.col_upper_ = np.where(np.isfinite(model.col_upper), model.col_upper, inf)
    lp.row_lower_ = np.where(np.isfinite(model.row_lower), model.row_lower, -inf)
    lp.row_upper_ = np.where(np.isfinite(model.row_upper), model.row_upper, inf)
    lp.offset_ = float(model.offset)
    A = model.A.tocsc()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = A.indptr.astype(np.int32)
    lp.a_matrix_.index_ = A.indices.astype(np.int32)
    lp.a_matrix_.value_ = A.data.astype(np.float64)
    lp.a_matrix_.num_col_ = model.n_cols
    lp.a_matrix_.num_row_ = model.n_rows
    if model.is_mip:
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
            for i in model.integrality
        ]
    return lp


_PRESOLVE = ("choose", "on", "off")


def _solve_milp_iv(model, time_limit, mip_rel_gap, threads, seed, warm_start, options):
    """HiGHS options by their HiGHS names, validated (HiGHS itself ignores a value of the
    wrong type with a warning, a silent no-op here), and the warm start as floats."""
    func = "solve_milp"
    check_type(model, "model", func, MilpModel, "a MilpModel")
    check_options(options, HIGHS_OPTIONS, func)
    opts = {
        "time_limit": check_time_limit(time_limit, func),
        "mip_rel_gap": check_real(mip_rel_gap, "mip_rel_gap", func, lo=0),
        "random_seed": check_int(seed, "seed", func, lo=0, hi=2**31 - 1),
    }
    if threads is not None:
        opts["threads"] = check_int(threads, "threads", func, lo=1)
    for k, v in options.items():
        if k in ("seed", "random_seed"):
            v = check_int(v, k, func, lo=0, hi=2**31 - 1)
        elif k == "time_limit":
            v = check_time_limit(v, func)
        elif k in ("mip_rel_gap", "mip_abs_gap"):
            v = check_real(v, k, func, lo=0)
        elif k == "threads":
            v = check_int(v, k, func, lo=1)
        elif k == "node_limit":
            v = check_int(v, k, func, lo=0, hi=2**31 - 1)
        elif k == "presolve":
            v = check_choice(v, k, func, _PRESOLVE)
        elif k == "output_flag":
            v = check_bool(v, k, func)
        opts[HIGHS_OPTIONS[k]] = v
    if warm_start is not None:
        warm_start = check_array(
            warm_start, "warm_start", func, shape=(model.n_cols,),
            expected=f"an array of shape ({model.n_cols},) of finite numbers",
        )  # fmt: skip
    return opts, warm_start


def solve_milp(
    model: MilpModel,
    *,
    time_limit: float = 10.0,
    mip_rel_gap: float = 1e-4,
    threads: int | None = 1,
    seed: int = 0,
    warm_start=None,
    **options,
) -> MilpSolution:
    """Solve a :class:`MilpModel` with HiGHS.

    Parameters
    ----------
    model : MilpModel
    time_limit : float
        Seconds; at the limit the best incumbent is returned with status FEASIBLE (or
        NO_SOLUTION) and the dual bound proved so far.
    mip_rel_gap : float
        Relative gap at which HiGHS stops and reports OPTIMAL (pass 0 for oracle tests).
    threads : int or None
        HiGHS threads (None: HiGHS default).
    seed : int
        ``random_seed``.
    warm_start : ndarray, optional
        A feasible column vector offered to HiGHS as the first incumbent.
    **options
        Further options from ``HIGHS_OPTIONS`` (``node_limit``, ``presolve``, ...).

    Raises
    ------
    InvalidOptionError
        An option name not in ``HIGHS_OPTIONS``, or an unknown choice.
    InvalidInputError
        A bad option value or warm start.
    """
    t_enter = time.perf_counter()
    opts, warm_start = _solve_milp_iv(
        model, time_limit, mip_rel_gap, threads, seed, warm_start, options
    )
    h = _new_highs()
    for k, v in opts.items():
        h.setOptionValue(k, v)
    t0 = time.perf_counter()
    h.passModel(_model_lp(model))
    if warm_start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(np.asarray(warm_start, dtype=float))
        sol.value_valid = True
        h.setSolution(sol)
    # the time limit covers passing the model and the warm start too
    left = opts["time_limit"] - (time.perf_counter() - t_enter)
    h.setOptionValue("time_limit", max(left, 1e-9))
    h.run()
    runtime = time.perf_counter() - t0
    info = h.getInfo()
    has_x = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = np.array(h.getSolution().col_value, dtype=float) if has_x else None
    if warm_start is not None and x is not None:
        reported = float(info.objective_function_value)
        if abs(model.objective(x) - reported) > 1e-6 * max(1.0, abs(reported)):
            # HiGHS 1.16 can report "Optimal" with the right objective value yet hand back
            # the warm-start vector (seen when presolve settles the whole model). The
            # vector then disagrees with the reported objective: solve again unseeded.
            left = max(opts["time_limit"] - (time.perf_counter() - t_enter), 1e-3)
            again = solve_milp(
                model,
                time_limit=left,
                mip_rel_gap=mip_rel_gap,
                threads=threads,
                seed=seed,
                **options,
            )
            again.extras["resolved_stale_warm_start"] = True
            return again
    status = _status_of(h, has_x)
    if x is not None:
        obj = model.objective(x)
    else:
        obj = math.inf
    if model.is_mip:
        dual = float(info.mip_dual_bound)
        if not math.isfinite(dual):
            dual = -math.inf
    else:
        dual = obj if status is Status.OPTIMAL else -math.inf
    if status is Status.OPTIMAL and model.is_mip:
        gap = float(info.mip_gap) if math.isfinite(info.mip_gap) else 0.0
    elif x is not None and math.isfinite(dual):
        gap = max(0.0, (obj - dual) / max(abs(obj), 1e-12))
    else:
        gap = 0.0 if status is Status.OPTIMAL else math.inf
    return MilpSolution(
        status=status,
        x=x,
        objective=obj,
        dual_bound=dual,
        gap=gap,
        runtime_s=runtime,
        raw_status=h.modelStatusToString(h.getModelStatus()),
        extras={
            "mip_node_count": int(getattr(info, "mip_node_count", 0)),
            "resolved_stale_warm_start": False,
        },
    )
