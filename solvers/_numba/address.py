"""Calling separately compiled code by its address: the one mechanism, and the compile that
serves it.

A jitted function's code library links in every jitted callee and optimizes the whole module
again (``numba.core.codegen.CPUCodeLibrary.finalize``), so each level of calls re-optimizes
everything below it, and a caller compiled for one callee must compile again for another.
Calling a callee through the address of its own compiled code (as numba calls a first-class
function, ``numba.core.lowering.Lower._lower_call_FunctionType``) compiles the callee once, on
its own, and keeps it out of every caller. Every such call here is emitted by
:func:`_emit_call`, in numba's own calling convention (an exception the callee raises
propagates), through one of two front ends:

* :func:`call_compiled` (``handle, function, args``): the caller is typed with ``function``
  (an ``@njit`` dispatcher) and the handle carries a fingerprint of the signature, checked at
  run time: tempo's stages and the token LP (:mod:`straggler.solvers.dispatch._tempo`,
  :mod:`straggler.solvers.dispatch._token_lp_fast`);
* :func:`address_call` (``address, *args``): the caller is typed by a rule on the argument
  types alone, with no dispatcher, so one compiled caller serves every callee of that
  signature: the routing policies, called by ``route_batch_kernel`` and the simulator's step
  loop (:func:`straggler.solvers.routing._core.call_policy`), whose addresses
  :func:`wrapperless_address` gives (the callee compiled without numba's CPython wrapper, which
  such a callee never needs).

:func:`readonly` types an array read-only without copying it, so that calls from Python (on a
problem's read-only arrays) and from jitted code (on arrays it built) share one compiled
version of a callee.

Callers of these calls tie their disk cache to this file (``cache_depends_on``): the code
emitted for a call is written here.
"""

from __future__ import annotations

import hashlib
import sys
import types as pytypes

from numba import types
from numba.core import cgutils, compiler, lowering, typed_passes
from numba.core.compiler_machinery import register_pass
from numba.core.errors import TypingError
from numba.core.imputils import impl_ret_borrowed, impl_ret_new_ref
from numba.extending import intrinsic, lower_builtin, overload, type_callable

from .cache import share_cache, source_digest

__all__ = [
    "compiled_address",
    "call_compiled",
    "address_call",
    "wrapperless_address",
    "readonly",
]


def _emit_call(context, builder, address, ret, argtys, args):
    """Call the compiled function at ``address`` (an LLVM int) with ``args`` of numba types
    ``argtys``, returning ``ret``, in numba's calling convention; an exception the callee
    raised propagates to the caller's caller. The one place such a call is emitted."""
    fnty = context.call_conv.get_function_type(ret, argtys)
    fn = builder.inttoptr(address, fnty.as_pointer())
    status, res = context.call_conv.call_function(builder, fn, ret, argtys, args)
    with cgutils.if_unlikely(builder, status.is_error):
        context.call_conv.return_status_propagate(builder, status)
    return res


# -- call_compiled: typed with the callee's dispatcher, the signature checked at run time -------


def _fingerprint(argtypes, return_type) -> int:
    """A process-independent int64 naming a signature (cached callers compare it at run time)."""
    text = f"{tuple(argtypes)!r}->{return_type!r}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little", signed=True)


def compiled_address(function, argtypes) -> tuple[int, int]:
    """``(address, fingerprint)`` of the code of ``function`` (an ``@njit`` dispatcher) for
    exactly the numba types ``argtypes``, compiled here or loaded from numba's disk cache: the
    handle :func:`call_compiled` takes in jitted code. ``(0, 0)`` under ``NUMBA_DISABLE_JIT=1``
    (the plain-Python :func:`call_compiled` ignores the handle).

    Examples
    --------
    >>> from numba import njit, types
    >>> @njit
    ... def twice(x):
    ...     return 2 * x
    >>> address, fingerprint = compiled_address(twice, (types.int64,))
    >>> address != 0 or not hasattr(twice, "compile")
    True
    """
    if not hasattr(function, "compile"):  # NUMBA_DISABLE_JIT=1, or a plain function
        return 0, 0
    argtypes = tuple(argtypes)
    function.compile(argtypes)
    cres = function.overloads[argtypes]
    address = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
    return address, _fingerprint(argtypes, cres.signature.return_type)


