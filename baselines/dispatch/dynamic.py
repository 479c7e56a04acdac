"""``sglang_dynamic``: SGLang's dynamic dispatch, a random replica for every token.

Upstream: sgl-project/sglang, ``python/sglang/srt/eplb/expert_location_dispatch.py``,
``_topk_ids_logical_to_physical_dynamic`` (``--ep-dispatch-algorithm dynamic``): every
``(token, top-k)`` entry draws ``torch.randint(0, 65536) % num_valid`` over the expert's
candidate list of the token's rank, ``partial_logical_to_all_physical_map``. Versions:

* ``version="same_node"`` (default, current): since PR #10874 (opened 2025-09-24,
  approved 2025-10-28, "EPLB: prefer to use physical experts in the same gpu or node"),
  ``_compute_logical_to_all_physical_map`` narrows each rank's list to the one replica of
  SGLang's nearest rule when there is one (``_find_nearest_expert``, as for ``static``:
  the only replica; the first on the rank's GPU; the first on its node when that narrows
  the set), so a rank with a local replica sends all its tokens of that expert there;
  otherwise the draw is over all replicas.
* ``version="uniform"`` (PR #5226, opened 2025-04-10, until #10874): the draw is always
  over all replicas, whatever the source.

``rank_invariant=True`` is the dispatch SGLang 0.5.23 uses without an all-to-all backend
(``--moe-a2a-backend none``, ``ExpertLocationDispatchInfo.rank_invariant``): every EP rank
runs the MoE over the same tokens, so the lists are not narrowed per rank and the replica
is the token's row index modulo ``num_valid`` instead of a random draw, identical on every
rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...formulations.dispatch import DispatchProblem
from ...formulations.validation import check_array, check_bool, check_choice, check_int, check_rng
from ...solvers.dispatch.method import LayerSolution
from .static import _nearest_replica
from .tokens import _caller_int_dtype, _mask_candidates, _shares_from_slots, token_layout

__all__ = [
    "SGLangDynamic",
    "SGLANG_DYNAMIC_VERSIONS",
    "sglang_dynamic_lists",
    "sglang_dynamic_choice",
]

#: Accepted values of :attr:`SGLangDynamic.version` (current first).
SGLANG_DYNAMIC_VERSIONS = ("same_node", "uniform")


def sglang_dynamic_lists(
    logical_to_physical, slot_gpu, gpu_node, *, version="same_node", rank_invariant=False
):
    """Every rank's candidate lists (``partial_logical_to_all_physical_map`` per rank).

    Parameters
    ----------
    logical_to_physical : array_like of int, shape (n_experts, X)
        One layer's replica slots per expert, ``-1`` padded.
    slot_gpu : array_like of int, shape (n_slots,)
    gpu_node : array_like of int, shape (n_gpus,)
    version : {"same_node", "uniform"}
    rank_invariant : bool, default False
        No all-to-all backend: SGLang skips the per-rank narrowing (every rank gets the
        full lists, as ``version="uniform"``).

    Returns
    -------
    lists : ndarray of the map's integer dtype (int64 for other input), shape (n_gpus, n_experts, X)
        SGLang's lists keep its map's dtype.
    num_valid : ndarray of int64, shape (n_gpus, n_experts)

    Examples
    --------
    >>> lists, nv = sglang_dynamic_lists([[0, 2]], np.arange(3), np.zeros(3, int))
    >>> lists[:, 0].tolist(), nv[:, 0].tolist()
    ([[0, -1], [0, 2], [2, -1]], [1, 2, 1])
    """
    func = "sglang_dynamic_lists"
    dtype = _caller_int_dtype(logical_to_physical)
    slot_gpu = check_array(slot_gpu, "slot_gpu", func, kind="int", ndim=1, lo=0)
    l2p = check_array(logical_to_physical, "logical_to_physical", func, kind="int", ndim=2, lo=-1)
    gpu_node = check_array(gpu_node, "gpu_node", func, kind="int", ndim=1, lo=0)
    version = check_choice(version, "version", func, SGLANG_DYNAMIC_VERSIONS)
    rank_invariant = check_bool(rank_invariant, "rank_invariant", func)
    n_gpus = gpu_node.size
    n_experts, width = l2p.shape
    lists = np.broadcast_to(l2p, (n_gpus, n_experts, width)).copy()
    num_valid = np.broadcast_to((l2p != -1).sum(axis=1), (n_gpus, n_experts)).copy()
    if version == "same_node" and not rank_invariant:
        for e in range(n_experts):
            cand = [int(p) for p in l2p[e] if p != -1]
            if not cand:
                continue
            for rank in range(n_gpus):
                p = _nearest_replica(cand, slot_gpu, gpu_node, rank, "same_node")
                if p != -1:
                    lists[rank, e] = -1
                    lists[rank, e, 0] = p
                    num_valid[rank, e] = 1
    return lists.astype(dtype, copy=False), num_valid


def sglang_dynamic_choice(
    topk, source, lists, num_valid, rng, *, rank_invariant=False
) -> np.ndarray:
    """The physical slot of every ``(token, top-k)`` entry: ``randint(0, 65536) % num_valid``
    over the token's rank's list (one draw per entry, as upstream; numpy's generator stands
    for torch's), or with ``rank_invariant`` the token's row index ``% num_valid``.

    Parameters
    ----------
    topk : ndarray of int, shape (n_tokens, k)
        Logical expert per entry, ``-1`` for none.
    source : ndarray of int, shape (n_tokens,)
        Source rank of each token.
    lists, num_valid : see :func:`sglang_dynamic_lists`
    rng : None, int or numpy.random.Generator
        (Anything with numpy's ``integers(low, high, size)`` method is used as it is.)
        Not drawn from with ``rank_invariant``.
    rank_invariant : bool, default False
        SGLang's row-index rule (no all-to-all backend): entry ``(t, j)`` takes list
        position ``t % num_valid``, the same on every rank.

    Returns
    -------
    ndarray of ``topk``'s integer dtype (int64 for other input), shape (n_tokens, k)
        ``-1`` where ``topk`` is ``-1``. SGLang casts its result back to ``topk_ids.dtype``
        (int32 ids stay int32).

    Examples
    --------
    >>> lists, nv = sglang_dynamic_lists([[0, 1]], np.arange(2), [0, 0], version="uniform")
    >>> slots = sglang_dynamic_choice(np.zeros((4, 1), int), np.zeros(4, int), lists, nv,
    ...                               np.random.default_rng(0))
    >>> sorted(set(slots.ravel().tolist())) <= [0, 1]
    True
    >>> sglang_dynamic_choice(np.zeros((3, 2), int), np.zeros(3, int), lists, nv, None,
    ...                       rank_invariant=True).tolist()
    [[0, 0], [1, 1], [0, 0]]
    """
    func = "sglang_dynamic_choice"
    dtype = _caller_int_dtype(topk)
    lists = check_array(lists, "lists", func, kind="int", ndim=3, lo=-1)
    g, n_experts, _ = lists.shape
    num_valid = check_array(
        num_valid, "num_valid", func, kind="int", ndim=2, lo=0, shape=(g, n_experts)
    )
    topk = check_array(topk, "topk", func, kind="int", ndim=2, lo=-1, hi=n_experts - 1)
    source = check_array(
        source, "source", func, kind="int", ndim=1, lo=0, hi=g - 1, shape=(topk.shape[0],)
    )
    rank_invariant = check_bool(rank_invariant, "rank_invariant", func)
    src = np.broadcast_to(source[:, None], topk.shape)
    if rank_invariant:  # upstream: arange(n_entries) // top_k, the row of each entry
        draw = np.broadcast_to(np.arange(topk.shape[0])[:, None], topk.shape)
    else:
        if not hasattr(rng, "integers"):
            rng = check_rng(rng, func)
        draw = np.asarray(rng.integers(0, 65536, size=topk.shape))
    live = topk >= 0
    e = np.where(live, topk, 0)
    idx = draw % np.maximum(num_valid[src, e], 1)
    return np.where(live, lists[src, e, idx], -1).astype(dtype, copy=False)


def _dynamic_iv(method) -> None:
    func = "solve_dispatch(method='sglang_dynamic')"
    check_choice(method.version, "version", func, SGLANG_DYNAMIC_VERSIONS)
    check_bool(method.rank_invariant, "rank_invariant", func)
    check_int(method.top_k, "top_k", func, lo=1)
    check_int(method.layout_seed, "layout_seed", func, lo=0)


@dataclass(frozen=True, kw_only=True)
class SGLangDynamic:
    """SGLang's dynamic dispatch: a uniformly random candidate replica for every token.

    Parameters
    ----------
    version : {"same_node", "uniform"}, default "same_node"
        See the module docstring.
    rank_invariant : bool, default False
        SGLang without an all-to-all backend (see the module docstring): full lists on
        every rank, replica by the token's row index; no random draw.
    top_k, layout_seed : int, default 8 and 0
        Experts per token and seed of the synthetic token order
        (:func:`~straggler.baselines.dispatch.tokens.token_layout`); the draws come from the
        ``rng`` of :func:`~straggler.solvers.solve_dispatch`.

    Notes
    -----
    The candidate lists are the instance's replica GPUs in increasing order (one slot per
    GPU). Not modelled: two replicas of one expert on one GPU (SGLang draws over slots, so
    that GPU would get twice the share); in the copy of SGLang read, a map rebuilt by a
    runtime EPLB rebalance (``init_by_eplb``) is not narrowed per rank, which is
    ``version="uniform"``. ``O(n_tokens * k + E * g * X)``.

    References
    ----------
    SGLang 0.5.23 ``srt/eplb/expert_location_dispatch.py`` (``topk_ids_logical_to_physical``).

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> from straggler.solvers import solve_dispatch
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> cost = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> solve_dispatch(p, cost, method="sglang_dynamic").shares.sum(axis=0).tolist()
    [390.0, 390.0]
    >>> x = solve_dispatch(p, cost, method="sglang_dynamic", version="uniform", rng=0).shares
    >>> x.sum().tolist()
    780.0
    """

    version: str = "same_node"
    rank_invariant: bool = False
    top_k: int = 8
    layout_seed: int = 0

    def __post_init__(self) -> None:
        _dynamic_iv(self)

    def solve(self, problem: DispatchProblem, cost, *, time_limit=None, rng=None) -> LayerSolution:
        """Dispatch one layer (see the class docstring)."""
        g = problem.n_gpus
        node = problem.gpu_node if problem.gpu_node is not None else np.zeros(g, np.int64)
        lists, num_valid = sglang_dynamic_lists(
            _mask_candidates(problem.replicas),
            np.arange(g),
            node,
            version=self.version,
            rank_invariant=self.rank_invariant,
        )
        lay = token_layout(problem.counts, g, top_k=int(self.top_k), seed=int(self.layout_seed))
        gen = check_rng(rng, "solve_dispatch(method='sglang_dynamic')")
        slots = sglang_dynamic_choice(
            lay.topk, lay.source, lists, num_valid, gen, rank_invariant=self.rank_invariant
        )
        shares = _shares_from_slots(lay.topk, slots, np.arange(g), g, problem.n_experts)
        extras = {"version": self.version, "rank_invariant": self.rank_invariant}
        return LayerSolution(shares=shares, extras=extras)
