"""The lock-step decode step loop: a Numba kernel and, below it, a plain-Python reference.

Both take the same arguments and return the same tuple; tests check they agree exactly.

Model (one loop iteration = one decode step of the whole cluster)
-----------------------------------------------------------------
1. Requests whose prefill is done (``ready_t <= clock``) enter the prompt pool, in ready order
   (ties: trace order).
2. If nothing runs and the pool is empty, the clock jumps to the next ready time (no step).
   If nothing runs after a routing tick (nobody could be placed: a prompt above the KV
   capacity), the loop stops (those requests never start).
3. Snapshot: the router's view of step ``k`` is computed (loads ``(G, 1)`` or projected loads
   ``(G, H+1)``) and kept in a ring of ``stale + 1`` snapshots.
4. Routing tick (``k % tick == 0`` and a non-empty pool): the router gets the prefill lengths of
   the oldest ``max_pool`` pool requests, the view of step ``k - stale`` (step 0's for
   ``k < stale``) and the running counts of that step, plus, when ``optimistic``, the prompt
   lengths (and counts) it placed at steps ``k - stale .. k - 1`` added to their replicas (all
   horizon columns); free slots are exact (the engine refuses a full replica anyway). The
   assignment is applied in pool order; a request is admitted when its replica has a free slot
   and ``load + prompt <= kv_cap``, otherwise it stays in the pool. An admitted request takes
   the lowest free slot index of its replica.
5. Step: ``dt = t0 + kappa * max_g L_g`` with the loads at the start of the step; every running
   request gains one token (``L_g += 1`` each); a request whose decoded count reaches its
   output length leaves at ``clock + dt`` (``L_g -= prompt + output``). Records per step:
   start clock, ``dt``, ``max_g L_g``, ``sum_g L_g``, running requests, pool size.

Projection (``pred_kind > 0``, BR-H), as :func:`straggler.solvers.routing.project_loads`:
``L_{g,h} = sum_{i on g} w_ih * (s_i + a_i + h) + (1 - w_ih) * rf``, ``w_ih = clip(c_i - h,
0, 1)``, for prompt ``s_i`` and age ``a_i``; ``rf`` = 0, or with ``refill`` the mean prompt of
the visible pool (its oldest ``max_pool`` requests) at the snapshot; presence ``c_i = H+1`` if
``p_fin < 0.5`` else ``(1 - p_fin)(H+1) + p_fin mu`` (``mu = clip(mu_rem, 1, max(H, 1))``)
and ``(p_fin, mu_rem)`` from

* oracle (1): ``r = output - a``: ``(1{r <= H}, r)`` (``OraclePredictor``);
* survival (2): tables by age ``surv_p[a], surv_mu[a]`` (the last entry for older ages),
  built from ``SurvivalPredictor``;
* exact-match (3): ``m`` = output length of the last request with the same prompt hash that
  *finished* (the memo is updated as requests leave); if ``m > a``: ``(1{m - a <= H}, m - a)``,
  else survival (``ExactMatchPredictor``);
* two-stage (4): the fitted ``TwoStagePredictor`` evaluated per running request from its
  arrays (``TwoStagePredictor.model_arrays``: hinge knots, feature means and scales, classifier
  and regressor weights, isotonic block ends and values), in the order written there, on the
  request's prompt ``s_i`` and age ``a_i``. ``two_stage = (fold, knots, lin, iso, n_blocks)``
  stacks ``K`` fitted models (``knots (K, 2, k)``, ``lin (K, 4, F)``, ``iso (K, 2, B)``,
  ``n_blocks (K,)``) and ``fold[i]`` names request ``i``'s model (cross-fitting: a request is
  never predicted by a model fitted on it). Not a table by age: the output depends on
  ``(s_i, a_i)`` through ``log1p`` features with a product term, and an age table per distinct
  prompt would hold ``#prompts x max(output)`` entries; the direct evaluation is exact and costs
  two ``log1p``, one ``exp`` and ``2F`` multiply-adds per running request and step. With
  ``pred_kind != 4`` the tuple is not read (:func:`no_two_stage` gives a placeholder).

Router signature: ``kernel(prefill, loads, free_slots, n_running, n_waiting, params, seed)``
of :data:`straggler.solvers.routing.ROUTING_KERNELS`. ``n_waiting`` is 0 (a request is only
sent to a replica with a free slot, so engines have no queue of their own); the round-robin
cursor ``params[P_CURSOR]`` is carried from tick to tick (last replica used + 1).
"""

