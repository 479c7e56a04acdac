"""``metro``: METRO's activation balancing, whole experts, one replica each.

METRO ("balance activated experts, not tokens"; no public code) routes every expert with
tokens to exactly one of its replicas so as to minimise the maximum number of activated
experts per GPU; one replica per expert is optimal for that objective (TEMPO Lemma 2: with
``beta = 0`` splitting only adds activations). The deployed variant is a greedy, reported
within 10.9% of optimal; the exact one is a binary search on the per-GPU cap with a
bipartite b-matching feasibility test by max-flow.

The paper fixes no visiting order for its greedy. Both readings are offered:
``order="tokens"`` (default: descending tokens, ties by index, the longest-processing-time
habit; it reproduces TEMPO Fig. 1b's 69 us) and ``order="index"`` (experts in index order,
the literal loop over experts). The two assignments differ on 100 of 100 random 12x4
instances of ``tests/test_upstream_baselines.py`` and on 50 of 50 generated DSv3 EP8
decode layers (where neither order is better: index order was worse on 14, better on 16
under ``dsv3_a_offline``), so a comparison should say which it used.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np

from ...formulations.dispatch import DispatchProblem
from ...formulations.validation import check_bool, check_choice
from ...solvers.dispatch.method import LayerSolution

__all__ = ["Metro", "METRO_ORDERS", "metro_greedy", "metro_exact"]

#: Accepted values of :attr:`Metro.order` (default first).
METRO_ORDERS = ("tokens", "index")


def _visit_order(counts: np.ndarray, order: str) -> np.ndarray:
    """Live experts by descending tokens (ties by index), or in index order."""
    live = np.flatnonzero(counts > 0)
    if order == "index":
        return live
    return live[np.argsort(-counts[live], kind="stable")]


def metro_greedy(counts, replicas, *, order: str = "tokens") -> np.ndarray:
    """METRO's deployed greedy: the GPU of each live expert (``-1`` for dead ones).

    Experts are visited by descending token count (``order="tokens"``, ties: lower expert
    index first) or by index (``order="index"``); each goes to the candidate GPU (one
    holding a replica) with the fewest activated experts so far, ties to the lower GPU
    index. Tokens play no part in the choice: METRO's objective is the activation count
    alone (its description is silent on ties and order; these are our documented choices).

    Examples
    --------
    >>> import numpy as np
    >>> metro_greedy(np.array([600] + [30] * 6), np.ones((7, 2), bool)).tolist()
    [0, 1, 0, 1, 0, 1, 0]
    >>> rep = np.array([[1, 1], [1, 0], [1, 1]], bool)
    >>> metro_greedy(np.array([1, 5, 9]), rep).tolist(), metro_greedy(
    ...     np.array([1, 5, 9]), rep, order="index").tolist()
    ([1, 0, 0], [0, 0, 1])
    """
    check_choice(order, "order", "metro_greedy", METRO_ORDERS)
    counts = np.asarray(counts)
    replicas = np.asarray(replicas, dtype=bool)
    n_gpus = replicas.shape[1]
    act = np.zeros(n_gpus, dtype=np.int64)
    gpu_of = np.full(counts.shape[0], -1, dtype=np.int64)
    for e in _visit_order(counts, order):
        cand = np.flatnonzero(replicas[e])
        best = cand[np.argmin(act[cand])]  # argmin: first minimum, i.e. the lowest index
        gpu_of[e] = best
        act[best] += 1
    return gpu_of


def _assignment_with_cap(live: np.ndarray, replicas: np.ndarray, cap: int) -> np.ndarray | None:
    """One-replica assignment of ``live`` experts with at most ``cap`` per GPU, or None.

    Max-flow on source -> expert (capacity 1) -> replica GPU (1) -> sink (``cap``); the
    assignment exists iff the flow saturates every expert.
    """
    graph = nx.DiGraph()
    n_gpus = replicas.shape[1]
    for e in live:
        graph.add_edge("s", ("e", int(e)), capacity=1)
        for g in np.flatnonzero(replicas[e]):
            graph.add_edge(("e", int(e)), ("g", int(g)), capacity=1)
    for g in range(n_gpus):
        graph.add_edge(("g", g), "t", capacity=int(cap))
    value, flow = nx.maximum_flow(graph, "s", "t")
    if value < live.size:
        return None
    gpu_of = np.full(replicas.shape[0], -1, dtype=np.int64)
    for e in live:
        for node, f in flow[("e", int(e))].items():
            if f > 0:
                gpu_of[e] = node[1]
    return gpu_of


def metro_exact(counts, replicas, *, order: str = "tokens") -> np.ndarray:
    """METRO's exact variant: a one-replica assignment minimising ``max_g G_g``.

    Binary search on the cap ``K`` between ``ceil(E_live / g)`` (every GPU's average) and
    the greedy's ``max_g G_g`` (feasible; ``order`` is the greedy's), each step a max-flow
    b-matching test; returns the assignment found at the smallest feasible ``K`` (``-1``
    for dead experts). Which optimal assignment comes back is whatever the flow gives:
    METRO's objective ignores tokens. ``O(log(E) * maxflow)``.

    Examples
    --------
    >>> import numpy as np
    >>> rep = np.array([[1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 1, 1]], bool)
    >>> gpu = metro_exact(np.array([5, 4, 3, 2]), rep)
    >>> int(np.bincount(gpu, minlength=3).max())
    2
    """
    counts = np.asarray(counts)
    replicas = np.asarray(replicas, dtype=bool)
    live = np.flatnonzero(counts > 0)
    greedy = metro_greedy(counts, replicas, order=order)
    if live.size == 0:
        return greedy
    n_gpus = replicas.shape[1]
    hi = int(np.bincount(greedy[live], minlength=n_gpus).max())
    lo = -(-live.size // n_gpus)
    best = greedy
    while lo < hi:
        mid = (lo + hi) // 2
        found = _assignment_with_cap(live, replicas, mid)
        if found is None:
            lo = mid + 1
        else:
            best, hi = found, mid
    return best


@dataclass(frozen=True, kw_only=True)
class Metro:
    """Whole experts, one replica each, balancing activated experts per GPU (METRO).

    Parameters
    ----------
    exact : bool, default False
        False: METRO's deployed greedy (:func:`metro_greedy`: least activated candidate
        GPU, ties to the lower index). True: the exact minimum of ``max_g G_g``
        (:func:`metro_exact`: binary search on the cap, b-matching by max-flow with
        networkx).
    order : {"tokens", "index"}, default "tokens"
        The greedy's visiting order (module docstring).

    Notes
    -----
    The objective is ``max_g G_g`` only: tokens per GPU are not balanced, which is what
    TEMPO Fig. 1b shows (69 us where the optimum is 60).
    ``exact`` satisfies ``max_g G_g(exact) <= max_g G_g(greedy)``; METRO reports its greedy
    within 10.9% of optimal.

    References
    ----------
    The METRO paper (greedy least-activated GPU); TEMPO §1, Fig. 1b, Lemma 2.

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> from straggler.solvers import solve_dispatch
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> r = solve_dispatch(p, CostModel(a=0, b=15, c=0, beta=0.1), method="metro")
    >>> r.makespan, r.shares.sum(axis=0).tolist()
    (69.0, [690.0, 90.0])
    """

    exact: bool = False
    order: str = "tokens"

    def __post_init__(self) -> None:
        func = "solve_dispatch(method='metro')"
        check_bool(self.exact, "exact", func)
        check_choice(self.order, "order", func, METRO_ORDERS)

    def solve(self, problem: DispatchProblem, cost, *, time_limit=None, rng=None) -> LayerSolution:
        """Dispatch one layer (see the class docstring)."""
        n = problem.counts
        fn = metro_exact if self.exact else metro_greedy
        gpu_of = fn(n, problem.replicas, order=self.order)
        shares = np.zeros(problem.replicas.shape, dtype=float)
        live = np.flatnonzero(n > 0)
        shares[live, gpu_of[live]] = n[live]
        max_g = int(np.bincount(gpu_of[live], minlength=problem.n_gpus).max()) if live.size else 0
        extras = {"exact": bool(self.exact), "order": self.order, "max_G": max_g}
        return LayerSolution(shares=shares, extras=extras)
