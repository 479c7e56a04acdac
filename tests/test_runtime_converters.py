"""Converters to SGLang's lp tables and vLLM's replica order / replica multisets."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from straggler.formulations import DispatchProblem, InvalidInputError
from straggler.runtime.converters import (
    reorder_columns,
    sglang_logical_to_all_physical,
    to_sglang_lp,
    to_vllm_replica_map,
    to_vllm_replica_order,
)


@st.composite
def _tables(draw):
    """A placement's (log2phy, probs) through to_tables, and a shuffled engine order."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    L, E, G, per = (
        draw(st.integers(1, 3)),
        draw(st.integers(1, 8)),
        draw(st.integers(1, 4)),
        draw(st.integers(1, 4)),
    )
    P = G * per
    p2l = np.stack([rng.integers(0, E, P) for _ in range(L)])
    p2l[:, : min(E, P)] = rng.permutation(E)[: min(E, P)]
    counts = rng.integers(0, 30, size=(L, E))
    counts[~np.array([[e in p2l[l] for e in range(E)] for l in range(L)])] = 0
    problem = DispatchProblem.from_placement(counts, p2l, n_gpus=G)
    shares = rng.random((L, E, G)) * problem.replicas * (rng.random((L, E, G)) < 0.7)
    l2p, _, probs = problem.to_tables(shares, p2l)
    # the engine's order: each row's listed slots permuted (vLLM's replica ranks), +1 column
    eng = np.full(l2p.shape[:2] + (l2p.shape[-1] + 1,), -1)
    for l in range(L):
        for e in range(E):
            slots = l2p[l, e][l2p[l, e] >= 0]
            eng[l, e, : slots.size] = rng.permutation(slots)
    return l2p, probs, eng


@given(_tables())
def test_reorder_roundtrip_and_vllm_order(case):
    l2p, probs, eng = case
    moved = reorder_columns(l2p, probs, eng)
    for l, e, c in zip(*np.nonzero(eng >= 0)):
        j = int(np.flatnonzero(l2p[l, e] == eng[l, e, c])[0])
        assert moved[l, e, c] == probs[l, e, j]
    assert (moved[eng < 0] == 0).all()
    back = reorder_columns(eng, moved, l2p)
    assert np.array_equal(back, np.where(l2p >= 0, probs, 0.0))
    assert np.array_equal(to_vllm_replica_order(l2p, probs, eng), moved.astype(np.float32))


def test_reorder_refuses_unknown_slots_and_lost_mass():
    with pytest.raises(InvalidInputError, match="slot 5"):
        reorder_columns([[[0, 4]]], [[[0.5, 0.5]]], [[[5, 0]]])
    with pytest.raises(InvalidInputError, match="missing"):
        reorder_columns([[[0, 4]]], [[[0.5, 0.5]]], [[[4, -1]]])
    # a slot of zero probability may be left out (SGLang's rank-local nearest-replica rows)
    assert reorder_columns([[[0, 4]]], [[[0.0, 1.0]]], [[[4, -1]]]).tolist() == [[[1.0, 0.0]]]
    with pytest.raises(InvalidInputError, match="target_log2phy"):
        reorder_columns([[[0, 4]]], [[[0.5, 0.5]]], [[[0, 4]], [[0, 4]]])


@given(_tables())
def test_sglang_lp_layout(case):
    """[L, E, P] in the engine's columns; SGLang's rule (mask -1 columns, zero-sum rows to
    uniform, normalise) reproduces it."""
    l2p, probs, eng = case
    out = to_sglang_lp(l2p, probs, eng)
    valid = eng >= 0
    assert out.dtype == np.float32 and out.shape == eng.shape
    want = reorder_columns(l2p, probs, eng) * valid
    zero = want.sum(axis=-1) <= 0
    want[zero] = valid[zero]
    tot = want.sum(axis=-1, keepdims=True)
    want = np.divide(want, tot, out=np.zeros_like(want), where=tot > 0)  # no replica: 0
    assert np.allclose(out, want, atol=1e-6) and (out[~valid] == 0).all()


