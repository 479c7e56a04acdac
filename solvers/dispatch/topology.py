"""Topology-aware split (TEMPO §4.3): which source node feeds which replica.

A solved dispatch fixes per-GPU shares ``x[e, g]``; on multi-node EP the tokens of expert
``e`` also come *from* nodes, ``s[e, n]`` of them from node ``n`` (node-uniform by default:
each node routes its share of the batch). A split ``f[e, n, g] >= 0`` realizes the shares
when ``sum_g f[e, n, g] = s[e, n]`` and ``sum_n f[e, n, g] = x[e, g]``; its cross-node
traffic is ``sum f[e, n, g]`` over ``node(g) != n``. Minimizing it is a transportation
problem per expert with cost 0 on the diagonal and 1 off it, and same-node-first is exact:

**Claim.** With ``X[e, m] = sum_{g on m} x[e, g]`` the minimum cross-node traffic of
expert ``e`` is ``n_e - sum_n min(s[e, n], X[e, n])``.
*Proof.* Any split sends at most ``min(s[e, n], X[e, n])`` tokens from node ``n`` to
node ``n`` (it cannot send more than the node sources, nor more than its GPUs take), so at
least the stated amount crosses. Same-node-first attains the bound for every node at once:
first each node keeps ``min(s[e, n], X[e, n])`` local; then every node has either no
source left or no capacity left, so whatever pairing of the leftovers (any feasible one
exists, their totals are equal) is cross-node by necessity and adds exactly the bound. ∎

The pairing rule, deterministic: a node's local tokens fill its GPUs in increasing index
order; the leftovers are paired by the north-west-corner rule (source nodes in increasing
order against the GPUs' remaining shares in increasing index order). Per-GPU loads, and so
the makespan, are those of the solved dispatch exactly; only the pairing changes. The
result is one dispatch table per source node (each rank uploads its node's slice; the
in-graph kernel is unchanged).

The baseline is the *flat* table: every node splits its tokens of ``e`` in the proportions
``x[e, g] / n_e`` of the one global table, sending ``sum_n s[e, n] (1 - X[e, n] / n_e)``
across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...formulations.errors import InvalidInputError
from ...formulations.validation import check_array

__all__ = ["TopologySplit", "topology_split", "node_uniform_sources", "flat_cross_node"]

_FUNC = "topology_split"
_RTOL = 1e-9


@dataclass(frozen=True, eq=False, kw_only=True)
class TopologySplit:
    """A same-node-first split; leading layer axis for stacks.

    Attributes
    ----------
    flows : ndarray, shape ([L,] n_experts, n_nodes, n_gpus)
        ``f[e, n, g]``: tokens of expert ``e`` from node ``n`` served on GPU ``g``.
    tables : ndarray, shape ([L,] n_nodes, n_experts, n_gpus)
        Per source node, the probability of sending a token of ``e`` to GPU ``g``
        (``f / s``); an expert with no token from that node gets the flat row
        ``x[e] / n_e`` (all zeros for an expert without tokens).
    cross_node : float
        Tokens crossing nodes under this split (total over layers): the minimum.
    cross_node_flat : float
        Tokens crossing nodes under the flat table (the baseline).
    nodes : ndarray of int
        Node labels in the order of the ``n_nodes`` axis (sorted).
    """

    flows: np.ndarray
    tables: np.ndarray
    cross_node: float
    cross_node_flat: float
    nodes: np.ndarray

    @property
    def saved(self) -> float:
        """Cross-node tokens saved beside the flat table."""
        return self.cross_node_flat - self.cross_node


def _node_index(gpu_node, n_gpus: int):
    node = check_array(gpu_node, "gpu_node", _FUNC, kind="int", ndim=1, shape=(n_gpus,), lo=0)
    labels, idx = np.unique(node, return_inverse=True)
    return labels, idx


def node_uniform_sources(counts, gpu_node) -> np.ndarray:
    """Node-uniform sources: node ``n`` routes ``counts[e] * |GPUs of n| / n_gpus`` tokens
    of each expert (decode batches are equal per GPU). Shape ``counts.shape + (n_nodes,)``.

    Examples
    --------
    >>> node_uniform_sources([8, 4], [0, 0, 1, 1]).tolist()
    [[4.0, 4.0], [2.0, 2.0]]
    """
    c = check_array(counts, "counts", "node_uniform_sources", ndim=(1, 2), lo=0)
    node = check_array(gpu_node, "gpu_node", "node_uniform_sources", kind="int", ndim=1, lo=0)
    _, idx = np.unique(node, return_inverse=True)
    frac = np.bincount(idx) / node.size
    return c[..., None] * frac


def flat_cross_node(shares, gpu_node, sources=None) -> float:
    """Cross-node tokens of the flat table (module notes).

    Examples
    --------
    One expert, 8 tokens, 6 on node 0's GPU and 2 on node 1's; 4 from each node: node 0
    sends a quarter of its 4 away, node 1 three quarters.

    >>> flat_cross_node([[6.0, 2.0]], [0, 1])
    4.0
    """
    x, idx, s = _split_iv(shares, gpu_node, sources, "flat_cross_node")
    n = x.sum(axis=-1)
    X = _per_node(x, idx, s.shape[-1])
    with np.errstate(invalid="ignore", divide="ignore"):
        keep = np.where(n[..., None] > 0, X / np.where(n > 0, n, 1.0)[..., None], 0.0)
    return float((s * (1.0 - keep)).sum())


def _per_node(x, idx, n_nodes):
    out = np.zeros((*x.shape[:-1], n_nodes))
    for m in range(n_nodes):
        out[..., m] = x[..., idx == m].sum(axis=-1)
    return out


def _split_iv(shares, gpu_node, sources, func):
    x = check_array(shares, "shares", func, ndim=(2, 3), lo=0)
    labels, idx = _node_index(gpu_node, x.shape[-1])
    n_nodes = labels.size
    if sources is None:
        s = x.sum(axis=-1)[..., None] * (np.bincount(idx) / idx.size)
    else:
        s = check_array(sources, "sources", func, ndim=x.ndim, lo=0)
        if s.shape != (*x.shape[:-1], n_nodes):
            raise InvalidInputError(
                f"The 'sources' parameter of {func} must have shape "
                f"{(*x.shape[:-1], n_nodes)} (experts x nodes, nodes in sorted label order). "
                f"Got shape {s.shape} instead."
            )
        n = x.sum(axis=-1)
        bad = np.abs(s.sum(axis=-1) - n) > _RTOL * np.maximum(1.0, n)
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise InvalidInputError(
                f"The 'sources' parameter of {func} must route each expert's tokens: "
                f"sum over nodes == sum over GPUs of 'shares'. Got {s[at].sum()!r} sources "
                f"and {n[at]!r} shared tokens for expert {at} instead."
            )
    return x, idx, s


def _northwest(a, b):
    """North-west-corner transport between supplies ``a`` and demands ``b`` (equal sums):
    ``f[i, j]`` is the overlap of the i-th supply interval with the j-th demand interval
    on the line of cumulative sums."""
    A = np.concatenate([[0.0], np.cumsum(a)])
    B = np.concatenate([[0.0], np.cumsum(b)])
    hi = np.minimum(A[1:, None], B[None, 1:])
    lo = np.maximum(A[:-1, None], B[None, :-1])
    return np.maximum(hi - lo, 0.0)


def _split_layer(x, idx, s):
    E, g = x.shape
    n_nodes = s.shape[1]
    f = np.zeros((E, n_nodes, g))
    X = _per_node(x, idx, n_nodes)
    for e in np.flatnonzero(x.sum(axis=1) > 0):
        rem = x[e].copy()
        left = s[e].copy()
        # Same node first: node m keeps min(s, X) and fills its GPUs in index order.
        for m in range(n_nodes):
            keep = min(left[m], X[e, m])
            if keep <= 0:
                continue
            gpus = np.flatnonzero(idx == m)
            take = _northwest([keep], rem[gpus])[0]
            f[e, m, gpus] += take
            rem[gpus] -= take
            left[m] -= keep
        # The leftovers all cross nodes: north-west corner, nodes x GPUs in index order.
        if left.sum() > 0:
            rem = np.maximum(rem, 0.0)
            # equalize the two totals against rounding so the corner rule closes exactly
            f[e] += _northwest(left, rem * (left.sum() / rem.sum()))
    return f


def topology_split(shares, gpu_node, sources=None) -> TopologySplit:
    """Pair each source node's tokens with replicas, same node first (TEMPO §4.3).

    Parameters
    ----------
    shares : array_like, shape (n_experts, n_gpus) or (n_layers, n_experts, n_gpus)
        A solved dispatch (e.g. ``DispatchResult.shares``).
    gpu_node : array_like of int, shape (n_gpus,)
        Node of each GPU.
    sources : array_like, shape ([n_layers,] n_experts, n_nodes), optional
        Tokens of each expert from each node (nodes in sorted label order), summing over
        nodes to each expert's tokens. Default: node-uniform (``node_uniform_sources``).

    Returns
    -------
    TopologySplit
        Flows, one table per source node, and the cross-node tokens of this split (the
        minimum over all splits realizing ``shares``; module notes) and of the flat table.

    Raises
    ------
    InvalidInputError
        Bad shapes or values, or sources that do not add up to the shares.

    Examples
    --------
    Expert 0 (8 tokens) is served 6 on GPU 0 (node 0) and 2 on GPU 1 (node 1); each node
    routes 4 of its tokens. Same node first, only 2 tokens cross (the flat table sends 4):

    >>> sp = topology_split([[6.0, 2.0]], [0, 1])
    >>> sp.flows[0].tolist(), sp.cross_node, sp.cross_node_flat
    ([[4.0, 0.0], [2.0, 2.0]], 2.0, 4.0)
    >>> sp.tables[:, 0].tolist()
    [[1.0, 0.0], [0.5, 0.5]]
    """
    x, idx, s = _split_iv(shares, gpu_node, sources, _FUNC)
    labels = np.unique(np.asarray(gpu_node))
    stack = x.ndim == 3
    xs, ss = (x, s) if stack else (x[None], s[None])
    flows = np.stack([_split_layer(xl, idx, sl) for xl, sl in zip(xs, ss)])
    same = idx[None, None, None, :] == np.arange(s.shape[-1])[None, None, :, None]
    cross = float(flows[~np.broadcast_to(same, flows.shape)].sum())
    n = xs.sum(axis=-1)
    flat = np.where(n[..., None] > 0, xs / np.where(n > 0, n, 1.0)[..., None], 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        tables = np.where(
            ss[..., None] > 0, flows / np.where(ss > 0, ss, 1.0)[..., None], flat[:, :, None, :]
        )
    tables = np.moveaxis(tables, 2, 1)  # [L, n_nodes, E, g]
    out_flows, out_tables = (flows, tables) if stack else (flows[0], tables[0])
    return TopologySplit(
        flows=out_flows,
        tables=out_tables,
        cross_node=cross,
        cross_node_flat=flat_cross_node(x, gpu_node, s),
        nodes=labels,
    )
