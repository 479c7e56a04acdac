"""The DP routers people deploy as small frozen objects: each :class:`Router` holds a
policy's options, and calling it routes one tick through
:func:`straggler.solvers.route_batch` and returns its
:class:`~straggler.formulations.RoutingResult`. What each upstream router does, and which
upstream file and change each version follows, is written beside its kernel, in
``straggler.baselines.routing``: ``sglang`` (``round_robin``, ``jsq``, ``jsq_requests``,
``p2c``, ``follow_bootstrap_room``), ``vllm``, ``trtllm`` (``trtllm``, ``trtllm_balance``),
``dynamo``, ``random``. The objects call the entry point, so they sit with it, above the
baselines.

Every router applies its upstream's local update after each placement unless built with
``optimistic=False`` (the stale-metric behaviour that sent whole bursts to one rank).

Examples
--------
>>> ROUTERS["jsq"]([8, 1], [0, 4], [1, 1]).assignment.tolist()
[0, 1]
>>> Router(policy="vllm", version="legacy")([1], [0, 0], [1, 1], n_running=[6, 0],
...                                          n_waiting=[0, 2]).assignment.tolist()
[0]
"""

from __future__ import annotations

from dataclasses import dataclass

from ...formulations.results import RoutingResult
from .registry import get_routing_policy
from .route import route_batch

__all__ = ["Router", "ROUTERS", "BASELINE_POLICIES"]

BASELINE_POLICIES = (
    "round_robin",
    "random",
    "jsq",
    "jsq_requests",
    "vllm",
    "p2c",
    "trtllm",
    "trtllm_balance",
    "follow_bootstrap_room",
    "dynamo",
)


@dataclass(frozen=True, kw_only=True)
class Router:
    """A routing policy with fixed options.

    Parameters
    ----------
    policy : str
        A registered routing policy (:func:`straggler.solvers.routing_policies`).
    version : str, optional
        The upstream version of a versioned baseline (default: its current one).
    optimistic : bool
        Optimistic local update after each placement (default True).
    r_max, s_greedy, alpha, beta, gamma
        BR-0/BR-H options (passed only to the policies that accept them).

    Other options (``kv_weight``, ``block_size``, ``timeout_iters``, ...) are passed per call.

    Examples
    --------
    >>> ROUTERS["jsq"]([8, 1], [0, 4], [1, 1]).assignment.tolist()
    [0, 1]
    >>> Router(policy="jsq", optimistic=False)([8, 1], [0, 4], [2, 2]).assignment.tolist()
    [0, 0]
    """

    policy: str
    version: str | None = None
    optimistic: bool = True
    r_max: int = 4
    s_greedy: float | None = None
    alpha: float = 1.0
    beta: float | None = None
    gamma: float = 1.0

    def __call__(self, prefill_lengths, loads, free_slots, *, rng=None, **params) -> RoutingResult:
        accepted = get_routing_policy(self.policy).options
        mine = dict(
            r_max=self.r_max,
            s_greedy=self.s_greedy,
            alpha=self.alpha,
            beta=self.beta,
            gamma=self.gamma,
            optimistic=self.optimistic,
            version=self.version,
        )
        # a version given to a policy without versions reaches route_batch, which refuses it
        mine = {k: v for k, v in mine.items() if k in accepted or (k == "version" and v)}
        return route_batch(
            prefill_lengths, loads, free_slots, policy=self.policy, rng=rng, **mine, **params
        )


#: One default router per baseline policy.
ROUTERS = {name: Router(policy=name) for name in BASELINE_POLICIES}
