"""Rebalance in the loop: when to move experts, how many, and what the move costs the step.

Every run is :func:`straggler.sim.experiments.rebalance.rebalance_loop`: the lock-step
simulator with the deployment step model (DP attention + EP MoE, EPLB's even split), a
saturated decode cluster (every slot busy, prefill unlimited: decode binds), ``--steps``
steps, one run per rebalance policy with everything else equal (trace, routing model and its
drift, seed). Tables:

1. **planning**: each planner's time per DeepSeek-V3 layer here (one thread), beside the
   engines' own (measured once in their environments: ``docs/guides/rebalance.md``).
2. **direction** (vLLM PR #50647): vLLM's synchronous clock at shorter and shorter intervals:
   balancedness up, throughput down, the stall the cause.
3. **held-out**: on drifts not used to choose ``auto``'s settings, for DeepSeek-V3 EP32
   (4 nodes) and Qwen3-235B EP8 (1 node), sync and async: ``never``, ``auto`` and the fixed
   clocks (vLLM's, SGLang's, ``every:N``); the check: ``auto`` at least the best fixed clock
   chosen in hindsight minus 1%, and at least ``never``.
4. **real drift** (``--full``): DeepSeek-V2-Lite EP8, the four ESFT tasks' recorded loads in
   turn (``../shared/data/expert_loads``).
5. **rank lost** (``--full``): DeepSeek-V3 EP32, rank 5 lost and back.
6. **Mixtral** (default run: the base model; ``--full``: the Instruct model too):
   Mixtral-8x7B EP8 on one node, 16 slots (2 per GPU), 256 requests per rank, its expert
   popularity on seven MMLU subjects in turn (``../shared/data/expert_loads/
   fiddler_mixtral8x7b_popularity``, efeslab/fiddler, Apache-2.0; alphabetical order,
   :data:`~straggler.sim.workloads.drift.MIXTRAL_SUBJECTS`) at two paces: a seventh of the
   run each, and each as long as an ESFT task of table 4 (a quarter of the run; the run then
   7/4 as long); sync and async, the check as in table 3. First, why this layout: EPLB's
   placement fitted to one subject and served on another against one fitted to the subject
   served, per layout.
   Nothing is tuned on these recordings (``auto``'s settings are the training drift's): both
   variants are held out.

``auto``'s settings were chosen on the *training* drift: DeepSeek-V3 EP32, seed 1, every
expert's log popularity stepping N(0, 1) every 2000 steps (:class:`~straggler.solvers.
placement.rebalance.auto.Auto` notes); no held-out drift below uses that seed, preset and
drift together.

Usage::

    python benchmarks/rebalance_loop.py            # planning, direction, held-out, Mixtral
    python benchmarks/rebalance_loop.py --full     # and more drifts, ESFT, a rank lost
    python benchmarks/rebalance_loop.py --quick    # fewer steps (a smoke run)

Writes ``rebalance_loop.json`` (``rebalance_loop_quick.json``, ``rebalance_loop_full.json``)
and, with matplotlib, the throughput-over-time figures ``rebalance_loop_<table>.png`` into
``--out`` (default ``$STRAGGLER_RESULTS``, else ``./straggler-results``).

The machine is shared (2 cores for several people): times are noisy; every comparison is
between runs of one invocation.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np
from _results import out_file, results_dir, run_info  # benchmarks/_results.py
from straggler.baselines.placement.elasticity_aware import elasticity_aware_rebalance
from straggler.formulations import CostModel
from straggler.sim import drifting_windows
from straggler.sim.engine.deployment import DeploymentConfig, RoutingModel, RoutingSequence
from straggler.sim.engine.simulator import warm_engine
from straggler.sim.experiments.rebalance import rebalance_loop
from straggler.sim.workloads.drift import load_esft_counts, load_mixtral_popularity
from straggler.sim.workloads.traces import generate_trace
from straggler.solvers import place_experts
from straggler.solvers.placement.eplb import rebalance_experts
from straggler.solvers.placement.place import warm_placement
from straggler.solvers.placement.rebalance.auto import decide_rebalance
from straggler.solvers.placement.rebalance.path import eplb_target, rebalance_path
from straggler.solvers.placement.rebalance.transfer import MoveCost

ESFT = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "expert_loads"
MIXTRAL = ESFT / "fiddler_mixtral8x7b_popularity"

#: The deployments: (preset, EP width, nodes, requests per rank).
SHAPES = {"dsv3": ("dsv3", 32, 4, 64), "qwen3_235b": ("qwen3_235b", 8, 1, 128)}
#: Held-out synthetic drifts: (seed, std of the log-popularity step, steps between steps).
#: The training drift was (1, 1.0, 2000) on DeepSeek-V3 only.
HELD_OUT = [(3, 0.7, 1500), (4, 1.5, 3000)]
FIXED = ["vllm", "vllm:1000", "vllm:250", "sglang", "sglang:250", "every:500", "every:1000",
         "every:2000"]  # fmt: skip
#: Mixtral's deployment: (GPUs, nodes, requests per rank, slots per GPU). Below about 150
#: requests per rank the cost model's MoE layer is its weight floor whatever the placement
#: (``a + 2 b`` against the traffic term ``c2 + gamma N`` for ``N = 2 x requests`` tokens per
#: GPU): placement would not matter. 256 requests per rank at ~1200 tokens of KV (4 KB per
#: token and layer: 39 GB) and 2 bf16 expert slots of 352 MB in each of 32 layers (22.5 GB)
#: fit an 80 GB GPU.
MIXTRAL_SHAPE = (8, 1, 256, 2)
#: Layouts compared for the Mixtral table's choice: (GPUs, slots per GPU).
MIXTRAL_LAYOUTS = ((4, 2), (4, 3), (8, 1), (8, 2))
#: The tables, in the order they run.
TABLES = ("planning", "direction", "held_out", "esft", "rank_lost", "mixtral")
QUICK_FIXED = ["vllm", "vllm:250", "sglang", "every:500", "every:1000"]


#: Where the figures go (set by ``main``; ``None``: no figures, matplotlib missing).
_FIGURES: dict = {"dir": None}


def _plot(res, name: str, title: str) -> None:
    """The throughput-over-time figure of one table, rearrangements marked."""
    if _FIGURES["dir"] is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    path = out_file(_FIGURES["dir"], f"rebalance_loop_{name}.png")
    res.plot(path, title=title)
    print(f"wrote {path}")


def _trace(steps: int, G: int, slots: int, seed: int):
    """Enough requests for ``steps`` saturated steps (outputs of ~210 tokens)."""
    return generate_trace("azure_conv", n_requests=int(1.3 * steps * G * slots / 200), rng=seed)


def _sim_kw(slots: int, steps: int) -> dict:
    return dict(max_slots=slots, saturated=True, max_steps=steps, kv_capacity=4_000_000,
                prefill_instances=0)  # fmt: skip


def planning(out: dict) -> None:
    """Per-layer planning time of each planner on DeepSeek-V3's shape (a drifted window of
    1000 steps of 64 requests per rank, 4 layers timed)."""
    L, P, G, N, groups = 4, 288, 32, 4, 8
    cost = CostModel.preset("dsv3_b_tile")
    w = drifting_windows(n_windows=2, window=1000, n_layers=L, n_experts=256, n_tokens=G * 64,
                         top_k=8, skew=0.85, drift=1.0, rng=0)  # fmt: skip
    prev = rebalance_experts(w[0].mean(0), P, groups, N, G, distinct=True)[0]
    move = MoveCost(expert_bytes=44e6)
    target = eplb_target(w[1].mean(0), P, groups, N, G, np.ones(G, bool))
    runs = {
        "auto: decide_rebalance (64 batches, 16 points)": lambda: decide_rebalance(
            w[1], prev, P, groups, N, G, cost=cost, move=move, horizon=2000, layer_scale=14.5
        ),
        "the rebalance path alone (every budget)": lambda: rebalance_path(
            w[1], prev, target, G, cost
        ),
        "place_experts(previous, max_moves=32) (one budget)": lambda: place_experts(
            w[1], P, groups, N, G, cost=cost, previous=prev, max_moves=32
        ),
        "place_experts(previous) greedy (every:N)": lambda: place_experts(
            w[1], P, groups, N, G, cost=cost, previous=prev
        ),
        "EPLB, vLLM's port + preserve_intragpu_slots (vllm)": lambda: rebalance_experts(
            w[1].sum(0), P, groups, N, G, version="vllm", old_physical_to_logical=prev
        ),
        "elasticity_aware, SGLang's port (sglang)": lambda: elasticity_aware_rebalance(
            w[1].sum(0), P, groups, N, G, True, np.ones(G, dtype=np.int64)
        ),
    }
    rows = []
    for name, f in runs.items():
        f()  # compile / warm
        t0 = time.perf_counter()
        f()
        rows.append(dict(planner=name, ms_per_layer=1e3 * (time.perf_counter() - t0) / L))
    out["planning"] = rows
    print("\nplanning time per DeepSeek-V3 layer (this machine, one thread; shared: noisy)")
    for r in rows:
        print(f"  {r['planner']:<52s} {r['ms_per_layer']:9.2f} ms")


def direction(out: dict, steps: int) -> None:
    """vLLM PR #50647's direction: vLLM's synchronous clock at shorter intervals."""
    preset, G, N, slots = SHAPES["dsv3"]
    dep = DeploymentConfig(preset=preset, n_gpus=G, n_nodes=N, layers=2, drift=1.0,
                           drift_steps=2000, seed=2)  # fmt: skip
    move = MoveCost(expert_bytes=dep.preset.expert_bytes, mode="sync")
    res = rebalance_loop(_trace(steps, G, slots, 2), dep,
                         ["never", "vllm:3000", "vllm:1000", "vllm:300", "vllm:100"], move=move,
                         **_sim_kw(slots, steps))  # fmt: skip
    out["direction"] = dict(note=res.note, rows=res.rows)
    _plot(res, "direction", f"vLLM's synchronous clock at shorter intervals: {res.note}")
    print(f"\ndirection (vLLM PR #50647): {res.note}; {steps} steps, drift N(0,1)/2000 steps, "
          "seed 2")  # fmt: skip
    print(res.format())


