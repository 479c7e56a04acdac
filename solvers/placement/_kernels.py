"""The search of :func:`~straggler.solvers.place_experts` on a cheap score, kernel and reference.

**The Hall bound.** For one batch ``n`` (tokens per expert) on a placement (each GPU's
experts, each expert's replica count ``r``), tempo's layer bound is
``max(a + b SM, c + beta lambda*, c2 + gamma lambda*)`` with ``SM`` the optimal
semi-matching value and ``lambda*`` the token-LP value (TEMPO Lemmas 1 and 2). Both are
maxima over sets ``Y`` of GPUs of what the experts confined to ``Y`` force onto them
(Hall's condition): ``SM >= ceil(|live experts with all replicas in Y| / |Y|)`` and
``lambda* >= (tokens of those experts) / |Y|``. The bound here takes ``Y`` among

* all GPUs (``ceil(E_live / g)``, ``N / g``);
* one GPU ``h``: its single-replica experts (``R_h`` live ones, ``T_h`` tokens);
* the replica set ``S_e`` of each live expert ``e`` with ``r_e >= 2``: ``e`` and the
  single-replica experts of ``S_e`` (``1 + sum R_h``, ``n_e + sum T_h`` over ``S_e``);

so it is a lower bound of tempo's layer bound (hence of tempo's makespan), equal to it when
every expert has one replica, and costs ``O(g + sum of replica sets)`` per batch once
``R_h`` and ``T_h`` are known, instead of a max-flow and an LP.

**The greedy dispatch.** The bound prices activations and tokens apart; a GPU must carry
both at once (when every GPU must activate its share of the live experts, the tokens of
those experts are no longer free to move). The greedy dispatch of a batch puts every
single-replica expert on its GPU, then each live replicated expert, by decreasing mean
tokens (``mean``, ties: lower index), whole on the replica GPU where
``max(a + b G_h, c + beta N_h, c2 + gamma N_h)`` ends lowest (ties: lower index), or split
evenly over all its replicas if that ends lower; its makespan is the largest GPU time, a
feasible dispatch's (an upper bound of the optimum tempo approximates).

**Score.** The mean over the scored batches of ``(1 - w) * Hall + w * greedy`` (``w = 0``:
the bound alone).

**Search** (first improvement, deterministic). Per round, with ``freq[e]`` (share of the
scored batches where ``e`` is live) and ``mean[e]`` given, the *pressure* of GPU ``h``
``max(a + b F_h, c + beta M_h)`` (``F_h``, ``M_h``: sums of ``freq`` and ``mean`` over its
single-replica experts, in slot order), and each row ``peak`` of ``need`` a criterion of
how much an expert needs replicas, the candidates are tried in this order and the first
that lowers the score (by more than a relative ``1e-12``) is applied:

1. *replica moves*, for each row ``peak`` of ``need`` in turn: for each receiver ``u``
   among the 6 experts of largest ``peak / r`` (ties: lower index) and each donor ``d``
   among the 6 experts with ``r >= 2`` of smallest ``peak / r``, ``d != u``: the slot of
   ``d`` on the GPU of least pressure (ties: lower index) among those that hold ``d``, not
   ``u``, and (several nodes) lie on a node where ``u`` has a replica;
2. *swaps*: for ``h1`` among the 2 GPUs of largest pressure and ``h2`` among the 3 of
   smallest (ties: lower index), ``h1 != h2``, same node: ``e1`` among the 4 single-replica
   experts of ``h1`` not on ``h2`` of largest weight ``w = max(b freq, beta mean) / r``,
   ``e2`` among the 4 experts of ``h2`` not on ``h1`` of smallest weight (ties: lower
   index), ``w[e1] > w[e2]``: ``e1`` and ``e2`` trade slots.

A replaced expert's slot takes the new expert in place. A candidate rejected (a replica move
by its receiver and donor, a swap by its two experts) is remembered with its round and
skipped in later rounds until a round ends without improvement having skipped some; the
next round is then a full pass (every candidate tried again). The search stops when a round
that skipped nothing finds no improving candidate, after ``patience`` scored candidates in
a row without improvement, or after ``max_evals`` scored candidates. The kernel keeps ``R_h``
and ``T_h`` of every batch up to date slot change by slot change (only the two experts
involved change), so a candidate costs the score's pass over the batches and no rebuild;
the reference rebuilds everything from the slots.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._numba.jit import NJIT

__all__ = [
    "hall_score_kernel",
    "hall_score_reference",
    "placement_search_kernel",
    "placement_search_reference",
]

_RECEIVERS, _DONORS, _HOT_GPUS, _COLD_GPUS, _HOT_EXPERTS, _COLD_EXPERTS = 6, 6, 2, 3, 4, 4


def hall_score_reference(slots, counts, mean, w, a, b, c, beta, c2, gamma, has3):
    """Plain-Python reference of :func:`hall_score_kernel`: the Hall sets and the greedy
    dispatch written out."""
    g = len(slots)
    E = len(counts[0])
    cost = (a, b, c, beta, c2, gamma, has3)
    mean = [float(x) for x in mean]
    holders = [[h for h in range(g) if e in [int(x) for x in slots[h]]] for e in range(E)]
    total = 0.0
    for row in counts:
        n = [int(x) for x in row]
        live = [e for e in range(E) if n[e] > 0]
        single = [e for e in live if len(holders[e]) == 1]
        # (GPUs of Y, live experts confined to Y that the bound counts)
        sets = [(list(range(g)), live)]
        sets += [([h], [e for e in single if holders[e] == [h]]) for h in range(g)]
        sets += [
            (holders[e], [e] + [x for x in single if holders[x][0] in holders[e]])
            for e in live
            if len(holders[e]) >= 2
        ]
        sm, frac = 0, (0, 1)
        for Y, inside in sets:
            sm = max(sm, -(-len(inside) // len(Y)))
            tok = sum(n[e] for e in inside)
            if tok * frac[1] > frac[0] * len(Y):
                frac = (tok, len(Y))
        lam = frac[0] / frac[1]
        v = max(a + b * sm, c + beta * lam)
        if has3:
            v = max(v, c2 + gamma * lam)
        if w > 0:
            v = (1 - w) * v + w * _greedy_reference(holders, single, live, n, mean, g, cost)
        total += v
    return total / len(counts)


def _greedy_reference(holders, single, live, n, mean, g, cost):
    """Makespan of the greedy dispatch (module notes) of one batch."""
    a, b, c, beta, c2, gamma, has3 = cost

    def time(G, N):
        x = max(a + b * G, c + beta * N)
        return max(x, c2 + gamma * N) if has3 else x

    G = [0.0] * g
    N = [0.0] * g
    for e in single:
        G[holders[e][0]] += 1
        N[holders[e][0]] += n[e]
    replicated = [e for e in range(len(n)) if len(holders[e]) >= 2]
    for e in sorted(replicated, key=lambda e: -mean[e]):
        if n[e] == 0:
            continue
        part = n[e] / len(holders[e])
        whole = [time(G[h] + 1, N[h] + n[e]) for h in holders[e]]
        split = max(time(G[h] + 1, N[h] + part) for h in holders[e])
        if split < min(whole):
            for h in holders[e]:
                G[h] += 1
                N[h] += part
        else:
            h = holders[e][whole.index(min(whole))]
            G[h] += 1
            N[h] += n[e]
    return max(time(G[h], N[h]) for h in range(g))


@njit(**NJIT)
def _toggle(sign, x, on, cnt, R, T, counts):
    """Add (``sign = 1``) or remove (``-1``) expert ``x``'s rigid share (live count and
    tokens, every batch) at its GPU, if it has one replica."""
    if cnt[x] != 1:
        return
    g = on.shape[1]
    h = 0
    for y in range(g):
        if on[x, y]:
            h = y
    for t in range(counts.shape[0]):
        if counts[t, x] > 0:
            R[t, h] += sign
            T[t, h] += sign * counts[t, x]


@njit(**NJIT)
def _set_slot(slots, on, cnt, R, T, counts, h, k, new):
    """Put expert ``new`` in slot ``k`` of GPU ``h``, keeping ``on``, ``cnt`` and the rigid
    shares ``R``, ``T`` up to date (only the two experts involved change)."""
    old = slots[h, k]
    _toggle(-1, old, on, cnt, R, T, counts)
    _toggle(-1, new, on, cnt, R, T, counts)
    slots[h, k] = new
    on[old, h] = False
    on[new, h] = True
    cnt[old] -= 1
    cnt[new] += 1
    _toggle(1, old, on, cnt, R, T, counts)
    _toggle(1, new, on, cnt, R, T, counts)


@njit(**NJIT)
def _hall_eval(
    slots, cnt, R, T, counts, gfloor, N, ptr, gpus, reps, order, by_mean, w, a, b, c, beta, c2,
    gamma, has3,
):  # fmt: skip
    """:func:`hall_score_kernel` from the maintained rigid shares ``R``, ``T`` (``(B, g)``),
    per-batch ``ceil(E_live / g)`` and ``N``: ``O(g + sum of replicated sets)`` a batch.
    ``by_mean``: every expert by decreasing mean load (ties: lower index)."""
    B, E = counts.shape
    g, per = slots.shape
    # the replica sets of the experts with >= 2 replicas, as compressed rows
    n = 0
    n_rep = 0
    for e in range(E):
        ptr[e] = n
        if cnt[e] >= 2:
            n += cnt[e]
            reps[n_rep] = e
            n_rep += 1
    ptr[E] = n
    fill = ptr[:E].copy()
    for h in range(g):
        for k in range(per):
            e = slots[h, k]
            if cnt[e] >= 2:
                gpus[fill[e]] = h
                fill[e] += 1
    # the replicated experts by decreasing mean load (the greedy dispatch's order)
    n_ord = 0
    for i in range(E):
        if cnt[by_mean[i]] >= 2:
            order[n_ord] = by_mean[i]
            n_ord += 1
    Gw = np.zeros(g)
    Nw = np.zeros(g)
    total = 0.0
    for t in range(B):
        sm = gfloor[t]
        num = N[t]
        den = g
        for h in range(g):
            if R[t, h] > sm:
                sm = R[t, h]
            if T[t, h] * den > num:
                num = T[t, h]
                den = 1
        for j in range(n_rep):
            e = reps[j]
            if counts[t, e] == 0:
                continue
            r = 1
            s = counts[t, e]
            for i in range(ptr[e], ptr[e + 1]):
                r += R[t, gpus[i]]
                s += T[t, gpus[i]]
            q = (r + cnt[e] - 1) // cnt[e]
            if q > sm:
                sm = q
            if s * den > num * cnt[e]:
                num = s
                den = cnt[e]
        lam = num / den
        v = max(a + b * sm, c + beta * lam)
        if has3:
            v = max(v, c2 + gamma * lam)
        if w > 0:
            # the greedy dispatch: rigid shares, then each live replicated expert whole on
            # the replica GPU that ends lowest, or split evenly over its replicas if lower
            for h in range(g):
                Gw[h] = R[t, h]
                Nw[h] = T[t, h]
            for j in range(n_rep):
                e = order[j]
                n = counts[t, e]
                if n == 0:
                    continue
                part = n / cnt[e]
                hb = -1
                vb = 0.0
                vs = 0.0
                for i in range(ptr[e], ptr[e + 1]):
                    h = gpus[i]
                    x = max(a + b * (Gw[h] + 1), c + beta * (Nw[h] + n))
                    y = max(a + b * (Gw[h] + 1), c + beta * (Nw[h] + part))
                    if has3:
                        x = max(x, c2 + gamma * (Nw[h] + n))
                        y = max(y, c2 + gamma * (Nw[h] + part))
                    if hb < 0 or x < vb:
                        hb = h
                        vb = x
                    vs = max(vs, y)
                if vs < vb:
                    for i in range(ptr[e], ptr[e + 1]):
                        Gw[gpus[i]] += 1
                        Nw[gpus[i]] += part
                else:
                    Gw[hb] += 1
                    Nw[hb] += n
            u = 0.0
            for h in range(g):
                x = max(a + b * Gw[h], c + beta * Nw[h])
                if has3:
                    x = max(x, c2 + gamma * Nw[h])
                u = max(u, x)
            v = (1 - w) * v + w * u
        total += v
    return total / B


@njit(**NJIT)
def hall_score_kernel(slots, counts, mean, w, a, b, c, beta, c2, gamma, has3):
    """Mean score (module notes) of ``slots`` (``(g, per)`` experts) over the rows of
    ``counts`` (``(n_batches, E)`` int64): the Hall bound, mixed with weight ``w`` with the
    greedy dispatch's makespan (replicated experts by decreasing ``mean``)."""
    cnt, on, gfloor, N, R, T, ptr, gpus, reps, order = _slot_state(slots, counts)
    by_mean = np.argsort(-mean, kind="mergesort")
    state = (gfloor, N, ptr, gpus, reps, order, by_mean, w, a, b, c, beta, c2, gamma, has3)
    return _hall_eval(slots, cnt, R, T, counts, *state)


