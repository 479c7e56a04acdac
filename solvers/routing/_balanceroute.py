r"""BalanceRoute's policies: BR-0, BR-H and BR-S (this library's default), each Numba kernel
with its plain-Python reference below it, their options and memory, and the projected loads
BR-H reads.

BR-0 and BR-H follow BalanceRoute (Tackling the Data-Parallel Load Balancing Bottleneck in LLM
Serving: Practical Online Routing at Scale, arXiv 2605.06113), key designs 1 (the asymmetric
F-score), 2 (the capacity-adaptive two stages) and 3 (the short-horizon discounted F-score,
BR-H); BR-S is this library's (the F-score within an age window, SGLang's ``total_tokens``
decision as its safety net). The kernel signature and the records are those of
:mod:`straggler.solvers.routing._core`; :func:`~straggler.solvers.route_batch` runs them.

``br0``
    On current loads ``L = loads[:, 0]``, ``M = max L``, margins ``m_g = M - L_g``, F-score
    ``F_g(Q) = D(Q) - G*(D(Q) - m_g)_+`` (key design 1). Until the pool is empty or no free
    slot is left, repeat (key design 2):

    1. Pop the replica ``g`` with a free slot that is largest in ``(cap_g, m_g)``
       (lexicographic; ties to the lowest index). Each placement can raise ``M`` and so
       moves every margin, but not their order: the replicas with the most free slots are
       sorted by load once, and a pop reads the first of them (and any with an equal margin).
    2. Rank the pool by the single score ``F_g({i})``, descending, ties to the lower pool
       index (older request first).
    3. **Stage 1**, while the total free slots ``S_tot > S_greedy``: place the top-ranked
       request on ``g``.
       **Stage 2**, otherwise: candidates are the top ``R_max`` of the ranking; search every
       subset ``Q`` with ``1 <= |Q| <= min(cap_g, R_max)`` for the largest ``F_g(Q)``; subsets
       are visited by size, then in lexicographic order of candidate ranks, and the first
       maximum is kept (so ties go to fewer requests, then to better-ranked ones). If the best
       score is ``<= 0`` the starvation guard places the top-ranked request alone.
    4. Optimistic update (``optimistic=True``, default): ``L_g += D(Q)``, ``M = max(M, L_g)``,
       all margins recomputed from the new ``M``; ``cap_g -= |Q|``.

    Every pop places at least one request, so a tick places ``min(n_pool, S_tot)`` requests.
    Options: ``r_max`` (``R_max``, Stage-2 candidates, 1..16, default 4, the paper's
    example), ``s_greedy`` (Stage-1 threshold, default :func:`default_s_greedy` ``= G *
    r_max``), ``optimistic``.
``brh``
    Key design 3: ``loads`` is ``(G, H+1)`` projected loads (see
    :func:`~straggler.solvers.routing.route.project_loads`), margin vectors ``m_{g,h} =
    max_g' L_{g',h} - L_{g,h}``, discount ``d = (1, gamma, ..., gamma^H)``, score ``F_g(Q) =
    alpha*(1'd)*D - beta*((D*1 - m_g)_+)'d`` (``beta`` defaults to ``G``). Same two stages; the
    replica key is ``(cap_g, d'm_g)`` and the update adds ``D(Q)`` to every column of ``g``.
    With ``H = 0, alpha = 1, beta = G`` it makes exactly BR-0's decisions (Theorem R3). Two
    options beyond the paper, both off by default: ``new_presence=pi`` (its vector option,
    ``opts.vector``) weighs column ``h`` by the probability ``pi_h`` that a request placed now
    is still resident then (``d_h = gamma^h * pi_h``;
    :func:`~straggler.solvers.routing.route.new_request_presence`), and ``project_loads(...,
    refill=...)`` lets a slot freed within the horizon hold a new request instead of staying
    empty (the study behind them: ``benchmarks/routing_table.py``). Options: BR-0's, ``alpha``,
    ``beta``, ``gamma`` (in (0, 1]), ``new_presence``.
``brs`` (not in the paper)
    JSQ's decision while there is no backlog. A backlog starts at the tick where some visible
    request has waited ``patience`` ticks (default 128: longer than the bursts below
    saturation, see ``benchmarks/routing_load_sweep.py``) and lasts, through its memory
    (``backlog``; pass ``extras["carry"]`` back), until a tick whose visible pool fits in the
    free slots (that tick is still routed as a backlog one). In a backlog: when every visible
    request has a slot, longest first onto JSQ's replica; when slots are scarce, the replica
    with the largest margin takes, from an age window, the request with the best F-score
    against its margin per free slot; the window holds the requests that entered the pool at
    most ``min(age_window, age_fraction * w*)`` ticks after the oldest waiting one (``w*``;
    defaults ``ceil(4096/G)`` and 0.1), cut to the ``window * S_tot`` oldest (default 8 per
    free slot). Safety net (``safe=True``): JSQ's own decision is kept whenever it leaves no
    larger imbalance. So one tick never leaves a larger imbalance than JSQ's (THEOREMS.md R7),
    and no request is placed while one that entered the pool more than ``age_window`` ticks
    before it waits (R8: the pool-wait bound; ``pool_wait`` gives the ticks waited). It reads
    KV room (``kv_capacity``) and places nothing that would not fit. The measured behaviour
    across loads: ``benchmarks/routing_load_sweep.py``.

Cost per tick, ``P`` placements (``P2`` in Stage 2): BR-0 ``O(n + P*(G + R_max log n) +
P2*2^R_max)`` (the pool is radix-sorted once; the ranking merges two walks from the margin,
Theorem R2, over a bitset of live positions; a Stage-1 pop is one binary search and a few
bitset look-ups, ``n <= 4096`` needing one summary word; the replica of a pop costs ``O(1)``
amortized when all replicas start with the same free slots and distinct loads: one insertion
sort of the ``G`` replicas per ``G`` pops, ``O(G)`` a pop at worst, as in ties); BR-H
``O(P*(G*H + e*H))`` with ``e`` the requests evaluated by its two walks from the peak of the
concave score (all of them in the worst case). The kernels equal their plain-Python references
(which rank the whole pool on every pop) decision for decision.

Deviations from the paper: it states neither ``S_greedy`` nor the candidate order nor the
tie-breaks; the choices above are ours. The replica key ``(cap_g, m_g)`` is read as
lexicographic (free slots first), as the paper writes the tuple.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from ...formulations.validation import check_array, check_bool, check_int, check_real
from .. import _order
from .._numba.jit import NJIT, NJIT_INLINE, cache_depends_on
from .._order import radix_order as _radix_order
from .._order import stable_argsort as _stable_argsort
from .._order import stable_argsort_desc as _stable_argsort_desc
from .._order import stable_argsort_float as _stable_argsort_float
from . import _core as _routing_core
from ._core import (
    PolicyOption,
    carry_slots,
    least_tokens_kernel,
    least_tokens_reference,
    option_slots,
    with_carry,
)
from .policy import OPTIMISTIC, routing_policy

__all__ = [
    "BR0",
    "BRH",
    "BRS",
    "BRSCarry",
    "default_s_greedy",
    "default_age_window",
    "best_subset_kernel",
    "br0_kernel",
    "br0_reference",
    "brh_kernel",
    "brh_reference",
    "brs_kernel",
    "brs_reference",
    "project_loads_kernel",
    "project_loads_reference",
]

# --------------------------------------------------------------------------------------------
# The policies' options and memory
# --------------------------------------------------------------------------------------------

_BIG = 1e300  # alpha and beta must be finite


def default_s_greedy(n_replicas: int, r_max: int) -> int:
    """``S_greedy = G * R_max`` (the paper gives no value).

    Below it each replica has on average at most ``R_max`` free slots, so one Stage-2 pop per
    replica (a subset of at most ``R_max`` requests) can use every slot; this is where slots
    are scarce and each one should be chosen by subset search. Above it, margins are filled
    greedily (Stage 1) at O(G + log n) per placement.

    Examples
    --------
    >>> default_s_greedy(16, 4)
    64
    """
    return int(n_replicas) * int(r_max)


def default_age_window(n_replicas: int) -> int:
    """BR-S's default age window ``A = ceil(4096 / G)`` ticks (512 at G = 8, 128 at G = 32).

    Arrivals per tick grow with ``G`` at a given load, so the window holds about the same
    number of requests at every cluster size, while the extra pool wait it allows (at most
    ``A`` ticks past the requests that entered with it) shrinks as the queueing tail does.

    Examples
    --------
    >>> default_age_window(8), default_age_window(32), default_age_window(1)
    (512, 128, 4096)
    """
    return -(-4096 // int(n_replicas))


R_MAX = PolicyOption(
    "r_max", lambda v, f: check_int(v, "r_max", f, lo=1, hi=16), 4,
    "Stage-2 candidates R_max, 1..16",
)  # fmt: skip
S_GREEDY = PolicyOption(
    "s_greedy",
    lambda v, f: check_real(v, "s_greedy", f, lo=0, finite=False),
    lambda G, r: float(default_s_greedy(G, r["r_max"])),
    "Stage 1 runs while the total free slots exceed it (default G * r_max)",
)
ALPHA = PolicyOption(
    "alpha", lambda v, f: check_real(v, "alpha", f, lo=0, hi=_BIG, lo_open=True), 1.0,
    "BR-H gain weight (> 0)",
)  # fmt: skip
BETA = PolicyOption(
    "beta", lambda v, f: check_real(v, "beta", f, lo=0, hi=_BIG), lambda G, r: float(G),
    "BR-H overflow weight (default G)",
)  # fmt: skip
GAMMA = PolicyOption(
    "gamma", lambda v, f: check_real(v, "gamma", f, lo=0, hi=1, lo_open=True), 1.0,
    "BR-H discount per step, in (0, 1]",
)  # fmt: skip
NEW_PRESENCE = PolicyOption(
    "new_presence",
    lambda v, f: check_array(v, "new_presence", f, kind="real", lo=0, hi=1),
    None,
    "BR-H: H+1 weights pi_h in [0, 1] of the new requests' presence (default none)",
    to="vector",
)
AGE_WINDOW = PolicyOption(
    "age_window",
    lambda v, f: check_int(v, "age_window", f, lo=0, hi=2**40),
    lambda G, r: default_age_window(G),
    "BR-S: place a request only if it entered the pool at most this many ticks after the "
    "oldest request still waiting (the bound on overtaking)",
)
WINDOW = PolicyOption(
    "window",
    lambda v, f: check_int(v, "window", f, lo=0, hi=2**20),
    8,
    "BR-S: candidates per free slot (the window holds the k * S_tot oldest requests; 0: no "
    "count limit)",
)
PATIENCE = PolicyOption(
    "patience",
    lambda v, f: check_int(v, "patience", f, lo=0, hi=2**40),
    128,
    "BR-S: route as JSQ until some visible request has waited this many ticks (a backlog, not "
    "a burst); the backlog lasts until the visible pool fits the free slots",
)
AGE_FRACTION = PolicyOption(
    "age_fraction",
    lambda v, f: check_real(v, "age_fraction", f, lo=0, hi=1),
    0.1,
    "BR-S: the window spans this fraction of the oldest request's wait (at most age_window ticks)",
)
SAFE = PolicyOption(
    "safe",
    lambda v, f: check_bool(v, "safe", f),
    True,
    "BR-S: keep JSQ's decision whenever it leaves no larger one-tick imbalance",
)

#: Each policy's options, in their order of resolution; their slots in ``opts.values``.
BR0_OPTIONS = (R_MAX, S_GREEDY, OPTIMISTIC)
BRH_OPTIONS = (R_MAX, S_GREEDY, ALPHA, BETA, GAMMA, OPTIMISTIC, NEW_PRESENCE)
BRS_OPTIONS = (OPTIMISTIC, AGE_WINDOW, WINDOW, PATIENCE, AGE_FRACTION, SAFE)
_B0 = option_slots(BR0_OPTIONS)
_BH = option_slots(BRH_OPTIONS)
_BS = option_slots(BRS_OPTIONS)


class BRSCarry(NamedTuple):
    """BR-S's memory from one tick to the next."""

    backlog: bool
    """True while a backlog lasts (entered at ``patience``, left when the visible pool fits)."""


