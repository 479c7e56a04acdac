"""What a routing policy is: a :class:`RoutingPolicy` (its Numba kernel and plain-Python
reference, the options it declares, its memory, its documentation and upstream versions),
built with :func:`routing_policy` in the module of its family, beside its kernel; and how its
declared options and memory become the records its kernel reads.

Each policy module declares its options (``PolicyOption`` of
:mod:`straggler.solvers.routing._core`: check, default, documentation) and its memory (a
``NamedTuple`` class of int and bool fields, ``check_carry_record``); the one option shared by
every policy that accepts it is :data:`OPTIMISTIC`, and ``version`` is a policy's choice among
its own ``versions``. :func:`resolve_options` checks the options given for a policy against its
declaration, fills the defaults, and builds its ``RouterOptions`` and its first tick's memory
(an int64 array), and nothing else does. :func:`public_carry` and :func:`policy_carry` turn
that memory into ``RoutingResult.extras["carry"]`` (an instance of the policy's
``NamedTuple``) and back.

This module sits below the policies (:mod:`straggler.solvers.routing._balanceroute` and the
upstream routers of :mod:`straggler.baselines.routing` build theirs with it); the table of
names, :mod:`straggler.solvers.routing.registry`, sits above them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...formulations.errors import param_error
from ...formulations.validation import (
    check_bool,
    check_choice,
    check_int,
    check_options,
    describe,
)
from ._core import (
    OPTION_TARGETS,
    NoCarry,
    PolicyOption,
    RouterOptions,
    carry_kinds,
    check_carry_record,
    option_slots,
)

__all__ = [
    "OPTIMISTIC",
    "RoutingPolicy",
    "routing_policy",
    "resolve_options",
    "public_carry",
    "policy_carry",
]


def _optimistic(v, func):
    return check_bool(v, "optimistic", func)


#: The optimistic local update, an option of every policy that declares it (``simulate``'s
#: ``optimistic`` setting sets it): ``RouterOptions.optimistic``, True when not declared.
OPTIMISTIC = PolicyOption(
    "optimistic",
    _optimistic,
    True,
    "update the local copy of the metric after each placement",
    to="optimistic",
)


@dataclass(frozen=True)
class RoutingPolicy:
    """A routing policy (built by :func:`routing_policy`)."""

    name: str
    kernel: Any
    """The Numba kernel, ``kernel(pool, reps, opts, carry, seed) -> (assignment, carry)``."""
    reference: Callable
    """The plain-Python reference, same signature, same decisions."""
    options: tuple[str, ...]
    """The options it accepts, in declared order (``"version"`` last when it has versions)."""
    summary: str
    source: str
    declared: tuple[PolicyOption, ...] = ()
    """Its options as declared (each one's check, default and documentation)."""
    carry: type = NoCarry
    """Its memory from one tick to the next: a ``NamedTuple`` class of int and bool fields
    (``RoutingResult.extras["carry"]`` is an instance)."""
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
    options: tuple[PolicyOption, ...] = (OPTIMISTIC,),
    carry: type = NoCarry,
    summary: str,
    source: str,
    horizon: bool = False,
    seeded: bool = False,
    staged: bool = False,
    versions: tuple[tuple[str, str], ...] = (),
    prefix_cache: bool = False,
) -> RoutingPolicy:
    """A ``RoutingPolicy`` (registers nothing).

    ``options``: the ``PolicyOption`` records (``straggler.solvers.routing._core``) it accepts,
    in the order they are resolved (its kernel reads the scalar ones at the slots
    ``option_slots`` gives for this tuple); at most one vector option; an option with
    ``to="carry"`` needs a field of that name in ``carry``. ``carry``: its memory, a
    ``NamedTuple`` class of int and bool fields (its kernel reads them at the slots of
    ``carry_slots``). ``versions``: ``(name, upstream change)`` pairs, the current upstream
    behaviour first; the policy then accepts ``version=`` (its kernel reads the index as
    ``opts.version``).
    """
    options = tuple(options)
    bad = [o for o in options if not isinstance(o, PolicyOption) or o.to not in OPTION_TARGETS]
    if bad:
        raise ValueError(f"routing policy {name!r}: options must be PolicyOption, got {bad}")
    names = [o.name for o in options]
    check_carry_record(carry, name)
    fields = list(carry._fields)
    if len(set(names)) < len(names) or "version" in names:
        raise ValueError(f"routing policy {name!r}: options named twice or 'version' in {names}")
    if sum(o.to == "vector" for o in options) > 1:
        raise ValueError(f"routing policy {name!r}: more than one vector option")
    orphans = [o.name for o in options if o.to == "carry" and o.name not in fields]
    if orphans:
        raise ValueError(f"routing policy {name!r}: carry options {orphans} have no carry field")
    return RoutingPolicy(
        name=name,
        kernel=kernel,
        reference=reference,
        options=tuple(names) + (("version",) if versions else ()),
        summary=summary,
        source=source,
        declared=options,
        carry=carry,
        horizon=horizon,
        seeded=seeded,
        staged=staged,
        versions=tuple(v for v, _ in versions),
        version_sources=tuple(src for _, src in versions),
        prefix_cache=prefix_cache,
    )


