"""Registry of routing policies by stable name: one place where a policy is written down.

:func:`~straggler.solvers.route_batch`, :func:`~straggler.sim.simulate`, the benchmarks and the
``straggler-simulate`` command all read this table; nothing else lists the policies. A policy is
a :class:`RoutingPolicy`: its Numba kernel and the plain-Python reference beside it (both in
:mod:`straggler.solvers._routing_kernels`), a stable integer id (the jitted simulator calls the
kernel by id through ``route_tick_kernel``), the options it accepts (:data:`OPTIONS`), and its
documentation (a one-line rule and the upstream system or paper section it follows).

The kernel interface
--------------------
Every kernel has one signature, ``kernel(pool, reps, params, carry, seed) -> (assignment,
carry_out)``, where ``reps`` is a :class:`ReplicaState` and ``pool`` a :class:`PoolState`
(NamedTuples of arrays; every field is always present, filled by ``route_batch`` from its
keyword arguments and by the simulator from its state):

* ``ReplicaState`` (per replica, length ``G``): ``loads`` float64 ``(G, H+1)`` (column 0:
  resident KV tokens; columns 1..H: projected loads, BR-H), ``free_slots`` int64,
  ``n_running`` int64, ``n_waiting`` int64 (requests queued inside the replica's engine; 0 in
  the simulator's central-pool model), ``prompt_tokens`` float64 (sum of the running requests'
  original prompt lengths: TensorRT-LLM's metric), ``waiting_tokens`` float64 (prompt tokens of
  the ``n_waiting`` requests: SGLang adds them), ``kv_usage`` float64 (fraction of the KV
  capacity in use: vLLM's newest score), ``kv_capacity`` float64 (tokens, ``inf`` when
  unbounded).
* ``PoolState`` (per visible pool request, length ``n``, oldest first): ``prefill`` float64
  (tokens it brings), ``wait`` int64 (routing ticks already spent in the pool), ``key`` int64 (a
  stable request id, e.g. SGLang's bootstrap room), ``cached`` float64 ``(n, G)`` (prompt
  tokens already in replica ``g``'s prefix cache) or ``(0, G)`` when unknown.
* ``params`` float64: the options at the ``P_*`` indices of the kernels module (BR-H may append
  ``H+1`` presence weights); ``carry`` float64 ``(N_CARRY,)``: the policy's memory from its
  previous tick (round-robin's cursor at ``C_CURSOR``, vLLM's scan start at ``C_VLLM_START``,
  TensorRT-LLM's hold-back counters at ``C_ADP_WAIT``/``C_ADP_BATCH``), returned updated as
  ``carry_out``; ``seed`` int64: the tick's random seed (random, p2c, dynamo's ties).

Kernels never mutate their inputs and only place a request on a replica with a free slot.

Adding a policy
---------------
1. In :mod:`straggler.solvers._routing_kernels`: ``<name>_kernel`` (``@njit(**NJIT)``) and
   ``<name>_reference`` right below it (plain Python, sharing no helper with the kernel), a new
   ``ID_<NAME>`` constant and one ``elif`` branch in ``route_tick_kernel``; new options take new
   ``P_*`` indices (raise ``N_PARAMS``), new memory new ``C_*`` indices (within ``N_CARRY``).
2. Here: its options in :data:`OPTIONS` (if new) and one :func:`register_routing_policy` call at
   the bottom of this module. A baseline with upstream versions passes ``versions=((name,
   upstream change), ...)``, the current behaviour first: it then accepts ``version=`` and its
   kernel reads the version's index at ``params[P_VERSION]``. ``prefix_cache=True`` marks a
   policy that reads ``PoolState.cached`` (the simulator then shows it the replicas' caches).
3. Nothing else: ``route_batch``, ``simulate``, the command and the benchmarks find it by name;
   ``tests/test_routing.py`` runs every registered policy through kernel == py_func ==
   reference and the independent checker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..formulations.errors import InvalidOptionError, param_error
from ..formulations.validation import (
    check_array,
    check_bool,
    check_choice,
    check_int,
    check_options,
    check_real,
    describe,
)
from . import _routing_kernels as K
from ._routing_kernels import PoolState, ReplicaState

__all__ = [
    "ReplicaState",
    "PoolState",
    "PolicyOption",
    "RoutingPolicy",
    "OPTIONS",
    "DEFAULT_POLICY",
    "register_routing_policy",
    "routing_policies",
    "get_routing_policy",
    "resolve_options",
    "default_s_greedy",
    "default_age_window",
]

#: What ``route_batch`` and ``simulate`` use when no policy is given.
DEFAULT_POLICY = "brs"

_POLICIES: dict[str, RoutingPolicy] = {}
_BIG = 1e300  # alpha and beta must be finite


def default_s_greedy(n_replicas: int, r_max: int) -> int:
    """``S_greedy = G * R_max`` (the paper gives no value).

    Below it each replica has on average at most ``R_max`` free slots, so one Stage-2 pop per
    replica (a subset of at most ``R_max`` requests) can use every slot; this is where slots
    are scarce and each one should be chosen by subset search. Above it, margins are filled
    greedily (Stage 1) at O(G + log n) per placement.

    Examples
    --------
    >>> default_s_greedy(16, 4)
    64
    """
    return int(n_replicas) * int(r_max)


def default_age_window(n_replicas: int) -> int:
    """BR-S's default age window ``A = ceil(4096 / G)`` ticks (512 at G = 8, 128 at G = 32).

    Arrivals per tick grow with ``G`` at a given load, so the window holds about the same
    number of requests at every cluster size, while the extra pool wait it allows (at most
    ``A`` ticks past the requests that entered with it) shrinks as the queueing tail does.

    Examples
    --------
    >>> default_age_window(8), default_age_window(32), default_age_window(1)
    (512, 128, 4096)
    """
    return -(-4096 // int(n_replicas))


@dataclass(frozen=True)
class PolicyOption:
    """One keyword option of one or more policies.

    ``check(value, func)`` returns the normalized value or raises naming the option;
    ``default`` is a value or ``default(G, resolved)`` of the number of replicas and the
    options resolved before it (in :data:`OPTIONS` order); ``slot`` says where it goes:
    ``("params", P_*)``, ``("carry", C_*)`` or ``("tail",)`` (an array appended to params).
    A value of ``None`` means "the default".
    """

    name: str
    check: Callable[[Any, str], Any]
    default: Any
    slot: tuple
    doc: str


def _r_max(v, func):
    return check_int(v, "r_max", func, lo=1, hi=16)


def _s_greedy(v, func):
    return check_real(v, "s_greedy", func, lo=0, finite=False)


def _alpha(v, func):
    return check_real(v, "alpha", func, lo=0, hi=_BIG, lo_open=True)


def _beta(v, func):
    return check_real(v, "beta", func, lo=0, hi=_BIG)


def _gamma(v, func):
    return check_real(v, "gamma", func, lo=0, hi=1, lo_open=True)


def _optimistic(v, func):
    return check_bool(v, "optimistic", func)


def _cursor(v, func):
    return check_int(v, "cursor", func, lo=0, hi=2**52)


def _age_window(v, func):
    return check_int(v, "age_window", func, lo=0, hi=2**40)


def _window(v, func):
    return check_int(v, "window", func, lo=0, hi=2**20)


def _patience(v, func):
    return check_int(v, "patience", func, lo=0, hi=2**40)


def _age_fraction(v, func):
    return check_real(v, "age_fraction", func, lo=0, hi=1)


def _safe(v, func):
    return check_bool(v, "safe", func)


def _new_presence(v, func):
    return check_array(v, "new_presence", func, kind="real", lo=0, hi=1)


def _kv_weight(v, func):
    return check_real(v, "kv_weight", func, lo=0)


def _throughput(v, func):
    return check_real(v, "throughput", func, lo=0, lo_open=True)


def _block_size(v, func):
    return check_int(v, "block_size", func, lo=1, hi=2**20)


def _overlap_weight(v, func):
    return check_real(v, "overlap_weight", func, lo=0)


def _timeout_iters(v, func):
    return check_int(v, "timeout_iters", func, lo=0, hi=2**40)


def _batching_wait_iters(v, func):
    return check_int(v, "batching_wait_iters", func, lo=0, hi=2**40)


#: Every option a registered policy may accept, in resolution order.
OPTIONS: dict[str, PolicyOption] = {
    o.name: o
    for o in (
        PolicyOption("r_max", _r_max, 4, ("params", K.P_R_MAX), "Stage-2 candidates R_max, 1..16"),
        PolicyOption(
            "s_greedy",
            _s_greedy,
            lambda G, r: float(default_s_greedy(G, r["r_max"])),
            ("params", K.P_S_GREEDY),
            "Stage 1 runs while the total free slots exceed it (default G * r_max)",
        ),
        PolicyOption("alpha", _alpha, 1.0, ("params", K.P_ALPHA), "BR-H gain weight (> 0)"),
        PolicyOption(
            "beta",
            _beta,
            lambda G, r: float(G),
            ("params", K.P_BETA),
            "BR-H overflow weight (default G)",
        ),
        PolicyOption(
            "gamma", _gamma, 1.0, ("params", K.P_GAMMA), "BR-H discount per step, in (0, 1]"
        ),
        PolicyOption(
            "optimistic",
            _optimistic,
            True,
            ("params", K.P_OPTIMISTIC),
            "update the local copy of the metric after each placement",
        ),
        PolicyOption(
            "cursor", _cursor, 0, ("carry", K.C_CURSOR), "round-robin: the replica to try first"
        ),
        PolicyOption(
            "age_window",
            _age_window,
            lambda G, r: default_age_window(G),
            ("params", K.P_AGE_WINDOW),
            "BR-S: place a request only if it entered the pool at most this many ticks after "
            "the oldest request still waiting (the bound on overtaking)",
        ),
        PolicyOption(
            "window",
            _window,
            8,
            ("params", K.P_WINDOW),
            "BR-S: candidates per free slot (the window holds the k * S_tot oldest requests; "
            "0: no count limit)",
        ),
        PolicyOption(
            "patience",
            _patience,
            32,
            ("params", K.P_PATIENCE),
            "BR-S: route as JSQ unless some visible request has waited this many ticks (the "
            "cluster is saturated)",
        ),
        PolicyOption(
            "age_fraction",
            _age_fraction,
            0.1,
            ("params", K.P_AGE_FRACTION),
            "BR-S: the window spans this fraction of the oldest request's wait (at most "
            "age_window ticks)",
        ),
        PolicyOption(
            "safe",
            _safe,
            True,
            ("params", K.P_SAFE),
            "BR-S: keep JSQ's decision whenever it leaves no larger one-tick imbalance",
        ),
        PolicyOption(
            "new_presence",
            _new_presence,
            None,
            ("tail",),
            "BR-H: H+1 weights pi_h in [0, 1] of the new requests' presence (default none)",
        ),
        PolicyOption(
            "version",
            None,  # checked against the policy's own versions (resolve_options)
            None,
            ("params", K.P_VERSION),
            "baselines: the upstream version (RoutingPolicy.versions; default the current one)",
        ),
        PolicyOption(
            "kv_weight",
            _kv_weight,
            0.15,
            ("params", K.P_KV_WEIGHT),
            "p2c expected_wait: seconds of the KV barrier u/(1-u) (the gateway's 0.15)",
        ),
        PolicyOption(
            "throughput",
            _throughput,
            2000.0,
            ("params", K.P_THROUGHPUT),
            "p2c expected_wait: tokens/s that turn queued tokens into seconds (gateway: 2000)",
        ),
        PolicyOption(
            "block_size",
            _block_size,
            16,
            ("params", K.P_BLOCK_SIZE),
            "dynamo: KV block size in tokens (default 16)",
        ),
        PolicyOption(
            "overlap_weight",
            _overlap_weight,
            1.0,
            ("params", K.P_OVERLAP_WEIGHT),
            "dynamo: weight of the prefill blocks (kv_overlap_score_weight, default 1)",
        ),
        PolicyOption(
            "timeout_iters",
            _timeout_iters,
            50,
            ("params", K.P_TIMEOUT_ITERS),
            "trtllm_balance: ticks new requests wait for every rank to take some (default 50)",
        ),
        PolicyOption(
            "batching_wait_iters",
            _batching_wait_iters,
            10,
            ("params", K.P_BATCHING_WAIT_ITERS),
            "trtllm_balance: extra ticks of batching once every rank can take some (default 10)",
        ),
    )
}


@dataclass(frozen=True)
class RoutingPolicy:
    """A registered routing policy (see the module docstring)."""

    name: str
    policy_id: int
    kernel: Any
    reference: Callable
    options: tuple[str, ...]
    summary: str
    source: str
    horizon: bool = False
    """Reads projected loads ``loads[:, 1:]`` (the simulator builds them with a predictor)."""
    seeded: bool = False
    """Draws random numbers (``rng`` of ``route_batch``, ``seed`` of ``simulate``)."""
    staged: bool = False
    """BalanceRoute's two stages (``RoutingResult.stage`` is 1 or 2, not 0)."""
    versions: tuple[str, ...] = ()
    """Upstream versions (``version="..."``), the current one first."""
    version_sources: tuple[str, ...] = ()
    """For each version: the upstream change that introduced it and when."""
    prefix_cache: bool = False
    """Reads ``PoolState.cached`` (the simulator then tracks each replica's prefix cache)."""


