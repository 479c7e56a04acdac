"""Baselines as upstream ships them: each rule pinned by small cases worked out from the
upstream code, and loop-by-loop references of the upstream loops (independent code)."""

import itertools
import random

import numpy as np
import pytest
from straggler.baselines.dispatch.dynamic import sglang_dynamic_choice, sglang_dynamic_lists
from straggler.baselines.dispatch.llep import native_imbalance
from straggler.baselines.dispatch.lplb import (
    _HYPERCUBE16,
    _kept_on_original,
    _lane_max,
    _lplb_exact,
    _lplb_ipm,
    _lplb_lp,
    _lplb_realise,
    lplb_placement,
    lplb_r2o,
)
from straggler.baselines.dispatch.metro import metro_greedy
from straggler.baselines.dispatch.static import _nearest_replica, sglang_static_table
from straggler.baselines.dispatch.tokens import (
    _local_positions,
    _mask_candidates,
    _shares_from_slots,
    token_layout,
)
from straggler.baselines.dispatch.vllm_ep import vllm_replica_choice
from straggler.baselines.placement.flashlb import (
    FLASHLB_Z,
    _flash_tree,
    _flashlb_statistics,
    _lpt_deployment,
    _min_max_replica,
    _minimize_moves,
    _placement_score,
    flashlb_rebalance,
)
from straggler.formulations import (
    CostModel,
    DispatchProblem,
    InvalidInputError,
    InvalidOptionError,
    check_shares,
)
from straggler.sim.workloads.batches import make_decode_problem
from straggler.solvers import solve_dispatch, solve_token_lp
from straggler.solvers.placement.eplb import rebalance_experts

COST = CostModel(a=0, b=15, c=0, beta=0.1)


# --- the synthetic token order ------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_token_layout_has_the_counts_distinct_experts_and_block_sources(seed):
    rng = np.random.default_rng(seed)
    g = int(rng.integers(1, 9))
    p = make_decode_problem("qwen3_30b", n_gpus=g, tokens_per_gpu=16, n_layers=1, seed=seed)
    n = p.counts[0]
    lay = token_layout(n, g, top_k=8, seed=seed)
    assert lay.topk.shape == (16 * g, 8)  # a real top-8 routing keeps k = 8
    assert np.bincount(lay.topk[lay.topk >= 0], minlength=n.size).tolist() == n.tolist()
    for row in lay.topk:
        live = row[row >= 0]
        assert live.size == np.unique(live).size  # k distinct experts per token
    assert (np.bincount(lay.source, minlength=g) == 16).all()
    assert (np.diff(lay.source) >= 0).all()
    assert lay.source_counts(n.size, g).sum(axis=1).tolist() == n.tolist()
    again = token_layout(n, g, top_k=8, seed=seed)
    assert np.array_equal(again.topk, lay.topk)


def test_token_layout_lowers_k_and_puts_hot_experts_first():
    # Fig. 1b is no top-2 routing (600 > 780 / 2): one expert per token
    lay = token_layout([600] + [30] * 6, 2)
    assert lay.topk.shape == (780, 1)
    assert np.bincount(lay.source).tolist() == [390, 390]
    # Plackett-Luce order by counts: the hot expert leads most of its tokens
    counts = np.array([1000] + [125] * 56)  # 1000 tokens of top-8
    lay = token_layout(counts, 8, top_k=8, seed=1)
    first = (lay.topk[:, 0] == 0).mean()
    assert first > 0.5  # uniform order would give 1/8


def test_local_positions_restart_per_rank():
    assert _local_positions(np.array([0, 0, 0, 2, 2])).tolist() == [0, 1, 2, 0, 1]
    assert _local_positions(np.array([], np.int64)).tolist() == []


# --- SGLang static ------------------------------------------------------------------------


