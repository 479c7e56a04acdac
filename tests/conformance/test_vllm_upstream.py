"""What vLLM's own EPLB unit tests check, on our code beside vLLM CPU 0.32.0's.

vLLM's ``tests/distributed/test_eplb_algo.py`` at commit 030ea52 (the version matching
0.32's API: the policy returns ``phy2log`` only, ``preserve_intragpu_slots(new, num_ranks,
old)``, ``compute_logical_maps``), check by check, each on our code and compared with
vLLM's on the same input:

* the load statistics' reduction over ranks: :func:`~straggler.formulations.vllm_balancedness`
  against ``_compute_eplb_load_stats``;
* the rebalance cases (the README example's exact maps, one GPU, equal weights, extreme
  imbalance, several layers, the global fallback, the hierarchical small case, the
  additional shapes, a CPU tensor): ``rebalance_experts(version="vllm")`` equals
  ``DefaultEplbPolicy.rebalance_experts`` and keeps upstream's invariants; the plug-in's
  policy (``vllm_rebalance``) keeps the same invariants; where vLLM asserts (``(7, 2, 2,
  4)``) ours refuses with an ``InvalidInputError``;
* maps from a slot map with empty (``-1``) slots: :func:`~straggler.runtime.engines.
  vllm_logical_maps` equals ``compute_logical_maps``, dtype included;
* slot preservation (three cases): :func:`~straggler.solvers.placement.eplb.
  preserve_intragpu_slots` equals vLLM's and keeps upstream's invariants.

Skipped where vLLM is not installed.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
default = pytest.importorskip("vllm.distributed.eplb.policy.default")
eplb_state = pytest.importorskip("vllm.distributed.eplb.eplb_state")

from straggler.formulations import InvalidInputError, vllm_balancedness  # noqa: E402
from straggler.runtime.engines import vllm_logical_maps, vllm_rebalance  # noqa: E402
from straggler.solvers.placement.eplb import (  # noqa: E402
    balanced_packing,
    preserve_intragpu_slots,
    rebalance_experts,
)

Policy = default.DefaultEplbPolicy


def test_load_stats_reduce_over_ranks():
    cases = [np.array([[100, 0, 0, 0], [100, 0, 0, 0]], np.float32)]  # upstream's case
    rng = np.random.default_rng(0)
    cases += [rng.integers(0, 50, size=(3, 4)).astype(np.float32) for _ in range(20)]
    for x in cases:
        avg, mx = eplb_state._compute_eplb_load_stats(torch.tensor(x))
        assert float(vllm_balancedness(x)) == pytest.approx(float(avg) / float(mx))
    assert float(vllm_balancedness(cases[0])) == 0.25  # avg 50, max 200


def _maps(w, P, G, N, R):
    """Ours and vLLM's ``phy2log`` (equal), with our replica counts."""
    theirs = Policy.rebalance_experts(torch.tensor(w), P, G, N, R).numpy()
    ours = rebalance_experts(w, P, G, N, R, version="vllm")[0]
    np.testing.assert_array_equal(ours, theirs)
    _, cnt = vllm_logical_maps(ours, w.shape[1])
    return ours, cnt


README = (
    [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
     [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]],
    16, 4, 2, 8,
)  # fmt: skip

