"""tempo_fast (TEMPO §4.2): Numba kernel and plain-Python reference.

Private module (stumpy's split): :func:`tempo_kernel` is the jitted kernel,
:func:`tempo_reference` the plain-Python reference directly below it, written from the
stage descriptions and sharing no helper with the kernel; :func:`tempo_stack_kernel` runs
the kernel over a stack of layers in parallel. The public wrapper is
:mod:`straggler.solvers.tempo`, which documents the stages and every tie-breaking rule.

Both take the token-LP candidate of stage 4 as an input (computed by
:mod:`~straggler.solvers._token_lp_fast`), so that no jitted function here calls into
another file (numba's cache would miss edits there).

Cost vector layout (``CostModel.as_array``): ``[a, b, b2, c, beta, c2, gamma, tile]``.
A GPU with ``G`` activated replicas, ``N`` tokens and ``T`` tiles takes
``max(a + b*G + b2*(T - G), c + beta*N, c2 + gamma*N)``, evaluated in exactly this order
in both implementations (and in :func:`~straggler.formulations.evaluate`), so the floats
agree bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._jit import NJIT, NJIT_PARALLEL

__all__ = [
    "INFO_FIELDS",
    "tempo_kernel",
    "tempo_reference",
    "tempo_stack_kernel",
]

#: Names of the entries of the ``info`` vector both implementations return.
INFO_FIELDS = (
    "makespan",  # of the returned dispatch
    "makespan_seed",  # after stage 1
    "makespan_chains",  # after stage 2
    "makespan_heuristic",  # after stage 3: M(A_H)
    "makespan_lp",  # token-LP candidate (nan when the ensemble is off)
    "makespan_a3",  # A3 candidate (nan when infeasible or the ensemble is off)
    "choice",  # 0: heuristic, 1: token LP, 2: A3
    "chain_moves",  # augmenting chains applied in stage 2
    "ls_moves",  # local-search moves applied in stage 3
)
_N_INFO = len(INFO_FIELDS)


@njit(**NJIT)
def _t(cost, G, N, T):
    """Modeled time of one GPU (the one cost family)."""
    t = cost[0] + cost[1] * G + cost[2] * (T - G)
    u = cost[3] + cost[4] * N
    if u > t:
        t = u
    u = cost[5] + cost[6] * N
    if u > t:
        t = u
    return t


@njit(**NJIT)
def _score(shares, cost, tile):
    """Makespan of a whole-token dispatch."""
    E, g = shares.shape
    m = -np.inf
    for h in range(g):
        G = 0
        N = 0
        T = 0
        for e in range(E):
            v = shares[e, h]
            if v > 0:
                G += 1
                N += v
                T += (v + tile - 1) // tile
        t = _t(cost, G, N, T)
        if t > m:
            m = t
    return m


@njit(**NJIT)
def _rest_max(times, i, j, k):
    """Largest time over GPUs other than ``i``, ``j``, ``k`` (-inf if none)."""
    m = -np.inf
    for h in range(times.shape[0]):
        if h != i and h != j and h != k and times[h] > m:
            m = times[h]
    return m


@njit(**NJIT)
def tempo_kernel(counts, replicas, cost, lp_shares, seed, chains, local_search, ensemble, tau,
                 max_iter):  # fmt: skip
    """One layer of tempo_fast.

    Parameters
    ----------
    counts : ndarray of int64, shape (n_experts,)
    replicas : ndarray of bool, shape (n_experts, n_gpus)
    cost : ndarray of float64, shape (8,)
        ``CostModel.as_array()``.
    lp_shares : ndarray of int64, shape (n_experts, n_gpus)
        The token-LP candidate of stage 4 (ignored when ``ensemble`` is False).
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
    # replica lists: GPUs of each expert, experts of each GPU (increasing order)
    e_ptr = np.zeros(E + 1, np.int64)
    g_ptr = np.zeros(g + 1, np.int64)
    for e in range(E):
        for h in range(g):
            if replicas[e, h]:
                e_ptr[e + 1] += 1
                g_ptr[h + 1] += 1
    for e in range(E):
        e_ptr[e + 1] += e_ptr[e]
    for h in range(g):
        g_ptr[h + 1] += g_ptr[h]
    e_gpus = np.empty(e_ptr[E], np.int64)
    g_exps = np.empty(g_ptr[g], np.int64)
    fill = g_ptr[:-1].copy()
    k = 0
    for e in range(E):
        for h in range(g):
            if replicas[e, h]:
                e_gpus[k] = h
                k += 1
                g_exps[fill[h]] = e
                fill[h] += 1

    x = np.zeros((E, g), np.int64)
    G = np.zeros(g, np.int64)
    N = np.zeros(g, np.int64)
    T = np.zeros(g, np.int64)
    times = np.empty(g)
    for h in range(g):
        times[h] = _t(cost, 0, 0, 0)
    M = times.max()

    # Stage 1: whole experts by descending tokens (ties: lower index), each on the replica
    # minimizing (resulting makespan, resulting GPU time, GPU index); seed=False puts each
    # on its lowest-index replica instead.
    order = np.argsort(-counts, kind="mergesort")
    for i in range(E):
        e = order[i]
        n = counts[e]
        if n == 0:
            break
        kn = (n + tile - 1) // tile
        best = -1
        bk1 = np.inf
        bk2 = np.inf
        for j in range(e_ptr[e], e_ptr[e + 1]):
            h = e_gpus[j]
            if not seed:
                best = h
                break
            tn = _t(cost, G[h] + 1, N[h] + n, T[h] + kn)
            k1 = max(M, tn)
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
    n_chain = 0
    while chains:
        M = times.max()
        Gmax = G.max()
        bv1 = np.inf
        bv2 = np.inf
        kind = 0
        cs = cm = cd = ce = ce2 = -1
        for s in range(g):
            if G[s] != Gmax:
                continue
            for i in range(g_ptr[s], g_ptr[s + 1]):
                e = g_exps[i]
                q = x[e, s]
                if q == 0:
                    continue
                ts = _t(cost, G[s] - 1, N[s] - q, T[s] - (q + tile - 1) // tile)
                for j in range(e_ptr[e], e_ptr[e + 1]):
                    d = e_gpus[j]
                    xd = x[e, d]
                    if d == s or (xd == 0 and G[d] > Gmax - 2):
                        continue
                    Gd = G[d] + (1 if xd == 0 else 0)
                    Td = T[d] - (xd + tile - 1) // tile + (xd + q + tile - 1) // tile
                    td = _t(cost, Gd, N[d] + q, Td)
                    v2 = max(ts, td)
                    v1 = max(v2, _rest_max(times, s, d, -1))
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
                for i in range(g_ptr[s], g_ptr[s + 1]):
                    e = g_exps[i]
                    q = x[e, s]
                    if q == 0:
                        continue
                    kq = (q + tile - 1) // tile
                    ts = _t(cost, G[s] - 1, N[s] - q, T[s] - kq)
                    for j in range(e_ptr[e], e_ptr[e + 1]):
                        m = e_gpus[j]
                        if m == s or x[e, m] != 0 or G[m] != Gmax - 1:
                            continue
                        for i2 in range(g_ptr[m], g_ptr[m + 1]):
                            e2 = g_exps[i2]
                            q2 = x[e2, m]
                            if e2 == e or q2 == 0:
                                continue
                            tm = _t(cost, Gmax - 1, N[m] + q - q2,
                                    T[m] + kq - (q2 + tile - 1) // tile)  # fmt: skip
                            for j2 in range(e_ptr[e2], e_ptr[e2 + 1]):
                                d = e_gpus[j2]
                                xd = x[e2, d]
                                if d == m or d == s or (xd == 0 and G[d] > Gmax - 2):
                                    continue
                                Gd = G[d] + (1 if xd == 0 else 0)
                                Td = T[d] - (xd + tile - 1) // tile + (xd + q2 + tile - 1) // tile
                                td = _t(cost, Gd, N[d] + q2, Td)
                                v2 = max(ts, max(tm, td))
                                v1 = max(v2, _rest_max(times, s, m, d))
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
    n_ls = 0
    while local_search and n_ls < max_iter:
        M = times.max()
        best_v = M
        bs = be = bd = bq = -1
        for s in range(g):
            if times[s] != M:
                continue
            for i in range(g_ptr[s], g_ptr[s + 1]):
                e = g_exps[i]
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
        if bs < 0:
            break
        xs = x[be, bs]
        xd = x[be, bd]
        G[bs] -= 1 if bq == xs else 0
        N[bs] -= bq
        T[bs] += (xs - bq + tile - 1) // tile - (xs + tile - 1) // tile
        G[bd] += 1 if xd == 0 else 0
        N[bd] += bq
        T[bd] += (xd + bq + tile - 1) // tile - (xd + tile - 1) // tile
        x[be, bs] = xs - bq
        x[be, bd] = xd + bq
        times[bs] = _t(cost, G[bs], N[bs], T[bs])
        times[bd] = _t(cost, G[bd], N[bd], T[bd])
        n_ls += 1
    m_h = times.max()
    info[3] = m_h

    # Stage 4: ensemble (Proposition 1). Candidates: the token-LP dispatch and, when every
    # live expert is replicated on every GPU, A3 round robin (rank r -> GPU r mod g). The
    # best candidate (LP first on ties) replaces A_H iff it is below (1 - tau) M(A_H).
    out = x
    choice = 0
    if ensemble:
        m_lp = _score(lp_shares, cost, tile)
        info[4] = m_lp
        best_c = m_lp
        cand = 1
        full = True
        for e in range(E):
            if counts[e] > 0 and e_ptr[e + 1] - e_ptr[e] != g:
                full = False
                break
        a3 = np.zeros((E, g), np.int64)
        if full:
            r = 0
            for i in range(E):
                e = order[i]
                if counts[e] == 0:
                    break
                a3[e, r % g] = counts[e]
                r += 1
            m_a3 = _score(a3, cost, tile)
            info[5] = m_a3
            if m_a3 < best_c:
                best_c = m_a3
                cand = 2
        if best_c < (1.0 - tau) * m_h:
            choice = cand
            out = lp_shares.copy() if cand == 1 else a3
    info[0] = _score(out, cost, tile)
    info[6] = choice
    info[7] = n_chain
    info[8] = n_ls
    return out, info


def tempo_reference(counts, replicas, cost, lp_shares, seed, chains, local_search, ensemble, tau,
                    max_iter):  # fmt: skip
    """Plain-Python reference of :func:`tempo_kernel`: same stages, same tie-breaking.

    Written from the stage descriptions without incremental bookkeeping: every candidate
    is scored by recomputing the changed GPUs from the shares, and the partial split
    ``q*`` is found by scanning ``q = 1, 2, ...`` instead of bisection.

    Examples
    --------
    TEMPO Fig. 1b (``b = 15``, ``beta = 0.1``): only the hot expert is split, 60 us.

    >>> cost = [0.0, 15.0, 0.0, 0.0, 0.1, 0.0, 0.0, 128.0]
    >>> x, info = tempo_reference([600] + [30] * 6, [[True, True]] * 7, cost,
    ...                           [[0, 0]] * 7, True, True, True, False, 0.01, 300)
    >>> x[0].tolist(), float(info[0])
    ([300, 300], 60.0)
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

    def time_of(G, N, T):
        return max(a + b * G + b2 * (T - G), c + beta * N, c2 + gamma * N)

    def times_of(y):
        return [time_of(*gpu(h, y)) for h in range(g)]

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
            M = max(times_of(x))

            def key(h, e=e, n=n, M=M):
                G, N, T = gpu(h, x)
                tn = time_of(G + 1, N + n, T + ceil_tiles(n))
                return (max(M, tn), tn, h)

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

        def value(moves, touched):
            new = times_of(moved(x, moves))
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

    # Stage 3: bottleneck local search.
    n_ls = 0
    while local_search and n_ls < max_iter:
        times = times_of(x)
        M = max(times)
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

                    def f(q, e=e, s=s, d=d):
                        new = times_of(moved(x, [(e, s, d, q)]))
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
            break
        x = moved(x, [best_move])
        n_ls += 1
    m_h = max(times_of(x))
    info[3] = m_h

    # Stage 4: ensemble with switching tolerance tau.
    out, choice = x, 0
    if ensemble:
        lp = [[int(v) for v in row] for row in lp_shares]
        cands = [(max(times_of(lp)), 1, lp)]
        info[4] = cands[0][0]
        live = [e for e in order if counts[e] > 0]
        if all(all(R[e]) for e in live):
            a3 = [[0] * g for _ in range(E)]
            for r, e in enumerate(live):
                a3[e][r % g] = counts[e]
            info[5] = max(times_of(a3))
            cands.append((info[5], 2, a3))
        m_c, cand, y = min(cands, key=lambda t: (t[0], t[1]))
        if m_c < (1.0 - tau) * m_h:
            out, choice = y, cand
    info[0] = max(times_of(out))
    info[6], info[7], info[8] = choice, n_chain, n_ls
    return np.array(out, dtype=np.int64).reshape(E, g), np.array(info)


@njit(**NJIT_PARALLEL)
def tempo_stack_kernel(counts, replicas, cost, lp_shares, seed, chains, local_search, ensemble, tau,
                       max_iter):  # fmt: skip
    """:func:`tempo_kernel` on every layer of ``(L, E)`` / ``(L, E, g)`` arrays, in parallel."""
    L, E, g = replicas.shape
    shares = np.zeros((L, E, g), np.int64)
    info = np.zeros((L, _N_INFO))
    for l in prange(L):
        x, inf = tempo_kernel(counts[l], replicas[l], cost, lp_shares[l], seed, chains,
                              local_search, ensemble, tau, max_iter)  # fmt: skip
        shares[l] = x
        info[l] = inf
    return shares, info
