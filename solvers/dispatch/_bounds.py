"""Certified lower bound on the optimal makespan: kernel and plain-Python reference.

Inputs: token counts ``n (E,)``, replica mask ``R (E, g)``, the cost array
``[a, b, b2, c, beta, c2, gamma, tile]`` (``CostModel.as_array``) and the optimal
semi-matching value ``sm`` of the live experts. The bound is the maximum of
(proofs/THEOREMS.md, Part I, "Lower bounds"):

* B2 ``a + b*sm`` (activation bound of Lemma 2);
* B3 for each GPU set ``S`` in a family, with ``E(S)`` the live experts whose replicas all
  lie in ``S``: ``c + beta*N(E(S))/|S|``, ``c2 + gamma*N(E(S))/|S|`` and
  ``a + Psi(E(S))/|S|``, where ``Psi`` sums each expert's cheapest activation measure
  ``psi_e = b*j_e + b2*(k_e - j_e)`` (``k_e = ceil(n_e/tile)``; ``j_e = 1`` if
  ``b2 <= b``, else ``j_e = min(k_e, r_e)`` with ``r_e`` its replica count). The family:
  all GPUs, and (when ``g <= 64``) the replica set of every live expert; for ``g > 64``,
  the replica set of each expert with that expert alone counted in ``E(S)``;
* B4 for each live expert: ``a + b + b2*(ceil(n_e/(r_e*tile)) - 1)`` (its largest piece);
* B6 (activations coupled with tokens, over all GPUs; :func:`coupling_bound_kernel`):
  ``min over K of max(a + b*K, c + beta*U(K), c2 + gamma*U(K))``, where ``U(K)`` is the
  least largest piece ``max_e n_e / j_e`` over piece counts ``1 <= j_e <= r_e`` with
  ``sum_e j_e <= g*K``: a dispatch whose GPUs hold at most ``K`` activations each has at
  most ``g*K`` pieces in all, so some piece, hence some GPU, carries at least ``U(K)``
  tokens. ``U(K)`` comes from the greedy that splits the expert of the largest
  ``n_e / j_e`` once more (optimal for this min-max), as exact fractions.

Integer aggregates (tokens, ``j``, ``k``, piece counts) are summed exactly, and every float
is formed by the same expression in both implementations, so they agree bit for bit.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from numba import njit

from .. import _order
from .._numba.jit import NJIT, NJIT_INLINE, cache_depends_on
from .._order import stable_argsort_uint
from . import _csr
from ._csr import gpu_slots, replica_lists

__all__ = [
    "FORCED_PASSES",
    "FORCED_STEPS",
    "FORCED_SLACK",
    "coupling_bound_kernel",
    "coupling_bound_reference",
    "forced_bound_kernel",
    "forced_bound_reference",
    "forced_kernel",
    "forced_reference",
    "lower_bound_kernel",
    "lower_bound_reference",
]


@njit(**NJIT_INLINE)
def _larger(n, j, u, v):
    """Whether expert u's piece ``n[u] / j[u]`` is larger than v's (exact, cross-multiplied)."""
    return n[u] * j[v] > n[v] * j[u]


@njit(**NJIT)
def _sift_down(heap, p, m, n, j):
    """Restore the max-heap ``heap[:m]`` (by piece ``n / j``) below position ``p``."""
    while True:
        ch = 2 * p + 1
        if ch >= m:
            return
        if ch + 1 < m and _larger(n, j, heap[ch + 1], heap[ch]):
            ch += 1
        if not _larger(n, j, heap[ch], heap[p]):
            return
        heap[p], heap[ch] = heap[ch], heap[p]
        p = ch


@njit(**NJIT_INLINE)
def coupling_bound_kernel(counts, replicas, params, best):
    """``max(best, B6)``: the activation-token coupling bound over all GPUs (module notes).

    ``best`` is the bound known so far. The search over ``K`` starts at ``ceil(E_live /
    g)`` (every live expert needs a piece); it returns ``best`` as soon as some ``K`` gives
    at most ``best`` (the minimum adds nothing then), and otherwise stops with the minimum
    once ``a + b*K`` reaches it or the largest piece belongs to an expert split over all its
    replicas (``U`` cannot fall any further while ``a + b*K`` only grows). Without an
    activation cost (``b = 0``) there is no coupling and ``best`` is returned.
    """
    E, g = replicas.shape
    a = params[0]
    b = params[1]
    c = params[3]
    beta = params[4]
    c2 = params[5]
    gamma = params[6]
    if b <= 0:
        return best
    n = np.zeros(E, np.int64)
    r = np.zeros(E, np.int64)
    m = np.int64(0)  # int64 from the start: a literal 0 makes numba compile _sift_down for it
    for e in range(E):
        if counts[e] > 0:
            n[m] = counts[e]
            for h in range(g):
                r[m] += np.int64(replicas[e, h])
            m += 1
    if m == 0:
        return best
    K = (m + g - 1) // g
    # every expert whole (j = 1) at the least K: when that already gives at most best, the
    # minimum over K does too, and no heap is needed
    top = 0
    for i in range(1, m):
        if n[i] > n[top]:
            top = i
    fl = a + b * K
    u = n[top] / 1
    if max(fl, max(c + beta * u, c2 + gamma * u)) <= best:
        return best
    j = np.ones(m, np.int64)
    heap = np.arange(m)  # max-heap of experts by their piece n / j
    for start in range(m // 2 - 1, -1, -1):
        _sift_down(heap, start, m, n, j)
    pieces = m
    result = np.inf
    while True:
        fl = a + b * K
        if fl >= result:
            break
        top = heap[0]
        while pieces < g * K and j[top] < r[top]:
            j[top] += 1
            pieces += 1
            _sift_down(heap, np.int64(0), m, n, j)
            top = heap[0]
        u = n[top] / j[top]
        v = max(fl, max(c + beta * u, c2 + gamma * u))
        if v <= best:  # the minimum is at most best: nothing to add
            return best
        if v < result:
            result = v
        if j[top] >= r[top]:
            break
        K += 1
    return max(best, result) if result < np.inf else best


def coupling_bound_reference(counts, replicas, params, best):
    """Plain-Python reference of :func:`coupling_bound_kernel`: ``U(K)`` as the least of the
    candidate pieces ``n_e / j`` (exact fractions) within the piece budget, instead of the
    greedy.

    Examples
    --------
    One expert of 600 tokens on two GPUs, ``b = 15``, ``beta = 0.1``: with ``K = 1`` the
    expert is split in two, ``U = 300``, ``max(15, 30) = 30``.

    >>> coupling_bound_reference([600], [[True, True]], [0, 15, 0, 0, 0.1, 0, 0, 128], 0.0)
    30.0
    """
    a, b, _, c, beta, c2, gamma, _ = (float(v) for v in params)
    n_gpus = len(replicas[0])
    live = [(int(n), sum(bool(v) for v in row)) for n, row in zip(counts, replicas) if int(n) > 0]
    if b <= 0 or not live:
        return best
    cands = sorted({Fraction(ne, jj) for ne, re in live for jj in range(1, re + 1)})
    floor_u = max(Fraction(ne, re) for ne, re in live)

    def pieces(u):
        return sum(max(1, -(-ne * u.denominator // u.numerator)) for ne, _ in live)

    result = math.inf
    K = -(-len(live) // n_gpus)
    while True:
        fl = a + b * K
        if fl >= result:
            break
        # the least candidate piece that the piece budget allows (m <= g*K: n_max always does)
        u = next(u for u in cands if u >= floor_u and pieces(u) <= n_gpus * K)
        uf = u.numerator / u.denominator  # (the kernel's n / j: the same rational, one rounding)
        v = max(fl, max(c + beta * uf, c2 + gamma * uf))
        if v <= best:
            return best
        result = min(result, v)
        if u == floor_u:
            break
        K += 1
    return max(best, result) if result < math.inf else best


@njit(**NJIT)
def _b3(best, params, n, j, k, s):
    """``max(best, B3)`` over ``s`` GPUs that together take ``n`` tokens of ``k`` tiles and at
    least ``j`` expert activations: the mean of each of the three step-time terms."""
    v = params[3] + params[4] * n / s
    if v > best:
        best = v
    v = params[5] + params[6] * n / s
    if v > best:
        best = v
    v = params[0] + (params[1] * j + params[2] * (k - j)) / s
    if v > best:
        best = v
    return best


@njit(**NJIT)
def lower_bound_kernel(counts, replicas, params, sm):
    """Certified lower bound of one layer: B1-B4 and B6 (see module docstring)."""
    E, g = replicas.shape
    a = params[0]
    b = params[1]
    b2 = params[2]
    tile = np.int64(params[7])
    split_cheaper = b2 > b
    best = a + b * sm
    n_live = 0
    for e in range(E):
        if counts[e] > 0:
            n_live += 1
    ntok = np.zeros(n_live, np.int64)
    jj = np.zeros(n_live, np.int64)
    kk = np.zeros(n_live, np.int64)
    rr = np.zeros(n_live, np.int64)
    masks = np.zeros(n_live, np.uint64)
    tot_n = np.int64(0)
    tot_j = np.int64(0)
    tot_k = np.int64(0)
    i = 0
    for e in range(E):
        n = counts[e]
        if n <= 0:
            continue
        r = np.int64(0)
        m = np.uint64(0)
        for h in range(g):
            if replicas[e, h]:
                r += 1
                if g <= 64:
                    m |= np.uint64(1) << np.uint64(h)
        k = (n + tile - 1) // tile
        j = np.int64(1)
        if split_cheaper:
            j = k if k < r else r
        ntok[i] = n
        jj[i] = j
        kk[i] = k
        rr[i] = r
        masks[i] = m
        tot_n += n
        tot_j += j
        tot_k += k
        # B4: the largest piece of e holds at least ceil(n / (r * tile)) tiles
        big = (n + r * tile - 1) // (r * tile)
        v = a + b + b2 * (big - 1)
        if v > best:
            best = v
        i += 1
    # B3 over all GPUs
    best = _b3(best, params, tot_n, tot_j, tot_k, g)
    # B3 over the replica set of each live expert
    if g > 64:
        for i in range(n_live):
            best = _b3(best, params, ntok[i], jj[i], kk[i], rr[i])
    else:
        # aggregate experts by distinct replica set, then sum over subsets: O(E log E + D^2)
        order = stable_argsort_uint(masks)
        dm = np.zeros(n_live, np.uint64)
        dn = np.zeros(n_live, np.int64)
        dj = np.zeros(n_live, np.int64)
        dk = np.zeros(n_live, np.int64)
        dr = np.zeros(n_live, np.int64)
        D = 0
        for t in range(n_live):
            i = order[t]
            if D == 0 or dm[D - 1] != masks[i]:
                dm[D] = masks[i]
                dr[D] = rr[i]
                D += 1
            dn[D - 1] += ntok[i]
            dj[D - 1] += jj[i]
            dk[D - 1] += kk[i]
        for d in range(D):
            s_mask = dm[d]
            sn = np.int64(0)
            sj = np.int64(0)
            sk = np.int64(0)
            for q in range(D):
                if dm[q] & ~s_mask == np.uint64(0):
                    sn += dn[q]
                    sj += dj[q]
                    sk += dk[q]
            best = _b3(best, params, sn, sj, sk, dr[d])
    return coupling_bound_kernel(counts, replicas, params, best)


cache_depends_on(lower_bound_kernel, _order)


def lower_bound_reference(counts, replicas, params, sm):
    """Plain-Python reference of :func:`lower_bound_kernel` with sets instead of bit masks."""
    a, b, b2, c, beta, c2, gamma, tile = (float(p) for p in params)
    tile = int(tile)
    n_gpus = len(replicas[0])
    live = [e for e in range(len(counts)) if int(counts[e]) > 0]
    rep = {e: frozenset(h for h in range(n_gpus) if bool(replicas[e][h])) for e in live}
    n = {e: int(counts[e]) for e in live}
    k = {e: -(-n[e] // tile) for e in live}
    j = {e: (min(k[e], len(rep[e])) if b2 > b else 1) for e in live}
    candidates = [a + b * sm]
    for e in live:
        r = len(rep[e])
        candidates.append(a + b + b2 * (-(-n[e] // (r * tile)) - 1))

    def terms(members, size):
        sn = sum(n[e] for e in members)
        sj = sum(j[e] for e in members)
        sk = sum(k[e] for e in members)
        return [
            c + beta * sn / size,
            c2 + gamma * sn / size,
            a + (b * sj + b2 * (sk - sj)) / size,
        ]

    candidates += terms(live, n_gpus)
    for e in live:
        if n_gpus <= 64:
            members = [f for f in live if rep[f] <= rep[e]]
        else:
            members = [e]
        candidates += terms(members, len(rep[e]))
    return coupling_bound_reference(counts, replicas, params, max(candidates))


# --------------------------------------------------------------------------------------
# B8: activations and tokens forced per GPU (proofs/THEOREMS.md, "B8")
# --------------------------------------------------------------------------------------

#: Relative slack on the token cap ``U`` of B8: every room is computed from ``U * (1 +
#: FORCED_SLACK)``, which exceeds the rounding of the float sums it enters (module notes).
FORCED_SLACK = 1e-10
#: Passes of B8's propagation at one ``T`` (a pass that changes nothing ends it sooner;
#: stopping early is sound, every deduction made so far holds).
FORCED_PASSES = 32
#: Bisection trials of B8 below its first trial value (each one pass of its kernel).
FORCED_STEPS = 6


@njit(**NJIT_INLINE)
def token_cap(params, T):
    """``(U, U * (1 + FORCED_SLACK))`` at the trial value ``T``: ``U`` the most tokens one GPU
    carries below ``T`` (``c + beta*U = T`` or ``c2 + gamma*U = T``, the least; inf where
    no token term is priced), then with the bounds' rounding slack; ``params`` is
    ``CostModel.as_array()``."""
    U = np.inf
    if params[4] > 0.0:
        U = (T - params[3]) / params[4]
    if params[6] > 0.0:
        U = min(U, (T - params[5]) / params[6])
    return U, U * (1.0 + FORCED_SLACK)


def token_cap_reference(params, T):
    """Plain-Python twin of :func:`token_cap`."""
    c, beta, c2, gamma = (float(v) for v in params[3:7])
    U = math.inf
    if beta > 0:
        U = (T - c) / beta
    if gamma > 0:
        U = min(U, (T - c2) / gamma)
    return U, U * (1.0 + FORCED_SLACK)


@njit(**NJIT_INLINE)
def _forced_time(params, G, J, N):
    """A GPU's time with ``G`` activations, ``J = T - G`` tiles above one per activation and
    ``N`` tokens: :func:`~straggler.formulations.evaluate`'s expression."""
    t = params[0] + params[1] * G + params[2] * J
    u = params[3] + params[4] * N
    if u > t:
        t = u
    u = params[5] + params[6] * N
    if u > t:
        t = u
    return t


