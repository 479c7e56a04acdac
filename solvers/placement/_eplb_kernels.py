"""The two greedy loops of DeepSeek's EPLB as Numba kernels, each with its plain reference.

:func:`~straggler.solvers.placement.eplb.rebalance_experts` spends nearly all its time in two loops
of
upstream's ``eplb.py`` (deepseek-ai/EPLB): ``balanced_packing`` (every item, by descending
weight, into the lightest pack with room) and ``replicate_experts`` (every redundant slot to
the expert with the largest load per replica). Upstream runs them as Python loops over torch
scalars; here they are compiled, with the arithmetic of upstream kept bit for bit: the pack
loads accumulate in the dtype of ``loads`` (float32 for DeepSeek's torch code, float64 for
vLLM's numpy port) and the replica ratio is ``weight / count`` in the dtype ``ratio_dtype``
selects (float32 division as torch's, or float64 as numpy's float32 / int64).

Tie-breaking, identical in kernel and reference: the sort order is given (``order``, computed
by the caller with the sort upstream uses); the pack is the first lightest pack with room
(Python's ``min``); the replicated expert is the first with the largest ratio (``torch.max``,
``np.argmax``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._numba.jit import NJIT

__all__ = [
    "packing_distinct_kernel",
    "packing_distinct_reference",
    "packing_kernel",
    "packing_reference",
    "replicate_kernel",
    "replicate_reference",
]


@njit(**NJIT)
def packing_kernel(w, order, num_packs, loads0):
    """Balanced packing of each row of ``w`` (items visited in ``order[i]``) into
    ``num_packs`` packs of ``n / num_packs`` items; pack loads start at ``loads0`` (a zero
    array whose dtype is the accumulation dtype). Returns ``(pack_index, rank_in_pack)``."""
    n_rows, n_items = w.shape
    per = n_items // num_packs
    pack_index = np.empty((n_rows, n_items), dtype=np.int64)
    rank_in_pack = np.empty((n_rows, n_items), dtype=np.int64)
    loads = loads0.copy()
    items = np.zeros(num_packs, dtype=np.int64)
    for i in range(n_rows):
        for p in range(num_packs):
            loads[p] = loads0[p]
            items[p] = 0
        for j in range(n_items):
            item = order[i, j]
            best = -1
            for p in range(num_packs):
                if items[p] < per and (best < 0 or loads[p] < loads[best]):
                    best = p
            pack_index[i, item] = best
            rank_in_pack[i, item] = items[best]
            loads[best] = loads[best] + w[i, item]
            items[best] += 1
    return pack_index, rank_in_pack


def packing_reference(w, order, num_packs, loads0):
    """Upstream ``balanced_packing``'s loop, as written there (Python ``min`` over the packs
    with room, keyed by load)."""
    n_rows, n_items = w.shape
    per = n_items // num_packs
    pack_index = np.full((n_rows, n_items), -1, dtype=np.int64)
    rank_in_pack = np.full((n_rows, n_items), -1, dtype=np.int64)
    for i in range(n_rows):
        loads = list(loads0)
        items = [0] * num_packs
        for item in order[i]:
            pack = min((p for p in range(num_packs) if items[p] < per), key=loads.__getitem__)
            pack_index[i, item] = pack
            rank_in_pack[i, item] = items[pack]
            loads[pack] = loads[pack] + w[i, item]
            items[pack] += 1
    return pack_index, rank_in_pack


@njit(**NJIT)
def replicate_kernel(w, num_phy, max_count, ratio_dtype):
    """Replicate each row of ``w`` (``num_log`` experts) to ``num_phy`` slots: every extra
    slot to the first expert with the largest ``w / count``, divided in the dtype of
    ``ratio_dtype`` (a ones array of length ``num_log``); experts at ``max_count`` replicas
    are skipped when ``max_count > 0``. Returns ``(phy2log, rank, logcnt)``."""
    n_rows, num_log = w.shape
    phy2log = np.empty((n_rows, num_phy), dtype=np.int64)
    rank = np.zeros((n_rows, num_phy), dtype=np.int64)
    logcnt = np.ones((n_rows, num_log), dtype=np.int64)
    cnt = ratio_dtype.copy()  # replica counts as the division's dtype
    ratio = w[0] / cnt
    for i in range(n_rows):
        for p in range(num_log):
            phy2log[i, p] = p
            cnt[p] = 1
            ratio[p] = w[i, p] / cnt[p]
        for p in range(num_log, num_phy):
            best = -1
            for e in range(num_log):
                if max_count > 0 and logcnt[i, e] >= max_count:
                    continue
                if best < 0 or ratio[e] > ratio[best]:
                    best = e
            phy2log[i, p] = best
            rank[i, p] = logcnt[i, best]
            logcnt[i, best] += 1
            cnt[best] = logcnt[i, best]
            ratio[best] = w[i, best] / cnt[best]
    return phy2log, rank, logcnt


def replicate_reference(w, num_phy, max_count, ratio_dtype):
    """Upstream ``replicate_experts``' loop, vectorized over rows as there: the ratio array
    recomputed for every slot, ``argmax`` taking the first maximum."""
    n_rows, num_log = w.shape
    phy2log = np.tile(np.arange(num_phy, dtype=np.int64), (n_rows, 1))
    rank = np.zeros((n_rows, num_phy), dtype=np.int64)
    logcnt = np.ones((n_rows, num_log), dtype=np.int64)
    for i in range(num_log, num_phy):
        ratio = (w / logcnt.astype(ratio_dtype.dtype)).astype(ratio_dtype.dtype)
        if max_count > 0:
            ratio = np.where(logcnt < max_count, ratio, -np.inf)
        idx = np.argmax(ratio, axis=-1)
        for r in range(n_rows):  # phy2log[:, i] = idx; rank[:, i] = logcnt[rows, idx]; += 1
            j = idx[r]
            phy2log[r, i] = j
            rank[r, i] = logcnt[r, j]
            logcnt[r, j] += 1
    return phy2log, rank, logcnt


@njit(**NJIT)
def packing_distinct_kernel(w, order, labels, num_packs):
    """Balanced packing (items of row ``i`` visited in ``order[i]``, float32 pack loads)
    that never puts two items with one label in one pack, with the one-swap repair that
    :func:`~straggler.solvers.placement.eplb._balanced_packing_distinct` states. Returns
    ``(pack_index, rank_in_pack)``."""
    n_rows, n_items = w.shape
    per = n_items // num_packs
    n_lab = labels.max() + 1
    pack_index = np.full((n_rows, n_items), -1, dtype=np.int64)
    rank_in_pack = np.full((n_rows, n_items), -1, dtype=np.int64)
    loads = np.zeros(num_packs, dtype=np.float32)
    members = np.empty((num_packs, per), dtype=np.int64)
    size = np.zeros(num_packs, dtype=np.int64)
    held = np.zeros((num_packs, n_lab), dtype=np.bool_)
    for i in range(n_rows):
        loads[:] = 0
        size[:] = 0
        held[:, :] = False
        for j in range(n_items):
            item = order[i, j]
            lab = labels[i, item]
            pack = -1
            for p in range(num_packs):
                if size[p] < per and not held[p, lab] and (pack < 0 or loads[p] < loads[pack]):
                    pack = p
            if pack >= 0:
                members[pack, size[pack]] = item
                size[pack] += 1
            else:  # every pack with room holds the label: the one swap
                p = -1
                for x in range(num_packs):
                    if size[x] < per and (p < 0 or loads[x] < loads[p]):
                        p = x
                q = -1
                for x in range(num_packs):
                    if not held[x, lab] and (q < 0 or loads[x] < loads[q]):
                        q = x
                r = -1
                for k in range(size[q]):
                    y = members[q, k]
                    if not held[p, labels[i, y]] and (r < 0 or w[i, y] < w[i, members[q, r]]):
                        r = k
                y = members[q, r]
                members[q, r] = item
                held[q, labels[i, y]] = False
                loads[q] = loads[q] - w[i, y]
                members[p, size[p]] = y
                size[p] += 1
                held[p, labels[i, y]] = True
                loads[p] = loads[p] + w[i, y]
                pack = q
            held[pack, lab] = True
            loads[pack] = loads[pack] + w[i, item]
        for p in range(num_packs):
            for r in range(size[p]):
                pack_index[i, members[p, r]] = p
                rank_in_pack[i, members[p, r]] = r
    return pack_index, rank_in_pack


def packing_distinct_reference(w, order, labels, num_packs):
    """Plain-Python reference of :func:`packing_distinct_kernel`: lists and sets, Python's
    ``min`` (first minimum), the rule as stated."""
    n_rows, n_items = w.shape
    per_pack = n_items // num_packs
    pack_index = np.full(w.shape, -1, dtype=np.int64)
    rank_in_pack = np.full(w.shape, -1, dtype=np.int64)
    for i in range(n_rows):
        loads = [np.float32(0)] * num_packs
        members: list[list[int]] = [[] for _ in range(num_packs)]  # items by rank
        held: list[set] = [set() for _ in range(num_packs)]
        for item in order[i]:
            lab = labels[i, item]
            room = [p for p in range(num_packs) if len(members[p]) < per_pack]
            ok = [p for p in room if lab not in held[p]]
            if ok:
                pack = min(ok, key=loads.__getitem__)
                members[pack].append(item)
            else:
                p = min(room, key=loads.__getitem__)
                full = [q for q in range(num_packs) if lab not in held[q]]
                q = min(full, key=loads.__getitem__)
                movable = [y for y in members[q] if labels[i, y] not in held[p]]
                y = min(movable, key=lambda j: w[i, j])
                r = members[q].index(y)
                members[q][r] = item
                held[q].discard(labels[i, y])
                loads[q] = loads[q] - w[i, y]
                members[p].append(y)
                held[p].add(labels[i, y])
                loads[p] = loads[p] + w[i, y]
                pack = q
            held[pack].add(lab)
            loads[pack] = loads[pack] + w[i, item]
        for p in range(num_packs):
            for r, item in enumerate(members[p]):
                pack_index[i, item] = p
                rank_in_pack[i, item] = r
    return pack_index, rank_in_pack
