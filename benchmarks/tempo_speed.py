"""tempo's solve time per layer and per 61-layer stack, against HiGHS and the Python reference.

Instance: ``straggler.sim.workload.make_decode_problem("dsv3", n_gpus=8, tokens_per_gpu=256,
replication=1.25, n_layers=61)`` (E = 256 experts, top-8, EPLB placement, Zipf skew 0.85
by default), cost preset ``dsv3_a_offline``; ``--cost`` and ``--skew`` change them.

Measured in one run, each as the median over the layers (each layer timed ``--repeats``
times, best of those kept per layer to drop scheduler noise):

* ``kernels``: the jitted path of one layer (exact token LP + semi-matching + tempo
  kernel), what a serving worker calls; timed on the same layer repeatedly (warm caches),
  so the streaming figure (the sequential stack over its layers) is reported beside it;
* ``method``: ``Tempo().solve`` (kernels plus the LayerSolution with extras and bound);
* ``solve_dispatch``: the public entry point on one layer (validation, scoring by the
  evaluator, certified lower bound, status);
* ``token_lp_highs``: the token LP alone solved by HiGHS (``solve_token_lp``);
* ``reference``: the plain-Python reference (``token_lp_reference`` + ``tempo_reference``)
  on the first ``--ref-layers`` layers;
* the 61-layer stack: ``Tempo().solve_stack`` (thread pool over the ``nogil`` kernels,
  ``numba.get_num_threads()`` threads) and a sequential loop of the kernels, and
  ``solve_dispatch`` on the stacked problem.

Usage::

    python benchmarks/tempo_speed.py --quick
    python benchmarks/tempo_speed.py
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import time

import numba
import numpy as np
from straggler.formulations import CostModel
from straggler.sim.workload import make_decode_problem
from straggler.solvers import Tempo, solve_dispatch, solve_token_lp
from straggler.solvers._semi_matching import semi_matching_kernel
from straggler.solvers._tempo import tempo_reference
from straggler.solvers._token_lp_fast import token_lp_reference


def best_of(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and reference layers")
    ap.add_argument("--cost", default="dsv3_a_offline")
    ap.add_argument("--skew", type=float, default=0.85)
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--ref-layers", type=int, default=None)
    ap.add_argument(
        "--out", default=str(pathlib.Path(__file__).parent / "results" / "tempo_speed.json")
    )
    args = ap.parse_args(argv)
    repeats = args.repeats or (5 if args.quick else 20)
    ref_layers = args.ref_layers or (2 if args.quick else 5)
    cost = CostModel.preset(args.cost)
    stack = make_decode_problem(
        "dsv3", n_gpus=8, tokens_per_gpu=256, skew=args.skew, replication=1.25,
        n_layers=args.layers, seed=0,
    )  # fmt: skip
    layers = list(stack.layers())
    tempo = Tempo()
    c = cost.as_array()
    arrays = [
        (np.ascontiguousarray(p.counts, dtype=np.int64), np.ascontiguousarray(p.replicas))
        for p in layers
    ]
    # warm up every jitted path (compilation is not timed)
    solve_dispatch(stack, cost, method="tempo")
    solve_dispatch(layers[0], cost, method="tempo")

    per_layer = {
        "kernels": [best_of(lambda a=a: tempo._arrays(c, *a), repeats) for a in arrays],
        "method": [
            best_of(lambda p=p: tempo.solve(p, cost, time_limit=1.0, rng=None), repeats)
            for p in layers
        ],
        "solve_dispatch": [
            best_of(lambda p=p: solve_dispatch(p, cost, method="tempo"), repeats) for p in layers
        ],
        "token_lp_highs": [
            best_of(lambda p=p: solve_token_lp(p), max(1, repeats // 4)) for p in layers
        ],
    }

    def reference(counts, replicas):
        lp, _, _ = token_lp_reference(counts, replicas)
        sm, _, _ = semi_matching_kernel(replicas, counts > 0)  # H3b's; not part of tempo
        tempo_reference(counts, replicas, c, lp, sm, True, True, True, True, 0.01, 300)

    per_layer["reference"] = [best_of(lambda a=a: reference(*a), 1) for a in arrays[:ref_layers]]
    med = {k: statistics.median(v) for k, v in per_layer.items()}

    def sequential():
        for a in arrays:
            tempo._arrays(c, *a)

    stack_times = {
        "solve_stack_threads": best_of(
            lambda: tempo.solve_stack(layers, cost, time_limit=1.0, rng=None), repeats
        ),
        "kernels_sequential": best_of(sequential, repeats),
        "solve_dispatch_stack": best_of(
            lambda: solve_dispatch(stack, cost, method="tempo"), max(1, repeats // 4)
        ),
    }
    res = solve_dispatch(stack, cost, method="tempo")
    summary = dict(
        per_layer_median_us={k: v * 1e6 for k, v in med.items()},
        per_layer_max_us={k: max(v) * 1e6 for k, v in per_layer.items()},
        stack_ms={k: v * 1e3 for k, v in stack_times.items()},
        n_layers=args.layers,
        threads=numba.get_num_threads(),
        per_layer_stream_us=stack_times["kernels_sequential"] / args.layers * 1e6,
        speedup_vs_reference=med["reference"] / med["kernels"],
        speedup_vs_highs_token_lp=med["token_lp_highs"] / med["kernels"],
        mean_gap_to_lower_bound=float(np.mean(res.gap)),
    )
    print(f"E=256, g=8, 256 tokens/GPU, cost {args.cost}, skew {args.skew}, "
          f"{numba.get_num_threads()} threads")  # fmt: skip
    print(f"{'per layer':>22} {'median us':>11} {'max us':>10}")
    for k in per_layer:
        print(f"{k:>22} {med[k] * 1e6:11.1f} {max(per_layer[k]) * 1e6:10.1f}")
    print(f"{f'{args.layers}-layer stack':>22} {'ms':>11}")
    for k, v in stack_times.items():
        print(f"{k:>22} {v * 1e3:11.3f}")
    print(f"{'per layer, streaming':>22} {summary['per_layer_stream_us']:11.1f}  "
          f"(sequential stack / {args.layers}: each layer once, cold caches)")  # fmt: skip
    print("goal: <= 50 us per layer, <= 3 ms per 61-layer stack (paper: 1.9 ms/layer, Python)")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            dict(
                args=vars(args),
                machine=platform.platform(),
                cpu_count=__import__("os").cpu_count(),
                date=time.strftime("%Y-%m-%d %H:%M:%S"),
                summary=summary,
                per_layer_us={k: [t * 1e6 for t in v] for k, v in per_layer.items()},
            ),  # fmt: skip
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
