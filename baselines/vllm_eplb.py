"""vLLM's EPLB policy with its slot-preserving step: fewer weight copies, the same placement.

Upstream: ``vllm/distributed/eplb/policy/default.py`` (``DefaultEplbPolicy``). Its
``rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_ranks,
old_global_expert_indices=None)`` is DeepSeek's EPLB in numpy
(:func:`~straggler.solvers.eplb.rebalance_experts` with ``version="vllm"``) followed, when
the placement in force is given, by ``preserve_intragpu_slots``: per GPU, the new experts
that were already on that GPU take back their old slots, so only replicas that really move
to another GPU are copied. The GPUs' expert sets, and so the balance, are EPLB's.

``preserve_intragpu_slots``, per layer and GPU (upstream's two passes):

1. for each old slot in order, the first new slot of that GPU not yet used that holds the
   same expert is put there;
2. the new slots left, in slot order, fill the old slots not preserved, in slot order.
"""

from __future__ import annotations

import numpy as np

from ..formulations.errors import param_error
from ..formulations.validation import check_array, check_int
from ..solvers.eplb import rebalance_experts

__all__ = ["preserve_intragpu_slots", "vllm_rebalance_experts"]


def preserve_intragpu_slots(phy2log, num_gpus: int, old_phy2log):
    """Rearrange each GPU's slots of ``phy2log`` to keep the experts of ``old_phy2log``.

    Parameters
    ----------
    phy2log, old_phy2log : array_like of int, shape (n_layers, P)
    num_gpus : int
        ``P`` a multiple of it (upstream returns ``phy2log`` unchanged otherwise; refused
        here).

    Returns
    -------
    ndarray of int64, shape (n_layers, P)
        Every GPU holds the experts of ``phy2log``, those it held before in their old slots.

    Examples
    --------
    >>> preserve_intragpu_slots([[2, 1, 0, 3]], 2, [[1, 4, 3, 5]]).tolist()
    [[1, 2, 3, 0]]
    """
    func = "preserve_intragpu_slots"
    new = check_array(phy2log, "phy2log", func, ndim=2, kind="int", lo=0)
    old = check_array(
        old_phy2log, "old_phy2log", func, ndim=2, kind="int", lo=0, shape=new.shape
    )  # fmt: skip
    num_gpus = check_int(num_gpus, "num_gpus", func, lo=1)
    L, P = new.shape
    if P % num_gpus:
        raise param_error("num_gpus", func, f"a divisor of the slots ({P})", repr(num_gpus))
    per = P // num_gpus
    out = new.copy()
    for l in range(L):
        for h in range(num_gpus):
            lo = h * per
            used = [False] * per
            kept = [False] * per
            for s in range(per):
                for j in range(per):
                    if not used[j] and new[l, lo + j] == old[l, lo + s]:
                        out[l, lo + s] = new[l, lo + j]
                        used[j] = kept[s] = True
                        break
            rest = [new[l, lo + j] for j in range(per) if not used[j]]
            free = [s for s in range(per) if not kept[s]]
            for s, e in zip(free, rest):
                out[l, lo + s] = e
    return out


def vllm_rebalance_experts(
    weight, num_replicas: int, num_groups: int, num_nodes: int, num_gpus: int, *, previous=None
):
    """vLLM's ``DefaultEplbPolicy.rebalance_experts``: EPLB, then, given the placement in
    force, :func:`preserve_intragpu_slots`.

    Parameters
    ----------
    weight, num_replicas, num_groups, num_nodes, num_gpus
        As for :func:`~straggler.solvers.eplb.rebalance_experts`.
    previous : array_like of int, shape (n_layers, P), optional
        The placement in force (upstream's ``old_global_expert_indices``).

    Returns
    -------
    physical_to_logical, logical_to_physical, logical_count
        As :func:`~straggler.solvers.eplb.rebalance_experts` returns them (the other two
        maps derived from the slot map in slot order).

    Examples
    --------
    >>> p2l, _, _ = vllm_rebalance_experts([[6, 2, 3, 1]], 4, 1, 1, 2, previous=[[3, 0, 1, 2]])
    >>> p2l.tolist()  # EPLB: GPU 0 {0, 3}, GPU 1 {1, 2}; each keeps its old slots
    [[3, 0, 1, 2]]
    """
    p2l, _, cnt = rebalance_experts(
        weight, num_replicas, num_groups, num_nodes, num_gpus, version="vllm"
    )  # fmt: skip
    if previous is None:
        return rebalance_experts(
            weight, num_replicas, num_groups, num_nodes, num_gpus, version="vllm"
        )  # fmt: skip
    p2l = preserve_intragpu_slots(p2l, num_gpus, previous)
    L, E = cnt.shape
    l2p = np.full((L, E, int(cnt.max())), -1, dtype=np.int64)
    for l in range(L):
        fill = np.zeros(E, dtype=np.int64)
        for p, e in enumerate(p2l[l]):
            l2p[l, e, fill[e]] = p
            fill[e] += 1
    return p2l, l2p, cnt
