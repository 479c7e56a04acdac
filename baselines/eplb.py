"""DeepSeek's EPLB placement algorithm (re-exported from :mod:`straggler.solvers.eplb`).

The algorithm lives in ``solvers`` because :func:`straggler.solvers.place_experts` (a
solver) starts from it and the layering forbids solvers to import baselines; this module
keeps the baseline's public name.
"""

from ..solvers.eplb import (  # noqa: F401 - the private name keeps tests/test_eplb.py working
    EPLB_VERSIONS,
    _balanced_packing_distinct,
    balanced_packing,
    rebalance_experts,
    replicate_experts,
)

__all__ = ["rebalance_experts", "balanced_packing", "replicate_experts", "EPLB_VERSIONS"]
