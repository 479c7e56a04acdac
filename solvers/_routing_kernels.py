"""Numba kernels of every routing policy, each with its plain-Python reference right below it.

Private module: :mod:`straggler.solvers.routing` validates, then calls these; the registry
(:mod:`straggler.solvers.routing_registry`) names them; the simulator's jitted step loop calls
them by policy id through :func:`route_tick_kernel`. Every kernel has one signature::

    kernel(pool, reps, params, carry, seed) -> (assignment, carry_out)

=============  =================================  ===========================================
argument       type                               meaning
=============  =================================  ===========================================
pool           :class:`PoolState`                 the ready requests the router sees, oldest
                                                  first (per request)
reps           :class:`ReplicaState`              the decode replicas (per replica)
params         float64 (N_PARAMS,) or             the policy's options at the ``P_*`` indices
               (N_PARAMS + H+1,)                  below; BR-H only: an optional tail
                                                  ``pi_0..pi_H`` of presence weights
carry          float64 (N_CARRY,)                 the policy's memory from its previous tick
                                                  (``C_*`` indices below; zeros at the start)
seed           int64 >= 0                         seed of the MINSTD generator (random, p2c)
assignment     int64 (n,), fresh                  replica of each pool request, -1 = stays in
                                                  the pool
carry_out      float64 (N_CARRY,), fresh          the memory for the next tick
=============  =================================  ===========================================

:class:`ReplicaState` (all arrays of length ``G`` except ``loads``):

================  =============  ==============================================================
field             dtype          meaning
================  =============  ==============================================================
loads             float64        ``(G, H+1)`` C-contiguous; column 0: resident KV tokens now
                                 (prompt + decoded, summed over the running requests); columns
                                 1..H: projected loads ``h`` steps ahead (BR-H; zeros width 0)
free_slots        int64          free request slots
n_running         int64          running requests
n_waiting         int64          requests queued in the replica's own engine (0 in the
                                 simulator's central-pool model: a request is sent only to a
                                 replica with a free slot)
prompt_tokens     float64        sum of the running requests' ORIGINAL prompt lengths
                                 (TensorRT-LLM's attention-DP metric; not resident KV)
waiting_tokens    float64        prompt tokens of the requests in ``n_waiting`` (SGLang adds
                                 them to its token count)
kv_usage          float64        fraction of the KV capacity in use (vLLM's newest score)
kv_capacity       float64        KV capacity in tokens (``inf``: unbounded)
================  =============  ==============================================================

:class:`PoolState` (arrays of length ``n``, the visible pool):

================  =============  ==============================================================
field             dtype          meaning
================  =============  ==============================================================
prefill           float64        tokens the request brings (its prompt, or prompt + decoded
                                 for a request preempted and recomputed)
wait              int64          routing ticks it has already spent in the pool (0 at its
                                 first tick)
key               int64          a stable per-request integer (request id; SGLang's bootstrap
                                 room)
cached            float64        ``(n, G)``: prompt tokens of request ``i`` already cached on
                                 replica ``g`` (prefix cache), or ``(0, G)`` when unknown
================  =============  ==============================================================

Shared rules. Inputs are never mutated. A request is only placed on a replica with a free slot;
each placement takes one slot. A policy stops when the pool is empty or no slot (no eligible
replica) is left, except ``follow_bootstrap_room`` (a request whose rank is full stays in the
pool; the next one may still go) and ``trtllm_balance`` (which may hold the whole tick back).
With ``params[P_OPTIMISTIC] != 0`` every policy applies its upstream's local update after each
placement (tokens: ``L_g += s_i`` on every column; requests: ``n_running[g] += 1``; vLLM:
``n_waiting[g] += 1``; SGLang ``jsq`` version ``plus_one``: requests only; the gateway's
``p2c``: its version's own credit, none for the versions that had none); with 0 the metric
stays at the tick's values and only slots are consumed. Exact bookkeeping an upstream keeps
whatever the option (vLLM's in-flight count, the gateway's in-flight requests) is kept.
Round-robin, random and ``follow_bootstrap_room`` keep no metric, so the option does not change
them.

Upstream versions: a baseline registered with ``versions`` reads ``params[P_VERSION]``, the
index of the version in that tuple (0 = the current upstream behaviour); the registry maps
``version="..."`` to it. Which upstream file, change and date each version follows is in the
kernel's docstring and in :mod:`straggler.baselines.routers`.

BR-H presence weights: when ``params`` carries ``H+1`` more entries ``pi_h`` (the probability
that a request placed now is still resident ``h`` steps later), the discount becomes
``d_h = gamma^h * pi_h`` (the new requests' expected presence weighs each horizon column of the
F-score); without them ``d_h = gamma^h`` (the paper's).

Randomness (random, p2c, dynamo's ties) comes from MINSTD (``x <- 48271*x mod (2^31-1)``,
state ``seed mod (2^31-2) + 1``), written out in both kernel and reference so they draw the
same numbers; a uniform index below ``k`` is ``x mod k``.

Adding a policy: write ``<name>_kernel`` (``@njit(**NJIT)``) and ``<name>_reference`` below it
with the signature above, give it the next ``ID_*`` constant and one branch in
:func:`route_tick_kernel`, new options at new ``P_*`` indices (raise ``N_PARAMS``), and register
it in :mod:`straggler.solvers.routing_registry`.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ._jit import NJIT

__all__ = [
    "ReplicaState",
    "PoolState",
    "P_R_MAX",
    "P_S_GREEDY",
    "P_ALPHA",
    "P_BETA",
    "P_GAMMA",
    "P_OPTIMISTIC",
    "P_AGE_WINDOW",
    "P_SAFE",
    "P_WINDOW",
    "P_PATIENCE",
    "P_AGE_FRACTION",
    "P_VERSION",
    "P_KV_WEIGHT",
    "P_THROUGHPUT",
    "P_BLOCK_SIZE",
    "P_OVERLAP_WEIGHT",
    "P_TIMEOUT_ITERS",
    "P_BATCHING_WAIT_ITERS",
    "N_PARAMS",
    "C_CURSOR",
    "C_VLLM_START",
    "C_ADP_WAIT",
    "C_ADP_BATCH",
    "N_CARRY",
    "ID_BR0",
    "ID_BRH",
    "ID_ROUND_ROBIN",
    "ID_RANDOM",
    "ID_JSQ",
    "ID_JSQ_REQUESTS",
    "ID_VLLM",
    "ID_P2C",
    "ID_TRTLLM",
    "ID_BRS",
    "ID_TRTLLM_BALANCE",
    "ID_FOLLOW_BOOTSTRAP_ROOM",
    "ID_DYNAMO",
    "best_subset_kernel",
    "br0_kernel",
    "br0_reference",
    "brh_kernel",
    "brh_reference",
    "round_robin_kernel",
    "round_robin_reference",
    "random_kernel",
    "random_reference",
    "jsq_kernel",
    "jsq_reference",
    "jsq_requests_kernel",
    "jsq_requests_reference",
    "vllm_kernel",
    "vllm_reference",
    "p2c_kernel",
    "p2c_reference",
    "trtllm_kernel",
    "trtllm_reference",
    "trtllm_balance_kernel",
    "trtllm_balance_reference",
    "follow_bootstrap_room_kernel",
    "follow_bootstrap_room_reference",
    "dynamo_kernel",
    "dynamo_reference",
    "brs_kernel",
    "brs_reference",
    "project_loads_kernel",
    "project_loads_reference",
    "tick_summary_kernel",
    "check_inputs_kernel",
    "route_tick_kernel",
    "route_batch_kernel",
    "monotonic_ns",
    "BAD_INPUT",
    "MAX_TOKENS",
]


class ReplicaState(NamedTuple):
    """What every kernel knows about each replica (see the module docstring for each field)."""

    loads: np.ndarray
    free_slots: np.ndarray
    n_running: np.ndarray
    n_waiting: np.ndarray
    prompt_tokens: np.ndarray
    waiting_tokens: np.ndarray
    kv_usage: np.ndarray
    kv_capacity: np.ndarray


class PoolState(NamedTuple):
    """What every kernel knows about each visible pool request (see the module docstring)."""

    prefill: np.ndarray
    wait: np.ndarray
    key: np.ndarray
    cached: np.ndarray


#: ``params`` layout shared by every kernel.
P_R_MAX = 0  # R_max: Stage-2 candidates (int >= 1)
P_S_GREEDY = 1  # S_greedy: Stage 1 runs while total free slots > S_greedy
P_ALPHA = 2  # BR-H: weight of the gain term
P_BETA = 3  # BR-H: weight of the overflow penalty (BR-0 uses G)
P_GAMMA = 4  # BR-H: discount in (0, 1]
P_OPTIMISTIC = 5  # 1.0: optimistic local update after each placement; 0.0: none
P_AGE_WINDOW = 6  # BR-S: a request may be placed only within this many ticks of the oldest
P_SAFE = 7  # BR-S: 1.0: keep JSQ's decision when it leaves no larger imbalance
P_WINDOW = 8  # BR-S: candidates per free slot (the k * S_tot oldest; 0: no count limit)
P_PATIENCE = 9  # BR-S: JSQ's decision unless some request has waited this many ticks
P_AGE_FRACTION = 10  # BR-S: the window spans this fraction of the oldest's wait (<= A ticks)
# (11-15 unused)
P_VERSION = 16  # a baseline's upstream version: index into its registered versions (0: current)
P_KV_WEIGHT = 17  # p2c expected_wait: seconds the KV barrier k/(1-k) weighs (upstream 0.15)
P_THROUGHPUT = 18  # p2c expected_wait: tokens/s turning token-work into seconds (upstream 2000)
P_BLOCK_SIZE = 19  # dynamo: KV block size in tokens
P_OVERLAP_WEIGHT = 20  # dynamo: weight of the prefill blocks (kv_overlap_score_weight)
P_TIMEOUT_ITERS = 21  # trtllm_balance: hold-back timeout (TensorRT-LLM timeout_iters)
P_BATCHING_WAIT_ITERS = 22  # trtllm_balance: extra batching wait (batching_wait_iters)
N_PARAMS = 24

#: ``carry`` layout (a policy's memory from tick to tick).
C_CURSOR = 0  # round_robin: the replica to try first
C_VLLM_START = 1  # vllm (rotating versions): where the next scan starts (eng_start_index)
C_ADP_WAIT = 2  # trtllm_balance: iterations waited for every rank to have a new request
C_ADP_BATCH = 3  # trtllm_balance: iterations of batching wait spent
N_CARRY = 8

#: Stable policy ids (``route_tick_kernel``'s ``policy_id``).
ID_BR0 = 0
ID_BRH = 1
ID_ROUND_ROBIN = 2
ID_RANDOM = 3
ID_JSQ = 4
ID_JSQ_REQUESTS = 5
ID_VLLM = 6
ID_P2C = 7
ID_TRTLLM = 8
ID_BRS = 9
ID_TRTLLM_BALANCE = 10
ID_FOLLOW_BOOTSTRAP_ROOM = 11
ID_DYNAMO = 12

#: Largest token count (length, load) a kernel accepts: float64 holds every integer up to it
#: exactly, and ``G * (max load + sum of lengths)`` stays finite for any realistic ``G``.
MAX_TOKENS = float(2**53)

_MINSTD_A = 48271
_MINSTD_M = 2147483647


def monotonic_ns() -> int:
    """``CLOCK_MONOTONIC`` in nanoseconds, in Python and in jitted code.

    Jitted code calls the C library's ``clock_gettime`` directly (:func:`_clock_gettime_ns`,
    resolved by name when the code is linked, so a function that calls it can be cached on
    disk, which a ctypes function pointer prevents); Python (a ``py_func``, or
    ``NUMBA_DISABLE_JIT=1``) reads the same clock through :func:`time.monotonic_ns`.
    """
    return time.monotonic_ns()


@intrinsic
def _clock_gettime_ns(typingctx):
    """``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds (jitted code only)."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        i32 = ir.IntType(32)
        timespec = ir.LiteralStructType([i64, i64])  # struct timespec on 64-bit Linux
        fnty = ir.FunctionType(i32, [i32, timespec.as_pointer()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "clock_gettime")
        ts = cgutils.alloca_once(builder, timespec)
        builder.call(fn, [ir.Constant(i32, 1), ts])  # CLOCK_MONOTONIC = 1
        sec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 0))
        nsec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 1))
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)

    return sig, codegen


