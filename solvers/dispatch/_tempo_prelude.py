"""What every tempo layer computes before stage 1, in one kernel call: kernel and reference.

:func:`tempo_prelude_kernel` runs, for one layer, the exact token LP
(:func:`~straggler.solvers.dispatch._token_lp_fast.token_lp_kernel`), the optimal
semi-matching (:func:`~straggler.solvers.dispatch._semi_matching.semi_matching_kernel`), the
certified bounds B1-B7 (:func:`~straggler.solvers.dispatch._bounds.lower_bound_kernel` and
B5, B7 from the token-LP value) and, with ``fractional``, the exact token-LP dispatch
(:func:`~straggler.solvers.dispatch._token_lp_fast.exact_token_lp_kernel`). Each is called
by the address of its own compiled code (:func:`prelude_handles`), so this kernel compiles
none of them again; one call from Python instead of five saves their dispatch and the glue
between them, a fifth of a small layer's whole ``solve_dispatch``.
:func:`tempo_prelude_reference` calls the plain-Python references in the same order.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, types

from .._numba import address as _address
from .._numba.address import call_compiled, compiled_address, readonly
from .._numba.jit import NJIT, cache_depends_on
from . import _bounds, _semi_matching, _token_lp_fast
from ._bounds import lower_bound_kernel, lower_bound_reference
from ._semi_matching import semi_matching_kernel, semi_matching_reference
from ._token_lp_fast import (
    exact_token_lp_kernel,
    exact_token_lp_reference,
    token_lp_handle,
    token_lp_kernel,
    token_lp_reference,
)

__all__ = ["prelude_handles", "tempo_prelude_kernel", "tempo_prelude_reference"]


@njit(**NJIT)
def _token_lp_terms(cost, v):
    """B5 and B7 from the token-LP value ``v``:
    :func:`~straggler.solvers.dispatch.bounds.token_lp_bound`'s expressions."""
    best = max(cost[3] + cost[4] * v, cost[5] + cost[6] * v)
    if v <= 0.0:
        return best
    k = max(1, math.ceil(v / cost[7] * (1 - 1e-12)))
    return max(best, cost[0] + min(cost[1] + cost[2] * (k - 1), cost[1] * k))


@njit(**NJIT)
def tempo_prelude_kernel(counts, replicas, cost, fractional, handles):
    """The token LP, semi-matching, bounds B1-B7 and exact token-LP dispatch of one layer.

    Parameters
    ----------
    counts : ndarray of int64, shape (n_experts,)
    replicas : ndarray of bool, shape (n_experts, n_gpus)
    cost : ndarray of float64
        ``CostModel.as_array()``.
    fractional : bool
        Whether to compute the exact token-LP dispatch.
    handles : tuple
        :func:`prelude_handles`; ignored in Python.

    Returns
    -------
    lp : ndarray of int64, shape (n_experts, n_gpus)
        The integral token-optimal dispatch.
    num, den : int
        ``lambda* = num / den``.
    assign : ndarray of int64, shape (n_experts,)
        An optimal semi-matching (-1 for an expert without tokens).
    sm : int
        Its value.
    bound : float
        B1-B7.
    x_lp : ndarray of float64, shape (n_experts, n_gpus), or (0, 0) without ``fractional``
    m_lp : float
        Its makespan (nan without ``fractional``).
    """
    c = readonly(counts)
    r = readonly(replicas)
    lp, num, den = call_compiled(handles[0], token_lp_kernel, (c, r))
    E = counts.shape[0]
    live = np.empty(E, np.bool_)
    for e in range(E):
        live[e] = counts[e] > 0
    assign, sm, _ = call_compiled(handles[1], semi_matching_kernel, (r, live))
    bound = call_compiled(handles[2], lower_bound_kernel, (c, r, cost, sm))
    bound = max(bound, _token_lp_terms(cost, num / den))
    if fractional:
        x_lp, m_lp = call_compiled(handles[3], exact_token_lp_kernel, (c, r, lp, num, den, cost))
    else:
        x_lp = np.zeros((0, 0))
        m_lp = np.nan
    return lp, num, den, assign, sm, bound, x_lp, m_lp


# call_compiled and readonly are lowered by solvers/_numba/address.py, and the callees'
# signatures come from their files: an edit in any of them recompiles this one
cache_depends_on(tempo_prelude_kernel, _address, _token_lp_fast, _semi_matching, _bounds)


def tempo_prelude_reference(counts, replicas, cost, fractional):
    """Plain-Python reference of :func:`tempo_prelude_kernel`: the references, in order.

    Examples
    --------
    TEMPO Fig. 1b: ``lambda* = 390`` (tokens) and SM = 4 (experts per GPU); the bound is
    ``b * 4 = 60``, which the exact token-LP dispatch (7 activations on a GPU: 105) misses.

    >>> cost = np.array([0, 15, 0, 0, 0.1, 0, 0, 128], float)
    >>> out = tempo_prelude_reference([600] + [30] * 6, np.ones((7, 2), bool), cost, True)
    >>> int(out[1]) / int(out[2]), int(out[4]), float(out[5]), float(out[7])
    (390.0, 4, 60.0, 105.0)
    """
    counts = np.asarray(counts, dtype=np.int64)
    replicas = np.asarray(replicas, dtype=bool)
    lp, num, den = token_lp_reference(counts, replicas)
    assign, sm, _ = semi_matching_reference(replicas, counts > 0)
    bound = lower_bound_reference(counts, replicas, cost, sm)
    a, b, b2, c, beta, c2, gamma, tile = (float(x) for x in cost)
    v = num / den
    terms = max(c + beta * v, c2 + gamma * v)
    if v > 0:
        k = max(1, math.ceil(v / tile * (1 - 1e-12)))
        terms = max(terms, a + min(b + b2 * (k - 1), b * k))
    bound = max(bound, terms)
    if fractional:
        x_lp, m_lp = exact_token_lp_reference(counts, replicas, lp, num, den, cost)
    else:
        x_lp, m_lp = np.zeros((0, 0)), math.nan
    return lp, num, den, np.asarray(assign, dtype=np.int64), sm, bound, x_lp, m_lp


@functools.cache
def prelude_handles() -> tuple:
    """The ``handles`` argument of :func:`tempo_prelude_kernel`: the compiled token LP,
    semi-matching, lower bound and exact token LP for the types it calls them with (read-only
    int64 counts and bool mask, a writeable float64 cost array), compiled here or loaded from
    numba's disk cache on the first call of the process, then kept."""
    ro_counts = types.Array(types.int64, 1, "C", readonly=True)
    ro_mask = types.Array(types.bool_, 2, "C", readonly=True)
    cost = types.Array(types.float64, 1, "C")
    lp = types.Array(types.int64, 2, "C")
    return (
        token_lp_handle(),
        compiled_address(semi_matching_kernel, (ro_mask, types.Array(types.bool_, 1, "C"))),
        compiled_address(lower_bound_kernel, (ro_counts, ro_mask, cost, types.int64)),
        compiled_address(
            exact_token_lp_kernel, (ro_counts, ro_mask, lp, types.int64, types.int64, cost)
        ),
    )