@njit(**NJIT)
def _slot_state(slots, counts):
    """The search state of ``slots`` (``(g, per)`` experts): replica counts ``cnt``, the
    expert-on-GPU mask ``on``, per batch ``ceil(E_live / g)`` and ``N``, the rigid shares
    ``R``, ``T``, and the scratch arrays of :func:`_hall_eval`."""
    B, E = counts.shape
    g, per = slots.shape
    cnt = np.zeros(E, np.int64)
    on = np.zeros((E, g), np.bool_)
    for h in range(g):
        for k in range(per):
            cnt[slots[h, k]] += 1
            on[slots[h, k], h] = True
    gfloor = np.zeros(B, np.int64)
    N = np.zeros(B, np.int64)
    R = np.zeros((B, g), np.int64)
    T = np.zeros((B, g), np.int64)
    for t in range(B):
        live = 0
        for e in range(E):
            if counts[t, e] > 0:
                live += 1
                N[t] += counts[t, e]
        gfloor[t] = (live + g - 1) // g
    for e in range(E):
        _toggle(1, e, on, cnt, R, T, counts)
    ptr = np.zeros(E + 1, np.int64)
    gpus = np.zeros(g * per, np.int64)
    reps = np.zeros(E, np.int64)
    order = np.zeros(E, np.int64)
    return cnt, on, gfloor, N, R, T, ptr, gpus, reps, order


