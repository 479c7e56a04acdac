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

In parallel (``warmup(jobs=2)``, ``straggler-warmup --jobs 2``): numba compiles in one thread,
so the steps are split into shares, one per process: this process compiles its own share
while child processes (``python -c`` running this module's :func:`main` on their steps, same
``NUMBA_CACHE_DIR``) compile theirs into the disk cache side by side; then this process runs
every other step as with ``jobs=1``, loading the children's work from the cache, and ends
exactly as warm. The split keeps steps that share kernels in one share (the dispatch methods,
EPLB, the routing policies, the simulator's engine) and balances the shares' expected
compile seconds, a child's start counted.

Examples
--------
>>> rep = warmup(routing=False, simulator=False, methods=["round_robin", "tempo"])
>>> [s.name for s in rep.steps], rep.missed_kernels
(['solve_dispatch[round_robin]', 'solve_dispatch[tempo]', 'rebalance_experts'], ())
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

try:
    import fcntl
except ImportError:  # Windows: no parallel warm-up
    fcntl = None

import numba
import numpy as np

from ..formulations._io import atomic_open
from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem
from ..formulations.errors import InvalidInputError, StragglerError
from ..formulations.validation import check_bool, check_choice, check_int, check_type
from ..sim.workloads.traces import Trace
from ..solvers._numba.cache import (
    cache_folder,
    cache_stamp,
    is_cached,
    saves_locked,
)
from ..solvers._numba.compile import JitTimer, compiled_on_disk
from ..solvers.dispatch._backend import dispatch_kernels, kernel_mode, needs_compile
from ..solvers.dispatch.registry import dispatch_methods
from ..solvers.dispatch.solve import solve_dispatch
from ..solvers.placement.place import warm_placement
from ..solvers.routing.registry import routing_policies
from ..solvers.routing.route import route_batch

__all__ = [
    "warmup",
    "WarmupReport",
    "WarmupStep",
    "WarmupChild",
    "WarmupChildError",
    "dispatch_kernels",
    "eplb_kernels",
    "needs_compile",
    "estimate_warmup_seconds",
    "MAX_JOBS",
]


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
class WarmupChild:
    """One share of a parallel warm-up (``warmup(jobs=N)``): a child process's
    (:attr:`WarmupReport.children`) or the warming process's own (:attr:`WarmupReport.share`)."""

    steps: tuple
    """The steps it ran, by name, in order."""
    wall_s: float
    """Wall time of the share: for a child, from its launch to its exit (interpreter start
    and imports included)."""
    compile_s: float
    """Seconds of real compilation in it."""
    cpu_s: float
    """CPU seconds of its steps."""
    kernels: dict
    """Compile seconds per top-level kernel it compiled (callees included)."""
    functions: tuple
    """Every disk-cached jitted function it compiled, callees included, by ``module.name``
    (:attr:`WarmupReport.compiled_twice` compares them across shares)."""
    skipped: tuple = ()
    """Steps a child did not know (a method or policy registered at run time in the parent),
    which the parent then compiles."""
    start_s: float = 0.0
    """For a child, seconds from its launch to its first step: interpreter start and imports
    (0 for the warming process's own share)."""


class WarmupChildError(StragglerError, RuntimeError):
    """A child process of a parallel warm-up failed; the message names the step it was
    running and ends with the tail of its stderr."""


def _kernel_seconds(steps) -> dict:
    """Compile seconds per top-level kernel over the ``WarmupStep`` records in ``steps``."""
    out: dict = {}
    for s in steps:
        for k, v in s.compiled.items():
            out[k] = out.get(k, 0.0) + v
    return out


@dataclass(frozen=True)
class WarmupReport:
    """What :func:`warmup` did and how long it took."""

    total_s: float
    """Wall time of the whole warm-up (child processes included)."""
    jit_s: float
    """Seconds of numba JIT in this process (compilation and cache loads)."""
    compile_s: float
    """Seconds of real compilation in this process: its share of a parallel warm-up
    (:attr:`share`) included, about 0 with a warm cache."""
    steps: tuple
    """One ``WarmupStep`` per call in this process, in the order run (a parallel
    warm-up runs this process's share first, then the other steps in warm-up order)."""
    missed_kernels: tuple
    """Dispatch kernels (those ``solve_dispatch`` calls from Python,
    ``straggler.solvers.dispatch._backend.dispatch_kernels``) and EPLB's (``eplb_kernels``)
    still without a compiled version after the warm-up: a later call reaching one compiles
    then (empty when the warm-up covers them all, which
    ``tests/test_warmup.py`` checks)."""
    cache_dir: str
    """numba's cache folder (``NUMBA_CACHE_DIR``, or ``""`` for the default beside the
    sources)."""
    children: tuple = ()
    """One ``WarmupChild`` per child process that compiled its share into the disk
    cache while this process compiled its own (empty for a serial warm-up)."""
    serial_reason: str = ""
    """Why a warm-up asked for ``jobs > 1`` ran serially (``""`` otherwise)."""
    share: WarmupChild | None = None
    """This process's own share of a parallel warm-up, compiled while the children compiled
    theirs (``None`` for a serial warm-up); its steps are also in :attr:`steps`."""

    @property
    def kernels(self) -> dict:
        """Compile seconds per top-level kernel over all steps in this process."""
        return _kernel_seconds(self.steps)

    @property
    def children_compile_s(self) -> float:
        """Seconds of compilation in the child processes, summed."""
        return float(sum(c.compile_s for c in self.children))

    @property
    def compiled_after_children(self) -> dict:
        """Compile seconds per top-level kernel this process compiled outside its share, i.e.
        after the children ended: work no share covered (empty when the shares left every
        kernel in the cache). All of :attr:`kernels` for a serial warm-up."""
        own = self.share.steps if self.share else ()
        return _kernel_seconds(s for s in self.steps if s.name not in own)

    @property
    def compiled_twice(self) -> tuple:
        """Disk-cached jitted functions that more than one share (this process's, the
        children's) compiled: work done twice, with the same or other signatures; every
        entry survives in the cache (``_cache_saves_locked``)."""
        seen: dict = {}
        for c in (self.share, *self.children) if self.share else self.children:
            for f in c.functions:
                seen[f] = seen.get(f, 0) + 1
        return tuple(sorted(f for f, n in seen.items() if n > 1))

    def summary(self) -> str:
        """One line a user can read: the wall time, then what compiled, where and for how
        long, or that everything came from numba's disk cache.

        Examples: ``warm-up 1.1 s: every kernel loaded from numba's disk cache``;
        ``warm-up 64.3 s: compiled in 2 processes side by side, this process 30.1 s
        (dispatch), 1 child process 33.0 s (routing, simulator); then loaded their work, 0
        kernels compiled after``."""
        head = f"warm-up {self.total_s:.1f} s: "
        if not self.children:
            if not self.kernels:
                return head + "every kernel loaded from numba's disk cache"
            where = f" (serially: {self.serial_reason})" if self.serial_reason else ""
            return head + (
                f"{len(self.kernels)} kernel(s) compiled in {self.compile_s:.1f} s in this "
                f"process{where}"
            )

        def units(steps):
            return ", ".join(_by_unit(steps))

        if not self.kernels and not any(c.kernels for c in self.children):
            return head + (
                f"{1 + len(self.children)} processes side by side loaded every kernel from "
                "numba's disk cache"
            )
        kids = ", ".join(f"{c.compile_s:.1f} s ({units(c.steps)})" for c in self.children)
        after = self.compiled_after_children
        later = self.compile_s - self.share.compile_s
        return head + (
            f"compiled in {1 + len(self.children)} processes side by side, this process "
            f"{self.share.compile_s:.1f} s ({units(self.share.steps)}), "
            f"{len(self.children)} child process{'es' if len(self.children) > 1 else ''} "
            f"{kids}; then loaded their work, {len(after)} kernel(s) compiled after"
            + (f" ({later:.1f} s)" if after else "")
        )

    def table(self) -> str:
        """Per-step table (seconds)."""
        head = f"{'step':32s} {'wall_s':>8s} {'jit_s':>8s} {'compile_s':>9s} {'cpu_s':>8s}"
        rows = [head, "-" * len(head)]
        shares = [("this process's share", self.share)] if self.share else []
        shares += [(f"child {i}", c) for i, c in enumerate(self.children)]
        for name, c in shares:
            start = f" (started in {c.start_s:.2f} s)" if c.start_s else ""
            rows.append(
                f"{name:32s} {c.wall_s:8.2f} {'':8s} {c.compile_s:9.2f} "
                f"{c.cpu_s:8.2f}  {', '.join(c.steps)}{start}"
            )
        for s in self.steps:
            rows.append(
                f"{s.name:32s} {s.wall_s:8.2f} {s.jit_s:8.2f} {s.compile_s:9.2f} {s.cpu_s:8.2f}"
            )
        rows.append(self.summary())
        if self.children and self.compiled_after_children:
            rows.append(
                f"compiled in this process after the children: "
                f"{', '.join(sorted(self.compiled_after_children))}"
            )
        skipped = [n for c in self.children for n in c.skipped]
        if skipped:
            rows.append(f"unknown to the children, compiled here: {', '.join(skipped)}")
        if self.compiled_twice:
            rows.append(f"compiled by more than one share: {', '.join(self.compiled_twice)}")
        if self.serial_reason:
            rows.append(f"serial: {self.serial_reason}")
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
            "share": _share_dict(self.share) if self.share else None,
            "children": [_share_dict(c) for c in self.children],
            "children_compile_s": self.children_compile_s,
            "compiled_after_children": self.compiled_after_children,
            "compiled_twice": list(self.compiled_twice),
            "serial_reason": self.serial_reason,
        }


