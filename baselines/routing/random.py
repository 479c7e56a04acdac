"""The uniform random router (a common baseline, no upstream): its Numba kernel with the
plain-Python reference below it (signature: :mod:`straggler.solvers.routing._core`).

As read in the upstream code (the first version listed is the default, ``version=...``
selects another):

``random``
    A uniform replica (common baseline; no upstream).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...solvers._numba.jit import NJIT, cache_depends_on
from ...solvers.routing import _core as _routing_core
from ...solvers.routing._core import MINSTD_A, MINSTD_M, draw_eligible, minstd_start
from ...solvers.routing.policy import routing_policy

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
    """Uniform random replica among those with a free slot, one MINSTD draw per request
    (:func:`~straggler.solvers.routing._core.draw_eligible`)."""
    n = pool.prefill.shape[0]
    cap = reps.free_slots.copy()
    out = np.full(n, -1, np.int64)
    x = minstd_start(seed)
    elig = np.empty(cap.shape[0], np.int64)
    for i in range(n):
        k, x, a = draw_eligible(cap, elig, x, np.int64(1))  # int64, not a literal: one compile
        if k == 0:
            break
        g = elig[a]
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


cache_depends_on(random_kernel, _routing_core)

RANDOM = routing_policy(
    "random",
    kernel=random_kernel,
    reference=random_reference,
    options=(),
    summary="uniform replica among those with a free slot (MINSTD stream)",
    source="common baseline",
    seeded=True,
)