CASES = [
    README,
    ([[10, 20, 30, 40]], 4, 1, 1, 1),  # one GPU
    ([[50] * 8], 8, 2, 2, 4),  # equal weights
    ([[1000, 1, 1, 1, 1, 1, 1, 1]], 12, 2, 2, 4),  # extreme imbalance
    ([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1], [3, 3, 3, 3, 3, 3]], 8, 2, 2, 4),  # layers
    ([[10, 20, 30, 40]], 8, 3, 2, 4),  # 3 groups on 2 nodes: the global policy
    ([[100, 50, 200, 75, 150, 25, 300, 80]], 12, 4, 2, 4),  # small hierarchical
    ([[10, 20, 30, 40, 50, 60]], 8, 3, 2, 4),  # global fallback
    ([[10, 20, 30, 40]], 6, 2, 1, 2),  # the device case (CPU tensor)
    ([list(range(1, 17))], 24, 8, 4, 8),  # additional: 16 experts
    ([[1, 9, 2, 3, 4, 5], [7, 1, 1, 2, 3, 1]], 10, 3, 1, 2),  # additional: 2 layers of 6
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_rebalance_cases(case):
    w, P, G, N, R = CASES[case]
    w = np.array(w)
    L, E = w.shape
    p2l, cnt = _maps(w, P, G, N, R)
    assert p2l.shape == (L, P) and cnt.shape == (L, E)
    assert ((p2l >= 0) & (p2l < E)).all() and (cnt >= 1).all()
    assert (cnt.sum(axis=1) == P).all()
    l2p, _ = vllm_logical_maps(p2l, E)
    assert l2p.shape[:2] == (L, E)
    if case == 0:  # upstream's exact expectation
        assert p2l.tolist() == [
            [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
            [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
        ]
        assert cnt.tolist() == [
            [1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1],
            [1, 2, 1, 1, 1, 2, 2, 1, 2, 1, 1, 1],
        ]
    if case == 1:
        assert set(p2l[0].tolist()) == {0, 1, 2, 3}
    if case == 2:
        assert (cnt == 1).all()
    if case == 3:
        assert cnt[0, 0] > cnt[0, 1]
    if case in (6, 10):
        assert (cnt[np.arange(L), w.argmax(axis=1)] >= 2).all()
    # the plug-in's policy (place_experts for vLLM's rule) keeps the same contract
    ours = vllm_rebalance(w, P, G, N, R)
    _, ours_cnt = vllm_logical_maps(ours, E)
    assert ours.shape == (L, P) and (ours_cnt >= 1).all() and (ours_cnt.sum(axis=1) == P).all()


def test_parameter_validation():
    w = np.array([[10, 20, 30, 40]])
    with pytest.raises(AssertionError):  # vLLM: 7 replicas on 4 GPUs
        Policy.rebalance_experts(torch.tensor(w), 7, 2, 2, 4)
    for f in (lambda: rebalance_experts(w, 7, 2, 2, 4, version="vllm"),
              lambda: vllm_rebalance(w, 7, 2, 2, 4)):  # fmt: skip
        with pytest.raises(InvalidInputError, match="num_replicas"):
            f()


def test_balanced_packing_equals_vllms():
    rng = np.random.default_rng(1)
    for _ in range(30):
        m = int(rng.choice([2, 3, 4]))
        w = rng.integers(0, 5, size=(3, m * int(rng.integers(1, 5)))).astype(np.float32)
        theirs = Policy.balanced_packing(w, m)
        ours = balanced_packing(w, m, version="vllm")
        for t, o in zip(theirs, ours):
            np.testing.assert_array_equal(o, t)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_logical_maps_with_empty_slots(dtype):
    p2l = torch.tensor([[0, 1, -1, 2, 3, -1], [3, -1, 2, 1, 0, -1]], dtype=dtype)
    theirs = eplb_state.compute_logical_maps(p2l, 4)
    ours = vllm_logical_maps(p2l.numpy(), 4)
    for t, o in zip(theirs, ours):
        np.testing.assert_array_equal(o, t.numpy())
        assert o.dtype == t.numpy().dtype
    l2p, cnt = ours
    assert (cnt == 1).all() and l2p.shape == (2, 4, 1) and (l2p >= 0).all()
    assert l2p[0, :, 0].tolist() == [0, 1, 3, 4]
    rng = np.random.default_rng(2)
    for _ in range(30):  # random maps with empty slots, experts without a slot, one layer
        E = int(rng.integers(1, 6))
        m = rng.integers(-1, E, size=(int(rng.integers(1, 4)), int(rng.integers(1, 12))))
        for arr in (m, m[0]):
            theirs = eplb_state.compute_logical_maps(torch.tensor(arr), E)
            for t, o in zip(theirs, vllm_logical_maps(arr, E)):
                np.testing.assert_array_equal(o, t.numpy())


PRESERVE = [
    (2, [0, 1, 2, 3, 4, 5, 6, 7], [1, 5, 0, 4, 6, 2, 7, 3]),  # simple
    (2, [0, 1, 0, 2, 3, 4, 5, 6, 1, 2], [0, 5, 4, 0, 1, 6, 2, 3, 2, 1]),  # duplicates
    (3, [0, 1, 2, 3] * 3, [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 0]),  # skewed expert
]


def _ranked(row):
    """(expert, replica rank) of every slot of a GPU segment."""
    seen: dict = {}
    out = []
    for e in row:
        out.append((e, seen.get(e, 0)))
        seen[e] = seen.get(e, 0) + 1
    return out


@pytest.mark.parametrize("ranks, old, new", PRESERVE)
def test_preserve_intragpu_slots(ranks, old, new):
    old, new = np.array([old]), np.array([new])
    theirs = Policy.preserve_intragpu_slots(new, ranks, old)
    ours = preserve_intragpu_slots(new, ranks, old)
    np.testing.assert_array_equal(ours, theirs)
    assert ours.shape == new.shape
    per = new.shape[1] // ranks
    for g in range(ranks):
        seg = slice(g * per, (g + 1) * per)
        assert sorted(_ranked(ours[0, seg].tolist())) == sorted(_ranked(new[0, seg].tolist()))
        for e in set(old[0, seg].tolist()) & set(new[0, seg].tolist()):
            first = int(np.flatnonzero(old[0, seg] == e)[0])
            assert ours[0, seg][first] == e  # kept at its old first position
    rng = np.random.default_rng(3)
    for _ in range(20):  # random maps of the same shape
        a = rng.integers(0, 4, size=(2, new.shape[1]))
        b = rng.integers(-1, 4, size=(2, new.shape[1]))
        np.testing.assert_array_equal(
            preserve_intragpu_slots(a, ranks, b), Policy.preserve_intragpu_slots(a, ranks, b)
        )
