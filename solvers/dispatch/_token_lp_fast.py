"""Exact token LP (TEMPO Lemma 1) by augmenting paths: Numba kernel and plain-Python reference.

Private module (stumpy's ``_stump`` / ``stump`` split): :func:`token_lp_kernel` is the
jitted kernel, :func:`token_lp_reference` the plain-Python reference written directly from
the algorithm below, sharing no helper with the kernel. The public wrapper is
:func:`straggler.solvers.dispatch.tempo.token_lp_fast`.

Problem: ``lambda* = min max_g N_g`` over fractional splits of each expert's ``n_e`` tokens
across its replica GPUs ``R(e)``. By max-flow/min-cut (Hall's condition for the bipartite
transportation problem),

    lambda* = max over GPU sets S of W(S) / |S|,   W(S) = sum of n_e over e with R(e) inside S,

and an integral flow with ``max_g N_g <= C`` exists for an integer ``C`` iff ``C >= lambda*``.

Algorithm (all integer arithmetic, exact):

1. Seed: experts by descending tokens (ties: lower index), each whole on its least-loaded
   replica (ties: lower GPU index).
2. Integer cap: ``C = ceil(total / g)``. Push: while some GPU is over ``C`` (the lowest index
   ``u`` first), breadth-first search from ``u`` in the residual graph, whose arcs are
   ``w -> v`` when some expert ``e`` has ``x[e, w] > 0`` and a replica on ``v`` (GPUs in
   increasing index, experts in increasing index, first found kept), up to the first GPU
   ``t`` under ``C``; push ``min(load[u] - C, C - load[t], shares along the path)`` tokens
   along it. When no such ``t`` is reachable, the reached set ``S`` is closed (every expert
   with tokens in ``S`` has all its replicas in ``S``) and every GPU in it is at or over
   ``C`` with ``u`` over, so ``W(S) = load(S) > C |S|``: then ``C <- max(C + 1,
   ceil(W(S)/|S|))`` (still ``<= ceil(lambda*)``) and the push resumes from the current
   flow. It ends with an integral dispatch of ``max_g N_g = ceil(lambda*)``.
3. Exact value (Dinkelbach on the densest-set ratio): ``p/q`` is the largest ratio
   ``W(S)/|S|`` seen (``S`` = all GPUs included). While ``p != C q``: scale the integral
   dispatch by ``q`` and push with cap ``p``; feasible means ``lambda* = p/q``; otherwise
   the stuck set gives a strictly larger ratio ``W(S')/|S'|``, which becomes ``p/q``.

Tokens are scaled by at most ``g``; counts below ``2**52`` with ``g, E < 2**11`` stay in int64.
The expert order (descending tokens, ties lower index) comes from a stable radix sort
(:func:`~straggler.solvers._order.stable_argsort_int_desc`).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, types

from ...formulations.dispatch import TILE_SLACK
from .. import _order
from .._numba import address as _address
from .._numba.address import call_compiled, compiled_address, readonly
from .._numba.jit import NJIT, NJIT_INLINE, cache_depends_on
from .._order import stable_argsort_int_desc
from . import _csr
from ._csr import replica_lists

__all__ = [
    "token_lp_kernel",
    "token_lp_reference",
    "support_rebalance_kernel",
    "support_rebalance_reference",
    "support_contract_kernel",
    "support_contract_reference",
    "support_swap_kernel",
    "support_swap_reference",
    "token_lp_handle",
    "exact_token_lp_kernel",
    "exact_token_lp_reference",
    "support_fractional_kernel",
    "support_fractional_reference",
]


@njit(**NJIT)
def _push(x, load, cap, e_ptr, e_gpus, g_ptr, g_exps):
    """Augment until no GPU exceeds ``cap`` (True, 0, 0) or stuck: (False, W(S), |S|)."""
    g = load.shape[0]
    par_gpu = np.empty(g, np.int64)
    par_exp = np.empty(g, np.int64)
    queue = np.empty(g, np.int64)
    seen = np.zeros(g, np.bool_)
    while True:
        u = -1
        for h in range(g):
            if load[h] > cap:
                u = h
                break
        if u < 0:
            return True, 0, 0
        seen[:] = False
        seen[u] = True
        queue[0] = u
        head = 0
        tail = 1
        t = -1
        while head < tail and t < 0:
            w = queue[head]
            head += 1
            for i in range(g_ptr[w], g_ptr[w + 1]):
                e = g_exps[i]
                if x[e, w] == 0:
                    continue
                for j in range(e_ptr[e], e_ptr[e + 1]):
                    v = e_gpus[j]
                    if not seen[v]:
                        seen[v] = True
                        par_gpu[v] = w
                        par_exp[v] = e
                        if load[v] < cap:
                            t = v
                            break
                        queue[tail] = v
                        tail += 1
                if t >= 0:
                    break
        if t < 0:
            wsum = 0
            k = 0
            for h in range(g):
                if seen[h]:
                    wsum += load[h]
                    k += 1
            return False, wsum, k
        delta = min(load[u] - cap, cap - load[t])
        v = t
        while v != u:
            w = par_gpu[v]
            delta = min(delta, x[par_exp[v], w])
            v = w
        v = t
        while v != u:
            w = par_gpu[v]
            e = par_exp[v]
            x[e, w] -= delta
            x[e, v] += delta
            v = w
        load[u] -= delta
        load[t] += delta


@njit(**NJIT_INLINE)
def _gcd(p, q):
    while q:
        p, q = q, p % q
    return p


@njit(**NJIT)
def token_lp_kernel(counts, replicas):
    """Integral token-optimal dispatch and the exact token-LP value ``num / den``.

    Parameters
    ----------
    counts : ndarray of int64, shape (n_experts,)
    replicas : ndarray of bool, shape (n_experts, n_gpus)
        Every expert with tokens has a replica (validated by the caller).

    Returns
    -------
    shares : ndarray of int64, shape (n_experts, n_gpus)
        Integral dispatch with ``max_g N_g = ceil(lambda*)``.
    num, den : int
        ``lambda* = num / den`` in lowest terms (``0 / 1`` without tokens).
    """
    E, g = replicas.shape
    e_ptr, e_gpus, g_ptr, g_exps = replica_lists(replicas)
    x = np.zeros((E, g), np.int64)
    load = np.zeros(g, np.int64)
    # Step 1: whole experts, descending tokens, least-loaded replica.
    # descending tokens, ties lower index (radix sort; the reference sorts (-n_e, e))
    order = stable_argsort_int_desc(counts)
    total = np.int64(0)  # int64 from the start: a literal 0 makes numba compile _push for it
    for i in range(E):
        e = order[i]
        n = counts[e]
        if n == 0:
            break
        total += n
        best = -1
        for j in range(e_ptr[e], e_ptr[e + 1]):
            h = e_gpus[j]
            if best < 0 or load[h] < load[best]:
                best = h
        x[e, best] = n
        load[best] += n
    if total == 0:
        return x, 0, 1
    # Step 2: smallest feasible integer cap.
    p = total
    q = g
    cap = (total + g - 1) // g
    while True:
        ok, w, k = _push(x, load, cap, e_ptr, e_gpus, g_ptr, g_exps)
        if ok:
            break
        if w * q > p * k:
            p = w
            q = k
        cap = max(cap + 1, (w + k - 1) // k)
    # Step 3: exact ratio by Dinkelbach on scaled copies of the integral dispatch.
    while p != cap * q:
        xs = np.empty((E, g), np.int64)  # loops, not x * q: numba's array arithmetic
        for e in range(E):  # compiles its broadcasting machinery into the kernel
            for h in range(g):
                xs[e, h] = x[e, h] * q
        ls = np.empty(g, np.int64)
        for h in range(g):
            ls[h] = load[h] * q
        ok, w, k = _push(xs, ls, p, e_ptr, e_gpus, g_ptr, g_exps)
        if ok:
            break
        p = w // q
        q = k
    d = _gcd(p, q)
    return x, p // d, q // d


def _push_reference(x, load, cap, R):
    """Plain-Python twin of :func:`_push` on lists: augment until no GPU exceeds ``cap``
    (``(True, 0, 0)``) or stuck (``(False, W(S), |S|)``); ``R`` the replica rows."""
    E, g = len(R), len(R[0])
    while True:
        over = [h for h in range(g) if load[h] > cap]
        if not over:
            return True, 0, 0
        u = over[0]
        seen = {u}
        parent = {}
        queue = [u]
        t = None
        for w in queue:  # breadth first; the list grows while iterating
            for e in range(E):
                if x[e][w] == 0 or not R[e][w]:
                    continue
                for v in range(g):
                    if R[e][v] and v not in seen:
                        seen.add(v)
                        parent[v] = (w, e)
                        if load[v] < cap:
                            t = v
                            break
                        queue.append(v)
                if t is not None:
                    break
            if t is not None:
                break
        if t is None:
            return False, sum(load[h] for h in seen), len(seen)
        path = []
        v = t
        while v != u:
            w, e = parent[v]
            path.append((w, e, v))
            v = w
        delta = min([load[u] - cap, cap - load[t]] + [x[e][w] for w, e, _ in path])
        for w, e, v in path:
            x[e][w] -= delta
            x[e][v] += delta
        load[u] -= delta
        load[t] += delta


def token_lp_reference(counts, replicas):
    """Plain-Python reference of :func:`token_lp_kernel` (same algorithm and tie-breaking).

    Examples
    --------
    Expert 0 (6 tokens) lives on GPUs 0 and 1, expert 1 (2 tokens) only on GPU 1:
    ``lambda* = 4``.

    >>> x, num, den = token_lp_reference([6, 2], [[True, True], [False, True]])
    >>> x.tolist(), num, den
    ([[4, 2], [0, 2]], 4, 1)
    """
    counts = [int(c) for c in counts]
    R = [[bool(r) for r in row] for row in replicas]
    E, g = len(R), len(R[0])
    x = [[0] * g for _ in range(E)]
    load = [0] * g

    for e in sorted(range(E), key=lambda e: (-counts[e], e)):
        if counts[e] == 0:
            break
        best = min((h for h in range(g) if R[e][h]), key=lambda h: (load[h], h))
        x[e][best] = counts[e]
        load[best] += counts[e]
    total = sum(counts)
    if total == 0:
        return np.array(x, dtype=np.int64).reshape(E, g), 0, 1
    p, q = total, g
    cap = -(-total // g)
    while True:
        ok, w, k = _push_reference(x, load, cap, R)
        if ok:
            break
        if w * q > p * k:
            p, q = w, k
        cap = max(cap + 1, -(-w // k))
    while p != cap * q:
        xs = [[v * q for v in row] for row in x]
        ls = [v * q for v in load]
        ok, w, k = _push_reference(xs, ls, p, R)
        if ok:
            break
        p, q = w // q, k
    d = math.gcd(p, q)
    return np.array(x, dtype=np.int64), p // d, q // d


@functools.cache
def token_lp_handle() -> tuple:
    """The last argument (``lp``) of the support kernels: the handle
    (:func:`~straggler.solvers._numba.address.compiled_address`) of :func:`token_lp_kernel` for
    read-only int64 counts and a read-only bool support, the types they call it with (and
    Python with a problem's arrays), compiled here or loaded from numba's disk cache on the
    first call of the process, then kept.

    The support kernels call the token LP by this address
    (:func:`~straggler.solvers._numba.address.call_compiled`) instead of linking it: a jitted
    function's library links and optimizes again every callee it links, so each of the three
    would otherwise compile the token LP once more.
    """
    counts = types.Array(types.int64, 1, "C", readonly=True)
    support = types.Array(types.bool_, 2, "C", readonly=True)
    return compiled_address(token_lp_kernel, (counts, support))


@njit(**NJIT)
def _gpu_time(x, cost, h, tile):
    """Modeled time of GPU ``h`` of a whole-token dispatch (the evaluator's order of operations)."""
    G = 0
    N = 0
    T = 0
    for e in range(x.shape[0]):
        v = x[e, h]
        if v > 0:
            G += 1
            N += v
            T += (v + tile - 1) // tile
    t = cost[0] + cost[1] * G + cost[2] * (T - G)
    u = cost[3] + cost[4] * N
    if u > t:
        t = u
    u = cost[5] + cost[6] * N
    if u > t:
        t = u
    return t


@njit(**NJIT)
def _makespan(x, cost):
    """Modeled makespan of a whole-token dispatch."""
    tile = np.int64(cost[7])
    m = -np.inf
    for h in range(x.shape[1]):
        t = _gpu_time(x, cost, h, tile)
        if t > m:
            m = t
    return m


@njit(**NJIT)
def _support(x):
    """``x > 0`` of an int64 matrix, by a loop (numba's array comparison compiles its
    broadcasting machinery into each kernel that uses it)."""
    E, g = x.shape
    sup = np.empty((E, g), np.bool_)
    for e in range(E):
        for h in range(g):
            sup[e, h] = x[e, h] > 0
    return sup


@njit(**NJIT)
def support_rebalance_kernel(counts, shares, cost, lp):
    """Token-optimal dispatch on the support of ``shares``, kept iff its makespan is lower.

    The token LP restricted to the replicas ``shares > 0`` moves tokens only between
    replicas that are already active, so it adds no activation (and may drop some); its
    integral optimum is scored under ``cost`` (``CostModel.as_array()``).

    Parameters
    ----------
    lp : tuple
        :func:`token_lp_handle`: the compiled token LP, called by address; ignored in Python.

    Returns
    -------
    shares : ndarray of int64, shape (n_experts, n_gpus)
        The rebalanced dispatch if strictly better, else a copy of ``shares``.
    improved : bool
    makespan : float
        Of the returned dispatch.
    """
    y, _, _ = call_compiled(lp, token_lp_kernel, (readonly(counts), readonly(_support(shares))))
    m0 = _makespan(shares, cost)
    m1 = _makespan(y, cost)
    if m1 < m0:
        return y, True, m1
    return shares.copy(), False, m0


def _reference_gpu_time(col, cost) -> float:
    """Plain-Python modeled time of one GPU holding the whole-token shares ``col``, under
    ``cost`` (``CostModel.as_array()``): what :func:`_gpu_time` computes."""
    tile = int(cost[7])
    col = [int(v) for v in col if v > 0]
    return _reference_time(len(col), sum(col), sum(-(-v // tile) for v in col), cost)


def _reference_time(G, N, T, cost) -> float:
    """The modeled time of a GPU with ``G`` activations, ``N`` tokens and ``T`` tiles, under
    ``cost`` (``CostModel.as_array()``), in plain Python: the references' one formula."""
    a, b, b2, c, beta, c2, gamma = (float(v) for v in cost[:7])
    return max(a + b * G + b2 * (T - G), c + beta * N, c2 + gamma * N)


def _reference_makespan(z, cost) -> float:
    """Plain-Python makespan of the whole-token dispatch ``z``: what :func:`_makespan`
    computes."""
    return max(_reference_gpu_time(z[:, h], cost) for h in range(z.shape[1]))


def support_rebalance_reference(counts, shares, cost):
    """Plain-Python reference of :func:`support_rebalance_kernel`.

    Examples
    --------
    Expert 0 (10 tokens) is split 8/2 over GPUs 0 and 1, expert 1 (4 tokens) is on GPU 1;
    tokens only (``beta = 1``): the support allows 7/7.

    >>> cost = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 128.0]
    >>> y, improved, m = support_rebalance_reference([10, 4], [[8, 2], [0, 4]], cost)
    >>> y.tolist(), improved, m
    ([[7, 3], [0, 4]], True, 7.0)
    """
    x = np.asarray(shares, dtype=np.int64)

    y, _, _ = token_lp_reference(counts, x > 0)
    m0, m1 = _reference_makespan(x, cost), _reference_makespan(y, cost)
    if m1 < m0:
        return y, True, m1
    return x.copy(), False, m0


@njit(**NJIT)
def support_contract_kernel(counts, shares, cost, lp):
    """Drop active replicas of split experts while the token LP on what is left is better.

    Each round tries every active replica of an expert active on two or more GPUs (experts
    increasing, then GPUs increasing): the replica leaves the support and the token LP
    restricted to the rest gives that support's integral token-optimal dispatch, scored
    under ``cost`` (``CostModel.as_array()``). The round's best strictly lower makespan
    (first found on ties) is applied; rounds repeat until none is lower. One fewer
    activation on a GPU lowers its floor ``a + b*G``; the LP puts the tokens the replica
    held back through the remaining support. It is the un-split that a move of the local
    search cannot price, since the rebalance it needs runs through every split at once.

    Parameters
    ----------
    lp : tuple
        :func:`token_lp_handle`: the compiled token LP, called by address; ignored in Python.

    Returns
    -------
    shares : ndarray of int64, shape (n_experts, n_gpus)
        The contracted dispatch (a copy of ``shares`` when no round applied).
    makespan : float
        Of the returned dispatch.
    rounds : int
        Replicas dropped.
    """
    E, g = shares.shape
    x = shares.copy()
    m = _makespan(x, cost)
    rounds = 0
    while True:
        sup = _support(x)
        best_m = m
        best_y = x
        for e in range(E):
            k = 0
            for h in range(g):
                if sup[e, h]:
                    k += 1
            if k < 2:
                continue
            for h in range(g):
                if not sup[e, h]:
                    continue
                sup[e, h] = False
                y, _, _ = call_compiled(lp, token_lp_kernel, (readonly(counts), readonly(sup)))
                sup[e, h] = True
                my = _makespan(y, cost)
                if my < best_m:
                    best_m = my
                    best_y = y
        if best_m < m:
            x = best_y
            m = best_m
            rounds += 1
        else:
            return x, m, rounds


def support_contract_reference(counts, shares, cost):
    """Plain-Python reference of :func:`support_contract_kernel`.

    Examples
    --------
    Floor-bound (``b = 10``): expert 0 split over both GPUs costs GPU 1 a second activation;
    dropping that replica puts expert 0 whole on GPU 0.

    >>> cost = [0.0, 10.0, 0.0, 0.0, 0.01, 0.0, 0.0, 128.0]
    >>> y, m, rounds = support_contract_reference([6, 6], [[3, 3], [0, 6]], cost)
    >>> y.tolist(), m, rounds
    ([[6, 0], [0, 6]], 10.0, 1)
    """

    x = np.asarray(shares, dtype=np.int64).copy()
    E, g = x.shape
    m = _reference_makespan(x, cost)
    rounds = 0
    while True:
        best = None
        for e in range(E):
            on = [h for h in range(g) if x[e, h] > 0]
            if len(on) < 2:
                continue
            for h in on:
                sup = x > 0
                sup[e, h] = False
                y, _, _ = token_lp_reference(counts, sup)
                my = _reference_makespan(y, cost)
                if my < (m if best is None else best[0]):
                    best = (my, y)
        if best is None:
            return x, m, rounds
        m, x = best
        rounds += 1


@njit(**NJIT)
def _gpu_times(x, cost, out):
    """Modeled time of each GPU of a whole-token dispatch, into ``out``."""
    tile = np.int64(cost[7])
    for h in range(x.shape[1]):
        out[h] = _gpu_time(x, cost, h, tile)


@njit(**NJIT)
def support_swap_kernel(counts, replicas, shares, cost, max_rounds, lp):
    """Swap an activation on a GPU below the makespan, the token LP re-routing the tokens.

    A round tries, on every GPU ``h`` whose time is below the makespan (increasing), every
    whole move of an active share ``f`` of ``h`` to another replica ``h2`` of ``f``
    (``f``, then ``h2`` increasing) together with a new replica on ``h`` of a live expert
    ``e != f`` that ``h`` holds but does not use (``e`` increasing): ``h`` keeps its
    activation count, ``f``'s tokens leave it, and the token LP on the new support (its
    integral token-optimal dispatch) routes ``e``'s tokens into it through every split.
    The round's best strictly lower makespan (first found on ties) is applied; at most
    ``max_rounds`` rounds.

    Parameters
    ----------
    lp : tuple
        :func:`token_lp_handle`: the compiled token LP, called by address; ignored in Python.

    Returns
    -------
    shares : ndarray of int64, shape (n_experts, n_gpus)
        The swapped dispatch (a copy of ``shares`` when no round applied).
    makespan : float
        Of the returned dispatch.
    rounds : int
        Swaps applied.
    """
    E, g = shares.shape
    x = shares.copy()
    m = _makespan(x, cost)
    times = np.empty(g)
    rounds = 0
    while rounds < max_rounds:
        sup = _support(x)
        _gpu_times(x, cost, times)
        best_m = m
        best_y = x
        for h in range(g):
            if times[h] >= m:
                continue
            for f in range(E):
                if not sup[f, h]:
                    continue
                for h2 in range(g):
                    if h2 == h or not replicas[f, h2]:
                        continue
                    had = sup[f, h2]
                    sup[f, h] = False
                    sup[f, h2] = True
                    for e in range(E):
                        if e == f or sup[e, h] or not replicas[e, h] or counts[e] == 0:
                            continue
                        sup[e, h] = True
                        y, _, _ = call_compiled(
                            lp, token_lp_kernel, (readonly(counts), readonly(sup))
                        )
                        sup[e, h] = False
                        my = _makespan(y, cost)
                        if my < best_m:
                            best_m = my
                            best_y = y
                    sup[f, h2] = had
                    sup[f, h] = True
        if best_m < m:
            x = best_y
            m = best_m
            rounds += 1
        else:
            break
    return x, m, rounds


def support_swap_reference(counts, replicas, shares, cost, max_rounds):
    """Plain-Python reference of :func:`support_swap_kernel`.

    Examples
    --------
    Floor and tokens (``b = 10, beta = 0.1``): GPU 1 holds expert 1 whole and could hold
    expert 0, split on GPU 0 alone; moving expert 2 off GPU 1 and splitting expert 0 onto
    it balances the tokens without a third activation anywhere.

    >>> cost = [0.0, 10.0, 0.0, 0.0, 0.1, 0.0, 0.0, 128.0]
    >>> R = [[1, 1], [0, 1], [1, 1]]
    >>> y, m, rounds = support_swap_reference([400, 100, 20], R, [[400, 0], [0, 100], [0, 20]],
    ...                                       cost, 4)
    >>> y.tolist(), round(m, 6), rounds
    ([[240, 160], [0, 100], [20, 0]], 26.0, 1)
    """
    R = np.asarray(replicas, dtype=bool)
    x = np.asarray(shares, dtype=np.int64).copy()
    E, g = x.shape
    m = _reference_makespan(x, cost)
    rounds = 0
    while rounds < max_rounds:
        best = None
        for h in range(g):
            if _reference_gpu_time(x[:, h], cost) >= m:
                continue
            for f in range(E):
                if x[f, h] == 0:
                    continue
                for h2 in range(g):
                    if h2 == h or not R[f, h2]:
                        continue
                    for e in range(E):
                        if e == f or x[e, h] > 0 or not R[e, h] or counts[e] == 0:
                            continue
                        sup = x > 0
                        sup[f, h], sup[f, h2], sup[e, h] = False, True, True
                        y, _, _ = token_lp_reference(counts, sup)
                        my = _reference_makespan(y, cost)
                        if my < (m if best is None else best[0]):
                            best = (my, y)
        if best is None:
            break
        m, x = best
        rounds += 1
    return x, m, rounds


# --------------------------------------------------------------------------------------
# Fractional shares: the exact token LP, on the whole mask or on a dispatch's support
# --------------------------------------------------------------------------------------


@njit(**NJIT)
def _makespan_float(x, cost, g_ptr, g_exps):
    """Modeled makespan of a float dispatch that is zero off the replica lists ``g_ptr,
    g_exps``, as the evaluator computes it
    (:func:`~straggler.formulations.dispatch.evaluate_arrays`: tokens summed in expert order,
    ``max(1, ceil((x - TILE_SLACK) / tile))`` tiles per active share; the zeros it also adds
    change no sum)."""
    g = g_ptr.shape[0] - 1
    tile = cost[7]
    m = -np.inf
    for h in range(g):
        G = 0
        T = 0
        N = 0.0
        for i in range(g_ptr[h], g_ptr[h + 1]):
            v = x[g_exps[i], h]
            if v > 0.0:
                N += v
                G += 1
                k = math.ceil((v - TILE_SLACK) / tile)
                T += k if k > 1 else 1
        t = cost[0] + cost[1] * G + cost[2] * (T - G)
        u = cost[3] + cost[4] * N
        if u > t:
            t = u
        u = cost[5] + cost[6] * N
        if u > t:
            t = u
        if t > m:
            m = t
    return m


@njit(**NJIT)
def _exact_shares(counts, replicas, x, num, den):
    """Shares ``(n_experts, n_gpus)`` float64 with ``max_g N_g = num / den`` (the exact
    ``lambda*``), from the integral optimum ``x`` of :func:`token_lp_kernel`: ``x * den``
    pushed to the cap ``num`` (feasible, as ``lambda* = num / den``, and integral), divided
    by ``den``; and the replica lists (the shares are zero off them)."""
    E, g = replicas.shape
    e_ptr, e_gpus, g_ptr, g_exps = replica_lists(replicas)
    out = np.zeros((E, g))
    if den == 1:  # lambda* is an integer: x already meets it
        for e in range(E):
            for j in range(e_ptr[e], e_ptr[e + 1]):
                h = e_gpus[j]
                out[e, h] = x[e, h]
        return out, g_ptr, g_exps
    xs = np.zeros((E, g), np.int64)
    load = np.zeros(g, np.int64)
    for e in range(E):
        for j in range(e_ptr[e], e_ptr[e + 1]):
            h = e_gpus[j]
            xs[e, h] = x[e, h] * den
            load[h] += xs[e, h]
    _push(xs, load, np.int64(num), e_ptr, e_gpus, g_ptr, g_exps)
    for e in range(E):
        for j in range(e_ptr[e], e_ptr[e + 1]):
            h = e_gpus[j]
            out[e, h] = xs[e, h] / den
    return out, g_ptr, g_exps


@njit(**NJIT)
def exact_token_lp_kernel(counts, replicas, x, num, den, cost):
    """The exact (fractional) token-LP dispatch and its makespan under ``cost``.

    Parameters
    ----------
    counts : ndarray of int64, shape (n_experts,)
    replicas : ndarray of bool, shape (n_experts, n_gpus)
    x, num, den
        :func:`token_lp_kernel`'s integral dispatch and ``lambda* = num / den`` on them.
    cost : ndarray of float64
        ``CostModel.as_array()``.

    Returns
    -------
    shares : ndarray of float64, shape (n_experts, n_gpus)
        Every expert's tokens, ``max_g N_g = lambda*`` (an optimum of the token LP).
    makespan : float
    """
    xf, g_ptr, g_exps = _exact_shares(counts, replicas, x, num, den)
    return xf, _makespan_float(xf, cost, g_ptr, g_exps)


def _reference_makespan_float(z, cost) -> float:
    """Plain-Python twin of :func:`_makespan_float`."""
    tile = float(cost[7])
    m = -math.inf
    for h in range(len(z[0])):
        col = [float(z[e][h]) for e in range(len(z))]
        N = 0.0
        for v in col:
            N += v
        live = [v for v in col if v > 0]
        G = len(live)
        T = sum(max(1, math.ceil((v - TILE_SLACK) / tile)) for v in live)
        m = max(m, _reference_time(G, N, T, cost))
    return m


def _exact_shares_reference(counts, replicas, x, num, den):
    """Plain-Python twin of :func:`_exact_shares`."""
    R = [[bool(r) for r in row] for row in replicas]
    x = [[int(v) for v in row] for row in x]
    if den == 1:
        return np.array(x, dtype=np.float64).reshape(len(R), len(R[0]))
    xs = [[v * den for v in row] for row in x]
    load = [sum(xs[e][h] for e in range(len(R))) for h in range(len(R[0]))]
    _push_reference(xs, load, num, R)
    return np.array([[v / den for v in row] for row in xs], dtype=np.float64)


def exact_token_lp_reference(counts, replicas, x, num, den, cost):
    """Plain-Python reference of :func:`exact_token_lp_kernel`.

    Examples
    --------
    Expert 0 (7 tokens) on GPUs 0 and 1, expert 1 (2 tokens) only on GPU 1: ``lambda* =
    9/2``, each GPU carries 4.5 tokens:

    >>> xf, m = exact_token_lp_reference([7, 2], [[1, 1], [0, 1]], [[5, 2], [0, 2]], 9, 2,
    ...                                  [0, 0, 0, 0, 1, 0, 0, 128])
    >>> xf.tolist(), m
    ([[4.5, 2.5], [0.0, 2.0]], 4.5)
    """
    xf = _exact_shares_reference(counts, replicas, x, num, den)
    return xf, _reference_makespan_float(xf, cost)


@njit(**NJIT)
def support_fractional_kernel(counts, shares, cost, lp):
    """The exact (fractional) token LP on the support of ``shares``, kept iff its makespan is
    lower: :func:`support_rebalance_kernel` without rounding ``lambda*`` up to whole tokens.

    Parameters
    ----------
    shares : ndarray of int64, shape (n_experts, n_gpus)
        A whole-token dispatch.
    lp : tuple
        :func:`token_lp_handle`; ignored in Python.

    Returns
    -------
    shares : ndarray of float64, shape (n_experts, n_gpus)
        The fractional dispatch if strictly better, else ``shares`` as floats.
    improved : bool
    makespan : float
        Of the returned dispatch.
    """
    sup = _support(shares)
    y, num, den = call_compiled(lp, token_lp_kernel, (readonly(counts), readonly(sup)))
    xf, g_ptr, g_exps = _exact_shares(counts, sup, y, num, den)
    m0 = _makespan(shares, cost)
    m1 = _makespan_float(xf, cost, g_ptr, g_exps)
    if m1 < m0:
        return xf, True, m1
    E, g = shares.shape
    out = np.empty((E, g))
    for e in range(E):
        for h in range(g):
            out[e, h] = shares[e, h]
    return out, False, m0


def support_fractional_reference(counts, shares, cost):
    """Plain-Python reference of :func:`support_fractional_kernel`.

    Examples
    --------
    Expert 0 (9 tokens) on GPUs 0 and 1, expert 1 (2 tokens) on GPU 1, whole tokens 6/5;
    tokens only: the support allows 5.5 each.

    >>> cost = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 128.0]
    >>> y, improved, m = support_fractional_reference([9, 2], [[6, 3], [0, 2]], cost)
    >>> y.tolist(), improved, m
    ([[5.5, 3.5], [0.0, 2.0]], True, 5.5)
    """
    x = np.asarray(shares, dtype=np.int64)
    y, num, den = token_lp_reference(counts, x > 0)
    xf = _exact_shares_reference(counts, x > 0, y, num, den)
    m0, m1 = _reference_makespan(x, cost), _reference_makespan_float(xf, cost)
    if m1 < m0:
        return xf, True, m1
    return x.astype(np.float64), False, m0


# token_lp_kernel orders the experts with solvers/_order.py, and call_compiled and readonly are
# lowered by solvers/_numba/address.py: an edit there recompiles the functions that use them
cache_depends_on(token_lp_kernel, _order, _csr)
cache_depends_on(exact_token_lp_kernel, _csr)
for _f in (support_rebalance_kernel, support_contract_kernel, support_swap_kernel):
    cache_depends_on(_f, _address)
cache_depends_on(support_fractional_kernel, _address, _csr)
