"""TensorRT-LLM's attention-DP routers: ``DefaultADPRouter`` (``trtllm``) and the same
assignment held back by ``attention_dp_config.enable_balance`` (``trtllm_balance``), each
Numba kernel with its plain-Python reference below it (signature:
:mod:`straggler.solvers.routing._core`).

Upstream: ``NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor`` (``DefaultADPRouter``;
``py_executor.py`` ``_balance_adp_requests``, TensorRT-LLM #6061, 2025-07-15).

As read in the upstream code (the first version listed is the default, ``version=...``
selects another):

``trtllm``
    TensorRT-LLM ``tensorrt_llm/_torch/pyexecutor`` ``DefaultADPRouter``: new requests longest
    prompt first onto a min-heap of ``(num_active_tokens, num_active_requests, rank)``, where
    ``num_active_tokens`` is the sum of the active requests' ORIGINAL prompt lengths
    (``py_orig_prompt_len``; ``prompt_tokens + waiting_tokens`` here), not resident KV; a rank
    leaves the heap at ``expected_num_active_requests = max(ceil((sum active + n_new) / G),
    max active)``.
``trtllm_balance``
    ``trtllm`` plus ``attention_dp_config.enable_balance`` (``PyExecutor._balance_adp_requests``,
    TensorRT-LLM #6061, 2025-07-15; defaults from ``AttentionDpConfig``): new context
    requests are held back until every rank has a free slot and a new request (at most
    ``timeout_iters`` = 50 ticks, and not when some rank runs nothing), then for
    ``batching_wait_iters`` = 10 more ticks while every rank is decoding. Deviations: held
    requests return to the pool and are re-routed at the next tick (upstream keeps them on
    their rank), the counters advance only at ticks with a non-empty pool, and the shorter
    wait for an under-occupied rank (an environment-gated change of TensorRT-LLM #17700,
    2026-08) is not modelled. The hold-back pays off where context phases share the decode
    step (aggregated serving: ``simulate(ctx_cost=...)``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from ...formulations.validation import check_int
from ...solvers import _order
from ...solvers._numba.jit import NJIT, cache_depends_on
from ...solvers._order import stable_argsort_desc
from ...solvers.routing import _core as _routing_core
from ...solvers.routing._core import (
    PolicyOption,
    carry_slots,
    option_slots,
    with_carry,
)
from ...solvers.routing.policy import OPTIMISTIC, routing_policy

__all__ = [
    "TRTLLM",
    "TRTLLM_BALANCE",
    "TrtllmBalanceCarry",
    "trtllm_kernel",
    "trtllm_reference",
    "trtllm_balance_kernel",
    "trtllm_balance_reference",
]

# --------------------------------------------------------------------------------------------
# TensorRT-LLM attention-DP: longest prompt first, min-heap on (prompt tokens, requests, rank)
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def trtllm_kernel(pool, reps, opts, carry, seed):
    """TensorRT-LLM's ``DefaultADPRouter``; the heap is an O(G) argmin over the same key.

    Tokens per rank: the active requests' ORIGINAL prompt lengths (``prompt_tokens`` plus the
    queued ``waiting_tokens``), not resident KV; requests: ``running + waiting``."""
    return _trtllm_assign(pool, reps, opts), carry


@njit(**NJIT)
def _trtllm_assign(pool, reps, opts):
    """:func:`trtllm_kernel`'s assignment, the one compiled copy both trtllm kernels call
    (a kernel calling another policy's kernel would compile that kernel once more, beside
    the version its own policy calls by address)."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = free_slots.shape[0]
    optimistic = opts.optimistic
    tok = reps.prompt_tokens + reps.waiting_tokens
    req = reps.n_running + reps.n_waiting
    active = req.copy()
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    s_tot = 0
    total = 0
    mx = 0
    for g in range(G):
        s_tot += cap[g]
        total += active[g]
        if active[g] > mx:
            mx = active[g]
    n_new = min(n, s_tot)
    limit = max((total + n_new + G - 1) // G, mx)
    order = stable_argsort_desc(prefill)  # np.argsort(-prefill, kind="stable")
    for t in range(n):
        i = order[t]
        g = -1
        for j in range(G):
            if cap[j] <= 0 or active[j] >= limit:
                continue
            if g < 0 or tok[j] < tok[g] or (tok[j] == tok[g] and req[j] < req[g]):
                g = j
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        active[g] += 1
        if optimistic:
            tok[g] += prefill[i]
            req[g] += 1
    return out


cache_depends_on(_trtllm_assign, _order)
cache_depends_on(trtllm_kernel, _order)


def trtllm_reference(pool, reps, opts, carry, seed):
    """TensorRT-LLM's attention-DP balancer in plain Python with ``heapq``."""
    import heapq

    prefill = pool.prefill
    G = len(reps.free_slots)
    optimistic = opts.optimistic
    cap = [int(c) for c in reps.free_slots]
    active = [int(r) + int(w) for r, w in zip(reps.n_running, reps.n_waiting)]
    tokens = [float(p) + float(w) for p, w in zip(reps.prompt_tokens, reps.waiting_tokens)]
    n_new = min(len(prefill), sum(cap))
    limit = max(-(-(sum(active) + n_new) // G), max(active))
    heap = [(tokens[g], active[g], g) for g in range(G) if cap[g] > 0 and active[g] < limit]
    heapq.heapify(heap)
    order = sorted(range(len(prefill)), key=lambda i: (-float(prefill[i]), i))
    out = [-1] * len(prefill)
    for i in order:
        if not heap:
            break
        tok, req, g = heapq.heappop(heap)
        out[i] = g
        cap[g] -= 1
        active[g] += 1
        if optimistic:
            tok, req = tok + float(prefill[i]), req + 1
        if cap[g] > 0 and active[g] < limit:
            heapq.heappush(heap, (tok, req, g))
    return np.array(out, dtype=np.int64), carry


# --------------------------------------------------------------------------------------------
# TensorRT-LLM attention-DP balance: the same router, new requests held back until every rank
# can take some (timeout_iters), then a batching wait (batching_wait_iters)
# --------------------------------------------------------------------------------------------


#: trtllm_balance's options and memory: the two hold-back limits and their counters.
TRTLLM_BALANCE_OPTIONS = (
    OPTIMISTIC,
    PolicyOption(
        "timeout_iters",
        lambda v, f: check_int(v, "timeout_iters", f, lo=0, hi=2**40),
        50,
        "trtllm_balance: ticks new requests wait for every rank to take some (default 50)",
    ),  # fmt: skip
    PolicyOption(
        "batching_wait_iters",
        lambda v, f: check_int(v, "batching_wait_iters", f, lo=0, hi=2**40),
        10,
        "trtllm_balance: extra ticks of batching once every rank can take some (default 10)",
    ),
)


class TrtllmBalanceCarry(NamedTuple):
    """trtllm_balance's memory from one tick to the next: its two hold-back counters."""

    adp_wait: int
    """Ticks waited for every rank to have a new request."""
    adp_batch: int
    """Ticks of batching wait spent."""


_TB = option_slots(TRTLLM_BALANCE_OPTIONS)
_TBC = carry_slots(TrtllmBalanceCarry)


@njit(**NJIT)
def trtllm_balance_kernel(pool, reps, opts, carry, seed):
    """``trtllm``'s assignment, released or held back by ``attention_dp_config.enable_balance``
    (``PyExecutor._balance_adp_requests``); the two counters are its memory (``adp_wait``,
    ``adp_batch``)."""
    out = _trtllm_assign(pool, reps, opts)
    G = reps.free_slots.shape[0]
    new = np.full(G, 0, np.int64)
    for i in range(out.shape[0]):
        if out[i] >= 0:
            new[out[i]] += 1
    all_free = True
    all_ctx = True
    all_gen = True
    for g in range(G):
        all_free = all_free and reps.free_slots[g] > 0
        all_ctx = all_ctx and new[g] + reps.n_waiting[g] > 0
        all_gen = all_gen and reps.n_running[g] > 0
    wait = carry[_TBC.adp_wait]
    batch = carry[_TBC.adp_batch]
    release = True
    if all_free and all_ctx:
        wait = 0
        if all_gen:
            if batch < int(opts.values[_TB.batching_wait_iters]):
                batch += 1
                release = False
            else:
                batch = 0
    else:
        wait += 1
        release = False
        if wait >= int(opts.values[_TB.timeout_iters]) or not all_gen:
            wait = 0
            release = True
    if not release:
        out[:] = -1
    return out, with_carry(with_carry(carry, _TBC.adp_wait, wait), _TBC.adp_batch, batch)


# the option and carry slots come from _core's option_slots/carry_slots
cache_depends_on(trtllm_balance_kernel, _order, _routing_core)


def trtllm_balance_reference(pool, reps, opts, carry, seed):
    """The hold-back in plain Python, written as upstream's branches."""
    out, _ = trtllm_reference(pool, reps, opts, carry, seed)
    G = len(reps.free_slots)
    got = [sum(1 for g in out if g == r) for r in range(G)]
    have_free = all(int(f) > 0 for f in reps.free_slots)  # num_gen < max_batch_size
    have_ctx = all(got[r] + int(reps.n_waiting[r]) > 0 for r in range(G))
    have_gen = all(int(r) > 0 for r in reps.n_running)
    wait, batch = int(carry[_TBC.adp_wait]), int(carry[_TBC.adp_batch])
    held = False
    if have_free and have_ctx:  # wait for all ranks to have context requests
        wait = 0
        if have_gen:  # balance the number of context requests across ranks
            if batch < int(opts.values[_TB.batching_wait_iters]):
                batch += 1
                held = True
            else:
                batch = 0
    else:
        wait += 1
        held = True
        if wait >= int(opts.values[_TB.timeout_iters]) or not have_gen:
            wait, held = 0, False
    if held:
        out = np.full(out.shape[0], -1, np.int64)
    if (wait, batch) != (carry[_TBC.adp_wait], carry[_TBC.adp_batch]):
        carry = carry.copy()  # a fresh copy: the input is never changed
        carry[_TBC.adp_wait] = wait
        carry[_TBC.adp_batch] = batch
    return np.asarray(out, dtype=np.int64), carry


TRTLLM = routing_policy(
    "trtllm",
    kernel=trtllm_kernel,
    reference=trtllm_reference,
    summary="longest prompt first; min-heap on (prompt tokens, requests, rank) with a cap",
    source="NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor (DefaultADPRouter): "
    "num_active_tokens = sum of py_orig_prompt_len",
)
TRTLLM_BALANCE = routing_policy(
    "trtllm_balance",
    kernel=trtllm_balance_kernel,
    reference=trtllm_balance_reference,
    options=TRTLLM_BALANCE_OPTIONS,
    carry=TrtllmBalanceCarry,
    summary="trtllm's assignment, held back until every rank can take a new request "
    "(timeout_iters), then batching_wait_iters more ticks",
    source="NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/py_executor.py "
    "_balance_adp_requests (attention_dp_config.enable_balance, TensorRT-LLM #6061, 2025-07-15)",
)
