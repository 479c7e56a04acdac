"""How long numba's JIT took: compile time kept apart from run time.

:class:`JitTimer` listens to numba's own compiler events while it is active and reports the
seconds spent holding (or waiting for) numba's global compiler lock, which covers both real
compilation and loading a compiled kernel from the on-disk cache (``cache=True``), and, of
those, the seconds of real compilation, per kernel. ``solve_dispatch`` subtracts the JIT
seconds from ``runtime_s``; :func:`straggler.runtime.warmup.warmup` reports them per kernel.

Intervals are merged over threads (a stack solved on a thread pool compiles once while the
other threads wait for the lock), so the JIT seconds never exceed the wall time. The
listeners are process-wide: JIT work done by an unrelated thread while a timer is active is
counted too.
"""

from __future__ import annotations

import contextlib
import threading
import time

from numba.core import event as _ev

__all__ = ["JitTimer", "merged_length", "compiled_on_disk", "library_kernels"]


def merged_length(intervals) -> float:
    """Total length of the union of ``(start, end)`` intervals.

    >>> merged_length([(0, 2), (1, 3), (5, 6)])
    4
    """
    total = 0
    end = None
    start = None
    for s, e in sorted(intervals):
        if end is None or s > end:
            if end is not None:
                total += end - start
            start, end = s, e
        else:
            end = max(end, e)
    if end is not None:
        total += end - start
    return total


class _Outermost:
    """Collects the outermost ``(start, end)`` of one event kind per thread (events nest)."""

    def __init__(self, keyed: bool) -> None:
        self.keyed = keyed
        self.depth: dict[int, int] = {}
        self.opened: dict[int, tuple[float, str]] = {}
        self.intervals: list[tuple[float, float]] = []
        self.by_key: dict[str, float] = {}

    def start(self, event, t: float, tid: int) -> None:
        d = self.depth.get(tid, 0)
        if d == 0:
            key = ""
            if self.keyed and isinstance(event.data, dict) and "dispatcher" in event.data:
                py = getattr(event.data["dispatcher"], "py_func", None)
                key = getattr(py, "__module__", "?") + "." + getattr(py, "__qualname__", "?")
            self.opened[tid] = (t, key)
        self.depth[tid] = d + 1

    def end(self, t: float, tid: int) -> None:
        d = self.depth.get(tid, 0) - 1
        self.depth[tid] = max(d, 0)
        if d == 0 and tid in self.opened:
            s, key = self.opened.pop(tid)
            self.intervals.append((s, t))
            if self.keyed:
                self.by_key[key] = self.by_key.get(key, 0.0) + (t - s)


class _Broadcast(_ev.Listener):
    """The one listener registered with numba (once, on first use) for an event kind: it
    forwards events to every active :class:`JitTimer`, so entering and leaving a timer costs
    a list operation, not a numba registration."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def on_start(self, event) -> None:
        t, tid = time.perf_counter(), threading.get_ident()
        with _LOCK:
            for timer in _ACTIVE:
                timer._collector(self.kind).start(event, t, tid)

    def on_end(self, event) -> None:
        t, tid = time.perf_counter(), threading.get_ident()
        with _LOCK:
            for timer in _ACTIVE:
                timer._collector(self.kind).end(t, tid)


_LOCK = threading.Lock()
_ACTIVE: list = []
_INSTALLED: list = []


def _install() -> None:
    with _LOCK:
        if not _INSTALLED:
            for kind in ("numba:compiler_lock", "numba:compile"):
                _ev.register(kind, _Broadcast(kind))
            _INSTALLED.append(True)


class JitTimer:
    """Context manager: JIT seconds spent while it is active.

    Attributes (valid after exit)
    -----------------------------
    jit_s : float
        Seconds in numba's compiler lock: compiling plus loading from the disk cache.
    compile_s : float
        Seconds of real compilation (cache misses), a part of ``jit_s``.
    compiled : dict[str, float]
        Compile seconds per top-level kernel (``module.name``), its jitted callees included.

    Timers nest and may run in several threads; each sees every JIT event of the process
    while it is active.

    Examples
    --------
    >>> with JitTimer() as t:
    ...     pass
    >>> t.jit_s, t.compile_s, t.compiled
    (0.0, 0.0, {})
    """

    def __init__(self) -> None:
        # the collectors are made on the first JIT event (most timed calls have none)
        self._lock: _Outermost | None = None
        self._compile: _Outermost | None = None
        self.jit_s = 0.0
        self.compile_s = 0.0
        self.compiled: dict[str, float] = {}

    def _collector(self, kind: str) -> _Outermost:
        if self._lock is None:
            self._lock, self._compile = _Outermost(keyed=False), _Outermost(keyed=True)
        return self._lock if kind == "numba:compiler_lock" else self._compile

    def __enter__(self) -> JitTimer:
        if not _INSTALLED:
            _install()
        with _LOCK:
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _LOCK:
            _ACTIVE.remove(self)
        if self._lock is not None:
            self.jit_s = float(merged_length(self._lock.intervals))
            self.compile_s = float(merged_length(self._compile.intervals))
            self.compiled = dict(self._compile.by_key)

    def jit_within(self, start: float, end: float) -> float:
        """JIT seconds (compiler-lock time) inside the window ``[start, end]`` of
        ``time.perf_counter()`` readings (valid after exit).

        >>> t = JitTimer()
        >>> t._collector("numba:compiler_lock").intervals = [(0.0, 2.0), (5.0, 9.0)]
        >>> t.jit_within(1.0, 6.0)
        2.0
        """
        if self._lock is None:
            return 0.0
        clipped = [(max(s, start), min(e, end)) for s, e in self._lock.intervals]
        return float(merged_length([(s, e) for s, e in clipped if e > s]))


@contextlib.contextmanager
def compiled_on_disk():
    """While the block runs, collect the ``module.name`` of every jitted function numba starts
    compiling that keeps a disk cache (callees included); the yielded list fills as it goes
    (read it after the block)."""
    from .cache import has_disk_cache

    out: list[str] = []
    with _ev.install_recorder("numba:compile") as rec:
        yield out
    for _, ev in rec.buffer:
        d = ev.data["dispatcher"]
        if ev.is_start and has_disk_cache(d):
            out.append(f"{d.py_func.__module__}.{d.py_func.__qualname__}")


def library_kernels(modules, *, defined_here: bool = True) -> dict[str, object]:
    """The ``@njit`` dispatchers in the namespaces of ``modules``, by ``module.name`` of
    their definition.

    ``defined_here=True``: those defined in the module (helpers included).
    ``defined_here=False``: every one the module holds, e.g. the kernels a Python wrapper
    module imports and calls (its entry kernels, which a warm-up must reach: a helper
    inlined into a cached caller never gets a compiled version of its own).
    """
    from numba.core.registry import CPUDispatcher

    out = {}
    for mod in modules:
        for obj in vars(mod).values():
            if isinstance(obj, CPUDispatcher):
                home = obj.py_func.__module__
                if not defined_here or home == mod.__name__:
                    out[f"{home}.{obj.py_func.__name__}"] = obj
    return out