@overload(monotonic_ns)
def _monotonic_ns_jit():
    return lambda: _clock_gettime_ns()


# --------------------------------------------------------------------------------------------
# BR-0 (BalanceRoute 关键设计 1-2)
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def best_subset_kernel(prefill, cand, nc, q, margin, n_replicas_f, best, comb):
    """Stage 2's subset search: the ``Q`` among candidates ``cand[:nc]`` with ``|Q| <= q``
    maximizing ``F(Q) = D(Q) - G*(D(Q) - m)_+``.

    Subsets are visited by size ``1..q``, each size in lexicographic order of candidate ranks;
    the first maximum is kept. Writes the ranks of ``Q`` into ``best[:n_best]`` and returns
    ``(F(Q), n_best)``; ``(-inf, 0)`` when ``q == 0``. ``comb`` is scratch of length ``>= q``.
    """
    best_f = -np.inf
    n_best = 0
    for size in range(1, q + 1):
        for j in range(size):
            comb[j] = j
        while True:
            D = 0.0
            for j in range(size):
                D += prefill[cand[comb[j]]]
            f = D - n_replicas_f * max(D - margin, 0.0)
            if f > best_f:
                best_f = f
                n_best = size
                for j in range(size):
                    best[j] = comb[j]
            j = size - 1
            while j >= 0 and comb[j] == nc - size + j:
                j -= 1
            if j < 0:
                break
            comb[j] += 1
            for t in range(j + 1, size):
                comb[t] = comb[t - 1] + 1
    return best_f, n_best


@njit(**NJIT)
def _stable_argsort(x):
    """``np.argsort(x, kind="stable")`` for finite ``x >= 0``: LSD radix sort on the IEEE bits.

    For non-negative doubles (``-0.0`` mapped to ``+0.0``) the bit patterns read as int64 are
    ordered as the values, so byte-wise counting passes (stable) give the order by ``(x, index)``;
    bytes that are equal in every key are skipped (token counts vary in 2-3 bytes only).
    """
    n = x.shape[0]
    buf = np.empty(n)
    for i in range(n):
        buf[i] = x[i] + 0.0
    keys = buf.view(np.int64)
    diff = 0
    for i in range(n):
        diff |= keys[i] ^ keys[0]
    order = np.arange(n)
    tmp = np.empty(n, np.int64)
    cnt = np.empty(257, np.int64)
    for sh in range(0, 64, 8):
        if ((diff >> sh) & 255) == 0:
            continue
        for d in range(257):
            cnt[d] = 0
        for i in range(n):
            cnt[((keys[i] >> sh) & 255) + 1] += 1
        for d in range(256):
            cnt[d + 1] += cnt[d]
        for i in range(n):
            o = order[i]
            d = (keys[o] >> sh) & 255
            tmp[cnt[d]] = o
            cnt[d] += 1
        order, tmp = tmp, order
    return order


_DEBRUIJN = np.uint64(0x03F79D71B4CB0A89)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_ONE = np.uint64(1)
# _BIT_OF[(2^b * _DEBRUIJN mod 2^64) >> 58] = b
_BIT_OF = np.zeros(64, np.int64)
for _b in range(64):
    _BIT_OF[((_DEBRUIJN << np.uint64(_b)) & _ALL) >> np.uint64(58)] = _b
del _b


@njit(**NJIT)
def _low_bit(x):
    """Index of the lowest set bit of a non-zero uint64 (de Bruijn multiplication)."""
    return _BIT_OF[((x & (~x + _ONE)) * _DEBRUIJN) >> np.uint64(58)]


@njit(**NJIT)
def _high_bit(x):
    """Index of the highest set bit of a non-zero uint64."""
    x |= x >> np.uint64(1)
    x |= x >> np.uint64(2)
    x |= x >> np.uint64(4)
    x |= x >> np.uint64(8)
    x |= x >> np.uint64(16)
    x |= x >> np.uint64(32)
    return _BIT_OF[((x ^ (x >> _ONE)) * _DEBRUIJN) >> np.uint64(58)]


@njit(**NJIT)
def _live_set(n):
    """Two-level bitset of the sorted positions ``0..n-1``, all live: ``(words, summary)``.

    Bit ``p & 63`` of ``words[p >> 6]`` is set while position ``p`` is live; bit ``w & 63`` of
    ``summary[w >> 6]`` while ``words[w]`` is non-zero.
    """
    nw = (n >> 6) + 1
    words = np.zeros(nw, np.uint64)
    summary = np.zeros((nw >> 6) + 1, np.uint64)
    for w in range(n >> 6):
        words[w] = _ALL
    if n & 63:
        words[n >> 6] = (_ONE << np.uint64(n & 63)) - _ONE
    for w in range(nw):
        if words[w] != 0:
            summary[w >> 6] |= _ONE << np.uint64(w & 63)
    return words, summary


@njit(**NJIT)
def _kill(words, summary, p):
    """Delete live position ``p``."""
    w = p >> 6
    words[w] &= ~(_ONE << np.uint64(p & 63))
    if words[w] == 0:
        summary[w >> 6] &= ~(_ONE << np.uint64(w & 63))


@njit(**NJIT)
def _next_live(words, summary, p, n):
    """First live position ``>= p`` (``n``: none); ``p >= 0``."""
    w = p >> 6
    if w >= words.shape[0]:
        return n
    x = words[w] & (_ALL << np.uint64(p & 63))
    if x != 0:
        return (w << 6) + _low_bit(x)
    w += 1
    sw = w >> 6
    if sw >= summary.shape[0]:
        return n
    y = summary[sw] & (_ALL << np.uint64(w & 63))
    while y == 0:
        sw += 1
        if sw == summary.shape[0]:
            return n
        y = summary[sw]
    w = (sw << 6) + _low_bit(y)
    return (w << 6) + _low_bit(words[w])


@njit(**NJIT)
def _prev_live(words, summary, p):
    """Last live position ``<= p`` (``-1``: none)."""
    if p < 0:
        return -1
    w = p >> 6
    x = words[w] & (_ALL >> np.uint64(63 - (p & 63)))
    if x != 0:
        return (w << 6) + _high_bit(x)
    w -= 1
    if w < 0:
        return -1
    sw = w >> 6
    y = summary[sw] & (_ALL >> np.uint64(63 - (w & 63)))
    while y == 0:
        sw -= 1
        if sw < 0:
            return -1
        y = summary[sw]
    w = (sw << 6) + _high_bit(y)
    return (w << 6) + _high_bit(words[w])


@njit(**NJIT)
def _br0_candidates(sv, order, run_start, words, summary, mg, Gf, k, cand, cand_f):
    """The ``k`` live requests with the largest ``F(s) = s - G*(s - m)_+``, ties to lower index.

    For ``G >= 2``, ``F`` increases (slope 1) up to the margin and strictly decreases (slope
    ``1-G``) above it, so the ranking merges two sorted walks from the margin: downward over
    ``s <= m`` (each run of equal ``s`` in index order) and upward over ``s > m``.
    """
    n = sv.shape[0]
    p = np.searchsorted(sv, mg, side="right")  # first position with s > m
    lo_q = _prev_live(words, summary, p - 1)  # last live position with s <= m (-1: none)
    # walk inside lo_q's run, in index order
    lo = _next_live(words, summary, run_start[lo_q], n) if lo_q >= 0 else -1
    hi = _next_live(words, summary, p, n)  # first live position with s > m (n: none)
    nc = 0
    while nc < k and (lo >= 0 or hi < n):
        f_lo = -np.inf
        f_hi = -np.inf
        if lo >= 0:
            f_lo = sv[lo] - Gf * max(sv[lo] - mg, 0.0)
        if hi < n:
            f_hi = sv[hi] - Gf * max(sv[hi] - mg, 0.0)
        take_lo = lo >= 0 and (hi >= n or f_lo > f_hi or (f_lo == f_hi and order[lo] < order[hi]))
        if take_lo:
            cand[nc] = order[lo]
            cand_f[nc] = f_lo
            nc += 1
            if nc == k:
                break
            if lo < lo_q:
                lo = _next_live(words, summary, lo + 1, n)
            else:  # run exhausted: the previous run with a live member
                lo_q = _prev_live(words, summary, run_start[lo_q] - 1)
                lo = _next_live(words, summary, run_start[lo_q], n) if lo_q >= 0 else -1
        else:
            cand[nc] = order[hi]
            cand_f[nc] = f_hi
            nc += 1
            if nc == k:
                break
            hi = _next_live(words, summary, hi + 1, n)
    return nc