def _compare(label: str, dep: DeploymentConfig, trace, fixed, steps: int, slots: int,
             modes=("sync", "async"), figure: str | None = None) -> dict:  # fmt: skip
    """never, auto and the fixed clocks in each mode; the checks."""
    out = {"label": label, "modes": {}}
    never = None
    for mode in modes:
        move = MoveCost(expert_bytes=dep.preset.expert_bytes, mode=mode)
        pols = (["never"] if never is None else []) + ["auto"] + list(fixed)
        res = rebalance_loop(trace, dep, pols, move=move, **_sim_kw(slots, steps))
        rows = res.rows
        if never is None:
            never = rows[0]
        else:  # never moves nothing: its run is the same in every mode
            b = never["throughput_tps"]
            for r in rows:
                r["throughput_vs_never_pct"] = 100.0 * (r["throughput_tps"] / b - 1.0)
            rows = [never] + rows
        by = {r["policy"]: r for r in rows}
        auto = by["auto:250"]
        best = max((r for r in rows if r["policy"] not in ("never", "auto:250")),
                   key=lambda r: r["throughput_tps"])  # fmt: skip
        check = dict(
            auto_tps=auto["throughput_tps"], never_tps=never["throughput_tps"],
            best_fixed=best["policy"], best_fixed_tps=best["throughput_tps"],
            auto_vs_best_pct=100.0 * (auto["throughput_tps"] / best["throughput_tps"] - 1.0),
            auto_vs_never_pct=100.0 * (auto["throughput_tps"] / never["throughput_tps"] - 1.0),
        )  # fmt: skip
        check["met"] = bool(check["auto_vs_best_pct"] >= -1.0 and check["auto_vs_never_pct"] >= 0)
        out["modes"][mode] = dict(note=res.note, rows=rows, check=check)
        if figure is not None:
            _plot(res, f"{figure}_{mode}", f"{label}, {mode}")
        print(f"\n{label}, {mode}: {res.note}")
        from straggler.sim.experiments.rebalance import RebalanceLoop

        print(RebalanceLoop(rows=rows, reports={}, note=res.note).format())
        print(f"  check: auto {check['auto_vs_best_pct']:+.2f}% vs the best fixed clock "
              f"({best['policy']}), {check['auto_vs_never_pct']:+.2f}% vs never -> "
              f"{'met' if check['met'] else 'NOT met'}")  # fmt: skip
    return out


