"""Round-robin whole-expert placements (TEMPO Theorem 2): kernel and plain-Python reference.

Both return the GPU of each expert (-1 for experts without tokens), by one of two rules:

* ``full = True`` (A3, full replication): rank the live experts by descending tokens, ties
  to the lower expert index; the expert of rank ``r`` (0-based) goes to GPU ``r mod g``.
* ``full = False`` (restricted replicas, "fewest-experts replica, token tie-break"): visit
  the live experts in the same order; put each whole on the replica GPU holding the fewest
  experts so far, ties to the fewest tokens so far, then to the lowest GPU index.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import _order
from .._numba.jit import NJIT, cache_depends_on
from .._order import stable_argsort_int_desc

__all__ = ["a3_kernel", "a3_reference"]


@njit(**NJIT)
def a3_kernel(counts, replicas, full):
    """GPU of each expert under A3 (``full``) or the fewest-experts variant."""
    E, g = replicas.shape
    # stable order of -counts: descending tokens, ties to the lower index
    order = stable_argsort_int_desc(counts)
    assign = np.full(E, -1, np.int64)
    n_exp = np.zeros(g, np.int64)
    n_tok = np.zeros(g, np.int64)
    rank = 0
    for i in range(E):
        e = order[i]
        if counts[e] <= 0:
            continue
        if full:
            best = rank % g
        else:
            best = -1
            for h in range(g):
                if not replicas[e, h]:
                    continue
                if (
                    best < 0
                    or n_exp[h] < n_exp[best]
                    or (n_exp[h] == n_exp[best] and n_tok[h] < n_tok[best])
                ):
                    best = h
        assign[e] = best
        n_exp[best] += 1
        n_tok[best] += counts[e]
        rank += 1
    return assign


cache_depends_on(a3_kernel, _order)


def a3_reference(counts, replicas, full):
    """Plain-Python reference of :func:`a3_kernel` (TEMPO Theorem 2 wording)."""
    n = [int(v) for v in counts]
    n_gpus = len(replicas[0])
    ranked = sorted((e for e in range(len(n)) if n[e] > 0), key=lambda e: (-n[e], e))
    out = [-1] * len(n)
    if full:
        # GPU i takes the experts ranked i, i + g, i + 2g, ...
        for r, e in enumerate(ranked):
            out[e] = r % n_gpus
    else:
        experts = [0] * n_gpus
        tokens = [0] * n_gpus
        for e in ranked:
            cands = [h for h in range(n_gpus) if bool(replicas[e][h])]
            h = min(cands, key=lambda k: (experts[k], tokens[k], k))
            out[e] = h
            experts[h] += 1
            tokens[h] += n[e]
    return np.array(out, dtype=np.int64)
