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
* B4 for each live expert: ``a + b + b2*(ceil(n_e/(r_e*tile)) - 1)`` (its largest piece).

Integer aggregates (tokens, ``j``, ``k``) are summed exactly, and every float is formed by
the same expression in both implementations, so they agree bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._jit import NJIT

__all__ = ["lower_bound_kernel", "lower_bound_reference"]


@njit(**NJIT)
def lower_bound_kernel(counts, replicas, params, sm):
    """Certified lower bound of one layer (see module docstring)."""
    E, g = replicas.shape
    a = params[0]
    b = params[1]
    b2 = params[2]
    c = params[3]
    beta = params[4]
    c2 = params[5]
    gamma = params[6]
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
    v = c + beta * tot_n / g
    if v > best:
        best = v
    v = c2 + gamma * tot_n / g
    if v > best:
        best = v
    v = a + (b * tot_j + b2 * (tot_k - tot_j)) / g
    if v > best:
        best = v
    # B3 over the replica set of each live expert
    if g > 64:
        for i in range(n_live):
            s = rr[i]
            v = c + beta * ntok[i] / s
            if v > best:
                best = v
            v = c2 + gamma * ntok[i] / s
            if v > best:
                best = v
            v = a + (b * jj[i] + b2 * (kk[i] - jj[i])) / s
            if v > best:
                best = v
        return best
    # aggregate experts by distinct replica set, then sum over subsets: O(E log E + D^2)
    order = np.argsort(masks)
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
        s = dr[d]
        v = c + beta * sn / s
        if v > best:
            best = v
        v = c2 + gamma * sn / s
        if v > best:
            best = v
        v = a + (b * sj + b2 * (sk - sj)) / s
        if v > best:
            best = v
    return best


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
    return max(candidates)
