"""Check and score a stack of dispatches in one pass: kernel and plain-Python reference.

``solve_dispatch`` checks every method's shares and scores them by the independent
evaluator (:func:`~straggler.formulations.dispatch.evaluate_arrays`, numpy: about fifteen
array passes, ~30 us per layer at ``E = 256, g = 8``, which is half of tempo's own time).
This kernel does both in one pass over ``x`` (``(L, E, g)`` float64; a single layer is
``L = 1``):

* feasible: :func:`~straggler.formulations.check_shares`'s rules (every entry finite and
  ``>= 0``, zero off ``mask``, ``|sum_g x[l, e, g] - n[l, e]| <= rtol * max(1,
  n[l, e])``), which words the error when the answer is no;
* per GPU: ``G`` (entries ``> 0``), ``N`` (their sum, added in expert order, as numpy
  reduces the expert axis), ``T`` (``max(1, ceil((x - TILE_SLACK) / tile))`` per active
  entry) and the time ``max(a + b*G + b2*(T - G), c + beta*N, c2 + gamma*N)``, evaluated in
  the evaluator's order of operations, so every float agrees with ``evaluate_arrays`` bit
  for bit (tested); ``cost`` is ``CostModel.as_array()`` plus a last entry ``1.0`` when the
  traffic piece is present, ``0.0`` otherwise.

When ``x`` is infeasible the per-GPU arrays are still computed (an infinite share counts in
``G`` and ``N``, not in ``T``), and the caller words the error with
:func:`~straggler.formulations.check_shares`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ...formulations.dispatch import TILE_SLACK
from .._numba.jit import NJIT

__all__ = ["score_kernel", "score_reference", "score_times_kernel", "score_times_reference"]


@njit(**NJIT)
def score_kernel(x, mask, counts, cost, rtol):
    """Feasibility and per-GPU ``G, N, T, times`` of a stack ``x`` ``(L, E, g)``.

    Returns
    -------
    ok : bool
    G, T : ndarray of int64, shape (L, g)
    N, times : ndarray of float64, shape (L, g)
    """
    L, E, g = x.shape
    a, b, b2, c, beta, c2, gamma, tile, traffic = (cost[0], cost[1], cost[2], cost[3], cost[4],
                                                  cost[5], cost[6], cost[7], cost[8])  # fmt: skip
    G = np.zeros((L, g), np.int64)
    T = np.zeros((L, g), np.int64)
    N = np.zeros((L, g))
    times = np.empty((L, g))
    ok = True
    for l in range(L):
        for e in range(E):
            s = 0.0
            for h in range(g):
                v = x[l, e, h]
                if v == 0.0:  # adds nothing to any sum (at wide EP nearly every entry)
                    continue
                if not (v > 0.0) or v == math.inf or not mask[l, e, h]:
                    ok = False
                s += v
                N[l, h] += v
                if v > 0.0:
                    G[l, h] += 1
                    if v < math.inf:  # (an infinite share has no tile count; x is infeasible)
                        k = math.ceil((v - TILE_SLACK) / tile)
                        T[l, h] += k if k > 1 else 1
            n = float(counts[l, e])
            if abs(s - n) > rtol * max(1.0, n):
                ok = False
        for h in range(g):
            Gf = float(G[l, h])
            t = a + b * Gf + b2 * (float(T[l, h]) - Gf)
            u = c + beta * N[l, h]
            if u > t:
                t = u
            if traffic != 0.0:
                u = c2 + gamma * N[l, h]
                if u > t:
                    t = u
            times[l, h] = t
    return ok, G, N, T, times


@njit(**NJIT)
def score_times_kernel(x, mask, counts, cost, rtol):
    """``(ok, times)`` of :func:`score_kernel`, what ``solve_dispatch`` reads: each array a
    kernel returns is a Python object built (with its class fetched by numba's unpickler),
    which costs about a microsecond when the caches are cold. ``x`` and ``mask`` C-contiguous,
    ``(L, E, g)`` or one layer ``(E, g)`` (``counts`` ``(L, E)`` or ``(E,)``): a layer is
    viewed as a stack of one here, not by three ``reshape`` calls in Python."""
    E, g = x.shape[-2], x.shape[-1]
    L = counts.size // E
    ok, _, _, _, times = score_kernel(x.reshape((L, E, g)), mask.reshape((L, E, g)),
                                      counts.reshape((L, E)), cost, rtol)  # fmt: skip
    return ok, times


def score_times_reference(x, mask, counts, cost, rtol):
    """Plain-Python reference of :func:`score_times_kernel`."""
    E, g = np.shape(x)[-2:]
    x, mask = np.reshape(x, (-1, E, g)), np.reshape(mask, (-1, E, g))
    ok, _, _, _, times = score_reference(x, mask, np.reshape(counts, (-1, E)), cost, rtol)
    return ok, times


def score_reference(x, mask, counts, cost, rtol):
    """Plain-Python reference of :func:`score_kernel`, written from the definitions."""
    a, b, b2, c, beta, c2, gamma, tile, traffic = (float(v) for v in cost)
    L, E, g = len(x), len(x[0]), len(x[0][0])
    ok = True
    G = np.zeros((L, g), np.int64)
    T = np.zeros((L, g), np.int64)
    N = np.zeros((L, g))
    times = np.empty((L, g))
    for l in range(L):
        for e in range(E):
            row = [float(v) for v in x[l][e]]
            if any(not math.isfinite(v) or v < 0 or (v != 0 and not mask[l][e][h])
                   for h, v in enumerate(row)):  # fmt: skip
                ok = False
            n = float(counts[l][e])
            if abs(sum(row) - n) > rtol * max(1.0, n):
                ok = False
        for h in range(g):
            col = [float(x[l][e][h]) for e in range(E)]
            total = 0.0
            for v in col:  # expert order, as the evaluator reduces
                total += v
            live = [v for v in col if v > 0]
            G[l, h] = len(live)
            T[l, h] = sum(max(1, math.ceil((v - TILE_SLACK) / tile)) for v in live if v < math.inf)
            N[l, h] = total
            pieces = [a + b * G[l, h] + b2 * (T[l, h] - G[l, h]), c + beta * total]
            if traffic:
                pieces.append(c2 + gamma * total)
            times[l, h] = max(pieces)
    return ok, G, N, T, times
