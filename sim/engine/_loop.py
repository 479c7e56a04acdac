"""The lock-step decode step loop: a Numba kernel and a plain-Python reference, phase by phase.

Both take one :class:`EngineInputs` (a NamedTuple of named arrays and scalars) and return one
:class:`EngineOutput`; tests check they agree exactly. :func:`run_engine` is one loop over
phase functions over :class:`EngineState`, which holds everything the loop changes (the pattern
of :mod:`straggler.solvers.dispatch._tempo`); each phase is handed the state's arrays it uses
and the scalars of :class:`_Cfg`, never the records themselves. Each phase (and each helper
that holds a rule of the model: :func:`_to_prefill`, :func:`_fits`, :func:`_admit`,
:func:`_router_view`, the prefix caches, :func:`two_stage_predict`) has its plain-Python twin
directly below it, named ``<phase>_reference``, written from the model on a
:class:`_ReferenceState` of lists (loads recomputed from the slots at every read, the prefill
queue a list, the caches ``OrderedDict`` s); :func:`run_engine_reference`, below
:func:`run_engine`, calls the twins in the loop's order. An edit to a phase has one twin to
edit beside it. The routing policy's kernel is an argument of the loop (the address of its
compiled code, called through :func:`~straggler.solvers.routing._core.call_policy`;
:func:`engine_entry`), so the loop compiles once for every policy. One iteration is one decode
step of the whole cluster:

1. :func:`_arrivals`: arrivals (``arrival_t <= clock``) join the prefill queue; ``prefill_
   instances`` instances serve it first come, first served (``0``: unlimited), a prefill
   taking ``prefill_base_s + prefill_per_token_s * tokens``.
2. :func:`_prefill_to_pool`: done prefills enter the pool, kept in order of age (a recomputed
   request returns to its place by first entry, as vLLM puts a preempted request back at the
   front of its waiting queue).
3. With nothing running or waiting the clock jumps to the next event.
4. :func:`_preempt`: while a replica's next step would overflow its KV capacity (``L_g +
   running_g > kv_cap``), its most recently admitted request goes back through prefill with
   ``prompt + decoded`` tokens (vLLM's recompute preemption).
5. :func:`_snapshot`: the router's view of this step into a ring of ``stale + 1`` views.
6. A routing tick (``k % tick == 0``, non-empty pool): the policy's kernel routes the oldest
   ``max_pool`` requests (:func:`_tick_state`) on the view of step ``k - stale`` (plus, when
   optimistic, what it sent since); :func:`_apply_tick`: pool mode admits in pool order what
   fits (:func:`_fits`: a free slot and ``L_g + tokens + running_g + 1 <= kv_cap``), queue
   mode appends to each replica's FIFO queue; :func:`_admit_queues` (queue mode) admits from
   each queue's head while it fits. Both admit through :func:`_admit` (lowest free slot);
   with prefix caches, :func:`_cache_admissions` then reads and fills (LRU) each admitted
   request's cache, in admission order.
7. :func:`step_time`: ``dt = t0 + kappa * max_g L_g`` (with ``ctx_cost``: ``t0 + max_g (kappa
   * L_g + ctx_cost * C_g)``); the one place a step is priced. An idle step costs ``t0`` (or,
   with ``t0 = 0``, jumps to the next event).
8. :func:`_record` (one row of :data:`SERIES`), :func:`_decode` (every running request gains a
   token; one reaching its output length leaves at ``clock + dt``).

Projection (``pred_kind > 0``, BR-H), as :func:`straggler.solvers.routing.route.project_loads`:
``L_{g,h} = sum_{i on g} w_ih * (s_i + a_i + h) + (1 - w_ih) * rf``, ``w_ih = clip(c_i - h,
0, 1)``, for prompt ``s_i`` and age ``a_i`` (tokens decoded so far); ``rf`` = 0, or with
``refill`` the mean prompt of the visible pool (its oldest ``max_pool`` requests) at the
snapshot; presence ``c_i = H+1`` if ``p_fin < 0.5`` else ``(1 - p_fin)(H+1) + p_fin mu``
(``mu = clip(mu_rem, 1, max(H, 1))``) and ``(p_fin, mu_rem)`` from the
:class:`~straggler.solvers.routing.predictors.PredictorKind`:

* ORACLE: ``r = output - a``: ``(1{r <= H}, r)`` (``OraclePredictor``);
* SURVIVAL: tables by age ``surv_p[a], surv_mu[a]`` (the last entry for older ages), built
  from ``SurvivalPredictor``;
* EXACT_MATCH: ``m`` = output length of the last request with the same prompt hash that
  *finished* (the memo is updated as requests leave); if ``m > a``: ``(1{m - a <= H}, m - a)``,
  else survival (``ExactMatchPredictor``);
* TWO_STAGE: the fitted ``TwoStagePredictor`` evaluated per running request from its arrays
  (``TwoStagePredictor.model_arrays``), in the order written there, on the request's prompt
  ``s_i`` and age ``a_i``; ``ts_fold[i]`` names request ``i``'s model among the stacked
  ``ts_knots (K, 2, k)``, ``ts_lin (K, 4, F)``, ``ts_iso (K, 2, B)``, ``ts_nb (K,)``
  (cross-fitting: a request is never predicted by a model fitted on it). Not a table by age:
  the output depends on ``(s_i, a_i)`` through ``log1p`` features with a product term; the
  direct evaluation is exact and costs two ``log1p``, one ``exp`` and ``2F`` multiply-adds per
  running request and step. With another predictor the arrays are not read
  (:func:`no_two_stage` gives placeholders).
"""

from __future__ import annotations

import bisect
import collections
import math
from typing import NamedTuple

import numpy as np
from numba import njit, objmode, typeof, types

from ...solvers._numba.clock import monotonic_ns
from ...solvers._numba.jit import (
    NJIT,
    NJIT_BORROW,
    NJIT_BORROW_ENTRY,
    NJIT_BORROW_INLINE,
    NJIT_INLINE,
    NJIT_JITTED,
    NJIT_OBJMODE,
)
from ...solvers.routing import predictors
from ...solvers.routing._core import (
    PoolState,
    ReplicaState,
    RouterOptions,
    call_policy,
    policy_address,
)
from ...solvers.routing.predictors import EXP_CAP
from .deployment import engine_moe_seconds

__all__ = [
    "EngineInputs",
    "EngineOutput",
    "EngineState",
    "step_time",
    "SERIES",
    "run_engine",
    "engine_entry",
    "engine_depends",
    "tick_signature",
    "run_engine_reference",
    "project_view",
    "two_stage_predict",
    "two_stage_predict_reference",
    "no_two_stage",
]

#: Columns of ``EngineOutput.series``, one row per step.
SERIES = (
    "time_s",
    "step_s",
    "max_load",
    "sum_load",
    "running",
    "pool",
    "prefill",
    "preempted",
    "ctx_tokens",
    "token_balance",
)

#: Predictor kinds, as the engine compares them (``PredictorKind`` values).
_ORACLE = int(predictors.PredictorKind.ORACLE)
_EXACT_MATCH = int(predictors.PredictorKind.EXACT_MATCH)
_TWO_STAGE = int(predictors.PredictorKind.TWO_STAGE)

# The option sets of the loop's functions come from solvers/_numba/jit.py: a function only
# jitted code calls has no CPython entry point (NJIT_JITTED; Python runs its py_func), and
# step_time, public, and _slot/_unslot, which a test calls, keep theirs; the per-step phases
# borrow the loop's arrays without counting references (NJIT_BORROW).


class EngineInputs(NamedTuple):
    """Everything the step loop reads (arrays are C-contiguous; requests in arrival order).

    ``arrival_t`` float64 sorted, ``prompt``/``output`` int64, ``group`` int64 (prompt-hash
    group, -1 none) of the ``n`` requests; ``options``/``carry``: the policy's (registry);
    ``pred_kind``: a :class:`~straggler.solvers.routing.predictors.PredictorKind` value; ``ts_*``:
    the
    two-stage models (see the module docstring); ``queue_mode``: route on arrival to the
    engines' own queues; ``room`` int64: each request's bootstrap room (the pool key);
    ``use_cache``: track the replicas' prefix caches (``blk_off`` ``(n+1,)`` and ``blk_ids``
    (dense ids ``>= 0``): each request's prompt blocks of ``blk_tokens`` tokens;
    ``cache_blocks``: each replica's capacity in blocks; ``cache_slots``: the size of their
    block table, see :func:`_table_size`); ``cache_router``: show them to the
    router (``PoolState.cached``); ``ctx_cost``: seconds per token of a context phase run
    inside the step of the replica that admits the request (0: prefill elsewhere).

    The deployment step (``deploy``, :mod:`straggler.sim.engine.deployment`): ``t0``, ``kappa`` and
    ``att_c`` are one layer's attention time per rank (seconds: fixed, per KV token, per
    running request), ``n_layers`` the layers, ``fixed_s`` the load-independent rest of a
    step (dense FFN layers, shared experts), ``moe_key`` the registered
    :class:`~straggler.sim.engine.deployment.StepModel` that prices the MoE layers (-1: none)."""

    options: RouterOptions
    carry: np.ndarray
    arrival_t: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    group: np.ndarray
    n_groups: int
    n_replicas: int
    max_slots: int
    kv_cap: int
    t0: float
    kappa: float
    prefill_instances: int
    prefill_base_s: float
    prefill_per_token_s: float
    tick: int
    stale: int
    optimistic: bool
    max_pool: int
    horizon: int
    pred_kind: int
    surv_p: np.ndarray
    surv_mu: np.ndarray
    refill: bool
    ts_fold: np.ndarray
    ts_knots: np.ndarray
    ts_lin: np.ndarray
    ts_iso: np.ndarray
    ts_nb: np.ndarray
    seed: int
    max_steps: int
    time_router: bool
    queue_mode: bool
    room: np.ndarray
    use_cache: bool
    cache_router: bool
    blk_off: np.ndarray
    blk_ids: np.ndarray
    blk_tokens: int
    cache_blocks: int
    cache_slots: int
    ctx_cost: float
    deploy: bool = False
    n_layers: int = 1
    att_c: float = 0.0
    fixed_s: float = 0.0
    moe_key: int = -1


