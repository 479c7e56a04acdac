"""The simulator's configuration as one frozen, validated record: :class:`SimConfig`.

``simulate(trace, policy, **settings)`` builds one with :meth:`SimConfig.from_settings` (its
keyword arguments are the flat names of :data:`SETTINGS`, whose defaults are the groups'
below); ``simulate(trace, config=...)`` takes one built by the caller. Each group checks its
own fields when built (the message names the keyword of ``simulate``); :class:`SimConfig`
checks what depends on several groups (the policy's options, the projection settings a policy
reads, a deployment's width against the cluster's), fills the defaults that depend on the
cluster (``prefill_instances = ceil(G / 2)``, BR-H's horizon 80) and resolves the step time
(``StepTime``, with a deployment its step model): everything a run needs but the trace.

Default prefill capacity
------------------------
``prefill_instances = ceil(G / 2)`` (the paper's 4P1D topology: four prefill instances for
eight decode replicas) at ``prefill_tokens_per_s = 50,000`` each (an H800-class node of a
large MoE; DeepSeek reports 73.7k input tokens/s per node with its prefix-cache hits, which
the simulator does not model), plus ``prefill_base_s = 20 ms``. In requests per second this is,
as a multiple of the decode capacity below (at every ``G``): Azure conversation 6.8x, Azure
code 0.68x (28-token outputs: prefill-bound from load 0.68), Mooncake conversation 3.4x,
Mooncake synthetic 1.34x, ShareGPT 10x, arXiv 6.3x, the generated workload 6.7x. A cluster
built for a prefill-heavy mix needs more: ``straggler.sim.experiments.load_sweep`` sizes it to
twice the
decode capacity. ``prefill_instances=0`` restores unlimited prefill.

Default step time (derived from the paper's tables)
---------------------------------------------------
The load-independent part of a step cancels between two policies at the same cluster size, so
each pair (JSQ, BR-H oracle) of the paper gives ``kappa = delta TPOT_P95 / delta (M - mean L)``
with ``M - mean L = I / G``:

=======================  ===================================  ===========  ===============
table row                 delta I / G (tokens)                 delta TPOT   kappa (us/tok)
=======================  ===================================  ===========  ===============
proprietary, G = 4        (75,326 - 6,576) / 4 = 17,188        3.93 ms      0.229
proprietary, G = 8        (215,110 - 23,577) / 8 = 23,942      5.16 ms      0.216
proprietary, G = 16       (675,607 - 117,067) / 16 = 34,909    5.36 ms      0.154
Azure-2024, G = 8         (104,737 - 35,301) / 8 = 8,680       12.0 ms      1.38
=======================  ===================================  ===========  ===============

* ``kappa = 0.22e-6`` s/token: the median of the four (0.22 us; the Azure pair is the outlier,
  its TPOT gap is larger than its token gap explains).
* ``t0 = 0.040`` s: by Little's law JSQ at G = 8 (proprietary) runs ``843 tok/s * 0.0832 s
  ~= 70`` requests, 8.8 per replica; at the paper's "hundreds of thousands of tokens" of
  load (our reading: ~175k mean, ~20k resident tokens per long-context request) ``M ~= 175k +
  215,110 / 8 ~= 202k`` and ``t0 = 83.2 ms - 0.22 us * 202k ~= 39 ms``.

So a step costs ~85 ms at ~200k tokens on the slowest replica (the paper's TPOT scale). In
saturated replays at 16 slots per replica, the Mooncake conversation trace (12k-token prompts)
is in that regime (TPOT P95 ~100-130 ms); the Azure-2023 traces (1-2k-token prompts, ~20k
tokens per replica) run at ~45-55 ms, where the barrier costs little.
``benchmarks/routing_table.py --kappa 1.38e-6`` reruns the table with the Azure-pair slope.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...formulations.errors import InvalidOptionError, param_error
from ...formulations.validation import (
    check_bool,
    check_choice,
    check_int,
    check_real,
    check_type,
    describe,
)
from ...solvers.routing.policy import RoutingPolicy, resolve_options
from ...solvers.routing.predictors import PredictorKind, TwoStagePredictor
from ...solvers.routing.registry import DEFAULT_POLICY, get_routing_policy
from ..workloads.prefix import PrefixBlocks
from ..workloads.traces import Trace
from .deployment import DeploymentConfig, StepModel, full_batch_step

__all__ = [
    "LOAD_BASES",
    "SimConfig",
    "StepTime",
    "ClusterConfig",
    "PrefillConfig",
    "RoutingConfig",
    "PredictorConfig",
    "PrefixCacheConfig",
    "RunConfig",
    "DEFAULT_STEP_TIME",
    "DEFAULT_PREFILL",
    "ADMISSION_MODES",
    "MAX_REPLICAS",
    "MAX_SLOTS",
    "SETTINGS",
]

#: ``(t0 seconds, kappa seconds per token)``; derivation in the module docstring.
DEFAULT_STEP_TIME = (0.040, 0.22e-6)

#: ``(tokens per second per instance, fixed seconds per prefill)``; the number of instances
#: defaults to ``ceil(G / 2)``.
DEFAULT_PREFILL = (50_000.0, 0.02)

#: Values of ``admission`` (where a routed request waits for its slot: in one central pool,
#: or in the engine's own queue).
ADMISSION_MODES = ("pool", "queue")

#: Values of ``RunConfig.load_basis`` (``simulate(load_basis=...)``): the capacity ``load``
#: is a multiple of (see :func:`straggler.sim.engine.simulator.simulate`).
LOAD_BASES = ("binding", "decode", "prefill")

#: Upper bounds that keep the engine's ``(G, max_slots)`` arrays allocatable and every integer
#: in int64 (a larger value once reached numba as uint64 and failed to type).
MAX_REPLICAS = 65_536
MAX_SLOTS = 65_536

_F = "simulate"


def _set(obj, name, value):
    object.__setattr__(obj, name, value)


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """The decode replicas and the step time ``t0 + kappa * max_g L_g`` (with ``ctx_cost > 0``:
    ``t0 + max_g (kappa * L_g + ctx_cost * C_g)``, aggregated serving)."""

    n_replicas: int = 8
    max_slots: int = 16
    kv_capacity: int = 500_000
    t0: float = DEFAULT_STEP_TIME[0]
    kappa: float = DEFAULT_STEP_TIME[1]
    ctx_cost: float = 0.0
    admission: str = "pool"
    """``"pool"``: one central pool, a request goes only to a replica with a free slot and
    starts there; ``"queue"``: to one engine's own FIFO queue, whatever its slots, and the
    engine admits from its head."""

    def __post_init__(self):
        _set(
            self, "n_replicas", check_int(self.n_replicas, "n_replicas", _F, lo=1, hi=MAX_REPLICAS)
        )
        _set(self, "max_slots", check_int(self.max_slots, "max_slots", _F, lo=1, hi=MAX_SLOTS))
        _set(self, "kv_capacity", check_int(self.kv_capacity, "kv_capacity", _F, lo=1, hi=2**53))
        _set(self, "t0", check_real(self.t0, "t0", _F, lo=0))
        _set(self, "kappa", check_real(self.kappa, "kappa", _F, lo=0))
        _set(self, "ctx_cost", check_real(self.ctx_cost, "ctx_cost", _F, lo=0))
        admission = check_choice(self.admission, "admission", _F, list(ADMISSION_MODES))
        _set(self, "admission", admission)
        if self.t0 == 0 and self.kappa == 0:
            raise param_error("t0", _F, "positive when kappa is 0 (steps must take time)", "0")


@dataclass(frozen=True, kw_only=True)
class PrefillConfig:
    """Prefill instances serving arrivals first come, first served; a prefill takes ``base_s
    + tokens / tokens_per_s`` on one (``instances = 0``: unlimited; None: ``ceil(G / 2)``,
    filled by :class:`SimConfig`)."""

    instances: int | None = None
    tokens_per_s: float = DEFAULT_PREFILL[0]
    base_s: float = DEFAULT_PREFILL[1]

    def __post_init__(self):
        rate = check_real(
            self.tokens_per_s, "prefill_tokens_per_s", _F, lo=0, lo_open=True, finite=False
        )
        _set(self, "tokens_per_s", rate)
        _set(self, "base_s", check_real(self.base_s, "prefill_base_s", _F, lo=0))
        if self.instances is not None:
            _set(self, "instances", check_int(self.instances, "prefill_instances", _F, lo=0))


@dataclass(frozen=True, kw_only=True)
class RoutingConfig:
    """When and what the router sees: a tick every ``tick`` steps, loads ``stale`` steps old,
    the oldest ``max_pool`` pool requests, the optimistic update on or off."""

    tick: int = 1
    stale: int = 0
    optimistic: bool = True
    max_pool: int = 256

    def __post_init__(self):
        _set(self, "tick", check_int(self.tick, "tick", _F, lo=1, hi=2**31))
        _set(self, "stale", check_int(self.stale, "stale", _F, lo=0, hi=2**31))
        _set(self, "optimistic", check_bool(self.optimistic, "optimistic", _F))
        _set(self, "max_pool", check_int(self.max_pool, "max_pool", _F, lo=1, hi=2**31))


@dataclass(frozen=True, kw_only=True)
class PredictorConfig:
    """BR-H's projection (only for a policy that reads projected loads): the predictor
    (default survival), the horizon ``H`` (default 80), the two-stage model's training data,
    and the two options beyond the paper (``refill``, ``new_presence``)."""

    kind: str | PredictorKind | None = None
    horizon: int | None = None
    fit: Trace | TwoStagePredictor | str | None = None
    refill: bool = False
    new_presence: bool = False

    def __post_init__(self):
        _set(self, "refill", check_bool(self.refill, "refill", _F))
        _set(self, "new_presence", check_bool(self.new_presence, "new_presence", _F))


@dataclass(frozen=True, kw_only=True)
class PrefixCacheConfig:
    """Each request's prompt blocks (None: no prefix caches); checked against the trace when
    the run starts."""

    blocks: PrefixBlocks | None = None

    def __post_init__(self):
        if self.blocks is not None:
            check_type(self.blocks, "prefix_blocks", _F, PrefixBlocks, "a PrefixBlocks (or None)")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """The offered load (a multiple of the capacity named by ``load_basis``, the binding
    stage's by default: the smaller of the decode cluster's and the prefill instances';
    ``saturated``: ``overload`` unless given), the ``min_output``
    filter, the seed, the step limit, the engine, the router's timer, and the deployment step
    model (:class:`~straggler.sim.engine.deployment.DeploymentConfig`, or None)."""

    load: float | None = None
    saturated: bool = False
    min_output: int = 0
    overload: float = 1.5
    seed: int = 0
    max_steps: int | None = None
    engine: str = "numba"
    time_router: bool = True
    load_basis: str = "binding"
    deployment: DeploymentConfig | None = None

    def __post_init__(self):
        _set(self, "load_basis", check_choice(self.load_basis, "load_basis", _F, LOAD_BASES))
        if self.deployment is not None:
            check_type(
                self.deployment, "deployment", _F, DeploymentConfig, "None or a DeploymentConfig"
            )
        _set(self, "saturated", check_bool(self.saturated, "saturated", _F))
        _set(self, "min_output", check_int(self.min_output, "min_output", _F, lo=0, hi=2**53))
        _set(self, "overload", check_real(self.overload, "overload", _F, lo=0, lo_open=True))
        _set(self, "seed", check_int(self.seed, "seed", _F, lo=0, hi=2**40))
        _set(self, "engine", check_choice(self.engine, "engine", _F, ["numba", "python"]))
        _set(self, "time_router", check_bool(self.time_router, "time_router", _F))
        if self.load is not None:
            _set(self, "load", check_real(self.load, "load", _F, lo=0, lo_open=True))
        if self.max_steps is not None:
            _set(self, "max_steps", check_int(self.max_steps, "max_steps", _F, lo=1))


#: ``simulate``'s flat keyword -> (group, field).
_FLAT = {
    "n_replicas": ("cluster", "n_replicas"),
    "max_slots": ("cluster", "max_slots"),
    "kv_capacity": ("cluster", "kv_capacity"),
    "t0": ("cluster", "t0"),
    "kappa": ("cluster", "kappa"),
    "ctx_cost": ("cluster", "ctx_cost"),
    "admission": ("cluster", "admission"),
    "prefill_instances": ("prefill", "instances"),
    "prefill_tokens_per_s": ("prefill", "tokens_per_s"),
    "prefill_base_s": ("prefill", "base_s"),
    "tick": ("routing", "tick"),
    "stale": ("routing", "stale"),
    "optimistic": ("routing", "optimistic"),
    "max_pool": ("routing", "max_pool"),
    "predictor": ("predictor", "kind"),
    "horizon": ("predictor", "horizon"),
    "predictor_fit": ("predictor", "fit"),
    "refill": ("predictor", "refill"),
    "new_presence": ("predictor", "new_presence"),
    "prefix_blocks": ("prefix_cache", "blocks"),
    "load": ("run", "load"),
    "saturated": ("run", "saturated"),
    "min_output": ("run", "min_output"),
    "overload": ("run", "overload"),
    "seed": ("run", "seed"),
    "max_steps": ("run", "max_steps"),
    "engine": ("run", "engine"),
    "time_router": ("run", "time_router"),
    "load_basis": ("run", "load_basis"),
    "deployment": ("run", "deployment"),
}
#: ``simulate``'s keywords that are settings (every keyword but ``policy``, ``config`` and the
#: policy's options).
SETTINGS = tuple(_FLAT)
_GROUPS = {
    "cluster": ClusterConfig,
    "prefill": PrefillConfig,
    "routing": RoutingConfig,
    "predictor": PredictorConfig,
    "prefix_cache": PrefixCacheConfig,
    "run": RunConfig,
}


class StepTime(NamedTuple):
    """The terms of a step's duration as the engine prices it (seconds;
    :func:`~straggler.sim.engine._loop.step_time`).

    Without a deployment (``deploy`` False): ``t0 + kappa * max_g L_g``, with ``ctx_cost > 0``
    ``t0 + max_g (kappa * L_g + ctx_cost * C_g)``. With one: ``n_layers * max_g (t0 + kappa *
    L_g + att_c * R_g + ctx_cost * C_g) + fixed_s`` (one layer's attention per rank, the
    context phase spread over the layers, the dense FFN and shared-expert layers in
    ``fixed_s``), plus the MoE layers priced by the run's
    :class:`~straggler.sim.engine.deployment.StepModel`.
    """

    deploy: bool
    t0: float
    kappa: float
    att_c: float
    n_layers: int
    fixed_s: float
    ctx_cost: float


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """Everything a simulated run is given, validated and resolved once: the policy and its
    options, then the groups (cluster, prefill, routing, predictor, prefix cache, run).

    Built from :func:`~straggler.sim.simulate`'s keywords by :meth:`from_settings`. Filled on
    construction (``init=False``): ``prefill.instances`` (``ceil(G / 2)`` when None), the
    projection (``pred_kind``, ``horizon``: the predictor's kind and ``H``, ``NONE`` and 0 for a
    policy that reads no projected loads), the run's ``label`` (``"brh:survival"``), the
    policy's registry entry (``routing_policy``) and its options as its kernel reads them
    (``router_options``, and its memory at the first tick, ``router_carry``) with
    ``resolved`` (each option of the policy and its value), and the step time (``step``,
    ``StepTime``).

    With a ``deployment`` (:class:`~straggler.sim.engine.deployment.DeploymentConfig`, whose
    ``n_gpus`` must be ``n_replicas``) the step is the deployment's: ``step`` holds its
    attention, layers and dense part, :meth:`new_step_model` gives each run a fresh copy of its
    :class:`~straggler.sim.engine.deployment.StepModel` (which prices the MoE layers), and
    ``cluster.t0``/``cluster.kappa`` become the linear step the offered load is measured against
    (``deployment.full_batch_step``).

    Examples
    --------
    >>> c = SimConfig.from_settings("brh", n_replicas=4, r_max=2)
    >>> c.prefill.instances, c.horizon, c.label, c.resolved["r_max"], c.resolved["beta"]
    (2, 80, 'brh:survival', 2, 4.0)
    >>> c.step.deploy, c.step.t0 == c.cluster.t0
    (False, True)
    """

    policy: str | None = None
    options: dict = field(default_factory=dict)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    prefill: PrefillConfig = field(default_factory=PrefillConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    prefix_cache: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    run: RunConfig = field(default_factory=RunConfig)
    pred_kind: PredictorKind = field(init=False)
    horizon: int = field(init=False)
    label: str = field(init=False)
    routing_policy: RoutingPolicy = field(init=False, repr=False)
    router_options: Any = field(init=False, repr=False)
    router_carry: Any = field(init=False, repr=False)
    resolved: dict = field(init=False)
    step: StepTime = field(init=False, repr=False)
    _step_model: StepModel | None = field(init=False, repr=False, compare=False)

    @classmethod
    def from_settings(cls, policy=None, **settings) -> SimConfig:
        """A config from ``simulate``'s flat keywords: the names of ``_FLAT`` go to their
        group, every other keyword is an option of the policy."""
        groups: dict[str, dict] = {g: {} for g in _GROUPS}
        options = {}
        for k, v in settings.items():
            if k in _FLAT:
                g, name = _FLAT[k]
                groups[g][name] = v
            else:
                options[k] = v
        built = {g: _GROUPS[g](**kw) for g, kw in groups.items()}
        return cls(policy=policy, options=options, **built)

    def __post_init__(self):
        pol = get_routing_policy(DEFAULT_POLICY if self.policy is None else self.policy, _F)
        _set(self, "policy", pol.name)
        _set(self, "routing_policy", pol)
        for g, typ in _GROUPS.items():
            check_type(getattr(self, g), g, _F, typ, f"a {typ.__name__}")
        G = self.cluster.n_replicas
        if self.prefill.instances is None:
            _set(self, "prefill", dataclasses.replace(self.prefill, instances=math.ceil(G / 2)))
        kind, H, label = self._projection(pol)
        opts = dict(self.options)
        if "new_presence" in opts:
            raise param_error(
                "new_presence",
                _F,
                "a bool (simulate computes the weights from the trace)",
                "an array",
            )
        if "optimistic" in pol.options:
            opts["optimistic"] = self.routing.optimistic
        ropts, carry, resolved = resolve_options(pol, opts, G, H, _F)
        _set(self, "options", dict(self.options))
        _set(self, "pred_kind", kind)
        _set(self, "horizon", H)
        _set(self, "label", label)
        _set(self, "router_options", ropts)
        _set(self, "router_carry", carry)
        _set(self, "resolved", {k: v for k, v in resolved.items() if k != "new_presence"})
        self._step_time()

    def _projection(self, pol: RoutingPolicy) -> tuple[PredictorKind, int, str]:
        """The predictor's kind, the horizon and the run's label; refuses projection settings
        for a policy that reads no projected loads."""
        pr = self.predictor
        if pol.horizon:  # projection settings: only for a policy that reads projected loads
            kind = PredictorKind.from_name("survival" if pr.kind is None else pr.kind)
            H = 80 if pr.horizon is None else check_int(pr.horizon, "horizon", _F, lo=0)
            label = f"{pol.name}:{kind.label}"
        else:
            for name, v in (
                ("predictor", pr.kind),
                ("horizon", pr.horizon),
                ("predictor_fit", pr.fit),
            ):
                if v is not None:
                    raise param_error(
                        name,
                        _F,
                        f"None for policy {pol.name!r} (it reads no projected loads)",
                        describe(v),
                        InvalidOptionError,
                    )
            for name, v in (("refill", pr.refill), ("new_presence", pr.new_presence)):
                if v:
                    raise param_error(
                        name,
                        _F,
                        f"False for policy {pol.name!r} (it reads no projected loads)",
                        "True",
                        InvalidOptionError,
                    )
            kind, H, label = PredictorKind.NONE, 0, pol.name
        if pr.fit is not None and kind != PredictorKind.TWO_STAGE:
            raise param_error(
                "predictor_fit",
                _F,
                'None unless the predictor is "two_stage"',
                describe(pr.fit),
                InvalidOptionError,
            )
        return kind, H, label

    def _step_time(self) -> None:
        """``step`` (and, with a deployment, its step model and the load basis's linear
        step in ``cluster``)."""
        cl = self.cluster
        dep = self.run.deployment
        model = None
        if dep is None:
            step = StepTime(False, cl.t0, cl.kappa, 0.0, 1, 0.0, cl.ctx_cost)
        else:
            if dep.n_gpus != cl.n_replicas:
                raise param_error(
                    "deployment", _F, f"a DeploymentConfig with n_gpus = n_replicas = "
                    f"{cl.n_replicas}", f"n_gpus={dep.n_gpus}",
                )  # fmt: skip
            model = StepModel(dep)
            t0, kappa = full_batch_step(model, cl.max_slots)
            _set(self, "cluster", dataclasses.replace(cl, t0=t0, kappa=kappa))
            att, n_layers = dep.preset.attention, dep.preset.n_layers
            step = StepTime(
                True, att.a / 1e6, att.b / 1e6, att.c / 1e6, n_layers, model.dense_us / 1e6,
                cl.ctx_cost / n_layers,
            )  # fmt: skip
        _set(self, "step", step)
        _set(self, "_step_model", model)

    def new_step_model(self) -> StepModel | None:
        """A fresh copy of the deployment's step model for one run (its placement, tables and
        random streams as built; the config's own is never stepped, so every run starts
        alike), or None without a deployment or without its MoE term."""
        dep = self.run.deployment
        if dep is None or not dep.moe:
            return None
        return copy.deepcopy(self._step_model)

    def as_dict(self) -> dict[str, Any]:
        """Every setting under ``simulate``'s flat names (with ``policy``, ``label``,
        ``horizon``, ``predictor`` as a label, the resolved ``options`` and, with one, the
        deployment's ``repr``)."""
        out: dict[str, Any] = {"policy": self.policy}
        for flat, (g, name) in _FLAT.items():
            if flat in (
                "prefix_blocks",
                "predictor_fit",
                "predictor",
                "horizon",
                "load",
                "max_steps",
                "deployment",
            ):
                continue
            out[flat] = getattr(getattr(self, g), name)
        out.update(
            predictor=self.pred_kind.label if self.routing_policy.horizon else None,
            horizon=self.horizon,
            label=self.label,
            options=dict(self.resolved),
        )
        if self.run.deployment is not None:
            out["deployment"] = repr(self.run.deployment)
        return out
