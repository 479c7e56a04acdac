"""tempo's makespan over the proven MILP optimum on decode-like instances, and its ablations.

Grid (TEMPO §3.2 / §4.2): Zipf skew ``s`` in {0, 0.5, 1, 1.5}; model shapes with
E = 64 (Qwen2-57B), 128 (Qwen3-235B), 256 (DeepSeek-V3), top-8; g in {8, 16} GPUs;
64, 256 and 1024 tokens per GPU; EPLB placement at 1.25x and 1.5x replication; cost
presets ``dsv3_a_offline`` (Table 6) and ``qwen3_235b_b_tile`` (Table 7, tiles and
traffic). Instances come from ``straggler.sim.workload.make_decode_problem`` (Zipf
popularity, Dirichlet batch fluctuation kappa = 2000, DeepSeek's EPLB on 16 history
batches; one layer, seeded).

For each instance: ``tempo`` (defaults: all stages, tau = 0.01), the exact MILP
(``method="milp"``, HiGHS, tightened model, warm-started with tempo's dispatch, 10 s limit,
mip_rel_gap 1e-4), and tempo with each stage switched off (the Table 2 ablation). The
ratio tempo / MILP is reported only over instances where the MILP proved optimality (the
count is reported); a ratio can dip below 1 by at most the 1e-4 gap.

Usage::

    python benchmarks/tempo_quality.py --quick   # 16 instances
    python benchmarks/tempo_quality.py           # the full grid (288 instances)
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import platform
import time

import numpy as np
from straggler.formulations import CostModel
from straggler.sim.workload import make_decode_problem
from straggler.solvers import solve_dispatch

SHAPES = {64: "qwen2_57b", 128: "qwen3_235b", 256: "dsv3"}
COSTS = ("dsv3_a_offline", "qwen3_235b_b_tile")
STAGES = ("seed", "chains", "local_search", "ensemble", "rebalance")


def grid(quick: bool):
    if quick:
        return list(itertools.product((0.0, 1.5), (64, 128), (8,), (64, 256), (1.25,), COSTS))
    return list(
        itertools.product(
            (0.0, 0.5, 1.0, 1.5), (64, 128, 256), (8, 16), (64, 256, 1024), (1.25, 1.5), COSTS
        )  # fmt: skip
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 16-instance subset")
    ap.add_argument("--time-limit", type=float, default=10.0, help="MILP seconds per instance")
    ap.add_argument(
        "--out",
        default=str(pathlib.Path(__file__).parent / "results" / "tempo_quality.json"),
    )
    args = ap.parse_args(argv)
    rows = []
    print(f"{'s':>4} {'E':>4} {'g':>3} {'B':>5} {'rep':>5} {'cost':>18} "
          f"{'tempo':>9} {'milp':>9} {'ratio':>7} {'choice':>13} {'milp':>9}")  # fmt: skip
    for i, (s, E, g, B, rep, cname) in enumerate(grid(args.quick)):
        p = make_decode_problem(
            SHAPES[E], n_gpus=g, tokens_per_gpu=B, skew=s, replication=rep, n_layers=1, seed=i
        ).layer(0)
        cost = CostModel.preset(cname)
        t = solve_dispatch(p, cost, method="tempo")
        m = solve_dispatch(p, cost, method="milp", time_limit=args.time_limit, warm_start="tempo")
        ablation = {
            st: float(solve_dispatch(p, cost, method="tempo", **{st: False}).makespan)
            for st in STAGES
        }
        optimal = m.status.name == "OPTIMAL"
        ratio = t.makespan / m.makespan if optimal else float("nan")
        rows.append(
            dict(
                skew=s,
                n_experts=E,
                n_gpus=g,
                tokens_per_gpu=B,
                replication=rep,
                cost=cname,
                tempo=t.makespan,
                tempo_runtime_s=t.runtime_s,
                choice=t.extras["choice"],
                tempo_lower_bound=t.lower_bound,
                milp=m.makespan,
                milp_status=m.status.name,
                milp_bound=m.lower_bound,
                milp_runtime_s=m.runtime_s,
                ratio=ratio,
                ablation=ablation,
            )  # fmt: skip
        )
        print(f"{s:4.1f} {E:4d} {g:3d} {B:5d} {rep:5.2f} {cname:>18} {t.makespan:9.2f} "
              f"{m.makespan:9.2f} {ratio:7.4f} {t.extras['choice']:>13} {m.status.name:>9}",
              flush=True)  # fmt: skip
    ok = [r for r in rows if r["milp_status"] == "OPTIMAL"]
    ratios = np.array([r["ratio"] for r in ok])
    summary = {
        "instances": len(rows),
        "milp_proved_optimal": len(ok),
        "ratio_mean": float(ratios.mean()) if ok else None,
        "ratio_p95": float(np.percentile(ratios, 95)) if ok else None,
        "ratio_max": float(ratios.max()) if ok else None,
        "share_exactly_optimal": float(np.mean(ratios <= 1 + 1e-4)) if ok else None,
        "choices": {c: sum(r["choice"] == c for r in rows) for c in {r["choice"] for r in rows}},
    }
    # Table 2: degradation of each ablation against full tempo, over all instances
    abl = {}
    for st in STAGES:
        d = np.array([r["ablation"][st] / r["tempo"] - 1 for r in rows])
        abl[f"no_{st}"] = dict(
            mean=float(d.mean()), p95=float(np.percentile(d, 95)), max=float(d.max()),
            share_worse=float(np.mean(d > 1e-9)),
        )  # fmt: skip
    summary["ablation_degradation"] = abl
    print()
    print(f"MILP proved optimal on {len(ok)}/{len(rows)} instances")
    if ok:
        print(f"tempo / OPT: mean {summary['ratio_mean']:.5f}  p95 {summary['ratio_p95']:.5f}  "
              f"max {summary['ratio_max']:.5f}  (paper: mean 1.005, max 1.033; "
              f"goal: mean <= 1.002, max <= 1.01)")  # fmt: skip
    print(f"choices: {summary['choices']}")
    print(f"{'ablation':>16} {'mean':>8} {'p95':>8} {'max':>8} {'worse':>7}")
    for k, v in abl.items():
        print(f"{k:>16} {v['mean']:8.4f} {v['p95']:8.4f} {v['max']:8.4f} {v['share_worse']:7.2f}")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            dict(
                args=vars(args),
                machine=platform.platform(),
                generator="straggler.sim.workload",
                date=time.strftime("%Y-%m-%d %H:%M:%S"),
                summary=summary,
                rows=rows,
            ),  # fmt: skip
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
