"""The routing policies by name, their options and defaults: the one place a policy's options
are written down.

A policy is a ``RoutingPolicy`` (its Numba kernel and plain-Python reference, the options
it accepts, its documentation and upstream versions), built with :func:`routing_policy` in the
module of its family, beside its kernel: :mod:`straggler.solvers.routing._balanceroute` (BR-0, BR-H,
BR-S) and, for the upstream routers, the modules of :mod:`straggler.baselines`. The names
``route_batch``, ``simulate``, the command and the benchmarks accept are the literal table
:data:`straggler.baselines.tables.ROUTING_POLICIES`, plus any policy a user registers at run
time (:func:`register_routing_policy`).

Layering (formulations <- solvers <- baselines): no module imports upward at import time and
no import registers anything. The table sees both layers, so it lives in ``baselines``;
:func:`get_routing_policy` reads it on first use (a function-level import), which is how
``route_batch`` in ``solvers`` reaches SGLang's router in ``baselines``.

Options (:data:`OPTIONS`): each has one check, one default (a value, or a rule of the number
of replicas ``G`` such as ``s_greedy = G * r_max``) and one line of documentation;
:func:`resolve_options` fills a :class:`~straggler.solvers.routing._core.RouterOptions` and
the first tick's :class:`~straggler.solvers.routing._core.RouterCarry` from them, and nothing
else does.

Adding a policy: its kernel, reference and :func:`routing_policy` in one module (a new
option: one :class:`PolicyOption` here and one field of ``RouterOptions``), and one line in
the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...formulations.errors import InvalidOptionError, param_error
from ...formulations.validation import (
    check_array,
    check_bool,
    check_choice,
    check_int,
    check_options,
    check_real,
    describe,
)
from ._core import PoolState, ReplicaState, RouterCarry, RouterOptions

__all__ = [
    "ReplicaState",
    "PoolState",
    "RouterOptions",
    "RouterCarry",
    "router_options",
    "PolicyOption",
    "RoutingPolicy",
    "OPTIONS",
    "DEFAULT_POLICY",
    "routing_policy",
    "register_routing_policy",
    "routing_policies",
    "get_routing_policy",
    "resolve_options",
    "default_s_greedy",
    "default_age_window",
]

#: What ``route_batch`` and ``simulate`` use when no policy is given.
DEFAULT_POLICY = "brs"

#: Policies registered at run time (:func:`register_routing_policy`), beside the table.
_USER: dict[str, RoutingPolicy] = {}
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
    options resolved before it (in :data:`OPTIONS` order): the one place each default is
    written. The value goes to the :class:`RouterOptions` field of the same name, or, with
    ``carry=True``, to that :class:`RouterCarry` field (the policy's memory at the first
    tick). A value of ``None`` means "the default".
    """

    name: str
    check: Callable[[Any, str], Any]
    default: Any
    doc: str
    carry: bool = False


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
        PolicyOption("r_max", _r_max, 4, "Stage-2 candidates R_max, 1..16"),
        PolicyOption(
            "s_greedy",
            _s_greedy,
            lambda G, r: float(default_s_greedy(G, r["r_max"])),
            "Stage 1 runs while the total free slots exceed it (default G * r_max)",
        ),
        PolicyOption("alpha", _alpha, 1.0, "BR-H gain weight (> 0)"),
        PolicyOption(
            "beta",
            _beta,
            lambda G, r: float(G),
            "BR-H overflow weight (default G)",
        ),
        PolicyOption("gamma", _gamma, 1.0, "BR-H discount per step, in (0, 1]"),
        PolicyOption(
            "optimistic",
            _optimistic,
            True,
            "update the local copy of the metric after each placement",
        ),
        PolicyOption("cursor", _cursor, 0, "round-robin: the replica to try first", carry=True),
        PolicyOption(
            "age_window",
            _age_window,
            lambda G, r: default_age_window(G),
            "BR-S: place a request only if it entered the pool at most this many ticks after "
            "the oldest request still waiting (the bound on overtaking)",
        ),
        PolicyOption(
            "window",
            _window,
            8,
            "BR-S: candidates per free slot (the window holds the k * S_tot oldest requests; "
            "0: no count limit)",
        ),
        PolicyOption(
            "patience",
            _patience,
            128,
            "BR-S: route as JSQ until some visible request has waited this many ticks (a "
            "backlog, not a burst); the backlog lasts until the visible pool fits the free "
            "slots",
        ),
        PolicyOption(
            "age_fraction",
            _age_fraction,
            0.1,
            "BR-S: the window spans this fraction of the oldest request's wait (at most "
            "age_window ticks)",
        ),
        PolicyOption(
            "safe",
            _safe,
            True,
            "BR-S: keep JSQ's decision whenever it leaves no larger one-tick imbalance",
        ),
        PolicyOption(
            "new_presence",
            _new_presence,
            None,
            "BR-H: H+1 weights pi_h in [0, 1] of the new requests' presence (default none)",
        ),
        PolicyOption(
            "version",
            None,  # checked against the policy's own versions (resolve_options)
            None,
            "baselines: the upstream version (RoutingPolicy.versions; default the current one)",
        ),
        PolicyOption(
            "kv_weight",
            _kv_weight,
            0.15,
            "p2c expected_wait: seconds of the KV barrier u/(1-u) (the gateway's 0.15)",
        ),
        PolicyOption(
            "throughput",
            _throughput,
            2000.0,
            "p2c expected_wait: tokens/s that turn queued tokens into seconds (gateway: 2000)",
        ),
        PolicyOption(
            "block_size",
            _block_size,
            16,
            "dynamo: KV block size in tokens (default 16)",
        ),
        PolicyOption(
            "overlap_weight",
            _overlap_weight,
            1.0,
            "dynamo: weight of the prefill blocks (kv_overlap_score_weight, default 1)",
        ),
        PolicyOption(
            "timeout_iters",
            _timeout_iters,
            50,
            "trtllm_balance: ticks new requests wait for every rank to take some (default 50)",
        ),
        PolicyOption(
            "batching_wait_iters",
            _batching_wait_iters,
            10,
            "trtllm_balance: extra ticks of batching once every rank can take some (default 10)",
        ),
    )
}


