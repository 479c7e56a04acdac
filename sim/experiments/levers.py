"""Which lever buys what: routing x dispatch x placement on one trace and one deployment.

Every cell is one :func:`~straggler.sim.simulate` run of the same trace with the deployment
step model (:mod:`straggler.sim.engine.deployment`) and one routing policy, dispatch and placement;
each is reported relative to the engines' default, JSQ routing with EPLB placement and its
even split (``jsq``, ``even``, ``eplb``). A cell's ``levers`` names the dimensions it changes
from the default: one name is that lever alone, all three are the levers together.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from ...formulations.errors import param_error
from ...formulations.validation import check_choice
from ..engine.deployment import DISPATCHES, PLACEMENTS, DeploymentConfig
from ..engine.simulator import SimReport, simulate
from ..workloads.traces import Trace

__all__ = [
    "ROUTINGS",
    "LEVER_DISPATCHES",
    "LEVER_PLACEMENTS",
    "DEFAULT_CELL",
    "LeversTable",
    "levers",
    "estimate_levers_seconds",
    "plot_step_decomposition",
]

#: Routing policies of the levers table (first: the default).
ROUTINGS = ("jsq", "brs", "br0", "trtllm_balance")
#: Dispatches of the levers table (first: the default).
LEVER_DISPATCHES = ("even", "token_lp", "tempo")
#: Placements of the levers table (first: the default).
LEVER_PLACEMENTS = ("eplb", "place_experts")
#: The engines' default: JSQ, EPLB placement, even split.
DEFAULT_CELL = ("jsq", "even", "eplb")

#: Columns: (header, key of a row, format).
_COLUMNS = (
    ("routing", "routing", "{}"),
    ("dispatch", "dispatch", "{}"),
    ("placement", "placement", "{}"),
    ("levers", "levers", "{}"),
    ("tok/s", "throughput_tps", "{:,.0f}"),
    ("tput %", "throughput_gain_pct", "{:+.2f}"),
    ("TPOT p50 ms", "tpot_p50_ms", "{:.2f}"),
    ("TPOT p99 ms", "tpot_p99_ms", "{:.2f}"),
    ("p99 %", "tpot_p99_change_pct", "{:+.2f}"),
    ("TTFT p99 s", "ttft_p99_s", "{:.2f}"),
    ("balance", "balance_ratio", "{:.3f}"),
    ("attn ms", "attention_ms", "{:.2f}"),
    ("attn strag ms", "attention_straggler_ms", "{:.2f}"),
    ("MoE ms", "moe_ms", "{:.2f}"),
    ("MoE strag ms", "moe_straggler_ms", "{:.2f}"),
    ("comm ms", "comm_ms", "{:.2f}"),
)


@dataclass(frozen=True)
class LeversTable:
    """The levers table: one row (dict) per cell, the default cell first.

    Each row: ``routing``, ``dispatch``, ``placement``, ``levers`` (``"default"``, or the
    changed dimensions joined by ``+``), ``throughput_tps`` and ``throughput_gain_pct``
    (relative to the default cell), ``tpot_p50_ms``, ``tpot_p99_ms`` and
    ``tpot_p99_change_pct``, ``ttft_p99_s``, ``balance_ratio`` (mean/max KV per step),
    the mean step decomposed in milliseconds (``attention_ms``, ``attention_straggler_ms``,
    ``moe_ms``, ``moe_straggler_ms``, ``comm_ms``, ``dense_ms``), and ``offered_load``.
    ``reports`` holds the :class:`~straggler.sim.SimReport` of each cell by
    ``(routing, dispatch, placement)``; ``note`` what was simulated.
    """

    rows: list
    reports: dict
    note: str

    def format(self) -> str:
        """The table as text, units in the header."""
        cells = [[fmt.format(r[key]) for _, key, fmt in _COLUMNS] for r in self.rows]
        widths = [
            max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _, _) in enumerate(_COLUMNS)
        ]
        head = " | ".join(f"{h:>{w}s}" for (h, _, _), w in zip(_COLUMNS, widths))
        lines = [self.note, head, "-" * len(head)]
        lines += [" | ".join(f"{c:>{w}s}" for c, w in zip(cell, widths)) for cell in cells]
        return "\n".join(lines)


def _row(cell, rep: SimReport, base: SimReport) -> dict:
    changed = [name for name, a, b in zip(("routing", "dispatch", "placement"), cell,
                                          DEFAULT_CELL) if a != b]  # fmt: skip
    bd = rep.step_breakdown

    def pct(a, b):
        return 100.0 * (a / b - 1.0) if b and not math.isnan(b) else float("nan")

    return dict(
        routing=cell[0],
        dispatch=cell[1],
        placement=cell[2],
        levers="+".join(changed) or "default",
        throughput_tps=rep.throughput_tps,
        throughput_gain_pct=pct(rep.throughput_tps, base.throughput_tps),
        tpot_p50_ms=rep.tpot_p50_ms,
        tpot_p99_ms=rep.tpot_p99_ms,
        tpot_p99_change_pct=pct(rep.tpot_p99_ms, base.tpot_p99_ms),
        ttft_p99_s=rep.ttft_p99_ms / 1e3,
        balance_ratio=rep.balance_ratio,
        attention_ms=bd["attention_us"] / 1e3,
        attention_straggler_ms=bd["attention_straggler_us"] / 1e3,
        moe_ms=bd["moe_us"] / 1e3,
        moe_straggler_ms=bd["moe_straggler_us"] / 1e3,
        comm_ms=bd["comm_us"] / 1e3,
        dense_ms=bd["dense_us"] / 1e3,
        offered_load=rep.offered_load,
    )


def levers(
    trace,
    deployment: DeploymentConfig,
    *,
    routings=ROUTINGS,
    dispatches=LEVER_DISPATCHES,
    placements=LEVER_PLACEMENTS,
    progress: bool = False,
    **simulate_kw,
) -> LeversTable:
    """Simulate every (routing, dispatch, placement) cell and compare it with the default.

    Parameters
    ----------
    trace : Trace or str
        As for :func:`~straggler.sim.simulate`.
    deployment : DeploymentConfig
        The deployment; its ``dispatch`` and ``placement`` are replaced per cell (every other
        setting, seed included, is shared, so cells differ only by their levers).
    routings, dispatches, placements : sequence of str
        The grid (defaults ``ROUTINGS``, ``LEVER_DISPATCHES``,
        ``LEVER_PLACEMENTS``); the default cell ``DEFAULT_CELL`` is always run.
    progress : bool, default False
        On stderr: the planned cell count and an estimate of the time they take (from short
        probe runs, ``estimate_levers_seconds`` in this module), then a progress bar with the
        time left.
    **simulate_kw
        Passed to :func:`~straggler.sim.simulate` (``n_replicas`` defaults to the
        deployment's ``n_gpus``; ``load``, ``max_slots``, ...).

    Returns
    -------
    LeversTable
    """
    func = "levers"
    if not isinstance(deployment, DeploymentConfig):
        raise param_error("deployment", func, "a DeploymentConfig", repr(deployment)[:80])
    from ...solvers import routing_policies

    routings = [check_choice(r, "routings", func, routing_policies()) for r in routings]
    dispatches = [check_choice(d, "dispatches", func, DISPATCHES) for d in dispatches]
    placements = [check_choice(p, "placements", func, PLACEMENTS) for p in placements]
    cells = [DEFAULT_CELL] + [
        (r, d, p)
        for r in routings
        for d in dispatches
        for p in placements
        if (r, d, p) != DEFAULT_CELL
    ]
    simulate_kw.setdefault("n_replicas", deployment.n_gpus)
    reports = {}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        est = estimate_levers_seconds(trace, deployment, cells, **simulate_kw)
        size = f" of {len(trace):,} requests" if isinstance(trace, Trace) else ""
        when = f"about {_duration(est)}" if est is not None else "shown after the first cell"
        print(f"levers: {len(cells)} cells{size}; estimated time {when}", file=sys.stderr)
        bar = tqdm(total=len(cells), desc="levers", unit="cell", file=sys.stderr)
    try:
        for r, d, p in cells:
            if bar is not None:
                bar.set_postfix_str(f"{r}, {d}, {p}")
            dep = dataclasses.replace(deployment, dispatch=d, placement=p)
            reports[(r, d, p)] = simulate(trace, r, deployment=dep, **simulate_kw)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    base = reports[DEFAULT_CELL]
    rows = [_row(c, reports[c], base) for c in cells]
    pre = deployment.preset
    note = (
        f"{pre.name}, EP = DP = {deployment.n_gpus} ({deployment.n_nodes} node(s)); "
        f"{deployment.n_sim_layers} of {pre.n_moe_layers} MoE layers simulated, scaled x"
        f"{deployment.layer_scale:g}; tables refreshed every {deployment.dispatch_period_s:g} s "
        f"(simulated); placement rebuilt every {deployment.placement_period} steps; offered "
        f"load {base.offered_load:.2f}x; gains relative to jsq + eplb + even (first row); "
        "step columns: mean per step"
    )
    return LeversTable(rows=rows, reports=reports, note=note)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def estimate_levers_seconds(trace, deployment, cells, *, probe_fraction=0.02, **simulate_kw):
    """Seconds the levers ``cells`` will take, from probe runs: each distinct (dispatch,
    placement) simulated with JSQ on the first ``probe_fraction`` of ``trace`` (at least 50
    requests) and on twice as many; the difference gives the seconds per request, the rest
    a run's fixed cost, and the whole trace is extrapolated linearly. A rough figure (the
    simulator's cost per request grows with the load a run builds up). None when ``trace`` is
    not a :class:`~straggler.sim.workloads.traces.Trace` or is shorter than 200 requests (the
    probes would be the work)."""
    if not isinstance(trace, Trace) or len(trace) < 200:
        return None
    n = max(50, int(len(trace) * probe_fraction))
    seconds = {}
    for _, d, p in cells:
        if (d, p) in seconds:
            continue
        dep = dataclasses.replace(deployment, dispatch=d, placement=p)
        times = []
        for size in (n, 2 * n):
            t0 = time.perf_counter()
            simulate(trace.subset(np.arange(size)), "jsq", deployment=dep, **simulate_kw)
            times.append(time.perf_counter() - t0)
        per_request = max(times[1] - times[0], 0.0) / n
        fixed = max(times[0] - per_request * n, 0.0)
        seconds[(d, p)] = fixed + per_request * len(trace)
    return sum(seconds[(d, p)] for _, d, p in cells)


def plot_step_decomposition(table: LeversTable, path) -> None:
    """A stacked bar per cell of the mean step: attention (balanced part and straggler share),
    MoE (balanced part and straggler share; the traffic piece inside it hatched), dense.
    Needs matplotlib (the ``plot`` extra); writes ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = table.rows
    labels = [f"{r['routing']}\n{r['dispatch']}\n{r['placement']}" for r in rows]
    x = range(len(rows))
    parts = [
        ("attention", [r["attention_ms"] - r["attention_straggler_ms"] for r in rows], "#4c72b0"),
        ("attention straggler", [r["attention_straggler_ms"] for r in rows], "#a6bddb"),
        ("MoE", [r["moe_ms"] - r["moe_straggler_ms"] for r in rows], "#dd8452"),
        ("MoE straggler", [r["moe_straggler_ms"] for r in rows], "#fdd0a2"),
        ("dense", [r["dense_ms"] for r in rows], "#8c8c8c"),
    ]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(rows) + 2), 4.2))
    bottom = [0.0] * len(rows)
    for name, vals, color in parts:
        ax.bar(x, vals, bottom=bottom, color=color, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(x, [r["comm_ms"] for r in rows], "k_", markersize=14, label="traffic piece (in MoE)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, fontsize=6)
    ax.set_ylabel("mean step (ms)")
    ax.set_title(table.note.split(";")[0], fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