def _share_dict(c: WarmupChild) -> dict:
    return {
        "steps": list(c.steps),
        "wall_s": c.wall_s,
        "start_s": c.start_s,
        "compile_s": c.compile_s,
        "cpu_s": c.cpu_s,
        "kernels": c.kernels,
        "functions": list(c.functions),
        "skipped": list(c.skipped),
    }


def _dispatch_cases():
    """Small layers and a stack that between them reach every dispatch kernel: full and
    restricted replication, tiles and traffic, a layer tempo's support rebalance improves
    (its kernel only runs then), one whose makespan no certified bound proves, so that
    tempo's support stages 5b-5d run (they are skipped where B8 or B9 proves it), and an
    idle layer."""
    full = np.ones((7, 2), bool)
    fig1b = DispatchProblem(counts=[600] + [30] * 6, replicas=full)
    restricted = DispatchProblem(counts=[130, 221], replicas=[[1, 1, 1], [1, 1, 0]])
    stack = DispatchProblem(
        counts=[[344, 279, 0], [0, 0, 0]], replicas=[[1, 0, 1], [1, 1, 1], [0, 1, 0]]
    )
    unproved = DispatchProblem(counts=[380, 260, 336], replicas=[[1, 1, 1], [1, 1, 1], [0, 1, 1]])
    tile16 = CostModel.preset("qwen3_235b_b_tile").replace(tile=16)
    return [
        (fig1b, CostModel(a=0, b=15, c=0, beta=0.1)),
        (restricted, CostModel.preset("dsv2_lite_a_serving")),
        (fig1b, tile16),
        (unproved, tile16),
        (stack, CostModel.preset("dsv3_a_mb_full")),
    ]


