"""The rebalance path under EPLB's even split: kernel and plain-Python reference.

**Score.** A layer's placement (each GPU's slots, ``-1`` empty) serves a batch ``X`` (tokens
per expert) with EPLB's even split, what vLLM and SGLang dispatch: expert ``e`` with ``c_e``
replicas, ``m`` of them on GPU ``h``, sends it ``x = X_e * (m / c_e)`` tokens. GPU ``h`` then
takes ``t_h = max(a + b A + b2 (T - A), c + beta N, c2 + gamma N)`` (TEMPO Eq. 1, 2, 4; ``A``
its experts with tokens, ``T`` their tiles ``ceil(x / tile)``, ``N`` their tokens: the
simulator's ``layer_times_kernel`` on the even split), and the layer the slowest active
GPU's time. The *score* of a placement is the mean over the batches of that makespan; the
*spread*, the mean over batches of ``sum_h t_h ** 2``, breaks its ties (moves off a GPU that
is not the slowest still count).

**Path.** From the placement in force to a target placement (each GPU's multiset of experts;
EPLB's plan), one replica at a time. GPU ``h`` is *pending* while its experts differ from the
target's: it lacks the target's experts ``add(h)`` and holds ``drop(h)`` beyond them (empty
slots included). Each round, every pending active GPU proposes one move: the expert of
``add(h)`` with the largest mean load per replica once added ``w_u / (c_u + 1)`` (while any
expert has no replica, only such experts, the lost ones, are proposed), into an empty slot
if ``h`` has one, else into the slot of the expert of ``drop(h)`` with the smallest
``w_d / c_d`` among those with another replica (``c_d >= 2``); ties to the lower expert and
the lower slot. The proposal with the lowest score, then spread, is applied (ties: the lower
GPU), improving or not, so the path ends at the target. When no GPU can propose (every
dropped expert is its expert's last replica) a *cycle* is applied: from the lowest pending
GPU, its dropped expert of smallest ``w / c`` goes to the lowest GPU that lacks it, whose
own such expert goes on in turn, until a GPU repeats; each GPU of the cycle takes the
expert of the one before it into the slot of the one it gives, replica counts unchanged.

A new expert takes the slot of the expert it replaces, so a prefix of the path differs from
the placement in force in exactly its moves (vLLM's ``preserve_intragpu_slots`` rule).

Complexity: ``D`` rounds (the replicas the target moves), each ``O(g B (g + s per))`` with
``s`` the GPUs a move touches (the kernel rescoring only those); the reference rescores
everything.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..._numba.jit import NJIT

__all__ = ["even_path_kernel", "even_path_reference"]


@njit(**NJIT)
def _gpu_time(slots, m, c, X, b, h, cost):
    """``t_h`` of GPU ``h`` at batch ``b`` under the even split (module notes)."""
    per = slots.shape[1]
    act = 0.0
    tiles = 0.0
    tok = 0.0
    for j in range(per):
        e = slots[h, j]
        if e < 0:
            continue
        seen = False
        for i in range(j):
            if slots[h, i] == e:
                seen = True
        if seen:
            continue
        n = X[b, e]
        x = n * (m[e, h] / c[e])
        tok += x
        if n > 0:
            act += 1.0
            tiles += math.ceil(x / cost[7])
    t = max(cost[0] + cost[1] * act + cost[2] * (tiles - act), cost[3] + cost[4] * tok)
    return max(t, cost[5] + cost[6] * tok)


@njit(**NJIT)
def _score(tb, active):
    """Score and spread of the cached per-batch GPU times ``tb (B, g)``."""
    B, G = tb.shape
    p = 0.0
    q = 0.0
    for b in range(B):
        worst = 0.0
        for h in range(G):
            if active[h]:
                t = tb[b, h]
                if t > worst:
                    worst = t
                q += t * t
        p += worst
    return p / B, q / B


@njit(**NJIT)
def _rescore(slots, m, c, X, aff, tb, active, cost):
    """Score and spread with the GPUs flagged in ``aff`` recomputed (``tb`` not changed)."""
    B, G = tb.shape
    p = 0.0
    q = 0.0
    for b in range(B):
        worst = 0.0
        for h in range(G):
            if not active[h]:
                continue
            t = _gpu_time(slots, m, c, X, b, h, cost) if aff[h] else tb[b, h]
            if t > worst:
                worst = t
            q += t * t
        p += worst
    return p / B, q / B


@njit(**NJIT)
def _flag(m, e, aff):
    if e >= 0:
        for h in range(m.shape[1]):
            if m[e, h] > 0:
                aff[h] = True


@njit(**NJIT)
def _apply(slots, m, c, h, j, u):
    d = slots[h, j]
    if d >= 0:
        m[d, h] -= 1
        c[d] -= 1
    slots[h, j] = u
    m[u, h] += 1
    c[u] += 1


@njit(**NJIT)
def _propose(slots, m, mt, c, w, h, lost):
    """GPU ``h``'s move ``(slot, u)`` (module notes), or ``(-1, -1)``."""
    E = m.shape[0]
    per = slots.shape[1]
    u = -1
    best = 0.0
    for e in range(E):
        if m[e, h] < mt[e, h] and (lost == 0 or c[e] == 0):
            key = w[e] / (c[e] + 1)
            if u < 0 or key > best:
                u = e
                best = key
    if u < 0:
        return -1, -1
    for j in range(per):
        if slots[h, j] < 0:
            return j, u
    d = -1
    best = 0.0
    for e in range(E):
        if m[e, h] > mt[e, h] and c[e] >= 2:
            key = w[e] / c[e]
            if d < 0 or key < best:
                d = e
                best = key
    if d < 0:
        return -1, -1
    for j in range(per):
        if slots[h, j] == d:
            return j, u
    return -1, -1


