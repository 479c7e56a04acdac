"""place_experts(dispatch=rule) vs the engine's own EPLB, on recorded real expert loads,
under each engine's own dispatch rule (the modelled step of ``solvers/placement/rules.py``).

Data (``../shared/data/expert_loads``, README there), split as ``benchmarks/real_loads.py``
splits it (its functions): DeepSeek-V2-Lite's per-sequence counts (ESFT: 64 experts, 26 MoE
layers, top-6; the 213 sequences of four tasks shuffled, half placed from, half held out; the
``dsv2_lite_a_offline`` cost fit) and Mixtral-8x7B's per-subject popularity (fiddler: 8
experts, 32 layers, top-2, instruct and base; 512-token decode batches drawn from each
subject's popularity, 16 per subject, four subjects placed from, three held out; the
``dsv3_a_offline`` cost, no Mixtral fit being at hand).

For each recording, layout (``P`` slots on ``g`` GPUs, one group and one node) and rule
(``vllm``: vLLM's hash; SGLang's ``static``, ``dynamic``, ``lp``):

* **EPLB**: the engine's own placement of the window's total (``rebalance_experts``,
  ``version="vllm"`` or ``"sglang"``), what the engine deploys;
* **ours**: ``place_experts(window, ..., dispatch=rule, n_samples=len(window))``, the
  window's batches as they are (what the SGLang plug-in and an offline ``straggler-plan``
  see);
* **ours (sum)**, vLLM's rule only: ``place_experts(window.sum(0)[None], ...,
  dispatch="vllm")``, what the vLLM plug-in computes from the one summed window vLLM hands
  its policy.

Each is scored by the rule's modelled MoE layer time (``rule_step_times``, mean over the
batches and the layers) on the window and on the held-out batches; the gain is ``1 - ours /
EPLB``. Placement time per layer is measured in the same run (shared 2-core machine:
compare within a row, not across runs).

``--timing`` also times the plug-ins' call at DeepSeek-V3's shape (256 experts, 288 slots,
32 GPUs on 4 nodes, 8 groups; ``--timing-layers`` of its 58 layers, a 100-step synthetic
window of 2048 tokens, top-8, Zipf 1.0): seconds per layer for each rule against the
engine's EPLB, side by side (vLLM's rule on the summed window, as vLLM calls its policy).

Usage::

    python benchmarks/placement_rules.py --quick
    python benchmarks/placement_rules.py --timing
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np
from _results import results_dir, run_info  # benchmarks/_results.py (the scripts' folder)
from real_loads import LOADS, esft_batches, mixtral_batches
from straggler.formulations import CostModel
from straggler.sim.workloads.batches import sample_counts, zipf_popularity
from straggler.solvers import place_experts
from straggler.solvers.placement.eplb import rebalance_experts
from straggler.solvers.placement.rules import ENGINE_DISPATCH_RULES, rule_step_times

#: (recording family, layouts (P, g)); the first of each is real_loads.py's.
LAYOUTS = {"esft": [(80, 8), (96, 8), (96, 16)], "mixtral": [(12, 4), (16, 8)]}
#: The cost fit of each family (as real_loads.py prices them).
COSTS = {"esft": "dsv2_lite_a_offline", "mixtral": "dsv3_a_offline"}


def recordings(loads, quick):
    """``name -> (window, held out)``, each ``(n_batches, n_layers, n_experts)``."""
    out = {"esft_dsv2_lite": esft_batches(loads, 64 if quick else 0)}
    for variant in ("original",) if quick else ("original", "instruct"):
        out[f"mixtral_{variant}"] = mixtral_batches(loads, variant)
    return out


def _mean_step(counts, p2l, g, rule, cost):
    return float(
        np.mean(
            [
                rule_step_times(counts[:, l], p2l[l], g, rule, cost).mean()
                for l in range(counts.shape[1])
            ]
        )  # fmt: skip
    )


def run_cell(name, window, held, P, g, rule, cost, layers):
    window, held = window[:, layers], held[:, layers]
    half = window.shape[0]
    version = "vllm" if rule == "vllm" else "sglang"
    L = window.shape[1]
    t = time.perf_counter()
    eplb = rebalance_experts(window.sum(0), P, 1, 1, g, version=version)[0]
    t_eplb = (time.perf_counter() - t) / L
    placements = {"eplb": eplb}
    times = {"eplb": t_eplb}
    t = time.perf_counter()
    placements["ours"] = place_experts(window, P, 1, 1, g, cost=cost, dispatch=rule,
                                       n_samples=half)[0]  # fmt: skip
    times["ours"] = (time.perf_counter() - t) / L
    if rule == "vllm":
        t = time.perf_counter()
        placements["ours_sum"] = place_experts(window.sum(0)[None], P, 1, 1, g, cost=cost,
                                               dispatch=rule)[0]  # fmt: skip
        times["ours_sum"] = (time.perf_counter() - t) / L
    row = {"recording": name, "P": P, "g": g, "rule": rule, "window": half,
           "heldout": held.shape[0], "layers": L}  # fmt: skip
    for key, p2l in placements.items():
        row[f"{key}_window_us"] = _mean_step(window, p2l, g, rule, cost)
        row[f"{key}_heldout_us"] = _mean_step(held, p2l, g, rule, cost)
        row[f"{key}_place_s_per_layer"] = times[key]
    for key in placements:
        if key == "eplb":
            continue
        for part in ("window", "heldout"):
            row[f"{key}_gain_{part}"] = 1 - row[f"{key}_{part}_us"] / row[f"eplb_{part}_us"]
    return row


def timing(n_layers, cost):
    """Seconds per layer of the plug-ins' placement at DeepSeek-V3's shape (module notes)."""
    E, P, g, groups, nodes = 256, 288, 32, 8, 4
    rng = np.random.default_rng(0)
    pop = zipf_popularity(E, 1.0, n_layers=n_layers, rng=rng)
    window = np.stack(
        [sample_counts(pop, n_tokens=2048, top_k=8, rng=rng) for _ in range(100)]
    ).astype(np.int64)
    out = {}
    for rule in ENGINE_DISPATCH_RULES:
        version = "vllm" if rule == "vllm" else "sglang"
        hist = window.sum(0)[None] if rule == "vllm" else window
        t = time.perf_counter()
        rebalance_experts(window.sum(0), P, groups, nodes, g, version=version)
        t_eplb = (time.perf_counter() - t) / n_layers
        t = time.perf_counter()
        place_experts(hist, P, groups, nodes, g, cost=cost, dispatch=rule)
        t_ours = (time.perf_counter() - t) / n_layers
        out[rule] = {"place_s_per_layer": t_ours, "eplb_s_per_layer": t_eplb}
        print(
            f"timing {rule:>7}: {t_ours:.3f} s per layer (EPLB {1e3 * t_eplb:.2f} ms)", flush=True
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="64 ESFT sequences, one Mixtral "
                    "variant, every fourth layer")  # fmt: skip
    ap.add_argument("--loads", default=str(LOADS), help="the expert_loads folder")
    ap.add_argument("--timing", action="store_true", help="also time DeepSeek-V3's shape")
    ap.add_argument("--timing-layers", type=int, default=2)
    ap.add_argument("--out", default=None, help="default results/placement_rules.json")
    args = ap.parse_args(argv)
    recs = recordings(pathlib.Path(args.loads), args.quick)
    rows = []
    head = (f"{'recording':>18} {'P':>3} {'g':>3} {'rule':>7} {'EPLB us':>8} {'win gain':>8} "
            f"{'held gain':>9} {'sum held':>8} {'place ms':>8} {'EPLB ms':>7}")  # fmt: skip
    print(head)
    for name, (window, held) in recs.items():
        family = name.split("_")[0]
        cost = CostModel.preset(COSTS[family])
        L = window.shape[1]
        layers = np.arange(0, L, 4) if args.quick else np.arange(L)
        for P, g in LAYOUTS[family]:
            for rule in ENGINE_DISPATCH_RULES:
                r = run_cell(name, window, held, P, g, rule, cost, layers)
                r["cost"] = COSTS[family]
                rows.append(r)
                sum_held = r.get("ours_sum_gain_heldout")
                print(f"{name:>18} {P:>3} {g:>3} {rule:>7} {r['eplb_heldout_us']:>8.1f} "
                      f"{100 * r['ours_gain_window']:>7.2f}% {100 * r['ours_gain_heldout']:>8.2f}% "
                      f"{'' if sum_held is None else f'{100 * sum_held:.2f}%':>8} "
                      f"{1e3 * r['ours_place_s_per_layer']:>8.1f} "
                      f"{1e3 * r['eplb_place_s_per_layer']:>7.2f}", flush=True)  # fmt: skip
    summary = {}
    for rule in ENGINE_DISPATCH_RULES:
        rr = [r for r in rows if r["rule"] == rule]
        summary[rule] = {
            "cells": len(rr),
            "window_gain_min": min(r["ours_gain_window"] for r in rr),
            "window_gain_mean": float(np.mean([r["ours_gain_window"] for r in rr])),
            "heldout_gain_min": min(r["ours_gain_heldout"] for r in rr),
            "heldout_gain_mean": float(np.mean([r["ours_gain_heldout"] for r in rr])),
        }
        if rule == "vllm":
            summary[rule]["sum_heldout_gain_min"] = min(r["ours_sum_gain_heldout"] for r in rr)
            summary[rule]["sum_heldout_gain_mean"] = float(
                np.mean([r["ours_sum_gain_heldout"] for r in rr])
            )
            summary[rule]["sum_window_gain_min"] = min(r["ours_sum_gain_window"] for r in rr)
    print("\nper rule: gain over the engine's EPLB (min / mean over cells)")
    for rule, s in summary.items():
        w_min, w_mean = 100 * s["window_gain_min"], 100 * s["window_gain_mean"]
        h_min, h_mean = 100 * s["heldout_gain_min"], 100 * s["heldout_gain_mean"]
        line = f"{rule:>8}: window {w_min:.2f}% / {w_mean:.2f}%, "
        line += f"held out {h_min:.2f}% / {h_mean:.2f}%"
        if rule == "vllm":
            line += (f"; from vLLM's summed window: held out {100 * s['sum_heldout_gain_min']:.2f}%"
                     f" / {100 * s['sum_heldout_gain_mean']:.2f}%")  # fmt: skip
        print(line)
    timings = (
        timing(args.timing_layers, CostModel.preset("dsv3_a_offline")) if args.timing else None
    )
    out = (
        pathlib.Path(args.out)
        if args.out
        else results_dir()
        / ("placement_rules_quick.json" if args.quick else "placement_rules.json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "run": run_info(), "args": vars(args), "costs": COSTS,
        "note": "shared 2-core machine: placement times are comparable within a row only",
        "summary": summary, "timing_dsv3": timings, "rows": rows,
    }, indent=1))  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