_BSC = carry_slots(BRSCarry)

# --------------------------------------------------------------------------------------------
# BR-0 (BalanceRoute, arXiv 2605.06113: the F-score and the capacity-adaptive two stages)
# --------------------------------------------------------------------------------------------


@njit(**NJIT_INLINE)
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
            if not _next_combination(comb, size, nc):
                break
    return best_f, n_best


@njit(**NJIT)
def _next_combination(comb, size, n):
    """Advance ``comb[:size]`` (increasing ranks in ``range(n)``) to the next ``size``-subset
    in lexicographic order; ``False`` after the last one."""
    j = size - 1
    while j >= 0 and comb[j] == n - size + j:
        j -= 1
    if j < 0:
        return False
    comb[j] += 1
    for t in range(j + 1, size):
        comb[t] = comb[t - 1] + 1
    return True


@njit(**NJIT_INLINE)
def _kth_largest(w, k):
    """The ``k``-th largest (``1 <= k <= len(w)``) of int64 ``w``: ``np.sort(w)[len(w) - k]``,
    by :func:`_radix_order` of ``w`` with its sign bit flipped (unsigned order = signed order)."""
    n = w.shape[0]
    keys = np.empty(n, np.int64)
    flip = np.int64(-9223372036854775808)
    for i in range(n):
        keys[i] = w[i] ^ flip
    return w[_radix_order(keys)[n - k]]