def register_routing_policy(
    name: str,
    *,
    policy_id: int,
    kernel,
    reference: Callable,
    options: tuple[str, ...] = ("optimistic",),
    summary: str,
    source: str,
    horizon: bool = False,
    seeded: bool = False,
    staged: bool = False,
    versions: tuple[tuple[str, str], ...] = (),
    prefix_cache: bool = False,
) -> RoutingPolicy:
    """Register a policy under ``name`` (once; ids and names are unique).

    ``versions``: ``(name, upstream change)`` pairs, the current upstream behaviour first; the
    policy then accepts ``version=`` (its kernel reads the index at ``params[P_VERSION]``).
    """
    if versions:
        options = tuple(options) + ("version",)
    if name in _POLICIES:
        raise RuntimeError(f"routing policy {name!r} registered twice")
    if any(p.policy_id == policy_id for p in _POLICIES.values()):
        raise RuntimeError(f"routing policy id {policy_id} registered twice")
    unknown = [o for o in options if o not in OPTIONS]
    if unknown:
        raise RuntimeError(f"routing policy {name!r}: unknown option(s) {unknown}")
    pol = RoutingPolicy(
        name=name,
        policy_id=int(policy_id),
        kernel=kernel,
        reference=reference,
        options=tuple(o for o in OPTIONS if o in options),
        summary=summary,
        source=source,
        horizon=horizon,
        seeded=seeded,
        staged=staged,
        versions=tuple(v for v, _ in versions),
        version_sources=tuple(src for _, src in versions),
        prefix_cache=prefix_cache,
    )
    _POLICIES[name] = pol
    return pol


