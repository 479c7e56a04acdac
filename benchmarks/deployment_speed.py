"""Deployment simulator speed: one-hour Azure conversation replay, G = 8, 4 simulated layers.

Goal: under 2 minutes on 2 cores with tempo tables refreshed every 200 ms of simulated time.
Runs, side by side in one process after a warm-up (compile time reported apart): the
deployment step with the MoE term off (attention and dense layers only: the engine's own
cost), the MoE term with EPLB's even split, and with tempo tables, each both ways a step can
run (``StepModel.fused``: one kernel call per step, and the step-by-step Python path, which
was the only path before the kernel; the two must give bit-identical series, checked here).
The per-layer cost of the MoE term is ``(wall / steps of the run - wall / steps of the
MoE-off run) / layers`` (it includes the routing stream's draws and, for tempo, the table
refreshes, amortized). Falls back to one hour of the shipped generator when the trace is
absent.

    python benchmarks/deployment_speed.py [--preset qwen3_235b] [--layers 4] [--requests N]
        [--no-python]

Writes ``straggler-results/deployment_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.sim import generate_trace, load_trace, simulate
from straggler.sim.engine.deployment import DeploymentConfig, StepModel
from straggler.sim.workloads.traces import Trace

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRACE = ROOT / ".." / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3_235b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--requests", type=int, default=0, help="first N requests (0: all)")
    ap.add_argument("--out", default=str(results_dir() / "deployment_speed.json"))
    ap.add_argument("--no-python", action="store_true", help="skip the Python-path runs")
    args = ap.parse_args(argv)
    trace = load_trace(TRACE) if TRACE.exists() else generate_trace("azure_conv", duration_s=3600)
    if args.requests:
        trace = trace.subset(list(range(args.requests)))
    G = 8
    t = time.perf_counter()
    tiny = Trace(arrival_s=[0.0, 0.0], prompt_len=[50, 50], output_len=[3, 3])
    for d in ("even", "tempo"):
        simulate(tiny, "jsq", n_replicas=G, deployment=DeploymentConfig(
            preset=args.preset, n_gpus=G, layers=args.layers, dispatch=d))  # fmt: skip
    compile_s = time.perf_counter() - t
    runs = [
        ("moe_off", dict(moe=False), True),
        ("even", dict(dispatch="even"), True),
        ("tempo_200ms", dict(dispatch="tempo", dispatch_period_s=0.2), True),
    ]
    if not args.no_python:
        runs += [
            ("even_python", dict(dispatch="even"), False),
            ("tempo_200ms_python", dict(dispatch="tempo", dispatch_period_s=0.2), False),
        ]
    series = {}
    rows = {}
    print(f"{trace.name}: {len(trace):,} requests, G = {G}, {args.preset}, {args.layers} layers;"
          f" warm-up (compile + first solves) {compile_s:.1f} s")  # fmt: skip
    head = f"{'run':18s} | {'wall s':>7s} | {'steps':>7s} | {'us/step':>8s} | "
    print(head + f"{'MoE us/layer/step':>17s} | {'tok/s':>7s} | {'TPOT p99 ms':>11s} | refreshes")
    for name, kw, fused in runs:
        dep = DeploymentConfig(preset=args.preset, n_gpus=G, layers=args.layers, **kw)
        StepModel.fused = fused
        t = time.perf_counter()
        try:
            r = simulate(trace, "jsq", n_replicas=G, deployment=dep)
        finally:
            StepModel.fused = True
        wall = time.perf_counter() - t
        series[name] = r.series
        rows[name] = dict(
            fused=fused,
            wall_s=wall,
            engine_wall_s=r.wall_s,
            n_steps=r.n_steps,
            us_per_step=1e6 * wall / max(r.n_steps, 1),
            throughput_tps=r.throughput_tps,
            tpot_p99_ms=r.tpot_p99_ms,
            step_breakdown=r.step_breakdown,
        )
        off = rows["moe_off"]["us_per_step"]
        rows[name]["moe_us_per_layer_step"] = (rows[name]["us_per_step"] - off) / args.layers
        print(f"{name:18s} | {wall:7.1f} | {r.n_steps:7,d} | {rows[name]['us_per_step']:8.1f} | "
              f"{rows[name]['moe_us_per_layer_step']:17.1f} | {r.throughput_tps:7,.0f} | "
              f"{r.tpot_p99_ms:11.2f} | {r.step_breakdown.get('table_refreshes', 0)}")  # fmt: skip
    for name in [n for n, _, fused in runs if not fused]:
        fast = series[name.removesuffix("_python")]
        same = fast.keys() == series[name].keys() and all(
            np.array_equal(fast[k], series[name][k], equal_nan=True) for k in fast
        )
        rows[name]["identical_to_fused"] = same
        ratio = rows[name]["wall_s"] / rows[name.removesuffix("_python")]["wall_s"]
        rows[name]["wall_over_fused"] = ratio
        print(f"{name}: series identical to the fused run: {same}; wall {ratio:.2f}x the fused")
    out = dict(
        trace=trace.name, n_requests=len(trace), n_gpus=G, preset=args.preset,
        layers=args.layers, compile_s=compile_s, runs=rows,
        goal="tempo_200ms wall < 120 s on 2 cores",
        goal_met=rows["tempo_200ms"]["wall_s"] < 120.0,
    )  # fmt: skip
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(
        f"goal (tempo tables, < 120 s): {'met' if out['goal_met'] else 'NOT met'}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