from __future__ import annotations

import bisect
import ctypes
import math

import numpy as np
from numba import njit

from ..solvers._jit import NJIT
from ..solvers._routing_kernels import N_CARRY, PoolState, ReplicaState, route_tick_kernel
from ..solvers.predictors import EXP_CAP

__all__ = [
    "run_engine",
    "run_engine_reference",
    "project_view",
    "two_stage_predict",
    "no_two_stage",
    "NS_CLOCK",
]

# The engine calls a ctypes function (the clock), which numba cannot cache.
_NJIT_ENGINE = dict(NJIT, cache=False)

_libc = ctypes.CDLL(None)
_clock_gettime = _libc.clock_gettime
_clock_gettime.argtypes = [ctypes.c_int, ctypes.c_void_p]
_clock_gettime.restype = ctypes.c_int
_CLOCK_MONOTONIC = 1


def NS_CLOCK() -> int:
    """Monotonic clock in nanoseconds (the one the kernel uses to time the router)."""
    ts = np.zeros(2, dtype=np.int64)
    _clock_gettime(_CLOCK_MONOTONIC, ts.ctypes.data)
    return int(ts[0]) * 1_000_000_000 + int(ts[1])


def no_two_stage():
    """The ``two_stage`` argument of :func:`run_engine` when no two-stage model is used.

    Examples
    --------
    >>> [x.shape for x in no_two_stage()]
    [(0,), (1, 2, 1), (1, 4, 8), (1, 2, 1), (1,)]
    """
    return (
        np.zeros(0, dtype=np.int64),
        np.zeros((1, 2, 1)),
        np.ones((1, 4, 8)),
        np.zeros((1, 2, 1)),
        np.zeros(1, dtype=np.int64),
    )


@njit(**_NJIT_ENGINE)
def two_stage_predict(knots, lin, iso, n_blocks, s, a):
    """``(p_fin, mu_rem)`` of one fitted two-stage model at prompt ``s``, age ``a`` (floats).

    ``knots (2, k)``, ``lin (4, F)``, ``iso (2, B)``, ``n_blocks`` as returned by
    :meth:`~straggler.solvers.predictors.TwoStagePredictor.model_arrays`, evaluated in the order
    written there (``mu_rem`` unclipped; the projection clips it to ``[1, max(H, 1)]`` as
    ``TwoStagePredictor.predict`` does).
    """
    nk = knots.shape[1]
    ls = math.log1p(s)
    la = math.log1p(a)
    z = 0.0
    y = 0.0
    for j in range(6 + 2 * nk):
        if j == 0:
            f = 1.0
        elif j == 1:
            f = ls
        elif j == 2:
            f = la
        elif j == 3:
            f = ls * ls
        elif j == 4:
            f = la * la
        elif j == 5:
            f = ls * la
        elif j < 6 + nk:
            f = max(ls - knots[0, j - 6], 0.0)
        else:
            f = max(la - knots[1, j - 6 - nk], 0.0)
        phi = (f - lin[0, j]) / lin[1, j]
        z += phi * lin[2, j]
        y += phi * lin[3, j]
    t = -z
    p = 0.0 if t > EXP_CAP else 1.0 / (1.0 + math.exp(t))
    nb = n_blocks
    if nb > 0:  # isotonic map: the first block whose end is >= p
        lo = 0
        hi = nb
        while lo < hi:
            mid = (lo + hi) // 2
            if iso[0, mid] < p:
                lo = mid + 1
            else:
                hi = mid
        p = iso[1, min(lo, nb - 1)]
    return p, y


