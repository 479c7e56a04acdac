"""Kernels of the deployment step model: expert choices per source rank, and MoE layer times.

Each ``@njit`` kernel has a plain-Python reference directly below it, written from the same
rules and sharing no helper with it; tests check ``kernel == kernel.py_func == reference``
exactly. Kernels never mutate their inputs and return fresh arrays.

Randomness: SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014), written out in both kernel and reference, so that the two draw the
same stream from one integer seed. A uniform is ``(z >> 11) * 2**-53`` in ``[0, 1)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..solvers._jit import NJIT

__all__ = [
    "sample_choices_kernel",
    "sample_choices_reference",
    "layer_times_kernel",
    "layer_times_reference",
    "LAYER_COLUMNS",
    "MAX_REJECTIONS",
]

#: Draws of one pick rejected for hitting an expert the token already chose before the pick
#: falls back to an exact draw over the unchosen experts (same distribution, O(E)).
MAX_REJECTIONS = 32

#: Columns of :func:`layer_times_kernel`'s output, one row per layer.
LAYER_COLUMNS = (
    "time_us",  # the layer's MoE time: max_g t_g + internode_us * max_g cross_g
    "max_gpu_us",  # max_g t_g (the dispatch problem's makespan)
    "mean_gpu_us",  # mean_g t_g
    "traffic_us",  # max_g (c2 + gamma * N_g), 0 without the traffic piece
    "cross_node_tokens",  # max_g tokens GPU g receives from other nodes
    "remote_tokens",  # max_g tokens GPU g receives from other GPUs
)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0


@njit(**NJIT)
def sample_choices_kernel(q, tokens, top_k, seed):
    """Each token of each source rank picks ``top_k`` distinct experts, per layer.

    ``q`` (L, E) float64: the batch's expert popularity per layer (non-negative, at least
    ``top_k`` positive entries per row; need not sum to 1); ``tokens`` (S,) int64: tokens of
    each source rank; ``seed`` int64 >= 0. Returns ``counts`` (L, S, E) int64.

    A pick is sequential sampling without replacement proportional to ``q``: one uniform
    ``u`` is read through the layer's alias table (Vose's construction: ``v = u * E``, column
    ``i = floor(v)``, expert ``i`` if ``v - i < prob[i]`` else ``alias[i]``); an expert the
    token already holds (or of zero mass) is rejected and the pick redrawn; after
    :data:`MAX_REJECTIONS` rejections, one exact draw over the unchosen experts' mass (walk
    in expert order). Visiting order: layer, source rank, token, pick.
    """
    L, E = q.shape
    S = tokens.shape[0]
    counts = np.zeros((L, S, E), dtype=np.int64)
    state = np.uint64(seed)
    prob = np.empty(E)
    alias = np.empty(E, dtype=np.int64)
    small = np.empty(E, dtype=np.int64)
    large = np.empty(E, dtype=np.int64)
    chosen = np.empty(top_k, dtype=np.int64)
    for l in range(L):
        # Vose's alias table of q[l] (stacks filled in expert order, popped from the top)
        total = 0.0
        for e in range(E):
            total += q[l, e]
        ns = 0
        nl = 0
        for e in range(E):
            prob[e] = q[l, e] * E / total
            alias[e] = e
            if prob[e] < 1.0:
                small[ns] = e
                ns += 1
            else:
                large[nl] = e
                nl += 1
        while ns > 0 and nl > 0:
            ns -= 1
            sm = small[ns]
            nl -= 1
            lg = large[nl]
            alias[sm] = lg
            prob[lg] = (prob[lg] + prob[sm]) - 1.0
            if prob[lg] < 1.0:
                small[ns] = lg
                ns += 1
            else:
                large[nl] = lg
                nl += 1
        while nl > 0:
            nl -= 1
            prob[large[nl]] = 1.0
        while ns > 0:
            ns -= 1
            prob[small[ns]] = 1.0
        for s in range(S):
            for _t in range(tokens[s]):
                for j in range(top_k):
                    pick = -1
                    tries = 0
                    while pick < 0:
                        # SplitMix64, inline (one draw per attempt)
                        state = state + _GOLDEN
                        z = state
                        z = (z ^ (z >> _S30)) * _MIX1
                        z = (z ^ (z >> _S27)) * _MIX2
                        z = z ^ (z >> _S31)
                        u = float(z >> _S11) * _INV53
                        if tries < MAX_REJECTIONS:
                            v = u * E
                            lo = int(v)
                            if lo >= E:
                                lo = E - 1
                            if v - lo >= prob[lo]:
                                lo = alias[lo]
                            dup = q[l, lo] <= 0.0
                            for i in range(j):
                                if chosen[i] == lo:
                                    dup = True
                            if dup:
                                tries += 1
                            else:
                                pick = lo
                        else:  # exact draw over the unchosen experts' mass
                            rest = total
                            for i in range(j):
                                rest -= q[l, chosen[i]]
                            x = u * rest
                            run = 0.0
                            last = -1
                            for e in range(E):
                                dup = q[l, e] <= 0.0
                                for i in range(j):
                                    if chosen[i] == e:
                                        dup = True
                                if dup:
                                    continue
                                last = e
                                run += q[l, e]
                                if run > x:
                                    pick = e
                                    break
                            if pick < 0:  # rounding left x at or above the walked mass
                                pick = last
                    chosen[j] = pick
                    counts[l, s, pick] += 1
    return counts


def sample_choices_reference(q, tokens, top_k, seed):
    """Plain-Python reference of :func:`sample_choices_kernel` (same rules, same stream)."""
    mask = (1 << 64) - 1
    state = int(seed) & mask

    def uniform():
        nonlocal state
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z = z ^ (z >> 31)
        return float(z >> 11) * (1.0 / 9007199254740992.0)

    q = np.asarray(q, dtype=float)
    L, E = q.shape
    S = len(tokens)
    counts = np.zeros((L, S, E), dtype=np.int64)
    for l in range(L):
        weights = [float(w) for w in q[l]]
        total = 0.0
        for w in weights:
            total += w
        # Vose's alias method: scaled masses, "small" and "large" stacks in expert order
        scaled = [w * E / total for w in weights]
        alias = list(range(E))
        small = [e for e in range(E) if scaled[e] < 1.0]
        large = [e for e in range(E) if scaled[e] >= 1.0]
        while small and large:
            sm, lg = small.pop(), large.pop()
            alias[sm] = lg
            scaled[lg] = (scaled[lg] + scaled[sm]) - 1.0
            (small if scaled[lg] < 1.0 else large).append(lg)
        for e in large + small:
            scaled[e] = 1.0
        for s in range(S):
            for _ in range(int(tokens[s])):
                held: list[int] = []
                for _j in range(top_k):
                    pick = None
                    for _try in range(MAX_REJECTIONS):
                        v = uniform() * E
                        e = min(int(v), E - 1)
                        if v - e >= scaled[e]:
                            e = alias[e]
                        if e not in held and weights[e] > 0.0:
                            pick = e
                            break
                    if pick is None:  # exact draw over the experts not yet held
                        u = uniform()
                        rest = total
                        for e in held:
                            rest -= weights[e]
                        x = u * rest
                        run = 0.0
                        free = [e for e in range(E) if e not in held and weights[e] > 0.0]
                        for e in free:
                            run += weights[e]
                            if run > x:
                                pick = e
                                break
                        if pick is None:
                            pick = free[-1]
                    held.append(pick)
                    counts[l, s, pick] += 1
    return counts


@njit(**NJIT)
def layer_times_kernel(x, src, node, cost, internode_us):
    """MoE time of each layer from its dispatch and the tokens' sources.

    ``x`` (L, E, G) float64: tokens of expert ``e`` sent to GPU ``g`` (rows sum to the
    expert's tokens); ``src`` (L, S, E) int64 with ``S == G``: tokens of expert ``e`` from
    source rank ``s`` (rank ``s`` lives on GPU ``s``); ``node`` (G,) int64; ``cost`` the
    :meth:`CostModel.as_array` vector ``[a, b, b2, c, beta, c2, gamma, tile]``;
    ``internode_us`` per token received from another node.

    Per GPU: ``G_g = #{e: x > 0}``, ``N_g = sum_e x`` (summed in expert order), ``T_g = sum_e
    ceil(x / tile)``, ``t_g = max(a + b G_g + b2 (T_g - G_g), c + beta N_g, c2 + gamma N_g)``
    (TEMPO Eq. 1, 2, 4; the evaluator of ``solve_dispatch``). Each source's tokens of an
    expert are split over GPUs in the expert's proportions ``x[e, g] / n_e`` (a flat table).
    Returns (L, len(LAYER_COLUMNS)) float64, see :data:`LAYER_COLUMNS`.
    """
    L, E, G = x.shape
    a, b, b2, c, beta, c2, gamma, tile = (
        cost[0], cost[1], cost[2], cost[3], cost[4], cost[5], cost[6], cost[7],
    )  # fmt: skip
    out = np.zeros((L, 6))
    n_nodes = 0
    for g in range(G):
        if node[g] + 1 > n_nodes:
            n_nodes = node[g] + 1
    per_node = np.zeros(n_nodes)
    for l in range(L):
        Gc = np.zeros(G)
        N = np.zeros(G)
        T = np.zeros(G)
        cross = np.zeros(G)
        remote = np.zeros(G)
        for e in range(E):
            n_e = 0.0
            for k in range(n_nodes):
                per_node[k] = 0.0
            for s in range(G):
                n_e += src[l, s, e]
                per_node[node[s]] += src[l, s, e]
            for g in range(G):
                v = x[l, e, g]
                if v > 0.0:
                    Gc[g] += 1.0
                    T[g] += np.ceil(v / tile)
                    f = v / n_e if n_e > 0.0 else 0.0
                    cross[g] += f * (n_e - per_node[node[g]])
                    remote[g] += f * (n_e - src[l, g, e])
                N[g] += v
        worst = 0.0
        tsum = 0.0
        traffic = 0.0
        cmax = 0.0
        rmax = 0.0
        for g in range(G):
            t = max(a + b * Gc[g] + b2 * (T[g] - Gc[g]), c + beta * N[g])
            t = max(t, c2 + gamma * N[g])
            if t > worst:
                worst = t
            tsum += t
            if gamma > 0.0 or c2 > 0.0:
                traffic = max(traffic, c2 + gamma * N[g])
            cmax = max(cmax, cross[g])
            rmax = max(rmax, remote[g])
        out[l, 0] = worst + internode_us * cmax
        out[l, 1] = worst
        out[l, 2] = tsum / G
        out[l, 3] = traffic
        out[l, 4] = cmax
        out[l, 5] = rmax
    return out


def layer_times_reference(x, src, node, cost, internode_us):
    """Plain-Python reference of :func:`layer_times_kernel`."""
    x = np.asarray(x, dtype=float)
    L, E, G = x.shape
    a, b, b2, c, beta, c2, gamma, tile = (float(v) for v in cost)
    rows = []
    for l in range(L):
        times, Ns, cross, remote = [], [], [], []
        for g in range(G):
            act = 0.0
            n_tok = 0.0
            tiles = 0.0
            cr = 0.0
            rm = 0.0
            for e in range(E):
                v = float(x[l, e, g])
                n_e = 0.0
                for s in range(G):
                    n_e += float(src[l, s, e])
                if v > 0.0:
                    act += 1.0
                    tiles += float(np.ceil(v / tile))
                    same_node = 0.0
                    for s in range(G):
                        if node[s] == node[g]:
                            same_node += float(src[l, s, e])
                    f = v / n_e if n_e > 0.0 else 0.0
                    cr += f * (n_e - same_node)
                    rm += f * (n_e - float(src[l, g, e]))
                n_tok += v
            t = max(a + b * act + b2 * (tiles - act), c + beta * n_tok, c2 + gamma * n_tok)
            times.append(t)
            Ns.append(n_tok)
            cross.append(cr)
            remote.append(rm)
        worst = max(times)
        has_traffic = gamma > 0.0 or c2 > 0.0
        traffic = max(c2 + gamma * n for n in Ns) if has_traffic else 0.0
        rows.append(
            [
                worst + internode_us * max(cross),
                worst,
                sum(times) / G,
                max(traffic, 0.0),
                max(max(cross), 0.0),
                max(max(remote), 0.0),
            ]
        )
    return np.array(rows, dtype=float).reshape(L, 6)