@njit(**NJIT_INLINE)
def _forced_tiles(v, tile):
    """Tiles above one of a share of at least ``v > 0`` tokens (the evaluator's slack)."""
    k = math.ceil((v - 1e-7) / tile)
    return k - 1 if k > 1 else 0


@njit(**NJIT)
def _forced_set(m, Gf, Jf, Nf, j, h, v, tile):
    """``m[j] = v`` (``v > m[j]``) for the replica ``j`` on GPU ``h``, with the GPU's forced
    aggregates updated."""
    old = m[j]
    if old > 0.0:
        Gf[h] -= 1
        Jf[h] -= _forced_tiles(old, tile)
    Nf[h] += v - old
    m[j] = v
    Gf[h] += 1
    Jf[h] += _forced_tiles(v, tile)


@njit(**NJIT_INLINE)
def _room(Uup, Nf, m, h, j):
    """Tokens replica ``j`` on GPU ``h`` can take at most: ``U`` less what the GPU's other
    experts must carry (never negative)."""
    r = Uup - (Nf[h] - m[j])
    return r if r > 0.0 else 0.0


@njit(**NJIT_INLINE)
def _insertion_sort(buf, k):
    """``buf[:k]`` in increasing order, in place (k is a replica count: small)."""
    for i in range(1, k):
        v = buf[i]
        q = i
        while q > 0 and buf[q - 1] > v:
            buf[q] = buf[q - 1]
            q -= 1
        buf[q] = v


