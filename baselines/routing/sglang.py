"""SGLang's DP routers: the data-parallel controller's ``round_robin``, ``total_tokens``
(``jsq``), ``total_requests`` (``jsq_requests``) and ``follow_bootstrap_room`` schedulers, and
the model gateway's power of two choices (``p2c``), each Numba kernel with its plain-Python
reference below it (signature: :mod:`straggler.solvers.routing._core`).

Upstream: ``sgl-project/sglang python/sglang/srt/managers/data_parallel_controller.py``
(``round_robin_scheduler``, ``DPBudget.dispatch``, ``follow_bootstrap_room_scheduler``) and
the gateway's ``sgl-router/src/policies/power_of_two.rs`` (now ``smg-project/smg
model_gateway/src/policies/power_of_two.rs``); each policy's versions name the upstream
change behind them (``RoutingPolicy.versions`` / ``version_sources``).

As read in the upstream code (the first version listed is the default, ``version=...``
selects another):

``round_robin``
    SGLang ``python/sglang/srt/managers/data_parallel_controller.py``,
    ``round_robin_scheduler``: a counter over the workers. Here the cycle skips replicas
    without a free slot (the central-pool model), starting from ``cursor``. Not the dispatch
    method ``round_robin`` (TEMPO's A3, :mod:`straggler.solvers.dispatch.round_robin`, whose kernel
    is
    ``a3_kernel``): the two share the upstream word, each in its own namespace (``policy=``
    of ``route_batch``, ``method=`` of ``solve_dispatch``).
``jsq``
    SGLang DP controller ``total_tokens`` (``DPBudget.dispatch``): the first minimum of
    ``(num_total_tokens, total_requests)`` where ``num_total_tokens`` is KV in use plus the
    waiting queue's lengths (``loads + waiting_tokens``) and ``total_requests`` running +
    waiting. ``"prompt"`` (sglang #22614, 2026-04): after a pick the rank's tokens grow by the
    prompt length and its requests by 1; ``"plus_one"`` (#16258, 2026-01, which renamed
    ``minimum_tokens`` to ``total_tokens``): requests only, so a burst between two load reports
    lands on one rank. Not modelled: the pending-dispatch re-add after a refresh (the
    simulator's ``stale`` with the optimistic update plays its part).
``jsq_requests``
    SGLang ``total_requests`` (#16258, formerly ``shortest_queue``): first minimum of running
    + waiting, +1 after a pick. The older ``shortest_queue`` budget queue is not modelled.
``p2c``
    The SGLang model gateway's ``power_of_two`` (``sgl-router/src/policies/power_of_two.rs``,
    now ``smg-project/smg model_gateway/src/policies``): two distinct workers (``a`` uniform,
    ``b = (a + 1 + u) % k``), ``b`` only when strictly lighter. ``"expected_wait"`` (smg #2187,
    2026-08-18): ``(queued tokens + tokens sent since the poll) / throughput + 0.15 s *
    u / (1 - u)`` with ``u`` the KV usage (``throughput`` 2000 tok/s, upstream's fallback when
    the engine reports none; ``kv_weight`` 0.15 s); ``"token_usage"`` (smg #554, 2026-02-27):
    the polled KV usage ratio; ``"tokens"`` (the sgl-router load monitor, 2025): the worker's
    token load; ``"inflight"`` (the first sgl-router policy): the router's in-flight requests.
    Only the versions whose upstream credits its own dispatches between polls (expected_wait,
    inflight) update their metric within a tick.
``follow_bootstrap_room``
    SGLang ``follow_bootstrap_room_scheduler`` (PD disaggregation): rank = ``bootstrap_room %
    dp_size`` (``pool_key``), whatever the load; a request whose rank is full waits for it.
    The simulator draws each request's room uniformly from ``[0, 2**63)`` (SGLang's mini_lb
    draws ``random.randint(0, 2**63 - 1)``), seeded by ``simulate(seed=)``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from ...formulations.validation import check_int, check_real
from ...solvers._numba.jit import NJIT, cache_depends_on
from ...solvers.routing import _core as _routing_core
from ...solvers.routing._core import (
    MINSTD_A,
    MINSTD_M,
    PolicyOption,
    carry_slots,
    draw_eligible,
    least_tokens_kernel,
    least_tokens_reference,
    minstd_next,
    minstd_start,
    option_slots,
    with_carry,
)
from ...solvers.routing.policy import OPTIMISTIC, routing_policy

__all__ = [
    "ROUND_ROBIN",
    "JSQ",
    "JSQ_REQUESTS",
    "P2C",
    "FOLLOW_BOOTSTRAP_ROOM",
    "RoundRobinCarry",
    "round_robin_kernel",
    "round_robin_reference",
    "jsq_kernel",
    "jsq_reference",
    "jsq_requests_kernel",
    "jsq_requests_reference",
    "p2c_kernel",
    "p2c_reference",
    "follow_bootstrap_room_kernel",
    "follow_bootstrap_room_reference",
]

# --------------------------------------------------------------------------------------------
# The policies' own options and memory (jsq and jsq_requests: optimistic and versions only)
# --------------------------------------------------------------------------------------------


class RoundRobinCarry(NamedTuple):
    """round_robin's memory from one tick to the next (its option ``cursor`` sets the
    first)."""

    cursor: int
    """The replica to try first."""


CURSOR = PolicyOption(
    "cursor", lambda v, f: check_int(v, "cursor", f, lo=0, hi=2**52), 0,
    "round-robin: the replica to try first", to="carry",
)  # fmt: skip
P2C_OPTIONS = (
    OPTIMISTIC,
    PolicyOption(
        "kv_weight",
        lambda v, f: check_real(v, "kv_weight", f, lo=0),
        0.15,
        "p2c expected_wait: seconds of the KV barrier u/(1-u) (the gateway's 0.15)",
    ),  # fmt: skip
    PolicyOption(
        "throughput",
        lambda v, f: check_real(v, "throughput", f, lo=0, lo_open=True),
        2000.0,
        "p2c expected_wait: tokens/s that turn queued tokens into seconds (gateway: 2000)",
    ),  # fmt: skip
)
_RRC = carry_slots(RoundRobinCarry)
_P2C = option_slots(P2C_OPTIONS)

# --------------------------------------------------------------------------------------------
# Round-robin: next replica with a free slot in cyclic order from the cursor
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def round_robin_kernel(pool, reps, opts, carry, seed):
    """Round-robin from the cursor (its memory's ``cursor``); the returned cursor is the last
    replica used + 1 (mod G), unchanged when nothing is placed."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = free_slots.shape[0]
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    cur = carry[_RRC.cursor] % G
    for i in range(n):
        g = -1
        for t in range(G):
            j = (cur + t) % G
            if cap[j] > 0:
                g = j
                break
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        cur = (g + 1) % G
    return out, with_carry(carry, _RRC.cursor, cur)


def round_robin_reference(pool, reps, opts, carry, seed):
    """Round-robin in plain Python."""
    G = len(reps.free_slots)
    cap = [int(c) for c in reps.free_slots]
    cur = int(carry[_RRC.cursor]) % G
    out = []
    for _ in range(len(pool.prefill)):
        order = [(cur + t) % G for t in range(G)]
        free = [j for j in order if cap[j] > 0]
        if not free:
            out.append(-1)
            continue
        out.append(free[0])
        cap[free[0]] -= 1
        cur = (free[0] + 1) % G
    if cur != carry[_RRC.cursor]:  # a fresh copy: the input is never changed
        carry = carry.copy()
        carry[_RRC.cursor] = cur
    return np.array(out, dtype=np.int64), carry


# --------------------------------------------------------------------------------------------
# JSQ by tokens (SGLang total_tokens): fewest tokens, then fewest requests, then lowest index
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def jsq_kernel(pool, reps, opts, carry, seed):
    """SGLang's ``total_tokens``: fewest ``loads + waiting_tokens`` (its ``num_total_tokens``:
    KV in use plus the waiting queue's lengths), then fewest ``running + waiting``, then lowest
    index (:func:`~straggler.solvers.routing._core.least_tokens_kernel`). Optimistic update:
    version 0 (``prompt``) ``tokens += s, requests += 1``; version 1 (``plus_one``)
    ``requests += 1`` only."""
    return least_tokens_kernel(pool, reps, opts.optimistic, opts.version == 0), carry


def jsq_reference(pool, reps, opts, carry, seed):
    """JSQ by tokens in plain Python (``prompt`` since SGLang #22614; before it the tokens
    stayed put)."""
    return least_tokens_reference(pool, reps, opts.optimistic, int(opts.version) == 0), carry


# --------------------------------------------------------------------------------------------
# JSQ by requests (SGLang total_requests): fewest requests, then lowest index
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def jsq_requests_kernel(pool, reps, opts, carry, seed):
    """Fewest requests (running + waiting), ties to the lowest index; optimistic: +1."""
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    n_running = reps.n_running
    n_waiting = reps.n_waiting
    n = prefill.shape[0]
    G = loads.shape[0]
    optimistic = opts.optimistic
    req = n_running + n_waiting
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    for i in range(n):
        g = -1
        for j in range(G):
            if cap[j] > 0 and (g < 0 or req[j] < req[g]):
                g = j
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        if optimistic:
            req[g] += 1
    return out, carry


def jsq_requests_reference(pool, reps, opts, carry, seed):
    """JSQ by requests in plain Python."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n_running = reps.n_running
    n_waiting = reps.n_waiting
    req = [int(a) + int(b) for a, b in zip(n_running, n_waiting)]
    cap = [int(c) for c in free_slots]
    optimistic = opts.optimistic
    out = [-1] * len(prefill)
    for i in range(len(prefill)):
        elig = [j for j in range(len(cap)) if cap[j] > 0]
        if not elig:
            break
        g = min(elig, key=lambda j: (req[j], j))
        out[i] = g
        cap[g] -= 1
        if optimistic:
            req[g] += 1
    return np.array(out, dtype=np.int64), carry


# --------------------------------------------------------------------------------------------
# Power of two choices (the SGLang gateway, four versions of its metric)
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def _p2c_metric(reps, j, version, credit, reqs, thr, lam):
    """Replica ``j``'s load under the gateway version ``version`` (see :func:`p2c_kernel`)."""
    if version == 0:
        u = min(max(reps.kv_usage[j], 0.0), 0.999)
        return (reps.waiting_tokens[j] + credit[j]) / thr + lam * u / (1.0 - u)
    if version == 1:
        return reps.kv_usage[j]
    if version == 2:
        return reps.loads[j, 0] + reps.waiting_tokens[j]
    return float(reqs[j])


@njit(**NJIT)
def p2c_kernel(pool, reps, opts, carry, seed):
    """Two distinct replicas ``a`` (uniform) and ``b = (a + 1 + u) % k`` (``u`` uniform below
    ``k - 1``) among the ``k`` eligible; ``b`` wins only with a strictly lower metric. Metric by
    version: 0 ``expected_wait`` ``(waiting_tokens + credit) / throughput + kv_weight * u/(1-u)``
    (``u`` = KV usage clipped to [0, 0.999], ``credit`` = tokens placed on the replica this
    tick when optimistic); 1 ``token_usage`` (KV usage, no update); 2 ``tokens`` (``loads +
    waiting_tokens``, no update); 3 ``inflight`` (``running + waiting``, ``+1`` per pick)."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = free_slots.shape[0]
    optimistic = opts.optimistic
    version = int(opts.version)
    thr = opts.values[_P2C.throughput]
    lam = opts.values[_P2C.kv_weight]
    credit = np.zeros(G)
    reqs = reps.n_running + reps.n_waiting
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    x = minstd_start(seed)
    elig = np.empty(G, np.int64)
    for i in range(n):
        # no draw when one replica is eligible (int64, not a literal: one compile with random)
        k, x, a = draw_eligible(cap, elig, x, np.int64(2))
        if k == 0:
            break
        if k == 1:
            g = elig[0]
        else:
            x = minstd_next(x)
            b = (a + 1 + x % (k - 1)) % k
            ma = _p2c_metric(reps, elig[a], version, credit, reqs, thr, lam)
            mb = _p2c_metric(reps, elig[b], version, credit, reqs, thr, lam)
            g = elig[a] if ma <= mb else elig[b]
        out[i] = g
        cap[g] -= 1
        if version == 3:
            reqs[g] += 1
        elif version == 0 and optimistic:
            credit[g] += prefill[i]
    return out, carry


def p2c_reference(pool, reps, opts, carry, seed):
    """Power of two choices in plain Python (the same MINSTD stream)."""
    G = len(reps.free_slots)
    cap = [int(c) for c in reps.free_slots]
    optimistic = opts.optimistic
    version = int(opts.version)
    thr, lam = float(opts.values[_P2C.throughput]), float(opts.values[_P2C.kv_weight])
    credit = [0.0] * G
    reqs = [int(r) + int(w) for r, w in zip(reps.n_running, reps.n_waiting)]

    def metric(j):
        if version == 0:  # smg #2187: least_load's expected wait on the sampled pair
            u = min(max(float(reps.kv_usage[j]), 0.0), 0.999)
            return (float(reps.waiting_tokens[j]) + credit[j]) / thr + lam * u / (1.0 - u)
        if version == 1:  # mean KV token_usage of the poll
            return float(reps.kv_usage[j])
        if version == 2:  # the load monitor's cached token load
            return float(reps.loads[j][0]) + float(reps.waiting_tokens[j])
        return float(reqs[j])  # the router's own in-flight requests

    x = int(seed) % (MINSTD_M - 1) + 1
    out = [-1] * len(pool.prefill)
    for i in range(len(pool.prefill)):
        elig = [j for j in range(G) if cap[j] > 0]
        if not elig:
            break
        if len(elig) == 1:
            g = elig[0]
        else:
            x = (MINSTD_A * x) % MINSTD_M
            a = x % len(elig)
            x = (MINSTD_A * x) % MINSTD_M
            b = (a + 1 + x % (len(elig) - 1)) % len(elig)
            g = elig[a] if metric(elig[a]) <= metric(elig[b]) else elig[b]
        out[i] = g
        cap[g] -= 1
        if version == 3:
            reqs[g] += 1
        elif version == 0 and optimistic:
            credit[g] += float(pool.prefill[i])
    return np.array(out, dtype=np.int64), carry


# --------------------------------------------------------------------------------------------
# SGLang follow_bootstrap_room: rank = bootstrap_room % G, whatever the load
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def follow_bootstrap_room_kernel(pool, reps, opts, carry, seed):
    """Request ``i`` goes to replica ``key[i] % G`` when it has a free slot, else stays in the
    pool (it has no other rank: it waits for a slot on its own)."""
    key = pool.key
    n = key.shape[0]
    G = reps.free_slots.shape[0]
    cap = reps.free_slots.copy()
    out = np.full(n, -1, np.int64)
    for i in range(n):
        g = key[i] % G
        if cap[g] > 0:
            out[i] = g
            cap[g] -= 1
    return out, carry


def follow_bootstrap_room_reference(pool, reps, opts, carry, seed):
    """``follow_bootstrap_room`` in plain Python."""
    G = len(reps.free_slots)
    cap = [int(c) for c in reps.free_slots]
    out = []
    for room in pool.key:
        g = int(room) % G  # SGLang: target_rank = req.bootstrap_room % len(self.workers)
        if cap[g] > 0:
            out.append(g)
            cap[g] -= 1
        else:
            out.append(-1)
    return np.array(out, dtype=np.int64), carry


# the option and carry slots come from _core's option_slots/carry_slots
cache_depends_on(round_robin_kernel, _routing_core)
cache_depends_on(jsq_kernel, _routing_core)
cache_depends_on(p2c_kernel, _routing_core)

_SGL_DPC = "sgl-project/sglang python/sglang/srt/managers/data_parallel_controller.py"
_SGL_GW = (
    "SGLang model gateway power_of_two (sgl-project/sglang sgl-router/src/policies/"
    "power_of_two.rs, now smg-project/smg model_gateway/src/policies/power_of_two.rs)"
)
ROUND_ROBIN = routing_policy(
    "round_robin",
    kernel=round_robin_kernel,
    reference=round_robin_reference,
    options=(CURSOR,),
    carry=RoundRobinCarry,
    summary="next replica with a free slot in cyclic order from a cursor",
    source=f"{_SGL_DPC} round_robin_scheduler",
)
JSQ = routing_policy(
    "jsq",
    kernel=jsq_kernel,
    reference=jsq_reference,
    summary="fewest loads + waiting tokens, then fewest requests, then lowest index",
    source=f"{_SGL_DPC} total_tokens (DPBudget.dispatch)",
    versions=(
        ("prompt", "sglang #22614 (2026-04): +prompt length and +1 request after each pick"),
        ("plus_one", "sglang #16258 (2026-01, minimum_tokens renamed total_tokens): +1 only"),
    ),
)
JSQ_REQUESTS = routing_policy(
    "jsq_requests",
    kernel=jsq_requests_kernel,
    reference=jsq_requests_reference,
    summary="fewest running + waiting requests, then lowest index; +1 after each pick",
    source=f"{_SGL_DPC} total_requests (sglang #16258, 2026-01: shortest_queue renamed)",
)
P2C = routing_policy(
    "p2c",
    kernel=p2c_kernel,
    reference=p2c_reference,
    options=P2C_OPTIONS,
    summary="two distinct random replicas, the lower gateway metric wins, ties to the first",
    source=_SGL_GW,
    seeded=True,
    versions=(
        (
            "expected_wait",
            "smg #2187 (2026-08-18): (queued + in-flight tokens) / throughput + 0.15 s * "
            "u/(1-u), least_load's score on the sampled pair",
        ),
        ("token_usage", "smg #554 (2026-02-27): the poll's KV token_usage ratio"),
        ("tokens", "sgl-router load monitor (2025, sglang #10880): the worker's token load"),
        ("inflight", "sgl-router's first power_of_two: the router's in-flight requests"),
    ),
)
FOLLOW_BOOTSTRAP_ROOM = routing_policy(
    "follow_bootstrap_room",
    kernel=follow_bootstrap_room_kernel,
    reference=follow_bootstrap_room_reference,
    options=(),
    summary="replica = bootstrap room (the pool key) mod G, waiting for a slot there",
    source=f"{_SGL_DPC} follow_bootstrap_room_scheduler (PD disaggregation)",
)
