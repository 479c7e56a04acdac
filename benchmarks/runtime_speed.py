"""Speed of the runtime adapter: the dispatch kernel per batch size, the solver worker's refresh.

Part 1, dispatch (``--skip-kernel`` to leave it out). DeepSeek-V3 shape: E = 256 experts,
top-8, an EPLB placement with 1.25x replication over 8 GPUs (``straggler.sim.workloads.batches``),
Zipf-skewed ids with 5% padding rows; batches of 4k-64k tokens x 8. Side by side on the one
device that exists (CUDA if present, else the CPU):

* ``bincount``: a bare ``torch.bincount`` over the same valid ids (prepared outside the
  timing: the count an engine already pays);
* ``torch_ref``: :func:`~straggler.runtime._dispatch_kernels.dispatch_torch` (map + count);
* ``triton``: the fused kernel, one launch, eager and replayed in a CUDA graph (CUDA only;
  the CPU interpreter is a correctness tool, not a speed measure, so it is not timed).

CUDA times come from CUDA events (median of ``--repeats`` after warm-up), CPU times from
``perf_counter`` with one torch thread (``--torch-threads``; on a shared 2-core machine more
threads measure the other jobs); the compile (first call) is timed apart.

Part 2, worker refresh. A 61-layer model (same shape and placement), count windows of
``--steps-per-window`` decode steps of ``--tokens-per-gpu`` tokens per GPU, period 200 ms.
For each thread count a real :class:`~straggler.runtime.SolverWorker` is spawned, warmed up,
and fed ``--windows`` windows one period apart. Reported per refresh (medians, p95):

* ``worker_busy``: the worker's own time, shared-memory read + solve + ``to_tables`` + post;
* ``engine``: the engine side, ``submit`` (validate, write, CRC) + ``poll`` (copy, check);
* ``refresh`` = worker_busy + engine, and its ratio to the period (the goal: under 10%);
* ``latency``: submit to tables in hand, wall clock (includes the worker's <= 5 ms poll
  sleep, which costs no CPU).

The machine is shared (2 cores among several jobs when this was written): read the ratios,
measured side by side in one run, rather than the absolute figures.

Usage::

    python benchmarks/runtime_speed.py --quick
    python benchmarks/runtime_speed.py
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.formulations import CostModel
from straggler.runtime import SolverWorker
from straggler.sim.workloads.batches import eplb_placement, sample_counts, zipf_popularity

E, TOP_K, N_GPUS, REPLICATION = 256, 8, 8, 1.25


def _placement(n_layers, skew, rng):
    pop = zipf_popularity(E, skew, n_layers=n_layers, rng=rng)
    history = sum(
        sample_counts(pop, n_tokens=2048, top_k=TOP_K, rng=rng).astype(float) for _ in range(8)
    )
    return pop, eplb_placement(history, n_gpus=N_GPUS, replication=REPLICATION, num_groups=8)


def _q(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


# --- part 1: dispatch -----------------------------------------------------------------


def _graph_replay_us(fn, repeats):
    """Median time of one replay of ``fn`` captured in a CUDA graph (how an engine runs it:
    no Python launch cost). ``torch.bincount`` cannot be captured (it reads the maximum back
    to the host), so the baseline stays eager."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    out = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out)


