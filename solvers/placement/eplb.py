"""DeepSeek's EPLB placement algorithm, reproduced in numpy (no torch).

Upstream: deepseek-ai/EPLB ``eplb.py`` (released with DeepSeek's open-infra week, February
2025; the global policy became the hierarchical code with one group and one node in a
later revision). The same code ships as SGLang's ``eplb_algorithms/deepseek.py`` and inside
LPLB (``lplb/eplb.py``). ``rebalance_experts`` returns what upstream returns on the same
inputs, with a stable sort (``version="deepseek"``, default): the replica sets that the
dispatch problem takes as given. ``version="sglang"`` is SGLang's copy as released
(0.5.23), torch's tie order and float64 pack loads included, so that its replica lists
(whose order SGLang's dispatch tables depend on) come out in SGLang's order.
``version="vllm"`` is vLLM's numpy port
(``vllm/distributed/eplb/policy/default.py``: numpy's default, unstable argsort; float64
replica and pack loads), with vLLM's ``preserve_intragpu_slots`` step when the previous slot
map is given (``old_physical_to_logical``, as vLLM's ``EplbState`` always passes it). An
opt-in ``distinct=True`` variant forbids two replicas of one
expert on one GPU (upstream allows it; its report of it stays open).

EPLB is a baseline, yet it lives here, in ``solvers``: :func:`~straggler.solvers.place_experts`
and its rebalance from the placement in force start from it, and the layering
(``formulations`` <- ``solvers`` <- ``baselines``) forbids a solver to import a baseline.
``straggler.baselines`` re-exports :func:`rebalance_experts` under its baseline name; there
is no second module.

The algorithm (deepseek-ai/EPLB ``eplb.py``):

* *balanced packing* of ``n`` weighted items into ``m`` packs of exactly ``n / m`` items:
  items by descending weight, each into the lightest pack that still has room;
* *replicate*: one replica per expert, then ``P - E`` times one more replica for the expert
  with the largest ``weight / count``;
* *hierarchical policy* (``num_groups % num_nodes == 0``): (1) pack expert groups onto
  nodes by group load; (2) replicate within each node up to ``P / num_nodes`` slots;
  (3) pack the replicas, each weighing ``weight / count``, onto the node's GPUs. The
  *global policy* is the same with one group and one node.
"""

from __future__ import annotations

import numpy as np

from ...formulations.errors import InvalidInputError, InvalidOptionError, param_error
from ...formulations.validation import check_array, check_bool, check_choice, check_int
from ._eplb_kernels import packing_distinct_kernel, packing_kernel, replicate_kernel
from ._eplb_vec import rebalance_experts_vec
from ._torch_order import torch_sort_descending

__all__ = [
    "rebalance_experts",
    "balanced_packing",
    "replicate_experts",
    "preserve_intragpu_slots",
    "EPLB_VERSIONS",
]

_FUNC = "rebalance_experts"
#: Accepted values of ``rebalance_experts(version=...)`` (default first).
EPLB_VERSIONS = ("deepseek", "vllm", "sglang", "sglang_vec")


def _balanced_packing_iv(weight, num_packs, version):
    func = "balanced_packing"
    version = check_choice(version, "version", func, ("deepseek", "vllm", "sglang"))
    w = check_array(weight, "weight", func, kind="real", ndim=2)
    if w.size == 0:
        raise param_error("weight", func, "a non-empty 2-D array", f"shape {w.shape}")
    n = w.shape[1]
    num_packs = check_int(num_packs, "num_packs", func, lo=1)
    if n % num_packs:
        raise param_error("num_packs", func, f"a divisor of the {n} items", repr(num_packs))
    given = np.asarray(weight)
    if version == "vllm" and given.dtype.kind in "fiu":
        w = given  # vLLM sorts the array it is given: its dtype decides numpy's sort
    return w, num_packs, version


