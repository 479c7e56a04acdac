"""The policies production deploys, each pinned to its upstream: the EP dispatch baselines
(one module per system) and the DP routers (``sglang_routers``, ``vllm_router``,
``trtllm_routers``, ``dynamo_router``, ``random_router``; :mod:`.routers` wraps them as
callable objects). :mod:`.tables` names them for the entry points; importing a module
registers nothing."""

from ..solvers.placement.eplb import rebalance_experts
from .dispatch.tokens import TokenLayout, token_layout
from .placement.flashlb import flashlb_rebalance

__all__: list[str] = [
    "rebalance_experts",
    "flashlb_rebalance",
    "TokenLayout",
    "token_layout",
]
