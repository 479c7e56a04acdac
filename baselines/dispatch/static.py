"""``static``: SGLang's static dispatch, one fixed replica per (source GPU, expert).

Upstream: sgl-project/sglang, ``python/sglang/srt/eplb/expert_location.py``,
``compute_logical_to_rank_dispatch_physical_map`` (selected by
``--ep-dispatch-algorithm static``, the algorithm SGLang picks under EPLB), applied by
``expert_location_dispatch.py`` (``_topk_ids_logical_to_physical_static``: a table lookup
per token). Versions, as read in the code and its history:

* ``version="same_node"`` (default, current): since PR #9849 (opened 2025-08-31, "EPLB:
  prefer to use physical experts in the same node"), for every (source rank, expert) the table
  holds, by ``_find_nearest_expert``: the only replica if there is one; else the first
  replica on the rank's own GPU; else the first replica on the rank's node **when that
  narrows the candidate set** (some but not all replicas are on the node); else a fair
  draw (below).
* ``version="same_gpu"`` (PR #5226, opened 2025-04-10, until #9849): the first replica on the rank's
  own GPU, else a fair draw; a single replica is "drawn" too (the draw returns it, but the
  shuffle still consumes the generator).

The fair draw (``_fair_choices``): the ranks left without a replica get the candidate list
repeated ``k // r`` times plus ``k % r`` candidates sampled without replacement, shuffled,
handed out in rank order. **One** ``random.Random(seed)`` (seed 42) is drawn from across
all layers, layer by layer, expert by expert: the table of layer 1 depends on every draw
of layer 0. The table never changes between rebalances, whatever the batch.

Which candidate lists the table is drawn from depends on how SGLang built the placement
(``expert_location.py``): after ``init_by_eplb`` (an EPLB rebalance) or without an
all-to-all backend (``--moe-a2a-backend none``) every rank draws from the full lists
(``per_rank_lists=False``); after ``init_by_mapping`` / ``init_trivial`` with an
all-to-all backend, rank ``r`` first narrows each list to its own nearest replica
(``_compute_logical_to_all_physical_map``, PR #10874) and draws its table from those lists
(``per_rank_lists=True``): its entry is the same where it has a nearest replica, but the
experts it narrowed consume no draws, so its fair draws differ.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from ...formulations.dispatch import DispatchProblem
from ...formulations.errors import InvalidOptionError, param_error
from ...formulations.validation import check_array, check_bool, check_choice, check_int
from ...solvers.dispatch.method import LayerSolution
from .tokens import _caller_int_dtype, _mask_candidates, token_layout

__all__ = [
    "StaticDispatch",
    "STATIC_RULES",
    "SGLANG_STATIC_VERSIONS",
    "sglang_static_table",
    "sglang_static_choice",
]

#: Accepted values of :attr:`StaticDispatch.rule`.
STATIC_RULES = ("sglang", "first", "random")
#: Accepted values of :attr:`StaticDispatch.version` (current first).
SGLANG_STATIC_VERSIONS = ("same_node", "same_gpu")


def _nearest_replica(candidates, slot_gpu, gpu_node, rank: int, version: str) -> int:
    """SGLang's ``_find_nearest_expert``: the replica slot rank ``rank`` prefers, or ``-1``.

    Parameters
    ----------
    candidates : sequence of int
        Physical slots of one expert, in the engine's order.
    slot_gpu : ndarray of int
        GPU of every physical slot.
    gpu_node : ndarray of int
        Node of every GPU.
    rank : int
        The source GPU.
    version : {"same_node", "same_gpu"}
        See the module docstring.

    Examples
    --------
    Replicas on GPUs 0, 1 (node 0) and 2 (node 1); GPU 3 is on node 1:

    >>> node = np.array([0, 0, 1, 1])
    >>> [_nearest_replica([0, 1, 2], np.arange(4), node, r, "same_node") for r in range(4)]
    [0, 1, 2, 2]
    >>> _nearest_replica([0, 1], np.arange(4), node, 3, "same_node")  # no same-node one
    -1
    >>> _nearest_replica([0, 1], np.arange(4), node, 2, "same_gpu")
    -1
    """
    cand = list(candidates)
    if version == "same_node" and len(cand) == 1:
        return cand[0]
    for p in cand:
        if slot_gpu[p] == rank:
            return p
    if version == "same_node":
        near = [p for p in cand if gpu_node[slot_gpu[p]] == gpu_node[rank]]
        if 0 < len(near) < len(cand):
            return near[0]
    return -1


def _fair_choices(arr: list, k: int, r: random.Random) -> list:
    """SGLang's ``_fair_choices``: every candidate ``k // len`` times, ``k % len`` sampled."""
    quotient, remainder = divmod(k, len(arr))
    out = arr * quotient + r.sample(arr, k=remainder)
    r.shuffle(out)
    return out