def test_sglang_lp_needs_the_engine_columns():
    l2p, probs = [[[0, 2], [1, -1]]], [[[3.0, 1.0], [1.0, 0.0]]]
    with pytest.raises(InvalidInputError, match="exactly one"):
        to_sglang_lp(l2p, probs)
    with pytest.raises(InvalidInputError, match="exactly one"):
        to_sglang_lp(l2p, probs, [[[0, 2, -1], [1, -1, -1]]], physical_to_logical=[[0, 1, 0]])
    out = to_sglang_lp(l2p, probs, physical_to_logical=[[0, 1, 0]])
    assert out.tolist() == [[[0.75, 0.25, 0.0], [1.0, 0.0, 0.0]]]
    assert sglang_logical_to_all_physical([[1, 0, 1, 1]]).tolist() == [
        [[1, -1, -1, -1], [0, 2, 3, -1]]
    ]
    with pytest.raises(InvalidInputError, match="physical_to_logical"):
        sglang_logical_to_all_physical([[0, -1]])


@given(_tables(), st.integers(1, 17))
def test_vllm_replica_map_multiplicities(case, width):
    l2p, probs, _ = case
    m, cnt = to_vllm_replica_map(l2p, probs, width)
    has = (l2p >= 0).any(axis=-1)
    assert m.shape == l2p.shape[:2] + (width,) and np.array_equal(cnt, np.where(has, width, 0))
    assert (m[~has] == -1).all()
    for l in range(l2p.shape[0]):
        for e in range(l2p.shape[1]):
            listed = l2p[l, e] >= 0
            if not listed.any():
                continue
            w = np.where(listed, probs[l, e], 0.0)
            if w.sum() == 0:
                w = listed.astype(float)
            w = w / w.sum()
            assert np.isin(m[l, e], l2p[l, e][w > 0]).all()
            for j in np.flatnonzero(listed):
                assert abs((m[l, e] == l2p[l, e, j]).sum() - width * w[j]) < 1


def test_vllm_rule_on_the_map_realises_the_shares():
    """vLLM's replica choice over the map (the Knuth hash of the token index, vllm_ep's
    rule, which tests/conformance checks against vLLM's kernel; and the older position
    modulo the count) splits a batch in the published proportions: exactly for a width
    that is a power of two, within a token per block of ``width`` tokens otherwise."""
    from straggler.baselines.dispatch.vllm_ep import vllm_replica_choice

    l2p = np.array([[[10, 11, 12]]])
    probs = np.array([[[0.5, 0.25, 0.25]]])
    m, cnt = to_vllm_replica_map(l2p, probs, 8)
    topk = np.zeros((8000, 1), dtype=np.int64)  # every token's expert 0, one rank
    for version in ("hash", "modulo"):
        phys = vllm_replica_choice(topk, np.zeros(8000, int), m[0], version=version)
        share = [(phys == s).mean() for s in (10, 11, 12)]
        assert share == [0.5, 0.25, 0.25], version
    m6, _ = to_vllm_replica_map(l2p, probs, 6)
    phys = vllm_replica_choice(topk[:6000], np.zeros(6000, int), m6[0], version="hash")
    got = np.array([(phys == s).sum() for s in (10, 11, 12)])
    want = np.array([(m6[0, 0] == s).sum() for s in (10, 11, 12)]) * 1000
    assert np.abs(got - want).max() <= 1000  # within a token per block of 6
    with pytest.raises(InvalidInputError, match="width"):
        to_vllm_replica_map(l2p, probs, 0)


def test_integration_page_names_the_patch_points():
    import pathlib

    page = pathlib.Path(__file__).parents[1] / "docs" / "guides" / "engines" / "integration.md"
    text = page.read_text()
    for needle in (
        "Dispatch hook",
        "Count window",
        "Table tensor",
        "num_valid_tokens",
        "topk_ids_logical_to_physical",
        "eplb_map_to_physical_and_record",
        "set_placement",
        "to_sglang_lp",
    ):
        assert needle in text, needle
