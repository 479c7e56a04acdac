"""The EPLB versions side by side: DeepSeek's (stable sort), SGLang's copy, SGLang's
``deepseek_vec`` and vLLM's port, judged on the NEXT window.

For each cell (model shape, EP32 on 4 nodes, tokens per GPU ``B``, Zipf skew ``s``,
replication ``r``), a window of ``--window`` routed batches (Dirichlet kappa 2000 around a
Zipf popularity, ``--layers`` layers) builds one placement per version: ``deepseek``,
``sglang`` and ``vllm`` from the window's summed loads, ``sglang_vec`` from the window as
its steps (as SGLang's recorder hands it over). Each placement is scored on the next
``--window`` batches with EPLB's own dispatch model (tokens split evenly over an expert's
replicas): the largest GPU load over the mean GPU load, per layer and batch, averaged.
Placement time is measured side by side in one run (shared 2-core machine: ratios).

The question: how SGLang's ``deepseek_vec`` relates to DeepSeek's EPLB (it is
another algorithm, reported with a higher max GPU load). Every version is the exact port
checked against the released engines in ``tests/conformance``.

Usage::

    python benchmarks/eplb_versions.py --quick
    python benchmarks/eplb_versions.py
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.sim.workloads.batches import (
    SHAPES,
    num_physical_slots,
    sample_counts,
    zipf_popularity,
)
from straggler.solvers.placement.eplb import rebalance_experts

RESULTS = results_dir()
VERSIONS = ("deepseek", "sglang", "sglang_vec", "vllm")


def _max_over_mean(batches, p2l, cnt, g):
    """Mean over held-out batches and layers of max GPU load / mean GPU load (even split)."""
    vals = []
    for c in batches:
        for layer in range(p2l.shape[0]):
            per_slot = c[layer, p2l[layer]] / cnt[layer, p2l[layer]]
            gpu = per_slot.reshape(g, -1).sum(axis=1)
            if gpu.sum() > 0:
                vals.append(gpu.max() / gpu.mean())
    return float(np.mean(vals))


def cell(shape, g, B, s, r, window, layers, seed):
    sh = SHAPES[shape]
    rng = np.random.default_rng([seed, g, B, round(s * 100), round(r * 100)])
    pop = zipf_popularity(sh.n_experts, s, n_layers=layers, rng=rng)
    draw = [sample_counts(pop, n_tokens=B * g, top_k=sh.top_k, rng=rng) for _ in range(2 * window)]
    build, held = np.stack(draw[:window]), draw[window:]
    P = num_physical_slots(sh.n_experts, g, r)
    groups = sh.n_groups if sh.n_experts % sh.n_groups == 0 else 1
    nodes = 4
    row = {"shape": shape, "ep": g, "B": B, "skew": s, "replication": r, "slots": P}
    score, secs = {}, {}
    for v in VERSIONS:
        w = build if v == "sglang_vec" else build.sum(axis=0)
        t0 = time.perf_counter()
        p2l, _, cnt = rebalance_experts(w, P, groups, nodes, g, version=v)
        secs[v] = time.perf_counter() - t0
        score[v] = _max_over_mean(held, p2l, cnt, g)
    row["max_over_mean"] = score
    row["time_s"] = secs
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--window", type=int, default=16, help="batches per window")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--out", default=str(RESULTS / "eplb_versions.json"))
    args = ap.parse_args(argv)
    cells = [
        (shape, 32, B, s, r)
        for shape in (("dsv3",) if args.quick else ("dsv3", "qwen3_235b"))
        for B in (64, 1024)
        for s in (0.6, 1.2)
        for r in ((1.125,) if args.quick else (1.125, 1.25))
    ]
    cell("dsv3", 8, 16, 1.0, 1.25, 2, 1, 1)  # warm-up, untimed
    head = "".join(f"{v:>11}" for v in VERSIONS)
    print(f"{'shape':>10} {'EP':>3} {'B':>5} {'s':>4} {'r':>6} {'P':>4}  max/mean GPU load:{head}"
          f"  vec/ds  t vec/ds")  # fmt: skip
    rows = []
    for c in cells:
        row = cell(*c, args.window, args.layers, 0)
        rows.append(row)
        m, t = row["max_over_mean"], row["time_s"]
        vals = "".join(f"{m[v]:>11.4f}" for v in VERSIONS)
        print(
            f"{row['shape']:>10} {row['ep']:>3} {row['B']:>5} {row['skew']:>4g} "
            f"{row['replication']:>6g} {row['slots']:>4}  {'':>18}{vals}"
            f"  {m['sglang_vec'] / m['deepseek']:>6.4f}  {t['sglang_vec'] / t['deepseek']:>7.2f}"
        )
    ratio = np.array(
        [r["max_over_mean"]["sglang_vec"] / r["max_over_mean"]["deepseek"] for r in rows]
    )
    same = np.array([r["max_over_mean"]["sglang"] / r["max_over_mean"]["deepseek"] for r in rows])
    summary = {
        "vec_over_deepseek_min": float(ratio.min()),
        "vec_over_deepseek_median": float(np.median(ratio)),
        "vec_over_deepseek_max": float(ratio.max()),
        "vec_worse_cells": int((ratio > 1).sum()),
        "cells": len(rows),
        "sglang_over_deepseek_max_abs_dev": float(np.abs(same - 1).max()),
    }
    print(json.dumps(summary))
    RESULTS.mkdir(exist_ok=True)
    out = pathlib.Path(args.out)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "benchmark": "eplb_versions",
                "machine": platform.platform(),
                "note": "shared 2-core machine; times side by side in one run",
                "window": args.window,
                "layers": args.layers,
                "summary": summary,
                "rows": rows,
            },
            indent=1,
        )
    )
    tmp.replace(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