def _sglang_static_table_iv(logical_to_physical, slot_gpu, gpu_node, version, seed, per_rank):
    func = "sglang_static_table"
    slot_gpu = check_array(slot_gpu, "slot_gpu", func, kind="int", ndim=1, lo=0)
    if slot_gpu.size == 0:
        raise param_error("slot_gpu", func, "a non-empty 1-D array", "an empty array")
    l2p = check_array(
        logical_to_physical,
        "logical_to_physical",
        func,
        kind="int",
        ndim=(2, 3),
        lo=-1,
        hi=slot_gpu.size - 1,
    )
    if l2p.ndim == 2:
        l2p = l2p[None]
    n_gpus = int(slot_gpu.max()) + 1
    if gpu_node is None:
        gpu_node = np.zeros(n_gpus, dtype=np.int64)
    gpu_node = check_array(gpu_node, "gpu_node", func, kind="int", ndim=1, lo=0, shape=(n_gpus,))
    version = check_choice(version, "version", func, SGLANG_STATIC_VERSIONS)
    seed = check_int(seed, "seed", func)
    per_rank = check_bool(per_rank, "per_rank_lists", func)
    if per_rank and version != "same_node":
        raise InvalidOptionError(
            f"The 'per_rank_lists' option of {func} applies to version='same_node' only "
            f"(SGLang narrows per rank since PR #10874). Got version={version!r} instead."
        )
    return l2p, slot_gpu, gpu_node, version, seed, per_rank


def sglang_static_table(
    logical_to_physical,
    slot_gpu,
    gpu_node=None,
    *,
    version: str = "same_node",
    seed: int = 42,
    per_rank_lists: bool = False,
) -> np.ndarray:
    """SGLang's static dispatch table for every source rank, layer and expert.

    Parameters
    ----------
    logical_to_physical : array_like of int, shape (n_layers, n_experts, X) or (n_experts, X)
        Physical slots of every expert in the engine's order, ``-1`` padded (SGLang's
        ``logical_to_all_physical_map``).
    slot_gpu : array_like of int, shape (n_slots,)
        GPU of each physical slot (``p // slots_per_gpu`` in the engines' layout).
    gpu_node : array_like of int, shape (n_gpus,), optional
        Node of each GPU; default one node.
    version : {"same_node", "same_gpu"}, default "same_node"
    seed : int, default 42
        SGLang's seed; one ``random.Random(seed)`` serves all layers.
    per_rank_lists : bool, default False
        Rank ``r``'s row drawn from its own narrowed lists (SGLang's ``init_by_mapping``
        with an all-to-all backend; see the module docstring); ``version="same_node"``
        only.

    Returns
    -------
    ndarray of the map's integer dtype (int64 for other input), shape (n_gpus, n_layers, n_experts)
        The slot each source rank sends each expert's tokens to (``-1`` for an expert with
        no replica, which SGLang never has; no draw is made for it). SGLang's table keeps
        its map's dtype (``compute_logical_to_rank_dispatch_physical_map``).

    Examples
    --------
    One expert on GPUs 0 and 2 of four (one node): GPUs 0 and 2 keep their tokens, GPUs 1
    and 3 get the two replicas in a shuffled order (``k = 2`` ranks, ``r = 2`` replicas):

    >>> t = sglang_static_table([[0, 2]], np.arange(4))
    >>> t[[0, 2], 0, 0].tolist(), sorted(t[[1, 3], 0, 0].tolist())
    ([0, 2], [0, 2])
    """
    dtype = _caller_int_dtype(logical_to_physical)
    l2p, slot_gpu, gpu_node, version, seed, per_rank = _sglang_static_table_iv(
        logical_to_physical, slot_gpu, gpu_node, version, seed, per_rank_lists
    )
    if not per_rank:
        return _static_table(l2p, slot_gpu, gpu_node, version, seed).astype(dtype, copy=False)
    n_gpus = gpu_node.size
    table = np.empty((n_gpus, *l2p.shape[:2]), dtype=np.int64)
    for rank in range(n_gpus):
        narrowed = l2p.copy()
        for layer, e in np.ndindex(*l2p.shape[:2]):
            cand = [int(p) for p in l2p[layer, e] if p != -1]
            p = _nearest_replica(cand, slot_gpu, gpu_node, rank, version) if cand else -1
            if p != -1:
                narrowed[layer, e] = -1
                narrowed[layer, e, 0] = p
        table[rank] = _static_table(narrowed, slot_gpu, gpu_node, version, seed)[rank]
    return table.astype(dtype, copy=False)


