"""vLLM's DP load balancer (``DPLBAsyncMPClient.get_core_engine_for_request``, four
versions), its Numba kernel with the plain-Python reference below it (signature:
:mod:`straggler.solvers.routing._core`).

Upstream: ``vllm-project/vllm vllm/v1/engine/core_client.py``; the versions and the change
behind each: ``RoutingPolicy.versions`` / ``version_sources`` of :data:`VLLM`.

As read in the upstream code (the first version listed is the default, ``version=...``
selects another):

``vllm``
    vLLM ``vllm/v1/engine/core_client.py``, ``DPLBAsyncMPClient.get_core_engine_for_request``:
    the first strict minimum scanning from ``eng_start_index``, then ``waiting +=
    client_count`` (one front-end: +1). ``"current"``: the start rotates after every pick
    (#47420, 2026-07-02) and the score is ``max(client_count * inflight, waiting + running) +
    waiting * 6 * max(0, kv_usage - 0.5)`` (#49204, 2026-07-20); ``"rotate_4w"``: #47420
    alone (``4 * waiting + running``, rotating start); ``"legacy"``: ``4 * waiting +
    running`` from the fixed start 0. The front-end's in-flight count is taken as the view's
    running + waiting plus this tick's picks (exact with ``stale = 0``; one front-end).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from ...formulations.validation import check_int
from ...solvers._numba.jit import NJIT, cache_depends_on
from ...solvers.routing import _core as _routing_core
from ...solvers.routing._core import (
    MINSTD_A,
    MINSTD_M,
    PolicyOption,
    carry_slots,
    draw_eligible,
    minstd_next,
    minstd_start,
    with_carry,
)
from ...solvers.routing.policy import OPTIMISTIC, routing_policy

__all__ = [
    "VLLM",
    "VLLM_P2C_FULL_SCAN_MAX",
    "VllmCarry",
    "vllm_kernel",
    "vllm_reference",
]

#: Version ``p2c``: the most engines still scanned in full (upstream
#: ``DPLBAsyncMPClient._P2C_FULL_SCAN_MAX_ENGINES``); above it, power of two choices.
VLLM_P2C_FULL_SCAN_MAX = 4

# --------------------------------------------------------------------------------------------
# vLLM DP load balancer (three versions): lowest score in cyclic order from a start index
# --------------------------------------------------------------------------------------------


class VllmCarry(NamedTuple):
    """vllm's memory from one tick to the next."""

    start: int
    """Where the next scan starts (upstream ``eng_start_index``)."""


_VC = carry_slots(VllmCarry)

START = PolicyOption(
    "start", lambda v, f: check_int(v, "start", f, lo=0, hi=2**52), 0,
    "vllm: the engine the first scan starts from, modulo G (upstream eng_start_index)",
    to="carry",
)  # fmt: skip


