"""A3 round-robin (TEMPO Theorem 2) and its restricted-replica variant.

Under full replication, A3 places whole experts by descending-token round-robin and
satisfies ``M(A3) <= OPT + max_k phi_k(n_max)`` for the per-GPU cost
``max_k(a_k + sum_e phi_k(n_e))`` (proofs/THEOREMS.md, Theorem 2). Under restricted replicas
the "fewest-experts replica, token tie-break" variant is used; TEMPO conjectures the same
additive bound for it, but ``straggler.proofs.conjecture`` refutes it (counterexamples in
proofs/THEOREMS.md), so no guarantee is claimed for the variant.

The method's name ``round_robin`` (``solve_dispatch(method="round_robin")``) is also the name
of SGLang's DP routing policy (``route_batch(policy="round_robin")``,
:mod:`straggler.baselines.routing.sglang`), a different algorithm in a different namespace;
in code the dispatch kernel is ``a3_kernel`` (``solvers/dispatch/_round_robin.py``) and the routing
one
``round_robin_kernel``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem
from ...formulations.errors import param_error
from ...formulations.validation import check_array, check_choice, check_type
from ._backend import A3
from .method import LayerSolution

__all__ = [
    "round_robin_shares",
    "round_robin_assignment",
    "is_full_replication",
    "a3_bound",
    "a3_paper_term",
    "RoundRobin",
]

_RULES = ("auto", "a3", "fewest")


def is_full_replication(problem: DispatchProblem) -> bool:
    """True when every expert with tokens has a replica on every GPU (one layer).

    Examples
    --------
    >>> is_full_replication(DispatchProblem(counts=[3, 0], replicas=[[1, 1], [1, 0]]))
    True
    """
    _single_layer_iv(problem, "is_full_replication")
    live = problem.counts > 0
    return bool(problem.replicas[live].all())


def _single_layer_iv(problem, func: str) -> DispatchProblem:
    check_type(problem, "problem", func, DispatchProblem, "a single-layer DispatchProblem")
    if problem.is_stack:
        raise param_error(
            "problem", func, "a single-layer DispatchProblem", f"a stack of {problem.n_layers}"
        )
    return problem


def round_robin_assignment(problem: DispatchProblem, rule: str = "auto") -> np.ndarray:
    """GPU of each expert (-1 without tokens) under A3 or the fewest-experts variant.

    ``rule="auto"`` takes A3 under full replication and the variant otherwise; ``"a3"``
    requires full replication; ``"fewest"`` forces the variant.
    """
    func = "round_robin_assignment"
    _single_layer_iv(problem, func)
    check_choice(rule, "rule", func, _RULES)
    full = is_full_replication(problem)
    if rule == "a3" and not full:
        raise param_error(
            "problem", func, "fully replicated for rule='a3'", "restricted replica sets"
        )
    use_a3 = full if rule == "auto" else rule == "a3"
    counts = np.ascontiguousarray(problem.counts, dtype=np.int64)
    return A3(counts, np.ascontiguousarray(problem.replicas), use_a3)


def round_robin_shares(counts, replicas, *, rule: str = "auto") -> np.ndarray:
    """Whole-expert shares of A3 (full replication) or its restricted-replica variant.

    Parameters
    ----------
    counts : array_like of int, shape (n_experts,)
    replicas : array_like of bool, shape (n_experts, n_gpus)
    rule : {"auto", "a3", "fewest"}, default "auto"
        ``"auto"``: A3 when every live expert is replicated on every GPU, else the variant.

    Returns
    -------
    shares : ndarray of float64, shape (n_experts, n_gpus)

    Notes
    -----
    A3: live experts ranked by descending tokens, ties to the lower index; GPU ``i`` takes
    ranks ``i, i + g, i + 2g, ...`` (0-based). Variant: same visiting order; each expert goes
    whole to the replica GPU with the fewest experts so far, ties to the fewest tokens so
    far, then to the lowest GPU index. ``O(E log E + E g)``.

    Guarantee (A3, full replication): ``M(A3) <= OPT + a3_bound(problem, cost)``
    (Theorem 2). The variant has no such guarantee: TEMPO's conjecture that it does is false
    (proofs/THEOREMS.md, "The restricted-replication conjecture is false").

    Examples
    --------
    >>> round_robin_shares([5, 9, 1, 7], np.ones((4, 2), bool)).tolist()
    [[5.0, 0.0], [9.0, 0.0], [0.0, 1.0], [0.0, 7.0]]
    >>> round_robin_shares([5, 9, 1], [[1, 1], [1, 0], [1, 1]]).tolist()
    [[0.0, 5.0], [9.0, 0.0], [0.0, 1.0]]
    """
    func = "round_robin_shares"
    counts = check_array(counts, "counts", func, kind="int", ndim=1, lo=0)
    problem = DispatchProblem(counts=counts, replicas=replicas)
    assign = round_robin_assignment(problem, rule)
    return _shares(problem, assign)


def _shares(problem, assign):
    n = np.asarray(problem.counts)
    shares = np.zeros((problem.n_experts, problem.n_gpus))
    idx = np.flatnonzero(assign >= 0)
    shares[idx, assign[idx]] = n[idx]
    return shares


def _phi_act(n: int, cost: CostModel) -> float:
    """Activation measure of one whole expert with ``n`` tokens: ``b + b2*(ceil(n/tile)-1)``."""
    if n <= 0:
        return 0.0
    return cost.b + cost.b2 * (math.ceil(n / cost.tile) - 1)


def a3_paper_term(problem: DispatchProblem, cost: CostModel) -> float:
    """The additive term of Theorem 2 as the paper states it: ``max_k phi_k(n_max)``.

    ``max(b + b2*(ceil(n_max/tile) - 1), beta*n_max, gamma*n_max)`` (0 without tokens).
    It is a valid bound only when ``b2 <= b`` (see :func:`a3_bound`).

    Examples
    --------
    >>> p = DispatchProblem(counts=[600, 30], replicas=np.ones((2, 2), bool))
    >>> a3_paper_term(p, CostModel(a=0, b=15, c=0, beta=0.1))
    60.0
    """
    _single_layer_iv(problem, "a3_paper_term")
    check_type(cost, "cost", "a3_paper_term", CostModel, "a CostModel")
    n = problem.counts
    n_max = int(n.max(initial=0))
    terms = [_phi_act(n_max, cost), cost.beta * n_max]
    if cost.has_traffic:
        terms.append(float(cost.gamma) * n_max)
    return float(max(terms))


def a3_bound(problem: DispatchProblem, cost: CostModel) -> float:
    """The additive term ``delta`` of Theorem 2: ``M(A3) <= OPT + delta`` (full replication).

    With ``b2 <= b`` (every calibrated preset) this is the paper's ``max_k phi_k(n_max)``
    (``a3_paper_term``). With ``b2 > b`` splitting an expert into tile-sized pieces is
    *cheaper* in the activation measure than keeping it whole, the averaging lower bound of
    the paper's proof fails, and the paper's term is not a valid bound (proofs/THEOREMS.md,
    Remark after Theorem 2, with a counterexample); the term returned then adds
    ``(Phi_act - Psi_act)/g``, the gap between the whole-expert and the cheapest-split
    activation totals, which restores the proof.

    Examples
    --------
    >>> p = DispatchProblem(counts=[256] * 4, replicas=np.ones((4, 2), bool))
    >>> a3_bound(p, CostModel(a=0, b=4, b2=1, c=0, beta=0))
    5.0
    >>> a3_bound(p, CostModel(a=0, b=1, b2=10, c=0, beta=0))
    29.0
    """
    _single_layer_iv(problem, "a3_bound")
    check_type(cost, "cost", "a3_bound", CostModel, "a CostModel")
    term = a3_paper_term(problem, cost)
    if cost.b2 <= cost.b:
        return term
    n = np.asarray(problem.counts)
    r = np.asarray(problem.replicas).sum(axis=1)
    gap = 0.0
    for e in np.flatnonzero(n > 0):
        k = math.ceil(int(n[e]) / cost.tile)
        m = min(k, int(r[e]))
        whole = cost.b + cost.b2 * (k - 1)
        split = cost.b * m + cost.b2 * (k - m)
        gap += whole - min(whole, split)
    return float(term + gap / problem.n_gpus)


@dataclass(frozen=True)
class RoundRobin:
    """Whole experts by A3 round-robin (full replication) or the fewest-experts variant.

    Parameters
    ----------
    rule : {"auto", "a3", "fewest"}, default "auto"
        See :func:`round_robin_shares`.
    """

    rule: str = "auto"

    def __post_init__(self):
        check_choice(self.rule, "rule", "solve_dispatch(method='round_robin')", _RULES)

    def solve(self, problem: DispatchProblem, cost: CostModel, *, time_limit, rng):
        assign = round_robin_assignment(problem, self.rule)
        full = is_full_replication(problem)
        return LayerSolution(
            shares=_shares(problem, assign),
            extras={
                "rule": "a3" if (self.rule == "a3" or (self.rule == "auto" and full)) else "fewest",
                "full_replication": full,
            },
        )
