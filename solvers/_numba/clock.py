"""``CLOCK_MONOTONIC`` in nanoseconds, the same clock in Python and in jitted code: the router
times its kernel with it, inside ``route_batch_kernel`` and the simulator's step loop (whose
disk caches are tied to this file: the clock read is emitted here).
"""

from __future__ import annotations

import time

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

__all__ = ["monotonic_ns"]


def monotonic_ns() -> int:
    """``CLOCK_MONOTONIC`` in nanoseconds, in Python and in jitted code.

    Jitted code calls the C library's ``clock_gettime`` directly (:func:`_clock_gettime_ns`,
    resolved by name when the code is linked, so a function that calls it can be cached on
    disk, which a ctypes function pointer prevents); Python (a ``py_func``, or
    ``NUMBA_DISABLE_JIT=1``) reads the same clock through :func:`time.monotonic_ns`.
    """
    return time.monotonic_ns()


@intrinsic
def _clock_gettime_ns(typingctx):
    """``clock_gettime(CLOCK_MONOTONIC)`` in nanoseconds (jitted code only)."""
    sig = types.int64()

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        i32 = ir.IntType(32)
        timespec = ir.LiteralStructType([i64, i64])  # struct timespec on 64-bit Linux
        fnty = ir.FunctionType(i32, [i32, timespec.as_pointer()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "clock_gettime")
        ts = cgutils.alloca_once(builder, timespec)
        builder.call(fn, [ir.Constant(i32, 1), ts])  # CLOCK_MONOTONIC = 1
        sec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 0))
        nsec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 1))
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)

    return sig, codegen


@overload(monotonic_ns)
def _monotonic_ns_jit():
    return lambda: _clock_gettime_ns()