def balanced_packing(weight, num_packs: int, *, version: str = "deepseek"):
    """Pack ``n`` items into ``num_packs`` packs of ``n / num_packs`` items each.

    Upstream ``balanced_packing(weight, num_packs)`` (deepseek-ai/EPLB ``eplb.py``; SGLang's
    ``eplb_algorithms/deepseek.py``; vLLM's ``DefaultEplbPolicy.balanced_packing``, same
    arguments): items by descending weight; each item into the lightest pack with room,
    ties to the lowest pack index. With one item per pack the packing is the identity
    (``pack_index = item``, ``rank_in_pack = 0``).

    Parameters
    ----------
    weight : array_like, shape (X, n)
        Finite weights, one row per independent packing.
    num_packs : int
        A divisor of ``n``.
    version : {"deepseek", "vllm", "sglang"}, default "deepseek"
        The item order and the pack-load arithmetic of each upstream copy (see
        :func:`rebalance_experts`): ``"deepseek"``, a stable descending sort (ties by
        increasing item index) and float32 pack loads, as torch sums them; ``"sglang"``,
        torch's CPU sort order, ties included, and float64 loads (Python floats of
        ``weight.tolist()``); ``"vllm"``, numpy's default (unstable) ``argsort(-weight)``
        and float64 loads, on the array as given.

    Returns
    -------
    pack_index, rank_in_pack : ndarray of int64, shape (X, n)

    Raises
    ------
    InvalidInputError
        A weight that is not a non-empty 2-D finite array, or ``num_packs`` not a positive
        divisor of ``n`` (upstream asserts it).

    Examples
    --------
    >>> pack, rank = balanced_packing(np.array([[4, 3, 2, 1]], np.float32), 2)
    >>> pack.tolist(), rank.tolist()
    ([[0, 1, 1, 0]], [[0, 0, 1, 1]])
    """
    w, num_packs, version = _balanced_packing_iv(weight, num_packs, version)
    return _balanced_packing(w, num_packs, version)


def _balanced_packing(weight, num_packs: int, version: str):
    """:func:`balanced_packing` on validated input."""
    vllm = version == "vllm"
    sglang = version == "sglang"
    # vLLM's numpy port packs the array it is given; the torch copies pack float32
    w = np.asarray(weight) if vllm else np.asarray(weight, dtype=np.float32)
    n_rows, n_items = w.shape
    if n_items // num_packs == 1:
        pack_index = np.broadcast_to(np.arange(n_items, dtype=np.int64), w.shape).copy()
        return pack_index, np.zeros(w.shape, dtype=np.int64)
    # vLLM: numpy's default (unstable) argsort and float64 pack loads; SGLang: torch's sort
    # order and float64 pack loads (Python floats of its ``weight.tolist()``)
    if sglang:
        order = np.array([torch_sort_descending(row) for row in w], dtype=np.int64)
        order = order.reshape(w.shape)
    else:
        order = np.argsort(-w, axis=-1) if vllm else np.argsort(-w, axis=-1, kind="stable")
    loads0 = np.zeros(num_packs, dtype=np.float64 if vllm or sglang else np.float32)
    return packing_kernel(np.ascontiguousarray(w), order, int(num_packs), loads0)


def _balanced_packing_distinct(weight, labels, num_packs: int):
    """:func:`balanced_packing` that never puts two items with one label in one pack.

    Same order and choice rule, restricted to packs without the item's label. When every
    pack with room already holds the label (possible late in the greedy), one swap
    restores feasibility: take the lightest full pack ``q`` without the label (ties: lowest
    index) and in it the lightest item whose label is absent from the chosen pack ``p``
    (the lightest pack with room; ties: lowest rank); that item moves to ``p`` and the new
    item takes its place (and rank) in ``q``. Such ``q`` and item always exist when every
    label has at most ``num_packs`` items: the label is missing from some pack, which must
    be full, and a full pack holds ``n / m`` distinct labels while ``p`` holds fewer.
    """
    w = np.ascontiguousarray(weight, dtype=np.float32)
    order = np.argsort(-w, axis=-1, kind="stable")
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    return packing_distinct_kernel(w, order, labels, int(num_packs))


