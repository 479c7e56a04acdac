"""How far the exact dispatch MILP scales: naive vs tightened model, side by side.

Decode-like batches: Zipf skew ``s`` over ``E`` experts, ``B`` tokens per GPU each routed
to ``k = 8`` distinct experts, ``g`` GPUs, ``1.25 x`` EPLB-style replication built from the
long-run expert probabilities. For each instance both models run through
``solve_dispatch(method="milp", tightened=...)`` with the same time limit (default 10 s,
1 thread) and the same seed incumbents; we report the share proved optimal (gap <=
mip_rel_gap = 1e-4) and the median wall time (seeds included). ``--models cold`` adds the
plain model handed to HiGHS with no seed at all.

Instances come from ``straggler.sim.workloads.batches`` when it is importable (Zipf popularity,
Dirichlet batch fluctuation, EPLB's own placement from 16 history batches, distinct GPUs per
expert); ``--generator local`` uses a self-contained generator instead: a Gumbel top-k
sampler for routing and a greedy replication (hottest experts by load per replica get the
extra replicas; replicas packed heaviest first onto the GPU with the least load among those
with a free slot and no copy of that expert, so every GPU has the same number of slots).

Usage::

    python benchmarks/milp_scale.py --quick            # small subset
    python benchmarks/milp_scale.py --time-limit 10    # the full grid (long)
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import platform
import statistics
import time

import numpy as np
from straggler.formulations import CostModel, DispatchProblem, Status, build_dispatch_milp
from straggler.solvers import solve_dispatch, solve_milp

SKEWS = (0.0, 0.5, 1.0, 1.5)
EXPERTS = (64, 128, 256)
GPUS = (8, 16)
TOKENS_PER_GPU = (64, 128, 256, 512)
TOP_K = 8
REPLICATION = 1.25


def zipf_probs(E: int, s: float, rng) -> np.ndarray:
    """Expert popularity ``p_e ∝ rank^-s`` over a random ranking."""
    w = 1.0 / np.arange(1, E + 1) ** s
    return rng.permutation(w / w.sum())


def route_batch(p: np.ndarray, n_tokens: int, k: int, rng) -> np.ndarray:
    """Token counts per expert: each token picks k distinct experts (Gumbel top-k of log p)."""
    scores = np.log(p)[None, :] + rng.gumbel(size=(n_tokens, p.size))
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return np.bincount(top.ravel(), minlength=p.size)


def greedy_replication(p: np.ndarray, n_gpus: int, factor: float) -> np.ndarray:
    """EPLB-style replica mask: extra replicas to the highest load-per-replica experts, then
    balanced packing with distinct GPUs per expert and equal slots per GPU."""
    E = p.size
    per_gpu = int(np.ceil(factor * E / n_gpus))
    slots = per_gpu * n_gpus
    cnt = np.ones(E, dtype=int)
    for _ in range(slots - E):
        cnt[np.argmax(p / cnt)] += 1
    reps = sorted(((p[e] / cnt[e], e) for e in range(E) for _ in range(cnt[e])), reverse=True)
    load = np.zeros(n_gpus)
    free = np.full(n_gpus, per_gpu)
    mask = np.zeros((E, n_gpus), bool)
    for w, e in reps:
        ok = (free > 0) & ~mask[e]
        if not ok.any():  # only if an expert has more replicas than GPUs
            ok = free > 0
        g = int(np.flatnonzero(ok)[np.argmin(load[ok])])
        mask[e, g] = True
        load[g] += w
        free[g] -= 1
    return mask


def make_instance_local(s, E, g, B, seed):
    """Local generator: Zipf popularity, one Gumbel top-k batch, greedy distinct replication."""
    rng = np.random.default_rng(seed)
    p = zipf_probs(E, s, rng)
    counts = route_batch(p, B * g, TOP_K, rng)
    return DispatchProblem(counts=counts, replicas=greedy_replication(p, g, REPLICATION))


def make_instance_sim(s, E, g, B, seed, n_history=16):
    """``straggler.sim.workloads.batches``: Zipf popularity, Dirichlet-fluctuating top-k batches,
    EPLB's placement (no two replicas of one expert on one GPU) from the mean of
    ``n_history`` batches, then one fresh batch."""
    from straggler.sim.workloads.batches import eplb_placement, sample_counts, zipf_popularity

    rng = np.random.default_rng(seed)
    pop = zipf_popularity(E, s, rng=rng)
    hist = np.mean(
        [sample_counts(pop, n_tokens=B * g, top_k=TOP_K, rng=rng) for _ in range(n_history)],
        axis=0,
    )
    p2l = eplb_placement(hist, n_gpus=g, replication=REPLICATION, distinct=True)
    counts = sample_counts(pop, n_tokens=B * g, top_k=TOP_K, rng=rng)
    return DispatchProblem.from_placement(counts[0], p2l[0], g)


def sim_available() -> bool:
    try:
        from straggler.sim.workloads.batches import eplb_placement  # noqa: F401
    except ImportError:
        return False
    return True


make_instance = make_instance_local


def solve_method(p, cost, time_limit, tightened):
    """The ``milp`` method as users call it (seeded, naive or tightened model)."""
    t0 = time.perf_counter()
    res = solve_dispatch(p, cost, method="milp", time_limit=time_limit, tightened=tightened)
    return dict(
        status=res.status.name,
        optimal=res.status is Status.OPTIMAL,
        makespan=res.makespan,
        lower_bound=res.lower_bound,
        gap=res.extras["gap"],
        wall_s=time.perf_counter() - t0,
        nodes=res.extras["node_count"],
    )


def solve_cold(p, cost, time_limit):
    """The plain big-M model handed to HiGHS alone: no seed incumbent, no bound from it."""
    t0 = time.perf_counter()
    model = build_dispatch_milp(p, cost, tightened=False)
    sol = solve_milp(model, time_limit=time_limit, mip_rel_gap=1e-4, threads=1)
    return dict(
        status=sol.status.name,
        optimal=sol.status is Status.OPTIMAL,
        makespan=sol.objective,
        lower_bound=sol.dual_bound,
        gap=sol.gap,
        wall_s=time.perf_counter() - t0,
        nodes=sol.extras["mip_node_count"],
    )


def run(configs, cost_name, time_limit, models, seeds):
    cost = CostModel.preset(cost_name)
    rows = []
    for (s, E, g, B), seed in itertools.product(configs, seeds):
        p = make_instance(s, E, g, B, seed)
        row = dict(cost=cost_name, skew=s, n_experts=E, n_gpus=g, tokens_per_gpu=B, seed=seed)
        for name in models:
            row[name] = (
                solve_cold(p, cost, time_limit)
                if name == "cold"
                else solve_method(p, cost, time_limit, tightened=name == "tightened")
            )
        rows.append(row)
        print(
            f"{cost_name} s={s:<4} E={E:<4} g={g:<3} B={B:<4} seed={seed}  "
            + "  ".join(
                f"{m}: {row[m]['status'][:4]} {row[m]['wall_s']:6.2f}s gap={row[m]['gap']:.1e}"
                for m in models
            ),
            flush=True,
        )
    return rows


def summarize(rows, models):
    out = {}
    for m in models:
        if not rows:
            continue
        times = [r[m]["wall_s"] for r in rows]
        out[m] = dict(
            instances=len(rows),
            proved_optimal=sum(r[m]["optimal"] for r in rows),
            share_optimal=sum(r[m]["optimal"] for r in rows) / max(len(rows), 1),
            median_s=statistics.median(times) if times else float("nan"),
            max_gap=max((r[m]["gap"] for r in rows), default=float("nan")),
        )
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small subset of the grid")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--seeds", type=int, default=1, help="instances per configuration")
    ap.add_argument(
        "--models",
        default="naive,tightened",
        help="comma-separated: naive, tightened (the milp method, seeded), cold (naive model "
        "alone in HiGHS, no seed)",
    )
    ap.add_argument(
        "--costs",
        default="dsv3_a_offline,qwen3_235b_b_tile",
        help="comma-separated CostModel presets (each runs the whole grid)",
    )
    ap.add_argument(
        "--subset",
        choices=("full", "representative"),
        default="full",
        help="representative: every skew and size, tokens per GPU in {64, 512} only",
    )
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results/milp_scale.json"))
    ap.add_argument(
        "--generator",
        choices=("auto", "sim", "local"),
        default="auto",
        help="instances from straggler.sim.workloads.batches (auto: when importable) or the "
        "local one",
    )
    args = ap.parse_args(argv)
    global make_instance
    use_sim = args.generator == "sim" or (args.generator == "auto" and sim_available())
    make_instance = make_instance_sim if use_sim else make_instance_local
    args.generator = "sim" if use_sim else "local"
    models = args.models.split(",")
    if args.quick:
        configs = list(itertools.product((0.0, 1.0), (64,), (8,), (64, 512)))
    elif args.subset == "representative":
        configs = list(itertools.product(SKEWS, EXPERTS, GPUS, (64, 512)))
    else:
        configs = list(itertools.product(SKEWS, EXPERTS, GPUS, TOKENS_PER_GPU))
    costs = args.costs.split(",")
    rows = []
    for name in costs:
        rows += run(configs, name, args.time_limit, models, range(args.seeds))
    summary = {"all": summarize(rows, models)}
    for name in costs:
        summary[name] = summarize([r for r in rows if r["cost"] == name], models)
    print(
        f"\n{'cost':<20} {'model':<10} {'instances':>9} {'optimal':>8} {'share':>7} "
        f"{'median s':>9} {'max gap':>8}"
    )
    for key, per in summary.items():
        for m in models:
            r = per[m]
            print(
                f"{key:<20} {m:<10} {r['instances']:>9} {r['proved_optimal']:>8} "
                f"{r['share_optimal']:>7.1%} {r['median_s']:>9.3f} {r['max_gap']:>8.1e}"
            )
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            dict(
                args=vars(args),
                costs=costs,
                time_limit_s=args.time_limit,
                threads=1,
                machine=platform.platform(),
                summary=summary,
                rows=rows,
            ),
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
