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
  least ``k = ceil(V/tile)`` tiles, so it takes ``a + min(b + b2*(k - 1), b*k)`` or more;
* B8, activations and tokens forced per GPU: for a trial value ``T``, suppose a dispatch
  keeps every GPU below ``T``; then a GPU that cannot take one more activation keeps every
  replica it is not forced to serve empty, an expert puts on a GPU the tokens its other
  allowed GPUs cannot absorb below ``T``, the activations the GPUs can hold must cover the
  pieces the experts need, and with no activation to spare no expert is split and every
  GPU holds exactly as many as it can. Propagated to a fixpoint, this either contradicts
  the supposition (``OPT >= T``) or leaves forced activations and tokens whose largest GPU
  time ``LB(T)`` bounds ``OPT`` (``OPT >= min(T, LB(T))`` for every ``T``). Tried at an
  upper bound (a feasible dispatch's makespan: the token-LP dispatch's here, the method's
  own in ``solve_dispatch``), then by bisection toward the bound known so far. It sees
  what the averaging bounds cannot: a GPU whose replicas are all the only ones of their
  experts it may hold (DeepSeek-V3 at EP32, 9 replicas per GPU placed by
  ``place_experts``: 9 activations where the semi-matching says 8).
* B9, activations counted per GPU (kernels in ``straggler.solvers.dispatch._counting``):
  for a trial value ``T``, suppose a dispatch keeps every GPU below ``T``; GPU ``h`` then
  holds at most ``k_h`` activations, ``U`` tokens and, with ``G`` activations, ``G +
  J(G)`` tiles. The pieces, tiles and tokens the experts need must fit those capacities
  (a dynamic programme over the GPUs' activation counts where tiles are priced), and
  where the experts need every activation the GPUs can hold (``sum_h k_h`` = live
  experts), no expert is split and every GPU holds exactly ``k_h`` whole experts: each
  expert sits on some GPU beside the experts forced there and at least the smallest others,
  which floors that GPU's time. It proves the layers whose optimum sits at an activation
  level with every GPU full (a big expert whole beside ``k - 1`` others, or a tile more
  than the level allows). Tried like B8, and only where B1-B8 leave the upper value more
  than ``OPTIMALITY_RTOL`` above them (``O(g * P * k)`` for the programme, ``P`` the
  pieces, plus ``O(replicas)`` per pass; tens of microseconds at ``E = 64-256, g = 16``).

B1-B4 and B6 come from one Numba kernel (``straggler.solvers.dispatch._bounds``, plain-Python
reference beside it), B2 from the semi-matching kernel, B5 and B7 from the token-LP kernel,
B8 from a second kernel of ``_bounds``; no LP solver or MILP is called, so every
``solve_dispatch`` call can afford it (B1-B7: about 5-25 us for ``E = 64-256, g = 8-16``
with restricted replicas; B8: a few passes of ``O(replicas)`` per trial).
"""

from __future__ import annotations

import math

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem
from ...formulations.validation import check_type
from ._backend import COUNTING_BOUND, FORCED_BOUND, LOWER_BOUND, PRELUDE
from ._bounds import FORCED_STEPS
from ._counting import COUNTING_STEPS
from .method import OPTIMALITY_RTOL

__all__ = [
    "certified_lower_bound",
    "counting_bound",
    "forced_bound",
    "layer_bound",
    "token_lp_bound",
    "validated_bound",
]

_FUNC = "certified_lower_bound"


def certified_lower_bound(problem: DispatchProblem, cost: CostModel) -> float | np.ndarray:
    """A lower bound on the optimal makespan of each layer, never above the optimum.

    Returns ``max(B1, ..., B9)`` (see the module docstring), computed from the problem and
    the cost alone: the semi-matching and token-LP values it needs are computed here by
    this library's exact kernels, never taken from the caller, and B8 and B9 are tried from
    the makespan of the exact token-LP dispatch.

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
        return np.array([validated_bound(p, cost) for p in problem.layers()], dtype=np.float64)
    return validated_bound(problem, cost)


def _certified_lower_bound_iv(problem, cost) -> tuple[DispatchProblem, CostModel]:
    check_type(
        problem, "problem", _FUNC, DispatchProblem,
        "a DispatchProblem (see DispatchProblem(counts=, replicas=))",
    )  # fmt: skip
    check_type(cost, "cost", _FUNC, CostModel, "a CostModel (e.g. CostModel.preset(name))")
    return problem, cost


def validated_bound(p: DispatchProblem, cost: CostModel, upper: float | None = None) -> float:
    """The bound of one validated layer, its semi-matching and token-LP values computed here;
    B8 and B9 tried from ``upper`` (any value; a feasible makespan proves most), else from the
    exact token-LP dispatch's makespan."""
    counts = np.ascontiguousarray(p.counts, dtype=np.int64)
    replicas = np.ascontiguousarray(p.replicas)
    c = cost.as_array()
    # the token LP, semi-matching, B1-B7 and the exact token-LP dispatch in one kernel call
    _, _, _, _, _, bound, _, m_lp = PRELUDE(counts, replicas, c, upper is None)
    return forced_bound(counts, replicas, c, float(bound), m_lp if upper is None else upper)


def layer_bound(
    counts, replicas, cost: CostModel, cost_array, sm: int, lp_value: float, upper=None
) -> float:
    """:func:`certified_lower_bound` from arrays: ``counts`` int64 ``(n_experts,)``,
    ``replicas`` bool ``(n_experts, n_gpus)``, ``cost_array = cost.as_array()`` and the
    layer's exact semi-matching value ``sm`` and token-LP value ``lp_value``: B1-B7, and B8
    and B9 from the trial value ``upper`` when it is given and above them
    (:func:`forced_bound`).

    A private path, unchecked: for this library's own callers that computed ``sm`` and
    ``lp_value`` with its kernels on these very arrays (``tempo`` does); a wrong value voids
    the bound, which is why :func:`certified_lower_bound` takes none. (``upper`` needs no
    check: B8 is valid from any trial value.)

    Examples
    --------
    >>> import numpy as np
    >>> cost = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> layer_bound(np.array([600] + [30] * 6), np.ones((7, 2), bool), cost,
    ...             cost.as_array(), 4, 390.0)
    60.0
    """
    best = float(LOWER_BOUND(counts, replicas, cost_array, int(sm)))
    best = max(best, token_lp_bound(cost, lp_value))
    if upper is not None:
        best = forced_bound(counts, replicas, cost_array, best, upper)
    return best


def forced_bound(counts, replicas, cost_array, best: float, upper: float) -> float:
    """``max(best, B8, B9)`` with B8 tried at ``upper``, then :data:`FORCED_STEPS` bisection
    trials toward ``best`` (module docstring), and B9 after it where it leaves ``upper``
    unproved (:func:`counting_bound`); ``best`` itself when ``upper <= best``.

    Examples
    --------
    Expert 0 (7 tokens) may go to GPU 0 or 1, experts 1 and 2 (3 and 1 tokens) only to GPU
    0; ``b = 1``, ``beta = 0.5``. B1-B7 give 2.75 (the token LP: 11 tokens on two GPUs).
    Below ``T = 3`` GPU 0, holding experts 1 and 2, cannot
    activate a third replica, so expert 0 is whole on GPU 1: 7 tokens take 3.5. So ``OPT
    >= 3``, which splitting expert 0 as 1 + 6 attains:

    >>> import numpy as np
    >>> R = np.array([[1, 1], [1, 0], [1, 0]], bool)
    >>> c = CostModel(a=0, b=1, c=0, beta=0.5).as_array()
    >>> forced_bound(np.array([7, 3, 1]), R, c, 2.75, 3.5)
    3.0
    """
    if not upper > best:
        return best
    best = float(FORCED_BOUND(counts, replicas, cost_array, float(best), float(upper),
                              FORCED_STEPS))  # fmt: skip
    return counting_bound(counts, replicas, cost_array, best, upper)


def counting_bound(counts, replicas, cost_array, best: float, upper: float) -> float:
    """``max(best, B9)`` with B9 tried at ``upper``, then :data:`COUNTING_STEPS` bisection
    trials toward ``best`` (module docstring); ``best`` itself where ``upper`` is within
    ``solve_dispatch``'s OPTIMAL rule of it (``upper <= best * (1 + OPTIMALITY_RTOL) +
    1e-12``: nothing left to prove), so it costs nothing on the layers B1-B8 certify.

    Examples
    --------
    Four experts of 100, 10, 10, 10 tokens, each allowed on both of two GPUs; ``b = 4``,
    ``beta = 0.1``. B1-B8 give 10 (B6: four pieces of at most 100 tokens). Below ``T = 12``
    each GPU holds two activations at most, four in all, so no expert is split and the
    expert of 100 sits whole beside one of 10 tokens: ``OPT >= 11``, which that dispatch
    attains:

    >>> import numpy as np
    >>> c = CostModel(a=0, b=4, c=0, beta=0.1).as_array()
    >>> counting_bound(np.array([100, 10, 10, 10]), np.ones((4, 2), bool), c, 10.0, 12.0)
    11.0
    """
    if not upper > best * (1 + OPTIMALITY_RTOL) + 1e-12:
        return best
    return float(COUNTING_BOUND(counts, replicas, cost_array, float(best), float(upper),
                                COUNTING_STEPS))  # fmt: skip


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