class EngineOutput(NamedTuple):
    """What the step loop returns: per request (arrival order) ``ready_t`` (first time in the
    pool), ``start_t`` (first admission), ``first_t`` (first token), ``finish_t`` (NaN:
    unfinished), ``replica`` (last replica, -1 never admitted), ``n_preempt``, ``pool_wait``
    (seconds in the pool, every visit, until the end for one still there), ``enter_tick`` (ticks
    before its first entry into the pool: ``wait = ticks so far - enter_tick``; -1 never),
    ``admit_tick`` (the tick of its first admission, -1 never); ``series`` (n_steps,
    len(SERIES)); per tick ``tick_ns`` (router time, 0 without ``time_router``) and
    ``tick_pool`` (visible pool size); per request ``cache_hit`` (prompt tokens found in its
    replica's prefix cache at its first admission; 0 without prefix caches)."""

    ready_t: np.ndarray
    start_t: np.ndarray
    first_t: np.ndarray
    finish_t: np.ndarray
    replica: np.ndarray
    n_preempt: np.ndarray
    pool_wait: np.ndarray
    enter_tick: np.ndarray
    admit_tick: np.ndarray
    series: np.ndarray
    tick_ns: np.ndarray
    tick_pool: np.ndarray
    cache_hit: np.ndarray


def no_two_stage():
    """The two-stage model arrays ``(fold, knots, lin, iso, n_blocks)`` of
    :class:`EngineInputs` when no two-stage model is used.

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


@njit(**NJIT)
def two_stage_predict(knots, lin, iso, n_blocks, s, a):
    """``(p_fin, mu_rem)`` of one fitted two-stage model at prompt ``s``, age ``a`` (floats).

    ``knots (2, k)``, ``lin (4, F)``, ``iso (2, B)``, ``n_blocks`` as returned by
    :meth:`~straggler.solvers.routing.predictors.TwoStagePredictor.model_arrays`, evaluated in the
    order
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


def two_stage_predict_reference(knots, lin, iso, n_blocks, s, a):
    """Plain-Python reference of :func:`two_stage_predict`: the features listed, then the
    logistic and linear heads, then the isotonic map by bisection."""
    ls, la = math.log1p(float(s)), math.log1p(float(a))
    feats = [1.0, ls, la, ls * ls, la * la, ls * la]
    feats += [max(ls - float(q), 0.0) for q in knots[0]]
    feats += [max(la - float(q), 0.0) for q in knots[1]]
    mean, std, w, v = (row.tolist() for row in lin)
    z = y = 0.0
    for f, mj, sj, wj, vj in zip(feats, mean, std, w, v):
        phi = (f - mj) / sj
        z = z + phi * wj
        y = y + phi * vj
    p = 0.0 if -z > EXP_CAP else 1.0 / (1.0 + math.exp(-z))
    nb = int(n_blocks)
    if nb > 0:
        ends = iso[0][:nb].tolist()
        p = float(iso[1][min(bisect.bisect_left(ends, p), nb - 1)])
    return p, y


@njit(**NJIT)
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

    Equals :func:`straggler.solvers.routing.route.project_loads` with the running requests listed
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


@njit(**NJIT_BORROW_INLINE)
def _heap_push(ht, hs, hi, size, t, s, i):
    """Push ``(t, s) -> i`` on the binary min-heap ``ht/hs/hi[:size]`` keyed by ``(t, s)``."""
    p = size
    while p > 0:
        q = (p - 1) >> 1
        if ht[q] < t or (ht[q] == t and hs[q] < s):
            break
        ht[p] = ht[q]
        hs[p] = hs[q]
        hi[p] = hi[q]
        p = q
    ht[p] = t
    hs[p] = s
    hi[p] = i
    return size + 1


@njit(**NJIT_BORROW_INLINE)
def _heap_pop(ht, hs, hi, size):
    """Remove the smallest ``(t, s)``; returns ``(t, i, size - 1)``."""
    t0 = ht[0]
    i0 = hi[0]
    size -= 1
    t = ht[size]
    s = hs[size]
    i = hi[size]
    p = 0
    while True:
        c = 2 * p + 1
        if c >= size:
            break
        if c + 1 < size and (ht[c + 1] < ht[c] or (ht[c + 1] == ht[c] and hs[c + 1] < hs[c])):
            c += 1
        if t < ht[c] or (t == ht[c] and s < hs[c]):
            break
        ht[p] = ht[c]
        hs[p] = hs[c]
        hi[p] = hi[c]
        p = c
    if size > 0:
        ht[p] = t
        hs[p] = s
        hi[p] = i
    return t0, i0, size


@njit(**NJIT_BORROW_INLINE)
def _prefill_done(pf_free, n_inst, t, tokens, base, per_token):
    """Completion time of a prefill queued at ``t`` (FCFS on the earliest free instance,
    lowest index on ties; ``n_inst = 0``: unlimited, starts at ``t``)."""
    cost = base + per_token * tokens
    if n_inst == 0:
        return t + cost
    j = 0
    for q in range(1, n_inst):
        if pf_free[q] < pf_free[j]:
            j = q
    done = max(t, pf_free[j]) + cost
    pf_free[j] = done
    return done


_FIB = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio: Fibonacci hashing's multiplier


def _table_size(n_keys):
    """Slots of a :func:`_slot` table that holds up to ``n_keys`` keys at most half full (a
    power of two, so that a probe always ends at an empty slot)."""
    size = 2
    while size < 2 * (n_keys + 1):
        size *= 2
    return size


@njit(**NJIT)
def _slot(D, key):
    """The slot of ``key`` in the open-addressing table ``D = (keys, vals)`` (linear probing;
    an empty slot has ``vals < 0``), or the empty slot where it would go (Knuth, TAOCP vol. 3,
    section 6.4, algorithm L)."""
    keys, vals = D
    mask = keys.shape[0] - 1
    i = np.int64((np.uint64(key) * _FIB) >> np.uint64(32)) & mask
    while vals[i] >= 0 and keys[i] != key:
        i = (i + 1) & mask
    return i


@njit(**NJIT)
def _unslot(D, i):
    """Empty slot ``i`` of the table ``D`` (see :func:`_slot`), moving back the entries after it
    that probing would no longer reach (Knuth, TAOCP vol. 3, section 6.4, algorithm R)."""
    keys, vals = D
    mask = keys.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        if vals[j] < 0:
            break
        h = np.int64((np.uint64(keys[j]) * _FIB) >> np.uint64(32)) & mask
        if (j > i and (h <= i or h > j)) or (j < i and h <= i and h > j):
            keys[i] = keys[j]
            vals[i] = vals[j]
            i = j
    vals[i] = -1


@njit(**NJIT_JITTED)
def _cache_touch(D, tg, th, ts, T, hp, sz, g, h, G, cap):
    """Touch block ``h`` in replica ``g``'s LRU prefix cache (``cap`` blocks).

    ``D`` (a :func:`_slot` table) maps ``h * G + g`` to the stamp of its last touch;
    ``tg/th/ts[:T]`` log every touch (replica, block, stamp) in order; ``hp[g]`` is where the
    search for ``g``'s least recently touched block resumes (every entry of ``g`` before it is
    stale or evicted), ``sz[g]`` the blocks ``g`` holds. Returns the (possibly grown) log and
    its new length.
    """
    key = h * G + g
    s = _slot(D, key)
    if D[1][s] < 0:
        sz[g] += 1
        D[0][s] = key
    D[1][s] = T
    if T == tg.shape[0]:
        tg, th, ts = _grown(tg), _grown(th), _grown(ts)
    tg[T] = g
    th[T] = h
    ts[T] = T
    T += 1
    while sz[g] > cap:  # evict the least recently touched block of g
        e = hp[g]
        while True:
            if tg[e] == g:
                s = _slot(D, th[e] * G + g)
                if D[1][s] == ts[e]:  # stamps are >= 0, an empty slot's value < 0
                    break
            e += 1
        _unslot(D, s)
        sz[g] -= 1
        hp[g] = e + 1
    return tg, th, ts, T


def _cache_touch_reference(st, inp, g, b):
    """Reference of :func:`_cache_touch`: block ``b`` becomes the most recently used of
    replica ``g``'s cache (an ``OrderedDict`` in LRU order), evicting the least recently used
    beyond ``cache_blocks``."""
    c = st.caches[g]
    if b in c:
        c.move_to_end(b)
    else:
        c[b] = None
        while len(c) > inp.cache_blocks:
            c.popitem(last=False)


@njit(**NJIT_JITTED)
def _cached_prefix(D, blk_off, blk_ids, i, g, G, blk_tokens, prompt_i):
    """Prompt tokens of request ``i`` in replica ``g``'s cache: its leading blocks present in
    ``D`` (a :func:`_slot` table), times ``blk_tokens``, at most its prompt."""
    c = 0
    for b in range(blk_off[i], blk_off[i + 1]):
        if D[1][_slot(D, blk_ids[b] * G + g)] >= 0:
            c += 1
        else:
            break
    return float(min(c * blk_tokens, prompt_i))


def _cached_prefix_reference(st, inp, i, g):
    """Reference of :func:`_cached_prefix`: request ``i``'s leading blocks found in replica
    ``g``'s cache, in tokens, at most its prompt."""
    hit = 0
    for b in st.blocks[i]:
        if b not in st.caches[g]:
            break
        hit += 1
    return float(min(hit * inp.blk_tokens, st.prompt[i]))


