"""The name tables of the library's two entry points: which name means which policy.

:data:`ROUTING_POLICIES` is what :func:`straggler.solvers.route_batch` and
:func:`straggler.sim.simulate` accept as ``policy``; :data:`DISPATCH_METHODS` what
:func:`straggler.solvers.solve_dispatch` accepts as ``method``; :data:`REBALANCE_POLICIES`
what a deployment's ``rebalance`` accepts (``get_rebalance_policy`` of
:mod:`straggler.solvers.placement.rebalance.registry`). Each entry is imported explicitly
from the module that defines it (as networkx's ``maxflow.py`` lists its flow functions);
importing a module registers nothing.

The tables list this library's methods (``straggler.solvers``) beside the upstream baselines
(``straggler.baselines``), so they live here, the higher layer; the registries of ``solvers``
read them on first use (:mod:`straggler.solvers.dispatch.registry`,
:mod:`straggler.solvers.routing.registry`).
"""

from __future__ import annotations

from ..solvers.dispatch.exact import MilpDispatch
from ..solvers.dispatch.round_robin import RoundRobin
from ..solvers.dispatch.semi_matching import SemiMatching
from ..solvers.dispatch.tempo import Tempo
from ..solvers.placement.rebalance.auto import Auto
from ..solvers.placement.rebalance.every import Every
from ..solvers.placement.rebalance.never import Never
from ..solvers.routing import _balanceroute
from .dispatch.dynamic import SGLangDynamic
from .dispatch.llep import LLEP
from .dispatch.lplb import LPLB
from .dispatch.metro import Metro
from .dispatch.moonep import MoonEP
from .dispatch.static import StaticDispatch
from .dispatch.token_lp import SGLangLP, TokenLP
from .dispatch.uniform import UniformSplit
from .dispatch.vllm_ep import VllmEP
from .placement.sglang_clock import SGLangClock
from .placement.vllm_clock import VllmClock
from .routing import dynamo as dynamo_router
from .routing import random as random_router
from .routing import sglang as sglang_routers
from .routing import trtllm as trtllm_routers
from .routing import vllm as vllm_router

__all__ = ["ROUTING_POLICIES", "DISPATCH_METHODS", "REBALANCE_POLICIES"]

#: Routing policy name -> :class:`~straggler.solvers.routing.registry.RoutingPolicy`.
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

#: Rebalance policy name -> its class (a frozen dataclass of hyperparameters with ``plan``).
REBALANCE_POLICIES = {
    "never": Never,
    "every": Every,
    "auto": Auto,
    "vllm": VllmClock,
    "sglang": SGLangClock,
}