@njit(**NJIT)
def forced_kernel(counts, replicas, params, T):
    """``min(T, LB(T))``: the bound B8 proves at the trial value ``T`` (module notes).

    Under the hypothesis that a dispatch has every GPU time below ``T``, propagates which
    replicas must stay empty, which must carry tokens and how many (the rules R1-R5 of
    proofs/THEOREMS.md, "B8"), for at most :data:`FORCED_PASSES` passes. Returns ``T`` when
    the hypothesis is contradicted (then ``OPT >= T``), else the largest time of a GPU's
    forced activations and tokens (``OPT`` is at least that or at least ``T``). Replicas
    are indexed by their position ``j`` in the expert-major CSR lists (``e_gpus``).
    """
    E, g = replicas.shape
    c = params[3]
    c2 = params[5]
    tile = params[7]
    if params[0] >= T or c >= T or c2 >= T:
        return T
    U, Uup = token_cap(params, T)
    finite = U < np.inf
    e_ptr, e_gpus, g_ptr, g_exps = replica_lists(replicas)
    nnz = e_ptr[E]
    g_slot = gpu_slots(e_ptr, e_gpus, g_ptr)  # the replica j of each GPU-major entry
    allowed = np.zeros(nnz, np.bool_)
    na = np.zeros(E, np.int64)
    D = np.zeros(g, np.int64)
    n_live = 0
    for e in range(E):
        if counts[e] > 0:
            n_live += 1
            na[e] = e_ptr[e + 1] - e_ptr[e]
            for j in range(e_ptr[e], e_ptr[e + 1]):
                allowed[j] = True
                D[e_gpus[j]] += 1
    m = np.zeros(nnz)
    room = np.empty(nnz)
    Gf = np.zeros(g, np.int64)
    Jf = np.zeros(g, np.int64)
    Nf = np.zeros(g)
    Kmax = np.zeros(g, np.int64)
    buf = np.empty(max(g, E))
    for _ in range(FORCED_PASSES):
        changed = False
        # R1: a GPU that cannot take one more activation keeps every unforced replica empty
        for h in range(g):
            if _forced_time(params, Gf[h] + 1, Jf[h], Nf[h]) >= T:
                for i in range(g_ptr[h], g_ptr[h + 1]):
                    j = g_slot[i]
                    if allowed[j] and m[j] == 0.0:
                        allowed[j] = False
                        na[g_exps[i]] -= 1
                        D[h] -= 1
                        changed = True
        # R2: tokens the expert's other allowed GPUs cannot absorb stay on this one
        for e in range(E):
            if counts[e] == 0:
                continue
            if na[e] == 0:
                return T
            n = float(counts[e])
            if not finite:
                if na[e] == 1:
                    for j in range(e_ptr[e], e_ptr[e + 1]):
                        if allowed[j] and m[j] < n:
                            _forced_set(m, Gf, Jf, Nf, j, e_gpus[j], n, tile)
                            changed = True
                continue
            tot = 0.0
            for j in range(e_ptr[e], e_ptr[e + 1]):
                if allowed[j]:
                    room[j] = _room(Uup, Nf, m, e_gpus[j], j)
                    tot += room[j]
            for j in range(e_ptr[e], e_ptr[e + 1]):
                if allowed[j]:
                    v = n - (tot - room[j])
                    if v > m[j]:
                        _forced_set(m, Gf, Jf, Nf, j, e_gpus[j], v, tile)
                        changed = True
        # R3: a GPU whose forced part alone reaches T
        for h in range(g):
            if _forced_time(params, Gf[h], Jf[h], Nf[h]) >= T:
                return T
        # R4: activations a GPU can hold, against the pieces the experts need
        spare = -n_live
        for h in range(g):
            k = Gf[h]
            while k < D[h] and _forced_time(params, k + 1, Jf[h], Nf[h]) < T:
                k += 1
            Kmax[h] = k
            spare += k
        if spare < 0:
            return T
        if finite:
            need = 0
            for e in range(E):
                if counts[e] == 0:
                    continue
                n = float(counts[e])
                k = 0
                for j in range(e_ptr[e], e_ptr[e + 1]):
                    if allowed[j]:
                        buf[k] = _room(Uup, Nf, m, e_gpus[j], j)
                        k += 1
                _insertion_sort(buf, k)
                acc = 0.0
                q = 0
                while q < k and acc < n:
                    acc += buf[k - 1 - q]  # the largest rooms first
                    q += 1
                if acc < n:
                    return T
                need += q - 1
            if need > spare:
                return T
        if spare == 0:
            # R5: no expert is split and every GPU holds exactly Kmax activations
            if finite:
                for e in range(E):
                    if counts[e] == 0:
                        continue
                    n = float(counts[e])
                    for j in range(e_ptr[e], e_ptr[e + 1]):
                        if allowed[j] and _room(Uup, Nf, m, e_gpus[j], j) < n:
                            if m[j] > 0.0:
                                return T
                            allowed[j] = False
                            na[e] -= 1
                            D[e_gpus[j]] -= 1
                            changed = True
                    if na[e] == 0:
                        return T
            for h in range(g):
                if D[h] < Kmax[h]:
                    return T
                if D[h] == Kmax[h]:
                    for i in range(g_ptr[h], g_ptr[h + 1]):
                        j = g_slot[i]
                        n = float(counts[g_exps[i]])
                        if allowed[j] and m[j] < n:
                            _forced_set(m, Gf, Jf, Nf, j, h, n, tile)
                            changed = True
            for h in range(g):
                k = 0
                for i in range(g_ptr[h], g_ptr[h + 1]):
                    j = g_slot[i]
                    if allowed[j] and m[j] == 0.0:
                        buf[k] = float(counts[g_exps[i]])
                        k += 1
                want = Kmax[h] - Gf[h]
                if want < 0 or want > k:
                    return T
                _insertion_sort(buf, k)
                extra = 0.0
                for i in range(want):
                    extra += buf[i]
                if _forced_time(params, Kmax[h], Jf[h], Nf[h] + extra) >= T:
                    return T
        if not changed:
            break
    lb = -np.inf
    for h in range(g):
        t = _forced_time(params, Gf[h], Jf[h], Nf[h])
        if t > lb:
            lb = t
    return min(T, lb)


