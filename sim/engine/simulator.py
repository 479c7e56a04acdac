"""Lock-step decode-cluster simulator: replay a trace under a routing policy, report metrics.

``simulate(trace, policy, **settings)`` runs four stages, each once, in order:

1. validate every setting into one :class:`~straggler.sim.engine.config.SimConfig` (the
   policy and its options, the groups, and with a ``deployment`` its step model and step
   time);
2. :func:`engine_inputs`: the trace as simulated (filtered, rescaled to the load) and the step
   loop's :class:`~straggler.sim.engine._loop.EngineInputs`, as a ``SimRun``;
3. run the step loop of :mod:`straggler.sim.engine._loop` (Numba, on numba's disk cache, one
   compiled loop for every policy; or its plain-Python reference);
4. summarise the run in a :class:`SimReport`.

The model (PD disaggregation, the overall framework of BalanceRoute, arXiv 2605.06113): a
request arrives and queues for one of ``prefill_instances`` prefill instances (first come, first
served; a prefill takes ``prefill_base_s + prompt / prefill_tokens_per_s`` seconds), then waits
in the prompt pool until the router places it on one of ``G`` decode replicas. Replicas step in
lock-step; a step costs ``t0 + kappa * max_g L_g`` where ``L_g`` is replica ``g``'s resident KV
tokens (the paper's ``a*x + b`` with the barrier: the most loaded replica sets the pace). Every
running request gains one token per step and leaves after ``output_len`` steps. Each replica has
``max_slots`` request slots and ``kv_capacity`` KV tokens, enforced at admission and during
decode: a replica whose next step would overflow preempts its most recently admitted request
(vLLM's recompute preemption: back through prefill with ``prompt + decoded`` tokens, KV
dropped). See :mod:`straggler.sim.engine._loop` for the exact order of events.

Admission modes, bootstrap rooms, prefix caches, aggregated serving
-------------------------------------------------------------------
``admission="pool"`` (default): one central prompt pool; the router places a request only on a
replica with a free slot, where it starts at once (BalanceRoute's model; TensorRT-LLM's
capacity-limited fetch). The engines keep no queue, so ``n_waiting = waiting_tokens = 0`` in
the policies' view. ``admission="queue"``: vLLM's and SGLang's DP front ends route every request
on arrival (here: at the first tick after its prefill) to one engine's own FIFO queue, whatever
its slots; each engine admits from the head of its queue at every step while the head has a
slot and KV room (the first that does not fit blocks those behind it, FCFS). The router then
sees each engine's queue (``n_waiting``, ``waiting_tokens``: prompt + decoded tokens of the
queued requests), so vLLM's ``4*waiting`` / ``6*waiting*(kv - 0.5)`` weights and SGLang's
waiting tokens act as upstream; with ``stale > 0`` and the optimistic update, what the router
sent since its view is added to those queue counts. A preempted request goes back through
prefill and is routed again (vLLM re-queues it at the front of its own engine: not modelled).
``pool_wait_s`` counts pool and queue time together.

Every request carries a bootstrap room (:func:`bootstrap_rooms`: uniform in ``[0, 2**63-1]``,
seeded by ``seed``, as SGLang's router draws ``random.randint(0, 2**63 - 1)``), the
``PoolState.key`` every policy sees; ``follow_bootstrap_room`` routes by it.

With ``prefix_blocks`` (each request's prompt block hashes, e.g. Mooncake's ``hash_ids``),
every replica keeps an LRU cache of the blocks of the prompts it admitted, ``kv_capacity //
block_tokens`` blocks (blocks in use are not pinned); a request's cached prefix on a replica is
its leading blocks found there. The report gives ``prefix_hit_rate``; a policy that reads
``PoolState.cached`` (``dynamo``) sees it per visible request and replica.

``ctx_cost > 0`` models aggregated serving (TensorRT-LLM attention DP without disaggregation):
the context phase of a request runs inside the decode step of the replica that admits it,
``ctx_cost`` seconds per prompt token not found in its cache, and the step costs ``t0 +
max_g (kappa * L_g + ctx_cost * C_g)``. ``SimReport.token_balance`` is TensorRT-LLM's balance
ratio (mean/max tokens processed per step).

Offered load and the capacity that binds
----------------------------------------
The ``load`` knob is a multiple of the capacity of the stage that binds first: the smaller of
the decode cluster's (:func:`decode_capacity`) and the prefill instances'
(:func:`prefill_capacity`), unless ``load_basis`` names one of them. :func:`decode_capacity`: with
``r = mean(prompt + output / 2)`` the mean resident tokens of a request over its decode, each
replica runs at most ``c = min(max_slots, kv_capacity / r)`` requests at a time, a full
cluster steps in ``dt = t0 + kappa * c * r`` seconds, and a request holds its slot for
``mean(output)`` steps, so the cluster completes at most ``G * c / (mean(output) * dt)``
requests per second (Little's law). The offered load of a trace is its arrival rate
(``(n - 1) / (last arrival - first arrival)``) over that rate; ``simulate(..., load=X)``
rescales the arrival times (their order and gaps' shape kept) so that the offered load against
the basis is ``X``. Where decode binds, below 1.0 the
slots are not all busy (the real utilisation is in ``SimReport.slot_utilisation``, lower than
the load because emptier replicas also step faster); above it the pool grows.

The defaults (prefill capacity, step time) and their derivations:
:mod:`straggler.sim.engine.config`.
"""

from __future__ import annotations

import inspect
import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from ...formulations.errors import (
    InvalidInputError,
    InvalidOptionError,
    StragglerError,
    param_error,
)
from ...formulations.validation import check_choice, check_type
from ...solvers._numba.cache import cache_misses, is_cached
from ...solvers._numba.jit import cache_depends_on
from ...solvers.routing.policy import RoutingPolicy
from ...solvers.routing.predictors import (
    PredictorKind,
    TwoStagePredictor,
    calibration_report,
    termination_samples,
)
from ...solvers.routing.registry import DEFAULT_POLICY, get_routing_policy
from ...solvers.routing.route import new_request_presence
from ..workloads.prefix import PrefixBlocks
from ..workloads.traces import Trace, generate_trace
from ._loop import (
    SERIES,
    EngineInputs,
    EngineOutput,
    _table_size,
    engine_depends,
    engine_entry,
    no_two_stage,
    run_engine,
    run_engine_reference,
)
from .config import (
    ADMISSION_MODES,
    DEFAULT_PREFILL,
    DEFAULT_STEP_TIME,
    LOAD_BASES,
    SETTINGS,
    SimConfig,
)
from .deployment import DeploymentConfig, StepModel, running_step_model

__all__ = [
    "simulate",
    "engine_inputs",
    "SimRun",
    "warm_engine",
    "SimReport",
    "PREDICTORS",
    "DEFAULT_STEP_TIME",
    "DEFAULT_PREFILL",
    "decode_capacity",
    "prefill_capacity",
    "offered_load",
    "LOAD_BASES",
    "bootstrap_rooms",
    "ADMISSION_MODES",
]


