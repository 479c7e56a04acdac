"""Dynamo's KV router (``DefaultWorkerSelector`` at temperature 0), its Numba kernel with the
plain-Python reference below it (signature: :mod:`straggler.solvers.routing._core`).

Upstream: ``ai-dynamo/dynamo lib/kv-router/src/scheduling/selector.rs``. It reads
``PoolState.cached`` (the simulator then tracks each replica's prefix cache).

As read in the upstream code (the first version listed is the default, ``version=...``
selects another):

``dynamo``
    Dynamo ``lib/kv-router/src/scheduling/selector.rs`` (``DefaultWorkerSelector``,
    temperature 0): the lowest ``overlap_weight * (isl - cached blocks * block_size) /
    block_size + decode_blocks``, ``decode_blocks`` = the worker's active tokens / block size
    + the request's own blocks; ties to a uniform tied worker (seeded). Cached blocks come from
    ``pool_cached`` (the simulator's per-replica prefix caches on traces with block hashes).
    Deviation: active blocks are counted as tokens / block size, without prefix sharing among
    the active sequences.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ...formulations.validation import check_int, check_real
from ...solvers._numba.jit import NJIT, cache_depends_on
from ...solvers.routing import _core as _routing_core
from ...solvers.routing._core import (
    MINSTD_A,
    MINSTD_M,
    PolicyOption,
    minstd_next,
    minstd_start,
    option_slots,
)
from ...solvers.routing.policy import OPTIMISTIC, routing_policy

__all__ = [
    "DYNAMO",
    "dynamo_kernel",
    "dynamo_reference",
]

# --------------------------------------------------------------------------------------------
# Dynamo KV router: overlap_weight * prefill blocks (cached prefix credited) + decode blocks
# --------------------------------------------------------------------------------------------

DYNAMO_OPTIONS = (
    OPTIMISTIC,
    PolicyOption(
        "block_size",
        lambda v, f: check_int(v, "block_size", f, lo=1, hi=2**20),
        16,
        "dynamo: KV block size in tokens (default 16)",
    ),  # fmt: skip
    PolicyOption(
        "overlap_weight",
        lambda v, f: check_real(v, "overlap_weight", f, lo=0),
        1.0,
        "dynamo: weight of the prefill blocks (kv_overlap_score_weight, default 1)",
    ),  # fmt: skip
)
_D = option_slots(DYNAMO_OPTIONS)


@njit(**NJIT)
def dynamo_kernel(pool, reps, opts, carry, seed):
    """Dynamo's ``DefaultWorkerSelector`` at temperature 0: the lowest ``w * (s - B *
    floor(cached / B)) / B + (loads + waiting_tokens) / B + ceil(s / B)``, ties to a uniform
    one of the tied (one MINSTD draw, only when two or more tie); optimistic: ``loads += s``."""
    prefill = pool.prefill
    cached = pool.cached
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = free_slots.shape[0]
    optimistic = opts.optimistic
    B = int(opts.values[_D.block_size])
    w = opts.values[_D.overlap_weight]
    has_cache = cached.shape[0] == n
    act = reps.loads[:, 0] + reps.waiting_tokens
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    tied = np.empty(G, np.int64)
    x = minstd_start(seed)
    for i in range(n):
        s = prefill[i]
        nt = 0
        best = np.inf
        for j in range(G):
            if cap[j] <= 0:
                continue
            hit = 0.0
            if has_cache:
                hit = min(np.floor(cached[i, j] / B) * B, s)
            logit = w * ((s - hit) / B) + (act[j] / B + np.ceil(s / B))
            if logit < best:
                best = logit
                nt = 0
            if logit == best:
                tied[nt] = j
                nt += 1
        if nt == 0:
            break
        g = tied[0]
        if nt > 1:
            x = minstd_next(x)
            g = tied[x % nt]
        out[i] = g
        cap[g] -= 1
        if optimistic:
            act[g] += s
    return out, carry


def dynamo_reference(pool, reps, opts, carry, seed):
    """Dynamo's KV-router cost in plain Python."""
    n, G = len(pool.prefill), len(reps.free_slots)
    B, w = float(opts.values[_D.block_size]), float(opts.values[_D.overlap_weight])
    optimistic = opts.optimistic
    cached = pool.cached if len(pool.cached) == n else None
    act = [float(row[0]) + float(t) for row, t in zip(reps.loads, reps.waiting_tokens)]
    cap = [int(c) for c in reps.free_slots]
    x = int(seed) % (MINSTD_M - 1) + 1
    out = [-1] * n
    for i, s in enumerate(float(v) for v in pool.prefill):
        logits = {}
        for j in range(G):
            if cap[j] > 0:
                hit = 0.0 if cached is None else min(math.floor(float(cached[i][j]) / B) * B, s)
                prefill_blocks = (s - hit) / B  # new prefill tokens / block size
                decode_blocks = act[j] / B + math.ceil(s / B)  # active + the request's own
                logits[j] = w * prefill_blocks + decode_blocks
        if not logits:
            break
        low = min(logits.values())
        tied = [j for j in sorted(logits) if logits[j] == low]
        g = tied[0]
        if len(tied) > 1:
            x = (MINSTD_A * x) % MINSTD_M
            g = tied[x % len(tied)]
        out[i] = g
        cap[g] -= 1
        if optimistic:
            act[g] += s
    return np.array(out, dtype=np.int64), carry


cache_depends_on(dynamo_kernel, _routing_core)  # its MINSTD and its option slots

DYNAMO = routing_policy(
    "dynamo",
    kernel=dynamo_kernel,
    reference=dynamo_reference,
    options=DYNAMO_OPTIONS,
    summary="lowest overlap_weight * new prefill blocks + decode blocks, ties random",
    source="ai-dynamo/dynamo lib/kv-router/src/scheduling/selector.rs (DefaultWorkerSelector, "
    "temperature 0)",
    seeded=True,
    prefix_cache=True,
)