def routing_policies() -> list[str]:
    """Names of every registered routing policy, sorted.

    Examples
    --------
    >>> "jsq" in routing_policies() and DEFAULT_POLICY in routing_policies()
    True
    """
    return sorted(_POLICIES)


def get_routing_policy(name, func: str = "route_batch") -> RoutingPolicy:
    """The policy registered as ``name``; :class:`InvalidOptionError` naming ``policy`` if none."""
    if not isinstance(name, str) or name not in _POLICIES:
        raise param_error(
            "policy", func, f"one of {routing_policies()}", describe(name), InvalidOptionError
        )
    return _POLICIES[name]


def resolve_options(
    policy: RoutingPolicy, options: dict, n_replicas: int, horizon: int, func: str
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Validate ``options`` for ``policy``; return ``(params, carry, resolved)``.

    ``resolved`` maps each option of the policy to its value (defaults filled in). An option
    the policy does not accept raises :class:`InvalidOptionError` listing those it does;
    ``new_presence`` must have ``horizon + 1`` entries.

    Examples
    --------
    >>> p, c, r = resolve_options(get_routing_policy("br0"), {"r_max": 2}, 8, 0, "f")
    >>> p[:6].tolist(), r["s_greedy"]
    ([2.0, 16.0, 1.0, 8.0, 1.0, 1.0], 16.0)
    """
    if options:
        check_options(options, policy.options, f"{func} (policy {policy.name!r})")
    params = np.zeros(K.N_PARAMS)
    params[K.P_ALPHA] = params[K.P_GAMMA] = params[K.P_OPTIMISTIC] = 1.0
    params[K.P_BETA] = float(n_replicas)  # an option's default even where it is not one
    carry = np.zeros(K.N_CARRY)
    resolved: dict[str, Any] = {}
    tail = None
    for name in policy.options:
        opt = OPTIONS[name]
        v = options.get(name) if options else None
        if name == "version":  # one option, each policy's own choices
            v = policy.versions[0] if v is None else check_choice(v, name, func, policy.versions)
            resolved[name] = v
            params[opt.slot[1]] = float(policy.versions.index(v))
            continue
        if v is None:
            v = opt.default(n_replicas, resolved) if callable(opt.default) else opt.default
        if v is not None:
            v = opt.check(v, func)
        resolved[name] = v
        if v is None:
            continue
        if opt.slot[0] == "params":
            params[opt.slot[1]] = float(v)
        elif opt.slot[0] == "carry":
            carry[opt.slot[1]] = float(v)
        else:
            if v.shape != (horizon + 1,):
                raise param_error(
                    name,
                    func,
                    f"H+1 = {horizon + 1} numbers in [0, 1] (one per column of loads)",
                    f"shape {v.shape}",
                )
            tail = v
    if tail is not None:
        params = np.concatenate([params, tail])
    return params, carry, resolved


# ----------------------------------------------------------------------------------------
# The policies (ids are stable: the simulator's cached engine dispatches on them)

_BR = ("r_max", "s_greedy", "optimistic")
register_routing_policy(
    "br0",
    policy_id=K.ID_BR0,
    kernel=K.br0_kernel,
    reference=K.br0_reference,
    options=_BR,
    summary="BR-0: two stages on the F-score D - G*(D - m_g)_+ (most free slots first)",
    source="BalanceRoute (arXiv 2605.06113) 关键设计 1-2",
    staged=True,
)
register_routing_policy(
    "brh",
    policy_id=K.ID_BRH,
    kernel=K.brh_kernel,
    reference=K.brh_reference,
    options=_BR + ("alpha", "beta", "gamma", "new_presence"),
    summary="BR-H: BR-0's stages on the horizon F-score over projected loads",
    source="BalanceRoute (arXiv 2605.06113) 关键设计 3",
    horizon=True,
    staged=True,
)
_SGL_DPC = "sgl-project/sglang python/sglang/srt/managers/data_parallel_controller.py"
_VLLM_LB = "vllm-project/vllm vllm/v1/engine/core_client.py (DPLBAsyncMPClient)"
_SGL_GW = (
    "SGLang model gateway power_of_two (sgl-project/sglang sgl-router/src/policies/"
    "power_of_two.rs, now smg-project/smg model_gateway/src/policies/power_of_two.rs)"
)
_TRT_ADP = "NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor (DefaultADPRouter)"
register_routing_policy(
    "round_robin",
    policy_id=K.ID_ROUND_ROBIN,
    kernel=K.round_robin_kernel,
    reference=K.round_robin_reference,
    options=("cursor",),
    summary="next replica with a free slot in cyclic order from a cursor",
    source=f"{_SGL_DPC} round_robin_scheduler",
)
register_routing_policy(
    "random",
    policy_id=K.ID_RANDOM,
    kernel=K.random_kernel,
    reference=K.random_reference,
    options=(),
    summary="uniform replica among those with a free slot (MINSTD stream)",
    source="common baseline",
    seeded=True,
)
register_routing_policy(
    "jsq",
    policy_id=K.ID_JSQ,
    kernel=K.jsq_kernel,
    reference=K.jsq_reference,
    summary="fewest loads + waiting tokens, then fewest requests, then lowest index",
    source=f"{_SGL_DPC} total_tokens (DPBudget.dispatch)",
    versions=(
        ("prompt", "sglang #22614 (2026-04): +prompt length and +1 request after each pick"),
        ("plus_one", "sglang #16258 (2026-01, minimum_tokens renamed total_tokens): +1 only"),
    ),
)
register_routing_policy(
    "jsq_requests",
    policy_id=K.ID_JSQ_REQUESTS,
    kernel=K.jsq_requests_kernel,
    reference=K.jsq_requests_reference,
    summary="fewest running + waiting requests, then lowest index; +1 after each pick",
    source=f"{_SGL_DPC} total_requests (sglang #16258, 2026-01: shortest_queue renamed)",
)
register_routing_policy(
    "vllm",
    policy_id=K.ID_VLLM,
    kernel=K.vllm_kernel,
    reference=K.vllm_reference,
    summary="first strict minimum of vLLM's score scanning from a start index; waiting += 1",
    source=_VLLM_LB,
    versions=(
        (
            "current",
            "vllm #47420 (2026-07-02, start rotates after every pick) + #49204 (2026-07-20, "
            "max(inflight, waiting + running) + 6*waiting*max(0, kv_usage - 0.5))",
        ),
        ("rotate_4w", "vllm #47420 alone: 4*waiting + running, rotating start"),
        ("legacy", "before vllm #47420: 4*waiting + running from a fixed start (client 0)"),
    ),
)
register_routing_policy(
    "p2c",
    policy_id=K.ID_P2C,
    kernel=K.p2c_kernel,
    reference=K.p2c_reference,
    options=("optimistic", "kv_weight", "throughput"),
    summary="two distinct random replicas, the lower gateway metric wins, ties to the first",
    source=_SGL_GW,
    seeded=True,
    versions=(
        (
            "expected_wait",
            "smg #2187 (2026-08-18): (queued + in-flight tokens) / throughput + 0.15 s * "
            "u/(1-u), least_load's score on the sampled pair",
        ),
        ("token_usage", "smg #554 (2026-02-27): the poll's KV token_usage ratio"),
        ("tokens", "sgl-router load monitor (2025, sglang #10880): the worker's token load"),
        ("inflight", "sgl-router's first power_of_two: the router's in-flight requests"),
    ),
)
register_routing_policy(
    "brs",
    policy_id=K.ID_BRS,
    kernel=K.brs_kernel,
    reference=K.brs_reference,
    options=("age_window", "age_fraction", "window", "patience", "safe", "optimistic"),
    summary="BR-S: margin-first F-score within an age window, JSQ's decision kept when it "
    "leaves no larger imbalance",
    source="this library (BalanceRoute's F-score, SGLang's total_tokens as the safety net)",
)
register_routing_policy(
    "trtllm",
    policy_id=K.ID_TRTLLM,
    kernel=K.trtllm_kernel,
    reference=K.trtllm_reference,
    summary="longest prompt first; min-heap on (prompt tokens, requests, rank) with a cap",
    source=f"{_TRT_ADP}: num_active_tokens = sum of py_orig_prompt_len",
)
register_routing_policy(
    "trtllm_balance",
    policy_id=K.ID_TRTLLM_BALANCE,
    kernel=K.trtllm_balance_kernel,
    reference=K.trtllm_balance_reference,
    options=("optimistic", "timeout_iters", "batching_wait_iters"),
    summary="trtllm's assignment, held back until every rank can take a new request "
    "(timeout_iters), then batching_wait_iters more ticks",
    source="NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/py_executor.py "
    "_balance_adp_requests (attention_dp_config.enable_balance, TensorRT-LLM #6061, 2025-07-15)",
)
register_routing_policy(
    "follow_bootstrap_room",
    policy_id=K.ID_FOLLOW_BOOTSTRAP_ROOM,
    kernel=K.follow_bootstrap_room_kernel,
    reference=K.follow_bootstrap_room_reference,
    options=(),
    summary="replica = bootstrap room (the pool key) mod G, waiting for a slot there",
    source=f"{_SGL_DPC} follow_bootstrap_room_scheduler (PD disaggregation)",
)
register_routing_policy(
    "dynamo",
    policy_id=K.ID_DYNAMO,
    kernel=K.dynamo_kernel,
    reference=K.dynamo_reference,
    options=("optimistic", "block_size", "overlap_weight"),
    summary="lowest overlap_weight * new prefill blocks + decode blocks, ties random",
    source="ai-dynamo/dynamo lib/kv-router/src/scheduling/selector.rs (DefaultWorkerSelector, "
    "temperature 0)",
    seeded=True,
    prefix_cache=True,
)
