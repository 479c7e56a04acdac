"""Converters from the library's tables to the in-memory dispatch layouts of SGLang and vLLM.

The library's layout (what :meth:`DispatchProblem.to_tables
<straggler.formulations.DispatchProblem.to_tables>` and the
:class:`~straggler.runtime.SolverWorker` produce): ``log2phy [L, E, X]`` physical slots in
increasing order, ``-1`` padded, and ``probs [L, E, X]`` in those columns.

* **SGLang** ``--ep-dispatch-algorithm lp``: per layer, a float32 ``[E, X_l]`` tensor of
  per-replica probabilities in the columns of ``logical_to_all_physical_map[layer, :, :X_l]``
  (``X_l`` = the layer's largest replica count; ``-1`` columns are masked by the engine,
  zero-sum rows become uniform, then tokens are drawn multinomially). SGLang lists slots in
  increasing physical id, as we do, except where a rank-local rewrite replaced a row by its
  nearest replica; pass the engine's map to reorder. :func:`to_sglang_lp`.
* **vLLM** ``EplbState``: ``logical_to_physical_map [L, E, R + 1]`` lists replicas in their
  *replica rank* order (EPLB's ``phyrank``, not slot order) and ``logical_replica_count``
  counts them; a token's replica is ``position % count`` (a Knuth hash of the position in
  newer versions), with no probabilities. :func:`to_vllm_replica_order` gives our
  probabilities in vLLM's columns; :func:`to_vllm_replica_map` encodes them as a replica
  multiset for vLLM's own rule (each slot repeated in proportion to its probability).
"""

from __future__ import annotations

import numpy as np

from ..formulations.errors import InvalidInputError
from ..formulations.validation import check_array, check_int

__all__ = ["reorder_columns", "to_sglang_lp", "to_vllm_replica_order", "to_vllm_replica_map"]


def _tables_iv(log2phy, probs, func):
    l2p = check_array(
        log2phy,
        "log2phy",
        func,
        kind="int",
        ndim=3,
        lo=-1,
        expected="an (n_layers, n_experts, X) integer array, -1 padded",
    )
    p = check_array(
        probs,
        "probs",
        func,
        kind="real",
        ndim=3,
        shape=l2p.shape,
        lo=0,
        expected=f"an array of shape {l2p.shape} (as log2phy) of finite numbers >= 0",
    )
    return l2p, p


def reorder_columns(log2phy, probs, target_log2phy) -> np.ndarray:
    """``probs`` moved from the columns of ``log2phy`` to those of ``target_log2phy``.

    Each listed target slot takes the probability of the same slot in our row; ``-1`` target
    columns get 0. Every listed target slot must be one of our row's slots, and no positive
    probability may sit on a slot the target row does not list (it would be lost).

    Examples
    --------
    >>> reorder_columns([[[0, 4, 9]]], [[[0.5, 0.2, 0.3]]], [[[9, 0, 4, -1]]]).tolist()
    [[[0.3, 0.5, 0.2, 0.0]]]
    """
    func = "reorder_columns"
    l2p, p = _tables_iv(log2phy, probs, func)
    tgt = check_array(target_log2phy, "target_log2phy", func, kind="int", ndim=3, lo=-1)
    if tgt.shape[:2] != l2p.shape[:2]:
        raise InvalidInputError(
            f"The 'target_log2phy' parameter of {func} must have shape "
            f"({l2p.shape[0]}, {l2p.shape[1]}, X') as log2phy. Got shape {tgt.shape} instead."
        )
    listed, tlisted = l2p >= 0, tgt >= 0
    match = (l2p[..., :, None] == tgt[..., None, :]) & listed[..., :, None] & tlisted[..., None, :]
    found = match.sum(axis=-2)
    if ((found != 1) & tlisted).any():
        l, e, c = (int(i) for i in np.argwhere((found != 1) & tlisted)[0])
        raise InvalidInputError(
            f"The 'target_log2phy' parameter of {func} must list only slots of the expert's "
            f"replicas in log2phy, each once. Got slot {int(tgt[l, e, c])} for expert {e} of "
            f"layer {l}, which log2phy lists {int(found[l, e, c])} times, instead."
        )
    lost = listed & ~match.any(axis=-1) & (p > 0)
    if lost.any():
        l, e, j = (int(i) for i in np.argwhere(lost)[0])
        raise InvalidInputError(
            f"The 'target_log2phy' parameter of {func} must list every slot with positive "
            f"probability. Got slot {int(l2p[l, e, j])} of expert {e} of layer {l} (p = "
            f"{p[l, e, j]:.4g}) missing instead."
        )
    return np.einsum("lex,lext->let", p, match.astype(np.float64))


