"""EPLB placement: upstream's README example, hand-checked cases, a loop-by-loop reference,
properties, the distinct variant and input validation. No torch needed."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from straggler.formulations import DispatchProblem, InvalidInputError, InvalidOptionError
from straggler.solvers.placement import eplb
from straggler.solvers.placement.eplb import rebalance_experts

README_WEIGHT = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]
README_P2L = [
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
    [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
]


def test_readme_example():
    p2l, l2p, cnt = rebalance_experts(np.array(README_WEIGHT), 16, 4, 2, 8)
    assert p2l.tolist() == README_P2L
    _check_tables(np.array(README_WEIGHT), p2l, l2p, cnt, 16, 8)


def test_global_policy_by_hand_with_duplicate_on_one_gpu():
    # 1 group on 2 nodes: 1 % 2 != 0, so the global policy. Replicate 4 -> 6: expert 0
    # (6) first, then a tie 6/2 == 3/1 won by expert 0: counts [3, 1, 1, 1], replica
    # loads [2, 2, 3, 1, 2, 2]. Packing (desc., stable): slot2 -> GPU0 (3), slot0 -> GPU1
    # (2), slot1 -> GPU1 (4), slot4 -> GPU0 (5), slot5 -> GPU1 (6, full), slot3 -> GPU0.
    p2l, l2p, cnt = rebalance_experts([[6, 2, 3, 1]], 6, 1, 2, 2)
    assert p2l.tolist() == [[2, 0, 3, 0, 1, 0]]  # two replicas of expert 0 on GPU 1
    assert cnt.tolist() == [[3, 1, 1, 1]]
    # logical_to_physical lists slots in replica-rank order, not slot order
    assert l2p.tolist() == [[[3, 1, 5], [4, -1, -1], [0, -1, -1], [2, -1, -1]]]
    # the distinct variant caps replicas at 2 GPUs and packs without duplicates:
    # counts [2, 1, 2, 1], loads [3, 2, 1.5, 1, 3, 1.5]
    p2l, l2p, cnt = rebalance_experts([[6, 2, 3, 1]], 6, 1, 2, 2, distinct=True)
    assert p2l.tolist() == [[0, 1, 2, 0, 2, 3]]
    assert cnt.tolist() == [[2, 1, 2, 1]]


def test_hierarchical_keeps_groups_on_nodes_and_hot_expert_unreplicated():
    # 2 groups of 2 on 2 nodes, 4 GPUs, 8 slots: group {0, 1} (load 101) goes to node 0,
    # group {2, 3} (load 60) to node 1; each node replicates its own experts into 4 slots.
    w = [[100, 1, 30, 30]]
    p2l, _, cnt = rebalance_experts(w, 8, 2, 2, 4)
    assert sorted(p2l[0, :4].tolist()) == [0, 0, 0, 1]
    assert sorted(p2l[0, 4:].tolist()) == [2, 2, 3, 3]
    # the global policy replicates the hot expert more
    _, _, cnt_global = rebalance_experts(w, 8, 1, 2, 4)
    assert cnt.tolist() == [[3, 1, 2, 2]] and cnt_global.tolist() == [[4, 1, 2, 1]]


def test_swap_repair_of_the_distinct_packing():
    # 6 replicas into 3 packs of 2; labels are experts, the last two share expert 4.
    weight = np.array([[3, 3, 7, 7, 8, 2]], np.float32)
    labels = np.array([[0, 1, 2, 3, 4, 4]])
    # greedy (desc., stable): item4 -> p0 (8), item2 -> p1 (7), item3 -> p2 (7),
    # item0 -> p1 (tie 7/7, lowest; 10, full), item1 -> p2 (10, full); item5 (expert 4):
    # only p0 has room and it holds expert 4 -> dead end. Repair: the lightest full pack
    # without expert 4 is p1 (tie 10/10, lowest); its lightest item whose expert is absent
    # from p0 is item0 (3): item0 moves to p0 (rank 1), item5 takes its place in p1.
    pack, rank = eplb._balanced_packing_distinct(weight, labels, 3)
    assert pack.tolist() == [[0, 2, 1, 2, 0, 1]]
    assert rank.tolist() == [[1, 1, 0, 0, 0, 1]]
    # upstream's packing puts both replicas of expert 4 in p0
    pack, _ = eplb.balanced_packing(weight, 3)
    assert pack[0, 4] == pack[0, 5] == 0


def _distinct(pack, labels):
    return all(
        len(set(labels[i][pack[i] == p])) == int((pack[i] == p).sum())
        for i in range(pack.shape[0])
        for p in np.unique(pack[i])
    )


# --- a loop-by-loop reference of upstream's code (lists and float32 scalars) -------------


def _ref_packing(w, m, vllm=False):
    n = len(w)
    per = n // m
    if per == 1:
        return list(range(n)), [0] * n
    if vllm:  # vLLM's port: numpy's default argsort, float64 pack loads
        order = np.argsort(-np.array(w)).tolist()
        loads, items = [np.float64(0)] * m, [0] * m
    else:
        order = sorted(range(n), key=lambda j: -w[j])  # Python's sort is stable
        loads, items = [np.float32(0)] * m, [0] * m
    pack, rank = [-1] * n, [-1] * n
    for j in order:
        best = None
        for p in range(m):
            if items[p] < per and (best is None or loads[p] < loads[best]):
                best = p
        pack[j], rank[j] = best, items[best]
        loads[best] = loads[best] + w[j]
        items[best] += 1
    return pack, rank


def _ref_replicate(w, num_phy, vllm=False):
    num_log = len(w)
    p2l, rank, cnt = list(range(num_phy)), [0] * num_phy, [1] * num_log
    for i in range(num_log, num_phy):
        if vllm:  # float32 / int64 arrays divide in float64
            ratios = [np.float64(w[e]) / np.float64(cnt[e]) for e in range(num_log)]
        else:
            ratios = [w[e] / np.float32(cnt[e]) for e in range(num_log)]
        best = 0
        for e in range(1, num_log):
            if ratios[e] > ratios[best]:
                best = e
        p2l[i], rank[i] = best, cnt[best]
        cnt[best] += 1
    return p2l, rank, cnt


def _ref_layer(w, P, groups, nodes, gpus, vllm=False):
    """One layer of the hierarchical policy, written out with explicit loops."""
    E = len(w)
    gsize, per_node_log, per_node_phy = E // groups, E // nodes, P // nodes
    per_gpu = P // gpus
    gload = [np.float32(0)] * groups
    for g in range(groups):
        for k in range(gsize):
            gload[g] = gload[g] + w[g * gsize + k]
    gpack, grank = _ref_packing(gload, nodes, vllm)
    # node-major "middle" numbering: node n holds middle ids n*per_node_log ...
    log2mlog = [0] * E
    for g in range(groups):
        for k in range(gsize):
            log2mlog[g * gsize + k] = (gpack[g] * (groups // nodes) + grank[g]) * gsize + k
    mlog2log = [0] * E
    for e, m in enumerate(log2mlog):
        mlog2log[m] = e
    p2l, rank, cnt = [None] * P, [None] * P, [0] * E
    for node in range(nodes):
        wn = [w[mlog2log[node * per_node_log + j]] for j in range(per_node_log)]
        phy2m, phyrank, mcnt = _ref_replicate(wn, per_node_phy, vllm)
        div = np.float64 if vllm else np.float32
        loads = [div(wn[phy2m[i]]) / div(mcnt[phy2m[i]]) for i in range(per_node_phy)]
        pack, prank = _ref_packing(loads, gpus // nodes, vllm)
        for i in range(per_node_phy):
            slot = node * per_node_phy + pack[i] * per_gpu + prank[i]
            e = mlog2log[node * per_node_log + phy2m[i]]
            p2l[slot], rank[slot] = e, phyrank[i]
        for j in range(per_node_log):
            cnt[mlog2log[node * per_node_log + j]] = mcnt[j]
    return p2l, rank, cnt


def _reference(weight, P, groups, nodes, gpus, vllm=False):
    w = np.asarray(weight, dtype=np.float32)
    if groups % nodes:
        groups, nodes = 1, 1
    out = [_ref_layer(list(row), P, groups, nodes, gpus, vllm) for row in w]
    return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]


@st.composite
def eplb_inputs(draw):
    nodes = draw(st.integers(1, 3))
    gpus = nodes * draw(st.integers(1, 3))
    groups = draw(st.sampled_from([1, 2, 3, 4, 6]))
    E = groups * draw(st.integers(1, 3))
    P = gpus * draw(st.integers(-(-E // gpus), -(-E // gpus) + 3))
    L = draw(st.integers(1, 3))
    hi = draw(st.sampled_from([3, 10, 1000]))  # small ranges make many ties
    w = draw(st.lists(st.integers(0, hi), min_size=L * E, max_size=L * E))
    return np.array(w).reshape(L, E), P, groups, nodes, gpus


@given(eplb_inputs())
def test_matches_loop_reference(args):
    weight, P, groups, nodes, gpus = args
    hier = groups % nodes == 0
    if hier and (weight.shape[1] % groups or gpus % nodes):
        with pytest.raises(InvalidInputError):
            rebalance_experts(weight, P, groups, nodes, gpus)
        return
    p2l, l2p, cnt = rebalance_experts(weight, P, groups, nodes, gpus)
    ref_p2l, ref_rank, ref_cnt = _reference(weight, P, groups, nodes, gpus)
    assert p2l.tolist() == ref_p2l
    assert cnt.tolist() == ref_cnt
    for layer in range(weight.shape[0]):
        for slot in range(P):
            assert l2p[layer, p2l[layer, slot], ref_rank[layer][slot]] == slot
    _check_tables(weight, p2l, l2p, cnt, P, gpus)
    # vLLM's numpy port against the same loops with vLLM's sort and float64 loads
    p2l, l2p, cnt = rebalance_experts(weight, P, groups, nodes, gpus, version="vllm")
    ref_p2l, _, ref_cnt = _reference(weight, P, groups, nodes, gpus, vllm=True)
    assert p2l.tolist() == ref_p2l
    assert cnt.tolist() == ref_cnt
    _check_tables(weight, p2l, l2p, cnt, P, gpus)


def _check_tables(weight, p2l, l2p, cnt, P, gpus):
    L, E = weight.shape
    assert p2l.shape == (L, P) and cnt.shape == (L, E)
    assert ((p2l >= 0) & (p2l < E)).all()
    for layer in range(L):
        assert (np.bincount(p2l[layer], minlength=E) == cnt[layer]).all()
        assert (cnt[layer] >= 1).all()  # every expert keeps at least one replica
        for e in range(E):
            slots = l2p[layer, e, : cnt[layer, e]]
            assert (l2p[layer, e, cnt[layer, e] :] == -1).all()
            assert sorted(slots.tolist()) == np.flatnonzero(p2l[layer] == e).tolist()
    assert l2p.shape == (L, E, int(cnt.max()))
    # each GPU gets P / gpus slots, all filled; the mask built from the map covers all
    prob = DispatchProblem.from_placement(np.zeros((L, E), int), p2l, gpus)
    assert prob.replicas.any(axis=-1).all()


@given(eplb_inputs())
def test_distinct_variant_never_duplicates(args):
    weight, P, groups, nodes, gpus = args
    hier = groups % nodes == 0
    if hier and (weight.shape[1] % groups or gpus % nodes):
        return
    g_nodes = nodes if hier else 1
    if P // g_nodes > (weight.shape[1] // g_nodes) * (gpus // g_nodes):
        with pytest.raises(InvalidInputError, match="distinct"):
            rebalance_experts(weight, P, groups, nodes, gpus, distinct=True)
        return
    p2l, l2p, cnt = rebalance_experts(weight, P, groups, nodes, gpus, distinct=True)
    _check_tables(weight, p2l, l2p, cnt, P, gpus)
    per_gpu = P // gpus
    for layer in range(weight.shape[0]):
        for g in range(gpus):
            on_gpu = p2l[layer, g * per_gpu : (g + 1) * per_gpu]
            assert len(set(on_gpu.tolist())) == per_gpu, (layer, g, on_gpu)


def test_upstream_duplicates_do_occur():
    """The known upstream behaviour the distinct variant removes, on a skewed load."""
    rng = np.random.default_rng(0)
    w = rng.zipf(1.5, size=(8, 64)).astype(float)
    p2l, _, _ = rebalance_experts(w, 80, 8, 1, 8)
    per_gpu = 10
    dup = sum(
        len(set(p2l[l, g * per_gpu : (g + 1) * per_gpu].tolist())) < per_gpu
        for l in range(8)
        for g in range(8)
    )
    assert dup > 0
    p2l, _, _ = rebalance_experts(w, 80, 8, 1, 8, distinct=True)
    assert all(
        len(set(p2l[l, g * per_gpu : (g + 1) * per_gpu].tolist())) == per_gpu
        for l in range(8)
        for g in range(8)
    )


@pytest.mark.parametrize(
    "args, param",
    [
        (([[1, 2, 3]], 3, 1, 1, 2), "num_replicas"),  # 3 slots on 2 GPUs
        (([[1, 2, 3, 4]], 6, 1, 1, 4), "num_replicas"),  # not a multiple of num_gpus
        (([[1, 2, 3, 4]], 2, 1, 1, 2), "num_replicas"),  # fewer slots than experts
        (([[1, 2, 3, 4]], 4, 3, 1, 2), "num_groups"),  # 4 experts, 3 groups (hierarchical)
        (([[1, 2, 3, 4]], 4, 2, 2, 3), "num_gpus"),  # 3 GPUs on 2 nodes
        (([1, 2, 3, 4], 4, 1, 1, 2), "weight"),  # 1-D
        (([[1, np.nan]], 2, 1, 1, 2), "weight"),
        (([[True, False]], 2, 1, 1, 2), "weight"),
        (([[1, 2]], 2, 0, 1, 2), "num_groups"),
        (([[1, 2]], 2, 1, 1, 2.0), "num_gpus"),
    ],
)
def test_invalid_input(args, param):
    with pytest.raises(InvalidInputError, match=f"'{param}'"):
        rebalance_experts(*args)


@given(
    st.integers(1, 3),
    st.integers(2, 30),
    st.integers(0, 30),
    st.integers(0, 4),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_compiled_loops_equal_their_references(L, E, extra, cap, f64, seed):
    # kernel == its py_func == the plain reference (upstream's loop as written), bit for bit,
    # on integer loads (ties) and on real ones, for both accumulation dtypes
    from straggler.solvers.placement import _eplb_kernels as k

    rng = np.random.default_rng(seed)
    P = E + extra
    dt = np.float64 if f64 else np.float32
    w = rng.integers(0, 20, size=(L, E)).astype(np.float32)
    if seed % 2:
        w = (rng.random((L, E)) * 50).astype(np.float32)
    cap = cap if cap * E >= P else 0
    ones = np.ones(E, dt)
    rk, pk = k.replicate_kernel, k.packing_kernel
    outs = [
        f(w, P, cap, ones)
        for f in (rk, getattr(rk, "py_func", rk), k.replicate_reference)
    ]  # fmt: skip
    for other in outs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(outs[0], other))
    packs = [d for d in range(1, P + 1) if P % d == 0]
    m = packs[seed % len(packs)]
    ww = np.round(rng.random((L, P)) * 8).astype(np.float32)
    order = np.argsort(-ww, axis=-1, kind="stable")
    z = np.zeros(m, dt)
    outs = [
        f(ww, order, m, z)
        for f in (pk, getattr(pk, "py_func", pk), k.packing_reference)
    ]  # fmt: skip
    for other in outs[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(outs[0], other))


# --- vLLM's preserve_intragpu_slots (old_physical_to_logical) ------------------------------


def test_vllm_old_map_keeps_slots_by_hand():
    # one layer, 6 experts on 2 GPUs of 3 slots; the old map is the new one with GPU 0's
    # slots reversed and GPU 1's first slot holding an expert of GPU 0
    weight = [[90, 132, 40, 61, 104, 165]]
    new, _, cnt = rebalance_experts(weight, 6, 1, 1, 2, version="vllm")
    old = new.copy()
    old[0, :3] = new[0, 2::-1]
    old[0, 3] = new[0, 0]
    got, l2p, cnt2 = rebalance_experts(
        weight, 6, 1, 1, 2, version="vllm", old_physical_to_logical=old
    )
    assert not np.array_equal(new, got)
    assert got[0, :3].tolist() == old[0, :3].tolist()  # all three kept, in their old slots
    assert got[0, 3:].tolist() == new[0, 3:].tolist()  # the newcomer takes the freed slot
    assert np.array_equal(cnt, cnt2)
    for e in range(6):  # the derived maps follow the reordered slots (slot order)
        assert l2p[0, e][l2p[0, e] >= 0].tolist() == np.flatnonzero(got[0] == e).tolist()


def test_vllm_old_map_rule():
    from straggler.solvers.placement.eplb import preserve_intragpu_slots

    # slot 0's old expert 3 left the GPU; 1 and 2 stay in their slots; 4 fills slot 0
    new = np.array([[1, 2, 4, 5, 5, 6]])
    old = np.array([[3, 1, 2, 6, 5, 0]])
    out = preserve_intragpu_slots(new, 2, old)
    # GPU 1: old 6 -> new position 2, old 5 -> position 0; the second 5 fills slot 2
    assert out.tolist() == [[4, 1, 2, 6, 5, 5]]


@given(eplb_inputs(), st.integers(0, 2**32 - 1))
def test_vllm_old_map_only_permutes_within_gpus(args, seed):
    weight, P, groups, nodes, gpus = args
    if groups % nodes == 0 and (weight.shape[1] % groups or gpus % nodes):
        return
    new, _, cnt = rebalance_experts(weight, P, groups, nodes, gpus, version="vllm")
    rng = np.random.default_rng(seed)
    old = rng.integers(0, weight.shape[1], size=new.shape)
    got, l2p, cnt2 = rebalance_experts(
        weight, P, groups, nodes, gpus, version="vllm", old_physical_to_logical=old
    )
    assert np.array_equal(cnt, cnt2)
    per = P // gpus
    for layer in range(weight.shape[0]):
        for g in range(gpus):
            sl = slice(g * per, (g + 1) * per)
            assert sorted(got[layer, sl].tolist()) == sorted(new[layer, sl].tolist())
            # an old expert that stays on the GPU is in one of its old slots
            for e in set(old[layer, sl].tolist()) & set(new[layer, sl].tolist()):
                kept = min((old[layer, sl] == e).sum(), (new[layer, sl] == e).sum())
                assert ((got[layer, sl] == e) & (old[layer, sl] == e)).sum() == kept
    _check_tables(weight, got, l2p, cnt2, P, gpus)


def test_vllm_old_map_refused_where_it_does_not_apply():
    w = [[4, 3, 2, 1]]
    with pytest.raises(InvalidOptionError, match="old_physical_to_logical"):
        rebalance_experts(w, 4, 1, 1, 2, old_physical_to_logical=[[0, 1, 2, 3]])
    with pytest.raises(InvalidInputError, match="'old_physical_to_logical'.*Got"):
        rebalance_experts(w, 4, 1, 1, 2, version="vllm", old_physical_to_logical=[[0, 1, 2]])
    with pytest.raises(InvalidInputError, match="'old_physical_to_logical'"):
        rebalance_experts(w, 4, 1, 1, 2, version="vllm", old_physical_to_logical=[[0, 1, 2, 4]])


# --- SGLang's copy: torch's tie order ------------------------------------------------------


@given(st.lists(st.integers(0, 5), max_size=80))
def test_torch_sort_order_is_a_descending_permutation(keys):
    from straggler.solvers.placement._torch_order import torch_sort_descending

    order = torch_sort_descending(keys)
    assert sorted(order) == list(range(len(keys)))
    assert [keys[i] for i in order] == sorted(keys, reverse=True)
    if len(keys) <= 16:  # insertion sort only: stable
        assert order == sorted(range(len(keys)), key=lambda i: -keys[i])


def test_sglang_version_orders_tied_replicas_as_torch():
    # one expert with 20 replicas on 20 GPUs: the 20 tied replicas are packed in torch's
    # order (introsort beyond 16 items), not in slot order as with a stable sort
    w = [[1000, 1]]
    p2l, l2p, cnt = rebalance_experts(w, 40, 1, 1, 20, version="sglang")
    p2l_d, l2p_d, cnt_d = rebalance_experts(w, 40, 1, 1, 20)
    assert np.array_equal(cnt, cnt_d) and cnt[0].tolist() == [39, 1]
    assert sorted(l2p[0, 0].tolist()) == sorted(l2p_d[0, 0].tolist())
    assert l2p[0, 0].tolist() != l2p_d[0, 0].tolist()
    _check_tables(np.array(w), p2l, l2p, cnt, 40, 20)


# --- SGLang's deepseek_vec ----------------------------------------------------------------


def test_sglang_vec_by_hand():
    # two recorded steps whose hot expert alternates (0, then 1); summed, expert 2 is the
    # hottest. DeepSeek's EPLB replicates 2 and then 0 (the summed loads); deepseek_vec
    # replicates 1 then 2 (each lowers one step's maximum; 1e-4 * e breaks 0 vs 1).
    # Expected maps: SGLang 0.5.23's eplb_algorithms.rebalance_experts on the same input.
    w = [[[40, 10, 30, 20]], [[10, 40, 30, 20]]]
    p2l, l2p, cnt = rebalance_experts(w, 6, 1, 1, 2, version="sglang_vec")
    assert p2l.tolist() == [[0, 2, 1, 3, 2, 1]] and cnt.tolist() == [[1, 2, 2, 1]]
    assert l2p.tolist() == [[[0, -1], [2, 5], [4, 1], [3, -1]]]
    assert rebalance_experts(np.sum(w, axis=0), 6, 1, 1, 2)[2].tolist() == [[2, 1, 2, 1]]
    # hierarchical: groups {0..3} and {4..7} on two nodes of 3 GPUs, 2 slots per GPU
    w = [[[40, 10, 30, 20, 5, 5, 1, 1]], [[10, 40, 30, 20, 1, 1, 5, 5]]]
    p2l, l2p, cnt = rebalance_experts(w, 12, 2, 2, 6, version="sglang_vec")
    assert p2l.tolist() == [[0, 1, 3, 1, 2, 2, 6, 4, 7, 5, 4, 5]]
    assert cnt.tolist() == [[1, 2, 2, 1, 2, 2, 1, 1]]
    _check_tables(np.sum(w, axis=0), p2l, l2p, cnt, 12, 6)
    # a 2-D weight is one step; 3-D weights belong to this version only
    a = rebalance_experts(np.sum(w, axis=0), 12, 2, 2, 6, version="sglang_vec")
    b = rebalance_experts(np.sum(w, axis=0)[None], 12, 2, 2, 6, version="sglang_vec")
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    with pytest.raises(InvalidInputError, match="'weight'"):
        rebalance_experts(w, 12, 2, 2, 6)


# --- the public helpers in the engines' argument order ------------------------------------


def test_balanced_packing_public_versions():
    """``version=`` selects each upstream copy's packing, the one rebalance_experts uses."""
    from straggler.solvers.placement.eplb import balanced_packing

    rng = np.random.default_rng(0)
    w = rng.integers(0, 4, size=(6, 12)).astype(np.float32)  # many ties
    for version in ("deepseek", "vllm", "sglang"):
        pack, rank = balanced_packing(w, 3, version=version)
        assert pack.shape == rank.shape == w.shape
        for row_p, row_r in zip(pack, rank):
            assert np.bincount(row_p, minlength=3).tolist() == [4, 4, 4]
            assert len(set(zip(row_p.tolist(), row_r.tolist()))) == 12
    # the deepseek version's ties go by increasing item index (stable order)
    pack, rank = balanced_packing([[1.0, 1.0, 1.0, 1.0]], 2)
    assert pack.tolist() == [[0, 1, 0, 1]] and rank.tolist() == [[0, 0, 1, 1]]


