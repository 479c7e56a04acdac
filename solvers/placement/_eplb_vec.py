"""SGLang's ``deepseek_vec`` EPLB in numpy: ``rebalance_experts(version="sglang_vec")``.

Upstream: sgl-project/sglang ``python/sglang/srt/eplb/eplb_algorithms/deepseek_vec.py`` (as
released in 0.5.23; ``--eplb-algorithm deepseek_vec`` and ``deepseek_vec_hierarchical``).
Despite its name, not DeepSeek's algorithm:

* *replicate per chunk* (``make_redundant_experts_chunkwise``): the slots are cut into
  chunks (one per node in the hierarchical form, one in all in the global form), each
  holding its ``E / chunks`` experts once plus ``R / chunks`` redundant slots. Redundant
  slot ``i`` of every chunk goes to the expert whose extra replica minimises the **sum over
  the recorded steps** of the chunk's largest ``load / count`` (only a step's current
  maximum expert can lower that step's maximum); loads carry ``e * 1e-4`` (float32) to
  break ties.
* *spread over GPUs*: each chunk's slots sorted by ``summed load / count`` (descending, in
  ``torch.argsort``'s order) are dealt round by round to the chunk's GPUs, one slot each
  per round, in a snake (GPU 0 up to the last, then back down).
* *hierarchical*: expert groups are first packed onto nodes (``pack_groups``: by
  descending group load, each to the lightest node with room, float32 sums), then each
  node is one chunk.

It replicates against per-step maxima rather than the summed load and balances GPUs by a
fixed snake rather than by greedy packing, so its largest GPU load is usually higher than
DeepSeek's (``benchmarks/eplb_versions.py`` measures by how much).
"""

from __future__ import annotations

import numpy as np

from ._torch_order import torch_sort_descending

__all__ = ["rebalance_experts_vec"]

_F32 = np.float32


def _chunkwise(tokens, num_physical, per_gpu, per_chunk):
    """``make_redundant_experts_chunkwise``: maps of ``tokens`` ``(S, L, E)``."""
    num_steps, num_layers, num_logical = tokens.shape
    num_redundant = num_physical - num_logical
    num_chunks = num_physical // per_chunk
    per_group = num_logical // num_chunks
    redundant_per_chunk = num_redundant // num_chunks
    chunk = np.arange(num_chunks)

    p2l = np.empty((num_layers, num_chunks, per_chunk), dtype=np.int64)
    p2l[:, :, :per_group] = np.arange(num_logical).reshape(num_chunks, per_group)
    l2p = np.full((num_layers, num_chunks, per_group, num_redundant + 1), -1, dtype=np.int64)
    l2p[:, :, :, 0] = np.arange(per_group) + chunk[:, None] * per_chunk
    count = np.ones((num_layers, num_chunks, per_group), dtype=np.int64)

    # float32 throughout, as torch computes int + float32 and int / int
    tok = tokens.reshape(num_steps, num_layers, num_chunks, per_group).astype(_F32)
    bias = (np.arange(num_logical, dtype=_F32) * _F32(1e-4)).reshape(num_chunks, per_group)
    tok_diff = tok + bias
    rows = np.arange(num_layers)[:, None]
    for i in range(redundant_per_chunk):
        score = tok_diff / count.astype(_F32)
        score_plus = tok / (count + 1).astype(_F32)
        top = np.argmax(score, axis=-1)[..., None]  # each step's largest (first of ties)
        top_value = np.take_along_axis(score, top, axis=-1)
        values = np.broadcast_to(top_value, score.shape).copy()
        np.put_along_axis(score, top, np.take_along_axis(score_plus, top, axis=-1), axis=-1)
        np.put_along_axis(values, top, score.max(axis=-1, keepdims=True), axis=-1)
        pick = np.argmin(values.sum(axis=0, dtype=_F32), axis=-1)  # (L, chunks)
        p2l[:, :, per_group + i] = pick + chunk * per_group
        l2p[rows, chunk, pick, count[rows, chunk, pick]] = chunk * per_chunk + per_group + i
        count[rows, chunk, pick] += 1

    p2l = p2l.reshape(num_layers, num_physical)
    l2p = l2p.reshape(num_layers, num_logical, num_redundant + 1)
    count = count.reshape(num_layers, num_logical)
    if per_gpu > 1:
        gpus_per_chunk = per_chunk // per_gpu
        load = tokens.sum(axis=0, dtype=tokens.dtype)
        per_slot = np.take_along_axis(load, p2l, axis=-1).astype(_F32) / np.take_along_axis(
            count, p2l, axis=-1
        ).astype(_F32)
        order = np.array(
            [torch_sort_descending(row) for row in per_slot.reshape(-1, per_chunk)]
        ).reshape(num_layers, num_chunks, per_gpu, gpus_per_chunk)
        order += (chunk * per_chunk)[None, :, None, None]
        order[:, :, 1::2, :] = order[:, :, 1::2, ::-1]  # the snake
        order = order.transpose(0, 1, 3, 2).reshape(num_layers, num_physical)
        p2l = np.take_along_axis(p2l, order, axis=-1)
        inverse = np.argsort(order, axis=-1)
        flat = np.where(l2p == -1, 0, l2p).reshape(num_layers, -1)
        l2p = np.where(l2p == -1, -1, np.take_along_axis(inverse, flat, axis=-1).reshape(l2p.shape))
    return p2l, l2p, count


