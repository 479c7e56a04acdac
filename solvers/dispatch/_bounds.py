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

__all__ = [
    "coupling_bound_kernel",
    "coupling_bound_reference",
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
