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

__all__ = ["replica_lists", "gpu_slots"]


@njit(**NJIT_INLINE)
def replica_lists(replicas):
    """CSR lists of a replica mask ``(n_experts, n_gpus)``: ``(e_ptr, e_gpus, g_ptr,
    g_exps)``, the GPUs of expert ``e`` being ``e_gpus[e_ptr[e]:e_ptr[e + 1]]`` and the
    experts of GPU ``h`` ``g_exps[g_ptr[h]:g_ptr[h + 1]]``, both increasing.

    One pass over the mask, row by row (when ``n_gpus`` is a multiple of 8, eight bytes at
    a time, skipping the words without a replica: at wide EP nearly all of them), writes the
    expert-major lists without branches on the replica bits (unpredictable under full
    replication: every GPU is written and the cursor advances only past a replica, so each
    list array carries a scratch slot at its end). The GPU-major lists come from a scan of
    the mask by columns where it is dense (at least one entry in 8), else from the
    expert-major lists by a counting sort, ``O(nnz)``.

    Examples
    --------
    >>> import numpy as np
    >>> e_ptr, e_gpus, g_ptr, g_exps = replica_lists(np.array([[1, 1], [0, 1]], bool))
    >>> e_ptr.tolist(), e_gpus[:3].tolist(), g_ptr.tolist(), g_exps[:3].tolist()
    ([0, 2, 3], [0, 1, 1], [0, 1, 3], [0, 0, 1])
    """
    E, g = replicas.shape
    e_ptr = np.zeros(E + 1, np.int64)
    buf = np.empty(E * g + 1, np.int64)
    k = 0
    if g % 8 == 0:
        words = np.ascontiguousarray(replicas).reshape(E * g).view(np.uint64)
        per = g // 8
        for e in range(E):
            base = e * per
            for w in range(per):
                if words[base + w] != 0:
                    h0 = w * 8
                    for q in range(8):
                        buf[k] = h0 + q
                        k += np.int64(replicas[e, h0 + q])
            e_ptr[e + 1] = k
    else:
        for e in range(E):
            for h in range(g):
                buf[k] = h
                k += np.int64(replicas[e, h])
            e_ptr[e + 1] = k
    nnz = k
    e_gpus = buf[: nnz + 1]
    g_ptr = np.zeros(g + 1, np.int64)
    g_exps = np.empty(nnz + 1, np.int64)
    if 8 * nnz >= E * g:
        # dense: per-GPU counts and lists by scans of the mask (a counting sort's increments
        # of a few counters would wait on each other)
        for e in range(E):
            for h in range(g):
                g_ptr[h + 1] += np.int64(replicas[e, h])
        for h in range(g):
            g_ptr[h + 1] += g_ptr[h]
        for h in range(g):
            k = g_ptr[h]
            for e in range(E):
                g_exps[k] = e
                k += np.int64(replicas[e, h])
    else:
        # sparse: a counting sort of the expert-major lists, O(nnz)
        for j in range(nnz):
            g_ptr[e_gpus[j] + 1] += 1
        for h in range(g):
            g_ptr[h + 1] += g_ptr[h]
        pos = g_ptr[:g].copy()
        for e in range(E):  # experts in increasing order: each GPU's list comes out increasing
            for j in range(e_ptr[e], e_ptr[e + 1]):
                h = e_gpus[j]
                g_exps[pos[h]] = e
                pos[h] += 1
    return e_ptr, e_gpus, g_ptr, g_exps


@njit(**NJIT_INLINE)
def gpu_slots(e_ptr, e_gpus, g_ptr):
    """The replica of each entry of the GPU-major lists of :func:`replica_lists`: its position
    ``j`` in the expert-major lists (``e_gpus[j]``), as ``g_slot[i]`` for entry ``i``.

    Examples
    --------
    >>> import numpy as np
    >>> e_ptr, e_gpus, g_ptr, _ = replica_lists(np.array([[1, 1], [0, 1]], bool))
    >>> gpu_slots(e_ptr, e_gpus, g_ptr).tolist()
    [0, 1, 2]
    """
    E = e_ptr.shape[0] - 1
    g = g_ptr.shape[0] - 1
    g_slot = np.empty(e_ptr[E], np.int64)
    pos = g_ptr[:g].copy()
    for e in range(E):
        for j in range(e_ptr[e], e_ptr[e + 1]):
            h = e_gpus[j]
            g_slot[pos[h]] = j
            pos[h] += 1
    return g_slot
