"""Certified lower bounds on the optimal dispatch makespan.

:func:`certified_lower_bound` is what every :class:`DispatchResult` reports (combined with
any bound the method proves itself, such as a MILP dual bound). Each ingredient is valid
for any replica sets; see ``proofs/THEOREMS.md``.
"""

from __future__ import annotations

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem, basic_lower_bound

__all__ = ["certified_lower_bound"]


def certified_lower_bound(problem: DispatchProblem, cost: CostModel) -> float:
    """A lower bound on the optimal makespan of one layer.

    Currently the averaging bound of
    :func:`~straggler.formulations.basic_lower_bound` (activations and tokens).
    """
    return float(basic_lower_bound(problem.layer(0) if problem.is_stack else problem, cost))