@njit(**NJIT_INLINE)
def trial_point(lo, hi, a, b):
    """The next trial value of B8's and B9's bisection between ``lo`` (the bound so far) and
    ``hi`` (the lowest value not refuted): the midpoint, moved up to the activation level
    ``a + b*k`` above it when that level is still inside the interval (below ``a + b*(k +
    1)`` a GPU holds at most ``k`` activations, so a refutation that comes from counting
    activations holds up to the level itself); NaN when no point is left between them."""
    mid = lo + 0.5 * (hi - lo)
    if not (lo < mid < hi):
        return np.nan
    q = (mid - a) / b if b > 0.0 else np.inf
    if q < 2.0**52:  # (a level index beyond that is no trial point worth moving to)
        level = a + b * np.ceil(q)
        if lo < level < hi:
            mid = level
    return mid


@njit(**NJIT_INLINE)
def bound_trials(test, counts, replicas, params, best, upper, steps):
    """``max(best, ...)`` of the bound ``test(counts, replicas, params, T)`` (B8's
    :func:`forced_kernel`, B9's ``counting_kernel``: each ``min(T, LB(T))``) at ``T =
    upper``, then at most ``steps`` bisection trials between the bound known so far and the
    lowest ``T`` it did not refute.

    ``upper`` is any value (a feasible dispatch's makespan proves most); ``OPT >= min(T,
    LB(T))`` holds at every trial, so the result is the largest of those and ``best``.
    A trial that refutes ``T`` raises the low end to ``T``; one that does not lowers the
    high end to ``T`` (the refutations are sought below it); the trial points are
    :func:`trial_point`'s.
    """
    if upper <= best:
        return best
    v = test(counts, replicas, params, upper)
    if v >= upper:
        return upper
    if v > best:
        best = v
    lo = best
    hi = upper
    for _ in range(steps):
        mid = trial_point(lo, hi, params[0], params[1])
        if math.isnan(mid):
            break
        v = test(counts, replicas, params, mid)
        if v >= mid:
            lo = mid
            best = mid
        else:
            if v > best:
                best = v
            hi = mid
    return best


