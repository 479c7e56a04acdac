"""tempo's solve time per layer and per 61-layer stack, against HiGHS and the Python reference.

Instance: ``straggler.sim.workload.make_decode_problem("dsv3", n_gpus=8, tokens_per_gpu=256,
replication=1.25, n_layers=61)`` (E = 256 experts, top-8, EPLB placement, Zipf skew 0.85
by default), cost preset ``dsv3_a_offline``; ``--cost`` and ``--skew`` change them.

Measured in one run:

* **headline, streaming**: the jitted path of one layer (exact token LP + semi-matching +
  tempo kernel, what a serving worker calls) on the 61 *different* layers in turn, the
  sequential stack time divided by the number of layers; median (and best) over
  ``--repeats`` passes. Re-solving one layer over and over is faster (the branch predictor
  learns that layer), so that figure is reported beside it, not as the headline;
* per layer, each layer timed ``--repeats`` times back to back (best kept per layer, then
  the median over layers): ``kernels`` (same path), ``method`` (``Tempo().solve``:
  kernels plus the LayerSolution with extras and bound), ``solve_dispatch`` (the public
  entry point: validation, scoring by the evaluator, certified lower bound, status),
  ``token_lp_highs`` (the token LP alone solved by HiGHS, ``solve_token_lp``) and
  ``reference`` (the plain-Python ``token_lp_reference`` + ``tempo_reference`` on the
  first ``--ref-layers`` layers);
* the 61-layer stack: ``Tempo().solve_stack`` (thread pool over the ``nogil`` kernels,
  ``numba.get_num_threads()`` threads), ``solve_dispatch`` on the stacked problem, and
  the sequential kernel loop; medians over ``--repeats`` passes;
* full replication: the same counts with every expert replicated on every GPU (the
  swap and ejection searches scan every expert there), per-layer kernels time, median
  and max over the layers.

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

    def sequential(arr=arrays):
        for a in arr:
            tempo._arrays(c, *a)

    def passes(fn, n):
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return ts

    stream = passes(sequential, repeats)
    stack_runs = {
        "solve_stack_threads": passes(
            lambda: tempo.solve_stack(layers, cost, time_limit=1.0, rng=None), repeats
        ),
        "solve_dispatch_stack": passes(
            lambda: solve_dispatch(stack, cost, method="tempo"), max(3, repeats // 4)
        ),
        "kernels_sequential": stream,
    }
    stack_median = {k: statistics.median(v) for k, v in stack_runs.items()}
    stack_best = {k: min(v) for k, v in stack_runs.items()}
    # full replication: same counts, every expert on every GPU
    full = [(cn, np.ones_like(r)) for cn, r in arrays]
    sequential(full)  # warm
    full_layer = [best_of(lambda a=a: tempo._arrays(c, *a), max(1, repeats // 4)) for a in full]
    full_stream = passes(lambda: sequential(full), max(3, repeats // 4))
    res = solve_dispatch(stack, cost, method="tempo")
    n = args.layers
    summary = dict(
        per_layer_stream_us=statistics.median(stream) / n * 1e6,
        per_layer_stream_best_us=min(stream) / n * 1e6,
        per_layer_median_us={k: v * 1e6 for k, v in med.items()},
        per_layer_max_us={k: max(v) * 1e6 for k, v in per_layer.items()},
        stack_ms={k: v * 1e3 for k, v in stack_median.items()},
        stack_best_ms={k: v * 1e3 for k, v in stack_best.items()},
        full_replication_stream_us=statistics.median(full_stream) / n * 1e6,
        full_replication_layer_median_us=statistics.median(full_layer) * 1e6,
        full_replication_layer_max_us=max(full_layer) * 1e6,
        n_layers=n,
        threads=numba.get_num_threads(),
        speedup_vs_reference=med["reference"] / (statistics.median(stream) / n),
        speedup_vs_highs_token_lp=med["token_lp_highs"] / (statistics.median(stream) / n),
        mean_gap_to_lower_bound=float(np.mean(res.gap)),
    )
    print(f"E=256, g=8, 256 tokens/GPU, cost {args.cost}, skew {args.skew}, "
          f"{numba.get_num_threads()} threads")  # fmt: skip
    print(f"HEADLINE per layer, streaming {n} different layers: "
          f"median {summary['per_layer_stream_us']:.1f} us "
          f"(best pass {summary['per_layer_stream_best_us']:.1f} us)")  # fmt: skip
    print(f"{'per layer (same layer)':>22} {'median us':>11} {'max us':>10}")
    for k in per_layer:
        print(f"{k:>22} {med[k] * 1e6:11.1f} {max(per_layer[k]) * 1e6:10.1f}")
    print(f"{f'{n}-layer stack':>22} {'median ms':>11} {'best ms':>10}")
    for k in stack_runs:
        print(f"{k:>22} {stack_median[k] * 1e3:11.3f} {stack_best[k] * 1e3:10.3f}")
    print(f"full replication: streaming {summary['full_replication_stream_us']:.1f} us/layer, "
          f"per layer median {summary['full_replication_layer_median_us']:.1f} us, "
          f"max {summary['full_replication_layer_max_us']:.1f} us")  # fmt: skip
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
                stream_pass_ms=[t * 1e3 for t in stream],
                full_replication_layer_us=[t * 1e6 for t in full_layer],
            ),  # fmt: skip
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