@njit(**NJIT)
def _keep_best(buf, n, e, key, sign):
    """Insert ``e`` into ``buf[:n]``, the (at most ``len(buf)``) experts of largest
    ``sign * key`` in order, ties to the lower index (a stable sort's first entries);
    returns the new count."""
    pos = n
    while pos > 0:
        x = buf[pos - 1]
        if sign * key[e] > sign * key[x] or (key[e] == key[x] and e < x):
            pos -= 1
        else:
            break
    if pos >= buf.shape[0]:
        return n
    for i in range(min(n, buf.shape[0] - 1), pos, -1):
        buf[i] = buf[i - 1]
    buf[pos] = e
    return min(n + 1, buf.shape[0])


@njit(**NJIT)
def _slot_of(slots, h, e):
    """The slot of GPU ``h`` that holds expert ``e`` (the last such slot; 0 if none)."""
    kk = 0
    for k in range(slots.shape[1]):
        if slots[h, k] == e:
            kk = k
    return kk


@njit(**NJIT)
def placement_search_kernel(
    slots0, counts, freq, mean, need, node_of, w, a, b, c, beta, c2, gamma, has3, max_evals,
    patience,
):  # fmt: skip
    """First-improvement search (module notes) from ``slots0`` (``(g, per)`` experts, no
    expert twice on a GPU) on the mean Hall bound over ``counts``; returns
    ``(slots, score, evals)``."""
    slots = slots0.copy()
    g, per = slots.shape
    E = counts.shape[1]
    several_nodes = node_of.max() > 0
    cnt, on, gfloor, N, R, T, ptr, gpus, reps, order = _slot_state(slots, counts)
    by_mean = np.argsort(-mean, kind="mergesort")
    args = (gfloor, N, ptr, gpus, reps, order, by_mean, w, a, b, c, beta, c2, gamma, has3)
    best = _hall_eval(slots, cnt, R, T, counts, *args)
    evals = 0
    pressure = np.zeros(g)
    ratio = np.zeros(E)
    wt = np.zeros(E)
    recv = np.empty(_RECEIVERS, np.int64)
    donors = np.empty(_DONORS, np.int64)
    e1s = np.empty(_HOT_EXPERTS, np.int64)
    e2s = np.empty(_COLD_EXPERTS, np.int64)
    # the round in which each replica move (receiver, donor) and swap (e1, e2) was last
    # rejected; those rejected after round ``fresh`` are not tried again until a full pass
    rej_move = np.zeros((E, E), np.int64)
    rej_swap = np.zeros((E, E), np.int64)
    rnd = 0
    fresh = 0
    cap = min(max_evals, patience)  # stop at cap evaluations: patience after the last gain
    while evals < cap:
        rnd += 1
        skipped = False
        for h in range(g):
            f = 0.0
            m = 0.0
            for k in range(per):
                e = slots[h, k]
                if cnt[e] == 1:
                    f += freq[e]
                    m += mean[e]
            pressure[h] = max(a + b * f, c + beta * m)
        for e in range(E):
            wt[e] = max(b * freq[e], beta * mean[e]) / cnt[e]
        improved = False
        # 1. replica moves: a donor's slot to a receiver, for each criterion in turn
        for q in range(need.shape[0]):
            if improved:
                break
            for e in range(E):
                ratio[e] = need[q, e] / cnt[e]
            n_recv = 0
            n_don = 0
            for e in range(E):
                n_recv = _keep_best(recv, n_recv, e, ratio, 1.0)
                if cnt[e] >= 2:
                    n_don = _keep_best(donors, n_don, e, ratio, -1.0)
            for i in range(n_recv):
                u = recv[i]
                for j in range(n_don):
                    d = donors[j]
                    if d == u or evals >= cap:
                        continue
                    hb = -1
                    for h in range(g):
                        if not on[d, h] or on[u, h]:
                            continue
                        if several_nodes:
                            near = False
                            for x in range(g):
                                if on[u, x] and node_of[x] == node_of[h]:
                                    near = True
                            if not near:
                                continue
                        if hb < 0 or pressure[h] < pressure[hb]:
                            hb = h
                    if hb < 0:
                        continue
                    if rej_move[u, d] > fresh:
                        skipped = skipped or rej_move[u, d] < rnd
                        continue
                    kb = _slot_of(slots, hb, d)
                    _set_slot(slots, on, cnt, R, T, counts, hb, kb, u)
                    s = _hall_eval(slots, cnt, R, T, counts, *args)
                    evals += 1
                    if s < best * (1 - 1e-12):
                        best = s
                        improved = True
                        cap = min(max_evals, evals + patience)
                        break
                    _set_slot(slots, on, cnt, R, T, counts, hb, kb, d)
                    rej_move[u, d] = rnd
                if improved:
                    break
        if improved:
            continue
        # 2. swaps between a GPU of large and one of small pressure
        hot = np.argsort(-pressure, kind="mergesort")
        cold = np.argsort(pressure, kind="mergesort")
        for i1 in range(min(_HOT_GPUS, g)):
            h1 = hot[i1]
            for i2 in range(min(_COLD_GPUS, g)):
                h2 = cold[i2]
                if h1 == h2 or node_of[h1] != node_of[h2]:
                    continue
                n1 = 0
                n2 = 0
                for k in range(per):
                    e = slots[h1, k]
                    if cnt[e] == 1 and not on[e, h2]:
                        n1 = _keep_best(e1s, n1, e, wt, 1.0)
                    e = slots[h2, k]
                    if not on[e, h1]:
                        n2 = _keep_best(e2s, n2, e, wt, -1.0)
                for j1 in range(n1):
                    e1 = e1s[j1]
                    for j2 in range(n2):
                        e2 = e2s[j2]
                        if wt[e1] <= wt[e2] or evals >= cap:
                            continue
                        if rej_swap[e1, e2] > fresh:
                            skipped = skipped or rej_swap[e1, e2] < rnd
                            continue
                        k1 = _slot_of(slots, h1, e1)
                        k2 = _slot_of(slots, h2, e2)
                        _set_slot(slots, on, cnt, R, T, counts, h1, k1, e2)
                        _set_slot(slots, on, cnt, R, T, counts, h2, k2, e1)
                        s = _hall_eval(slots, cnt, R, T, counts, *args)
                        evals += 1
                        if s < best * (1 - 1e-12):
                            best = s
                            improved = True
                            cap = min(max_evals, evals + patience)
                            break
                        _set_slot(slots, on, cnt, R, T, counts, h2, k2, e2)
                        _set_slot(slots, on, cnt, R, T, counts, h1, k1, e1)
                        rej_swap[e1, e2] = rnd
                    if improved:
                        break
                if improved:
                    break
            if improved:
                break
        if not improved:
            if not skipped:
                break
            fresh = rnd  # a full pass: every candidate is tried again
    return slots, best, evals


