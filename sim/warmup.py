"""Compile every Numba kernel a serving worker or a benchmark needs, once, before timing.

The library's kernels are ``@njit(cache=True)``: the first call in a process compiles a
kernel (tens of seconds for ``tempo`` on a cold cache) or loads it from numba's disk cache
(milliseconds). :func:`warmup` pays that first call on tiny inputs of exactly the types the
public entry points pass, so that the next ``solve_dispatch``, ``route_batch`` or
``simulate`` runs at steady-state speed, and reports where the time went (per step and per
kernel, compilation apart from cache loads).

Why it lives in ``straggler.sim``: ``straggler`` itself is a namespace package (no
``__init__.py``), so a ``straggler.warmup()`` attribute cannot exist; ``straggler.sim`` is
the highest layer of the library (it may use formulations, solvers and baselines), so it can
exercise the dispatch kernels, the routing kernels and the simulator's engine in one call.
The console script ``straggler-warmup`` runs it.

Where the cache lives: ``NUMBA_CACHE_DIR`` when set, otherwise ``__pycache__`` folders next
to the installed sources (numba falls back to a per-user folder when those are read-only).
A fresh install starts with a cold cache; reinstalling or editing a kernel's file invalidates
that file's entries.

Examples
--------
>>> rep = warmup(routing=False, simulator=False, methods=["round_robin", "tempo"])
>>> [s.name for s in rep.steps], rep.missed_kernels
(['solve_dispatch[round_robin]', 'solve_dispatch[tempo]', 'rebalance_experts'], ())
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field

import numba
import numpy as np

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem
from ..formulations.validation import check_bool, check_choice, check_type
from ..solvers._backend import PAIRS, kernel_mode
from ..solvers._compile import JitTimer, is_cached
from ..solvers.dispatch import solve_dispatch
from ..solvers.placement import warm_placement
from ..solvers.registry import dispatch_methods
from ..solvers.routing import route_batch
from ..solvers.routing_registry import routing_policies
from .traces import Trace

__all__ = [
    "warmup",
    "WarmupReport",
    "WarmupStep",
    "dispatch_kernels",
    "eplb_kernels",
    "needs_compile",
    "main",
]


def dispatch_kernels() -> dict[str, object]:
    """The kernels ``solve_dispatch`` calls from Python, by ``module.name`` (each called
    through its kernel/reference pair, :mod:`straggler.solvers._backend`)."""
    return {name: pair.kernel for name, pair in PAIRS.items()}


@dataclass(frozen=True)
class WarmupStep:
    """One call of the warm-up."""

    name: str
    """The call, e.g. ``"solve_dispatch[tempo]"``."""
    wall_s: float
    """Wall time of the call."""
    jit_s: float
    """Of which numba JIT: compiling plus loading compiled kernels from the disk cache."""
    compile_s: float
    """Of which real compilation (0 when everything came from the cache)."""
    cpu_s: float = 0.0
    """Process CPU seconds of the call (compilation is single-threaded CPU work, so on a busy
    machine this is close to what the call takes on a quiet one)."""
    compiled: dict = field(default_factory=dict)
    """Compile seconds per top-level kernel compiled in this step (callees included)."""


@dataclass(frozen=True)
class WarmupReport:
    """What :func:`warmup` did and how long it took."""

    total_s: float
    """Wall time of the whole warm-up."""
    jit_s: float
    """Seconds of numba JIT (compilation and cache loads)."""
    compile_s: float
    """Seconds of real compilation (about 0 with a warm cache)."""
    steps: tuple
    """One :class:`WarmupStep` per call, in order."""
    missed_kernels: tuple
    """Dispatch kernels (those ``solve_dispatch`` calls from Python, :func:`dispatch_kernels`)
    and EPLB's (:func:`eplb_kernels`) still without a compiled version after the warm-up: a
    later call reaching one compiles then (empty when the warm-up covers them all, which
    ``tests/test_warmup.py`` checks)."""
    cache_dir: str
    """numba's cache folder (``NUMBA_CACHE_DIR``, or ``""`` for the default beside the
    sources)."""

    @property
    def kernels(self) -> dict:
        """Compile seconds per top-level kernel over all steps."""
        out: dict = {}
        for s in self.steps:
            for k, v in s.compiled.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def summary(self) -> str:
        """One line: what was compiled and how long it took."""
        n = len(self.kernels)
        where = self.cache_dir or "numba's default cache beside the sources"
        return (
            f"warmup: {len(self.steps)} calls in {self.total_s:.1f} s; {n} kernel(s) compiled "
            f"in {self.compile_s:.1f} s, {self.jit_s - self.compile_s:.1f} s loading from the "
            f"cache ({where})"
        )

    def table(self) -> str:
        """Per-step table (seconds)."""
        head = f"{'step':32s} {'wall_s':>8s} {'jit_s':>8s} {'compile_s':>9s} {'cpu_s':>8s}"
        rows = [head, "-" * len(head)]
        for s in self.steps:
            rows.append(
                f"{s.name:32s} {s.wall_s:8.2f} {s.jit_s:8.2f} {s.compile_s:9.2f} {s.cpu_s:8.2f}"
            )
        rows.append(self.summary())
        if self.missed_kernels:
            rows.append(f"not compiled by the warm-up: {', '.join(self.missed_kernels)}")
        return "\n".join(rows)

    def as_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "total_s": self.total_s,
            "jit_s": self.jit_s,
            "compile_s": self.compile_s,
            "cache_dir": self.cache_dir,
            "missed_kernels": list(self.missed_kernels),
            "kernels": self.kernels,
            "steps": [
                {
                    "name": s.name,
                    "wall_s": s.wall_s,
                    "jit_s": s.jit_s,
                    "compile_s": s.compile_s,
                    "cpu_s": s.cpu_s,
                }
                for s in self.steps
            ],
        }


def _dispatch_cases():
    """Small layers and a stack that between them reach every dispatch kernel: full and
    restricted replication, tiles and traffic, a layer tempo's support rebalance improves
    (its kernel only runs then), and an idle layer."""
    full = np.ones((7, 2), bool)
    fig1b = DispatchProblem(counts=[600] + [30] * 6, replicas=full)
    restricted = DispatchProblem(counts=[130, 221], replicas=[[1, 1, 1], [1, 1, 0]])
    stack = DispatchProblem(
        counts=[[344, 279, 0], [0, 0, 0]], replicas=[[1, 0, 1], [1, 1, 1], [0, 1, 0]]
    )
    return [
        (fig1b, CostModel(a=0, b=15, c=0, beta=0.1)),
        (restricted, CostModel.preset("dsv2_lite_a_serving")),
        (fig1b, CostModel.preset("qwen3_235b_b_tile").replace(tile=16)),
        (stack, CostModel.preset("dsv3_a_mb_full")),
    ]


def eplb_kernels() -> dict[str, object]:
    """The kernels of DeepSeek's EPLB (:func:`straggler.solvers.eplb.rebalance_experts`), by
    ``module.name``."""
    from ..solvers import _eplb_kernels

    return {
        f"{_eplb_kernels.__name__}.{name}": getattr(_eplb_kernels, name)
        for name in ("packing_kernel", "replicate_kernel")
    }


def _eplb_cases():
    """``rebalance_experts`` in every version (each packs and replicates in its own dtypes),
    hierarchical (2 groups on 2 nodes) and global (1 group)."""
    from ..solvers.eplb import EPLB_VERSIONS, rebalance_experts

    w = np.arange(1.0, 17.0).reshape(2, 8)
    for version in EPLB_VERSIONS:
        for groups, nodes in ((2, 2), (1, 1)):
            rebalance_experts(w, 12, groups, nodes, 4, version=version)


def _routing_case(policy):
    return route_batch(
        [900, 120, 40, 300, 7],
        loads=[5000, 4200, 4800, 3000],
        free_slots=[2, 2, 1, 2],
        policy=policy,
        rng=0,
    )


def _tiny_trace() -> Trace:
    return Trace(
        arrival_s=[0.0, 0.01, 0.02, 0.03, 0.05, 0.08],
        prompt_len=[300, 20, 700, 50, 120, 900],
        output_len=[4, 9, 3, 6, 2, 5],
        prefix_hash=[1, 2, 1, 3, 2, 1],
        name="warmup",
    )


def _warmup_iv(dispatch, routing, simulator, methods, policies, verbose):
    func = "warmup"
    dispatch = check_bool(dispatch, "dispatch", func)
    routing = check_bool(routing, "routing", func)
    simulator = check_bool(simulator, "simulator", func)
    verbose = check_bool(verbose, "verbose", func)
    registered = dispatch_methods()
    if methods is None:
        methods = registered
    else:
        check_type(methods, "methods", func, (list, tuple), "a list of method names")
        methods = [check_choice(m, "methods", func, registered) for m in methods]
    registered = routing_policies()
    if policies is None:
        policies = registered
    else:
        check_type(policies, "policies", func, (list, tuple), "a list of policy names")
        policies = [check_choice(p, "policies", func, registered) for p in policies]
    return dispatch, routing, simulator, list(methods), list(policies), verbose


def warmup(
    *,
    dispatch: bool = True,
    routing: bool = True,
    simulator: bool = True,
    methods=None,
    policies=None,
    verbose: bool = False,
    placement: bool = False,
) -> WarmupReport:
    """Compile (or load from numba's disk cache) every kernel the chosen entry points use.

    Parameters
    ----------
    dispatch : bool, default True
        ``solve_dispatch`` with each of ``methods`` on small layers and a stack (tempo's
        kernels, the token-LP, semi-matching, round-robin and bound kernels; HiGHS loaded),
        then ``rebalance_experts`` (DeepSeek's EPLB) in each of its versions.
    routing : bool, default True
        ``route_batch`` with each of ``policies``.
    simulator : bool, default True
        ``simulate`` (numba engine) with each of ``policies`` on a six-request trace: the
        step loop compiles once, each policy adds its kernel (``route_batch`` compiles the
        same one).
    methods : list of str, optional
        Dispatch methods (default: every registered one).
    policies : list of str, optional
        Routing policies (default: every registered one,
        ``straggler.solvers.routing_registry.routing_policies()``).
    verbose : bool, default False
        Print each step as it finishes (to stderr).
    placement : bool, default False
        ``place_experts`` and EPLB (:func:`straggler.solvers.placement.warm_placement`).

    Returns
    -------
    WarmupReport
        Per-step wall, JIT and compile seconds, per-kernel compile seconds, the kernels
        still uncompiled, numba's cache folder. ``str(report)`` is one line.

    Notes
    -----
    A cold cache costs the full compile once per machine (the figures are in
    ``benchmarks/cold_start.py``); a warm one costs the cache loads, well under a second per
    entry point. Compilation is single-threaded (numba holds a global compiler lock).
    """
    dispatch, routing, simulator, methods, policies, verbose = _warmup_iv(
        dispatch, routing, simulator, methods, policies, verbose
    )
    placement = check_bool(placement, "placement", "warmup")
    steps = []
    t_start = time.perf_counter()

    def step(name, fn):
        with JitTimer() as jt:
            t, cpu = time.perf_counter(), time.process_time()
            fn()
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
        steps.append(WarmupStep(name, wall, jt.jit_s, jt.compile_s, cpu, dict(jt.compiled)))
        if verbose:
            print(
                f"  {name}: {wall:.2f} s (compile {jt.compile_s:.2f} s)",
                file=sys.stderr,
                flush=True,
            )

    if dispatch:
        cases = _dispatch_cases()
        for m in methods:
            with kernel_mode("kernel"):  # compile: never the references' one-shot path
                step(
                    f"solve_dispatch[{m}]",
                    lambda m=m: [
                        solve_dispatch(p, c, method=m, time_limit=5.0, rng=0) for p, c in cases
                    ],
                )
        step("rebalance_experts", _eplb_cases)
    if routing:
        for pol in policies:
            step(f"route_batch[{pol}]", lambda pol=pol: _routing_case(pol))
    if simulator:
        from .simulator import simulate

        trace = _tiny_trace()
        for pol in policies:
            step(
                f"simulate[{pol}]",
                lambda pol=pol: simulate(trace, policy=pol, n_replicas=2, max_slots=2),
            )
    if placement:
        step("place_experts", warm_placement)
    total = time.perf_counter() - t_start
    missed = ()
    if dispatch and not numba.config.DISABLE_JIT:  # without the JIT nothing compiles
        kernels = {**dispatch_kernels(), **eplb_kernels()}
        missed = tuple(sorted(k for k, d in kernels.items() if not d.signatures))
    return WarmupReport(
        total_s=total,
        jit_s=float(sum(s.jit_s for s in steps)),
        compile_s=float(sum(s.compile_s for s in steps)),
        steps=tuple(steps),
        missed_kernels=missed,
        cache_dir=numba.config.CACHE_DIR or "",
    )


def needs_compile() -> bool:
    """Whether some dispatch kernel has no up-to-date entry in numba's disk cache and is
    not in memory yet, i.e. whether the next ``solve_dispatch`` will compile."""
    return not all(k.signatures or is_cached(k) for k in dispatch_kernels().values())


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="straggler-warmup",
        description=(
            "Compile every Numba kernel of straggler (or load it from numba's disk cache) and "
            "report how long it took, so that a serving worker or a benchmark starts warm."
        ),
    )
    p.add_argument("--no-dispatch", action="store_true", help="skip solve_dispatch")
    p.add_argument("--no-routing", action="store_true", help="skip route_batch")
    p.add_argument("--no-simulator", action="store_true", help="skip simulate")
    p.add_argument("--methods", default=None, help="comma-separated dispatch methods")
    p.add_argument("--policies", default=None, help="comma-separated routing policies")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def main(argv=None) -> int:
    """Console entry point ``straggler-warmup``; returns the exit status (2 on bad flags)."""
    parser = _parser()
    args = parser.parse_args(argv)

    def names(s):
        return None if s is None else [x.strip() for x in s.split(",") if x.strip()]

    try:
        rep = warmup(
            dispatch=not args.no_dispatch,
            routing=not args.no_routing,
            simulator=not args.no_simulator,
            methods=names(args.methods),
            policies=names(args.policies),
            verbose=not args.json,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(rep.as_dict(), indent=2) if args.json else rep.table())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
