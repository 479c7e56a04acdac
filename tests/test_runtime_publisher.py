"""TablePublisher: one-copy publication that cannot route wrong, under races and tears."""

import doctest
import importlib.util
import os
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from straggler.formulations import InvalidInputError
from straggler.proofs.runtime import (
    dispatch_violations,
    replica_tables,
    topk_batches,
    torn_mixtures,
    valid_tables,
)
from straggler.runtime import TablePublisher, dispatch_and_count
from straggler.runtime.publisher import normalize_table, uniform_table

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed (runtime extra)")

if HAS_TORCH:
    import torch


def _placement(rng, L, E, X, n_slots=64):
    l2p = np.full((L, E, X), -1, np.int64)
    for l in range(L):
        for e in range(E):
            k = int(rng.integers(1, X + 1))
            l2p[l, e, :k] = rng.choice(n_slots, k, replace=False)
            rng.shuffle(l2p[l, e])  # -1 columns anywhere in the row
    return l2p


@needs_torch
def test_docstring_examples():
    """The class examples (skipped by the package doctest run, which has no torch)."""
    text = TablePublisher.__doc__.replace("# doctest: +SKIP", "")
    test = doctest.DocTestParser().get_doctest(
        text, {"np": np, "TablePublisher": TablePublisher}, "TablePublisher", None, 0
    )
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0 and runner.tries >= 6


@needs_torch
def test_publish_normalises_keeps_idle_rows_and_zero_columns():
    rng = np.random.default_rng(0)
    l2p = _placement(rng, 3, 8, 3)
    pub = TablePublisher(l2p, device="cpu")
    assert np.allclose(pub.snapshot(), uniform_table(l2p))
    data = rng.random(l2p.shape) * 5  # weight on -1 columns too: must be dropped
    rows = rng.random((3, 8)) < 0.5
    before = pub.snapshot()
    storage = pub.probs.data_ptr()
    assert pub.publish(data, rows=rows) == 1
    after = pub.snapshot()
    assert pub.probs.data_ptr() == storage  # in place: a captured graph keeps its address
    assert np.array_equal(after[~rows], before[~rows])  # idle rows untouched
    assert (after[l2p < 0] == 0).all()
    assert np.allclose(after[rows], normalize_table(data, l2p)[rows], atol=1e-7)
    assert np.allclose(after.sum(axis=-1), 1, atol=1e-6)
    pub.publish(np.zeros(l2p.shape))  # no weight anywhere: uniform, never a zero row
    assert np.allclose(pub.snapshot(), uniform_table(l2p))


@needs_torch
def test_reset_and_bad_input():
    rng = np.random.default_rng(1)
    l2p = _placement(rng, 2, 4, 2)
    pub = TablePublisher(l2p, device="cpu")
    with pytest.raises(InvalidInputError, match="probs"):
        pub.publish(np.ones((2, 4, 3)))
    with pytest.raises(InvalidInputError, match="probs"):
        pub.publish(-np.ones(l2p.shape))
    with pytest.raises(InvalidInputError, match="probs"):
        pub.publish(np.full(l2p.shape, np.nan))
    with pytest.raises(InvalidInputError, match="rows"):
        pub.publish(np.ones(l2p.shape), rows=np.ones((2, 5), bool))
    with pytest.raises(InvalidInputError, match="log2phy"):
        TablePublisher(np.zeros((2, 4)), device="cpu")
    with pytest.raises(InvalidInputError, match="log2phy"):
        TablePublisher(np.full((1, 2, 2), -3), device="cpu")
    with pytest.raises(InvalidInputError, match="log2phy"):
        pub.reset(np.zeros((2, 4, 3)))
    new = _placement(rng, 2, 4, 2)
    pub.reset(new)
    assert torch.equal(pub.log2phy, torch.as_tensor(new))
    assert np.allclose(pub.snapshot(), uniform_table(new))


@st.composite
def _torn(draw):
    l2p, _ = draw(replica_tables(max_experts=6, max_cols=4, adversarial=False))
    a = draw(valid_tables(l2p))
    b = draw(valid_tables(l2p))
    mix = draw(torn_mixtures(a, b))
    ids = draw(topk_batches(l2p.shape[0], max_tokens=40))
    return l2p, mix, ids, draw(st.integers(0, 1000))


@given(_torn())
def test_any_tear_of_two_published_tables_routes_validly(case):
    """Every element-wise mixture of two valid tables (the worst tears: memcpy stopped part
    way, alternating elements, rows) is dispatched within the spec: no -1 slot, no
    zero-weight replica, shares of the mixture (or uniform when it is all zero)."""
    l2p, mix, ids, seed = case
    for backend in ("reference", "torch") if HAS_TORCH else ("reference",):
        if backend == "torch":
            args = (torch.tensor(ids), torch.tensor(l2p), torch.tensor(mix))
        else:
            args = (ids, l2p, mix)
        phys, counts = dispatch_and_count(*args, seed=seed, backend=backend)
        phys, counts = np.asarray(phys), np.asarray(counts)
        assert dispatch_violations(ids, l2p, mix, phys, counts) == []
        listed_rows = (l2p >= 0).any(axis=1)
        assert (phys[ids >= 0] >= 0).all() and listed_rows.all()