@njit(**NJIT)
def forced_bound_kernel(counts, replicas, params, best, upper, steps):
    """``max(best, B8)``: :func:`bound_trials` of :func:`forced_kernel`."""
    return bound_trials(forced_kernel, counts, replicas, params, best, upper, steps)


# B8's kernels inline the replica lists of _csr.py: an edit there recompiles them
cache_depends_on(forced_kernel, _csr)
cache_depends_on(forced_bound_kernel, _csr)


def forced_reference(counts, replicas, params, T):
    """Plain-Python reference of :func:`forced_kernel`, with sets of allowed GPUs and dicts of
    forced shares.

    Examples
    --------
    GPU 0 holds experts 0 and 1, GPU 1 holds 1 and 2 (expert 1 on both), ``b = 1``, ``beta =
    0.01``: every expert alone on a GPU carries at most ``100 * (T - 0)`` tokens. Below
    ``T = 2`` each GPU holds at most one activation, so expert 1 has nowhere to go:

    >>> p = [0, 1, 0, 0, 0.01, 0, 0, 128]
    >>> forced_reference([10, 10, 10], [[1, 0], [1, 1], [0, 1]], p, 2.0)
    2.0
    >>> forced_reference([10, 10, 10], [[1, 0], [1, 1], [0, 1]], p, 3.0)
    1.0
    """
    a, b, b2, c, beta, c2, gamma, tile = (float(v) for v in params)
    E, g = len(counts), len(replicas[0])
    n = [int(v) for v in counts]
    live = [e for e in range(E) if n[e] > 0]

    def time(G, J, N):
        return max(a + b * G + b2 * J, c + beta * N, c2 + gamma * N)

    def extra_tiles(v):
        return max(0, math.ceil((v - 1e-7) / tile) - 1)

    if max(a, c, c2) >= T:
        return T
    U, Uup = token_cap_reference(params, T)
    allowed = {e: {h for h in range(g) if bool(replicas[e][h])} for e in live}
    m = {}
    G, J, N = [0] * g, [0] * g, [0.0] * g

    def force(e, h, v):
        old = m.get((e, h), 0.0)
        if old > 0:
            G[h] -= 1
            J[h] -= extra_tiles(old)
        N[h] += v - old
        m[e, h] = v
        G[h] += 1
        J[h] += extra_tiles(v)

    def room(e, h):
        return max(0.0, Uup - (N[h] - m.get((e, h), 0.0)))

    def on(h):
        return [e for e in live if h in allowed[e]]

    for _ in range(FORCED_PASSES):
        changed = False
        for h in range(g):  # R1
            if time(G[h] + 1, J[h], N[h]) >= T:
                for e in on(h):
                    if m.get((e, h), 0.0) == 0.0:
                        allowed[e].discard(h)
                        changed = True
        for e in live:  # R2
            if not allowed[e]:
                return T
            if U == math.inf:
                if len(allowed[e]) == 1:
                    (h,) = allowed[e]
                    if m.get((e, h), 0.0) < n[e]:
                        force(e, h, float(n[e]))
                        changed = True
                continue
            rooms = {h: room(e, h) for h in sorted(allowed[e])}
            tot = 0.0
            for h in sorted(rooms):
                tot += rooms[h]
            for h in sorted(rooms):
                v = n[e] - (tot - rooms[h])
                if v > m.get((e, h), 0.0):
                    force(e, h, v)
                    changed = True
        if any(time(G[h], J[h], N[h]) >= T for h in range(g)):  # R3
            return T
        kmax = []  # R4
        for h in range(g):
            k = G[h]
            while k < len(on(h)) and time(k + 1, J[h], N[h]) < T:
                k += 1
            kmax.append(k)
        spare = sum(kmax) - len(live)
        if spare < 0:
            return T
        if U < math.inf:
            need = 0
            for e in live:
                rs = sorted((room(e, h) for h in allowed[e]), reverse=True)
                acc, j = 0.0, 0
                while j < len(rs) and acc < n[e]:
                    acc += rs[j]
                    j += 1
                if acc < n[e]:
                    return T
                need += j - 1
            if need > spare:
                return T
        if spare == 0:  # R5
            for e in live:
                if U == math.inf:
                    continue
                for h in sorted(allowed[e]):
                    if room(e, h) < n[e]:
                        if m.get((e, h), 0.0) > 0:
                            return T
                        allowed[e].discard(h)
                        changed = True
                if not allowed[e]:
                    return T
            for h in range(g):
                if len(on(h)) < kmax[h]:
                    return T
                if len(on(h)) == kmax[h]:
                    for e in on(h):
                        if m.get((e, h), 0.0) < n[e]:
                            force(e, h, float(n[e]))
                            changed = True
            for h in range(g):
                free = sorted(float(n[e]) for e in on(h) if m.get((e, h), 0.0) == 0.0)
                want = kmax[h] - G[h]
                if want < 0 or want > len(free):
                    return T
                extra = 0.0
                for v in free[:want]:
                    extra += v
                if time(kmax[h], J[h], N[h] + extra) >= T:
                    return T
        if not changed:
            break
    return min(T, max(time(G[h], J[h], N[h]) for h in range(g)))


