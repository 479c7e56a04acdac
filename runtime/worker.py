"""``SolverWorker``: the dispatch solver in a separate process, fed through shared memory.

TEMPO §4.4, "off the critical path: a solver process, not a thread" (in-thread solving cost
8-10% end to end from GIL contention, §5.11). The engine side (:meth:`SolverWorker.submit`,
:meth:`SolverWorker.poll`, :meth:`SolverWorker.status`) only copies arrays in and out of one
``multiprocessing.shared_memory`` block and never waits for the worker: no locks, queues or
pipes are shared with it, so a dead, stopped or slow worker cannot hang the engine. It
leaves the last published tables in force and is reported (``status()``, and one warning on
the ``straggler.runtime`` logger per change of health).

Protocol (one writer per region, seqlocks): the engine writes the latest count window
``[L, E]`` (a sequence counter odd while writing, a CRC-32 of the payload beside it); the
worker, at most once per ``period`` and only for a new window, copies it, checks sequence
and CRC, solves every layer with the configured method (``tempo`` by default, a stack solve
over the layers) under the cost model, turns the shares into replica-probability tables with
:meth:`DispatchProblem.to_tables <straggler.formulations.DispatchProblem.to_tables>` (the
library's ``logical_to_physical [L, E, X]`` layout) and posts them into one of two response
slots, alternating, each with its own sequence counter and CRC. ``poll`` copies the newest
complete slot, or returns ``None``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
import weakref
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..formulations.cost import CostModel
from ..formulations.dispatch import MAX_COUNT, DispatchProblem, logical_to_physical
from ..formulations.errors import InvalidInputError, param_error
from ..formulations.validation import check_array, check_int, check_real, check_type

__all__ = [
    "SolverWorker",
    "WorkerTables",
    "WorkerStatus",
    "WorkerDecision",
    "window_delta",
    "decide_for_windows",
]

log = logging.getLogger("straggler.runtime")

# Header words (int64).
H_STOP, H_REQ_SEQ, H_REQ_WINDOW, H_REQ_CRC = 0, 1, 2, 3
H_PLACE_SEQ, H_PLACE_VERSION, H_PLACE_CRC = 4, 5, 6
H_HEARTBEAT, H_READY, H_SOLVES, H_LATEST, H_POSTS, H_ERRORS, H_PID = 7, 8, 9, 10, 11, 12, 13
H_FAILING = 14  # refreshes failed in a row (0 after a success)
N_HEADER = 16
# Response slot meta words (int64).
M_SEQ, M_POST, M_WINDOW, M_PLACE, M_CRC, M_POSTED, M_READ, M_SOLVE, M_TABLES = range(9)
N_META = 12
ERR_BYTES = 1024
# Decision region meta words (int64).
D_SEQ, D_POST, D_FIRST, D_LAST, D_REBALANCE, D_MOVES, D_PLACE, D_CRC = range(8)
N_DMETA = 8


def window_delta(current, previous) -> np.ndarray:
    """Counts of one window from two snapshots of a cumulative counter (int64).

    Wrap-safe: an int32 counter (what an in-graph kernel may keep) is differenced modulo
    ``2**32``, an int64 one modulo ``2**64``, so a window is right as long as it holds fewer
    than ``2**31`` tokens per expert.

    Examples
    --------
    >>> window_delta(np.array([5, -2147483646], np.int32), np.array([3, 2147483647], np.int32))
    array([2, 3])
    """
    cur, prev = np.asarray(current), np.asarray(previous)
    if cur.shape != prev.shape or cur.dtype != prev.dtype or cur.dtype.kind not in "iu":
        raise param_error(
            "current",
            "window_delta",
            "an integer array of the shape and dtype of 'previous'",
            f"{cur.dtype} {cur.shape} and {prev.dtype} {prev.shape}",
        )
    bits = cur.dtype.itemsize * 8
    if bits >= 64:
        return (cur.astype(np.uint64) - prev.astype(np.uint64)).astype(np.int64)
    return (cur.astype(np.int64) - prev.astype(np.int64)) % (1 << bits)


@dataclass(frozen=True)
class WorkerTables:
    """Tables the worker posted for one count window."""

    probs: np.ndarray
    """``[L, E, X]`` float32 replica probabilities in the columns of ``SolverWorker.log2phy``."""
    active: np.ndarray
    """``[L, E]`` bool: experts with tokens in the window (the rows to publish)."""
    makespan: np.ndarray
    """``[L]`` modeled makespan per layer (us), from the independent evaluator (the one
    ``solve_dispatch`` scores every method with)."""
    window: int
    """Id of the window solved (what ``submit`` returned)."""
    placement: int
    """Placement version the tables are for."""
    timings: dict = field(default_factory=dict)
    """Worker seconds: ``read`` (shared-memory copy and check), ``solve``, ``tables``
    (``to_tables``), ``post`` (write and CRC); and ``age``, since it was posted."""


@dataclass(frozen=True)
class WorkerDecision:
    """A rebalance decision the worker posted (``SolverWorker(rebalance=...)``)."""

    rebalance: bool
    moves: int
    """Replicas moved, summed over the layers."""
    physical_to_logical: np.ndarray
    """``[L, P]``: the placement to move to (the one in force when ``rebalance`` is False)."""
    gain_s: float
    """Predicted seconds saved over the policy's horizon."""
    cost_s: float
    """Predicted cost of the copies (seconds)."""
    windows: tuple
    """Ids of the first and last window the decision read (what ``submit`` returned)."""
    placement: int
    """Placement version it was decided from."""

    def __str__(self) -> str:
        return f"rebalance: {'yes' if self.rebalance else 'no'}, moves {self.moves}"