def _pack_groups(tokens_per_group, num_nodes):
    """``pack_groups``: each group's position in node-major order (node, rank in node)."""
    num_layers, num_groups = tokens_per_group.shape
    per_node = num_groups // num_nodes
    out = np.full((num_layers, num_groups), -1, dtype=np.int64)
    for layer in range(num_layers):
        node_tokens = [_F32(0)] * num_nodes
        node_groups = [0] * num_nodes
        for group in torch_sort_descending(tokens_per_group[layer]):
            node = min(
                range(num_nodes),
                key=lambda n: (1, 0) if node_groups[n] >= per_node else (0, node_tokens[n]),
            )
            out[layer, group] = node * per_node + node_groups[node]
            node_tokens[node] = _F32(node_tokens[node] + tokens_per_group[layer, group])
            node_groups[node] += 1
    return out


def rebalance_experts_vec(tokens, num_physical, num_gpus, num_groups, num_nodes, hierarchical):
    """SGLang's ``deepseek_vec.rebalance_experts`` on validated input.

    Parameters
    ----------
    tokens : ndarray, shape (n_steps, n_layers, n_experts)
        Recorded loads per step (integer counts, or float32).
    num_physical, num_gpus, num_groups, num_nodes : int
    hierarchical : bool
        ``deepseek_vec_hierarchical`` (groups packed onto nodes, one chunk per node).

    Returns
    -------
    physical_to_logical : ndarray of int64, shape (n_layers, P)
    logical_to_physical : ndarray of int64, shape (n_layers, n_experts, P - n_experts + 1)
    logical_count : ndarray of int64, shape (n_layers, n_experts)
    """
    per_gpu = num_physical // num_gpus
    if not hierarchical:
        return _chunkwise(tokens, num_physical, per_gpu, num_physical)
    tokens = tokens.astype(_F32)  # upstream: tokens_per_expert.float()
    num_steps, num_layers, num_logical = tokens.shape
    group_size = num_logical // num_groups
    per_group = tokens.sum(axis=0, dtype=_F32).reshape(num_layers, num_groups, group_size)
    group_perm = _pack_groups(per_group.sum(axis=-1, dtype=_F32), num_nodes)
    log2mlog = (group_perm[..., None] * group_size + np.arange(group_size)).reshape(
        num_layers, num_logical
    )
    mlog2log = np.argsort(log2mlog, axis=-1)
    tokens_mlog = np.take_along_axis(tokens, mlog2log[None], axis=-1)
    phy2mlog, mlog2phy, mlog_count = _chunkwise(
        tokens_mlog, num_physical, per_gpu, num_physical // num_nodes
    )
    phy2log = np.take_along_axis(mlog2log, phy2mlog, axis=-1)
    log2phy = np.take_along_axis(mlog2phy, log2mlog[..., None], axis=1)
    return phy2log, log2phy, np.take_along_axis(mlog_count, log2mlog, axis=-1)
