"""What each part of BR-S costs or buys: the default policy's options varied over the load sweep.

Every variant runs BR-S (``policy="brs"`` with the variant's options) on the main sweep's grid
(``routing_load_sweep.py``: 7 traces x G = 8, 16, 32 x load 0.2-1.5, the first 8,000 requests,
prefill sized to twice the decode capacity) and is judged, cell by cell, by the sweep's own
goals (``routing_load_sweep.goals``) against the JSQ and BR-0 cells of a sweep JSON written by
``routing_load_sweep.py`` with the same simulator (``--reference``, default
``benchmarks/results/routing_load_sweep.json``); with another ``--requests`` (a shorter prefix
of the same traces: how sensitive a verdict is to the exact run) the JSQ and BR-0 cells are run
here too. The variants isolate:

* ``patience`` (JSQ until a backlog; default 128 ticks): lower values route short bursts below
  saturation by F-score too;
* the starvation guard: ``age_fraction`` (the window spans this fraction of the oldest wait,
  default 0.1), and no guard at all (``age_window`` 10**6, ``age_fraction`` 1, ``window`` 0);
* ``window`` (the k * S_tot oldest; 0: no count limit) and ``safe`` (JSQ's decision kept when
  it leaves no larger one-tick imbalance).

Writes ``straggler-results/routing_brs_ablation.json`` and prints one row per variant: cells
missing each goal, the saturated (load >= 1.0) median imbalance ratio, the worst TTFT p99
ratio at load >= 1.0. One process, about 10 s per variant on a shared 2-core machine.

    python benchmarks/routing_brs_ablation.py [--variants default,no_guard] [--requests 8000]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from routing_load_sweep import GOAL_SAT, goals
from straggler.sim.experiments.load_sweep import load_sweep_cell, traces_dir

RESULTS = results_dir()
#: The recorded load sweep the variants are judged against (read, never written).
REFERENCE = pathlib.Path(__file__).resolve().parent / "results" / "routing_load_sweep.json"
NO_GUARD = {"age_window": 10**6, "age_fraction": 1.0, "window": 0}
VARIANTS = {
    "default": {},
    "window_0": {"window": 0},
    "age_fraction_0.25": {"age_fraction": 0.25},
    "age_fraction_0.5": {"age_fraction": 0.5},
    "age_fraction_1": {"age_fraction": 1.0},
    "no_guard": NO_GUARD,
    "unsafe": {"safe": False},
    "patience_32": {"patience": 32},
    "patience_64": {"patience": 64},
    "patience_256": {"patience": 256},
    "patience_0": {"patience": 0},
    "patience_0_no_guard": {"patience": 0, **NO_GUARD},
}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--reference", default=str(REFERENCE))
    ap.add_argument("--out", default=str(RESULTS / "routing_brs_ablation.json"))
    args = ap.parse_args(argv)
    ref = json.loads(pathlib.Path(args.reference).read_text())
    cfg = dict(ref["config"])
    traces, Gs, loads = cfg["traces"], cfg["G"], cfg["loads"]
    directory = str(traces_dir().resolve())
    same = cfg["requests"] == args.requests
    if same:
        base = {
            (c["trace"], int(c["n_replicas"]), float(c["load"]), c["policy"]): c
            for c in ref["cells"]
            if c["policy"] in ("jsq", "br0")
        }
    else:  # another prefix: the baselines' cells are run here
        cfg["requests"] = args.requests
        base = {
            (tr, G, load, p): load_sweep_cell(
                tr, G, load, p, args.requests, "sized", 0, directory, load_basis="decode"
            )
            for tr in traces
            for G in Gs
            for load in loads
            for p in ("jsq", "br0")
        }
    rows = []
    head = (
        f"{'variant':22s} {'cells met':>9s} {'imb':>4s} {'tpot':>4s} {'ttft':>4s} {'thr':>4s} "
        f"{'sat. median':>11s} {'TTFT99 max':>10s} {'s':>5s}"
    )
    print(head)
    for name in args.variants.split(","):
        opts = VARIANTS[name]
        t0 = time.perf_counter()
        by = dict(base)
        for tr in traces:
            for G in Gs:
                for load in loads:
                    by[(tr, G, load, "brs")] = load_sweep_cell(
                        tr, G, load, "brs", args.requests, "sized", 0, directory,
                        json.dumps(opts), load_basis="decode",
                    )  # fmt: skip
        g = goals(by, traces, Gs, loads, "brs")
        miss = {
            k: sum(k in c["missed"] for c in g["cells"])
            for k in ("imbalance", "tpot_p95", "ttft_p99", "throughput_vs_br0")
        }
        ttft = max(c["ttft_p99_vs_jsq"] for c in g["cells"] if c["load"] >= 1.0)
        row = {
            "variant": name,
            "options": opts,
            "n_cells": g["n_cells"],
            "n_cells_met": g["n_cells_met"],
            "missed": miss,
            "saturated_median_imbalance_vs_jsq": g["saturated_median_imbalance_vs_jsq"],
            "saturated_ttft_p99_vs_jsq_max": ttft,
            "wall_s": time.perf_counter() - t0,
            "cells": g["cells"],
        }
        rows.append(row)
        print(
            f"{name:22s} {g['n_cells_met']:>4d}/{g['n_cells']:<4d} {miss['imbalance']:>4d} "
            f"{miss['tpot_p95']:>4d} {miss['ttft_p99']:>4d} {miss['throughput_vs_br0']:>4d} "
            f"{g['saturated_median_imbalance_vs_jsq']:>11.3f} {ttft:>10.3f} {row['wall_s']:>5.0f}",
            flush=True,
        )
    out = {
        "benchmark": "routing_brs_ablation",
        "reference": pathlib.Path(args.reference).name if same else "jsq and br0 run here",
        "config": {**cfg, "policies": ["brs (variants)"], "goal_saturated_median": GOAL_SAT},
        "variants": rows,
    }
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
