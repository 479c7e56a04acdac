"""The engines' per-token rules keep the caller's integer dtype, as the engines do: SGLang
casts its lookups back to ``topk_ids.dtype`` and keeps its map's dtype in the static table;
vLLM's router writes ``topk_ids.dtype``. int32 ids from an engine come back int32."""

import numpy as np
import pytest
from straggler.baselines.dispatch.dynamic import sglang_dynamic_choice, sglang_dynamic_lists
from straggler.baselines.dispatch.static import sglang_static_choice, sglang_static_table
from straggler.baselines.dispatch.vllm_ep import vllm_replica_choice

L2P = np.array([[0, 3], [1, -1], [2, 4], [5, -1]])  # 4 experts, 6 slots on 3 GPUs
SLOT_GPU = np.arange(6) // 2


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_rules_keep_the_ids_dtype(dtype):
    rng = np.random.default_rng(0)
    topk = rng.integers(-1, 4, size=(40, 3))
    source = np.sort(rng.integers(0, 3, size=40))
    # SGLang dynamic: lists take the map's dtype, choices the ids' dtype, same values
    lists, nv = sglang_dynamic_lists(L2P.astype(dtype), SLOT_GPU, np.zeros(3, int))
    assert lists.dtype == dtype and nv.dtype == np.int64
    got = sglang_dynamic_choice(topk.astype(dtype), source, lists, nv, np.random.default_rng(1))
    ref = sglang_dynamic_choice(topk, source, lists, nv, np.random.default_rng(1))
    assert got.dtype == dtype and ref.dtype == np.int64
    np.testing.assert_array_equal(got, ref)
    inv = sglang_dynamic_choice(topk.astype(dtype), source, lists, nv, None, rank_invariant=True)
    assert inv.dtype == dtype
    # SGLang static: the table takes the map's dtype
    table = sglang_static_table(L2P.astype(dtype), SLOT_GPU)
    assert table.dtype == dtype
    np.testing.assert_array_equal(table, sglang_static_table(L2P, SLOT_GPU))
    per_rank = sglang_static_table(L2P.astype(dtype), SLOT_GPU, per_rank_lists=True)
    assert per_rank.dtype == dtype
    got = sglang_static_choice(topk.astype(dtype), source, table[:, 0])
    assert got.dtype == dtype
    live = topk >= 0
    np.testing.assert_array_equal(got[live], table[source[:, None].repeat(3, 1), 0, topk][live])
    assert (got[~live] == -1).all()
    # vLLM: the ids' dtype
    got = vllm_replica_choice(topk.astype(dtype), source, L2P)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, vllm_replica_choice(topk, source, L2P))


def test_lists_and_unsigned_input_give_int64():
    topk = np.array([[0, 1]], dtype=np.uint8)  # no -1 in an unsigned type: int64 out
    assert vllm_replica_choice(topk, [0], L2P).dtype == np.int64
    assert vllm_replica_choice([[0, 1]], [0], L2P.tolist()).dtype == np.int64
    assert sglang_static_table(L2P.tolist(), SLOT_GPU).dtype == np.int64
