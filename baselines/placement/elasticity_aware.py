"""SGLang 0.5.23's ``elasticity_aware`` EPLB: DeepSeek's EPLB on the ranks still active.

Upstream: ``python/sglang/srt/eplb/eplb_algorithms/elasticity_aware.py``
(``rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus,
enable_hierarchical, active_ranks)``), what SGLang's elastic EP runs when a rank is lost
(``--eplb-algorithm elasticity_aware``; ``auto`` becomes it with an elastic EP backend), in
SGLang's order:

1. ``A`` active ranks of ``num_gpus``, ``P_local = num_replicas // num_gpus`` slots each.
   With a rank down, DeepSeek's EPLB (SGLang's ``deepseek.py``
   ``rebalance_experts_hierarchical``) places ``P_local * A`` replicas on ``A`` GPUs with the
   **global** policy (one group, one node), whatever ``enable_hierarchical`` says; with every
   rank up, the hierarchical policy (``enable_hierarchical``) or the global one on all
   ``num_replicas`` slots.
2. ``logical_to_physical`` lists each expert's slots in replica-rank order (SGLang's
   scatter), ``-1`` padded to the largest replica count, slot ids of the compacted active
   space.
3. With a rank down, the ``A`` per-rank slices of ``physical_to_logical`` are walked in rank
   order: at each inactive rank ``idx`` a slice of **zeros** is inserted (every slot of a
   lost rank reads logical expert 0; those slots are in no ``logical_to_physical`` row and no
   count) and every slot id ``>= idx * P_local`` is shifted up by ``P_local``.

The placement steps are :func:`~straggler.solvers.placement.eplb.rebalance_experts` with
``version="sglang"`` (SGLang's copy of DeepSeek's code, torch's tie order included), so this
port equals SGLang's decision for decision (``tests/conformance/test_elasticity_aware.py``).
Like upstream it has no guard for too few active slots (``P_local * A`` below the number of
experts): upstream fails an ``assert`` there, this port raises
:class:`~straggler.formulations.errors.InvalidInputError`.
"""

from __future__ import annotations

import numpy as np

from ...formulations.errors import param_error
from ...formulations.validation import check_array, check_bool
from ...solvers.placement.eplb import _hierarchical, _rebalance_experts_iv

__all__ = ["elasticity_aware_rebalance"]

_FUNC = "elasticity_aware_rebalance"


def elasticity_aware_rebalance(
    weight,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    enable_hierarchical: bool,
    active_ranks,
):
    """SGLang's ``elasticity_aware.rebalance_experts`` (module notes), in numpy.

    Parameters
    ----------
    weight : array_like, shape (n_layers, n_experts)
        Tokens per expert (SGLang passes the recorder's window summed over its steps);
        converted to float32 as upstream.
    num_replicas, num_groups, num_nodes, num_gpus : int
        As SGLang's dispatcher passes them (``num_gpus = P // P_local``).
    enable_hierarchical : bool
        SGLang's ``compute_algorithm``: True for ``elasticity_aware_hierarchical``.
    active_ranks : array_like of int or bool, shape (num_gpus,)
        1 for a rank that serves, 0 for one lost (SGLang's ``ElasticEPStateManager``
        state).

    Returns
    -------
    physical_to_logical : ndarray of int64, shape (n_layers, num_replicas)
        A lost rank's slots hold expert 0.
    logical_to_physical : ndarray of int64, shape (n_layers, n_experts, X)
        Replica-rank order, ``-1`` padded.
    logical_count : ndarray of int64, shape (n_layers, n_experts)

    Raises
    ------
    InvalidInputError
        Where upstream asserts (the layout checks of
        :func:`~straggler.solvers.placement.eplb.rebalance_experts`, too few active slots for
        the experts), an ``active_ranks`` of the wrong length or not 0/1, or no active rank.

    Examples
    --------
    One of four ranks lost (12 slots, 3 per rank):

    >>> p2l, l2p, cnt = elasticity_aware_rebalance(
    ...     [[90, 132, 40, 61, 104, 165, 39, 4]], 12, 1, 1, 4, False, [1, 0, 1, 1])
    >>> p2l.tolist(), l2p[0, 5].tolist()
    ([[1, 3, 7, 0, 0, 0, 4, 5, 6, 0, 5, 2]], [10, 7])
    """
    hier = check_bool(enable_hierarchical, "enable_hierarchical", _FUNC)
    w, P, groups, nodes, G, _, _ = _rebalance_experts_iv(
        weight, num_replicas, num_groups, num_nodes, num_gpus, False, "sglang"
    )
    active = check_array(
        active_ranks, "active_ranks", _FUNC, ndim=1, kind="int", shape=(G,), lo=0, hi=1,
        expected=f"an array of {G} zeros and ones (1: the rank is active)",
    ).astype(bool)  # fmt: skip
    A = int(active.sum())
    L, E = w.shape
    local = P // G
    if A == 0:
        raise param_error("active_ranks", _FUNC, "at least one active rank", "none")
    if A < G:
        if local * A < E:
            raise param_error(
                "active_ranks", _FUNC, f"enough active ranks for the {E} experts ({local} "
                "slots each; upstream asserts num_redundant >= 0)", f"{A} active",
            )  # fmt: skip
        phy2log, phyrank, logcnt = _hierarchical(w, local * A, 1, 1, A, False, "sglang")
    elif hier:
        phy2log, phyrank, logcnt = _hierarchical(w, P, groups, nodes, G, False, "sglang")
    else:
        phy2log, phyrank, logcnt = _hierarchical(w, P, 1, 1, G, False, "sglang")
    X = int(logcnt.max())
    log2phy = np.full((L, E * X), -1, dtype=np.int64)
    np.put_along_axis(
        log2phy, phy2log * X + phyrank,
        np.broadcast_to(np.arange(local * A, dtype=np.int64), phy2log.shape), axis=-1,
    )  # fmt: skip
    if A < G:
        slices = [phy2log[:, i * local : (i + 1) * local] for i in range(A)]
        for idx in range(G):
            if not active[idx]:
                slices.insert(idx, np.zeros((L, local), dtype=np.int64))
                log2phy = np.where(log2phy >= idx * local, log2phy + local, log2phy)
        phy2log = np.concatenate(slices, axis=1)
    return np.ascontiguousarray(phy2log), log2phy.reshape(L, E, X), logcnt