def forced_bound_reference(counts, replicas, params, best, upper, steps):
    """Plain-Python reference of :func:`forced_bound_kernel` (the same trials)."""
    return bound_trials_reference(forced_reference, counts, replicas, params, best, upper, steps)


def trial_point_reference(lo, hi, a, b) -> float:
    """Plain-Python twin of :func:`trial_point`."""
    mid = lo + 0.5 * (hi - lo)
    if not (lo < mid < hi):
        return math.nan
    q = (mid - a) / b if b > 0 else math.inf
    if q < 2.0**52:
        level = a + b * float(math.ceil(q))
        if lo < level < hi:
            mid = level
    return mid


def bound_trials_reference(test, counts, replicas, params, best, upper, steps):
    """Plain-Python twin of :func:`bound_trials` (``test``: a plain-Python bound)."""
    if upper <= best:
        return best
    v = test(counts, replicas, params, upper)
    if v >= upper:
        return upper
    best = max(best, v)
    lo, hi = best, upper
    a, b = float(params[0]), float(params[1])
    for _ in range(steps):
        mid = trial_point_reference(lo, hi, a, b)
        if math.isnan(mid):
            break
        v = test(counts, replicas, params, mid)
        if v >= mid:
            lo = best = mid
        else:
            best = max(best, v)
            hi = mid
    return best