def call_compiled(handle, function, args):
    """``function(*args)``.

    In jitted code ``handle`` is ``compiled_address(function, types of args)`` and the call is
    an indirect call of that compiled code (:func:`_emit_call`): the caller is typed with
    ``function`` but never includes its code, so the callee compiles once however many callers
    it has. The handle's fingerprint is checked against the signature the caller was typed
    with; a handle for other argument types raises ``ValueError`` instead of running code
    compiled for other types. In Python (a ``py_func``, or ``NUMBA_DISABLE_JIT=1``) the handle
    is ignored.
    """
    return function(*args)


def _call_type(context, handle, function, args):
    """The signature ``call_compiled`` is typed with in jitted code, or None."""
    if not (
        isinstance(handle, types.BaseTuple)
        and len(handle) == 2
        and all(isinstance(t, types.Integer) for t in handle)
        and isinstance(function, types.Dispatcher)
        and isinstance(args, types.BaseTuple)
    ):
        return None
    argtys = tuple(args.types)
    sig = function.get_call_type(context, argtys, {})
    if sig is None or tuple(sig.args) != argtys:
        raise TypingError(
            f"call_compiled: {function.dispatcher.py_func.__name__} has no compiled version for "
            f"exactly {argtys} (got {sig})"
        )
    return sig.return_type


# Typed and lowered directly (not an @overload, whose implementation numba would compile once
# more for every signature): the call is a few instructions in the caller.
@type_callable(call_compiled)
def _call_compiled_typer(context):
    def typer(handle, function, args):
        return _call_type(context, handle, function, args)

    return typer


@lower_builtin(call_compiled, types.BaseTuple, types.Dispatcher, types.BaseTuple)
def _call_compiled_lower(context, builder, sig, llargs):
    handle_ty, function, args_ty = sig.args
    argtys = tuple(args_ty.types)
    ret = sig.return_type
    expected = _fingerprint(argtys, ret)
    name = function.dispatcher.py_func.__name__
    handle_v, _, tup = llargs
    address, fp = (
        context.cast(builder, builder.extract_value(handle_v, i), handle_ty[i], types.int64)
        for i in range(2)
    )
    wrong = builder.icmp_signed("!=", fp, context.get_constant(types.int64, expected))
    with cgutils.if_unlikely(builder, wrong):
        context.call_conv.return_user_exc(
            builder,
            ValueError,
            (f"call_compiled: the handle is not the address of {name}{argtys}",),
        )
    values = [builder.extract_value(tup, i) for i in range(len(argtys))]
    res = _emit_call(context, builder, address, ret, argtys, values)
    return impl_ret_new_ref(context, builder, ret, res)


# -- address_call: typed by a rule on the argument types, one caller for every callee ----------


def address_call(return_type):
    """An intrinsic ``call(address, *args)`` for jitted code: the code at ``address`` (an
    integer, e.g. :func:`wrapperless_address`'s) called with ``args``, returning the numba type
    ``return_type(argtypes)``. The caller never names the callee, so it compiles once for
    every callee of that signature; whoever hands out the address guarantees the signature.

    Examples
    --------
    >>> call_twice = address_call(lambda argtypes: argtypes[0])
    """

    @intrinsic
    def call(typingctx, address, *args):
        if not isinstance(address, types.Integer):
            return None
        argtys = tuple(args)
        ret = return_type(argtys)
        star = types.StarArgTuple.from_types(argtys)

        def codegen(context, builder, signature, llargs):
            values = [builder.extract_value(llargs[1], i) for i in range(len(argtys))]
            return _emit_call(context, builder, llargs[0], ret, argtys, values)

        return ret(address, star), codegen

    return call


# -- a kernel compiled for calls by address only ---------------------------------------------
#
# numba builds, beside every compiled function, a CPython wrapper that unboxes its arguments
# and boxes its result: for a routing policy's kernel, four records (13 arrays and the option
# arrays), about 650 LLVM instructions, as much as a small kernel's own code, lowered,
# optimized and compiled to machine code for every policy. A callee called by address never
# needs it. The version wrapperless_address hands out is compiled without it, by a second
# dispatcher of the same function: the same flags (so numba's overload implementations the
# kernel uses are shared with everything else, not built again), the same code, only the
# wrapper left out. The kernel itself stays callable from Python (it compiles its own version,
# with the wrapper, on the first such call).