@pytest.mark.skipif(not (HAS_TORCH and HAS_TRITON), reason="torch and triton not installed")
@settings(max_examples=8)
@given(_torn())
def test_tears_under_the_triton_kernel(case):
    l2p, mix, ids, seed = case
    old = os.environ.get("TRITON_INTERPRET")
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"
    dev = "cuda" if cuda else "cpu"
    try:
        phys, counts = dispatch_and_count(
            torch.tensor(ids, device=dev),
            torch.tensor(l2p, device=dev),
            torch.tensor(mix, device=dev),
            seed=seed,
            backend="triton",
        )
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old
    assert dispatch_violations(ids, l2p, mix, phys.cpu().numpy(), counts.cpu().numpy()) == []


@needs_torch
def test_writer_thread_racing_a_reader():
    """A writer publishes random valid tables (one-hot rows that flip columns, so tears can
    zero a row) while the reader dispatches against the live tensor: no token reaches a
    replica lacking its expert, no NaN, every row read valid or the uniform fallback."""
    rng = np.random.default_rng(5)
    L, E, X = 4, 128, 4
    l2p = _placement(rng, L, E, X)
    listed = l2p >= 0
    pub = TablePublisher(l2p, device="cpu")
    stop = threading.Event()
    errors = []

    def writer():
        wr = np.random.default_rng(6)
        try:
            while not stop.is_set():
                hot = wr.random(l2p.shape) * listed
                table = (hot == hot.max(axis=-1, keepdims=True)) * listed * 1.0
                if wr.random() < 0.5:
                    table = wr.random(l2p.shape) * listed
                pub.publish(table, rows=wr.random((L, E)) < 0.8)
                time.sleep(0.0005)  # let the reader in (the GIL), yet publish ~1000/s
        except Exception as exc:  # noqa: BLE001 - reported by the reader
            errors.append(exc)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    reads = 0
    try:
        ids = rng.integers(-1, E, size=(128, 8))
        tids = torch.tensor(ids)
        for step in range(100):
            l = step % L
            tl2p, tprobs = pub.layer(l)
            phys, counts = dispatch_and_count(tids, tl2p, tprobs, seed=step, check=False)
            phys = phys.numpy()
            ok = ids >= 0
            slot_ok = (phys[..., None] == l2p[l][np.maximum(ids, 0)]).any(axis=-1)
            assert (phys[~ok] == -1).all() and slot_ok[ok].all()
            assert np.array_equal(counts.numpy(), np.bincount(ids[ok], minlength=E))
            snap = tprobs.clone().numpy()
            assert np.isfinite(snap).all() and (snap >= 0).all()
            assert (snap[~listed[l]] == 0).all()
            s = snap.sum(axis=-1)  # a mixture renormalises to a distribution, or is all zero
            assert ((s > 0) | (snap == 0).all(axis=-1)).all()
            reads += 1
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not errors, errors
    assert reads == 100 and pub.version > 0


@needs_torch
def test_a_failed_reset_changes_nothing():
    l2p = np.array([[[0, 2], [1, -1]]])
    pub = TablePublisher(l2p, device="cpu")
    pub.publish([[[3.0, 1.0], [1.0, 0.0]]])
    before = (pub.log2phy.clone(), pub.snapshot(), pub.version)
    new = np.array([[[0, -1], [1, 2]]])
    for bad in ([[[1.0, 1.0], [-1.0, 0.0]]], np.ones((1, 2, 3)), [[[np.nan, 1], [1, 1]]]):
        with pytest.raises(InvalidInputError, match="probs"):
            pub.reset(new, probs=bad)
        assert torch.equal(pub.log2phy, before[0])
        assert np.array_equal(pub.snapshot(), before[1]) and pub.version == before[2]


@needs_torch
def test_huge_finite_weights_normalise_instead_of_overflowing():
    l2p = np.array([[[0, 2], [1, -1]]])
    pub = TablePublisher(l2p, device="cpu")
    pub.publish([[[1e308, 1e308], [5.0, 0.0]]])
    assert pub.snapshot()[0].tolist() == [[0.5, 0.5], [1.0, 0.0]]
    pub.publish([[[1e308, 1e-300], [1e308, 7.0]]])
    row = pub.snapshot()[0]
    assert row[0].tolist() == [1.0, 0.0] and row[1].tolist() == [1.0, 0.0]
    # a weight that underflows float32 still yields a distribution over the listed replicas
    pub.publish([[[1e-45, 0.0], [1.0, 0.0]]])
    assert abs(float(pub.snapshot()[0, 0].sum()) - 1) < 1e-6
    assert np.allclose(normalize_table([[[1e308, 1e308]]], [[[0, 1]]]), 0.5)


@needs_torch
@pytest.mark.skipif(HAS_TORCH and torch.cuda.is_available(), reason="a CUDA device is present")
def test_unavailable_devices_are_refused_clearly():
    l2p = np.array([[[0, 2], [1, -1]]])
    for device in ("cuda", "cuda:7", "meta", "nonsense"):
        with pytest.raises(InvalidInputError, match="'device' parameter of TablePublisher"):
            TablePublisher(l2p, device=device)


@needs_torch
def test_layer_index_is_checked():
    pub = TablePublisher(np.array([[[0, 2], [1, -1]]]), device="cpu")
    assert pub.layer(0)[0].tolist() == [[0, 2], [1, -1]]
    for bad in (1, -1, "0", 0.0):
        with pytest.raises(InvalidInputError, match="'l' parameter"):
            pub.layer(bad)
