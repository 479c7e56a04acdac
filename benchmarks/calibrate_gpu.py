"""Time the grouped expert GEMM on a CUDA GPU over a (G, N) grid and fit the cost model.

TEMPO §4.1 / App. B: the cost table is fitted, not derived. For every number of activated
experts ``G`` and tokens per expert ``n`` of the grid, this times one GPU's MoE expert
computation, ``G`` experts of ``n`` tokens each (the expert FFN: ``x @ w13`` (gate and up,
``[hidden, 2 * ffn]``), SiLU-and-mul, ``@ w2`` (``[ffn, hidden]``), or ``--part w13`` alone,
the ANCHORS.md H20 figure's scope), writes the ``G, N, T, t_us`` log that
:func:`straggler.solvers.fit_cost_model` reads (``T = G * ceil(n / 128)`` M-tiles), and
fits it (tile term included; ``--pieces 3`` for three pieces).

Timing as App. B: CUDA-graph replays of ``--reps`` back-to-back calls (median over
``--repeats`` replays), each call on a different copy of the experts' weights, rotating
over enough copies to exceed ``--l2-mib`` of cache (weights never come from L2), after a
warm-up. Kernels: ``bmm`` (one batched GEMM over ``[G, n, hidden]``: with equal tokens
per expert it is a grouped GEMM), ``grouped_mm`` (``torch._grouped_mm`` with offsets,
Hopper and newer, bf16), ``loop`` (one GEMM per expert, the paper's "bf16 loop"). The
grid is App. B's: G in 1..40, tokens per expert 1..4096 on a log2 ladder.

Without a CUDA device (or without torch) it says so and exits 0: there is nothing to
time. ``--device cpu`` runs the same pipeline on the CPU, for testing the script only
(CPU timings are not a GPU calibration).

Usage::

    python benchmarks/calibrate_gpu.py                       # Qwen3-235B expert shape, bf16
    python benchmarks/calibrate_gpu.py --hidden 7168 --ffn 2048 --name dsv3   # DeepSeek-V3
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import platform
import statistics
import sys
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.solvers import fit_cost_model
from straggler.solvers.dispatch.calibration import write_calibration_log

RESULTS = results_dir()
G_GRID = "1,2,4,8,12,16,24,32,40"
TOKENS = ",".join(str(2**k) for k in range(13))


def _ints(text: str) -> list[int]:
    vals = [int(v) for v in text.split(",") if v.strip()]
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def expert_ffn(x, w13, w2, *, kernel: str, part: str):
    """The experts' computation on ``x [G, n, hidden]`` (``kernel`` bmm or loop)."""
    import torch

    if kernel == "loop":
        outs = []
        for e in range(x.shape[0]):
            h = x[e] @ w13[e]
            if part == "w13":
                outs.append(h)
                continue
            gate, up = h.chunk(2, dim=-1)
            outs.append((torch.nn.functional.silu(gate) * up) @ w2[e])
        return torch.stack(outs)
    h = torch.bmm(x, w13)
    if part == "w13":
        return h
    gate, up = h.chunk(2, dim=-1)
    return torch.bmm(torch.nn.functional.silu(gate) * up, w2)


def expert_ffn_grouped(x, w13, w2, offs, *, part: str):
    """The same with ``torch._grouped_mm`` on ``x [N, hidden]`` and group ends ``offs``."""
    import torch

    h = torch._grouped_mm(x, w13, offs=offs)
    if part == "w13":
        return h
    gate, up = h.chunk(2, dim=-1)
    return torch._grouped_mm(torch.nn.functional.silu(gate) * up, w2, offs=offs)


def _time_cpu(fn, calls, reps, repeats):
    fn(calls[0])
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for r in range(reps):
            fn(calls[r % len(calls)])
        samples.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(samples)


def _time_cuda(fn, calls, reps, repeats):
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls[: min(3, len(calls))]:
            fn(c)  # warm-up (and lazy kernel selection) outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for r in range(reps):
                fn(calls[r % len(calls)])
        run = graph.replay
    except Exception:  # noqa: BLE001 - a kernel that cannot be captured: time it eagerly

        def run():
            for r in range(reps):
                fn(calls[r % len(calls)])

    run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(samples)