def replicate_experts(
    weight, num_phy: int, max_count: int | None = None, *, _version: str = "deepseek"
):
    """Grow ``num_log`` experts to ``num_phy`` replicas, minimising the max replica load.

    Upstream ``replicate_experts``: each of the ``num_phy - num_log`` redundant slots goes
    to the expert with the largest ``weight / count`` (float32 division, as in torch; ties
    to the lowest expert index, ``torch.max`` returning the first maximum). Physical slot
    ``i < num_log`` is expert ``i``; redundant slots follow in creation order.

    Parameters
    ----------
    weight : ndarray, shape (X, num_log)
    num_phy : int
    max_count : int, optional
        Never give an expert more than this many replicas (the ``distinct`` variant; not
        upstream).

    Returns
    -------
    phy2log, rank : ndarray of int64, shape (X, num_phy)
        Logical expert of each slot and its replica rank.
    logcnt : ndarray of int64, shape (X, num_log)

    Examples
    --------
    The second redundant slot is a tie, ``6 / 2 == 3 / 1``, won by the lower index:

    >>> p2l, rank, cnt = replicate_experts(np.array([[6, 2, 3]], np.float32), 5)
    >>> p2l.tolist(), rank.tolist(), cnt.tolist()
    ([[0, 1, 2, 0, 0]], [[0, 0, 0, 1, 2]], [[3, 1, 1]])
    """
    w = np.ascontiguousarray(weight, dtype=np.float32)
    # vLLM: float32 / int64 is a float64 division in numpy
    ones = np.ones(w.shape[1], dtype=np.float64 if _version == "vllm" else np.float32)
    return replicate_kernel(w, int(num_phy), 0 if max_count is None else int(max_count), ones)


