"""Converters from the library's tables to the in-memory dispatch layouts of SGLang and vLLM.

The library's layout (what :meth:`DispatchProblem.to_tables
<straggler.formulations.DispatchProblem.to_tables>` and the
:class:`~straggler.runtime.SolverWorker` produce): ``log2phy [L, E, X]`` physical slots in
increasing order, ``-1`` padded, and ``probs [L, E, X]`` in those columns.

* **SGLang** ``--ep-dispatch-algorithm lp`` (0.5.23): per layer, a float32 ``[E, P]``
  table in the columns of ``logical_to_all_physical_map[layer]`` (padded to
  ``num_physical_experts`` columns), the shape ``LPLBSolver.solve`` returns. The map lists
  slots in increasing id after ``init_by_mapping``, in replica-rank order after
  ``init_by_eplb`` or a rebalance, and one local slot per expert after the rank-local
  rewrite: :func:`to_sglang_lp` takes the engine's map, or rebuilds it from the
  ``physical_to_logical_map`` SGLang was started with. :class:`~straggler.runtime.
  TableSolver` serves the live tables in place of SGLang's per-layer solver.
* **vLLM** ``EplbModelState`` (CPU build 0.32.0): ``logical_to_physical_map [L, E, 1024]``
  lists each expert's slots (in increasing slot id, as ``compute_logical_maps`` builds it)
  and ``logical_replica_count`` counts them; a token's replica is a Knuth hash of its index
  in the rank's batch, ``((t * 2654435769) & 0xFFFFFFFF) % count`` (``vllm_ep``), with no
  probabilities. :func:`to_vllm_replica_order` gives our probabilities in vLLM's columns;
  :func:`to_vllm_replica_map` encodes them as a replica multiset for vLLM's own rule (each
  slot repeated in proportion to its probability).
"""

from __future__ import annotations

import numpy as np

from ..formulations.errors import InvalidInputError
from ..formulations.validation import check_array, check_int

__all__ = [
    "reorder_columns",
    "sglang_logical_to_all_physical",
    "to_sglang_lp",
    "to_vllm_replica_order",
    "to_vllm_replica_map",
]


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


def sglang_logical_to_all_physical(physical_to_logical, n_experts=None) -> np.ndarray:
    """SGLang's ``logical_to_all_physical_map [L, E, P]`` built from a placement.

    As ``ExpertLocationMetadata.init_by_mapping`` builds it (``sglang/srt/eplb/
    expert_location.py``, SGLang 0.5.23): ``_compute_logical_to_all_physical_map`` lists each
    expert's slots in increasing slot id, ``_pad_nested_array`` pads with ``-1`` to the
    longest list and ``_init_raw`` pads to ``P = num_physical_experts`` columns. This is the
    map without the rank-local rewrite SGLang applies when it is given an EP rank and an
    all-to-all backend (each expert with a replica on the rank's GPU or node reduced to that
    one slot): pass the engine's own metadata map in that case.

    Examples
    --------
    >>> sglang_logical_to_all_physical([[0, 1, 0]]).tolist()
    [[[0, 2, -1], [1, -1, -1]]]
    """
    func = "sglang_logical_to_all_physical"
    p2l = check_array(
        physical_to_logical,
        "physical_to_logical",
        func,
        kind="int",
        ndim=2,
        lo=0,
        expected="an (n_layers, num_physical_experts) array of expert ids >= 0 (SGLang has "
        "no empty slots)",
    )
    L, P = p2l.shape
    if min(L, P) < 1:
        raise InvalidInputError(
            f"The 'physical_to_logical' parameter of {func} must be a non-empty (n_layers, "
            f"num_physical_experts) array. Got shape {p2l.shape} instead."
        )
    E = int(p2l.max()) + 1 if n_experts is None else check_int(n_experts, "n_experts", func, lo=1)
    if p2l.max() >= E:
        raise InvalidInputError(
            f"The 'physical_to_logical' parameter of {func} must hold expert ids below "
            f"n_experts={E}. Got {int(p2l.max())} instead."
        )
    out = np.full((L, E, P), -1, dtype=np.int64)
    for layer in range(L):
        seen = np.zeros(E, dtype=np.int64)
        for slot in range(P):
            e = p2l[layer, slot]
            out[layer, e, seen[e]] = slot
            seen[e] += 1
    return out