@njit(**_NJIT_ENGINE)
def project_view(
    slot_req,
    decoded,
    prompt,
    output,
    group,
    memo,
    surv_p,
    surv_mu,
    pred_kind,
    H,
    refill,
    two_stage,
):
    """Projected loads ``(G, H+1)`` of the running requests ``slot_req`` (-1 = empty slot).

    Equals :func:`straggler.solvers.routing.project_loads` with the running requests listed
    replica by replica in slot order, and the predictor of ``pred_kind`` (1 oracle, 2 survival
    tables ``surv_p[a], surv_mu[a]`` by age ``a``, the last entry for older ages, 3 exact-match
    on ``memo[group[i]]`` with the survival fallback, 4 the two-stage models ``two_stage =
    (fold, knots, lin, iso, n_blocks)``, model ``fold[i]`` for request ``i``).
    """
    G, n_slots = slot_req.shape
    out = np.zeros((G, H + 1))
    n_surv = surv_p.size
    ts_fold, ts_knots, ts_lin, ts_iso, ts_nb = two_stage
    for g in range(G):
        for s in range(n_slots):
            i = slot_req[g, s]
            if i < 0:
                continue
            a = decoded[i]
            if pred_kind == 1:
                r = output[i] - a
                p = 1.0 if r <= H else 0.0
                mu = float(r)
            elif pred_kind == 4:
                p, mu = two_stage_predict(
                    ts_knots[ts_fold[i]],
                    ts_lin[ts_fold[i]],
                    ts_iso[ts_fold[i]],
                    ts_nb[ts_fold[i]],
                    float(prompt[i]),
                    float(a),
                )
            else:
                m = memo[group[i]] if (pred_kind == 3 and group[i] >= 0) else -1
                if m > a:
                    r = m - a
                    p = 1.0 if r <= H else 0.0
                    mu = float(r)
                else:
                    j = a if a < n_surv else n_surv - 1
                    p = surv_p[j]
                    mu = surv_mu[j]
            # presence with the confidence gate, as presence_from_prediction
            mu = min(max(mu, 1.0), float(max(H, 1)))
            c = float(H + 1) if p < 0.5 else (1.0 - p) * (H + 1) + p * mu
            base = prompt[i] + a
            for h in range(H + 1):
                w = min(max(c - h, 0.0), 1.0)
                if w > 0.0:
                    out[g, h] += w * (base + h)
                if refill > 0.0 and w < 1.0:
                    out[g, h] += (1.0 - w) * refill
    return out


