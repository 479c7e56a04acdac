"""Which implementation a dispatch call runs: the Numba kernel or its plain-Python reference.

Every dispatch kernel has a plain-Python reference beside it that returns exactly what the
kernel returns (``kernel == getattr(kernel, "py_func", kernel) == reference`` is tested for
each), so either can serve a call and the results are bit-identical. They differ in cost:
a kernel that is neither compiled in this process nor in numba's disk cache costs its
compile first (tens of seconds for ``tempo`` on a cold cache), a reference costs nothing
up front but runs 10-1000x slower.

:class:`Pair` chooses per call, by the process-wide mode (:func:`kernel_mode`):

``"kernel"``
    Always the kernel (compiling it when needed): what a server wants, and what
    :func:`straggler.runtime.warmup.warmup` forces.
``"reference"``
    Always the reference (tests, and the one way to run without Numba's compiler).
``"auto"`` (the default)
    The kernel when it is ready (compiled in this process, or in numba's disk cache),
    else the reference, as long as the reference time this process has spent on that pair
    stays within the pair's budget (:attr:`Pair.budget_s`); past it, the kernel is
    compiled and used from then on. This is the ski-rental rule: rent (run the reference)
    until the rent paid reaches a share of the purchase (the compile), then buy; the
    references' total cost is at most ``sum(budget_s)`` whatever the workload, so a
    one-shot command (``straggler-compare``, ``straggler-plan``, a notebook's first cell)
    answers without compiling, and a long run compiles once, as before. The budget is
    enforced inside a reference call too (a ``SIGALRM`` interval timer interrupts it and
    the kernel takes over), so one large instance cannot make the reference run long; where
    no timer can be set (a thread other than the main one, or no ``setitimer``, or a
    ``SIGALRM`` handler of the caller's own), ``"auto"`` uses the kernel.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from contextlib import contextmanager

from ...formulations.validation import check_choice
from .._numba.cache import is_cached
from ._bounds import (
    forced_bound_kernel,
    forced_bound_reference,
    lower_bound_kernel,
    lower_bound_reference,
)
from ._counting import counting_bound_kernel, counting_bound_reference
from ._round_robin import a3_kernel, a3_reference
from ._score import score_times_kernel, score_times_reference
from ._semi_matching import semi_matching_kernel, semi_matching_reference
from ._tempo import stage_handles, tempo_kernel, tempo_reference
from ._tempo_prelude import prelude_handles, tempo_prelude_kernel, tempo_prelude_reference
from ._token_lp_fast import (
    exact_token_lp_kernel,
    exact_token_lp_reference,
    support_contract_kernel,
    support_contract_reference,
    support_fractional_kernel,
    support_fractional_reference,
    support_rebalance_kernel,
    support_rebalance_reference,
    support_swap_kernel,
    support_swap_reference,
    token_lp_handle,
    token_lp_kernel,
    token_lp_reference,
)

__all__ = [
    "MODES",
    "Pair",
    "PAIRS",
    "kernel_mode",
    "set_kernel_mode",
    "get_kernel_mode",
    "all_ready",
    "reference_seconds",
    "TEMPO",
    "PRELUDE",
    "TOKEN_LP",
    "SEMI_MATCHING",
    "LOWER_BOUND",
    "FORCED_BOUND",
    "COUNTING_BOUND",
    "EXACT_LP",
    "SUPPORT_CONTRACT",
    "SUPPORT_FRACTIONAL",
    "SUPPORT_REBALANCE",
    "SUPPORT_SWAP",
    "A3",
    "SCORE",
]

#: The modes of :func:`kernel_mode` (module docstring).
MODES = ("auto", "kernel", "reference")
_MODE = ["auto"]
_REFERENCE_S = [0.0]  # every pair's reference seconds, for callers that time a window


class _OutOfBudget(BaseException):
    """Raised into a reference call by the interval timer when its budget runs out (a
    BaseException, so no ``except Exception`` inside a reference can swallow it)."""


_ARMED = [False]


def _on_alarm(signum, frame):
    if _ARMED[0]:
        _ARMED[0] = False
        raise _OutOfBudget


class Pair:
    """A kernel and its reference; calling the pair runs the one the mode chooses.

    Parameters
    ----------
    kernel : numba dispatcher
    reference : callable
        Same arguments, same results (bit for bit).
    budget_s : float
        Reference seconds this process may spend on the pair in ``"auto"`` mode before the
        kernel is compiled: about a third of the kernel's cold compile on a 2-core machine
        (``benchmarks/cold_start.py`` measures both).
    stages : callable, optional
        For a kernel that calls separately compiled stages by address: returns its last
        argument (their handles), which the reference does not take; called only when the
        kernel runs, so a call the reference serves compiles nothing.

    Attributes
    ----------
    reference_calls : int
        Calls the reference served (it stops at the first kernel call in ``"auto"`` mode).
    reference_s : float
        Seconds those calls took (interrupted ones included).
    """

    __slots__ = ("kernel", "reference", "budget_s", "stages", "reference_calls", "reference_s",
                 "_ready")  # fmt: skip

    def __init__(self, kernel, reference, budget_s: float, stages=None) -> None:
        self.kernel = kernel
        self.reference = reference
        self.budget_s = float(budget_s)
        self.stages = stages
        self.reference_calls = 0
        self.reference_s = 0.0
        self._ready = False

    @property
    def name(self) -> str:
        py = getattr(self.kernel, "py_func", self.kernel)
        return f"{py.__module__}.{py.__name__}"

    def ready(self) -> bool:
        """Whether the kernel runs without compiling: compiled in this process (or numba's
        JIT disabled), or loadable from numba's disk cache. Once true, stays true."""
        if not self._ready:
            k = self.kernel
            self._ready = not hasattr(k, "signatures") or bool(k.signatures) or is_cached(k)
        return self._ready

    def uses_kernel(self) -> bool:
        """Whether a call made now from this thread would run the kernel."""
        mode = _MODE[0]
        if mode != "auto":
            return mode == "kernel"
        return self.ready() or not _can_interrupt() or self.reference_s >= self.budget_s

    def __call__(self, *args):
        mode = _MODE[0]
        if mode == "kernel" or (self._ready and mode == "auto"):  # the steady state
            return self._kernel(args)
        if mode == "reference":
            return self._reference(args, math.inf)
        if self.uses_kernel():
            return self._kernel(args)
        out = self._reference(args, self.budget_s - self.reference_s)
        return self._kernel(args) if out is _INTERRUPTED else out

    def _kernel(self, args):
        if self.stages is None:
            return self.kernel(*args)
        return self.kernel(*args, self.stages())

    def _reference(self, args, budget: float):
        t0 = time.perf_counter()
        self.reference_calls += 1
        try:
            if budget == math.inf:
                return self.reference(*args)
            return _within(budget, self.reference, args)
        finally:
            dt = time.perf_counter() - t0
            self.reference_s += dt
            _REFERENCE_S[0] += dt