# Scalars of the step loop, kept in EngineState.cnt (int64) so that phases update them in place
_K = 0  # steps done
_NXT = 1  # next arrival not yet queued for prefill
_POOL_N = 2  # requests in the pool (EngineState.pool[:POOL_N], oldest first)
_HEAP_N = 3  # requests queued for or in prefill (the heap)
_PF_SEQ = 4  # prefill queue order (FCFS tie-break of the heap)
_SEQ = 5  # admission order (preemption takes the most recent)
_RUN = 6  # running requests, every replica
_QUEUED = 7  # requests in the engines' own queues (queue mode)
_TICKS = 8  # routing ticks so far
_LRU_N = 9  # entries of the prefix caches' touch log
_ADM_N = 10  # admissions in this step (adm_i/adm_g[:ADM_N] of EngineState.adm)
_N_CNT = 11


class EngineState(NamedTuple):
    """Everything the step loop changes, updated in place by the phases, in the groups the
    phases take (tuples of arrays).

    ``rep``, per replica: ``(slot_req (G, S)`` (request in each slot, -1 empty), ``load``
    (resident KV tokens), ``nrun``, ``ptok`` (running requests' prompt tokens), ``ctx``,
    ``ctx_n)`` (context-phase tokens and requests admitted in this step). ``pq``, prefill:
    ``(pf_free`` (each instance's next free time), ``ht, hs, hi)`` (the heap of ``(done,
    order) -> request``). ``queues``, the engines' queues: ``(q_head, q_tail, q_next`` (per
    request: the queues as linked lists), ``q_len, q_tok)``. ``ring``, the router's views of
    the last ``stale + 1`` steps, ring-indexed by step: ``(view (R, G, H+1), nrun, ptok, qlen,
    qtok`` and what it sent at each step: ``add`` tokens, ``addn`` requests, ``addp`` prompt
    tokens ``)``. ``adm``, what an admission writes (see :func:`_admit`): per request
    ``(replica, start_t, admit_tick, adm_seq`` (admission order), ``pool_wait, enter_t`` (last
    entry into the pool), ``in_pool``, and ``adm_i, adm_g)`` (the requests admitted in this
    step and their replicas, in order). Per request (arrival order): ``ready_t``,
    ``first_t``, ``finish_t``, ``decoded``, ``n_pre``, ``enter_tick``, ``cache_hit`` (-1
    until its first admission); ``pool``: the pool, oldest first (``pool[:cnt[_POOL_N]]``).
    ``memo``: the last finished output length per prompt-hash group. ``tick_in`` (capacity
    ``max_pool``) and ``tick_view``: what the policy is shown at a tick
    (:func:`_tick_state`), allocated once. ``cache``, the prefix caches: ``(cache_d``
    (block * G + replica -> stamp, a :func:`_slot` table ``(keys, vals)`` sized to the most
    blocks the caches can hold at once), ``c_hp, c_sz)`` (see :func:`_cache_touch`).
    ``cnt``: the loop's counters (``_K`` .. ``_ADM_N``); ``clock`` ``(1,)``: the simulated
    time.

    Grouped, :func:`run_engine` binds a few fields (each read of a field of a record
    variable loads the whole record, which LLVM's SROA then splits field by field: with one
    field per array, those reads were a large part of the loop function's compile).
    """

    rep: tuple
    pq: tuple
    queues: tuple
    ring: tuple
    adm: tuple
    ready_t: np.ndarray
    first_t: np.ndarray
    finish_t: np.ndarray
    decoded: np.ndarray
    n_pre: np.ndarray
    enter_tick: np.ndarray
    cache_hit: np.ndarray
    pool: np.ndarray
    memo: np.ndarray
    tick_in: PoolState
    tick_view: ReplicaState
    cache: tuple
    cnt: np.ndarray
    clock: np.ndarray


@njit(**NJIT_JITTED)
def _new_state(inp):
    """The state before the first step: nothing arrived, every slot and queue empty.

    Compiled apart, as :func:`_cfg` (not inlined into :func:`run_engine`): inlined, each
    built their record of many arrays (or read ``inp``'s fields one by one) inside the loop's
    function, where LLVM's SROA splits every such record value field by field; that doubled
    the time of the loop function's own optimization passes."""
    n = inp.arrival_t.shape[0]
    G, S, H, R = inp.n_replicas, inp.max_slots, inp.horizon, inp.stale + 1
    cap = max(min(inp.max_pool, n), 1)
    n_cached = cap if inp.cache_router else 0
    return EngineState(
        rep=(
            np.full((G, S), -1, dtype=np.int64),
            np.zeros(G, dtype=np.int64),
            np.zeros(G, dtype=np.int64),
            np.zeros(G, dtype=np.int64),
            np.zeros(G, dtype=np.int64),
            np.zeros(G, dtype=np.int64),
        ),
        pq=(
            np.zeros(max(inp.prefill_instances, 1)),
            np.empty(n),
            np.empty(n, dtype=np.int64),
            np.empty(n, dtype=np.int64),
        ),
        queues=(
            np.full(G, -1, dtype=np.int64),
            np.full(G, -1, dtype=np.int64),
            np.full(n, -1, dtype=np.int64),
            np.zeros(G, dtype=np.int64),
            np.zeros(G, dtype=np.int64),
        ),
        ring=(
            np.zeros((R, G, H + 1)),
            np.zeros((R, G), dtype=np.int64),
            np.zeros((R, G)),
            np.zeros((R, G), dtype=np.int64),
            np.zeros((R, G)),
            np.zeros((R, G)),
            np.zeros((R, G), dtype=np.int64),
            np.zeros((R, G)),
        ),
        adm=(
            np.full(n, -1, dtype=np.int64),
            np.full(n, np.nan),
            np.full(n, -1, dtype=np.int64),
            np.zeros(n, dtype=np.int64),
            np.zeros(n),
            np.zeros(n),
            np.zeros(n, dtype=np.bool_),
            np.empty(n, dtype=np.int64),
            np.empty(n, dtype=np.int64),
        ),
        ready_t=np.full(n, np.nan),
        first_t=np.full(n, np.nan),
        finish_t=np.full(n, np.nan),
        decoded=np.zeros(n, dtype=np.int64),
        n_pre=np.zeros(n, dtype=np.int64),
        enter_tick=np.full(n, -1, dtype=np.int64),
        cache_hit=np.full(n, -1.0),
        pool=np.empty(n, dtype=np.int64),
        memo=np.full(max(inp.n_groups, 1), -1, dtype=np.int64),
        tick_in=PoolState(
            np.empty(cap),
            np.empty(cap, np.int64),
            np.empty(cap, np.int64),
            np.zeros((n_cached, G)),
        ),
        tick_view=ReplicaState(
            np.zeros((G, H + 1)),
            np.zeros(G, np.int64),
            np.zeros(G, np.int64),
            np.zeros(G, np.int64),
            np.zeros(G),
            np.zeros(G),
            np.zeros(G),
            np.full(G, float(inp.kv_cap)),
        ),
        cache=(
            (np.zeros(inp.cache_slots, np.int64), np.full(inp.cache_slots, -1, np.int64)),
            np.zeros(G, dtype=np.int64),
            np.zeros(G, dtype=np.int64),
        ),
        cnt=np.zeros(_N_CNT, dtype=np.int64),
        clock=np.zeros(1),
    )


class _ReferenceState:
    """What :func:`run_engine_reference` changes, in plain Python containers (the twin of
    :class:`EngineState`): per request lists (arrival order); ``slots[g]`` the requests in
    replica ``g``'s slots (None: empty), from which loads are recomputed at every read;
    ``pool`` (by first ready time, then index), ``queue`` the prefill queue as a list of
    ``(done, order, request)``, ``instances`` each prefill instance's next free time;
    ``views[k]``/``placed[k]`` the router's view of step ``k`` and what it sent at step ``k``
    (the last ``stale + 1`` steps); ``engine_queue[g]`` engine ``g``'s own FIFO (queue
    mode); ``caches[g]`` its prefix blocks in LRU order; ``admitted`` the step's admissions
    ``(request, replica)`` in order; ``ctx``/``ctx_n`` the context-phase tokens and requests
    each replica admitted in this step."""

    def __init__(self, inp):
        n = len(inp.arrival_t)
        G, S = inp.n_replicas, inp.max_slots
        nan = float("nan")
        self.n, self.G = n, G
        self.prompt = [int(x) for x in inp.prompt]
        self.output = [int(x) for x in inp.output]
        self.group = [int(x) for x in inp.group]
        self.ready_t, self.start_t = [nan] * n, [nan] * n
        self.first_t, self.finish_t = [nan] * n, [nan] * n
        self.replica, self.n_pre, self.pool_wait = [-1] * n, [0] * n, [0.0] * n
        self.decoded, self.admitted_as = [0] * n, [0] * n
        self.enter_t, self.enter_tick, self.admit_tick = [0.0] * n, [0] * n, [-1] * n
        self.slots = [[None] * S for _ in range(G)]
        self.memo: dict[int, int] = {}
        self.pool: list[int] = []
        self.queue: list[tuple[float, int, int]] = []
        self.instances = [0.0] * max(inp.prefill_instances, 1)
        self.views: dict[int, tuple] = {}
        self.placed: dict[int, list] = {}
        self.series: list[list] = []
        self.tick_pool: list[int] = []
        self.engine_queue: list[list[int]] = [[] for _ in range(G)]
        self.caches = [collections.OrderedDict() for _ in range(G)]
        self.hits = [None] * n  # cached prompt tokens at the first admission
        self.blocks = [
            [int(b) for b in inp.blk_ids[inp.blk_off[i] : inp.blk_off[i + 1]]]
            if inp.use_cache
            else []
            for i in range(n)
        ]
        self.admitted: list[tuple[int, int]] = []
        self.ctx, self.ctx_n = [0] * G, [0] * G
        self.clock, self.k, self.nxt, self.order, self.seq, self.n_ticks = 0.0, 0, 0, 0, 0, 0
        self.carry = inp.carry


