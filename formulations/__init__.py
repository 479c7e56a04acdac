"""The problems stated exactly: instances, cost models, validation, evaluation, MILP builders.

Nothing here depends on a solver. ``from straggler.formulations import DispatchProblem,
CostModel, evaluate``.
"""

from .cost import PRESETS, CostModel
from .dispatch import (
    DispatchProblem,
    Evaluation,
    basic_lower_bound,
    check_shares,
    evaluate,
    logical_to_physical,
    tile_count,
)
from .dispatch_milp import build_dispatch_milp, build_token_lp
from .errors import (
    BackendUnavailableError,
    InfeasibleSharesError,
    InvalidInputError,
    InvalidOptionError,
    StragglerError,
    WriteError,
)
from .metrics import (
    ideal_throughput_gain,
    imbalance_ratio,
    layer_balance,
    mean_over_max,
    sglang_balancedness,
    trtllm_imbalance_ratio,
    vllm_balancedness,
)
from .milp import MilpModel, RowBuilder
from .results import DispatchResult, RoutingResult, Status, worst_status
from .routing import (
    ClusterState,
    apply_assignment,
    check_assignment,
    f_score,
    horizon_f_score,
    imbalance,
    margins,
)
from .routing_milp import build_fscore_knapsack_milp, build_joint_tick_milp

__all__ = [
    "build_fscore_knapsack_milp",
    "build_joint_tick_milp",
    "ClusterState",
    "apply_assignment",
    "check_assignment",
    "f_score",
    "horizon_f_score",
    "imbalance",
    "margins",
    "PRESETS",
    "CostModel",
    "DispatchProblem",
    "Evaluation",
    "basic_lower_bound",
    "check_shares",
    "evaluate",
    "logical_to_physical",
    "tile_count",
    "build_dispatch_milp",
    "build_token_lp",
    "BackendUnavailableError",
    "InfeasibleSharesError",
    "InvalidInputError",
    "WriteError",
    "InvalidOptionError",
    "StragglerError",
    "ideal_throughput_gain",
    "imbalance_ratio",
    "layer_balance",
    "mean_over_max",
    "sglang_balancedness",
    "trtllm_imbalance_ratio",
    "vllm_balancedness",
    "MilpModel",
    "RowBuilder",
    "DispatchResult",
    "RoutingResult",
    "Status",
    "worst_status",
]