def bootstrap_rooms(n: int, seed: int) -> np.ndarray:
    """The ``n`` requests' bootstrap rooms: uniform integers in ``[0, 2**63 - 1]`` from
    ``numpy.random.default_rng([seed, 0xB007])`` (SGLang's router draws each room with
    ``random.randint(0, 2**63 - 1)``; ``follow_bootstrap_room`` sends a request to rank
    ``room % G``, so the rank is uniform and independent of load).

    Examples
    --------
    >>> r = bootstrap_rooms(4, 0)
    >>> r.dtype, bool((r >= 0).all()), bootstrap_rooms(4, 0).tolist() == r.tolist()
    (dtype('int64'), True, True)
    """
    rng = np.random.default_rng([int(seed), 0xB007])
    return rng.integers(0, 2**63 - 1, size=int(n), dtype=np.int64, endpoint=True)


#: Predictors BR-H can use inside the simulator
#: (``straggler.solvers.routing.predictors.PredictorKind`` labels).
PREDICTORS = tuple(PredictorKind.names())

_FUNC = "simulate"


@dataclass(frozen=True, eq=False, kw_only=True)
class SimReport:
    """Metrics of one simulated run.

    Step metrics are given twice: over the **whole run** (every step, from the first to the
    last request's completion or ``max_steps``) and over the **window** (``window_*``: the
    steps that start before the trace's last arrival, the same stretch of simulated time for
    every policy). Request metrics cover every request that finished (pool waits: every
    request that reached the pool, the unfinished ones until the end of the run).

    Attributes
    ----------
    policy, trace : str
        Policy label (``"brh:oracle"`` for BR-H with a predictor) and trace name.
    n_replicas, n_requests, n_finished, n_unfinished, n_steps, n_ticks : int
    n_preempted : int
        Preemptions (a request preempted twice counts twice).
    offered_load : float
        Arrival rate over the capacity named by ``load_basis`` (the binding stage's by
        default; the ``load`` the run was given, or the trace's own).
    mean_imbalance : float
        Mean over steps of ``I = G*max L - sum L`` (tokens).
    balance_ratio : float
        Mean over steps (with ``max L > 0``) of ``mean L / max L``.
    throughput_tps : float
        Tokens decoded per second (one token per running request per step) over the run's span.
    mean_step_ms : float
        Mean step time.
    slot_utilisation : float
        Time-weighted mean of ``running / (G * max_slots)``.
    window_mean_imbalance, window_balance_ratio, window_throughput_tps, window_mean_step_ms,
    window_slot_utilisation : float
        The same over the window.
    tpot_p50_ms, tpot_p95_ms, tpot_p99_ms : float
        Time per output token of each finished request: ``(finish - first admission) /
        output_len`` (the mean step time over its decode, preemption stalls included).
    ttft_p50_ms, ttft_p99_ms : float
        Arrival to the end of the first decode step (prefill queue and prefill, pool wait,
        one step).
    queue_p50_ms, queue_p99_ms : float
        Time in the prompt pool per request (all its visits).
    max_pool_wait_s : float
        The longest time one request spent in the pool.
    sched_us_p50, sched_us_p99, sched_us_mean : float
        Router time per tick (the kernel call inside the jitted loop), microseconds.
    token_balance : float
        Mean over steps of ``mean_g P_g / max_g P_g`` with ``P_g`` the tokens replica ``g``
        processes in the step (its context-phase prompt tokens plus one per generating
        request): TensorRT-LLM's attention-DP balance ratio (1 when nothing runs).
    prefix_hit_rate : float
        With ``prefix_blocks`` (whatever the policy): prompt tokens found in the replica's
        prefix cache at each request's first admission over all admitted prompt tokens (the
        prefill a KV-aware router saves); NaN without.
    series : dict of ndarray
        Per step (``straggler.sim.engine._loop.SERIES``): ``time_s`` (start), ``step_s``,
        ``max_load``, ``sum_load``, ``running``, ``pool`` (requests waiting for a slot: the
        pool, and the engines' queues in queue mode), ``prefill`` (requests queued or in
        prefill), ``preempted``, ``ctx_tokens`` (the most context-phase tokens one replica
        admitted), ``token_balance`` (see above); and ``imbalance``.
    requests : dict of ndarray
        Per request (arrival order): ``arrival_s``, ``ready_s`` (first time in the pool),
        ``start_s`` (first admission), ``first_s``, ``finish_s``, ``replica``, ``prompt_len``,
        ``output_len``, ``n_preempt``, ``pool_wait_s``, ``enter_tick`` (routing ticks before its
        first entry into the pool; a request's wait at a tick is that tick's index minus it),
        ``admit_tick`` (the tick that first admitted it; -1: never), ``cache_hit`` (prompt
        tokens cached on its replica at its first admission).
    window : tuple of int
        ``(first, end)`` step indices of the window.
    config : dict
        Every setting of the run.
    wall_s : float
        Host time of the simulation (engine call).
    step_breakdown : dict
        With a ``deployment`` (MoE term on): the mean step decomposed, microseconds per step
        (``straggler.sim.engine.deployment.StepBreakdown``: ``attention_us``,
        ``attention_straggler_us``, ``moe_us``, ``moe_straggler_us``, ``comm_us``,
        ``dense_us``, ``total_us``, ``cross_node_tokens``), ``layers_simulated``,
        ``layer_scale``, ``placements``, ``table_refreshes``; the per-step values are in
        ``series`` under the same names. Empty without.
    offered_decode_load, offered_prefill_load : float
        The arrival rate over :func:`decode_capacity` and over :func:`prefill_capacity`
        (``offered_load`` is one of them, or their max, by ``load_basis``).
    binding_stage : str
        ``"prefill"`` when the prefill instances complete fewer requests per second than the
        decode cluster (they bind first as load grows), else ``"decode"``.
    prefill_utilisation : float
        Measured over the arrival window (first to last arrival): the prefill instances'
        busy time there (first prefills, ``prefill_base_s + prompt / rate`` ending when the
        request reached the pool; recomputes not counted) over ``prefill_instances`` times
        the window (NaN with unlimited instances).
    decode_utilisation : float
        Measured over the same window: ``window_slot_utilisation``.
    balancedness : float
        With a deployment's MoE term: the mean over steps of vLLM's balancedness of the step
        (``series["balancedness"]``, ``sum_l mean_g N_g / sum_l max_g N_g``); NaN without.
    rebalances : tuple of dict
        With a deployment's rebalance policy: every rearrangement
        (``straggler.sim.engine.deployment.StepModel.rebalances``: decided ``step`` and
        ``time_s``, ``copies``, ``bytes``, ``stall_s``, ``delay_s``, ``planning_s``,
        ``applied_step``, ``forced``); their totals are in ``step_breakdown``.
    """

    policy: str
    trace: str
    n_replicas: int
    n_requests: int
    n_finished: int
    n_unfinished: int
    n_steps: int
    n_ticks: int
    n_preempted: int
    offered_load: float
    mean_imbalance: float
    balance_ratio: float
    throughput_tps: float
    mean_step_ms: float
    slot_utilisation: float
    window_mean_imbalance: float
    window_balance_ratio: float
    window_throughput_tps: float
    window_mean_step_ms: float
    window_slot_utilisation: float
    tpot_p50_ms: float
    tpot_p95_ms: float
    tpot_p99_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    queue_p50_ms: float
    queue_p99_ms: float
    max_pool_wait_s: float
    sched_us_p50: float
    sched_us_p99: float
    sched_us_mean: float
    token_balance: float
    prefix_hit_rate: float
    series: dict[str, np.ndarray] = field(repr=False)
    requests: dict[str, np.ndarray] = field(repr=False)
    window: tuple[int, int]
    config: dict[str, Any] = field(repr=False)
    wall_s: float
    step_breakdown: dict[str, float] = field(default_factory=dict)
    offered_decode_load: float = float("nan")
    offered_prefill_load: float = float("nan")
    binding_stage: str = ""
    prefill_utilisation: float = float("nan")
    decode_utilisation: float = float("nan")
    balancedness: float = float("nan")
    rebalances: tuple = ()

    def summary(self) -> dict[str, float | str | int]:
        """The scalar fields as a plain dict (for JSON)."""
        skip = {"series", "requests", "config", "rebalances"}
        out = {}
        for k in self.__dataclass_fields__:
            if k in skip:
                continue
            v = getattr(self, k)
            out[k] = list(v) if isinstance(v, tuple) else v
        return out


