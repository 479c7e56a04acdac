"""``llep``: least-loaded expert parallelism restricted to existing replicas (LLEP-R).

Upstream: SalesforceAIResearch/LeastLoadedEP (Nguyen et al., "Least-Loaded Expert
Parallelism", 2026), ``llep/gpt_oss_llep.py``: ``compute_llep_lpt_plan`` caps every GPU at
``max_tokens_factor * (N // g)`` tokens, visits experts by descending count (LPT order),
keeps what fits on the expert's native GPU and spills the rest to the GPUs with the least
*effective* load (tokens already assigned plus the native load of experts not yet
visited), never in a chunk under ``min_tokens_per_gemm`` except the remainder. The
**adaptive gate** (``MOE_ADAPTIVE_LPT_ROUTING_RATIO``, 1.3 in the README's run;
``compute_gpu_imbalance_ratio``): the plan runs only when the native GPU loads' max/mean
is at least the threshold; below it, standard EP (every expert on its native GPU). The
code's default, the variable unset, always plans (``threshold=None`` here).

The original moves weights to any helper GPU; LLEP-R spills only to GPUs that already hold
a replica, so no weight moves and the result lies on the replica mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...formulations.dispatch import DispatchProblem
from ...formulations.validation import check_array, check_int, check_real
from ...solvers.dispatch.method import LayerSolution

__all__ = ["LLEP", "llep_plan", "native_imbalance", "LLEP_THRESHOLD"]

#: The gate of LLEP's README run (``MOE_ADAPTIVE_LPT_ROUTING_RATIO=1.3``).
LLEP_THRESHOLD = 1.3


def native_imbalance(counts, replicas) -> float:
    """``compute_gpu_imbalance_ratio``: max/mean of the GPU loads when every expert stays on
    its native GPU (here its lowest-index replica GPU); 1.0 when the batch is empty.

    Examples
    --------
    >>> native_imbalance(np.array([9, 3, 2, 2]), np.ones((4, 2), bool))
    2.0
    """
    func = "native_imbalance"
    replicas = check_array(replicas, "replicas", func, kind="bool", ndim=2)
    counts = check_array(
        counts, "counts", func, kind="int", ndim=1, lo=0, shape=(replicas.shape[0],)
    )
    has = replicas.any(axis=1)
    native = replicas.argmax(axis=1)
    loads = np.bincount(native[has], weights=counts[has], minlength=replicas.shape[1])
    mean = loads.mean()
    return 1.0 if mean == 0 else float(loads.max() / mean)


def llep_plan(counts, replicas, *, cap_factor: float = 1.1, min_chunk: int = 1024):
    """LLEP-R's integer token shares for one layer.

    Follows ``compute_llep_lpt_plan`` step by step, with "any other GPU" replaced by
    "any other GPU holding a replica" and the native GPU of expert ``e`` defined as its
    lowest-index replica GPU.

    * ``cap = max(1, int(cap_factor * (N // g)))`` (``N`` if ``N // g == 0``).
    * Experts by descending count, ties by expert index (Python's stable sort).
    * ``native_available = cap - eff(native)`` where ``eff(h) = assigned[h] + pending[h]``
      and ``pending`` is the native load of experts not yet visited.
    * Fits: all tokens stay native. Partial room: native takes ``native_available``; then,
      round after round, the helpers (sorted by ``eff``, ties by index) are scanned and
      the first with room takes ``min(remaining, room)`` unless that chunk is under
      ``min_chunk`` while more remains; a round that places nothing gives the whole
      remainder to the least-loaded helper. No room: one scan of the helpers sorted once
      by ``eff``, with the same chunk rule; what is left goes to the helper that was least
      loaded before the scan.
    * No helper (a single replica): everything stays on the native GPU, over the cap if
      need be.

    Returns
    -------
    shares : ndarray of int64, shape (n_experts, n_gpus)
    cap : int

    Examples
    --------
    >>> import numpy as np
    >>> x, cap = llep_plan(np.array([9, 3, 2, 2]), np.ones((4, 2), bool), min_chunk=1)
    >>> cap, x.tolist()
    (8, [[1, 8], [3, 0], [2, 0], [2, 0]])
    """
    counts = np.asarray(counts, dtype=np.int64)
    replicas = np.asarray(replicas, dtype=bool)
    n_experts, n_gpus = replicas.shape
    total = int(counts.sum())
    balanced = total // n_gpus
    cap = int(cap_factor * balanced) if balanced > 0 else total
    cap = max(cap, 1)

    native = np.where(replicas.any(axis=1), replicas.argmax(axis=1), -1)
    pending = [0] * n_gpus
    for e in range(n_experts):
        if native[e] >= 0:
            pending[native[e]] += int(counts[e])
    assigned = [0] * n_gpus
    shares = np.zeros((n_experts, n_gpus), dtype=np.int64)

    def eff(h: int) -> int:
        return assigned[h] + pending[h]

    def give(e: int, h: int, k: int) -> None:
        shares[e, h] += k
        assigned[h] += k

    order = sorted(range(n_experts), key=lambda i: -int(counts[i]))
    for e in order:
        n = int(counts[e])
        if n == 0:
            continue
        home = int(native[e])
        pending[home] -= n
        helpers = [int(h) for h in np.flatnonzero(replicas[e]) if h != home]
        room = cap - eff(home)
        if room >= n:
            give(e, home, n)
        elif room > 0:
            give(e, home, room)
            remaining = n - room
            while remaining > 0:
                if not helpers:
                    give(e, home, remaining)
                    break
                ranked = sorted(helpers, key=eff)
                placed = False
                for h in ranked:
                    avail = cap - eff(h)
                    if avail <= 0:
                        continue
                    chunk = min(remaining, avail)
                    if chunk < min_chunk and remaining > chunk:
                        continue
                    give(e, h, chunk)
                    remaining -= chunk
                    placed = True
                    break
                if not placed:
                    give(e, ranked[0], remaining)
                    remaining = 0
        else:
            if not helpers:
                give(e, home, n)
                continue
            ranked = sorted(helpers, key=eff)
            avail0 = {h: cap - eff(h) for h in ranked}  # the original computes room once
            remaining = n
            for h in ranked:
                if remaining <= 0:
                    break
                if avail0[h] <= 0:
                    continue
                chunk = min(remaining, avail0[h])
                if chunk < min_chunk and remaining > chunk:
                    continue
                give(e, h, chunk)
                remaining -= chunk
            if remaining > 0:
                give(e, ranked[0], remaining)
    return shares, cap


def _llep_iv(method) -> None:
    func = "solve_dispatch(method='llep')"
    check_real(method.cap_factor, "cap_factor", func, lo=0, lo_open=True)
    check_int(method.min_chunk, "min_chunk", func, lo=1)
    if method.threshold is not None:
        check_real(method.threshold, "threshold", func, lo=0)


@dataclass(frozen=True, kw_only=True)
class LLEP:
    """Least-loaded spill over existing replicas with a token cap (LLEP-R), behind its gate.

    Parameters
    ----------
    cap_factor : float, default 1.1
        LLEP's ``max_tokens_factor``: each GPU is capped at ``int(cap_factor * (N // g))``
        tokens (a soft cap: a remainder that fits nowhere is placed anyway).
    min_chunk : int, default 1024
        LLEP's ``min_tokens_per_gemm``: no spilled chunk smaller than this, except the
        expert's last remainder.
    threshold : float or None, default 1.3
        The adaptive gate: plan only when :func:`native_imbalance` ``>= threshold``,
        otherwise keep every expert on its native GPU (LLEP's standard-EP path). None
        always plans (the code's default when the variable is unset).

    Notes
    -----
    See :func:`llep_plan` for every step and tie-break. When nothing fits, the remainder
    goes to the helper replica with the least effective load (over the cap), and an expert
    with a single replica stays whole on it. Whole tokens. ``O(E * g log g)``.
    ``extras["planned"]`` says whether the gate let the plan run.

    References
    ----------
    The LLEP README (least-loaded EP, lambda = 1.3, 1024-token chunks); TEMPO §6 (related work).

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> from straggler.solvers import solve_dispatch
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> cost = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> r = solve_dispatch(p, cost, method="llep", min_chunk=1)
    >>> r.extras["cap"], r.shares.sum(axis=0).tolist(), r.makespan
    (429, [429.0, 351.0], 105.0)
    >>> q = DispatchProblem(counts=[5, 4], replicas=np.ones((2, 2), bool))  # 9/4.5 = 2 >= 1.3
    >>> solve_dispatch(q, cost, method="llep", min_chunk=1, threshold=2.5).extras["planned"]
    False
    """

    cap_factor: float = 1.1
    min_chunk: int = 1024
    threshold: float | None = LLEP_THRESHOLD

    def __post_init__(self) -> None:
        _llep_iv(self)

    def solve(self, problem: DispatchProblem, cost, *, time_limit=None, rng=None) -> LayerSolution:
        """Dispatch one layer (see the class docstring)."""
        n, rep = problem.counts, problem.replicas
        ratio = native_imbalance(n, rep)
        planned = self.threshold is None or ratio >= float(self.threshold)
        if planned:
            shares, cap = llep_plan(
                n, rep, cap_factor=float(self.cap_factor), min_chunk=int(self.min_chunk)
            )
        else:
            shares = np.zeros(rep.shape, dtype=np.int64)
            has = rep.any(axis=1)
            native = rep.argmax(axis=1)
            shares[np.flatnonzero(has), native[has]] = n[has]
            cap = None
        extras = {"cap": cap, "planned": planned, "imbalance": ratio}
        return LayerSolution(shares=shares.astype(float), extras=extras)
