"""Certified lower bounds on the optimal dispatch makespan.

:func:`certified_lower_bound` is what every :class:`DispatchResult` reports (combined with
any bound the method proves itself, such as a MILP dual bound). Each ingredient is valid
for any replica sets and is proved in ``proofs/THEOREMS.md`` (Part I, "Lower bounds"):

* B1, the averaging bound of :func:`~straggler.formulations.basic_lower_bound` (here with
  each expert's cheapest split limited by its replica count, which only strengthens it);
* B2, the activation bound ``a + b*SM`` from the optimal semi-matching value ``SM``
  (Lemma 2);
* B3, token and activation-measure bounds over GPU sets closed under the replica sets of
  the experts they hold (``N(E(S))/|S|``);
* B4, the tile count of each expert's largest piece;
* B5, the token-LP bound ``max(c + beta*V, c2 + gamma*V)`` with ``V = min max_g N_g``
  (Lemma 1), computed exactly by the augmenting-path kernel of
  ``straggler.solvers.dispatch._token_lp_fast`` (the best of all closed-set token bounds);
* B6, activations coupled with tokens: ``min_K max(a + b*K, c + beta*U(K), c2 +
  gamma*U(K))`` with ``U(K)`` the least largest piece when the ``g*K`` activations a
  dispatch with at most ``K`` per GPU can have are spread over the experts' splits (the
  bound that sees that wide EP needs one more activation per GPU than the semi-matching);
* B7, tiles coupled with tokens: when ``V > 0``, the GPU carrying ``V`` tokens holds at
  least ``k = ceil(V/tile)`` tiles, so it takes ``a + min(b + b2*(k - 1), b*k)`` or more.

B1-B4 and B6 come from one Numba kernel (``straggler.solvers.dispatch._bounds``, plain-Python
reference beside it), B2 from the semi-matching kernel, B5 and B7 from the token-LP kernel;
no LP solver or MILP is called, so every ``solve_dispatch`` call can afford it (about 5-25 us
for ``E = 64-256, g = 8-16`` with restricted replicas).
"""

from __future__ import annotations

import math

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem
from ...formulations.validation import check_type
from ._backend import LOWER_BOUND, SEMI_MATCHING, TOKEN_LP

__all__ = ["certified_lower_bound", "layer_bound", "token_lp_bound"]

_FUNC = "certified_lower_bound"


def certified_lower_bound(problem: DispatchProblem, cost: CostModel) -> float | np.ndarray:
    """A lower bound on the optimal makespan of each layer, never above the optimum.

    Returns ``max(B1, ..., B7)`` (see the module docstring), computed from the problem and
    the cost alone: the semi-matching and token-LP values it needs are computed here by
    this library's exact kernels, never taken from the caller.

    Parameters
    ----------
    problem : DispatchProblem
        One layer, or a stack of layers.
    cost : CostModel

    Returns
    -------
    float, or ndarray of shape (n_layers,) for a stack
        The bound of the layer (of each layer).

    Raises
    ------
    InvalidInputError
        ``problem`` is not a :class:`DispatchProblem` or ``cost`` not a :class:`CostModel`.

    Examples
    --------
    TEMPO Fig. 1b (the optimum is 60; the token bound ``beta*N/2 = 39`` and the activation
    bound ``b*ceil(7/2) = 60`` meet it):

    >>> import numpy as np
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> certified_lower_bound(p, CostModel(a=0, b=15, c=0, beta=0.1))
    60.0

    Restricted replicas: expert 0 (90 tokens) lives only on GPU 0, so GPU 0 carries at
    least 90 tokens, more than the average 50:

    >>> p = DispatchProblem(counts=[90, 10], replicas=[[1, 0], [1, 1]])
    >>> certified_lower_bound(p, CostModel(a=0, b=0, c=0, beta=1))
    90.0
    """
    problem, cost = _certified_lower_bound_iv(problem, cost)
    if problem.is_stack:
        return np.array([_bound_of(p, cost) for p in problem.layers()], dtype=np.float64)
    return _bound_of(problem, cost)


def _certified_lower_bound_iv(problem, cost) -> tuple[DispatchProblem, CostModel]:
    check_type(
        problem, "problem", _FUNC, DispatchProblem,
        "a DispatchProblem (see DispatchProblem(counts=, replicas=))",
    )  # fmt: skip
    check_type(cost, "cost", _FUNC, CostModel, "a CostModel (e.g. CostModel.preset(name))")
    return problem, cost


def _bound_of(p: DispatchProblem, cost: CostModel) -> float:
    """The bound of one validated layer, its semi-matching and token-LP values computed here."""
    counts = np.ascontiguousarray(p.counts, dtype=np.int64)
    replicas = np.ascontiguousarray(p.replicas)
    _, sm, _ = SEMI_MATCHING(replicas, counts > 0)
    _, num, den = TOKEN_LP(counts, replicas)
    return layer_bound(counts, replicas, cost, cost.as_array(), sm, num / den)


def layer_bound(counts, replicas, cost: CostModel, cost_array, sm: int, lp_value: float) -> float:
    """:func:`certified_lower_bound` from arrays: ``counts`` int64 ``(n_experts,)``,
    ``replicas`` bool ``(n_experts, n_gpus)``, ``cost_array = cost.as_array()`` and the
    layer's exact semi-matching value ``sm`` and token-LP value ``lp_value``.

    A private path, unchecked: for this library's own callers that computed ``sm`` and
    ``lp_value`` with its kernels on these very arrays (``tempo`` does); a wrong value voids
    the bound, which is why :func:`certified_lower_bound` takes none.

    Examples
    --------
    >>> import numpy as np
    >>> cost = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> layer_bound(np.array([600] + [30] * 6), np.ones((7, 2), bool), cost,
    ...             cost.as_array(), 4, 390.0)
    60.0
    """
    best = float(LOWER_BOUND(counts, replicas, cost_array, int(sm)))
    return max(best, token_lp_bound(cost, lp_value))


def token_lp_bound(cost: CostModel, token_lp_value: float) -> float:
    """B5 and B7 from the token-LP value ``V`` (module docstring).

    Examples
    --------
    ``V = 300`` tokens, tiles of 128: that GPU holds at least 3 tiles.

    >>> token_lp_bound(CostModel(a=1, b=4, c=0, beta=0.01, b2=2), 300.0)
    9.0
    """
    best = max(c0 + slope * token_lp_value for c0, slope in cost.token_pieces)
    if token_lp_value <= 0:  # no tokens: no GPU needs an activation
        return best
    # (ceil with a relative slack: a V just above a tile boundary by rounding never counts)
    k = max(1, math.ceil(token_lp_value / cost.tile * (1 - 1e-12)))
    return max(best, cost.a + min(cost.b + cost.b2 * (k - 1), cost.b * k))