def eplb_kernels() -> dict[str, object]:
    """The kernels of DeepSeek's EPLB (:func:`straggler.solvers.placement.eplb.rebalance_experts`),
    by
    ``module.name``."""
    from ..solvers.placement import _eplb_kernels

    return {
        f"{_eplb_kernels.__name__}.{name}": getattr(_eplb_kernels, name)
        for name in ("packing_kernel", "replicate_kernel")
    }


def _eplb_cases():
    """``rebalance_experts`` in every version (each packs and replicates in its own dtypes),
    hierarchical (2 groups on 2 nodes) and global (1 group)."""
    from ..solvers.placement.eplb import EPLB_VERSIONS, rebalance_experts

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


def _warmup_iv(dispatch, routing, simulator, methods, policies, verbose, placement, jobs):
    func = "warmup"
    dispatch = check_bool(dispatch, "dispatch", func)
    routing = check_bool(routing, "routing", func)
    simulator = check_bool(simulator, "simulator", func)
    verbose = check_bool(verbose, "verbose", func)
    placement = check_bool(placement, "placement", func)
    jobs = check_int(jobs, "jobs", func, lo=1)
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
    return dispatch, routing, simulator, list(methods), list(policies), verbose, placement, jobs


def _dispatch_step(method, cases):
    with kernel_mode("kernel"):  # compile: never the references' one-shot path
        for p, c in cases:
            solve_dispatch(p, c, method=method, time_limit=5.0, rng=0)


def _plan(dispatch, routing, simulator, methods, policies, placement) -> list:
    """The warm-up's calls, in order, as ``(name, call)`` pairs."""
    plan = []
    if dispatch:
        cases = _dispatch_cases()
        for m in methods:
            plan.append((f"solve_dispatch[{m}]", functools.partial(_dispatch_step, m, cases)))
        plan.append(("rebalance_experts", _eplb_cases))
    if routing:
        for pol in policies:
            plan.append((f"route_batch[{pol}]", functools.partial(_routing_case, pol)))
    if simulator:
        from ..sim.engine.simulator import simulate

        trace = _tiny_trace()
        for pol in policies:
            call = functools.partial(simulate, trace, policy=pol, n_replicas=2, max_slots=2)
            plan.append((f"simulate[{pol}]", call))
    if placement:
        plan.append(("place_experts", warm_placement))
    return plan


#: Printed to stderr by a child process before each step, so that a failure names its step.
_MARKER = "warmup child: step "


def _with_bar(plan) -> list:
    """``plan`` with a tqdm bar on stderr advanced by each step's call."""
    from tqdm.auto import tqdm

    bar = tqdm(total=len(plan), desc="warm-up", unit="step", file=sys.stderr)

    def stepped(name, fn):
        def call():
            bar.set_postfix_str(name)
            try:
                return fn()
            finally:
                bar.update(1)
                if bar.n == bar.total:
                    bar.close()

        return call

    return [(name, stepped(name, fn)) for name, fn in plan]


