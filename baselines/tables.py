"""The name tables of the library's two entry points: which name means which policy.

:data:`ROUTING_POLICIES` is what :func:`straggler.solvers.route_batch` and
:func:`straggler.sim.simulate` accept as ``policy``; :data:`DISPATCH_METHODS` what
:func:`straggler.solvers.solve_dispatch` accepts as ``method``. Each entry is imported
explicitly from the module that defines it (as networkx's ``maxflow.py`` lists its flow
functions); importing a module registers nothing.

The tables list this library's methods (``straggler.solvers``) beside the upstream baselines
(``straggler.baselines``), so they live here, the higher layer; the registries of ``solvers``
read them on first use (:mod:`straggler.solvers.registry`,
:mod:`straggler.solvers.routing_registry`).
"""

from __future__ import annotations

from ..solvers import _balanceroute
from ..solvers.exact import MilpDispatch
from ..solvers.round_robin import RoundRobin
from ..solvers.semi_matching import SemiMatching
from ..solvers.tempo import Tempo
from . import dynamo_router, random_router, sglang_routers, trtllm_routers, vllm_router
from .dynamic import SGLangDynamic
from .llep import LLEP
from .lplb import LPLB
from .metro import Metro
from .moonep import MoonEP
from .static import StaticDispatch
from .token_lp import SGLangLP, TokenLP
from .uniform import UniformSplit
from .vllm_ep import VllmEP

__all__ = ["ROUTING_POLICIES", "DISPATCH_METHODS"]

#: Routing policy name -> :class:`~straggler.solvers.routing_registry.RoutingPolicy`.
ROUTING_POLICIES = {
    "br0": _balanceroute.BR0,
    "brh": _balanceroute.BRH,
    "brs": _balanceroute.BRS,
    "round_robin": sglang_routers.ROUND_ROBIN,
    "jsq": sglang_routers.JSQ,
    "jsq_requests": sglang_routers.JSQ_REQUESTS,
    "p2c": sglang_routers.P2C,
    "follow_bootstrap_room": sglang_routers.FOLLOW_BOOTSTRAP_ROOM,
    "vllm": vllm_router.VLLM,
    "trtllm": trtllm_routers.TRTLLM,
    "trtllm_balance": trtllm_routers.TRTLLM_BALANCE,
    "dynamo": dynamo_router.DYNAMO,
    "random": random_router.RANDOM,
}

#: Dispatch method name -> its class (a frozen dataclass of hyperparameters with ``solve``).
DISPATCH_METHODS = {
    "tempo": Tempo,
    "milp": MilpDispatch,
    "semi_matching": SemiMatching,
    "round_robin": RoundRobin,
    "token_lp": TokenLP,
    "sglang_lp": SGLangLP,
    "uniform": UniformSplit,
    "static": StaticDispatch,
    "sglang_dynamic": SGLangDynamic,
    "llep": LLEP,
    "lplb": LPLB,
    "metro": Metro,
    "moonep": MoonEP,
    "vllm_ep": VllmEP,
}
