"""``never``: the placement is never rebalanced; a lost rank's experts are placed again, no more.

The reference every policy is measured against: no weight is copied unless a rank is lost,
and then only the copies that put every expert back on an active rank
(:func:`~straggler.solvers.placement.rebalance.path.restore_experts`: each lost expert into
an empty slot, else the slot of the replica of least load per replica among the experts with
another one). A rank that comes back stays empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .path import restore_experts
from .policy import RebalanceContext, RebalancePlan, RebalancePolicy

__all__ = ["Never"]


@dataclass(frozen=True, kw_only=True)
class Never(RebalancePolicy):
    """Never rebalance (module notes).

    Examples
    --------
    >>> Never().schedule(), Never().label
    ((0, 0), 'never')
    """

    name: ClassVar[str] = "never"

    def plan(self, ctx: RebalanceContext) -> RebalancePlan | None:
        if not ctx.forced:
            return None
        mean = ctx.history.mean(axis=0)
        new = np.stack([
            restore_experts(ctx.previous[l], mean[l], ctx.num_gpus, ctx.active)
            for l in range(mean.shape[0])
        ])  # fmt: skip
        return RebalancePlan(new, {})
