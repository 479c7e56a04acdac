"""Rebalancing: how much makespan each moved replica buys (the frontier, upstream's points),
and policies compared in the loop (:func:`rebalance_loop`: throughput with the moves' cost).

A rebalance costs weight copies (one per *moved replica*, a slot whose expert changes,
:func:`~straggler.solvers.placement.place.moved_replicas`) and buys a lower step time.
:func:`rebalance_frontier` draws the trade-off from the placement in force: for a range of
move budgets ``k`` per layer, :func:`~straggler.solvers.place_experts` with
``previous=..., max_moves=k`` (from 0 moves up to as many as a full EPLB rebalance copies),
each scored by tempo's mean makespan on the scoring batches; and, on the same axes, where
upstream's rebalancers land from the same placement:

* ``"eplb"``: DeepSeek's EPLB on the window, every changed slot copied (SGLang, DeepSeek);
* ``"vllm_eplb"``: vLLM's ``DefaultEplbPolicy`` (EPLB, then ``preserve_intragpu_slots``:
  :func:`~straggler.solvers.placement.eplb.rebalance_experts` with ``version="vllm"`` and
  ``old_physical_to_logical``);
* ``"flashlb"``: FlashLB's update from the previous placement (minimum-move matching, at
  most 16 layers, :func:`~straggler.baselines.placement.flashlb.flashlb_rebalance`);
* ``"place_experts"``: the placement from scratch with its slots kept where they can be;
* ``"previous"``: no rebalance.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ...baselines.placement.flashlb import flashlb_rebalance
from ...formulations.cost import PRESETS, CostModel
from ...formulations.dispatch import DispatchProblem
from ...formulations.errors import InvalidInputError, param_error
from ...formulations.validation import check_array, check_choice, check_int, check_type
from ...solvers.dispatch.solve import solve_dispatch
from ...solvers.placement.eplb import rebalance_experts
from ...solvers.placement.place import DEFAULT_PLACEMENT_COST, moved_replicas, place_experts
from ...solvers.placement.rebalance.registry import get_rebalance_policy
from ...solvers.placement.rebalance.transfer import MoveCost
from ..engine.deployment import DeploymentConfig
from ..engine.simulator import SimReport, simulate

__all__ = [
    "RebalanceFrontier",
    "rebalance_frontier",
    "tempo_makespan",
    "RebalanceLoop",
    "rebalance_loop",
    "throughput_series",
]

_FUNC = "rebalance_frontier"


def tempo_makespan(batches, physical_to_logical, num_gpus: int, cost) -> float:
    """Tempo's mean makespan per step over ``batches`` (``(n, n_layers, n_experts)`` tokens),
    summed over the layers, on the placement ``physical_to_logical``.

    Examples
    --------
    >>> c = CostModel(a=0, b=1, c=0, beta=1)
    >>> tempo_makespan(np.array([[[4, 4]]]), np.array([[0, 1]]), 2, c)
    4.0
    """
    tot = 0.0
    for c in batches:
        p = DispatchProblem.from_placement(c, physical_to_logical, num_gpus)
        res = solve_dispatch(p, cost, method="tempo", repair_budget_s=0.0)
        tot += float(np.sum(res.makespan))
    return tot / len(batches)


@dataclass(frozen=True, kw_only=True, eq=False)
class RebalanceFrontier:
    """The makespan-vs-moves curve of :func:`rebalance_frontier` and upstream's points."""

    budgets: np.ndarray
    """Move budgets per layer (``max_moves``) of the curve's points."""
    moves: np.ndarray
    """Replicas moved, summed over layers, at each budget."""
    makespan: np.ndarray
    """Tempo's mean makespan per step (summed over layers) at each budget."""
    points: dict = field(default_factory=dict)
    """``name -> (moves, makespan)`` for ``"previous"``, ``"eplb"``, ``"vllm_eplb"``,
    ``"flashlb"`` and ``"place_experts"``."""

    def gain_captured(self, budget_moves: int, reference: str = "eplb") -> float:
        """Share of ``reference``'s makespan gain over ``"previous"`` reached by the curve
        within ``budget_moves`` moved replicas in all (``nan`` without a gain)."""
        base = self.points["previous"][1]
        gain = base - self.points[reference][1]
        ok = self.moves <= budget_moves
        if gain <= 0 or not ok.any():
            return float("nan")
        return float((base - self.makespan[ok].min()) / gain)

    def plot(self, ax=None):
        """Draw the curve and the points (matplotlib, the ``plot`` extra); returns ``ax``."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4))
        ax.plot(self.moves, self.makespan, "o-", color="k", label="place_experts(max_moves=k)")
        marks = {
            "previous": "s",
            "eplb": "^",
            "vllm_eplb": "v",
            "flashlb": "D",
            "place_experts": "*",
        }
        for name, (m, t) in self.points.items():
            ax.plot([m], [t], marks.get(name, "x"), markersize=9, label=name)
        ax.set_xlabel("replicas moved (all layers)")
        ax.set_ylabel("tempo mean makespan per step (us)")
        ax.legend(fontsize=8)
        return ax


def _rebalance_frontier_iv(
    history,
    previous,
    num_replicas,
    num_groups,
    num_nodes,
    num_gpus,
    cost,
    score_on,
    n_samples,
    budgets,
):
    """Every argument of :func:`rebalance_frontier` checked before any work, errors naming
    its parameters (the functions it calls would name theirs)."""
    if cost is None:
        cost = CostModel.preset(DEFAULT_PLACEMENT_COST)
    elif isinstance(cost, str):
        cost = CostModel.preset(check_choice(cost, "cost", _FUNC, sorted(PRESETS)))
    check_type(cost, "cost", _FUNC, CostModel, "a CostModel, a preset name or None")
    form = "a non-empty (n_batches, n_layers, n_experts) array of non-negative integers"
    h = check_array(history, "history", _FUNC, ndim=3, kind="int", lo=0, expected=form)
    if 0 in h.shape:
        raise param_error("history", _FUNC, form, f"shape {h.shape}")
    _, L, E = h.shape
    P = check_int(num_replicas, "num_replicas", _FUNC, lo=1)
    prev = check_array(
        previous, "previous", _FUNC, ndim=2, kind="int", lo=0, hi=E - 1, shape=(L, P),
        expected=f"the placement in force: an ({L}, {P}) array of experts",
    )  # fmt: skip
    held = h
    if score_on is not None:
        form = (
            f"a non-empty (n, {L}, {E}) array of non-negative integers (history's layers, experts)"
        )
        held = check_array(score_on, "score_on", _FUNC, ndim=3, kind="int", lo=0, expected=form)
        if held.shape[0] == 0 or held.shape[1:] != (L, E):
            raise param_error("score_on", _FUNC, form, f"shape {held.shape}")
    args = (
        P,
        check_int(num_groups, "num_groups", _FUNC, lo=1),
        check_int(num_nodes, "num_nodes", _FUNC, lo=1),
        check_int(num_gpus, "num_gpus", _FUNC, lo=1),
    )
    try:  # EPLB's constraints between them, worded for this function
        rebalance_experts(np.ones((1, E)), *args)
    except InvalidInputError as exc:
        raise InvalidInputError(
            str(exc).replace(" of rebalance_experts ", f" of {_FUNC} ")
        ) from None
    n_samples = check_int(n_samples, "n_samples", _FUNC, lo=1)
    if budgets is not None:
        budgets = check_array(budgets, "budgets", _FUNC, ndim=1, kind="int", lo=0)
    return h, prev, held, args, cost, n_samples, budgets


def rebalance_frontier(
    history,
    previous,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    cost: CostModel | str | None = None,
    score_on=None,
    budgets=None,
    n_samples: int = 8,
) -> RebalanceFrontier:
    """Expected makespan vs replicas moved, from ``previous`` to a full EPLB rebalance.

    Parameters
    ----------
    history : array_like of int, shape (n_batches, n_layers, n_experts)
        The window the rebalance plans on.
    previous : array_like of int, shape (n_layers, P)
        The placement in force.
    num_replicas, num_groups, num_nodes, num_gpus : int
        As for :func:`~straggler.solvers.placement.eplb.rebalance_experts`.
    cost : CostModel or preset name, optional
        Default ``straggler.solvers.placement.place.DEFAULT_PLACEMENT_COST``.
    score_on : array_like of int, shape (n, n_layers, n_experts), optional
        Batches the makespans are measured on; default ``history`` (pass the next window to
        judge on held-out batches).
    budgets : sequence of int, optional
        Move budgets per layer; default 9 evenly spaced from 0 to the most replicas a full
        EPLB rebalance moves in one layer.
    n_samples : int, default 8
        As for :func:`~straggler.solvers.place_experts`.

    Returns
    -------
    RebalanceFrontier

    Raises
    ------
    InvalidInputError
        Bad shapes or values (checked by the functions it calls, naming the parameter).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> hist = rng.poisson([90, 30, 9, 5, 3, 2, 1, 1], size=(6, 1, 8))
    >>> fr = rebalance_frontier(hist, [[7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4]], 12, 1, 1, 4,
    ...                         budgets=[0, 2])
    >>> fr.moves.tolist()[0], sorted(fr.points)
    (0, ['eplb', 'flashlb', 'place_experts', 'previous', 'vllm_eplb'])
    """
    h, prev, held, args, cost, n_samples, budgets = _rebalance_frontier_iv(
        history, previous, num_replicas, num_groups, num_nodes, num_gpus, cost, score_on,
        n_samples, budgets,
    )  # fmt: skip
    num_replicas, g = args[0], args[3]
    mean = h.mean(axis=0)
    eplb = rebalance_experts(mean, *args)[0]
    vllm = rebalance_experts(mean, *args, version="vllm", old_physical_to_logical=prev)[0]
    flash = flashlb_rebalance(h, num_replicas, g, previous=prev)[0] if h.shape[0] >= 2 else eplb
    fresh = place_experts(h, *args, cost=cost, n_samples=n_samples, previous=prev)[0]
    points = {}
    for name, p2l in (("previous", prev), ("eplb", eplb), ("vllm_eplb", vllm),
                      ("flashlb", flash), ("place_experts", fresh)):  # fmt: skip
        points[name] = (int(moved_replicas(prev, p2l).sum()), tempo_makespan(held, p2l, g, cost))
    if budgets is None:
        top = int(moved_replicas(prev, eplb).max())
        budgets = np.unique(np.linspace(0, top, 9).round().astype(np.int64))
    moves, spans = [], []
    for k in budgets:
        p2l = place_experts(
            h, *args, cost=cost, n_samples=n_samples, previous=prev, max_moves=int(k)
        )[0]  # fmt: skip
        moves.append(int(moved_replicas(prev, p2l).sum()))
        spans.append(tempo_makespan(held, p2l, g, cost))
    return RebalanceFrontier(
        budgets=budgets, moves=np.array(moves), makespan=np.array(spans), points=points
    )


#: Columns of :meth:`RebalanceLoop.format`: (header, key of a row, format).
_LOOP_COLUMNS = (
    ("policy", "policy", "{}"),
    ("tok/s", "throughput_tps", "{:,.0f}"),
    ("vs never %", "throughput_vs_never_pct", "{:+.2f}"),
    ("TPOT p50 ms", "tpot_p50_ms", "{:.2f}"),
    ("TPOT p99 ms", "tpot_p99_ms", "{:.2f}"),
    ("balancedness", "balancedness", "{:.3f}"),
    ("MoE ms/step", "moe_ms", "{:.2f}"),
    ("rearr.", "rearrangements", "{:d}"),
    ("copies", "copies", "{:,.0f}"),
    ("GB moved", "gb_moved", "{:,.1f}"),
    ("stall s", "stall_s", "{:.2f}"),
    ("async delay s", "async_delay_s", "{:.2f}"),
    ("stall % of time", "stall_pct", "{:.2f}"),
)


@dataclass(frozen=True)
class RebalanceLoop:
    """Rebalance policies compared on one trace and deployment (:func:`rebalance_loop`).

    Each row (dict): ``policy`` (its label, ``vllm:3000``), ``mode``, ``throughput_tps``
    and ``throughput_vs_never_pct`` (relative to ``never``'s run when there is one),
    ``tpot_p50_ms``, ``tpot_p99_ms``, ``balancedness`` (vLLM's, mean over steps),
    ``moe_ms`` (mean MoE time per step, the rearrangements' share included), the
    rearrangements' totals (``rearrangements``, ``copies``: expert copies over the model's
    layers, ``gb_moved``, ``stall_s``, ``async_delay_s``, ``planning_s``), ``stall_pct``
    (stall and delay over the run's simulated time: the rearrangements' share of it),
    ``run_s`` (simulated seconds), ``n_steps``, ``wall_s``. ``reports`` holds each run's
    :class:`~straggler.sim.SimReport` by label.
    """

    rows: list
    reports: dict
    note: str

    def format(self) -> str:
        """The table, one line per policy (units in the header)."""
        heads = [h for h, _, _ in _LOOP_COLUMNS]
        cells = [[fmt.format(r[k]) for _, k, fmt in _LOOP_COLUMNS] for r in self.rows]
        width = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
        line = " | ".join(h.rjust(w) for h, w in zip(heads, width))
        out = [line, "-" * len(line)]
        out += [" | ".join(c.rjust(w) for c, w in zip(row, width)) for row in cells]
        return "\n".join(out)

    def plot(self, path=None, *, bin_s: float | None = None, title: str | None = None):
        """Throughput over simulated time per policy, each rearrangement marked where it was
        decided (a tick on the policy's line); matplotlib, the ``plot`` extra. Returns the
        figure (saved to ``path`` when given)."""
        import os
        import textwrap

        from ...formulations._io import atomic_path
        from .plots import _pyplot

        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(9, 5))
        span = max(float(r.series["time_s"][-1]) for r in self.reports.values())
        b = bin_s if bin_s is not None else max(span / 60.0, 1e-3)
        for label, rep in self.reports.items():
            x, y = throughput_series(rep, b)
            (line,) = ax.plot(x, y, lw=1.2, label=label)
            ev = [e["time_s"] for e in rep.rebalances]
            if ev:
                yv = np.interp(ev, x, y) if x.size else np.zeros(len(ev))
                ax.plot(ev, yv, "|", ms=12, mew=1.5, color=line.get_color())
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel(f"throughput (tok/s, {b:.3g} s bins); | = a rearrangement")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=3)
        ax.set_title("\n".join(textwrap.wrap(title or self.note, 110)), fontsize=9)
        fig.tight_layout()
        if path is not None:
            with atomic_path(path) as tmp:
                fig.savefig(tmp, dpi=120, format=os.path.splitext(os.fspath(path))[1][1:] or "png")
        return fig


def throughput_series(report: SimReport, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Decoded tokens per second of a run in consecutive ``bin_s`` bins of simulated time
    (tokens of the steps that start in a bin over the bin's summed step time): bin centres
    and throughputs.

    Examples
    --------
    >>> from straggler.sim.workloads.traces import Trace
    >>> tr = Trace(arrival_s=[0, 0], prompt_len=[5, 5], output_len=[4, 4])
    >>> r = simulate(tr, "jsq", n_replicas=2, max_slots=2, t0=0.5, kappa=0.0,
    ...              prefill_instances=0, prefill_base_s=0.0, prefill_tokens_per_s=float("inf"))
    >>> throughput_series(r, 1.0)[1].tolist()
    [4.0, 4.0]
    """
    t = report.series["time_s"]
    dt = report.series["step_s"]
    tok = report.series["running"]
    if t.size == 0:
        return t, t
    k = np.floor((t - t[0]) / bin_s).astype(np.int64)
    busy = np.bincount(k, weights=dt)
    made = np.bincount(k, weights=tok)
    keep = busy > 0
    centres = t[0] + (np.arange(busy.size) + 0.5) * bin_s
    return centres[keep], made[keep] / busy[keep]


def rebalance_loop(
    trace,
    deployment: DeploymentConfig,
    policies,
    *,
    move: MoveCost | None = None,
    policy: str = "jsq",
    progress: bool = False,
    **simulate_kw,
) -> RebalanceLoop:
    """Simulate ``trace`` once per rebalance policy, everything else equal, and tabulate.

    Parameters
    ----------
    trace : Trace or str
        As for :func:`~straggler.sim.simulate`.
    deployment : DeploymentConfig
        The deployment; its ``rebalance`` (and ``move``, when ``move`` is given) is replaced
        per run, everything else (routing model and its drift, seed, rank events) shared.
    policies : sequence of str or RebalancePolicy
        Names (``"never"``, ``"every:2000"``, ...) or policy objects; at least one.
    move : MoveCost, optional
        The copies' price and mode for every run (default: the deployment's, or the preset's
        expert size on H100 links, synchronous).
    policy : str, default "jsq"
        The DP routing policy of every run.
    progress : bool, default False
        A line on stderr per finished run.
    **simulate_kw
        Passed to :func:`~straggler.sim.simulate` (``n_replicas`` defaults to the
        deployment's ``n_gpus``).

    Returns
    -------
    RebalanceLoop
    """
    func = "rebalance_loop"
    if not isinstance(deployment, DeploymentConfig):
        raise param_error("deployment", func, "a DeploymentConfig", repr(deployment)[:80])
    pols = [get_rebalance_policy(p, func) for p in policies]
    if not pols:
        raise param_error("policies", func, "at least one rebalance policy", "none")
    simulate_kw.setdefault("n_replicas", deployment.n_gpus)
    reports: dict[str, SimReport] = {}
    rows = []
    t0 = time.perf_counter()
    for k, pol in enumerate(pols):
        kw = {"rebalance": pol, "rank_events": deployment.rank_events or ()}
        if move is not None:
            kw["move"] = move
        elif deployment.rebalance is not None:
            kw["move"] = deployment.move
        dep = dataclasses.replace(deployment, **kw)
        w0 = time.perf_counter()
        rep = simulate(trace, policy, deployment=dep, **simulate_kw)
        wall = time.perf_counter() - w0
        reports[pol.label] = rep
        rows.append(_loop_row(pol.label, dep, rep, wall))
        if progress:
            print(
                f"rebalance: {k + 1}/{len(pols)} runs ({pol.label}, "
                f"{time.perf_counter() - t0:.1f} s)",
                file=sys.stderr,
            )
    base = next((r for r in rows if r["policy"] == "never"), rows[0])
    for r in rows:
        b = base["throughput_tps"]
        r["throughput_vs_never_pct"] = 100.0 * (r["throughput_tps"] / b - 1.0) if b else 0.0
    dep = dataclasses.replace(deployment, rebalance=pols[0], move=move or deployment.move)
    note = (
        f"{dep.preset.name} EP{dep.n_gpus} on {dep.n_nodes} node(s), {dep.n_sim_layers} "
        f"simulated layers; copies {dep.move.mode}, {dep.move.intra_gbps:g}/"
        f"{dep.move.inter_gbps:g} GB/s intra/inter-node, {dep.move.expert_bytes / 1e6:.1f} MB "
        "per expert"
    )
    return RebalanceLoop(rows=rows, reports=reports, note=note)


def _loop_row(label: str, dep: DeploymentConfig, rep: SimReport, wall: float) -> dict:
    b = rep.step_breakdown
    t = rep.series["time_s"]
    run_s = float(t[-1] + rep.series["step_s"][-1] - t[0]) if t.size else 0.0
    stall = b.get("stall_s", 0.0) + b.get("async_delay_s", 0.0)
    return dict(
        policy=label,
        mode=dep.move.mode,
        throughput_tps=rep.throughput_tps,
        tpot_p50_ms=rep.tpot_p50_ms,
        tpot_p99_ms=rep.tpot_p99_ms,
        balancedness=rep.balancedness,
        moe_ms=(b.get("moe_us", 0.0) + b.get("rebalance_us", 0.0)) / 1e3,
        rearrangements=int(b.get("rearrangements", 0)),
        copies=b.get("copies", 0.0),
        gb_moved=b.get("bytes_moved", 0.0) / 1e9,
        stall_s=b.get("stall_s", 0.0),
        async_delay_s=b.get("async_delay_s", 0.0),
        planning_s=b.get("planning_s", 0.0),
        stall_pct=100.0 * stall / run_s if run_s > 0 else 0.0,
        run_s=run_s,
        n_steps=rep.n_steps,
        wall_s=wall,
    )