_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_ONE = np.uint64(1)


@intrinsic
def _count_trailing_zeros(typingctx, x):
    """LLVM's ``cttz`` of an integer, as int64 (jitted code only)."""

    def codegen(context, builder, signature, args):
        return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

    return types.int64(x), codegen


@intrinsic
def _count_leading_zeros(typingctx, x):
    """LLVM's ``ctlz`` of an integer, as int64 (jitted code only)."""

    def codegen(context, builder, signature, args):
        return builder.ctlz(args[0], ir.Constant(ir.IntType(1), 0))

    return types.int64(x), codegen


def _low_bit(x):
    """Index of the lowest set bit of a non-zero uint64 (in jitted code: one ``tzcnt``)."""
    x = int(x)
    return (x & -x).bit_length() - 1


def _high_bit(x):
    """Index of the highest set bit of a non-zero uint64 (in jitted code: one ``lzcnt``)."""
    return int(x).bit_length() - 1


@overload(_low_bit)
def _low_bit_jit(x):
    return lambda x: _count_trailing_zeros(x)


@overload(_high_bit)
def _high_bit_jit(x):
    return lambda x: 63 - _count_leading_zeros(x)


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


@njit(**NJIT_INLINE)
def _count_at_most(sv, x):
    """``np.searchsorted(sv, x, side="right")`` for ascending ``sv`` and ``x`` without NaN:
    the number of entries ``<= x``, by binary search (numba's ``searchsorted`` compiles its
    ``side`` string handling and NaN-aware comparisons, about a third of a second)."""
    lo = 0
    hi = sv.shape[0]
    while lo < hi:
        mid = (lo + hi) >> 1
        if sv[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(**NJIT_INLINE)
def _br0_candidates(sv, order, run_start, words, summary, mg, Gf, k, cand, cand_f):
    """The ``k`` live requests with the largest ``F(s) = s - G*(s - m)_+``, ties to lower index.

    For ``G >= 2``, ``F`` increases (slope 1) up to the margin and strictly decreases (slope
    ``1-G``) above it, so the ranking merges two sorted walks from the margin: downward over
    ``s <= m`` (each run of equal ``s`` in index order) and upward over ``s > m``.
    """
    n = sv.shape[0]
    p = _count_at_most(sv, mg)  # first position with s > m
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
def br0_kernel(pool, reps, opts, carry, seed):
    """BR-0 on current loads ``loads[:, 0]``; see the module docstring for the full statement.

    Data structures (the decisions are those of :func:`br0_reference`, which re-ranks the
    whole pool on every pop): the pool is sorted once by ``(s, index)`` (stable radix sort);
    live requests are a two-level bitset over sorted positions. A Stage-1 pop needs only the
    best single request: the largest live ``s <= m`` (``F = s``; the lowest index of its run)
    against the smallest live ``s > m`` (``F = s - G*(s - m)``), found by a binary search for
    the margin and two bitset look-ups (``O(log n)``); when every live ``s`` is ``<= m``, the
    largest live one wins without a search. The replica of a pop is the one with the most
    free slots, then the largest margin, then the lowest index. The replicas holding the
    largest free-slot count (a level) are sorted by load once, when the level starts (an
    insertion sort, ties by index); a pop removes one of them and changes only its own load, so
    the order holds for the level's other replicas. Margins ``M - L`` are non-increasing along
    it (rounding is monotone, whatever ``M``), so the replicas of the largest margin are a
    prefix of it: the pop reads the first, and the next ones only while their margin is equal
    (the lowest index among them wins, as in the reference's key).
    """
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = loads.shape[0]
    r_max = int(opts.values[_B0.r_max])
    s_greedy = opts.values[_B0.s_greedy]
    optimistic = opts.optimistic
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
    top = n - 1  # Stage 1: the largest live position, or a placed one above it
    level = np.empty(G, np.int64)  # replicas with the most free slots, by (load, index) ...
    head = 0  # ... from level[head]
    n_at = 0  # how many are left in the level (0: start the next one)
    while n_live > 0 and s_tot > 0:
        # Priority queue keyed by (free slots, margin), ties to the lowest index.
        if n_at == 0:
            cmax = 0
            for j in range(G):
                if cap[j] > cmax:
                    cmax = cap[j]
            head = 0
            for j in range(G):
                if cap[j] == cmax:
                    t = n_at
                    while t > 0 and L[level[t - 1]] > L[j]:
                        level[t] = level[t - 1]
                        t -= 1
                    level[t] = j
                    n_at += 1
        g = level[head]
        mg = M - L[g]
        at = head
        for t in range(head + 1, head + n_at):
            j = level[t]
            if M - L[j] != mg:
                break
            if j < g:  # an equal margin: the lowest index
                g = j
                at = t
        for t in range(at, head, -1):
            level[t] = level[t - 1]
        head += 1
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
            if out[order[top]] >= 0:  # placed: the largest live s is below it
                top = _prev_live(words, summary, top)
            if sv[top] <= mg:
                q = top
                if run_start[top] != top:  # the lowest index of its run
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
                    if run_start[lo] != lo:
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
        n_at -= 1  # g left the level
        if optimistic:
            L[g] += D
            if L[g] > M:
                M = L[g]
    return out, carry


def br0_reference(pool, reps, opts, carry, seed):
    """BR-0 from the paper's pseudo-code, in plain Python (lists, sorted, itertools)."""
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    s = [float(x) for x in prefill]
    L = [float(row[0]) for row in loads]
    cap = [int(c) for c in free_slots]
    G = len(L)
    r_max = int(opts.values[_B0.r_max])
    s_greedy = float(opts.values[_B0.s_greedy])
    optimistic = opts.optimistic
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
    return np.array(out, dtype=np.int64), carry


# --------------------------------------------------------------------------------------------
# BR-H (BalanceRoute, arXiv 2605.06113: BR-H): the same two stages with the horizon F-score
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


@njit(**NJIT_INLINE)
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
    p = _count_at_most(sv, s_lo)  # first position with s > s_lo
    nc = np.int64(0)  # int64 from the start: a literal 0 makes numba compile _brh_insert for it
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
def brh_kernel(pool, reps, opts, carry, seed):
    """BR-H on projected loads ``loads`` (G, H+1); see the module docstring.

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
    r_max = int(opts.values[_BH.r_max])
    s_greedy = opts.values[_BH.s_greedy]
    alpha = opts.values[_BH.alpha]
    beta = opts.values[_BH.beta]
    gamma = opts.values[_BH.gamma]
    optimistic = opts.optimistic
    d = np.empty(H1)
    acc = 1.0
    for h in range(H1):
        d[h] = acc
        acc *= gamma
    if opts.vector.shape[0] > 0:
        # presence weights of the new requests (new_presence): d_h = gamma^h * pi_h
        for h in range(H1):
            d[h] *= opts.vector[h]
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
    sorted_once = np.full(G, 0, np.int64)  # (the allocation the other kernels spell)
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
            # by margin (stable; any order of equal margins gives the same bracket)
            pg = _stable_argsort_float(m)
            for h in range(H1):
                perm[g, h] = pg[h]
            sorted_once[g] = 1
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
                    if not _next_combination(comb, size, nc):
                        break
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
    return out, carry


def brh_reference(pool, reps, opts, carry, seed):
    """BR-H in plain Python: margin vectors, discount vector, horizon F-score."""
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    s = [float(x) for x in prefill]
    L = [[float(v) for v in row] for row in loads]
    cap = [int(c) for c in free_slots]
    G, H1 = len(L), len(L[0])
    r_max = int(opts.values[_BH.r_max])
    s_greedy = float(opts.values[_BH.s_greedy])
    alpha, beta = float(opts.values[_BH.alpha]), float(opts.values[_BH.beta])
    gamma = float(opts.values[_BH.gamma])
    optimistic = opts.optimistic
    d = []
    acc = 1.0
    for h in range(H1):
        pi = opts.vector  # new_presence
        d.append(acc * float(pi[h]) if len(pi) > 0 else acc)
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
    return np.array(out, dtype=np.int64), carry


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
def brs_kernel(pool, reps, opts, carry, seed):
    """BR-S; see the module docstring for the full statement (and THEOREMS.md R7-R8)."""
    s = pool.prefill
    wait = pool.wait
    n = s.shape[0]
    G = reps.loads.shape[0]
    A = int(opts.values[_BS.age_window])
    optimistic = opts.optimistic
    Gf = float(G)
    L0 = reps.loads[:, 0].copy()
    L = L0.copy()
    req = np.empty(G, np.int64)  # a loop, not an array expression (a broadcasting loop compiled)
    for g in range(G):
        req[g] = reps.n_running[g] + reps.n_waiting[g]
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
    # The backlog: entered when some visible request has waited `patience` ticks, left when
    # the visible pool fits in the free slots (the tick that fits still routes as BR-S).
    in_backlog = carry[_BSC.backlog] != 0
    backlog = w_max >= int(opts.values[_BS.patience]) or in_backlog
    keep = in_backlog
    if n <= s_tot:
        keep = False
    elif backlog:
        keep = True
    carry_out = with_carry(carry, _BSC.backlog, keep)
    if not backlog:
        # No backlog: JSQ's decision itself (a bool, not a literal True: SGLang's jsq and
        # this share one compiled least_tokens_kernel).
        j_out = least_tokens_kernel(pool, reps, optimistic, np.bool_(True))
        return j_out, carry_out
    fitted = False
    if n <= s_tot:
        # Every visible request gets a slot: longest first, each onto JSQ's replica. If the
        # KV capacity keeps one out, the tick is routed as a scarce one instead (below), so
        # that no request is passed over by a younger one outside the age window.
        order = _stable_argsort_desc(s)
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
            for g in range(G):
                L[g] = L0[g]
                kv_load[g] = L0[g]
                req[g] = reps.n_running[g] + reps.n_waiting[g]
                cap[g] = reps.free_slots[g]
                kv_run[g] = reps.n_running[g]
    if not fitted:
        # Slots are scarce: the replica with the largest margin takes, from the age window,
        # the request with the best F-score against its margin per free slot. The window:
        # waits >= the oldest live request's - A, and only the k * S_tot oldest; it is set at
        # the start and again whenever every request in it has been placed.
        live = np.full(n, 1, np.int64)  # (the allocation the other kernels spell)
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
                span = math.floor(opts.values[_BS.age_fraction] * w_old)
                if span > A:
                    span = A
                theta = w_old - span
                kk = int(opts.values[_BS.window]) * s_tot
                if kk > 0 and kk < n_live:
                    w_live = np.empty(n_live, np.int64)
                    q = 0
                    for i in range(n):
                        if live[i]:
                            w_live[q] = wait[i]
                            q += 1
                    w_kk = _kth_largest(w_live, kk)
                    if w_kk > theta:
                        theta = w_kk
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
            live[best] = 0
            n_live -= 1
            in_window -= 1
            cap[g] -= 1
            s_tot -= 1
            kv_load[g] += s[best]
            kv_run[g] += 1
            if optimistic:
                L[g] += s[best]
    if opts.values[_BS.safe] != 0.0:
        # The safety net: JSQ's own decision whenever it leaves no larger imbalance.
        j_out = least_tokens_kernel(pool, reps, optimistic, np.bool_(True))
        if _post_imbalance(L0, s, j_out) <= _post_imbalance(L0, s, out):
            out = j_out
    return out, carry_out


def brs_reference(pool, reps, opts, carry, seed):
    """BR-S in plain Python (sorted, min/max with key tuples, the JSQ reference)."""
    s = [float(x) for x in pool.prefill]
    wait = [int(w) for w in pool.wait]
    n, G = len(s), len(reps.free_slots)
    A = float(opts.values[_BS.age_window])
    optimistic = opts.optimistic
    L0 = [float(row[0]) for row in reps.loads]
    L = list(L0)
    req = [int(a) + int(b) for a, b in zip(reps.n_running, reps.n_waiting)]
    cap = [int(c) for c in reps.free_slots]
    kv = [float(c) for c in reps.kv_capacity]
    kv_load, kv_run = list(L0), [int(r) for r in reps.n_running]
    out = [-1] * n
    in_backlog = bool(carry[_BSC.backlog])
    backlog = n > 0 and max(wait) >= int(opts.values[_BS.patience]) or in_backlog
    keep = in_backlog
    if n <= sum(cap):
        keep = False
    elif backlog:
        keep = True
    carry_out = carry
    if keep != in_backlog:  # a fresh copy: the input is never changed
        carry_out = carry.copy()
        carry_out[_BSC.backlog] = keep
    if not backlog:
        return least_tokens_reference(pool, reps, optimistic, True), carry_out

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
                theta = w_old - min(A, math.floor(float(opts.values[_BS.age_fraction]) * w_old))
                k_oldest = int(opts.values[_BS.window]) * sum(cap)
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
    if bool(opts.values[_BS.safe]):
        j_out = [int(x) for x in least_tokens_reference(pool, reps, optimistic, True)]

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
    return np.array(out, dtype=np.int64), carry_out


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


# the option and carry slots come from _core's option_slots/carry_slots
cache_depends_on(brs_kernel, _order, _routing_core)
cache_depends_on(br0_kernel, _order, _routing_core)
cache_depends_on(brh_kernel, _order, _routing_core)

BR0 = routing_policy(
    "br0",
    kernel=br0_kernel,
    reference=br0_reference,
    options=BR0_OPTIONS,
    summary="BR-0: two stages on the F-score D - G*(D - m_g)_+ (most free slots first)",
    source="BalanceRoute (arXiv 2605.06113): F-score, two-stage assignment",
    staged=True,
)
BRH = routing_policy(
    "brh",
    kernel=brh_kernel,
    reference=brh_reference,
    options=BRH_OPTIONS,
    summary="BR-H: BR-0's stages on the horizon F-score over projected loads",
    source="BalanceRoute (arXiv 2605.06113): BR-H, horizon F-score",
    horizon=True,
    staged=True,
)
BRS = routing_policy(
    "brs",
    kernel=brs_kernel,
    reference=brs_reference,
    options=BRS_OPTIONS,
    carry=BRSCarry,
    summary="BR-S: margin-first F-score within an age window, JSQ's decision kept when it "
    "leaves no larger imbalance",
    source="this library (BalanceRoute's F-score, SGLang's total_tokens as the safety net)",
)
