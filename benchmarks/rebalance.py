"""The EPLB-replacement protocol: plan on window i, score on window i + 1, count the moves.

DeepSeek-V3 shape (256 experts, 8 groups, 288 slots, 32 GPUs, 4 nodes), ``--layers`` MoE
layers, decode batches of ``--tokens`` tokens per GPU, Zipf popularity whose hot experts
drift between windows (:func:`straggler.sim.drifting_windows`). For each window ``i >= 1``
the placement in force is EPLB's plan of window ``i - 1``; every rebalancer plans from the
loads of window ``i`` and is scored on window ``i + 1``, which nothing saw:

* ``keep``: no rebalance;
* ``eplb``: DeepSeek's EPLB (SGLang, DeepSeek; every changed slot copied);
* ``vllm_eplb``: vLLM's ``DefaultEplbPolicy`` (EPLB + ``preserve_intragpu_slots``);
* ``flashlb``: FlashLB's update from the placement in force;
* ``place_experts``: from scratch (``method="local_search"``), slots kept where they can be;
* ``place_experts_k``: ``place_experts(previous=..., max_moves=k)``, ``k`` = 5% and 10%
  of the slots.

Reported per method and summed over the scored windows: tempo's mean makespan per step
(summed over layers), EPLB's balancedness (mean over max GPU load, each expert's load of
window i + 1 split evenly over its replicas, mean over layers and windows), replicas moved,
and the share of the full EPLB rebalance's gain (keep - eplb) captured. Planning times are
side by side in one run (shared 2-core machine: ratios). The frontier of the last window
(budgets up to 60 replicas per layer; EPLB's own point, ~270 per layer, on the same axes) is
plotted to ``results/rebalance_frontier.png`` when matplotlib is installed.

Usage::

    python benchmarks/rebalance.py --quick
    python benchmarks/rebalance.py
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.baselines.placement.flashlb import flashlb_rebalance
from straggler.formulations import CostModel
from straggler.sim import drifting_windows, rebalance_frontier, tempo_makespan
from straggler.solvers import place_experts
from straggler.solvers.placement.eplb import rebalance_experts
from straggler.solvers.placement.place import moved_replicas, warm_placement

RESULTS = results_dir()
E, P, G_GPUS, NODES, GROUPS = 256, 288, 32, 4, 8


def balancedness(mean_loads, p2l, n_gpus):
    """Mean over layers of mean / max GPU load, loads split evenly over replicas."""
    out = []
    for l in range(p2l.shape[0]):
        cnt = np.bincount(p2l[l], minlength=mean_loads.shape[1])
        gpu = (mean_loads[l][p2l[l]] / cnt[p2l[l]]).reshape(n_gpus, -1).sum(axis=1)
        out.append(gpu.mean() / gpu.max())
    return float(np.mean(out))


def _rebalancers(prev, plan, cost, lay, budgets):
    """Each method's planning call from the placement in force ``prev`` on window ``plan``."""
    mean = plan.mean(axis=0)
    runs = {
        "keep": lambda: prev,
        "eplb": lambda: rebalance_experts(mean, *lay)[0],
        "vllm_eplb": lambda: rebalance_experts(
            mean, *lay, version="vllm", old_physical_to_logical=prev
        )[0],
        "flashlb": lambda: flashlb_rebalance(plan, P, G_GPUS, previous=prev)[0],
        # the search from scratch, whose results are recorded (the default is now greedy)
        "place_experts": lambda: place_experts(
            plan, *lay, cost=cost, previous=prev, method="local_search"
        )[0],
    }
    for name, k in budgets.items():
        runs[name] = lambda k=k: place_experts(
            plan, *lay, cost=cost, previous=prev, max_moves=k
        )[0]  # fmt: skip
    return runs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 layers, 3 windows")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128, help="decode tokens per GPU")
    ap.add_argument("--skew", type=float, default=0.85)
    ap.add_argument("--drift", type=float, default=0.3)
    ap.add_argument("--cost", default="dsv3_a_offline")
    ap.add_argument("--out", default=str(RESULTS / "rebalance.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.windows = 2, 3
    cost = CostModel.preset(args.cost)
    warm_placement()  # compile (or load) the kernels first: planning times are run times
    W = drifting_windows(
        n_windows=args.windows, window=args.window, n_layers=args.layers, n_experts=E,
        n_tokens=args.tokens * G_GPUS, top_k=8, skew=args.skew, drift=args.drift, rng=0,
    )  # fmt: skip
    budgets = {"place_experts_5pct": int(0.05 * P), "place_experts_10pct": int(0.10 * P)}
    lay = (P, GROUPS, NODES, G_GPUS)
    methods = ["keep", "eplb", "vllm_eplb", "flashlb", "place_experts", *budgets]
    tot = {m: dict(makespan=0.0, balancedness=0.0, moves=0, time_s=0.0) for m in methods}
    n_scored = 0
    for i in range(1, args.windows - 1):
        prev = rebalance_experts(W[i - 1].mean(axis=0), *lay)[0]
        plan, held = W[i], W[i + 1]
        runs = _rebalancers(prev, plan, cost, lay, budgets)
        row = {}
        for m, f in runs.items():
            t0 = time.perf_counter()
            p2l = f()
            dt = time.perf_counter() - t0
            row[m] = dict(
                makespan=tempo_makespan(held, p2l, G_GPUS, cost),
                balancedness=balancedness(held.mean(axis=0), p2l, G_GPUS),
                moves=int(moved_replicas(prev, p2l).sum()),
                time_s=dt,
            )
            for key in tot[m]:
                tot[m][key] += row[m][key]
        n_scored += 1
        print(f"window {i}: " + ", ".join(f"{m} {row[m]['makespan']:.1f}" for m in methods))
    for m in methods:
        tot[m]["balancedness"] /= n_scored
    gain_full = tot["keep"]["makespan"] - tot["eplb"]["makespan"]
    for m in methods:
        gain = tot["keep"]["makespan"] - tot[m]["makespan"]
        tot[m]["share_of_eplb_gain"] = gain / gain_full if gain_full > 0 else None
    print(
        f"\n{args.windows - 2} scored windows x {args.layers} layers, DSv3 shape, B={args.tokens}"
    )
    head = ("method", "makespan", "balanced", "moves", "of EPLB gain", "time/EPLB")
    print("{:<22} {:>10} {:>9} {:>6} {:>12} {:>9}".format(*head))
    for m in methods:
        t = tot[m]
        share = "-" if t["share_of_eplb_gain"] is None else f"{100 * t['share_of_eplb_gain']:.0f}%"
        print(
            f"{m:<22} {t['makespan']:>10.1f} {t['balancedness']:>9.4f} {t['moves']:>6d} "
            f"{share:>12} {t['time_s'] / max(tot['eplb']['time_s'], 1e-12):>9.1f}"
        )
    # budgets per layer up to 60 (the curve is flat well before; EPLB moves ~270 per layer)
    frontier = rebalance_frontier(
        W[-2], prev, *lay, cost=cost, score_on=W[-1], budgets=[0, 2, 5, 10, 15, 20, 28, 40, 60]
    )
    front = dict(
        budgets=frontier.budgets.tolist(),
        moves=frontier.moves.tolist(),
        makespan=frontier.makespan.tolist(),
        points={k: list(v) for k, v in frontier.points.items()},
    )
    print("frontier (last window): " + ", ".join(
        f"{m}:{t:.1f}" for m, t in zip(frontier.moves, frontier.makespan)
    ))  # fmt: skip
    print(
        "points: "
        + ", ".join(f"{k} ({v[0]} moves, {v[1]:.1f})" for k, v in frontier.points.items())
    )
    try:
        import matplotlib

        matplotlib.use("Agg")
        ax = frontier.plot()
        ax.set_title(f"DSv3, {args.layers} layers, held-out window: makespan vs moves")
        ax.figure.tight_layout()
        ax.figure.savefig(RESULTS / "rebalance_frontier.png", dpi=110)
    except ImportError:
        pass
    pathlib.Path(args.out).write_text(
        json.dumps(
            {
                "benchmark": "rebalance",
                "machine": platform.platform(),
                "note": "shared 2-core machine; plan on window i, score on window i+1",
                "args": vars(args),
                "budgets_per_layer": budgets,
                "totals": tot,
                "frontier_last_window": front,
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
