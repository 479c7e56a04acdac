"""tempo_fast (TEMPO §4.2): Numba kernel and plain-Python reference.

Private module (stumpy's split): :func:`tempo_kernel` is the jitted kernel,
:func:`tempo_reference` the plain-Python reference directly below it, written from the
stage descriptions and sharing no helper with the kernel. The kernel is ``nogil``: the
wrapper solves a stack of layers on a thread pool. The public wrapper is
:mod:`straggler.solvers.tempo`, which documents the stages and every tie-breaking rule.

Both take the token-LP candidate of stage 4 as an input (computed by
:mod:`~straggler.solvers._token_lp_fast`), so that no jitted function here calls into
another file (numba's cache would miss edits there).

Cost vector layout (``CostModel.as_array``): ``[a, b, b2, c, beta, c2, gamma, tile]``.
A GPU with ``G`` activated replicas, ``N`` tokens and ``T`` tiles takes
``max(a + b*G + b2*(T - G), c + beta*N, c2 + gamma*N)``, evaluated in exactly this order
in both implementations (and in :func:`~straggler.formulations.evaluate`), so the floats
agree bit for bit.

The expert order (descending tokens, ties lower index) comes from a stable radix sort.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._jit import NJIT

__all__ = [
    "INFO_FIELDS",
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
    "choice",  # 0: heuristic, 1: token LP, 2: A3, 3: semi-matching
    "chain_moves",  # augmenting chains applied in stage 2
    "ls_moves",  # local-search moves applied in stage 3 (to A_H)
)
_N_INFO = len(INFO_FIELDS)


@njit(**NJIT)
def _t(cost, G, N, T):
    """Modeled time of one GPU (the one cost family); inf above the activation cap cost[8]."""
    if G > cost[8]:
        return np.inf
    t = cost[0] + cost[1] * G + cost[2] * (T - G)
    u = cost[3] + cost[4] * N
    if u > t:
        t = u
    u = cost[5] + cost[6] * N
    if u > t:
        t = u
    return t


@njit(**NJIT)
def _expert_order(counts):
    """Experts by descending tokens, ties lower index (LSD radix sort on max - n, stable).

    The same order as sorting the unique keys ``-n_e * E + e``, without the branch
    mispredictions of a comparison sort (which dominate when layers stream past).
    """
    E = counts.shape[0]
    mx = 0
    for e in range(E):
        mx = max(mx, counts[e])
    order = np.arange(E)
    tmp = np.empty(E, np.int64)
    cnt = np.empty(257, np.int64)
    shift = 0
    while (mx >> shift) > 0:
        cnt[:] = 0
        for i in range(E):
            cnt[((mx - counts[order[i]]) >> shift & 255) + 1] += 1
        for d in range(256):
            cnt[d + 1] += cnt[d]
        for i in range(E):
            e = order[i]
            d = (mx - counts[e]) >> shift & 255
            tmp[cnt[d]] = e
            cnt[d] += 1
        order, tmp = tmp, order
        shift += 8
    return order


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


@njit(**NJIT)
def _act_build(x, g_ptr, g_exps, act, act_n):
    """Experts with tokens on each GPU, increasing: ``act[h, :act_n[h]]`` (branch-free)."""
    for h in range(act_n.shape[0]):
        k = 0
        for i in range(g_ptr[h], g_ptr[h + 1]):
            e = g_exps[i]
            act[h, k] = e
            k += np.int64(x[e, h] > 0)
        act_n[h] = k


@njit(**NJIT)
def _act_add(act, act_n, h, e):
    """Insert expert e into GPU h's active list, keeping it increasing."""
    k = act_n[h]
    while k > 0 and act[h, k - 1] > e:
        act[h, k] = act[h, k - 1]
        k -= 1
    act[h, k] = e
    act_n[h] += 1


@njit(**NJIT)
def _act_del(act, act_n, h, e):
    """Remove expert e from GPU h's active list."""
    k = 0
    while act[h, k] != e:
        k += 1
    for j in range(k, act_n[h] - 1):
        act[h, j] = act[h, j + 1]
    act_n[h] -= 1


@njit(**NJIT)
def _move(x, G, N, T, times, act, act_n, cost, tile, e, src, dst, q):
    """Send q tokens of expert e from GPU src to GPU dst, updating the state in place."""
    xs = x[e, src]
    xd = x[e, dst]
    G[src] -= 1 if q == xs else 0
    N[src] -= q
    T[src] += (xs - q + tile - 1) // tile - (xs + tile - 1) // tile
    G[dst] += 1 if xd == 0 else 0
    N[dst] += q
    T[dst] += (xd + q + tile - 1) // tile - (xd + tile - 1) // tile
    x[e, src] = xs - q
    x[e, dst] = xd + q
    times[src] = _t(cost, G[src], N[src], T[src])
    times[dst] = _t(cost, G[dst], N[dst], T[dst])
    if xd == 0:
        _act_add(act, act_n, dst, e)
    if q == xs:
        _act_del(act, act_n, src, e)


