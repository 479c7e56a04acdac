"""Kernels of the deployment step model: expert choices per source rank, and MoE layer times.

Each ``@njit`` kernel has a plain-Python reference directly below it, written from the same
rules and sharing no helper with it; tests check ``kernel == kernel.py_func == reference``
exactly. Kernels never mutate their inputs and return fresh arrays, except
:func:`deployment_step_kernel`, a whole step in one call, which updates the step model's
preallocated state buffers it is given (named in its docstring).

Randomness: SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", OOPSLA 2014), written out in both kernel and reference, so that the two draw the
same stream from one integer seed. A uniform is ``(z >> 11) * 2**-53`` in ``[0, 1)``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...solvers._numba.jit import NJIT

__all__ = [
    "sample_choices_kernel",
    "sample_choices_reference",
    "layer_times_kernel",
    "layer_times_reference",
    "deployment_step_kernel",
    "deployment_step_reference",
    "LAYER_COLUMNS",
    "STEP_COLUMNS",
    "STEP_PARAMS",
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
    "max_gpu_tokens",  # max_g N_g
    "mean_gpu_tokens",  # mean_g N_g (summed in GPU order)
)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0
#: A node whose ranks send at least this share of what its GPUs receive keeps all of it (a
#: table's shares sum to the expert's tokens only up to rounding).
_FULL = 1.0 - 1e-12


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
def layer_times_kernel(x, src, node, cost, internode_us, node_first):
    """MoE time of each layer from its dispatch and the tokens' sources.

    ``x`` (L, E, G) float64: tokens of expert ``e`` sent to GPU ``g`` (rows sum to the
    expert's tokens); ``src`` (L, S, E) int64 with ``S == G``: tokens of expert ``e`` from
    source rank ``s`` (rank ``s`` lives on GPU ``s``); ``node`` (G,) int64; ``cost`` the
    :meth:`CostModel.as_array` vector ``[a, b, b2, c, beta, c2, gamma, tile]``;
    ``internode_us`` per token received from another node.

    Per GPU: ``G_g = #{e: x > 0}``, ``N_g = sum_e x`` (summed in expert order), ``T_g = sum_e
    ceil(x / tile)``, ``t_g = max(a + b G_g + b2 (T_g - G_g), c + beta N_g, c2 + gamma N_g)``
    (TEMPO Eq. 1, 2, 4; the evaluator of ``solve_dispatch``).

    Which source sends which token where (the traffic columns only; per-GPU loads are ``x``
    either way): ``node_first`` False, a flat table: each source's tokens of an expert split
    over GPUs in the expert's proportions ``x[e, g] / n_e``. ``node_first`` True, the
    topology-aware split (TEMPO §4.3; SGLang's static table prefers the own GPU's replica
    too): each GPU first takes the tokens of its own rank (``own_g = min(src_g, x_g)``), then
    each node keeps ``K_k = min(S_k, D_k)`` of its tokens (``S_k`` from its ranks, ``D_k``
    sent to its GPUs), the rest of its local supply spread over its GPUs in proportion to
    their remaining demand (``local_g = own_g + (x_g - own_g) (K_k - O_k) / (D_k - O_k)``,
    ``O_k`` the node's own sum), and everything else crosses nodes: the fewest inter-node
    tokens any split of these per-GPU loads has (a node whose ranks send at least
    ``(1 - 1e-12) D_k`` keeps everything: shares sum to ``n_e`` up to rounding). Returns
    (L, len(LAYER_COLUMNS)) float64, see :data:`LAYER_COLUMNS`.
    """
    L, E, G = x.shape
    a, b, b2, c, beta, c2, gamma, tile = (
        cost[0], cost[1], cost[2], cost[3], cost[4], cost[5], cost[6], cost[7],
    )  # fmt: skip
    out = np.zeros((L, 8))
    n_nodes = 0
    for g in range(G):
        if node[g] + 1 > n_nodes:
            n_nodes = node[g] + 1
    per_node = np.zeros(n_nodes)
    dem = np.zeros(n_nodes)
    own_node = np.zeros(n_nodes)
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
            if node_first:
                for k in range(n_nodes):
                    dem[k] = 0.0
                    own_node[k] = 0.0
                for g in range(G):
                    v = x[l, e, g]
                    dem[node[g]] += v
                    own_node[node[g]] += min(float(src[l, g, e]), v)
            for g in range(G):
                v = x[l, e, g]
                if v > 0.0:
                    Gc[g] += 1.0
                    T[g] += np.ceil(v / tile)
                    if node_first:
                        own = min(float(src[l, g, e]), v)
                        k = node[g]
                        keep = min(per_node[k], dem[k])
                        r = 0.0
                        if per_node[k] >= dem[k] * _FULL:  # the node's ranks cover it
                            r = 1.0
                        elif dem[k] > own_node[k]:
                            r = (keep - own_node[k]) / (dem[k] - own_node[k])
                        cross[g] += v - (own + (v - own) * r)
                        remote[g] += v - own
                    else:
                        f = v / n_e if n_e > 0.0 else 0.0
                        cross[g] += f * (n_e - per_node[node[g]])
                        remote[g] += f * (n_e - src[l, g, e])
                N[g] += v
        worst = 0.0
        tsum = 0.0
        traffic = 0.0
        cmax = 0.0
        rmax = 0.0
        nmax = 0.0
        nsum = 0.0
        for g in range(G):
            nmax = max(nmax, N[g])
            nsum += N[g]
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
        out[l, 6] = nmax
        out[l, 7] = nsum / G
    return out


def layer_times_reference(x, src, node, cost, internode_us, node_first):
    """Plain-Python reference of :func:`layer_times_kernel`."""
    x = np.asarray(x, dtype=float)
    L, E, G = x.shape
    a, b, b2, c, beta, c2, gamma, tile = (float(v) for v in cost)
    rows = []
    for l in range(L):
        if node_first:  # own rank first, then the node, then other nodes (per expert)
            local = np.zeros((E, G))
            for e in range(E):
                for k in set(int(v) for v in node):
                    gpus = [g for g in range(G) if node[g] == k]
                    supply = 0.0
                    for s in range(G):
                        if node[s] == k:
                            supply += float(src[l, s, e])
                    demand = 0.0
                    own_sum = 0.0
                    for g in gpus:
                        demand += float(x[l, e, g])
                        own_sum += min(float(src[l, g, e]), float(x[l, e, g]))
                    kept = min(supply, demand)
                    if supply >= demand * (1.0 - 1e-12):
                        r = 1.0
                    elif demand > own_sum:
                        r = (kept - own_sum) / (demand - own_sum)
                    else:
                        r = 0.0
                    for g in gpus:
                        own = min(float(src[l, g, e]), float(x[l, e, g]))
                        local[e, g] = own + (float(x[l, e, g]) - own) * r
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
                    if node_first:
                        cr += v - local[e, g]
                        rm += v - min(float(src[l, g, e]), v)
                    else:
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
        total_n = 0.0
        for n in Ns:
            total_n += n
        rows.append(
            [
                worst + internode_us * max(cross),
                worst,
                sum(times) / G,
                max(traffic, 0.0),
                max(max(cross), 0.0),
                max(max(remote), 0.0),
                max(max(Ns), 0.0),
                total_n / G,
            ]
        )
    return np.array(rows, dtype=float).reshape(L, 8)


#: Columns of :func:`deployment_step_kernel`'s log row (the fields of
#: :class:`~straggler.sim.engine.deployment.StepBreakdown`, in order).
STEP_COLUMNS = (
    "attention_us",
    "attention_straggler_us",
    "moe_us",
    "moe_straggler_us",
    "comm_us",
    "dense_us",
    "total_us",
    "cross_node_tokens",
    "balancedness",
    "rebalance_us",
)

#: Entries of :func:`deployment_step_kernel`'s parameter vector ``par``.
STEP_PARAMS = (
    "att_a", "att_b", "att_c", "n_layers", "layer_scale", "dense_us", "internode_us",
    "node_first",
)  # fmt: skip


@njit(**NJIT)
def _pairwise_sum(v, lo, n):
    """``v[lo:lo + n].sum()`` in numpy's order (``pairwise_sum`` of numpy's
    ``loops_utils.h.src``: under 8 terms in sequence from -0.0; up to 128 with 8 running sums
    combined as ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))``, then the remainder;
    above 128 the sum of the two halves, split at half rounded down to a multiple of 8), so
    a sum here is bit-identical to numpy's. The halving runs on explicit stacks (numba's
    disk cache does not load recursive functions reliably)."""
    # tasks (start, length, combine?) and the values of finished parts; depth <= 64 halvings
    t_lo = np.empty(200, dtype=np.int64)
    t_n = np.empty(200, dtype=np.int64)
    vals = np.empty(200)
    nt = 1
    nv = 0
    t_lo[0] = lo
    t_n[0] = n
    while nt > 0:
        nt -= 1
        a = t_lo[nt]
        m = t_n[nt]
        if m < 0:  # combine the two last finished halves (left, then right)
            nv -= 1
            vals[nv - 1] = vals[nv - 1] + vals[nv]
        elif m < 8:
            res = -0.0
            for i in range(a, a + m):
                res += v[i]
            vals[nv] = res
            nv += 1
        elif m <= 128:
            r0, r1, r2, r3 = v[a], v[a + 1], v[a + 2], v[a + 3]
            r4, r5, r6, r7 = v[a + 4], v[a + 5], v[a + 6], v[a + 7]
            i = 8
            while i < m - m % 8:
                r0 += v[a + i]
                r1 += v[a + i + 1]
                r2 += v[a + i + 2]
                r3 += v[a + i + 3]
                r4 += v[a + i + 4]
                r5 += v[a + i + 5]
                r6 += v[a + i + 6]
                r7 += v[a + i + 7]
                i += 8
            res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
            while i < m:
                res += v[a + i]
                i += 1
            vals[nv] = res
            nv += 1
        else:  # combine after both halves; the left half on top, so it finishes first
            m2 = m // 2
            m2 -= m2 % 8
            t_lo[nt], t_n[nt] = 0, -1
            t_lo[nt + 1], t_n[nt + 1] = a + m2, m - m2
            t_lo[nt + 2], t_n[nt + 2] = a, m2
            nt += 3
    return vals[0]


@njit(**NJIT)
def deployment_step_kernel(
    q, seed, kv, req, top_k, tables, static_gpu, node, cost, par, window, slot, acc, log, row
):
    """One decode step of the deployment model: choices, dispatch, layer times, the step's
    decomposition, and the count windows; returns the step's MoE time (us).

    ``q`` (L, E), ``seed``, ``req`` (G,) int64 and ``top_k``: the choices, as
    :func:`sample_choices_kernel` draws them (tokens are the ranks' running requests).
    Dispatch: with ``static_gpu`` of shape (G, L, E) (SGLang's static table), every
    (source, layer, expert) sends its tokens to GPU ``static_gpu[s, l, e]``, added in source
    order; with ``static_gpu`` of shape (0, L, E), ``x[l, e, g] = n_le * tables[l, e, g]``
    (the table in force, ``n_le`` the layer's tokens of ``e``). Layer times as
    :func:`layer_times_kernel` prices them (``node``, ``cost``). ``kv`` (G,) float64 resident
    KV tokens; ``par`` the vector :data:`STEP_PARAMS`.

    The decomposition (:data:`STEP_COLUMNS`): ``att_g = (a + b kv_g) + c req_g``,
    ``attention_us = n_layers * max_g att_g``, ``attention_straggler_us = n_layers * (max -
    mean)``, ``moe_us = scale * sum_l time_l``, ``moe_straggler_us = scale * sum_l (max_l -
    mean_l)``, ``comm_us = scale * sum_l ((traffic_l + time_l) - max_l)``,
    ``cross_node_tokens = mean_l cross_l``, ``total_us = (attention + moe) + dense``,
    ``balancedness = sum_l mean_g N_g / sum_l max_g N_g`` (vLLM's ``EplbState`` balancedness
    of the step, 0 without tokens), ``rebalance_us = 0`` (the step model adds a
    rearrangement's cost after the call); every sum and mean in numpy's pairwise order
    (bit-identical to the numpy expressions of the reference).

    State, updated in place (the one kernel here that writes into its arguments, so that a
    step is one call on the model's preallocated buffers): ``window[slot] = n``, ``acc +=
    n`` (``n`` (L, E) int64 the step's tokens per expert), ``log[row]`` the decomposition.
    """
    src = sample_choices_kernel(q, req, top_k, seed)
    L, S, E = src.shape
    G = tables.shape[2]
    x = np.zeros((L, E, G))
    for l in range(L):
        for e in range(E):
            n = 0
            for s in range(S):
                n += src[l, s, e]
            window[slot, l, e] = n
            acc[l, e] += n
            if static_gpu.shape[0] == 0:
                for g in range(G):
                    x[l, e, g] = n * tables[l, e, g]
    if static_gpu.shape[0] > 0:
        for s in range(S):
            for l in range(L):
                for e in range(E):
                    x[l, e, static_gpu[s, l, e]] += src[l, s, e]
    rows = layer_times_kernel(x, src, node, cost, par[6], par[7] > 0.0)
    att = np.empty(G)
    worst = -np.inf
    for g in range(G):
        att[g] = (par[0] + par[1] * kv[g]) + par[2] * float(req[g])
        if att[g] > worst:
            worst = att[g]
    col = np.empty(L)
    for l in range(L):
        col[l] = rows[l, 0]
    moe = par[4] * _pairwise_sum(col, 0, L)
    for l in range(L):
        col[l] = rows[l, 1] - rows[l, 2]
    straggler = par[4] * _pairwise_sum(col, 0, L)
    for l in range(L):
        col[l] = (rows[l, 3] + rows[l, 0]) - rows[l, 1]
    comm = par[4] * _pairwise_sum(col, 0, L)
    for l in range(L):
        col[l] = rows[l, 7]
    avg_tok = _pairwise_sum(col, 0, L)
    for l in range(L):
        col[l] = rows[l, 6]
    max_tok = _pairwise_sum(col, 0, L)
    for l in range(L):
        col[l] = rows[l, 4]
    attention = par[3] * worst
    log[row, 0] = attention
    log[row, 1] = par[3] * (worst - _pairwise_sum(att, 0, G) / G)
    log[row, 2] = moe
    log[row, 3] = straggler
    log[row, 4] = comm
    log[row, 5] = par[5]
    log[row, 6] = (attention + moe) + par[5]
    log[row, 7] = _pairwise_sum(col, 0, L) / L
    log[row, 8] = avg_tok / max_tok if max_tok > 0.0 else 0.0
    log[row, 9] = 0.0
    return moe


def deployment_step_reference(
    q, seed, kv, req, top_k, tables, static_gpu, node, cost, par, window, slot, acc, log, row
):
    """Plain-Python reference of :func:`deployment_step_kernel` (the step in numpy
    expressions on the reference choices and layer times; same in-place updates)."""
    src = sample_choices_reference(q, req, top_k, seed)
    L, S, E = src.shape
    counts = src.sum(axis=1)
    if len(static_gpu):
        x = np.zeros((L, E, tables.shape[2]))
        li, ei = np.meshgrid(np.arange(L), np.arange(E), indexing="ij")
        for s in range(S):
            np.add.at(x, (li, ei, static_gpu[s]), src[:, s, :])
    else:
        x = counts[:, :, None] * tables
    rows = layer_times_reference(x, src, node, cost, par[6], par[7] > 0.0)
    att = par[0] + par[1] * np.asarray(kv, dtype=float) + par[2] * np.asarray(req, dtype=float)
    attention = par[3] * float(att.max())
    moe = par[4] * float(rows[:, 0].sum())
    window[slot] = counts
    acc += counts
    log[row] = [
        attention,
        par[3] * float(att.max() - att.mean()),
        moe,
        par[4] * float((rows[:, 1] - rows[:, 2]).sum()),
        par[4] * float((rows[:, 3] + rows[:, 0] - rows[:, 1]).sum()),
        par[5],
        attention + moe + par[5],
        float(rows[:, 4].mean()),
        float(rows[:, 7].sum() / rows[:, 6].sum()) if rows[:, 6].sum() > 0 else 0.0,
        0.0,
    ]
    return moe
