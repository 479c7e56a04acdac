"""All ``@njit`` options come from here, and the one tool that makes a cross-file cache safe.

``cache=True`` is used only by modules whose jitted callees all live in the same file (numba's
cache does not see edits in other files), or by a function whose cache is tied to the files of
its callees with :func:`cache_depends_on`. CI points ``NUMBA_CACHE_DIR`` at a fresh directory.
"""

from __future__ import annotations

import hashlib
import pathlib

NJIT = dict(nogil=True, cache=True, fastmath=False, error_model="numpy")
NJIT_PARALLEL = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", parallel=True)
#: For a jitted helper with one call site, inlined into its caller at numba's IR level: every
#: jitted function's library links and re-optimizes all its callees, so each level of calls
#: adds a pass over everything below it (this keeps tempo's cold compile down).
NJIT_INLINE = dict(NJIT, inline="always")

__all__ = [
    "NJIT",
    "NJIT_INLINE",
    "NJIT_PARALLEL",
    "cache_depends_on",
    "source_digest",
]


def source_digest(*modules) -> str:
    """SHA-256 over the source files of ``modules`` (module objects), in the given order.

    Examples
    --------
    >>> import straggler.solvers._jit as j
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