def _loads_reference(st):
    """Each replica's resident KV tokens, recomputed from its slots."""
    return [
        sum(st.prompt[i] + st.decoded[i] for i in st.slots[g] if i is not None) for g in range(st.G)
    ]


def _running_reference(st, g):
    """Requests running on replica ``g``."""
    return sum(1 for i in st.slots[g] if i is not None)


class _Cfg(NamedTuple):
    """The scalars of :class:`EngineInputs` the phases read, taken once before the loop: a
    record of scalars only, so binding it in a phase costs nothing (a record holding arrays
    costs a reference-count update per array at every binding)."""

    n_replicas: int
    max_slots: int
    kv_cap: int
    t0: float
    kappa: float
    prefill_instances: int
    prefill_base_s: float
    prefill_per_token_s: float
    stale: int
    optimistic: bool
    max_pool: int
    horizon: int
    pred_kind: int
    refill: bool
    seed: int
    time_router: bool
    queue_mode: bool
    use_cache: bool
    cache_router: bool
    blk_tokens: int
    cache_blocks: int
    ctx_cost: float
    deploy: bool
    n_layers: int
    att_c: float
    fixed_s: float
    moe_key: int


@njit(**NJIT_JITTED)
def _cfg(inp):
    """The :class:`_Cfg` of ``inp``."""
    return _Cfg(
        inp.n_replicas, inp.max_slots, inp.kv_cap, inp.t0, inp.kappa, inp.prefill_instances,
        inp.prefill_base_s, inp.prefill_per_token_s, inp.stale, inp.optimistic, inp.max_pool,
        inp.horizon, inp.pred_kind, inp.refill, inp.seed, inp.time_router, inp.queue_mode,
        inp.use_cache, inp.cache_router, inp.blk_tokens, inp.cache_blocks, inp.ctx_cost,
        inp.deploy, inp.n_layers, inp.att_c, inp.fixed_s, inp.moe_key,
    )  # fmt: skip


@njit(**NJIT_BORROW_INLINE)
def _to_prefill(cfg, c, pq, i, t, tokens):
    """Request ``i`` joins the prefill queue ``pq = (pf_free, ht, hs, hi)`` at time ``t``
    with ``tokens`` to prefill."""
    pf_free, ht, hs, hi = pq
    done = _prefill_done(
        pf_free, cfg.prefill_instances, t, tokens, cfg.prefill_base_s, cfg.prefill_per_token_s
    )
    c[_HEAP_N] = _heap_push(ht, hs, hi, c[_HEAP_N], done, c[_PF_SEQ], i)
    c[_PF_SEQ] += 1


def _to_prefill_reference(st, inp, i, t, tokens):
    """Reference of :func:`_to_prefill`: request ``i`` joins the prefill queue (a list) at
    ``t``; its prefill starts on the earliest free instance (lowest index on ties)."""
    cost = inp.prefill_base_s + inp.prefill_per_token_s * float(tokens)
    if inp.prefill_instances == 0:
        done = t + cost
    else:
        j = min(range(len(st.instances)), key=lambda q: (st.instances[q], q))
        done = max(t, st.instances[j]) + cost
        st.instances[j] = done
    st.queue.append((done, st.order, i))
    st.order += 1


@njit(**NJIT_BORROW)
def _arrivals(cfg, arrival_t, prompt, c, clock, pq):
    """Phase 1: the requests that arrived by now join the prefill queue, in arrival order."""
    n = arrival_t.shape[0]
    while c[_NXT] < n and arrival_t[c[_NXT]] <= clock[0]:
        i = c[_NXT]
        _to_prefill(cfg, c, pq, i, arrival_t[i], float(prompt[i]))
        c[_NXT] += 1


def _arrivals_reference(st, inp):
    """Reference of :func:`_arrivals`."""
    while st.nxt < st.n and inp.arrival_t[st.nxt] <= st.clock:
        _to_prefill_reference(st, inp, st.nxt, float(inp.arrival_t[st.nxt]), st.prompt[st.nxt])
        st.nxt += 1


@njit(**NJIT_BORROW)
def _prefill_to_pool(c, clock, pq, pool, ready_t, enter_t, enter_tick, in_pool):
    """Phase 2: prefills done by now enter the pool, kept in order of (first ready time,
    index): a recomputed request goes back to its place by age, ahead of later ones."""
    _, ht, hs, hi = pq
    while c[_HEAP_N] > 0 and ht[0] <= clock[0]:
        t_done, i, heap_n = _heap_pop(ht, hs, hi, c[_HEAP_N])
        c[_HEAP_N] = heap_n
        if np.isnan(ready_t[i]):
            ready_t[i] = t_done
            enter_tick[i] = c[_TICKS]
        enter_t[i] = t_done
        in_pool[i] = True
        q = c[_POOL_N]
        while q > 0 and (
            ready_t[pool[q - 1]] > ready_t[i]
            or (ready_t[pool[q - 1]] == ready_t[i] and pool[q - 1] > i)
        ):
            pool[q] = pool[q - 1]
            q -= 1
        pool[q] = i
        c[_POOL_N] += 1


def _prefill_to_pool_reference(st):
    """Reference of :func:`_prefill_to_pool`: done prefills, earliest first, inserted into
    the pool by (first ready time, index)."""
    for done, o, i in sorted(q for q in st.queue if q[0] <= st.clock):
        st.queue.remove((done, o, i))
        if st.ready_t[i] != st.ready_t[i]:
            st.ready_t[i], st.enter_tick[i] = done, st.n_ticks
        st.enter_t[i] = done
        keys = [(st.ready_t[j], j) for j in st.pool]
        st.pool.insert(bisect.bisect_left(keys, (st.ready_t[i], i)), i)


@njit(**NJIT_BORROW)
def _next_event(arrival_t, c, ht):
    """The next arrival or prefill completion (``inf``: none)."""
    t_next = np.inf
    if c[_NXT] < arrival_t.shape[0]:
        t_next = arrival_t[c[_NXT]]
    if c[_HEAP_N] > 0 and ht[0] < t_next:
        t_next = ht[0]
    return t_next


def _next_event_reference(st, inp):
    """Reference of :func:`_next_event` (None: no event left)."""
    times = [float(inp.arrival_t[st.nxt])] if st.nxt < st.n else []
    times += [q[0] for q in st.queue]
    return min(times) if times else None


@njit(**NJIT_BORROW)
def _preempt(cfg, c, clock, rep, pq, prompt, decoded, adm_seq, n_pre):
    """Phase 4: while a replica's next step would overflow its KV capacity, its most recently
    admitted request goes back through prefill with ``prompt + decoded`` tokens. ``rep``:
    the replicas' ``(slot_req, load, nrun, ptok, ctx, ctx_n)``. Returns the number of
    preemptions."""
    slot_req, load, nrun, ptok, _, _ = rep
    n_preempted = 0
    for g in range(cfg.n_replicas):
        while load[g] + nrun[g] > cfg.kv_cap:
            v_s = -1
            for s in range(cfg.max_slots):
                i = slot_req[g, s]
                if i >= 0 and (v_s < 0 or adm_seq[i] > adm_seq[slot_req[g, v_s]]):
                    v_s = s
            v = slot_req[g, v_s]
            slot_req[g, v_s] = -1
            load[g] -= prompt[v] + decoded[v]
            ptok[g] -= prompt[v]
            nrun[g] -= 1
            c[_RUN] -= 1
            n_pre[v] += 1
            n_preempted += 1
            _to_prefill(cfg, c, pq, v, clock[0], float(prompt[v] + decoded[v]))
    return n_preempted


def _preempt_reference(st, inp):
    """Reference of :func:`_preempt`; returns the number of preemptions."""
    n_preempted = 0
    for g in range(st.G):
        while _loads_reference(st)[g] + _running_reference(st, g) > inp.kv_cap:
            s = max(
                (s for s in range(inp.max_slots) if st.slots[g][s] is not None),
                key=lambda s: st.admitted_as[st.slots[g][s]],
            )
            v = st.slots[g][s]
            st.slots[g][s] = None
            st.n_pre[v] += 1
            n_preempted += 1
            _to_prefill_reference(st, inp, v, st.clock, st.prompt[v] + st.decoded[v])
    return n_preempted


@njit(**NJIT_BORROW)
def _snapshot(cfg, c, rep, queues, ring):
    """Phase 5: the router's view of this step (loads, running counts, prompt tokens,
    queues) into the ring ``(view, nrun, ptok, qlen, qtok, add, addn, addp)``; this step's
    sent, context and admission counters start at zero. Returns the ring slot."""
    slot_req, load, nrun, ptok, ctx, ctx_n = rep
    _, _, _, q_len, q_tok = queues
    view_ring, nrun_ring, ptok_ring, qlen_ring, qtok_ring, add_ring, addn_ring, addp_ring = ring
    slot = c[_K] % (cfg.stale + 1)
    c[_ADM_N] = 0
    for g in range(cfg.n_replicas):
        ctx[g] = 0
        ctx_n[g] = 0
        add_ring[slot, g] = 0.0
        addn_ring[slot, g] = 0
        addp_ring[slot, g] = 0.0
        nrun_ring[slot, g] = nrun[g]
        ptok_ring[slot, g] = ptok[g]
        qlen_ring[slot, g] = q_len[g]
        qtok_ring[slot, g] = q_tok[g]
        for h in range(cfg.horizon + 1):
            view_ring[slot, g, h] = 0.0
        view_ring[slot, g, 0] = load[g]
    return slot


