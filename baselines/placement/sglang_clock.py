"""SGLang 0.5.23's EPLB clock: rebalance every ``eplb_rebalance_num_iterations`` forward passes.

Upstream: ``python/sglang/srt/eplb/eplb_manager.py`` (``EPLBManager``), the recorder
``srt/eplb/expert_distribution.py`` and the defaults of ``srt/arg_groups/fields/exec_.py`` and
``arg_groups/parallel_hook.py``:

* **Clock.** ``_entrypoint`` yields ``eplb_rebalance_num_iterations`` (default 1000) times,
  one per forward pass, then rebalances: the first rebalance comes at the end of pass
  ``N + 1``, the next ones every ``N`` passes.
* **Window.** The stat recorder's circular buffer of ``expert_distribution_recorder_buffer_size``
  passes (default: ``N``; ``EPLBManager`` asserts ``N >= buffer size``), summed.
* **Skip.** ``_check_rebalance_needed``: no rebalance when the window's average utilisation
  rate (SGLang's balancedness, :func:`~straggler.formulations.metrics.sglang_balancedness`
  of each pass's GPU loads, averaged) exceeds ``eplb_min_rebalancing_utilization_threshold``
  (default 1.0: never skipped). The GPU loads are the window's tokens per expert split evenly
  over the replicas in force (what SGLang's physical counts record under its dispatch).
* **Planner.** ``ExpertLocationMetadata.init_by_eplb``: ``compute_algorithm("auto")`` picks
  DeepSeek's EPLB, hierarchical when ``num_groups % num_nodes == 0``; with an elastic EP
  backend ``elasticity_aware`` (which is DeepSeek's EPLB while every rank is active,
  :func:`~straggler.baselines.placement.elasticity_aware.elasticity_aware_rebalance`), so
  one planner serves both. No slot is kept: SGLang's updater copies every slot whose expert
  changed (from the GPU itself when it held that expert, else from a peer).
* **Mode.** Synchronous (``rebalance`` runs the planner and the weight update inside the
  forward loop; ``eplb_rebalance_layers_per_chunk`` spreads layers over passes, the loop's
  asynchronous modes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ...formulations.errors import param_error
from ...formulations.metrics import sglang_balancedness
from ...formulations.validation import check_int, check_real
from ...solvers.placement.rebalance.policy import RebalanceContext, RebalancePlan, RebalancePolicy
from .elasticity_aware import elasticity_aware_rebalance

__all__ = ["SGLangClock", "SGLANG_PLANNING_S_PER_LAYER", "window_utilization"]

#: SGLang 0.5.23's ``deepseek`` EPLB (its own torch code, in the SGLang environment) on
#: DeepSeek-V3's shape (58 layers, hierarchical) on this project's shared 2-core machine:
#: 132-154 ms side by side with vLLM's 59 ms (46.7 ms on a quieter day, ``ANCHORS.md``),
#: 2.4 ms per layer (docs/guides/rebalance.md, "Planning time").
SGLANG_PLANNING_S_PER_LAYER = 2.4e-3


def window_utilization(history: np.ndarray, physical_to_logical: np.ndarray, n_gpus: int):
    """SGLang's ``average_utilization_rate_over_window`` for a window of tokens per expert
    ``(n_steps, n_layers, n_experts)`` served by ``physical_to_logical`` with the even split:
    the mean over steps of :func:`~straggler.formulations.metrics.sglang_balancedness` of the
    GPU loads (``-1`` slots hold nothing).

    Examples
    --------
    >>> round(float(window_utilization(np.array([[[3, 1]]]), np.array([[0, 1]]), 2)), 4)
    0.6667
    """
    W, L, E = history.shape
    P = physical_to_logical.shape[1]
    per = P // n_gpus
    loads = np.zeros((W, L, n_gpus))
    for l in range(L):
        row = physical_to_logical[l]
        ok = row >= 0
        cnt = np.bincount(row[ok], minlength=E).astype(float)
        share = np.divide(history[:, l, :], cnt, out=np.zeros((W, E)), where=cnt > 0)
        slot_load = np.zeros((W, P))
        slot_load[:, ok] = share[:, row[ok]]
        loads[:, l, :] = slot_load.reshape(W, n_gpus, per).sum(axis=2)
    return float(sglang_balancedness(loads).mean())


@dataclass(frozen=True, kw_only=True)
class SGLangClock(RebalancePolicy):
    """SGLang's EPLB manager (module notes).

    Parameters
    ----------
    num_iterations : int, default 1000
        ``eplb_rebalance_num_iterations``.
    buffer_size : int, optional
        ``expert_distribution_recorder_buffer_size`` (default ``num_iterations``).
    threshold : float, default 1.0
        ``eplb_min_rebalancing_utilization_threshold``.
    planning_s_per_layer : float
        Default :data:`SGLANG_PLANNING_S_PER_LAYER`.

    Examples
    --------
    >>> p = SGLangClock()
    >>> p.schedule(), p.window_steps(), p.label
    ((1001, 1000), 1000, 'sglang:1000')
    """

    name: ClassVar[str] = "sglang"
    spec_field: ClassVar[str] = "num_iterations"

    num_iterations: int = 1000
    buffer_size: int | None = None
    threshold: float = 1.0
    planning_s_per_layer: float = SGLANG_PLANNING_S_PER_LAYER

    def __post_init__(self) -> None:
        super().__post_init__()
        n = check_int(self.num_iterations, "num_iterations", "sglang", lo=1)
        object.__setattr__(self, "num_iterations", n)
        if self.buffer_size is not None:
            b = check_int(self.buffer_size, "buffer_size", "sglang", lo=1)
            if b > n:
                raise param_error(
                    "buffer_size", "sglang", f"at most num_iterations={n} (SGLang's "
                    "EPLBManager asserts it)", repr(b),
                )  # fmt: skip
            object.__setattr__(self, "buffer_size", b)
        object.__setattr__(
            self, "threshold", check_real(self.threshold, "threshold", "sglang", lo=0)
        )

    def schedule(self) -> tuple[int, int]:
        return self.num_iterations + 1, self.num_iterations

    def window_steps(self) -> int:
        return self.num_iterations if self.buffer_size is None else self.buffer_size

    def plan(self, ctx: RebalanceContext) -> RebalancePlan | None:
        if not ctx.forced:
            rate = window_utilization(ctx.history, ctx.previous, ctx.num_gpus)
            if rate > self.threshold:
                return None
        act = np.asarray(ctx.active, dtype=bool)
        hier = ctx.num_groups % ctx.num_nodes == 0
        p2l, _, _ = elasticity_aware_rebalance(
            ctx.weight, ctx.num_replicas, ctx.num_groups, ctx.num_nodes, ctx.num_gpus, hier,
            act.astype(np.int64),
        )  # fmt: skip
        per = ctx.num_replicas // ctx.num_gpus
        for r in np.flatnonzero(~act):  # SGLang's dummy expert-0 slots: empty for the loop
            p2l[:, r * per : (r + 1) * per] = -1
        return RebalancePlan(p2l, {})