def estimate_warmup_seconds(names, shares=()) -> tuple:
    """``(seconds, units to compile, units)``: the expected compile seconds of the warm-up
    steps ``names`` on numba's disk cache as it is now (units already warm cost about 1 s
    of loading each), from the per-unit and per-step costs measured on an empty cache
    (``_UNIT_COST``); with ``shares`` (a parallel warm-up), the slowest share's."""
    units = _by_unit(names)
    cold = {
        u: steps for u, steps in units.items() if not _unit_warm(u, steps, _unit_kernels(u, steps))
    }
    if numba.config.DISABLE_JIT:
        cold = {}

    def cost(steps):
        by_unit = _by_unit(steps).items()
        return sum(_UNIT_COST[u] + sum(map(_step_cost, st)) for u, st in by_unit if u in cold)

    loading = float(len(units) - len(cold))
    if shares:
        est = max(cost(sh) + (_CHILD_START_S if i else 0.0) for i, sh in enumerate(shares))
    else:
        est = cost(names)
    return est + loading, len(cold), len(units)


def _run(plan, verbose: bool, marker: bool = False) -> list:
    """Run the ``(name, call)`` pairs of ``plan``, each timed (wall, CPU, JIT, compile)."""
    steps = []
    for name, fn in plan:
        if marker:
            print(_MARKER + name, file=sys.stderr, flush=True)
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
    return steps


#: The units a parallel warm-up splits into shares, by the call a step makes: steps of one
#: unit share kernels (the first compiles them for the rest), so a unit is never split.
#: EPLB's kernels call no other jitted code (dispatch's LPLB also compiles them, for its own
#: types): a unit of their own, unless ``place_experts`` (which runs EPLB and the dispatch
#: kernels) joins them to dispatch (:func:`_by_unit`).
_UNITS = {
    "solve_dispatch": "dispatch",
    "rebalance_experts": "eplb",
    "place_experts": "dispatch",
    "route_batch": "routing",
    "simulate": "simulator",
}
#: Expected CPU seconds of compiling on an empty cache, to balance the shares. Per unit, what
#: its first step compiles for all of them: the bounds, score and token-LP kernels; nothing
#: (EPLB); ``route_batch``'s jitted entry; the simulator's engine. Per step, what it adds: a
#: dispatch method its own kernels, a routing policy its kernel (the same for ``route_batch``
#: and ``simulate``). From the steps' ``cpu_s`` of ``straggler-warmup --jobs 1 --json`` on an
#: empty cache (2 busy cores), routing's unit raised to what it costs apart from dispatch (a
#: serial warm-up compiles the stable-order helpers they share in dispatch's steps; alone,
#: dispatch and routing compile in the ratio 40 : 22); tempo's raised to what the shares
#: compiled side by side on an empty cache (2 cores, every method and policy, 4 runs and a CI
#: run): dispatch with EPLB 1.05-1.21 times routing with the engine, which the child
#: compiled while this process compiled dispatch. A step not listed counts
#: :data:`_OTHER_STEP_COST`.
_UNIT_COST = {"dispatch": 8.4, "eplb": 0.0, "routing": 6.4, "simulator": 17.2}
_STEP_COST = {
    "solve_dispatch[tempo]": 31.0,
    "solve_dispatch[lplb]": 1.3,
    "solve_dispatch[round_robin]": 0.6,
    "rebalance_experts": 1.3,
    "place_experts": 11.5,
}
_POLICY_COST = {
    "br0": 4.0,
    "brh": 3.2,
    "brs": 3.2,
    "trtllm_balance": 1.4,
    "p2c": 1.0,
    "dynamo": 0.9,
    "trtllm": 0.8,
    "jsq_requests": 0.7,
    "vllm": 0.7,
}
_OTHER_STEP_COST = 0.35
#: Expected seconds from a child's launch to its first step (interpreter start, importing
#: numba, scipy and this package; :attr:`WarmupChild.start_s`), in the same units: 8.9 s
#: measured at load 5 on 2 cores, where compiling took 3.9 times its CPU seconds.
_CHILD_START_S = 2.0
#: Most processes worth compiling side by side: one per unit.
MAX_JOBS = len(_UNIT_COST)


def _by_unit(names) -> dict:
    """The step names ``names`` grouped by their unit (:data:`_UNITS`), in order; EPLB's
    step in dispatch's unit when ``place_experts`` is among them (it runs EPLB too)."""
    units: dict = {}
    for n in names:
        unit = _UNITS[n.partition("[")[0]]
        if unit == "eplb" and "place_experts" in names:
            unit = "dispatch"
        units.setdefault(unit, []).append(n)
    return units


def _step_cost(name: str) -> float:
    call, _, arg = name.partition("[")
    if call in ("route_batch", "simulate"):
        return _POLICY_COST.get(arg.rstrip("]"), _OTHER_STEP_COST)
    return _STEP_COST.get(name, _OTHER_STEP_COST)


