"""Simulator speed: a one-hour Azure conversation replay (19,366 requests), G = 8, per policy.

Goal: <= 5 s per policy. Each policy is run once to compile (reported separately), then timed
``--repeat`` times (best and median of the engine's wall time, and of the whole ``simulate``
call). Falls back to one hour of the shipped generator when the trace is absent.

    python benchmarks/sim_speed.py [--repeat 3] [--saturated]

Writes ``straggler-results/sim_speed.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.sim import generate_trace, load_trace, simulate
from straggler.sim.workloads.traces import find_trace

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: the trace: the package's copy, or the file in ``$STRAGGLER_TRACES`` (``find_trace``)
TRACE = find_trace("AzureLLMInferenceTrace_conv.csv")
POLICIES = [
    ("brs", {}),
    ("random", {}),
    ("round_robin", {}),
    ("p2c", {}),
    ("jsq", {}),
    ("jsq_requests", {}),
    ("vllm", {}),
    ("trtllm", {}),
    ("br0", {}),
    ("brh", {"predictor": "survival"}),
    ("brh", {"predictor": "exact_match"}),
    ("brh", {"predictor": "oracle"}),
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--saturated", action="store_true")
    args = ap.parse_args(argv)
    if TRACE.exists():
        trace = load_trace(TRACE)
    else:
        trace = generate_trace("azure_conv", duration_s=3600)
    rows = {}
    print(
        f"trace {trace.name}: {len(trace):,} requests, {trace.duration_s / 60:.0f} min, G = 8, "
        f"saturated={args.saturated}"
    )
    print(
        f"{'policy':18s} {'compile+run s':>13s} {'engine best s':>13s} {'engine med s':>12s} "
        f"{'simulate med s':>14s} {'steps':>8s} {'Msteps/s':>8s} {'<= 5 s':>6s}"
    )
    for pol, extra in POLICIES:
        t = time.perf_counter()
        r = simulate(trace, pol, saturated=args.saturated, load_basis="decode", **extra)
        first = time.perf_counter() - t
        eng, tot = [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            r = simulate(trace, pol, saturated=args.saturated, load_basis="decode", **extra)
            tot.append(time.perf_counter() - t)
            eng.append(r.wall_s)
        label = r.policy
        rows[label] = {
            "first_call_s": first,
            "engine_best_s": min(eng),
            "engine_median_s": statistics.median(eng),
            "simulate_median_s": statistics.median(tot),
            "n_steps": r.n_steps,
            "n_ticks": r.n_ticks,
        }
        ok = statistics.median(tot) <= 5.0
        print(
            f"{label:18s} {first:13.2f} {min(eng):13.3f} {statistics.median(eng):12.3f} "
            f"{statistics.median(tot):14.3f} {r.n_steps:8,d} "
            f"{r.n_steps / min(eng) / 1e6:8.2f} {'yes' if ok else 'NO':>6s}"
        )
    out = results_dir() / "sim_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "trace": trace.name,
                "n_requests": len(trace),
                "saturated": args.saturated,
                "rows": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
