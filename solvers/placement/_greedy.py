"""``place_experts(method="greedy")``: EPLB's two stages on time-aware weights; kernel, reference.

EPLB (deepseek-ai/EPLB ``eplb.py``) replicates (every redundant slot to the expert with the
largest load per replica) and packs (every replica, heaviest first, onto the lightest GPU
with room), both on the window's *mean* tokens. Under a time-aware dispatch a GPU's time is
``max(a + b G, c + beta N, c2 + gamma N)``: its activated experts ``G`` count as much as its
tokens ``N``, and a replica is worth as much for the activations it lets the dispatch move
(a replicated expert goes to whichever replica GPU has room) as for the tokens it splits.
This is the same two greedy stages, one pass each, on weights that see both. Per layer and
node, from the window's batches (tokens per expert), with ``f_e`` the share of the batches
where expert ``e`` is live, ``m_e`` its mean tokens, ``p_e`` its peak tokens and
``s = max(beta, gamma)`` (``beta`` without the third term):

1. **Replicate.** Every expert starts with one replica; each of the node's redundant slots
   goes to the first expert (lowest index on ties) with the largest ``w_e / r_e`` among
   those with fewer replicas than the node has GPUs, where
   ``w_e = max(s p_e, alpha b f_e)``: an expert needs replicas for its peak tokens (the
   compute piece) or, live in most batches, to let the dispatch even out the GPUs'
   activated experts (the floor piece).
2. **Pack.** The replicas, expert by expert by decreasing ``max(b f_e, s m_e) / r_e``
   (ties: lower index), each go to the GPU of the node with room and without that expert
   whose pressure ``max(a + b F, c + beta M, c2 + gamma M)`` after adding the replica's
   share ``(f_e / r_e, m_e / r_e)`` to the GPU's ``(F, M)``, plus ``spread * b`` per
   expert that already has replicas on both that GPU and one holding ``e``, is least
   (ties: lower ``b F + s M`` before adding, then lower index). The ``spread`` term keeps
   the replica sets apart: two GPUs sharing many replicated experts form a set that the
   dispatch cannot relieve (Hall's condition on the pair; packed by load alone, the
   replicas of equally weighted experts fall on the same GPU pairs).
3. **Repair** (the one swap of EPLB's distinct packing, :mod:`._eplb_kernels`). If every
   GPU with room already holds ``e``, the GPU ``q`` without ``e`` of least pressure (ties:
   lower index) gives its expert of smallest packing key (ties: lower index) not on ``p``,
   the GPU with room of least pressure, to ``p``, and ``e`` takes its place on ``q``.
   Such a ``q`` and expert exist whenever ``P / n_nodes <= (E / n_nodes) * (g / n_nodes)``.

Nodes: each expert's node is given (EPLB's group-to-node packing, from the caller); the
stages run inside each node on its experts, its GPUs and its ``P / n_nodes`` slots.

Cost: ``O(T E)`` for the statistics, ``O(E + (P - E) log E)`` to replicate (the kernel keeps
the experts below the cap in a heap ordered as the rule, the reference scans them all) and
``O(P g / n_nodes)`` to pack, per layer: the order of one EPLB call (no candidate is scored).
Slots of a GPU hold its experts in increasing order; ``logical_to_physical`` lists each
expert's slots in increasing order, ``-1`` padded to ``g / n_nodes``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import _order
from .._numba.jit import NJIT, cache_depends_on
from .._order import stable_argsort_desc

__all__ = ["greedy_placement_kernel", "greedy_placement_reference"]


@njit(**NJIT)
def _sift_down(heap, n, i, ratio):
    """Restore the heap order of ``heap[:n]`` below position ``i``: a parent comes before
    its children by larger ``ratio``, ties by lower expert index."""
    while True:
        top = i
        for j in (2 * i + 1, 2 * i + 2):
            if j < n:
                x, y = heap[j], heap[top]
                if ratio[x] > ratio[y] or (ratio[x] == ratio[y] and x < y):
                    top = j
        if top == i:
            return
        heap[i], heap[top] = heap[top], heap[i]
        i = top


@njit(**NJIT)
def greedy_placement_kernel(
    counts, expert_node, n_nodes, n_slots, n_gpus, alpha, spread, a, b, c, beta, c2, gamma,
    has3,
):  # fmt: skip
    """The placement of the module notes for every layer of ``counts`` (``(T, L, E)`` int64
    tokens per expert), ``expert_node`` (``(L, E)`` int64) each expert's node (each node
    holding ``E / n_nodes`` experts); returns ``(physical_to_logical (L, P),
    logical_to_physical (L, E, g / n_nodes), logical_count (L, E))``."""
    T, L, E = counts.shape
    gpn = n_gpus // n_nodes
    per = n_slots // n_gpus
    epn = E // n_nodes
    extra = n_slots // n_nodes - epn
    s = max(beta, gamma) if has3 else beta
    p2l = np.empty((L, n_slots), np.int64)
    l2p = np.full((L, E, gpn), -1, np.int64)
    cnt = np.ones((L, E), np.int64)
    f = np.empty(E)
    m = np.empty(E)
    w = np.empty(E)
    key = np.empty(E)
    ex = np.empty(epn, np.int64)
    heap = np.empty(epn, np.int64)
    ratio = np.empty(E)
    pos = np.empty(epn)
    on = np.zeros((E, n_gpus), np.bool_)
    F = np.zeros(n_gpus)
    M = np.zeros(n_gpus)
    size = np.zeros(n_gpus, np.int64)
    C = np.zeros((n_gpus, n_gpus), np.int64)  # experts with replicas on both GPUs
    fill = np.zeros(E, np.int64)
    where = np.empty(gpn, np.int64)  # the GPUs of the expert being packed
    for l in range(L):
        for e in range(E):
            live = 0
            tot = 0
            pk = 0
            for t in range(T):
                x = counts[t, l, e]
                if x > 0:
                    live += 1
                tot += x
                if x > pk:
                    pk = x
            f[e] = live / T
            m[e] = tot / T
            w[e] = max(s * pk, alpha * b * f[e])
        on[:, :] = False
        C[:, :] = 0
        F[:] = 0.0
        M[:] = 0.0
        size[:] = 0
        for k in range(n_nodes):
            n_ex = 0
            for e in range(E):
                if expert_node[l, e] == k:
                    ex[n_ex] = e
                    n_ex += 1
            # Stage 1: each redundant slot to the largest w / r (first on ties), the
            # experts below the cap kept in a heap by (w / r descending, index ascending)
            n_heap = 0
            if gpn > 1:
                for i in range(epn):
                    heap[n_heap] = ex[i]
                    ratio[ex[i]] = w[ex[i]]
                    n_heap += 1
                for i in range(n_heap // 2 - 1, -1, -1):
                    _sift_down(heap, n_heap, i, ratio)
            for _ in range(extra):
                e = heap[0]
                cnt[l, e] += 1
                if cnt[l, e] < gpn:
                    ratio[e] = w[e] / cnt[l, e]
                else:
                    n_heap -= 1
                    heap[0] = heap[n_heap]
                _sift_down(heap, n_heap, 0, ratio)
            # Stage 2: replicas by decreasing packing key, expert by expert
            for i in range(epn):
                e = ex[i]
                key[e] = max(b * f[e] / cnt[l, e], s * m[e] / cnt[l, e])
                pos[i] = key[e]
            order = stable_argsort_desc(pos)
            h0 = k * gpn
            for i in range(epn):
                e = ex[order[i]]
                fw = f[e] / cnt[l, e]
                mw = m[e] / cnt[l, e]
                for placed in range(cnt[l, e]):
                    best = -1
                    bv = 0.0
                    bs = 0.0
                    for h in range(h0, h0 + gpn):
                        if size[h] >= per or on[e, h]:
                            continue
                        shared = 0
                        for j in range(placed):
                            shared += C[h, where[j]]
                        v = max(a + b * (F[h] + fw), c + beta * (M[h] + mw))
                        if has3:
                            v = max(v, c2 + gamma * (M[h] + mw))
                        v += spread * b * shared
                        sec = b * F[h] + s * M[h]
                        if best < 0 or v < bv or (v == bv and sec < bs):
                            best = h
                            bv = v
                            bs = sec
                    if best < 0:
                        # Step 3: the one swap; p has room, q lacks e
                        p = -1
                        q = -1
                        pv = 0.0
                        qv = 0.0
                        for h in range(h0, h0 + gpn):
                            v = max(a + b * F[h], c + beta * M[h])
                            if has3:
                                v = max(v, c2 + gamma * M[h])
                            if size[h] < per and (p < 0 or v < pv):
                                p = h
                                pv = v
                            if not on[e, h] and (q < 0 or v < qv):
                                q = h
                                qv = v
                        y = -1
                        for j in range(epn):
                            x = ex[j]
                            if on[x, q] and not on[x, p] and (y < 0 or key[x] < key[y]):
                                y = x
                        fy = f[y] / cnt[l, y]
                        my = m[y] / cnt[l, y]
                        on[y, q] = False
                        for x in range(h0, h0 + gpn):
                            if on[y, x]:
                                C[q, x] -= 1
                                C[x, q] -= 1
                                C[p, x] += 1
                                C[x, p] += 1
                        on[y, p] = True
                        F[q] -= fy
                        M[q] -= my
                        F[p] += fy
                        M[p] += my
                        size[q] -= 1
                        size[p] += 1
                        best = q
                    for j in range(placed):
                        C[best, where[j]] += 1
                        C[where[j], best] += 1
                    where[placed] = best
                    on[e, best] = True
                    F[best] += fw
                    M[best] += mw
                    size[best] += 1
        fill[:] = 0
        for h in range(n_gpus):
            j = h * per
            for e in range(E):
                if on[e, h]:
                    p2l[l, j] = e
                    l2p[l, e, fill[e]] = j
                    fill[e] += 1
                    j += 1
    return p2l, l2p, cnt


cache_depends_on(greedy_placement_kernel, _order)


def greedy_placement_reference(
    counts, expert_node, n_nodes, n_slots, n_gpus, alpha, spread, a, b, c, beta, c2, gamma,
    has3,
):  # fmt: skip
    """Plain-Python reference of :func:`greedy_placement_kernel`: the module notes' rules
    on lists and sets, Python's ``max``/``min`` and a stable sort."""
    T, L, E = counts.shape
    gpn, per, epn = n_gpus // n_nodes, n_slots // n_gpus, E // n_nodes
    s = max(beta, gamma) if has3 else beta

    def pressure(F, M):
        v = max(a + b * F, c + beta * M)
        return max(v, c2 + gamma * M) if has3 else v

    p2l = np.empty((L, n_slots), np.int64)
    l2p = np.full((L, E, gpn), -1, np.int64)
    cnt = np.ones((L, E), np.int64)
    for l in range(L):
        rows = [[int(counts[t, l, e]) for e in range(E)] for t in range(T)]
        f = [sum(r[e] > 0 for r in rows) / T for e in range(E)]
        m = [sum(r[e] for r in rows) / T for e in range(E)]
        w = [max(s * max(r[e] for r in rows), alpha * b * f[e]) for e in range(E)]
        r = [1] * E
        held = [set() for _ in range(n_gpus)]  # experts of each GPU
        F, M = [0.0] * n_gpus, [0.0] * n_gpus
        for k in range(n_nodes):
            experts = [e for e in range(E) if expert_node[l, e] == k]
            gpus = list(range(k * gpn, (k + 1) * gpn))
            for _ in range(n_slots // n_nodes - epn):
                ok = [e for e in experts if r[e] < gpn]
                r[max(ok, key=lambda e: w[e] / r[e])] += 1  # max: the first maximum
            key = {e: max(b * f[e] / r[e], s * m[e] / r[e]) for e in experts}

            def shared(h, e, held=held, gpus=gpus):
                # experts on both h and a GPU holding e (e itself excluded: not on h)
                return sum(len(held[h] & held[x]) for x in gpus if e in held[x])

            for e in sorted(experts, key=lambda e: -key[e]):
                fw, mw = f[e] / r[e], m[e] / r[e]
                for _ in range(r[e]):
                    room = [h for h in gpus if len(held[h]) < per and e not in held[h]]
                    if room:
                        h = min(
                            room,
                            key=lambda h: (
                                pressure(F[h] + fw, M[h] + mw) + spread * b * shared(h, e),
                                b * F[h] + s * M[h],
                            ),
                        )
                    else:  # the one swap
                        p = min((x for x in gpus if len(held[x]) < per),
                                key=lambda x: pressure(F[x], M[x]))  # fmt: skip
                        h = min((x for x in gpus if e not in held[x]),
                                key=lambda x: pressure(F[x], M[x]))  # fmt: skip
                        y = min(sorted(held[h] - held[p]), key=lambda x: key[x])
                        held[h].remove(y)
                        held[p].add(y)
                        F[h] -= f[y] / r[y]
                        M[h] -= m[y] / r[y]
                        F[p] += f[y] / r[y]
                        M[p] += m[y] / r[y]
                    held[h].add(e)
                    F[h] += fw
                    M[h] += mw
        for h in range(n_gpus):
            for j, e in enumerate(sorted(held[h])):
                p2l[l, h * per + j] = e
        for e in range(E):
            slots = [j for j in range(n_slots) if p2l[l, j] == e]
            cnt[l, e] = len(slots)
            l2p[l, e, : len(slots)] = slots
    return p2l, l2p, cnt
