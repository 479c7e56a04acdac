"""B9, activations counted per GPU: kernel and plain-Python reference.

At a trial value ``T``, suppose a dispatch keeps every GPU time below ``T``
(proofs/THEOREMS.md, Part I, "B9"). Then GPU ``h`` holds at most ``k_h`` activations (the
most ``G <= D_h`` with ``a + b*G < T``, ``D_h`` its live replicas), at most ``U`` tokens
(``c + beta*U = T`` or ``c2 + gamma*U = T``, the least) and, with ``G`` activations, at
most ``t(G) = G + J(G)`` tiles (``J(G)`` the most extra tiles with ``a + b*G + b2*J < T``).
Two counting rules follow:

* C (cover): the experts need at least ``P = sum_e max(1, ceil(n_e/U))`` pieces,
  ``K = sum_e ceil(n_e/tile)`` tiles and ``N = sum_e n_e`` tokens. ``P <= sum_h k_h``, and
  (where tiles are priced, ``b2 > 0``) the best choice of activations ``G_h <= k_h`` with
  ``sum_h G_h >= P`` must give ``sum_h t(G_h) >= K`` and ``sum_h min(U, tile*t(G_h) +
  G_h) >= N`` (a dynamic programme over the GPUs); otherwise ``OPT >= T``.
* W (whole experts): when ``sum_h k_h`` equals the number of live experts, no expert is
  split and every GPU holds exactly ``k_h`` experts, so an expert ``e`` sits whole on some
  allowed ``h`` with the experts forced there and the smallest others up to ``k_h``: the
  time ``t(e, h)`` of that content is a floor of ``h``'s time. A pair with ``t(e, h) >= T``
  is disallowed; a GPU with exactly ``k_h`` allowed experts forces them all; propagated for
  at most :data:`COUNTING_PASSES` passes. ``OPT >= min(T, max_e min_h t(e, h))``.

The counts are exact integers; every float is formed by the same expression in both
implementations, so they agree bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._numba.jit import NJIT, NJIT_INLINE, cache_depends_on
from . import _bounds, _csr
from ._bounds import bound_trials, bound_trials_reference, token_cap, token_cap_reference
from ._csr import gpu_slots, replica_lists

__all__ = [
    "COUNTING_PASSES",
    "COUNTING_STEPS",
    "counting_bound_kernel",
    "counting_bound_reference",
    "counting_kernel",
    "counting_reference",
]

#: Passes of rule W's propagation at one ``T`` (stopping early is sound).
COUNTING_PASSES = 16
#: Bisection trials of B9 below its first trial value.
COUNTING_STEPS = 6
#: Extra tiles beyond this count as unbounded (a relaxation, so sound).
_J_CAP = 2.0**52


@njit(**NJIT_INLINE)
def _tile_room(params, G, T):
    """The most tiles a GPU with ``G >= 1`` activations holds below ``T`` (``inf`` when
    ``b2 = 0`` or beyond ``2**52``); ``a + b*G < T`` is assumed."""
    a = params[0]
    b = params[1]
    b2 = params[2]
    if b2 <= 0.0:
        return np.inf
    q = (T - a - b * G) / b2
    if not q < _J_CAP:
        return np.inf
    J = np.ceil(q) - 1.0
    if J < 0.0:
        J = 0.0
    while J > 0.0 and a + b * G + b2 * J >= T:
        J -= 1.0
    while a + b * G + b2 * (J + 1.0) < T:
        J += 1.0
    return G + J


@njit(**NJIT)
def _programme_refutes(params, T, k, P, K, N, Uup, tile, sum_k):
    """Rule C2: whether the best activation counts ``G_h <= k_h`` with ``sum_h G_h >= P``
    leave fewer than ``K`` tiles or ``N`` tokens (module notes)."""
    g = k.shape[0]
    kmax = np.int64(0)
    for h in range(g):
        kmax = max(kmax, k[h])
    rooms = np.zeros(kmax + 1)
    caps = np.zeros(kmax + 1)
    for G in range(1, kmax + 1):
        rooms[G] = _tile_room(params, G, T)
        caps[G] = min(Uup, tile * rooms[G] + G)
    # every GPU at its best count bounds both maxima from above, every GPU at k_h is one
    # choice (float sums are monotone and taken in the same GPU order as the programme's,
    # so these shortcuts decide exactly as the programme would)
    ub_t = 0.0
    ub_n = 0.0
    w_t = 0.0
    w_n = 0.0
    for h in range(g):
        mt = 0.0
        mn = 0.0
        for G in range(k[h] + 1):
            mt = max(mt, rooms[G])
            mn = max(mn, caps[G])
        ub_t += mt
        ub_n += mn
        w_t += rooms[k[h]]
        w_n += caps[k[h]]
    if ub_t < K or ub_n < N:
        return True
    if w_t < K or w_n < N:
        bt = np.full(P + 1, -np.inf)
        bn = np.full(P + 1, -np.inf)
        bt[0] = 0.0
        bn[0] = 0.0
        nt = np.empty(P + 1)
        nn = np.empty(P + 1)
        rest = sum_k
        top = np.int64(0)  # the largest reachable state
        for h in range(g):
            rest -= k[h]
            low = max(np.int64(0), P - rest)  # states below cannot reach P any more
            nt[:] = -np.inf
            nn[:] = -np.inf
            for s in range(max(np.int64(0), low - k[h]), top + 1):
                if bt[s] == -np.inf:
                    continue
                for G in range(k[h] + 1):
                    s2 = min(P, s + G)
                    if s2 < low:
                        continue
                    v = bt[s] + rooms[G]
                    if v > nt[s2]:
                        nt[s2] = v
                    v = bn[s] + caps[G]
                    if v > nn[s2]:
                        nn[s2] = v
            top = min(P, top + k[h])
            bt[:] = nt
            bn[:] = nn
        if bt[P] < K or bn[P] < N:
            return True
    return False


@njit(**NJIT)
def _whole_experts(counts, params, T, k, tile, e_ptr, e_gpus, g_ptr, g_exps):
    """Rule W where no activation is to spare: ``min(T, LB(T))`` (module notes)."""
    E = counts.shape[0]
    g = k.shape[0]
    a = params[0]
    b = params[1]
    b2 = params[2]
    c = params[3]
    beta = params[4]
    c2 = params[5]
    gamma = params[6]
    nnz = e_ptr[E]
    g_slot = gpu_slots(e_ptr, e_gpus, g_ptr)  # the replica j of each GPU-major entry
    allowed = np.zeros(nnz, np.bool_)
    na = np.zeros(E, np.int64)
    x = np.zeros(E, np.int64)  # extra tiles of each expert whole
    for e in range(E):
        if counts[e] > 0:
            x[e] = (counts[e] + tile - 1) // tile - 1
            for j in range(e_ptr[e], e_ptr[e + 1]):
                if k[e_gpus[j]] >= 1:
                    allowed[j] = True
                    na[e] += 1
    times = np.full(nnz, np.inf)
    rank = np.zeros(nnz, np.int64)  # a free replica's place in its GPU's sorted free list
    f_cnt = np.zeros(g, np.int64)
    f_sum = np.zeros(g, np.int64)
    f_x = np.zeros(g, np.int64)
    n_free = np.zeros(g, np.int64)
    f_ptr = np.zeros(g + 1, np.int64)
    for h in range(g):
        f_ptr[h + 1] = f_ptr[h] + (g_ptr[h + 1] - g_ptr[h]) + 1
    pre_n = np.zeros(f_ptr[g], np.int64)
    pre_x = np.zeros(f_ptr[g], np.int64)
    keys = np.empty(max(E, 1), np.int64)
    slots = np.empty(max(E, 1), np.int64)
    lb = -np.inf
    for _ in range(COUNTING_PASSES):
        changed = False
        for h in range(g):
            cnt = 0
            for i in range(g_ptr[h], g_ptr[h + 1]):
                if allowed[g_slot[i]]:
                    cnt += 1
            if cnt < k[h]:
                return T
            if cnt == k[h]:
                for i in range(g_ptr[h], g_ptr[h + 1]):
                    j = g_slot[i]
                    f = g_exps[i]
                    if allowed[j] and na[f] != 1:
                        for jj in range(e_ptr[f], e_ptr[f + 1]):
                            if jj != j:
                                allowed[jj] = False
                        na[f] = 1
                        changed = True
        for h in range(g):
            f_cnt[h] = 0
            f_sum[h] = 0
            f_x[h] = 0
            m = 0
            for i in range(g_ptr[h], g_ptr[h + 1]):
                j = g_slot[i]
                if not allowed[j]:
                    continue
                f = g_exps[i]
                if na[f] == 1:
                    f_cnt[h] += 1
                    f_sum[h] += counts[f]
                    f_x[h] += x[f]
                else:
                    # insertion by tokens, stable: the free list of h, increasing
                    q = m
                    while q > 0 and counts[keys[q - 1]] > counts[f]:
                        keys[q] = keys[q - 1]
                        slots[q] = slots[q - 1]
                        q -= 1
                    keys[q] = f
                    slots[q] = j
                    m += 1
            n_free[h] = m
            base = f_ptr[h]
            pre_n[base] = 0
            pre_x[base] = 0
            for q in range(m):
                rank[slots[q]] = q
                pre_n[base + q + 1] = pre_n[base + q] + counts[keys[q]]
                pre_x[base + q + 1] = pre_x[base + q] + x[keys[q]]
        for e in range(E):
            if counts[e] <= 0:
                continue
            for j in range(e_ptr[e], e_ptr[e + 1]):
                times[j] = np.inf
                if not allowed[j]:
                    continue
                h = e_gpus[j]
                base = f_ptr[h]
                if na[e] == 1:
                    fc = f_cnt[h] - 1
                    fs = f_sum[h] - counts[e]
                    fx = f_x[h] - x[e]
                    want = k[h] - 1 - fc
                    if want < 0:
                        continue
                    m = min(want, n_free[h])
                    ws = pre_n[base + m]
                    wx = pre_x[base + m]
                else:
                    fc = f_cnt[h]
                    fs = f_sum[h]
                    fx = f_x[h]
                    want = k[h] - 1 - fc
                    if want < 0:
                        continue
                    m = min(want, n_free[h] - 1)
                    if rank[j] < m:
                        ws = pre_n[base + m + 1] - counts[e]
                        wx = pre_x[base + m + 1] - x[e]
                    else:
                        ws = pre_n[base + m]
                        wx = pre_x[base + m]
                W = counts[e] + fs + ws
                X = x[e] + fx + wx
                times[j] = max(a + b * k[h] + b2 * X, max(c + beta * W, c2 + gamma * W))
        lb = -np.inf
        for e in range(E):
            if counts[e] <= 0:
                continue
            low = np.inf
            for j in range(e_ptr[e], e_ptr[e + 1]):
                if allowed[j]:
                    if times[j] < T:
                        if times[j] < low:
                            low = times[j]
                    else:
                        allowed[j] = False
                        na[e] -= 1
                        changed = True
            if low == np.inf:
                return T
            if low > lb:
                lb = low
        if not changed:
            break
    return min(T, lb)


@njit(**NJIT)
def counting_kernel(counts, replicas, params, T):
    """``min(T, LB(T))`` of B9 at the trial value ``T`` (module notes): ``T`` when rule C
    or W refutes it, the floor of rule W where every activation is needed, else ``-inf``."""
    E, g = replicas.shape
    a = params[0]
    b = params[1]
    b2 = params[2]
    c = params[3]
    c2 = params[5]
    tile = np.int64(params[7])
    n_live = 0
    for e in range(E):
        if counts[e] > 0:
            n_live += 1
    if n_live == 0:
        return -np.inf
    if a >= T or c >= T or c2 >= T:
        return T
    U, Uup = token_cap(params, T)
    finite = U < np.inf
    e_ptr, e_gpus, g_ptr, g_exps = replica_lists(replicas)
    D = np.zeros(g, np.int64)
    for e in range(E):
        if counts[e] > 0:
            for j in range(e_ptr[e], e_ptr[e + 1]):
                D[e_gpus[j]] += 1
    k = np.zeros(g, np.int64)
    sum_k = np.int64(0)
    for h in range(g):
        q = np.int64(0)
        while q < D[h] and (b <= 0.0 or a + b * (q + 1) < T):
            q += 1
        k[h] = q
        sum_k += q
    # rule C: pieces, tiles and tokens
    P = np.int64(0)
    K = np.int64(0)
    N = np.int64(0)
    for e in range(E):
        n = counts[e]
        if n <= 0:
            continue
        if finite:
            qq = np.ceil(n / Uup)
            if qq > sum_k:
                return T
            P += max(np.int64(1), np.int64(qq))
        else:
            P += 1
        K += (n + tile - 1) // tile
        N += n
    if P > sum_k:
        return T
    if b2 > 0.0 and _programme_refutes(params, T, k, P, K, N, Uup, tile, sum_k):
        return T
    if sum_k != n_live or P != n_live:
        return -np.inf
    return _whole_experts(counts, params, T, k, tile, e_ptr, e_gpus, g_ptr, g_exps)


@njit(**NJIT)
def counting_bound_kernel(counts, replicas, params, best, upper, steps):
    """``max(best, B9)``: :func:`~straggler.solvers.dispatch._bounds.bound_trials` of
    :func:`counting_kernel` (B8's trials)."""
    return bound_trials(counting_kernel, counts, replicas, params, best, upper, steps)


# B9's kernels inline the replica lists of _csr.py and B8's helpers of _bounds.py: an edit
# there recompiles them
cache_depends_on(_whole_experts, _csr)
cache_depends_on(counting_kernel, _csr, _bounds)
cache_depends_on(counting_bound_kernel, _csr, _bounds)


def _tile_room_reference(params, G, T):
    a, b, b2 = float(params[0]), float(params[1]), float(params[2])
    if b2 <= 0:
        return math.inf
    q = (T - a - b * G) / b2
    if not q < _J_CAP:
        return math.inf
    J = max(0.0, float(math.ceil(q)) - 1.0)
    while J > 0 and a + b * G + b2 * J >= T:
        J -= 1.0
    while a + b * G + b2 * (J + 1.0) < T:
        J += 1.0
    return G + J


def counting_reference(counts, replicas, params, T):
    """Plain-Python reference of :func:`counting_kernel`: sets of allowed GPUs, sorted
    lists, and the dynamic programme over dicts.

    Examples
    --------
    Four experts of 100, 10, 10, 10 tokens on two GPUs (all on both), ``b = 4``, ``beta =
    0.1``: below ``T = 12`` each GPU holds two activations, none to spare, so the expert of
    100 sits whole beside one of 10 tokens: 110 tokens take 11, so ``OPT >= 11``:

    >>> p = [0, 4, 0, 0, 0.1, 0, 0, 128]
    >>> R = [[1, 1]] * 4
    >>> counting_reference([100, 10, 10, 10], R, p, 12.0)
    11.0
    >>> counting_reference([100, 10, 10, 10], R, p, 7.5)  # one activation a GPU: too few
    7.5
    """
    a, b, b2, c, beta, c2, gamma, tile = (float(v) for v in params)
    tile = int(tile)
    E, g = len(counts), len(replicas[0])
    n = [int(v) for v in counts]
    live = [e for e in range(E) if n[e] > 0]
    if not live:
        return -math.inf
    if max(a, c, c2) >= T:
        return T
    U, Uup = token_cap_reference(params, T)
    D = [sum(1 for e in live if replicas[e][h]) for h in range(g)]
    k = []
    for h in range(g):
        q = 0
        while q < D[h] and (b <= 0 or a + b * (q + 1) < T):
            q += 1
        k.append(q)
    P = 0
    for e in live:
        if U < math.inf:
            r = n[e] / Uup  # (inf where T is tiny: compared, never rounded to an int)
            if r > sum(k):  # ceil(r) > sum(k), for an integer sum
                return T
            P += max(1, math.ceil(r))
        else:
            P += 1
    if P > sum(k):
        return T
    if b2 > 0:
        K = sum(-(-n[e] // tile) for e in live)
        N = sum(n[e] for e in live)
        rooms = [0.0] + [_tile_room_reference(params, G, T) for G in range(1, max(k) + 1)]
        bt = {0: 0.0}
        bn = {0: 0.0}
        for h in range(g):
            nt, nn = {}, {}
            for s in sorted(bt):
                for G in range(k[h] + 1):
                    s2 = min(P, s + G)
                    t = rooms[G]
                    nt[s2] = max(nt.get(s2, -math.inf), bt[s] + t)
                    nn[s2] = max(nn.get(s2, -math.inf), bn[s] + min(Uup, tile * t + G))
                    # (the kernel skips the states that cannot reach P, and the programme
                    # where its bounds decide: the same answer, see counting_kernel)
            bt, bn = nt, nn
        if bt.get(P, -math.inf) < K or bn.get(P, -math.inf) < N:
            return T
    if sum(k) != len(live) or P != len(live):
        return -math.inf
    x = {e: -(-n[e] // tile) - 1 for e in live}
    allowed = {e: {h for h in range(g) if replicas[e][h] and k[h] >= 1} for e in live}
    lb = -math.inf
    for _ in range(COUNTING_PASSES):
        changed = False
        for h in range(g):
            onh = [e for e in live if h in allowed[e]]
            if len(onh) < k[h]:
                return T
            if len(onh) == k[h]:
                for f in onh:
                    if allowed[f] != {h}:
                        allowed[f] = {h}
                        changed = True
        times = {}
        for e in live:
            for h in allowed[e]:
                others = [f for f in live if f != e and h in allowed[f]]
                forced = [f for f in others if len(allowed[f]) == 1]
                want = k[h] - 1 - len(forced)
                if want < 0:
                    times[e, h] = math.inf
                    continue
                free = sorted(n[f] for f in others if len(allowed[f]) != 1)[:want]
                W = n[e] + sum(n[f] for f in forced) + sum(free)
                X = x[e] + sum(x[f] for f in forced) + sum(-(-v // tile) - 1 for v in free)
                times[e, h] = max(a + b * k[h] + b2 * X, c + beta * W, c2 + gamma * W)
        lb = -math.inf
        for e in live:
            keep = {h for h in allowed[e] if times[e, h] < T}
            if not keep:
                return T
            if keep != allowed[e]:
                allowed[e] = keep
                changed = True
            lb = max(lb, min(times[e, h] for h in keep))
        if not changed:
            break
    return min(T, lb)


def counting_bound_reference(counts, replicas, params, best, upper, steps):
    """Plain-Python reference of :func:`counting_bound_kernel` (the same trials)."""
    return bound_trials_reference(counting_reference, counts, replicas, params, best, upper, steps)
