"""Algorithms: the HiGHS backend, exact methods, Numba heuristics, and the entry points.

``from straggler.solvers import solve_dispatch, route_batch``.
"""

from .dispatch.bounds import certified_lower_bound
from .dispatch.calibration import CalibrationResult, fit_cost_model
from .dispatch.exact import solve_token_lp
from .dispatch.method import LayerSolution
from .dispatch.milp import MilpDispatch
from .dispatch.registry import dispatch_methods, register_dispatch_method
from .dispatch.round_robin import RoundRobin, a3_bound, round_robin_shares
from .dispatch.semi_matching import SemiMatching, semi_matching
from .dispatch.solve import DEFAULT_METHOD, solve_dispatch
from .dispatch.tempo import ExactTokenLP, Tempo, token_lp_fast
from .dispatch.topology import TopologySplit, topology_split
from .highs import MilpSolution, solve_milp
from .placement.place import place_experts
from .routing.policy import routing_policy
from .routing.registry import (
    DEFAULT_POLICY,
    get_routing_policy,
    register_routing_policy,
    routing_policies,
)
from .routing.route import project_loads, route_batch

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
