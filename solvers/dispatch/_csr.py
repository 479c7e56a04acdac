"""Replica lists in compressed sparse row form, shared by the dispatch kernels.

:func:`replica_lists` is the one builder of the lists that the tempo and token-LP kernels
(:mod:`~straggler.solvers.dispatch._tempo`, :mod:`~straggler.solvers.dispatch._token_lp_fast`)
walk instead of scanning the replica mask. A jitted caller in another file ties its disk
cache to this file with :func:`~straggler.solvers._numba.jit.cache_depends_on`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._numba.jit import NJIT_INLINE

__all__ = ["replica_lists"]


@njit(**NJIT_INLINE)
def replica_lists(replicas):
    """CSR lists of a replica mask ``(n_experts, n_gpus)``: ``(e_ptr, e_gpus, g_ptr,
    g_exps)``, the GPUs of expert ``e`` being ``e_gpus[e_ptr[e]:e_ptr[e + 1]]`` and the
    experts of GPU ``h`` ``g_exps[g_ptr[h]:g_ptr[h + 1]]``, both increasing.

    Built without branches (unpredictable branches on the replica bits dominate
    otherwise): each list array carries a scratch slot at its end for the writes that do
    not count.

    Examples
    --------
    >>> import numpy as np
    >>> e_ptr, e_gpus, g_ptr, g_exps = replica_lists(np.array([[1, 1], [0, 1]], bool))
    >>> e_ptr.tolist(), e_gpus[:3].tolist(), g_ptr.tolist(), g_exps[:3].tolist()
    ([0, 2, 3], [0, 1, 1], [0, 1, 3], [0, 0, 1])
    """
    E, g = replicas.shape
    e_ptr = np.zeros(E + 1, np.int64)
    g_ptr = np.zeros(g + 1, np.int64)
    for e in range(E):
        k = 0
        for h in range(g):
            r = np.int64(replicas[e, h])
            k += r
            g_ptr[h + 1] += r
        e_ptr[e + 1] = e_ptr[e] + k
    for h in range(g):
        g_ptr[h + 1] += g_ptr[h]
    e_gpus = np.empty(e_ptr[E] + 1, np.int64)
    g_exps = np.empty(g_ptr[g] + 1, np.int64)
    k = 0
    for e in range(E):
        for h in range(g):
            e_gpus[k] = h
            k += np.int64(replicas[e, h])
    for h in range(g):
        k = g_ptr[h]
        for e in range(E):
            g_exps[k] = e
            k += np.int64(replicas[e, h])
    return e_ptr, e_gpus, g_ptr, g_exps
