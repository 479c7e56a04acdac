"""EPLB's speed beside SGLang's: ours (exact DeepSeek output) vs ``deepseek`` and ``deepseek_vec``.

DeepSeek-V3 shape: 58 layers, 256 experts, 288 slots, 32 GPUs, 4 nodes, 8 groups, loads
from a window of drifting synthetic batches (:func:`straggler.sim.drifting_windows`). Each
algorithm runs ``--repeat`` times, all interleaved round by round (one process, same
load: the shared machine's noise hits all of them alike; report ratios). Ours is timed
after a first call that loads or compiles its kernels (that first call is reported apart).
``ours_sglang`` is ``version="sglang"`` (torch's tie order), compared map for map with
SGLang on the raw loads. Also reported: whether our maps equal SGLang ``deepseek``'s (exact
DeepSeek output; on the same loads made tie-free, since on equal loads torch's CPU sort,
unstable beyond 16 items, orders ties its own way while ours is stable, see
``rebalance_experts``' Notes) and each
placement's balancedness (mean over max GPU load, EPLB's metric, each expert's window load
split evenly over its replicas).

torch runs on one thread by default (``--torch-threads``; ours is single-threaded too): on a
shared machine torch's default thread pool oversubscribes the cores. SGLang's code is loaded
from its installed files (``--sglang-dir``, the
``eplb_algorithms`` folder of SGLang 0.5.23; needs torch), never copied here.

Usage::

    python benchmarks/eplb_speed.py --sglang-dir /path/to/sglang/srt/eplb/eplb_algorithms
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import platform
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.sim import drifting_windows
from straggler.solvers.placement.eplb import rebalance_experts

RESULTS = results_dir()
DEFAULT_DIR = "/work/envs/sglang/lib/python3.11/site-packages/sglang/srt/eplb/eplb_algorithms"


def _load(path: pathlib.Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def balancedness(weight, p2l, n_gpus):
    """Mean over layers of mean GPU load / max GPU load (EPLB's even split over replicas)."""
    L, P = p2l.shape
    out = []
    for l in range(L):
        cnt = np.bincount(p2l[l], minlength=weight.shape[1])
        unit = weight[l][p2l[l]] / cnt[p2l[l]]
        gpu = unit.reshape(n_gpus, P // n_gpus).sum(axis=1)
        out.append(gpu.mean() / gpu.max())
    return float(np.mean(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang-dir", default=DEFAULT_DIR)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--torch-threads", type=int, default=1, help="torch's threads (0: its default)")
    ap.add_argument("--out", default=str(RESULTS / "eplb_speed.json"))
    args = ap.parse_args(argv)
    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    d = pathlib.Path(args.sglang_dir)
    ds = _load(d / "deepseek.py", "sglang_deepseek")
    vec = _load(d / "deepseek_vec.py", "sglang_deepseek_vec")
    L, E, P, g, N, G = 58, 256, 288, 32, 4, 8
    hist = drifting_windows(
        n_windows=1, window=args.window, n_layers=L, n_experts=E, n_tokens=128 * g, top_k=8,
        skew=0.85, rng=0,
    )[0]  # fmt: skip
    weight = hist.sum(axis=0)
    tw = torch.from_numpy(weight)
    th = torch.from_numpy(hist)
    t0 = time.perf_counter()
    rebalance_experts(weight, P, G, N, g)
    first_call = time.perf_counter() - t0

    hv, gv = (P, P // g, G, N, True), (P, P // g, G, N, False)
    runs = {
        "ours_hierarchical": lambda: rebalance_experts(weight, P, G, N, g),
        "ours_global": lambda: rebalance_experts(weight, P, 1, 1, g),
        "ours_sglang_hierarchical": lambda: rebalance_experts(weight, P, G, N, g, version="sglang"),
        "ours_sglang_global": lambda: rebalance_experts(weight, P, 1, 1, g, version="sglang"),
        "sglang_deepseek_hierarchical": lambda: ds.rebalance_experts(tw, P, G, N, g, True),
        "sglang_deepseek_global": lambda: ds.rebalance_experts(tw, P, G, N, g, False),
        "sglang_deepseek_vec_hierarchical": lambda: vec.rebalance_experts(th, *hv),
        "sglang_deepseek_vec_global": lambda: vec.rebalance_experts(th, *gv),
    }  # fmt: skip
    times = {k: [] for k in runs}
    outs = {}
    for _ in range(args.repeat):
        for k, f in runs.items():
            t0 = time.perf_counter()
            outs[k] = f()
            times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in times.items()}
    p2l = {k: np.asarray(v[0]) for k, v in outs.items()}
    # Identity on the same loads made tie-free (torch's CPU sort orders equal keys of rows
    # longer than 16 its own way; ours is stable): 256 w + a permutation of 0..E-1.
    tie_free = weight * 256 + np.argsort(np.random.default_rng(1).random(weight.shape), axis=1)
    tt = torch.from_numpy(tie_free)
    identical = {
        "hierarchical": bool(
            np.array_equal(
                rebalance_experts(tie_free, P, G, N, g)[0],
                ds.rebalance_experts(tt, P, G, N, g, True)[0].numpy(),
            )
        ),
        "global": bool(
            np.array_equal(
                rebalance_experts(tie_free, P, 1, 1, g)[0],
                ds.rebalance_experts(tt, P, G, N, g, False)[0].numpy(),
            )
        ),
    }
    raw_equal = {
        mode: bool(np.array_equal(p2l[f"ours_{mode}"], p2l[f"sglang_deepseek_{mode}"]))
        for mode in ("hierarchical", "global")
    }
    # version="sglang" (torch's tie order): the three maps on the raw loads, ties included
    sglang_equal = {
        mode: all(
            np.array_equal(np.asarray(a), np.asarray(b))
            for a, b in zip(outs[f"ours_sglang_{mode}"], outs[f"sglang_deepseek_{mode}"])
        )
        for mode in ("hierarchical", "global")
    }
    bal = {k: balancedness(weight, v, g) for k, v in p2l.items()}
    ratio = {
        mode: med[f"ours_{mode}"] / med[f"sglang_deepseek_vec_{mode}"]
        for mode in ("hierarchical", "global")
    }
    print(f"{'algorithm':<34} {'median ms':>10} {'balancedness':>13}")
    for k in runs:
        print(f"{k:<34} {1e3 * med[k]:>10.2f} {bal[k]:>13.4f}")
    print(f"ours first call (kernel load or compile): {1e3 * first_call:.1f} ms")
    print(f"identical to SGLang deepseek on tie-free loads: {identical}")
    print(f"identical on the raw integer loads (ties ordered by torch's sort): {raw_equal}")
    print(f"version='sglang', all three maps identical on the raw loads: {sglang_equal}")
    print("ours / deepseek_vec: " + ", ".join(f"{m} {r:.3f}x" for m, r in ratio.items()))
    pathlib.Path(args.out).write_text(
        json.dumps(
            {
                "benchmark": "eplb_speed",
                "machine": platform.platform(),
                "note": "shared 2-core machine; medians of interleaved runs in one process",
                "shape": dict(layers=L, experts=E, slots=P, gpus=g, nodes=N, groups=G),
                "torch_threads": torch.get_num_threads(),
                "repeat": args.repeat,
                "median_s": med,
                "first_call_s": first_call,
                "identical_to_sglang_deepseek_tie_free": identical,
                "identical_to_sglang_deepseek_raw": raw_equal,
                "version_sglang_identical_maps_raw": sglang_equal,
                "balancedness": bal,
                "ours_over_deepseek_vec": ratio,
            },
            indent=1,
        )
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
