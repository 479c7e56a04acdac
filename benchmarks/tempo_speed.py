"""tempo's solve time per layer and per 61-layer stack, beside today's kernel, HiGHS and the
Python reference; optionally the cold compile time of both kernels.

Instance: ``straggler.sim.workloads.batches.make_decode_problem("dsv3", n_gpus=8,
tokens_per_gpu=256,
replication=1.25, n_layers=61)`` (E = 256 experts, top-8, EPLB placement, Zipf skew 0.85
by default), cost preset ``dsv3_a_offline``; ``--cost`` and ``--skew`` change them.

Measured in one run:

* **baseline side by side**: the kernel path of ``--baseline`` (a git revision, default
  ``9c0a042``, the tree before tempo's current stages: token LP + semi-matching + its tempo
  kernel + the support rebalance, extracted with ``git show`` into a private package) and today's
  (``Tempo._arrays``: the same plus the cheap bound), timed on the same layers
  alternately (best of ``--repeats`` per layer, then the median over layers), with the
  repair off, since the repair is no kernel;
* **headline, streaming**: today's kernel path on the 61 *different* layers in turn, the
  sequential stack time divided by the number of layers (median and best pass);
* per layer, each layer timed ``--repeats`` times back to back (best kept per layer, then
  the median over layers): ``kernels``, ``method`` (``Tempo().solve``: kernels, extras,
  bound and, where its gap exceeds ``repair_gap``, the repair), ``solve_dispatch`` (the
  public entry point with the defaults: validation, evaluator, certified bound, status),
  ``solve_dispatch_no_repair``, ``token_lp_highs`` (the token LP alone solved by HiGHS,
  ``solve_token_lp``) and ``reference`` (``token_lp_reference`` + ``tempo_reference`` on
  the first ``--ref-layers`` layers);
* the 61-layer stack: ``Tempo().solve_stack`` (thread pool over the ``nogil`` kernels),
  ``solve_dispatch`` on the stacked problem, and the sequential kernel loop;
* full replication: the same counts with every expert replicated on every GPU;
* ``--compile``: the cold compile time of each kernel (baseline and today's), each in a
  fresh process with an empty ``NUMBA_CACHE_DIR`` (CPU seconds and wall seconds; apart
  from every run time above).

Usage::

    python benchmarks/tempo_speed.py --quick
    nice -n 10 python benchmarks/tempo_speed.py --compile
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numba
import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.formulations import CostModel, evaluate
from straggler.sim.workloads.batches import make_decode_problem
from straggler.solvers import Tempo, solve_dispatch, solve_token_lp
from straggler.solvers.dispatch._semi_matching import semi_matching_kernel
from straggler.solvers.dispatch._tempo import KernelOptions, kernel_cost, tempo_reference
from straggler.solvers.dispatch._token_lp_fast import (
    support_rebalance_kernel,
    token_lp_handle,
    token_lp_kernel,
    token_lp_reference,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
_COMPILE_SNIPPET = """
import math, sys, time
t0, w0 = time.process_time(), time.perf_counter()
import numpy as np
{imports}
counts = np.array([600] + [30] * 6, np.int64)
R = np.ones((7, 2), bool)
lp = np.array([[300, 300]] + [[30, 0]] * 3 + [[0, 30]] * 3, np.int64)
sm = np.array([0, 0, 0, 0, 1, 1, 1])
c = np.array([0, 15, 0, 0, 0.1, 0, 0, 128.0])
t1, w1 = time.process_time(), time.perf_counter()
{call}
print(time.process_time() - t1, time.perf_counter() - w1)
"""


def best_of(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def best_of_rounds(loops, repeats):
    """Best time per call of each loop of ``loops`` (lists of calls) over ``repeats``
    rounds, each round running every loop in turn: the loops alternate, so a load change on
    a shared machine hits them alike (a fair ratio), while the calls of one loop follow
    each other as in a serving loop (warm caches). Returns the wall and the process CPU
    seconds (``time.process_time``, all threads: what a loaded machine cannot inflate)."""
    wall = [[float("inf")] * len(calls) for calls in loops]
    cpu = [[float("inf")] * len(calls) for calls in loops]
    for _ in range(repeats):
        for w, c, calls in zip(wall, cpu, loops):
            for i, fn in enumerate(calls):
                t0, c0 = time.perf_counter(), time.process_time()
                fn()
                c[i] = min(c[i], time.process_time() - c0)
                w[i] = min(w[i], time.perf_counter() - t0)
    return wall, cpu


def summary_stack_ratio(stack_runs) -> float:
    """``solve_dispatch`` on the stack over ``Tempo.solve_stack``, medians."""
    return statistics.median(stack_runs["solve_dispatch_stack"]) / statistics.median(
        stack_runs["solve_stack_threads"]
    )


def load_baseline(rev):
    """The tempo kernel of git revision ``rev`` as a private package (None if unavailable)."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="tempo_baseline_"))
    pkg = d / "tempo_baseline"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("_tempo.py", "_jit.py"):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:solvers/{name}"],
                             capture_output=True, text=True)  # fmt: skip
        if src.returncode:
            return None, d
        (pkg / name).write_text(src.stdout)
    sys.path.insert(0, str(d))
    return importlib.import_module("tempo_baseline._tempo"), d