def _shares(names, jobs: int) -> list:
    """The steps ``names`` (in warm-up order) split into at most ``jobs`` shares, as tuples
    of names in warm-up order: this process's first, then one per child process; ``[]``
    when this process alone is expected to be done soonest.

    Units (:data:`_UNITS`) stay whole. Every placement of the units (at most 4 in 4 shares)
    is tried and the one expected to finish first kept: this process's share finishes
    after its compile seconds, a child's after its start (:data:`_CHILD_START_S`) and its
    compile seconds; on a tie, the one with fewer children. (This process then loads the
    children's work from the cache, about 1-2% of its compile seconds, left out here.) The
    simulator's unit, when routing runs too, needs one policy's ``simulate`` only (the
    engine is one for every policy; each policy's kernel is ``route_batch``'s): the
    cheapest, whose kernel both shares then compile (with the least-tokens helper that
    ``route_batch``'s entry and the engine share), when they are apart.

    >>> _shares(["solve_dispatch[tempo]", "rebalance_experts", "route_batch[jsq]",
    ...          "route_batch[br0]", "simulate[jsq]", "simulate[br0]"], 2)
    [('solve_dispatch[tempo]',),
     ('rebalance_experts', 'route_batch[jsq]', 'route_batch[br0]', 'simulate[jsq]')]
    """
    units = _by_unit(names)
    if "simulator" in units and "routing" in units:
        units["simulator"] = [min(units["simulator"], key=_step_cost)]
    cost = [_UNIT_COST[u] + sum(map(_step_cost, steps)) for u, steps in units.items()]
    n = min(jobs, len(units))
    if n < 2:
        return []
    best, best_key = None, None
    for where in itertools.product(range(n), repeat=len(units)):
        load = [0.0] * n
        for share, c in zip(where, cost):
            load[share] += c
        children = [i for i in set(where) if i > 0]
        key = (max([load[0]] + [_CHILD_START_S + load[i] for i in children]), len(children))
        if best_key is None or key < best_key:
            best, best_key = where, key
    if best_key[1] == 0:
        return []
    members = [[] for _ in range(n)]
    for share, steps in zip(best, units.values()):
        members[share] += steps
    order = {name: i for i, name in enumerate(names)}
    return [tuple(sorted(m, key=order.__getitem__)) for m in members if m]


def _cache_obstacle(kernels) -> str:
    """Why child processes could not hand ``kernels`` (dispatchers) to this one through
    numba's disk cache (``""`` when they can)."""
    for k in kernels:
        path = cache_folder(k)
        name = getattr(getattr(k, "py_func", k), "__qualname__", repr(k))
        if path is None:
            return f"{name} has no disk cache (cache=False)"
        if not (os.path.isdir(path) and os.access(path, os.W_OK)):
            return f"numba's cache folder {path} is not writable"
    return ""


def _unit_kernels(unit: str, names) -> list:
    """The kernels (dispatchers) the steps ``names`` of ``unit`` reach from Python: those
    whose disk-cache entries say whether the unit still has to compile."""
    if unit == "eplb":
        return list(eplb_kernels().values())
    if unit == "dispatch":
        kernels = list(dispatch_kernels().values())
        if "place_experts" in names:  # EPLB's kernels among them
            from ..solvers.placement.place import placement_kernels

            kernels += placement_kernels().values()
        return kernels
    from ..sim.engine._loop import engine_depends, run_engine
    from ..solvers._numba.jit import cache_depends_on
    from ..solvers.routing._core import route_batch_kernel
    from ..solvers.routing.registry import get_routing_policy

    policies = [get_routing_policy(n.partition("[")[2].rstrip("]")) for n in names]
    if unit == "routing":
        return [route_batch_kernel] + [p.kernel for p in policies]
    cache_depends_on(run_engine, *engine_depends())  # its cache key, as simulate sets it
    return [run_engine] + [p.kernel for p in policies]


def _parallel_plan(names, jobs: int) -> tuple:
    """``(shares, reason)``: the steps this process and each child process compile
    (:func:`_shares`) for ``warmup(jobs=jobs)`` with the steps ``names``, or ``[]`` and why
    they run serially.

    Only units not yet warm in numba's disk cache (:func:`_unit_warm`) are shared out (a
    warm cache needs no child: starting one costs more than loading)."""
    if numba.config.DISABLE_JIT:
        return [], "NUMBA_DISABLE_JIT=1 (nothing compiles)"
    if fcntl is None:
        return [], "no fcntl file locks on this platform (numba's cache saves must not overlap)"
    units = _by_unit(names)
    kernels, pending = [], []
    for unit, steps in units.items():
        reach = _unit_kernels(unit, steps)
        if not _unit_warm(unit, steps, reach):
            kernels += reach
            pending += steps
    obstacle = _cache_obstacle(kernels)
    if obstacle:
        return [], obstacle
    shares = _shares([n for n in names if n in pending], jobs)
    if not shares:
        n_units = len(_by_unit(pending))
        if not pending:
            why = "every kernel is in numba's disk cache"
        elif n_units == 1:
            why = "one unit compiles"
        else:
            why = "a child's start is expected to cost more than it saves"
        return [], f"{why} ({n_units} of {len(units)} units to compile)"
    return shares, ""