def measure(G, n, *, hidden, ffn, dtype, device, kernel, part, reps, repeats, l2_mib, gen):
    """Median microseconds of one call of ``G`` experts x ``n`` tokens."""
    import torch

    out_dim = 2 * ffn
    per_expert = (hidden * out_dim + (0 if part == "w13" else ffn * hidden)) * dtype.itemsize
    copies = max(2, math.ceil(2 * l2_mib * 2**20 / max(1, G * per_expert)))
    copies = min(copies, reps)
    calls = []
    for _ in range(copies):
        w13 = torch.randn(G, hidden, out_dim, generator=gen, dtype=torch.float32).to(device, dtype)
        w2 = (
            None
            if part == "w13"
            else torch.randn(G, ffn, hidden, generator=gen, dtype=torch.float32).to(device, dtype)
        )
        x = torch.randn(G, n, hidden, generator=gen, dtype=torch.float32).to(device, dtype)
        if kernel == "grouped_mm":
            offs = torch.arange(1, G + 1, device=device, dtype=torch.int32) * n
            calls.append((x.reshape(G * n, hidden), w13, w2, offs))
        else:
            calls.append((x, w13, w2))
    if kernel == "grouped_mm":

        def fn(c):
            return expert_ffn_grouped(*c[:3], c[3], part=part)
    else:

        def fn(c):
            return expert_ffn(*c, kernel=kernel, part=part)

    timer = _time_cuda if device.startswith("cuda") else _time_cpu
    return timer(fn, calls, reps, repeats)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=4096, help="model width (Qwen3-235B: 4096)")
    ap.add_argument("--ffn", type=int, default=1536, help="expert FFN width (Qwen3-235B: 1536)")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    ap.add_argument("--part", choices=["ffn", "w13"], default="ffn")
    ap.add_argument("--kernel", choices=["auto", "bmm", "grouped_mm", "loop"], default="auto")
    ap.add_argument("--experts", type=_ints, default=_ints(G_GRID), help="G values")
    ap.add_argument("--tokens", type=_ints, default=_ints(TOKENS), help="tokens per expert")
    ap.add_argument("--reps", type=int, default=30, help="calls per CUDA-graph replay")
    ap.add_argument("--repeats", type=int, default=5, help="replays timed (median)")
    ap.add_argument("--l2-mib", type=float, default=64.0, help="cache to defeat (MiB)")
    ap.add_argument("--pieces", type=int, choices=[2, 3], default=2)
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (tests)")
    ap.add_argument("--name", default="qwen3_235b", help="expert shape's name for the files")
    ap.add_argument("--out", default=None, help="CSV log (default results/calibration_<...>.csv)")
    ap.add_argument("--fit-out", default=None, help="fit JSON (default beside the log)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("calibrate_gpu: torch is not installed (pip install 'straggler[runtime]'); "
              "nothing to time.")  # fmt: skip
        return 0
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("calibrate_gpu: no CUDA device (torch.cuda.is_available() is False); nothing to "
              "time. Run it on the GPU the deployment uses.")  # fmt: skip
        return 0
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    kernel = args.kernel
    if kernel == "auto":
        kernel = (
            "grouped_mm"
            if args.device.startswith("cuda")
            and hasattr(torch, "_grouped_mm")
            and dtype == torch.bfloat16
            and torch.cuda.get_device_capability()[0] >= 9
            else "bmm"
        )
    gpu = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    gen = torch.Generator().manual_seed(args.seed)
    tag = f"{args.name}_{args.dtype}_{args.part}_{gpu.replace(' ', '_')}"
    out = pathlib.Path(args.out) if args.out else RESULTS / f"calibration_{tag}.csv"
    fit_out = pathlib.Path(args.fit_out) if args.fit_out else out.with_suffix(".fit.json")
    print(f"device {gpu}, kernel {kernel}, {args.part} of hidden {args.hidden} x ffn {args.ffn}, "
          f"{args.dtype}; {len(args.experts)} x {len(args.tokens)} grid")  # fmt: skip
    Gs, Ns, Ts, ts = [], [], [], []
    t_start = time.perf_counter()
    for G in args.experts:
        row = []
        for n in args.tokens:
            try:
                t_us = measure(
                    G, n, hidden=args.hidden, ffn=args.ffn, dtype=dtype, device=args.device,
                    kernel=kernel, part=args.part, reps=args.reps, repeats=args.repeats,
                    l2_mib=args.l2_mib, gen=gen,
                )  # fmt: skip
            except RuntimeError as exc:  # out of memory at the grid's corner: skip the point
                print(f"  G={G} n={n}: skipped ({str(exc).splitlines()[0][:80]})")
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()
                continue
            Gs.append(G)
            Ns.append(G * n)
            Ts.append(G * math.ceil(n / 128))
            ts.append(t_us)
            row.append(f"{t_us:8.1f}")
        print(f"  G={G:3d}: " + " ".join(row), flush=True)
    meta = {
        "gpu": gpu,
        "torch": torch.__version__,
        "kernel": kernel,
        "part": args.part,
        "dtype": args.dtype,
        "hidden": args.hidden,
        "ffn": args.ffn,
        "reps": args.reps,
        "repeats": args.repeats,
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    write_calibration_log(out, Gs, Ns, ts, T=Ts, meta=meta)
    fit = fit_cost_model(
        np.array(Gs, float), np.array(Ns, float), np.array(ts), T=np.array(Ts, float),
        pieces=args.pieces, bootstrap=args.bootstrap, rng=args.seed, meta=meta,
    )  # fmt: skip
    fit.save(fit_out)
    print(fit.table())
    preset = {k: round(v, 4) for k, v in fit.params.items()}
    print(f"preset for straggler.formulations.cost.PRESETS ({gpu}, {args.name}, {args.dtype}, "
          f"{args.part}, {kernel}): {json.dumps(preset)}")  # fmt: skip
    print(f"timed {len(ts)} points in {time.perf_counter() - t_start:.0f} s; wrote {out} and "
          f"{fit_out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