@njit(**_NJIT_ENGINE)
def run_engine(
    policy_id,
    params,
    ready_t,
    prompt,
    output,
    group,
    n_groups,
    n_replicas,
    max_slots,
    kv_cap,
    t0,
    kappa,
    tick,
    stale,
    optimistic,
    max_pool,
    horizon,
    pred_kind,
    surv_p,
    surv_mu,
    seed,
    max_steps,
    time_router,
    refill,
    two_stage,
):
    """Run the step loop; see the module docstring.

    ``ready_t`` must be sorted (the wrapper sorts requests by ready time). ``router(prefill,
    view, free, n_running, seed) -> assignment`` is a jitted function. Returns ``(start_t,
    first_t, finish_t, replica, series (n_steps, 6), tick_ns (n_ticks,), tick_pool
    (n_ticks,))``; series columns: clock, dt, max load, sum load, running, pool.
    """
    n = ready_t.size
    G = n_replicas
    H = horizon
    start_t = np.full(n, np.nan)
    first_t = np.full(n, np.nan)
    finish_t = np.full(n, np.nan)
    replica = np.full(n, -1, dtype=np.int64)
    decoded = np.zeros(n, dtype=np.int64)
    slot_req = np.full((G, max_slots), -1, dtype=np.int64)
    load = np.zeros(G, dtype=np.int64)
    nrun = np.zeros(G, dtype=np.int64)
    memo = np.full(max(n_groups, 1), -1, dtype=np.int64)
    pool = np.empty(n, dtype=np.int64)
    pool_n = 0
    R = stale + 1
    view_ring = np.zeros((R, G, H + 1))
    add_ring = np.zeros((R, G))
    nrun_ring = np.zeros((R, G), dtype=np.int64)
    addn_ring = np.zeros((R, G), dtype=np.int64)
    cap_series = 1024
    series = np.empty((cap_series, 6))
    cap_ticks = 1024
    tick_ns = np.empty(cap_ticks, dtype=np.int64)
    tick_pool = np.empty(cap_ticks, dtype=np.int64)
    n_ticks = 0
    ts = np.zeros(2, dtype=np.int64)
    par = params.copy()
    carry = np.zeros(N_CARRY)
    nwait = np.zeros(G, dtype=np.int64)
    zeros_g = np.zeros(G)
    kvcap_g = np.full(G, float(kv_cap))
    prompt_tok = np.zeros(G)
    pool_entry = np.zeros(n, dtype=np.int64)
    ptok = np.zeros(G)
    clock = 0.0
    k = 0
    nxt = 0
    total_run = 0
    while k < max_steps:
        # 1. prefill done -> pool
        while nxt < n and ready_t[nxt] <= clock:
            pool[pool_n] = nxt
            pool_entry[nxt] = n_ticks
            pool_n += 1
            nxt += 1
        # 2. idle: jump to the next ready time
        if total_run == 0 and pool_n == 0:
            if nxt >= n:
                break
            clock = ready_t[nxt]
            continue
        # 3. snapshot of step k
        slot = k % R
        for g in range(G):
            add_ring[slot, g] = 0.0
            addn_ring[slot, g] = 0
            nrun_ring[slot, g] = nrun[g]
            for h in range(H + 1):
                view_ring[slot, g, h] = 0.0
            view_ring[slot, g, 0] = load[g]
        if pred_kind > 0:
            rf = 0.0
            if refill:
                P = pool_n if pool_n < max_pool else max_pool
                for j in range(P):
                    rf += prompt[pool[j]]
                rf = rf / P if P > 0 else 0.0
            view_ring[slot] = project_view(
                slot_req,
                decoded,
                prompt,
                output,
                group,
                memo,
                surv_p,
                surv_mu,
                pred_kind,
                H,
                rf,
                two_stage,
            )
        # 4. routing tick
        if k % tick == 0 and pool_n > 0:
            P = pool_n if pool_n < max_pool else max_pool
            prefill = np.empty(P)
            wait = np.empty(P, dtype=np.int64)
            key = np.empty(P, dtype=np.int64)
            for j in range(P):
                prefill[j] = prompt[pool[j]]
                wait[j] = n_ticks - pool_entry[pool[j]]
                key[j] = pool[j]
            old = (k - stale) % R if k >= stale else 0
            view = view_ring[old].copy()
            seen_n = nrun_ring[old].copy()
            if optimistic:
                lo = k - stale if k >= stale else 0
                for kk in range(lo, k):
                    for g in range(G):
                        seen_n[g] += addn_ring[kk % R, g]
                        for h in range(H + 1):
                            view[g, h] += add_ring[kk % R, g]
            free = np.empty(G, dtype=np.int64)
            for g in range(G):
                free[g] = max_slots - nrun[g]
            tick_seed = seed * 1_000_003 + k
            if time_router:
                _clock_gettime(1, ts.ctypes.data)
                c0 = ts[0] * 1_000_000_000 + ts[1]
            for g in range(G):
                prompt_tok[g] = ptok[g]
            usage = np.empty(G)
            for g in range(G):
                usage[g] = view[g, 0] / kv_cap
            pstate = PoolState(prefill, wait, key, np.zeros((0, G)))
            rstate = ReplicaState(view, free, seen_n, nwait, prompt_tok, zeros_g, usage, kvcap_g)
            assign, carry = route_tick_kernel(policy_id, pstate, rstate, par, carry, tick_seed)
            if time_router:
                _clock_gettime(1, ts.ctypes.data)
                c1 = ts[0] * 1_000_000_000 + ts[1]
            else:
                c0 = 0
                c1 = 0
            if n_ticks == cap_ticks:
                cap_ticks *= 2
                tn = np.empty(cap_ticks, dtype=np.int64)
                tn[:n_ticks] = tick_ns[:n_ticks]
                tick_ns = tn
                tp = np.empty(cap_ticks, dtype=np.int64)
                tp[:n_ticks] = tick_pool[:n_ticks]
                tick_pool = tp
            tick_ns[n_ticks] = c1 - c0
            tick_pool[n_ticks] = P
            n_ticks += 1
            keep = 0
            for j in range(pool_n):
                i = pool[j]
                g = assign[j] if j < P else -1
                if g >= 0 and nrun[g] < max_slots and load[g] + prompt[i] <= kv_cap:
                    for s in range(max_slots):
                        if slot_req[g, s] < 0:
                            slot_req[g, s] = i
                            break
                    nrun[g] += 1
                    total_run += 1
                    load[g] += prompt[i]
                    ptok[g] += prompt[i]
                    replica[i] = g
                    start_t[i] = clock
                    add_ring[slot, g] += prompt[i]
                    addn_ring[slot, g] += 1
                else:
                    pool[keep] = i
                    keep += 1
            pool_n = keep
            if total_run == 0:
                break  # nothing runs and the router placed nobody: no progress is possible
        # 5. one decode step
        M = 0
        S = 0
        for g in range(G):
            S += load[g]
            if load[g] > M:
                M = load[g]
        dt = t0 + kappa * M
        if k == series.shape[0]:
            grown = np.empty((2 * series.shape[0], 6))
            grown[:k] = series[:k]
            series = grown
        series[k, 0] = clock
        series[k, 1] = dt
        series[k, 2] = M
        series[k, 3] = S
        series[k, 4] = total_run
        series[k, 5] = pool_n
        t_end = clock + dt
        for g in range(G):
            for s in range(max_slots):
                i = slot_req[g, s]
                if i < 0:
                    continue
                decoded[i] += 1
                load[g] += 1
                if decoded[i] == 1:
                    first_t[i] = t_end
                if decoded[i] == output[i]:
                    finish_t[i] = t_end
                    load[g] -= prompt[i] + output[i]
                    ptok[g] -= prompt[i]
                    slot_req[g, s] = -1
                    nrun[g] -= 1
                    total_run -= 1
                    if group[i] >= 0:
                        memo[group[i]] = output[i]
        clock = t_end
        k += 1
    return (
        start_t,
        first_t,
        finish_t,
        replica,
        series[:k].copy(),
        tick_ns[:n_ticks].copy(),
        tick_pool[:n_ticks].copy(),
    )


