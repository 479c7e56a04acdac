"""Feasibility of a dispatch in one pass: kernel and plain-Python reference.

``solve_dispatch`` checks every method's shares before it scores them (so that a bound
certified on a mask is only ever reported beside shares that lie on it); numpy's check
(:func:`~straggler.formulations.check_shares`) makes six passes over the array, this kernel
one. Both say whether ``x`` (``(E, g)`` or ``(L, E, g)``, float64) is a feasible dispatch of
``counts`` on ``mask``: every entry finite and ``>= 0``, zero off the mask, and
``|sum_g x[e, g] - n[e]| <= rtol * max(1, n[e])`` for every expert (``check_shares``'s
rules); ``check_shares`` itself words the error when the answer is no.
"""

from __future__ import annotations

import math

from numba import njit

from ._jit import NJIT

__all__ = ["feasible_kernel", "feasible_reference"]


@njit(**NJIT)
def feasible_kernel(x, mask, counts, rtol):
    """True when ``x`` is a feasible dispatch (see the module docstring); 2-D views."""
    rows, g = x.shape
    for r in range(rows):
        s = 0.0
        for h in range(g):
            v = x[r, h]
            if not (v >= 0.0) or v == math.inf:  # NaN, negative or infinite
                return False
            if v != 0.0 and not mask[r, h]:
                return False
            s += v
        n = float(counts[r])
        if abs(s - n) > rtol * max(1.0, n):
            return False
    return True


def feasible_reference(x, mask, counts, rtol):
    """Plain-Python reference of :func:`feasible_kernel` (same rules, written as the
    definition: all entries valid, all experts conserved)."""
    rows = len(x)
    entries_ok = all(
        math.isfinite(float(v)) and float(v) >= 0 and (float(v) == 0 or bool(m))
        for r in range(rows)
        for v, m in zip(x[r], mask[r])
    )
    conserved = all(
        abs(sum(float(v) for v in x[r]) - float(counts[r])) <= rtol * max(1.0, float(counts[r]))
        for r in range(rows)
    )
    return entries_ok and conserved
