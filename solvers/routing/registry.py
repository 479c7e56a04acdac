"""The routing policies by name: the literal table :data:`ROUTING_POLICIES` (BalanceRoute's
policies beside the upstream routers, each imported explicitly from the module that defines
it; importing a module registers nothing) and the lookup ``route_batch``, ``simulate``, the
command and the benchmarks use, plus any policy a user registers at run time
(:func:`register_routing_policy`).

The table sees the baselines, so this module, like :func:`~straggler.solvers.route_batch`,
sits above them; a policy is defined with :mod:`straggler.solvers.routing.policy`, below them.

Adding a policy: its kernel, reference, options, memory and ``routing_policy(...)`` in one
module, and one line in the table.
"""

from __future__ import annotations

import numpy as np

from ...baselines.routing import dynamo as dynamo_router
from ...baselines.routing import random as random_router
from ...baselines.routing import sglang as sglang_routers
from ...baselines.routing import trtllm as trtllm_routers
from ...baselines.routing import vllm as vllm_router
from ...formulations.errors import InvalidOptionError, param_error
from ...formulations.validation import describe
from . import _balanceroute
from ._core import RouterOptions
from .policy import RoutingPolicy, resolve_options

__all__ = [
    "ROUTING_POLICIES",
    "DEFAULT_POLICY",
    "register_routing_policy",
    "routing_policies",
    "get_routing_policy",
    "router_options",
]

#: What ``route_batch`` and ``simulate`` use when no policy is given.
DEFAULT_POLICY = "brs"

#: Routing policy name -> :class:`~straggler.solvers.routing.policy.RoutingPolicy`.
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

#: Policies registered at run time (:func:`register_routing_policy`), beside the table.
_USER: dict[str, RoutingPolicy] = {}


def register_routing_policy(policy: RoutingPolicy) -> RoutingPolicy:
    """Make ``policy`` (from :func:`routing_policy`) known by its name for this process, beside
    the library's table; a name already known raises ``ValueError``."""
    if not isinstance(policy, RoutingPolicy):
        raise TypeError("register_routing_policy takes a RoutingPolicy (see routing_policy)")
    if policy.name in ROUTING_POLICIES or policy.name in _USER:
        raise ValueError(f"routing policy {policy.name!r} registered twice")
    _USER[policy.name] = policy
    return policy


def routing_policies() -> list[str]:
    """Names of every routing policy (the table's and those registered at run time), sorted.

    Examples
    --------
    >>> "jsq" in routing_policies() and DEFAULT_POLICY in routing_policies()
    True
    """
    return sorted([*ROUTING_POLICIES, *_USER])


def get_routing_policy(name, func: str = "route_batch") -> RoutingPolicy:
    """The policy named ``name``; :class:`InvalidOptionError` naming ``policy`` if none."""
    pol = ROUTING_POLICIES.get(name) if isinstance(name, str) else None
    if pol is None and isinstance(name, str):
        pol = _USER.get(name)
    if pol is None:
        raise param_error(
            "policy", func, f"one of {routing_policies()}", describe(name), InvalidOptionError
        )
    return pol


def router_options(
    policy, n_replicas: int, horizon: int = 0, *, func: str = "router_options", **options
) -> tuple[RouterOptions, np.ndarray]:
    """``(RouterOptions, carry)`` of ``policy`` (a name or a :class:`RoutingPolicy`) for
    ``options`` (the others at their defaults), as its kernel reads them: for calling a kernel
    directly. ``version`` is a name of the policy's versions.

    Examples
    --------
    >>> o, c = router_options("round_robin", 8, cursor=3)
    >>> o.values.tolist(), c.tolist()
    ([], [3])
    """
    if not isinstance(policy, RoutingPolicy):
        policy = get_routing_policy(policy, func)
    return resolve_options(policy, options, n_replicas, horizon, func)[:2]