@njit(**NJIT)
def _local_search(x, G, N, T, times, replicas, e_ptr, e_gpus, act, act_n, cost, tile, max_iter,
                  stop_at):  # fmt: skip
    """Stage 3 on the state (x, G, N, T, times, act, act_n), in place; returns the move count."""
    g = times.shape[0]
    n_ls = 0
    while n_ls < max_iter:
        M = times.max()
        if M <= stop_at:
            break
        best_v = M
        bs = be = bd = bq = -1
        for s in range(g):
            if times[s] != M:
                continue
            for i in range(act_n[s]):
                e = act[s, i]
                xs = x[e, s]
                if xs == 0:
                    continue
                ks = (xs + tile - 1) // tile
                ts_full = _t(cost, G[s] - 1, N[s] - xs, T[s] - ks)
                for j in range(e_ptr[e], e_ptr[e + 1]):
                    d = e_gpus[j]
                    if d == s or times[d] >= best_v:
                        continue
                    xd = x[e, d]
                    kd = (xd + tile - 1) // tile
                    Gd = G[d] + (1 if xd == 0 else 0)
                    v = max(
                        ts_full, _t(cost, Gd, N[d] + xs, T[d] - kd + (xd + xs + tile - 1) // tile)
                    )
                    if v < best_v:
                        best_v = v
                        bs = s
                        be = e
                        bd = d
                        bq = xs
                    if xs < 2:
                        continue
                    b_lo = _t(cost, Gd, N[d] + 1, T[d] - kd + (xd + 1 + tile - 1) // tile)
                    a_lo = _t(cost, G[s], N[s] - (xs - 1), T[s] - ks + 1)
                    if b_lo >= best_v or a_lo >= best_v:
                        continue
                    # max(A, B) >= t(0, ceil((N_s + N_d) / 2), 0): the best even split
                    if _t(cost, 0, (N[s] + N[d] + 1) // 2, 0) >= best_v:
                        continue
                    lo = 1
                    hi = xs
                    while lo < hi:
                        mid = (lo + hi) // 2
                        am = _t(cost, G[s], N[s] - mid, T[s] - ks + (xs - mid + tile - 1) // tile)
                        bm = _t(cost, Gd, N[d] + mid, T[d] - kd + (xd + mid + tile - 1) // tile)
                        if bm >= am:
                            hi = mid
                        else:
                            lo = mid + 1
                    for q in (lo - 1, lo):
                        if q < 1 or q > xs - 1:
                            continue
                        aq = _t(cost, G[s], N[s] - q, T[s] - ks + (xs - q + tile - 1) // tile)
                        bq_ = _t(cost, Gd, N[d] + q, T[d] - kd + (xd + q + tile - 1) // tile)
                        v = max(aq, bq_)
                        if v < best_v:
                            best_v = v
                            bs = s
                            be = e
                            bd = d
                            bq = q
        bf = -1
        if bs < 0:
            # Fallback: swaps. q tokens of e go from s to d (full or partial, same bisection)
            # while the whole share of another expert f goes from d to s.
            # Pruning (lower bounds that cannot beat best_v, so the result is unchanged):
            # t >= a + b*G since T >= G, and t >= _t(0, N, 0) for the token pieces; d's
            # new time is at least t(G_d', N_d + 1 - (largest share on d), G_d').
            maxq = np.zeros(g, np.int64)
            for h in range(g):
                for i in range(act_n[h]):
                    maxq[h] = max(maxq[h], x[act[h, i], h])
            for s in range(g):
                if times[s] != M or _t(cost, G[s] - 1, 0, G[s] - 1) >= best_v:
                    continue
                for i in range(act_n[s]):
                    e = act[s, i]
                    xs = x[e, s]
                    if xs == 0:
                        continue
                    ks = (xs + tile - 1) // tile
                    # an f not yet on s leaves s with G_s (whole e) or G_s + 1 activations
                    only_on_s = _t(cost, G[s], N[s] - xs + 1, G[s]) >= best_v and (
                        xs < 2 or _t(cost, G[s] + 1, N[s] - xs + 2, G[s] + 1) >= best_v
                    )
                    for j in range(e_ptr[e], e_ptr[e + 1]):
                        d = e_gpus[j]
                        if d == s:
                            continue
                        xd = x[e, d]
                        kd = (xd + tile - 1) // tile
                        gd = G[d] - 1 + (1 if xd == 0 else 0)
                        if _t(cost, gd, N[d] + 1 - maxq[d], gd) >= best_v:
                            continue
                        for i2 in range(act_n[d]):
                            f = act[d, i2]
                            yd = x[f, d]
                            if f == e or yd == 0 or not replicas[f, s]:
                                continue
                            if only_on_s and x[f, s] == 0:
                                continue
                            if (
                                _t(cost, 0, N[s] - xs + yd, 0) >= best_v
                                or _t(cost, 0, N[d] + 1 - yd, 0) >= best_v
                            ):
                                continue
                            ys = x[f, s]
                            Gs = G[s] + (1 if ys == 0 else 0)
                            Ts = T[s] - ks - (ys + tile - 1) // tile + (ys + yd + tile - 1) // tile
                            Gd = G[d] - 1 + (1 if xd == 0 else 0)
                            Td = T[d] - kd - (yd + tile - 1) // tile
                            v = max(
                                _t(cost, Gs - 1, N[s] - xs + yd, Ts),
                                _t(cost, Gd, N[d] + xs - yd, Td + (xd + xs + tile - 1) // tile),
                            )
                            if v < best_v:
                                best_v = v
                                bs = s
                                be = e
                                bd = d
                                bq = xs
                                bf = f
                            if xs < 2:
                                continue
                            a_lo = _t(cost, Gs, N[s] - (xs - 1) + yd, Ts + 1)
                            b_lo = _t(cost, Gd, N[d] + 1 - yd, Td + (xd + 1 + tile - 1) // tile)
                            if b_lo >= best_v or a_lo >= best_v:
                                continue
                            # max(A, B) >= t(0, ceil((N_s + N_d) / 2), 0): the best even split
                            if _t(cost, 0, (N[s] + N[d] + 1) // 2, 0) >= best_v:
                                continue
                            lo = 1
                            hi = xs
                            while lo < hi:
                                mid = (lo + hi) // 2
                                am = _t(
                                    cost, Gs, N[s] - mid + yd, Ts + (xs - mid + tile - 1) // tile
                                )
                                bm = _t(
                                    cost, Gd, N[d] + mid - yd, Td + (xd + mid + tile - 1) // tile
                                )
                                if bm >= am:
                                    hi = mid
                                else:
                                    lo = mid + 1
                            for q in (lo - 1, lo):
                                if q < 1 or q > xs - 1:
                                    continue
                                aq = _t(cost, Gs, N[s] - q + yd, Ts + (xs - q + tile - 1) // tile)
                                bq_ = _t(cost, Gd, N[d] + q - yd, Td + (xd + q + tile - 1) // tile)
                                v = max(aq, bq_)
                                if v < best_v:
                                    best_v = v
                                    bs = s
                                    be = e
                                    bd = d
                                    bq = q
                                    bf = f
        bm = -1
        be2 = -1
        if bs < 0:
            # Fallback 2: ejection chains. e's whole share goes from s to m, another expert
            # e2's whole share from m to d (d not s); all three new times below best_v.
            # Pruning (exact, t is nondecreasing in G, N, T and T >= G): m's new time is at
            # least t(G_m', N_m + x_s - (largest share on m), G_m'); a destination d not
            # holding e2 gets at least t(G_d + 1, N_d + 1, T_d + 1) (tadd); with no GPU
            # below best_v under that, e2 needs another GPU holding it (nnz).
            maxq = np.zeros(g, np.int64)
            tadd = np.empty(g)
            nnz = np.zeros(x.shape[0], np.int64)
            for h in range(g):
                for i in range(act_n[h]):
                    maxq[h] = max(maxq[h], x[act[h, i], h])
                    nnz[act[h, i]] += 1
                tadd[h] = _t(cost, G[h] + 1, N[h] + 1, T[h] + 1)
            for s in range(g):
                if times[s] != M:
                    continue
                for i in range(act_n[s]):
                    e = act[s, i]
                    xs = x[e, s]
                    if xs == 0:
                        continue
                    ts = _t(cost, G[s] - 1, N[s] - xs, T[s] - (xs + tile - 1) // tile)
                    if ts >= best_v:
                        continue
                    for j in range(e_ptr[e], e_ptr[e + 1]):
                        m = e_gpus[j]
                        if m == s:
                            continue
                        xm = x[e, m]
                        Gm = G[m] + (1 if xm == 0 else 0)
                        if _t(cost, Gm - 1, N[m] + xs - maxq[m], Gm - 1) >= best_v:
                            continue
                        Tm = T[m] - (xm + tile - 1) // tile + (xm + xs + tile - 1) // tile
                        rec = False  # a GPU other than s, m that could take a new expert
                        for h in range(g):
                            if h != s and h != m and tadd[h] < best_v:
                                rec = True
                                break
                        for i2 in range(act_n[m]):
                            e2 = act[m, i2]
                            q2 = x[e2, m]
                            if e2 == e or q2 == 0 or (not rec and nnz[e2] < 2):
                                continue
                            tm = _t(cost, Gm - 1, N[m] + xs - q2, Tm - (q2 + tile - 1) // tile)
                            if tm >= best_v:
                                continue
                            for j2 in range(e_ptr[e2], e_ptr[e2 + 1]):
                                d = e_gpus[j2]
                                if d == m or d == s or times[d] >= best_v:
                                    continue
                                yd = x[e2, d]
                                if yd == 0 and tadd[d] >= best_v:
                                    continue
                                td = _t(
                                    cost,
                                    G[d] + (1 if yd == 0 else 0),
                                    N[d] + q2,
                                    T[d] - (yd + tile - 1) // tile + (yd + q2 + tile - 1) // tile,
                                )
                                v = max(ts, max(tm, td))
                                if v < best_v:
                                    best_v = v
                                    bs = s
                                    be = e
                                    bm = m
                                    be2 = e2
                                    bd = d
                                    bq = xs
        be3 = -1
        if bs < 0 and cost[8] < np.inf:
            # Fallback 2b, under an activation cap only (the capped polish): rotations. The
            # whole shares of three distinct experts go around s -> m -> d -> s (three
            # distinct GPUs); all three new times below best_v. Each GPU loses one expert
            # and gains one, so with every GPU at the cap this is the move that is left.
            for s in range(g):
                if times[s] != M:
                    continue
                for i in range(act_n[s]):
                    e = act[s, i]
                    xs = x[e, s]
                    ks = (xs + tile - 1) // tile
                    for j in range(e_ptr[e], e_ptr[e + 1]):
                        m = e_gpus[j]
                        if m == s:
                            continue
                        xm = x[e, m]
                        Gm = G[m] + (1 if xm == 0 else 0) - 1
                        Tm = T[m] - (xm + tile - 1) // tile + (xm + xs + tile - 1) // tile
                        for i2 in range(act_n[m]):
                            e2 = act[m, i2]
                            if e2 == e:
                                continue
                            q2 = x[e2, m]
                            tm = _t(cost, Gm, N[m] + xs - q2, Tm - (q2 + tile - 1) // tile)
                            if tm >= best_v:
                                continue
                            for j2 in range(e_ptr[e2], e_ptr[e2 + 1]):
                                d = e_gpus[j2]
                                if d == s or d == m:
                                    continue
                                yd = x[e2, d]
                                Gd = G[d] + (1 if yd == 0 else 0) - 1
                                Td = T[d] - (yd + tile - 1) // tile + (yd + q2 + tile - 1) // tile
                                for i3 in range(act_n[d]):
                                    e3 = act[d, i3]
                                    if e3 == e or e3 == e2 or not replicas[e3, s]:
                                        continue
                                    q3 = x[e3, d]
                                    td = _t(cost, Gd, N[d] + q2 - q3, Td - (q3 + tile - 1) // tile)
                                    if td >= best_v:
                                        continue
                                    zs = x[e3, s]
                                    ts = _t(
                                        cost,
                                        G[s] - 1 + (1 if zs == 0 else 0),
                                        N[s] - xs + q3,
                                        T[s]
                                        - ks
                                        - (zs + tile - 1) // tile
                                        + (zs + q3 + tile - 1) // tile,
                                    )
                                    v = max(ts, max(tm, td))
                                    if v < best_v:
                                        best_v = v
                                        bs = s
                                        be = e
                                        bm = m
                                        be2 = e2
                                        bd = d
                                        be3 = e3
                                        bq = xs
        if bs < 0:
            # Fallback 3: leximax moves below the makespan, to make room. GPUs not at M by
            # decreasing time (ties: lower index); the first with a move taking both new
            # times below its own time (a strict decrease of the sorted time vector) gives
            # the best such move. M never increases; nothing can cycle.
            g_order = np.argsort(-times, kind="mergesort")
            for r in range(g):
                s = g_order[r]
                if times[s] == M:
                    continue
                best_v = times[s]
                for i in range(act_n[s]):
                    e = act[s, i]
                    xs = x[e, s]
                    if xs == 0:
                        continue
                    ks = (xs + tile - 1) // tile
                    ts_full = _t(cost, G[s] - 1, N[s] - xs, T[s] - ks)
                    for j in range(e_ptr[e], e_ptr[e + 1]):
                        d = e_gpus[j]
                        if d == s or times[d] >= best_v:
                            continue
                        xd = x[e, d]
                        kd = (xd + tile - 1) // tile
                        Gd = G[d] + (1 if xd == 0 else 0)
                        v = max(
                            ts_full,
                            _t(cost, Gd, N[d] + xs, T[d] - kd + (xd + xs + tile - 1) // tile),
                        )
                        if v < best_v:
                            best_v = v
                            bs = s
                            be = e
                            bd = d
                            bq = xs
                        if xs < 2:
                            continue
                        b_lo = _t(cost, Gd, N[d] + 1, T[d] - kd + (xd + 1 + tile - 1) // tile)
                        a_lo = _t(cost, G[s], N[s] - (xs - 1), T[s] - ks + 1)
                        if b_lo >= best_v or a_lo >= best_v:
                            continue
                        # max(A, B) >= t(0, ceil((N_s + N_d) / 2), 0): the best even split
                        if _t(cost, 0, (N[s] + N[d] + 1) // 2, 0) >= best_v:
                            continue
                        lo = 1
                        hi = xs
                        while lo < hi:
                            mid = (lo + hi) // 2
                            am = _t(
                                cost, G[s], N[s] - mid, T[s] - ks + (xs - mid + tile - 1) // tile
                            )
                            bm_ = _t(
                                cost, Gd, N[d] + mid, T[d] - kd + (xd + mid + tile - 1) // tile
                            )
                            if bm_ >= am:
                                hi = mid
                            else:
                                lo = mid + 1
                        for q in (lo - 1, lo):
                            if q < 1 or q > xs - 1:
                                continue
                            aq = _t(cost, G[s], N[s] - q, T[s] - ks + (xs - q + tile - 1) // tile)
                            bq_ = _t(cost, Gd, N[d] + q, T[d] - kd + (xd + q + tile - 1) // tile)
                            v = max(aq, bq_)
                            if v < best_v:
                                best_v = v
                                bs = s
                                be = e
                                bd = d
                                bq = q
                if bs >= 0:
                    break
        if bs < 0:
            break
        if bf >= 0:
            _move(x, G, N, T, times, act, act_n, cost, tile, bf, bd, bs, x[bf, bd])
        if be3 >= 0:
            q2 = x[be2, bm]
            q3 = x[be3, bd]
            _move(x, G, N, T, times, act, act_n, cost, tile, be, bs, bm, bq)
            _move(x, G, N, T, times, act, act_n, cost, tile, be2, bm, bd, q2)
            _move(x, G, N, T, times, act, act_n, cost, tile, be3, bd, bs, q3)
        elif bm >= 0:
            _move(x, G, N, T, times, act, act_n, cost, tile, be, bs, bm, bq)
            _move(x, G, N, T, times, act, act_n, cost, tile, be2, bm, bd, x[be2, bm])
        else:
            _move(x, G, N, T, times, act, act_n, cost, tile, be, bs, bd, bq)
        n_ls += 1
    return n_ls


@njit(**NJIT)
def tempo_kernel(counts, replicas, cost, lp_shares, sm_assign, seed, chains, local_search, ensemble,
                 tau, max_iter):  # fmt: skip
    """One layer of tempo_fast.

    Parameters
    ----------
    counts : ndarray of int64, shape (n_experts,)
    replicas : ndarray of bool, shape (n_experts, n_gpus)
    cost : ndarray of float64, shape (8,)
        ``CostModel.as_array()``.
    lp_shares : ndarray of int64, shape (n_experts, n_gpus)
        The integral token-LP dispatch (``max_g N_g = ceil(lambda*)``): a stage-4
        candidate, and with ``sm_assign`` the integral lower bound that stops stage 3.
    sm_assign : ndarray of int64, shape (n_experts,)
        An optimal semi-matching (GPU of each live expert, -1 otherwise).
    seed, chains, local_search, ensemble : bool
        Stage switches.
    tau : float
        Switching tolerance of stage 4.
    max_iter : int
        Iteration cap of stage 3.

    Returns
    -------
    shares : ndarray of int64, shape (n_experts, n_gpus)
    info : ndarray of float64, shape (len(INFO_FIELDS),)
    """
    E, g = replicas.shape
    tile = np.int64(cost[7])
    info = np.full(_N_INFO, np.nan)
    # internal cost vector: a ninth entry caps the activations of a GPU (inf: no cap)
    cost = np.append(cost, np.inf)
    # replica lists: GPUs of each expert, experts of each GPU (increasing order)
    # (branch-free: unpredictable branches on the replica bits dominate the cost otherwise;
    # each list carries one scratch slot at its end for the writes that do not count)
    e_ptr = np.zeros(E + 1, np.int64)
    g_ptr = np.zeros(g + 1, np.int64)
    for e in range(E):
        k = 0
        for h in range(g):
            r = np.int64(replicas[e, h])
            k += r
            g_ptr[h + 1] += r
        e_ptr[e + 1] = e_ptr[e] + k
    for h in range(g):
        g_ptr[h + 1] += g_ptr[h]
    e_gpus = np.empty(e_ptr[E] + 1, np.int64)
    g_exps = np.empty(g_ptr[g] + 1, np.int64)
    k = 0
    for e in range(E):
        for h in range(g):
            e_gpus[k] = h
            k += np.int64(replicas[e, h])
    for h in range(g):
        k = g_ptr[h]
        for e in range(E):
            g_exps[k] = e
            k += np.int64(replicas[e, h])

    x = np.zeros((E, g), np.int64)
    G = np.zeros(g, np.int64)
    N = np.zeros(g, np.int64)
    T = np.zeros(g, np.int64)
    times = np.empty(g)
    for h in range(g):
        times[h] = _t(cost, 0, 0, 0)
    M = times.max()

    # Stage 1: whole experts by descending tokens (ties: lower index), each on the replica
    # minimizing (marginal cost t_new - t_old of that GPU, t_new, GPU index); seed=False
    # puts each on its lowest-index replica instead.
    # descending tokens, ties lower index (radix sort; the reference sorts (-n_e, e))
    order = _expert_order(counts)
    for i in range(E):
        e = order[i]
        n = counts[e]
        if n == 0:
            break
        kn = (n + tile - 1) // tile
        best = -1
        bk1 = np.inf
        bk2 = np.inf
        # (the makespan is not needed here: it only grows, and stages 2-4 read times)
        for j in range(e_ptr[e], e_ptr[e + 1]):
            h = e_gpus[j]
            if not seed:
                best = h
                break
            tn = _t(cost, G[h] + 1, N[h] + n, T[h] + kn)
            k1 = tn - times[h]
            if best < 0 or k1 < bk1 or (k1 == bk1 and tn < bk2):
                best = h
                bk1 = k1
                bk2 = tn
        x[e, best] = n
        G[best] += 1
        N[best] += n
        T[best] += kn
        times[best] = _t(cost, G[best], N[best], T[best])
        if times[best] > M:
            M = times[best]
    info[1] = times.max()

    # Stage 2: 1- and 2-step augmenting chains on max G; a chain is applied only if the
    # makespan does not increase; the best chain minimizes (makespan, max time of the GPUs
    # it changes), first found on ties; 2-step chains are searched only without a 1-step.
    # experts with tokens on each GPU (increasing), kept up to date by every move
    act = np.empty((g, E), np.int64)
    act_n = np.zeros(g, np.int64)
    _act_build(x, g_ptr, g_exps, act, act_n)
    n_chain = 0
    nnz = np.zeros(E, np.int64)  # GPUs holding each expert
    for e in range(E):
        for j in range(e_ptr[e], e_ptr[e + 1]):
            nnz[e] += np.int64(x[e, e_gpus[j]] > 0)
    top = np.full(4, -1, np.int64)
    while chains:
        M = times.max()
        Gmax = G.max()
        # (pruning only, the result is that of the full enumeration: a chain's value is at
        # least the new time of each GPU it changes; a destination not holding the expert
        # needs G <= Gmax - 2, and with no such GPU only a split expert has one)
        low = 0
        for h in range(g):
            low += np.int64(G[h] <= Gmax - 2)
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
        cs = cm = cd = ce = ce2 = -1
        for s in range(g):
            if G[s] != Gmax:
                continue
            # the least the other GPUs can leave: excluding the largest one (or two) but s
            o1 = top[0] if top[0] != s else top[1]
            rl1 = _rest_max(times, top, s, o1, -1)
            for i in range(act_n[s]):
                e = act[s, i]
                q = x[e, s]
                if q == 0 or (low == 0 and nnz[e] < 2):
                    continue
                ts = _t(cost, G[s] - 1, N[s] - q, T[s] - (q + tile - 1) // tile)
                lb = max(ts, rl1)
                if ts > M or lb > bv1 or (lb == bv1 and ts >= bv2):
                    continue
                for j in range(e_ptr[e], e_ptr[e + 1]):
                    d = e_gpus[j]
                    xd = x[e, d]
                    if d == s or (xd == 0 and G[d] > Gmax - 2):
                        continue
                    Gd = G[d] + (1 if xd == 0 else 0)
                    Td = T[d] - (xd + tile - 1) // tile + (xd + q + tile - 1) // tile
                    td = _t(cost, Gd, N[d] + q, Td)
                    v2 = max(ts, td)
                    v1 = max(v2, _rest_max(times, top, s, d, -1))
                    if v1 <= M and (v1 < bv1 or (v1 == bv1 and v2 < bv2)):
                        bv1 = v1
                        bv2 = v2
                        kind = 1
                        cs = s
                        ce = e
                        cd = d
        if kind == 0:
            for s in range(g):
                if G[s] != Gmax:
                    continue
                o1 = -1
                o2 = -1
                for r in range(4):
                    if top[r] >= 0 and top[r] != s:
                        if o1 < 0:
                            o1 = top[r]
                        elif o2 < 0:
                            o2 = top[r]
                rl2 = _rest_max(times, top, s, o1, o2)
                for i in range(act_n[s]):
                    e = act[s, i]
                    q = x[e, s]
                    if q == 0:
                        continue
                    kq = (q + tile - 1) // tile
                    ts = _t(cost, G[s] - 1, N[s] - q, T[s] - kq)
                    lb = max(ts, rl2)
                    if ts > M or lb > bv1 or (lb == bv1 and ts >= bv2):
                        continue
                    for j in range(e_ptr[e], e_ptr[e + 1]):
                        m = e_gpus[j]
                        if m == s or x[e, m] != 0 or G[m] != Gmax - 1:
                            continue
                        for i2 in range(act_n[m]):
                            e2 = act[m, i2]
                            q2 = x[e2, m]
                            if e2 == e or q2 == 0 or (low == 0 and nnz[e2] < 2):
                                continue
                            tm = _t(cost, Gmax - 1, N[m] + q - q2,
                                    T[m] + kq - (q2 + tile - 1) // tile)  # fmt: skip
                            lb2 = max(ts, tm)
                            lb = max(lb2, rl2)
                            if tm > M or lb > bv1 or (lb == bv1 and lb2 >= bv2):
                                continue
                            for j2 in range(e_ptr[e2], e_ptr[e2 + 1]):
                                d = e_gpus[j2]
                                xd = x[e2, d]
                                if d == m or d == s or (xd == 0 and G[d] > Gmax - 2):
                                    continue
                                Gd = G[d] + (1 if xd == 0 else 0)
                                Td = T[d] - (xd + tile - 1) // tile + (xd + q2 + tile - 1) // tile
                                td = _t(cost, Gd, N[d] + q2, Td)
                                v2 = max(ts, max(tm, td))
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
            break
        q = x[ce, cs]
        if kind == 1:
            cm = cd
        # move expert ce's share from cs to cm
        G[cs] -= 1
        N[cs] -= q
        T[cs] -= (q + tile - 1) // tile
        G[cm] += 1 if x[ce, cm] == 0 else 0
        N[cm] += q
        T[cm] += (x[ce, cm] + q + tile - 1) // tile - (x[ce, cm] + tile - 1) // tile
        nnz[ce] += (1 if x[ce, cm] == 0 else 0) - 1
        if x[ce, cm] == 0:
            _act_add(act, act_n, cm, ce)
        _act_del(act, act_n, cs, ce)
        x[ce, cm] += q
        x[ce, cs] = 0
        if kind == 2:
            # then expert ce2's share from cm to cd
            q2 = x[ce2, cm]
            G[cm] -= 1
            N[cm] -= q2
            T[cm] -= (q2 + tile - 1) // tile
            G[cd] += 1 if x[ce2, cd] == 0 else 0
            N[cd] += q2
            T[cd] += (x[ce2, cd] + q2 + tile - 1) // tile - (x[ce2, cd] + tile - 1) // tile
            nnz[ce2] += (1 if x[ce2, cd] == 0 else 0) - 1
            if x[ce2, cd] == 0:
                _act_add(act, act_n, cd, ce2)
            _act_del(act, act_n, cm, ce2)
            x[ce2, cd] += q2
            x[ce2, cm] = 0
        for h in (cs, cm, cd):
            times[h] = _t(cost, G[h], N[h], T[h])
        n_chain += 1
    info[2] = times.max()

    # Stage 3: bottleneck local search. A move sends q tokens of expert e from a GPU s at
    # the makespan to another replica d; it improves iff both new times are below the
    # makespan (the makespan drops, or the number of GPUs at it does). The best move
    # minimizes max(new t_s, new t_d); first found on ties, in the order s, e, d
    # increasing, the full move before partial ones. Partial q in [1, x-1]: the source time
    # A(q) is nonincreasing and the destination time B(q) nondecreasing, so with
    # q* = min{q : B(q) >= A(q)} (binary search) the best split is q*-1 or q* (the former
    # on ties).
    # integral lower bound: no whole-token dispatch goes below it, so the search stops there
    lp_load = np.zeros(g, np.int64)
    for e in range(E):
        for h in range(g):
            lp_load[h] += lp_shares[e, h]
    lp_nmax = lp_load.max()
    sm_cnt = np.zeros(g, np.int64)
    for e in range(E):
        if counts[e] > 0:
            sm_cnt[sm_assign[e]] += 1
    stop_at = max(_t(cost, 0, lp_nmax, 0), _t(cost, sm_cnt.max(), 0, sm_cnt.max()))
    n_ls = 0
    if local_search:
        n_ls = _local_search(x, G, N, T, times, replicas, e_ptr, e_gpus, act, act_n, cost, tile,
                             max_iter, stop_at)  # fmt: skip
    m_h = times.max()
    info[3] = m_h

    # Stage 4: ensemble (Proposition 1). Candidates, in this order: the token-LP dispatch,
    # A3 round robin (rank r -> GPU r mod g) when every live expert is replicated on every
    # GPU, and the optimal semi-matching (whole experts). A candidate below M(A_H) is first
    # improved by the stage-3 local search (when that stage is on and the integral lower
    # bound leaves room to switch: stop_at < (1 - tau) M(A_H)); the best (first on ties)
    # replaces A_H iff it is below (1 - tau) M(A_H). A candidate's state is built from its
    # live entries; its share matrix only when it is polished or taken.
    out = x
    m_out = m_h
    choice = 0
    if ensemble:
        full = True
        for e in range(E):
            if counts[e] > 0 and e_ptr[e + 1] - e_ptr[e] != g:
                full = False
                break
        # A_H activates more than SM replicas on a GPU whose floor reaches the makespan
        act_bound = G.max() > sm_cnt.max() and _t(cost, G.max(), 0, G.max()) >= m_h
        room = stop_at < (1.0 - tau) * m_h
        best_c = np.inf
        for cand in range(1, 4):
            if cand == 2 and not full:
                continue
            Gc = np.zeros(g, np.int64)
            Nc = np.zeros(g, np.int64)
            Tc = np.zeros(g, np.int64)
            if cand == 1:
                for e in range(E):
                    for j in range(e_ptr[e], e_ptr[e + 1]):
                        h = e_gpus[j]
                        v = lp_shares[e, h]
                        if v > 0:
                            Gc[h] += 1
                            Nc[h] += v
                            Tc[h] += (v + tile - 1) // tile
            else:
                r = 0
                for i in range(E):
                    e = order[i]
                    n = counts[e]
                    if n == 0:
                        break
                    h = r % g if cand == 2 else sm_assign[e]
                    Gc[h] += 1
                    Nc[h] += n
                    Tc[h] += (n + tile - 1) // tile
                    r += 1
            tc = np.empty(g)
            for h in range(g):
                tc[h] = _t(cost, Gc[h], Nc[h], Tc[h])
            m_c = tc.max()
            info[3 + cand] = m_c
            polish = local_search and room and (m_c < m_h or (cand == 3 and act_bound))
            if polish or (m_c < best_c and m_c < (1.0 - tau) * m_h):
                y = np.zeros((E, g), np.int64)
                if cand == 1:
                    y[:, :] = lp_shares
                else:
                    r = 0
                    for i in range(E):
                        e = order[i]
                        if counts[e] == 0:
                            break
                        y[e, r % g if cand == 2 else sm_assign[e]] = counts[e]
                        r += 1
                if polish:
                    act_c = np.empty((g, E), np.int64)
                    act_nc = np.zeros(g, np.int64)
                    _act_build(y, g_ptr, g_exps, act_c, act_nc)
                    if cand == 3:
                        # first balance under the activation cap SM, then without it
                        capped = cost.copy()
                        capped[8] = sm_cnt.max()
                        _local_search(y, Gc, Nc, Tc, tc, replicas, e_ptr, e_gpus, act_c, act_nc,
                                      capped, tile, max_iter, stop_at)  # fmt: skip
                    _local_search(y, Gc, Nc, Tc, tc, replicas, e_ptr, e_gpus, act_c, act_nc,
                                  cost, tile, max_iter, stop_at)  # fmt: skip
                    m_c = tc.max()
                if m_c < best_c and m_c < (1.0 - tau) * m_h:
                    choice = cand
                    out = y
                    m_out = m_c
            if m_c < best_c:
                best_c = m_c
                info[7] = m_c
    info[0] = m_out
    info[8] = choice
    info[9] = n_chain
    info[10] = n_ls
    return out, info


def tempo_reference(counts, replicas, cost, lp_shares, sm_assign, seed, chains, local_search,
                    ensemble, tau, max_iter):  # fmt: skip
    """Plain-Python reference of :func:`tempo_kernel`: same stages, same tie-breaking.

    Written from the stage descriptions without incremental bookkeeping: every candidate
    is scored by recomputing the changed GPUs from the shares, and the partial split
    ``q*`` is found by scanning ``q = 1, 2, ...`` instead of bisection.

    Examples
    --------
    TEMPO Fig. 1b (``b = 15``, ``beta = 0.1``): only the hot expert is split, 60 us (the
    optimum).

    >>> cost = [0.0, 15.0, 0.0, 0.0, 0.1, 0.0, 0.0, 128.0]
    >>> lp = [[300, 300]] + [[30, 0]] * 3 + [[0, 30]] * 3
    >>> x, info = tempo_reference([600] + [30] * 6, [[True, True]] * 7, cost, lp,
    ...                           [0, 0, 0, 0, 1, 1, 1], True, True, True, False, 0.01, 300)
    >>> (x > 0).sum(axis=1).tolist(), float(info[0])
    ([2, 1, 1, 1, 1, 1, 1], 60.0)
    """
    counts = [int(c) for c in counts]
    R = [[bool(r) for r in row] for row in replicas]
    a, b, b2, c, beta, c2, gamma, tile = (float(v) for v in cost)
    tile = int(tile)
    E, g = len(R), len(R[0])
    x = [[0] * g for _ in range(E)]

    def ceil_tiles(v):
        return -(-v // tile)

    def gpu(h, y):
        """(G, N, T) of GPU h under shares y."""
        col = [y[e][h] for e in range(E) if y[e][h] > 0]
        return len(col), sum(col), sum(ceil_tiles(v) for v in col)

    def time_of(G, N, T, cap=float("inf")):
        if G > cap:
            return float("inf")
        return max(a + b * G + b2 * (T - G), c + beta * N, c2 + gamma * N)

    def times_of(y, cap=float("inf")):
        return [time_of(*gpu(h, y), cap) for h in range(g)]

    def moved(y, moves):
        """Copy of y with moves (e, src, dst, q) applied in order."""
        z = [row[:] for row in y]
        for e, src, dst, q in moves:
            z[e][src] -= q
            z[e][dst] += q
        return z

    # Stage 1: cost-aware greedy seeding.
    order = sorted(range(E), key=lambda e: (-counts[e], e))
    for e in order:
        n = counts[e]
        if n == 0:
            break
        cands = [h for h in range(g) if R[e][h]]
        if seed:

            def key(h, n=n, y=x):
                G, N, T = gpu(h, y)
                tn = time_of(G + 1, N + n, T + ceil_tiles(n))
                return (tn - time_of(G, N, T), tn, h)

            h = min(cands, key=key)
        else:
            h = cands[0]
        x[e][h] = n
    info = [float("nan")] * len(INFO_FIELDS)
    info[1] = max(times_of(x))

    # Stage 2: augmenting chains.
    n_chain = 0
    while chains:
        times = times_of(x)
        M = max(times)
        Gs = [gpu(h, x)[0] for h in range(g)]
        Gmax = max(Gs)

        def allowed(e, d, y=x, Gs=Gs, Gmax=Gmax):
            return y[e][d] > 0 or Gs[d] <= Gmax - 2

        def value(moves, touched, y=x):
            new = times_of(moved(y, moves))
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
                    v = value([(e, s, d, x[e][s])], (s, d))
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
                                v = value(moves, (s, m, d))
                                if v[0] <= M and (best is None or v < best[0]):
                                    best = (v, moves)
        if best is None:
            break
        x = moved(x, best[1])
        n_chain += 1
    info[2] = max(times_of(x))

    # Stage 3: bottleneck local search (moves, partial migrations, swaps as fallback),
    # stopped at the integral lower bound.
    lp = [[int(v) for v in row] for row in lp_shares]
    lp_nmax = max(sum(lp[e][h] for e in range(E)) for h in range(g))
    sm_max = max([list(sm_assign[e] for e in range(E) if counts[e] > 0).count(h) for h in range(g)])
    stop_at = max(time_of(0, lp_nmax, 0), time_of(sm_max, 0, sm_max))

    def search(x, cap=float("inf")):
        def times_cap(y):
            return times_of(y, cap)

        n_ls = 0
        while n_ls < max_iter:
            times = times_cap(x)
            M = max(times)
            if M <= stop_at:
                break
            best_v, best_move = M, None
            for s in range(g):
                if times[s] != M:
                    continue
                for e in range(E):
                    xs = x[e][s]
                    if xs == 0:
                        continue
                    for d in range(g):
                        if d == s or not R[e][d]:
                            continue

                        def f(q, e=e, s=s, d=d, y=x):
                            new = times_cap(moved(y, [(e, s, d, q)]))
                            return new[s], new[d]

                        v = max(f(xs))
                        if v < best_v:
                            best_v, best_move = v, (e, s, d, xs)
                        if xs < 2:
                            continue
                        q_star = 1
                        while q_star < xs and f(q_star)[1] < f(q_star)[0]:
                            q_star += 1
                        for q in (q_star - 1, q_star):
                            if 1 <= q <= xs - 1:
                                v = max(f(q))
                                if v < best_v:
                                    best_v, best_move = v, (e, s, d, q)
            if best_move is None:
                # fallback: swaps (q of e from s to d, all of another expert f from d to s)
                for s in range(g):
                    if times[s] != M:
                        continue
                    for e in range(E):
                        xs = x[e][s]
                        if xs == 0:
                            continue
                        for d in range(g):
                            if d == s or not R[e][d]:
                                continue
                            for f2 in range(E):
                                if f2 == e or x[f2][d] == 0 or not R[f2][s]:
                                    continue
                                back = (f2, d, s, x[f2][d])

                                def fs(q, e=e, s=s, d=d, back=back, y=x):
                                    new = times_cap(moved(y, [back, (e, s, d, q)]))
                                    return new[s], new[d]

                                v = max(fs(xs))
                                if v < best_v:
                                    best_v, best_move = v, [back, (e, s, d, xs)]
                                if xs < 2:
                                    continue
                                q_star = 1
                                while q_star < xs and fs(q_star)[1] < fs(q_star)[0]:
                                    q_star += 1
                                for q in (q_star - 1, q_star):
                                    if 1 <= q <= xs - 1:
                                        v = max(fs(q))
                                        if v < best_v:
                                            best_v, best_move = v, [back, (e, s, d, q)]
                if best_move is None:
                    # fallback 2: ejection chains (e: s -> m whole, then e2: m -> d whole)
                    for s in range(g):
                        if times[s] != M:
                            continue
                        for e in range(E):
                            if x[e][s] == 0:
                                continue
                            for m in range(g):
                                if m == s or not R[e][m]:
                                    continue
                                for e2 in range(E):
                                    if e2 == e or x[e2][m] == 0:
                                        continue
                                    for d in range(g):
                                        if d in (m, s) or not R[e2][d]:
                                            continue
                                        moves = [(e, s, m, x[e][s]), (e2, m, d, x[e2][m])]
                                        new = times_cap(moved(x, moves))
                                        v = max(new[s], new[m], new[d])
                                        if v < best_v:
                                            best_v, best_move = v, moves
                if best_move is None and cap < float("inf"):
                    # fallback 2b (capped search only): rotations of three whole shares,
                    # e: s -> m, e2: m -> d, e3: d -> s
                    for s in range(g):
                        if times[s] != M:
                            continue
                        for e in range(E):
                            if x[e][s] == 0:
                                continue
                            for m in range(g):
                                if m == s or not R[e][m]:
                                    continue
                                for e2 in range(E):
                                    if e2 == e or x[e2][m] == 0:
                                        continue
                                    for d in range(g):
                                        if d in (m, s) or not R[e2][d]:
                                            continue
                                        for e3 in range(E):
                                            if e3 in (e, e2) or x[e3][d] == 0 or not R[e3][s]:
                                                continue
                                            moves = [
                                                (e, s, m, x[e][s]),
                                                (e2, m, d, x[e2][m]),
                                                (e3, d, s, x[e3][d]),
                                            ]
                                            new = times_cap(moved(x, moves))
                                            v = max(new[s], new[m], new[d])
                                            if v < best_v:
                                                best_v, best_move = v, moves
                if best_move is None:
                    # fallback 3: leximax moves on the first GPU below M that has one
                    for s in sorted(range(g), key=lambda h: (-times[h], h)):
                        if times[s] == M:
                            continue
                        best_v = times[s]
                        for e in range(E):
                            xs = x[e][s]
                            if xs == 0:
                                continue
                            for d in range(g):
                                if d == s or not R[e][d]:
                                    continue

                                def fl(q, e=e, s=s, d=d, y=x):
                                    new = times_cap(moved(y, [(e, s, d, q)]))
                                    return new[s], new[d]

                                v = max(fl(xs))
                                if v < best_v:
                                    best_v, best_move = v, [(e, s, d, xs)]
                                if xs < 2:
                                    continue
                                q_star = 1
                                while q_star < xs and fl(q_star)[1] < fl(q_star)[0]:
                                    q_star += 1
                                for q in (q_star - 1, q_star):
                                    if 1 <= q <= xs - 1:
                                        v = max(fl(q))
                                        if v < best_v:
                                            best_v, best_move = v, [(e, s, d, q)]
                        if best_move is not None:
                            break
                if best_move is None:
                    break
            else:
                best_move = [best_move]
            x = moved(x, best_move)
            n_ls += 1
        return x, n_ls

    n_ls = 0
    if local_search:
        x, n_ls = search(x)
    m_h = max(times_of(x))
    info[3] = m_h
    g_max = max(gpu(h, x)[0] for h in range(g))
    act_bound = g_max > sm_max and time_of(g_max, 0, g_max) >= m_h

    # Stage 4: ensemble with switching tolerance tau; promising candidates polished first.
    out, choice = x, 0
    if ensemble:
        live = [e for e in order if counts[e] > 0]
        a3 = [[0] * g for _ in range(E)]
        for r, e in enumerate(live):
            a3[e][r % g] = counts[e]
        sm = [[0] * g for _ in range(E)]
        for e in live:
            sm[e][int(sm_assign[e])] = counts[e]
        cands = [(1, lp), (2, a3), (3, sm)]
        if not all(all(R[e]) for e in live):
            cands.pop(1)
        best_c = float("inf")
        for cand, y in cands:
            m_c = max(times_of(y))
            info[3 + cand] = m_c
            room = stop_at < (1.0 - tau) * m_h  # else no polish can switch
            if local_search and room and (m_c < m_h or (cand == 3 and act_bound)):
                if cand == 3:
                    y, _ = search(y, sm_max)
                y, _ = search(y)
                m_c = max(times_of(y))
            if m_c < best_c:
                best_c = info[7] = m_c
                if m_c < (1.0 - tau) * m_h:
                    out, choice = y, cand
    info[0] = max(times_of(out))
    info[8], info[9], info[10] = choice, n_chain, n_ls
    return np.array(out, dtype=np.int64).reshape(E, g), np.array(info)
