"""Algorithms: the HiGHS backend, exact methods, Numba heuristics, and the entry points.

``from straggler.solvers import solve_dispatch, route_batch``.
"""

from .bounds import certified_lower_bound
from .calibration import CalibrationResult, fit_cost_model
from .dispatch import DEFAULT_METHOD, solve_dispatch
from .exact import MilpDispatch, solve_token_lp
from .highs import MilpSolution, solve_milp
from .placement import place_experts
from .registry import LayerSolution, dispatch_methods, register_dispatch_method
from .round_robin import RoundRobin, a3_bound, round_robin_shares
from .routing import project_loads, route_batch
from .routing_registry import (
    DEFAULT_POLICY,
    get_routing_policy,
    register_routing_policy,
    routing_policies,
    routing_policy,
)
from .semi_matching import SemiMatching, semi_matching
from .tempo import ExactTokenLP, Tempo, token_lp_fast
from .topology import TopologySplit, topology_split

__all__ = [
    "CalibrationResult",
    "fit_cost_model",
    "DEFAULT_POLICY",
    "routing_policies",
    "get_routing_policy",
    "register_routing_policy",
    "routing_policy",
    "project_loads",
    "route_batch",
    "certified_lower_bound",
    "DEFAULT_METHOD",
    "solve_dispatch",
    "MilpDispatch",
    "solve_token_lp",
    "MilpSolution",
    "solve_milp",
    "LayerSolution",
    "dispatch_methods",
    "register_dispatch_method",
    "RoundRobin",
    "a3_bound",
    "round_robin_shares",
    "SemiMatching",
    "semi_matching",
    "Tempo",
    "ExactTokenLP",
    "token_lp_fast",
    "place_experts",
    "TopologySplit",
    "topology_split",
]