def _snapshot_reference(st, inp):
    """Reference of :func:`_snapshot`: the view of step ``k`` (exact loads, running counts,
    prompt tokens, queues), kept for ``stale + 1`` steps; this step's sent, context and
    admission records start empty."""
    G, H, k = st.G, inp.horizon, st.k
    st.ctx, st.ctx_n = [0] * G, [0] * G
    st.admitted = []
    L = _loads_reference(st)
    view = [[float(L[g])] + [0.0] * H for g in range(G)]
    prompts_now = [float(sum(st.prompt[i] for i in s if i is not None)) for s in st.slots]
    queued = [len(q) for q in st.engine_queue]
    queued_tok = [float(sum(st.prompt[i] + st.decoded[i] for i in q)) for q in st.engine_queue]
    running = [_running_reference(st, g) for g in range(G)]
    st.views[k] = (view, running, prompts_now, queued, queued_tok)
    st.views.pop(k - inp.stale - 1, None)
    st.placed[k] = [[0.0] * G, [0] * G, [0.0] * G]
    st.placed.pop(k - inp.stale - 1, None)


@njit(**NJIT_INLINE)
def _project(cfg, c, pred, slot_req, pool, decoded, memo, view_ring, slot, two_stage):
    """Phase 5b (with a predictor): the projected loads of this step into the ring slot
    ``slot``; ``pred``: ``(prompt, output, group, surv_p, surv_mu)``."""
    prompt, output, group, surv_p, surv_mu = pred
    rf = 0.0
    if cfg.refill:
        pool_n = c[_POOL_N]
        P = pool_n if pool_n < cfg.max_pool else cfg.max_pool
        for j in range(P):
            rf += prompt[pool[j]]
        rf = rf / P if P > 0 else 0.0
    view = project_view(
        slot_req,
        decoded,
        prompt,
        output,
        group,
        memo,
        surv_p,
        surv_mu,
        cfg.pred_kind,
        cfg.horizon,
        rf,
        two_stage,
    )
    for g in range(cfg.n_replicas):  # element by element: no broadcasting (and its compile)
        for h in range(cfg.horizon + 1):
            view_ring[slot, g, h] = view[g, h]


def _project_reference(st, inp):
    """Reference of :func:`_project` (and of :func:`project_view`): the projected loads
    replace the view of step ``k`` (the predictor of ``pred_kind``, written out per request as
    in the module docstring)."""
    G, H = st.G, inp.horizon
    prompt, decoded = st.prompt, st.decoded
    view = [[0.0] * (H + 1) for g in range(G)]
    visible = [float(prompt[i]) for i in st.pool[: inp.max_pool]] if inp.refill else []
    rf = sum(visible) / len(visible) if visible else 0.0
    for g in range(G):
        for i in st.slots[g]:
            if i is None:
                continue
            a = decoded[i]
            hit = inp.pred_kind == _EXACT_MATCH and st.group[i] >= 0
            m = st.memo.get(st.group[i], -1) if hit else -1
            if inp.pred_kind == _TWO_STAGE:
                f = int(inp.ts_fold[i])
                p, mu = two_stage_predict_reference(
                    inp.ts_knots[f], inp.ts_lin[f], inp.ts_iso[f], inp.ts_nb[f], prompt[i], a
                )
            elif inp.pred_kind == _ORACLE or m > a:
                r = (st.output[i] if inp.pred_kind == _ORACLE else m) - a
                p, mu = (1.0 if r <= H else 0.0), float(r)
            else:
                j = min(a, len(inp.surv_p) - 1)
                p, mu = float(inp.surv_p[j]), float(inp.surv_mu[j])
            mu = min(max(mu, 1.0), float(max(H, 1)))
            c = float(H + 1) if p < 0.5 else (1.0 - p) * (H + 1) + p * mu
            for h in range(H + 1):
                w = min(max(c - h, 0.0), 1.0)
                if w > 0.0:
                    view[g][h] += w * (prompt[i] + a + h)
                if rf > 0.0 and w < 1.0:
                    view[g][h] += (1.0 - w) * rf
    st.views[st.k] = (view,) + st.views[st.k][1:]


@njit(**NJIT_BORROW_INLINE)
def _fits(cfg, nrun, load, tok, g):
    """Whether replica ``g`` can start a request of ``tok`` tokens now: a free slot, and its
    tokens plus the next step's token of every request fit the KV capacity."""
    return nrun[g] < cfg.max_slots and load[g] + tok + nrun[g] + 1 <= cfg.kv_cap


def _fits_reference(st, inp, i, g):
    """Reference of :func:`_fits`."""
    tok = st.prompt[i] + st.decoded[i]
    run = _running_reference(st, g)
    return run < inp.max_slots and _loads_reference(st)[g] + tok + run + 1 <= inp.kv_cap


@njit(**NJIT_BORROW_INLINE)
def _admit(cfg, c, clock, rep, adm, prompt, decoded, i, g):
    """Start request ``i`` on replica ``g`` in its lowest free slot (pool and queue mode
    alike): its tokens join the load and the step's context phase, and ``(i, g)`` joins the
    step's admissions ``adm_i/adm_g[:cnt[_ADM_N]]`` (with prefix caches,
    :func:`_cache_admissions` then reads and fills the caches in this order). ``adm``: the
    per-request ``(replica, start_t, admit_tick, adm_seq, pool_wait, enter_t, in_pool)`` and
    the step's ``(adm_i, adm_g)``."""
    slot_req, load, nrun, ptok, ctx, ctx_n = rep
    replica, start_t, admit_tick, adm_seq, pool_wait, enter_t, in_pool, adm_i, adm_g = adm
    tok = prompt[i] + decoded[i]
    for s in range(cfg.max_slots):
        if slot_req[g, s] < 0:
            slot_req[g, s] = i
            break
    nrun[g] += 1
    load[g] += tok
    ptok[g] += prompt[i]
    replica[i] = g
    if np.isnan(start_t[i]):
        start_t[i] = clock[0]
        admit_tick[i] = c[_TICKS] - 1
    adm_seq[i] = c[_SEQ]
    c[_SEQ] += 1
    pool_wait[i] += clock[0] - enter_t[i]
    in_pool[i] = False
    c[_RUN] += 1
    ctx[g] += tok
    ctx_n[g] += 1
    adm_i[c[_ADM_N]] = i
    adm_g[c[_ADM_N]] = g
    c[_ADM_N] += 1


def _admit_reference(st, inp, i, g):
    """Reference of :func:`_admit`: request ``i`` takes replica ``g``'s first empty slot."""
    st.ctx[g] += st.prompt[i] + st.decoded[i]  # a context phase in this step
    st.ctx_n[g] += 1
    st.slots[g][st.slots[g].index(None)] = i
    st.replica[i] = g
    if st.start_t[i] != st.start_t[i]:
        st.start_t[i] = st.clock
        st.admit_tick[i] = st.n_ticks - 1
    st.admitted_as[i] = st.seq
    st.seq += 1
    st.pool_wait[i] += st.clock - st.enter_t[i]
    st.admitted.append((i, g))


@njit(**NJIT_JITTED)
def _cache_admissions(cfg, c, cache, cache_hit, ctx, prompt, adm_i, adm_g, touch):
    """Phase 6c (with prefix caches): the step's admissions in order, each reading its
    cached prefix on its replica (``cache_hit`` at its first admission; a cached prefix needs
    no context phase, so ``ctx`` drops by it), then filling the cache with its prompt blocks
    (LRU, :func:`_cache_touch`). ``cache``: ``(cache_d, c_hp, c_sz, blk_off, blk_ids)``.
    ``touch``: the caches' touch log ``(tg, th, ts)`` (replica, block, stamp); returns it
    (possibly grown). Nothing in the admissions of a step reads the
    caches, so reading them after the step's admissions, in their order, is exact."""
    cache_d, c_hp, c_sz, blk_off, blk_ids = cache
    G = cfg.n_replicas
    tg, th, ts = touch
    n_log = c[_LRU_N]
    for a in range(c[_ADM_N]):
        i = adm_i[a]
        g = adm_g[a]
        hit = int(_cached_prefix(cache_d, blk_off, blk_ids, i, g, G, cfg.blk_tokens, prompt[i]))
        if cache_hit[i] < 0:
            cache_hit[i] = float(hit)
        for b in range(blk_off[i], blk_off[i + 1]):
            tg, th, ts, n_log = _cache_touch(
                cache_d, tg, th, ts, n_log, c_hp, c_sz, g, blk_ids[b], G, cfg.cache_blocks
            )
        ctx[g] -= hit
    c[_LRU_N] = n_log
    return tg, th, ts


def _cache_admissions_reference(st, inp):
    """Reference of :func:`_cache_admissions`: each admission of the step, in order, reads
    its cached prefix (its first admission's is kept; the context phase skips it), then its
    prompt's blocks enter the replica's cache."""
    for i, g in st.admitted:
        hit = int(_cached_prefix_reference(st, inp, i, g))
        if st.hits[i] is None:
            st.hits[i] = float(hit)
        for b in st.blocks[i]:
            _cache_touch_reference(st, inp, g, b)
        st.ctx[g] -= hit


@njit(**NJIT_BORROW_INLINE)
def _sent(ring, slot, g, tok, prompt_i):
    """Record in the ring what the router sent to ``g`` at this step (the optimistic view of
    later ticks adds it while the view is older than it)."""
    ring[5][slot, g] += tok
    ring[6][slot, g] += 1
    ring[7][slot, g] += prompt_i