def compile_time(d_baseline):
    """Cold compile (CPU s, wall s) of the baseline and today's tempo kernel, each in a fresh
    process with an empty numba cache."""
    out = {}
    cases = {
        "today": ("from straggler.solvers.dispatch import _tempo as T",
                  "T.tempo_kernel(counts, R, T.kernel_cost(c), lp, sm, -math.inf, "
                  "T.KernelOptions(True, True, True, True, True, True, True, 0.01, 300), "
                  "T.stage_handles())"),
    }  # fmt: skip
    if d_baseline is not None:
        cases["baseline"] = (
            f"sys.path.insert(0, {str(d_baseline)!r}); from tempo_baseline import _tempo as T",
            "T.tempo_kernel(counts, R, c, lp, sm, True, True, True, True, 0.01, 300)",
        )
    for name, (imports, call) in cases.items():
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache)
            code = _COMPILE_SNIPPET.format(imports=imports, call=call)
            r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                               text=True, check=True)  # fmt: skip
            cpu, wall = (float(v) for v in r.stdout.split())
            out[name] = {"cpu_s": cpu, "wall_s": wall}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats and reference layers")
    ap.add_argument("--cost", default="dsv3_a_offline")
    ap.add_argument("--skew", type=float, default=0.85)
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--ref-layers", type=int, default=None)
    ap.add_argument("--baseline", default="9c0a042", help="git revision, or 'none'")
    ap.add_argument("--compile", action="store_true", help="also measure cold compile times")
    ap.add_argument("--out", default=str(results_dir() / "tempo_speed.json"))
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
    kc = kernel_cost(c)
    arrays = [
        (np.ascontiguousarray(p.counts, dtype=np.int64), np.ascontiguousarray(p.replicas))
        for p in layers
    ]
    base, base_dir = (None, None) if args.baseline == "none" else load_baseline(args.baseline)

    def today(a):
        return tempo._arrays(cost, kc, c, *a)

    def baseline(a):
        counts, R = a
        lp, num, den = token_lp_kernel(counts, R)
        assign, sm, _ = semi_matching_kernel(R, counts > 0)
        x, info = base.tempo_kernel(counts, R, c, lp, assign, True, True, True, True, 0.01, 300)
        lam = num / den
        if info[0] > max(c[3] + c[4] * lam, c[0] + c[1] * sm, c[5] + c[6] * lam):
            x, _, _ = support_rebalance_kernel(counts, x, c, token_lp_handle())
        return x

    # warm up every jitted path (compilation is not timed)
    solve_dispatch(stack, cost, method="tempo")
    solve_dispatch(layers[0], cost, method="tempo")
    for a in arrays:
        today(a)
        if base is not None:
            baseline(a)

    side = {"today": [math.inf] * len(arrays), "baseline": [math.inf] * len(arrays)}
    for _ in range(repeats):
        for i, a in enumerate(arrays):
            for name, fn in (("today", today), ("baseline", baseline)):
                if name == "baseline" and base is None:
                    continue
                t0 = time.perf_counter()
                fn(a)
                side[name][i] = min(side[name][i], time.perf_counter() - t0)
    same = None
    if base is not None:
        m_today = [float(today(a).makespan) for a in arrays]
        m_base = [float(evaluate(p, cost, baseline(a)).makespan) for p, a in zip(layers, arrays)]
        ratios = [t / b for t, b in zip(m_today, m_base)]
        same = dict(today_over_baseline_makespan_max=max(ratios),
                    today_over_baseline_makespan_min=min(ratios))  # fmt: skip

    per_layer = {
        "kernels": [best_of(lambda a=a: today(a), repeats) for a in arrays],
        "method": [
            best_of(lambda p=p: tempo.solve(p, cost, time_limit=1.0, rng=None), repeats)
            for p in layers
        ],
        "solve_dispatch": [
            best_of(lambda p=p: solve_dispatch(p, cost, method="tempo"), repeats) for p in layers
        ],
        "solve_dispatch_no_repair": [
            best_of(
                lambda p=p: solve_dispatch(p, cost, method="tempo", repair_budget_s=0.0), repeats
            )  # fmt: skip
            for p in layers
        ],
        "token_lp_highs": [
            best_of(lambda p=p: solve_token_lp(p), max(1, repeats // 4)) for p in layers
        ],
    }
    # the goal's ratio: the solve_dispatch (defaults) and HiGHS token LP loops alternating
    (sd_loop, highs_loop), (sd_cpu, highs_cpu) = best_of_rounds(
        [
            [lambda p=p: solve_dispatch(p, cost, method="tempo") for p in layers],
            [lambda p=p: solve_token_lp(p) for p in layers],
        ],
        max(3, repeats // 2),
    )
    per_layer["solve_dispatch_interleaved"] = sd_loop
    per_layer["token_lp_highs_interleaved"] = highs_loop
    per_layer["solve_dispatch_cpu"] = sd_cpu
    per_layer["token_lp_highs_cpu"] = highs_cpu
    ref_opts = KernelOptions(True, True, True, True, True, True, True, 0.01, 300)

    def reference(counts, replicas):
        lp, _, _ = token_lp_reference(counts, replicas)
        sm, _, _ = semi_matching_kernel(replicas, counts > 0)  # H3b's; not part of tempo
        tempo_reference(counts, replicas, kc, lp, sm, -math.inf, ref_opts)

    per_layer["reference"] = [best_of(lambda a=a: reference(*a), 1) for a in arrays[:ref_layers]]
    med = {k: statistics.median(v) for k, v in per_layer.items()}

    def sequential(arr=arrays):
        for a in arr:
            today(a)

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
    full = [(cn, np.ones_like(r)) for cn, r in arrays]
    sequential(full)  # warm
    full_layer = [best_of(lambda a=a: today(a), max(1, repeats // 4)) for a in full]
    full_stream = passes(lambda: sequential(full), max(3, repeats // 4))
    res = solve_dispatch(stack, cost, method="tempo")
    n = args.layers
    summary = dict(
        kernel_median_us=statistics.median(side["today"]) * 1e6,
        baseline=args.baseline,
        baseline_kernel_median_us=(statistics.median(side["baseline"]) * 1e6 if base else None),
        kernel_over_baseline=(
            statistics.median(side["today"]) / statistics.median(side["baseline"]) if base else None
        ),  # fmt: skip
        makespan_vs_baseline=same,
        per_layer_stream_us=statistics.median(stream) / n * 1e6,
        per_layer_stream_best_us=min(stream) / n * 1e6,
        per_layer_median_us={k: v * 1e6 for k, v in med.items()},
        per_layer_max_us={k: max(v) * 1e6 for k, v in per_layer.items()},
        solve_dispatch_over_highs_token_lp=med["solve_dispatch"] / med["token_lp_highs"],
        solve_dispatch_over_highs_interleaved=(
            med["solve_dispatch_interleaved"] / med["token_lp_highs_interleaved"]
        ),
        solve_dispatch_over_highs_cpu=med["solve_dispatch_cpu"] / med["token_lp_highs_cpu"],
        stack_over_solve_stack=summary_stack_ratio(stack_runs),
        stack_ms={k: v * 1e3 for k, v in stack_median.items()},
        stack_best_ms={k: v * 1e3 for k, v in stack_best.items()},
        full_replication_stream_us=statistics.median(full_stream) / n * 1e6,
        full_replication_layer_median_us=statistics.median(full_layer) * 1e6,
        full_replication_layer_max_us=max(full_layer) * 1e6,
        n_layers=n,
        threads=numba.get_num_threads(),
        repaired_layers=sum(bool(ex["repaired"]) for ex in res.extras["layers"]),
        mean_gap_to_lower_bound=float(np.mean(res.gap)),
    )
    if args.compile:
        summary["compile_s"] = compile_time(base_dir if base else None)
    print(f"E=256, g=8, 256 tokens/GPU, cost {args.cost}, skew {args.skew}, "
          f"{numba.get_num_threads()} threads")  # fmt: skip
    if base is not None:
        print(f"kernel path side by side (median over layers of the best of {repeats}): "
              f"today {summary['kernel_median_us']:.1f} us, baseline {args.baseline} "
              f"{summary['baseline_kernel_median_us']:.1f} us, ratio "
              f"{summary['kernel_over_baseline']:.2f} (goal <= 1.5); makespan today/baseline "
              f"max {same['today_over_baseline_makespan_max']:.5f}")  # fmt: skip
    print(f"HEADLINE per layer, streaming {n} different layers: "
          f"median {summary['per_layer_stream_us']:.1f} us "
          f"(best pass {summary['per_layer_stream_best_us']:.1f} us)")  # fmt: skip
    print(f"{'per layer (same layer)':>24} {'median us':>11} {'max us':>10}")
    for k in per_layer:
        print(f"{k:>24} {med[k] * 1e6:11.1f} {max(per_layer[k]) * 1e6:10.1f}")
    print(f"solve_dispatch / HiGHS token LP: {summary['solve_dispatch_over_highs_token_lp']:.3f}; "
          f"timed alternately {summary['solve_dispatch_over_highs_interleaved']:.3f}, in CPU "
          f"time {summary['solve_dispatch_over_highs_cpu']:.3f} (goal <= 0.05); repaired "
          f"layers {summary['repaired_layers']}/{n}")  # fmt: skip
    print(f"{f'{n}-layer stack':>24} {'median ms':>11} {'best ms':>10}")
    for k in stack_runs:
        print(f"{k:>24} {stack_median[k] * 1e3:11.3f} {stack_best[k] * 1e3:10.3f}")
    print(f"{n}-layer stack through solve_dispatch / Tempo.solve_stack: "
          f"{summary['stack_over_solve_stack']:.2f} (medians; goal <= 2)")  # fmt: skip
    print(f"full replication: streaming {summary['full_replication_stream_us']:.1f} us/layer, "
          f"per layer median {summary['full_replication_layer_median_us']:.1f} us, "
          f"max {summary['full_replication_layer_max_us']:.1f} us")  # fmt: skip
    if args.compile:
        for k, v in summary["compile_s"].items():
            print(f"cold compile, {k}: {v['cpu_s']:.1f} s CPU, {v['wall_s']:.1f} s wall")
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            dict(
                args=vars(args),
                machine=platform.platform(),
                cpu_count=os.cpu_count(),
                load_avg=os.getloadavg(),
                date=time.strftime("%Y-%m-%d %H:%M:%S"),
                summary=summary,
                per_layer_us={k: [t * 1e6 for t in v] for k, v in per_layer.items()},
                side_by_side_us={k: [t * 1e6 for t in v] for k, v in side.items()},
                stream_pass_ms=[t * 1e3 for t in stream],
                full_replication_layer_us=[t * 1e6 for t in full_layer],
            ),  # fmt: skip
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