@dataclass(frozen=True)
class RoutingPolicy:
    """A routing policy (built by :func:`routing_policy`)."""

    name: str
    kernel: Any
    """The Numba kernel, ``kernel(pool, reps, opts, carry, seed) -> (assignment, carry)``."""
    reference: Callable
    """The plain-Python reference, same signature, same decisions."""
    options: tuple[str, ...]
    """The options it accepts (names of :data:`OPTIONS`, in that order)."""
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


def routing_policy(
    name: str,
    *,
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
    """A ``RoutingPolicy`` (registers nothing).

    ``versions``: ``(name, upstream change)`` pairs, the current upstream behaviour first; the
    policy then accepts ``version=`` (its kernel reads the index as ``opts.version``).
    """
    if versions:
        options = tuple(options) + ("version",)
    unknown = [o for o in options if o not in OPTIONS]
    if unknown:
        raise ValueError(f"routing policy {name!r}: unknown option(s) {unknown}")
    return RoutingPolicy(
        name=name,
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


_TABLE: dict = {}


def _table() -> dict[str, RoutingPolicy]:
    """The name table of :mod:`straggler.baselines.tables` (it sees every layer, so it is
    imported on first use; module docstring)."""
    if not _TABLE:
        from ...baselines.tables import ROUTING_POLICIES

        _TABLE.update(ROUTING_POLICIES)
    return _TABLE


def register_routing_policy(policy: RoutingPolicy) -> RoutingPolicy:
    """Make ``policy`` (from :func:`routing_policy`) known by its name for this process, beside
    the library's table; a name already known raises ``ValueError``."""
    if not isinstance(policy, RoutingPolicy):
        raise TypeError("register_routing_policy takes a RoutingPolicy (see routing_policy)")
    if policy.name in _table() or policy.name in _USER:
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
    return sorted([*_table(), *_USER])


def get_routing_policy(name, func: str = "route_batch") -> RoutingPolicy:
    """The policy named ``name``; :class:`InvalidOptionError` naming ``policy`` if none."""
    pol = _table().get(name) if isinstance(name, str) else None
    if pol is None and isinstance(name, str):
        pol = _USER.get(name)
    if pol is None:
        raise param_error(
            "policy", func, f"one of {routing_policies()}", describe(name), InvalidOptionError
        )
    return pol


#: The options stored as int and bool in RouterOptions (the rest are float).
_INT = {"r_max", "age_window", "window", "patience", "version", "block_size", "timeout_iters",
        "batching_wait_iters"}  # fmt: skip
_BOOL = {"optimistic", "safe"}


def _record(values: dict, horizon: int, func: str) -> tuple[RouterOptions, RouterCarry]:
    """The typed records of resolved ``values`` (every option of :data:`OPTIONS`)."""
    pi = values["new_presence"]
    if pi is None:
        pi = np.zeros(0)
    elif pi.shape != (horizon + 1,):
        raise param_error(
            "new_presence",
            func,
            f"H+1 = {horizon + 1} numbers in [0, 1] (one per column of loads)",
            f"shape {pi.shape}",
        )
    fields = {}
    for name in RouterOptions._fields:
        if name == "new_presence":
            continue
        v = values[name]
        fields[name] = int(v) if name in _INT else bool(v) if name in _BOOL else float(v)
    opts = RouterOptions(**fields, new_presence=np.array(pi, dtype=np.float64))
    return opts, RouterCarry(int(values["cursor"]), 0, 0, 0, False)


def router_options(
    n_replicas: int, horizon: int = 0, *, func: str = "router_options", **options
) -> tuple[RouterOptions, RouterCarry]:
    """Every option of :data:`OPTIONS` checked and the rest filled with its default, as the
    kernels read them: ``(RouterOptions, RouterCarry)`` (for calling a kernel directly; a
    policy's own options go through :func:`resolve_options`). ``version`` is the index of the
    upstream version (0: the current one).

    Examples
    --------
    >>> o, c = router_options(8, patience=0)
    >>> o.r_max, o.s_greedy, o.beta, o.patience, o.window, c.cursor
    (4, 32.0, 8.0, 0, 8, 0)
    """
    check_options(options, list(OPTIONS), func)
    values: dict[str, Any] = {}
    for name, opt in OPTIONS.items():
        v = options.get(name)
        if name == "version":
            values[name] = 0 if v is None else check_int(v, name, func, lo=0, hi=15)
            continue
        if v is None:
            v = opt.default(n_replicas, values) if callable(opt.default) else opt.default
        values[name] = None if v is None else opt.check(v, func)
    return _record(values, horizon, func)


def resolve_options(
    policy: RoutingPolicy, options: dict, n_replicas: int, horizon: int, func: str
) -> tuple[RouterOptions, RouterCarry, dict]:
    """Validate ``options`` for ``policy``; return ``(RouterOptions, RouterCarry, resolved)``.

    ``resolved`` maps each option of the policy to its value (defaults filled in); the options
    the policy does not read hold their defaults in the record. An option the policy does not
    accept raises :class:`InvalidOptionError` listing those it does; ``new_presence`` must
    have ``horizon + 1`` entries.

    Examples
    --------
    >>> o, c, r = resolve_options(get_routing_policy("br0"), {"r_max": 2}, 8, 0, "f")
    >>> o.r_max, o.s_greedy, o.beta, r["s_greedy"]
    (2, 16.0, 8.0, 16.0)
    """
    if options:
        check_options(options, policy.options, f"{func} (policy {policy.name!r})")
    values: dict[str, Any] = {}
    resolved: dict[str, Any] = {}
    for name, opt in OPTIONS.items():
        v = options.get(name) if options and name in policy.options else None
        if name == "version":  # one option, each policy's own choices
            if policy.versions:
                v = (
                    policy.versions[0]
                    if v is None
                    else check_choice(v, name, func, policy.versions)
                )
                resolved[name] = v
            values[name] = policy.versions.index(v) if policy.versions else 0
            continue
        if v is None:
            v = opt.default(n_replicas, values) if callable(opt.default) else opt.default
        if v is not None:
            v = opt.check(v, func)
        values[name] = v
        if name in policy.options:
            resolved[name] = v
    opts, carry = _record(values, horizon, func)
    return opts, carry, resolved