def sglang_static_choice(topk, source, table) -> np.ndarray:
    """The physical slot of every ``(token, top-k)`` entry under SGLang's static table.

    SGLang's ``_topk_ids_logical_to_physical_static``: a lookup of each token's source
    rank's row, ``table[source, expert]``, cast back to the ids' dtype.

    Parameters
    ----------
    topk : array_like of int, shape (n_tokens, k)
        Logical expert per entry (``-1``: none).
    source : array_like of int, shape (n_tokens,)
        Source rank of each token.
    table : array_like of int, shape (n_gpus, n_experts)
        One layer of :func:`sglang_static_table`.

    Returns
    -------
    ndarray of ``topk``'s integer dtype (int64 for other input), shape (n_tokens, k)
        ``-1`` where ``topk`` is ``-1``.

    Examples
    --------
    >>> t = np.array([[0, 5], [3, 5]])                    # 2 ranks, 2 experts
    >>> sglang_static_choice(np.array([[0, 1], [1, -1]], np.int32), [0, 1], t)
    array([[ 0,  5],
           [ 5, -1]], dtype=int32)
    """
    func = "sglang_static_choice"
    dtype = _caller_int_dtype(topk)
    table = check_array(table, "table", func, kind="int", ndim=2, lo=-1)
    g, n_experts = table.shape
    topk = check_array(topk, "topk", func, kind="int", ndim=2, lo=-1, hi=n_experts - 1)
    source = check_array(
        source, "source", func, kind="int", ndim=1, lo=0, hi=g - 1, shape=(topk.shape[0],)
    )
    live = topk >= 0
    out = table[np.broadcast_to(source[:, None], topk.shape), np.where(live, topk, 0)]
    return np.where(live, out, -1).astype(dtype, copy=False)


def _static_table(l2p, slot_gpu, gpu_node, version, seed) -> np.ndarray:
    """The table of :func:`sglang_static_table` from validated lists (one set for all ranks)."""
    n_gpus = int(slot_gpu.max(initial=-1)) + 1
    n_layers, n_experts, _ = l2p.shape
    table = np.full((n_gpus, n_layers, n_experts), -1, dtype=np.int64)
    r = random.Random(seed)
    for layer in range(n_layers):
        for e in range(n_experts):
            cand = [int(p) for p in l2p[layer, e] if p != -1]
            if not cand:
                continue
            remaining = []
            for rank in range(n_gpus):
                p = _nearest_replica(cand, slot_gpu, gpu_node, rank, version)
                table[rank, layer, e] = p
                if p == -1:
                    remaining.append(rank)
            if remaining:  # (before #9849 it ran for every expert; k = 0 draws nothing)
                for rank, p in zip(remaining, _fair_choices(cand, len(remaining), r)):
                    table[rank, layer, e] = p
    return table


def _static_iv(method) -> None:
    func = "solve_dispatch(method='static')"
    check_choice(method.rule, "rule", func, STATIC_RULES)
    check_choice(method.version, "version", func, SGLANG_STATIC_VERSIONS)
    check_int(method.seed, "seed", func)
    check_bool(method.per_rank_lists, "per_rank_lists", func)
    if method.per_rank_lists and (method.rule != "sglang" or method.version != "same_node"):
        raise InvalidOptionError(
            f"The 'per_rank_lists' option of {func} applies to rule='sglang' with "
            f"version='same_node' only. Got rule={method.rule!r}, version={method.version!r}."
        )
    check_int(method.top_k, "top_k", func, lo=1)
    check_int(method.layout_seed, "layout_seed", func, lo=0)


