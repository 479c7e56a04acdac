"""Routing across offered load: every policy, every shipped trace and the generated workload.

Grid: traces (``straggler.sim.experiments.load_sweep.SWEEP_TRACES``: Azure conversation and code,
Mooncake
conversation and synthetic, ShareGPT, arXiv, the generated ``bursty`` workload; the first
``--requests`` of each) x G = 8, 16, 32 x load 0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.5 (multiples of
the cluster's decode capacity, ``straggler.sim.decode_capacity``: ``load_basis="decode"``,
pinned, as the recorded figures were made) x every registered policy,
16 slots per replica, 500k KV tokens, the default step time, prefill sized to twice the decode
capacity (``load_sweep_cell(prefill="sized")``), BR-H with the survival predictor at H = 80.
The cells run through ``straggler.sim.experiments.sweep`` (a local process pool; resumable: the
journal
is ``straggler-results/routing_load_sweep.csv.cells.jsonl``).

It prints, per trace, G and load, each policy's mean imbalance (whole run) as a multiple of
JSQ's (with a row saying which stage binds at each load: ``PRE`` marks a prefill-bound cell,
where decode slots are not the bottleneck), and then the default policy's goals cell by cell:
mean imbalance <= 1.01x JSQ's and TPOT p95 <= 1.01x JSQ's everywhere; at load >= 1.0 the
median imbalance ratio <= 0.25, TTFT p99 <= 1.0x JSQ's and throughput >= BR-0's. Writes
``straggler-results/routing_load_sweep.json`` (every cell, the goal verdicts) and a PNG
(``--plot``, default ``straggler-results/routing_load_sweep.png``): imbalance ratio vs load,
one line per policy, one panel per trace (rows: G).

    python benchmarks/routing_load_sweep.py [--quick] [--workers 2] [--requests 8000]
        [--compare OTHER.json]

``--compare``: after the run, every cell's results compared field by field with the same cell
of another run's JSON (an older checkout's, say: results unchanged means 0 fields differ);
the fields that measure the machine (``wall_s``, ``sched_us_p99``) and the trace folder are
left out, as are fields one of the two runs does not have. The count is printed and stored
under ``compared_with``.

``--quick``: Azure conversation and the generated workload, G = 8, loads 0.4 / 1.0 / 1.5,
2,000 requests (about a minute).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import statistics
import time

from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.sim import sweep
from straggler.sim.experiments.load_sweep import SWEEP_TRACES, load_sweep_cell, traces_dir
from straggler.solvers import DEFAULT_POLICY, routing_policies

RESULTS = results_dir()
LOADS = (0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.5)
GOAL_RATIO, GOAL_SAT = 1.01, 0.25


def _cells(table):
    rows = [dict(zip(table.columns, r)) for r in zip(*(table.column(c) for c in table.columns))]
    by = {}
    for r in rows:
        by[(r["trace"], int(r["n_replicas"]), float(r["load"]), r["policy"])] = r
    return by


def _stage(cell) -> str:
    """A cell's binding stage for the tables: ``PRE`` (prefill-bound), ``dec``, or ``?`` for
    a cell journaled before cells carried it."""
    return {"prefill": "PRE", "decode": "dec"}.get(cell.get("binding_stage", ""), "?")


def goals(by, traces, Gs, loads, default):
    """The default policy's verdicts, cell by cell."""
    cells, sat = [], []
    for tr in traces:
        for G in Gs:
            for load in loads:
                d, j = by[(tr, G, load, default)], by[(tr, G, load, "jsq")]
                b = by.get((tr, G, load, "br0"))
                c = {
                    "trace": tr,
                    "G": G,
                    "load": load,
                    "imbalance_vs_jsq": float(d["mean_imbalance"] / max(j["mean_imbalance"], 1e-9)),
                    "tpot_p95_vs_jsq": float(d["tpot_p95_ms"] / j["tpot_p95_ms"]),
                    "ttft_p99_vs_jsq": float(d["ttft_p99_ms"] / j["ttft_p99_ms"]),
                    "throughput_vs_br0": float(d["throughput_tps"] / b["throughput_tps"])
                    if b
                    else 1.0,
                    "n_unfinished": int(d["n_unfinished"]),
                    "binding_stage": str(d.get("binding_stage", "")),
                }
                miss = []
                if c["imbalance_vs_jsq"] > GOAL_RATIO:
                    miss.append("imbalance")
                if c["tpot_p95_vs_jsq"] > GOAL_RATIO:
                    miss.append("tpot_p95")
                if load >= 1.0:
                    sat.append(c["imbalance_vs_jsq"])
                    if c["ttft_p99_vs_jsq"] > 1.0:
                        miss.append("ttft_p99")
                    if c["throughput_vs_br0"] < 1.0:
                        miss.append("throughput_vs_br0")
                c["missed"] = miss
                cells.append(c)
    med = statistics.median(sat) if sat else math.nan
    return {
        "cells": cells,
        "saturated_median_imbalance_vs_jsq": float(med),
        "saturated_median_met": bool(med <= GOAL_SAT),
        "n_cells": len(cells),
        "n_cells_met": sum(not c["missed"] for c in cells),
    }