def _inverse(perm: np.ndarray) -> np.ndarray:
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def _hierarchical(w, num_physical, num_groups, num_nodes, num_gpus, distinct, version):
    num_layers, num_logical = w.shape
    group_size = num_logical // num_groups
    groups_per_node = num_groups // num_nodes
    per_gpu = num_physical // num_gpus
    gpus_per_node = num_gpus // num_nodes

    # Step 1: pack groups onto nodes by group load.
    tokens_per_group = w.reshape(num_layers, num_groups, group_size).sum(-1, dtype=np.float32)
    group_pack, group_rank = _balanced_packing(tokens_per_group, num_nodes, version)
    log2mlog = (
        ((group_pack * groups_per_node + group_rank) * group_size)[..., None]
        + np.arange(group_size, dtype=np.int64)
    ).reshape(num_layers, num_logical)
    mlog2log = _inverse(log2mlog)

    # Step 2: replicate within each node ([num_layers * num_nodes, E / num_nodes]).
    tokens_per_mlog = np.take_along_axis(w, mlog2log, axis=-1).reshape(-1, num_logical // num_nodes)
    phy2mlog, phyrank, mlogcnt = replicate_experts(
        tokens_per_mlog,
        num_physical // num_nodes,
        gpus_per_node if distinct else None,
        _version=version,
    )

    # Step 3: pack the replicas, each weighing weight / count, onto the node's GPUs.
    cnt = mlogcnt if version == "vllm" else mlogcnt.astype(np.float32)
    tokens_per_phy = np.take_along_axis(tokens_per_mlog / cnt, phy2mlog, axis=-1)
    if distinct and per_gpu > 1:
        pack, rank = _balanced_packing_distinct(tokens_per_phy, phy2mlog, gpus_per_node)
    else:
        pack, rank = _balanced_packing(tokens_per_phy, gpus_per_node, version)
    phy2pphy = pack * per_gpu + rank
    pphy2phy = _inverse(phy2pphy)

    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=-1)
    pphy2mlog = (
        pphy2mlog.reshape(num_layers, num_nodes, -1)
        + np.arange(0, num_logical, num_logical // num_nodes, dtype=np.int64)[None, :, None]
    ).reshape(num_layers, -1)
    pphy2log = np.take_along_axis(mlog2log, pphy2mlog, axis=-1)
    pphyrank = np.take_along_axis(phyrank, pphy2phy, axis=-1).reshape(num_layers, -1)
    logcnt = np.take_along_axis(mlogcnt.reshape(num_layers, -1), log2mlog, axis=-1)
    return pphy2log, pphyrank, logcnt


def preserve_intragpu_slots(phy2log, num_ranks: int, old_phy2log):
    """vLLM's ``DefaultEplbPolicy.preserve_intragpu_slots(phy2log, num_ranks, old_phy2log)``.

    Rearranges each GPU's slots of a new slot map so that an expert staying on a GPU keeps
    its old slot: per layer and GPU (``P / num_ranks`` consecutive slots), first the old
    slots in order: slot ``s`` gets its old expert back when the GPU's new slice holds it
    (the first unused new position holding it is consumed); then the unused new
    positions, in order, fill the slots not kept, in order. Each GPU holds the same
    multiset of experts as in ``phy2log``; only their slots move, and a slot changes
    expert (one expert's weights copied) only where the GPU's expert set changed.

    Parameters
    ----------
    phy2log : array_like of int, shape (n_layers, P)
        The new slot map.
    num_ranks : int
        GPUs, a divisor of ``P``.
    old_phy2log : array_like of int, shape (n_layers, P)
        The map in force; ``-1`` (an empty slot) matches nothing.

    Returns
    -------
    ndarray of int64, shape (n_layers, P)

    Raises
    ------
    InvalidInputError
        Maps of different shapes or with ids below ``-1``, or ``num_ranks`` not a positive
        divisor of ``P`` (vLLM returns the map unchanged then).

    Examples
    --------
    vLLM's test case (``tests/distributed/test_eplb_algo.py``, two GPUs of four slots):

    >>> preserve_intragpu_slots([[1, 5, 0, 4, 6, 2, 7, 3]], 2, [[0, 1, 2, 3, 4, 5, 6, 7]])
    array([[0, 1, 5, 4, 2, 3, 6, 7]])
    """
    func = "preserve_intragpu_slots"
    new = check_array(phy2log, "phy2log", func, kind="int", ndim=2, lo=-1)
    old = check_array(old_phy2log, "old_phy2log", func, kind="int", ndim=2, lo=-1, shape=new.shape)
    num_ranks = check_int(num_ranks, "num_ranks", func, lo=1)
    if new.shape[1] % num_ranks:
        raise param_error(
            "num_ranks", func, f"a divisor of the {new.shape[1]} slots", repr(num_ranks)
        )
    out = new.copy()
    num_layers, num_physical = new.shape
    per_gpu = num_physical // num_ranks
    for layer in range(num_layers):
        for gpu in range(num_ranks):
            lo = gpu * per_gpu
            fresh = new[layer, lo : lo + per_gpu].tolist()
            before = old[layer, lo : lo + per_gpu].tolist()
            used = [False] * per_gpu
            kept = [False] * per_gpu
            for s in range(per_gpu):
                j = next((j for j in range(per_gpu) if not used[j] and fresh[j] == before[s]), -1)
                if j >= 0:
                    out[layer, lo + s] = fresh[j]
                    used[j] = kept[s] = True
            rest = [j for j in range(per_gpu) if not used[j]]
            free = [s for s in range(per_gpu) if not kept[s]]
            for j, s in zip(rest, free):
                out[layer, lo + s] = fresh[j]
    return out


def _rebalance_experts_iv(weight, num_replicas, num_groups, num_nodes, num_gpus, distinct, version):
    version = check_choice(version, "version", _FUNC, EPLB_VERSIONS)
    vec = version == "sglang_vec"
    shape = "2-D (n_layers, n_experts) or 3-D (n_steps, n_layers, n_experts)" if vec else "2-D"
    w = check_array(
        weight,
        "weight",
        _FUNC,
        kind="real",
        ndim=(2, 3) if vec else 2,
        expected=f"a non-empty {shape} array of finite numbers",
    )
    if w.size == 0:
        raise param_error("weight", _FUNC, f"a non-empty {shape} array", f"shape {w.shape}")
    # SGLang's deepseek_vec keeps integer counts as integers (its global form divides them)
    integral = vec and bool((w == np.round(w)).all()) and np.abs(w).max() < 2**62
    w = w.astype(np.int64) if integral else w.astype(np.float32)
    if not np.isfinite(w).all():
        raise param_error("weight", _FUNC, "finite (as float32)", "values beyond float32's range")
    if vec and w.ndim == 2:
        w = w[None]
    num_replicas = check_int(num_replicas, "num_replicas", _FUNC, lo=1)
    num_groups = check_int(num_groups, "num_groups", _FUNC, lo=1)
    num_nodes = check_int(num_nodes, "num_nodes", _FUNC, lo=1)
    num_gpus = check_int(num_gpus, "num_gpus", _FUNC, lo=1)
    distinct = check_bool(distinct, "distinct", _FUNC)
    num_logical = w.shape[-1]
    if num_groups % num_nodes == 0:
        groups, nodes = num_groups, num_nodes
        if num_logical % num_groups:
            raise param_error(
                "num_groups",
                _FUNC,
                f"a divisor of the number of experts ({num_logical})",
                repr(num_groups),
            )
        if num_gpus % num_nodes:
            raise param_error(
                "num_gpus", _FUNC, f"a multiple of num_nodes={num_nodes}", repr(num_gpus)
            )
    else:
        groups, nodes = 1, 1
    if num_replicas % num_gpus:
        raise param_error(
            "num_replicas", _FUNC, f"a multiple of num_gpus={num_gpus}", repr(num_replicas)
        )
    if num_replicas < num_logical:
        raise param_error(
            "num_replicas",
            _FUNC,
            f"at least the number of experts ({num_logical})",
            repr(num_replicas),
        )
    if distinct:
        if version != "deepseek":
            raise InvalidOptionError(
                f"The 'distinct' option of {_FUNC} applies to version='deepseek' only. "
                f"Got version={version!r} instead."
            )
        per_node = num_replicas // nodes
        most = (num_logical // nodes) * (num_gpus // nodes)
        if per_node > most:
            raise InvalidInputError(
                f"The 'distinct' option of {_FUNC} cannot place {per_node} slots per node "
                f"without duplicates: {num_logical // nodes} experts per node on "
                f"{num_gpus // nodes} GPUs hold at most {most}. Got num_replicas="
                f"{num_replicas} instead."
            )
    return w, num_replicas, groups, nodes, num_gpus, distinct, version


def _old_map_iv(old, version, shape, num_logical):
    if old is None:
        return None
    if version != "vllm":
        raise InvalidOptionError(
            f"The 'old_physical_to_logical' option of {_FUNC} applies to version='vllm' only. "
            f"Got version={version!r} instead."
        )
    return check_array(
        old,
        "old_physical_to_logical",
        _FUNC,
        kind="int",
        ndim=2,
        lo=0,
        hi=num_logical - 1,
        shape=shape,
        expected=f"a {shape} array of logical expert ids (the previous slot map)",
    )


def rebalance_experts(
    weight,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    distinct: bool = False,
    version: str = "deepseek",
    old_physical_to_logical=None,
):
    """EPLB's expert placement: which logical expert every physical slot holds.

    Parameters
    ----------
    weight : array_like, shape (n_layers, n_experts)
        Load statistics of every logical expert (e.g. long-run average token counts).
        Converted to float32, as upstream does (``weight.float()``). ``version="sglang_vec"``
        also takes ``(n_steps, n_layers, n_experts)`` (SGLang's recorded window).
    num_replicas : int
        Physical slots ``P`` (``>= n_experts``, a multiple of ``num_gpus``); slot ``p``
        lives on GPU ``p // (P / num_gpus)``.
    num_groups : int
        Expert groups (DeepSeek's group-limited routing); the hierarchical policy needs
        ``n_experts % num_groups == 0``.
    num_nodes : int
        Server nodes; the hierarchical policy is used iff ``num_groups % num_nodes == 0``.
    num_gpus : int
        GPUs, a multiple of ``num_nodes`` (hierarchical policy).
    distinct : bool, default False
        Not upstream: forbid two replicas of one expert on one GPU (replica counts capped
        at the GPUs per node; packing with the one-swap repair of
        ``_balanced_packing_distinct``). Needs ``P / num_nodes <= (E / num_nodes) *
        (num_gpus / num_nodes)``; ``version="deepseek"`` only.
    version : {"deepseek", "vllm", "sglang", "sglang_vec"}, default "deepseek"
        ``"deepseek"``: upstream's torch code (float32 loads) with a stable sort.
        ``"sglang"``: SGLang's copy (``eplb_algorithms/deepseek.py``, as released in
        0.5.23): torch's CPU sort order, ties included (``solvers/placement/_torch_order.py``), and
        pack loads summed as Python floats (float64) from ``weight.tolist()``; replica
        lists in replica-rank order.
        ``"sglang_vec"``: SGLang's ``deepseek_vec`` (``deepseek_vec_hierarchical`` when
        ``num_groups % num_nodes == 0``), another algorithm: replicas chosen against the
        per-step maxima of ``weight`` given as ``(n_steps, n_layers, n_experts)``, slots
        dealt to GPUs in a snake (``solvers/placement/_eplb_vec.py``); integer weights stay
        integers,
        as upstream divides them.
        ``"vllm"``: vLLM's numpy port: numpy's default argsort (unstable on ties, as
        vLLM's on the same numpy build), float64 replica and pack loads; vLLM returns the
        slot map only and derives the other maps in slot order, as here.
    old_physical_to_logical : array_like of int, shape (n_layers, P), optional
        ``version="vllm"`` only: the slot map in service (vLLM's ``EplbState`` passes its
        ``physical_to_logical_map`` as ``old_global_expert_indices``). vLLM then reorders
        each GPU's slots so that an expert staying on a GPU keeps its old slot
        (``DefaultEplbPolicy.preserve_intragpu_slots``): the same experts on every GPU,
        fewer weight copies.

    Returns
    -------
    physical_to_logical : ndarray of int64, shape (n_layers, P)
    logical_to_physical : ndarray of int64, shape (n_layers, n_experts, X)
        Slots of each expert **in replica-rank order** (slot order for
        ``version="vllm"``), ``-1`` padded; ``X`` is the largest replica count.
    logical_count : ndarray of int64, shape (n_layers, n_experts)

    Raises
    ------
    InvalidInputError
        Where upstream asserts (``P % num_gpus``, ``n_experts % num_groups`` and
        ``num_gpus % num_nodes`` for the hierarchical policy, ``P < n_experts``), and for
        non-positive integers, a weight that is not a non-empty 2-D finite numeric array
        (upstream would fail later or propagate NaN), or an infeasible ``distinct``.
    InvalidOptionError
        An unknown ``version``, or ``distinct`` or ``old_physical_to_logical`` with another
        version than the one they belong to.

    Notes
    -----
    *Ties.* Upstream sorts with ``torch.sort(descending=True)``, which promises no order
    among equal keys; torch's CPU sort is libstdc++'s ``std::sort`` (insertion sort up to
    16 items, stable there; introsort beyond). Ties are not rare: in the GPU-packing step
    the replicas of one expert all weigh ``w / count``, so **they always tie**, and on rows
    of 17 or more replicas upstream visits them in introsort's order. Swapping two
    replicas of one expert leaves ``physical_to_logical`` unchanged but exchanges their
    replica ranks, so the ``logical_to_physical`` order differs; SGLang's static table and
    its nearest-replica rule read that order, so its dispatch differs too. Ties between
    different experts (equal loads) can change the placement itself. ``"deepseek"`` fixes
    the stable order (descending weight, ties by increasing index), with which it matches
    upstream run with a stable sort exactly (and SGLang's ``deepseek.py`` on tie-free loads,
    ``benchmarks/eplb_speed.py``); ``"sglang"`` reproduces torch's order and
    matches SGLang 0.5.23 map for map, replica order included (``tests/conformance``).
    ``torch.max`` and Python's ``min`` take the first extremum, as here.

    *Arithmetic.* Replica loads ``w / count`` are float32 divisions, pack loads float32
    sums, as in torch. Group loads (hierarchical step 1) are float32 sums whose rounding
    order may differ from torch's for non-integer weights; they agree exactly whenever the
    sums are exactly representable (integer loads below ``2**24`` per group).

    *Known behaviour, reproduced:* packing has no distinctness constraint, so two replicas
    of one hot expert can land on one GPU (``distinct=True`` forbids it); replication is
    decided within nodes after group packing, so a globally hot expert may stay
    unreplicated. The global policy is the hierarchical code with one group and one node
    (upstream's current version; its first release replicated without packing).
    ``O(L * P * num_gpus)`` steps, in the compiled loops of
    ``straggler.solvers.placement._eplb_kernels``.

    References
    ----------
    deepseek-ai/EPLB ``eplb.py``; SGLang ``python/sglang/srt/eplb/eplb_algorithms/deepseek.py``.

    Examples
    --------
    EPLB's README example (two layers, 12 experts, 4 groups, 2 nodes, 8 GPUs, 16 slots):

    >>> weight = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    ...           [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
    >>> p2l, l2p, cnt = rebalance_experts(weight, 16, 4, 2, 8)
    >>> print(p2l)
    [[ 5  6  5  7  8  4  3  4 10  9 10  2  0  1 11  1]
     [ 7 10  6  8  6 11  8  9  2  4  5  1  5  0  3  1]]
    >>> cnt[0].tolist(), l2p[0, 5].tolist()
    ([1, 2, 1, 1, 2, 2, 1, 1, 1, 1, 2, 1], [0, 2])
    """
    w, num_replicas, groups, nodes, num_gpus, distinct, version = _rebalance_experts_iv(
        weight, num_replicas, num_groups, num_nodes, num_gpus, distinct, version
    )
    num_layers, num_logical = w.shape[-2:]
    old = _old_map_iv(old_physical_to_logical, version, (num_layers, num_replicas), num_logical)
    if version == "sglang_vec":
        hierarchical = num_groups % num_nodes == 0
        phy2log, log2phy, logcnt = rebalance_experts_vec(
            w, num_replicas, num_gpus, groups, nodes, hierarchical
        )
        return phy2log, log2phy[..., : int(logcnt.max())].copy(), logcnt
    phy2log, phyrank, logcnt = _hierarchical(
        w, num_replicas, groups, nodes, num_gpus, distinct, version
    )
    if old is not None:
        phy2log = preserve_intragpu_slots(phy2log, num_gpus, old)
    if version == "vllm":  # vLLM derives its maps from the slot map, in slot order
        order = np.argsort(phy2log, axis=-1, kind="stable")
        phyrank = np.empty_like(phyrank)
        for layer in range(num_layers):
            seen = np.zeros(num_logical, dtype=np.int64)
            for p in order[layer]:
                e = phy2log[layer, p]
                phyrank[layer, p] = seen[e]
                seen[e] += 1
    max_count = int(logcnt.max())
    log2phy = np.full((num_layers, num_logical * max_count), -1, dtype=np.int64)
    np.put_along_axis(
        log2phy,
        phy2log * max_count + phyrank,
        np.broadcast_to(np.arange(num_replicas, dtype=np.int64), phy2log.shape),
        axis=-1,
    )
    return phy2log, log2phy.reshape(num_layers, num_logical, max_count), logcnt
