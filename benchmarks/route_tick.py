"""Tick time of ``route_batch``: BR-0 (both stages), BR-H, JSQ, BR-S and the plain-Python reference.

Every configuration is timed in one run, side by side, through the public
``straggler.solvers.route_batch`` (validation and result object included; BR-0, BR-H, JSQ and
BR-S interleaved call by call, so their ratios see the same machine load), each beside the
``runtime_s`` its results report (its kernel and the tick summary, timed inside the jitted
call: the rest of a call is the Python entry's validation, boxing and result), plus the bare
BR-0 kernel called from Python (its compiled code for the records' types, :func:`bare`: the
call unboxes the records, without numba's type dispatch) and the plain-Python reference
``br0_reference`` on the same states. BR-S (the default)
is timed twice: with no pool waits (JSQ's path) and with every request waiting at least its
default ``patience`` ticks (its backlog path).

States: ``G`` replicas with 32 running requests each (prompt lengths from the Azure 2023
conversation trace when ``../shared/data/traces`` is present, else a lognormal fitted to it:
median 1,020, mean 1,155 tokens; decoded so far uniform in [0, 400)); a pool of ``n`` ready
requests with prefill lengths from the same source. Stage 1: ``2*ceil(n/G) + R_max`` free
slots per replica (``S_tot > S_greedy = G*R_max`` at the start); Stage 2: ``R_max`` free slots
per replica (``S_tot = S_greedy``: Stage 2 from the first pop). 64 distinct states are cycled.

Paper (BalanceRoute, G = 8, Python proxy): P50 1.20 ms, P99 2.77 ms per tick. Goal here:
P50 <= 30 us and P99 <= 150 us for G = 16, pool 256.

``--old PATH`` times an earlier checkout of this repository beside this one, in the same run
(``git worktree add /tmp/tick-old main``): its ``route_batch`` (BR-0, JSQ, BR-S) interleaved
call by call with this checkout's, and its bare BR-0 kernel interleaved with this one's. It is
imported under the name ``straggler_old`` (a temporary folder of links to the checkout's
packages; the library imports itself relatively), in a process of its own whose numba cache is
a fresh temporary folder: with two copies of the record classes in one process (the same
names and fields), kernels cached by that process came to refer to the other copy, and no
later process could load them.

Writes ``straggler-results/route_tick.json`` and prints a table.

Usage: ``python benchmarks/route_tick.py [--reps 2000] [--quick] [--old PATH]``
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.solvers.routing import _balanceroute as B
from straggler.solvers.routing import _core as K
from straggler.solvers.routing.registry import router_options
from straggler.solvers.routing.route import route_batch

PATIENCE = int(B.PATIENCE.default)  # BR-S's backlog threshold (ticks)

OUT = results_dir() / "route_tick.json"
TRACE = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared/data/traces"
R_MAX = 4
_OLD_CHILD = "ROUTE_TICK_OLD_CHILD"  # set in the process that imports the old checkout
_KEEP: list = []  # the old checkout's import folder, kept until the process exits


def prompt_source(rng):
    path = TRACE / "AzureLLMInferenceTrace_conv.csv"
    if path.exists():
        lens = np.loadtxt(path, delimiter=",", skiprows=1, usecols=1)
        return "azure_conv_2023", lambda k: rng.choice(lens, k).astype(np.float64)
    sigma = math.sqrt(2 * math.log(1155 / 1020))
    return "lognormal(median 1020, mean 1155)", lambda k: np.round(
        rng.lognormal(math.log(1020), sigma, k)
    )


def make_states(G, n, stage, draw, rng, count=64):
    per = 2 * math.ceil(n / G) + R_MAX if stage == 1 else R_MAX
    states = []
    for _ in range(count):
        running = draw(G * 32) + rng.integers(0, 400, G * 32)
        loads = running.reshape(G, 32).sum(axis=1)
        states.append((draw(n), loads.astype(np.float64), np.full(G, per, np.int64)))
    return states


def br0_records(K, options, G):
    """BR-0's ``(options, carry)`` records for ``G`` replicas (``K``, ``options``: the records'
    module and ``router_options`` of this checkout or of an older one, whose option and carry
    records held every policy's fields)."""
    if hasattr(K, "RouterCarry"):  # an older checkout
        opts = options(G, r_max=R_MAX, s_greedy=G * R_MAX, beta=float(G))[0]
        return opts, K.RouterCarry(0, 0, 0, 0, False)
    return options("br0", G, r_max=R_MAX, s_greedy=G * R_MAX)