def to_sglang_lp(log2phy, probs, sglang_log2phy=None, *, physical_to_logical=None) -> np.ndarray:
    """Probability tables for SGLang's ``lp`` dispatch, ``[L, E, P]`` float32.

    SGLang 0.5.23 builds one ``LPLBSolver`` per layer from
    ``metadata.logical_to_all_physical_map[layer]`` (``[E, P]``, padded to
    ``num_physical_experts`` by ``_init_raw``), and the ``log2phy_prob`` its ``solve``
    returns, which the dispatch kernel reads, is ``[E, P]`` in that map's columns. That
    map lists slots in increasing id after ``init_by_mapping``, but in EPLB's replica-rank
    order after ``init_by_eplb`` or a rebalance, and a single local slot per expert after
    the rank-local rewrite: the columns must come from the engine.

    Parameters
    ----------
    log2phy, probs : array_like, shape (n_layers, n_experts, X)
        The library's tables.
    sglang_log2phy : array_like of int, shape (n_layers, n_experts, P), optional
        The engine's ``metadata.logical_to_all_physical_map`` (as a tensor or array).
    physical_to_logical : array_like of int, shape (n_layers, P), optional
        Instead of ``sglang_log2phy``: the ``physical_to_logical_map`` SGLang was started
        with (``--init-expert-location``); the map is rebuilt as ``init_by_mapping`` builds
        it (:func:`sglang_logical_to_all_physical`). Exactly one of the two is required.

    Returns
    -------
    ndarray of float32, shape (n_layers, n_experts, P)
        Row ``[l, e]`` in the columns of the engine's map: rows normalised, ``-1`` columns
        zero, a row without weight uniform over its listed slots.

    Raises
    ------
    InvalidInputError
        Neither or both maps, a map whose rows list a slot that is not one of the expert's
        replicas in ``log2phy``, or that leaves out a slot holding positive probability.

    Examples
    --------
    >>> l2p = [[[0, 2], [1, -1]]]
    >>> to_sglang_lp(l2p, [[[3.0, 1.0], [1.0, 0.0]]], [[[2, 0, -1], [1, -1, -1]]]).tolist()
    [[[0.25, 0.75, 0.0], [1.0, 0.0, 0.0]]]
    """
    func = "to_sglang_lp"
    l2p, p = _tables_iv(log2phy, probs, func)
    if (sglang_log2phy is None) == (physical_to_logical is None):
        raise InvalidInputError(
            f"{func} needs exactly one of sglang_log2phy (the engine's "
            "logical_to_all_physical_map) and physical_to_logical (the map SGLang was started "
            "with): the column order of SGLang's tables depends on how its map was built."
        )
    if sglang_log2phy is not None:
        cols = check_array(
            _host(sglang_log2phy, "sglang_log2phy", func),
            "sglang_log2phy",
            func,
            kind="int",
            ndim=3,
            lo=-1,
        )
    else:
        cols = sglang_logical_to_all_physical(physical_to_logical, l2p.shape[1])
    p = reorder_columns(l2p, p, cols)
    listed = cols >= 0
    p = np.where(listed, p, 0.0)
    s = p.sum(axis=-1, keepdims=True)
    uniform = listed / np.maximum(listed.sum(axis=-1, keepdims=True), 1)
    return np.where(s > 0, p / np.where(s > 0, s, 1.0), uniform).astype(np.float32)


def _host(x, name: str, func: str):
    """A torch tensor as a host numpy array; anything else as it is (a tensor without data
    to read, on the ``meta`` device, sparse or nested, is an error naming the parameter)."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        from .engines._common import to_numpy

        try:
            return to_numpy(x)
        except InvalidInputError as exc:
            raise InvalidInputError(
                f"The '{name}' parameter of {func} must be a dense tensor holding data. {exc}"
            ) from None
    return x


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
    """Encode the tables as replica multisets for vLLM's replica rule (an index modulo the
    count: the Knuth hash of the token index in current vLLM, ``position % count`` before).

    Row ``(l, e)`` becomes ``width`` entries in which slot ``j`` appears ``m_j`` times,
    ``m_j = ceil(width C_j - 1/2) - ceil(width C_{j-1} - 1/2)`` (``C`` the cumulative
    normalised probabilities: systematic rounding at the stratum midpoints, so
    ``|m_j - width p_j| < 1``, as in the dispatch kernel's own split), entries in column
    order. A row without positive probability is spread uniformly over its listed slots.
    vLLM then sends token ``t`` to entry ``hash(t) % width`` (``pos % width`` in older
    versions), which gives slot ``j`` a share ``m_j / width`` of the expert's tokens: exactly
    over every block of ``width`` consecutive tokens when ``width`` is a power of two (the
    hash multiplier is odd, so ``t -> hash(t) mod 2^b`` is a bijection), to within a
    fraction of a token per block otherwise.

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