@dataclass(frozen=True)
class WorkerStatus:
    """What the engine side knows about the worker, read without waiting."""

    alive: bool
    ready: bool
    healthy: bool
    """Alive, ready, its heartbeat younger than ``stale_after`` and its last refresh (solve
    or placement change) successful."""
    heartbeat_age_s: float
    n_solves: int
    n_errors: int
    last_error: str
    exitcode: int | None
    reason: str = ""
    """Why the worker is not healthy (empty when it is): not started, dead, stalled, or its
    refreshes failing (with the last error)."""
    n_failing: int = 0
    """Refreshes that failed in a row since the last success."""


@dataclass(frozen=True)
class _Config:
    n_layers: int
    n_experts: int
    n_slots: int
    width: int
    n_gpus: int
    gpu_node: tuple | None
    cost: CostModel
    method: str
    options: dict
    period: float
    poll: float
    n_threads: int
    time_limit: float
    seed: int
    rebalance: object = None
    move: object = None
    num_groups: int = 1
    num_nodes: int = 1
    rebalance_every: int = 1


def _layout(cfg: _Config):
    """Byte offsets of each region of the shared block."""
    L, E, P, X = cfg.n_layers, cfg.n_experts, cfg.n_slots, cfg.width
    parts = [
        ("hdr", np.int64, (N_HEADER,)),
        ("err", np.uint8, (ERR_BYTES,)),
        ("counts", np.int64, (L, E)),
        ("place", np.int64, (L, P)),
    ]
    for s in (0, 1):
        parts += [
            (f"meta{s}", np.int64, (N_META,)),
            (f"probs{s}", np.float32, (L, E, X)),
            (f"active{s}", np.uint8, (L, E)),
            (f"makespan{s}", np.float64, (L,)),
        ]
    parts += [
        ("dmeta", np.int64, (N_DMETA,)),
        ("dfloat", np.float64, (2,)),
        ("dplace", np.int64, (L, P)),
    ]
    out, off = {}, 0
    for name, dt, shape in parts:
        off = (off + 63) // 64 * 64
        out[name] = (off, dt, shape)
        off += int(np.prod(shape)) * np.dtype(dt).itemsize
    return out, off


def _views(buf, cfg: _Config) -> dict:
    lay, _ = _layout(cfg)
    return {
        name: np.ndarray(shape, dtype=dt, buffer=buf, offset=off)
        for name, (off, dt, shape) in lay.items()
    }


def _crc(*arrays) -> int:
    c = 0
    for a in arrays:
        c = zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"), c)
    return c


def _check_every_expert_placed(p2l: np.ndarray, n_experts: int, func: str) -> None:
    """Every expert ``0..n_experts-1`` has a slot in every layer (else each window with a
    token for it would fail in the worker)."""
    for layer, row in enumerate(p2l):
        missing = np.setdiff1d(np.arange(n_experts), row)
        if missing.size:
            raise param_error(
                "physical_to_logical",
                func,
                f"a slot for every expert 0..{n_experts - 1} in every layer",
                f"no slot for expert {int(missing[0])} in layer {layer}",
            )


def _padded_log2phy(p2l: np.ndarray, n_experts: int, width: int) -> np.ndarray:
    l2p, _ = logical_to_physical(p2l, n_experts)
    out = np.full((p2l.shape[0], n_experts, width), -1, dtype=np.int64)
    out[..., : l2p.shape[-1]] = l2p
    return out


# --- the worker process -------------------------------------------------------------------


def _write_error(v, msg: str) -> None:
    data = msg.encode("utf-8", "replace")[: ERR_BYTES - 1]
    v["err"][:] = 0
    v["err"][: len(data)] = np.frombuffer(data, dtype=np.uint8)
    v["hdr"][H_ERRORS] += 1
    v["hdr"][H_FAILING] += 1