@njit(**NJIT)
def _pending(m, mt, slots, h):
    for e in range(m.shape[0]):
        if m[e, h] != mt[e, h]:
            return True
    for j in range(slots.shape[1]):
        if slots[h, j] < 0:
            return True
    return False


@njit(**NJIT)
def even_path_kernel(slots, target, counts, active, cost):
    """The path of the module notes for one layer.

    ``slots`` (g, per) int64 the placement in force (``-1`` empty; an inactive GPU's row all
    ``-1``), ``target`` (g, per) int64 the target (every active GPU's slots filled, every
    expert placed), ``counts`` (B, E) int64 the scored batches, ``active`` (g,) bool, ``cost``
    the ``CostModel.as_array`` vector. Returns ``(gpu, slot, old, new, score, spread,
    valid)``: the ``D`` moves in order (``old = -1`` for an empty slot) and, for each prefix
    of ``0..D`` moves, the score and spread of the placement it reaches and whether that
    placement is one to stop at (every expert placed, no cycle cut); score and spread are
    NaN inside a cycle. ``slots``, ``target`` and ``counts`` are not changed.
    """
    G, per = slots.shape
    B, E = counts.shape
    s = slots.copy()
    m = np.zeros((E, G), np.int64)
    mt = np.zeros((E, G), np.int64)
    c = np.zeros(E, np.int64)
    for h in range(G):
        for j in range(per):
            if s[h, j] >= 0:
                m[s[h, j], h] += 1
                c[s[h, j]] += 1
            if target[h, j] >= 0:
                mt[target[h, j], h] += 1
    w = np.zeros(E)
    for b in range(B):
        for e in range(E):
            w[e] += counts[b, e]
    for e in range(E):
        w[e] = w[e] / B
    D = 0
    for h in range(G):
        if not active[h]:
            continue
        for e in range(E):
            if m[e, h] > mt[e, h]:
                D += m[e, h] - mt[e, h]
        for j in range(per):
            if s[h, j] < 0:
                D += 1
    tb = np.zeros((B, G))
    for b in range(B):
        for h in range(G):
            if active[h]:
                tb[b, h] = _gpu_time(s, m, c, counts, b, h, cost)
    gpu = np.empty(D, np.int64)
    slot = np.empty(D, np.int64)
    old = np.empty(D, np.int64)
    new = np.empty(D, np.int64)
    score = np.empty(D + 1)
    spread = np.empty(D + 1)
    valid = np.zeros(D + 1, np.bool_)
    lost = 0
    for e in range(E):
        if c[e] == 0:
            lost += 1
    score[0], spread[0] = _score(tb, active)
    valid[0] = lost == 0
    aff = np.zeros(G, np.bool_)
    k = 0
    while k < D:
        bg = -1
        bj = -1
        bu = -1
        bp = 0.0
        bq = 0.0
        # lost experts first; when none of them can go anywhere yet, any expert
        for attempt in range(2):
            if attempt == 1 and (bg >= 0 or lost == 0):
                break
            restrict = lost if attempt == 0 else 0
            for h in range(G):
                if not active[h] or not _pending(m, mt, s, h):
                    continue
                j, u = _propose(s, m, mt, c, w, h, restrict)
                if j < 0:
                    continue
                d = s[h, j]
                aff[:] = False
                aff[h] = True
                _flag(m, d, aff)
                _flag(m, u, aff)
                _apply(s, m, c, h, j, u)
                p, q = _rescore(s, m, c, counts, aff, tb, active, cost)
                # undo
                s[h, j] = d
                m[u, h] -= 1
                c[u] -= 1
                if d >= 0:
                    m[d, h] += 1
                    c[d] += 1
                if bg < 0 or p < bp or (p == bp and q < bq):
                    bg, bj, bu, bp, bq = h, j, u, p, q
        if bg >= 0:
            d = s[bg, bj]
            aff[:] = False
            aff[bg] = True
            _flag(m, d, aff)
            _flag(m, bu, aff)
            if d >= 0 and c[d] == 1:
                lost += 1
            if c[bu] == 0:
                lost -= 1
            _apply(s, m, c, bg, bj, bu)
            for b in range(B):
                for h in range(G):
                    if aff[h] and active[h]:
                        tb[b, h] = _gpu_time(s, m, c, counts, b, h, cost)
            gpu[k], slot[k], old[k], new[k] = bg, bj, d, bu
            k += 1
            score[k], spread[k] = _score(tb, active)
            valid[k] = lost == 0
            continue
        # a cycle: every pending GPU's dropped experts are last replicas
        chain_g = np.empty(G + 1, np.int64)
        chain_d = np.empty(G + 1, np.int64)
        n = 0
        h = -1
        for x in range(G):
            if active[x] and _pending(m, mt, s, x):
                h = x
                break
        start = -1
        while start < 0:
            d = -1
            best = 0.0
            for e in range(E):
                if m[e, h] > mt[e, h]:
                    key = w[e] / c[e]
                    if d < 0 or key < best:
                        d = e
                        best = key
            chain_g[n] = h
            chain_d[n] = d
            n += 1
            nxt = -1
            for x in range(G):
                if active[x] and m[d, x] < mt[d, x]:
                    nxt = x
                    break
            for i in range(n):
                if chain_g[i] == nxt:
                    start = i
            h = nxt
        # GPU chain_g[i + 1] takes chain_d[i] into chain_d[i + 1]'s slot; the first of the
        # cycle takes the last one's expert
        aff[:] = False
        for i in range(start, n):
            hh = chain_g[(i + 1 - start) % (n - start) + start]
            u = chain_d[i]
            dd = chain_d[(i + 1 - start) % (n - start) + start]
            jj = 0
            while s[hh, jj] != dd:
                jj += 1
            aff[hh] = True
            s[hh, jj] = u
            m[dd, hh] -= 1
            m[u, hh] += 1
            gpu[k], slot[k], old[k], new[k] = hh, jj, dd, u
            k += 1
            if i < n - 1:
                score[k] = np.nan
                spread[k] = np.nan
                valid[k] = False
        for b in range(B):
            for x in range(G):
                if aff[x] and active[x]:
                    tb[b, x] = _gpu_time(s, m, c, counts, b, x, cost)
        score[k], spread[k] = _score(tb, active)
        valid[k] = lost == 0
    return gpu, slot, old, new, score, spread, valid


