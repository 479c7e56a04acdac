"""Cold compile of the routing, bound and token-LP kernels, per kernel: CPU seconds and the
amount of code numba compiles, optionally beside an earlier checkout.

Each run is a fresh subprocess on a fresh, empty ``NUMBA_CACHE_DIR``. It compiles, in order:
``route_batch`` with ``jsq``, ``br0``, ``brh`` and ``brs`` (the entry kernel
``route_batch_kernel`` and each policy's kernel), ``lower_bound_kernel``, ``token_lp_kernel``
and the three support kernels (on the argument types ``solve_dispatch`` passes). Per top-level
kernel (its jitted callees compiled for it included; a numba overload shared by several is
counted where it is first compiled) it records:

* ``cpu_s``: thread CPU seconds between numba's ``numba:compile`` events;
* ``lowered``: LLVM instructions numba's lowering produced (every function of every module
  added to a code library: bodies, CPython and C wrappers);
* ``optimized``: LLVM instructions in the modules numba's final optimization ran over
  (``CPUCodeLibrary._optimize_final_module``, read before it runs: a caller's module includes
  every callee linked into it);
* ``libraries``: how many code libraries were finalized.

The last three do not depend on the machine's load (CPU seconds on a busy machine vary by
10-20% from run to run): they show what a change removed, the CPU seconds what it is worth.
The counts are read by wrapping two methods of ``numba.core.codegen.CPUCodeLibrary`` in the
child process (numba 0.68 internals; measurement only).

``--old PATH`` runs an earlier checkout of this repository too (imported through a temporary
folder whose ``straggler`` links to it), alternating with this one run by run.

    python benchmarks/compile_kernels.py [--reps 3] [--old PATH]

Writes ``straggler-results/compile_kernels.json`` and prints a table (medians over the runs).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

from _results import results_dir  # benchmarks/_results.py (the scripts' folder)

RESULTS = results_dir()
ROOT = pathlib.Path(__file__).resolve().parents[1]
POLICIES = ("jsq", "br0", "brh", "brs")


def _child() -> dict:
    """Runs in the subprocess: compile every kernel, return the per-kernel records."""
    import time

    from numba.core import codegen
    from numba.core import event as ev

    stack: list = []
    out: dict = {}

    def rec(key):
        return out.setdefault(key, {"cpu_s": 0.0, "lowered": 0, "optimized": 0, "libraries": 0})

    class Listener(ev.Listener):
        def on_start(self, event):
            py = event.data["dispatcher"].py_func
            stack.append((f"{py.__module__.split('.')[-1]}.{py.__name__}", time.thread_time()))

        def on_end(self, event):
            key, t0 = stack.pop()
            if not stack:
                rec(key)["cpu_s"] += time.thread_time() - t0

    ev.register("numba:compile", Listener())
    optimize = codegen.CPUCodeLibrary._optimize_final_module
    add = codegen.CPUCodeLibrary.add_ir_module

    def count(module):  # an llvmlite.ir.Module (lowered) or a binding ModuleRef (linked)
        return sum(
            1
            for f in module.functions
            if not f.is_declaration
            for b in f.blocks
            for _ in b.instructions
        )

    def optimize_counted(self):
        r = rec(stack[0][0] if stack else "?")
        r["optimized"] += count(self._final_module)
        r["libraries"] += 1
        return optimize(self)

    def add_counted(self, module):
        rec(stack[0][0] if stack else "?")["lowered"] += count(module)
        return add(self, module)

    codegen.CPUCodeLibrary._optimize_final_module = optimize_counted
    codegen.CPUCodeLibrary.add_ir_module = add_counted

    import numpy as np
    from straggler.solvers.dispatch import _bounds, _token_lp_fast
    from straggler.solvers.routing.route import route_batch

    for policy in POLICIES:
        route_batch([900, 120, 40, 300, 7], [5000, 4200, 4800, 3000], [2, 2, 1, 2], policy=policy)
    counts = np.array([5, 3, 0], np.int64)
    replicas = np.ones((3, 2), bool)
    counts.setflags(write=False)  # solve_dispatch passes a problem's read-only arrays
    replicas.setflags(write=False)
    cost = np.array([0, 1, 0, 0, 0.1, 0, 0, 128.0])
    shares = np.array([[5, 0], [0, 3], [0, 0]], np.int64)
    _bounds.lower_bound_kernel(counts, replicas, cost, 2)
    _token_lp_fast.token_lp_kernel(counts, replicas)
    lp = _token_lp_fast.token_lp_handle()
    _token_lp_fast.support_rebalance_kernel(counts, shares, cost, lp)
    _token_lp_fast.support_contract_kernel(counts, shares, cost, lp)
    _token_lp_fast.support_swap_kernel(counts, replicas, shares, cost, 4, lp)
    return out


def _run(pythonpath: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="compile_kernels_") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        p = subprocess.run(
            [sys.executable, __file__, "--child"],
            env=env,
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--old", help="an earlier checkout, run beside this one")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child()))
        return {}
    trees = {"this": None}
    links = None
    if args.old:
        links = tempfile.TemporaryDirectory(prefix="compile_kernels_old_")
        os.symlink(pathlib.Path(args.old).resolve(), pathlib.Path(links.name) / "straggler")
        trees = {"old": links.name, "this": None}
    runs: dict = {t: [] for t in trees}
    for _ in range(args.reps):
        for t, path in trees.items():
            runs[t].append(_run(path))
    fields = ("cpu_s", "lowered", "optimized", "libraries")
    kernels = sorted({k for t in runs for r in runs[t] for k in r if k != "?"})
    table = {
        t: {
            k: {f: statistics.median(r.get(k, {}).get(f, 0) for r in runs[t]) for f in fields}
            for k in kernels
        }
        for t in trees
    }
    for t in trees:
        table[t]["TOTAL"] = {f: sum(table[t][k][f] for k in kernels) for f in fields}
    head = f"{'kernel':42s}" + "".join(
        f" {f + (' ' + t if len(trees) > 1 else ''):>17s}" for f in fields for t in trees
    )
    print(head)
    print("-" * len(head))
    for k in [*kernels, "TOTAL"]:
        row = f"{k:42s}"
        for f in fields:
            for t in trees:
                v = table[t][k][f]
                row += f" {v:17.2f}" if f == "cpu_s" else f" {int(v):17d}"
        print(row)
    print(f"medians of {args.reps} run(s) per tree, each a fresh process on an empty cache")
    out = {"reps": args.reps, "old": args.old, "runs": runs, "median": table}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compile_kernels.json").write_text(json.dumps(out, indent=1))
    if links is not None:
        links.cleanup()
    return out


if __name__ == "__main__":
    main()