class _Solver:
    """The worker's solving state for one placement (the process side)."""

    def __init__(self, cfg: _Config, p2l: np.ndarray):
        from ..solvers.dispatch.registry import make_method

        self.cfg = cfg
        self.method = make_method(cfg.method, dict(cfg.options), "SolverWorker")
        self.rng = np.random.default_rng(cfg.seed)
        self.gpu_node = None if cfg.gpu_node is None else np.asarray(cfg.gpu_node)
        self.set_placement(p2l)

    def set_placement(self, p2l: np.ndarray) -> None:
        zeros = np.zeros((self.cfg.n_layers, self.cfg.n_experts), dtype=np.int64)
        base = DispatchProblem.from_placement(zeros, p2l, self.cfg.n_gpus, self.gpu_node)
        self.p2l = p2l.copy()
        self.replicas = base.replicas

    def solve(self, counts: np.ndarray):
        """Tables ``[L, E, width]`` float32 and per-layer makespans for one window."""
        from ..solvers.dispatch.solve import solve_layers

        cfg = self.cfg
        problem = DispatchProblem(counts=counts, replicas=self.replicas, gpu_node=self.gpu_node)
        # solve_dispatch's own layer loop: every method's shares checked and scored by the
        # independent evaluator, the certified bound checked against the makespan
        fields, _ = solve_layers(
            problem, cfg.cost, cfg.method, self.method, cfg.time_limit, self.rng
        )
        t1 = time.perf_counter()
        shares = fields["shares"].reshape(problem.counts.shape + (cfg.n_gpus,))
        _, _, prob = problem.to_tables(shares, self.p2l)
        probs = np.zeros((cfg.n_layers, cfg.n_experts, cfg.width), dtype=np.float32)
        probs[..., : prob.shape[-1]] = prob
        makespan = np.atleast_1d(np.asarray(fields["makespan"], dtype=np.float64))
        return probs, makespan, t1


def _worker_main(shm_name: str, cfg: _Config) -> None:  # pragma: no cover - child process
    from multiprocessing import shared_memory

    # A spawned child shares its parent's resource tracker, so attaching registers nothing
    # new and the parent's unlink() in close() is the one release of the block.
    shm = shared_memory.SharedMemory(name=shm_name)
    v = _views(shm.buf, cfg)
    hdr = v["hdr"]
    try:
        _serve(v, cfg)
    except BaseException as exc:  # noqa: BLE001 - report whatever stopped the worker
        _write_error(v, f"worker stopped: {type(exc).__name__}: {exc}")
        raise
    finally:
        hdr[H_READY] = 0
        del v, hdr
        shm.close()


def _read_seqlocked(hdr, seq_i, crc_i, data):
    s1 = int(hdr[seq_i])
    if s1 % 2:
        return None
    crc = int(hdr[crc_i])
    copy = data.copy()
    if int(hdr[seq_i]) != s1 or _crc(copy) != crc:
        return None
    return copy, s1


def _serve(v, cfg: _Config) -> None:  # pragma: no cover - child process
    hdr = v["hdr"]
    parent = os.getppid()
    hdr[H_PID] = os.getpid()
    hdr[H_HEARTBEAT] = time.monotonic_ns()
    if cfg.n_threads:
        import numba

        numba.set_num_threads(max(1, min(cfg.n_threads, numba.config.NUMBA_NUM_THREADS)))
    got = _read_seqlocked(hdr, H_PLACE_SEQ, H_PLACE_CRC, v["place"])
    while got is None:  # written before the spawn; a retry only if the engine rewrote it
        time.sleep(cfg.poll)
        got = _read_seqlocked(hdr, H_PLACE_SEQ, H_PLACE_CRC, v["place"])
    p2l, _ = got
    place_seq = int(hdr[H_PLACE_SEQ])
    place_version = int(hdr[H_PLACE_VERSION])
    solver = _Solver(cfg, p2l)
    # Warm up (JIT compile or cache load) on the real placement before declaring ready: a
    # server compiles its kernels up front, never runs their plain-Python references
    from ..solvers.dispatch._backend import set_kernel_mode

    set_kernel_mode("kernel")
    solver.solve(solver.replicas.any(axis=-1).astype(np.int64))
    decider = _Decider(cfg, p2l, place_version) if cfg.rebalance is not None else None
    hdr[H_READY] = 1
    last_window, due = -1, 0.0
    while not hdr[H_STOP]:
        now = time.monotonic()
        hdr[H_HEARTBEAT] = time.monotonic_ns()
        if os.getppid() != parent:
            return  # the engine is gone
        if int(hdr[H_PLACE_SEQ]) != place_seq:
            got = _read_seqlocked(hdr, H_PLACE_SEQ, H_PLACE_CRC, v["place"])
            if got is not None:
                p2l, place_seq = got
                place_version = int(hdr[H_PLACE_VERSION])
                try:
                    solver.set_placement(p2l)
                except Exception as exc:  # noqa: BLE001 - reported, the old one stays
                    _write_error(v, f"placement {place_version}: {type(exc).__name__}: {exc}")
                else:
                    hdr[H_FAILING] = 0
        window = int(hdr[H_REQ_WINDOW])
        if window != last_window and now >= due:
            t0 = time.perf_counter()
            got = _read_seqlocked(hdr, H_REQ_SEQ, H_REQ_CRC, v["counts"])
            if got is None or int(hdr[H_REQ_WINDOW]) != window:
                time.sleep(cfg.poll / 4)
                continue
            counts, _ = got
            t_read = time.perf_counter()
            last_window, due = window, now + cfg.period
            try:
                probs, makespan, t_solved = solver.solve(counts)
            except Exception as exc:  # noqa: BLE001 - reported, the engine keeps its tables
                _write_error(v, f"window {window}: {type(exc).__name__}: {exc}")
                continue
            t_tables = time.perf_counter()
            _post(
                v,
                cfg,
                probs,
                counts > 0,
                makespan,
                window,
                place_version,
                (t_read - t0, t_solved - t_read, t_tables - t_solved),
            )
            hdr[H_SOLVES] += 1
            hdr[H_FAILING] = 0
            if decider is not None:
                try:
                    decider.window(counts, window, v)
                except Exception as exc:  # noqa: BLE001 - reported, no decision posted
                    _write_error(v, f"rebalance decision: {type(exc).__name__}: {exc}")
        time.sleep(cfg.poll)


