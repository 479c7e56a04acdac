"""All ``@njit`` options come from here, the one tool that makes a cross-file cache safe, and
the one way jitted code calls a separately compiled kernel without compiling it in.

``cache=True`` is used only by modules whose jitted callees all live in the same file (numba's
cache does not see edits in other files), or by a function whose cache is tied to the files of
its callees with :func:`cache_depends_on`. CI points ``NUMBA_CACHE_DIR`` at a fresh directory.
"""

from __future__ import annotations

import hashlib
import pathlib
import pickle

from numba import types
from numba.core import caching, cgutils
from numba.core.errors import TypingError
from numba.core.imputils import impl_ret_new_ref
from numba.extending import lower_builtin, type_callable

#: ``no_cfunc_wrapper``: numba otherwise compiles, beside each function, a C-ABI wrapper that
#: only a first-class function value or a ``cfunc`` would call (jitted callers and
#: :func:`call_compiled` call the function itself, Python calls the CPython wrapper).
NJIT = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", no_cfunc_wrapper=True)
NJIT_PARALLEL = dict(NJIT, parallel=True)
#: For a jitted helper with one call site, inlined into its caller at numba's IR level: every
#: jitted function's library links and re-optimizes all its callees, so each level of calls
#: adds a pass over everything below it (this keeps tempo's cold compile down).
NJIT_INLINE = dict(NJIT, inline="always")

__all__ = [
    "NJIT",
    "NJIT_INLINE",
    "NJIT_PARALLEL",
    "cache_depends_on",
    "call_compiled",
    "compiled_address",
    "source_digest",
]


# -- a stale cache index is a cache miss -------------------------------------------------------
#
# numba reads a function's cache index by unpickling it before it compares the index's source
# stamp with the file's: an index written by an older version of this library can name a class
# since removed or renamed (a record in a kernel's signature), and the unpickling then raises
# instead of the stale index being ignored.


def _tolerant(load_index):
    def _load_index(self):
        try:
            return load_index(self)
        except (AttributeError, ImportError, pickle.UnpicklingError, EOFError, TypeError):
            return {}  # stale: compile again, and the next save writes a fresh index

    _load_index.straggler_tolerant = True
    return _load_index


if not getattr(caching.IndexDataCacheFile._load_index, "straggler_tolerant", False):
    caching.IndexDataCacheFile._load_index = _tolerant(caching.IndexDataCacheFile._load_index)


def source_digest(*modules) -> str:
    """SHA-256 over the source files of ``modules`` (module objects), in the given order.

    Examples
    --------
    >>> import straggler.solvers._numba.jit as j
    >>> source_digest(j) == source_digest(j) and len(source_digest(j)) == 64
    True
    """
    h = hashlib.sha256()
    for m in modules:
        path = pathlib.Path(m.__file__)
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_depends_on(dispatcher, *modules) -> bool:
    """Make the disk cache of ``dispatcher`` (an ``@njit(cache=True)`` function) stale whenever
    the source of any of ``modules`` changes, not only its own file.

    numba keys a cached function on a hash of its own source file; a jitted function that calls
    kernels of another file would load stale machine code after an edit there. This adds the
    digest of the callees' files (:func:`source_digest`) to that key, so an edit in any of them
    recompiles. Call it right after the definition, before the first call. Returns True; if the
    installed numba has no such key (a future internal change), it turns the disk cache of
    ``dispatcher`` off instead (correct, only slower) and returns False.
    """
    cache = getattr(dispatcher, "_cache", None)
    index = getattr(cache, "_cache_file", None)
    if index is None or not hasattr(index, "_source_stamp"):
        from numba.core.caching import NullCache

        dispatcher._cache = NullCache()
        return False
    base = getattr(index, "_own_stamp", None)
    if base is None:  # the function's own stamp, kept so that a later call replaces the digest
        base = index._own_stamp = index._source_stamp
    index._source_stamp = (base, source_digest(*modules))
    return True


# -- calling a kernel by the address of its compiled code -------------------------------------
#
# A jitted function's code library links in every jitted callee and optimizes the whole module
# again (``numba.core.codegen.CPUCodeLibrary.finalize``), so each level of calls re-optimizes
# everything below it. Calling a heavy stage through the address of its own compiled code (as
# numba calls a first-class function, ``numba.core.lowering.Lower._lower_call_FunctionType``)
# compiles the stage once, on its own, and keeps it out of every caller.


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
    an indirect call of that compiled code in numba's own calling convention (an exception the
    callee raises propagates): the caller is typed with ``function`` but never includes its
    code, so the callee compiles once however many callers it has. The handle's fingerprint is
    checked against the signature the caller was typed with; a handle for other argument types
    raises ``ValueError`` instead of running code compiled for other types. In Python (a
    ``py_func``, or ``NUMBA_DISABLE_JIT=1``) the handle is ignored.
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
    fnty = context.call_conv.get_function_type(ret, argtys)
    fn = builder.inttoptr(address, fnty.as_pointer())
    status, res = context.call_conv.call_function(builder, fn, ret, argtys, values)
    with cgutils.if_unlikely(builder, status.is_error):
        context.call_conv.return_status_propagate(builder, status)
    return impl_ret_new_ref(context, builder, ret, res)