def even_path_reference(slots, target, counts, active, cost):
    """Plain-Python reference of :func:`even_path_kernel`: the same rules, every candidate
    scored from scratch on lists."""
    s = [list(map(int, row)) for row in np.asarray(slots)]
    tgt = [list(map(int, row)) for row in np.asarray(target)]
    X = [list(map(int, row)) for row in np.asarray(counts)]
    act = [bool(v) for v in np.asarray(active)]
    a, b_, b2, c0, beta, c2, gamma, tile = (float(v) for v in cost)
    G = len(s)
    B, E = len(X), len(X[0])

    def held(rows, e, h):
        return sum(1 for v in rows[h] if v == e)

    def count(rows, e):
        return sum(held(rows, e, h) for h in range(G))

    w = []
    for e in range(E):
        tot = 0.0
        for bb in range(B):
            tot += X[bb][e]
        w.append(tot / B)

    def gpu_time(rows, cnt, bb, h):
        act_, tiles, tok = 0.0, 0.0, 0.0
        for j, e in enumerate(rows[h]):
            if e < 0 or e in rows[h][:j]:
                continue
            n = X[bb][e]
            x = n * (held(rows, e, h) / cnt[e])
            tok += x
            if n > 0:
                act_ += 1.0
                tiles += math.ceil(x / tile)
        t = max(a + b_ * act_ + b2 * (tiles - act_), c0 + beta * tok)
        return max(t, c2 + gamma * tok)

    def score(rows):
        cnt = [count(rows, e) for e in range(E)]
        p, q = 0.0, 0.0
        for bb in range(B):
            worst = 0.0
            for h in range(G):
                if act[h]:
                    t = gpu_time(rows, cnt, bb, h)
                    worst = max(worst, t)
                    q += t * t
            p += worst
        return p / B, q / B

    def pending(h):
        return sorted(s[h]) != sorted(tgt[h])

    def adds(h):
        return [e for e in range(E) if held(s, e, h) < held(tgt, e, h)]

    def drops(h):
        return [e for e in range(E) if held(s, e, h) > held(tgt, e, h)]

    D = sum(
        max(0, held(s, e, h) - held(tgt, e, h)) for h in range(G) if act[h] for e in range(E)
    ) + sum(1 for h in range(G) if act[h] for v in s[h] if v < 0)
    moves, scores, spreads, valid = [], [], [], []
    p, q = score(s)
    scores.append(p)
    spreads.append(q)
    valid.append(all(count(s, e) > 0 for e in range(E)))
    while len(moves) < D:
        lost = [e for e in range(E) if count(s, e) == 0]
        best = None
        for only in [lost, []] if lost else [[]]:
            if best is not None:
                break
            for h in range(G):
                if not act[h] or not pending(h):
                    continue
                cand = [e for e in adds(h) if not only or e in only]
                if not cand:
                    continue
                u = max(cand, key=lambda e: (w[e] / (count(s, e) + 1), -e))
                if -1 in s[h]:
                    j = s[h].index(-1)
                else:
                    spare = [e for e in drops(h) if count(s, e) >= 2]
                    if not spare:
                        continue
                    d = min(spare, key=lambda e: (w[e] / count(s, e), e))
                    j = s[h].index(d)
                trial = [row[:] for row in s]
                trial[h][j] = u
                p, q = score(trial)
                if best is None or (p, q) < best[0]:
                    best = ((p, q), h, j, u)
        if best is not None:
            (p, q), h, j, u = best
            moves.append((h, j, s[h][j], u))
            s[h][j] = u
            scores.append(p)
            spreads.append(q)
            valid.append(all(count(s, e) > 0 for e in range(E)))
            continue
        # a cycle
        h = next(x for x in range(G) if act[x] and pending(x))
        chain = []
        while True:
            d = min(drops(h), key=lambda e: (w[e] / count(s, e), e))
            chain.append((h, d))
            nxt = next(x for x in range(G) if act[x] and held(s, d, x) < held(tgt, d, x))
            gs = [g for g, _ in chain]
            if nxt in gs:
                cyc = chain[gs.index(nxt) :]
                break
            h = nxt
        L = len(cyc)
        for i in range(L):
            hh, dd = cyc[(i + 1) % L]
            u = cyc[i][1]
            jj = s[hh].index(dd)
            moves.append((hh, jj, dd, u))
            s[hh][jj] = u
            if i < L - 1:
                scores.append(float("nan"))
                spreads.append(float("nan"))
                valid.append(False)
        p, q = score(s)
        scores.append(p)
        spreads.append(q)
        valid.append(all(count(s, e) > 0 for e in range(E)))
    arr = np.array(moves, dtype=np.int64).reshape(-1, 4)
    return (
        arr[:, 0].copy(),
        arr[:, 1].copy(),
        arr[:, 2].copy(),
        arr[:, 3].copy(),
        np.array(scores),
        np.array(spreads),
        np.array(valid, dtype=bool),
    )