def decode_capacity(
    trace: Trace,
    *,
    n_replicas: int,
    max_slots: int,
    kv_capacity: float,
    t0: float = DEFAULT_STEP_TIME[0],
    kappa: float = DEFAULT_STEP_TIME[1],
) -> dict[str, float]:
    """The decode cluster's capacity for ``trace``'s request mix (module docstring).

    Returns ``concurrency`` (requests per replica, ``min(max_slots, kv_capacity / r)`` with
    ``r = mean(prompt + output/2)``), ``step_s`` (the step time of a full cluster),
    ``rate_per_s`` (requests per second it completes: ``G * concurrency / (mean(output) *
    step_s)``) and ``tokens_per_s`` (decoded tokens per second, ``G * concurrency / step_s``).

    Examples
    --------
    >>> tr = Trace(arrival_s=[0, 1], prompt_len=[100, 100], output_len=[10, 10])
    >>> cap = decode_capacity(tr, n_replicas=2, max_slots=4, kv_capacity=10**6, t0=0.01, kappa=0)
    >>> cap["concurrency"], cap["rate_per_s"]
    (4.0, 80.0)
    """
    r = float(np.mean(trace.prompt_len + trace.output_len / 2.0))
    c = float(max_slots) if r <= 0 else min(float(max_slots), kv_capacity / r)
    step = t0 + kappa * c * r
    rate = n_replicas * c / (float(trace.output_len.mean()) * step)
    return {
        "concurrency": c,
        "step_s": step,
        "rate_per_s": rate,
        "tokens_per_s": n_replicas * c / step,
    }


def prefill_capacity(
    trace: Trace,
    *,
    prefill_instances: int,
    prefill_tokens_per_s: float = DEFAULT_PREFILL[0],
    prefill_base_s: float = DEFAULT_PREFILL[1],
) -> float:
    """Requests per second the prefill instances complete for ``trace``'s prompts:
    ``prefill_instances / (prefill_base_s + mean(prompt) / prefill_tokens_per_s)`` (``inf``
    for unlimited instances or prefills that take no time).

    Examples
    --------
    >>> tr = Trace(arrival_s=[0, 1], prompt_len=[1000, 3000], output_len=[10, 10])
    >>> prefill_capacity(tr, prefill_instances=2, prefill_tokens_per_s=1000, prefill_base_s=0)
    1.0
    """
    per = prefill_base_s + float(np.mean(trace.prompt_len)) / prefill_tokens_per_s
    if prefill_instances == 0 or per <= 0:
        return math.inf
    return prefill_instances / per


def offered_load(trace: Trace, **capacity) -> float:
    """``trace``'s arrival rate over :func:`decode_capacity` (``inf`` when every request
    arrives at once; ``capacity``: its keyword arguments).

    Examples
    --------
    >>> tr = Trace(arrival_s=[0, 1], prompt_len=[100, 100], output_len=[10, 10])
    >>> offered_load(tr, n_replicas=2, max_slots=4, kv_capacity=10**6, t0=0.01, kappa=0)
    0.0125
    """
    if len(trace) < 2 or trace.duration_s <= 0:
        return math.inf
    rate = (len(trace) - 1) / trace.duration_s
    return rate / decode_capacity(trace, **capacity)["rate_per_s"]


