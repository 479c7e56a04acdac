"""``every:N``: a full rebalance with :func:`~straggler.solvers.place_experts` every ``N`` steps.

A fixed clock with this library's placement: every ``N`` steps, ``place_experts`` on the last
``window`` steps' tokens per expert (its default method, the greedy placement), with the
placement in force as ``previous`` so that every expert staying on a GPU keeps its slot
(vLLM's ``preserve_intragpu_slots`` rule; only the changed slots are copied). A lost rank:
``place_experts`` on the active ranks (``active_ranks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ....formulations.validation import check_int
from ..place import place_experts
from .policy import RebalanceContext, RebalancePlan, RebalancePolicy

__all__ = ["Every", "EVERY_PLANNING_S_PER_LAYER"]

#: ``place_experts`` (greedy, with ``previous``) per DeepSeek-V3 layer on this project's
#: 2-core machine: 1.6 ms (``benchmarks/rebalance_loop.py``, "planning" table).
EVERY_PLANNING_S_PER_LAYER = 1.6e-3


@dataclass(frozen=True, kw_only=True)
class Every(RebalancePolicy):
    """A full rebalance every ``interval`` steps from the last ``window`` steps (module notes).

    Parameters
    ----------
    interval : int, default 3000
    window : int, optional
        Default ``min(interval, 1000)``.
    planning_s_per_layer : float
        Default :data:`EVERY_PLANNING_S_PER_LAYER`.

    Examples
    --------
    >>> p = Every(interval=500)
    >>> p.schedule(), p.window_steps(), p.label
    ((500, 500), 500, 'every:500')
    """

    name: ClassVar[str] = "every"
    spec_field: ClassVar[str] = "interval"

    interval: int = 3000
    window: int | None = None
    planning_s_per_layer: float = EVERY_PLANNING_S_PER_LAYER

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "interval", check_int(self.interval, "interval", "every", lo=1))
        if self.window is not None:
            object.__setattr__(self, "window", check_int(self.window, "window", "every", lo=1))

    def schedule(self) -> tuple[int, int]:
        return self.interval, self.interval

    def window_steps(self) -> int:
        return min(self.interval, 1000) if self.window is None else self.window

    def plan(self, ctx: RebalanceContext) -> RebalancePlan | None:
        p2l, _, _ = place_experts(
            ctx.history, ctx.num_replicas, ctx.num_groups, ctx.num_nodes, ctx.num_gpus,
            cost=ctx.cost, previous=ctx.previous, active_ranks=ctx.active,
        )  # fmt: skip
        return RebalancePlan(p2l, {})