class _LowerWithoutWrapper(lowering.Lower):
    """numba's lowering, minus the CPython wrapper (the code is only called by address)."""

    def create_cpython_wrapper(self, release_gil=False):
        pass


@register_pass(mutates_CFG=True, analysis_only=False)
class _NativeLoweringByAddress(typed_passes.NativeLowering):
    """numba's native lowering pass with :class:`_LowerWithoutWrapper`."""

    _name = "straggler_native_lowering_by_address"

    @property
    def lowering_class(self):
        return _LowerWithoutWrapper


class _ByAddressCompiler(compiler.CompilerBase):
    """numba's nopython pipeline with :class:`_NativeLoweringByAddress` for its lowering."""

    def define_pipelines(self):
        pm = compiler.DefaultPassBuilder.define_nopython_pipeline(self.state)
        pm.passes = [
            (_NativeLoweringByAddress if cls is typed_passes.NativeLowering else cls, what)
            for cls, what in pm.passes
        ]
        pm.finalize()
        return [pm]


#: What the disk cache keys the versions compiled without a wrapper on, apart from the
#: kernel's own: this file's source (which decides how they are compiled).
_CACHE_KEY = ("by address", source_digest(sys.modules[__name__]))


def _wrapperless(kernel):
    """The dispatcher that compiles ``kernel`` (an ``@njit`` dispatcher) without a CPython
    wrapper, made once per kernel: the same code and options, the same disk cache file and
    cache key (the file and, from ``cache_depends_on``, its callees' files) as ``kernel``,
    its entries keyed apart there
    (:func:`~straggler.solvers._numba.cache.share_cache`). It compiles a copy of the
    function named ``<name>__by_address``: the symbols of its code must differ from the
    kernel's, which one process may load beside them (numba names a function's code by its
    name, types and a counter local to the process that compiled it). Never called from
    Python (its versions have no entry point there): :func:`wrapperless_address` reads the
    address of its code."""
    twin = kernel.__dict__.get("_by_address")
    if twin is None:
        f = kernel.py_func
        copy = pytypes.FunctionType(
            f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__
        )
        copy.__kwdefaults__ = f.__kwdefaults__
        copy.__qualname__ = f.__qualname__ + "__by_address"
        twin = type(kernel)(
            copy,
            locals=kernel.locals,
            targetoptions=dict(kernel.targetoptions),
            pipeline_class=_ByAddressCompiler,
        )
        share_cache(twin, kernel, _CACHE_KEY)
        kernel._by_address = twin
    return twin


def wrapperless_address(kernel, argtypes) -> tuple[int, object]:
    """``(address, return type)`` of the code of ``kernel`` (an ``@njit`` dispatcher) for the
    numba types ``argtypes``, compiled without numba's CPython wrapper (:func:`_wrapperless`) or
    loaded from numba's disk cache, for :func:`address_call` in jitted code that passes exactly
    those types. The caller checks the return type it relies on."""
    argtypes = tuple(argtypes)
    twin = _wrapperless(kernel)
    twin.compile(argtypes)
    cres = twin.overloads[argtypes]
    address = cres.library.get_pointer_to_function(cres.fndesc.llvm_func_name)
    return address, cres.signature.return_type


# -- one compiled version for read-only and writeable arrays ----------------------------------


def readonly(a):
    """A read-only view of the array ``a`` (in jitted code: ``a`` itself, typed read-only).

    numba compiles one version of a function per argument type, and read-only is part of an
    array's type (its data model is the same): a callee that Python calls on a problem's
    read-only arrays and jitted code calls on arrays it built shares one compiled version when
    both pass ``readonly(...)`` (nothing is copied).

    Examples
    --------
    >>> import numpy as np
    >>> readonly(np.arange(3)).flags.writeable
    False
    """
    v = a.view()
    v.setflags(write=False)
    return v


@intrinsic
def _as_readonly(typingctx, a):
    if not isinstance(a, types.Array):
        return None

    def codegen(context, builder, signature, args):
        return impl_ret_borrowed(context, builder, signature.return_type, args[0])

    return a.copy(readonly=True)(a), codegen


@overload(readonly)
def _readonly_jit(a):
    return lambda a: _as_readonly(a)
