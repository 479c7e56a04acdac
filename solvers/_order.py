"""Stable orders by LSD radix sort, as Numba kernels: exact replacements of
``np.argsort(..., kind="stable")`` for the key types the kernels sort.

numba's own ``np.argsort`` (its merge sort and quick sort) compiles to several seconds of
machine code per key type; these loops compile in a fraction of that and return the same
permutation as numpy's stable sort (ordered by ``(key, index)``). Each function states the
numpy call it equals; ``tests/test_order.py`` checks it against numpy.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._jit import NJIT

__all__ = [
    "radix_order",
    "stable_argsort",
    "stable_argsort_desc",
    "stable_argsort_float",
    "stable_argsort_int_desc",
    "stable_argsort_uint",
]


@njit(**NJIT)
def radix_order(keys):
    """The stable order of int64 ``keys`` read as unsigned 64-bit integers: LSD radix sort.

    Counting passes over 8-bit digits (stable) give the order by ``(key, index)``. Only the
    bits where the keys differ matter: the digits start at the lowest of them (not at a byte
    boundary), and a digit equal in every key is skipped (token counts as float64 differ in
    about 24 bits: three passes).
    """
    n = keys.shape[0]
    diff = 0
    for i in range(n):
        diff |= keys[i] ^ keys[0]
    order = np.arange(n)
    if diff == 0:
        return order
    lo = 0
    while (diff >> lo) & 1 == 0:
        lo += 1
    hi = 63
    while (diff >> hi) & 1 == 0:
        hi -= 1
    n_pass = (hi - lo + 8) >> 3
    first = min(lo, 64 - 8 * n_pass)  # the last digit ends at bit 63 at most
    tmp = np.empty(n, np.int64)
    cnt = np.empty(257, np.int64)
    for sh in range(first, first + 8 * n_pass, 8):
        if ((diff >> sh) & 255) == 0:
            continue
        for d in range(257):
            cnt[d] = 0
        for i in range(n):
            cnt[((keys[i] >> sh) & 255) + 1] += 1
        for d in range(256):
            cnt[d + 1] += cnt[d]
        for i in range(n):
            o = order[i]
            d = (keys[o] >> sh) & 255
            tmp[cnt[d]] = o
            cnt[d] += 1
        order, tmp = tmp, order
    return order


@njit(**NJIT)
def stable_argsort(x):
    """``np.argsort(x, kind="stable")`` for finite float64 ``x >= 0``: :func:`radix_order` of
    the IEEE bits.

    For non-negative doubles (``-0.0`` mapped to ``+0.0``) the bit patterns read as int64 are
    ordered as the values.
    """
    n = x.shape[0]
    buf = np.empty(n)
    for i in range(n):
        buf[i] = x[i] + 0.0
    return radix_order(buf.view(np.int64))


@njit(**NJIT)
def stable_argsort_desc(x):
    """``np.argsort(-x, kind="stable")`` for finite float64 ``x >= 0``: :func:`radix_order` of
    the IEEE bits subtracted from the largest int64 (which reverses their order, ties kept by
    index).
    """
    n = x.shape[0]
    buf = np.empty(n)
    for i in range(n):
        buf[i] = x[i] + 0.0
    keys = buf.view(np.int64)
    top = np.int64(0x7FFFFFFFFFFFFFFF)
    for i in range(n):
        keys[i] = top - keys[i]
    return radix_order(keys)


@njit(**NJIT)
def stable_argsort_int_desc(x):
    """``np.argsort(-x, kind="stable")`` for int64 ``x > -2**63`` (where ``-x`` exists):
    :func:`radix_order` of ``x`` with its sign bit flipped (unsigned order = signed order),
    complemented (which reverses it)."""
    n = x.shape[0]
    keys = np.empty(n, np.int64)
    flip = np.int64(-9223372036854775808)
    for i in range(n):
        keys[i] = ~(x[i] ^ flip)
    return radix_order(keys)


@njit(**NJIT)
def stable_argsort_uint(x):
    """``np.argsort(x, kind="stable")`` for uint64 ``x``: :func:`radix_order` of its bits."""
    n = x.shape[0]
    keys = np.empty(n, np.uint64)
    for i in range(n):
        keys[i] = x[i]
    return radix_order(keys.view(np.int64))


@njit(**NJIT)
def stable_argsort_float(x):
    """``np.argsort(x, kind="stable")`` for float64 ``x`` without NaN: :func:`radix_order` of
    the IEEE bits mapped to an unsigned order (negative values complemented, the sign bit of
    the others flipped; ``-0.0`` taken as ``+0.0``, as numpy compares them)."""
    n = x.shape[0]
    buf = np.empty(n)
    for i in range(n):
        buf[i] = x[i] + 0.0
    keys = buf.view(np.int64)
    flip = np.int64(-9223372036854775808)
    for i in range(n):
        k = keys[i]
        keys[i] = ~k if k < 0 else k ^ flip
    return radix_order(keys)