@njit(**NJIT)
def br0_kernel(pool, reps, params, carry, seed):
    """BR-0 on current loads ``loads[:, 0]``; see ``route_batch`` for the full statement.

    Data structures (the decisions are those of :func:`br0_reference`, which re-ranks the
    whole pool on every pop): the pool is sorted once by ``(s, index)`` (stable radix sort);
    live requests are a two-level bitset over sorted positions. A Stage-1 pop needs only the
    best single request: the largest live ``s <= m`` (``F = s``; the lowest index of its run)
    against the smallest live ``s > m`` (``F = s - G*(s - m)``), found by a binary search for
    the margin and two bitset look-ups (``O(log n)``); when every live ``s`` is ``<= m``, the
    largest live one wins without a search. The replica of a pop is the one with the most
    free slots, then the largest margin, then the lowest index: the largest free-slot count
    ``cmax`` and how many replicas hold it are kept between pops, so one pass over ``G`` keys
    finds it.
    """
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = loads.shape[0]
    r_max = int(params[P_R_MAX])
    s_greedy = params[P_S_GREEDY]
    optimistic = params[P_OPTIMISTIC] != 0.0
    Gf = float(G)
    L = loads[:, 0].copy()
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    n_live = n
    s_tot = 0
    for g in range(G):
        s_tot += cap[g]
    M = L[0]
    for g in range(1, G):
        if L[g] > M:
            M = L[g]
    cand = np.empty(r_max, np.int64)
    cand_f = np.empty(r_max)
    best = np.empty(r_max, np.int64)
    comb = np.empty(r_max, np.int64)
    order = _stable_argsort(prefill)
    sv = np.empty(n)
    pos_of = np.empty(n, np.int64)
    run_start = np.empty(n, np.int64)
    for p in range(n):
        o = order[p]
        sv[p] = prefill[o]
        pos_of[o] = p
        run_start[p] = p if p == 0 or sv[p] != sv[p - 1] else run_start[p - 1]
    words, summary = _live_set(n)
    first = 0  # G = 1: lowest pool index that may still be live
    cmax = 0  # largest free-slot count ...
    n_at = 0  # ... and how many replicas hold it (0: recompute)
    while n_live > 0 and s_tot > 0:
        # Priority queue keyed by (free slots, margin), ties to the lowest index. Margins all
        # move when M moves, so the keys are read afresh (one pass over the cmax replicas).
        if n_at == 0:
            cmax = 0
            for j in range(G):
                if cap[j] > cmax:
                    cmax = cap[j]
            for j in range(G):
                if cap[j] == cmax:
                    n_at += 1
        g = -1
        mg = -1.0
        for j in range(G):
            if cap[j] == cmax:
                mj = M - L[j]
                if mj > mg:  # margins are >= 0; strict: ties to the lowest index
                    g = j
                    mg = mj
        stage1 = s_tot > s_greedy
        if G == 1:
            # F = 0 for every request (m = 0): the ranking is the pool order.
            k = 1 if stage1 else min(r_max, n_live)
            while out[first] >= 0:
                first += 1
            nc = 0
            for i in range(first, n):
                if out[i] < 0:
                    cand[nc] = i
                    nc += 1
                    if nc == k:
                        break
        elif stage1:
            # The best single request: top-ranked of the two walks of _br0_candidates.
            top = _prev_live(words, summary, n - 1)  # largest live s
            if sv[top] <= mg:
                q = _next_live(words, summary, run_start[top], n)
            else:
                # first position with s > m, in [0, top] (branch-free binary search)
                base = 0
                size = top + 1
                while size > 1:
                    half = size >> 1
                    base += half * (sv[base + half - 1] <= mg)
                    size -= half
                q = _next_live(words, summary, base, n)  # smallest live s > m
                lo = _prev_live(words, summary, base - 1)  # largest live s <= m
                if lo >= 0:
                    lo = _next_live(words, summary, run_start[lo], n)
                    f_hi = sv[q] - Gf * max(sv[q] - mg, 0.0)
                    if sv[lo] > f_hi or (sv[lo] == f_hi and order[lo] < order[q]):
                        q = lo
            cand[0] = order[q]
            nc = 1
        else:
            k = min(r_max, n_live)
            nc = _br0_candidates(sv, order, run_start, words, summary, mg, Gf, k, cand, cand_f)
        if stage1:
            # Stage 1: the replica with most free slots takes the best single request.
            best[0] = 0
            n_best = 1
        else:
            # Stage 2: best subset of the candidates, then the starvation guard.
            best_f, n_best = best_subset_kernel(
                prefill, cand, nc, min(cap[g], nc), mg, Gf, best, comb
            )
            if best_f <= 0.0:
                # Starvation guard: the best single request is placed anyway.
                best[0] = 0
                n_best = 1
        D = 0.0
        for j in range(n_best):
            i = cand[best[j]]
            D += prefill[i]
            out[i] = g
            _kill(words, summary, pos_of[i])
        n_live -= n_best
        cap[g] -= n_best
        s_tot -= n_best
        n_at -= 1  # g left the cmax level
        if optimistic:
            L[g] += D
            if L[g] > M:
                M = L[g]
    return out, carry.copy()