@njit(**NJIT)
def vllm_kernel(pool, reps, opts, carry, seed):
    """vLLM's ``get_core_engine_for_request``: the first strict minimum of the score scanning
    from the start index (the carry's ``start`` modulo ``G``); version 0 (``current``) scores
    ``max(inflight, waiting + running) + waiting * 6 * max(0, kv_usage - 0.5)`` and rotates
    the start after every pick; version 1 (``rotate_4w``) scores ``4 * waiting + running``
    and rotates; version 2 (``legacy``) scores ``4 * waiting + running`` from a fixed start;
    version 3 (``p2c``) is version 2 for ``G <= VLLM_P2C_FULL_SCAN_MAX`` and above it power
    of two choices among the replicas with a free slot (``k`` of them): ``a`` uniform below
    ``k``, ``u`` uniform below ``k - 1``, ``b = u + (u >= a)`` (two MINSTD steps of ``seed``
    per pick; one replica with a free slot is taken without a draw), ``a`` unless ``b``
    scores strictly lower. ``inflight`` (the front-end's own count, exact) = ``running +
    waiting`` of the view plus this tick's picks; the optimistic update is ``waiting += 1``."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n_running = reps.n_running
    n_waiting = reps.n_waiting
    kv = reps.kv_usage
    n = prefill.shape[0]
    G = free_slots.shape[0]
    optimistic = opts.optimistic
    version = int(opts.version)
    rotate = version < 2
    sample = version == 3 and G > VLLM_P2C_FULL_SCAN_MAX
    start = carry[_VC.start] % G
    waiting = n_waiting.copy()
    picks = np.full(G, 0, np.int64)
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    x = minstd_start(seed)
    elig = np.empty(G, np.int64)
    for i in range(n):
        g = -1
        if sample:
            k, x, a = draw_eligible(cap, elig, x, np.int64(2))
            if k == 1:
                g = elig[0]
            elif k > 1:
                x = minstd_next(x)
                u = x % (k - 1)
                ja = elig[a]
                jb = elig[u + 1] if u >= a else elig[u]
                sa = 4 * waiting[ja] + n_running[ja]
                sb = 4 * waiting[jb] + n_running[jb]
                g = ja if sa <= sb else jb
        else:
            best = np.inf
            for t in range(G):
                j = (start + t) % G
                if cap[j] <= 0:
                    continue
                if version == 0:
                    inflight = n_running[j] + n_waiting[j] + picks[j]
                    score = float(max(inflight, waiting[j] + n_running[j]))
                    if waiting[j] > 0:
                        score += waiting[j] * 6.0 * max(0.0, kv[j] - 0.5)
                else:
                    score = float(4 * waiting[j] + n_running[j])
                if score < best:
                    best = score
                    g = j
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        picks[g] += 1
        if optimistic:
            waiting[g] += 1
        if rotate:
            start = (start + 1) % G
    if not rotate:
        return out, carry
    return out, with_carry(carry, _VC.start, start)


def vllm_reference(pool, reps, opts, carry, seed):
    """vLLM's DP load balancer in plain Python (the scan and the two choices written out as
    upstream's loops, the draws from the same MINSTD stream as the kernel's)."""
    G = len(reps.free_slots)
    running = [int(r) for r in reps.n_running]
    waiting0 = [int(w) for w in reps.n_waiting]
    waiting = list(waiting0)
    kv = [float(u) for u in reps.kv_usage]
    cap = [int(c) for c in reps.free_slots]
    picks = [0] * G
    optimistic = opts.optimistic
    version = int(opts.version)
    start = int(carry[_VC.start]) % G
    x = int(seed) % (MINSTD_M - 1) + 1

    def randrange(m):  # one MINSTD step, then below m
        nonlocal x
        x = (MINSTD_A * x) % MINSTD_M
        return x % m

    out = [-1] * len(pool.prefill)
    for i in range(len(pool.prefill)):
        g = -1
        if version == 3 and G > VLLM_P2C_FULL_SCAN_MAX:  # vLLM #43279
            elig = [j for j in range(G) if cap[j] > 0]
            if len(elig) == 1:
                g = elig[0]
            elif elig:
                a = randrange(len(elig))
                b = randrange(len(elig) - 1)
                if b >= a:
                    b += 1
                sa = waiting[elig[a]] * 4 + running[elig[a]]
                sb = waiting[elig[b]] * 4 + running[elig[b]]
                g = elig[a] if sa <= sb else elig[b]
        else:
            best = float("inf")
            for t in range(G):
                j = (start + t) % G
                if cap[j] <= 0:
                    continue
                if version == 0:  # vLLM #49204
                    score = float(max(running[j] + waiting0[j] + picks[j], waiting[j] + running[j]))
                    if waiting[j]:
                        score += waiting[j] * 6.0 * max(0.0, kv[j] - 0.5)
                else:
                    score = float(waiting[j] * 4 + running[j])
                if score < best:
                    best, g = score, j
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        picks[g] += 1
        if optimistic:
            waiting[g] += 1
        if version < 2:  # vLLM #47420
            start = (start + 1) % G
    if version < 2 and start != carry[_VC.start]:  # a fresh copy: the input is never changed
        carry = carry.copy()
        carry[_VC.start] = start
    return np.array(out, dtype=np.int64), carry


cache_depends_on(vllm_kernel, _routing_core)  # the carry slots come from _core's carry_slots


VLLM = routing_policy(
    "vllm",
    kernel=vllm_kernel,
    reference=vllm_reference,
    options=(OPTIMISTIC, START),
    carry=VllmCarry,
    seeded=True,
    summary=(
        "first strict minimum of vLLM's score scanning from a start index (or the better of "
        "two drawn engines above 4, version p2c); waiting += 1"
    ),
    source="vllm-project/vllm vllm/v1/engine/core_client.py (DPLBAsyncMPClient)",
    versions=(
        (
            "current",
            "vllm #47420 (2026-07-02, start rotates after every pick) + #49204 (2026-07-20, "
            "max(inflight, waiting + running) + 6*waiting*max(0, kv_usage - 0.5))",
        ),
        ("rotate_4w", "vllm #47420 alone: 4*waiting + running, rotating start"),
        ("legacy", "before vllm #47420: 4*waiting + running from a fixed start"),
        (
            "p2c",
            "vllm #43279 (opened 2026-05-21; test_dplb_engine_selection.py): legacy's scan up "
            "to 4 engines, above it the better of two distinct engines drawn uniformly",
        ),
    ),
)
