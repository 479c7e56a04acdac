"""Problem 2, F-score routing of ready requests to lock-step decode replicas (BalanceRoute).

At a scheduling tick ``G`` decode replicas hold loads ``L_g`` (resident KV tokens: prompt plus
tokens decoded so far, summed over their running requests) and ``cap_g`` free slots; a pool of
ready requests (prefill done) waits with prefill lengths ``s_i``. Every decode step ends at a
barrier, so the step costs what the most loaded replica costs. With ``M = max_g L_g``:

* imbalance ``I = G*M - sum_g L_g`` (tokens the other replicas "wait for"),
* margin ``m_g = M - L_g >= 0`` (room below the straggler),
* F-score ``F_g(Q) = D(Q) - G*(D(Q) - m_g)_+`` with ``D(Q) = sum_{i in Q} s_i``; ``-F_g(Q)`` is
  the exact change of ``I`` when only replica ``g`` receives ``Q`` (Theorem R1, proofs).
* horizon F-score (BR-H) over projected loads ``L_{g,h}``, ``h = 0..H``:
  ``F_g(Q) = alpha*(1'd)*D(Q) - beta*((D(Q)*1 - m_g)_+)'d`` with margin vector
  ``m_{g,h} = max_g' L_{g',h} - L_{g,h}`` and discount ``d = (1, gamma, ..., gamma^H)``.

This module states the problem and nothing else: the cluster state, these quantities, and the
independent checker of a routing decision. Solvers live in ``straggler.solvers.routing.route``.

References
----------
BalanceRoute (arXiv 2605.06113): the asymmetric marginal-imbalance F-score (its first key
design) and the short-horizon discounted F-score of BR-H (its third).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InvalidInputError, param_error
from .validation import MAX_EXACT_INT, check_array

__all__ = [
    "ClusterState",
    "imbalance",
    "margins",
    "f_score",
    "discount_vector",
    "horizon_margins",
    "horizon_f_score",
    "check_assignment",
    "apply_assignment",
]


@dataclass(frozen=True, eq=False, kw_only=True)
class ClusterState:
    """The decode cluster at one scheduling tick.

    Parameters
    ----------
    free_slots : array of int, shape (G,)
        Free request slots of each replica (``cap_g``).
    running_replica : array of int, shape (n_running,)
        Replica each running request is bound to (its KV cache lives there).
    running_prompt : array, shape (n_running,)
        Prompt (prefill) length of each running request, in tokens.
    running_decoded : array, shape (n_running,)
        Tokens decoded so far (the request's age ``a_i``).
    pool_prefill : array, shape (n_pool,)
        Prefill lengths ``s_i`` of the ready requests in the pool, oldest first.
    running_prefix : array of int, shape (n_running,), optional
        Prompt-prefix hash of each running request (for exact-match prediction).
    pool_prefix : array of int, shape (n_pool,), optional
        Prompt-prefix hash of each pool request.
    running_output : array, shape (n_running,), optional
        True output lengths (known only in simulation; used by the oracle predictor).
    loads : array, shape (G,), optional
        Resident KV tokens per replica. Default: ``sum`` of ``prompt + decoded`` of the running
        requests of each replica. When given it is used as is (e.g. stale reported loads).

    Examples
    --------
    >>> st = ClusterState(free_slots=[1, 2], running_replica=[0, 0, 1],
    ...                   running_prompt=[10, 5, 3], running_decoded=[2, 1, 0],
    ...                   pool_prefill=[4, 7])
    >>> st.loads.tolist(), st.n_replicas, imbalance(st.loads)
    ([18.0, 3.0], 2, 15.0)
    """

    free_slots: np.ndarray
    running_replica: np.ndarray
    running_prompt: np.ndarray
    running_decoded: np.ndarray
    pool_prefill: np.ndarray
    running_prefix: np.ndarray | None = None
    pool_prefix: np.ndarray | None = None
    running_output: np.ndarray | None = None
    loads: np.ndarray | None = None

    def __post_init__(self) -> None:
        vals = _cluster_state_iv(self)
        for k, v in vals.items():
            if v is not None:
                v = v.copy()
                v.setflags(write=False)
            object.__setattr__(self, k, v)

    @property
    def n_replicas(self) -> int:
        """``G``."""
        return int(self.free_slots.size)

    @property
    def n_running(self) -> np.ndarray:
        """Running requests per replica, shape (G,)."""
        return np.bincount(self.running_replica, minlength=self.n_replicas).astype(np.int64)


def _cluster_state_iv(st: ClusterState) -> dict:
    """Every check of :class:`ClusterState`, once; returns the normalized arrays by field."""
    f = "ClusterState"

    def tokens(x, name):
        return check_array(x, name, f, kind="real", lo=0, hi=MAX_EXACT_INT)

    free = check_array(st.free_slots, "free_slots", f, kind="int", lo=0)
    if free.size == 0:
        raise param_error(
            "free_slots", f, "a non-empty 1-D array (one entry per replica)", "an empty array"
        )
    G = free.size
    rep = check_array(st.running_replica, "running_replica", f, kind="int", lo=0, hi=G - 1)
    n = rep.size
    prompt = tokens(st.running_prompt, "running_prompt")
    dec = tokens(st.running_decoded, "running_decoded")
    for name, arr in (("running_prompt", prompt), ("running_decoded", dec)):
        if arr.shape != (n,):
            raise param_error(name, f, f"shape ({n},) like running_replica", f"shape {arr.shape}")
    pool = tokens(st.pool_prefill, "pool_prefill")
    opt = {}
    for name, size in (("running_prefix", n), ("pool_prefix", pool.size)):
        v = getattr(st, name)
        if v is not None:
            v = check_array(v, name, f, kind="int", shape=(size,))
        opt[name] = v
    out = st.running_output
    if out is not None:
        out = tokens(out, "running_output")
        if out.shape != (n,) or np.any(out <= dec):
            raise param_error(
                "running_output",
                f,
                f"shape ({n},) with output > decoded for every request",
                f"shape {out.shape}",
            )
    loads = st.loads
    if loads is None:
        loads = np.bincount(rep, weights=prompt + dec, minlength=G).astype(np.float64)
    else:
        loads = check_array(loads, "loads", f, kind="real", lo=0, hi=MAX_EXACT_INT, shape=(G,))
    return dict(
        free_slots=free,
        running_replica=rep,
        running_prompt=prompt,
        running_decoded=dec,
        pool_prefill=pool,
        running_output=out,
        loads=loads,
        **opt,
    )


def imbalance(loads) -> float | np.ndarray:
    """``I = G*max_g L_g - sum_g L_g`` of loads ``(G,)``, or per column of ``(G, H+1)``.

    Examples
    --------
    >>> imbalance([5, 3, 1])
    6.0
    >>> imbalance([[5, 0], [3, 2]]).tolist()
    [2.0, 2.0]
    """
    L = np.asarray(loads, dtype=np.float64)
    G = L.shape[0]
    out = G * L.max(axis=0) - L.sum(axis=0)
    return float(out) if out.ndim == 0 else out


def margins(loads) -> np.ndarray:
    """``m_g = max_g' L_g' - L_g`` (per column for ``(G, H+1)`` projected loads).

    Examples
    --------
    >>> margins([5, 3, 1]).tolist()
    [0.0, 2.0, 4.0]
    """
    L = np.asarray(loads, dtype=np.float64)
    return L.max(axis=0) - L


def f_score(total, margin, n_replicas: int):
    """``F = D - G*(D - m)_+`` for a set of total prefill ``D`` given to a replica of margin ``m``.

    Slope 1 while ``D <= m`` (the safe zone) and ``-(G-1)`` above it (Theorem R2).

    Examples
    --------
    >>> [f_score(d, 4.0, 3) for d in (0, 2, 4, 5, 6)]
    [0.0, 2.0, 4.0, 2.0, 0.0]
    """
    D = np.asarray(total, dtype=np.float64)
    out = D - n_replicas * np.maximum(D - margin, 0.0)
    return float(out) if out.ndim == 0 else out


def discount_vector(H: int, gamma: float) -> np.ndarray:
    """``d = (1, gamma, ..., gamma^H)`` (computed by repeated multiplication, as the kernels do).

    Examples
    --------
    >>> discount_vector(3, 0.5).tolist()
    [1.0, 0.5, 0.25, 0.125]
    """
    d = np.empty(H + 1)
    acc = 1.0
    for h in range(H + 1):
        d[h] = acc
        acc *= gamma
    return d


def horizon_margins(projected_loads) -> np.ndarray:
    """Margin vectors ``m_{g,h} = max_g' L_{g',h} - L_{g,h}`` of ``(G, H+1)`` projected loads."""
    L = np.asarray(projected_loads, dtype=np.float64)
    if L.ndim == 1:
        L = L[:, None]
    return L.max(axis=0)[None, :] - L


def horizon_f_score(total, margin_vector, *, alpha: float, beta: float, gamma: float) -> float:
    """``alpha*(1'd)*D - beta*((D*1 - m)_+)'d`` for a margin vector ``m`` of length ``H+1``.

    With ``H = 0``, ``alpha = 1`` and ``beta = G`` it equals :func:`f_score` (Theorem R3).

    Examples
    --------
    >>> horizon_f_score(5.0, [4.0], alpha=1.0, beta=3.0, gamma=1.0) == f_score(5.0, 4.0, 3)
    True
    >>> horizon_f_score(2.0, [4.0, 1.0], alpha=1.0, beta=3.0, gamma=0.5)
    1.5
    """
    m = np.asarray(margin_vector, dtype=np.float64).ravel()
    d = discount_vector(m.size - 1, gamma)
    D = float(total)
    return float(alpha * d.sum() * D - beta * float(np.maximum(D - m, 0.0) @ d))


def check_assignment(assignment, prefill, free_slots) -> np.ndarray:
    """Independent feasibility check of a routing decision; returns the placed count per replica.

    ``assignment[i]`` is the replica of pool request ``i`` or ``-1`` (stays in the pool). A
    replica never receives more requests than it has free slots.

    Raises
    ------
    InvalidInputError
        Wrong shape, an index out of range, or a slot limit exceeded.

    Examples
    --------
    >>> check_assignment([1, -1, 1], [3, 4, 5], [0, 2]).tolist()
    [0, 2]
    """
    f = "check_assignment"
    a = np.asarray(assignment)
    s = np.asarray(prefill)
    cap = np.asarray(free_slots)
    if a.shape != s.shape or a.ndim != 1:
        raise param_error("assignment", f, f"shape {s.shape} like prefill", f"shape {a.shape}")
    G = cap.size
    if a.size and (a.min() < -1 or a.max() >= G):
        raise param_error(
            "assignment", f, f"replica indices in [-1, {G})", f"values in [{a.min()}, {a.max()}]"
        )
    placed = np.bincount(a[a >= 0], minlength=G)
    over = np.flatnonzero(placed > cap)
    if over.size:
        g = int(over[0])
        raise InvalidInputError(
            f"The assignment gives replica {g} {placed[g]} requests but it has only "
            f"{cap[g]} free slots."
        )
    return placed.astype(np.int64)


def apply_assignment(loads, assignment, prefill) -> np.ndarray:
    """Loads after placing each assigned request's prefill on its replica (``(G,)`` or per column).

    Examples
    --------
    >>> apply_assignment([5, 3], [1, -1, 1], [1, 9, 2]).tolist()
    [5.0, 6.0]
    """
    L = np.array(loads, dtype=np.float64)
    a = np.asarray(assignment)
    s = np.asarray(prefill, dtype=np.float64)
    add = np.bincount(a[a >= 0], weights=s[a >= 0], minlength=L.shape[0])
    return L + (add if L.ndim == 1 else add[:, None])
