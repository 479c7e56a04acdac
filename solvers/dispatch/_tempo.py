"""tempo_fast (TEMPO §4.2): Numba kernel and plain-Python reference.

Private module (stumpy's split): :func:`tempo_kernel` is the jitted kernel, read as the
paper's stages (:func:`_stage_seed` -> :func:`_stage_chains` -> :func:`_stage_local_search`
-> :func:`_stage_ensemble` -> :func:`_stage_restarts`, each a function of this file, with one
function per neighbourhood of the local search; stage 3, which three callers run, and stage
4b compile once on their own and are called by the address of their code,
:func:`stage_handles`). :func:`tempo_reference` is the plain-Python reference, written from
the stage descriptions and sharing no helper with the kernel: each stage and neighbourhood
function of the kernel has one reference twin of the same name with ``_reference``
appended, directly below it (``_nb_moves`` / ``_nb_moves_reference``, ...), so an edit to a
kernel stage has its twin beside it. The kernel is ``nogil``: the wrapper solves a stack of
layers on a thread pool. The public wrapper is :mod:`straggler.solvers.dispatch.tempo`,
which documents the stages and every tie-breaking rule.

Both take the token-LP candidate of stage 4 and a certified lower bound as inputs
(computed by :mod:`~straggler.solvers.dispatch._token_lp_fast` and
:mod:`~straggler.solvers.dispatch._bounds`). The jitted functions here call into other
files only for the replica lists (:func:`~straggler.solvers.dispatch._csr.replica_lists`),
the expert order and the by-address calls; :func:`~straggler.solvers._numba.jit.cache_depends_on`
ties their disk cache to those files, so an edit there recompiles them.

Parameters are named: :class:`KernelCost` holds the cost model (``CostModel.as_array`` by
name) and the activation and floor caps, :class:`KernelOptions` the stage switches. A GPU with ``G``
activated replicas, ``N`` tokens and ``T`` tiles takes ``max(a + b*G + b2*(T - G), c +
beta*N, c2 + gamma*N)`` (infinity when ``G`` exceeds the cap), evaluated in exactly this
order in both implementations (and in :func:`~straggler.formulations.evaluate`), so the
floats agree bit for bit.

The expert order (descending tokens, ties lower index) comes from a stable radix sort
(:func:`~straggler.solvers._order.stable_argsort_int_desc`, as A3 orders them).
"""

from __future__ import annotations

import functools
import heapq
import math
from typing import NamedTuple

import numpy as np
from numba import njit

from .. import _order
from .._numba import address as _address
from .._numba.address import call_compiled, compiled_address
from .._numba.jit import NJIT, NJIT_INLINE, cache_depends_on
from .._order import stable_argsort_int_desc
from . import _bounds as _bounds_module
from . import _counting as _counting_module
from . import _csr
from . import method as _method
from ._bounds import (
    FORCED_STEPS,
    forced_bound_kernel,
    forced_bound_reference,
    forced_kernel,
    forced_reference,
)
from ._counting import (
    COUNTING_STEPS,
    counting_bound_kernel,
    counting_bound_reference,
    counting_kernel,
    counting_reference,
)
from ._csr import replica_lists
from .method import OPTIMALITY_RTOL

__all__ = [
    "CHOICES",
    "INFO_FIELDS",
    "KernelCost",
    "KernelOptions",
    "kernel_cost",
    "stage_handles",
    "tempo_kernel",
    "tempo_reference",
]

#: Names of the entries of the ``info`` vector both implementations return.
INFO_FIELDS = (
    "makespan",  # of the returned dispatch
    "makespan_seed",  # after stage 1
    "makespan_chains",  # after stage 2
    "makespan_heuristic",  # after stage 3: M(A_H)
    "makespan_lp",  # token-LP candidate as given (nan when the ensemble is off)
    "makespan_a3",  # A3 candidate (nan when infeasible or the ensemble is off)
    "makespan_sm",  # semi-matching candidate (nan when the ensemble is off)
    "makespan_candidate",  # best candidate, after its local search if polished (nan: off)
    "choice",  # index into CHOICES
    "chain_moves",  # augmenting chains applied in stage 2
    "ls_moves",  # local-search moves applied in stage 3 (to A_H)
    "flow_moves",  # of which token paths
    "exchange_moves",  # of which path or cyclic exchanges
    "restarts",  # ruin-and-recreate restarts applied in stage 4b
    "probes",  # neighbourhood probes of the stage-3 search (of A_H)
    "restart_probes",  # neighbourhood probes of stage 4b's searches (0: it did not run)
    "bound_forced",  # B8 and B9 tried at the stage-4 makespan, before stage 4b (nan: not tried)
)
_N_INFO = len(INFO_FIELDS)

#: Most ruin-and-recreate rounds of stage 4b, and how many floor caps each restart tries.
RESTART_ROUNDS = 2
RESTART_LEVELS = 2
#: Most makespans of stage 4b that B8 and B9 are tried at, one trial each (the first
#: improvements of the search), to end it once one is proved optimal.
RESTART_PROOFS = 8

#: What ``info[INFO_FIELDS.index("choice")]`` indexes: which dispatch tempo returned.
CHOICES = ("heuristic", "token_lp", "a3", "semi_matching", "semi_matching_relaxed")


class KernelCost(NamedTuple):
    """The cost model of one layer, by name, and two caps (the kernels' input)."""

    a: float
    b: float
    b2: float
    c: float
    beta: float
    c2: float
    gamma: float
    tile: int
    cap: float
    """Most activated replicas a GPU may hold (``inf``: no cap); above it its time is inf."""
    floor_cap: float = math.inf
    """Largest floor ``a + b*G + b2*(T - G)`` a GPU may have (``inf``: no cap); above it
    its time is inf."""


class KernelOptions(NamedTuple):
    """Stage switches and parameters of :func:`tempo_kernel`."""

    seed: bool
    chains: bool
    local_search: bool
    ensemble: bool
    flows: bool
    """Token paths in stage 3."""
    exchanges: bool
    """Path and cyclic exchanges in stage 3."""
    tile_chains: bool
    """Ejection chains whose first leg is a tile-boundary partial split."""
    tau: float
    max_iter: int
    restarts: bool = False
    """Ruin-and-recreate restarts after stage 4 (stage 4b)."""
    restart_gap: float = 0.0
    """Stage 4b runs only on a dispatch more than this (relative) above the stop bound."""
    restart_probes: int = 0
    """Stage 4b starts no polish once its searches have made this many neighbourhood probes."""
    max_probes: int = 1 << 62
    """Neighbourhood probes of each stage-3 search (see :func:`_stage_local_search`)."""


def kernel_cost(cost_array, cap: float = math.inf, floor_cap: float = math.inf) -> KernelCost:
    """:class:`KernelCost` from ``CostModel.as_array()`` (``[a, b, b2, c, beta, c2, gamma,
    tile]``), an activation cap and a floor cap."""
    a, b, b2, c, beta, c2, gamma, tile = (float(v) for v in cost_array)
    return KernelCost(a, b, b2, c, beta, c2, gamma, int(tile), float(cap), float(floor_cap))


class _Lists(NamedTuple):
    """Replica lists (CSR): GPUs of each expert and experts of each GPU, increasing."""

    replicas: np.ndarray
    e_ptr: np.ndarray
    e_gpus: np.ndarray
    g_ptr: np.ndarray
    g_exps: np.ndarray


class _State(NamedTuple):
    """A dispatch and its per-GPU bookkeeping, updated in place by every move."""

    x: np.ndarray  # (E, g) shares
    gnt: np.ndarray  # (3, g): activated replicas, tokens, tiles (rows _G, _N, _T)
    times: np.ndarray  # (g,) modeled times
    act: np.ndarray  # (g, E): act[h, :act_n[h]] experts with tokens on h, increasing
    act_n: np.ndarray  # (g,)


_G, _N, _T = 0, 1, 2

# int64 (not literal) sentinels: a literal argument makes numba compile one more
# specialization of the callee
_NO, _ZERO, _ONE = np.int64(-1), np.int64(0), np.int64(1)


class _Work(NamedTuple):
    """Scratch buffers of the local search (allocated once per kernel call)."""

    mv: np.ndarray  # (5, 2g + 2): legs (expert, src, dst, q) of the best move; mv[4, 0] legs
    wi: np.ndarray  # (14, W) int64 rows _MARK .. _STAMP
    wf: np.ndarray  # (2, W) float64 rows _LAB, _MID


# rows of _Work.wi: search stamps and tree (per GPU), improvement graph (per item), heap
_MARK, _PARG, _PARE, _DEPTH, _QUEUE, _OFF = 0, 1, 2, 3, 4, 5
_NODEH, _NODEI, _PRED, _SRC, _DONE, _HEAP, _HPOS, _STAMP = 6, 7, 8, 9, 10, 11, 12, 13
_LAB, _MID = 0, 1


# --------------------------------------------------------------------------------------
# Shared pieces of the kernel
# --------------------------------------------------------------------------------------


@njit(**NJIT)
def _t(cost, G, N, T):
    """Modeled time of one GPU (the one cost family); inf above the activation cap or
    with its floor above the floor cap."""
    if G > cost.cap:
        return np.inf
    t = cost.a + cost.b * G + cost.b2 * (T - G)
    if t > cost.floor_cap:
        return np.inf
    u = cost.c + cost.beta * N
    if u > t:
        t = u
    u = cost.c2 + cost.gamma * N
    if u > t:
        t = u
    return t


@njit(**NJIT)
def _amax(a):
    """``a.max()`` of a non-empty 1-D array, as numba's ``ndarray.max`` computes it (the
    first NaN met is returned): one loop, instead of numba's general nditer implementation,
    which compiles for about half a second per array type."""
    m = a[0]
    if m != m:
        return m
    for i in range(1, a.shape[0]):
        v = a[i]
        if v != v:
            return v
        if v > m:
            m = v
    return m


@njit(**NJIT)
def _tiles(v, tile):
    return (v + tile - 1) // tile


@njit(**NJIT)
def _time_with(cost, x, gnt, h, e_in, q_in, e_out, q_out):
    """Time of GPU h after it gains ``q_in`` tokens of ``e_in`` and loses ``q_out`` of
    ``e_out`` (-1: none); an expert that gains and loses on h counts once, net."""
    xi = x[e_in, h] if e_in >= 0 else -1
    xo = x[e_out, h] if e_out >= 0 else -1
    both = e_in >= 0 and e_in == e_out
    return _time_core(cost, gnt[_G, h], gnt[_N, h], gnt[_T, h], xi, q_in, xo, q_out, both)


@njit(**NJIT)
def _time_core(cost, G, N, T, xi, q_in, xo, q_out, both):
    """:func:`_time_with` on scalars (a GPU's ``G, N, T``; the gaining share holds ``xi``
    tokens, the losing one ``xo``, -1: none; ``both``: one share gains and loses), which
    keeps the hot calls free of array arguments."""
    tile = cost.tile
    if both:
        new = xi + q_in - q_out
        G += np.int64(new > 0) - np.int64(xi > 0)
        N += q_in - q_out
        T += _tiles(new, tile) - _tiles(xi, tile)
        return _t(cost, G, N, T)
    if xi >= 0:
        G += np.int64(xi == 0)
        N += q_in
        T += _tiles(xi + q_in, tile) - _tiles(xi, tile)
    if xo >= 0:
        G -= np.int64(xo == q_out)
        N -= q_out
        T += _tiles(xo - q_out, tile) - _tiles(xo, tile)
    return _t(cost, G, N, T)


