"""Every ``@njit`` option set of the library, each with the reason for its choices, and the
one tool that makes a cross-file disk cache safe (:func:`cache_depends_on`).

``cache=True`` is used only by modules whose jitted callees all live in the same file (numba's
cache does not see edits in other files), or by a function whose cache is tied to the files of
its callees with :func:`cache_depends_on`. CI points ``NUMBA_CACHE_DIR`` at a fresh directory.
The rest of what this library does with numba's internals lives beside this module: calls by
address and the compile without a CPython wrapper in :mod:`straggler.solvers._numba.address`,
every access to numba's disk cache (its state, its key, its index, its saves) in
:mod:`straggler.solvers._numba.cache`, compile timing in :mod:`straggler.solvers._numba.compile`,
the clock read in :mod:`straggler.solvers._numba.clock`.
"""

from __future__ import annotations

from .cache import cache_depends_on, source_digest

#: ``no_cfunc_wrapper``: numba otherwise compiles, beside each function, a C-ABI wrapper that
#: only a first-class function value or a ``cfunc`` would call (jitted callers and the calls by
#: address of :mod:`straggler.solvers._numba.address` call the function itself, Python calls
#: the CPython wrapper).
NJIT = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", no_cfunc_wrapper=True)
NJIT_PARALLEL = dict(NJIT, parallel=True)
#: For a jitted helper with one call site, inlined into its caller at numba's IR level: every
#: jitted function's library links and re-optimizes all its callees, so each level of calls
#: adds a pass over everything below it (this keeps tempo's cold compile down).
NJIT_INLINE = dict(NJIT, inline="always")
#: For a function only jitted code calls (the simulator's step phases and helpers): numba
#: builds, besides the function, a CPython entry point (unboxing every argument, a tuple of
#: arrays field by field) and a C-callable wrapper, and optimizes and emits both; without them
#: a phase compiles in a third to a half less time. A Python call of such a function has no
#: entry point to run and crashes: Python runs its ``py_func``.
NJIT_JITTED = dict(NJIT, no_cpython_wrapper=True, no_cfunc_wrapper=True)
#: For a step phase that only borrows its caller's arrays: compiled apart (each once, on the
#: disk cache; LLVM inlines it into the caller when it links it), for jitted callers only
#: (:data:`NJIT_JITTED`), and without numba's reference counting (``_nrt=False``): counting a
#: reference at every binding (an atomic increment and decrement per array, per phase, per
#: step) is pure cost for arrays the caller keeps alive. Such a function must neither allocate
#: nor return an array (the caller would own a reference never counted).
NJIT_BORROW = dict(NJIT_JITTED, _nrt=False)
#: A small helper of :data:`NJIT_BORROW` phases only, inlined into them at numba's IR level.
NJIT_BORROW_INLINE = dict(NJIT_BORROW, inline="always")
#: A phase that borrows as :data:`NJIT_BORROW` does and that Python calls too (its CPython
#: entry point kept: the simulator's public ``step_time``).
NJIT_BORROW_ENTRY = dict(NJIT, _nrt=False)
#: For a function with an object-mode block (a call back into Python): it holds the GIL (object
#: mode needs it) and counts references (its block hands Python objects back).
NJIT_OBJMODE = dict(NJIT, nogil=False, _nrt=True)

__all__ = [
    "NJIT",
    "NJIT_INLINE",
    "NJIT_PARALLEL",
    "NJIT_JITTED",
    "NJIT_BORROW",
    "NJIT_BORROW_INLINE",
    "NJIT_BORROW_ENTRY",
    "NJIT_OBJMODE",
    "cache_depends_on",
    "source_digest",
]
