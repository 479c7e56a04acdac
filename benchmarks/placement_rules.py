"""place_experts(dispatch=rule) vs the engine's own EPLB, on recorded real expert loads,
under each engine's own dispatch rule (the modelled step of ``solvers/placement/rules.py``).

Data (``../shared/data/expert_loads``, README there): DeepSeek-V2-Lite's per-sequence counts
(ESFT: 64 experts, 26 MoE layers, top-6; four tasks, each sequence one forward pass) and
Mixtral-8x7B's per-subject totals (fiddler: 8 experts, 32 layers, top-2; two variants, seven
MMLU subjects each). Each recording is split in time: the first half of its batches is the
window the placements are built from, the second half is held out.

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
batches and the layers) on the window and on the held-out half; the gain is ``1 - ours /
EPLB``. Placement time per layer is measured in the same run (shared 2-core machine:
compare within a row, not across runs).

Usage::

    python benchmarks/placement_rules.py --quick
    python benchmarks/placement_rules.py
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.formulations import CostModel
from straggler.solvers import place_experts
from straggler.solvers.placement.eplb import rebalance_experts
from straggler.solvers.placement.rules import ENGINE_DISPATCH_RULES, rule_step_times

DATA = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "expert_loads"
#: (recording family, layouts (P, g)).
LAYOUTS = {"esft": [(80, 8), (96, 8), (96, 16)], "mixtral": [(12, 4), (16, 8)]}


def recordings(data_dir, quick):
    """``name -> counts (n_batches, n_layers, n_experts)`` in recorded order."""
    out = {}
    esft = np.load(data_dir / "esft_per_sequence_counts.npz")
    tasks = ("intent", "law") if quick else ("intent", "law", "summary", "translation")
    for task in tasks:
        out[f"esft_{task}"] = esft[f"{task}_counts"].astype(np.int64)
    folder = data_dir / "fiddler_mixtral8x7b_popularity"
    for variant in ("original",) if quick else ("original", "instruct"):
        files = sorted(folder.glob(f"mixtral_8x7b_{variant}__*.json"))
        out[f"mixtral_{variant}"] = np.array(
            [json.loads(f.read_text())["expert_popularity"] for f in files], dtype=np.int64
        )
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


def run_cell(name, counts, P, g, rule, cost, layers):
    counts = counts[:, layers]
    half = counts.shape[0] // 2
    window, held = counts[:half], counts[half:]
    version = "vllm" if rule == "vllm" else "sglang"
    L = counts.shape[1]
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
           "heldout": counts.shape[0] - half, "layers": L}  # fmt: skip
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two ESFT tasks, one Mixtral variant, "
                    "every fourth layer")  # fmt: skip
    ap.add_argument("--data", default=str(DATA), help="the expert_loads folder")
    ap.add_argument("--cost", default="dsv3_a_offline", help="cost model preset")
    ap.add_argument("--out", default=None, help="default results/placement_rules.json")
    args = ap.parse_args(argv)
    cost = CostModel.preset(args.cost)
    recs = recordings(pathlib.Path(args.data), args.quick)
    rows = []
    head = (f"{'recording':>18} {'P':>3} {'g':>3} {'rule':>7} {'EPLB us':>8} {'win gain':>8} "
            f"{'held gain':>9} {'sum held':>8} {'place ms':>8} {'EPLB ms':>7}")  # fmt: skip
    print(head)
    for name, counts in recs.items():
        family = name.split("_")[0]
        L = counts.shape[1]
        layers = np.arange(0, L, 4) if args.quick else np.arange(L)
        for P, g in LAYOUTS[family]:
            for rule in ENGINE_DISPATCH_RULES:
                r = run_cell(name, counts, P, g, rule, cost, layers)
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
    out = (
        pathlib.Path(args.out)
        if args.out
        else results_dir()
        / ("placement_rules_quick.json" if args.quick else "placement_rules.json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "args": vars(args), "cost": args.cost, "machine": platform.node(),
        "note": "shared 2-core machine: placement times are comparable within a row only",
        "summary": summary, "rows": rows,
    }, indent=1))  # fmt: skip
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