@njit(**NJIT)
def _best_split(cost, x, gnt, s, d, e, xs, s_in, s_in_q, d_out, d_out_q, best_v):
    """The split bisection, written once: the best ``q`` in ``[1, xs - 1]`` of expert ``e``
    from GPU ``s`` to GPU ``d`` (``s`` also gaining ``s_in_q`` of ``s_in``, ``d`` also
    losing ``d_out_q`` of ``d_out``, -1: none), if ``max(A(q), B(q)) < best_v``.

    ``A(q)``, the time of ``s``, is nonincreasing and ``B(q)``, the time of ``d``,
    nondecreasing in ``q`` (tiles included), so the integer minimum of ``max(A, B)`` is at
    ``q* - 1`` or ``q*`` with ``q* = min{q : B(q) >= A(q)}`` (bisection; ``q* - 1`` first).
    Returns ``(value, q)``; ``(best_v, -1)`` when no split beats ``best_v``. Pruning only
    by bounds that cannot beat ``best_v``: ``B(1)``, ``A(xs - 1)`` and the best even split
    of the two GPUs' tokens.
    """
    if xs < 2:
        return best_v, _NO
    if _time_with(cost, x, gnt, d, e, _ONE, d_out, d_out_q) >= best_v:
        return best_v, _NO
    if _time_with(cost, x, gnt, s, s_in, s_in_q, e, xs - 1) >= best_v:
        return best_v, _NO
    pair = gnt[_N, s] + s_in_q + gnt[_N, d] - d_out_q
    if _t(cost, _ZERO, (pair + 1) // 2, _ZERO) >= best_v:
        return best_v, _NO
    lo = 1
    hi = xs
    while lo < hi:
        mid = (lo + hi) // 2
        am = _time_with(cost, x, gnt, s, s_in, s_in_q, e, mid)
        if _time_with(cost, x, gnt, d, e, mid, d_out, d_out_q) >= am:
            hi = mid
        else:
            lo = mid + 1
    bq = _NO
    for q in (lo - 1, lo):
        if q < 1 or q > xs - 1:
            continue
        v = max(
            _time_with(cost, x, gnt, s, s_in, s_in_q, e, q),
            _time_with(cost, x, gnt, d, e, q, d_out, d_out_q),
        )
        if v < best_v:
            best_v = v
            bq = q
    return best_v, bq


@njit(**NJIT)
def _gpu_order(times, out):
    """GPUs by decreasing time, ties lower index (stable insertion sort into ``out``)."""
    for h in range(times.shape[0]):
        k = h
        while k > 0 and times[out[k - 1]] < times[h]:
            out[k] = out[k - 1]
            k -= 1
        out[k] = h


@njit(**NJIT)
def _act_build(x, lists, act, act_n):
    """Experts with tokens on each GPU, increasing: ``act[h, :act_n[h]]`` (branch-free)."""
    for h in range(act_n.shape[0]):
        k = 0
        for i in range(lists.g_ptr[h], lists.g_ptr[h + 1]):
            e = lists.g_exps[i]
            act[h, k] = e
            k += np.int64(x[e, h] > 0)
        act_n[h] = k


@njit(**NJIT)
def _state_of(y, lists, cost):
    """The bookkeeping of dispatch ``y`` (its live entries only)."""
    E, g = y.shape
    gnt = np.zeros((3, g), np.int64)
    for e in range(E):
        for j in range(lists.e_ptr[e], lists.e_ptr[e + 1]):
            h = lists.e_gpus[j]
            v = y[e, h]
            if v > 0:
                gnt[_G, h] += 1
                gnt[_N, h] += v
                gnt[_T, h] += _tiles(v, cost.tile)
    times = np.empty(g)
    for h in range(g):
        times[h] = _t(cost, gnt[_G, h], gnt[_N, h], gnt[_T, h])
    act = np.empty((g, E), np.int64)
    act_n = np.zeros(g, np.int64)
    _act_build(y, lists, act, act_n)
    return _State(y, gnt, times, act, act_n)


@njit(**NJIT)
def _move(st, cost, e, src, dst, q):
    """Send q tokens of expert e from GPU src to GPU dst, updating the state in place."""
    x = st.x
    gnt = st.gnt
    act = st.act
    act_n = st.act_n
    tile = cost.tile
    xs = x[e, src]
    xd = x[e, dst]
    gnt[_G, src] -= 1 if q == xs else 0
    gnt[_N, src] -= q
    gnt[_T, src] += _tiles(xs - q, tile) - _tiles(xs, tile)
    gnt[_G, dst] += 1 if xd == 0 else 0
    gnt[_N, dst] += q
    gnt[_T, dst] += _tiles(xd + q, tile) - _tiles(xd, tile)
    x[e, src] = xs - q
    x[e, dst] = xd + q
    for h in (src, dst):
        st.times[h] = _t(cost, gnt[_G, h], gnt[_N, h], gnt[_T, h])
    if xd == 0:  # insert e into dst's active list, keeping it increasing
        k = act_n[dst]
        while k > 0 and act[dst, k - 1] > e:
            act[dst, k] = act[dst, k - 1]
            k -= 1
        act[dst, k] = e
        act_n[dst] += 1
    if q == xs:  # remove e from src's active list
        k = 0
        while act[src, k] != e:
            k += 1
        for j in range(k, act_n[src] - 1):
            act[src, j] = act[src, j + 1]
        act_n[src] -= 1


@njit(**NJIT)
def _record(mv, k, e, src, dst, q):
    """Leg k of the best compound move."""
    mv[0, k] = e
    mv[1, k] = src
    mv[2, k] = dst
    mv[3, k] = q


# --------------------------------------------------------------------------------------
# Shared pieces of the reference
# --------------------------------------------------------------------------------------
# The plain-Python reference (:func:`tempo_reference`) is written from the stage
# descriptions, one function per kernel function of the same name with ``_reference``
# appended, each directly below its twin. It keeps no incremental bookkeeping: every
# candidate is scored by recomputing the GPUs it changes from the shares (:class:`_Ref`).

#: The reference's caps ``(activation cap, floor cap)``: none.
_NO_CAP = (math.inf, math.inf)


class _Ref:
    """One layer in plain Python: token counts, replica rows, the cost model, the options,
    the expert order (descending tokens, ties lower index), and the GPU-time arithmetic
    every reference stage scores with."""

    def __init__(self, counts, replicas, cost, opts):
        self.counts = [int(v) for v in counts]
        self.R = [[bool(r) for r in row] for row in replicas]
        self.a, self.b, self.b2, self.c, self.beta, self.c2, self.gamma = (
            float(v) for v in cost[:7]
        )
        self.tile = int(cost.tile)
        self.E, self.g = len(self.R), len(self.R[0])
        self.opts = opts
        self.order = sorted(range(self.E), key=lambda e: (-self.counts[e], e))

    def tiles(self, v):
        return -(-v // self.tile)

    def time_of(self, G, N, T, cap=_NO_CAP):
        """The time of a GPU with ``G`` activations, ``N`` tokens and ``T`` tiles (infinite
        above a cap), in :func:`_t`'s order of operations."""
        floor = self.a + self.b * G + self.b2 * (T - G)
        if G > cap[0] or floor > cap[1]:
            return math.inf
        return max(floor, self.c + self.beta * N, self.c2 + self.gamma * N)

    def gpu(self, h, y):
        """(G, N, T) of GPU h under shares y."""
        col = [y[e][h] for e in range(self.E) if y[e][h] > 0]
        return len(col), sum(col), sum(self.tiles(v) for v in col)

    def times_of(self, y, cap=_NO_CAP):
        return [self.time_of(*self.gpu(h, y), cap) for h in range(self.g)]

    def time_after(self, y, h, changes, cap):
        """Time of GPU h after the share changes [(expert, tokens)] (summed per expert)."""
        de = {}
        for e, dq in changes:
            de[e] = de.get(e, 0) + dq
        col = [y[e][h] + de.get(e, 0) for e in range(self.E)]
        col = [v for v in col if v > 0]
        return self.time_of(len(col), sum(col), sum(self.tiles(v) for v in col), cap)

    def after(self, y, moves, cap):
        """New times of the GPUs the moves (e, src, dst, q) change."""
        changes = {}
        for e, src, dst, q in moves:
            changes.setdefault(src, []).append((e, -q))
            changes.setdefault(dst, []).append((e, q))
        return {h: self.time_after(y, h, ch, cap) for h, ch in changes.items()}

    def value(self, y, moves, cap):
        """The largest new time of the GPUs the moves change."""
        return max(self.after(y, moves, cap).values())


def _moved(y, moves):
    """Copy of y with moves (e, src, dst, q) applied in order."""
    z = [row[:] for row in y]
    for e, src, dst, q in moves:
        z[e][src] -= q
        z[e][dst] += q
    return z


# --------------------------------------------------------------------------------------
# Stage 1: cost-aware greedy seeding
# --------------------------------------------------------------------------------------


@njit(**NJIT)
def _put_whole(x, gnt, put, counts, order, lists, cost, seed):
    """Stage 1's rule, in place: the experts ``e`` with ``put[e]``, by descending tokens
    (``order``; ties: lower index), each put whole (``x[e, h] = counts[e]``) on the replica
    ``h`` minimizing (marginal cost t_new - t_old of its GPU, t_new, GPU index), the GPUs'
    ``(G, N, T)`` in ``gnt`` updated; ``seed=False`` puts each on its lowest-index replica
    instead. Stage 1 puts every expert on empty GPUs; stage 4b's recreate puts back the
    experts it removed."""
    for i in range(order.shape[0]):
        e = order[i]
        n = counts[e]
        if n == 0:
            break
        if not put[e]:
            continue
        best = -1
        bk1 = np.inf
        bk2 = np.inf
        for j in range(lists.e_ptr[e], lists.e_ptr[e + 1]):
            h = lists.e_gpus[j]
            if not seed:
                best = h
                break
            t0 = _t(cost, gnt[_G, h], gnt[_N, h], gnt[_T, h])
            tn = _t(cost, gnt[_G, h] + 1, gnt[_N, h] + n, gnt[_T, h] + _tiles(n, cost.tile))
            k1 = tn - t0
            if best < 0 or k1 < bk1 or (k1 == bk1 and tn < bk2):
                best = h
                bk1 = k1
                bk2 = tn
        x[e, best] = n
        gnt[_G, best] += 1
        gnt[_N, best] += n
        gnt[_T, best] += _tiles(n, cost.tile)


def _put_whole_reference(ref, x, put, seed):
    """Plain-Python twin of :func:`_put_whole`: the experts in ``put``, by descending
    tokens, each whole on the replica of lowest (marginal cost, new time, GPU index), or on
    its lowest-index replica without ``seed``; in place on the lists ``x``."""
    for e in ref.order:
        n = ref.counts[e]
        if n == 0:
            break
        if e not in put:
            continue
        cands = [h for h in range(ref.g) if ref.R[e][h]]
        if seed:

            def key(h, n=n, y=x):
                G, N, T = ref.gpu(h, y)
                tn = ref.time_of(G + 1, N + n, T + ref.tiles(n))
                return (tn - ref.time_of(G, N, T), tn, h)

            h = min(cands, key=key)
        else:
            h = cands[0]
        x[e][h] = n


@njit(**NJIT_INLINE)
def _stage_seed(counts, order, lists, cost, seed):
    """Whole experts by descending tokens (ties: lower index), each on the replica
    minimizing (marginal cost t_new - t_old of that GPU, t_new, GPU index); ``seed=False``
    puts each on its lowest-index replica instead (:func:`_put_whole` on empty GPUs)."""
    E, g = lists.replicas.shape
    x = np.zeros((E, g), np.int64)
    gnt = np.zeros((3, g), np.int64)
    _put_whole(x, gnt, np.ones(E, np.bool_), counts, order, lists, cost, seed)
    times = np.empty(g)
    for h in range(g):
        times[h] = _t(cost, gnt[_G, h], gnt[_N, h], gnt[_T, h])
    st = _State(x, gnt, times, np.empty((g, E), np.int64), np.zeros(g, np.int64))
    _act_build(x, lists, st.act, st.act_n)
    return st


def _stage_seed_reference(ref):
    """Plain-Python twin of :func:`_stage_seed`: the seeded dispatch, as lists."""
    x = [[0] * ref.g for _ in range(ref.E)]
    _put_whole_reference(ref, x, range(ref.E), ref.opts.seed)
    return x


# --------------------------------------------------------------------------------------
# Stage 2: augmenting chains on max G
# --------------------------------------------------------------------------------------


@njit(**NJIT)
def _rest_max(times, top, i, j, k):
    """Largest time over GPUs other than ``i``, ``j``, ``k`` (-inf if none).

    ``top`` holds the indices of the (up to) four largest times, -1 past the end.
    """
    for r in range(4):
        h = top[r]
        if h < 0:
            break
        if h != i and h != j and h != k:
            return times[h]
    return -np.inf


@njit(**NJIT_INLINE)
def _stage_chains(st, lists, cost):
    """1- and 2-step augmenting chains on max G (see the wrapper's stage 2); returns the
    number of chains applied. The applied chain minimizes (makespan, max time of the GPUs
    it changes), first found on ties; 2-step chains only without a 1-step one.

    Pruning only (the result is that of the full enumeration): a chain's value is at least
    the new time of each GPU it changes; a destination not holding the expert needs
    ``G <= Gmax - 2``, and with no such GPU only a split expert has one.
    """
    E, g = lists.replicas.shape
    e_ptr = lists.e_ptr
    e_gpus = lists.e_gpus
    x = st.x
    gnt = st.gnt
    times = st.times
    act = st.act
    act_n = st.act_n
    nnz = np.zeros(E, np.int64)  # GPUs holding each expert
    for e in range(E):
        for j in range(e_ptr[e], e_ptr[e + 1]):
            nnz[e] += np.int64(x[e, e_gpus[j]] > 0)
    top = np.full(4, -1, np.int64)
    n_chain = 0
    while True:
        M = _amax(times)
        Gmax = _amax(gnt[_G])
        low = 0
        for h in range(g):
            low += np.int64(gnt[_G, h] <= Gmax - 2)
        # the four largest times give the largest time outside any three GPUs
        top[:] = -1
        for h in range(g):
            th = times[h]
            r = 4
            while r > 0 and (top[r - 1] < 0 or times[top[r - 1]] < th):
                r -= 1
            if r < 4:
                for k in range(3, r, -1):
                    top[k] = top[k - 1]
                top[r] = h
        bv1 = np.inf
        bv2 = np.inf
        kind = 0
        cs = cm = cd = ce = ce2 = _NO
        for two in range(2):
            if two == 1 and kind != 0:
                break
            for s in range(g):
                if gnt[_G, s] != Gmax:
                    continue
                o1 = _NO
                o2 = _NO
                for r in range(4):
                    if top[r] >= 0 and top[r] != s:
                        if o1 < 0:
                            o1 = top[r]
                        elif o2 < 0:
                            o2 = top[r]
                # the least the other GPUs can leave: all but s and the largest one or two
                rl = _rest_max(times, top, s, o1, o2 if two == 1 else _NO)
                for i in range(act_n[s]):
                    e = act[s, i]
                    q = x[e, s]
                    if two == 0 and low == 0 and nnz[e] < 2:
                        continue
                    ts = _time_with(cost, x, gnt, s, _NO, _ZERO, e, q)
                    lb = max(ts, rl)
                    if ts > M or lb > bv1 or (lb == bv1 and ts >= bv2):
                        continue
                    for j in range(e_ptr[e], e_ptr[e + 1]):
                        m = e_gpus[j]
                        if two == 0:
                            # 1-step: e's whole share from s to m
                            if m == s or (x[e, m] == 0 and gnt[_G, m] > Gmax - 2):
                                continue
                            v2 = max(ts, _time_with(cost, x, gnt, m, e, q, _NO, _ZERO))
                            v1 = max(v2, _rest_max(times, top, s, m, _NO))
                            if v1 <= M and (v1 < bv1 or (v1 == bv1 and v2 < bv2)):
                                bv1 = v1
                                bv2 = v2
                                kind = 1
                                cs = s
                                ce = e
                                cd = m
                            continue
                        # 2-step: e to m at Gmax - 1 not holding it, e2's share from m to d
                        if m == s or x[e, m] != 0 or gnt[_G, m] != Gmax - 1:
                            continue
                        for i2 in range(act_n[m]):
                            e2 = act[m, i2]
                            q2 = x[e2, m]
                            if e2 == e or (low == 0 and nnz[e2] < 2):
                                continue
                            tm = _time_with(cost, x, gnt, m, e, q, e2, q2)
                            lb2 = max(ts, tm)
                            lb = max(lb2, rl)
                            if tm > M or lb > bv1 or (lb == bv1 and lb2 >= bv2):
                                continue
                            for j2 in range(e_ptr[e2], e_ptr[e2 + 1]):
                                d = e_gpus[j2]
                                if d == m or d == s or (x[e2, d] == 0 and gnt[_G, d] > Gmax - 2):
                                    continue
                                v2 = max(lb2, _time_with(cost, x, gnt, d, e2, q2, _NO, _ZERO))
                                v1 = max(v2, _rest_max(times, top, s, m, d))
                                if v1 <= M and (v1 < bv1 or (v1 == bv1 and v2 < bv2)):
                                    bv1 = v1
                                    bv2 = v2
                                    kind = 2
                                    cs = s
                                    ce = e
                                    cm = m
                                    ce2 = e2
                                    cd = d
        if kind == 0:
            return n_chain
        if kind == 1:
            nnz[ce] += (1 if x[ce, cd] == 0 else 0) - 1
            _move(st, cost, ce, cs, cd, x[ce, cs])
        else:
            nnz[ce2] += (1 if x[ce2, cd] == 0 else 0) - 1
            _move(st, cost, ce, cs, cm, x[ce, cs])
            _move(st, cost, ce2, cm, cd, x[ce2, cm])
        n_chain += 1


def _stage_chains_reference(ref, x):
    """Plain-Python twin of :func:`_stage_chains`: returns ``(x, chains applied)``."""
    E, g, R = ref.E, ref.g, ref.R
    n_chain = 0
    while True:
        times = ref.times_of(x)
        M = max(times)
        Gs = [ref.gpu(h, x)[0] for h in range(g)]
        Gmax = max(Gs)

        def allowed(e, d, y=x, Gs=Gs, Gmax=Gmax):
            return y[e][d] > 0 or Gs[d] <= Gmax - 2

        def chain_value(moves, y=x):
            new = ref.times_of(_moved(y, moves))
            touched = {h for _, s_, d_, _ in moves for h in (s_, d_)}
            return max(new), max(new[h] for h in touched)

        best = None
        for s in range(g):
            if Gs[s] != Gmax:
                continue
            for e in range(E):
                if x[e][s] == 0:
                    continue
                for d in range(g):
                    if d == s or not R[e][d] or not allowed(e, d):
                        continue
                    v = chain_value([(e, s, d, x[e][s])])
                    if v[0] <= M and (best is None or v < best[0]):
                        best = (v, [(e, s, d, x[e][s])])
        if best is None:
            for s in range(g):
                if Gs[s] != Gmax:
                    continue
                for e in range(E):
                    if x[e][s] == 0:
                        continue
                    for m in range(g):
                        if m == s or not R[e][m] or x[e][m] != 0 or Gs[m] != Gmax - 1:
                            continue
                        for e2 in range(E):
                            if e2 == e or x[e2][m] == 0:
                                continue
                            for d in range(g):
                                if d in (m, s) or not R[e2][d] or not allowed(e2, d):
                                    continue
                                moves = [(e, s, m, x[e][s]), (e2, m, d, x[e2][m])]
                                v = chain_value(moves)
                                if v[0] <= M and (best is None or v < best[0]):
                                    best = (v, moves)
        if best is None:
            return x, n_chain
        x = _moved(x, best[1])
        n_chain += 1


# --------------------------------------------------------------------------------------
# Stage 3: bottleneck local search, one function per neighbourhood
# --------------------------------------------------------------------------------------
# Each neighbourhood searches from the sources (the GPUs at ``theta``, or GPU ``s_sel``
# alone when ``s_sel >= 0``), records its best compound move in ``wk.mv`` when it beats
# ``best_v`` (first found on ties) and returns the new ``best_v``.


@njit(**NJIT)
def _is_source(times, theta, s_sel, s):
    if s_sel >= 0:
        return s == s_sel
    return times[s] == theta


@njit(**NJIT)
def _nb_moves(st, lists, cost, theta, s_sel, best_v, mv):
    """Whole moves and partial migrations off the sources (to replicas below ``best_v``)."""
    x = st.x
    gnt = st.gnt
    for s in range(gnt.shape[1]):
        if not _is_source(st.times, theta, s_sel, s):
            continue
        for i in range(st.act_n[s]):
            e = st.act[s, i]
            xs = x[e, s]
            ts_full = _time_with(cost, x, gnt, s, _NO, _ZERO, e, xs)
            for j in range(lists.e_ptr[e], lists.e_ptr[e + 1]):
                d = lists.e_gpus[j]
                if d == s or st.times[d] >= best_v:
                    continue
                v = max(ts_full, _time_with(cost, x, gnt, d, e, xs, _NO, _ZERO))
                if v < best_v:
                    best_v = v
                    mv[4, 0] = 1
                    _record(mv, _ZERO, e, s, d, xs)
                best_v, q = _best_split(cost, x, gnt, s, d, e, xs, _NO, _ZERO, _NO, _ZERO, best_v)
                if q >= 0:
                    mv[4, 0] = 1
                    _record(mv, _ZERO, e, s, d, q)
    return best_v


def _nb_moves_reference(ref, y, times, sources, best_v, cap):
    """Plain-Python twin of :func:`_nb_moves`: ``(best value, moves or None)``; the split
    ``q*`` found by scanning ``q = 1, 2, ...`` instead of bisection."""
    best = None
    for s in sources:
        for e in range(ref.E):
            xs = y[e][s]
            if xs == 0:
                continue
            for d in range(ref.g):
                if d == s or not ref.R[e][d]:
                    continue
                v = ref.value(y, [(e, s, d, xs)], cap)
                if v < best_v:
                    best_v, best = v, [(e, s, d, xs)]
                if xs < 2:
                    continue

                def f(q, e=e, s=s, d=d):
                    new = ref.after(y, [(e, s, d, q)], cap)
                    return new[s], new[d]

                q_star = 1
                while q_star < xs and f(q_star)[1] < f(q_star)[0]:
                    q_star += 1
                for q in (q_star - 1, q_star):
                    if 1 <= q <= xs - 1:
                        v = max(f(q))
                        if v < best_v:
                            best_v, best = v, [(e, s, d, q)]
    return best_v, best


@njit(**NJIT_INLINE)
def _flow_value(x, gnt, cost, wi, s, v, q):
    """Largest new time over the GPUs of the search-tree path s -> v moving q tokens."""
    u = v
    val = _time_with(cost, x, gnt, v, wi[_PARE, v], q, _NO, _ZERO)
    while wi[_PARG, u] != s:
        p = wi[_PARG, u]
        val = max(val, _time_with(cost, x, gnt, p, wi[_PARE, p], q, wi[_PARE, u], q))
        u = p
    return max(val, _time_with(cost, x, gnt, s, _NO, _ZERO, wi[_PARE, u], q))


@njit(**NJIT_INLINE)
def _flow_end(st, cost, s, v, best_v, wk):
    """Evaluate the search-tree path s -> v; record it if it beats best_v."""
    x = st.x
    gnt = st.gnt
    wi = wk.wi
    cap = x[wi[_PARE, v], wi[_PARG, v]]
    u = v
    while wi[_PARG, u] != s:
        u = wi[_PARG, u]
        cap = min(cap, x[wi[_PARE, u], wi[_PARG, u]])
    e1 = wi[_PARE, u]  # the expert leaving s
    f = wi[_PARE, v]  # the expert arriving on v
    lo = 1
    hi = cap + 1
    while lo < hi:
        mid = (lo + hi) // 2
        a_mid = _time_with(cost, x, gnt, s, _NO, _ZERO, e1, mid)
        if _time_with(cost, x, gnt, v, f, mid, _NO, _ZERO) >= a_mid:
            hi = mid
        else:
            lo = mid + 1
    bq = _NO
    for q in (lo - 1, lo, cap):
        if q < 1 or q > cap:
            continue
        val = _flow_value(x, gnt, cost, wi, s, v, q)
        if val < best_v:
            best_v = val
            bq = q
    if bq >= 0:
        n = wi[_DEPTH, v]
        u = v
        for k in range(n - 1, -1, -1):
            _record(wk.mv, k, wi[_PARE, u], wi[_PARG, u], u, bq)
            u = wi[_PARG, u]
        wk.mv[4, 0] = n
    return best_v


@njit(**NJIT)
def _nb_flows(st, lists, cost, theta, s_sel, best_v, wk):
    """Token paths: ``q`` tokens leave a source ``s`` and travel along a path of GPUs, each
    intermediate forwarding ``q`` tokens of an expert it holds; the last GPU keeps them.

    Breadth-first search from ``s`` over arcs ``w -> v`` (an expert ``f`` with tokens on
    ``w`` and a replica on ``v``; ``w`` in visiting order, ``f`` and ``v`` increasing). A
    GPU is reached (once, by the first arc found) only if its time is below ``best_v`` and,
    when the arc would activate ``f`` on it, ``t(G + 1, N, T + 1) < best_v``. Each GPU
    reached at depth >= 2 ends a candidate path; ``q`` is the bisection split between the
    source and the end (capped by the smallest share along the path), ``q* - 1``, ``q*``,
    then the cap; the value is the largest new time over the path's GPUs. The path's
    intermediates keep their token counts, so this is the multi-hop partial migration
    through split experts that single moves cannot make.
    """
    x = st.x
    gnt = st.gnt
    wi = wk.wi
    for s in range(gnt.shape[1]):
        if not _is_source(st.times, theta, s_sel, s):
            continue
        wi[_STAMP, 0] += 1
        stamp = wi[_STAMP, 0]
        wi[_MARK, s] = stamp
        wi[_PARG, s] = -1
        wi[_DEPTH, s] = 0
        wi[_QUEUE, 0] = s
        head = 0
        tail = 1
        while head < tail:
            w = wi[_QUEUE, head]
            head += 1
            for i in range(st.act_n[w]):
                f = st.act[w, i]
                for j in range(lists.e_ptr[f], lists.e_ptr[f + 1]):
                    v = lists.e_gpus[j]
                    if wi[_MARK, v] == stamp or st.times[v] >= best_v:
                        continue
                    if x[f, v] == 0 and (
                        _t(cost, gnt[_G, v] + 1, gnt[_N, v], gnt[_T, v] + 1) >= best_v
                    ):
                        continue
                    wi[_MARK, v] = stamp
                    wi[_PARG, v] = w
                    wi[_PARE, v] = f
                    wi[_DEPTH, v] = wi[_DEPTH, w] + 1
                    wi[_QUEUE, tail] = v
                    tail += 1
                    if wi[_DEPTH, v] >= 2:
                        best_v = _flow_end(st, cost, s, v, best_v, wk)
    return best_v


def _nb_flows_reference(ref, y, times, sources, best_v, cap):
    """Plain-Python twin of :func:`_nb_flows` (with :func:`_flow_value` and
    :func:`_flow_end`): ``(best value, moves or None)``."""
    E, g, R = ref.E, ref.g, ref.R
    best = None
    for s in sources:
        par = {s: None}
        depth = {s: 0}
        queue = [s]
        for w in queue:  # breadth first; the list grows while iterating
            for f in range(E):
                if y[f][w] == 0:
                    continue
                for v in range(g):
                    if not R[f][v] or v in par or times[v] >= best_v:
                        continue
                    Gv, Nv, Tv = ref.gpu(v, y)
                    if y[f][v] == 0 and ref.time_of(Gv + 1, Nv, Tv + 1, cap) >= best_v:
                        continue
                    par[v] = (w, f)
                    depth[v] = depth[w] + 1
                    queue.append(v)
                    if depth[v] < 2:
                        continue
                    legs = []
                    u = v
                    while par[u] is not None:
                        p, fe = par[u]
                        legs.append((fe, p, u))
                        u = p
                    legs.reverse()
                    cap_q = min(y[fe][p] for fe, p, _ in legs)
                    e1, fl = legs[0][0], legs[-1][0]

                    def ends(q, e1=e1, fl=fl, v=v, s=s):
                        t_v = ref.time_after(y, v, [(fl, q)], cap)
                        return t_v, ref.time_after(y, s, [(e1, -q)], cap)

                    q_star = 1
                    while q_star <= cap_q and ends(q_star)[0] < ends(q_star)[1]:
                        q_star += 1
                    for q in (q_star - 1, q_star, cap_q):
                        if 1 <= q <= cap_q:
                            mv = [(fe, p, u, q) for fe, p, u in legs]
                            val = ref.value(y, mv, cap)
                            if val < best_v:
                                best_v, best = val, mv
    return best_v, best


@njit(**NJIT)
def _nb_swaps(st, lists, cost, theta, s_sel, best_v, mv):
    """Swaps: q tokens of e from a source s to d (whole or by the split bisection) while the
    whole share of another expert f goes from d to s.

    Pruning only (lower bounds that cannot beat best_v): ``t >= a + b*G`` since ``T >= G``,
    and ``t >= t(0, N, 0)`` for the token pieces; d's new time is at least
    ``t(G_d', N_d + 1 - (largest share on d), G_d')``.
    """
    x = st.x
    gnt = st.gnt
    act = st.act
    act_n = st.act_n
    g = gnt.shape[1]
    maxq = np.zeros(g, np.int64)
    for h in range(g):
        for i in range(act_n[h]):
            maxq[h] = max(maxq[h], x[act[h, i], h])
    for s in range(g):
        Gs = gnt[_G, s]
        Ns = gnt[_N, s]
        if not _is_source(st.times, theta, s_sel, s) or _t(cost, Gs - 1, _ZERO, Gs - 1) >= best_v:
            continue
        for i in range(act_n[s]):
            e = act[s, i]
            xs = x[e, s]
            # an f not yet on s leaves s with G_s (whole e) or G_s + 1 activations
            only_on_s = _t(cost, Gs, Ns - xs + 1, Gs) >= best_v and (
                xs < 2 or _t(cost, Gs + 1, Ns - xs + 2, Gs + 1) >= best_v
            )
            for j in range(lists.e_ptr[e], lists.e_ptr[e + 1]):
                d = lists.e_gpus[j]
                if d == s:
                    continue
                gd = gnt[_G, d] - 1 + (1 if x[e, d] == 0 else 0)
                if _t(cost, gd, gnt[_N, d] + 1 - maxq[d], gd) >= best_v:
                    continue
                for i2 in range(act_n[d]):
                    f = act[d, i2]
                    yd = x[f, d]
                    if f == e or not lists.replicas[f, s] or (only_on_s and x[f, s] == 0):
                        continue
                    if (
                        _t(cost, _ZERO, Ns - xs + yd, _ZERO) >= best_v
                        or _t(cost, _ZERO, gnt[_N, d] + 1 - yd, _ZERO) >= best_v
                    ):
                        continue
                    v = max(
                        _time_with(cost, x, gnt, s, f, yd, e, xs),
                        _time_with(cost, x, gnt, d, e, xs, f, yd),
                    )
                    if v < best_v:
                        best_v = v
                        mv[4, 0] = 2
                        _record(mv, _ZERO, f, d, s, yd)
                        _record(mv, _ONE, e, s, d, xs)
                    best_v, q = _best_split(cost, x, gnt, s, d, e, xs, f, yd, f, yd, best_v)
                    if q >= 0:
                        mv[4, 0] = 2
                        _record(mv, _ZERO, f, d, s, yd)
                        _record(mv, _ONE, e, s, d, q)
    return best_v


def _nb_swaps_reference(ref, y, times, sources, best_v, cap):
    """Plain-Python twin of :func:`_nb_swaps`: ``(best value, moves or None)``."""
    best = None
    for s in sources:
        for e in range(ref.E):
            xs = y[e][s]
            if xs == 0:
                continue
            for d in range(ref.g):
                if d == s or not ref.R[e][d]:
                    continue
                for f2 in range(ref.E):
                    if f2 == e or y[f2][d] == 0 or not ref.R[f2][s]:
                        continue
                    back = (f2, d, s, y[f2][d])

                    def fs(q, e=e, s=s, d=d, back=back):
                        new = ref.after(y, [back, (e, s, d, q)], cap)
                        return new[s], new[d]

                    v = max(fs(xs))
                    if v < best_v:
                        best_v, best = v, [back, (e, s, d, xs)]
                    if xs < 2:
                        continue
                    q_star = 1
                    while q_star < xs and fs(q_star)[1] < fs(q_star)[0]:
                        q_star += 1
                    for q in (q_star - 1, q_star):
                        if 1 <= q <= xs - 1:
                            v = max(fs(q))
                            if v < best_v:
                                best_v, best = v, [back, (e, s, d, q)]
    return best_v, best


@njit(**NJIT)
def _nb_ejections(st, lists, cost, theta, s_sel, best_v, tile_chains, mv):
    """Ejection chains: q tokens of e from a source s to m, then another expert e2's whole
    share from m to d (d not s); all three new times below best_v. The first leg is e's
    whole share, or (``tile_chains`` and ``b2 > 0``) a tile-boundary partial split: the
    part of e's share above its last full tile (``x % tile``), then the part that fills m's
    share of e to a tile boundary.

    Pruning only (exact, t is nondecreasing in G, N, T and T >= G): m's new time is at
    least t(G_m', N_m + q - (largest share on m), G_m'); a destination d not holding e2
    gets at least t(G_d + 1, N_d + 1, T_d + 1) (tadd); with no GPU below best_v under
    that, e2 needs another GPU holding it (nnz).
    """
    x = st.x
    gnt = st.gnt
    act = st.act
    act_n = st.act_n
    E, g = x.shape
    tile = cost.tile
    maxq = np.zeros(g, np.int64)
    tadd = np.empty(g)
    nnz = np.zeros(E, np.int64)
    for h in range(g):
        for i in range(act_n[h]):
            maxq[h] = max(maxq[h], x[act[h, i], h])
            nnz[act[h, i]] += 1
        tadd[h] = _t(cost, gnt[_G, h] + 1, gnt[_N, h] + 1, gnt[_T, h] + 1)
    partial = tile_chains and cost.b2 > 0
    for s in range(g):
        if not _is_source(st.times, theta, s_sel, s):
            continue
        for i in range(act_n[s]):
            e = act[s, i]
            xs = x[e, s]
            for j in range(lists.e_ptr[e], lists.e_ptr[e + 1]):
                m = lists.e_gpus[j]
                if m == s:
                    continue
                xm = x[e, m]
                Gm = gnt[_G, m] + (1 if xm == 0 else 0)
                rec = False  # a GPU other than s, m that could take a new expert
                for h in range(g):
                    if h != s and h != m and tadd[h] < best_v:
                        rec = True
                        break
                for leg in range(3):
                    q = xs
                    if leg == 1:
                        q = xs % tile
                    elif leg == 2:
                        q = (tile - xm % tile) % tile if xm > 0 else 0
                        if q == xs % tile:
                            q = 0
                    if leg > 0 and (not partial or q <= 0 or q >= xs):
                        continue
                    ts = _time_with(cost, x, gnt, s, _NO, _ZERO, e, q)
                    if ts >= best_v or _t(cost, Gm - 1, gnt[_N, m] + q - maxq[m], Gm - 1) >= best_v:
                        continue
                    for i2 in range(act_n[m]):
                        e2 = act[m, i2]
                        q2 = x[e2, m]
                        if e2 == e or (not rec and nnz[e2] < 2):
                            continue
                        tm = _time_with(cost, x, gnt, m, e, q, e2, q2)
                        if tm >= best_v:
                            continue
                        for j2 in range(lists.e_ptr[e2], lists.e_ptr[e2 + 1]):
                            d = lists.e_gpus[j2]
                            if d == m or d == s or st.times[d] >= best_v:
                                continue
                            if x[e2, d] == 0 and tadd[d] >= best_v:
                                continue
                            v = max(ts, max(tm, _time_with(cost, x, gnt, d, e2, q2, _NO, _ZERO)))
                            if v < best_v:
                                best_v = v
                                mv[4, 0] = 2
                                _record(mv, _ZERO, e, s, m, q)
                                _record(mv, _ONE, e2, m, d, q2)
    return best_v


def _nb_ejections_reference(ref, y, times, sources, best_v, cap):
    """Plain-Python twin of :func:`_nb_ejections`: ``(best value, moves or None)``."""
    E, g, R, tile = ref.E, ref.g, ref.R, ref.tile
    best = None
    partial = ref.opts.tile_chains and ref.b2 > 0
    for s in sources:
        for e in range(E):
            xs = y[e][s]
            if xs == 0:
                continue
            for m in range(g):
                if m == s or not R[e][m]:
                    continue
                legs = [xs]
                if partial:
                    trim = xs % tile
                    fill = (tile - y[e][m] % tile) % tile if y[e][m] > 0 else 0
                    legs += [q for q in (trim,) if 0 < q < xs]
                    legs += [q for q in (fill,) if 0 < q < xs and q != trim]
                for q in legs:
                    for e2 in range(E):
                        if e2 == e or y[e2][m] == 0:
                            continue
                        for d in range(g):
                            if d in (m, s) or not R[e2][d]:
                                continue
                            moves = [(e, s, m, q), (e2, m, d, y[e2][m])]
                            v = ref.value(y, moves, cap)
                            if v < best_v:
                                best_v, best = v, moves
    return best_v, best


@njit(**NJIT)
def _heap_less(lab, i, j):
    return lab[i] < lab[j] or (lab[i] == lab[j] and i < j)


@njit(**NJIT)
def _heap_up(wi, lab, k, n):
    """Insert node k (or sift it up after its label decreased); n: heap size; returns n."""
    heap = wi[_HEAP]
    hpos = wi[_HPOS]
    p = hpos[k]
    if p < 0:
        p = n
        n += 1
    while p > 0:
        q = (p - 1) // 2
        if not _heap_less(lab, k, heap[q]):
            break
        heap[p] = heap[q]
        hpos[heap[p]] = p
        p = q
    heap[p] = k
    hpos[k] = p
    return n


@njit(**NJIT)
def _heap_pop(wi, lab, n):
    """Remove and return the least (label, node) of a non-empty heap of size n."""
    heap = wi[_HEAP]
    hpos = wi[_HPOS]
    top = heap[0]
    hpos[top] = -1
    n -= 1
    if n > 0:
        k = heap[n]
        p = 0
        while True:
            c = 2 * p + 1
            if c >= n:
                break
            if c + 1 < n and _heap_less(lab, heap[c + 1], heap[c]):
                c += 1
            if not _heap_less(lab, heap[c], k):
                break
            heap[p] = heap[c]
            hpos[heap[p]] = p
            p = c
        heap[p] = k
        hpos[k] = p
    return top


@njit(**NJIT)
def _nb_exchanges(st, lists, cost, theta, s_sel, best_v, wk):
    """Path and cyclic exchanges of whole shares, by shortest-path search on an improvement
    graph (the very-large-scale neighbourhood of min-max partitioning).

    Nodes are the items (an expert's share on a GPU; GPUs increasing, then experts). An arc
    ``i -> j`` (``i`` on GPU ``h``, ``j`` on GPU ``k != h``, another expert, ``k`` a
    replica of ``i``'s expert) says: ``i`` moves to ``k`` and ``j`` leaves ``k``; its
    weight is ``k``'s new time. A path from an item of the source ``s`` ends either at a GPU
    that only gains (a path exchange, an ejection chain of any length) or back at ``s`` (a
    cyclic exchange: every GPU gains one share and loses one, so activation counts stay,
    which is the move left under an activation cap). Labels are the largest new time along
    the path (``s``'s time without its item included). One Dijkstra runs per item leaving
    ``s`` (items of ``s`` by increasing expert): a cycle's closing arc is ``s``'s time with
    the last item in and the first one out, so the first item is part of the label's
    meaning, and a single search from all of them at once keeps, on tied labels, a path
    whose closure fails while another one's succeeds. Each search pops (label, node)
    increasing, keeps one label per item and the GPUs of each path distinct (checked on
    the label's path), and prunes arcs whose weight reaches the best exchange found over
    all searches, which it keeps (first found on ties). Terminals are tried per popped item
    over its replica GPUs increasing: closing back at ``s``, else ending there, then the
    arcs out of it.
    """
    x = st.x
    gnt = st.gnt
    act = st.act
    act_n = st.act_n
    wi = wk.wi
    lab = wk.wf[_LAB]
    mid = wk.wf[_MID]
    g = gnt.shape[1]
    n_nodes = 0
    for h in range(g):
        wi[_OFF, h] = n_nodes
        for i in range(act_n[h]):
            wi[_NODEH, n_nodes] = h
            wi[_NODEI, n_nodes] = i
            n_nodes += 1
    for s in range(g):
        if not _is_source(st.times, theta, s_sel, s):
            continue
        for i1 in range(act_n[s]):
            for k in range(n_nodes):
                lab[k] = np.inf
                wi[_DONE, k] = 0
                wi[_HPOS, k] = -1
            n_heap = _ZERO
            e1 = act[s, i1]
            v = _time_with(cost, x, gnt, s, _NO, _ZERO, e1, x[e1, s])
            if v >= best_v:
                continue
            k = wi[_OFF, s] + i1
            lab[k] = v
            mid[k] = -np.inf
            wi[_PRED, k] = -1
            n_heap = _heap_up(wi, lab, k, n_heap)
            best_k = _NO
            best_d = _NO
            while n_heap > 0:
                k = _heap_pop(wi, lab, n_heap)
                n_heap -= 1
                L = lab[k]
                if L >= best_v:
                    break
                wi[_DONE, k] = 1
                h = wi[_NODEH, k]
                e = act[h, wi[_NODEI, k]]
                q = x[e, h]
                wi[_STAMP, 0] += 1
                stamp = wi[_STAMP, 0]
                j = k
                while j >= 0:
                    wi[_MARK, wi[_NODEH, j]] = stamp
                    j = wi[_PRED, j]
                for jj in range(lists.e_ptr[e], lists.e_ptr[e + 1]):
                    d = lists.e_gpus[jj]
                    if d == h:
                        continue
                    if d == s:
                        if wi[_PRED, k] >= 0 and e != e1:
                            v = max(mid[k], _time_with(cost, x, gnt, s, e, q, e1, x[e1, s]))
                            if v < best_v:
                                best_v = v
                                best_k = k
                                best_d = d
                        continue
                    if wi[_MARK, d] == stamp:
                        continue
                    v = max(L, _time_with(cost, x, gnt, d, e, q, _NO, _ZERO))
                    if v < best_v:
                        best_v = v
                        best_k = k
                        best_d = d
                    for i2 in range(act_n[d]):
                        f = act[d, i2]
                        k2 = wi[_OFF, d] + i2
                        if f == e or wi[_DONE, k2] != 0:
                            continue
                        w = _time_with(cost, x, gnt, d, e, q, f, x[f, d])
                        if w >= best_v:
                            continue
                        nl = max(L, w)
                        if nl < lab[k2]:
                            lab[k2] = nl
                            mid[k2] = max(mid[k], w)
                            wi[_PRED, k2] = k
                            n_heap = _heap_up(wi, lab, k2, n_heap)
            if best_k >= 0:
                n = 0
                j = best_k
                while j >= 0:
                    n += 1
                    j = wi[_PRED, j]
                j = best_k
                dst = best_d
                for r in range(n - 1, -1, -1):
                    h = wi[_NODEH, j]
                    e = act[h, wi[_NODEI, j]]
                    _record(wk.mv, r, e, h, dst, x[e, h])
                    dst = h
                    j = wi[_PRED, j]
                wk.mv[4, 0] = n
    return best_v


def _nb_exchanges_reference(ref, y, times, sources, best_v, cap):
    """Plain-Python twin of :func:`_nb_exchanges`: ``(best value, moves or None)``; a lazy
    ``heapq`` instead of the indexed heap."""
    E, g, R = ref.E, ref.g, ref.R
    best = None
    items = [(h, e) for h in range(g) for e in range(E) if y[e][h] > 0]
    index = {it: k for k, it in enumerate(items)}
    for s in sources:
        for e1 in range(E):
            if y[e1][s] == 0:
                continue
            # one search per share leaving s: a cycle's closing arc depends on it
            v = ref.time_after(y, s, [(e1, -y[e1][s])], cap)
            if v >= best_v:
                continue
            k0 = index[(s, e1)]
            lab, mid, pred = {k0: v}, {k0: -math.inf}, {k0: -1}
            done = set()
            heap = [(v, k0)]
            found = None
            while heap:
                L, k = heapq.heappop(heap)
                if k in done or L != lab[k]:
                    continue
                if L >= best_v:
                    break
                done.add(k)
                h, e = items[k]
                q = y[e][h]
                on = set()
                j = k
                while j >= 0:
                    on.add(items[j][0])
                    j = pred[j]
                for d in range(g):
                    if not R[e][d] or d == h:
                        continue
                    if d == s:
                        if pred[k] >= 0 and e != e1:
                            v = max(mid[k], ref.time_after(y, s, [(e, q), (e1, -y[e1][s])], cap))
                            if v < best_v:
                                best_v, found = v, (k, d)
                        continue
                    if d in on:
                        continue
                    v = max(L, ref.time_after(y, d, [(e, q)], cap))
                    if v < best_v:
                        best_v, found = v, (k, d)
                    for f in range(E):
                        if f == e or y[f][d] == 0:
                            continue
                        k2 = index[(d, f)]
                        if k2 in done:
                            continue
                        w = ref.time_after(y, d, [(e, q), (f, -y[f][d])], cap)
                        if w >= best_v:
                            continue
                        nl = max(L, w)
                        if nl < lab.get(k2, math.inf):
                            lab[k2], mid[k2], pred[k2] = nl, max(mid[k], w), k
                            heapq.heappush(heap, (nl, k2))
            if found is not None:
                k, dst = found
                chain = []
                while k >= 0:
                    chain.append(k)
                    k = pred[k]
                chain.reverse()
                gpus = [items[j][0] for j in chain] + [dst]
                best = [(items[j][1], gpus[r], gpus[r + 1], y[items[j][1]][gpus[r]])
                        for r, j in enumerate(chain)]  # fmt: skip
    return best_v, best


@njit(**NJIT)
def _stage_local_search(st, lists, cost, opts, stop_at, wk, counters):
    """Stage 3 on the state, in place: bottleneck neighbourhoods, then leximax moves.

    Each iteration applies, over the GPUs at the makespan ``M`` (all new times below
    ``M``), the best move or partial migration; without one, the best of the token paths,
    swaps, ejection chains and exchanges (first found on ties, in this order); without any,
    on the first GPU below ``M`` by decreasing time (ties: lower index) that has one, its
    best move, else its best token path or exchange, taking all its new times below its
    own time (a strict decrease of the sorted vector of times, so the search cannot
    cycle). A *probe* is the neighbourhoods' evaluation from one GPU: the step at ``M``
    makes one per GPU at ``M``, the leximax step one per GPU it tries. It stops at ``stop_at`` (a
    lower bound), at ``opts.max_iter`` moves, once it has made ``opts.max_probes`` probes
    (the leximax step tries no further GPU then), or without a move: a work bound counted
    in probes, deterministic, which also bounds the searches that apply few moves but try
    every GPU before each. ``counters``: moves, of which token paths, of which exchanges,
    and probes (incremented in place).
    """
    g = st.times.shape[0]
    times = st.times
    mv = wk.mv
    g_order = np.empty(g, np.int64)
    n_it = 0
    probes = 0
    while n_it < opts.max_iter and probes < opts.max_probes:
        M = _amax(times)
        if M <= stop_at:
            break
        for h in range(g):
            if times[h] == M:
                probes += 1
        mv[4, 0] = 0
        kind = -1
        best_v = _nb_moves(st, lists, cost, M, _NO, M, mv)
        if mv[4, 0] > 0:
            kind = 0
        else:
            # the best of the other neighbourhoods at M (first found on ties, in this order)
            for nb in range(4):
                v = best_v
                if nb == 0 and opts.flows:
                    v = _nb_flows(st, lists, cost, M, _NO, best_v, wk)
                elif nb == 1:
                    v = _nb_swaps(st, lists, cost, M, _NO, best_v, mv)
                elif nb == 2:
                    v = _nb_ejections(st, lists, cost, M, _NO, best_v, opts.tile_chains, mv)
                elif nb == 3 and opts.exchanges:
                    v = _nb_exchanges(st, lists, cost, M, _NO, best_v, wk)
                if v < best_v:
                    best_v = v
                    kind = 1 if nb == 0 else (2 if nb == 3 else 0)
        if kind < 0:
            # leximax: the first GPU below M with a move, else its best token path or exchange
            _gpu_order(times, g_order)
            for r in range(g):
                s = g_order[r]
                th = times[s]
                if th == M:
                    continue
                if probes >= opts.max_probes:
                    break
                probes += 1
                v = _nb_moves(st, lists, cost, th, s, th, mv)
                if mv[4, 0] > 0:
                    kind = 0
                    break
                if opts.flows:
                    v = _nb_flows(st, lists, cost, th, s, th, wk)
                    if v < th:
                        kind = 1
                if opts.exchanges and _nb_exchanges(st, lists, cost, th, s, v, wk) < v:
                    kind = 2
                if kind >= 0:
                    break
        if mv[4, 0] == 0:
            break
        for k in range(mv[4, 0]):
            _move(st, cost, mv[0, k], mv[1, k], mv[2, k], mv[3, k])
        n_it += 1
        counters[0] += 1
        if kind > 0:
            counters[kind] += 1
    counters[3] += probes
    return n_it


def _stage_local_search_reference(ref, x, stop_at, cap=_NO_CAP):
    """Plain-Python twin of :func:`_stage_local_search` on ``x`` under the caps ``(activation
    cap, floor cap)``: returns ``(x, [moves, of which token paths, of which exchanges,
    probes])``."""
    opts = ref.opts
    n_ls = [0, 0, 0, 0]
    while n_ls[0] < opts.max_iter and n_ls[3] < opts.max_probes:
        times = ref.times_of(x, cap)
        M = max(times)
        if M <= stop_at:
            break
        at_m = [s for s in range(ref.g) if times[s] == M]
        n_ls[3] += len(at_m)
        best_v, best = _nb_moves_reference(ref, x, times, at_m, M, cap)
        kind = 0
        if best is None:
            # the best of the other neighbourhoods (first found on ties, in this order)
            others = (
                (1, opts.flows, _nb_flows_reference),
                (0, True, _nb_swaps_reference),
                (0, True, _nb_ejections_reference),
                (2, opts.exchanges, _nb_exchanges_reference),
            )
            for k, on, nb in others:
                if on:
                    v, mv = nb(ref, x, times, at_m, best_v, cap)
                    if mv is not None:
                        best_v, best, kind = v, mv, k
        if best is None:
            # leximax: the first GPU below M with a move, else a token path or exchange
            for s in sorted(range(ref.g), key=lambda h: (-times[h], h)):
                th = times[s]
                if th == M:
                    continue
                if n_ls[3] >= opts.max_probes:
                    break
                n_ls[3] += 1
                kind = 0
                v, best = _nb_moves_reference(ref, x, times, [s], th, cap)
                if best is None:
                    for k, on, nb in (
                        (1, opts.flows, _nb_flows_reference),
                        (2, opts.exchanges, _nb_exchanges_reference),
                    ):
                        if on:
                            v2, mv = nb(ref, x, times, [s], v, cap)
                            if mv is not None:
                                v, best, kind = v2, mv, k
                if best is not None:
                    break
        if best is None:
            break
        x = _moved(x, best)
        n_ls[0] += 1
        if kind > 0:
            n_ls[kind] += 1
    return x, n_ls


# --------------------------------------------------------------------------------------
# Stage 4: ensemble
# --------------------------------------------------------------------------------------


@njit(**NJIT_INLINE)
def _stage_ensemble(counts, order, lists, cost, lp_shares, sm_assign, sm, opts, stop_at, hst, wk,
                    info, stages):  # fmt: skip
    """Candidates, in this order: the token-LP dispatch, A3 round robin (rank r -> GPU
    r mod g) when every live expert is replicated on every GPU, the optimal semi-matching
    (whole experts) polished first under the activation cap SM, and the same polished
    first under the cap SM + 1. With stage 3 on and room below ``M(A_H)`` (``stop_at <
    M(A_H)``), every candidate is polished by the stage-3 search (uncapped last) and the
    first strictly best one below the current output replaces it; otherwise a raw
    candidate replaces ``A_H`` iff it is below ``(1 - tau) M(A_H)`` (Proposition 1).
    Returns ``(shares, makespan, choice)``."""
    E, g = lists.replicas.shape
    m_h = _amax(hst.times)
    out = hst.x
    m_out = m_h
    choice = 0
    full = True
    for e in range(E):
        if counts[e] > 0 and lists.e_ptr[e + 1] - lists.e_ptr[e] != g:
            full = False
            break
    polish = opts.local_search and stop_at < m_h
    best_c = np.inf
    counters = np.zeros(4, np.int64)
    gnt = np.zeros((3, g), np.int64)
    for cand in range(1, 5):
        if (cand == 2 and not full) or (cand == 4 and not polish):
            continue
        # score the raw candidate from its live entries
        gnt[:, :] = 0
        r = 0
        for i in range(E):
            e = order[i]
            if counts[e] == 0:
                break
            if cand == 1:
                for j in range(lists.e_ptr[e], lists.e_ptr[e + 1]):
                    h = lists.e_gpus[j]
                    v = lp_shares[e, h]
                    if v > 0:
                        gnt[_G, h] += 1
                        gnt[_N, h] += v
                        gnt[_T, h] += _tiles(v, cost.tile)
            else:
                h = r % g if cand == 2 else sm_assign[e]
                gnt[_G, h] += 1
                gnt[_N, h] += counts[e]
                gnt[_T, h] += _tiles(counts[e], cost.tile)
                r += 1
        m_c = -np.inf
        for h in range(g):
            m_c = max(m_c, _t(cost, gnt[_G, h], gnt[_N, h], gnt[_T, h]))
        if cand < 4:
            info[3 + cand] = m_c
        take = not polish and cand < 4 and m_c < best_c and m_c < (1.0 - opts.tau) * m_h
        if polish or take:
            y = np.zeros((E, g), np.int64)
            if cand == 1:
                for e in range(E):  # y[:, :] = lp_shares
                    for h in range(g):
                        y[e, h] = lp_shares[e, h]
            else:
                r = 0
                for i in range(E):
                    e = order[i]
                    if counts[e] == 0:
                        break
                    y[e, r % g if cand == 2 else sm_assign[e]] = counts[e]
                    r += 1
            if polish:
                if cand >= 3:
                    capped = KernelCost(cost.a, cost.b, cost.b2, cost.c, cost.beta, cost.c2,
                                        cost.gamma, cost.tile, float(sm + cand - 3),
                                        cost.floor_cap)  # fmt: skip
                    call_compiled(stages[_SEARCH], _stage_local_search,
                                  (_state_of(y, lists, capped), lists, capped, opts, stop_at, wk,
                                   counters))  # fmt: skip
                cst = _state_of(y, lists, cost)
                call_compiled(stages[_SEARCH], _stage_local_search,
                              (cst, lists, cost, opts, stop_at, wk, counters))  # fmt: skip
                m_c = _amax(cst.times)
                take = m_c < m_out
            if take:
                choice = cand
                out = y
                m_out = m_c
        if m_c < best_c:
            best_c = m_c
            info[7] = m_c
    return out, m_out, choice


def _stage_ensemble_reference(ref, x_h, lp, sm_assign, sm, stop_at, info):
    """Plain-Python twin of :func:`_stage_ensemble`: the candidates' makespans into
    ``info``; returns ``(shares, makespan, choice)``."""
    E, g, counts = ref.E, ref.g, ref.counts
    m_h = max(ref.times_of(x_h))
    out, m_out, choice = x_h, m_h, 0
    live = [e for e in ref.order if counts[e] > 0]
    a3 = [[0] * g for _ in range(E)]
    for r, e in enumerate(live):
        a3[e][r % g] = counts[e]
    smx = [[0] * g for _ in range(E)]
    for e in live:
        smx[e][int(sm_assign[e])] = counts[e]
    polish = ref.opts.local_search and stop_at < m_h
    cands = [(1, lp, _NO_CAP), (2, a3, _NO_CAP), (3, smx, (sm, math.inf)),
             (4, smx, (sm + 1, math.inf))]  # fmt: skip
    if not all(all(ref.R[e]) for e in live):
        cands.pop(1)
    if not polish:
        cands.pop()
    best_c = math.inf
    for cand, y, cap in cands:
        m_c = max(ref.times_of(y))
        if cand < 4:
            info[3 + cand] = m_c
        if polish:
            if cap != _NO_CAP:
                y, _ = _stage_local_search_reference(ref, y, stop_at, cap)
            y, _ = _stage_local_search_reference(ref, y, stop_at)
            m_c = max(ref.times_of(y))
            if m_c < m_out:
                out, m_out, choice = y, m_c, cand
        elif m_c < best_c and m_c < (1.0 - ref.opts.tau) * m_h:
            out, m_out, choice = y, m_c, cand
        if m_c < best_c:
            best_c = info[7] = m_c
    return out, m_out, choice


# --------------------------------------------------------------------------------------
# Stage 4b: ruin-and-recreate restarts
# --------------------------------------------------------------------------------------


@njit(**NJIT)
def _floor_levels(cost, m, g_max, j_max, out):
    """The (up to) ``out.size`` largest distinct floors ``a + b*G + b2*j < m`` (``1 <= G
    <= g_max``, ``0 <= j <= j_max``), decreasing, into ``out``; returns how many. Computed
    with the expression of :func:`_t` (``j = T - G``), so a GPU exactly at a level is
    within that floor cap."""
    L = out.shape[0]
    k = 0
    for G in range(1, g_max + 1):
        if cost.a + cost.b * G >= m:
            break
        for j in range(j_max + 1):
            v = cost.a + cost.b * G + cost.b2 * j
            if v >= m:
                break
            dup = False
            for i in range(k):
                dup = dup or out[i] == v
            if not dup and (k < L or v > out[L - 1]):
                i = k if k < L else L - 1
                out[i] = v
                k = min(k + 1, L)
                while i > 0 and out[i - 1] < out[i]:  # keep out[:k] decreasing
                    out[i - 1], out[i] = out[i], out[i - 1]
                    i -= 1
            if cost.b2 == 0:
                break
        if cost.b == 0:
            break
    return k


def _floor_levels_reference(ref, m):
    """Plain-Python twin of :func:`_floor_levels`: the ``RESTART_LEVELS`` largest distinct
    floors ``a + b*G + b2*j`` below ``m``, decreasing."""
    a, b, b2 = ref.a, ref.b, ref.b2
    g_max = sum(sum(row) for row in ref.R)
    j_max = g_max + sum(ref.tiles(ref.counts[e]) * sum(ref.R[e]) for e in range(ref.E))
    vals = set()
    for G in range(1, g_max + 1):
        if a + b * G >= m:
            break
        for j in range(j_max + 1):
            v = a + b * G + b2 * j
            if v >= m:
                break
            vals.add(v)
            if b2 == 0:
                break
        if b == 0:
            break
    return sorted(vals, reverse=True)[:RESTART_LEVELS]


@njit(**NJIT)
def _recreate(x, ruin, counts, order, lists, cost):
    """A copy of ``x`` with the experts ``ruin`` removed and put back whole, by descending
    tokens (ties: lower index), each on the replica of lowest (marginal cost, new time,
    GPU index): stage 1's rule (:func:`_put_whole`) on the rest of the dispatch."""
    E, g = x.shape
    y = x.copy()
    gnt = np.zeros((3, g), np.int64)
    for e in range(E):
        for j in range(lists.e_ptr[e], lists.e_ptr[e + 1]):
            h = lists.e_gpus[j]
            if ruin[e]:
                y[e, h] = 0
            v = y[e, h]
            if v > 0:
                gnt[_G, h] += 1
                gnt[_N, h] += v
                gnt[_T, h] += _tiles(v, cost.tile)
    _put_whole(y, gnt, ruin, counts, order, lists, cost, True)
    return y


def _recreate_reference(ref, y, ruined):
    """Plain-Python twin of :func:`_recreate`: ``y`` without the experts ``ruined``, put back
    whole by stage 1's rule."""
    z = [[0 if e in ruined else y[e][h] for h in range(ref.g)] for e in range(ref.E)]
    _put_whole_reference(ref, z, ruined, True)
    return z


@njit(**NJIT_INLINE)
def _bound_params(cost):
    """The cost array of B8 and B9 (``CostModel.as_array()``'s first eight fields)."""
    return np.array([cost.a, cost.b, cost.b2, cost.c, cost.beta, cost.c2, cost.gamma,
                     float(cost.tile)])  # fmt: skip


@njit(**NJIT_INLINE)
def _proves(counts, replicas, params, m):
    """Whether B8, or else B9, tried once at ``T = m`` proves no dispatch below ``m``
    (``min(T, LB(T)) >= T``): ``m`` is then the optimum."""
    if forced_kernel(counts, replicas, params, m) >= m:
        return True
    return counting_kernel(counts, replicas, params, m) >= m


def _proves_reference(counts, replicas, params, m):
    """Plain-Python twin of :func:`_proves`."""
    if forced_reference(counts, replicas, params, m) >= m:
        return True
    return counting_reference(counts, replicas, params, m) >= m


@njit(**NJIT)
def _stage_restarts(counts, order, lists, cost, opts, stop_at, x0, rounds_max, wk, stages):
    """Stage 4b: best-improvement ruin and recreate of each GPU, polished by stage 3.

    A round tries, for every GPU ``h`` (increasing), the dispatch with the experts active
    on ``h`` removed and put back whole by stage 1's rule (:func:`_recreate`), polished by
    the stage-3 search, uncapped and, for each of the ``RESTART_LEVELS`` largest floor
    levels ``F`` below the makespan (:func:`_floor_levels`), first under the floor cap
    ``F`` and then uncapped. The round's strictly lowest makespan (first found on ties)
    is applied; at most ``rounds_max`` rounds, until none is lower or ``stop_at`` is met.
    No polish starts once the stage's searches have made ``opts.restart_probes``
    neighbourhood probes (the round then ends with what it found): a work bound that also
    counts the probes of searches that end without a move. The first ``RESTART_PROOFS``
    times the round's best makespan falls, B8 and then B9 are tried once at it
    (:func:`_proves`); where they prove it optimal, the stage ends there with it: no later
    dispatch of the round or of a further round is strictly lower, so the output is the
    one the whole stage would return, sooner. Returns ``(shares, makespan, rounds,
    probes)``.
    """
    E, g = x0.shape
    counters = np.zeros(4, np.int64)
    x = x0.copy()
    st = _state_of(x.copy(), lists, cost)
    m = _amax(st.times)
    levels = np.empty(RESTART_LEVELS)
    ruin = np.zeros(E, np.bool_)
    g_max = lists.e_ptr[E]  # activations: at most one per replica
    j_max = g_max  # tiles above one per share: at most ceil(n_e / tile) per replica
    for e in range(E):
        j_max += _tiles(counts[e], cost.tile) * (lists.e_ptr[e + 1] - lists.e_ptr[e])
    params = _bound_params(cost)
    proofs = 0
    proved = False
    rounds = 0
    while rounds < rounds_max and m > stop_at and not proved:
        n_lev = _floor_levels(cost, m, g_max, j_max, levels)
        best_m = m
        best_x = x
        for h in range(g):
            if counters[3] >= opts.restart_probes or proved:
                break
            ruin[:] = False
            for i in range(lists.g_ptr[h], lists.g_ptr[h + 1]):
                e = lists.g_exps[i]
                ruin[e] = x[e, h] > 0
            y = _recreate(x, ruin, counts, order, lists, cost)
            for k in range(n_lev + 1):
                if counters[3] >= opts.restart_probes:
                    break
                z = y.copy()
                if k > 0:  # the floor cap makes the search keep every floor at most F
                    capped = KernelCost(cost.a, cost.b, cost.b2, cost.c, cost.beta, cost.c2,
                                        cost.gamma, cost.tile, cost.cap, levels[k - 1])  # fmt: skip
                    call_compiled(stages[_SEARCH], _stage_local_search,
                                  (_state_of(z, lists, capped), lists, capped, opts, stop_at, wk,
                                   counters))  # fmt: skip
                cst = _state_of(z, lists, cost)
                call_compiled(stages[_SEARCH], _stage_local_search,
                              (cst, lists, cost, opts, stop_at, wk, counters))  # fmt: skip
                mz = _amax(cst.times)
                if mz < best_m:
                    best_m = mz
                    best_x = cst.x
                    if proofs < RESTART_PROOFS:
                        proofs += 1
                        proved = _proves(counts, lists.replicas, params, mz)
                        if proved:
                            break
        if best_m < m:
            x = best_x
            m = best_m
            rounds += 1
        else:
            break
    return x, m, rounds, counters[3]


def _stage_restarts_reference(ref, x, m, stop_at, bound_args):
    """Plain-Python twin of :func:`_stage_restarts`: returns ``(shares, makespan, rounds,
    probes)``; ``bound_args``: ``(counts, replicas, params)`` of B8 and B9."""
    rounds = 0
    probes = 0
    proofs = 0
    proved = False
    while rounds < RESTART_ROUNDS and m > stop_at and not proved:
        levels = _floor_levels_reference(ref, m)
        best_m, best_x = m, x
        for h in range(ref.g):
            if probes >= ref.opts.restart_probes or proved:
                break
            y = _recreate_reference(ref, x, {e for e in range(ref.E) if x[e][h] > 0})
            for F in [None, *levels]:
                if probes >= ref.opts.restart_probes:
                    break
                z = y
                if F is not None:
                    z, n = _stage_local_search_reference(ref, y, stop_at, (math.inf, F))
                    probes += n[3]
                z, n = _stage_local_search_reference(ref, z, stop_at)
                probes += n[3]
                mz = max(ref.times_of(z))
                if mz < best_m:
                    best_m, best_x = mz, z
                    if proofs < RESTART_PROOFS:
                        proofs += 1
                        proved = _proves_reference(*bound_args, mz)
                        if proved:
                            break
        if best_m >= m:
            break
        x, m = best_x, best_m
        rounds += 1
    return x, m, rounds, probes


# --------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------

#: ``rounds_max`` of stage 4b as an int64 (a literal argument is another type)
_ROUNDS = np.int64(RESTART_ROUNDS)
#: B8's bisection trials (an int64, as :func:`~straggler.solvers.dispatch.bounds.forced_bound`
#: passes them)
_FORCED_STEPS = np.int64(FORCED_STEPS)
#: B9's bisection trials (an int64, as :func:`~straggler.solvers.dispatch.bounds.counting_bound`
#: passes them)
_COUNTING_STEPS = np.int64(COUNTING_STEPS)


@njit(**NJIT_INLINE)
def _canonical_cost(cost):
    """:class:`KernelCost` with float fields and an int64 tile, from a :class:`KernelCost`
    or a plain tuple of its fields (by position)."""
    return KernelCost(float(cost[0]), float(cost[1]), float(cost[2]), float(cost[3]),
                      float(cost[4]), float(cost[5]), float(cost[6]), np.int64(cost[7]),
                      float(cost[8]), float(cost[9]))  # fmt: skip


@njit(**NJIT_INLINE)
def _canonical_opts(opts):
    """:class:`KernelOptions` with bool, float and int64 fields, from a
    :class:`KernelOptions` or a plain tuple of its fields (by position)."""
    return KernelOptions(bool(opts[0]), bool(opts[1]), bool(opts[2]), bool(opts[3]),
                         bool(opts[4]), bool(opts[5]), bool(opts[6]), float(opts[7]),
                         np.int64(opts[8]), bool(opts[9]), float(opts[10]),
                         np.int64(opts[11]), np.int64(opts[12]))  # fmt: skip


def _stage_argtypes():
    """The stages of :data:`_STAGE_FUNCTIONS` and the numba types of the arguments they are
    called with (by :func:`tempo_kernel` and each other)."""
    import numba

    i1, i2 = np.zeros(1, np.int64), np.zeros((1, 1), np.int64)
    st = _State(i2, i2, np.zeros(1), i2, i1)
    lists = _Lists(np.zeros((1, 1), np.bool_), i1, i1, i1, i1)
    # the plain functions (under NUMBA_DISABLE_JIT=1 they are the functions themselves)
    cost = getattr(_canonical_cost, "py_func", _canonical_cost)(kernel_cost(np.zeros(8)))
    opts = getattr(_canonical_opts, "py_func", _canonical_opts)(KernelOptions(*[False] * 7, 0.0, 0))
    wk = _Work(i2, i2, np.zeros((1, 1)))
    v = 0.0  # a time
    stages = ((0, 0),) * len(_STAGE_FUNCTIONS)
    args = (
        (st, lists, cost, opts, v, wk, i1),  # _stage_local_search
        (i1, i1, lists, cost, opts, v, i2, _ROUNDS, wk, stages),  # _stage_restarts
    )
    return [tuple(numba.typeof(a) for a in arg) for arg in args]


#: The functions :func:`tempo_kernel` and its stages call by address, at these indices of
#: its ``stages`` argument (:func:`stage_handles`)
_STAGE_FUNCTIONS = (_stage_local_search, _stage_restarts)
_SEARCH, _RESTARTS = range(2)


@functools.cache
def stage_handles() -> tuple:
    """The ``stages`` argument of :func:`tempo_kernel`: the handles
    (:func:`~straggler.solvers._numba.address.compiled_address`) of stage 3 and stage 4b
    (:data:`_STAGE_FUNCTIONS`), compiled here or loaded from numba's disk cache on the first
    call of the process, then kept."""
    argtypes = _stage_argtypes()
    return tuple(compiled_address(f, a) for f, a in zip(_STAGE_FUNCTIONS, argtypes))


@njit(**NJIT)
def tempo_kernel(counts, replicas, cost, lp_shares, sm_assign, bound, opts, stages):
    """One layer of tempo_fast.

    Parameters
    ----------
    counts : ndarray of int64, shape (n_experts,)
    replicas : ndarray of bool, shape (n_experts, n_gpus)
    cost : KernelCost, or a plain tuple of its fields
        The cost model, ``cap = inf``. (A plain tuple costs the dispatcher less than a
        named one: numba types a namedtuple argument in Python, about a microsecond.)
    lp_shares : ndarray of int64, shape (n_experts, n_gpus)
        The integral token-LP dispatch (``max_g N_g = ceil(lambda*)``): a stage-4
        candidate, and with ``sm_assign`` an integral lower bound that stops stage 3.
    sm_assign : ndarray of int64, shape (n_experts,)
        An optimal semi-matching (GPU of each live expert, -1 otherwise).
    bound : float
        A certified lower bound on the optimal makespan (``-inf``: none); stage 3 stops
        there too.
    opts : KernelOptions, or a plain tuple of its fields
    stages : tuple
        :func:`stage_handles`: the compiled stage 3 and stage 4b, which the kernel, stage 4
        and stage 4b call by address
        (:func:`~straggler.solvers._numba.address.call_compiled`), so that each compiles once
        and is never linked into (and optimized again with) a caller; ignored in Python.

    Returns
    -------
    shares : ndarray of int64, shape (n_experts, n_gpus)
    info : ndarray of float64, shape (len(INFO_FIELDS),)
    """
    # the stages run by address were compiled for exactly these types (stage_handles):
    # fresh arrays and float / int64 fields, whatever the caller passed (a read-only array
    # or an int field is another numba type)
    counts = counts.copy()
    replicas = replicas.copy()
    cost = _canonical_cost(cost)
    opts = _canonical_opts(opts)
    E, g = replicas.shape
    info = np.full(_N_INFO, np.nan)
    e_ptr, e_gpus, g_ptr, g_exps = replica_lists(replicas)
    lists = _Lists(replicas, e_ptr, e_gpus, g_ptr, g_exps)
    order = stable_argsort_int_desc(counts)
    width = max(g + 1, lists.e_ptr[E])
    # (every entry is written before it is read, except the stamps)
    wk = _Work(np.empty((5, 2 * g + 2), np.int64), np.empty((14, width), np.int64),
               np.empty((2, width)))  # fmt: skip
    wk.wi[_MARK, :] = 0
    wk.wi[_STAMP, 0] = 0

    st = _stage_seed(counts, order, lists, cost, opts.seed)  # Stage 1
    info[1] = _amax(st.times)
    n_chain = _stage_chains(st, lists, cost) if opts.chains else 0  # Stage 2
    info[2] = _amax(st.times)

    # integral lower bound: no whole-token dispatch goes below it, so the searches stop there
    lp_load = np.zeros(g, np.int64)
    for e in range(E):  # by rows: a walk down each column costs 20x more at EP256
        for h in range(g):
            lp_load[h] += lp_shares[e, h]
    lp_nmax = 0
    for h in range(g):
        lp_nmax = max(lp_nmax, lp_load[h])
    sm_cnt = np.zeros(g, np.int64)
    for e in range(E):
        if counts[e] > 0:
            sm_cnt[sm_assign[e]] += 1
    sm = _amax(sm_cnt)
    stop_at = max(float(bound), max(_t(cost, _ZERO, lp_nmax, _ZERO), _t(cost, sm, _ZERO, sm)))
    counters = np.zeros(4, np.int64)
    if opts.local_search:  # Stage 3
        call_compiled(stages[_SEARCH], _stage_local_search,
                      (st, lists, cost, opts, stop_at, wk, counters))  # fmt: skip
    info[3] = _amax(st.times)
    out = st.x
    m_out = info[3]
    choice = 0
    if opts.ensemble:  # Stage 4
        out, m_out, choice = _stage_ensemble(counts, order, lists, cost, lp_shares, sm_assign,
                                             sm, opts, stop_at, st, wk, info,
                                             stages)  # fmt: skip
    n_restart = 0
    n_probe = 0
    if opts.restarts and opts.local_search and m_out > stop_at + opts.restart_gap * m_out:
        # B8, then B9 where B8 leaves it unproved, at the stage-4 makespan: where they prove
        # that makespan optimal (solve_dispatch's OPTIMAL rule), no restart can apply, as only
        # a strictly lower makespan is applied
        params = _bound_params(cost)
        info[16] = forced_bound_kernel(counts, replicas, params, float(bound), m_out,
                                       _FORCED_STEPS)  # fmt: skip
        if m_out > info[16] * (1 + OPTIMALITY_RTOL) + 1e-12:
            info[16] = counting_bound_kernel(counts, replicas, params, info[16], m_out,
                                             _COUNTING_STEPS)  # fmt: skip
        if m_out > info[16] * (1 + OPTIMALITY_RTOL) + 1e-12:  # Stage 4b
            out, m_out, n_restart, n_probe = call_compiled(
                stages[_RESTARTS], _stage_restarts,
                (counts, order, lists, cost, opts, stop_at, out, _ROUNDS, wk, stages),
            )  # fmt: skip
    info[0] = m_out
    info[8] = choice
    info[9] = n_chain
    info[10] = counters[0]
    info[11] = counters[1]
    info[12] = counters[2]
    info[13] = n_restart
    info[14] = counters[3]
    info[15] = n_probe
    return out, info


# call_compiled is lowered by solvers/_numba/address.py, the kernel orders the experts with
# solvers/_order.py and builds its replica lists with _csr.py, and tries B8 (_bounds.py) and B9
# (_counting.py) with the OPTIMAL rule's tolerance (method.py): an edit there recompiles the
# functions that use them
cache_depends_on(_stage_local_search, _address, _order, _csr)
cache_depends_on(_stage_restarts, _address, _order, _csr, _bounds_module, _counting_module)
cache_depends_on(tempo_kernel, _address, _order, _csr, _bounds_module, _counting_module, _method)


def tempo_reference(counts, replicas, cost, lp_shares, sm_assign, bound, opts):
    """Plain-Python reference of :func:`tempo_kernel`: same stages, same tie-breaking.

    Each stage is the ``_reference`` twin of the kernel function of the same name, written
    from the stage descriptions without incremental bookkeeping: every candidate is scored
    by recomputing the GPUs it changes from the shares, the split ``q*`` is found by
    scanning ``q = 1, 2, ...`` instead of bisection, and the exchange search keeps a lazy
    ``heapq`` instead of an indexed heap.

    Examples
    --------
    TEMPO Fig. 1b (``b = 15``, ``beta = 0.1``): only the hot expert is split, 60 us (the
    optimum).

    >>> cost = KernelCost(0.0, 15.0, 0.0, 0.0, 0.1, 0.0, 0.0, 128, math.inf)
    >>> opts = KernelOptions(True, True, True, True, True, True, True, 0.01, 300)
    >>> lp = [[300, 300]] + [[30, 0]] * 3 + [[0, 30]] * 3
    >>> x, info = tempo_reference([600] + [30] * 6, [[True, True]] * 7, cost, lp,
    ...                           [0, 0, 0, 0, 1, 1, 1], -math.inf, opts)
    >>> (x > 0).sum(axis=1).tolist(), float(info[0])
    ([2, 1, 1, 1, 1, 1, 1], 60.0)
    """
    cost, opts = KernelCost(*cost), KernelOptions(*opts)  # (either may be a plain tuple)
    ref = _Ref(counts, replicas, cost, opts)
    E, g = ref.E, ref.g
    info = [float("nan")] * len(INFO_FIELDS)
    x = _stage_seed_reference(ref)  # Stage 1
    info[1] = max(ref.times_of(x))
    n_chain = 0
    if opts.chains:  # Stage 2
        x, n_chain = _stage_chains_reference(ref, x)
    info[2] = max(ref.times_of(x))

    # integral lower bound: no whole-token dispatch goes below it, so the searches stop there
    lp = [[int(v) for v in row] for row in lp_shares]
    lp_nmax = max(sum(lp[e][h] for e in range(E)) for h in range(g))
    live_gpus = [sm_assign[e] for e in range(E) if ref.counts[e] > 0]
    sm = max([live_gpus.count(h) for h in range(g)])
    stop_at = max(float(bound), ref.time_of(0, lp_nmax, 0), ref.time_of(sm, 0, sm))
    counters = [0, 0, 0, 0]
    if opts.local_search:  # Stage 3
        x, counters = _stage_local_search_reference(ref, x, stop_at)
    info[3] = max(ref.times_of(x))

    out, m_out, choice = x, info[3], 0
    if opts.ensemble:  # Stage 4
        out, m_out, choice = _stage_ensemble_reference(ref, x, lp, sm_assign, sm, stop_at, info)
    n_restart = n_probe = 0
    if opts.restarts and opts.local_search and m_out > stop_at + opts.restart_gap * m_out:
        # B8 and B9 at the stage-4 makespan, and stage 4b only where they do not prove it
        # optimal
        params = [cost.a, cost.b, cost.b2, cost.c, cost.beta, cost.c2, cost.gamma, cost.tile]
        info[16] = forced_bound_reference(counts, replicas, params, float(bound), m_out,
                                          FORCED_STEPS)  # fmt: skip
        if m_out > info[16] * (1 + OPTIMALITY_RTOL) + 1e-12:
            info[16] = counting_bound_reference(counts, replicas, params, info[16], m_out,
                                                COUNTING_STEPS)  # fmt: skip
        if m_out > info[16] * (1 + OPTIMALITY_RTOL) + 1e-12:  # Stage 4b
            out, m_out, n_restart, n_probe = _stage_restarts_reference(
                ref, out, m_out, stop_at, (counts, replicas, params)
            )
    info[0] = m_out
    info[13], info[15] = n_restart, n_probe
    info[8], info[9] = choice, n_chain
    info[10], info[11], info[12], info[14] = counters
    return np.array(out, dtype=np.int64).reshape(E, g), np.array(info)
