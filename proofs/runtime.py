"""The runtime adapter's spec as a checker, and hypothesis strategies for its inputs.

:func:`dispatch_violations` states everything :func:`straggler.runtime.dispatch_and_count`
promises, from scratch (it shares no code with the kernels), and lists what an output breaks.

``replica_tables()`` draws one layer's ``(log2phy [E, X], probs [E, X])`` including the
adversarial rows the dispatch kernel must survive: all-zero rows (a torn write), ``-1``
columns anywhere in a row (with junk probability on them), single-replica rows, zero
probability on listed replicas, ties. ``topk_batches(E)`` draws ``[n_tok, K]`` expert ids
with ``-1`` padding, empty batches and all tokens on one expert. ``valid_tables(log2phy)``
draws the tables a publisher may publish (listed columns only, rows summing to 1).

>>> from hypothesis import given
>>> @given(replica_tables(max_experts=3, max_cols=2))
... def check(table):
...     log2phy, probs = table
...     assert ((log2phy >= 0).any(axis=1)).all()
>>> check()
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import strategies as st

__all__ = [
    "dispatch_violations",
    "replica_tables",
    "topk_batches",
    "valid_tables",
    "torn_mixtures",
]


def dispatch_violations(topk_ids, log2phy, probs, physical_ids, counts) -> list[str]:
    """What ``(physical_ids, counts)`` breaks of the dispatch spec (empty when nothing).

    Checked: counts equal a bincount of the valid ids (in range, of an expert with a
    replica); padding maps to ``-1``; per expert,
    each listed replica's realised count is strictly within 1 of its share of the expert's
    tokens, in exact rational arithmetic (weights: the row's finite positive values on listed
    columns, or uniform over the listed replicas when there are none); no token reaches a
    ``-1`` slot or a replica of zero weight.

    >>> dispatch_violations([[0, 0]], [[4, 5]], [[0.5, 0.5]], [[4, 4]], [2])
    ['expert 0 column 0: 2 tokens for a share of 1.0000', \
'expert 0 column 1: 0 tokens for a share of 1.0000']
    """
    ids, l2p = np.asarray(topk_ids), np.asarray(log2phy)
    probs = np.asarray(probs, dtype=np.float64)
    phys, counts = np.asarray(physical_ids), np.asarray(counts)
    E, X = l2p.shape
    bad = []
    valid = (ids >= 0) & (ids < E)
    placed = (l2p >= 0).any(axis=1)  # an expert without a replica is padding
    valid &= placed[np.where(valid, ids, 0)]
    if not np.array_equal(counts, np.bincount(ids[valid], minlength=E)):
        bad.append("counts differ from a bincount of the valid ids")
    if (phys[~valid] != -1).any():
        bad.append("a padding entry was mapped")
    for e in np.unique(ids[valid]):
        got = phys[ids == e]
        listed = l2p[e] >= 0
        w = np.where(listed & np.isfinite(probs[e]) & (probs[e] > 0), probs[e], 0.0)
        if w.sum() == 0:
            w = listed.astype(float)  # the uniform fallback of a torn row
        exact = [Fraction(float(v)) for v in w]  # shares in exact rational arithmetic
        for j in range(X):
            real = int((got == l2p[e, j]).sum()) if listed[j] else 0
            want = got.size * exact[j] / sum(exact)
            if abs(real - want) >= 1:
                bad.append(f"expert {e} column {j}: {real} tokens for a share of {float(want):.4f}")
        if not np.isin(got, l2p[e][w > 0]).all():
            bad.append(f"expert {e}: a token reached a -1 or zero-probability slot")
    return bad


@st.composite
def replica_tables(
    draw, *, max_experts: int = 8, max_cols: int = 4, max_slot: int = 64, adversarial: bool = True
):
    """``(log2phy int64 [E, X], probs float32 [E, X])``; every row lists >= 1 slot."""
    E = draw(st.integers(1, max_experts))
    X = draw(st.integers(1, max_cols))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    # distinct slots within a row (an engine never lists one slot twice for an expert)
    slots = np.stack([rng.choice(max(max_slot, X), X, replace=False) for _ in range(E)])
    listed = rng.random((E, X)) < draw(st.sampled_from([1.0, 0.7, 0.4]))
    listed[np.arange(E), rng.integers(0, X, E)] = True  # at least one replica per expert
    log2phy = np.where(listed, slots, -1).astype(np.int64)
    kind = draw(st.sampled_from(["random", "ties", "dyadic"]))
    if kind == "random":
        probs = rng.random((E, X))
    elif kind == "ties":
        probs = np.ones((E, X))
    else:
        probs = rng.integers(0, 5, size=(E, X)) / 4.0
    if adversarial:
        probs = np.where(rng.random((E, X)) < 0.25, 0.0, probs)  # zero on listed replicas
        probs = np.where(listed, probs, rng.random((E, X)))  # junk on -1 columns
        probs[rng.random(E) < 0.2] = 0.0  # torn rows
    else:
        probs = np.where(listed, probs, 0.0)
    return log2phy, probs.astype(np.float32)


@st.composite
def topk_batches(draw, n_experts: int, *, max_tokens: int = 48, max_k: int = 4):
    """``[n_tok, K]`` int64 expert ids in ``[-1, n_experts)``, some rows all padding."""
    n_tok = draw(st.integers(0, max_tokens))
    K = draw(st.integers(1, max_k))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["uniform", "skewed", "one_expert"]))
    if kind == "uniform":
        ids = rng.integers(0, n_experts, size=(n_tok, K))
    elif kind == "skewed":
        w = 1.0 / np.arange(1, n_experts + 1) ** 1.5
        ids = rng.choice(n_experts, size=(n_tok, K), p=w / w.sum())
    else:
        ids = np.full((n_tok, K), int(rng.integers(0, n_experts)))
    pad = rng.random((n_tok, K)) < draw(st.sampled_from([0.0, 0.1, 0.5]))
    pad[rng.random(n_tok) < 0.1] = True  # CUDA-graph padding rows
    return np.where(pad, -1, ids).astype(np.int64)


@st.composite
def valid_tables(draw, log2phy):
    """Probabilities ``[..., E, X]`` float32 a solver may publish for ``log2phy``: zero on
    ``-1`` columns, each listed row summing to 1 (some replicas at exactly zero)."""
    log2phy = np.asarray(log2phy)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    listed = log2phy >= 0
    w = rng.random(log2phy.shape) * (rng.random(log2phy.shape) < 0.8) * listed
    one_hot = rng.random(log2phy.shape[:-1]) < 0.3  # whole rows on one replica
    pick = rng.random(log2phy.shape) * listed
    w = np.where(one_hot[..., None], pick == pick.max(axis=-1, keepdims=True), w) * listed
    s = w.sum(axis=-1, keepdims=True)
    uniform = listed / np.maximum(listed.sum(axis=-1, keepdims=True), 1)
    probs = np.where(s > 0, w / np.where(s > 0, s, 1.0), uniform)
    return probs.astype(np.float32)


@st.composite
def torn_mixtures(draw, a, b):
    """Element-wise mixtures of two tables: what a reader racing a copy of ``b`` over ``a``
    can see (each element from one or the other), the worst tears included."""
    a = np.asarray(a)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    mode = draw(st.sampled_from(["elements", "prefix", "rows"]))
    if mode == "elements":
        take_b = rng.random(a.shape) < 0.5
    elif mode == "prefix":  # a memcpy stopped part way
        take_b = (np.arange(a.size) < rng.integers(0, a.size + 1)).reshape(a.shape)
    else:
        take_b = np.broadcast_to((rng.random(a.shape[:-1]) < 0.5)[..., None], a.shape)
    return np.where(take_b, b, a).astype(a.dtype)