def _ref_static(l2p, per_gpu, n_gpus, gpus_per_node, version, seed=42):
    """SGLang's compute_logical_to_rank_dispatch_physical_map, written out with lists."""
    r = random.Random(seed)

    def fair(arr, k):
        q, rem = divmod(k, len(arr))
        out = arr * q + r.sample(arr, k=rem)
        r.shuffle(out)
        return out

    table = []
    for layer in l2p:
        rows = []
        for cand_row in layer:
            cand = [p for p in cand_row if p != -1]
            out = [-1] * n_gpus
            if not cand:
                rows.append(out)
                continue
            for rank in range(n_gpus):
                if version == "same_node" and len(cand) == 1:
                    out[rank] = cand[0]
                    continue
                same = [p for p in cand if p // per_gpu == rank]
                if same:
                    out[rank] = same[0]
                    continue
                if version == "same_node":
                    node = rank // gpus_per_node
                    near = [p for p in cand if p // (per_gpu * gpus_per_node) == node]
                    if 0 < len(near) < len(cand):
                        out[rank] = near[0]
            rest = [k for k in range(n_gpus) if out[k] == -1]
            if version == "same_gpu" or rest:
                for k, p in zip(rest, fair(cand, len(rest))):
                    out[k] = p
            rows.append(out)
        table.append(rows)
    return np.array(table).transpose(2, 0, 1)  # (rank, layer, expert)


def test_sglang_nearest_rule_by_hand():
    node = np.array([0, 0, 1, 1])
    gpu = np.arange(4)
    # a single replica returns itself for everyone (no draw)
    assert [_nearest_replica([3], gpu, node, r, "same_node") for r in range(4)] == [3] * 4
    # the same GPU first (the first such slot, slots 0 and 1 both on GPU 0 here)
    assert _nearest_replica([0, 1, 4], np.array([0, 0, 1, 2, 3]), node, 0, "same_node") == 0
    # same node only when it narrows: replicas on GPUs 0, 1 (node 0) and 2 (node 1)
    assert _nearest_replica([0, 1, 2], gpu, node, 3, "same_node") == 2
    # every replica on the rank's node: no narrowing, left to the fair draw
    assert _nearest_replica([0, 1], gpu, node, 1, "same_node") == 1
    assert _nearest_replica([2, 3], gpu, np.zeros(4, int), 0, "same_node") == -1
    # before #9849: no node step, and a single replica is drawn like any other
    assert _nearest_replica([0, 1, 2], gpu, node, 3, "same_gpu") == -1
    assert _nearest_replica([3], gpu, node, 0, "same_gpu") == -1


def test_sglang_static_one_generator_across_layers():
    # layer 0: expert on GPUs 0 and 1 of four; layer 1 the same. Ranks 2 and 3 draw; the
    # draws of layer 1 continue the stream of layer 0 (not a reseeded generator).
    l2p = np.array([[[0, 1]], [[0, 1]]])
    table = sglang_static_table(l2p, np.arange(4))
    r = random.Random(42)
    first = [0, 1]
    r.shuffle(first)
    second = [0, 1]
    r.shuffle(second)
    assert table[2:, 0, 0].tolist() == first
    assert table[2:, 1, 0].tolist() == second
    assert table[:2, :, 0].tolist() == [[0, 0], [1, 1]]  # same GPU first


def test_sglang_static_single_replica_draw_consumes_the_stream_before_9849():
    # expert 0 has one replica: since #9849 no draw; before, shuffling 5 copies of it
    # advanced the generator (4 draws), so expert 1's draw differs (on 6 GPUs)
    l2p = np.array([[[0, -1], [0, 1]]])
    for version in ("same_node", "same_gpu"):
        ref = _ref_static(l2p, 1, 6, 6, version)
        assert np.array_equal(sglang_static_table(l2p, np.arange(6), version=version), ref)
    a = sglang_static_table(l2p, np.arange(6), version="same_node")[:, 0, 1]
    b = sglang_static_table(l2p, np.arange(6), version="same_gpu")[:, 0, 1]
    assert sorted(a[2:].tolist()) == sorted(b[2:].tolist()) == [0, 0, 1, 1]
    r = random.Random(42)
    fair = [0, 1] * 2
    r.shuffle(fair)
    assert a[2:].tolist() == fair
    r = random.Random(42)
    r.shuffle([0] * 5)
    fair = [0, 1] * 2
    r.shuffle(fair)
    assert b[2:].tolist() == fair != a[2:].tolist()


@pytest.mark.parametrize("seed", range(30))
def test_sglang_static_table_equals_the_loop_reference(seed):
    rng = np.random.default_rng(seed)
    nodes = int(rng.integers(1, 3))
    per_node = int(rng.integers(1, 4))
    g = nodes * per_node
    per_gpu = int(rng.integers(1, 3))
    L, E = int(rng.integers(1, 3)), int(rng.integers(1, 6))
    P = g * per_gpu
    width = int(rng.integers(1, 4))
    l2p = np.full((L, E, width), -1)
    for layer in range(L):
        for e in range(E):
            k = int(rng.integers(1, min(width, P) + 1))
            l2p[layer, e, :k] = rng.choice(P, size=k, replace=False)
    slot_gpu = np.arange(P) // per_gpu
    node = np.arange(g) // per_node
    for version in ("same_node", "same_gpu"):
        got = sglang_static_table(l2p, slot_gpu, node, version=version)
        assert np.array_equal(got, _ref_static(l2p, per_gpu, g, per_node, version)), version


def test_sglang_static_per_rank_lists_draw_from_narrowed_lists():
    # 6 GPUs on one node; expert e on GPUs 2e and 2e + 1. With the full lists expert 0's
    # draw (ranks 2..5) comes first, then expert 1's (ranks 0, 1, 4, 5). With rank 0's
    # narrowed lists expert 0 is [0] (no draw): expert 1's draw starts the stream.
    l2p = np.array([[[0, 1], [2, 3], [4, 5]]])
    full = sglang_static_table(l2p, np.arange(6))
    mine = sglang_static_table(l2p, np.arange(6), per_rank_lists=True)
    r = random.Random(42)
    first = [0, 1] * 2
    r.shuffle(first)
    second = [2, 3] * 2
    r.shuffle(second)
    assert full[2:, 0, 0].tolist() == first and full[[0, 1, 4, 5], 0, 1].tolist() == second
    fresh = [2, 3] * 2
    random.Random(42).shuffle(fresh)
    assert mine[0, 0, 1] == fresh[0] != full[0, 0, 1]  # rank 0's row: its own stream
    assert mine[2, 0, 0] == full[2, 0, 0] == first[0]  # rank 2 narrows only later experts
    assert (mine[np.arange(6), 0, np.arange(6) // 2] == np.arange(6)).all()  # same GPU
    p = DispatchProblem(counts=[1], replicas=[[1]])
    with pytest.raises(InvalidOptionError, match="per_rank_lists"):
        sglang_static_table(l2p, np.arange(6), version="same_gpu", per_rank_lists=True)
    with pytest.raises(InvalidOptionError, match="per_rank_lists"):
        solve_dispatch(p, COST, method="static", rule="first", per_rank_lists=True)


def test_static_realises_the_table_on_the_source_tokens():
    p = make_decode_problem("qwen3_30b", n_gpus=4, tokens_per_gpu=16, n_layers=2, seed=3)
    res = solve_dispatch(p, COST, method="static")
    table = sglang_static_table(
        np.stack([_mask_candidates(p.replicas[layer]) for layer in range(2)]), np.arange(4)
    )
    for layer in range(2):
        src = token_layout(p.counts[layer], 4).source_counts(p.n_experts, 4)
        expect = np.zeros((p.n_experts, 4))
        for e in range(p.n_experts):
            for s in range(4):
                expect[e, table[s, layer, e]] += src[e, s]
        assert np.array_equal(res.shares[layer], expect)
        assert np.array_equal(res.extras["layers"][layer]["table"], table[:, layer])
    # a layer solved alone is layer 0 of a fresh generator: layer 1 of the stack is not
    alone = solve_dispatch(p.layer(1), COST, method="static")
    assert np.array_equal(
        alone.extras["table"],
        sglang_static_table(_mask_candidates(p.replicas[1]), np.arange(4))[:, 0],
    )


def test_static_full_replication_keeps_every_token_local():
    p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    x = solve_dispatch(p, COST, method="static").shares
    src = token_layout(p.counts, 2).source_counts(7, 2)
    assert np.array_equal(x, src)


def test_static_options_are_checked():
    for bad in ({"rule": "nearest"}, {"version": "v2"}, {"seed": 1.5}, {"top_k": 0}):
        with pytest.raises(InvalidInputError, match=f"'{next(iter(bad))}'"):
            one = DispatchProblem(counts=[1], replicas=[[1]])
            solve_dispatch(one, COST, method="static", **bad)


# --- SGLang dynamic -----------------------------------------------------------------------


class _FixedDraws:
    """A stand-in generator whose ``integers`` returns given values (upstream's randint)."""

    def __init__(self, values):
        self.values = np.asarray(values)

    def integers(self, lo, hi, size):
        return self.values.reshape(size)


def test_sglang_dynamic_lists_narrow_to_the_nearest_replica():
    node = np.array([0, 0, 1, 1])
    lists, nv = sglang_dynamic_lists([[0, 2], [1, -1]], np.arange(4), node)
    # expert 0 on GPUs 0 (node 0) and 2 (node 1): each rank narrows to its node's replica
    assert lists[:, 0, 0].tolist() == [0, 0, 2, 2] and nv[:, 0].tolist() == [1, 1, 1, 1]
    assert nv[:, 1].tolist() == [1, 1, 1, 1]  # a single replica
    lists, nv = sglang_dynamic_lists([[0, 1]], np.arange(4), node)
    # both replicas on node 0: ranks 2, 3 draw over both
    assert nv[:, 0].tolist() == [1, 1, 2, 2]
    lists, nv = sglang_dynamic_lists([[0, 2]], np.arange(4), node, version="uniform")
    assert nv[:, 0].tolist() == [2, 2, 2, 2]


def test_sglang_dynamic_choice_is_randint_mod_num_valid():
    lists, nv = sglang_dynamic_lists([[0, 1, 2]], np.arange(3), np.zeros(3, int))
    topk = np.zeros((4, 1), int)
    src = np.array([1, 1, 1, 1])  # rank 1 holds a replica: every draw maps to it
    slots = sglang_dynamic_choice(topk, src, lists, nv, _FixedDraws([0, 1, 2, 65535]))
    assert slots.ravel().tolist() == [1, 1, 1, 1]
    lists, nv = sglang_dynamic_lists([[0, 1, 2]], np.arange(4), np.zeros(4, int), version="uniform")
    src = np.array([3, 3, 3, 3])
    slots = sglang_dynamic_choice(topk, src, lists, nv, _FixedDraws([0, 1, 5, 65535]))
    assert slots.ravel().tolist() == [0, 1, 2, 0]  # 65535 % 3 == 0


def test_sglang_dynamic_rank_invariant_uses_the_row_index_on_full_lists():
    node = np.array([0, 0, 1, 1])
    lists, nv = sglang_dynamic_lists([[0, 2], [1, -1]], np.arange(4), node, rank_invariant=True)
    assert nv[:, 0].tolist() == [2, 2, 2, 2]  # not narrowed, whatever the version
    topk = np.array([[0, 1], [0, -1], [1, 0]])
    src = np.array([0, 3, 2])  # ignored: every rank picks the same replica
    slots = sglang_dynamic_choice(topk, src, lists, nv, None, rank_invariant=True)
    assert slots.tolist() == [[0, 1], [2, -1], [1, 0]]  # row t -> list[t % num_valid]
    p = DispatchProblem(counts=[3000, 1000], replicas=[[1, 1, 1, 0], [0, 0, 0, 1]])
    a, b = (
        solve_dispatch(p, COST, method="sglang_dynamic", rank_invariant=True, rng=s) for s in (0, 1)
    )
    assert np.array_equal(a.shares, b.shares)  # no random draw
    lay = token_layout(p.counts, 4)
    rows = np.flatnonzero((lay.topk == 0).any(axis=1))
    assert a.shares[0].tolist() == np.bincount(rows % 3, minlength=4).tolist()
    with pytest.raises(InvalidInputError, match="'rank_invariant'"):
        solve_dispatch(p, COST, method="sglang_dynamic", rank_invariant="yes")


def test_sglang_dynamic_uniform_version_splits_evenly_in_expectation():
    p = DispatchProblem(counts=[3000, 1000], replicas=[[1, 1, 1, 0], [0, 0, 0, 1]])
    x = np.mean(
        [
            solve_dispatch(p, COST, method="sglang_dynamic", version="uniform", rng=s).shares[0]
            for s in range(20)
        ],
        axis=0,
    )
    assert np.allclose(x[:3], 1000, rtol=0.03)
    # same GPU first: sources 0..2 keep theirs, source 3's tokens scatter over the three
    y = solve_dispatch(p, COST, method="sglang_dynamic", rng=0).shares
    src = token_layout(p.counts, 4).source_counts(2, 4)
    assert (y[0, :3] >= src[0, :3]).all() and y[0].sum() == 3000


# --- vLLM ---------------------------------------------------------------------------------


def test_vllm_modulo_rule_by_hand():
    # two tokens of top-3 on one rank; expert 0 has replicas at slots 5 and 7
    topk = np.array([[0, 1, 2], [2, 0, 1]])
    l2p = np.array([[5, 7], [1, -1], [2, 3]])
    out = vllm_replica_choice(topk, np.zeros(2, int), l2p, version="modulo")
    # flat indices 0, 1, 2 / 3, 4, 5: expert 0 at 0 -> 0 % 2, at 4 -> 4 % 2; expert 2 at
    # 2 -> 2 % 2 = 0 (slot 2), at 3 -> 3 % 2 = 1 (slot 3)
    assert out.tolist() == [[5, 1, 2], [3, 5, 1]]
    # the flat index restarts on every rank's batch
    out = vllm_replica_choice(topk, np.array([0, 1]), l2p, version="modulo")
    assert out.tolist() == [[5, 1, 2], [2, 7, 1]]


def test_vllm_hash_rule_by_hand():
    # i = ((t * 2654435769) mod 2**32) % count: for count 3, t = 0..5 -> 0, 0, 2, 2, 1, 0
    # (2654435769 has digit sum 51: divisible by 3; 2 * it - 2**32 = 1013904242 = 2 mod 3)
    topk = np.zeros((6, 2), int)
    topk[:, 1] = 1
    l2p = np.array([[10, 11, 12], [20, -1, -1]])
    out = vllm_replica_choice(topk, np.zeros(6, int), l2p)
    assert out[:, 0].tolist() == [10, 10, 12, 12, 11, 10]
    assert (out[:, 1] == 20).all()


def test_vllm_modulo_is_biased_by_the_top_k_position():
    # a hot expert first in every token, two replicas, top-8: modulo keeps it on one
    # replica (j = 0 is even); the hash splits it by token parity
    counts = np.array([512] + [64] * 56)
    rep = np.zeros((57, 8), bool)
    rep[0, :2] = True
    rep[np.arange(1, 57), np.arange(1, 57) % 8] = True
    p = DispatchProblem(counts=counts, replicas=rep)
    mod = solve_dispatch(p, COST, method="vllm_ep", version="modulo").shares[0, :2]
    hsh = solve_dispatch(p, COST, method="vllm_ep").shares[0, :2]
    assert mod[0] > 2 * mod[1]
    assert abs(hsh[0] - hsh[1]) <= 16  # parity of the local token index


# --- SGLang lp ----------------------------------------------------------------------------


def test_sglang_lp_samples_around_the_token_lp():
    p = make_decode_problem("dsv3", n_gpus=8, tokens_per_gpu=64, n_layers=1, seed=2).layer(0)
    lp, value = solve_token_lp(p)
    draws = [solve_dispatch(p, COST, method="sglang_lp", rng=s) for s in range(12)]
    for r in draws:
        check_shares(p, r.shares)
        assert (r.shares == np.round(r.shares)).all()
        assert not (r.shares[lp == 0] > 0).any()  # only replicas with LP mass
        assert r.extras["lp_max_tokens"] == pytest.approx(value)
        assert r.extras["max_tokens"] >= np.ceil(value - 1e-9)
    mean = np.mean([r.shares for r in draws], axis=0)
    assert np.abs(mean - lp).max() < 0.25 * p.counts.max()
    assert np.mean([r.extras["max_tokens"] for r in draws]) > value  # sampling costs


# --- LPLB ---------------------------------------------------------------------------------


def test_lplb_topologies_are_upstreams():
    assert lplb_r2o("ring", 8)[0].ravel().tolist() == [1, 2, 3, 4, 5, 6, 7, 0]  # RING_8P
    cube, size = lplb_r2o("cube", 16)
    assert size == 8 and cube.T.tolist() == [[3, 0, 1, 2, 7, 4, 5, 6], [6, 7, 4, 5, 0, 1, 2, 3]]
    hyper, size = lplb_r2o("hypercube", 16)
    assert size == 16 and np.array_equal(hyper, _HYPERCUBE16)
    # ring within groups of 4 (r -> r - 1), and r -> r - 4 across the groups
    assert hyper[:4, 0].tolist() == [3, 0, 1, 2]
    assert hyper[:5, 1].tolist() == [12, 13, 14, 15, 0]
    # torus_2d(2, 4): next node's same local index, then the same node's local + 1
    torus, size = lplb_r2o("torus", 8, [0, 0, 0, 0, 1, 1, 1, 1])
    assert torus.tolist() == [[4, 1], [5, 2], [6, 3], [7, 0], [0, 5], [1, 6], [2, 7], [3, 4]]
    with pytest.raises(InvalidInputError, match="hypercube"):
        lplb_r2o("hypercube", 8)
    with pytest.raises(InvalidOptionError, match="topology"):
        lplb_r2o("mesh", 8)


def test_lplb_placement_copies_each_gpus_top_experts_along_the_graph():
    rng = np.random.default_rng(0)
    w = rng.integers(1, 1000, 64).astype(float)
    plan = lplb_placement(w, 8, "cube", redundant_per_gpu=2)
    p2l = plan.physical_to_logical.reshape(8, 10)
    # EPLB without replication: every expert once among the originals
    assert sorted(p2l[:, :8].ravel().tolist()) == list(range(64))
    # originals by descending workload; slot j copies the j-th hottest of GPU r2o[r, j]
    assert all((np.diff(w[p2l[r, :8]]) <= 0).all() for r in range(8))
    r2o = lplb_r2o("cube", 8)[0]
    for r in range(8):
        assert p2l[r, 8:].tolist() == [p2l[r2o[r, 0], 0], p2l[r2o[r, 1], 1]]
    # 16 redundant slots on 8 GPUs: 16 two-copy experts
    counts = np.bincount(plan.physical_to_logical, minlength=64)
    assert (counts == 2).sum() == 16 and counts.max() == 2
    # the originals are EPLB's packing of the workload over 8 GPUs
    eplb, _, _ = rebalance_experts(w[None], 64, 1, 1, 8)
    assert [sorted(row) for row in p2l[:, :8].tolist()] == [
        sorted(row) for row in eplb.reshape(8, 8).tolist()
    ]


def test_lplb_shared_ratio_lp_by_hand_and_against_the_token_lp():
    plan = lplb_placement([9, 5, 4, 1], 2, "ring", redundant_per_gpu=1)
    W, fixed = _lplb_lp([9, 5, 4, 1], plan)
    y, _ = _lplb_exact(W[0], fixed[0], plan.r2o)
    loads = [
        fixed[0, 0] + W[0, 0, 0] * y[0, 0] + W[0, 1, 0] * (1 - y[1, 0]),
        fixed[0, 1] + W[0, 1, 0] * y[1, 0] + W[0, 0, 0] * (1 - y[0, 0]),
    ]
    assert np.allclose(loads, 19 / 18, atol=1e-6)
    # one expert per variable (combined = 1): the LP is the token LP on LPLB's mask
    rng = np.random.default_rng(3)
    w = rng.integers(1, 300, 32)
    plan = lplb_placement(w, 8, "cube", redundant_per_gpu=2)
    W, fixed = _lplb_lp(w, plan)
    y, _ = _lplb_exact(W[0], fixed[0], plan.r2o)
    mine = max(
        fixed[0, r]
        + sum(W[0, r, j] * y[r, j] for j in range(2))
        + sum(W[0, q, j] * (1 - y[q, j]) for j, q in enumerate(plan.r2o[r]))
        for r in range(8)
    )
    _, value = solve_token_lp(DispatchProblem(counts=w, replicas=plan.replicas(32)))
    assert mine * w.max() == pytest.approx(value, rel=1e-5)


def test_lplb_ipm_warp_max_and_fallback():
    d = np.ones(42, np.float32)
    d[3] = 5.0  # lanes 0..9 last wrote d[32..41]: d[0..9] never reach the reduction
    assert _lane_max(d) == 1.0
    d[35] = 7.0
    assert _lane_max(d) == 7.0
    assert _lane_max(np.array([-1.0, -2.0], np.float32)) == 0.0  # idle lanes hold 0
    # five steps land within 1% of the optimum on these groups (none falls back); one
    # step does not pass the check and falls back to 50/50
    rng = np.random.default_rng(5)

    def peak(W, fixed, r2o, y):
        def load(r):
            sent = sum(W[q, j] * (1 - y[q, j]) for j, q in enumerate(r2o[r]))
            return fixed[r] + (W[r] * y[r]).sum() + sent

        return max(load(r) for r in range(W.shape[0]))

    for _ in range(20):
        w = rng.integers(1, 500, 32)
        plan = lplb_placement(w, 8, "cube", redundant_per_gpu=2)
        W, fixed = _lplb_lp(w, plan)
        y, ok = _lplb_ipm(W[0], fixed[0], plan.r2o)
        best, _ = _lplb_exact(W[0], fixed[0], plan.r2o)
        assert ok
        opt = peak(W[0], fixed[0], plan.r2o, best)
        assert opt - 1e-6 <= peak(W[0], fixed[0], plan.r2o, y) <= 1.01 * opt
        y, ok = _lplb_ipm(W[0], fixed[0], plan.r2o, steps=1)
        assert not ok and (y == 0.5).all()


def test_lplb_token_map_counts_by_hand():
    # n = 4, ratio 0.5: expected 2; (499 k + 41) % 4 = 1, 0, 3, 2 -> k = 0, 1 stay
    assert _kept_on_original(np.float32(0.5), 4) == 2
    # n = 499: every token has permuted index 41 -> all or nothing
    assert _kept_on_original(np.float32(0.5), 499) == 499
    assert _kept_on_original(np.float32(0.08), 499) == 0
    assert _kept_on_original(np.float32(0.999), 3) == 2  # trunc(2.997) = 2
    assert _kept_on_original(np.float32(-0.2), 5) == 0
    plan = lplb_placement([9, 5, 4, 1], 2, "ring", redundant_per_gpu=1)
    src = np.array([[5, 4], [3, 2], [2, 2], [1, 0]])
    # expert 0 (home 0, copy 1, ratio 0.5): source 0 keeps trunc(2.5) = 2 of 5, source 1
    # keeps 2 of 4; expert 1 (home 1, copy 0, ratio 1.0): all 5 stay on GPU 1
    x = _lplb_realise(src, plan, np.array([[0.5], [1.0]], np.float32))
    assert x.tolist() == [[4, 5], [0, 5], [0, 4], [1, 0]]


def test_lplb_method_dispatches_on_its_own_placement():
    p = make_decode_problem("dsv3", n_gpus=8, tokens_per_gpu=32, n_layers=1, seed=1).layer(0)
    for solver in ("exact", "ipm"):
        r = solve_dispatch(p, COST, method="lplb", solver=solver)
        own = DispatchProblem(counts=p.counts, replicas=r.extras["replicas"])
        check_shares(own, r.shares)
        assert (r.shares == np.round(r.shares)).all()
        assert (r.extras["replicas"].sum(axis=1) <= 2).all()
        assert r.extras["n_moved"] > 0 and len(r.extras["ok"]) == 1
    with pytest.raises(InvalidOptionError, match="'solver'"):
        solve_dispatch(p, COST, method="lplb", solver="simplex")


# --- METRO and LLEP -----------------------------------------------------------------------


def test_metro_orders_differ_and_index_order_is_literal():
    rep = np.array([[1, 1], [1, 0], [1, 1]], bool)
    assert metro_greedy(np.array([1, 5, 9]), rep).tolist() == [1, 0, 0]
    assert metro_greedy(np.array([1, 5, 9]), rep, order="index").tolist() == [0, 0, 1]
    differ = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        rep = rng.random((12, 4)) < 0.4
        rep[np.arange(12), rng.integers(4, size=12)] = True
        n = rng.integers(1, 50, 12)
        differ += not np.array_equal(metro_greedy(n, rep), metro_greedy(n, rep, order="index"))
    assert differ > 90  # 100 of 100 when written


def test_llep_gate():
    rep = np.ones((3, 2), bool)
    p = DispatchProblem(counts=[6, 3, 3], replicas=rep)  # native loads 12 / 0: ratio 2.0
    assert native_imbalance(p.counts, rep) == 2.0
    gated = solve_dispatch(p, COST, method="llep", min_chunk=1, threshold=2.5)
    assert not gated.extras["planned"] and gated.shares[:, 1].sum() == 0
    planned = solve_dispatch(p, COST, method="llep", min_chunk=1)
    assert planned.extras["planned"] and planned.shares[:, 1].sum() > 0
    balanced = DispatchProblem(counts=[5, 5], replicas=np.eye(2, dtype=bool))
    assert native_imbalance(balanced.counts, balanced.replicas) == 1.0
    assert not solve_dispatch(balanced, COST, method="llep").extras["planned"]
    assert solve_dispatch(balanced, COST, method="llep", threshold=None).extras["planned"]
    with pytest.raises(InvalidInputError, match="'threshold'"):
        solve_dispatch(p, COST, method="llep", threshold=-1)


# --- EPLB versions ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_eplb_vllm_port_agrees_on_tie_free_weights(seed):
    # no two experts' replica loads w / count tie (large random integers); replicas of
    # one expert always tie, so vLLM's unstable sort may swap them (their ranks, not GPUs)
    rng = np.random.default_rng(seed)
    w = rng.choice(np.arange(10**5, 10**6), size=64, replace=False)[None]
    a, _, ca = rebalance_experts(w, 80, 8, 2, 8)
    b, l2p_b, cb = rebalance_experts(w, 80, 8, 2, 8, version="vllm")
    assert np.array_equal(ca, cb)
    # the same experts on every GPU (replicas of one expert tie: their slots may swap)
    assert [sorted(r) for r in a.reshape(8, 10).tolist()] == [
        sorted(r) for r in b.reshape(8, 10).tolist()
    ]
    for e in range(64):  # vLLM lists slots in slot order
        slots = l2p_b[0, e][l2p_b[0, e] >= 0]
        assert (np.diff(slots) > 0).all()
    with pytest.raises(InvalidOptionError, match="distinct"):
        rebalance_experts(w, 80, 8, 2, 8, version="vllm", distinct=True)


# --- FlashLB ------------------------------------------------------------------------------


def test_flashlb_steps_by_hand():
    mu, var, cov = _flashlb_statistics(np.array([[9.0, 1, 1, 1], [7.0, 1, 2, 1]]))
    assert mu.tolist() == [8, 1, 1.5, 1] and var.tolist() == [2, 0, 0.5, 0]
    assert cov[0, 2] == -1.0
    # (mu + z sigma) / count: 8 + 0.674 * 1.414 = 8.95 > 1.98 > 1: expert 0 twice
    counts, hist = _min_max_replica(mu, var, 2, np.ones(4, int))
    assert counts.tolist() == [3, 1, 1, 1] and hist[1].tolist() == [2, 1, 1, 1]
    assert FLASHLB_Z == pytest.approx(0.6744897501960817)
    # co-locating two replicas of a variable expert is risky: the second goes elsewhere
    dep = _lpt_deployment(
        np.array([4.0, 4.0]), np.array([9.0, 0.0]), np.diag([9.0, 0.0]), np.array([2, 2]), 2
    )
    assert sorted(dep[0].tolist()) == [0, 1] and sorted(dep[1].tolist()) == [0, 1]
    assert _placement_score(np.array([[4.0, 2.0], [3.0, 3.0]]), [1, 1], [[0], [1]]) == (
        pytest.approx(((8.01 / 6.01) + 1.0) / 2)
    )


def _brute_min_moves(src, dst):
    """The fewest changed slots over all GPU renumberings (within-GPU order free)."""
    n, m = src.shape
    best = None
    for perm in itertools.permutations(range(n)):
        cost = 0
        for i, j in enumerate(perm):
            sc = np.bincount(src[i], minlength=20)
            dc = np.bincount(dst[j], minlength=20)
            cost += m - np.minimum(sc, dc).sum()
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(20))
def test_flashlb_minimum_move_matching_is_optimal(seed):
    rng = np.random.default_rng(seed)
    n, m = int(rng.integers(1, 5)), int(rng.integers(1, 4))
    pool = np.arange(n * m) % max(1, n * m - int(rng.integers(0, 3)))
    src = rng.permutation(pool).reshape(n, m)
    dst = rng.permutation(pool).reshape(n, m)
    out = _minimize_moves(src, dst)
    # a renumbering and reordering of dst's GPUs
    assert sorted(map(sorted, out.tolist())) == sorted(map(sorted, dst.tolist()))
    assert int((out != src).sum()) == _brute_min_moves(src, dst)


def test_flashlb_rebalance_maps_and_update_rule():
    rng = np.random.default_rng(0)
    pop = rng.zipf(1.6, 16).astype(float)
    window = rng.poisson(pop * 20, size=(32, 2, 16))
    p2l, l2p, cnt = flashlb_rebalance(window, 24, 4)
    assert p2l.shape == (2, 24) and cnt.sum(axis=1).tolist() == [24, 24]
    for layer in range(2):
        assert (np.bincount(p2l[layer], minlength=16) == cnt[layer]).all()
        for e in range(16):
            assert (
                sorted(l2p[layer, e, : cnt[layer, e]].tolist())
                == np.flatnonzero(p2l[layer] == e).tolist()
            )
    # the hot expert is replicated
    hot = np.argmax(window.mean(axis=0), axis=-1)
    assert (cnt[np.arange(2), hot] >= 2).all()
    # a previous placement that is good enough (ratio >= 0.8 and no history) is kept
    same = flashlb_rebalance(window, 24, 4, previous=p2l)[0]
    assert np.array_equal(same, p2l)
    # a bad one is replaced, keeping the experts that stay on a GPU in their slots
    bad = np.tile(np.r_[np.arange(16), np.arange(8)], (2, 1))
    new = flashlb_rebalance(window, 24, 4, previous=bad)[0]
    assert not np.array_equal(new, bad)
    fresh = flashlb_rebalance(window, 24, 4)[0]
    for layer in range(2):
        assert int((new[layer] != bad[layer]).sum()) <= int((fresh[layer] != bad[layer]).sum())
    # at most max_layers layers are updated per call
    one = flashlb_rebalance(window, 24, 4, previous=bad, max_layers=1)[0]
    assert sum(not np.array_equal(one[layer], bad[layer]) for layer in range(2)) == 1


def test_flashlb_tree_search_by_hand():
    # mu = [8, 1, 1.5, 1], 6 slots on 2 GPUs, intervals of 2 by mu + z sigma: {0, 2}, {1, 3}.
    # The greedy gives both extra replicas to expert 0 (initial = 2); the search also scores
    # 1 and 0 extra for the interval. Packed by lpt_deployment: [3, 1, 1, 1] gives GPUs
    # {0, 0, 3} / {0, 2, 1}, peak-to-mean 7/6 and 17/16.5 (mean 1.098); [2, 1] for the
    # interval leaves one replica to {1, 3}, to expert 1: [2, 2, 1, 1], GPUs {0, 2, 1} /
    # {0, 3, 1}, 1.0 and 6/5.5 (mean 1.045): the search keeps it over the greedy's.
    w = np.array([[9.0, 1, 1, 1], [7.0, 1, 2, 1]])
    mu, var, cov = _flashlb_statistics(w)
    greedy = _lpt_deployment(mu, var, cov, np.array([3, 1, 1, 1]), 2)
    assert greedy.tolist() == [[0, 0, 3], [0, 2, 1]]
    assert _placement_score(w, [3, 1, 1, 1], greedy) == pytest.approx(
        ((14.01 / 12.01) + (34 / 3 + 0.01) / (11 + 0.01)) / 2
    )
    dep, reps, score = _flash_tree(w, mu, var, cov, 6, 2)
    assert reps.tolist() == [2, 2, 1, 1] and dep.tolist() == [[0, 2, 1], [0, 3, 1]]
    assert score == pytest.approx((1.0 + 12.01 / 11.01) / 2)
    dep1, reps1, _ = _flash_tree(w, mu, var, cov, 6, 2, deep=1)  # the greedy alone
    assert reps1.tolist() == [3, 1, 1, 1] and dep1.tolist() == greedy.tolist()


def test_flashlb_input_errors():
    with pytest.raises(InvalidInputError, match="'loads'"):
        flashlb_rebalance(np.ones((1, 4)), 4, 2)  # one batch: no variance
    with pytest.raises(InvalidInputError, match="'num_replicas'"):
        flashlb_rebalance(np.ones((3, 4)), 5, 2)
    with pytest.raises(InvalidInputError, match="'previous'"):
        flashlb_rebalance(np.ones((3, 4)), 4, 2, previous=[[0, 0, 1, 2]])


def test_shares_from_slots_and_mask_candidates():
    assert _mask_candidates(np.zeros((1, 3), bool)).tolist() == [[-1]]
    x = _shares_from_slots(np.array([[1, -1]]), np.array([[4, 9]]), np.array([0, 0, 1, 1, 2]), 3, 2)
    assert x.tolist() == [[0, 0, 0], [0, 0, 1]]