@pytest.mark.parametrize(
    "args, name",
    [
        (([[1.0, 2.0, 3.0]], 2), "num_packs"),
        (([[1.0, 2.0]], 0), "num_packs"),
        (([1.0, 2.0], 1), "weight"),
        (([[1.0, np.nan]], 1), "weight"),
        ((np.zeros((0, 4)), 2), "weight"),
    ],
)
def test_balanced_packing_refuses_bad_input(args, name):
    with pytest.raises(InvalidInputError, match=f"'{name}' parameter of balanced_packing"):
        eplb.balanced_packing(*args)
    with pytest.raises(InvalidOptionError, match="'version' parameter"):
        eplb.balanced_packing([[1.0, 2.0]], 1, version="torch")


@pytest.mark.parametrize(
    "args, name",
    [
        (([[0, 1, 2, 3]], 3, [[0, 1, 2, 3]]), "num_ranks"),
        (([[0, 1, 2, 3]], 0, [[0, 1, 2, 3]]), "num_ranks"),
        (([[0, 1, 2, 3]], 2, [[0, 1, 2]]), "old_phy2log"),
        (([[0, 1, 2, -2]], 2, [[0, 1, 2, 3]]), "phy2log"),
    ],
)
def test_preserve_intragpu_slots_refuses_bad_input(args, name):
    with pytest.raises(InvalidInputError, match=f"'{name}' parameter of preserve_intragpu"):
        eplb.preserve_intragpu_slots(*args)


def test_preserve_intragpu_slots_with_empty_old_slots():
    # -1 (a slot elastic scale-up left empty) matches nothing: 0 keeps its slot, the
    # newcomers fill the others in their new order
    out = eplb.preserve_intragpu_slots([[2, 0, 1, 3]], 1, [[-1, 0, -1, 5]])
    assert out.tolist() == [[2, 0, 1, 3]]
    out = eplb.preserve_intragpu_slots([[2, 1, 0, 3]], 1, [[-1, 0, -1, 5]])
    assert out.tolist() == [[2, 0, 1, 3]]