_INTERRUPTED = object()


def _can_interrupt() -> bool:
    """Whether a reference call can be cut off by an interval timer here."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if not hasattr(signal, "setitimer"):
        return False
    handler = signal.getsignal(signal.SIGALRM)
    if handler not in (signal.SIG_DFL, signal.SIG_IGN, None, _on_alarm):
        return False  # the caller's own alarm: leave it alone
    return signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def _within(budget: float, fn, args):
    """``fn(*args)``, or :data:`_INTERRUPTED` once ``budget`` seconds have passed."""
    old = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        _ARMED[0] = True
        signal.setitimer(signal.ITIMER_REAL, max(budget, 1e-3))
        try:
            return fn(*args)
        finally:
            _ARMED[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0.0)
    except _OutOfBudget:
        return _INTERRUPTED
    finally:
        signal.signal(signal.SIGALRM, old)


# Budgets: about a third of each kernel's cold compile measured on the 2-core development
# machine (benchmarks/results/cold_start.json), at least 0.5 s.
TEMPO = Pair(tempo_kernel, tempo_reference, 8.0, stage_handles)
PRELUDE = Pair(tempo_prelude_kernel, tempo_prelude_reference, 1.0, prelude_handles)
TOKEN_LP = Pair(token_lp_kernel, token_lp_reference, 2.0)
SEMI_MATCHING = Pair(semi_matching_kernel, semi_matching_reference, 0.5)
LOWER_BOUND = Pair(lower_bound_kernel, lower_bound_reference, 1.5)
FORCED_BOUND = Pair(forced_bound_kernel, forced_bound_reference, 1.0)
COUNTING_BOUND = Pair(counting_bound_kernel, counting_bound_reference, 1.0)
EXACT_LP = Pair(exact_token_lp_kernel, exact_token_lp_reference, 1.0)
# (the support kernels call the token LP by address: token_lp_handle is their last argument)
SUPPORT_REBALANCE = Pair(support_rebalance_kernel, support_rebalance_reference, 1.0,
                         token_lp_handle)  # fmt: skip
SUPPORT_CONTRACT = Pair(support_contract_kernel, support_contract_reference, 1.0, token_lp_handle)
SUPPORT_SWAP = Pair(support_swap_kernel, support_swap_reference, 1.0, token_lp_handle)
SUPPORT_FRACTIONAL = Pair(support_fractional_kernel, support_fractional_reference, 1.0,
                          token_lp_handle)  # fmt: skip
A3 = Pair(a3_kernel, a3_reference, 0.6)
SCORE = Pair(score_times_kernel, score_times_reference, 0.5)

#: Every pair, by the kernel's ``module.name``.
PAIRS = {
    p.name: p
    for p in (
        TEMPO,
        PRELUDE,
        TOKEN_LP,
        SEMI_MATCHING,
        LOWER_BOUND,
        FORCED_BOUND,
        COUNTING_BOUND,
        EXACT_LP,
        SUPPORT_REBALANCE,
        SUPPORT_CONTRACT,
        SUPPORT_SWAP,
        SUPPORT_FRACTIONAL,
        A3,
        SCORE,
    )
}


def reference_seconds() -> float:
    """Seconds every pair's reference has run in this process (read it before and after a
    window of work to know what part of it the references did)."""
    return _REFERENCE_S[0]


def all_ready(*pairs) -> bool:
    """Whether each of ``pairs`` would run its kernel now (so a thread pool may call them)."""
    return all(p.uses_kernel() for p in pairs)


def get_kernel_mode() -> str:
    """The current mode (``"auto"``, ``"kernel"`` or ``"reference"``)."""
    return _MODE[0]


def set_kernel_mode(mode: str) -> str:
    """Set the process-wide mode (see the module docstring); returns the previous one.

    Raises
    ------
    InvalidInputError
        ``mode`` is not one of :data:`MODES`.
    """
    mode = check_choice(mode, "mode", "set_kernel_mode", list(MODES))
    old, _MODE[0] = _MODE[0], mode
    return old


@contextmanager
def kernel_mode(mode: str):
    """Context manager: :func:`set_kernel_mode` inside, the previous mode restored after.

    Examples
    --------
    >>> import numpy as np
    >>> with kernel_mode("reference"):  # A3: the GPU of each expert, by descending tokens
    ...     A3(np.array([3, 1]), np.ones((2, 2), bool), True).tolist()
    [0, 1]
    >>> get_kernel_mode()
    'auto'
    """
    old = set_kernel_mode(mode)
    try:
        yield
    finally:
        _MODE[0] = old


def dispatch_kernels() -> dict[str, object]:
    """The kernels ``solve_dispatch`` calls from Python, by ``module.name`` (each called
    through its kernel/reference pair, :mod:`straggler.solvers.dispatch._backend`)."""
    return {name: pair.kernel for name, pair in PAIRS.items()}


def needs_compile() -> bool:
    """Whether some dispatch kernel has no up-to-date entry in numba's disk cache and is
    not in memory yet, i.e. whether the next ``solve_dispatch`` will compile."""
    return not all(k.signatures or is_cached(k) for k in dispatch_kernels().values())