class _Decider:
    """The worker's rebalance decisions (the process side; module notes)."""

    def __init__(self, cfg: _Config, p2l: np.ndarray, version: int):
        self.cfg = cfg
        self.policy = cfg.rebalance
        self.history: list[tuple[int, np.ndarray]] = []
        self.p2l, self.version = p2l.copy(), version
        self.since = 0

    def placement(self, p2l: np.ndarray, version: int) -> None:
        self.p2l, self.version = p2l.copy(), version

    def window(self, counts: np.ndarray, window: int, v) -> None:
        """Keep ``counts`` (window ``window``); decide every ``rebalance_every`` windows."""
        self.history.append((window, counts.copy()))
        del self.history[: max(0, len(self.history) - self.policy.window_steps())]
        self.since += 1
        if self.since < self.cfg.rebalance_every:
            return
        self.since = 0
        d = decide_for_windows(
            self.policy, [c for _, c in self.history], self.p2l, self.cfg.n_gpus,
            self.cfg.num_groups, self.cfg.num_nodes, self.cfg.cost, self.cfg.move,
        )  # fmt: skip
        _post_decision(v, d, self.history[0][0], self.history[-1][0], self.version)


def decide_for_windows(
    policy, windows, physical_to_logical, n_gpus, num_groups, num_nodes, cost, move
):
    """The decision of ``policy`` (``Auto``) for count ``windows`` (oldest first, each
    ``[L, E]``) from the placement ``physical_to_logical``: the call the worker makes, and the
    one an engine or a test makes to check it (every rank active, one window per recorded
    batch, the step time unknown)."""
    from ..solvers.placement.rebalance.policy import RebalanceContext

    p2l = np.asarray(physical_to_logical, dtype=np.int64)
    ctx = RebalanceContext(
        history=np.stack([np.asarray(w, dtype=np.int64) for w in windows]), previous=p2l,
        num_replicas=p2l.shape[1], num_groups=num_groups, num_nodes=num_nodes,
        num_gpus=n_gpus, cost=cost, move=move,
    )  # fmt: skip
    return policy.decide(ctx)


def _post_decision(v, d, first: int, last: int, place_version: int) -> None:
    meta = v["dmeta"]
    meta[D_SEQ] += 1  # odd: writing
    v["dplace"][...] = d.physical_to_logical
    v["dfloat"][:] = (d.gain_s, d.cost_s)
    meta[D_FIRST], meta[D_LAST] = first, last
    meta[D_REBALANCE], meta[D_MOVES], meta[D_PLACE] = int(d.rebalance), d.moves, place_version
    meta[D_CRC] = _crc(v["dplace"], v["dfloat"])
    meta[D_POST] += 1
    meta[D_SEQ] += 1  # even: complete


def _post(v, cfg, probs, active, makespan, window, place_version, times) -> None:
    hdr = v["hdr"]
    t0 = time.perf_counter()
    slot = 0 if int(hdr[H_LATEST]) == 1 else 1
    meta = v[f"meta{slot}"]
    meta[M_SEQ] += 1  # odd: writing
    v[f"probs{slot}"][...] = probs
    v[f"active{slot}"][...] = active
    v[f"makespan{slot}"][...] = makespan
    meta[M_WINDOW] = window
    meta[M_PLACE] = place_version
    meta[M_READ], meta[M_SOLVE], meta[M_TABLES] = (int(t * 1e9) for t in times)
    meta[M_CRC] = _crc(v[f"probs{slot}"], v[f"active{slot}"])
    meta[M_POSTED] = time.monotonic_ns()
    meta[M_POST] = int(hdr[H_POSTS]) + 1
    meta[N_META - 1] = int((time.perf_counter() - t0) * 1e9)
    meta[M_SEQ] += 1  # even: complete
    hdr[H_LATEST] = slot
    hdr[H_POSTS] += 1


# --- the engine side ----------------------------------------------------------------------


