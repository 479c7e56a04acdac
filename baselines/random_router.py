"""The uniform random router (a common baseline, no upstream): its Numba kernel with the
plain-Python reference below it (signature: :mod:`straggler.solvers._routing_core`).

As read in the upstream code (the first version listed is the default, ``version=...``
selects another):

``random``
    A uniform replica (common baseline; no upstream).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..solvers._jit import NJIT
from ..solvers._routing_core import MINSTD_A, MINSTD_M
from ..solvers.routing_registry import routing_policy

__all__ = [
    "RANDOM",
    "random_kernel",
    "random_reference",
]

# --------------------------------------------------------------------------------------------
# Random: uniform over the replicas with a free slot (MINSTD draws)
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def random_kernel(pool, reps, opts, carry, seed):
    """Uniform random replica among those with a free slot, one MINSTD draw per request."""
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = loads.shape[0]
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    x = seed % (MINSTD_M - 1) + 1
    elig = np.empty(G, np.int64)
    for i in range(n):
        k = 0
        for j in range(G):
            if cap[j] > 0:
                elig[k] = j
                k += 1
        if k == 0:
            break
        x = (MINSTD_A * x) % MINSTD_M
        g = elig[x % k]
        out[i] = g
        cap[g] -= 1
    return out, carry


def random_reference(pool, reps, opts, carry, seed):
    """Random routing in plain Python (the same MINSTD stream)."""
    prefill = pool.prefill
    free_slots = reps.free_slots
    cap = [int(c) for c in free_slots]
    x = int(seed) % (MINSTD_M - 1) + 1
    out = [-1] * len(prefill)
    for i in range(len(prefill)):
        elig = [j for j in range(len(cap)) if cap[j] > 0]
        if not elig:
            break
        x = (MINSTD_A * x) % MINSTD_M
        out[i] = elig[x % len(elig)]
        cap[out[i]] -= 1
    return np.array(out, dtype=np.int64), carry


RANDOM = routing_policy(
    "random",
    kernel=random_kernel,
    reference=random_reference,
    options=(),
    summary="uniform replica among those with a free slot (MINSTD stream)",
    source="common baseline",
    seeded=True,
)