def plot(by, traces, Gs, loads, policies, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(Gs), len(traces), figsize=(3.1 * len(traces), 2.6 * len(Gs)), squeeze=False
    )
    cmap = matplotlib.colormaps["tab10"]
    for r, G in enumerate(Gs):
        for c, tr in enumerate(traces):
            ax = axes[r][c]
            for k, p in enumerate(policies):
                y = [
                    by[(tr, G, x, p)]["mean_imbalance"] / by[(tr, G, x, "jsq")]["mean_imbalance"]
                    for x in loads
                ]
                ax.plot(
                    loads,
                    y,
                    marker="o",
                    ms=3,
                    lw=2.2 if p == DEFAULT_POLICY else 1.0,
                    color=cmap(k % 10),
                    ls="-" if k < 10 else "--",
                    label=p + (" (default)" if p == DEFAULT_POLICY else ""),
                )
            ax.axhline(1.0, color="k", lw=0.6)
            ax.set_yscale("log")
            ax.set_title(f"{tr}, G={G}", fontsize=9)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel("imbalance / JSQ's")
            if r == len(Gs) - 1:
                ax.set_xlabel("offered load (x decode capacity)")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


#: Cell fields that measure the machine or name a folder, not the routing.
_NOT_COMPARED = {"wall_s", "sched_us_p99", "directory"}
#: The fields that name a cell.
_KEY = {"trace", "n_replicas", "load", "policy"}