def _rebalance_iv(rebalance, move, num_groups, num_nodes, every, n_gpus, P, E, func):
    """``SolverWorker``'s rebalance options checked (before the process starts)."""
    if rebalance is None:
        for name, value, default in (("move", move, None), ("rebalance_every", every, 1)):
            if value != default:
                raise param_error(name, func, "left out without rebalance", repr(value))
        return None, None, 1, 1, 1
    from ..solvers.placement.rebalance.registry import get_rebalance_policy
    from ..solvers.placement.rebalance.transfer import MoveCost

    policy = get_rebalance_policy(rebalance, func)
    if not hasattr(policy, "decide"):
        raise param_error(
            "rebalance", func, "a policy that decides from windows ('auto')", repr(policy.label)
        )
    check_type(move, "move", func, MoveCost, "a MoveCost (the copies' price) with rebalance")
    num_groups = check_int(num_groups, "num_groups", func, lo=1)
    num_nodes = check_int(num_nodes, "num_nodes", func, lo=1)
    if E % num_groups or n_gpus % num_nodes:
        raise param_error(
            "num_groups", func, f"a divisor of the {E} experts, with num_nodes a divisor of "
            f"n_gpus={n_gpus}", f"num_groups={num_groups}, num_nodes={num_nodes}",
        )  # fmt: skip
    every = check_int(every, "rebalance_every", func, lo=1)
    return policy, move, num_groups, num_nodes, every


def _cleanup(proc, shm) -> None:
    """Stop the process and free the block (also run by the finalizer)."""
    if proc is not None and proc.is_alive():
        proc.terminate()
        proc.join(2)
        if proc.is_alive():
            proc.kill()
            proc.join(2)
    try:
        shm.close()
    except BufferError:  # a view is still alive somewhere; the OS frees it at exit
        pass
    try:
        shm.unlink()
    except FileNotFoundError:
        pass


