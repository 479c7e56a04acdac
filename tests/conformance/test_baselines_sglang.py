"""Our SGLang baselines beside SGLang 0.5.23's own code, decision for decision.

Each test builds random instances, runs the released function (imported from the installed
``sglang`` package) and ours on the same input, and compares every output:

* EPLB: ``sglang.srt.eplb.eplb_algorithms.rebalance_experts`` (``deepseek`` and
  ``deepseek_hierarchical``) against :func:`straggler.solvers.placement.eplb.rebalance_experts`.
* Static dispatch: SGLang's table (``expert_location.compute_logical_to_rank_dispatch_physical_map``
  via ``ExpertLocationMetadata._init_raw``, on lists from ``_compute_logical_to_all_physical_map``
  or from SGLang's EPLB) against :func:`straggler.baselines.dispatch.static.sglang_static_table`.
* Dynamic dispatch: ``expert_location_dispatch.topk_ids_logical_to_physical`` (random draws
  from torch's generator, and ``rank_invariant``) against
  :func:`straggler.baselines.dispatch.dynamic.sglang_dynamic_choice` fed the same draws.

SGLang reads its server configuration through ``get_exec()`` / ``get_parallel()``; the tests
replace those two accessors in ``expert_location`` with the few fields its functions read
(EP size, nodes, all-to-all backend, dispatch algorithm). Skipped where SGLang is not
installed.
"""

import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
eplb_algorithms = pytest.importorskip("sglang.srt.eplb.eplb_algorithms")
expert_location = pytest.importorskip("sglang.srt.eplb.expert_location")

from straggler.baselines.dispatch.dynamic import sglang_dynamic_choice, sglang_dynamic_lists  # noqa: E402
from straggler.baselines.dispatch.static import sglang_static_table  # noqa: E402
from straggler.solvers.placement.eplb import rebalance_experts  # noqa: E402

N_CASES = 200


