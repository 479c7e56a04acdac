"""Every registered dispatch method on one generated decode batch (``straggler-compare``).

The library's main job. It generates a routed decode batch with
:func:`~straggler.sim.workloads.batches.make_decode_problem` (default: DeepSeek-V3 shape, 256
experts top-8, EP8, 128 tokens per GPU, Zipf skew 0.85, Dirichlet kappa 2000, EPLB
placement at 1.25x replication), solves it with every method of
:func:`~straggler.solvers.dispatch_methods` under a calibrated cost preset, and prints one
row per method: modeled makespan, ratio to the best method on the replica mask, certified
lower bound, gap, status and runtime. A method whose optional backend is missing is
skipped with a note; a method that fails is reported (exit status 1) without hiding the
others.

For a stack of layers the makespan, bound and gap are totals over the layers (the MoE
time of one step through them). ``moonep`` moves weights, so it is not on the problem's
replica mask: its row shows the free-prefetch makespan, notes the charged one, and is
left out of "best".

The command is :mod:`straggler.runtime.commands.compare`.
"""

from __future__ import annotations

import math
import time

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem
from ...formulations.errors import BackendUnavailableError
from ...formulations.validation import check_choice, check_rng, check_time_limit, check_type
from ...solvers.dispatch.registry import dispatch_methods, get_dispatch_method
from ...solvers.dispatch.solve import solve_dispatch
from ...solvers.dispatch.topology import topology_split

__all__ = ["compare", "DEFAULT_PRESETS", "format_table"]

#: Cost preset used for each model shape when ``--preset`` is not given (TEMPO Tables 6/7;
#: Qwen2-57B has no fit of its own and borrows the small-expert DSv2-Lite kernel fit).
DEFAULT_PRESETS = {
    "dsv3": "dsv3_a_offline",
    "qwen3_235b": "qwen3_235b_b_tile",
    "qwen3_30b": "qwen3_30b_a_offline",
    "qwen2_57b": "dsv2_lite_a_offline",
}


def _compare_iv(problem, cost, methods, time_limit, seed):
    func = "compare"
    check_type(problem, "problem", func, DispatchProblem, "a DispatchProblem")
    check_type(cost, "cost", func, CostModel, "a CostModel")
    registered = dispatch_methods()
    if methods is None:
        names = registered
    else:
        check_type(methods, "methods", func, (list, tuple), "a list of method names")
        names = [check_choice(m, "methods", func, registered) for m in methods]
    check_rng(seed, func, "seed")
    return names, check_time_limit(time_limit, func)


