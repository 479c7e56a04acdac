"""Golden outputs: every decision the library makes on seeded inputs, written as JSON.

Run it on two checkouts and compare: a refactor that keeps behaviour leaves every entry equal.

    python benchmarks/golden.py --out /tmp/golden_a.json
    python benchmarks/golden.py --out /tmp/golden_b.json --compare /tmp/golden_a.json

Covered, through the public names only (so the script runs unchanged across a reorganised
tree): every ``route_batch`` policy on seeded ticks; ``simulate`` for every policy and over its
modes (pool and queue admission, staleness, tick period, predictors, the reference engine, the
deployment model with each placement and dispatch; the other simulator paths, on both engines:
the engines' queues, prefix caches, aggregated serving, the load basis, the deployment model
without MoE, with nodes, drift, context cost, and priced step by step in Python); every
``solve_dispatch`` method on generated layers (tempo without the wall-clock-bounded repair, so
the result does not depend on the machine's speed); placement (``place_experts`` per method,
EPLB per version, FlashLB, the rebalance frontier); the certified bound; ``plan`` on a
generated engine log. Arrays are stored as SHA-256 digests of their bytes with shape and dtype;
floats as their ``repr``. Timing fields (``runtime_s``, ``wall_s``, scheduler microseconds) are
left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import hashlib
import json
import sys
import time

import numpy as np
from straggler.baselines import flashlb_rebalance, rebalance_experts
from straggler.formulations import CostModel
from straggler.sim import (
    DeploymentConfig,
    PrefixBlocks,
    StepModel,
    generate_trace,
    make_decode_problem,
    rebalance_frontier,
    simulate,
)
from straggler.solvers import (
    certified_lower_bound,
    dispatch_methods,
    place_experts,
    route_batch,
    routing_policies,
    solve_dispatch,
)

TIMING = {
    "runtime_s",
    "wall_s",
    "compile_s",
    "reference_s",
    "sched_us_p50",
    "sched_us_p99",
    "sched_us_mean",
    "elapsed_s",
    "solve_s",
    "seconds",
}


def _digest(a) -> dict:
    a = np.ascontiguousarray(a)
    return {
        "shape": list(a.shape),
        "dtype": str(a.dtype),
        "sha256": hashlib.sha256(a.tobytes()).hexdigest()[:20],
    }


def _plain(x, depth=0):
    """A JSON-ready form of a result: arrays digested, timings dropped, floats as repr."""
    if depth > 6:
        return repr(type(x))
    if isinstance(x, np.ndarray):
        return _digest(x)
    if isinstance(x, enum.Enum):
        return x.name
    if isinstance(x, bool | np.bool_):
        return bool(x)
    if isinstance(x, int | np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        return repr(float(x))
    if isinstance(x, str) or x is None:
        return x
    if isinstance(x, dict):
        return {
            str(k): _plain(v, depth + 1)
            for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))
            if str(k) not in TIMING
        }
    if isinstance(x, list | tuple):
        if len(x) > 64 and all(isinstance(v, int | float | np.number) for v in x):
            return _digest(np.asarray(x))
        return [_plain(v, depth + 1) for v in x]
    if dataclasses.is_dataclass(x):
        return {
            f.name: _plain(getattr(x, f.name), depth + 1)
            for f in dataclasses.fields(x)
            if f.name not in TIMING
        }
    if hasattr(x, "_asdict"):
        return _plain(x._asdict(), depth + 1)
    return repr(type(x).__name__)


def routing_entries(out: dict) -> None:
    rng = np.random.default_rng(7)
    ticks = []
    for _ in range(24):
        g = int(rng.integers(1, 17))
        n = int(rng.integers(0, 40))
        ticks.append(
            dict(
                prefill_lengths=rng.integers(1, 8000, n),
                loads=rng.integers(0, 60000, g),
                free_slots=rng.integers(0, 6, g),
                n_running=rng.integers(0, 30, g),
                n_waiting=rng.integers(0, 5, g),
            )
        )
    for policy in routing_policies():
        for i, t in enumerate(ticks):
            try:
                r = route_batch(**t, policy=policy, rng=i)
                out[f"route_batch/{policy}/{i}"] = _plain(r)
            except Exception as e:  # an input a policy refuses is part of its behaviour
                out[f"route_batch/{policy}/{i}"] = f"{type(e).__name__}: {e}"


def simulate_entries(out: dict) -> None:
    trace = generate_trace("bursty", n_requests=240, rng=3)
    for policy in routing_policies():
        r = simulate(trace, policy, n_replicas=4, max_slots=8, seed=1)
        out[f"simulate/{policy}"] = _plain(r)
    modes = {
        "queue": dict(admission="queue"),
        "stale2_tick3": dict(stale=2, tick=3),
        "not_optimistic": dict(optimistic=False),
        "reference_engine": dict(engine="python"),
        "saturated": dict(saturated=True, max_steps=400),
        "prefill2": dict(prefill_instances=2),
    }
    for name, kw in modes.items():
        for policy in ("brs", "jsq", "vllm", "trtllm"):
            r = simulate(trace, policy, n_replicas=4, max_slots=8, seed=1, **kw)
            out[f"simulate/{name}/{policy}"] = _plain(r)
    for predictor in ("oracle", "survival", "exact_match", "two_stage"):
        r = simulate(
            trace,
            "brh",
            n_replicas=4,
            max_slots=8,
            seed=1,
            predictor=predictor,
            predictor_fit=trace if predictor == "two_stage" else None,
        )
        out[f"simulate/brh/{predictor}"] = _plain(r)
    small = generate_trace("bursty", n_requests=120, rng=5)
    for placement in ("eplb", "place_experts"):
        for dispatch in ("even", "tempo", "token_lp", "static", "lp", "per_batch"):
            try:
                dep = DeploymentConfig(
                    preset="qwen3_235b",
                    n_gpus=8,
                    layers=2,
                    placement=placement,
                    dispatch=dispatch,
                    seed=2,
                )
                r = simulate(
                    small, "brs", n_replicas=8, max_slots=8, seed=1, deployment=dep, max_steps=120
                )
                out[f"simulate/deployment/{placement}/{dispatch}"] = _plain(r)
            except Exception as e:
                out[f"simulate/deployment/{placement}/{dispatch}"] = f"{type(e).__name__}: {e}"


def _blocks(trace, block_tokens=64, seed=3) -> PrefixBlocks:
    """Block chains for ``trace``: four shared prefixes of random depth, then the request's own
    blocks (one id per ``block_tokens`` prompt tokens, as Mooncake's ``hash_ids``)."""
    rng = np.random.default_rng(seed)
    lists = []
    for i, p in enumerate(trace.prompt_len):
        nb = -(-int(p) // block_tokens)
        conv, depth = int(rng.integers(4)), int(rng.integers(0, nb + 1))
        lists.append(
            [conv * 10_000 + j for j in range(depth)]
            + [10**6 + 1000 * i + j for j in range(nb - depth)]
        )
    return PrefixBlocks.from_lists(lists, block_tokens=block_tokens)


def simulate_mode_entries(out: dict) -> None:
    """The simulator's other paths: both engines with the engines' queues, prefix caches and
    aggregated serving; the load basis and filters; BR-H's options beyond the paper; the
    deployment model without its MoE term, on the reference engine, with context cost,
    nodes and drift, and its per-step Python path."""
    trace = generate_trace("bursty", n_requests=160, rng=8)
    blocks = _blocks(trace)
    tight = int((trace.prompt_len + trace.output_len).max()) + 300  # preempts often
    instant = dict(prefill_instances=0, prefill_base_s=0.0, prefill_tokens_per_s=float("inf"))
    modes = {
        "queue_blocks": ("dynamo", dict(admission="queue", prefix_blocks=blocks, load=1.5)),
        "pool_blocks": ("dynamo", dict(prefix_blocks=blocks, load=1.5)),
        "jsq_blocks_tight": ("jsq", dict(prefix_blocks=blocks, load=1.5, kv_capacity=tight)),
        "ctx_queue": ("vllm", dict(ctx_cost=2e-6, admission="queue", load=1.5, **instant)),
        "ctx_pool": ("trtllm_balance", dict(ctx_cost=2e-6, load=1.5, **instant)),
        "basis_decode": ("jsq", dict(load=1.2, load_basis="decode")),
        "basis_prefill": ("jsq", dict(load=0.8, load_basis="prefill", prefill_instances=1)),
        "min_output": ("br0", dict(min_output=20, saturated=True, max_steps=300)),
        "brh_fix": ("brh", dict(predictor="oracle", horizon=12, refill=True, new_presence=True)),
        "brh_stale": ("brh", dict(predictor="survival", horizon=8, stale=2, max_pool=5)),
        "room_queue": ("follow_bootstrap_room", dict(admission="queue", load=2.0)),
    }
    for name, (policy, kw) in modes.items():
        for engine in ("numba", "python"):
            r = simulate(trace, policy, n_replicas=4, max_slots=8, seed=1, engine=engine, **kw)
            out[f"simulate_modes/{name}/{engine}"] = _plain(r)
    small = generate_trace("bursty", n_requests=100, rng=9)
    deps = {
        "no_moe": dict(moe=False),
        "nodes_split": dict(n_nodes=2, split="node_first", internode_us_per_token=0.05),
        "drift_fixed": dict(drift=0.5, drift_steps=20, placement="fixed", dispatch="tempo"),
        "short_period": dict(placement_period=30, placement_window=20, dispatch="token_lp"),
        "window_counts": dict(dispatch="tempo", table_counts="window", dispatch_period_s=0.05),
    }
    for name, kw in deps.items():
        dep = DeploymentConfig(preset="dsv3", n_gpus=8, layers=2, seed=4, **kw)
        for engine in ("numba", "python"):
            r = simulate(
                small, "jsq", n_replicas=8, max_slots=8, seed=2, deployment=dep,
                max_steps=100, engine=engine, load=2.0,
            )  # fmt: skip
            out[f"simulate_modes/deployment/{name}/{engine}"] = _plain(r)
    dep = DeploymentConfig(preset="qwen3_235b", n_gpus=4, layers=1, seed=5, dispatch="even")
    r = simulate(
        small, "vllm", n_replicas=4, max_slots=8, seed=3, deployment=dep, max_steps=80,
        ctx_cost=1e-6, admission="queue", **instant,
    )  # fmt: skip
    out["simulate_modes/deployment/ctx_queue"] = _plain(r)
    StepModel.fused = False  # every step priced in Python and numpy (the per-batch path)
    try:
        dep = DeploymentConfig(preset="dsv3", n_gpus=8, layers=2, seed=4, dispatch="tempo")
        r = simulate(small, "jsq", n_replicas=8, max_slots=8, seed=2, deployment=dep, max_steps=60)
        out["simulate_modes/deployment/unfused"] = _plain(r)
    finally:
        del StepModel.fused


def dispatch_entries(out: dict) -> None:
    cost = CostModel.preset("dsv3_a_offline")
    tile = CostModel(a=34.9, b=3.95, b2=1.23, c=34.8, beta=0.0154)
    problems = {
        f"dsv3_g{g}_t{t}_s{s}": make_decode_problem(
            "dsv3", n_gpus=g, tokens_per_gpu=t, n_layers=2, seed=s
        )
        for g, t, s in ((8, 128, 0), (8, 512, 1), (16, 64, 2))
    }
    problems["dsv3_g16_nodes2_distinct"] = make_decode_problem(
        "dsv3", n_gpus=16, tokens_per_gpu=256, n_layers=2, num_nodes=2, distinct=True, seed=3
    )
    problems["qwen_g8_full"] = make_decode_problem(
        "qwen3_235b", n_gpus=8, tokens_per_gpu=64, replication=2.0, n_layers=2, seed=6
    )
    costs = {"b15": CostModel(a=0, b=15, c=0, beta=0.1), "tile": tile, "preset": cost}
    for pname, p in problems.items():
        for cname, c in costs.items():
            for m in dispatch_methods():
                if m in ("milp",):
                    continue
                kw = {"repair_budget_s": 0} if m == "tempo" else {}
                try:
                    r = solve_dispatch(p, c, method=m, rng=11, **kw)
                    out[f"dispatch/{pname}/{cname}/{m}"] = _plain(r)
                except Exception as e:
                    out[f"dispatch/{pname}/{cname}/{m}"] = f"{type(e).__name__}: {e}"
            out[f"bound/{pname}/{cname}"] = _plain(certified_lower_bound(p, c))
    tiny = make_decode_problem("dsv3", n_gpus=4, tokens_per_gpu=16, n_layers=1, seed=4)
    r = solve_dispatch(tiny, costs["b15"], method="milp", mip_rel_gap=0, threads=1)
    out["dispatch/tiny/milp"] = {"makespan": _plain(r.makespan), "status": r.status.name}


def placement_entries(out: dict) -> None:
    rng = np.random.default_rng(5)
    hist = rng.zipf(1.6, size=(12, 3, 64)).clip(max=500).astype(np.int64)
    w = hist.sum(axis=0)
    for version in ("deepseek", "sglang_vec", "vllm"):
        try:
            out[f"eplb/{version}"] = _plain(rebalance_experts(w, 80, 4, 2, 8, version=version))
        except Exception as e:
            out[f"eplb/{version}"] = f"{type(e).__name__}: {e}"
    out["eplb/distinct"] = _plain(rebalance_experts(w, 80, 4, 2, 8, distinct=True))
    out["flashlb"] = _plain(flashlb_rebalance(w, 80, 8))
    cost = CostModel(a=16.4, b=2.99, c=15.6, beta=0.0179, c2=25, gamma=0.10)
    for method in ("greedy", "local_search", "eplb"):
        try:
            out[f"place_experts/{method}"] = _plain(
                place_experts(hist, 80, 4, 2, 8, cost=cost, method=method, max_evals=40)
            )
        except Exception as e:
            out[f"place_experts/{method}"] = f"{type(e).__name__}: {e}"
    prev = rebalance_experts(w, 80, 4, 2, 8)[0]
    out["place_experts/moves"] = _plain(
        place_experts(hist, 80, 4, 2, 8, cost=cost, previous=prev, max_moves=6, max_evals=40)
    )
    out["frontier"] = _plain(
        rebalance_frontier(hist, prev, 80, 4, 2, 8, cost=cost, budgets=[0, 2, 8])
    )


def plan_entries(out: dict) -> None:
    from straggler.runtime.engines import EngineLog
    from straggler.runtime.plan import plan

    rng = np.random.default_rng(9)
    counts = rng.zipf(1.5, size=(10, 2, 32)).clip(max=300).astype(np.int64)
    log = EngineLog(engine="sglang", kind="stat", sources=("golden",), n_experts=32, counts=counts)
    r = plan(log, n_gpus=4, n_slots=40, cost=CostModel(a=0, b=15, c=0, beta=0.1), seed=1)
    out["plan"] = _plain(dict(r))


SECTIONS = {
    "routing": routing_entries,
    "simulate": simulate_entries,
    "simulate_modes": simulate_mode_entries,
    "dispatch": dispatch_entries,
    "placement": placement_entries,
    "plan": plan_entries,
}


def compare(a: dict, b: dict) -> list[str]:
    diffs = []
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k):
            diffs.append(k)
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="where to write the golden JSON")
    ap.add_argument("--compare", help="another run's JSON: print every entry that differs")
    ap.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}"
    )
    args = ap.parse_args(argv)
    out: dict = {}
    for name in args.sections.split(","):
        t0 = time.perf_counter()
        SECTIONS[name](out)
        print(f"{name:10s} {time.perf_counter() - t0:7.1f} s", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=0, sort_keys=True)
    print(f"{len(out)} entries written to {args.out}")
    if args.compare:
        with open(args.compare) as f:
            other = json.load(f)
        diffs = compare(out, other)
        for k in diffs[:50]:
            print("differs:", k)
        print(f"{len(diffs)} of {len(set(out) | set(other))} entries differ")
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
