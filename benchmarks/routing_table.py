"""BalanceRoute's results table, reproduced in the lock-step simulator.

Rows: Random, Round-Robin, P2C, JSQ, the other deployed baselines (below), BR-0, BR-H
(survival), BR-H (exact-match), BR-H (two-stage), BR-H (oracle). The two-stage row (not in the
paper's table; its predictor is the paper's training section) is cross-fitted on the two halves
of each simulated trace (no request is predicted by a model fitted on it;
``simulate(predictor_fit=None)``); its classifier's out-of-fold calibration (Brier, AUC, ECE)
is printed under each table and stored in the JSON. Columns: mean imbalance (tokens), its ratio
to JSQ, TPOT P95 (ms), throughput (tokens/s), throughput vs JSQ. Datasets: Azure 2023
conversation and code (real, from ``../shared/data/traces``), the shipped generator's default
workload (``bursty``, 1 h), and the Mooncake conversation trace (long prompts) as an extra.
Every run is in saturated mode (the paper's setting: it kept Azure-2024 requests with output >
1000 so that the decode cluster stays saturated; here: arrivals rescaled to 1.5x the cluster's
decode capacity, ``simulate(saturated=True)`` = ``load=1.5``), G = 8, 16 slots per replica,
default step time, prefill sized to twice the decode capacity, KV capacity enforced (recompute
preemption). Imbalance, throughput and step time are whole-run figures (every step to the last
completion); the window figures (steps before the last arrival) are in the JSON. BR-S, the
library's default policy, is the first row.

Rows "+fix" (unless ``--no-fix``): BR-H with ``refill=True, new_presence=True`` (not in the
paper; see ``straggler.sim.simulate``): slots freed within the horizon are projected as refilled
by a pool-mean prompt, and each horizon column of the F-score is weighed by the chance that a
newly placed request is still resident then.

Baseline rows, each as its upstream ships it (``straggler.solvers.routing.routers``):
SGLang ``total_tokens`` (JSQ; also its "+1 only" version before #22614) and ``total_requests``,
vLLM's DP load balancer (current, and the legacy ``4*waiting + running``), the SGLang gateway's
power of two (current expected-wait score, and the 2025 token-load version), TensorRT-LLM's
attention-DP router and its balance hold-back, SGLang ``follow_bootstrap_room``, Dynamo's KV
router (with the Mooncake trace's prefix hashes). In this central-pool mode (a request goes
only to a replica with a free slot) the engines keep no queue, so vLLM's waiting weight and
SGLang's waiting tokens do not act; the queue tables route on arrival to each engine's own
queue (``simulate(admission="queue")``), where they do (also with loads 2 steps old, as vLLM
publishes its counts about every 100 ms). The attention-DP tables run
TensorRT-LLM's setting (context phases inside the decode step, ``ctx_cost``; requests ready on
arrival) at two context costs and two loads; the Dynamo tables give each policy's prefix-cache
hit rate on the Mooncake conversation trace (pool and queue modes).

Also: G = 4, 8, 16 scaling rows (JSQ, BR-0, BR-H oracle) on Azure conversation; a horizon
sensitivity table for BR-H (oracle); with ``--stale``, the staleness table (loads 10 and 100
steps old, with and without the optimistic local update); with ``--plot PATH``, a PNG of the
imbalance over time per policy (Azure conversation, G = 8). The results from before the
baselines were modelled as their upstreams ship them are kept in
``benchmarks/results/routing_table_before_issue11.json``.

    python benchmarks/routing_table.py [--plot imbalance.png] [--stale] [--quick]

Writes ``straggler-results/routing_table.json`` (``routing_staleness.json`` with ``--stale``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.sim import generate_trace, load_trace, simulate
from straggler.sim.experiments.load_sweep import sized_prefill_instances
from straggler.sim.workloads.prefix import load_prefix_blocks

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRACES = ROOT / ".." / "shared" / "data" / "traces"
RESULTS = results_dir()

ROWS = [
    ("BR-S (default)", "brs", {}),
    ("Random", "random", {}),
    ("Round-Robin", "round_robin", {}),
    ("P2C", "p2c", {}),
    ("JSQ", "jsq", {}),
    ("JSQ +1 only (SGLang < #22614)", "jsq", {"version": "plus_one"}),
    ("JSQ by requests", "jsq_requests", {}),
    ("vLLM", "vllm", {}),
    ("vLLM legacy (4w + r)", "vllm", {"version": "legacy"}),
    ("P2C tokens (sgl-router 2025)", "p2c", {"version": "tokens"}),
    ("TRT-LLM", "trtllm", {}),
    ("TRT-LLM balance", "trtllm_balance", {}),
    ("follow_bootstrap_room", "follow_bootstrap_room", {}),
    ("Dynamo KV router", "dynamo", {"prefix_blocks": "trace"}),
    ("BR-0", "br0", {}),
    ("BR-H (survival)", "brh", {"predictor": "survival"}),
    ("BR-H (exact-match)", "brh", {"predictor": "exact_match"}),
    ("BR-H (two-stage)", "brh", {"predictor": "two_stage"}),
    ("BR-H (oracle)", "brh", {"predictor": "oracle"}),
]
ROW = {label: (label, pol, extra) for label, pol, extra in ROWS}
#: BR-H with the two options beyond the paper (refilled slots in the projection, the new
#: requests' presence weights in the score); with ``--no-fix`` the table has the paper's rows only.
FIX = {"refill": True, "new_presence": True}
FIX_ROWS = [
    ("BR-H (survival) +fix", "brh", {"predictor": "survival", **FIX}),
    ("BR-H (two-stage) +fix", "brh", {"predictor": "two_stage", **FIX}),
    ("BR-H (oracle) +fix", "brh", {"predictor": "oracle", **FIX}),
]

#: The paper's Azure-2024 rows (imbalance, TPOT P95 ms, throughput tok/s, vs JSQ).
PAPER_AZURE = {
    "Random": (146_564, 90.3, 706),
    "Round-Robin": (110_049, 89.1, 771),
    "P2C": (109_033, 89.3, 794),
    "JSQ": (104_737, 89.3, 785),
    "BR-0": (54_051, 83.3, 854),
    "BR-H (survival)": (44_010, 82.1, 893),
    "BR-H (exact-match)": (38_496, 82.3, 909),
    "BR-H (oracle)": (35_301, 77.3, 957),
}
#: The paper's scaling rows (proprietary data): G -> {policy: (imbalance, throughput gain %)}.
PAPER_SCALING = {
    4: {"JSQ": (75_326, 0.0), "BR-0": (9_711, 11.4), "BR-H (oracle)": (6_576, 13.7)},
    8: {"JSQ": (215_110, 0.0), "BR-0": (51_927, 11.8), "BR-H (oracle)": (23_577, 22.1)},
    16: {"JSQ": (675_607, 0.0), "BR-0": (215_170, 20.6), "BR-H (oracle)": (117_067, 34.6)},
}


#: Prefix blocks per dataset (Mooncake's hash_ids), for the rows that ask for them.
BLOCKS: dict = {}


def datasets(quick: bool):
    out = {}
    for key, fname in [
        ("azure_conv", "AzureLLMInferenceTrace_conv.csv"),
        ("azure_code", "AzureLLMInferenceTrace_code.csv"),
    ]:
        if (TRACES / fname).exists():
            tr = load_trace(TRACES / fname)
            out[key] = tr.window(0, 600) if quick else tr
        else:
            print(f"(skipping {key}: {TRACES / fname} not found)", file=sys.stderr)
    out["generated"] = generate_trace("bursty", duration_s=600 if quick else 3600)
    if (TRACES / "conversation_trace.jsonl").exists():
        tr = load_trace(TRACES / "conversation_trace.jsonl")
        blocks = load_prefix_blocks(TRACES / "conversation_trace.jsonl")
        if quick:  # the same requests as window(0, 600)
            keep = tr.arrival_s - tr.arrival_s[0] < 600
            tr, blocks = tr.window(0, 600), blocks.subset(keep)
        out["mooncake_conv"] = tr
        BLOCKS[tr.name] = blocks  # run_row finds them by the trace's name
    return out


STEP = {}


def run_row(trace, policy, extra, **kw):
    # prefill sized to twice the decode capacity (as the load sweep): decode, not prefill, is
    # what saturates, the paper's setting
    extra = dict(extra)
    if extra.get("prefix_blocks") == "trace":  # the dataset's own blocks, when it has them
        extra["prefix_blocks"] = BLOCKS.get(trace.name)
    kw = {"saturated": True, "load_basis": "decode", **kw}
    if "prefill_instances" not in kw:
        kw["prefill_instances"] = sized_prefill_instances(trace, kw.get("n_replicas", 8))
    r = simulate(trace, policy, **extra, **STEP, **kw)
    return {
        "mean_imbalance": r.mean_imbalance,
        "window_mean_imbalance": r.window_mean_imbalance,
        "n_preempted": r.n_preempted,
        "n_unfinished": r.n_unfinished,
        "balance_ratio": r.balance_ratio,
        "tpot_p50_ms": r.tpot_p50_ms,
        "tpot_p95_ms": r.tpot_p95_ms,
        "tpot_p99_ms": r.tpot_p99_ms,
        "ttft_p50_ms": r.ttft_p50_ms,
        "ttft_p99_ms": r.ttft_p99_ms,
        "throughput_tps": r.throughput_tps,
        "mean_step_ms": r.mean_step_ms,
        "sched_us_p50": r.sched_us_p50,
        "sched_us_p99": r.sched_us_p99,
        "token_balance": r.token_balance,
        "prefix_hit_rate": r.prefix_hit_rate,
        "n_requests": r.n_requests,
        "n_steps": r.n_steps,
        "wall_s": r.wall_s,
        **({"two_stage": r.config["two_stage"]} if "two_stage" in r.config else {}),
    }, r


def table(title, rows, *, paper=None):
    jsq = rows.get("JSQ")
    print(f"\n{title}")
    head = (
        f"{'policy':30s} {'mean imbalance':>15s} {'x JSQ':>6s} {'TPOT P95 ms':>11s} "
        f"{'throughput tok/s':>16s} {'vs JSQ':>7s}"
    )
    if paper:
        head += f" | {'paper imb.':>10s} {'x JSQ':>6s} {'vs JSQ':>7s}"
    print(head)
    for name, m in rows.items():
        ratio = m["mean_imbalance"] / jsq["mean_imbalance"] if jsq else float("nan")
        gain = (m["throughput_tps"] / jsq["throughput_tps"] - 1) * 100 if jsq else float("nan")
        m["imbalance_vs_jsq"] = ratio
        m["throughput_vs_jsq_pct"] = gain
        line = (
            f"{name:30s} {m['mean_imbalance']:15,.0f} {ratio:6.2f} {m['tpot_p95_ms']:11.1f} "
            f"{m['throughput_tps']:16,.1f} {gain:+6.1f}%"
        )
        if paper and name in paper:
            pi, _, pt = paper[name]
            pj, _, ptj = paper["JSQ"]
            line += f" | {pi:10,d} {pi / pj:6.2f} {(pt / ptj - 1) * 100:+6.1f}%"
        print(line)
    for name, m in rows.items():
        if "two_stage" in m:
            ts = m["two_stage"]
            print(
                f"   {name}: fit {ts['fit']}; out-of-fold classifier Brier {ts['brier']:.4f}, "
                f"AUC {ts['auc']:.3f}, ECE {ts['ece']:.4f} ({ts['n_samples']:,} samples)"
            )


#: vLLM's and SGLang's front ends route on arrival to each engine's own queue
#: (``simulate(admission="queue")``): the baselines there, every version.
QUEUE_ROWS = [
    ("JSQ", "jsq", {}),
    ("JSQ +1 only (SGLang < #22614)", "jsq", {"version": "plus_one"}),
    ("JSQ by requests", "jsq_requests", {}),
    ("vLLM", "vllm", {}),
    ("vLLM #47420 only (4w + r)", "vllm", {"version": "rotate_4w"}),
    ("vLLM legacy (4w + r)", "vllm", {"version": "legacy"}),
    ("P2C", "p2c", {}),
    ("P2C token_usage (smg #554)", "p2c", {"version": "token_usage"}),
    ("P2C tokens (sgl-router 2025)", "p2c", {"version": "tokens"}),
    ("P2C inflight", "p2c", {"version": "inflight"}),
    ("Round-Robin", "round_robin", {}),
    ("Random", "random", {}),
    ("follow_bootstrap_room", "follow_bootstrap_room", {}),
    ("Dynamo KV router", "dynamo", {"prefix_blocks": "trace"}),
    ("TRT-LLM", "trtllm", {}),
    ("BR-S (default)", "brs", {}),
]
#: TensorRT-LLM's attention-DP balance needs its setting: context phases run inside the decode
#: step of the rank that admits them (aggregated serving, ``simulate(ctx_cost=...)``).
ADP_ROWS = [
    ("TRT-LLM", "trtllm", {}),
    ("TRT-LLM balance", "trtllm_balance", {}),
    ("JSQ", "jsq", {}),
    ("BR-S (default)", "brs", {}),
]
INSTANT = dict(prefill_instances=0, prefill_base_s=0.0, prefill_tokens_per_s=float("inf"))
#: Dynamo on the trace with prefix hashes: the cached-prefix credit against its cost in balance.
DYNAMO_ROWS = [
    ("JSQ", "jsq", {"prefix_blocks": "trace"}),
    ("Dynamo KV router", "dynamo", {"prefix_blocks": "trace"}),
    ("Dynamo overlap_weight 2", "dynamo", {"prefix_blocks": "trace", "overlap_weight": 2.0}),
    ("Dynamo overlap_weight 0", "dynamo", {"prefix_blocks": "trace", "overlap_weight": 0.0}),
    ("Dynamo, no prefix data", "dynamo", {}),
]


def wide_table(title, rows, ref, cols):
    """Rows with the metrics ``cols`` (``(key, header, format)``) and throughput vs ``ref``."""
    print(f"\n{title}")
    print(f"{'policy':30s}" + "".join(f" {h:>12s}" for _, h, _ in cols) + f" {'vs ' + ref:>12s}")
    base = rows[ref]["throughput_tps"]
    for name, m in rows.items():
        m[f"throughput_vs_{ref}_pct"] = (m["throughput_tps"] / base - 1) * 100
        line = f"{name:30s}" + "".join(f" {format(m[k], f):>12s}" for k, _, f in cols)
        print(line + f" {m[f'throughput_vs_{ref}_pct']:+11.1f}%")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plot", help="write a PNG of imbalance over time per policy")
    ap.add_argument("--stale", action="store_true", help="the staleness table instead")
    ap.add_argument("--quick", action="store_true", help="10-minute slices (smoke run)")
    ap.add_argument("--horizon", type=int, default=80, help="BR-H horizon H (paper: 80)")
    ap.add_argument("--gamma", type=float, default=1.0, help="BR-H discount")
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--t0", type=float, default=None, help="step time t0 (s); default library's")
    ap.add_argument("--kappa", type=float, default=None, help="step time slope (s/token)")
    ap.add_argument("--out", default=None, help="JSON file name under ./straggler-results")
    ap.add_argument("--no-fix", action="store_true", help="omit the BR-H '+fix' rows")
    args = ap.parse_args(argv)
    rows_all = ROWS + ([] if args.no_fix else FIX_ROWS)
    STEP.clear()
    STEP.update({k: getattr(args, k) for k in ("t0", "kappa") if getattr(args, k) is not None})
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = datasets(args.quick)
    brh = dict(horizon=args.horizon, gamma=args.gamma)
    out = {"config": {**vars(args), "saturated": True, "max_slots": 16}, "tables": {}}
    t_start = time.perf_counter()

    if args.stale:
        name = "azure_conv" if "azure_conv" in data else "generated"
        trace = data[name]
        for stale in (0, 10, 100):
            for optimistic in (True, False) if stale else (True,):
                rows = {}
                for label, pol, extra in rows_all:
                    kw = {**extra, **(brh if pol == "brh" else {})}
                    rows[label], _ = run_row(
                        trace,
                        pol,
                        kw,
                        n_replicas=args.replicas,
                        stale=stale,
                        optimistic=optimistic,
                    )
                key = f"{name}/G={args.replicas}/stale={stale}/optimistic={optimistic}"
                table(key, rows)
                out["tables"][key] = rows
        path = RESULTS / (args.out or "routing_staleness.json")
    else:
        reports = {}
        for name, trace in data.items():
            rows = {}
            for label, pol, extra in rows_all:
                kw = {**extra, **(brh if pol == "brh" else {})}
                rows[label], rep = run_row(trace, pol, kw, n_replicas=args.replicas)
                if name == "azure_conv" or (name == "generated" and "azure_conv" not in data):
                    reports[label] = rep
            key = f"{name}/G={args.replicas}"
            table(
                f"{key} ({len(trace):,} requests, saturated)",
                rows,
                paper=PAPER_AZURE if name == "azure_conv" else None,
            )
            out["tables"][key] = rows
        scale_name = "azure_conv" if "azure_conv" in data else "generated"
        # Scaling on the Azure conversation trace and on the Mooncake one, whose long prompts
        # put the replicas at the paper's load scale (~200k tokens).
        for name in [scale_name] + (["mooncake_conv"] if "mooncake_conv" in data else []):
            for G in (4, 8, 16):
                rows = {}
                scaling_rows = [ROW["JSQ"], ROW["BR-0"], ROW["BR-H (oracle)"]]
                scaling_rows += [r for r in rows_all[len(ROWS) :] if "oracle" in r[0]]
                for label, pol, extra in scaling_rows:
                    kw = {**extra, **(brh if pol == "brh" else {})}
                    rows[label], _ = run_row(data[name], pol, kw, n_replicas=G)
                key = f"scaling/{name}/G={G}"
                table(key, rows)
                for label, (pi, pg) in PAPER_SCALING[G].items():
                    print(
                        f"   paper (proprietary) {label:14s} imbalance {pi:9,d}  vs JSQ {pg:+.1f}%"
                    )
                out["tables"][key] = rows
        # Horizon sensitivity: the paper's projection has no term for the requests that will
        # refill slots freed within the horizon, so H must stay short next to output lengths;
        # the "+fix" rows add that term and the new requests' presence weights.
        for name, trace in data.items():
            rows = {
                "JSQ": out["tables"][f"{name}/G={args.replicas}"]["JSQ"],
                "BR-0": out["tables"][f"{name}/G={args.replicas}"]["BR-0"],
            }
            for pred in ("survival", "oracle"):
                for fix in (False,) if args.no_fix else (False, True):
                    for H in (5, 20, 80):
                        for gamma in (1.0, 0.95):
                            label = f"BR-H {pred} H={H} g={gamma}" + (" +fix" if fix else "")
                            rows[label], _ = run_row(
                                trace,
                                "brh",
                                dict(
                                    predictor=pred, horizon=H, gamma=gamma, **(FIX if fix else {})
                                ),
                                n_replicas=args.replicas,
                            )
            key = f"horizon/{name}/G={args.replicas}"
            table(f"{key} (mean output {trace.output_len.mean():.0f} tokens)", rows)
            out["tables"][key] = rows
        # Queue mode: every ready request routed at once to an engine's own queue
        for name in [k for k in ("azure_conv", "mooncake_conv", "generated") if k in data]:
            rows = {}
            for label, pol, extra in QUEUE_ROWS:
                rows[label], _ = run_row(data[name], pol, extra, admission="queue")
            key = f"queue/{name}/G={args.replicas}"
            table(f"{key} (engines' own queues, saturated)", rows)
            out["tables"][key] = rows
        # ... with the load reports ~100 ms old (vLLM publishes its counts about every 100 ms;
        # a step is ~45-130 ms here): the regime the rotating tie-break and the credits target
        for name in [k for k in ("azure_conv", "mooncake_conv") if k in data]:
            rows = {}
            for label, pol, extra in QUEUE_ROWS[:10]:
                rows[label], _ = run_row(data[name], pol, extra, admission="queue", stale=2)
            key = f"queue/{name}/G={args.replicas}/stale=2"
            table(f"{key} (engines' own queues, loads 2 steps old, saturated)", rows)
            out["tables"][key] = rows
        # Aggregated attention DP (TensorRT-LLM's setting for enable_balance)
        adp = "azure_conv" if "azure_conv" in data else "generated"
        for ctx_cost in (2e-5, 5e-5):
            for load in (0.7, 1.0):
                rows = {}
                for label, pol, extra in ADP_ROWS:
                    rows[label], _ = run_row(
                        data[adp], pol, extra, load=load, ctx_cost=ctx_cost, **INSTANT
                    )
                key = f"attention_dp/{adp}/G={args.replicas}/ctx_cost={ctx_cost:g}/load={load}"
                wide_table(
                    f"{key} (context phases inside the decode step; TensorRT-LLM reports "
                    "balance ratio 54% -> 88%, throughput 1.33x, DeepSeek-V3 DP8)",
                    rows,
                    "TRT-LLM",
                    [
                        ("token_balance", "token bal.", ".3f"),
                        ("balance_ratio", "KV bal.", ".3f"),
                        ("throughput_tps", "tok/s", ",.0f"),
                        ("mean_step_ms", "step ms", ".1f"),
                        ("ttft_p50_ms", "TTFT p50 ms", ",.0f"),
                        ("tpot_p95_ms", "TPOT p95 ms", ".1f"),
                    ],
                )
                out["tables"][key] = rows
        # Dynamo's cached-prefix credit on the trace with prefix hashes
        if "mooncake_conv" in data:
            for mode in ("pool", "queue"):
                rows = {}
                for label, pol, extra in DYNAMO_ROWS:
                    rows[label], _ = run_row(data["mooncake_conv"], pol, extra, admission=mode)
                key = f"dynamo/mooncake_conv/G={args.replicas}/{mode}"
                wide_table(
                    f"{key} (per-replica LRU prefix caches of kv_capacity / 512 blocks)",
                    rows,
                    "JSQ",
                    [
                        ("mean_imbalance", "imbalance", ",.0f"),
                        ("prefix_hit_rate", "prefix hits", ".3f"),
                        ("throughput_tps", "tok/s", ",.0f"),
                        ("ttft_p50_ms", "TTFT p50 ms", ",.0f"),
                        ("tpot_p95_ms", "TPOT p95 ms", ".1f"),
                    ],
                )
                out["tables"][key] = rows
            # aggregated serving: a prefix found in the replica's cache needs no context phase
            rows = {}
            for label, pol, extra in DYNAMO_ROWS[:3]:
                rows[label], _ = run_row(
                    data["mooncake_conv"], pol, extra, admission="queue", ctx_cost=2e-5, **INSTANT
                )
            key = f"dynamo/mooncake_conv/G={args.replicas}/queue/ctx_cost=2e-05"
            wide_table(
                f"{key} (aggregated: context phases inside the decode step, cached prefix free)",
                rows,
                "JSQ",
                [
                    ("mean_imbalance", "imbalance", ",.0f"),
                    ("prefix_hit_rate", "prefix hits", ".3f"),
                    ("throughput_tps", "tok/s", ",.0f"),
                    ("mean_step_ms", "step ms", ".1f"),
                    ("ttft_p50_ms", "TTFT p50 ms", ",.0f"),
                ],
            )
            out["tables"][key] = rows
        if args.plot:
            import matplotlib
            from cycler import cycler
            from straggler.sim.experiments.plots import plot_imbalance

            # more series than the 10 default colors: solid lines first, then dashed ones
            styles = cycler(linestyle=["-", "--"]) * cycler(
                color=matplotlib.colormaps["tab10"].colors
            )
            with matplotlib.rc_context({"axes.prop_cycle": styles}):
                plot_imbalance(
                    reports, args.plot, title=f"{scale_name}, G={args.replicas}, saturated"
                )
            print(f"\nwrote {args.plot}")
        path = RESULTS / (args.out or "routing_table.json")
    out["wall_s"] = time.perf_counter() - t_start
    path.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {path} ({out['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