def placement_search_reference(
    slots0, counts, freq, mean, need, node_of, w, a, b, c, beta, c2, gamma, has3, max_evals,
    patience,
):  # fmt: skip
    """Plain-Python reference of :func:`placement_search_kernel` (lists, sorted keys, and
    :func:`hall_score_reference`)."""
    slots = [[int(x) for x in row] for row in slots0]
    g, E = len(slots), len(counts[0])
    nodes = [int(x) for x in node_of]
    freq, mean = [float(x) for x in freq], [float(x) for x in mean]
    need = [[float(x) for x in row] for row in need]

    def score():
        return hall_score_reference(slots, counts, mean, w, a, b, c, beta, c2, gamma, has3)

    best, evals = score(), 0
    rejected, rnd, fresh = {}, 0, 0  # candidate key -> round of its last rejection
    cap = min(max_evals, patience)
    while evals < cap:
        rnd += 1
        skipped = False
        cnt = [sum(row.count(e) for row in slots) for e in range(E)]
        pressure = []
        for row in slots:
            f = m = 0.0
            for e in row:
                if cnt[e] == 1:
                    f += freq[e]
                    m += mean[e]
            pressure.append(max(a + b * f, c + beta * m))
        wt = [max(b * freq[e], beta * mean[e]) / cnt[e] for e in range(E)]
        trials = []  # (key, (GPU, slot, new expert) changes) of each candidate, in order
        for row in need:
            ratio = [row[e] / cnt[e] for e in range(E)]
            recv = sorted(range(E), key=lambda e: -ratio[e])[:_RECEIVERS]
            donors = [e for e in sorted(range(E), key=lambda e: ratio[e]) if cnt[e] >= 2]
            for u in recv:
                for d in donors[:_DONORS]:
                    if d == u:
                        continue
                    near = {nodes[x] for x in range(g) if u in slots[x]}
                    gpus = [h for h in range(g) if d in slots[h] and u not in slots[h]]
                    gpus = [h for h in gpus if max(nodes) == 0 or nodes[h] in near]
                    if gpus:
                        h = min(gpus, key=lambda x: pressure[x])
                        trials.append((("move", u, d), [(h, slots[h].index(d), u)]))
        hot = sorted(range(g), key=lambda h: -pressure[h])[:_HOT_GPUS]
        cold = sorted(range(g), key=lambda h: pressure[h])[:_COLD_GPUS]
        for h1 in hot:
            for h2 in cold:
                if h1 == h2 or nodes[h1] != nodes[h2]:
                    continue
                e1s = [
                    e for e in sorted(range(E), key=lambda e: -wt[e])
                    if cnt[e] == 1 and e in slots[h1] and e not in slots[h2]
                ][:_HOT_EXPERTS]  # fmt: skip
                e2s = [
                    e for e in sorted(range(E), key=lambda e: wt[e])
                    if e in slots[h2] and e not in slots[h1]
                ][:_COLD_EXPERTS]  # fmt: skip
                trials += [
                    (
                        ("swap", e1, e2),
                        [(h1, slots[h1].index(e1), e2), (h2, slots[h2].index(e2), e1)],
                    )
                    for e1 in e1s
                    for e2 in e2s
                    if wt[e1] > wt[e2]
                ]
        improved = False
        for key, trial in trials:
            if evals >= cap:
                break
            if rejected.get(key, 0) > fresh:
                skipped = skipped or rejected[key] < rnd
                continue
            old = [slots[h][k] for h, k, _ in trial]
            for h, k, e in trial:
                slots[h][k] = e
            s = score()
            evals += 1
            if s < best * (1 - 1e-12):
                best, improved = s, True
                cap = min(max_evals, evals + patience)
                break
            for (h, k, _), e in zip(trial, old):
                slots[h][k] = e
            rejected[key] = rnd
        if not improved:
            if not skipped:
                break
            fresh = rnd
    return np.array(slots, dtype=np.int64), best, evals