def kernel_state(s, L, f, K=K, carry=None):
    """The kernels' ``(pool, reps, carry)`` for lengths ``s``, loads ``L`` (G,), free slots
    (``K``: the records' module; ``carry``: BR-0's, :func:`br0_records`)."""
    G, n = L.shape[0], s.shape[0]
    reps = K.ReplicaState(
        L.reshape(-1, 1).copy(),
        f,
        np.zeros(G, np.int64),
        np.zeros(G, np.int64),
        np.zeros(G),
        np.zeros(G),
        np.zeros(G),
        np.full(G, np.inf),
    )
    pool = K.PoolState(s, np.zeros(n, np.int64), np.arange(n), np.zeros((0, G)))
    return pool, reps, carry


def _summary(t, reps):
    t = np.asarray(t) * 1e6
    return {
        "p50_us": float(np.percentile(t, 50)),
        "p99_us": float(np.percentile(t, 99)),
        "mean_us": float(t.mean()),
        "reps": int(reps),
    }


def bare(kernel, pool, reps, opts, carry):
    """``kernel(pool, reps, opts, carry, 0)`` by its compiled code for these arguments' types.

    Called through its dispatcher, each call would also type its arguments (the records are
    NamedTuples, which numba's dispatcher types afresh: microseconds per call), and with two
    copies of the records' classes in one process (``--old``) the copy typed second took
    hundreds of microseconds per call.
    """
    from numba import typeof

    f = kernel.compile(tuple(typeof(a) for a in (pool, reps, opts, carry, 0)))
    return lambda pool, reps, c: f(pool, reps, opts, c, 0)


def timeit(fn, states, reps):
    fn(*states[0])  # warm (JIT compiled and cached)
    t = np.empty(reps)
    for r in range(reps):
        st = states[r % len(states)]
        t0 = time.perf_counter()
        fn(*st)
        t[r] = time.perf_counter() - t0
    return _summary(t, reps)


def timeit_together(configs, reps, in_jit=True):
    """Time several ``name -> (fn, states)`` interleaved, one call of each per round, so that
    their ratios see the same machine load. With ``in_jit``, beside each ``<name>_in_jit``: the
    ``runtime_s`` its results report (the policy's kernel and the tick summary, timed inside
    the jitted call), read after the timed call."""
    for fn, states in configs.values():
        fn(*states[0])
    t = {k: np.empty(reps) for k in configs}
    inner = {k: np.empty(reps) for k in configs}
    for r in range(reps):
        for k, (fn, states) in configs.items():
            st = states[r % len(states)]
            t0 = time.perf_counter()
            d = fn(*st)
            t[k][r] = time.perf_counter() - t0
            if in_jit:
                inner[k][r] = d.runtime_s
    out = {k: _summary(v, reps) for k, v in t.items()}
    if in_jit:
        out.update({f"{k}_in_jit": _summary(v, reps) for k, v in inner.items()})
    return out


