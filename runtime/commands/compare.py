"""``straggler-compare``: every registered dispatch method on one generated decode batch.

The command around :func:`straggler.sim.experiments.compare.compare` (see its module for what
each row holds). Run ``straggler-compare --help`` for the flags.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np

from ...formulations._io import OneLineParser, name_list
from ...formulations.cost import PRESETS, CostModel
from ...formulations.errors import StragglerError
from ...sim.experiments.compare import DEFAULT_PRESETS, compare, format_table
from ...sim.workloads.batches import (
    DEFAULT_KAPPA,
    MAX_GPUS,
    MAX_LAYERS,
    MAX_TOKENS,
    SHAPES,
    SKEWS,
    make_decode_problem,
    num_physical_slots,
)
from ...solvers.dispatch._backend import needs_compile
from ...solvers.dispatch.registry import dispatch_methods

__all__ = ["main", "MAX_COMPARE_SLOTS"]


#: Most physical slots ``straggler-compare`` generates (``--replication`` times the experts,
#: rounded to the GPUs): a bound checked before anything is allocated.
MAX_COMPARE_SLOTS = 2**20


def _parser() -> OneLineParser:
    p = OneLineParser(
        prog="straggler-compare",
        description="Compare every registered EP dispatch method on a generated decode batch.",
    )
    p.add_argument("--shape", choices=sorted(SHAPES), default="dsv3", help="model shape")
    p.add_argument("--gpus", type=int, default=8, help="EP degree (default 8)")
    p.add_argument("--tokens-per-gpu", type=int, default=128, help="decode batch per GPU")
    p.add_argument(
        "--skew",
        type=float,
        default=SKEWS["qwen3_prover"],
        help="Zipf exponent of expert popularity (default 0.85: ~11x max/mean at E=128)",
    )
    p.add_argument("--kappa", type=float, default=DEFAULT_KAPPA, help="Dirichlet concentration")
    p.add_argument("--replication", type=float, default=1.25, help="EPLB replication ratio")
    p.add_argument("--layers", type=int, default=1, help="MoE layers in the batch")
    p.add_argument("--nodes", type=int, default=1, help="nodes (EPLB hierarchical policy)")
    p.add_argument(
        "--distinct", action="store_true", help="EPLB placement without duplicate replicas"
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="cost preset (default: the shape's, see DEFAULT_PRESETS)",
    )
    p.add_argument("--seed", type=int, default=0, help="workload and method seed")
    p.add_argument(
        "--time-limit", type=float, default=5.0, help="seconds per layer for exact methods"
    )
    p.add_argument(
        "--methods",
        type=name_list,
        default=None,
        help="comma-separated subset of methods (default: all)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _check_args(parser, args) -> None:
    """Every flag's range, each error naming the flag, before anything is printed or
    generated (the generator's own checks name its parameters, not these flags)."""
    ints = (
        ("--gpus", args.gpus, 1, MAX_GPUS),
        ("--tokens-per-gpu", args.tokens_per_gpu, 1, MAX_TOKENS),
        ("--layers", args.layers, 1, MAX_LAYERS),
        ("--nodes", args.nodes, 1, args.gpus),
    )
    for flag, v, lo, hi in ints:
        if not lo <= v <= hi:
            parser.error(f"{flag} must be an integer in [{lo}, {hi}]; got {v}")
    if args.gpus % args.nodes:
        parser.error(f"--nodes must be a divisor of --gpus {args.gpus}; got {args.nodes}")
    if args.gpus * args.tokens_per_gpu > MAX_TOKENS:
        parser.error(
            f"--gpus x --tokens-per-gpu must be at most {MAX_TOKENS:,} tokens; got "
            f"{args.gpus * args.tokens_per_gpu:,}"
        )
    reals = (
        ("--skew", args.skew, ">= 0", args.skew >= 0),
        ("--kappa", args.kappa, "> 0", args.kappa > 0),
        ("--replication", args.replication, ">= 1", args.replication >= 1),
    )
    for flag, v, form, ok in reals:
        if not (math.isfinite(v) and ok):
            parser.error(f"{flag} must be a finite number {form}; got {v}")
    if args.seed < 0:
        parser.error(f"--seed must be an integer >= 0; got {args.seed}")
    if not args.time_limit > 0:
        parser.error(f"--time-limit must be positive, got {args.time_limit}")
    if args.methods is not None:
        unknown = sorted(set(args.methods) - set(dispatch_methods()))
        if unknown:
            parser.error(
                f"--methods: unknown method(s) {unknown}; registered: {dispatch_methods()}"
            )


def _notice(out) -> None:
    """One line on a first run (a dispatch kernel neither compiled nor in numba's disk
    cache): what runs instead of compiling."""
    if needs_compile():
        print(
            "kernels not compiled yet: their plain-Python references run (same results); "
            "straggler-warmup compiles them",
            file=out,
            flush=True,
        )


def main(argv=None) -> int:
    """Console entry point ``straggler-compare``; returns the exit status.

    Exit status 0 when every method ran (or was skipped for a missing optional backend),
    1 when one failed, 2 on bad arguments.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    preset = args.preset or DEFAULT_PRESETS[args.shape]
    cost = CostModel.preset(preset)
    methods = args.methods
    try:
        slots = num_physical_slots(SHAPES[args.shape].n_experts, args.gpus, args.replication)
        if slots > MAX_COMPARE_SLOTS:
            parser.error(
                f"--replication {args.replication:g} on {args.gpus} GPUs gives {slots:,} physical "
                f"slots; at most {MAX_COMPARE_SLOTS:,}"
            )
        problem = make_decode_problem(
            args.shape,
            n_gpus=args.gpus,
            tokens_per_gpu=args.tokens_per_gpu,
            skew=args.skew,
            kappa=args.kappa,
            replication=args.replication,
            n_layers=args.layers,
            num_nodes=args.nodes,
            distinct=args.distinct,
            seed=args.seed,
        )
    except StragglerError as exc:
        parser.error(str(exc))
    out = sys.stderr if args.json else sys.stdout
    _notice(out)
    rows = compare(problem, cost, methods=methods, time_limit=args.time_limit, seed=args.seed)
    shape = SHAPES[args.shape]
    counts = problem.counts
    instance = {
        "shape": args.shape,
        "n_experts": shape.n_experts,
        "top_k": shape.top_k,
        "n_gpus": args.gpus,
        "tokens_per_gpu": args.tokens_per_gpu,
        "n_layers": args.layers,
        "skew": args.skew,
        "kappa": args.kappa,
        "replication": args.replication,
        "physical_slots": num_physical_slots(shape.n_experts, args.gpus, args.replication),
        "replica_entries": int(problem.replicas.sum()),
        "max_over_mean_load": float(np.mean(counts.max(axis=-1) / counts.mean(axis=-1))),
        "cost_preset": preset,
        "cost": {k: v for k, v in vars(cost).items() if v is not None and not k.startswith("_")},
        "seed": args.seed,
        "time_limit_s": args.time_limit,
    }
    if args.json:
        print(json.dumps({"instance": instance, "results": rows}, indent=2))
    else:
        print(
            f"{args.shape}: {shape.n_experts} experts top-{shape.top_k}, EP{args.gpus}, "
            f"{args.tokens_per_gpu} tokens/GPU, {args.layers} layer(s), skew {args.skew}, "
            f"kappa {args.kappa:g}, EPLB {args.replication}x "
            f"({instance['physical_slots']} slots), hottest/mean load "
            f"{instance['max_over_mean_load']:.1f}x, seed {args.seed}"
        )
        print(f"cost preset {preset}: {instance['cost']}")
        print(format_table(rows))
    compiled = sum(r.get("compile_s", 0.0) for r in rows)
    if compiled >= 0.5:  # a method outran its references' budget: its kernels compiled
        print(f"kernels compiled during the run: {compiled:.1f} s (first run only)", file=out)
    return 1 if any(r["status"] == "ERROR" for r in rows) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
