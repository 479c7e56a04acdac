"""tempo's kernel at two git revisions side by side: time per layer and makespan.

Both kernels take today's interface (``tempo_kernel(counts, replicas, KernelCost, lp,
assign, bound, KernelOptions)``, followed by ``stage_handles()`` in a revision that has it),
so any revision since the kernel took its cost and options by name compares with the working
tree. The revision's ``solvers/dispatch/_tempo.py`` and
``solvers/_numba/jit.py`` are extracted with ``git show`` into a private package (as
``tempo_speed.py`` does for its baseline); the token LP, semi-matching and certified bound
are computed once per layer and handed to both.

Layers:

* ``speed``: the instance of ``tempo_speed.py`` (``make_decode_problem("dsv3", n_gpus=8,
  tokens_per_gpu=256, replication=1.25, n_layers=61)``, ``dsv3_a_offline``);
* ``decode16``: the ``decode16`` family of ``tempo_quality.py`` (every preset x shape at
  g = 16, replication 1.5), where the local search's later neighbourhoods run.

Each layer is timed alternately (old, new) ``--repeats`` times, the best kept per layer;
reported: the median over layers of each, their ratio, and the makespans (how many layers
each is lower on, and the largest ratio either way). Compile time is excluded (one warm-up
call per kernel before timing). Beside them, the same way, today's whole kernel path
(``Tempo()._arrays``: token LP, semi-matching, bound, tempo, support stages) with and
without the support contraction and activation swaps (``contract``, ``swap``), which run
after the kernel.

Usage::

    nice -n 10 python benchmarks/tempo_revisions.py --old HEAD~2
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from straggler.formulations import CostModel
from straggler.sim.workloads.batches import make_decode_problem
from straggler.solvers.dispatch import _tempo as today
from straggler.solvers.dispatch._semi_matching import semi_matching_kernel
from straggler.solvers.dispatch._token_lp_fast import token_lp_kernel
from straggler.solvers.dispatch.bounds import layer_bound
from straggler.solvers.dispatch.tempo import Tempo

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from tempo_quality import instances  # noqa: E402  (this folder)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_revision(rev):
    """The tempo kernel module of git revision ``rev`` as a private package."""
    d = pathlib.Path(tempfile.mkdtemp(prefix="tempo_rev_"))
    name = "tempo_rev_" + "".join(ch if ch.isalnum() else "_" for ch in rev)
    pkg = d / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for f in ("_tempo.py", "_jit.py"):
        src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:solvers/{f}"],
                             capture_output=True, text=True, check=True)  # fmt: skip
        (pkg / f).write_text(src.stdout)
    sys.path.insert(0, str(d))
    return importlib.import_module(f"{name}._tempo")


def _kernel(mod):
    """``kernel(*args, opts)`` for the tempo module ``mod`` (its stage handles appended where
    its kernel takes them)."""
    if not hasattr(mod, "stage_handles"):
        return mod.tempo_kernel
    stages = mod.stage_handles()
    return lambda *a: mod.tempo_kernel(*a, stages)


def _layers(which):
    if which == "speed":
        stack = make_decode_problem("dsv3", n_gpus=8, tokens_per_gpu=256, skew=0.85,
                                    replication=1.25, n_layers=61, seed=0)  # fmt: skip
        cost = CostModel.preset("dsv3_a_offline")
        return [(p, cost) for p in stack.layers()]
    return [(p, CostModel.preset(c)) for _, p, c in instances(which, False)]


def _args(problem, cost):
    counts = np.ascontiguousarray(problem.counts, np.int64)
    R = np.ascontiguousarray(problem.replicas)
    c = cost.as_array()
    lp, num, den = token_lp_kernel(counts, R)
    assign, sm, _ = semi_matching_kernel(R, counts > 0)
    bound = layer_bound(counts, R, cost, c, sm, num / den)
    return counts, R, today.kernel_cost(c), lp, assign, bound


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="git revision of the kernel to compare")
    ap.add_argument("--sets", default="speed,decode16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(results_dir() / "tempo_revisions.json"))
    args = ap.parse_args(argv)
    old = load_revision(args.old)
    old_kernel, new_kernel = _kernel(old), _kernel(today)
    opts = Tempo()._opts()  # (a KernelOptions: an older kernel reads its fields by name)
    full, bare = Tempo(), Tempo(contract=False, swap=False)
    summary = {}
    for which in [s for s in args.sets.split(",") if s]:
        t_old, t_new, m_old, m_new = [], [], [], []
        t_bare, t_full, m_bare, m_full = [], [], [], []
        for problem, cost in _layers(which):
            a = _args(problem, cost)
            c = cost.as_array()
            pa = (cost, a[2], c, a[0], a[1])
            lb, lf = bare._arrays(*pa), full._arrays(*pa)
            bb = bf = math.inf
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                bare._arrays(*pa)
                t1 = time.perf_counter()
                full._arrays(*pa)
                t2 = time.perf_counter()
                bb, bf = min(bb, t1 - t0), min(bf, t2 - t1)
            t_bare.append(bb * 1e6)
            t_full.append(bf * 1e6)
            m_bare.append(lb.makespan)
            m_full.append(lf.makespan)
            _, io = old_kernel(*a, opts)  # warm-up (and compile on the first layer)
            _, inew = new_kernel(*a, opts)
            bo = bn = math.inf
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                old_kernel(*a, opts)
                t1 = time.perf_counter()
                new_kernel(*a, opts)
                t2 = time.perf_counter()
                bo, bn = min(bo, t1 - t0), min(bn, t2 - t1)
            t_old.append(bo * 1e6)
            t_new.append(bn * 1e6)
            m_old.append(float(io[0]))
            m_new.append(float(inew[0]))
        mo, mn = np.array(m_old), np.array(m_new)
        s = dict(
            layers=len(t_old),
            old_median_us=statistics.median(t_old),
            new_median_us=statistics.median(t_new),
            new_over_old_median=statistics.median(t_new) / statistics.median(t_old),
            old_total_ms=sum(t_old) / 1e3,
            new_total_ms=sum(t_new) / 1e3,
            new_max_us=max(t_new),
            old_max_us=max(t_old),
            new_lower=int((mn < mo * (1 - 1e-12)).sum()),
            old_lower=int((mo < mn * (1 - 1e-12)).sum()),
            new_over_old_makespan_max=float((mn / mo).max()),
            old_over_new_makespan_max=float((mo / mn).max()),
            path_without_5bc_median_us=statistics.median(t_bare),
            path_median_us=statistics.median(t_full),
            path_without_5bc_total_ms=sum(t_bare) / 1e3,
            path_total_ms=sum(t_full) / 1e3,
            path_max_us=max(t_full),
            path_without_5bc_max_us=max(t_bare),
            support_stages_lower=int((np.array(m_full) < np.array(m_bare) * (1 - 1e-12)).sum()),
        )
        summary[which] = s
        print(f"{which}: {s['layers']} layers; kernel median {s['old_median_us']:.1f} us "
              f"(old) vs {s['new_median_us']:.1f} us (new), ratio "
              f"{s['new_over_old_median']:.3f}; total {s['old_total_ms']:.1f} vs "
              f"{s['new_total_ms']:.1f} ms; max {s['old_max_us']:.0f} vs {s['new_max_us']:.0f} "
              f"us; makespan lower on {s['new_lower']} (new) / {s['old_lower']} (old) layers, "
              f"new/old max {s['new_over_old_makespan_max']:.5f}, old/new max "
              f"{s['old_over_new_makespan_max']:.5f}", flush=True)  # fmt: skip
        print(f"{which}: Tempo()._arrays without / with contraction and swaps: median "
              f"{s['path_without_5bc_median_us']:.1f} / {s['path_median_us']:.1f} us, total "
              f"{s['path_without_5bc_total_ms']:.1f} / {s['path_total_ms']:.1f} ms, max "
              f"{s['path_without_5bc_max_us']:.0f} / {s['path_max_us']:.0f} us; lower on "
              f"{s['support_stages_lower']} layers", flush=True)  # fmt: skip
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(args=vars(args), machine=platform.platform(),
                                   date=time.strftime("%Y-%m-%d %H:%M:%S"),
                                   summary=summary), indent=1))  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
