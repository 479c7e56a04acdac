"""The policies production deploys, one interface each (registered by name on import)."""

from . import (
    llep,  # noqa: F401
    metro,  # noqa: F401
    moonep,  # noqa: F401
    static,  # noqa: F401
    token_lp,  # noqa: F401
    uniform,  # noqa: F401
)
from .eplb import rebalance_experts

__all__: list[str] = ["rebalance_experts"]