@njit(**NJIT_BORROW_INLINE)
def _router_view(cfg, c, ring, reps):
    """What the router sees at this tick, written into the :class:`ReplicaState` ``reps``
    (its ``loads``, ``n_running``, ``prompt_tokens``, ``n_waiting``, ``waiting_tokens``):
    the view of step ``k - stale`` (step 0's before), plus, when optimistic, what it sent
    since then (pool mode: tokens on every horizon column, running counts, prompt tokens;
    queue mode: queue lengths and tokens)."""
    view_ring, nrun_ring, ptok_ring, qlen_ring, qtok_ring, add_ring, addn_ring, addp_ring = ring
    view, seen_n, seen_p = reps.loads, reps.n_running, reps.prompt_tokens
    seen_q, seen_qt = reps.n_waiting, reps.waiting_tokens
    k, R, G, H = c[_K], cfg.stale + 1, cfg.n_replicas, cfg.horizon
    old = (k - cfg.stale) % R if k >= cfg.stale else 0
    for g in range(G):
        for h in range(H + 1):
            view[g, h] = view_ring[old, g, h]
        seen_n[g] = nrun_ring[old, g]
        seen_p[g] = ptok_ring[old, g]
        seen_q[g] = qlen_ring[old, g]
        seen_qt[g] = qtok_ring[old, g]
    if cfg.optimistic:
        lo = k - cfg.stale if k >= cfg.stale else 0
        for kk in range(lo, k):
            for g in range(G):
                if cfg.queue_mode:  # what it sent since then sits in the engines' queues
                    seen_q[g] += addn_ring[kk % R, g]
                    seen_qt[g] += add_ring[kk % R, g]
                else:
                    seen_n[g] += addn_ring[kk % R, g]
                    seen_p[g] += addp_ring[kk % R, g]
                    for h in range(H + 1):
                        view[g, h] += add_ring[kk % R, g]


def _router_view_reference(st, inp):
    """Reference of :func:`_router_view`: the view of step ``k - stale`` (step 0's before),
    plus, when optimistic, what was sent since (to the queues in queue mode); returns
    ``(loads, n_running, prompt_tokens, n_waiting, waiting_tokens)`` as lists."""
    G, H, k = st.G, inp.horizon, st.k
    old_view, old_n, old_p, old_q, old_qt = st.views[max(k - inp.stale, 0)]
    seen = [row[:] for row in old_view]
    seen_n, seen_p, seen_q, seen_qt = list(old_n), list(old_p), list(old_q), list(old_qt)
    if inp.optimistic:
        for kk in range(max(k - inp.stale, 0), k):
            tok, cnt, pr = st.placed[kk]
            for g in range(G):
                if inp.queue_mode:  # sent since the view: in the engines' queues
                    seen_q[g] += cnt[g]
                    seen_qt[g] += tok[g]
                    continue
                seen_n[g] += cnt[g]
                seen_p[g] += pr[g]
                for h in range(H + 1):
                    seen[g][h] += tok[g]
    return seen, seen_n, seen_p, seen_q, seen_qt


@njit(**NJIT_BORROW)
def _tick_state(cfg, c, prompt, room, decoded, pool, enter_tick, nrun, ring, buf, reps):
    """Phase 6a: what the policy is shown at this tick, written into buffers the loop
    allocates once (a kernel never changes its inputs): the oldest ``P = min(pool,
    max_pool)`` pool requests into ``buf`` (a :class:`PoolState` of capacity ``max_pool``:
    tokens ``prompt + decoded``, ticks waited, bootstrap room; the cached prefixes apart,
    :func:`_cached_view`) and the replicas' (stale) view into ``reps``
    (:class:`ReplicaState`, :func:`_router_view`; pool mode: exact free slots, queue mode:
    every replica takes the whole pool). Returns ``P``."""
    G = cfg.n_replicas
    pool_n = c[_POOL_N]
    P = pool_n if pool_n < cfg.max_pool else cfg.max_pool
    prefill, wait, key = buf.prefill, buf.wait, buf.key
    for j in range(P):
        i = pool[j]
        prefill[j] = prompt[i] + decoded[i]
        wait[j] = c[_TICKS] - enter_tick[i]
        key[j] = room[i]
    _router_view(cfg, c, ring, reps)
    free, usage = reps.free_slots, reps.kv_usage
    for g in range(G):
        free[g] = P if cfg.queue_mode else cfg.max_slots - nrun[g]  # a queue takes all
        usage[g] = reps.loads[g, 0] / cfg.kv_cap
    return P


def _tick_state_reference(st, inp):
    """Reference of :func:`_tick_state`: ``(P, (prefill, wait, key), ReplicaState)`` for the
    oldest ``P`` pool requests and the router's view."""
    G, H, kv_cap = st.G, inp.horizon, inp.kv_cap
    P = min(len(st.pool), inp.max_pool)
    visible = st.pool[:P]
    prefill = np.array([float(st.prompt[i] + st.decoded[i]) for i in visible])
    wait = np.array([st.n_ticks - st.enter_tick[i] for i in visible], dtype=np.int64)
    key = np.array([int(inp.room[i]) for i in visible], dtype=np.int64)
    seen, seen_n, seen_p, seen_q, seen_qt = _router_view_reference(st, inp)
    free = [P if inp.queue_mode else inp.max_slots - _running_reference(st, g) for g in range(G)]
    reps = ReplicaState(
        np.array(seen, dtype=np.float64).reshape(G, H + 1),
        np.array(free, dtype=np.int64),
        np.array(seen_n, dtype=np.int64),
        np.array(seen_q, dtype=np.int64),
        np.array(seen_p, dtype=np.float64),
        np.array(seen_qt, dtype=np.float64),
        np.array([seen[g][0] / kv_cap for g in range(G)]),
        np.full(G, float(kv_cap)),
    )
    return P, (prefill, wait, key), reps


@njit(**NJIT_JITTED)
def _cached_view(cfg, cache, prompt, pool, P, cached):
    """Phase 6a (a policy that reads the prefix caches): ``cached[j, g]``, the prompt tokens
    of the ``j``-th visible pool request found in replica ``g``'s cache."""
    cache_d, _, _, blk_off, blk_ids = cache
    G = cfg.n_replicas
    for j in range(P):
        for g in range(G):
            cached[j, g] = _cached_prefix(
                cache_d, blk_off, blk_ids, pool[j], g, G, cfg.blk_tokens, prompt[pool[j]]
            )


def _cached_view_reference(st, inp, P):
    """Reference of :func:`_cached_view`: ``(P, G)`` cached prompt tokens."""
    rows = [[_cached_prefix_reference(st, inp, i, g) for g in range(st.G)] for i in st.pool[:P]]
    return np.array(rows).reshape(-1, st.G)


@njit(**NJIT_BORROW)
def _apply_tick(
    cfg, c, clock, rep, adm, queues, ring, prompt, decoded, pool, assign, P, ns, tick_ns, tick_pool
):
    """Phase 6b: the tick's assignment applied in pool order: queue mode, to the tail of
    the replica's own queue; pool mode, admitted when it fits (:func:`_fits`), otherwise it
    stays in the pool. Records the router's time ``ns`` and the visible pool ``P`` in
    ``tick_ns`` and ``tick_pool`` (the loop makes room first)."""
    _, load, nrun, _, _, _ = rep
    q_head, q_tail, q_next, q_len, q_tok = queues
    k = c[_K]
    pool_n = c[_POOL_N]
    n_ticks = c[_TICKS]
    tick_ns[n_ticks] = ns
    tick_pool[n_ticks] = P
    c[_TICKS] += 1
    slot = k % (cfg.stale + 1)
    keep = 0
    for j in range(pool_n):
        i = pool[j]
        g = assign[j] if j < P else -1
        tok = prompt[i] + decoded[i]
        if cfg.queue_mode and g >= 0:  # to the tail of the engine's own queue
            if q_tail[g] < 0:
                q_head[g] = i
            else:
                q_next[q_tail[g]] = i
            q_tail[g] = i
            q_next[i] = -1
            q_len[g] += 1
            q_tok[g] += tok
            c[_QUEUED] += 1
            _sent(ring, slot, g, tok, prompt[i])
        elif g >= 0 and _fits(cfg, nrun, load, tok, g):
            _admit(cfg, c, clock, rep, adm, prompt, decoded, i, g)
            _sent(ring, slot, g, tok, prompt[i])
        else:
            pool[keep] = i
            keep += 1
    c[_POOL_N] = keep


def _apply_tick_reference(st, inp, assign, P):
    """Reference of :func:`_apply_tick`: the assignment applied in pool order (queue mode:
    to the engine's queue; pool mode: admitted when it fits, else it stays)."""
    st.n_ticks += 1
    st.tick_pool.append(P)
    sent = st.placed[st.k]
    still = []
    for j, i in enumerate(st.pool):
        g = int(assign[j]) if j < P else -1
        if g >= 0 and (inp.queue_mode or _fits_reference(st, inp, i, g)):
            if inp.queue_mode:
                st.engine_queue[g].append(i)
            else:
                _admit_reference(st, inp, i, g)
            sent[0][g] += st.prompt[i] + st.decoded[i]
            sent[1][g] += 1
            sent[2][g] += st.prompt[i]
        else:
            still.append(i)
    st.pool = still


@njit(**NJIT_BORROW)
def _admit_queues(cfg, c, clock, rep, adm, queues, prompt, decoded):
    """Phase 6c (queue mode): each replica admits from the head of its queue while the head
    fits (:func:`_fits`); the first that does not blocks those behind it (FCFS)."""
    _, load, nrun, _, _, _ = rep
    q_head, q_tail, q_next, q_len, q_tok = queues
    for g in range(cfg.n_replicas):
        while q_head[g] >= 0:
            i = q_head[g]
            if not _fits(cfg, nrun, load, prompt[i] + decoded[i], g):
                break
            q_head[g] = q_next[i]
            if q_head[g] < 0:
                q_tail[g] = -1
            q_len[g] -= 1
            q_tok[g] -= prompt[i] + decoded[i]
            c[_QUEUED] -= 1
            _admit(cfg, c, clock, rep, adm, prompt, decoded, i, g)


def _admit_queues_reference(st, inp):
    """Reference of :func:`_admit_queues`: each engine admits from its queue's head, FCFS."""
    for g in range(st.G):
        while st.engine_queue[g] and _fits_reference(st, inp, st.engine_queue[g][0], g):
            _admit_reference(st, inp, st.engine_queue[g].pop(0), g)


