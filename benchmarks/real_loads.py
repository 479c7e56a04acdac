"""What to expect on real loads: the plan (placement + tempo dispatch table) against what the
engines run, on recorded expert loads, planned on one part and scored on another.

Loads (``../shared/data/expert_loads``, or ``--loads DIR``):

* **DeepSeek-V2-Lite** (64 routed experts, top-6, 26 MoE layers), ESFT per-sequence counts:
  every sequence is one recorded forward pass (60-650 tokens); the 213 sequences of the four
  tasks, shuffled (seed 0), half planned on, half scored. EP 8, 80 slots (16 redundant), the
  ``dsv2_lite_a_offline`` cost fit (TEMPO Table 6).
* **Mixtral-8x7B** (8 experts, top-2, 32 layers), instruct and base, expert popularity per
  MMLU subject: decode batches of 512 tokens (128 per GPU) drawn from each subject's
  popularity (``sample_counts``, Dirichlet fluctuation ``kappa = 2000``), 16 per subject;
  planned on four subjects, scored on the other three. EP 4, 12 slots (4 redundant), the
  ``dsv3_a_offline`` cost (no Mixtral fit is at hand).

Compared, each on the same scored batches, as the modeled MoE time of one forward pass (the
slowest GPU's time per layer under the cost model, summed over the MoE layers, mean over the
batches):

* **SGLang**: EPLB (DeepSeek's, on the planning batches' loads) and SGLang's static dispatch
  (``--ep-dispatch-algorithm static``, one fixed replica per source rank and expert);
* **vLLM**: vLLM's EPLB and its replica rule (a hash of the token index);
* **EPLB even split**: EPLB and each expert's tokens split evenly over its replicas;
* **plan**: ``straggler-plan``'s output, EPLB placement and tempo's dispatch table (one split per
  layer from the planning batches, applied to each scored batch in expectation);
* **plan + place_experts**: the same with ``--placement place_experts``;
* **tempo per batch**: tempo re-solving every scored batch on the EPLB placement (an oracle no
  table reaches) and the certified lower bound.

Not modelled: communication beyond the cost model's per-token term, the attention part of the
step, the weight moves a placement change costs, and a table's sampling noise (the table is
scored in expectation). Writes ``real_loads.json`` under ``--out`` and prints the table.

Usage::

    python benchmarks/real_loads.py [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import pathlib
import sys
import time

import numpy as np
from straggler.baselines import rebalance_experts
from straggler.formulations import CostModel, DispatchProblem
from straggler.runtime.engines import EngineLog
from straggler.runtime.plan import plan
from straggler.sim import sample_counts
from straggler.solvers import solve_dispatch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _results import add_out_argument, out_file, run_info  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOADS = ROOT / ".." / "shared" / "data" / "expert_loads"
ESFT_TASKS = ("intent", "law", "summary", "translation")
MIXTRAL_PLAN = ("college_computer_science", "college_medicine", "high_school_biology",
                "high_school_mathematics")  # fmt: skip
MIXTRAL_SCORE = ("high_school_us_history", "international_law", "machine_learning")


def esft_batches(loads: pathlib.Path, n_sequences: int = 0):
    """(plan batches, scored batches), each ``[B, 26, 64]``: one sequence per batch (the first
    ``n_sequences`` of the shuffle; 0: all)."""
    z = np.load(loads / "esft_per_sequence_counts.npz")
    seqs = np.concatenate([z[f"{t}_counts"] for t in ESFT_TASKS]).astype(np.int64)
    order = np.random.default_rng(0).permutation(len(seqs))
    if n_sequences:
        order = order[:n_sequences]
    half = len(order) // 2
    return seqs[order[:half]], seqs[order[half:]]


def mixtral_batches(loads: pathlib.Path, variant: str, *, n_tokens=512, per_subject=16):
    """(plan batches, scored batches), each ``[B, 32, 8]``, sampled from subject popularity."""
    rng = np.random.default_rng(0)

    def subject(name):
        path = (
            loads
            / "fiddler_mixtral8x7b_popularity"
            / (f"mixtral_8x7b_{variant}__expert_popularity_{name}.json")
        )
        pop = np.asarray(json.loads(path.read_text())["expert_popularity"], float)
        return [sample_counts(pop, n_tokens=n_tokens, top_k=2, rng=rng) for _ in range(per_subject)]

    fit = [b for s in MIXTRAL_PLAN for b in subject(s)]
    score = [b for s in MIXTRAL_SCORE for b in subject(s)]
    return np.stack(fit), np.stack(score)


def baseline(batches, p2l, n_gpus, cost, method, **options) -> float:
    """Mean over batches of the summed per-layer makespan (us) of ``method`` on ``p2l``."""
    total = 0.0
    for counts in batches:
        problem = DispatchProblem.from_placement(counts, p2l, n_gpus)
        total += float(np.sum(solve_dispatch(problem, cost, method=method, **options).makespan))
    return total / len(batches)


def compare(name, fit, score, *, n_gpus, n_slots, top_k, cost_name) -> dict:
    cost = CostModel.preset(cost_name)
    batches = np.concatenate([fit, score])
    log = EngineLog(
        engine="eplb", kind="recorded_loads", sources=(name,), n_experts=fit.shape[-1],
        counts=batches,
    )  # fmt: skip
    holdout = len(score) / len(batches)
    kw = dict(n_gpus=n_gpus, n_slots=n_slots, cost=cost, holdout=holdout,
              max_batches=len(batches))  # fmt: skip
    t0 = time.perf_counter()
    ours = plan(log, placement="eplb", **kw)
    t_plan = time.perf_counter() - t0
    ours_pe = plan(log, placement="place_experts", **kw)
    scored = np.asarray(ours["meta"]["scored_batches"])  # the held-out batches plan scored
    assert (scored >= len(fit) - 1).all(), scored
    score = batches[scored]
    eplb = np.asarray(ours["placement"]["physical_to_logical"])
    weight = batches[np.asarray(ours["meta"]["fit_batches"])].sum(axis=0)
    vllm_p2l = rebalance_experts(weight, n_slots, 1, 1, n_gpus, version="vllm")[0]
    s = ours["summary"]
    rows = {
        "sglang": baseline(score, eplb, n_gpus, cost, "static"),
        "vllm": baseline(score, vllm_p2l, n_gpus, cost, "vllm_ep", top_k=top_k),
        "eplb_even": s["total_eplb_even_us"],
        "plan": s["total_table_us"],
        "plan_place_experts": ours_pe["summary"]["total_table_us"],
        "tempo_per_batch": s["total_tempo_us"],
        "lower_bound": s["total_lower_bound_us"],
    }
    return {
        "loads": name,
        "n_layers": int(fit.shape[1]),
        "n_experts": int(fit.shape[2]),
        "top_k": top_k,
        "n_gpus": n_gpus,
        "n_slots": n_slots,
        "cost": cost_name,
        "planned_batches": len(ours["meta"]["fit_batches"]),
        "scored_batches": len(score),
        "tokens_per_batch_mean": float(score.sum(axis=(1, 2)).mean() / top_k / fit.shape[1]),
        "moe_us": rows,
        "plan_seconds": t_plan,
    }


def table(results) -> str:
    cols = ("sglang", "vllm", "eplb_even", "plan", "plan_place_experts", "tempo_per_batch",
            "lower_bound")  # fmt: skip
    head = f"{'loads':28s} " + " ".join(f"{c:>18s}" for c in cols)
    lines = ["modeled MoE time per forward pass (us, mean over the scored batches); "
             "x = relative to SGLang (EPLB + static)", head, "-" * len(head)]  # fmt: skip
    for r in results:
        base = r["moe_us"]["sglang"]
        cells = " ".join(f"{r['moe_us'][c]:9.1f} ({r['moe_us'][c] / base:5.3f}x)" for c in cols)
        lines.append(f"{r['loads']:28s} {cells}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", default=str(LOADS), help="the expert_loads folder")
    ap.add_argument("--sequences", type=int, default=0, help="DeepSeek-V2-Lite: first N (0: all)")
    ap.add_argument("--per-subject", type=int, default=16, help="Mixtral batches per subject")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    loads = pathlib.Path(args.loads)
    if not (loads / "esft_per_sequence_counts.npz").exists():
        ap.error(f"no recorded loads at {loads} (esft_per_sequence_counts.npz)")
    results = []
    with contextlib.redirect_stderr(io.StringIO()):  # the plans' first-run notices
        fit, score = esft_batches(loads, args.sequences)
        results.append(compare("DeepSeek-V2-Lite (ESFT)", fit, score, n_gpus=8, n_slots=80,
                               top_k=6, cost_name="dsv2_lite_a_offline"))  # fmt: skip
        for variant in ("instruct", "original"):
            fit, score = mixtral_batches(loads, variant, per_subject=args.per_subject)
            results.append(compare(f"Mixtral-8x7B {variant} (MMLU)", fit, score, n_gpus=4,
                                   n_slots=12, top_k=2, cost_name="dsv3_a_offline"))  # fmt: skip
    print(table(results))
    path = out_file(args.out, "real_loads.json")
    path.write_text(json.dumps({"run": run_info(), "results": results}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
