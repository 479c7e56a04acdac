"""numba's disk cache, the one module that reaches into it: a function's cache key tied to
other files (:func:`cache_depends_on`), a stale index read as a miss, the cache of a second
dispatcher of one function (:func:`share_cache`), what the cache holds for a kernel, and its
saves made safe across processes.

numba keeps no public interface for any of this; what is used here is numba's
``numba/core/caching.py`` (``Dispatcher._cache``, ``FunctionCache``, ``NullCache``,
``IndexDataCacheFile`` with its ``_source_stamp``, ``_load_index``, ``_cache_path`` and
``save``), as of numba 0.68 (``pyproject.toml`` pins the minor releases
``tests/test_numba_home.py`` passes on). Any surprise in those internals reads as "no disk
cache" or "not cached": a function compiled in this process instead of loaded, a compile
notice printed that was not needed, a warm-up that compiles in one process; never a wrong
answer.
"""

from __future__ import annotations

import contextlib
import hashlib
import pathlib
import pickle

from numba.core import caching

__all__ = [
    "source_digest",
    "cache_depends_on",
    "share_cache",
    "is_cached",
    "has_disk_cache",
    "cache_folder",
    "cache_stamp",
    "cache_misses",
    "saves_locked",
]


# -- a stale cache index is a cache miss -------------------------------------------------------
#
# numba reads a function's cache index by unpickling it before it compares the index's source
# stamp with the file's: an index written by an older version of this library can name a class
# since removed or renamed (a record in a kernel's signature), and the unpickling then raises
# instead of the stale index being ignored. Every kernel module imports this one (through
# solvers/_numba/jit.py, for its options) before its first call.


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


# -- the cache key ---------------------------------------------------------------------------


def source_digest(*modules) -> str:
    """SHA-256 over the source files of ``modules`` (module objects), in the given order.

    Examples
    --------
    >>> import straggler.solvers._numba.cache as c
    >>> source_digest(c) == source_digest(c) and len(source_digest(c)) == 64
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
    recompiles. Call it right after the definition, before the first call; a later call
    replaces the digest. Returns True; if the installed numba has no such key (a future
    internal change), it turns the disk cache of ``dispatcher`` off instead (correct, only
    slower) and returns False.
    """
    cache = getattr(dispatcher, "_cache", None)
    index = getattr(cache, "_cache_file", None)
    if index is None or not hasattr(index, "_source_stamp"):
        dispatcher._cache = caching.NullCache()
        return False
    base = getattr(index, "_own_stamp", None)
    if base is None:  # the function's own stamp, kept so that a later call replaces the digest
        base = index._own_stamp = index._source_stamp
    index._source_stamp = (base, source_digest(*modules))
    return True


class _KeyedCache(caching.FunctionCache):
    """A function's own disk cache file, its entries keyed apart by ``key``."""

    def __init__(self, py_func, key):
        super().__init__(py_func)
        self._straggler_key = key

    def _index_key(self, sig, codegen):
        return (self._straggler_key, super()._index_key(sig, codegen))


def share_cache(twin, kernel, key) -> bool:
    """Give ``twin`` (a second dispatcher of ``kernel``'s function, compiled differently) the
    disk cache of ``kernel``: the same file, named after the function and keyed on its code,
    the same stamp (its source file's, with :func:`cache_depends_on`'s digest), its entries
    keyed apart by ``key`` (anything picklable that names how ``twin`` compiles). Without a
    disk cache for ``kernel`` (``cache=False``) ``twin`` keeps none either; in a cache layout
    this module does not know, ``twin`` gets none (correct, only slower) and False is
    returned."""
    if not has_disk_cache(kernel):
        twin._cache = caching.NullCache()
        return True
    cache = _KeyedCache(kernel.py_func, key)
    index, own = cache._cache_file, getattr(kernel._cache, "_cache_file", None)
    if own is None or not hasattr(index, "_source_stamp") or not hasattr(own, "_source_stamp"):
        twin._cache = caching.NullCache()
        return False
    index._source_stamp = own._source_stamp
    twin._cache = cache
    return True


# -- what the cache holds --------------------------------------------------------------------


def is_cached(kernel) -> bool:
    """Whether numba's disk cache holds an up-to-date compiled version of ``kernel`` (a
    ``@njit`` dispatcher): its index file exists and matches the source file's stamp (with
    :func:`cache_depends_on`'s digest of its callees' files)."""
    try:
        return bool(kernel._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - NullCache (cache=False) or another numba version
        return False


def has_disk_cache(kernel) -> bool:
    """Whether ``kernel`` (a dispatcher) keeps its compiled versions on disk (``cache=True``)."""
    cache = getattr(kernel, "_cache", None)
    return cache is not None and not isinstance(cache, caching.NullCache)


def cache_folder(kernel) -> str | None:
    """The folder of ``kernel``'s disk cache (``NUMBA_CACHE_DIR`` or beside its source), or
    None without a disk cache."""
    return getattr(getattr(kernel, "_cache", None), "cache_path", None)


def cache_stamp(kernel):
    """The stamp ``kernel``'s disk cache compares its index with (its source file's, with
    :func:`cache_depends_on`'s digest of its callees' files), or None without one."""
    index = getattr(getattr(kernel, "_cache", None), "_cache_file", None)
    return getattr(index, "_source_stamp", None)


def cache_misses(kernels) -> int:
    """How many times ``kernels`` (dispatchers) compiled instead of loading from the disk
    cache, in this process so far (numba's dispatcher statistics)."""
    return sum(sum(k.stats.cache_misses.values()) for k in kernels)


# -- saves across processes ------------------------------------------------------------------


@contextlib.contextmanager
def saves_locked(lock):
    """While the block runs, every numba disk-cache save of this process runs inside
    ``lock(folder)`` (a context manager, e.g. an exclusive file lock in that folder, which
    other processes writing the same cache take too).

    numba saves an entry (numba/core/caching.py, ``IndexDataCacheFile.save``) by reading the
    function's index, picking the first data file name the index does not use, and rewriting
    the index and that data file, with no lock between the read and the writes. Two processes
    compiling two signatures of one function at once can then both pick the same name: the
    index that survives maps one signature to the other's machine code. Under a shared lock
    each save reads the index the other process wrote, so the names differ."""
    cls = caching.IndexDataCacheFile
    original = cls.save

    def save(self, key, data):
        with lock(self._cache_path):
            return original(self, key, data)

    cls.save = save
    try:
        yield
    finally:
        cls.save = original