def bench_kernel(sizes, repeats, rng):
    import torch
    from straggler.runtime._dispatch_kernels import dispatch_torch, dispatch_triton
    from straggler.runtime.dispatch_count import triton_available
    from straggler.runtime.publisher import normalize_table

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    pop, p2l = _placement(1, 0.85, rng)
    from straggler.formulations.dispatch import logical_to_physical

    l2p, _ = logical_to_physical(p2l, E)
    probs = normalize_table(rng.random(l2p.shape), l2p)
    tl2p = torch.tensor(l2p[0], device=dev)
    tprobs = torch.tensor(probs[0], dtype=torch.float32, device=dev)
    use_triton = cuda and triton_available()
    rows = []
    for n_tok in sizes:
        ids = rng.choice(E, size=(n_tok, TOP_K), p=pop[0])
        ids[rng.random(n_tok) < 0.05] = -1
        tids = torch.tensor(ids, dtype=torch.int32, device=dev)
        valid = tids.reshape(-1)[tids.reshape(-1) >= 0].to(torch.int64)

        def timed(fn):
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            first = time.perf_counter() - t0
            for _ in range(3):
                fn()
            out = []
            for _ in range(repeats):
                if cuda:
                    a, b = (
                        torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True),
                    )
                    a.record()
                    fn()
                    b.record()
                    b.synchronize()
                    out.append(a.elapsed_time(b) * 1e3)
                else:
                    t0 = time.perf_counter()
                    fn()
                    out.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(out), first

        row = {"n_tokens": n_tok, "entries": n_tok * TOP_K}
        row["bincount_us"], _ = timed(lambda v=valid: torch.bincount(v, minlength=E))
        row["torch_ref_us"], _ = timed(lambda t=tids: dispatch_torch(t, tl2p, tprobs, 0))
        if use_triton:
            row["triton_us"], row["triton_first_call_s"] = timed(
                lambda t=tids: dispatch_triton(t, tl2p, tprobs, 0)
            )
            row["triton_graph_us"] = _graph_replay_us(
                lambda t=tids: dispatch_triton(t, tl2p, tprobs, 0), repeats
            )
            row["triton_graph_over_bincount"] = row["triton_graph_us"] / row["bincount_us"]
            got = dispatch_triton(tids, tl2p, tprobs, 0)
            want = dispatch_torch(tids, tl2p, tprobs, 0)
            row["triton_equals_torch"] = bool(
                torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
            )
            row["triton_over_bincount"] = row["triton_us"] / row["bincount_us"]
        row["torch_ref_over_bincount"] = row["torch_ref_us"] / row["bincount_us"]
        rows.append(row)
        print(
            f"  {n_tok:>6} tok x {TOP_K}: bincount {row['bincount_us']:9.1f} us  "
            f"torch_ref {row['torch_ref_us']:10.1f} us ({row['torch_ref_over_bincount']:5.1f}x)"
            + (
                f"  triton {row['triton_us']:8.1f} us ({row['triton_over_bincount']:4.2f}x)"
                f", in a graph {row['triton_graph_us']:8.1f} us "
                f"({row['triton_graph_over_bincount']:4.2f}x)"
                if use_triton
                else "  triton n/a (no GPU)"
            ),
            flush=True,
        )
    return {
        "device": torch.cuda.get_device_name(0) if cuda else f"cpu ({platform.processor()})",
        "triton_timed": use_triton,
        "torch": torch.__version__,
        "rows": rows,
    }


# --- part 2: worker refresh -----------------------------------------------------------