def resolve_options(
    policy: RoutingPolicy, options: dict, n_replicas: int, horizon: int, func: str
) -> tuple[RouterOptions, np.ndarray, dict]:
    """Validate ``options`` for ``policy``; return ``(RouterOptions, carry, resolved)``.

    Each of the policy's declared options, in its order, takes the value given or its default
    and is checked; the scalar ones fill ``RouterOptions.values`` at their slots, a vector
    option ``RouterOptions.vector`` (``horizon + 1`` entries), a carry option the field of
    the same name of ``carry`` (the policy's memory at the first tick, int64, zeros
    elsewhere). ``resolved`` maps each option the policy accepts to its value. An option the
    policy does not accept raises :class:`InvalidOptionError` listing those it does.

    Examples
    --------
    >>> from straggler.solvers.routing._balanceroute import BR0
    >>> o, c, r = resolve_options(BR0, {"r_max": 2}, 8, 0, "f")
    >>> o.values.tolist(), o.optimistic, c.tolist(), r["s_greedy"]
    ([2.0, 16.0], True, [], 16.0)
    """
    if options:
        check_options(options, policy.options, f"{func} (policy {policy.name!r})")
    resolved: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for opt in policy.declared:
        v = options.get(opt.name) if options else None
        if v is None:
            v = opt.default(n_replicas, values) if callable(opt.default) else opt.default
        if v is not None:
            v = opt.check(v, func)
        values[opt.name] = resolved[opt.name] = v
    version = 0
    if policy.versions:
        v = options.get("version") if options else None
        v = policy.versions[0] if v is None else check_choice(v, "version", func, policy.versions)
        resolved["version"] = v
        version = policy.versions.index(v)
    opts, carry = _records(policy, values, version, horizon, func)
    return opts, carry, resolved


def _records(policy, values, version, horizon, func) -> tuple[RouterOptions, np.ndarray]:
    """The kernel's records of the resolved ``values`` (one per declared option)."""
    slots = option_slots(policy.declared)
    scalars = np.empty(len(slots))
    vector = np.zeros(0)
    optimistic = True
    for opt in policy.declared:
        v = values[opt.name]
        if opt.to == "values":
            scalars[getattr(slots, opt.name)] = float(v)
        elif opt.to == "optimistic":
            optimistic = bool(v)
        elif opt.to == "vector" and v is not None:
            if v.shape != (horizon + 1,):
                raise param_error(
                    opt.name,
                    func,
                    f"H+1 = {horizon + 1} numbers (one per column of loads)",
                    f"shape {v.shape}",
                )
            vector = np.array(v, dtype=np.float64)
    fields = policy.carry._fields
    carry = np.zeros(len(fields), dtype=np.int64)
    for opt in policy.declared:
        if opt.to == "carry":
            carry[fields.index(opt.name)] = int(values[opt.name])
    return RouterOptions(optimistic, int(version), scalars, vector), carry


def public_carry(policy: RoutingPolicy, carry):
    """A policy's memory (its kernel's int64 array) as ``RoutingResult.extras["carry"]``
    shows it: an instance of the policy's ``NamedTuple``, each field of its declared type.

    Examples
    --------
    >>> from straggler.solvers.routing._balanceroute import BRS
    >>> public_carry(BRS, np.array([1]))
    BRSCarry(backlog=True)
    """
    return policy.carry._make(
        bool(v) if k is bool else v for k, v in zip(carry_kinds(policy.carry), carry.tolist())
    )


def policy_carry(policy: RoutingPolicy, carry, func: str) -> np.ndarray:
    """The int64 memory array of ``carry`` (``extras["carry"]`` of a result of ``policy``, an
    instance of its ``NamedTuple``), checked."""
    record = policy.carry
    if not isinstance(carry, record):
        raise param_error(
            "carry",
            func,
            f"a {record.__name__} (extras['carry'] of a result of policy {policy.name!r})",
            describe(carry),
        )
    out = np.empty(len(record._fields), dtype=np.int64)
    for k, kind in enumerate(carry_kinds(record)):
        if kind is bool:
            out[k] = check_bool(carry[k], "carry", func)
        else:
            out[k] = check_int(carry[k], "carry", func, lo=0, hi=2**52)
    return out