def run_engine_reference(
    router,
    params,
    ready_t,
    prompt,
    output,
    group,
    n_groups,
    n_replicas,
    max_slots,
    kv_cap,
    t0,
    kappa,
    tick,
    stale,
    optimistic,
    max_pool,
    horizon,
    pred_kind,
    surv_p,
    surv_mu,
    seed,
    max_steps,
    time_router,
    refill,
    two_stage,
):
    """Plain-Python step loop written from the model in the module docstring.

    Running requests are kept per replica in a slot list; the router's view is rebuilt from
    them each step. ``time_router`` is accepted for signature parity (tick times are 0).
    """
    n = len(ready_t)
    G, H = n_replicas, horizon
    start_t = [float("nan")] * n
    first_t = [float("nan")] * n
    finish_t = [float("nan")] * n
    replica = [-1] * n
    decoded = [0] * n
    slots = [[None] * max_slots for _ in range(G)]
    memo: dict[int, int] = {}
    pool: list[int] = []
    views: dict[int, list[list[float]]] = {}
    placed_at: dict[int, list[float]] = {}
    placed_n: dict[int, list[int]] = {}
    series, tick_pool = [], []
    clock, k, nxt = 0.0, 0, 0
    par = np.array(params, dtype=np.float64)
    carry = np.zeros(N_CARRY)
    entered: dict[int, int] = {}
    n_ticks = 0
    ts_fold, ts_knots, ts_lin, ts_iso, ts_nb = two_stage

    def two_stage_predict(i, a):
        """``(p_fin, mu_rem)`` of model ``ts_fold[i]`` at prompt ``prompt[i]``, age ``a``."""
        m = int(ts_fold[i])
        ls, la = math.log1p(float(prompt[i])), math.log1p(float(a))
        feats = [1.0, ls, la, ls * ls, la * la, ls * la]
        feats += [max(ls - float(k), 0.0) for k in ts_knots[m][0]]
        feats += [max(la - float(k), 0.0) for k in ts_knots[m][1]]
        mean, std, w, v = (row.tolist() for row in ts_lin[m])
        z = y = 0.0
        for f, mj, sj, wj, vj in zip(feats, mean, std, w, v):
            phi = (f - mj) / sj
            z = z + phi * wj
            y = y + phi * vj
        p = 0.0 if -z > EXP_CAP else 1.0 / (1.0 + math.exp(-z))
        nb = int(ts_nb[m])
        if nb > 0:
            ends = ts_iso[m][0][:nb].tolist()
            p = float(ts_iso[m][1][min(bisect.bisect_left(ends, p), nb - 1)])
        return p, y

    def loads():
        return [sum(prompt[i] + decoded[i] for i in slots[g] if i is not None) for g in range(G)]

    def running(g):
        return sum(1 for i in slots[g] if i is not None)

    while k < max_steps:
        while nxt < n and ready_t[nxt] <= clock:
            pool.append(nxt)
            entered[nxt] = n_ticks
            nxt += 1
        if sum(running(g) for g in range(G)) == 0 and not pool:
            if nxt >= n:
                break
            clock = float(ready_t[nxt])
            continue
        # the view of step k: exact loads, then the projected horizon columns
        L = loads()
        view = [[float(L[g])] + [0.0] * H for g in range(G)]
        if pred_kind > 0:
            view = [[0.0] * (H + 1) for g in range(G)]
            visible = [float(prompt[i]) for i in pool[:max_pool]] if refill else []
            rf = sum(visible) / len(visible) if visible else 0.0
            for g in range(G):
                for i in slots[g]:
                    if i is None:
                        continue
                    a = decoded[i]
                    m = memo.get(int(group[i]), -1) if (pred_kind == 3 and group[i] >= 0) else -1
                    if pred_kind == 4:
                        p, mu = two_stage_predict(i, a)
                    elif pred_kind == 1 or m > a:
                        r = (output[i] if pred_kind == 1 else m) - a
                        p, mu = (1.0 if r <= H else 0.0), float(r)
                    else:
                        j = min(a, len(surv_p) - 1)
                        p, mu = float(surv_p[j]), float(surv_mu[j])
                    mu = min(max(mu, 1.0), float(max(H, 1)))
                    c = float(H + 1) if p < 0.5 else (1.0 - p) * (H + 1) + p * mu
                    for h in range(H + 1):
                        w = min(max(c - h, 0.0), 1.0)
                        if w > 0.0:
                            view[g][h] += w * (prompt[i] + a + h)
                        if rf > 0.0 and w < 1.0:
                            view[g][h] += (1.0 - w) * rf
        views[k] = (view, [running(g) for g in range(G)])
        views.pop(k - stale - 1, None)
        placed_at[k] = [0.0] * G
        placed_n[k] = [0] * G
        placed_at.pop(k - stale - 1, None)
        placed_n.pop(k - stale - 1, None)
        if k % tick == 0 and pool:
            P = min(len(pool), max_pool)
            prefill = np.array([float(prompt[i]) for i in pool[:P]])
            old_view, old_n = views[max(k - stale, 0)]
            seen = [row[:] for row in old_view]
            seen_n = list(old_n)
            if optimistic:
                for kk in range(max(k - stale, 0), k):
                    for g in range(G):
                        seen_n[g] += placed_n[kk][g]
                        for h in range(H + 1):
                            seen[g][h] += placed_at[kk][g]
            free = np.array([max_slots - running(g) for g in range(G)], dtype=np.int64)
            nrun = np.array(seen_n, dtype=np.int64)
            pstate = PoolState(
                prefill,
                np.array([n_ticks - entered[i] for i in pool[:P]], dtype=np.int64),
                np.array(pool[:P], dtype=np.int64),
                np.zeros((0, G)),
            )
            rstate = ReplicaState(
                np.array(seen),
                free,
                nrun,
                np.zeros(G, dtype=np.int64),
                np.array(
                    [float(sum(prompt[i] for i in slots[g] if i is not None)) for g in range(G)]
                ),
                np.zeros(G),
                np.array([float(seen[g][0]) / kv_cap for g in range(G)]),
                np.full(G, float(kv_cap)),
            )
            assign, carry = router(pstate, rstate, par.copy(), carry, seed * 1_000_003 + k)
            n_ticks += 1
            tick_pool.append(P)
            still = []
            for j, i in enumerate(pool):
                g = int(assign[j]) if j < P else -1
                Lg = sum(prompt[q] + decoded[q] for q in slots[g] if q is not None) if g >= 0 else 0
                if g >= 0 and running(g) < max_slots and Lg + prompt[i] <= kv_cap:
                    slots[g][slots[g].index(None)] = i
                    replica[i] = g
                    start_t[i] = clock
                    placed_at[k][g] += prompt[i]
                    placed_n[k][g] += 1
                else:
                    still.append(i)
            pool = still
            if sum(running(g) for g in range(G)) == 0:
                break  # deadlock: nothing runs and nobody was placed
        L = loads()
        M, S = max(L), sum(L)
        dt = t0 + kappa * M
        series.append([clock, dt, M, S, sum(running(g) for g in range(G)), len(pool)])
        t_end = clock + dt
        for g in range(G):
            for s, i in enumerate(slots[g]):
                if i is None:
                    continue
                decoded[i] += 1
                if decoded[i] == 1:
                    first_t[i] = t_end
                if decoded[i] == output[i]:
                    finish_t[i] = t_end
                    slots[g][s] = None
                    if group[i] >= 0:
                        memo[int(group[i])] = int(output[i])
        clock = t_end
        k += 1
    return (
        np.array(start_t),
        np.array(first_t),
        np.array(finish_t),
        np.array(replica, dtype=np.int64),
        np.array(series, dtype=float).reshape(-1, 6),
        np.zeros(len(tick_pool), dtype=np.int64),
        np.array(tick_pool, dtype=np.int64),
    )
