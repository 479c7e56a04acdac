"""The token-level view of one routed layer, for baselines that decide token by token.

A :class:`~straggler.formulations.DispatchProblem` carries counts per expert, not tokens.
SGLang's ``static`` and ``dynamic`` dispatch, its ``lp`` sampling, vLLM's EP replica choice
and LPLB's token mapping decide per token, from the token's source GPU (the attention-DP
rank that routed it) and, for vLLM, its position in the ``(token, top-k)`` layout. These
baselines therefore realise their rule on a **seeded synthetic token order** built from the
counts by :func:`token_layout`: the same counts and seed give the same tokens for every
method, so methods are compared on identical tokens.

The layout, for ``N = sum(counts)`` expert assignments and ``k`` experts per token:

1. ``k`` is the requested ``top_k`` unless the counts are not a top-``k`` routing (some
   expert has more tokens than there are tokens, ``n_e > ceil(N / k)``); then the largest
   ``k' <= top_k`` for which they are (``k' = 1`` always is).
2. ``T = ceil(N / k)`` tokens. Experts by descending count (ties by index), each repeated
   ``n_e`` times, fill the ``(T, k)`` table column by column (assignment ``i`` to token
   ``i % T``, position ``i // T``); an expert's run is at most ``T`` long, so it lands on
   distinct tokens. The last ``T * k - N`` cells are empty (``-1``).
3. A seeded permutation shuffles the tokens. Within each token the experts are ordered by
   an exponential race with rates ``n_e`` (keys ``Exp(1) / n_e``, ascending; empty cells
   last): a Plackett-Luce order in which hot experts tend to come first, as a router's
   top-k output sorted by descending score puts them (vLLM's ``flat_index % count`` rule
   depends on that position).
4. Token ``t`` comes from GPU ``t * g // T``: the batch is split over the ``g`` GPUs in
   contiguous blocks of ``T // g`` or ``T // g + 1`` tokens (the decode batch of attention
   data parallelism), each block in its GPU's local order.

Callers with real routing data pass their own ``topk`` and ``source`` arrays to the
token-level functions of each baseline module instead.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...formulations.errors import InvalidInputError
from ...formulations.validation import check_array, check_int

__all__ = ["TokenLayout", "token_layout", "layout_top_k", "MAX_LAYOUT_ASSIGNMENTS"]


class TokenLayout(NamedTuple):
    """Tokens of one layer: which experts each token chose and which GPU it came from."""

    topk: np.ndarray
    """``(n_tokens, k)`` int64: logical expert at each top-k position, ``-1`` for none."""
    source: np.ndarray
    """``(n_tokens,)`` int64: source GPU of each token, non-decreasing."""

    def source_counts(self, n_experts: int, n_gpus: int) -> np.ndarray:
        """``(n_experts, n_gpus)`` matrix: tokens of expert ``e`` coming from GPU ``s``."""
        out = np.zeros((n_experts, n_gpus), dtype=np.int64)
        live = self.topk >= 0
        src = np.broadcast_to(self.source[:, None], self.topk.shape)
        np.add.at(out, (self.topk[live], src[live]), 1)
        return out


def layout_top_k(counts, top_k: int) -> int:
    """The experts per token of :func:`token_layout`: the largest ``k <= top_k`` with
    ``max(counts) <= ceil(sum(counts) / k)`` and at most as many as the experts with tokens
    (a token's ``k`` experts are distinct); 1 for an empty batch.

    Examples
    --------
    >>> layout_top_k([600, 30, 30, 30, 30, 30, 30], 8)
    1
    >>> layout_top_k([3, 3, 2], 2)
    2
    >>> layout_top_k([1, 1, 0], 10**9)
    2
    """
    n = check_array(counts, "counts", "layout_top_k", kind="int", ndim=1, lo=0)
    top_k = check_int(top_k, "top_k", "layout_top_k", lo=1)
    total = int(n.sum())
    if total == 0:
        return 1
    peak = int(n.max())
    # O(live experts) whatever top_k is: no token can hold more distinct experts than that
    for k in range(min(top_k, int(np.count_nonzero(n))), 0, -1):
        if peak <= -(-total // k):
            return k
    return 1  # pragma: no cover - k = 1 always qualifies


#: Most token-expert assignments one layout holds: the layout keeps about 50 bytes per
#: assignment at once (its int64 table, permutation and float64 keys; 3.3 GB at this bound),
#: and the baselines built on it as much again. A decode batch is far below it (8 GPUs x 256
#: tokens x top-8 = 16,384); a per-token rule on more tokens is refused up front rather than
#: run out of memory part way.
MAX_LAYOUT_ASSIGNMENTS = 2**26


def _token_layout_iv(counts, n_gpus, top_k, seed):
    func = "token_layout"
    n = check_array(counts, "counts", func, kind="int", ndim=1, lo=0)
    total = float(n.astype(np.float64).sum())
    if total > MAX_LAYOUT_ASSIGNMENTS:
        raise InvalidInputError(
            "The 'counts' of a layer dispatched token by token (SGLang's static, dynamic and "
            "lp dispatch, vLLM's EP replica choice, LPLB: every token is laid out in memory, "
            f"about 50 bytes each) must total at most 2**26 = {MAX_LAYOUT_ASSIGNMENTS} "
            f"token-expert assignments. Got {int(n.sum())} instead."
        )
    g = check_int(n_gpus, "n_gpus", func, lo=1)
    k = check_int(top_k, "top_k", func, lo=1)
    s = check_int(seed, "seed", func, lo=0)
    return n, g, k, s


def token_layout(counts, n_gpus: int, *, top_k: int = 8, seed: int = 0) -> TokenLayout:
    """A seeded synthetic token order with exactly these per-expert counts (module docstring).

    Parameters
    ----------
    counts : array_like of int, shape (n_experts,)
        Tokens per expert of one layer.
    n_gpus : int
        GPUs the batch comes from (tokens are split over them in contiguous blocks).
    top_k : int, default 8
        Experts per token (DeepSeek-V3, Qwen3); lowered when the counts need it.
    seed : int, default 0
        Seed of the token permutation and of the within-token order.

    Returns
    -------
    TokenLayout
        ``topk`` of shape ``(ceil(N / k), k)``, ``source`` of shape ``(ceil(N / k),)``.

    Examples
    --------
    >>> lay = token_layout([3, 2, 1], 2, top_k=2, seed=0)
    >>> lay.topk.shape, lay.source.tolist()
    ((3, 2), [0, 0, 1])
    >>> np.bincount(lay.topk[lay.topk >= 0], minlength=3).tolist()
    [3, 2, 1]
    >>> bool((lay.topk[:, 0] != lay.topk[:, 1]).all())
    True
    """
    n, g, top_k, seed = _token_layout_iv(counts, n_gpus, top_k, seed)
    k = layout_top_k(n, top_k)
    total = int(n.sum())
    n_tok = -(-total // k)
    if n_tok == 0:
        return TokenLayout(np.zeros((0, k), np.int64), np.zeros(0, np.int64))
    order = np.argsort(-n, kind="stable")
    flat = np.full(n_tok * k, -1, dtype=np.int64)
    flat[:total] = np.repeat(order, n[order])
    table = flat.reshape(k, n_tok).T.copy()  # assignment i -> token i % T, position i // T
    gen = np.random.default_rng(seed)
    table = table[gen.permutation(n_tok)]
    rate = np.where(table >= 0, n[np.maximum(table, 0)], 0).astype(float)
    keys = gen.standard_exponential(table.shape)
    keys = np.where(rate > 0, keys / np.where(rate > 0, rate, 1.0), np.inf)
    table = np.take_along_axis(table, np.argsort(keys, axis=1, kind="stable"), axis=1)
    source = np.arange(n_tok, dtype=np.int64) * g // n_tok
    return TokenLayout(table, source)


def _local_positions(source: np.ndarray) -> np.ndarray:
    """Index of every token within its source GPU's batch (``source`` non-decreasing).

    Examples
    --------
    >>> _local_positions(np.array([0, 0, 1, 1, 1, 3])).tolist()
    [0, 1, 0, 1, 2, 0]
    """
    source = np.asarray(source, dtype=np.int64)
    if source.size == 0:
        return source.copy()
    start = np.r_[0, np.flatnonzero(np.diff(source)) + 1]
    first = np.repeat(start, np.diff(np.r_[start, source.size]))
    return np.arange(source.size, dtype=np.int64) - first


def _caller_int_dtype(x) -> np.dtype:
    """The signed integer dtype of what the caller passed, int64 for anything else.

    The engines keep their id tensors' dtype through a lookup (SGLang's
    ``topk_ids_logical_to_physical`` casts back to ``topk_ids.dtype``; vLLM's router writes
    ``topk_ids.dtype``; SGLang's static table takes its map's dtype), so int32 ids from an
    engine come back int32.

    Examples
    --------
    >>> _caller_int_dtype(np.zeros(2, np.int32)), _caller_int_dtype([1, 2])
    (dtype('int32'), dtype('int64'))
    """
    dt = np.asarray(x).dtype
    return dt if dt.kind == "i" else np.dtype(np.int64)


def _mask_candidates(replicas) -> np.ndarray:
    """Replica lists of a GPU mask in the engines' padded layout, one slot per GPU.

    ``replicas`` of shape ``(n_experts, n_gpus)`` becomes ``(n_experts, X)``: the GPUs
    holding each expert in increasing order, ``-1`` padded (``X = max(1, max count)``).
    With one slot per GPU a slot index is its GPU index, so the engines' rules read on
    these lists exactly as on a ``logical_to_physical`` map whose duplicates on one GPU
    were merged.

    Examples
    --------
    >>> _mask_candidates(np.array([[1, 0, 1], [0, 1, 0]], bool)).tolist()
    [[0, 2], [1, -1]]
    """
    rep = np.asarray(replicas, dtype=bool)
    cnt = rep.sum(axis=1)
    width = max(1, int(cnt.max(initial=0)))
    out = np.full((rep.shape[0], width), -1, dtype=np.int64)
    for e in range(rep.shape[0]):
        gpus = np.flatnonzero(rep[e])
        out[e, : gpus.size] = gpus
    return out


def _shares_from_slots(topk, slots, slot_gpu, n_gpus: int, n_experts: int) -> np.ndarray:
    """Whole-token shares ``(n_experts, n_gpus)`` of a per-token physical choice.

    ``slots[t, j]`` is the physical slot that token ``t``'s ``j``-th expert ``topk[t, j]``
    was sent to (ignored where ``topk`` is ``-1``); ``slot_gpu[p]`` is the GPU of slot ``p``.

    Examples
    --------
    >>> topk = np.array([[0, 1], [0, -1]])
    >>> _shares_from_slots(topk, np.array([[2, 1], [0, -1]]), np.arange(3), 3, 2).tolist()
    [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]
    """
    topk = np.asarray(topk)
    live = topk >= 0
    gpu = np.asarray(slot_gpu)[np.asarray(slots)[live]]
    out = np.zeros((n_experts, n_gpus), dtype=float)
    np.add.at(out, (topk[live], gpu), 1.0)
    return out