@njit(**NJIT_OBJMODE)
def _moe_seconds(key, load, nrun, clock):
    """The MoE layers' seconds of this step from the registered step model (object mode).

    The step model (:class:`~straggler.sim.engine.deployment.StepModel`) is a Python object:
    numpy draws, a placement rebuilt and tables solved with ``solve_dispatch`` now and then,
    per-step logs. Compiled code cannot hold a Python object, so the loop calls back into
    Python through an object-mode block with an integer key, and the callee finds the model
    in a registry the run fills for its duration
    (:func:`~straggler.sim.engine.deployment.running_step_model`). The callback holds the GIL
    (object mode needs it); the loop without a deployment never enters it."""
    with objmode(moe="float64"):
        moe = engine_moe_seconds(key, load, nrun, clock)
    return moe


@njit(**NJIT_BORROW_ENTRY)  # public: keeps its Python entry point
def step_time(cfg, load, nrun, ctx, clock):
    """Phase 7: the duration of this decode step from the loads at its start (``cfg``: the
    engine's scalars, ``load``/``nrun``/``ctx`` per replica, ``clock`` the time now).

    ``t0 + kappa * max_g L_g`` (the barrier: the most loaded replica sets the pace); with
    ``ctx_cost > 0`` (aggregated serving) ``t0 + max_g (kappa * L_g + ctx_cost * C_g)``,
    ``C_g = ctx[g]`` the context-phase tokens ``g`` admitted at this step. This is the
    one place that prices a step: a cost model with more terms (per-layer attention per
    replica, a barrier, an MoE layer) replaces this function's body.

    With ``deploy`` (the deployment step model): ``n_layers * max_g (t0 + kappa * L_g +
    att_c * R_g + ctx_cost * C_g) + fixed_s`` (attention per layer and its barrier, ``R_g``
    the running requests), plus, with ``moe_key >= 0``, the MoE layers' time from the
    registered step model (:func:`~straggler.sim.engine.deployment.engine_moe_seconds`, called in
    object mode with the ranks' running requests and the clock). One layer, ``att_c = 0``,
    no context cost and no MoE term give ``t0 + kappa * max_g L_g`` exactly.
    """
    if cfg.deploy:
        worst = 0.0
        for g in range(cfg.n_replicas):
            att = cfg.t0 + cfg.kappa * load[g] + cfg.att_c * nrun[g]
            if cfg.ctx_cost > 0.0:
                att += cfg.ctx_cost * ctx[g]
            if att > worst:
                worst = att
        dt = cfg.n_layers * worst + cfg.fixed_s
        if cfg.moe_key >= 0:
            dt += _moe_seconds(cfg.moe_key, load, nrun, clock)
        return dt
    M = 0
    for g in range(cfg.n_replicas):
        if load[g] > M:
            M = load[g]
    dt = cfg.t0 + cfg.kappa * M
    if cfg.ctx_cost > 0.0:  # aggregated serving: the slowest rank's decode + context
        worst = 0.0
        for g in range(cfg.n_replicas):
            step_g = cfg.kappa * load[g] + cfg.ctx_cost * ctx[g]
            if step_g > worst:
                worst = step_g
        dt = cfg.t0 + worst
    return dt


def step_time_reference(st, inp):
    """Reference of :func:`step_time`, from the loads recomputed from the slots."""
    G = st.G
    L = _loads_reference(st)
    dt = inp.t0 + inp.kappa * max(L)
    if inp.ctx_cost > 0.0:
        dt = inp.t0 + max(inp.kappa * L[g] + inp.ctx_cost * st.ctx[g] for g in range(G))
    if inp.deploy:  # the deployment step: attention per layer, barrier, MoE layers
        worst = 0.0
        for g in range(G):
            att = inp.t0 + inp.kappa * L[g] + inp.att_c * _running_reference(st, g)
            if inp.ctx_cost > 0.0:
                att += inp.ctx_cost * st.ctx[g]
            worst = max(worst, att)
        dt = inp.n_layers * worst + inp.fixed_s
        if inp.moe_key >= 0:
            nrun = np.array([_running_reference(st, g) for g in range(G)], dtype=np.int64)
            L = np.array(L, dtype=np.int64)
            dt += engine_moe_seconds(inp.moe_key, L, nrun, st.clock)
    return dt


@njit(**NJIT_BORROW)
def _record(cfg, c, clock, rep, series, dt, n_preempted):
    """Phase 8: the step's row of ``series`` (:data:`SERIES`; the loop grows it first,
    :func:`_grown_rows`)."""
    _, load, nrun, _, ctx, ctx_n = rep
    G, k = cfg.n_replicas, c[_K]
    M = 0
    tot = 0
    cmax = 0
    pmax = 0
    psum = 0
    for g in range(G):
        tot += load[g]
        if load[g] > M:
            M = load[g]
        proc = ctx[g] + nrun[g] - ctx_n[g]  # prompt tokens + one per generating one
        psum += proc
        if proc > pmax:
            pmax = proc
        if ctx[g] > cmax:
            cmax = ctx[g]
    series[k, 0] = clock[0]
    series[k, 1] = dt
    series[k, 2] = M
    series[k, 3] = tot
    series[k, 4] = c[_RUN]
    series[k, 5] = c[_POOL_N] + c[_QUEUED]
    series[k, 6] = c[_HEAP_N]
    series[k, 7] = n_preempted
    series[k, 8] = cmax
    series[k, 9] = psum / G / pmax if pmax > 0 else 1.0


def _record_reference(st, dt, n_preempted):
    """Reference of :func:`_record`: the step's row of :data:`SERIES`."""
    G = st.G
    L = _loads_reference(st)
    running = [_running_reference(st, g) for g in range(G)]
    proc = [st.ctx[g] + running[g] - st.ctx_n[g] for g in range(G)]
    balance = sum(proc) / G / max(proc) if max(proc) > 0 else 1.0
    waiting = len(st.pool) + sum(len(q) for q in st.engine_queue)
    st.series.append(
        [st.clock, dt, max(L), sum(L), sum(running), waiting, len(st.queue), n_preempted,
         max(st.ctx), balance]
    )  # fmt: skip


@njit(**NJIT_JITTED)
def _grown(x):
    """A copy of the 1-d ``x`` with twice its length (the entries beyond ``x``'s
    uninitialized; copied element by element: no broadcasting, and its compile)."""
    out = np.empty(2 * x.shape[0], dtype=x.dtype)
    for i in range(x.shape[0]):
        out[i] = x[i]
    return out


@njit(**NJIT_JITTED)
def _grown_rows(x):
    """A copy of the 2-d ``x`` with twice its rows (as :func:`_grown_rows`)."""
    out = np.empty((2 * x.shape[0], x.shape[1]), dtype=x.dtype)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[i, j] = x[i, j]
    return out


@njit(**NJIT_BORROW)
def _decode(cfg, c, rep, prompt, output, group, decoded, first_t, finish_t, memo, t_end):
    """Phase 9: every running request gains one token; one that reaches its output length
    leaves at ``t_end`` (and its group's exact-match memo learns its length)."""
    slot_req, load, nrun, ptok, _, _ = rep
    for g in range(cfg.n_replicas):
        for s in range(cfg.max_slots):
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
                c[_RUN] -= 1
                if group[i] >= 0:
                    memo[group[i]] = output[i]


def _decode_reference(st, t_end):
    """Reference of :func:`_decode`."""
    for g in range(st.G):
        for s, i in enumerate(st.slots[g]):
            if i is None:
                continue
            st.decoded[i] += 1
            if st.decoded[i] == 1:
                st.first_t[i] = t_end
            if st.decoded[i] == st.output[i]:
                st.finish_t[i] = t_end
                st.slots[g][s] = None
                if st.group[i] >= 0:
                    st.memo[st.group[i]] = st.output[i]