def _survival_tables(output_len: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Age-indexed ``(p_fin, mu_rem)`` of H4's empirical-survival predictor fitted on
    ``output_len``, for ages ``0..max(output_len)`` (older ages use the last entry)."""
    from ...solvers.routing.predictors import SurvivalPredictor

    pred = SurvivalPredictor(output_len)
    ages = np.arange(int(output_len.max()) + 1, dtype=np.float64)
    p, mu = pred.predict(np.zeros_like(ages), ages, horizon)
    return np.ascontiguousarray(p, dtype=np.float64), np.ascontiguousarray(mu, dtype=np.float64)


def _two_stage(trace: Trace, horizon: int, fit) -> tuple[tuple, dict[str, Any]]:
    """The engine's ``two_stage`` tuple for ``trace`` (in trace order) and a summary.

    ``fit``: None (cross-fitting on the two halves of the trace in arrival order: the model
    fitted on the first half predicts the second half's requests and vice versa), ``"in_sample"``
    (one model fitted on every request of ``trace``), a :class:`Trace` (one model fitted on it),
    or a fitted ``straggler.solvers.routing.predictors.TwoStagePredictor`` for ``horizon``.
    The
    summary holds the split and a :func:`~straggler.solvers.routing.predictors.calibration_report`
    of
    the classifier on ``trace``'s requests, each predicted by its own model (out of fold for the
    cross-fit), on samples every ``H/2`` tokens from a random first age (all ages covered).
    """
    n = len(trace)
    s, o = trace.prompt_len, trace.output_len
    fold = np.zeros(n, dtype=np.int64)
    try:
        if fit is None:
            half = n // 2
            if half < 1:
                raise InvalidInputError("Cross-fitting needs at least two requests.")
            models = [
                TwoStagePredictor(horizon).fit(s[:half], o[:half]),
                TwoStagePredictor(horizon).fit(s[half:], o[half:]),
            ]
            fold[:half] = 1  # the first half is predicted by the model of the second
            how = f"cross-fit halves ({half} + {n - half} requests)"
        elif isinstance(fit, str) and fit == "in_sample":
            models = [TwoStagePredictor(horizon).fit(s, o)]
            how = f"in sample ({n} requests)"
        elif isinstance(fit, Trace):
            models = [TwoStagePredictor(horizon).fit(fit.prompt_len, fit.output_len)]
            how = f"trace {fit.name!r} ({len(fit)} requests)"
        elif isinstance(fit, TwoStagePredictor):
            models = [fit]
            how = "given TwoStagePredictor"
        else:
            models, how = [], ""
    except InvalidInputError as e:
        raise param_error(
            "predictor_fit",
            _FUNC,
            f"training data for the two-stage predictor at horizon {horizon} (requests that "
            "finish within it and requests that do not)",
            f"a failed fit ({str(e).rstrip('.')})",
        ) from None
    if not models:
        raise param_error(
            "predictor_fit",
            _FUNC,
            'None, "in_sample", a Trace or a fitted TwoStagePredictor',
            repr(fit),
            InvalidOptionError,
        )
    if isinstance(fit, TwoStagePredictor) and (fit.w is None or fit.horizon != horizon):
        raise param_error(
            "predictor_fit",
            _FUNC,
            f"a TwoStagePredictor fitted for horizon {horizon}",
            f"one {'fitted' if fit.w is not None else 'not fitted'} for {fit.horizon}",
        )
    arrays = [m.model_arrays() for m in models]
    B = max(a[2].shape[1] for a in arrays)
    iso = np.zeros((len(models), 2, B))
    for k, a in enumerate(arrays):
        iso[k, :, : a[2].shape[1]] = a[2]
        iso[k, 0, a[2].shape[1] :] = np.inf
        iso[k, 1, a[2].shape[1] :] = a[2][1, -1]
    ts = (
        fold,
        np.ascontiguousarray(np.stack([a[0] for a in arrays])),
        np.ascontiguousarray(np.stack([a[1] for a in arrays])),
        iso,
        np.array([a[3] for a in arrays], dtype=np.int64),
    )
    # calibration on the simulated requests, each by its own model
    ps, ys = [], []
    for k, m in enumerate(models):
        sel = fold == k
        if sel.any():
            cs, ca, cy, _ = termination_samples(s[sel], o[sel], horizon, rng=k)
            if cs.size:
                ps.append(m.predict(cs, ca, horizon)[0])
                ys.append(cy)
    rep = calibration_report(np.concatenate(ps), np.concatenate(ys))
    info = dict(
        fit=how,
        brier=rep.brier,
        log_loss=rep.log_loss,
        auc=rep.auc,
        ece=rep.ece,
        n_samples=rep.n,
    )
    return ts, info


def _groups(prefix_hash: np.ndarray | None, n: int) -> tuple[np.ndarray, int]:
    if prefix_hash is None:
        return np.full(n, -1, dtype=np.int64), 0
    known = prefix_hash >= 0
    uniq, inv = np.unique(prefix_hash[known], return_inverse=True)
    g = np.full(n, -1, dtype=np.int64)
    g[known] = inv
    return g, int(uniq.size)


class SimRun(NamedTuple):
    """One run as :func:`simulate` hands it to the step loop (:func:`engine_inputs`).

    ``config`` the run's :class:`~straggler.sim.engine.config.SimConfig`; ``trace`` the trace
    as simulated (``min_output`` filter applied, arrivals rescaled to the load); ``inputs`` the
    loop's :class:`~straggler.sim.engine._loop.EngineInputs` (``moe_key`` -1: the run
    registers its step model when it starts); ``record`` the report's record of every
    setting (:attr:`SimReport.config`); ``step_model`` the run's own
    :class:`~straggler.sim.engine.deployment.StepModel` (None without a deployment's MoE
    term)."""

    config: SimConfig
    trace: Trace
    inputs: EngineInputs
    record: dict[str, Any]
    step_model: StepModel | None

    @property
    def policy(self) -> RoutingPolicy:
        """The routing policy's registry entry (kernel and reference)."""
        return self.config.routing_policy


