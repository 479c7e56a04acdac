"""What SGLang's own unit tests check, on our code beside SGLang 0.5.23's.

SGLang's tests (sgl-project/sglang ``test/registered/unit/eplb/``) as read, each adapted to
0.5.23's API where the stored versions target a newer one:

* ``test_balanced_packing.py``: :func:`~straggler.solvers.placement.eplb.balanced_packing`
  (``version="sglang"``) equals ``eplb_algorithms.deepseek.balanced_packing`` and keeps its
  invariants (shapes, pack and rank ranges, equal items per pack, unique slots, the
  one-item-per-pack identity, the balance case, determinism).
* ``test_compute_logical_to_rank_dispatch_physical_map.py`` (0.5.23's function has no
  ``server_args``: the node count comes from ``get_parallel()``): our
  :func:`~straggler.baselines.dispatch.static.sglang_static_table` equals SGLang's table
  for every rank and keeps the checked properties (local replica first, same-node
  fallback, ranks differ, the seed decides).
* ``test_dispatch_dtype_preservation.py`` (0.5.23 has no ``_is_hip``; the casts it tests
  are unconditional there): int32 ids stay int32 through SGLang's static and dynamic
  lookups and through ours (``sglang_static_choice``, ``sglang_dynamic_choice``), with
  equal values; int64 stays int64.

Skipped where SGLang is not installed.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
deepseek = pytest.importorskip("sglang.srt.eplb.eplb_algorithms.deepseek")
expert_location = pytest.importorskip("sglang.srt.eplb.expert_location")
dispatch = pytest.importorskip("sglang.srt.eplb.expert_location_dispatch")

from straggler.baselines.dispatch.dynamic import (  # noqa: E402
    sglang_dynamic_choice,
    sglang_dynamic_lists,
)
from straggler.baselines.dispatch.static import (  # noqa: E402
    sglang_static_choice,
    sglang_static_table,
)
from straggler.solvers.placement.eplb import balanced_packing  # noqa: E402

from .test_baselines_sglang import sglang_config  # noqa: E402, F401  (the fixture)

# --- balanced_packing ---------------------------------------------------------------------


def _both(w, m):
    theirs = deepseek.balanced_packing(torch.tensor(w), m)
    ours = balanced_packing(w, m, version="sglang")
    for t, o in zip(theirs, ours):
        np.testing.assert_array_equal(o, t.numpy())
    return ours


def _invariants(w, pack, rank, m):
    n = w.shape[1]
    assert pack.shape == rank.shape == w.shape
    assert ((pack >= 0) & (pack < m)).all() and ((rank >= 0) & (rank < n // m)).all()
    for row_p, row_r in zip(pack, rank):
        assert (np.bincount(row_p, minlength=m) == n // m).all()
        assert len(set(zip(row_p.tolist(), row_r.tolist()))) == n


@pytest.mark.parametrize(
    "shape, m", [((3, 8), 4), ((2, 6), 3), ((4, 8), 4), ((2, 8), 4), ((3, 8), 4), ((16, 8), 4)]
)
def test_balanced_packing_invariants_and_equality(shape, m):
    for seed in range(5):
        w = np.random.default_rng(seed).random(shape).astype(np.float32)
        _invariants(w, *_both(w, m), m)
    ones = np.ones(shape, np.float32)  # uniform weights: every pair ties
    _invariants(ones, *_both(ones, m), m)


def test_balanced_packing_special_cases():
    w = np.random.default_rng(0).random((2, 6)).astype(np.float32)
    pack, rank = _both(w, 6)  # one item per pack: the identity
    assert (np.sort(pack, axis=1) == np.arange(6)).all() and (rank == 0).all()
    pack, _ = _both(np.array([[3, 1, 4, 1]], np.float32), 2)
    assert np.bincount(pack[0]).tolist() == [2, 2]
    w = np.array([[9, 1, 1, 1]], np.float32)
    pack, _ = _both(w, 2)
    assert max(w[0][pack[0] == p].sum() for p in range(2)) == 10.0
    a = balanced_packing(w, 2, version="sglang")
    b = balanced_packing(w, 2, version="sglang")
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


# --- compute_logical_to_rank_dispatch_physical_map ------------------------------------------

EP, NODES, SLOTS = 4, 2, 8
SLOT_GPU = np.arange(SLOTS) // (SLOTS // EP)
GPU_NODE = np.arange(EP) // (EP // NODES)


def _upstream_map(layers=2, experts=4):
    """Logical ``i`` on slots ``2i`` and ``2i + 1`` (upstream's setup)."""
    row = np.stack([np.arange(experts) * 2, np.arange(experts) * 2 + 1], axis=1)
    return np.repeat(row[None], layers, axis=0).astype(np.int64)


def _sglang_rows(l2p, seed=42):
    return np.stack(
        [
            expert_location.compute_logical_to_rank_dispatch_physical_map(
                torch.tensor(l2p), EP, SLOTS, rank, seed=seed
            ).numpy()
            for rank in range(EP)
        ]
    )


def test_static_table_upstream_checks(sglang_config):  # noqa: F811
    sglang_config(ep_size=EP, nnodes=NODES)
    l2p = _upstream_map()
    ours = sglang_static_table(l2p, SLOT_GPU, GPU_NODE)
    np.testing.assert_array_equal(ours, _sglang_rows(l2p))
    assert ours.shape == (EP, 2, 4) and ((ours >= 0) & (ours < SLOTS)).all()
    assert ours[0, 0, 0] in (0, 1)  # GPU 0 holds logical 0: local
    assert ours[0, 0, 1] in (2, 3)  # logical 1 on GPU 1, GPU 0's node: same node
    assert any(not np.array_equal(ours[a], ours[b]) for a in range(EP) for b in range(a))
    seven = [sglang_static_table(l2p, SLOT_GPU, GPU_NODE, seed=7) for _ in range(2)]
    np.testing.assert_array_equal(seven[0], seven[1])
    np.testing.assert_array_equal(seven[0], _sglang_rows(l2p, seed=7))
    tables = [sglang_static_table(l2p, SLOT_GPU, GPU_NODE, seed=s) for s in range(20)]
    assert len({tuple(t[2].ravel()) for t in tables}) > 1  # rank 2's row: the seed decides


@pytest.mark.parametrize(
    "l2p, nodes",
    [
        (_upstream_map(layers=1), NODES),  # one layer
        (_upstream_map(), 1),  # one node
        (np.arange(SLOTS)[None, None].repeat(2, axis=0), NODES),  # one expert on every slot
    ],
)
def test_static_table_upstream_shapes(sglang_config, l2p, nodes):  # noqa: F811
    sglang_config(ep_size=EP, nnodes=nodes)
    node = np.arange(EP) // (EP // nodes)
    ours = sglang_static_table(l2p, SLOT_GPU, node)
    np.testing.assert_array_equal(ours, _sglang_rows(l2p))
    assert ours.shape == (EP, *l2p.shape[:2]) and (ours >= 0).all()


# --- dispatch dtype preservation ------------------------------------------------------------

N = 256  # logical = physical, one replica each


def _info(algorithm, p2l_row):
    l2p = torch.as_tensor(np.argsort(p2l_row))[:, None]  # each expert's one slot
    table = l2p[:, 0] if algorithm == "static" else None
    return dispatch.ExpertLocationDispatchInfo(
        ep_dispatch_algorithm=algorithm,
        partial_logical_to_rank_dispatch_physical_map=table,
        partial_logical_to_all_physical_map=l2p,
        partial_logical_to_all_physical_map_num_valid=torch.ones(N, dtype=torch.int64),
        num_physical_experts=N,
    )


@pytest.mark.parametrize("algorithm", ["static", "dynamic"])
@pytest.mark.parametrize("perm", [False, True])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", [(3,), (32, 8), (64, 8)])
def test_lookups_keep_the_ids_dtype(algorithm, perm, ids_dtype, shape):
    rng = np.random.default_rng(0)
    p2l_row = rng.permutation(N) if perm else np.arange(N)
    info = _info(algorithm, p2l_row)
    ids = torch.as_tensor(rng.integers(0, N, size=shape)).to(ids_dtype)
    theirs = dispatch.topk_ids_logical_to_physical(ids, info)
    assert theirs.dtype == ids_dtype and theirs.shape == ids.shape
    topk = ids.numpy().reshape(-1, shape[-1] if len(shape) > 1 else 1)
    source = np.zeros(topk.shape[0], dtype=np.int64)
    l2p = np.argsort(p2l_row)[:, None].astype(np.int64)
    if algorithm == "static":
        ours = sglang_static_choice(topk, source, l2p[:, 0][None])
    else:
        lists, nv = sglang_dynamic_lists(l2p, np.arange(N), np.zeros(N, np.int64))
        ours = sglang_dynamic_choice(topk, source, lists, nv, np.random.default_rng(0))
    assert ours.dtype == topk.dtype
    np.testing.assert_array_equal(ours.reshape(shape), theirs.numpy())
    assert ours.itemsize == theirs.element_size()