def to_sglang_lp(log2phy, probs, sglang_log2phy=None) -> list[np.ndarray]:
    """Per-layer ``[E, X_l]`` float32 probabilities for SGLang's ``lp`` dispatch.

    Parameters
    ----------
    log2phy, probs : array_like, shape (n_layers, n_experts, X)
        The library's tables.
    sglang_log2phy : array_like of int, shape (n_layers, n_experts, X_s), optional
        The engine's ``logical_to_all_physical_map`` (default: ours, same slot order).

    Returns
    -------
    list of ndarray
        Layer ``l``: float32 ``[E, X_l]``, ``X_l`` the layer's largest replica count, in the
        columns of ``logical_to_all_physical_map[l, :, :X_l]`` (SGLang's
        ``partial_logical_to_valid_physical_map``), rows normalised, ``-1`` columns zero.

    Examples
    --------
    >>> l2p = [[[0, 2], [1, -1]], [[0, -1], [1, -1]]]
    >>> out = to_sglang_lp(l2p, [[[3.0, 1.0], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]]])
    >>> [o.tolist() for o in out]
    [[[0.75, 0.25], [1.0, 0.0]], [[1.0], [1.0]]]
    """
    func = "to_sglang_lp"
    l2p, p = _tables_iv(log2phy, probs, func)
    if sglang_log2phy is not None:
        cols = check_array(sglang_log2phy, "sglang_log2phy", func, kind="int", ndim=3, lo=-1)
        p = reorder_columns(l2p, p, cols)
        l2p = cols
    listed = l2p >= 0
    p = np.where(listed, p, 0.0)
    s = p.sum(axis=-1, keepdims=True)
    uniform = listed / np.maximum(listed.sum(axis=-1, keepdims=True), 1)
    p = np.where(s > 0, p / np.where(s > 0, s, 1.0), uniform)
    width = np.maximum(listed.sum(axis=-1).max(axis=-1), 1)
    return [p[l, :, : width[l]].astype(np.float32) for l in range(p.shape[0])]


def to_vllm_replica_order(log2phy, probs, vllm_log2phy) -> np.ndarray:
    """Our probabilities in the columns of vLLM's ``logical_to_physical_map [L, E, R + 1]``
    (replica-rank order), float32; see :func:`reorder_columns`.

    Examples
    --------
    >>> to_vllm_replica_order([[[3, 7]]], [[[0.25, 0.75]]], [[[7, 3]]]).tolist()
    [[[0.75, 0.25]]]
    """
    return reorder_columns(log2phy, probs, vllm_log2phy).astype(np.float32)


def to_vllm_replica_map(log2phy, probs, width: int):
    """Encode the tables as replica multisets for vLLM's ``position % count`` rule.

    Row ``(l, e)`` becomes ``width`` entries in which slot ``j`` appears ``m_j`` times,
    ``m_j = ceil(width C_j - 1/2) - ceil(width C_{j-1} - 1/2)`` (``C`` the cumulative
    normalised probabilities: systematic rounding at the stratum midpoints, so
    ``|m_j - width p_j| < 1``, as in the dispatch kernel's own split), entries in column
    order. A row without positive probability is spread uniformly over its listed slots.
    vLLM then sends the token at flat position ``pos`` to entry ``pos % width`` (or its hash
    of ``pos``), which gives slot ``j`` a share ``m_j / width`` of the expert's tokens.

    Parameters
    ----------
    log2phy, probs : array_like, shape (n_layers, n_experts, X)
    width : int
        Entries per row, at most the map's width (``R + 1`` in vLLM, where the map is a
        separate dispatch tensor: vLLM's rearrangement code expects distinct replicas in its
        own ``logical_to_physical_map``).

    Returns
    -------
    logical_to_physical_map : ndarray of int64, shape (n_layers, n_experts, width)
    logical_replica_count : ndarray of int64, shape (n_layers, n_experts)
        ``width`` for experts with a replica, 0 otherwise.

    Examples
    --------
    >>> m, cnt = to_vllm_replica_map([[[3, 7], [5, -1]]], [[[0.25, 0.75], [1.0, 0.0]]], 4)
    >>> m.tolist(), cnt.tolist()
    ([[[3, 7, 7, 7], [5, 5, 5, 5]]], [[4, 4]])
    """
    func = "to_vllm_replica_map"
    l2p, p = _tables_iv(log2phy, probs, func)
    width = check_int(width, "width", func, lo=1)
    listed = l2p >= 0
    w = np.where(listed, p, 0.0)
    w = np.where((w.sum(axis=-1) > 0)[..., None], w, listed.astype(np.float64))
    s = w.sum(axis=-1, keepdims=True)
    cum = np.cumsum(w, axis=-1) / np.where(s > 0, s, 1.0)
    cum[..., -1] = np.where(s[..., 0] > 0, 1.0, 0.0)  # the last threshold exactly 1
    mid = (np.arange(width) + 0.5) / width  # stratum midpoints
    col = (cum[..., None, :] <= mid[:, None]).sum(axis=-1)  # [L, E, width]
    col = np.minimum(col, l2p.shape[-1] - 1)
    out = np.take_along_axis(l2p, col, axis=-1)
    has = listed.any(axis=-1)
    out = np.where(has[..., None], out, -1)
    return out.astype(np.int64), np.where(has, width, 0).astype(np.int64)