def _simulated_trace(trace, config: SimConfig) -> tuple[Trace, PrefixBlocks | None, dict]:
    """The run-time checks that need the trace (its type, the prefix blocks' alignment, the
    KV capacity against the longest request), then the trace as simulated (the
    ``min_output`` filter, the load's rescaling); returns ``(trace, blocks, record)`` with
    ``record`` the report's record of every setting and of the offered load."""
    f = _FUNC
    cfg = config.as_dict()
    cl, pf, run = config.cluster, config.prefill, config.run
    if isinstance(trace, str):
        trace = generate_trace(trace)
    check_type(trace, "trace", f, Trace, "a Trace or a generator preset name")
    blocks = config.prefix_cache.blocks
    if blocks is not None:
        if len(blocks) != len(trace):
            raise param_error(
                "prefix_blocks",
                f,
                f"one block list per request of the trace ({len(trace)})",
                f"{len(blocks)} lists",
            )
        most = -(-trace.prompt_len // blocks.block_tokens)
        bad = np.flatnonzero(blocks.counts() > most)
        if bad.size:
            i = int(bad[0])
            raise param_error(
                "prefix_blocks",
                f,
                f"at most ceil(prompt / {blocks.block_tokens}) blocks per request (aligned with "
                "the trace)",
                f"{int(blocks.counts()[i])} blocks for request {i} of {int(trace.prompt_len[i])} "
                "tokens",
            )
    if run.min_output > 0:
        keep = trace.output_len >= run.min_output
        trace = trace.subset(keep).rebase()
        blocks = None if blocks is None else blocks.subset(keep)
    if len(trace) == 0:
        raise param_error("trace", f, "a non-empty Trace (after the min_output filter)", "none")
    longest = int((trace.prompt_len + trace.output_len).max())
    if longest > cl.kv_capacity:
        raise param_error(
            "kv_capacity",
            f,
            "at least the longest request of the trace (prompt + output, as vLLM's "
            "max_model_len must fit the KV cache)",
            f"{cl.kv_capacity} < {longest}",
        )
    cap = dict(
        n_replicas=cl.n_replicas,
        max_slots=cl.max_slots,
        kv_capacity=float(cl.kv_capacity),
        t0=cl.t0,
        kappa=cl.kappa,
    )
    load = run.load
    if load is None and run.saturated:
        load = run.overload
    prefill = dict(
        prefill_instances=pf.instances,
        prefill_tokens_per_s=pf.tokens_per_s,
        prefill_base_s=pf.base_s,
    )
    basis = run.load_basis
    own_decode = offered_load(trace, **cap)
    ratio = decode_capacity(trace, **cap)["rate_per_s"] / prefill_capacity(trace, **prefill)
    # the basis capacity over the decode capacity: offered loads convert by this factor
    if basis == "prefill" and ratio == 0.0:
        raise param_error(
            "load_basis", f, "'decode' or 'binding' with unlimited prefill (no prefill "
            "capacity to measure against)", repr(basis),
        )  # fmt: skip
    scale = {"decode": 1.0, "prefill": ratio, "binding": max(1.0, ratio)}[basis]
    own = own_decode * scale
    if load is not None:
        if not math.isfinite(own):
            raise param_error(
                "load", f, "None for a trace whose requests all arrive at once", repr(load)
            )
        trace = trace.rebase().compress(load / own)
        trace = Trace(
            arrival_s=trace.arrival_s,
            prompt_len=trace.prompt_len,
            output_len=trace.output_len,
            prefix_hash=trace.prefix_hash,
            name=trace.name,
            meta={**trace.meta, "load": load},
        )
    cfg["offered_load"] = offered_load(trace, **cap) * scale if load is None else load
    cfg["capacity"] = decode_capacity(trace, **cap)
    decode_load = cfg["offered_load"] / scale
    cfg["offered_decode_load"] = decode_load
    cfg["offered_prefill_load"] = decode_load * ratio
    cfg["binding_stage"] = "prefill" if ratio > 1.0 else "decode"
    cfg["prefix_cache"] = blocks is not None
    cfg["prefix_cache_router"] = bool(config.routing_policy.prefix_cache and blocks is not None)
    return trace, blocks, cfg


def engine_inputs(trace, config: SimConfig) -> SimRun:
    """:func:`simulate` up to the step loop: the trace as simulated (filtered, rescaled),
    the loop's inputs and the report's record of the settings, as a ``SimRun`` (for
    checks of the engine against its plain-Python reference)."""
    check_type(config, "config", _FUNC, SimConfig, "a SimConfig")
    trace, blocks, cfg = _simulated_trace(trace, config)
    cl, pf, rt, step = config.cluster, config.prefill, config.routing, config.step
    pred_kind, H = config.pred_kind, config.horizon
    ropts = config.router_options
    n = len(trace)
    prompt = np.array(trace.prompt_len, dtype=np.int64)  # writable copies: one engine signature
    output = np.array(trace.output_len, dtype=np.int64)
    group, n_groups = _groups(trace.prefix_hash, n)
    if pred_kind in (PredictorKind.SURVIVAL, PredictorKind.EXACT_MATCH):
        surv_p, surv_mu = _survival_tables(trace.output_len, H)
    else:
        surv_p, surv_mu = np.zeros(1), np.ones(1)
    if pred_kind == PredictorKind.TWO_STAGE:
        two_stage, cfg["two_stage"] = _two_stage(trace, H, config.predictor.fit)
    else:
        two_stage = no_two_stage()
    if config.predictor.new_presence:
        pi = new_request_presence(trace.output_len, H)
        # the policy's vector option (BR-H's new_presence), from the trace
        ropts = ropts._replace(vector=np.ascontiguousarray(pi, dtype=np.float64))
    max_steps = config.run.max_steps
    if max_steps is None:
        max_steps = int(output.sum()) + 11 * n + 1000
    cfg["max_steps"] = max_steps
    blk_off, blk_ids, blk_tokens = np.zeros(n + 1, dtype=np.int64), np.zeros(0, np.int64), 1
    if blocks is not None:  # dense ids, so that id * G + replica is a unique int64 key
        blk_off = np.array(blocks.offsets, dtype=np.int64)  # a writeable copy: one engine type
        blk_ids = np.unique(blocks.ids, return_inverse=True)[1].astype(np.int64)
        blk_tokens = int(blocks.block_tokens)
    cache_blocks = int(cl.kv_capacity) // blk_tokens
    # the most (block, replica) keys the caches hold at once: each replica's capacity (one
    # more while a touch evicts), at most every distinct block on every replica
    n_blk = int(blk_ids.max()) + 1 if blk_ids.size else 0
    cache_keys = cl.n_replicas * min(cache_blocks, n_blk) + 1 if n_blk else 0
    rate = pf.tokens_per_s
    inp = EngineInputs(
        options=ropts,
        carry=config.router_carry,
        arrival_t=np.array(trace.arrival_s, dtype=np.float64),
        prompt=prompt,
        output=output,
        group=group,
        n_groups=int(n_groups),
        n_replicas=int(cl.n_replicas),
        max_slots=int(cl.max_slots),
        kv_cap=int(cl.kv_capacity),
        t0=float(step.t0),
        kappa=float(step.kappa),
        prefill_instances=int(pf.instances),
        prefill_base_s=float(pf.base_s),
        prefill_per_token_s=0.0 if math.isinf(rate) else 1.0 / rate,
        tick=int(rt.tick),
        stale=int(rt.stale),
        optimistic=bool(rt.optimistic),
        max_pool=int(rt.max_pool),
        horizon=int(H),
        pred_kind=int(pred_kind),
        surv_p=surv_p,
        surv_mu=surv_mu,
        refill=bool(config.predictor.refill),
        ts_fold=np.ascontiguousarray(two_stage[0], dtype=np.int64),
        ts_knots=np.ascontiguousarray(two_stage[1], dtype=np.float64),
        ts_lin=np.ascontiguousarray(two_stage[2], dtype=np.float64),
        ts_iso=np.ascontiguousarray(two_stage[3], dtype=np.float64),
        ts_nb=np.ascontiguousarray(two_stage[4], dtype=np.int64),
        seed=int(config.run.seed),
        max_steps=int(max_steps),
        time_router=bool(config.run.time_router),
        queue_mode=cl.admission == "queue",
        room=bootstrap_rooms(n, config.run.seed),
        use_cache=blocks is not None,
        cache_router=cfg["prefix_cache_router"],
        blk_off=blk_off,
        blk_ids=blk_ids,
        blk_tokens=blk_tokens,
        cache_blocks=cache_blocks,
        cache_slots=_table_size(cache_keys),
        ctx_cost=float(step.ctx_cost),
        deploy=step.deploy,
        n_layers=step.n_layers,
        att_c=float(step.att_c),
        fixed_s=float(step.fixed_s),
    )
    return SimRun(config, trace, inp, cfg, config.new_step_model())


def simulate(
    trace: Trace | str = "bursty",
    policy: str | None = None,
    *,
    n_replicas: int = 8,
    max_slots: int = 16,
    kv_capacity: int = 500_000,
    t0: float = DEFAULT_STEP_TIME[0],
    kappa: float = DEFAULT_STEP_TIME[1],
    load: float | None = None,
    prefill_instances: int | None = None,
    prefill_tokens_per_s: float = DEFAULT_PREFILL[0],
    prefill_base_s: float = DEFAULT_PREFILL[1],
    tick: int = 1,
    stale: int = 0,
    optimistic: bool = True,
    max_pool: int = 256,
    predictor: str | None = None,
    horizon: int | None = None,
    predictor_fit: Trace | TwoStagePredictor | str | None = None,
    refill: bool = False,
    new_presence: bool = False,
    saturated: bool = False,
    min_output: int = 0,
    overload: float = 1.5,
    seed: int = 0,
    max_steps: int | None = None,
    engine: str = "numba",
    time_router: bool = True,
    admission: str = "pool",
    prefix_blocks: PrefixBlocks | None = None,
    ctx_cost: float = 0.0,
    deployment: DeploymentConfig | None = None,
    load_basis: str = "binding",
    config: SimConfig | None = None,
    dispatch: str | None = None,
    **options,
) -> SimReport:
    """Replay ``trace`` on ``n_replicas`` lock-step decode replicas routed by ``policy``.

    Parameters
    ----------
    trace : Trace or str
        A :class:`~straggler.sim.workloads.traces.Trace`, or the name of a generator preset (default
        ``"bursty"``: one hour of the shipped generator, seed 0).
    policy : str, optional
        A registered routing policy (:func:`~straggler.solvers.routing_policies`; default
        :data:`~straggler.solvers.DEFAULT_POLICY`). ``brh`` uses ``predictor`` and
        ``horizon``.
    n_replicas : int
        ``G`` decode replicas.
    max_slots : int
        Request slots per replica (its decode batch size).
    kv_capacity : int
        KV tokens per replica, enforced at admission (a request is admitted when its tokens
        and the next step's token of every running request fit) and during decode (vLLM's
        recompute preemption, module docstring). Must hold the longest request (prompt +
        output).
    t0, kappa : float
        Step time ``t0 + kappa * max_g L_g`` (seconds, seconds per token); defaults in
        :data:`DEFAULT_STEP_TIME`, derived in the module docstring.
    load : float, optional
        Offered load as a multiple of the capacity of the stage that binds (``load_basis``,
        by default the smaller of the decode cluster's :func:`decode_capacity`, defined in the
        module docstring, and the prefill instances' :func:`prefill_capacity`): arrivals are
        rescaled so the trace's arrival rate is ``load`` times the rate that stage completes
        requests at. Default: the trace's timestamps as recorded (``SimReport.offered_load``
        says what that is).
    prefill_instances : int, optional
        Prefill instances serving arrivals first come, first served (default ``ceil(G/2)``;
        0: unlimited, every prefill starts on arrival).
    prefill_tokens_per_s, prefill_base_s : float
        A prefill takes ``prefill_base_s + tokens / prefill_tokens_per_s`` on one instance
        (defaults :data:`DEFAULT_PREFILL`: 50,000 tokens/s, 20 ms; ``inf``: only the fixed
        part). A preempted request's recompute prefills ``prompt + decoded`` tokens.
    tick : int
        A routing tick every ``tick`` steps.
    stale : int
        The router sees loads (projections, counts, prompt tokens) ``stale`` steps old.
    optimistic : bool
        Optimistic local update: within a tick each policy adds a placed request's tokens to
        its copy of the replica's load (policy option ``optimistic``); across ticks, with
        ``stale > 0``, what was placed since the stale snapshot is added too. False turns
        off both.
    max_pool : int
        The router sees the oldest ``max_pool`` requests of the pool.
    predictor : {"survival", "exact_match", "oracle", "two_stage"}, optional
        For a policy that reads projected loads (``brh``; default ``"survival"``): empirical
        survival (ECDF of the trace's output lengths by age, H4's ``SurvivalPredictor``),
        exact-match (output length of the last finished request with the same prompt hash,
        falling back to survival; traces without hashes fall back always), oracle (true
        remaining length), two-stage (the paper's calibrated termination classifier and
        conditional-mean regressor on prompt length and age,
        ``straggler.solvers.routing.predictors.TwoStagePredictor`` trained for ``horizon``;
        see
        ``predictor_fit``). The survival ECDF is fitted on the simulated trace itself (the
        marginal output lengths); the two-stage model by default is not. A
        ``straggler.solvers.routing.predictors.PredictorKind`` is accepted too.
    horizon : int, optional
        BR-H's ``H`` (default 80, the paper's).
    predictor_fit : None, "in_sample", Trace or TwoStagePredictor
        Training data of the two-stage predictor (only with ``predictor="two_stage"``).
        Default None: cross-fitting on the simulated trace, split in two halves by arrival;
        the model fitted on the first half predicts the requests of the second half and vice
        versa, so no request is predicted by a model that saw it. ``"in_sample"``: one model
        fitted on all simulated requests (optimistic). A
        :class:`~straggler.sim.workloads.traces.Trace`:
        one model fitted on it. A fitted ``TwoStagePredictor`` (for ``horizon``): used as
        is. ``config["two_stage"]`` of the report records the split and the classifier's
        calibration (Brier, log loss, AUC, ECE) on the simulated requests.
    refill : bool
        BR-H, not in the paper (default False): project that a slot freed within the horizon
        is refilled by a request of the mean prompt length of the router's visible pool
        (:func:`~straggler.solvers.routing.route.project_loads` ``refill``).
    new_presence : bool
        BR-H, not in the paper (default False): weigh horizon column ``h`` of the F-score by
        ``pi_h = P(output > h)`` of the trace's output lengths (``route_batch`` option
        ``new_presence``). ``benchmarks/routing_table.py`` ("+fix" rows) measures both.
    saturated : bool
        The paper's setting: ``load=overload`` unless ``load`` is given (with ``min_output``
        the paper's filter of long outputs).
    min_output : int
        Keep only the requests with ``output_len >= min_output`` (default all).
    overload : float
        The load of ``saturated=True`` (default 1.5).
    seed : int
        Seed of the seeded policies (per tick: ``seed * 1_000_003 + step``) and of the
        requests' bootstrap rooms (:func:`bootstrap_rooms`, the pool key every policy sees).
    max_steps : int, optional
        Stop after this many steps (default: enough for every request, ``sum(output) +
        11 * n + 1000``); requests left are counted in ``n_unfinished``.
    engine : {"numba", "python"}
        The jitted step loop or its plain-Python reference (slow; for checks).
    time_router : bool
        Time each router call (a monotonic clock read around it).
    admission : {"pool", "queue"}
        Where a routed request waits for its slot. ``"pool"`` (default; BalanceRoute's model
        and TensorRT-LLM's capacity-limited fetch): one central prompt pool, a request is
        routed only to a replica with a free slot and starts at once. ``"queue"`` (vLLM's and
        SGLang's DP front ends): every ready request is routed at the next tick to one
        engine's own FIFO queue, whatever its slots; each engine admits from the head of its
        queue at every step while the head fits (a slot and KV room), so ``n_waiting`` and
        ``waiting_tokens`` are the queues the policies see (module docstring, "Admission
        modes").
    prefix_blocks : PrefixBlocks, optional
        Each request's prompt blocks (:func:`~straggler.sim.workloads.prefix.load_prefix_blocks`
        for a
        Mooncake trace), aligned with ``trace``. Each replica then keeps an LRU cache of the
        blocks of the prompts it admitted (``kv_capacity // block_tokens`` blocks; blocks in
        use are not pinned) and the report gives ``prefix_hit_rate``; a policy that reads
        prefix-cache data (``dynamo``) sees each visible request's cached prompt tokens per
        replica. Without it such a policy gets no credit.
    ctx_cost : float
        Seconds per token of a context (prefill) phase run inside the decode step of the
        replica that admits the request: the step costs ``t0 + max_g (kappa * L_g + ctx_cost *
        C_g)`` with ``C_g`` the prompt tokens ``g`` admitted at that step, less their prefix
        found in ``g``'s cache when ``prefix_blocks`` is given (aggregated serving,
        e.g. TensorRT-LLM attention DP without disaggregation; pair it with
        ``prefill_instances=0, prefill_base_s=0, prefill_tokens_per_s=inf`` so requests are
        ready on arrival). Default 0: PD disaggregation, prefill elsewhere.
    deployment : DeploymentConfig, optional
        Price every step with the deployment step model (``straggler.sim.engine.deployment``):
        ``n_layers`` times the slowest rank's attention ``a + b L_g + c R_g`` (plus its
        context tokens at ``ctx_cost / n_layers`` per layer), the MoE layers (placement,
        dispatch, routing model of the config) and the dense layers; ``t0`` and ``kappa``
        are then replaced by the preset's attention, and ``load`` is measured against the
        deployment's full-batch step (``max_slots`` requests per rank,
        ``deployment.full_batch_step``). Its ``n_gpus`` must equal
        ``n_replicas``. ``SimReport.step_breakdown`` decomposes the mean step.
    load_basis : {"binding", "decode", "prefill"}, default "binding"
        The capacity ``load`` (and ``SimReport.offered_load``) is a multiple of: whichever of
        the decode cluster's (:func:`decode_capacity`) and the prefill instances'
        (:func:`prefill_capacity`) is smaller (``"binding"``, the default: ``load=1`` is the
        rate at which the first stage saturates), the decode cluster's (``"decode"``), or the
        prefill instances' (``"prefill"``). With unlimited prefill (``prefill_instances=0``)
        ``"binding"`` is ``"decode"``. ``SimReport`` gives the offered load against both and
        the binding stage either way.
    config : SimConfig, optional
        Every setting as one record (:class:`~straggler.sim.engine.config.SimConfig`); then
        ``policy``, options and every other keyword but ``trace`` must be left out. By default
        one is built from the keywords (``SimConfig.from_settings``).
    dispatch : {"pool", "queue"}, optional
        Deprecated (a :class:`DeprecationWarning`): the former name of ``admission``
        (``dispatch`` names the expert-parallel problem everywhere else, e.g.
        ``DeploymentConfig.dispatch``).
    **options
        The policy's options, declared in its module (``r_max``, ``s_greedy`` of BR-0,
        ``alpha``, ``beta``, ``gamma`` of BR-H, ``cursor`` of round-robin, ...; see
        :func:`~straggler.solvers.route_batch`); a policy refuses an option it does not
        declare.

    Returns
    -------
    SimReport

    Raises
    ------
    InvalidInputError
        A bad setting (the message names it), a trace that does not fit the KV capacity.
    InvalidOptionError
        An unknown policy or predictor, an option or projection setting the policy does not
        read.

    Examples
    --------
    >>> from straggler.sim.workloads.traces import Trace
    >>> tr = Trace(arrival_s=[0, 0, 0], prompt_len=[100, 50, 50], output_len=[2, 2, 2])
    >>> r = simulate(tr, "jsq", n_replicas=2, max_slots=2, t0=0.01, kappa=0.0,
    ...              prefill_instances=0, prefill_base_s=0.0,
    ...              prefill_tokens_per_s=float("inf"), engine="python")
    >>> r.n_finished, r.n_steps, r.series["max_load"].tolist(), r.mean_imbalance
    (3, 2, [100.0, 102.0], 0.5)
    """
    settings = {name: value for name, value in locals().items() if name in SETTINGS}
    if dispatch is not None:
        settings["admission"] = _admission_from_dispatch(dispatch, admission)
    config = _config(policy, settings, options, config)
    run = engine_inputs(trace, config)
    out, wall = _run(run)
    return _report(run, out, wall)


def _admission_from_dispatch(dispatch, admission) -> str:
    """``admission`` from its deprecated name ``dispatch`` (checked under that name)."""
    warnings.warn(
        "simulate(dispatch=...) is deprecated: use admission=... (same values)",
        DeprecationWarning,
        stacklevel=3,
    )
    if admission != "pool":
        raise param_error(
            "dispatch", _FUNC, "None when admission is given (its deprecated name)", repr(dispatch)
        )
    return check_choice(dispatch, "dispatch", _FUNC, list(ADMISSION_MODES))


def _config(policy, settings: dict, options: dict, config: SimConfig | None) -> SimConfig:
    """The run's :class:`SimConfig`: built from the keywords, or ``config`` when given (then
    with no other setting)."""
    if config is None:
        return SimConfig.from_settings(policy, **settings, **options)
    own = [k for k, v in settings.items() if not _is_default(k, v)]
    if policy is not None or options or own:
        given = ["policy"] * (policy is not None) + sorted(options) + own
        raise param_error(
            "config",
            _FUNC,
            "the only setting when given (a SimConfig holds the policy, its options and "
            "every other setting)",
            f"also {', '.join(given)}",
        )
    return config


def _run(run: SimRun) -> tuple[EngineOutput, float]:
    """The step loop on ``run`` (the jitted loop, or its reference with ``engine="python"``),
    with the run's step model registered for the MoE term; returns the loop's output and its
    host time in seconds."""
    pol = run.policy
    with running_step_model(run.step_model) as key:
        inp = run.inputs._replace(moe_key=key)
        w0 = time.perf_counter()
        if run.config.run.engine == "numba":
            out = engine_entry(pol, inp)(inp)
        else:
            out = run_engine_reference(inp, pol.reference)
        wall = time.perf_counter() - w0
    return out, wall


def _is_default(name: str, value) -> bool:
    d = inspect.signature(simulate).parameters[name].default
    return value is d or (isinstance(value, (int, float, str)) and value == d)


def _jitted(policies) -> list:
    """The step loop and the kernels of ``policies`` (names): what a first ``simulate``
    compiles."""
    return [run_engine, *(get_routing_policy(p, _FUNC).kernel for p in policies)]


def engine_cache_is_warm(policies=(DEFAULT_POLICY,)) -> bool:
    """Whether numba's disk cache holds, for the current sources, the step loop (compiled
    once for every policy) and the kernel of each of ``policies`` (names): a quick look at
    numba's indexes; False when it cannot tell."""
    try:
        cache_depends_on(run_engine, *engine_depends())
        kernels = _jitted(policies)
    except Exception:  # noqa: BLE001 - an unknown policy: "do not know"
        return False
    return all(is_cached(f) for f in kernels)


def warm_engine(policies=(DEFAULT_POLICY,)) -> tuple[float, bool]:
    """Load (or compile, the first time) the jitted step loop and the kernel of each of
    ``policies`` (names); returns ``(seconds, compiled)``, ``compiled`` True when one had to
    compile (no usable disk cache). A command calls it first so the compile is announced and
    not charged to a run.

    Examples
    --------
    >>> seconds, compiled = warm_engine(["jsq"])
    >>> seconds >= 0.0 and isinstance(compiled, bool)
    True
    """

    def misses():
        return cache_misses(_jitted(policies))

    before = misses()
    t0 = time.perf_counter()
    tr = Trace(arrival_s=[0.0, 0.0], prompt_len=[5, 5], output_len=[2, 2])
    for p in policies:
        simulate(tr, p, n_replicas=2, max_slots=2)
    return time.perf_counter() - t0, misses() > before


def _hit_rate(out, trace, cfg) -> float:
    if not cfg["prefix_cache"]:
        return float("nan")
    admitted = ~np.isnan(out.start_t)
    total = float(trace.prompt_len[admitted].sum())
    return float(out.cache_hit[admitted].sum()) / total if total > 0 else 0.0


def _pct(x: np.ndarray, q: float, scale: float) -> float:
    return float(np.percentile(x, q) * scale) if x.size else float("nan")


def _step_metrics(G, slots, clock, dt, mx, sm, running, lo, hi) -> dict[str, float]:
    """Imbalance, balance ratio, throughput, step time and slot use over steps ``lo:hi``."""
    if hi <= lo:
        nan = float("nan")
        return dict(imb=0.0, ratio=1.0, thr=0.0, step=nan, util=nan)
    w = slice(lo, hi)
    span = clock[hi - 1] + dt[hi - 1] - clock[lo]
    pos = mx[w] > 0
    busy = float(dt[w].sum())
    return dict(
        imb=float((G * mx[w] - sm[w]).mean()),
        ratio=float(np.mean(sm[w][pos] / G / mx[w][pos])) if pos.any() else 1.0,
        thr=float(running[w].sum() / span) if span > 0 else 0.0,
        step=float(dt[w].mean() * 1e3),
        util=float((running[w] * dt[w]).sum() / (G * slots * busy)) if busy > 0 else 0.0,
    )


def _report(run: SimRun, out: EngineOutput, wall: float) -> SimReport:
    """The run's metrics from the loop's output (and, with one, the step model's
    decomposition of every step)."""
    trace, cfg, model = run.trace, run.record, run.step_model
    G, slots = cfg["n_replicas"], cfg["max_slots"]
    series = out.series
    n_steps = series.shape[0]
    cols = {name: series[:, j] for j, name in enumerate(SERIES)}
    clock, dt, mx, sm, running = (
        cols[k] for k in ("time_s", "step_s", "max_load", "sum_load", "running")
    )
    imb = G * mx - sm
    whole = _step_metrics(G, slots, clock, dt, mx, sm, running, 0, n_steps)
    # the window: steps that start before the last arrival (the same time for every policy)
    hi = int(np.searchsorted(clock, trace.arrival_s[-1], side="left")) if n_steps else 0
    hi = max(min(hi, n_steps), min(1, n_steps))
    win = _step_metrics(G, slots, clock, dt, mx, sm, running, 0, hi)
    done = ~np.isnan(out.finish_t)
    tpot = (out.finish_t[done] - out.start_t[done]) / trace.output_len[done]
    has_first = ~np.isnan(out.first_t)
    ttft = out.first_t[has_first] - trace.arrival_s[has_first]
    reached = ~np.isnan(out.ready_t)
    queue = out.pool_wait[reached]
    us = out.tick_ns / 1e3
    timed = cfg["engine"] == "numba" and cfg["time_router"]
    series_out = dict(cols)
    series_out["imbalance"] = imb
    breakdown: dict[str, float] = {}
    if model is not None:
        if model.n_steps != n_steps:  # the engine prices every step once
            raise StragglerError(f"step model priced {model.n_steps} steps of {n_steps}")
        series_out.update(model.breakdowns())
        breakdown = model.summary()
    n_inst, rate = cfg["prefill_instances"], cfg["prefill_tokens_per_s"]
    a0, a1 = float(trace.arrival_s[0]), float(trace.arrival_s[-1])
    pf_util = float("nan")
    if n_inst > 0 and a1 > a0:  # first prefills' busy time inside the arrival window
        end = out.ready_t[reached]
        begin = end - (cfg["prefill_base_s"] + trace.prompt_len[reached] / rate)
        busy = np.clip(np.minimum(end, a1) - np.maximum(begin, a0), 0.0, None).sum()
        pf_util = float(busy / (n_inst * (a1 - a0)))
    return SimReport(
        policy=run.config.label,
        trace=trace.name,
        n_replicas=G,
        n_requests=len(trace),
        n_finished=int(done.sum()),
        n_unfinished=int((~done).sum()),
        n_steps=int(n_steps),
        n_ticks=int(out.tick_ns.size),
        n_preempted=int(out.n_preempt.sum()),
        offered_load=float(cfg["offered_load"]),
        mean_imbalance=whole["imb"],
        balance_ratio=whole["ratio"],
        throughput_tps=whole["thr"],
        mean_step_ms=whole["step"],
        slot_utilisation=whole["util"],
        window_mean_imbalance=win["imb"],
        window_balance_ratio=win["ratio"],
        window_throughput_tps=win["thr"],
        window_mean_step_ms=win["step"],
        window_slot_utilisation=win["util"],
        tpot_p50_ms=_pct(tpot, 50, 1e3),
        tpot_p95_ms=_pct(tpot, 95, 1e3),
        tpot_p99_ms=_pct(tpot, 99, 1e3),
        ttft_p50_ms=_pct(ttft, 50, 1e3),
        ttft_p99_ms=_pct(ttft, 99, 1e3),
        queue_p50_ms=_pct(queue, 50, 1e3),
        queue_p99_ms=_pct(queue, 99, 1e3),
        max_pool_wait_s=float(queue.max()) if queue.size else 0.0,
        sched_us_p50=_pct(us, 50, 1.0) if timed else float("nan"),
        sched_us_p99=_pct(us, 99, 1.0) if timed else float("nan"),
        sched_us_mean=float(us.mean()) if us.size and timed else float("nan"),
        token_balance=float(cols["token_balance"].mean()) if n_steps else 1.0,
        prefix_hit_rate=_hit_rate(out, trace, cfg),
        series=series_out,
        requests={
            "arrival_s": trace.arrival_s,
            "ready_s": out.ready_t,
            "start_s": out.start_t,
            "first_s": out.first_t,
            "finish_s": out.finish_t,
            "replica": out.replica,
            "prompt_len": trace.prompt_len,
            "output_len": trace.output_len,
            "n_preempt": out.n_preempt,
            "pool_wait_s": out.pool_wait,
            "enter_tick": out.enter_tick,
            "admit_tick": out.admit_tick,
            "cache_hit": out.cache_hit,
        },
        window=(0, hi),
        config=cfg,
        wall_s=wall,
        step_breakdown=breakdown,
        offered_decode_load=float(cfg["offered_decode_load"]),
        offered_prefill_load=float(cfg["offered_prefill_load"]),
        binding_stage=cfg["binding_stage"],
        prefill_utilisation=pf_util,
        decode_utilisation=win["util"],
        balancedness=float(series_out["balancedness"].mean())
        if model is not None and n_steps
        else float("nan"),
        rebalances=tuple(dict(r) for r in getattr(model, "rebalances", ())),
    )