@njit(**NJIT)
def run_engine(kernel, inp):
    """Run the step loop on :class:`EngineInputs` with the routing policy's kernel ``kernel``
    (the address of its compiled code for :func:`tick_signature`, called through
    :func:`~straggler.solvers.routing._core.call_policy`: the loop compiles once for every
    policy; see :func:`engine_entry`); see the module docstring. Returns
    :class:`EngineOutput`.

    One iteration is one decode step, as the phases above in order: arrivals, prefill to
    pool, (idle: jump to the next event), preemption, snapshot, (projection), routing tick
    (:func:`_tick_state`, the kernel, :func:`_apply_tick`), queue admission, prefix caches,
    :func:`step_time`, record, decode.

    Each phase is handed the arrays it uses (bound once, before the loop, alone or in small
    tuples) and the scalars in :class:`_Cfg`. The per-step phases are compiled without
    reference counting (``NJIT_BORROW``) and allocate nothing; what allocates (the
    kernel's assignment, a log that grows, the prefix caches) happens here or in a phase
    that counts references."""
    # one binding per line: a tuple on the right of a multiple assignment (four names or
    # more) is built and unpacked in the compiled code
    st = _new_state(inp)
    cfg = _cfg(inp)
    c, clock = st.cnt, st.clock
    rep, pq, queues = st.rep, st.pq, st.queues
    ring, adm, cache_hit = st.ring, st.adm, st.cache_hit
    decoded, pool, memo = st.decoded, st.pool, st.memo
    ready_t, first_t, finish_t = st.ready_t, st.first_t, st.finish_t
    n_pre, enter_tick = st.n_pre, st.enter_tick
    arrival_t, prompt, output = inp.arrival_t, inp.prompt, inp.output
    group, room = inp.group, inp.room
    slot_req, load = rep[0], rep[1]
    nrun, ctx = rep[2], rep[4]
    ht, view_ring = pq[1], ring[0]
    adm_seq, pool_wait, enter_t = adm[3], adm[4], adm[5]
    in_pool, adm_i, adm_g = adm[6], adm[7], adm[8]
    cache_d, c_hp, c_sz = st.cache
    cache = (cache_d, c_hp, c_sz, inp.blk_off, inp.blk_ids)
    pred = (prompt, output, group, inp.surv_p, inp.surv_mu)
    tick_in, tick_view, options = st.tick_in, st.tick_view, inp.options
    series = np.empty((1024, len(SERIES)))
    tick_ns = np.empty(1024, dtype=np.int64)
    tick_pool = np.empty(1024, dtype=np.int64)
    touch = (np.empty(1024, np.int64), np.empty(1024, np.int64), np.empty(1024, np.int64))
    carry = inp.carry
    two_stage = (inp.ts_fold, inp.ts_knots, inp.ts_lin, inp.ts_iso, inp.ts_nb)
    max_steps, tick = inp.max_steps, inp.tick
    while c[_K] < max_steps:
        _arrivals(cfg, arrival_t, prompt, c, clock, pq)
        _prefill_to_pool(c, clock, pq, pool, ready_t, enter_t, enter_tick, in_pool)
        if c[_RUN] == 0 and c[_POOL_N] == 0 and c[_QUEUED] == 0:  # idle: next event
            t_next = _next_event(arrival_t, c, ht)
            if t_next == np.inf:
                break
            clock[0] = max(clock[0], t_next)
            continue
        n_preempted = _preempt(cfg, c, clock, rep, pq, prompt, decoded, adm_seq, n_pre)
        slot = _snapshot(cfg, c, rep, queues, ring)
        if cfg.pred_kind > 0:
            _project(cfg, c, pred, slot_req, pool, decoded, memo, view_ring, slot, two_stage)
        if c[_K] % tick == 0 and c[_POOL_N] > 0:  # phase 6: a routing tick
            P = _tick_state(
                cfg, c, prompt, room, decoded, pool, enter_tick, nrun, ring, tick_in, tick_view
            )
            if cfg.cache_router:
                _cached_view(cfg, cache, prompt, pool, P, tick_in.cached)
            pstate = PoolState(
                tick_in.prefill[:P], tick_in.wait[:P], tick_in.key[:P], tick_in.cached[:P]
            )
            seed = cfg.seed * 1_000_003 + c[_K]
            c0 = monotonic_ns() if cfg.time_router else 0
            assign, carry = call_policy(kernel, pstate, tick_view, options, carry, seed)
            c1 = monotonic_ns() if cfg.time_router else 0
            if c[_TICKS] == tick_ns.shape[0]:
                tick_ns, tick_pool = _grown(tick_ns), _grown(tick_pool)
            _apply_tick(cfg, c, clock, rep, adm, queues, ring, prompt, decoded, pool, assign, P,
                        c1 - c0, tick_ns, tick_pool)  # fmt: skip
        if cfg.queue_mode:
            _admit_queues(cfg, c, clock, rep, adm, queues, prompt, decoded)
        if cfg.use_cache and c[_ADM_N] > 0:
            touch = _cache_admissions(cfg, c, cache, cache_hit, ctx, prompt, adm_i, adm_g, touch)
        dt = step_time(cfg, load, nrun, ctx, clock[0])
        if c[_RUN] == 0 and dt <= 0.0:
            # nothing runs and steps cost nothing: wait for the next event instead
            t_next = _next_event(arrival_t, c, ht)
            if t_next == np.inf:
                break
            dt = max(t_next - clock[0], 0.0)
        if c[_K] == series.shape[0]:
            series = _grown_rows(series)
        _record(cfg, c, clock, rep, series, dt, n_preempted)
        t_end = clock[0] + dt
        _decode(cfg, c, rep, prompt, output, group, decoded, first_t, finish_t, memo, t_end)
        clock[0] = t_end
        c[_K] += 1
    for i in range(arrival_t.shape[0]):  # requests still waiting at the end
        if in_pool[i]:
            pool_wait[i] += clock[0] - enter_t[i]
    k, n_ticks = c[_K], c[_TICKS]
    return EngineOutput(
        ready_t,
        adm[1],
        first_t,
        finish_t,
        adm[0],
        n_pre,
        pool_wait,
        enter_tick,
        adm[2],
        series[:k].copy(),
        tick_ns[:n_ticks].copy(),
        tick_pool[:n_ticks].copy(),
        np.maximum(cache_hit, 0.0),
    )


def run_engine_reference(inp, router):
    """Plain-Python step loop written from the model in the module docstring: the phases of
    :func:`run_engine` in the same order, each a ``*_reference`` twin written beside its
    kernel phase, on a :class:`_ReferenceState`.

    ``router`` is the policy's plain-Python reference (the registry's ``reference``). Running
    requests are kept per replica in a slot list and the loads recomputed from them; the
    prefill instances are a list of free times, the prefill queue a list scanned for its
    earliest ``(done, order)``. Tick times are 0.
    """
    st = _ReferenceState(inp)
    G = inp.n_replicas
    while st.k < inp.max_steps:
        _arrivals_reference(st, inp)
        _prefill_to_pool_reference(st)
        idle = all(_running_reference(st, g) == 0 for g in range(G))
        if idle and not st.pool and not any(st.engine_queue):  # idle: next event
            t = _next_event_reference(st, inp)
            if t is None:
                break
            st.clock = max(st.clock, t)
            continue
        n_preempted = _preempt_reference(st, inp)
        _snapshot_reference(st, inp)
        if inp.pred_kind > 0:
            _project_reference(st, inp)
        if st.k % inp.tick == 0 and st.pool:  # phase 6: a routing tick
            P, (prefill, wait, key), reps = _tick_state_reference(st, inp)
            cached = _cached_view_reference(st, inp, P) if inp.cache_router else np.zeros((0, G))
            pool = PoolState(prefill, wait, key, cached)
            seed = inp.seed * 1_000_003 + st.k
            assign, st.carry = router(pool, reps, inp.options, st.carry, seed)
            _apply_tick_reference(st, inp, assign, P)
        if inp.queue_mode:
            _admit_queues_reference(st, inp)
        if inp.use_cache and st.admitted:
            _cache_admissions_reference(st, inp)
        dt = step_time_reference(st, inp)
        if all(_running_reference(st, g) == 0 for g in range(G)) and dt <= 0.0:
            t = _next_event_reference(st, inp)  # steps cost nothing: wait for the next event
            if t is None:
                break
            dt = max(t - st.clock, 0.0)
        _record_reference(st, dt, n_preempted)
        t_end = st.clock + dt
        _decode_reference(st, t_end)
        st.clock = t_end
        st.k += 1
    for i in st.pool + [i for q in st.engine_queue for i in q]:  # still waiting at the end
        st.pool_wait[i] += st.clock - st.enter_t[i]
    n = st.n
    return EngineOutput(
        np.array(st.ready_t),
        np.array(st.start_t),
        np.array(st.first_t),
        np.array(st.finish_t),
        np.array(st.replica, dtype=np.int64),
        np.array(st.n_pre, dtype=np.int64),
        np.array(st.pool_wait),
        np.array(
            [st.enter_tick[i] if st.ready_t[i] == st.ready_t[i] else -1 for i in range(n)],
            dtype=np.int64,
        ),
        np.array(st.admit_tick, dtype=np.int64),
        np.array(st.series, dtype=float).reshape(-1, len(SERIES)),
        np.zeros(len(st.tick_pool), dtype=np.int64),
        np.array(st.tick_pool, dtype=np.int64),
        np.array([0.0 if h is None else h for h in st.hits]),
    )


def engine_depends() -> tuple:
    """The modules whose source the compiled engine includes besides its own (the option sets
    of :mod:`~straggler.solvers._numba.jit`, the call by address of
    :mod:`~straggler.solvers._numba.address`, the router clock of
    :mod:`~straggler.solvers._numba.clock`, the routing records of
    :mod:`~straggler.solvers.routing._core`, the predictors' constants): :func:`run_engine`'s
    disk cache is tied to them. The policy's kernel is not
    among them: the engine calls it by the address of its code, and the kernel has its own
    cache."""
    from ...solvers._numba import address as _address
    from ...solvers._numba import clock as _clock
    from ...solvers._numba import jit as _jit
    from ...solvers.routing import _core as _routing_core

    return (_jit, _address, _clock, _routing_core, predictors)


def tick_signature(inp):
    """The argument types ``(PoolState, ReplicaState, RouterOptions, carry, int64)``
    with which :func:`run_engine` calls a policy's kernel on :class:`EngineInputs` ``inp``
    (the arrays the loop builds at each tick: C-contiguous, float64 tokens, int64 counts)."""
    f1, i1, f2 = np.zeros(1), np.zeros(1, np.int64), np.zeros((1, 1))
    pool = PoolState(f1, i1, i1, f2)
    reps = ReplicaState(f2, i1, i1, i1, f1, f1, f1, f1)
    return (typeof(pool), typeof(reps), typeof(inp.options), typeof(inp.carry), types.int64)


def engine_entry(policy, inp):
    """:func:`run_engine` with the kernel of ``policy`` (a
    :class:`~straggler.solvers.routing.registry.RoutingPolicy`), as a callable of ``inp`` alone.

    The step loop is compiled once for every policy: it takes the address of the kernel's
    code compiled for :func:`tick_signature`
    (:func:`~straggler.solvers.routing._core.policy_address`, which refuses, naming
    ``simulate``, a kernel that is not ``@njit`` or returns another type), so a policy adds
    only its own kernel's compile, which ``route_batch`` shares. Both are loaded from numba's
    disk cache when there (the loop's cache is tied to :func:`engine_depends`). With
    ``NUMBA_DISABLE_JIT=1``, the Python loop with the kernel's Python function.
    """
    from ...solvers._numba.jit import cache_depends_on

    addr = policy_address(policy.kernel, policy.name, tick_signature(inp), "simulate")
    if not hasattr(run_engine, "compile"):  # NUMBA_DISABLE_JIT=1
        return lambda inp: run_engine(addr, inp)
    cache_depends_on(run_engine, *engine_depends())
    entry = run_engine.compile((types.int64, typeof(inp)))
    return lambda inp: entry(addr, inp)