@dataclass(frozen=True, kw_only=True)
class StaticDispatch:
    """Send each source GPU's tokens of an expert to one fixed replica (no per-batch decision).

    Parameters
    ----------
    rule : {"sglang", "first", "random"}, default "sglang"
        * ``"sglang"``: SGLang's table (:func:`sglang_static_table` on the instance's
          replica mask, one slot per GPU, replicas in increasing GPU order), realised on
          the tokens of :func:`~straggler.baselines.dispatch.tokens.token_layout` (each token goes
          where its source GPU's table entry points), so an expert is split over the
          replicas its source GPUs map to.
        * ``"first"``: every token of an expert to its replica on the lowest-index GPU
          (one replica per expert, whole experts; not an engine's rule).
        * ``"random"``: one replica per expert drawn with ``numpy.random.default_rng(seed)``,
          experts in index order, independent of the batch (not an engine's rule).
    version : {"same_node", "same_gpu"}, default "same_node"
        SGLang's rule version (``rule="sglang"``), see the module docstring.
    seed : int, default 42
        SGLang's seed (``"sglang"``) or the ``"random"`` rule's seed.
    per_rank_lists : bool, default False
        ``rule="sglang"``: every rank draws its row from its own narrowed lists (SGLang's
        ``init_by_mapping`` with an all-to-all backend, see the module docstring) instead
        of the full lists (after an EPLB rebalance, or without an all-to-all backend).
    top_k, layout_seed : int, default 8 and 0
        Experts per token and seed of the synthetic token order
        (:func:`~straggler.baselines.dispatch.tokens.token_layout`).

    Notes
    -----
    For a stack the layers share one generator, drawn in layer order, as SGLang's; a
    single-layer problem is layer 0 (a fresh generator). The table is drawn for every
    expert with a replica, tokens or not, so that the draws match a table built from the
    placement alone. Not modelled: two replicas of one expert on one GPU (the mask merges
    them; SGLang draws slots, so such a GPU would get a double share of the fair draw);
    SGLang's candidate order from ``init_by_eplb`` (replica rank order) where it differs
    from slot order. Without an all-to-all backend SGLang 0.5.23 changes only the dynamic
    rule (``rank_invariant``); its static table is then drawn from the full lists
    (``per_rank_lists=False``). ``O(L * E * g)``, times ``g`` with ``per_rank_lists``.

    References
    ----------
    SGLang 0.5.23 ``srt/eplb/expert_location.py``
    (``compute_logical_to_rank_dispatch_physical_map``); TEMPO §5 ("static").

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> from straggler.solvers import solve_dispatch
    >>> cost = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> r = solve_dispatch(p, cost, method="static")  # every GPU keeps its own tokens
    >>> r.shares.sum(axis=0).tolist()
    [390.0, 390.0]
    >>> r = solve_dispatch(p, cost, method="static", rule="first")
    >>> r.makespan, r.shares.sum(axis=0).tolist()
    (105.0, [780.0, 0.0])
    """

    rule: str = "sglang"
    version: str = "same_node"
    seed: int = 42
    per_rank_lists: bool = False
    top_k: int = 8
    layout_seed: int = 0

    def __post_init__(self) -> None:
        _static_iv(self)

    def solve(self, problem: DispatchProblem, cost, *, time_limit=None, rng=None) -> LayerSolution:
        """Dispatch one layer (layer 0 of SGLang's table for ``rule="sglang"``)."""
        return self.solve_stack([problem], cost, time_limit=time_limit, rng=rng)[0]

    def solve_stack(self, layers, cost, *, time_limit=None, rng=None) -> list[LayerSolution]:
        """Dispatch a stack: SGLang's table is drawn once for all layers, in layer order."""
        if self.rule != "sglang":
            return [self._solve_simple(p) for p in layers]
        n_gpus = layers[0].n_gpus
        node = layers[0].gpu_node
        width = max(_mask_candidates(p.replicas).shape[1] for p in layers)
        l2p = np.full((len(layers), layers[0].n_experts, width), -1, dtype=np.int64)
        for i, p in enumerate(layers):
            c = _mask_candidates(p.replicas)
            l2p[i, :, : c.shape[1]] = c
        table = sglang_static_table(
            l2p,
            np.arange(n_gpus),
            node,
            version=self.version,
            seed=int(self.seed),
            per_rank_lists=self.per_rank_lists,
        )
        out = []
        for i, p in enumerate(layers):
            src = token_layout(
                p.counts, n_gpus, top_k=int(self.top_k), seed=int(self.layout_seed)
            ).source_counts(p.n_experts, n_gpus)
            shares = np.zeros(p.replicas.shape, dtype=float)
            for e in np.flatnonzero(p.counts > 0):
                np.add.at(shares[e], table[:, i, e], src[e])
            extras = {"rule": self.rule, "version": self.version, "table": table[:, i].copy()}
            out.append(LayerSolution(shares=shares, extras=extras))
        return out

    def _solve_simple(self, problem: DispatchProblem) -> LayerSolution:
        n = problem.counts
        rep = problem.replicas
        shares = np.zeros(rep.shape, dtype=float)
        np_rng = np.random.default_rng(int(self.seed))
        for e in range(problem.n_experts):
            gpus = np.flatnonzero(rep[e])
            if gpus.size == 0:  # only experts without tokens lack replicas
                continue
            if self.rule == "first":
                shares[e, gpus[0]] = n[e]
            else:  # drawn for every expert with a replica: the table is batch-independent
                shares[e, gpus[np_rng.integers(gpus.size)]] = n[e]
        return LayerSolution(shares=shares, extras={"rule": self.rule})