def compare_cells(cells, other, name: str) -> dict:
    """``cells`` against ``other`` (another run's cells), matched by trace, G, load and policy:
    how many fields both have (:data:`_NOT_COMPARED` left out) and how many differ (NaN equals
    NaN)."""

    def key(c):
        return (c["trace"], c["n_replicas"], c["load"], c["policy"])

    here = {key(c): c for c in cells}
    there = {key(c): c for c in other}
    fields = differ = 0
    first = []
    for k in here.keys() & there.keys():
        for f in (here[k].keys() & there[k].keys()) - _NOT_COMPARED:
            fields += 1
            a, b = here[k][f], there[k][f]
            if a != b and not (isinstance(a, float) and isinstance(b, float) and a != a and b != b):
                differ += 1
                if len(first) < 10:
                    first.append([*k, f, a, b])
    return {
        "other": name,
        "cells": len(here.keys() & there.keys()),
        "only_here": len(here.keys() - there.keys()),
        "only_there": len(there.keys() - here.keys()),
        "fields": fields,
        "differ": differ,
        "first_differences": first,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--backend", default="process")
    ap.add_argument("--plot", default=str(RESULTS / "routing_load_sweep.png"))
    ap.add_argument("--out", default=str(RESULTS / "routing_load_sweep.json"))
    ap.add_argument(
        "--resume",
        action="store_true",
        help="reuse the cells journaled next to the CSV by an interrupted run of the same code "
        "(off by default: a journal written before a change to the library would stand in for "
        "the new code's results)",
    )
    ap.add_argument(
        "--first",
        type=int,
        default=0,
        help="start at this request (the held-out check: --first 8000 on the traces that have "
        "16,000 requests, after the defaults were chosen on the first 8,000)",
    )
    ap.add_argument("--traces", default=None, help="comma-separated subset of the traces")
    ap.add_argument("--compare", default=None, help="another run's JSON, compared cell by cell")
    args = ap.parse_args(argv)
    other = None
    if args.compare is not None:  # read before the sweep: a bad file fails at once
        try:
            data = json.loads(pathlib.Path(args.compare).read_text())
            other = data.get("cells") if isinstance(data, dict) else None
            if not isinstance(other, list):
                raise ValueError("no list of cells under 'cells'")
            if not all(isinstance(c, dict) and _KEY <= c.keys() for c in other):
                raise ValueError(f"a cell without the fields {sorted(_KEY)}")
        except (OSError, ValueError) as e:
            ap.exit(2, f"routing_load_sweep: --compare must be a JSON file of this script: {e}\n")
    policies = routing_policies()
    if args.quick:
        traces, Gs, loads, n = ["azure_conv", "generated"], [8], [0.4, 1.0, 1.5], 2000
    else:
        traces, Gs, loads, n = list(SWEEP_TRACES), [8, 16, 32], list(LOADS), args.requests
    if args.traces:
        traces = args.traces.split(",")
    directory = str(traces_dir().resolve())
    t0 = time.perf_counter()
    RESULTS.mkdir(exist_ok=True)
    csv = pathlib.Path(args.out).with_suffix(".csv")
    table = sweep(
        load_sweep_cell,
        {"trace": traces, "n_replicas": Gs, "load": loads, "policy": policies},
        fixed={
            "n_requests": n,
            "prefill": "sized",
            "load_basis": "decode",
            "seed": 0,
            "directory": directory,
            "first": args.first,
        },
        backend=args.backend,
        workers=args.workers,
        path=None if args.quick else csv,
        resume=args.resume,
        desc="routing load sweep",
    )
    wall = time.perf_counter() - t0
    by = _cells(table)
    for tr in traces:
        for G in Gs:
            print(f"\n{tr}, G={G}: mean imbalance (whole run) as a multiple of JSQ's")
            print(f"{'policy':14s}" + "".join(f"{x:>7.1f}x" for x in loads))
            print(
                f"{'binding stage':14s}"
                + "".join(f"{_stage(by[(tr, G, x, 'jsq')]):>8s}" for x in loads)
            )
            print(
                f"{'jsq (tokens)':14s}"
                + "".join(f"{by[(tr, G, x, 'jsq')]['mean_imbalance'] / 1e3:>7.0f}k" for x in loads)
            )
            for p in policies:
                if p == "jsq":
                    continue
                row = [
                    by[(tr, G, x, p)]["mean_imbalance"] / by[(tr, G, x, "jsq")]["mean_imbalance"]
                    for x in loads
                ]
                mark = " *" if p == DEFAULT_POLICY else ""
                print(f"{p + mark:14s}" + "".join(f"{v:8.2f}" for v in row))
    g = goals(by, traces, Gs, loads, DEFAULT_POLICY)
    print(
        f"\ndefault policy {DEFAULT_POLICY!r}: {g['n_cells_met']}/{g['n_cells']} cells meet "
        "every per-cell goal; saturated (load >= 1.0) median imbalance "
        f"{g['saturated_median_imbalance_vs_jsq']:.3f}x JSQ's (goal <= {GOAL_SAT})"
    )
    head = (
        f"{'trace':15s} {'G':>3s} {'load':>5s} {'imb/JSQ':>8s} {'TPOT95/JSQ':>10s} "
        f"{'TTFT99/JSQ':>10s} {'thr/BR-0':>8s} {'binds':>6s}  missed"
    )
    print(head)
    for c in g["cells"]:
        if c["missed"]:
            print(
                f"{c['trace']:15s} {c['G']:3d} {c['load']:5.1f} {c['imbalance_vs_jsq']:8.3f} "
                f"{c['tpot_p95_vs_jsq']:10.3f} {c['ttft_p99_vs_jsq']:10.3f} "
                f"{c['throughput_vs_br0']:8.3f} {_stage(c):>6s}  {', '.join(c['missed'])}"
            )
    out = {
        "benchmark": "routing_load_sweep",
        "config": {
            "traces": traces,
            "G": Gs,
            "loads": loads,
            "requests": n,
            "policies": policies,
            "default_policy": DEFAULT_POLICY,
            "prefill": "sized (2x decode capacity)",
            "max_slots": 16,
            "kv_capacity": 500_000,
            "predictor (brh)": "survival, H = 80",
        },
        "wall_s": wall,
        "goals": g,
        "cells": [
            dict(zip(table.columns, r))
            for r in zip(*(table.column(c).tolist() for c in table.columns))
        ],
    }
    if other is not None:
        out["compared_with"] = compare_cells(out["cells"], other, args.compare)
        c = out["compared_with"]
        print(
            f"\ncompared with {args.compare}: {c['cells']} cells in both ({c['only_here']} only "
            f"here, {c['only_there']} only there), {c['fields']} fields, {c['differ']} differ"
        )
        for d in c["first_differences"]:
            print("  ", d)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out} ({wall:.0f} s)")
    if args.plot:
        try:
            plot(by, traces, Gs, loads, policies, args.plot)
            print(f"wrote {args.plot}")
        except ImportError:
            print("(matplotlib not installed: no plot)")
    return out


if __name__ == "__main__":
    main()