def _record_path(unit: str, kernels) -> str | None:
    """The file in numba's cache folder (that of ``kernels[0]``) recording which steps of
    ``unit`` a warm-up ran there, or ``None`` without a disk cache."""
    folder = cache_folder(kernels[0]) if kernels else None
    return None if folder is None else os.path.join(folder, f"straggler-warmup-{unit}.json")


def _stamps(kernels) -> dict | None:
    """Each kernel's cache stamp (its source file's, with ``cache_depends_on``'s digest of
    its callees' files), by ``module.name``, as text; ``None`` when one has none."""
    out = {}
    for k in kernels:
        stamp = cache_stamp(k)
        if stamp is None:
            return None
        out[f"{k.py_func.__module__}.{k.py_func.__qualname__}"] = repr(stamp)
    return out


def _read_record(path: str) -> dict:
    try:
        with open(path) as f:
            rec = json.load(f)
        return rec if isinstance(rec, dict) else {}
    except (OSError, ValueError):
        return {}


def _unit_warm(unit: str, steps, kernels) -> bool:
    """Whether the steps ``steps`` of ``unit`` need no compiling: a warm-up ran them on
    numba's disk cache as it is now (:func:`_record_units` recorded them, with the same
    source stamps) and every kernel of ``kernels`` still has entries there.

    A kernel's versions in memory, or entries on disk, do not by themselves say so: other
    code compiles the unit's kernels for other argument types (LPLB and
    ``make_decode_problem`` compile EPLB's, for instance at a test module's import), and
    the steps would then compile theirs after all."""
    path = _record_path(unit, kernels)
    if path is None:
        return False
    rec = _read_record(path)
    return (
        set(steps) <= set(rec.get("steps", ()))
        and rec.get("stamps") == _stamps(kernels)
        and all(is_cached(k) for k in kernels)
    )


def _record_units(names) -> None:
    """Record, beside each unit's kernels in numba's disk cache, that this process ran its
    steps among ``names`` (so they are compiled there; :func:`_unit_warm`). Best effort: a
    record not written only means a later warm-up compiles, or loads, in a child."""
    if fcntl is None or numba.config.DISABLE_JIT:
        return
    for unit, steps in _by_unit(names).items():
        kernels = _unit_kernels(unit, steps)
        path, stamps = _record_path(unit, kernels), _stamps(kernels)
        if path is None or stamps is None or not all(is_cached(k) for k in kernels):
            continue
        try:
            with _folder_locked(os.path.dirname(path)):
                rec = _read_record(path)
                if rec.get("stamps") == stamps:
                    if set(steps) <= set(rec.get("steps", ())):
                        continue  # recorded already: a warm run writes nothing
                    steps = sorted(set(steps) | set(rec.get("steps", ())))
                with atomic_open(path) as f:
                    json.dump({"steps": sorted(steps), "stamps": stamps}, f)
        except (OSError, InvalidInputError):
            continue