def compare(problem, cost: CostModel, *, methods=None, time_limit: float = 5.0, seed=0):
    """Solve ``problem`` with each method; one dict per method (see :func:`main`).

    Keys: ``method``, ``makespan_us``, ``lower_bound_us``, ``gap``, ``ratio_vs_best``,
    ``status``, ``runtime_s``, ``compile_s``, ``reference`` (True when a plain-Python
    reference served a kernel's part of the call, see :mod:`straggler.solvers.dispatch._backend`:
    same results, slower ``runtime_s``), ``on_mask``, ``note``. Totals over layers for
    stacks. On more than one node (``problem.gpu_node``) also ``cross_node_flat`` and
    ``cross_node``: tokens crossing nodes with the flat table and with the same-node-first
    split of TEMPO §4.3 (:func:`~straggler.solvers.dispatch.topology.topology_split`, node-uniform
    sources).
    ``ratio_vs_best`` divides by the smallest makespan among methods on the replica mask.

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> rows = compare(p, CostModel(a=0, b=15, c=0, beta=0.1), methods=["uniform", "metro"])
    >>> [(r["method"], r["makespan_us"], round(r["ratio_vs_best"], 3)) for r in rows]
    [('uniform', 105.0, 1.522), ('metro', 69.0, 1.0)]
    """
    names, time_limit = _compare_iv(problem, cost, methods, time_limit, seed)
    rows = []
    for name in names:
        cls = get_dispatch_method(name, "compare")
        on_mask = not getattr(cls, "moves_weights", False)
        row = {"method": name, "on_mask": on_mask, "note": ""}
        t0 = time.perf_counter()
        try:
            res = solve_dispatch(problem, cost, method=name, time_limit=time_limit, rng=seed)
        except BackendUnavailableError as exc:
            row.update(status="SKIPPED", note=f"skipped: {exc}")
            rows.append(row)
            continue
        except Exception as exc:  # reported, not hidden: main() exits with status 1
            row.update(
                status="ERROR",
                runtime_s=time.perf_counter() - t0,
                note=f"{type(exc).__name__}: {exc}",
            )
            rows.append(row)
            continue
        mk = float(np.sum(res.makespan))
        lb = float(np.sum(res.lower_bound))
        row.update(
            makespan_us=mk,
            lower_bound_us=lb,
            gap=(mk - lb) / mk if mk > 0 else 0.0,
            status=res.status.name,
            runtime_s=res.runtime_s,
            compile_s=res.compile_s,
            reference=res.reference_s > 0,
        )
        if on_mask and problem.gpu_node is not None and np.unique(problem.gpu_node).size > 1:
            split = topology_split(res.shares, problem.gpu_node)
            row.update(cross_node_flat=split.cross_node_flat, cross_node=split.cross_node)
        if not on_mask and getattr(cls, "own_placement", False):
            # LPLB builds its own placement (fitted to the batch it serves), off this mask
            row["note"] = "own placement (LPLB's, from this batch): not on the problem's mask"
        elif not on_mask:
            layers = res.extras["layers"] if problem.is_stack else [res.extras]
            moved = sum(int(x.get("n_moved", 0)) for x in layers)
            charged = sum(float(x.get("makespan_charged", math.nan)) for x in layers)
            row["note"] = (
                f"moves weights: {moved} replica(s) created; free prefetch shown, "
                f"charged {charged:.1f} us"
            )
        rows.append(row)
    valid = [r["makespan_us"] for r in rows if r["on_mask"] and "makespan_us" in r]
    best = min(valid) if valid else math.nan
    for r in rows:
        if "makespan_us" in r:
            r["ratio_vs_best"] = r["makespan_us"] / best if best > 0 else math.nan
    return rows


def _xnode(r) -> str:
    if "cross_node" not in r:
        return "-"
    flat, split = r["cross_node_flat"], r["cross_node"]
    saved = f" ({100 * (split - flat) / flat:+.0f}%)" if flat > 0 else ""
    return f"{flat:.0f}->{split:.0f}{saved}"


def format_table(rows) -> str:
    """The rows of :func:`compare` as an aligned text table."""
    head = ["method", "makespan_us", "vs_best", "lower_bound_us", "gap", "status", "runtime_ms"]
    topo = any("cross_node" in r for r in rows)
    if topo:
        head.append("xnode_tok flat->split")
    lines = []
    for r in rows:
        if "makespan_us" in r:
            cells = [
                r["method"] + ("" if r["on_mask"] else "*"),
                f"{r['makespan_us']:.1f}",
                f"{r['ratio_vs_best']:.3f}",
                f"{r['lower_bound_us']:.1f}",
                f"{100 * r['gap']:.1f}%",
                r["status"],
                f"{r['runtime_s'] * 1e3:.3f}" + ("^" if r.get("reference") else ""),
            ]
            if topo:
                cells.append(_xnode(r))
        else:
            rt = f"{r['runtime_s'] * 1e3:.3f}" if "runtime_s" in r else "-"
            cells = [r["method"], "-", "-", "-", "-", r["status"], rt] + ["-"] * topo
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    out.append("  ".join("-" * w for w in widths))
    for cells in lines:
        out.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    notes = [f"  {r['method']}: {r['note']}" for r in rows if r["note"]]
    if any(r.get("reference") for r in rows):
        notes.append(
            "  ^ runtime of the plain-Python references (kernels not compiled yet; same "
            "results; straggler-warmup compiles them once)"
        )
    if notes:
        out.append("notes (* = not on the replica mask, left out of vs_best):")
        out.extend(notes)
    return "\n".join(out)
