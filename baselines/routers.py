"""The DP routers people deploy, one interface each, each pinned to its upstream.

Each router is a small frozen object of options; calling it routes one tick through
:func:`straggler.solvers.route_batch` and returns its
:class:`~straggler.formulations.RoutingResult`. The Numba kernels (and their plain-Python
references) live in :mod:`straggler.solvers._routing_kernels` so that the jitted simulator can
call them by id; the routing registry (:mod:`straggler.solvers.routing_registry`) names them
and lists each one's versions with the upstream change behind it
(``get_routing_policy(name).versions`` / ``.version_sources``). These are routing policies,
not dispatch methods: they are deliberately not in the dispatch registry.

Upstreams, as read in their code (ANCHORS.md "Upstream versions"); the first version listed is
the default (``version=...`` selects another):

``round_robin``
    SGLang ``python/sglang/srt/managers/data_parallel_controller.py``,
    ``round_robin_scheduler``: a counter over the workers. Here the cycle skips replicas
    without a free slot (the central-pool model), starting from ``cursor``.
``random``
    A uniform replica (common baseline; no upstream).
``jsq``
    SGLang DP controller ``total_tokens`` (``DPBudget.dispatch``): the first minimum of
    ``(num_total_tokens, total_requests)`` where ``num_total_tokens`` is KV in use plus the
    waiting queue's lengths (``loads + waiting_tokens``) and ``total_requests`` running +
    waiting. ``"prompt"`` (sglang #22614, 2026-04): after a pick the rank's tokens grow by the
    prompt length and its requests by 1; ``"plus_one"`` (#16258, 2026-01, which renamed
    ``minimum_tokens`` to ``total_tokens``): requests only, so a burst between two load reports
    lands on one rank. Not modelled: the pending-dispatch re-add after a refresh (the
    simulator's ``stale`` with the optimistic update plays its part).
``jsq_requests``
    SGLang ``total_requests`` (#16258, formerly ``shortest_queue``): first minimum of running
    + waiting, +1 after a pick. The older ``shortest_queue`` budget queue is not modelled.
``vllm``
    vLLM ``vllm/v1/engine/core_client.py``, ``DPLBAsyncMPClient.get_core_engine_for_request``:
    the first strict minimum scanning from ``eng_start_index``, then ``waiting +=
    client_count`` (one front-end: +1). ``"current"``: the start rotates after every pick
    (#47420, 2026-07-02) and the score is ``max(client_count * inflight, waiting + running) +
    waiting * 6 * max(0, kv_usage - 0.5)`` (#49204, 2026-07-20); ``"rotate_4w"``: #47420
    alone (``4 * waiting + running``, rotating start); ``"legacy"``: ``4 * waiting +
    running`` from the fixed start 0. The front-end's in-flight count is taken as the view's
    running + waiting plus this tick's picks (exact with ``stale = 0``; one front-end).
``p2c``
    The SGLang model gateway's ``power_of_two`` (``sgl-router/src/policies/power_of_two.rs``,
    now ``smg-project/smg model_gateway/src/policies``): two distinct workers (``a`` uniform,
    ``b = (a + 1 + u) % k``), ``b`` only when strictly lighter. ``"expected_wait"`` (smg #2187,
    2026-08-18): ``(queued tokens + tokens sent since the poll) / throughput + 0.15 s *
    u / (1 - u)`` with ``u`` the KV usage (``throughput`` 2000 tok/s, upstream's fallback when
    the engine reports none; ``kv_weight`` 0.15 s); ``"token_usage"`` (smg #554, 2026-02-27):
    the polled KV usage ratio; ``"tokens"`` (the sgl-router load monitor, 2025): the worker's
    token load; ``"inflight"`` (the first sgl-router policy): the router's in-flight requests.
    Only the versions whose upstream credits its own dispatches between polls (expected_wait,
    inflight) update their metric within a tick.
``trtllm``
    TensorRT-LLM ``tensorrt_llm/_torch/pyexecutor`` ``DefaultADPRouter``: new requests longest
    prompt first onto a min-heap of ``(num_active_tokens, num_active_requests, rank)``, where
    ``num_active_tokens`` is the sum of the active requests' ORIGINAL prompt lengths
    (``py_orig_prompt_len``; ``prompt_tokens + waiting_tokens`` here), not resident KV; a rank
    leaves the heap at ``expected_num_active_requests = max(ceil((sum active + n_new) / G),
    max active)``.
``trtllm_balance``
    ``trtllm`` plus ``attention_dp_config.enable_balance`` (``PyExecutor._balance_adp_requests``,
    TensorRT-LLM #6061, 2025-07-15; defaults from ``AttentionDpConfig``): new context
    requests are held back until every rank has a free slot and a new request (at most
    ``timeout_iters`` = 50 ticks, and not when some rank runs nothing), then for
    ``batching_wait_iters`` = 10 more ticks while every rank is decoding. Deviations: held
    requests return to the pool and are re-routed at the next tick (upstream keeps them on
    their rank), the counters advance only at ticks with a non-empty pool, and the shorter
    wait for an under-occupied rank (an environment-gated change of TensorRT-LLM #17700,
    2026-08) is not modelled. The hold-back pays off where context phases share the decode
    step (aggregated serving: ``simulate(ctx_cost=...)``).
``follow_bootstrap_room``
    SGLang ``follow_bootstrap_room_scheduler`` (PD disaggregation): rank = ``bootstrap_room %
    dp_size`` (``pool_key``), whatever the load; a request whose rank is full waits for it.
    The simulator draws each request's room uniformly from ``[0, 2**63)`` (SGLang's mini_lb
    draws ``random.randint(0, 2**63 - 1)``), seeded by ``simulate(seed=)``.
``dynamo``
    Dynamo ``lib/kv-router/src/scheduling/selector.rs`` (``DefaultWorkerSelector``,
    temperature 0): the lowest ``overlap_weight * (isl - cached blocks * block_size) /
    block_size + decode_blocks``, ``decode_blocks`` = the worker's active tokens / block size
    + the request's own blocks; ties to a uniform tied worker (seeded). Cached blocks come from
    ``pool_cached`` (the simulator's per-replica prefix caches on traces with block hashes).
    Deviation: active blocks are counted as tokens / block size, without prefix sharing among
    the active sequences.

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

from ..formulations.results import RoutingResult
from ..solvers.routing import route_batch
from ..solvers.routing_registry import get_routing_policy

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
