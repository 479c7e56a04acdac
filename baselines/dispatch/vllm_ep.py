"""``vllm_ep``: vLLM's EPLB replica choice, token by token.

Upstream: vllm-project/vllm, ``eplb_map_to_physical_and_record`` (in vLLM CPU 0.32.0:
``vllm/model_executor/layers/fused_moe/router/base_router.py``, the Triton kernel
``_eplb_map_and_record_i32_kernel``, defined on CUDA-like platforms; the ``hash`` rule
below equals that kernel run under Triton's interpreter, ``tests/conformance/
test_vllm.py``): every entry of a rank's ``topk_ids [n_tokens, k]`` (its local batch) maps
logical expert ``e`` to ``logical_to_physical_map[e, i]`` with replica index ``i`` chosen
by

* ``version="hash"`` (default, current): since PR #40810 (opened 2026-04-24, "Fix replica
  selection bias in fused_moe router"), ``i = ((t * 2654435769) & 0xFFFFFFFF) % count[e]``
  with ``t = flat_index // k`` the token's local index: a Knuth multiplicative hash, the
  same replica index for all ``k`` experts of a token;
* ``version="modulo"`` (PR #24573, opened 2025-09-10, "Reduce EPLB Inference Overhead"):
  ``i = flat_index % count[e]`` with ``flat_index = t * k + j`` over the local
  ``(token, top-k)`` layout. Biased: when ``count[e]`` divides ``k``, ``i = j % count[e]``
  depends on the top-k position alone, and a hot expert sits mostly at position 0;
* ``version="random"`` (PR #18343, the first EPLB, reviewed June 2025): a uniformly random
  replica per entry (``torch.rand``; numpy's generator stands for it here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...formulations.dispatch import DispatchProblem
from ...formulations.errors import param_error
from ...formulations.validation import check_array, check_choice, check_int, check_rng
from ...solvers.dispatch.method import LayerSolution
from .tokens import (
    _caller_int_dtype,
    _local_positions,
    _mask_candidates,
    _shares_from_slots,
    token_layout,
)

__all__ = ["VllmEP", "VLLM_EP_VERSIONS", "KNUTH_MULTIPLIER", "vllm_replica_choice"]

#: Accepted values of :attr:`VllmEP.version` (current first).
VLLM_EP_VERSIONS = ("hash", "modulo", "random")
#: ``floor(2**32 / phi)``, the multiplier of vLLM's hash (#40810).
KNUTH_MULTIPLIER = 2654435769


def _vllm_replica_choice_iv(topk, source, logical_to_physical, version, rng):
    func = "vllm_replica_choice"
    topk = check_array(topk, "topk", func, kind="int", ndim=2, lo=-1)
    source = check_array(source, "source", func, kind="int", ndim=1, lo=0, shape=(topk.shape[0],))
    if source.size and (np.diff(source) < 0).any():
        raise param_error(
            "source", func, "non-decreasing (each rank's tokens contiguous)", "a decreasing step"
        )
    l2p = check_array(logical_to_physical, "logical_to_physical", func, kind="int", ndim=2, lo=-1)
    if topk.size and topk.max() >= l2p.shape[0]:
        raise param_error("topk", func, f"expert ids below {l2p.shape[0]}", f"id {int(topk.max())}")
    version = check_choice(version, "version", func, VLLM_EP_VERSIONS)
    gen = check_rng(rng, func) if version == "random" else None
    return topk, source, l2p, version, gen


def vllm_replica_choice(topk, source, logical_to_physical, *, version="hash", rng=None):
    """The physical slot vLLM sends every ``(token, top-k)`` entry to.

    Parameters
    ----------
    topk : array_like of int, shape (n_tokens, k)
        Logical expert per entry (``-1``: none); the rows of each rank contiguous, in the
        rank's local order.
    source : array_like of int, shape (n_tokens,)
        Rank of each token, non-decreasing: the flat index restarts at each rank's batch.
    logical_to_physical : array_like of int, shape (n_experts, X)
        ``logical_to_physical_map`` of one layer, ``-1`` padded; ``count[e]`` is its number
        of valid entries.
    version : {"hash", "modulo", "random"}, default "hash"
    rng : None, int or numpy.random.Generator
        Only ``version="random"`` draws.

    Returns
    -------
    ndarray of ``topk``'s integer dtype (int64 for other input), shape (n_tokens, k)
        ``-1`` where ``topk`` is ``-1`` (vLLM writes ``topk_ids.dtype``).

    Examples
    --------
    Two replicas (slots 0 and 1) of a hot expert that is every token's first choice, top-2:
    the modulo rule sends all of them to slot 0, the hash alternates with the token.

    >>> topk = np.array([[0, 1], [0, 1], [0, 1], [0, 1]])
    >>> l2p = np.array([[0, 1], [2, -1]])
    >>> vllm_replica_choice(topk, np.zeros(4, int), l2p, version="modulo")[:, 0].tolist()
    [0, 0, 0, 0]
    >>> vllm_replica_choice(topk, np.zeros(4, int), l2p)[:, 0].tolist()
    [0, 1, 0, 1]
    """
    dtype = _caller_int_dtype(topk)
    topk, source, l2p, version, gen = _vllm_replica_choice_iv(
        topk, source, logical_to_physical, version, rng
    )
    n_tok, k = topk.shape
    count = np.maximum((l2p != -1).sum(axis=1), 1)
    live = topk >= 0
    e = np.where(live, topk, 0)
    t = np.broadcast_to(_local_positions(source)[:, None], topk.shape)
    if version == "hash":
        idx = ((t * KNUTH_MULTIPLIER) & 0xFFFFFFFF) % count[e]
    elif version == "modulo":
        idx = (t * k + np.arange(k)[None, :]) % count[e]
    else:
        idx = np.floor(gen.random(topk.shape) * count[e]).astype(np.int64)
    return np.where(live, l2p[e, idx], -1).astype(dtype, copy=False)


def _vllm_iv(method) -> None:
    func = "solve_dispatch(method='vllm_ep')"
    check_choice(method.version, "version", func, VLLM_EP_VERSIONS)
    check_int(method.top_k, "top_k", func, lo=1)
    check_int(method.layout_seed, "layout_seed", func, lo=0)


@dataclass(frozen=True, kw_only=True)
class VllmEP:
    """vLLM's EPLB replica choice (hash of the token index, or the older modulo / random).

    Parameters
    ----------
    version : {"hash", "modulo", "random"}, default "hash"
        See the module docstring.
    top_k, layout_seed : int, default 8 and 0
        Experts per token and seed of the synthetic token order
        (:func:`~straggler.baselines.dispatch.tokens.token_layout`), whose within-token order puts
        hot experts first as a router's sorted top-k does; ``"random"`` draws from the
        ``rng`` of :func:`~straggler.solvers.solve_dispatch`.

    Notes
    -----
    The replica lists are the instance's replica GPUs in increasing order (one slot per
    GPU; vLLM's map lists slots in slot order). Not modelled: two replicas of one expert on
    one GPU (vLLM counts both, so that GPU gets two of the ``count`` residues); DP padding
    tokens. ``O(n_tokens * k)``.

    References
    ----------
    vLLM CPU 0.32.0 ``model_executor/layers/fused_moe/router/base_router.py``
    (``eplb_map_to_physical_and_record``).

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> from straggler.solvers import solve_dispatch
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> r = solve_dispatch(p, CostModel(a=0, b=15, c=0, beta=0.1), method="vllm_ep")
    >>> r.shares[0].tolist()  # k = 1 here: the replica is the parity of the local token index
    [300.0, 300.0]
    """

    version: str = "hash"
    top_k: int = 8
    layout_seed: int = 0

    def __post_init__(self) -> None:
        _vllm_iv(self)

    def solve(self, problem: DispatchProblem, cost, *, time_limit=None, rng=None) -> LayerSolution:
        """Dispatch one layer (see the class docstring)."""
        g = problem.n_gpus
        lay = token_layout(problem.counts, g, top_k=int(self.top_k), seed=int(self.layout_seed))
        slots = vllm_replica_choice(
            lay.topk, lay.source, _mask_candidates(problem.replicas), version=self.version, rng=rng
        )
        shares = _shares_from_slots(lay.topk, slots, np.arange(g), g, problem.n_experts)
        return LayerSolution(shares=shares, extras={"version": self.version})
