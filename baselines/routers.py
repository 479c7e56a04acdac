"""The DP routers people deploy, one interface each (ANCHORS.md "DP routers").

Each router is a small frozen object of options; calling it routes one tick through
:func:`straggler.solvers.route_batch` and returns its
:class:`~straggler.formulations.RoutingResult`. The Numba kernels (and their plain-Python
references) live in :mod:`straggler.solvers._routing_kernels` so that the jitted simulator can
call them by id; the routing registry (:mod:`straggler.solvers.routing_registry`) names them.
These are routing policies, not dispatch methods: they are deliberately not in the dispatch
registry.

=================  ===============================================================  =========
name               rule (all: only replicas with a free slot; pool order)           source
=================  ===============================================================  =========
``round_robin``    next replica in cyclic order from a cursor                        SGLang
``random``         uniform replica (MINSTD stream from ``rng``)                      common
``jsq``            fewest tokens, then fewest requests, then lowest index            SGLang
                   (``total_tokens``)
``jsq_requests``   fewest running + waiting requests, then lowest index              SGLang
                   (``total_requests``)
``vllm``           lowest ``4*waiting + running``, lowest index; ``waiting += 1``    vLLM DPLB
``p2c``            two distinct random replicas, fewer tokens wins, ties to first    SGLang
                                                                                     gateway
``trtllm``         longest prompt first; min-heap on ``(tokens, requests, rank)``;   TRT-LLM
                   per-rank cap ``max(ceil((sum active + n_new)/G), max active)``    attn-DP
=================  ===============================================================  =========

Every router applies the optimistic local update after each placement unless built with
``optimistic=False`` (the stale-metric behaviour that sent whole bursts to one rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..formulations.results import RoutingResult
from ..solvers.routing import route_batch
from ..solvers.routing_registry import get_routing_policy

__all__ = ["Router", "ROUTERS", "BASELINE_POLICIES"]

BASELINE_POLICIES = ("round_robin", "random", "jsq", "jsq_requests", "vllm", "p2c", "trtllm")


@dataclass(frozen=True, kw_only=True)
class Router:
    """A routing policy with fixed options.

    Parameters
    ----------
    policy : str
        A registered routing policy (:func:`straggler.solvers.routing_policies`).
    optimistic : bool
        Optimistic local update after each placement (default True).
    r_max, s_greedy, alpha, beta, gamma
        BR-0/BR-H options (passed only to the policies that accept them).

    Examples
    --------
    >>> ROUTERS["jsq"]([8, 1], [0, 4], [1, 1]).assignment.tolist()
    [0, 1]
    >>> Router(policy="jsq", optimistic=False)([8, 1], [0, 4], [2, 2]).assignment.tolist()
    [0, 0]
    """

    policy: str
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
        )
        mine = {k: v for k, v in mine.items() if k in accepted}
        return route_batch(
            prefill_lengths, loads, free_slots, policy=self.policy, rng=rng, **mine, **params
        )


#: One default router per baseline policy.
ROUTERS = {name: Router(policy=name) for name in BASELINE_POLICIES}