def bench_worker(n_layers, threads, windows, steps, tokens_per_gpu, period, cost, rng):
    pop, p2l = _placement(n_layers, 0.85, rng)
    n_tok = tokens_per_gpu * N_GPUS
    stream = [
        sum(sample_counts(pop, n_tokens=n_tok, top_k=TOP_K, rng=rng) for _ in range(steps))
        for _ in range(windows)
    ]
    out = []
    for nt in threads:
        w = SolverWorker(p2l, N_GPUS, cost, period=period, n_threads=nt).start()
        try:
            t0 = time.perf_counter()
            if not w.wait_ready(900):
                raise RuntimeError(f"worker not ready: {w.status()}")
            ready_s = time.perf_counter() - t0
            busy, engine, latency, parts = (
                [],
                [],
                [],
                {"read": [], "solve": [], "tables": [], "post": []},
            )
            for counts in stream:
                next_t = time.perf_counter() + period
                t_sub = time.perf_counter()
                wid = w.submit(counts)
                submit_s = time.perf_counter() - t_sub
                tables, polls = None, []
                while tables is None and time.perf_counter() < t_sub + 10 * period:
                    tp = time.perf_counter()
                    got = w.poll()
                    polls.append(time.perf_counter() - tp)
                    if got is not None and got.window >= wid:
                        tables = got
                    else:
                        time.sleep(0.002)  # a tight loop here would take a core from the worker
                if tables is None:
                    raise RuntimeError(f"no tables for window {wid}: {w.status()}")
                latency.append(time.perf_counter() - t_sub)
                tm = tables.timings
                for k in parts:
                    parts[k].append(tm[k])
                busy.append(tm["read"] + tm["solve"] + tm["tables"] + tm["post"])
                engine.append(submit_s + polls[-1])  # the poll that returned the tables
                time.sleep(max(0.0, next_t - time.perf_counter()))
        finally:
            w.close()
        refresh = [b + e for b, e in zip(busy, engine)]
        row = {
            "n_threads": nt,
            "ready_s": ready_s,
            "worker_busy_ms": 1e3 * statistics.median(busy),
            "engine_ms": 1e3 * statistics.median(engine),
            "refresh_ms": 1e3 * statistics.median(refresh),
            "refresh_p95_ms": 1e3 * _q(refresh, 0.95),
            "latency_ms": 1e3 * statistics.median(latency),
            "latency_p95_ms": 1e3 * _q(latency, 0.95),
            "parts_ms": {k: 1e3 * statistics.median(v) for k, v in parts.items()},
        }
        row["refresh_over_period"] = row["refresh_ms"] / (1e3 * period)
        row["refresh_p95_over_period"] = row["refresh_p95_ms"] / (1e3 * period)
        out.append(row)
        p = row["parts_ms"]
        print(
            f"  threads={nt}: refresh {row['refresh_ms']:6.2f} ms (p95 "
            f"{row['refresh_p95_ms']:6.2f}) = {100 * row['refresh_over_period']:4.1f}% of "
            f"{1e3 * period:.0f} ms [read {p['read']:.2f}, solve {p['solve']:.2f}, tables "
            f"{p['tables']:.2f}, post {p['post']:.2f}, engine {row['engine_ms']:.2f}]; "
            f"latency {row['latency_ms']:.1f} ms",
            flush=True,
        )
    return {
        "n_layers": n_layers,
        "n_experts": E,
        "n_gpus": N_GPUS,
        "n_slots": int(p2l.shape[1]),
        "tokens_per_window": tokens_per_gpu * N_GPUS * steps,
        "period_s": period,
        "windows": windows,
        "rows": out,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    ap.add_argument("--skip-kernel", action="store_true")
    ap.add_argument("--skip-worker", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--windows", type=int, default=None)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--n-layers", type=int, default=61)
    ap.add_argument("--tokens-per-gpu", type=int, default=256)
    ap.add_argument("--steps-per-window", type=int, default=5)
    ap.add_argument("--period", type=float, default=0.2)
    ap.add_argument("--cost", default="dsv3_a_offline")
    ap.add_argument("--torch-threads", type=int, default=1, help="CPU timing only")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    repeats = args.repeats or (5 if args.quick else 30)
    windows = args.windows or (8 if args.quick else 40)
    sizes = [4096, 16384] if args.quick else [4096, 8192, 16384, 32768, 65536]
    res = {
        "benchmark": "runtime_speed",
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "cost": args.cost,
        "load_average_start": os.getloadavg(),
    }
    if not args.skip_kernel:
        try:
            import torch
        except ImportError:
            print("dispatch: skipped (torch not installed: pip install 'straggler[runtime]')")
        else:
            if not torch.cuda.is_available():
                torch.set_num_threads(args.torch_threads)
            print(f"dispatch (E={E}, top-{TOP_K}, EPLB x{REPLICATION}):", flush=True)
            res["dispatch"] = bench_kernel(sizes, repeats, rng)
    if not args.skip_worker:
        threads = [int(t) for t in args.threads.split(",")]
        print(
            f"worker refresh ({args.n_layers} layers, {args.tokens_per_gpu} tok/GPU x "
            f"{args.steps_per_window} steps per window, cost {args.cost}):",
            flush=True,
        )
        res["worker"] = bench_worker(
            args.n_layers,
            threads,
            windows,
            args.steps_per_window,
            args.tokens_per_gpu,
            args.period,
            CostModel.preset(args.cost),
            rng,
        )
    res["load_average_end"] = os.getloadavg()
    name = "runtime_speed_quick.json" if args.quick else "runtime_speed.json"
    out = pathlib.Path(args.out) if args.out else results_dir() / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
