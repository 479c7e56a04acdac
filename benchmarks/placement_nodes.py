"""``place_experts``'s default (the greedy placement) against one EPLB call on the
DeepSeek-V3 shape with several nodes: time only, side by side.

256 experts in 8 groups, 288 slots, 32 GPUs, 4 nodes (the field's EPLB-replacement protocol,
``benchmarks/rebalance.py``), ``--layers`` MoE layers, one window of 8 decode batches from
:func:`straggler.sim.drifting_windows` per skew and batch size. Each call is timed alternately
with EPLB (``rebalance_experts`` on the window's mean, the mean included), after one untimed
call of each (compile excluded); medians of ``--repeat`` calls. ``benchmarks/placement.py``
measures quality and time on one node; this script covers the hierarchical layout, whose
group-to-node packing (EPLB's step 1, in Python) the greedy placement runs too.

Usage::

    python benchmarks/placement_nodes.py
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.sim import drifting_windows
from straggler.solvers.placement.eplb import rebalance_experts
from straggler.solvers.placement.place import place_experts

ROOT = pathlib.Path(__file__).resolve().parent
SHAPE = (288, 8, 4, 32)  # num_replicas, num_groups, num_nodes, num_gpus


def cell(skew: float, tokens: int, layers: int, repeat: int, seed: int) -> dict:
    (window,) = drifting_windows(n_windows=1, window=8, n_layers=layers, n_experts=256,
                                 n_tokens=tokens * 32, top_k=8, skew=skew, rng=seed)  # fmt: skip
    place_experts(window, *SHAPE)
    rebalance_experts(window.mean(axis=0), *SHAPE)
    tg, te = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        place_experts(window, *SHAPE)
        tg.append(time.perf_counter() - t)
        t = time.perf_counter()
        rebalance_experts(window.mean(axis=0), *SHAPE)
        te.append(time.perf_counter() - t)
    g, e = float(np.median(tg)), float(np.median(te))
    return {"skew": skew, "tokens": tokens, "greedy_ms": g * 1e3, "eplb_ms": e * 1e3,
            "ratio": g / e}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=21)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(results_dir() / "placement_nodes.json"))
    args = ap.parse_args(argv)
    rows = [cell(s, b, args.layers, args.repeat, args.seed) for s in (0.6, 1.0, 1.4)
            for b in (128, 512)]  # fmt: skip
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"layers": args.layers, "repeat": args.repeat, "rows": rows},
                              indent=2) + "\n")  # fmt: skip
    print(f"{'skew':>5s} {'tokens/GPU':>10s} {'greedy ms':>10s} {'EPLB ms':>8s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['skew']:5.2f} {r['tokens']:10d} {r['greedy_ms']:10.3f} {r['eplb_ms']:8.3f} "
              f"{r['ratio']:6.2f}")  # fmt: skip
    ratios = [r["ratio"] for r in rows]
    print(f"median ratio {np.median(ratios):.2f}, max {max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