@contextlib.contextmanager
def _folder_locked(folder: str):
    """Hold the exclusive ``fcntl`` lock of the cache folder ``folder`` (a file in it) that
    every process of a parallel warm-up takes before writing there."""
    with open(os.path.join(folder, ".straggler-warmup.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _cache_saves_locked():
    """While the block runs, every numba disk-cache save of this process holds the exclusive
    lock of its cache folder (:func:`_folder_locked`), which the other processes of a parallel
    warm-up take too: two processes compiling two signatures of one function at once (a
    shared callee such as a stable sort or an EPLB kernel) would otherwise both pick the same
    data file name for their entries (:func:`straggler.solvers._numba.cache.saves_locked`)."""
    return saves_locked(_folder_locked)


_CHILD_CODE = (
    "import sys; from straggler.runtime.warmup import _child_entry; "
    "sys.exit(_child_entry(sys.argv[1:]))"
)


def _child_argv(steps) -> list:
    """The command of a child process of this one running the steps ``steps`` (names):
    ``_child_entry``'s two arguments, the steps' names and this process's pid."""
    return [sys.executable, "-c", _CHILD_CODE, json.dumps(list(steps)), str(os.getpid())]


def _child_entry(argv) -> int:
    """A child process of :func:`warmup`: ``argv`` is ``[steps, parent]``, the step names as
    a JSON list of strings and the parent's pid; it runs :func:`_child_main` and prints its
    report as JSON. Only :class:`_Children` starts it: anything else is refused (exit 2,
    one line on stderr) before any work."""
    try:
        steps = json.loads(argv[0]) if len(argv) == 2 else None
    except (ValueError, RecursionError):
        steps = None
    parent = argv[1] if len(argv) == 2 else ""
    ok = (
        isinstance(steps, list)
        and steps
        and all(isinstance(s, str) and s for s in steps)
        and parent.isascii()
        and parent.isdigit()
        and 1 <= int(parent) < 2**31
    )
    if not ok:
        sys.stderr.write(
            "straggler warm-up child: error: expected two arguments, the step names as a "
            f"non-empty JSON list of strings and the parent's pid; got {argv!r}\n"
        )
        return 2
    _exit_with_parent(int(parent))
    print(json.dumps(_child_main(steps)))
    return 0


def _run_recorded(plan, verbose: bool, marker: bool = False) -> tuple:
    """``(steps, functions)``: :func:`_run` of ``plan``, and every disk-cached jitted
    function it compiled, callees included, by ``module.name`` (sorted)."""
    with compiled_on_disk() as functions:
        steps = _run(plan, verbose, marker)
    return steps, sorted(set(functions))


def _child_main(names) -> dict:
    """In a child process: run the steps ``names`` and say what they compiled, and when it
    began and ended (``time.time()``, for the parent to time the child's start and wall). A
    step this process does not know (a method or policy registered at run time in the
    parent) is skipped and listed: the parent compiles it."""
    began = time.time()
    full = dict(_plan(True, True, True, dispatch_methods(), routing_policies(), True))
    plan = [(n, full[n]) for n in names if n in full]
    with _cache_saves_locked():
        steps, functions = _run_recorded(plan, verbose=False, marker=True)
    return {
        "compile_s": float(sum(s.compile_s for s in steps)),
        "cpu_s": float(sum(s.cpu_s for s in steps)),
        "kernels": _kernel_seconds(steps),
        "functions": functions,
        "skipped": [n for n in names if n not in full],
        "began": began,
        "ended": time.time(),
    }


def _exit_with_parent(parent: int, interval_s: float = 0.2) -> None:
    """End this process (exit status 1) soon after its parent, the process ``parent`` (its
    pid, passed at launch), is gone: a child of a parallel warm-up whose parent was killed (a
    SIGKILL or SIGTERM skips the parent's clean-up, which stops its children) stops compiling
    for nobody. A daemon thread polls ``os.getppid()`` (the parent's end makes another
    process this one's parent; the pid comes from the launch, so a parent gone while this
    process was still starting counts too); numba's cache writes each file through a
    temporary one, and an entry whose data file is missing loads as absent, so an exit
    between two writes leaves nothing wrong behind."""

    def watch():
        while os.getppid() == parent:
            time.sleep(interval_s)
        os._exit(1)

    threading.Thread(target=watch, name="straggler-warmup-parent", daemon=True).start()


class _Children:
    """Child processes compiling their shares of a parallel warm-up: one per tuple of step
    names in ``shares``, launched at once on this process's numba cache folder when the
    ``with`` block is entered. :meth:`wait` collects them; leaving the block stops any still
    running (this process's own share failed, or another child did)."""

    def __init__(self, shares, verbose: bool) -> None:
        self.shares, self.verbose = [tuple(s) for s in shares], verbose
        self.runs: list = []  # [process, stdout file, stderr file]
        self.launched = 0.0

    def __enter__(self) -> _Children:
        env = dict(os.environ)
        if numba.config.CACHE_DIR:
            env["NUMBA_CACHE_DIR"] = numba.config.CACHE_DIR
        self.launched = time.time()
        try:
            for i, steps in enumerate(self.shares):
                out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
                self.runs.append([None, out, err])
                argv = _child_argv(steps)
                self.runs[-1][0] = subprocess.Popen(argv, env=env, stdout=out, stderr=err)
                if self.verbose:
                    print(f"  child {i}: {', '.join(steps)}", file=sys.stderr, flush=True)
        except BaseException:
            self.__exit__()
            raise
        return self

    def wait(self) -> tuple:
        """Wait for every child; one ``WarmupChild`` each. Raises
        :class:`WarmupChildError` as soon as one fails."""
        done = [False] * len(self.runs)
        while not all(done):
            for i, (proc, _, err) in enumerate(self.runs):
                if not done[i] and proc.poll() is not None:
                    if proc.returncode:
                        raise _child_error(self.shares[i], proc.returncode, err)
                    done[i] = True
            time.sleep(0.02)
        children = []
        for steps, (_, out, _) in zip(self.shares, self.runs):
            out.seek(0)
            got = json.loads(out.read().decode())
            children.append(
                WarmupChild(
                    steps=steps,
                    wall_s=got["ended"] - self.launched,
                    compile_s=got["compile_s"],
                    cpu_s=got["cpu_s"],
                    kernels=got["kernels"],
                    functions=tuple(got["functions"]),
                    skipped=tuple(got["skipped"]),
                    start_s=got["began"] - self.launched,
                )
            )
            if self.verbose:
                c = children[-1]
                print(
                    f"  child {len(children) - 1} done: {c.wall_s:.1f} s (started in "
                    f"{c.start_s:.1f} s, compile {c.compile_s:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        return tuple(children)

    def __exit__(self, *exc) -> None:
        for proc, out, err in self.runs:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
            out.close()
            err.close()


def _child_error(steps, returncode: int, err) -> WarmupChildError:
    err.seek(0)
    text = err.read().decode(errors="replace")
    started = [ln[len(_MARKER) :] for ln in text.splitlines() if ln.startswith(_MARKER)]
    where = f"in step {started[-1]!r}" if started else "before its first step"
    return WarmupChildError(
        f"warmup: the child process compiling {', '.join(steps)} failed {where} (exit status "
        f"{returncode}); the end of its stderr:\n{text[-3000:]}"
    )


def warmup(
    *,
    dispatch: bool = True,
    routing: bool = True,
    simulator: bool = True,
    methods=None,
    policies=None,
    verbose: bool = False,
    placement: bool = False,
    jobs: int = 1,
    progress: bool = False,
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
        ``straggler.solvers.routing.registry.routing_policies()``).
    verbose : bool, default False
        Print each step as it finishes (to stderr).
    placement : bool, default False
        ``place_experts`` and EPLB (``straggler.solvers.placement.place.warm_placement``).
    jobs : int, default 1
        Processes compiling side by side on a cold cache: this one and up to ``jobs - 1``
        child processes, each with its share of the units (dispatch with placement,
        EPLB, routing, the simulator; so at most ``MAX_JOBS`` are used, fewer when
        that is expected to finish as soon). The children compile into numba's disk
        cache; when they are done this process runs every step outside its share, loading
        what they compiled. 1: everything compiles here, one step after another.
    progress : bool, default False
        On stderr before starting: the steps, the units still to compile and an estimate of
        the compiling (``estimate_warmup_seconds`` in this module); then a bar over this
        process's steps with the time left.

    Returns
    -------
    WarmupReport
        Per-step wall, JIT and compile seconds, per-kernel compile seconds, the kernels
        still uncompiled, numba's cache folder, each process's share. ``str(report)`` is one
        line.

    Raises
    ------
    InvalidInputError
        A parameter of the wrong type or value (``jobs`` not an integer >= 1, ...).
    WarmupChildError
        A child process failed (the message names its step and ends with its stderr; the
        other children are stopped). An exception in this process's own share stops the
        children and propagates.

    Notes
    -----
    A cold cache costs the full compile once per machine (the figures are in
    ``benchmarks/cold_start.py``); a warm one costs the cache loads, well under a second per
    entry point. Compilation is single-threaded (numba holds a global compiler lock), so on
    a cold cache ``jobs=2`` cuts the wall time nearly in half on two cores: this process
    compiles its share while one child compiles the other, then this process loads the
    child's work, compiling about nothing more, and ends exactly as warm as with
    ``jobs=1`` (:attr:`WarmupReport.compiled_after_children` lists anything it still had
    to compile). The steps run serially (``serial_reason`` says why) under
    ``NUMBA_DISABLE_JIT=1``, without a writable disk cache, when the selection is one unit,
    or when a child's start is expected to cost more than it saves, and where ``fcntl`` is
    missing. Two shares may compile the same jitted callee, with the same or other
    signatures: every process of the warm-up saves numba's cache entries under one lock per
    cache folder (``_cache_saves_locked``), so no entry overwrites another.
    """
    dispatch, routing, simulator, methods, policies, verbose, placement, jobs = _warmup_iv(
        dispatch, routing, simulator, methods, policies, verbose, placement, jobs
    )
    progress = check_bool(progress, "progress", "warmup")
    t_start = time.perf_counter()
    plan = _plan(dispatch, routing, simulator, methods, policies, placement)
    names = [name for name, _ in plan]
    shares, reason = _parallel_plan(names, jobs) if jobs > 1 else ([], "")
    if progress:
        est, cold, n_units = estimate_warmup_seconds(names, shares)
        print(
            f"warm-up: {len(names)} steps, {cold} of {n_units} units to compile in "
            f"{max(1, len(shares))} process(es); estimated {est:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        plan = _with_bar(plan)
    children, share = (), None
    if shares:
        own = shares[0]
        if verbose:
            print(f"  this process: {', '.join(own)}", file=sys.stderr, flush=True)
        with _cache_saves_locked(), _Children(shares[1:], verbose) as kids:
            t, cpu = time.perf_counter(), time.process_time()
            steps, functions = _run_recorded([(n, c) for n, c in plan if n in own], verbose)
            share = WarmupChild(
                steps=own,
                wall_s=time.perf_counter() - t,
                compile_s=float(sum(s.compile_s for s in steps)),
                cpu_s=time.process_time() - cpu,
                kernels=_kernel_seconds(steps),
                functions=tuple(functions),
            )
            children = kids.wait()
        steps += _run([(n, c) for n, c in plan if n not in own], verbose)
    else:
        steps = _run(plan, verbose)
    _record_units(names)
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
        children=children,
        serial_reason=reason,
        share=share,
    )