def _instance(seed):
    """A random EPLB instance: loads ``(L, E)`` and the cluster shape.

    Half the cases draw loads from a small range (many ties, between experts and between
    groups), half from a wide one; some are skewed (a few hot experts).
    """
    rng = np.random.default_rng(seed)
    nodes = int(rng.choice([1, 2, 4]))
    gpus = nodes * int(rng.choice([1, 2, 4]))
    groups = nodes * int(rng.choice([1, 2])) if rng.random() < 0.8 else int(rng.choice([1, 3]))
    E = groups * int(rng.integers(2 if groups == 1 else 1, 9))
    per_gpu = -(-E // gpus) + int(rng.integers(0, 3))
    P = gpus * per_gpu
    L = int(rng.integers(1, 4))
    kind = seed % 3
    if kind == 0:
        w = rng.integers(0, 4, size=(L, E))
    elif kind == 1:
        w = rng.integers(0, 100_000, size=(L, E))
    else:
        w = (1000 * rng.pareto(1.2, size=(L, E))).astype(np.int64)
    return w, P, groups, nodes, gpus


def _sglang_eplb(w, P, groups, nodes, gpus):
    algorithm = eplb_algorithms.compute_algorithm("auto", groups, nodes)
    p2l, l2p, cnt = eplb_algorithms.rebalance_experts(
        tokens_per_expert=torch.tensor(w)[None],
        num_physical_experts=P,
        num_local_physical_experts=P // gpus,
        num_groups=groups,
        num_nodes=nodes,
        algorithm=algorithm,
    )
    return p2l.numpy(), l2p.numpy(), cnt.numpy()


def _valid(w, P, groups, nodes, gpus):
    E = w.shape[1]
    hier = groups % nodes == 0
    return P >= E and (not hier or (E % groups == 0 and gpus % nodes == 0))


@pytest.mark.parametrize("seed", range(N_CASES))
def test_eplb_equals_sglang_deepseek(seed):
    w, P, groups, nodes, gpus = _instance(seed)
    if not _valid(w, P, groups, nodes, gpus):
        pytest.skip("instance outside EPLB's preconditions")
    theirs = _sglang_eplb(w, P, groups, nodes, gpus)
    # version="sglang": every map, the replica order of logical_to_physical included
    ours = rebalance_experts(w, P, groups, nodes, gpus, version="sglang")
    for name, a, b in zip(("physical_to_logical", "logical_to_physical", "count"), ours, theirs):
        assert np.array_equal(a, b), name
    # the default (stable sort) where no two experts tie: the same replica counts and the
    # same experts on every GPU (only tied replicas of one expert may swap slots)
    if seed % 3 == 0:
        return  # small integer loads: ties between experts, which the two orders break apart
    p2l, l2p, cnt = rebalance_experts(w, P, groups, nodes, gpus)
    assert np.array_equal(cnt, theirs[2])
    per_gpu = P // gpus
    ours_gpus = np.sort(p2l.reshape(len(w), gpus, per_gpu), axis=-1)
    assert np.array_equal(ours_gpus, np.sort(theirs[0].reshape(len(w), gpus, per_gpu), axis=-1))


def test_eplb_equals_sglang_deepseek_v3_shape():
    # DeepSeek-V3: 58 layers, 256 experts in 8 groups, 288 slots, 32 GPUs on 4 nodes
    rng = np.random.default_rng(0)
    w = (1000 * rng.pareto(1.5, size=(58, 256))).astype(np.int64)
    theirs = _sglang_eplb(w, 288, 8, 4, 32)
    ours = rebalance_experts(w, 288, 8, 4, 32, version="sglang")
    for name, a, b in zip(("physical_to_logical", "logical_to_physical", "count"), ours, theirs):
        assert np.array_equal(a, b), name


# --- static and dynamic dispatch ----------------------------------------------------------


@pytest.fixture
def sglang_config(monkeypatch):
    """Set the server fields SGLang's expert-location functions read; returns a setter."""

    def configure(*, ep_size, nnodes, a2a="deepep", algorithm="static"):
        moe = types.SimpleNamespace(
            moe_a2a_backend=a2a, ep_dispatch_algorithm=algorithm, ep_join_mode=None
        )
        monkeypatch.setattr(expert_location, "get_exec", lambda: types.SimpleNamespace(moe=moe))
        monkeypatch.setattr(
            expert_location,
            "get_parallel",
            lambda: types.SimpleNamespace(ep_size=ep_size, nnodes=nnodes),
        )
        monkeypatch.setattr(expert_location, "_prefer_same_node_experts", lambda: True)

    return configure


def _placement(seed):
    """A random slot map ``(L, P)`` where every expert has a slot, and the cluster shape."""
    rng = np.random.default_rng(10_000 + seed)
    nodes = int(rng.choice([1, 2, 4]))
    gpus = nodes * int(rng.choice([1, 2, 3]))
    per_gpu = int(rng.integers(1, 4))
    P = gpus * per_gpu
    E = int(rng.integers(1, P + 1))
    L = int(rng.integers(1, 4))
    p2l = np.empty((L, P), dtype=np.int64)
    for layer in range(L):
        p2l[layer] = np.concatenate([np.arange(E), rng.integers(0, E, size=P - E)])
        rng.shuffle(p2l[layer])
    return p2l, E, P, gpus, nodes


def _all_physical(p2l, E, gpus, rank=None):
    """SGLang's ``logical_to_all_physical_map`` (rank ``r``'s, or the full lists)."""
    return expert_location._compute_logical_to_all_physical_map(
        physical_to_logical_map=torch.tensor(p2l),
        num_logical_experts=E,
        ep_size=gpus,
        moe_ep_rank=rank,
    )


def _sglang_table_row(l2p, P, gpus, rank):
    """Rank ``rank``'s static table, through ``ExpertLocationMetadata._init_raw``."""
    p2l_dummy = torch.zeros((l2p.shape[0], P), dtype=torch.int64)
    meta = expert_location.ExpertLocationMetadata._init_raw(
        ep_size=gpus,
        physical_to_logical_map=p2l_dummy,
        logical_to_all_physical_map=l2p,
        moe_ep_rank=rank,
    )
    return meta.logical_to_rank_dispatch_physical_map.numpy()


def _layout(P, gpus, nodes):
    slot_gpu = np.arange(P) // (P // gpus)
    gpu_node = np.arange(gpus) // (gpus // nodes)
    return slot_gpu, gpu_node


@pytest.mark.parametrize("a2a", ["deepep", "none"])
@pytest.mark.parametrize("seed", range(N_CASES // 2))
def test_static_table_equals_sglang_from_a_mapping(sglang_config, seed, a2a):
    # init_by_mapping: with an all-to-all backend every rank narrows its lists first
    p2l, E, P, gpus, nodes = _placement(seed)
    sglang_config(ep_size=gpus, nnodes=nodes, a2a=a2a)
    slot_gpu, gpu_node = _layout(P, gpus, nodes)
    full = _all_physical(p2l, E, gpus).numpy()
    ours = sglang_static_table(full, slot_gpu, gpu_node, per_rank_lists=a2a != "none")
    for rank in range(gpus):
        theirs = _sglang_table_row(_all_physical(p2l, E, gpus, rank), P, gpus, rank)
        assert np.array_equal(ours[rank], theirs), f"rank {rank}"


@pytest.mark.parametrize("seed", range(N_CASES // 2))
def test_static_table_equals_sglang_after_eplb(sglang_config, seed):
    # init_by_eplb: the lists come from SGLang's EPLB in replica-rank order, not narrowed
    w, P, groups, nodes, gpus = _instance(seed)
    if not _valid(w, P, groups, nodes, gpus):
        pytest.skip("instance outside EPLB's preconditions")
    sglang_config(ep_size=gpus, nnodes=nodes)
    p2l, l2p, _ = _sglang_eplb(w, P, groups, nodes, gpus)
    slot_gpu, gpu_node = _layout(P, gpus, nodes)
    l2p_ours = rebalance_experts(w, P, groups, nodes, gpus, version="sglang")[1]
    ours = sglang_static_table(l2p_ours, slot_gpu, gpu_node)
    for rank in range(gpus):
        theirs = _sglang_table_row(torch.tensor(l2p), P, gpus, rank)
        assert np.array_equal(ours[rank], theirs), f"rank {rank}"


class _TorchDraws:
    """numpy's ``integers`` interface over torch's generator, as SGLang draws: one
    ``torch.randint(0, 65536, (n_entries,), dtype=int32)`` after ``torch.manual_seed``."""

    def __init__(self, seed):
        self.seed = seed

    def integers(self, lo, hi, size):
        torch.manual_seed(self.seed)
        n = int(np.prod(size))
        return torch.randint(lo, hi, (n,), dtype=torch.int32).numpy().reshape(size)


@pytest.mark.parametrize("rank_invariant", [False, True])
@pytest.mark.parametrize("seed", range(N_CASES // 2))
def test_dynamic_choice_equals_sglang(sglang_config, seed, rank_invariant):
    dispatch = pytest.importorskip("sglang.srt.eplb.expert_location_dispatch")
    p2l, E, P, gpus, nodes = _placement(seed)
    a2a = "none" if rank_invariant else "deepep"
    sglang_config(ep_size=gpus, nnodes=nodes, a2a=a2a, algorithm="dynamic")
    slot_gpu, gpu_node = _layout(P, gpus, nodes)
    full = _all_physical(p2l, E, gpus).numpy()
    lists, num_valid = sglang_dynamic_lists(
        full[0], slot_gpu, gpu_node, rank_invariant=rank_invariant
    )
    rng = np.random.default_rng(seed)
    n_tokens, k = int(rng.integers(1, 40)), int(rng.integers(1, min(E, 4) + 1))
    topk = np.stack([rng.choice(E, size=k, replace=False) for _ in range(n_tokens)])
    for rank in range(gpus):
        l2p = _all_physical(p2l, E, gpus, rank)  # rank's lists (narrowed unless "none")
        meta = expert_location.ExpertLocationMetadata._init_raw(
            ep_size=gpus,
            physical_to_logical_map=torch.tensor(p2l),
            logical_to_all_physical_map=l2p,
            moe_ep_rank=rank,
        )
        info = dispatch.ExpertLocationDispatchInfo(
            ep_dispatch_algorithm="dynamic",
            partial_logical_to_rank_dispatch_physical_map=None,
            partial_logical_to_all_physical_map=meta.logical_to_all_physical_map[0],
            partial_logical_to_all_physical_map_num_valid=meta.logical_to_all_physical_map_num_valid[
                0
            ],
            num_physical_experts=P,
            rank_invariant=rank_invariant,
        )
        torch.manual_seed(seed)
        theirs = dispatch.topk_ids_logical_to_physical(torch.tensor(topk), info).numpy()
        source = np.full(n_tokens, rank)
        ours = sglang_dynamic_choice(
            topk, source, lists, num_valid, _TorchDraws(seed), rank_invariant=rank_invariant
        )
        assert np.array_equal(ours, theirs), f"rank {rank}"
        width = int(num_valid[rank].max())  # the lists themselves, up to SGLang's padding
        assert np.array_equal(
            lists[rank][:, :width], meta.logical_to_all_physical_map[0, :, :width].numpy()
        )


# --- deepseek_vec -------------------------------------------------------------------------


def _sglang_vec(w, P, groups, nodes, gpus):
    algorithm = eplb_algorithms.EplbAlgorithm[
        "deepseek_vec_hierarchical" if groups % nodes == 0 else "deepseek_vec"
    ]
    p2l, l2p, cnt = eplb_algorithms.rebalance_experts(
        tokens_per_expert=torch.tensor(w),
        num_physical_experts=P,
        num_local_physical_experts=P // gpus,
        num_groups=groups,
        num_nodes=nodes,
        algorithm=algorithm,
    )
    return p2l.numpy(), l2p.numpy(), cnt.numpy()


@pytest.mark.parametrize("seed", range(N_CASES))
def test_eplb_vec_equals_sglang_deepseek_vec(seed):
    w, P, groups, nodes, gpus = _instance(seed)
    steps = np.random.default_rng(seed).integers(1, 4)
    w = np.stack([np.roll(w, s, axis=-1) for s in range(steps)])  # a window of steps
    theirs = _sglang_vec(w, P, groups, nodes, gpus)
    ours = rebalance_experts(w, P, groups, nodes, gpus, version="sglang_vec")
    X = ours[1].shape[-1]
    assert np.array_equal(ours[0], theirs[0]), "physical_to_logical"
    assert np.array_equal(ours[2], theirs[2]), "count"
    assert np.array_equal(ours[1], theirs[1][..., :X]), "logical_to_physical"
    assert (theirs[1][..., X:] == -1).all()


def test_eplb_vec_equals_sglang_on_a_deepseek_v3_window():
    # 20 recorded steps of a DeepSeek-V3-shaped model (58 layers, 256 experts, 288 slots)
    rng = np.random.default_rng(1)
    w = (100 * rng.pareto(1.5, size=(20, 58, 256))).astype(np.int64)
    for groups in (8, 3):  # hierarchical, then the global form
        theirs = _sglang_vec(w, 288, groups, 4, 32)
        ours = rebalance_experts(w, 288, groups, 4, 32, version="sglang_vec")
        assert np.array_equal(ours[0], theirs[0]) and np.array_equal(ours[2], theirs[2])
        assert np.array_equal(ours[1], theirs[1][..., : ours[1].shape[-1]])