def held_out(out: dict, steps: int, fixed, drifts) -> None:
    out["held_out"] = []
    for name, (preset, G, N, slots) in SHAPES.items():
        for k, (seed, drift, every) in enumerate(drifts):
            dep = DeploymentConfig(preset=preset, n_gpus=G, n_nodes=N, layers=2, drift=drift,
                                   drift_steps=every, seed=seed)  # fmt: skip
            label = f"{name} EP{G}, drift N(0,{drift:g}) every {every} steps, seed {seed}"
            out["held_out"].append(
                _compare(
                    label,
                    dep,
                    _trace(steps, G, slots, seed),
                    fixed,
                    steps,
                    slots,
                    figure=f"held_out_{name}" if k == 0 else None,
                )  # fmt: skip
            )


def real_drift(out: dict, steps: int, fixed) -> None:
    """DeepSeek-V2-Lite EP8 on 2 nodes, the ESFT tasks' recorded loads in turn."""
    counts = load_esft_counts(ESFT / "esft_per_sequence_counts.npz")
    models = [RoutingModel.recorded(c, top_k=6, layers=2) for c in counts.values()]
    G, N, slots = 8, 2, 64
    probe = DeploymentConfig(preset="dsv2_lite", n_gpus=G, n_nodes=N, layers=2,
                             routing=models[0])  # fmt: skip
    # a task for about a quarter of the run: the step time at full load, measured
    every = steps * _full_step_s(probe, slots) / 4
    dep = DeploymentConfig(preset="dsv2_lite", n_gpus=G, n_nodes=N, layers=2, seed=5,
                           routing=RoutingSequence(models, every_s=every))  # fmt: skip
    label = f"dsv2_lite EP8 (2 nodes), ESFT tasks {'/'.join(counts)} in turn, {every:.1f} s each"
    out["real_drift"] = _compare(label, dep, _trace(steps, G, slots, 5), fixed, steps, slots,
                                 figure="esft")  # fmt: skip


