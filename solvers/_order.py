"""Stable orders by LSD radix sort, as Numba kernels: exact replacements of
``np.argsort(..., kind="stable")`` for the key types the kernels sort.

numba's own ``np.argsort`` (its merge sort and quick sort) compiles to several seconds of
machine code per key type; these loops compile in a fraction of that and return the same
permutation as numpy's stable sort (ordered by ``(key, index)``). Each key type is mapped to
int64 keys whose unsigned order is the order wanted, then sorted by the one
:func:`radix_order`; the float orders share one compiled function (:func:`float_order`), the
names the kernels call are thin wrappers inlined into them. Each function states the numpy
call it equals; ``tests/test_order.py`` checks it against numpy.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import lower_builtin, type_callable

from ._numba.jit import NJIT, NJIT_INLINE

__all__ = [
    "float_order",
    "radix_order",
    "stable_argsort",
    "stable_argsort_desc",
    "stable_argsort_float",
    "stable_argsort_int_desc",
    "stable_argsort_uint",
]


def bits64(x):
    """The 64 bits of a float64, uint64 or int64 scalar ``x``, read as an int64.

    In jitted code one LLVM ``bitcast`` (numba's ``arr.view(np.int64)`` would compile its
    dtype-change and view code into every caller).

    Examples
    --------
    >>> int(bits64(np.float64(1.0))) == 0x3FF0000000000000
    True
    >>> int(bits64(np.uint64(2**63)))
    -9223372036854775808
    """
    return np.asarray(x).reshape(()).view(np.int64)[()]


@type_callable(bits64)
def _bits64_typer(context):
    def typer(x):
        if isinstance(x, (types.Float, types.Integer)) and x.bitwidth == 64:
            return types.int64
        return None

    return typer


@lower_builtin(bits64, types.Float)
@lower_builtin(bits64, types.Integer)
def _bits64_lower(context, builder, sig, args):
    (x,) = args
    if isinstance(sig.args[0], types.Integer):  # the same bits, another reading
        return x
    return builder.bitcast(x, ir.IntType(64))


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
    order = np.empty(n, np.int64)
    for i in range(n):
        order[i] = i
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
def float_order(x, descending):
    """``np.argsort(x, kind="stable")`` (``descending``: ``np.argsort(-x, kind="stable")``)
    for float64 ``x`` without NaN: :func:`radix_order` of the IEEE bits mapped to an unsigned
    order (negative values complemented, the sign bit of the others flipped; ``-0.0`` taken as
    ``+0.0``, as numpy compares them), complemented for ``descending`` (which reverses the
    order, ties kept by index)."""
    n = x.shape[0]
    keys = np.empty(n, np.int64)
    flip = np.int64(-9223372036854775808)
    for i in range(n):
        k = bits64(x[i] + 0.0)
        k = ~k if k < 0 else k ^ flip
        keys[i] = ~k if descending else k
    return radix_order(keys)


@njit(**NJIT_INLINE)
def stable_argsort(x):
    """``np.argsort(x, kind="stable")`` for float64 ``x`` without NaN: :func:`float_order`."""
    return float_order(x, np.bool_(False))


@njit(**NJIT_INLINE)
def stable_argsort_desc(x):
    """``np.argsort(-x, kind="stable")`` for float64 ``x`` without NaN: :func:`float_order`,
    descending."""
    return float_order(x, np.bool_(True))


#: ``np.argsort(x, kind="stable")`` for float64 ``x`` without NaN: :func:`stable_argsort`
#: itself, under the name the callers that sort values of either sign use.
stable_argsort_float = stable_argsort


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
    keys = np.empty(n, np.int64)
    for i in range(n):
        keys[i] = bits64(x[i])
    return radix_order(keys)
