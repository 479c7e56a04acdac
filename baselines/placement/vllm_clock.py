"""vLLM 0.32's EPLB clock: rearrange every ``step_interval`` steps from a ``window_size`` window.

Upstream: ``vllm/distributed/eplb/eplb_state.py`` (``EplbState.step``, ``rearrange``),
``EPLBConfig`` in ``vllm/config/parallel.py`` (``window_size=1000``, ``step_interval=3000``,
``use_async=True``):

* **Clock.** ``expert_rearrangement_step`` starts at ``step_interval - step_interval // 4``
  and counts forward passes; when it reaches ``step_interval`` the state rearranges and the
  counter restarts from 0, so the first rearrangement comes after ``step_interval // 4``
  steps and the next ones every ``step_interval`` steps after the previous. In async mode a
  rearrangement whose copies are still running holds the next one back (``step`` returns
  before resetting the counter): the loop asks again at every step until it is done.
* **Window.** Each step's per-slot loads are written to a ring of ``window_size`` steps, only
  while ``step_interval - counter <= window_size`` (``_should_record_current_step``): at a
  rearrangement the ring holds the last ``min(window_size, steps recorded)`` steps, which is
  what the loop hands the policy.
* **Planner.** ``DefaultEplbPolicy.rebalance_experts`` on the window summed over its steps
  (vLLM's numpy port of DeepSeek's EPLB,
  :func:`~straggler.solvers.placement.eplb.rebalance_experts` with ``version="vllm"``; its
  hierarchical policy when ``num_groups % num_nodes == 0``, ``num_nodes`` taken as 1 when it
  does not divide the GPUs), then ``preserve_intragpu_slots`` against the map in force:
  every expert staying on a GPU keeps its slot.
* **Mode.** ``use_async`` is the loop's mode (``"sync"``: ``rearrange`` runs the policy and
  the weight exchange on the critical path; otherwise the async worker thread runs both,
  one layer's copies consumed per forward pass).

A rank lost or returned: the policy on the active ranks only (vLLM's elastic EP rearranges
over the new EP group with the same policy), the inactive ranks' slots empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ...formulations.validation import check_int
from ...solvers.placement.eplb import preserve_intragpu_slots, rebalance_experts
from ...solvers.placement.rebalance.policy import RebalanceContext, RebalancePlan, RebalancePolicy

__all__ = ["VllmClock", "VLLM_PLANNING_S_PER_LAYER"]

#: vLLM 0.32's ``DefaultEplbPolicy.rebalance_experts`` (its own numpy code, run in the vLLM
#: 0.32 environment, with the map in force) on DeepSeek-V3's shape (58 layers, 256 experts,
#: 288 slots, 32 GPUs, 4 nodes) on this project's shared 2-core machine: 59 ms, 1.0 ms per
#: layer (docs/guides/rebalance.md, "Planning time").
VLLM_PLANNING_S_PER_LAYER = 1.0e-3


@dataclass(frozen=True, kw_only=True)
class VllmClock(RebalancePolicy):
    """vLLM's EPLB clock and policy (module notes).

    Parameters
    ----------
    step_interval : int, default 3000
    window_size : int, default 1000
    planning_s_per_layer : float
        Default :data:`VLLM_PLANNING_S_PER_LAYER`.

    Examples
    --------
    >>> p = VllmClock()
    >>> p.schedule(), p.window_steps(), VllmClock(step_interval=100).label
    ((750, 3000), 1000, 'vllm:100')
    """

    name: ClassVar[str] = "vllm"
    spec_field: ClassVar[str] = "step_interval"

    step_interval: int = 3000
    window_size: int = 1000
    planning_s_per_layer: float = VLLM_PLANNING_S_PER_LAYER

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("step_interval", "window_size"):
            object.__setattr__(self, name, check_int(getattr(self, name), name, "vllm", lo=1))

    def schedule(self) -> tuple[int, int]:
        return max(1, self.step_interval // 4), self.step_interval

    def window_steps(self) -> int:
        return self.window_size

    def plan(self, ctx: RebalanceContext) -> RebalancePlan | None:
        act = np.asarray(ctx.active, dtype=bool)
        G, P = ctx.num_gpus, ctx.num_replicas
        nodes = ctx.num_nodes if G % ctx.num_nodes == 0 else 1
        if act.all():
            new = rebalance_experts(ctx.weight, P, ctx.num_groups, nodes, G, version="vllm")[0]
            return RebalancePlan(preserve_intragpu_slots(new, G, ctx.previous), {})
        per = P // G
        A = int(act.sum())
        ranks = np.flatnonzero(act)
        slots = np.concatenate([np.arange(r * per, (r + 1) * per) for r in ranks])
        new = rebalance_experts(ctx.weight, per * A, 1, 1, A, version="vllm")[0]
        new = preserve_intragpu_slots(new, A, ctx.previous[:, slots])
        out = np.full_like(ctx.previous, -1)
        out[:, slots] = new
        return RebalancePlan(out, {})
