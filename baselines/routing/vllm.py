"""vLLM's DP load balancer (``DPLBAsyncMPClient.get_core_engine_for_request``, three
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

from ...solvers._numba.jit import NJIT, cache_depends_on
from ...solvers.routing import _core as _routing_core
from ...solvers.routing._core import carry_slots, with_carry
from ...solvers.routing.registry import routing_policy

__all__ = [
    "VLLM",
    "VllmCarry",
    "vllm_kernel",
    "vllm_reference",
]

# --------------------------------------------------------------------------------------------
# vLLM DP load balancer (three versions): lowest score in cyclic order from a start index
# --------------------------------------------------------------------------------------------


class VllmCarry(NamedTuple):
    """vllm's memory from one tick to the next."""

    start: int
    """Where the next scan starts (upstream ``eng_start_index``)."""


_VC = carry_slots(VllmCarry)


@njit(**NJIT)
def vllm_kernel(pool, reps, opts, carry, seed):
    """vLLM's ``get_core_engine_for_request``: the first strict minimum of the score scanning
    from the start index; version 0 (``current``) scores ``max(inflight, waiting + running) +
    waiting * 6 * max(0, kv_usage - 0.5)`` and rotates the start after every pick; version 1
    (``rotate_4w``) scores ``4 * waiting + running`` and rotates; version 2 (``legacy``)
    scores ``4 * waiting + running`` from a fixed start 0. ``inflight`` (the front-end's own
    count, exact) = ``running + waiting`` of the view plus this tick's picks; the optimistic
    update is ``waiting += 1``."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n_running = reps.n_running
    n_waiting = reps.n_waiting
    kv = reps.kv_usage
    n = prefill.shape[0]
    G = free_slots.shape[0]
    optimistic = opts.optimistic
    version = int(opts.version)
    rotate = version != 2
    start = carry[_VC.start] % G if rotate else 0
    waiting = n_waiting.copy()
    picks = np.full(G, 0, np.int64)
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    for i in range(n):
        g = -1
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
    """vLLM's DP load balancer in plain Python (the scan written out as upstream's loop)."""
    G = len(reps.free_slots)
    running = [int(r) for r in reps.n_running]
    waiting0 = [int(w) for w in reps.n_waiting]
    waiting = list(waiting0)
    kv = [float(u) for u in reps.kv_usage]
    cap = [int(c) for c in reps.free_slots]
    picks = [0] * G
    optimistic = opts.optimistic
    version = int(opts.version)
    start = int(carry[_VC.start]) % G if version != 2 else 0
    out = [-1] * len(pool.prefill)
    for i in range(len(pool.prefill)):
        best, g = float("inf"), -1
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
        if version != 2:  # vLLM #47420
            start = (start + 1) % G
    if version != 2 and start != carry[_VC.start]:  # a fresh copy: the input is never changed
        carry = carry.copy()
        carry[_VC.start] = start
    return np.array(out, dtype=np.int64), carry


cache_depends_on(vllm_kernel, _routing_core)  # the carry slots come from _core's carry_slots


VLLM = routing_policy(
    "vllm",
    kernel=vllm_kernel,
    reference=vllm_reference,
    carry=VllmCarry,
    summary="first strict minimum of vLLM's score scanning from a start index; waiting += 1",
    source="vllm-project/vllm vllm/v1/engine/core_client.py (DPLBAsyncMPClient)",
    versions=(
        (
            "current",
            "vllm #47420 (2026-07-02, start rotates after every pick) + #49204 (2026-07-20, "
            "max(inflight, waiting + running) + 6*waiting*max(0, kv_usage - 0.5))",
        ),
        ("rotate_4w", "vllm #47420 alone: 4*waiting + running, rotating start"),
        ("legacy", "before vllm #47420: 4*waiting + running from a fixed start (client 0)"),
    ),
)