def _stale_balance(pops: dict, G: int, per_gpu: int) -> tuple[float, float]:
    """(fresh, stale): busiest GPU's load over the mean under EPLB's even split, mean over
    layers, of EPLB's placement fitted to the subject served (fresh) and to another subject
    (stale: mean over the ordered pairs), on ``G`` GPUs with ``per_gpu`` slots each."""
    P = G * per_gpu
    load = {s: p / p.sum(axis=1, keepdims=True) for s, p in pops.items()}
    place = {s: rebalance_experts(p, P, 1, 1, G)[0] for s, p in load.items()}

    def imbalance(p2l, pop):
        rep = np.stack([np.bincount(r, minlength=pop.shape[1]) for r in p2l])
        per_slot = np.take_along_axis(pop / rep, p2l, axis=1)  # (L, P)
        gpu = per_slot.reshape(len(p2l), G, per_gpu).sum(axis=2)
        return float(np.mean(gpu.max(axis=1) / gpu.mean(axis=1)))

    fresh = np.mean([imbalance(place[s], load[s]) for s in load])
    stale = np.mean([imbalance(place[a], load[b]) for a in load for b in load if a != b])
    return float(fresh), float(stale)


def mixtral(out: dict, steps: int, fixed, variants) -> None:
    """Mixtral-8x7B EP8, the MMLU subjects' recorded popularity in turn."""
    G, N, slots, per_gpu = MIXTRAL_SHAPE
    rows = []
    for variant in variants:
        pops = load_mixtral_popularity(MIXTRAL, variant=variant)
        for g, k in MIXTRAL_LAYOUTS:
            fresh, stale = _stale_balance(pops, g, k)
            rows.append(dict(variant=variant, gpus=g, slots_per_gpu=k, fresh=fresh, stale=stale))
    out["mixtral_layouts"] = rows
    print("\nMixtral layouts: busiest GPU / mean under EPLB's even split, placement fitted to "
          "the subject served (fresh) or to another subject (stale), mean over layers")  # fmt: skip
    for r in rows:
        print(f"  {r['variant']:<9s} EP{r['gpus']} x {r['slots_per_gpu']} slots per GPU: "
              f"fresh {r['fresh']:.3f}, stale {r['stale']:.3f}")  # fmt: skip
    out["mixtral"] = []
    for variant in variants:
        pops = load_mixtral_popularity(MIXTRAL, variant=variant)
        models = [RoutingModel.recorded(p[None], top_k=2, layers=2) for p in pops.values()]
        kw = dict(preset="mixtral_8x7b", n_gpus=G, n_nodes=N, layers=2,
                  replication=float(per_gpu))  # fmt: skip
        dt = _full_step_s(DeploymentConfig(routing=models[0], **kw), slots)
        # two paces: the seven subjects within the run, and each subject as long as each
        # ESFT task of the "real drift" table (a quarter of the run), the run 7/4 as long
        for n, pace in ((steps, "run / 7"), (7 * steps // 4, "ESFT's pace")):
            every = n * dt / 7
            dep = DeploymentConfig(seed=7, routing=RoutingSequence(models, every_s=every), **kw)
            label = (f"mixtral_8x7b EP8 x {per_gpu} slots, MMLU subjects ({variant}) in turn, "
                     f"{every:.1f} s each ({pace}, {n} steps)")  # fmt: skip
            first = variant == variants[0] and n == steps
            out["mixtral"].append(
                _compare(label, dep, _trace(n, G, slots, 7), fixed, n, slots,
                         figure=f"mixtral_{variant}" if first else None)
            )  # fmt: skip


def _full_step_s(dep: DeploymentConfig, slots: int) -> float:
    """Seconds of one step at full load (every slot busy, ~1200 tokens of KV each)."""
    from straggler.sim.engine.deployment import StepModel

    m = StepModel(dep)
    G = dep.n_gpus
    return float(np.mean([m.step(np.full(G, 1200 * slots), np.full(G, slots), 0.0).total_us
                          for _ in range(20)]) * 1e-6)  # fmt: skip


def rank_lost(out: dict, steps: int) -> None:
    preset, G, N, slots = SHAPES["dsv3"]
    down, up = steps // 4, steps // 2
    dep = DeploymentConfig(preset=preset, n_gpus=G, n_nodes=N, layers=2, drift=1.0,
                           drift_steps=2000, seed=6, rebalance="never",
                           rank_events=((down, 5, False), (up, 5, True)))  # fmt: skip
    move = MoveCost(expert_bytes=dep.preset.expert_bytes, mode="sync")
    res = rebalance_loop(_trace(steps, G, slots, 6), dep, ["never", "sglang", "vllm", "auto"],
                         move=move, **_sim_kw(slots, steps))  # fmt: skip
    events = {k: [e for e in r.rebalances if e["forced"]] for k, r in res.reports.items()}
    out["rank_lost"] = dict(note=res.note, rows=res.rows, forced=events)
    _plot(res, "rank_lost", f"DeepSeek-V3 EP32, rank 5 lost after {down} steps, back after {up}")
    print(f"\nrank 5 lost after {down} steps, back after {up}: {res.note}")
    print(res.format())
    for k, evs in events.items():
        print(f"  {k}: " + "; ".join(
            f"step {e['step']}: {e['copies']:,.0f} copies, stall {e['stall_s']:.2f} s"
            for e in evs))  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and clocks (smoke run)")
    ap.add_argument("--full", action="store_true", help="every drift, ESFT, a rank lost")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default 6000)")
    ap.add_argument("--tables", default=None,
                    help="comma list of tables to run: planning, direction, held_out, esft, "
                    "rank_lost, mixtral (default: the first three and mixtral; --full: "
                    "all)")  # fmt: skip
    ap.add_argument("--no-plots", action="store_true", help="no figures")
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="folder for the JSON and figures (default $STRAGGLER_RESULTS, else "
                    "./straggler-results)")  # fmt: skip
    args = ap.parse_args(argv)
    args.out = str(args.out or results_dir())
    if not args.no_plots:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is not None:
            _FIGURES["dir"] = args.out
    steps = args.steps or (1500 if args.quick else 10000 if args.full else 6000)
    fixed = QUICK_FIXED if args.quick else FIXED
    t0 = time.perf_counter()
    warm_engine()
    warm_placement()
    out: dict = dict(
        benchmark="rebalance_loop", run=run_info(), args=vars(args),
        note="shared 2-core machine: times noisy; comparisons within one invocation",
        steps=steps, training_drift="dsv3 EP32, seed 1, N(0,1) every 2000 steps",
    )  # fmt: skip
    tables = TABLES if args.full else TABLES[:3] + ("mixtral",)
    if args.tables is not None:
        tables = [t.strip() for t in args.tables.split(",") if t.strip()]
        bad = [t for t in tables if t not in TABLES]
        if bad or not tables:
            ap.error(f"--tables takes a comma list of {', '.join(TABLES)}; got {args.tables!r}")
    if "planning" in tables:
        planning(out)
    if "direction" in tables:
        direction(out, steps)
    if "held_out" in tables:
        held_out(out, steps, fixed, HELD_OUT if args.full else HELD_OUT[:1])
    if "esft" in tables:
        real_drift(out, steps, fixed)
    if "rank_lost" in tables:
        rank_lost(out, steps)
    if "mixtral" in tables:
        mixtral(out, steps, fixed, ("original", "instruct") if args.full else ("original",))
    out["wall_s"] = time.perf_counter() - t0
    met = [m["check"]["met"] for h in out.get("held_out", []) for m in h["modes"].values()]
    if "real_drift" in out:
        met += [m["check"]["met"] for m in out["real_drift"]["modes"].values()]
    met += [m["check"]["met"] for h in out.get("mixtral", []) for m in h["modes"].values()]
    out["all_checks_met"] = bool(all(met)) if met else None
    checks = f"checks met: {sum(met)}/{len(met)}" if met else "no checks in these tables"
    print(f"\n{checks}; {out['wall_s']:.0f} s")
    name = "rebalance_loop" + ("_quick" if args.quick else "_full" if args.full else "")
    if args.tables is not None:
        name += "_" + "_".join(tables)
    path = out_file(args.out, name + ".json")
    path.write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
