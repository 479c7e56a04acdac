"""The policies production deploys, each pinned to its upstream: the EP dispatch baselines
(``straggler.baselines.dispatch``, one module per system), EPLB and FlashLB placement, and
the DP routers (``straggler.baselines.routing``: ``sglang``, ``vllm``, ``trtllm``, ``dynamo``,
``random``). They build on the algorithms of ``straggler.solvers``, never on its entry points;
the name tables (``straggler.solvers.dispatch.registry``,
``straggler.solvers.routing.registry``) list them above, and importing a module registers
nothing."""

from ..solvers.placement.eplb import rebalance_experts
from .dispatch.tokens import TokenLayout, token_layout
from .placement.flashlb import flashlb_rebalance

__all__: list[str] = [
    "rebalance_experts",
    "flashlb_rebalance",
    "TokenLayout",
    "token_layout",
]