def br0_reference(pool, reps, params, carry, seed):
    """BR-0 from the paper's pseudo-code, in plain Python (lists, sorted, itertools)."""
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    s = [float(x) for x in prefill]
    L = [float(row[0]) for row in loads]
    cap = [int(c) for c in free_slots]
    G = len(L)
    r_max = int(params[P_R_MAX])
    s_greedy = float(params[P_S_GREEDY])
    optimistic = float(params[P_OPTIMISTIC]) != 0.0
    out = [-1] * len(s)
    pool = list(range(len(s)))

    def F(D, m):
        return D - float(G) * max(D - m, 0.0)

    while pool and sum(cap) > 0:
        M = max(L)
        S_tot = sum(cap)
        # pop the replica with the largest (free slots, margin), lowest index on ties
        g = min((j for j in range(G) if cap[j] > 0), key=lambda j: (-cap[j], -(M - L[j]), j))
        m = M - L[g]
        ranked = sorted(pool, key=lambda i: (-F(s[i], m), i))
        if S_tot > s_greedy:  # Stage 1
            Q = [ranked[0]]
        else:  # Stage 2
            top = ranked[:r_max]
            best_q, best_f = None, -math.inf
            for size in range(1, min(cap[g], len(top)) + 1):
                for combo in itertools.combinations(range(len(top)), size):
                    D = 0.0
                    for c in combo:
                        D += s[top[c]]
                    if F(D, m) > best_f:
                        best_q, best_f = [top[c] for c in combo], F(D, m)
            Q = best_q if best_f > 0.0 else [top[0]]  # starvation guard
        D = 0.0
        for i in Q:
            D += s[i]
            out[i] = g
            pool.remove(i)
        cap[g] -= len(Q)
        if optimistic:
            L[g] += D
    return np.array(out, dtype=np.int64), np.array(carry, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# BR-H (BalanceRoute 关键设计 3): the same two stages with the horizon F-score
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def _brh_insert(i, f, k, nc, cand, cand_f):
    """Insert request ``i`` of score ``f`` into the top-k list ordered by (f desc, index asc)."""
    if nc < k:
        pos = nc
        nc += 1
    elif f > cand_f[k - 1] or (f == cand_f[k - 1] and i < cand[k - 1]):
        pos = k - 1
    else:
        return nc
    while pos > 0 and (cand_f[pos - 1] < f or (cand_f[pos - 1] == f and cand[pos - 1] > i)):
        cand[pos] = cand[pos - 1]
        cand_f[pos] = cand_f[pos - 1]
        pos -= 1
    cand[pos] = i
    cand_f[pos] = f
    return nc


@njit(**NJIT)
def _brh_score(s, gain, beta, d, m, idx, hs):
    """``F(s) = gain*s - beta*sum_h d_h (s - m_h)_+`` computed exactly as the reference does
    (the positive terms added in increasing ``h``; a zero term adds ``+0.0``, which changes
    nothing). ``idx`` sorts the horizon offsets by margin: a binary search counts the margins
    below ``s``; when they are few (the usual case near the score's peak) only they are read,
    put back in ``h`` order in the scratch ``hs``; otherwise every offset is scanned."""
    H1 = idx.shape[0]
    lo = 0
    hi = H1
    while lo < hi:  # number of margins < s
        mid = (lo + hi) >> 1
        if m[idx[mid]] < s:
            lo = mid + 1
        else:
            hi = mid
    nb = lo
    pen = 0.0
    if nb > 16:
        for h in range(H1):
            x = s - m[h]
            if x > 0.0:
                pen += x * d[h]
        return gain * s - beta * pen
    for j in range(nb):
        h = idx[j]
        t = j
        while t > 0 and hs[t - 1] > h:
            hs[t] = hs[t - 1]
            t -= 1
        hs[t] = h
    for t in range(nb):
        h = hs[t]
        pen += (s - m[h]) * d[h]
    return gain * s - beta * pen


@njit(**NJIT)
def _brh_candidates(
    sv, order, words, summary, m, d, sd, spread, gain, beta, k, cand, cand_f, idx, hs
):
    """The ``k`` live requests with the largest horizon score, ties to the lower index.

    ``F(s) = gain*s - beta*sum_h d_h (s - m_h)_+`` is concave in ``s`` (``beta, d_h >= 0``),
    increasing below its peak ``s*`` and non-increasing above it. Two walks over the pool
    sorted by ``s`` start near the peak: downward from ``s_lo <= s*`` and upward, each computing
    ``F`` exactly as the scan does (:func:`_brh_score`). A walk stops once the computed ``F``
    is below the k-th candidate by more than twice a rigorous bound ``eps`` on the rounding
    error of ``F`` (the upward walk only beyond ``s_hi >= s*``): every later request's computed
    score is then below the k-th too, so the top-k equals the full scan's. ``s_lo``/``s_hi``
    come from the slope signs at the sorted margins, decided with a tolerance so they bracket
    ``s*``. ``sd = 1'd`` and ``spread = sum_h d_h |m_h|`` are the caller's.
    """
    n = sv.shape[0]
    H1 = m.shape[0]
    # idx: this replica's permutation from its previous pop, nearly sorted: insertion sort
    # (the caller sorts it fully at the replica's first pop of the tick).
    for j in range(1, H1):
        v = idx[j]
        i = j - 1
        while i >= 0 and m[idx[i]] > m[v]:
            idx[i + 1] = idx[i]
            i -= 1
        idx[i + 1] = v
    tol = 1e-9 * (gain + beta * sd)
    s_lo = np.inf
    s_hi = np.inf
    w = 0.0
    for j in range(H1):
        w += d[idx[j]]
        if j + 1 < H1 and m[idx[j + 1]] == m[idx[j]]:
            continue
        slope = gain - beta * w  # slope of F just above the breakpoint m[idx[j]]
        if s_lo == np.inf and slope <= tol:
            s_lo = m[idx[j]]
        if slope < -tol:
            s_hi = m[idx[j]]
            break
    top = _prev_live(words, summary, n - 1)  # largest live position
    if top < 0:
        return 0
    smax = sv[top]
    eps = 1e-10 * (gain * smax + beta * (sd * smax + spread)) + 1e-300
    p = np.searchsorted(sv, s_lo, side="right")  # first position with s > s_lo
    nc = 0
    q = _prev_live(words, summary, p - 1)  # downward walk
    while q >= 0:
        f = _brh_score(sv[q], gain, beta, d, m, idx, hs)
        nc = _brh_insert(order[q], f, k, nc, cand, cand_f)
        if nc == k and f + 2.0 * eps < cand_f[k - 1]:
            break
        q = _prev_live(words, summary, q - 1)
    q = _next_live(words, summary, p, n)  # upward walk
    while q < n:
        s = sv[q]
        f = _brh_score(s, gain, beta, d, m, idx, hs)
        nc = _brh_insert(order[q], f, k, nc, cand, cand_f)
        if nc == k and s >= s_hi and f + 2.0 * eps < cand_f[k - 1]:
            break
        q = _next_live(words, summary, q + 1, n)
    return nc


@njit(**NJIT)
def brh_kernel(pool, reps, params, carry, seed):
    """BR-H on projected loads ``loads`` (G, H+1); see ``route_batch``.

    The decisions are :func:`brh_reference`'s (which scores every replica and every request
    over all ``H+1`` columns on every pop); the work per pop is smaller:

    * replica keys ``d'm_j = d'M - d'L_j`` are kept incrementally (``d'L_j`` moves by
      ``D * (1'd)`` when ``j`` takes ``D``; ``d'M`` is recomputed only when a column's maximum
      moves), and only the replicas within a rounding bound of the best are re-scored exactly
      (``sum_h d_h (M_h - L_jh)`` in ``h`` order, as the reference does), none when one
      stands out;
    * the pool is sorted once (radix sort) and live positions kept in BR-0's two-level
      bitset; the candidates come from two walks from the peak of the concave score
      (:func:`_brh_candidates`);
    * each replica's horizon offsets are kept sorted by margin (a full sort at its first pop of
      the tick, an insertion pass later), so a score reads only the margins below ``s``
      (:func:`_brh_score`): the positive terms, in ``h`` order, exactly as the full sum.
    """
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = loads.shape[0]
    H1 = loads.shape[1]
    r_max = int(params[P_R_MAX])
    s_greedy = params[P_S_GREEDY]
    alpha = params[P_ALPHA]
    beta = params[P_BETA]
    gamma = params[P_GAMMA]
    optimistic = params[P_OPTIMISTIC] != 0.0
    d = np.empty(H1)
    acc = 1.0
    for h in range(H1):
        d[h] = acc
        acc *= gamma
    if params.shape[0] > N_PARAMS:
        # presence weights of the new requests: d_h = gamma^h * pi_h
        for h in range(H1):
            d[h] *= params[N_PARAMS + h]
    sd = 0.0
    for h in range(H1):
        sd += d[h]
    gain = alpha * sd
    L = loads.copy()
    Mh = np.empty(H1)
    for h in range(H1):
        Mh[h] = L[0, h]
        for g in range(1, G):
            if L[g, h] > Mh[h]:
                Mh[h] = L[g, h]
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    n_live = n
    s_tot = 0
    for g in range(G):
        s_tot += cap[g]
    m = np.empty(H1)
    cand = np.empty(r_max, np.int64)
    cand_f = np.empty(r_max)
    comb = np.empty(r_max, np.int64)
    best = np.empty(r_max, np.int64)
    order = _stable_argsort(prefill)  # by (s, index), as a stable sort
    sv = prefill[order]
    pos_of = np.empty(n, np.int64)
    for p in range(n):
        pos_of[order[p]] = p
    words, summary = _live_set(n)  # live sorted positions (BR-0's two-level bitset)
    perm = np.empty((G, H1), np.int64)  # per replica: its horizon offsets by margin
    sorted_once = np.zeros(G, np.bool_)
    hs = np.empty(H1, np.int64)  # scratch of _brh_score
    # Replica keys d'm_j = d'M - d'L_j, kept incrementally: d'L_j moves by D * (1'd) when j
    # takes D, d'M is recomputed only when a column's maximum moves. They decide the pop up to
    # a rounding bound; the contenders within it are re-scored exactly as the reference scores
    # every replica (sum_h d_h * (M_h - L_jh), in h order), so the decision is the reference's.
    dL = np.empty(G)
    for j in range(G):
        acc = 0.0
        for h in range(H1):
            acc += d[h] * L[j, h]
        dL[j] = acc
    dM = 0.0
    for h in range(H1):
        dM += d[h] * Mh[h]
    n_upd = 0
    unit = 2.0**-53
    while n_live > 0 and s_tot > 0:
        # Replica key: (free slots, discounted margin d'm_g), ties to the lowest index.
        # (keys are only computed for the replicas with the most free slots).
        cmax = 0
        for j in range(G):
            if cap[j] > cmax:
                cmax = cap[j]
        best_a = -np.inf
        big = 0.0
        for j in range(G):
            if cap[j] == cmax:
                a = dM - dL[j]
                if a > best_a:
                    best_a = a
                if abs(dL[j]) > big:
                    big = abs(dL[j])
        tol = 8.0 * (H1 + n_upd + 4) * unit * (abs(dM) + big + 1.0)
        g = -1
        n_cont = 0
        for j in range(G):
            if cap[j] == cmax and dM - dL[j] >= best_a - 2.0 * tol:
                n_cont += 1
                if g < 0:
                    g = j
        if n_cont > 1:  # near-ties: the exact keys decide
            g = -1
            key = 0.0
            for j in range(G):
                if cap[j] != cmax or dM - dL[j] < best_a - 2.0 * tol:
                    continue
                kj = 0.0
                for h in range(H1):
                    kj += d[h] * (Mh[h] - L[j, h])
                if g < 0 or kj > key:
                    g = j
                    key = kj
        spread = 0.0
        for h in range(H1):
            m[h] = Mh[h] - L[g, h]
            spread += d[h] * abs(m[h])
        if not sorted_once[g]:
            perm[g] = np.argsort(m)  # any order of equal margins gives the same bracket
            sorted_once[g] = True
        stage1 = s_tot > s_greedy
        k = 1 if stage1 else min(r_max, n_live)
        nc = _brh_candidates(
            sv, order, words, summary, m, d, sd, spread, gain, beta, k, cand, cand_f, perm[g], hs
        )
        if stage1:
            best[0] = 0
            n_best = 1
        else:
            q = min(cap[g], nc)
            best_f = -np.inf
            n_best = 0
            for size in range(1, q + 1):
                for j in range(size):
                    comb[j] = j
                while True:
                    D = 0.0
                    for j in range(size):
                        D += prefill[cand[comb[j]]]
                    f = _brh_score(D, gain, beta, d, m, perm[g], hs)
                    if f > best_f:
                        best_f = f
                        n_best = size
                        for j in range(size):
                            best[j] = comb[j]
                    j = size - 1
                    while j >= 0 and comb[j] == nc - size + j:
                        j -= 1
                    if j < 0:
                        break
                    comb[j] += 1
                    for t in range(j + 1, size):
                        comb[t] = comb[t - 1] + 1
            if best_f <= 0.0:
                best[0] = 0
                n_best = 1
        D = 0.0
        for j in range(n_best):
            i = cand[best[j]]
            D += prefill[i]
            out[i] = g
            _kill(words, summary, pos_of[i])
        n_live -= n_best
        cap[g] -= n_best
        s_tot -= n_best
        if optimistic:
            moved = False
            for h in range(H1):
                L[g, h] += D
                if L[g, h] > Mh[h]:
                    Mh[h] = L[g, h]
                    moved = True
            dL[g] += D * sd
            n_upd += 1
            if moved:
                dM = 0.0
                for h in range(H1):
                    dM += d[h] * Mh[h]
    return out, carry.copy()


def brh_reference(pool, reps, params, carry, seed):
    """BR-H in plain Python: margin vectors, discount vector, horizon F-score."""
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    s = [float(x) for x in prefill]
    L = [[float(v) for v in row] for row in loads]
    cap = [int(c) for c in free_slots]
    G, H1 = len(L), len(L[0])
    r_max = int(params[P_R_MAX])
    s_greedy = float(params[P_S_GREEDY])
    alpha, beta, gamma = float(params[P_ALPHA]), float(params[P_BETA]), float(params[P_GAMMA])
    optimistic = float(params[P_OPTIMISTIC]) != 0.0
    d = []
    acc = 1.0
    for h in range(H1):
        d.append(acc * float(params[N_PARAMS + h]) if len(params) > N_PARAMS else acc)
        acc *= gamma
    sd = 0.0
    for x in d:
        sd += x
    out = [-1] * len(s)
    pool = list(range(len(s)))

    def F(D, m):
        pen = 0.0
        for h in range(H1):
            pen += max(D - m[h], 0.0) * d[h]
        return alpha * sd * D - beta * pen

    def dm(mv):
        acc = 0.0
        for h in range(H1):
            acc += d[h] * mv[h]
        return acc

    while pool and sum(cap) > 0:
        M = [max(L[g][h] for g in range(G)) for h in range(H1)]
        margin = [[M[h] - L[g][h] for h in range(H1)] for g in range(G)]
        g = min((j for j in range(G) if cap[j] > 0), key=lambda j: (-cap[j], -dm(margin[j]), j))
        m = margin[g]
        ranked = sorted(pool, key=lambda i: (-F(s[i], m), i))
        if sum(cap) > s_greedy:
            Q = [ranked[0]]
        else:
            top = ranked[:r_max]
            best_q, best_f = None, -math.inf
            for size in range(1, min(cap[g], len(top)) + 1):
                for combo in itertools.combinations(range(len(top)), size):
                    D = 0.0
                    for c in combo:
                        D += s[top[c]]
                    if F(D, m) > best_f:
                        best_q, best_f = [top[c] for c in combo], F(D, m)
            Q = best_q if best_f > 0.0 else [top[0]]
        D = 0.0
        for i in Q:
            D += s[i]
            out[i] = g
            pool.remove(i)
        cap[g] -= len(Q)
        if optimistic:
            for h in range(H1):
                L[g][h] += D
    return np.array(out, dtype=np.int64), np.array(carry, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Round-robin: next replica with a free slot in cyclic order from the cursor
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def round_robin_kernel(pool, reps, params, carry, seed):
    """Round-robin from the cursor ``carry[C_CURSOR]``; the returned cursor is the last replica
    used + 1 (mod G), unchanged when nothing is placed."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = free_slots.shape[0]
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    cur = int(carry[C_CURSOR]) % G
    for i in range(n):
        g = -1
        for t in range(G):
            j = (cur + t) % G
            if cap[j] > 0:
                g = j
                break
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        cur = (g + 1) % G
    new = carry.copy()
    new[C_CURSOR] = float(cur)
    return out, new


def round_robin_reference(pool, reps, params, carry, seed):
    """Round-robin in plain Python."""
    G = len(reps.free_slots)
    cap = [int(c) for c in reps.free_slots]
    cur = int(carry[C_CURSOR]) % G
    out = []
    for _ in range(len(pool.prefill)):
        order = [(cur + t) % G for t in range(G)]
        free = [j for j in order if cap[j] > 0]
        if not free:
            out.append(-1)
            continue
        out.append(free[0])
        cap[free[0]] -= 1
        cur = (free[0] + 1) % G
    new = [float(c) for c in carry]
    new[C_CURSOR] = float(cur)
    return np.array(out, dtype=np.int64), np.array(new, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Random: uniform over the replicas with a free slot (MINSTD draws)
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def random_kernel(pool, reps, params, carry, seed):
    """Uniform random replica among those with a free slot, one MINSTD draw per request."""
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = loads.shape[0]
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    x = seed % (_MINSTD_M - 1) + 1
    elig = np.empty(G, np.int64)
    for i in range(n):
        k = 0
        for j in range(G):
            if cap[j] > 0:
                elig[k] = j
                k += 1
        if k == 0:
            break
        x = (_MINSTD_A * x) % _MINSTD_M
        g = elig[x % k]
        out[i] = g
        cap[g] -= 1
    return out, carry.copy()


def random_reference(pool, reps, params, carry, seed):
    """Random routing in plain Python (the same MINSTD stream)."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    cap = [int(c) for c in free_slots]
    x = int(seed) % (_MINSTD_M - 1) + 1
    out = [-1] * len(prefill)
    for i in range(len(prefill)):
        elig = [j for j in range(len(cap)) if cap[j] > 0]
        if not elig:
            break
        x = (_MINSTD_A * x) % _MINSTD_M
        out[i] = elig[x % len(elig)]
        cap[out[i]] -= 1
    return np.array(out, dtype=np.int64), np.array(carry, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# JSQ by tokens (SGLang total_tokens): fewest tokens, then fewest requests, then lowest index
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def jsq_kernel(pool, reps, params, carry, seed):
    """SGLang's ``total_tokens``: fewest ``loads + waiting_tokens`` (its ``num_total_tokens``:
    KV in use plus the waiting queue's lengths), then fewest ``running + waiting``, then lowest
    index. Optimistic update: version 0 (``prompt``) ``tokens += s, requests += 1``; version 1
    (``plus_one``) ``requests += 1`` only."""
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = loads.shape[0]
    optimistic = params[P_OPTIMISTIC] != 0.0
    add_tokens = params[P_VERSION] == 0.0
    tok = loads[:, 0] + reps.waiting_tokens
    req = reps.n_running + reps.n_waiting
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    for i in range(n):
        g = -1
        for j in range(G):
            if cap[j] <= 0:
                continue
            if g < 0 or tok[j] < tok[g] or (tok[j] == tok[g] and req[j] < req[g]):
                g = j
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        if optimistic:
            req[g] += 1
            if add_tokens:
                tok[g] += prefill[i]
    return out, carry.copy()


def jsq_reference(pool, reps, params, carry, seed):
    """JSQ by tokens in plain Python."""
    prefill = pool.prefill
    tok = [float(row[0]) + float(w) for row, w in zip(reps.loads, reps.waiting_tokens)]
    req = [int(a) + int(b) for a, b in zip(reps.n_running, reps.n_waiting)]
    cap = [int(c) for c in reps.free_slots]
    optimistic = float(params[P_OPTIMISTIC]) != 0.0
    version = int(params[P_VERSION])
    out = [-1] * len(prefill)
    for i, s in enumerate(prefill):
        elig = [j for j in range(len(cap)) if cap[j] > 0]
        if not elig:
            break
        g = min(elig, key=lambda j: (tok[j], req[j], j))
        out[i] = g
        cap[g] -= 1
        if optimistic:
            req[g] += 1
            if version == 0:  # since SGLang #22614; before it the tokens stayed put
                tok[g] += float(s)
    return np.array(out, dtype=np.int64), np.array(carry, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# JSQ by requests (SGLang total_requests): fewest requests, then lowest index
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def jsq_requests_kernel(pool, reps, params, carry, seed):
    """Fewest requests (running + waiting), ties to the lowest index; optimistic: +1."""
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    n_running = reps.n_running
    n_waiting = reps.n_waiting
    n = prefill.shape[0]
    G = loads.shape[0]
    optimistic = params[P_OPTIMISTIC] != 0.0
    req = n_running + n_waiting
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    for i in range(n):
        g = -1
        for j in range(G):
            if cap[j] > 0 and (g < 0 or req[j] < req[g]):
                g = j
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        if optimistic:
            req[g] += 1
    return out, carry.copy()


def jsq_requests_reference(pool, reps, params, carry, seed):
    """JSQ by requests in plain Python."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n_running = reps.n_running
    n_waiting = reps.n_waiting
    req = [int(a) + int(b) for a, b in zip(n_running, n_waiting)]
    cap = [int(c) for c in free_slots]
    optimistic = float(params[P_OPTIMISTIC]) != 0.0
    out = [-1] * len(prefill)
    for i in range(len(prefill)):
        elig = [j for j in range(len(cap)) if cap[j] > 0]
        if not elig:
            break
        g = min(elig, key=lambda j: (req[j], j))
        out[i] = g
        cap[g] -= 1
        if optimistic:
            req[g] += 1
    return np.array(out, dtype=np.int64), np.array(carry, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# vLLM DP load balancer (three versions): lowest score in cyclic order from a start index
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def vllm_kernel(pool, reps, params, carry, seed):
    """vLLM's ``get_core_engine_for_request``: the first strict minimum of the score scanning
    from the start index; version 0 (``current``) scores ``max(inflight, waiting + running) +
    waiting * 6 * max(0, kv_usage - 0.5)`` and rotates the start after every pick; version 1
    (``rotate_4w``) scores ``4 * waiting + running`` and rotates; version 2 (``legacy``)
    scores ``4 * waiting + running`` from a fixed start 0. ``inflight`` (the front-end's own
    count, exact) = ``running + waiting`` of the view plus this tick's picks; the optimistic
    update is ``waiting += 1``."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n_running = reps.n_running
    n_waiting = reps.n_waiting
    kv = reps.kv_usage
    n = prefill.shape[0]
    G = free_slots.shape[0]
    optimistic = params[P_OPTIMISTIC] != 0.0
    version = int(params[P_VERSION])
    rotate = version != 2
    start = int(carry[C_VLLM_START]) % G if rotate else 0
    waiting = n_waiting.copy()
    picks = np.zeros(G, np.int64)
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    for i in range(n):
        g = -1
        best = np.inf
        for t in range(G):
            j = (start + t) % G
            if cap[j] <= 0:
                continue
            if version == 0:
                inflight = n_running[j] + n_waiting[j] + picks[j]
                score = float(max(inflight, waiting[j] + n_running[j]))
                if waiting[j] > 0:
                    score += waiting[j] * 6.0 * max(0.0, kv[j] - 0.5)
            else:
                score = float(4 * waiting[j] + n_running[j])
            if score < best:
                best = score
                g = j
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        picks[g] += 1
        if optimistic:
            waiting[g] += 1
        if rotate:
            start = (start + 1) % G
    new = carry.copy()
    if rotate:
        new[C_VLLM_START] = float(start)
    return out, new


def vllm_reference(pool, reps, params, carry, seed):
    """vLLM's DP load balancer in plain Python (the scan written out as upstream's loop)."""
    G = len(reps.free_slots)
    running = [int(r) for r in reps.n_running]
    waiting0 = [int(w) for w in reps.n_waiting]
    waiting = list(waiting0)
    kv = [float(u) for u in reps.kv_usage]
    cap = [int(c) for c in reps.free_slots]
    picks = [0] * G
    optimistic = float(params[P_OPTIMISTIC]) != 0.0
    version = int(params[P_VERSION])
    start = int(carry[C_VLLM_START]) % G if version != 2 else 0
    out = [-1] * len(pool.prefill)
    for i in range(len(pool.prefill)):
        best, g = float("inf"), -1
        for t in range(G):
            j = (start + t) % G
            if cap[j] <= 0:
                continue
            if version == 0:  # vLLM #49204
                score = float(max(running[j] + waiting0[j] + picks[j], waiting[j] + running[j]))
                if waiting[j]:
                    score += waiting[j] * 6.0 * max(0.0, kv[j] - 0.5)
            else:
                score = float(waiting[j] * 4 + running[j])
            if score < best:
                best, g = score, j
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        picks[g] += 1
        if optimistic:
            waiting[g] += 1
        if version != 2:  # vLLM #47420
            start = (start + 1) % G
    new = [float(c) for c in carry]
    if version != 2:
        new[C_VLLM_START] = float(start)
    return np.array(out, dtype=np.int64), np.array(new, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Power of two choices (the SGLang gateway, four versions of its metric)
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def _p2c_metric(reps, j, version, credit, reqs, thr, lam):
    """Replica ``j``'s load under the gateway version ``version`` (see :func:`p2c_kernel`)."""
    if version == 0:
        u = min(max(reps.kv_usage[j], 0.0), 0.999)
        return (reps.waiting_tokens[j] + credit[j]) / thr + lam * u / (1.0 - u)
    if version == 1:
        return reps.kv_usage[j]
    if version == 2:
        return reps.loads[j, 0] + reps.waiting_tokens[j]
    return float(reqs[j])


@njit(**NJIT)
def p2c_kernel(pool, reps, params, carry, seed):
    """Two distinct replicas ``a`` (uniform) and ``b = (a + 1 + u) % k`` (``u`` uniform below
    ``k - 1``) among the ``k`` eligible; ``b`` wins only with a strictly lower metric. Metric by
    version: 0 ``expected_wait`` ``(waiting_tokens + credit) / throughput + kv_weight * u/(1-u)``
    (``u`` = KV usage clipped to [0, 0.999], ``credit`` = tokens placed on the replica this
    tick when optimistic); 1 ``token_usage`` (KV usage, no update); 2 ``tokens`` (``loads +
    waiting_tokens``, no update); 3 ``inflight`` (``running + waiting``, ``+1`` per pick)."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = free_slots.shape[0]
    optimistic = params[P_OPTIMISTIC] != 0.0
    version = int(params[P_VERSION])
    thr = params[P_THROUGHPUT]
    lam = params[P_KV_WEIGHT]
    credit = np.zeros(G)
    reqs = reps.n_running + reps.n_waiting
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    x = seed % (_MINSTD_M - 1) + 1
    elig = np.empty(G, np.int64)
    for i in range(n):
        k = 0
        for j in range(G):
            if cap[j] > 0:
                elig[k] = j
                k += 1
        if k == 0:
            break
        if k == 1:
            g = elig[0]
        else:
            x = (_MINSTD_A * x) % _MINSTD_M
            a = x % k
            x = (_MINSTD_A * x) % _MINSTD_M
            b = (a + 1 + x % (k - 1)) % k
            ma = _p2c_metric(reps, elig[a], version, credit, reqs, thr, lam)
            mb = _p2c_metric(reps, elig[b], version, credit, reqs, thr, lam)
            g = elig[a] if ma <= mb else elig[b]
        out[i] = g
        cap[g] -= 1
        if version == 3:
            reqs[g] += 1
        elif version == 0 and optimistic:
            credit[g] += prefill[i]
    return out, carry.copy()


def p2c_reference(pool, reps, params, carry, seed):
    """Power of two choices in plain Python (the same MINSTD stream)."""
    G = len(reps.free_slots)
    cap = [int(c) for c in reps.free_slots]
    optimistic = float(params[P_OPTIMISTIC]) != 0.0
    version = int(params[P_VERSION])
    thr, lam = float(params[P_THROUGHPUT]), float(params[P_KV_WEIGHT])
    credit = [0.0] * G
    reqs = [int(r) + int(w) for r, w in zip(reps.n_running, reps.n_waiting)]

    def metric(j):
        if version == 0:  # smg #2187: least_load's expected wait on the sampled pair
            u = min(max(float(reps.kv_usage[j]), 0.0), 0.999)
            return (float(reps.waiting_tokens[j]) + credit[j]) / thr + lam * u / (1.0 - u)
        if version == 1:  # mean KV token_usage of the poll
            return float(reps.kv_usage[j])
        if version == 2:  # the load monitor's cached token load
            return float(reps.loads[j][0]) + float(reps.waiting_tokens[j])
        return float(reqs[j])  # the router's own in-flight requests

    x = int(seed) % (_MINSTD_M - 1) + 1
    out = [-1] * len(pool.prefill)
    for i in range(len(pool.prefill)):
        elig = [j for j in range(G) if cap[j] > 0]
        if not elig:
            break
        if len(elig) == 1:
            g = elig[0]
        else:
            x = (_MINSTD_A * x) % _MINSTD_M
            a = x % len(elig)
            x = (_MINSTD_A * x) % _MINSTD_M
            b = (a + 1 + x % (len(elig) - 1)) % len(elig)
            g = elig[a] if metric(elig[a]) <= metric(elig[b]) else elig[b]
        out[i] = g
        cap[g] -= 1
        if version == 3:
            reqs[g] += 1
        elif version == 0 and optimistic:
            credit[g] += float(pool.prefill[i])
    return np.array(out, dtype=np.int64), np.array(carry, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# TensorRT-LLM attention-DP: longest prompt first, min-heap on (prompt tokens, requests, rank)
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def trtllm_kernel(pool, reps, params, carry, seed):
    """TensorRT-LLM's ``DefaultADPRouter``; the heap is an O(G) argmin over the same key.

    Tokens per rank: the active requests' ORIGINAL prompt lengths (``prompt_tokens`` plus the
    queued ``waiting_tokens``), not resident KV; requests: ``running + waiting``."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = free_slots.shape[0]
    optimistic = params[P_OPTIMISTIC] != 0.0
    tok = reps.prompt_tokens + reps.waiting_tokens
    req = reps.n_running + reps.n_waiting
    active = req.copy()
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    s_tot = 0
    total = 0
    mx = 0
    for g in range(G):
        s_tot += cap[g]
        total += active[g]
        if active[g] > mx:
            mx = active[g]
    n_new = min(n, s_tot)
    limit = max((total + n_new + G - 1) // G, mx)
    order = np.argsort(-prefill, kind="mergesort")
    for t in range(n):
        i = order[t]
        g = -1
        for j in range(G):
            if cap[j] <= 0 or active[j] >= limit:
                continue
            if g < 0 or tok[j] < tok[g] or (tok[j] == tok[g] and req[j] < req[g]):
                g = j
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        active[g] += 1
        if optimistic:
            tok[g] += prefill[i]
            req[g] += 1
    return out, carry.copy()


def trtllm_reference(pool, reps, params, carry, seed):
    """TensorRT-LLM's attention-DP balancer in plain Python with ``heapq``."""
    import heapq

    prefill = pool.prefill
    G = len(reps.free_slots)
    optimistic = float(params[P_OPTIMISTIC]) != 0.0
    cap = [int(c) for c in reps.free_slots]
    active = [int(r) + int(w) for r, w in zip(reps.n_running, reps.n_waiting)]
    tokens = [float(p) + float(w) for p, w in zip(reps.prompt_tokens, reps.waiting_tokens)]
    n_new = min(len(prefill), sum(cap))
    limit = max(-(-(sum(active) + n_new) // G), max(active))
    heap = [(tokens[g], active[g], g) for g in range(G) if cap[g] > 0 and active[g] < limit]
    heapq.heapify(heap)
    order = sorted(range(len(prefill)), key=lambda i: (-float(prefill[i]), i))
    out = [-1] * len(prefill)
    for i in order:
        if not heap:
            break
        tok, req, g = heapq.heappop(heap)
        out[i] = g
        cap[g] -= 1
        active[g] += 1
        if optimistic:
            tok, req = tok + float(prefill[i]), req + 1
        if cap[g] > 0 and active[g] < limit:
            heapq.heappush(heap, (tok, req, g))
    return np.array(out, dtype=np.int64), np.array(carry, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# TensorRT-LLM attention-DP balance: the same router, new requests held back until every rank
# can take some (timeout_iters), then a batching wait (batching_wait_iters)
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def trtllm_balance_kernel(pool, reps, params, carry, seed):
    """``trtllm``'s assignment, released or held back by ``attention_dp_config.enable_balance``
    (``PyExecutor._balance_adp_requests``); the two counters live in the carry."""
    out, _ = trtllm_kernel(pool, reps, params, carry, seed)
    G = reps.free_slots.shape[0]
    new = np.zeros(G, np.int64)
    for i in range(out.shape[0]):
        if out[i] >= 0:
            new[out[i]] += 1
    all_free = True
    all_ctx = True
    all_gen = True
    for g in range(G):
        all_free = all_free and reps.free_slots[g] > 0
        all_ctx = all_ctx and new[g] + reps.n_waiting[g] > 0
        all_gen = all_gen and reps.n_running[g] > 0
    wait = carry[C_ADP_WAIT]
    batch = carry[C_ADP_BATCH]
    release = True
    if all_free and all_ctx:
        wait = 0.0
        if all_gen:
            if batch < params[P_BATCHING_WAIT_ITERS]:
                batch += 1.0
                release = False
            else:
                batch = 0.0
    else:
        wait += 1.0
        release = False
        if wait >= params[P_TIMEOUT_ITERS] or not all_gen:
            wait = 0.0
            release = True
    if not release:
        out[:] = -1
    c = carry.copy()
    c[C_ADP_WAIT] = wait
    c[C_ADP_BATCH] = batch
    return out, c


def trtllm_balance_reference(pool, reps, params, carry, seed):
    """The hold-back in plain Python, written as upstream's branches."""
    out, _ = trtllm_reference(pool, reps, params, carry, seed)
    G = len(reps.free_slots)
    got = [sum(1 for g in out if g == r) for r in range(G)]
    have_free = all(int(f) > 0 for f in reps.free_slots)  # num_gen < max_batch_size
    have_ctx = all(got[r] + int(reps.n_waiting[r]) > 0 for r in range(G))
    have_gen = all(int(r) > 0 for r in reps.n_running)
    wait, batch = float(carry[C_ADP_WAIT]), float(carry[C_ADP_BATCH])
    held = False
    if have_free and have_ctx:  # wait for all ranks to have context requests
        wait = 0.0
        if have_gen:  # balance the number of context requests across ranks
            if batch < float(params[P_BATCHING_WAIT_ITERS]):
                batch += 1.0
                held = True
            else:
                batch = 0.0
    else:
        wait += 1.0
        held = True
        if wait >= float(params[P_TIMEOUT_ITERS]) or not have_gen:
            wait, held = 0.0, False
    if held:
        out = np.full(len(out), -1, dtype=np.int64)
    c = [float(v) for v in carry]
    c[C_ADP_WAIT], c[C_ADP_BATCH] = wait, batch
    return np.asarray(out, dtype=np.int64), np.array(c, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# SGLang follow_bootstrap_room: rank = bootstrap_room % G, whatever the load
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def follow_bootstrap_room_kernel(pool, reps, params, carry, seed):
    """Request ``i`` goes to replica ``key[i] % G`` when it has a free slot, else stays in the
    pool (it has no other rank: it waits for a slot on its own)."""
    key = pool.key
    n = key.shape[0]
    G = reps.free_slots.shape[0]
    cap = reps.free_slots.copy()
    out = np.full(n, -1, np.int64)
    for i in range(n):
        g = key[i] % G
        if cap[g] > 0:
            out[i] = g
            cap[g] -= 1
    return out, carry.copy()


def follow_bootstrap_room_reference(pool, reps, params, carry, seed):
    """``follow_bootstrap_room`` in plain Python."""
    G = len(reps.free_slots)
    cap = [int(c) for c in reps.free_slots]
    out = []
    for room in pool.key:
        g = int(room) % G  # SGLang: target_rank = req.bootstrap_room % len(self.workers)
        if cap[g] > 0:
            out.append(g)
            cap[g] -= 1
        else:
            out.append(-1)
    return np.array(out, dtype=np.int64), np.array(carry, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Dynamo KV router: overlap_weight * prefill blocks (cached prefix credited) + decode blocks
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def dynamo_kernel(pool, reps, params, carry, seed):
    """Dynamo's ``DefaultWorkerSelector`` at temperature 0: the lowest ``w * (s - B *
    floor(cached / B)) / B + (loads + waiting_tokens) / B + ceil(s / B)``, ties to a uniform
    one of the tied (one MINSTD draw, only when two or more tie); optimistic: ``loads += s``."""
    prefill = pool.prefill
    cached = pool.cached
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = free_slots.shape[0]
    optimistic = params[P_OPTIMISTIC] != 0.0
    B = params[P_BLOCK_SIZE]
    w = params[P_OVERLAP_WEIGHT]
    has_cache = cached.shape[0] == n
    act = reps.loads[:, 0] + reps.waiting_tokens
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    tied = np.empty(G, np.int64)
    x = seed % (_MINSTD_M - 1) + 1
    for i in range(n):
        s = prefill[i]
        nt = 0
        best = np.inf
        for j in range(G):
            if cap[j] <= 0:
                continue
            hit = 0.0
            if has_cache:
                hit = min(np.floor(cached[i, j] / B) * B, s)
            logit = w * ((s - hit) / B) + (act[j] / B + np.ceil(s / B))
            if logit < best:
                best = logit
                nt = 0
            if logit == best:
                tied[nt] = j
                nt += 1
        if nt == 0:
            break
        g = tied[0]
        if nt > 1:
            x = (_MINSTD_A * x) % _MINSTD_M
            g = tied[x % nt]
        out[i] = g
        cap[g] -= 1
        if optimistic:
            act[g] += s
    return out, carry.copy()


def dynamo_reference(pool, reps, params, carry, seed):
    """Dynamo's KV-router cost in plain Python."""
    n, G = len(pool.prefill), len(reps.free_slots)
    B, w = float(params[P_BLOCK_SIZE]), float(params[P_OVERLAP_WEIGHT])
    optimistic = float(params[P_OPTIMISTIC]) != 0.0
    cached = pool.cached if len(pool.cached) == n else None
    act = [float(row[0]) + float(t) for row, t in zip(reps.loads, reps.waiting_tokens)]
    cap = [int(c) for c in reps.free_slots]
    x = int(seed) % (_MINSTD_M - 1) + 1
    out = [-1] * n
    for i, s in enumerate(float(v) for v in pool.prefill):
        logits = {}
        for j in range(G):
            if cap[j] > 0:
                hit = 0.0 if cached is None else min(math.floor(float(cached[i][j]) / B) * B, s)
                prefill_blocks = (s - hit) / B  # new prefill tokens / block size
                decode_blocks = act[j] / B + math.ceil(s / B)  # active + the request's own
                logits[j] = w * prefill_blocks + decode_blocks
        if not logits:
            break
        low = min(logits.values())
        tied = [j for j in sorted(logits) if logits[j] == low]
        g = tied[0]
        if len(tied) > 1:
            x = (_MINSTD_A * x) % _MINSTD_M
            g = tied[x % len(tied)]
        out[i] = g
        cap[g] -= 1
        if optimistic:
            act[g] += s
    return np.array(out, dtype=np.int64), np.array(carry, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# BR-S (the library's default): an age window, margin-first F-score, and JSQ as a safety net
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def _post_imbalance(loads0, prefill, out):
    """``G*max L - sum L`` of ``loads0`` plus each placed request's prefill (pool order)."""
    G = loads0.shape[0]
    L = loads0.copy()
    for i in range(out.shape[0]):
        if out[i] >= 0:
            L[out[i]] += prefill[i]
    mx = L[0]
    tot = 0.0
    for g in range(G):
        tot += L[g]
        if L[g] > mx:
            mx = L[g]
    return G * mx - tot


@njit(**NJIT)
def brs_kernel(pool, reps, params, carry, seed):
    """BR-S; see ``route_batch`` for the full statement (and THEOREMS.md R7-R8)."""
    s = pool.prefill
    wait = pool.wait
    n = s.shape[0]
    G = reps.loads.shape[0]
    A = params[P_AGE_WINDOW]
    optimistic = params[P_OPTIMISTIC] != 0.0
    Gf = float(G)
    L0 = reps.loads[:, 0].copy()
    L = L0.copy()
    req = reps.n_running + reps.n_waiting
    cap = reps.free_slots.copy()
    kv = reps.kv_capacity
    kv_load = L0.copy()  # what the replica holds, updated by every placement
    kv_run = reps.n_running.copy()
    out = np.full(n, -1, np.int64)
    s_tot = 0
    for g in range(G):
        s_tot += cap[g]
    w_max = -1
    for i in range(n):
        if wait[i] > w_max:
            w_max = wait[i]
    if w_max < params[P_PATIENCE]:
        # Not saturated: nobody has waited long; JSQ's decision itself.
        return jsq_kernel(pool, reps, params, carry, seed)
    fitted = False
    if n <= s_tot:
        # Every visible request gets a slot: longest first, each onto JSQ's replica. If the
        # KV capacity keeps one out, the tick is routed as a scarce one instead (below), so
        # that no request is passed over by a younger one outside the age window.
        order = np.argsort(-s, kind="mergesort")
        fitted = True
        for t in range(n):
            i = order[t]
            g = -1
            for j in range(G):
                if cap[j] <= 0 or kv_load[j] + s[i] + kv_run[j] + 1.0 > kv[j]:
                    continue
                if g < 0 or L[j] < L[g] or (L[j] == L[g] and req[j] < req[g]):
                    g = j
            if g < 0:
                fitted = False
                break
            out[i] = g
            cap[g] -= 1
            kv_load[g] += s[i]
            kv_run[g] += 1
            if optimistic:
                L[g] += s[i]
                req[g] += 1
        if not fitted:
            for i in range(n):
                out[i] = -1
            L[:] = L0
            req = reps.n_running + reps.n_waiting
            cap = reps.free_slots.copy()
            kv_load[:] = L0
            kv_run = reps.n_running.copy()
    if not fitted:
        # Slots are scarce: the replica with the largest margin takes, from the age window,
        # the request with the best F-score against its margin per free slot. The window:
        # waits >= the oldest live request's - A, and only the k * S_tot oldest; it is set at
        # the start and again whenever every request in it has been placed.
        live = np.ones(n, np.bool_)
        n_live = n
        theta = 0
        in_window = 0
        while n_live > 0 and s_tot > 0:
            if in_window == 0:
                w_old = -1
                for i in range(n):
                    if live[i] and wait[i] > w_old:
                        w_old = wait[i]
                # the window's span: a fraction of the oldest's wait, at most A ticks
                span = math.floor(params[P_AGE_FRACTION] * w_old)
                if span > A:
                    span = A
                theta = w_old - span
                kk = int(params[P_WINDOW]) * s_tot
                if kk > 0 and kk < n_live:
                    w_live = np.empty(n_live, np.int64)
                    q = 0
                    for i in range(n):
                        if live[i]:
                            w_live[q] = wait[i]
                            q += 1
                    w_live.sort()
                    if w_live[n_live - kk] > theta:
                        theta = w_live[n_live - kk]
                in_window = 0
                for i in range(n):
                    if live[i] and wait[i] >= theta:
                        in_window += 1
            M = L[0]
            for j in range(1, G):
                if L[j] > M:
                    M = L[j]
            g = -1
            for j in range(G):
                if cap[j] <= 0:
                    continue
                if g < 0 or L[j] < L[g] or (L[j] == L[g] and cap[j] > cap[g]):
                    g = j
            target = (M - L[g]) / cap[g]
            best = -1
            best_f = 0.0
            for i in range(n):
                if not live[i] or wait[i] < theta:
                    continue
                if kv_load[g] + s[i] + kv_run[g] + 1.0 > kv[g]:
                    continue
                f = s[i] - Gf * max(s[i] - target, 0.0)
                if best < 0 or f > best_f or (f == best_f and wait[i] > wait[best]):
                    best = i
                    best_f = f
            if best < 0:
                # nothing in the window fits its KV: this replica takes no more this tick
                s_tot -= cap[g]
                cap[g] = 0
                continue
            out[best] = g
            live[best] = False
            n_live -= 1
            in_window -= 1
            cap[g] -= 1
            s_tot -= 1
            kv_load[g] += s[best]
            kv_run[g] += 1
            if optimistic:
                L[g] += s[best]
    if params[P_SAFE] != 0.0:
        # The safety net: JSQ's own decision whenever it leaves no larger imbalance.
        j_out, _ = jsq_kernel(pool, reps, params, carry, seed)
        if _post_imbalance(L0, s, j_out) <= _post_imbalance(L0, s, out):
            out = j_out
    return out, carry.copy()


def brs_reference(pool, reps, params, carry, seed):
    """BR-S in plain Python (sorted, min/max with key tuples, the JSQ reference)."""
    s = [float(x) for x in pool.prefill]
    wait = [int(w) for w in pool.wait]
    n, G = len(s), len(reps.free_slots)
    A = float(params[P_AGE_WINDOW])
    optimistic = float(params[P_OPTIMISTIC]) != 0.0
    L0 = [float(row[0]) for row in reps.loads]
    L = list(L0)
    req = [int(a) + int(b) for a, b in zip(reps.n_running, reps.n_waiting)]
    cap = [int(c) for c in reps.free_slots]
    kv = [float(c) for c in reps.kv_capacity]
    kv_load, kv_run = list(L0), [int(r) for r in reps.n_running]
    out = [-1] * n
    if n == 0 or max(wait) < float(params[P_PATIENCE]):
        return jsq_reference(pool, reps, params, carry, seed)

    def fits(i, g):
        return cap[g] > 0 and kv_load[g] + s[i] + kv_run[g] + 1.0 <= kv[g]

    def place(i, g):
        out[i] = g
        cap[g] -= 1
        kv_load[g] += s[i]
        kv_run[g] += 1
        if optimistic:
            L[g] += s[i]
            req[g] += 1

    fitted = False
    if n <= sum(cap):
        fitted = True
        for i in sorted(range(n), key=lambda i: (-s[i], i)):  # longest first
            elig = [g for g in range(G) if fits(i, g)]
            if not elig:
                fitted = False
                break
            place(i, min(elig, key=lambda g: (L[g], req[g], g)))
        if not fitted:  # a KV limit keeps one out: route the tick as a scarce one
            out = [-1] * n
            L = list(L0)
            req = [int(a) + int(b) for a, b in zip(reps.n_running, reps.n_waiting)]
            cap = [int(c) for c in reps.free_slots]
            kv_load, kv_run = list(L0), [int(r) for r in reps.n_running]
    if not fitted:
        live = list(range(n))
        window: list[int] = []
        while live and sum(cap) > 0:
            if not [i for i in live if i in window]:
                # (re)open the window on the live requests
                w_old = max(wait[i] for i in live)
                theta = w_old - min(A, math.floor(float(params[P_AGE_FRACTION]) * w_old))
                k_oldest = int(params[P_WINDOW]) * sum(cap)
                if 0 < k_oldest < len(live):
                    theta = max(theta, sorted((wait[i] for i in live), reverse=True)[k_oldest - 1])
                window = [i for i in live if wait[i] >= theta]
            M = max(L)
            g = min((j for j in range(G) if cap[j] > 0), key=lambda j: (L[j], -cap[j], j))
            target = (M - L[g]) / cap[g]
            here = [i for i in live if i in window and fits(i, g)]
            if not here:
                cap[g] = 0
                continue

            def key(i, t=target):
                return (s[i] - float(G) * max(s[i] - t, 0.0), wait[i], -i)

            best = max(here, key=key)
            place(best, g)
            live.remove(best)
    if float(params[P_SAFE]) != 0.0:
        j_out = [int(x) for x in jsq_reference(pool, reps, params, carry, seed)[0]]

        def post(a):
            loads = list(L0)
            for i, g in enumerate(a):
                if g >= 0:
                    loads[g] += s[i]
            tot = 0.0
            for x in loads:
                tot += x
            return float(G) * max(loads) - tot

        if post(j_out) <= post(out):
            out = j_out
    return np.array(out, dtype=np.int64), np.array(carry, dtype=np.float64)


# --------------------------------------------------------------------------------------------
# Projected loads over the horizon (BR-H)
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def project_loads_kernel(replica, tokens, presence, n_replicas, horizon, refill=0.0):
    """``out[g, h] = sum_{i on g} w_ih * (tokens_i + h) + (1 - w_ih) * refill``, ``h = 0..H``,
    with ``w_ih = clip(c_i - h, 0, 1)``.

    ``tokens_i = prompt_i + decoded_i`` (resident now), ``c_i`` = expected presence (steps),
    ``refill`` = tokens of the request expected to take a slot once its request left (0: the
    paper's projection, where a freed slot stays empty).
    """
    out = np.zeros((n_replicas, horizon + 1))
    for i in range(replica.shape[0]):
        g = replica[i]
        for h in range(horizon + 1):
            w = min(max(presence[i] - h, 0.0), 1.0)
            if w > 0.0:
                out[g, h] += w * (tokens[i] + h)
            if refill > 0.0 and w < 1.0:
                out[g, h] += (1.0 - w) * refill
    return out


def project_loads_reference(replica, tokens, presence, n_replicas, horizon, refill=0.0):
    """Projected loads in plain Python."""
    out = [[0.0] * (horizon + 1) for _ in range(n_replicas)]
    for g, tk, c in zip(replica, tokens, presence):
        for h in range(horizon + 1):
            w = min(max(float(c) - h, 0.0), 1.0)
            if w > 0.0:
                out[int(g)][h] += w * (float(tk) + h)
            if refill > 0.0 and w < 1.0:
                out[int(g)][h] += (1.0 - w) * float(refill)
    return np.array(out, dtype=np.float64).reshape(n_replicas, horizon + 1)


@njit(**NJIT)
def tick_summary_kernel(loads, prefill, assignment):
    """``(I_before, I_after, loads_after, n_placed)`` on current loads ``loads[:, 0]``:
    ``loads_after`` adds each placed request's prefill to its replica (no reference needed: the
    tests compare it with :func:`straggler.formulations.routing.imbalance`)."""
    G = loads.shape[0]
    L = loads[:, 0].copy()
    before_max = L.max()
    before = G * before_max - L.sum()
    placed = 0
    for i in range(assignment.shape[0]):
        if assignment[i] >= 0:
            L[assignment[i]] += prefill[i]
            placed += 1
    after = G * L.max() - L.sum()
    return before, after, L, placed


#: Codes of :func:`check_inputs_kernel`: the parameter of ``route_batch`` at fault.
BAD_INPUT = (
    "",
    "prefill_lengths",
    "loads",
    "free_slots",
    "n_running",
    "n_waiting",
    "prompt_tokens",
    "waiting_tokens",
    "kv_usage",
    "kv_capacity",
    "pool_wait",
    "pool_cached",
    "pool_key",
)


@njit(**NJIT)
def _bad_tokens(x):
    """Flat index of the first value of ``x`` outside ``[0, MAX_TOKENS]`` (NaN included), -1."""
    v = x.ravel()
    for i in range(v.shape[0]):
        if not (v[i] >= 0.0 and v[i] <= MAX_TOKENS):
            return i
    return -1


@njit(**NJIT)
def _bad_count(x):
    """Index of the first negative entry of an int64 vector, -1."""
    for i in range(x.shape[0]):
        if x[i] < 0:
            return i
    return -1


@njit(**NJIT)
def check_inputs_kernel(pool, reps):
    """``(code, index)``: ``(0, -1)`` when every value is valid, else the first bad array (its
    code in :data:`BAD_INPUT`) and the flat index of its first bad value, in one pass.

    Token arrays (prefill, loads, prompt and waiting tokens, cached) must lie in
    ``[0, MAX_TOKENS]``; counts must be ``>= 0``; the free slots must also sum to at most
    ``2**63 - 1`` (index: where the running sum would overflow); ``kv_usage`` finite
    ``>= 0``; ``kv_capacity > 0`` (``inf`` allowed); request keys ``>= 0``.
    """
    i = _bad_tokens(pool.prefill)
    if i >= 0:
        return 1, i
    i = _bad_tokens(reps.loads)
    if i >= 0:
        return 2, i
    total = 0
    free = reps.free_slots
    for g in range(free.shape[0]):
        if free[g] < 0 or free[g] > 9223372036854775807 - total:
            return 3, g
        total += free[g]
    i = _bad_count(reps.n_running)
    if i >= 0:
        return 4, i
    i = _bad_count(reps.n_waiting)
    if i >= 0:
        return 5, i
    i = _bad_tokens(reps.prompt_tokens)
    if i >= 0:
        return 6, i
    i = _bad_tokens(reps.waiting_tokens)
    if i >= 0:
        return 7, i
    u = reps.kv_usage
    for g in range(u.shape[0]):
        if not (u[g] >= 0.0 and u[g] < np.inf):
            return 8, g
    c = reps.kv_capacity
    for g in range(c.shape[0]):
        if not (c[g] > 0.0):
            return 9, g
    i = _bad_count(pool.wait)
    if i >= 0:
        return 10, i
    i = _bad_tokens(pool.cached)
    if i >= 0:
        return 11, i
    i = _bad_count(pool.key)
    if i >= 0:
        return 12, i
    return 0, -1


@njit(**NJIT)
def route_tick_kernel(policy_id, pool, reps, params, carry, seed):
    """The kernel of policy ``policy_id`` (an ``ID_*`` constant), for callers inside jitted
    code (the simulator) and for :func:`route_batch_kernel`."""
    if policy_id == ID_BR0:
        return br0_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_BRH:
        return brh_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_ROUND_ROBIN:
        return round_robin_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_RANDOM:
        return random_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_JSQ:
        return jsq_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_JSQ_REQUESTS:
        return jsq_requests_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_VLLM:
        return vllm_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_P2C:
        return p2c_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_TRTLLM:
        return trtllm_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_BRS:
        return brs_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_TRTLLM_BALANCE:
        return trtllm_balance_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_FOLLOW_BOOTSTRAP_ROOM:
        return follow_bootstrap_room_kernel(pool, reps, params, carry, seed)
    elif policy_id == ID_DYNAMO:
        return dynamo_kernel(pool, reps, params, carry, seed)
    # unknown id (the registry never passes one): route nothing
    return np.full(pool.prefill.shape[0], -1, np.int64), carry.copy()


@njit(**NJIT)
def route_batch_kernel(
    policy_id,
    prefill,
    wait,
    key,
    cached,
    loads,
    free_slots,
    n_running,
    n_waiting,
    prompt_tokens,
    waiting_tokens,
    kv_usage,
    kv_capacity,
    params,
    carry,
    seed,
):
    """One call for ``route_batch``: value check, the policy's kernel, the tick summary.

    Takes the fields of :class:`PoolState` and :class:`ReplicaState` as flat arrays (cheaper to
    pass from Python than two tuples). Returns ``(code, index, assignment, carry_out,
    I_before, I_after, loads_after, n_placed, S_tot)``; ``(code, index)`` as in
    :func:`check_inputs_kernel` (nothing is routed when ``code != 0``); ``S_tot`` = total free
    slots at the start of the tick.
    """
    pool = PoolState(prefill, wait, key, cached)
    reps = ReplicaState(
        loads,
        free_slots,
        n_running,
        n_waiting,
        prompt_tokens,
        waiting_tokens,
        kv_usage,
        kv_capacity,
    )
    code, index = check_inputs_kernel(pool, reps)
    if code != 0:
        empty = np.full(prefill.shape[0], -1, np.int64)
        return code, index, empty, carry.copy(), 0.0, 0.0, loads[:, 0].copy(), 0, 0, 0
    t0 = monotonic_ns()
    out, new_carry = route_tick_kernel(policy_id, pool, reps, params, carry, seed)
    before, after, loads_after, placed = tick_summary_kernel(loads, prefill, out)
    ns = monotonic_ns() - t0
    s_tot = 0
    for g in range(free_slots.shape[0]):
        s_tot += free_slots[g]
    return 0, -1, out, new_carry, before, after, loads_after, placed, s_tot, ns
