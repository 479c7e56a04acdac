"""Optimal semi-matching: ``min max_g G_g`` with one replica per live expert (TEMPO Lemma 2).

With ``c = beta = 0`` (and no tile or traffic term) the dispatch problem *is* this problem
(splitting only adds activations), and in general its value ``SM`` gives the activation
lower bound ``OPT >= a + b*SM`` for any replica sets (proofs/THEOREMS.md, Lemma 2 and
Bound B2), which :func:`~straggler.solvers.certified_lower_bound` uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem
from ...formulations.errors import InvalidInputError, param_error
from ...formulations.validation import check_array
from ._backend import SEMI_MATCHING
from .method import LayerSolution

__all__ = ["semi_matching", "semi_matching_witness", "SemiMatching"]


def _semi_matching_iv(replicas, live, func: str):
    """``(replicas, live)`` as C-contiguous bool arrays of shapes ``(E, g >= 1)`` and
    ``(E,)``, every live expert with a replica."""
    form = "a boolean (or 0/1) mask of shape (n_experts, n_gpus >= 1)"
    rep = check_array(replicas, "replicas", func, kind="bool", ndim=2, expected=form)
    if rep.shape[1] < 1:
        raise param_error("replicas", func, form, f"shape {rep.shape}")
    lv = check_array(live, "live", func, kind="bool", shape=(rep.shape[0],))
    orphan = lv & ~rep.any(axis=1)
    if orphan.any():
        e = int(np.argmax(orphan))
        raise InvalidInputError(
            f"The 'replicas' parameter of {func} must give every live expert a replica. "
            f"Got live expert {e} with no replica instead."
        )
    return rep, lv


def semi_matching_witness(replicas, live):
    """Optimal semi-matching with its certificate of optimality.

    Returns
    -------
    assignment : ndarray of int64, shape (n_experts,)
        GPU of each live expert (-1 for experts that are not live).
    value : int
        ``max_g #{e : assignment[e] == g}``, the optimum.
    witness : ndarray of bool, shape (n_gpus,)
        A GPU set ``Y`` with ``ceil(|E(Y)| / |Y|) == value``, where ``E(Y)`` is the set of
        live experts whose replicas all lie in ``Y``: every semi-matching puts at least
        ``value`` experts on some GPU of ``Y`` (Hall-type bound), so ``value`` is optimal.

    Examples
    --------
    >>> rep = np.array([[1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 1, 1]], bool)
    >>> a, v, y = semi_matching_witness(rep, np.ones(4, bool))
    >>> a.tolist(), v, y.tolist()
    ([1, 0, 0, 2], 2, [True, False, False])
    """
    rep, lv = _semi_matching_iv(replicas, live, "semi_matching_witness")
    a, v, y = SEMI_MATCHING(rep, lv)
    return a, int(v), y


def semi_matching(replicas, live):
    """Assign each live expert to one replica GPU, minimizing the most experts on one GPU.

    Exact and polynomial: a greedy start then augmenting paths from the bottleneck GPUs
    (Harvey, Ladner, Lovász and Tamir 2006), ``O(P * E * g)`` for ``P`` augmentations
    (``P <= E``).

    Parameters
    ----------
    replicas : array_like of bool, shape (n_experts, n_gpus)
        Replica mask.
    live : array_like of bool, shape (n_experts,)
        Experts that must be placed (those with tokens).

    Returns
    -------
    assignment : ndarray of int64, shape (n_experts,)
        GPU of each live expert, -1 for the others.
    value : int
        The optimal ``min max_g G_g`` (0 when no expert is live).

    Raises
    ------
    InvalidInputError
        Bad shapes or dtypes, or a live expert without a replica.

    Notes
    -----
    Tie-breaking: the greedy start visits experts by index and takes the replica with the
    fewest experts, then the lowest GPU index; each search scans GPUs, their experts and
    replica GPUs in increasing index. The kernel and its plain-Python reference
    (``straggler.solvers.dispatch._semi_matching``) follow the same rules and agree exactly.

    References
    ----------
    TEMPO Lemma 2 and Appendix A.2; N. Harvey et al., "Semi-matchings for bipartite graphs
    and load balancing", J. Algorithms 59 (2006).

    Examples
    --------
    Expert 0 can go to GPU 0 or 1; experts 1 and 2 only to GPU 0:

    >>> rep = np.array([[1, 1], [1, 0], [1, 0]], bool)
    >>> a, v = semi_matching(rep, [True, True, True])
    >>> a.tolist(), v
    ([1, 0, 0], 2)
    """
    rep, lv = _semi_matching_iv(replicas, live, "semi_matching")
    a, v, _ = SEMI_MATCHING(rep, lv)
    return a, int(v)


@dataclass(frozen=True)
class SemiMatching:
    """Whole experts on the replica chosen by the optimal semi-matching (METRO's exact form).

    Optimal when ``c = beta = b2 = 0`` and there is no traffic term (Lemma 2); otherwise a
    baseline that ignores tokens. Its lower bound ``a + b*value`` is valid for any cost.
    """

    def solve(self, problem: DispatchProblem, cost: CostModel, *, time_limit, rng):
        n = np.asarray(problem.counts)
        live = n > 0
        assign, value, _ = SEMI_MATCHING(np.ascontiguousarray(problem.replicas), live)
        shares = np.zeros((problem.n_experts, problem.n_gpus))
        idx = np.flatnonzero(live)
        shares[idx, assign[idx]] = n[idx]
        return LayerSolution(
            shares=shares,
            lower_bound=cost.a + cost.b * float(value),
            extras={"semi_matching_value": int(value)},
        )
