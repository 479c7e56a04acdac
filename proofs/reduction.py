"""Theorem 1 (NP-hardness) as code: Balanced PARTITION -> two-GPU dispatch (TEMPO A.1).

Given positive integers ``w_1..w_m`` (``m`` even, ``sum w = 2W``), build: two GPUs, full
replication, expert ``i`` with ``w_i`` tokens, ``a = c = 0``, ``b = T/(m/2)``,
``beta = T/W``. Then a dispatch of makespan ``<= T`` exists iff a balanced partition
(``|S| = m/2``, ``w(S) = W``) exists. Both directions are constructive:
:func:`dispatch_from_partition` and :func:`partition_from_dispatch`. The default budget
``T = (m/2)*W`` makes ``b = W`` and ``beta = m/2`` (exact in binary floating point).

The tests check the equivalence on small instances against exact oracles in both
directions (``tests/test_certificates.py``).
"""

from __future__ import annotations

import itertools

import numpy as np

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem
from ..formulations.errors import param_error
from ..formulations.validation import check_array, check_real

__all__ = [
    "partition_to_dispatch",
    "has_balanced_partition",
    "dispatch_from_partition",
    "partition_from_dispatch",
]


_WEIGHTS_FORM = "a non-empty 1-D array of an even number of positive integers below 2**52"


def _weights_iv(weights, func: str) -> np.ndarray:
    w = check_array(
        weights, "weights", func, kind="int", ndim=1, lo=1, hi=2**52, expected=_WEIGHTS_FORM
    )
    if w.size == 0 or w.size % 2:
        raise param_error("weights", func, _WEIGHTS_FORM, f"{w.size} values")
    return w


def partition_to_dispatch(weights, *, T: float | None = None):
    """The dispatch instance of Theorem 1's reduction.

    Returns
    -------
    problem : DispatchProblem
        Two GPUs, full replication, ``counts = weights``.
    cost : CostModel
        ``a = c = 0``, ``b = T/(m/2)``, ``beta = T/W``.
    T : float
        The makespan budget.

    Examples
    --------
    >>> p, cost, T = partition_to_dispatch([3, 1, 1, 1])
    >>> cost.b, cost.beta, T
    (3.0, 2.0, 6.0)
    """
    w = _weights_iv(weights, "partition_to_dispatch")
    m = w.size
    W = w.sum() / 2
    if T is not None:
        T = check_real(T, "T", "partition_to_dispatch", lo=0)
    T = float(m // 2 * W) if T is None else T
    problem = DispatchProblem(counts=w, replicas=np.ones((m, 2), bool))
    cost = CostModel(a=0.0, b=T / (m // 2), c=0.0, beta=T / W)
    return problem, cost, T


def has_balanced_partition(weights) -> bool:
    """Brute force: is there ``S`` with ``|S| = m/2`` and ``w(S) = W``?

    >>> has_balanced_partition([3, 1, 1, 1]), has_balanced_partition([2, 1, 1, 2])
    (False, True)
    """
    w = _weights_iv(weights, "has_balanced_partition").tolist()
    m = len(w)
    total = sum(w)
    return any(2 * sum(w[i] for i in s) == total for s in itertools.combinations(range(m), m // 2))


def dispatch_from_partition(weights, subset) -> np.ndarray:
    """(<=) A balanced partition ``S`` as a whole-expert dispatch: ``S`` on GPU 0."""
    w = _weights_iv(weights, "dispatch_from_partition")
    idx = check_array(
        subset, "subset", "dispatch_from_partition", kind="int", ndim=1, lo=0, hi=w.size - 1
    )
    x = np.zeros((w.size, 2))
    on0 = np.zeros(w.size, bool)
    on0[idx] = True
    x[on0, 0] = w[on0]
    x[~on0, 1] = w[~on0]
    return x


def partition_from_dispatch(shares) -> list[int] | None:
    """(=>) The experts on GPU 0 of a dispatch that splits nothing (None if one is split).

    In a dispatch of makespan ``<= T`` no expert is split (the proof's counting argument);
    the experts on GPU 0 then form a balanced partition.
    """
    x = check_array(shares, "shares", "partition_from_dispatch", ndim=2, shape=(None, 2), lo=0)
    active = x > 0
    if (active.sum(axis=1) > 1).any():
        return None
    return [int(i) for i in np.flatnonzero(active[:, 0])]