def load_old(path):
    """``(route_batch, _balanceroute, _routing_core, router_options)`` of the checkout at
    ``path``, imported as ``straggler_old``."""
    root = pathlib.Path(path).resolve()
    tmp = tempfile.TemporaryDirectory(prefix="route_tick_old_")  # removed at exit
    _KEEP.append(tmp)
    ns = pathlib.Path(tmp.name) / "straggler_old"
    ns.mkdir()
    for pkg in ("formulations", "solvers", "baselines", "proofs", "sim", "runtime"):
        if (root / pkg).is_dir():
            (ns / pkg).symlink_to(root / pkg)
    sys.path.insert(0, str(ns.parent))
    mod = importlib.import_module
    if (root / "solvers" / "routing" / "route.py").exists():  # solvers split by problem
        names = ("routing.route", "routing._balanceroute", "routing._core", "routing.registry")
    else:
        names = ("routing", "_balanceroute", "_routing_core", "routing_registry")
    route, br, core, registry = (mod(f"straggler_old.solvers.{m}") for m in names)
    return route.route_batch, br, core, registry.router_options


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="G = 16, pool 256 only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--old", help="an earlier checkout, timed beside this one in the same run")
    args = ap.parse_args(argv)
    if args.old and os.environ.get(_OLD_CHILD) != "1":
        argv = sys.argv[1:] if argv is None else list(argv)
        with tempfile.TemporaryDirectory(prefix="route_tick_numba_") as cache:
            env = dict(os.environ, NUMBA_CACHE_DIR=cache, **{_OLD_CHILD: "1"})
            subprocess.run([sys.executable, __file__, *argv], env=env, check=True)
        return json.loads(OUT.read_text())
    old = load_old(args.old) if args.old else None
    rng = np.random.default_rng(args.seed)
    source, draw = prompt_source(rng)
    grid = [(16, 256)] if args.quick else [(G, n) for G in (8, 16) for n in (16, 64, 256, 1024)]
    rows = []
    for G, n in grid:
        for stage in (1, 2):
            states = make_states(G, n, stage, draw, rng)
            p, c0 = br0_records(K, router_options, G)
            kstates = [kernel_state(s, L, f, K, c0) for s, L, f in states]
            ref_reps = max(3, min(200, 200_000 // (n * n)))
            # BR-H on (G, 81) projected loads (H = 80, the paper's horizon), gamma = 0.98
            hstates = [
                (s, L[:, None] + np.linspace(0, -0.5, 81)[None, :] * L[:, None], f)
                for s, L, f in states
            ]
            waits = [(s, L, f, np.arange(s.size)[::-1] + PATIENCE) for s, L, f in states]
            before = {}
            if old:
                rb = old[0]
                before = {
                    "old_br0": (lambda s, L, f, rb=rb: rb(s, L, f, policy="br0"), states),
                    "old_jsq": (lambda s, L, f, rb=rb: rb(s, L, f, policy="jsq"), states),
                    "old_brs": (lambda s, L, f, rb=rb: rb(s, L, f), states),
                }
            res = timeit_together(
                {
                    **before,
                    "br0": (lambda s, L, f: route_batch(s, L, f, policy="br0"), states),
                    "brh_h80": (
                        lambda s, P, f: route_batch(s, P, f, policy="brh", gamma=0.98),
                        hstates,
                    ),
                    "jsq": (lambda s, L, f: route_batch(s, L, f, policy="jsq"), states),
                    # the default policy: JSQ's path (nobody waited) and the saturated one
                    "brs": (lambda s, L, f: route_batch(s, L, f), states),
                    "brs_saturated": (
                        lambda s, L, f, w: route_batch(s, L, f, pool_wait=w),
                        waits,
                    ),
                },
                args.reps,
            )
            if old:
                _, B_old, K_old, options_old = old
                p_old, K_old_c = br0_records(K_old, options_old, G)
                kstates_old = [kernel_state(s, L, f, K_old, K_old_c) for s, L, f in states]
                res.update(
                    timeit_together(
                        {
                            "old_br0_kernel": (
                                bare(B_old.br0_kernel, *kstates_old[0][:2], p_old, K_old_c),
                                kstates_old,
                            ),
                            "br0_kernel": (bare(B.br0_kernel, *kstates[0][:2], p, c0), kstates),
                        },
                        args.reps,
                        in_jit=False,
                    )
                )
            else:
                res["br0_kernel"] = timeit(
                    bare(B.br0_kernel, *kstates[0][:2], p, c0), kstates, args.reps
                )
            res["br0_reference"] = timeit(
                lambda pool, reps, c, p=p: B.br0_reference(pool, reps, p, c, 0),
                kstates,
                ref_reps,
            )
            res["brh_over_br0_p99"] = res["brh_h80"]["p99_us"] / res["br0"]["p99_us"]
            res["brh_over_br0_p50"] = res["brh_h80"]["p50_us"] / res["br0"]["p50_us"]
            d = route_batch(*states[0], policy="br0")
            rows.append(
                {
                    "G": G,
                    "pool": n,
                    "stage": stage,
                    "stage_reported": d.stage,
                    "free_per_replica": int(states[0][2][0]),
                    "placed": d.n_placed,
                    **res,
                }
            )
    out = {
        "benchmark": "route_tick",
        "prompt_source": source,
        "r_max": R_MAX,
        "paper": {"p50_ms": 1.20, "p99_ms": 2.77, "G": 8},
        "goal": {"G": 16, "pool": 256, "p50_us": 30, "p99_us": 150, "brh_over_br0_p99": 5.0},
        "note": "timed on a 2-core machine shared with other jobs: ratios within a run only",
        "old": args.old,
        "machine": platform.platform(),
        "python": platform.python_version(),
        "rows": rows,
    }
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1))
    hdr = (
        f"{'G':>3} {'pool':>5} {'st':>2} {'placed':>6} | {'BR-0 p50':>9} {'p99':>8} | "
        f"{'in-jit':>6} | {'JSQ p50':>8} {'p99':>7} | {'BR-S p50':>8} {'sat.':>6} | "
        f"{'kernel p50':>10} | "
        f"{'ref p50':>10} | {'BR-H80 p50':>10} {'p99':>8} {'/BR-0':>6}   (us)"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            f"{r['G']:>3} {r['pool']:>5} {r['stage']:>2} {r['placed']:>6} | "
            f"{r['br0']['p50_us']:>9.1f} {r['br0']['p99_us']:>8.1f} "
            f"{r['br0_in_jit']['p50_us']:>6.1f} | "
            f"{r['jsq']['p50_us']:>8.1f} {r['jsq']['p99_us']:>7.1f} | "
            f"{r['brs']['p50_us']:>8.1f} {r['brs_saturated']['p50_us']:>6.1f} | "
            f"{r['br0_kernel']['p50_us']:>10.1f} | {r['br0_reference']['p50_us']:>10.0f} | "
            f"{r['brh_h80']['p50_us']:>10.1f} {r['brh_h80']['p99_us']:>8.1f} "
            f"{r['brh_over_br0_p99']:>5.1f}x"
        )
    if old:
        hdr = (
            f"{'G':>3} {'pool':>5} {'st':>2} | {'BR-0 p50':>8} {'old':>6} {'p99':>7} {'old':>7} | "
            f"{'in-jit':>6} {'old':>6} | {'kernel p50':>10} {'old':>6} {'p99':>6} {'old':>6} | "
            f"{'JSQ p50':>7} {'old':>6} | {'BR-S p50':>8} {'old':>6}   (us; old: --old {args.old})"
        )
        print(hdr)
        print("-" * len(hdr))
        for r in rows:
            print(
                f"{r['G']:>3} {r['pool']:>5} {r['stage']:>2} | "
                f"{r['br0']['p50_us']:>8.1f} {r['old_br0']['p50_us']:>6.1f} "
                f"{r['br0']['p99_us']:>7.1f} {r['old_br0']['p99_us']:>7.1f} | "
                f"{r['br0_in_jit']['p50_us']:>6.1f} {r['old_br0_in_jit']['p50_us']:>6.1f} | "
                f"{r['br0_kernel']['p50_us']:>10.1f} {r['old_br0_kernel']['p50_us']:>6.1f} "
                f"{r['br0_kernel']['p99_us']:>6.1f} {r['old_br0_kernel']['p99_us']:>6.1f} | "
                f"{r['jsq']['p50_us']:>7.1f} {r['old_jsq']['p50_us']:>6.1f} | "
                f"{r['brs']['p50_us']:>8.1f} {r['old_brs']['p50_us']:>6.1f}"
            )
    print(
        f"prompt lengths: {source}; paper: P50 1200 us, P99 2770 us (G = 8); goals G=16 pool "
        "256: BR-0 P50 <= 30 us, P99 <= 150 us; BR-H (H = 80) P99 <= 5x BR-0's (the /BR-0 "
        "column: P99 over P99, interleaved in one run); in-jit: BR-0's own runtime_s P50 (its "
        "kernel and the tick summary inside the jitted call); kernel: br0_kernel's compiled "
        "code called from Python on the kernel's records"
    )
    return out


if __name__ == "__main__":
    main()