class SolverWorker:
    """Solve count windows into replica tables in a spawned process; never block the engine.

    Parameters
    ----------
    physical_to_logical : array_like of int, shape (n_layers, n_slots)
        Logical expert of each physical slot (``-1``: empty), slot ``p`` on GPU
        ``p // (n_slots / n_gpus)`` (EPLB's layout).
    n_gpus : int
        GPUs of the EP group; must divide ``n_slots``.
    cost : CostModel
        The cost model the method minimises (e.g. ``CostModel.preset("dsv3_a_offline")``).
    n_experts : int, optional
        Logical experts (default ``max(physical_to_logical) + 1``).
    method : str, default "tempo"
        A registered dispatch method (:func:`~straggler.solvers.dispatch_methods`); stack
        methods (tempo) solve all layers in one call on the worker's threads.
    options : dict, optional
        The method's hyperparameters (checked here, before the process starts). For
        ``tempo``, ``repair_budget_s`` defaults to a quarter of ``period`` (the repair's
        budget is per stack solve), so a refresh stays inside its period.
    period : float, default 0.2
        Seconds between solves (TEMPO's 200 ms default); a window submitted sooner waits,
        and only the latest window is solved.
    n_threads : int, default 1
        Numba threads of the worker (layers are solved in parallel across them).
    stale_after : float, optional
        A heartbeat older than this (seconds) marks the worker unhealthy (default
        ``max(1, 5 * period)``).
    max_replicas : int, optional
        Width ``X`` of the tables (default: the widest row of the placement); later
        placements may not exceed it.
    time_limit : float, default 1.0
        Per-layer limit passed to exact methods.
    gpu_node : array_like of int, optional
        Node of each GPU, for topology-aware methods.
    seed : int, default 0
        Seed of randomized methods.
    rebalance : str or RebalancePolicy, optional
        A policy that decides from windows (``"auto"``, ``"auto:N"`` or an
        :class:`~straggler.solvers.placement.rebalance.auto.Auto`): the worker then keeps
        its last ``window`` windows and posts a decision every ``rebalance_every`` windows
        (module notes; :meth:`rebalance_decision`).
    move : MoveCost, optional
        The copies' price the decision weighs (needed with ``rebalance``: the worker does not
        know the model's expert size).
    num_groups, num_nodes : int, default 1
        The layout EPLB's plan (the decision's target) uses.
    rebalance_every : int, default 1
        Windows between two decisions.

    Attributes
    ----------
    log2phy : numpy.ndarray, int64, (n_layers, n_experts, X)
        The columns of every posted table (``logical_to_physical`` of the placement, padded
        with ``-1`` to ``X``): build the engine's :class:`~straggler.runtime.TablePublisher`
        from it.

    Notes
    -----
    The engine never waits: ``submit`` and ``poll`` copy at most a few hundred kilobytes and
    check a process with ``waitpid(WNOHANG)``. A dead worker (``status().alive`` False), a
    stopped or overloaded one (heartbeat older than ``stale_after``) or one whose solve raised
    (``status().last_error``) leaves the last tables in force; each change of health is
    logged once. The process exits when :meth:`close` is called, when the engine process
    goes away, or at interpreter exit (daemon process).

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel
    >>> p2l = np.array([[0, 1, 0, 2]])  # expert 0 replicated on both GPUs
    >>> with SolverWorker(p2l, 2, CostModel(a=0, b=15, c=0, beta=0.1), period=0.01) as w:
    ...     ok = w.wait_ready(timeout=600)
    ...     window = w.submit([[600, 30, 30]])
    ...     tables = w.wait_tables(window, timeout=60)
    >>> w.log2phy[0].tolist()
    [[0, 2], [1, -1], [3, -1]]
    >>> tables.probs[0].tolist(), tables.active[0].tolist()
    ([[0.5, 0.5], [1.0, 0.0], [1.0, 0.0]], [True, True, True])
    """

    def __init__(
        self,
        physical_to_logical,
        n_gpus,
        cost,
        *,
        n_experts=None,
        method: str = "tempo",
        options=None,
        period: float = 0.2,
        n_threads: int = 1,
        stale_after: float | None = None,
        max_replicas: int | None = None,
        time_limit: float = 1.0,
        gpu_node=None,
        seed: int = 0,
        rebalance=None,
        move=None,
        num_groups: int = 1,
        num_nodes: int = 1,
        rebalance_every: int = 1,
    ):
        from ..solvers.dispatch.registry import make_method

        func = "SolverWorker"
        p2l = check_array(
            physical_to_logical, "physical_to_logical", func, kind="int", ndim=2, lo=-1
        )
        L, P = p2l.shape
        n_gpus = check_int(n_gpus, "n_gpus", func, lo=1)
        if L < 1 or P < 1 or P % n_gpus:
            raise param_error(
                "physical_to_logical",
                func,
                f"an (n_layers >= 1, n_slots) array with n_slots divisible by n_gpus={n_gpus}",
                f"shape {p2l.shape}",
            )
        # every expert needs a slot, so there are at most P of them (checked before anything
        # is sized by the number of experts)
        if p2l.max() >= P:
            raise param_error(
                "physical_to_logical",
                func,
                f"expert ids below the {P} slots (every expert needs a slot)",
                f"id {int(p2l.max())}",
            )
        E = (
            int(p2l.max()) + 1
            if n_experts is None
            else check_int(n_experts, "n_experts", func, lo=1, hi=P)
        )
        if E < 1 or p2l.max() >= E:
            raise param_error(
                "n_experts",
                func,
                f"more than the largest expert id {int(p2l.max())}",
                repr(n_experts),
            )
        _check_every_expert_placed(p2l, E, func)
        cost = check_type(cost, "cost", func, CostModel, "a CostModel")
        if options is not None and not isinstance(options, Mapping):
            raise param_error(
                "options", func, "a mapping of the method's options", type(options).__name__
            )
        options = {} if options is None else dict(options)
        make_method(method, options, func)  # unknown method or option: raise here
        period = check_real(period, "period", func, lo=0, lo_open=True)
        if method == "tempo" and "repair_budget_s" not in options:
            # tempo's exact repair gets a quarter of each refresh (not its 2 s default)
            options["repair_budget_s"] = 0.25 * period
        n_threads = check_int(n_threads, "n_threads", func, lo=1)
        stale = (
            max(1.0, 5 * period)
            if stale_after is None
            else check_real(stale_after, "stale_after", func, lo=0, lo_open=True)
        )
        width = int(logical_to_physical(p2l, E)[0].shape[-1])
        if max_replicas is not None:
            # an expert has at most one replica per slot: a larger width is only memory
            width_cap = check_int(max_replicas, "max_replicas", func, lo=1, hi=P)
            if width_cap < width:
                raise param_error(
                    "max_replicas",
                    func,
                    f"at least {width} (the placement's widest row)",
                    repr(max_replicas),
                )
            width = width_cap
        time_limit = check_real(time_limit, "time_limit", func, lo=0, lo_open=True)
        seed = check_int(seed, "seed", func, lo=0)
        if gpu_node is not None:
            gpu_node = tuple(
                int(g)
                for g in check_array(gpu_node, "gpu_node", func, kind="int", shape=(n_gpus,), lo=0)
            )
        DispatchProblem.from_placement(np.zeros((L, E), np.int64), p2l, n_gpus, gpu_node)
        rebalance, move, num_groups, num_nodes, rebalance_every = _rebalance_iv(
            rebalance, move, num_groups, num_nodes, rebalance_every, n_gpus, P, E, func
        )
        self._cfg = _Config(
            n_layers=L,
            n_experts=E,
            n_slots=P,
            width=width,
            n_gpus=n_gpus,
            gpu_node=gpu_node,
            cost=cost,
            method=method,
            options=options,
            period=period,
            poll=min(0.005, period / 10),
            n_threads=n_threads,
            time_limit=time_limit,
            seed=seed,
            rebalance=rebalance,
            move=move,
            num_groups=num_groups,
            num_nodes=num_nodes,
            rebalance_every=rebalance_every,
        )
        self.stale_after = stale
        self.log2phy = _padded_log2phy(p2l, E, width)
        self._p2l = p2l.copy()
        self._shm = None
        self._proc = None
        self._views = None
        self._window = 0
        self._place_version = 0
        self._last_post = 0
        self._last_decision = 0
        self._health = None
        self._finalizer = None

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> SolverWorker:
        """Spawn the process (returns at once; see :meth:`wait_ready`)."""
        from multiprocessing import shared_memory

        if self._proc is not None:
            raise InvalidInputError("SolverWorker.start was called twice.")
        _, size = _layout(self._cfg)
        self._shm = shared_memory.SharedMemory(create=True, size=size)
        self._views = _views(self._shm.buf, self._cfg)
        self._views["hdr"][:] = 0
        self._views["hdr"][H_LATEST] = -1
        self._write_placement(self._p2l)
        ctx = mp.get_context("spawn")
        self._proc = ctx.Process(
            target=_worker_main,
            args=(self._shm.name, self._cfg),
            name="straggler-solver",
            daemon=True,
        )
        self._proc.start()
        self._finalizer = weakref.finalize(self, _cleanup, self._proc, self._shm)
        return self

    def wait_ready(self, timeout: float = 300.0) -> bool:
        """Wait (this call blocks, use it at start-up) until the worker has warmed up its
        kernels; False when it died or the timeout passed."""
        timeout = check_real(timeout, "timeout", "SolverWorker.wait_ready", lo=0)
        self._require_started("SolverWorker.wait_ready")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self._views["hdr"][H_READY]:
                return True
            if not self._proc.is_alive():
                return False
            time.sleep(0.01)
        return False

    def close(self, timeout: float = 5.0) -> int | None:
        """Ask the worker to stop, wait up to ``timeout`` s, then terminate it; free the
        shared memory. Returns the process exit code."""
        timeout = check_real(timeout, "timeout", "SolverWorker.close", lo=0)
        if self._proc is None:
            return None
        if self._views is not None:
            self._views["hdr"][H_STOP] = 1
        self._proc.join(timeout)
        code = self._proc.exitcode
        self._views = None
        self._finalizer()
        return code if code is not None else self._proc.exitcode

    def __enter__(self) -> SolverWorker:
        return self.start() if self._proc is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- engine side: never blocks --------------------------------------------------
    def _write_placement(self, p2l) -> None:
        hdr = self._views["hdr"]
        hdr[H_PLACE_SEQ] += 1
        self._views["place"][...] = p2l
        hdr[H_PLACE_VERSION] = self._place_version
        hdr[H_PLACE_CRC] = _crc(self._views["place"])
        hdr[H_PLACE_SEQ] += 1

    def submit(self, counts) -> int:
        """Hand the worker the latest count window ``[n_layers, n_experts]``; returns its id.

        Non-blocking: the window overwrites any the worker has not taken yet.
        """
        func = "SolverWorker.submit"
        L, E = self._cfg.n_layers, self._cfg.n_experts
        c = check_array(
            counts,
            "counts",
            func,
            kind="int",
            ndim=2,
            shape=(L, E),
            lo=0,
            hi=MAX_COUNT,
            expected=f"an ({L}, {E}) array of non-negative integers at most 2**52",
        )
        self._require_started(func)
        hdr = self._views["hdr"]
        self._window += 1
        hdr[H_REQ_SEQ] += 1
        self._views["counts"][...] = c
        hdr[H_REQ_CRC] = _crc(self._views["counts"])
        hdr[H_REQ_WINDOW] = self._window
        hdr[H_REQ_SEQ] += 1
        return self._window

    def set_placement(self, physical_to_logical) -> None:
        """A new placement (after an EPLB rebalance): tables solved for the old one are
        dropped by :meth:`poll`; ``log2phy`` changes (reset the publisher with it)."""
        func = "SolverWorker.set_placement"
        cfg = self._cfg
        p2l = check_array(
            physical_to_logical,
            "physical_to_logical",
            func,
            kind="int",
            ndim=2,
            shape=(cfg.n_layers, cfg.n_slots),
            lo=-1,
            hi=cfg.n_experts - 1,
        )
        width = int(logical_to_physical(p2l, cfg.n_experts)[0].shape[-1])
        if width > cfg.width:
            raise param_error(
                "physical_to_logical",
                func,
                f"at most {cfg.width} replicas per expert (max_replicas)",
                f"{width}",
            )
        _check_every_expert_placed(p2l, cfg.n_experts, func)
        DispatchProblem.from_placement(
            np.zeros((cfg.n_layers, cfg.n_experts), np.int64), p2l, cfg.n_gpus, cfg.gpu_node
        )
        self._require_started(func)
        self._place_version += 1
        self._p2l = p2l.copy()
        self.log2phy = _padded_log2phy(p2l, cfg.n_experts, cfg.width)
        self._write_placement(p2l)

    def poll(self) -> WorkerTables | None:
        """The newest tables not yet returned, or ``None`` (nothing new, a post being
        written, tables for an old placement, or an unhealthy worker). Never blocks."""
        self._require_started("SolverWorker.poll")
        self._check_health()
        v = self._views
        hdr = v["hdr"]
        slot = int(hdr[H_LATEST])
        if slot < 0:
            return None
        meta = v[f"meta{slot}"]
        s1 = int(meta[M_SEQ])
        post = int(meta[M_POST])
        if s1 % 2 or post <= self._last_post:
            return None
        probs = v[f"probs{slot}"].copy()
        active = v[f"active{slot}"].astype(bool)
        makespan = v[f"makespan{slot}"].copy()
        fields = meta.copy()
        if int(meta[M_SEQ]) != s1 or _crc(probs, active.astype(np.uint8)) != int(fields[M_CRC]):
            return None  # torn by a new post: the next poll takes that one
        self._last_post = post
        if int(fields[M_PLACE]) != self._place_version:
            return None
        return WorkerTables(
            probs=probs,
            active=active,
            makespan=makespan,
            window=int(fields[M_WINDOW]),
            placement=int(fields[M_PLACE]),
            timings={
                "read": fields[M_READ] / 1e9,
                "solve": fields[M_SOLVE] / 1e9,
                "tables": fields[M_TABLES] / 1e9,
                "post": fields[N_META - 1] / 1e9,
                "age": (time.monotonic_ns() - int(fields[M_POSTED])) / 1e9,
            },
        )

    def rebalance_decision(self) -> WorkerDecision | None:
        """The newest rebalance decision not yet returned, or ``None`` (none, one being
        written, or the worker built without ``rebalance``). Never blocks."""
        self._require_started("SolverWorker.rebalance_decision")
        if self._cfg.rebalance is None:
            return None
        v = self._views
        meta = v["dmeta"]
        s1 = int(meta[D_SEQ])
        post = int(meta[D_POST])
        if s1 % 2 or post <= self._last_decision:
            return None
        place = v["dplace"].copy()
        floats = v["dfloat"].copy()
        fields = meta.copy()
        if int(meta[D_SEQ]) != s1 or _crc(place, floats) != int(fields[D_CRC]):
            return None  # torn by a new post: the next call takes that one
        self._last_decision = post
        return WorkerDecision(
            rebalance=bool(fields[D_REBALANCE]),
            moves=int(fields[D_MOVES]),
            physical_to_logical=place,
            gain_s=float(floats[0]),
            cost_s=float(floats[1]),
            windows=(int(fields[D_FIRST]), int(fields[D_LAST])),
            placement=int(fields[D_PLACE]),
        )

    def wait_decision(self, timeout: float = 10.0) -> WorkerDecision | None:
        """Poll :meth:`rebalance_decision` until one arrives or ``timeout`` passes. Blocks:
        for tests, benchmarks and start-up, not the engine's loop."""
        timeout = check_real(timeout, "timeout", "SolverWorker.wait_decision", lo=0)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            d = self.rebalance_decision()
            if d is not None:
                return d
            time.sleep(0.001)
        return None

    def wait_tables(self, window: int, timeout: float = 10.0) -> WorkerTables | None:
        """Poll until tables for ``window`` (or a later one) arrive, or ``timeout`` passes.
        Blocks: for tests, benchmarks and start-up, not the engine's loop."""
        func = "SolverWorker.wait_tables"
        window = check_int(window, "window", func, lo=0)
        timeout = check_real(timeout, "timeout", func, lo=0)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            t = self.poll()
            if t is not None and t.window >= window:
                return t
            time.sleep(0.001)
        return None

    def status(self) -> WorkerStatus:
        """Liveness, readiness and health, read from shared memory without waiting."""
        self._require_started("SolverWorker.status")
        return self._check_health()

    def _check_health(self) -> WorkerStatus:
        v = self._views
        hdr = v["hdr"]
        alive = self._proc.is_alive()
        ready = bool(hdr[H_READY])
        beat = int(hdr[H_HEARTBEAT])
        age = (time.monotonic_ns() - beat) / 1e9 if beat else float("inf")
        failing = int(hdr[H_FAILING])
        healthy = alive and ready and age < self.stale_after and failing == 0
        err = bytes(v["err"]).split(b"\0", 1)[0].decode("utf-8", "replace")
        if healthy:
            reason = ""
        elif not alive:
            reason = f"the worker process is dead (exit code {self._proc.exitcode})"
        elif not ready:
            reason = "the worker is still warming up"
        elif age >= self.stale_after:
            reason = f"no heartbeat for {age:.2f} s (stale_after={self.stale_after} s)"
        else:
            reason = f"its last {failing} refresh(es) failed: {err}"
        st = WorkerStatus(
            alive=alive,
            ready=ready,
            healthy=healthy,
            heartbeat_age_s=age,
            n_solves=int(hdr[H_SOLVES]),
            n_errors=int(hdr[H_ERRORS]),
            last_error=err,
            exitcode=self._proc.exitcode,
            reason=reason,
            n_failing=failing,
        )
        state = (
            "healthy"
            if healthy
            else (
                "dead"
                if not alive
                else (
                    "starting"
                    if not ready
                    else ("stalled" if age >= self.stale_after else "failing")
                )
            )
        )
        if state != self._health:
            if self._health is not None and state in ("dead", "stalled", "failing"):
                log.warning(
                    "solver worker %s (heartbeat %.2f s old, exit code %s%s); the "
                    "last tables stay in force",
                    state,
                    age,
                    st.exitcode,
                    f", last error: {err}" if err else "",
                )
            elif self._health in ("dead", "stalled", "failing"):
                log.warning("solver worker %s again", state)
            self._health = state
        return st

    def _require_started(self, func: str) -> None:
        if self._views is None:
            raise InvalidInputError(
                f"{func} needs a started worker: call start() first "
                "(or use it as a context manager)."
            )

    def __repr__(self) -> str:
        c = self._cfg
        return (
            f"SolverWorker(n_layers={c.n_layers}, n_experts={c.n_experts}, "
            f"n_gpus={c.n_gpus}, method={c.method!r}, period={c.period})"
        )
