"""The policies production deploys, one interface each (registered by name on import)."""

from ..solvers.eplb import rebalance_experts
from . import (
    dynamic,  # noqa: F401
    llep,  # noqa: F401
    lplb,  # noqa: F401
    metro,  # noqa: F401
    moonep,  # noqa: F401
    static,  # noqa: F401
    token_lp,  # noqa: F401
    uniform,  # noqa: F401
    vllm_ep,  # noqa: F401
)
from .flashlb import flashlb_rebalance
from .tokens import TokenLayout, token_layout

__all__: list[str] = [
    "rebalance_experts",
    "flashlb_rebalance",
    "TokenLayout",
    "token_layout",
]
