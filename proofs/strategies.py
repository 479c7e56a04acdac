"""Hypothesis strategies for dispatch instances (small first, so exact oracles stay fast).

``dispatch_instances()`` draws ``(problem, cost)`` pairs covering full and restricted
replication, every cost term (floor ``a, b``, tile staircase ``b2`` with small tiles,
compute ``c, beta``, traffic ``c2, gamma``), ties, zero counts, one GPU and one giant
expert. Use them with ``@given``:

>>> from hypothesis import given
>>> @given(dispatch_instances(max_experts=3, max_gpus=2))
... def check(inst):
...     problem, cost = inst
...     assert problem.n_gpus <= 2
>>> check()
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem

__all__ = [
    "cost_models",
    "replica_masks",
    "slot_balanced_masks",
    "token_counts",
    "dispatch_instances",
    "coupled_instances",
    "forced_instances",
]


@st.composite
def cost_models(draw, *, tiles: bool | None = None, traffic: bool | None = None) -> CostModel:
    """A :class:`CostModel` with small integer-ish parameters (exact arithmetic friendly).

    ``tiles`` / ``traffic``: force the tile staircase / traffic piece on (True) or off
    (False); None draws it. Tiles are small (2-8 tokens) so that small counts cross them.
    """
    a = draw(st.sampled_from([0.0, 0.0, 1.0, 5.0, 20.0]))
    b = draw(st.sampled_from([0.0, 1.0, 2.0, 3.0, 15.0]))
    c = draw(st.sampled_from([0.0, 0.0, 2.0, 10.0]))
    beta = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0]))
    use_tiles = draw(st.booleans()) if tiles is None else tiles
    b2, tile = 0.0, 128
    if use_tiles:
        b2 = draw(st.sampled_from([0.5, 1.0, 2.0, 4.0]))
        tile = draw(st.integers(2, 8))
    use_traffic = draw(st.booleans()) if traffic is None else traffic
    extra = {}
    if use_traffic:
        extra = dict(
            c2=draw(st.sampled_from([0.0, 3.0, 25.0])),
            gamma=draw(st.sampled_from([0.1, 0.7, 3.0])),
        )
    return CostModel(a=a, b=b, c=c, beta=beta, b2=b2, tile=tile, **extra)


@st.composite
def token_counts(draw, n_experts: int, *, max_tokens: int = 40) -> np.ndarray:
    """Counts with zeros, ties and sometimes one giant expert."""
    kind = draw(st.sampled_from(["random", "ties", "giant", "zeros"]))
    if kind == "ties":
        v = draw(st.integers(1, max_tokens))
        counts = [v] * n_experts
    else:
        counts = draw(st.lists(st.integers(0, max_tokens), min_size=n_experts, max_size=n_experts))
    if kind == "giant":
        counts[draw(st.integers(0, n_experts - 1))] = draw(
            st.integers(5 * max_tokens, 20 * max_tokens)
        )
    if kind == "zeros":
        for e in draw(st.lists(st.integers(0, n_experts - 1), max_size=n_experts)):
            counts[e] = 0
    return np.array(counts, dtype=np.int64)


@st.composite
def replica_masks(draw, n_experts: int, n_gpus: int, *, full: bool | None = None) -> np.ndarray:
    """A replica mask with at least one replica per expert; ``full=True`` gives all ones."""
    is_full = draw(st.booleans()) if full is None else full
    if is_full:
        return np.ones((n_experts, n_gpus), bool)
    rows = []
    for _ in range(n_experts):
        first = draw(st.integers(0, n_gpus - 1))
        extra = draw(st.lists(st.integers(0, n_gpus - 1), max_size=n_gpus))
        row = np.zeros(n_gpus, bool)
        row[first] = True
        row[extra] = True
        rows.append(row)
    return np.array(rows)


@st.composite
def slot_balanced_masks(draw, n_gpus: int, *, max_slots_per_gpu: int = 4) -> np.ndarray:
    """An EPLB-like mask: every GPU holds the same number of slots, every expert >= 1.

    Experts fill ``per * n_gpus`` slots (each expert at least once, the rest drawn), laid
    out in a drawn order, slot ``p`` on GPU ``p // per``. Returns ``(n_experts, n_gpus)``.
    """
    per = draw(st.integers(1, max_slots_per_gpu))
    slots = per * n_gpus
    n_experts = draw(st.integers(1, slots))
    extra = draw(st.lists(st.integers(0, n_experts - 1), min_size=slots - n_experts,
                          max_size=slots - n_experts))  # fmt: skip
    owners = draw(st.permutations(list(range(n_experts)) + extra))
    rep = np.zeros((n_experts, n_gpus), bool)
    for p, e in enumerate(owners):
        rep[e, p // per] = True
    return rep


@st.composite
def dispatch_instances(
    draw,
    *,
    min_experts: int = 1,
    max_experts: int = 5,
    min_gpus: int = 1,
    max_gpus: int = 3,
    max_tokens: int = 40,
    full: bool | None = None,
    tiles: bool | None = None,
    traffic: bool | None = None,
    slot_balanced: bool = False,
):
    """``(DispatchProblem, CostModel)`` for one layer, small by default.

    ``slot_balanced=True`` draws an EPLB-like mask (:func:`slot_balanced_masks`, which
    sets the number of experts itself; ``full`` is then ignored).
    """
    n_gpus = draw(st.integers(min_gpus, max_gpus))
    if slot_balanced:
        rep = draw(slot_balanced_masks(n_gpus, max_slots_per_gpu=max(1, max_experts // n_gpus)))
        n_experts = rep.shape[0]
    else:
        n_experts = draw(st.integers(min_experts, max_experts))
        rep = draw(replica_masks(n_experts, n_gpus, full=full))
    counts = draw(token_counts(n_experts, max_tokens=max_tokens))
    cost = draw(cost_models(tiles=tiles, traffic=traffic))
    return DispatchProblem(counts=counts, replicas=rep), cost


@st.composite
def coupled_instances(draw, *, max_experts: int = 6, max_gpus: int = 4):
    """``(DispatchProblem, CostModel)`` where activations and tokens both bind: a few hot
    experts with many replicas among cold ones, and an activation cost ``b`` about the time
    of ``n* = b/beta`` tokens with ``n*`` near the hot counts (the regime where the coupling
    bound B6 of ``certified_lower_bound`` binds and splits cost activations)."""
    n_gpus = draw(st.integers(2, max_gpus))
    n_experts = draw(st.integers(n_gpus, max(n_gpus, max_experts)))
    hot = draw(st.integers(1, max(1, n_experts // 2)))
    counts = [draw(st.integers(30, 120)) for _ in range(hot)]
    counts += [draw(st.integers(0, 12)) for _ in range(n_experts - hot)]
    rep = draw(replica_masks(n_experts, n_gpus))
    for e in range(hot):  # the hot ones replicated widely
        rep[e, draw(st.lists(st.integers(0, n_gpus - 1), min_size=1, max_size=n_gpus))] = True
    b = draw(st.sampled_from([2.0, 5.0, 10.0]))
    beta = b / draw(st.sampled_from([10.0, 30.0, 60.0]))
    extra = {}
    if draw(st.booleans()):
        extra = dict(b2=draw(st.sampled_from([0.5, 2.0])), tile=draw(st.integers(4, 16)))
    cost = CostModel(a=draw(st.sampled_from([0.0, 3.0])), b=b, c=0.0, beta=beta, **extra)
    return DispatchProblem(counts=np.array(counts, np.int64), replicas=rep), cost


@st.composite
def forced_instances(draw, *, max_experts: int = 7, max_gpus: int = 4):
    """``(DispatchProblem, CostModel)`` where replicas are forced per GPU: every GPU holds
    experts that live only there, a few experts are shared by two or three GPUs, and the
    activation cost ``b`` is worth a few tokens' time, so that a GPU full of its own experts
    pushes a shared one elsewhere (the regime of bound B8 of ``certified_lower_bound``).
    Tiles (small) and the traffic piece sometimes."""
    n_gpus = draw(st.integers(2, max_gpus))
    n_experts = draw(st.integers(n_gpus, max(n_gpus, max_experts)))
    rep = np.zeros((n_experts, n_gpus), bool)
    for e in range(n_experts):
        rep[e, e % n_gpus if e < n_gpus else draw(st.integers(0, n_gpus - 1))] = True
    for _ in range(draw(st.integers(1, max(1, n_experts // 2)))):
        e = draw(st.integers(0, n_experts - 1))
        rep[e, draw(st.lists(st.integers(0, n_gpus - 1), min_size=1, max_size=2))] = True
    counts = np.array([draw(st.integers(0, 20)) for _ in range(n_experts)], np.int64)
    extra = {}
    if draw(st.booleans()):
        extra = dict(b2=draw(st.sampled_from([0.5, 2.0])), tile=draw(st.integers(2, 6)))
    if draw(st.integers(0, 3)) == 0:
        extra.update(c2=draw(st.sampled_from([0.0, 1.0])), gamma=0.3)
    cost = CostModel(
        a=draw(st.sampled_from([0.0, 1.0])),
        b=draw(st.sampled_from([1.0, 2.0, 3.0])),
        c=draw(st.sampled_from([0.0, 0.5])),
        beta=draw(st.sampled_from([0.1, 0.2, 0.5])),
        **extra,
    )
    return DispatchProblem(counts=counts, replicas=rep), cost
