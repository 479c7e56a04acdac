"""Where BR-S's run-level imbalance differs from JSQ's in one sweep cell (the mechanism check).

One cell of the load sweep (``straggler.sim.experiments.load_sweep.load_sweep_cell``'s setting: the
first
``--requests`` of ``--trace``, prefill sized to twice the decode capacity) is simulated under
JSQ and under BR-S with each ``--patience`` value. For each run it reports the mean imbalance
as a multiple of JSQ's, how many requests went to another replica than under JSQ, the mean
imbalance of both over steps binned by the number of running requests (where the excess
lives: the busy middle of the run or its drain tail), and the mean admission delay against JSQ
by prompt-length percentile (whether BR-S defers the long prompts). Writes
``straggler-results/routing_brs_divergence.json``.

    python benchmarks/routing_brs_divergence.py [--trace azure_code] [--G 16] [--load 0.8]
        [--patience 28,30,31,32,33,34,36,128]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.sim import simulate
from straggler.sim.experiments.load_sweep import sized_prefill_instances, sweep_trace, traces_dir

RESULTS = results_dir()
BINS = ((0, 16), (16, 64), (64, 192), (192, 1 << 30))
PCTS = ((0, 50), (50, 90), (90, 99), (99, 100))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="azure_code")
    ap.add_argument("--G", type=int, default=16)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--patience", default="28,30,31,32,33,34,36,128")
    ap.add_argument("--out", default=str(RESULTS / "routing_brs_divergence.json"))
    args = ap.parse_args(argv)
    tr = sweep_trace(args.trace, args.requests, str(traces_dir().resolve()))
    kw = dict(
        n_replicas=args.G, load=args.load, load_basis="decode",
        prefill_instances=sized_prefill_instances(tr, args.G),
    )  # fmt: skip
    jsq = simulate(tr, "jsq", **kw)
    ij, run = jsq.series["imbalance"], jsq.series["running"]
    p = tr.prompt_len
    rows = []
    print(f"{args.trace}, G={args.G}, load {args.load}: BR-S against JSQ")
    for pat in (int(x) for x in args.patience.split(",")):
        r = simulate(tr, "brs", patience=pat, **kw)
        ib = r.series["imbalance"]
        n = min(ib.size, ij.size)
        bins = []
        for lo, hi in BINS:
            m = (run[:n] >= lo) & (run[:n] < hi)
            bins.append(
                {
                    "running": [lo, hi],
                    "steps": int(m.sum()),
                    "jsq": float(ij[:n][m].mean()) if m.any() else 0.0,
                    "brs": float(ib[:n][m].mean()) if m.any() else 0.0,
                }
            )
        delay = []
        waited = np.maximum(jsq.requests["admit_tick"] - jsq.requests["enter_tick"], 0) > 0
        for lo, hi in PCTS:
            a, b = np.percentile(p, lo), np.percentile(p, hi)
            m = (p >= a) & (p <= b) & waited
            d = r.requests["start_s"][m] - jsq.requests["start_s"][m]
            delay.append({"prompt_pct": [lo, hi], "n": int(m.sum()), "mean_s": float(d.mean())})
        moved = int((r.requests["replica"] != jsq.requests["replica"]).sum())
        row = {
            "patience": pat,
            "imbalance_vs_jsq": float(r.mean_imbalance / jsq.mean_imbalance),
            "requests_on_another_replica": moved,
            "imbalance_by_running": bins,
            "admission_delay_vs_jsq": delay,
        }
        rows.append(row)
        where = "  ".join(
            f"run {b['running'][0]}-{b['running'][1] if b['running'][1] < 1 << 30 else 'max'}: "
            f"{b['brs'] / max(b['jsq'], 1.0):.2f}x ({b['steps']} steps)"
            for b in bins
        )
        print(
            f"patience {pat:4d}: {row['imbalance_vs_jsq']:.3f}x, {moved} requests elsewhere; "
            f"{where}; delay by prompt pct "
            + " ".join(f"{x['mean_s'] * 1e3:+.0f}ms" for x in delay)
        )
    out = {
        "benchmark": "routing_brs_divergence",
        "cell": {"trace": args.trace, "G": args.G, "load": args.load, "requests": args.requests},
        "runs": rows,
    }
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
