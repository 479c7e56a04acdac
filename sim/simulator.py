"""Lock-step decode-cluster simulator: replay a trace under a routing policy, report metrics.

``simulate(trace, policy)`` runs the step loop of :mod:`straggler.sim._engine` (Numba) with a
routing kernel of :data:`straggler.solvers.routing.ROUTING_KERNELS` called at every routing
tick, and summarises the run in a :class:`SimReport`.

The model (PD disaggregation, BalanceRoute §"整体框架"): a request arrives, its prefill takes
``prefill_base_s + prefill_per_token_s * prompt`` seconds (prefill capacity is not modelled:
prefills run in parallel), then it waits in the prompt pool until the router places it on one
of ``G`` decode replicas. Replicas step in lock-step; a step costs ``t0 + kappa * max_g L_g``
where ``L_g`` is replica ``g``'s resident KV tokens (the paper's ``a*x + b`` with the barrier:
the most loaded replica sets the pace). Every running request gains one token per step and
leaves after ``output_len`` steps. Each replica has ``max_slots`` request slots and
``kv_capacity`` KV tokens (checked at admission). See :mod:`straggler.sim._engine` for the
exact order of events.

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

import math
import time
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

import numpy as np

from ..formulations.errors import InvalidInputError, InvalidOptionError, param_error
from ..solvers.predictors import (
    PredictorKind,
    TwoStagePredictor,
    calibration_report,
    termination_samples,
)
from ..solvers.routing import new_request_presence
from ..solvers.routing_registry import get_routing_policy, resolve_options
from ._engine import no_two_stage, run_engine, run_engine_reference
from .traces import Trace, generate_trace, saturate_trace

__all__ = ["simulate", "SimReport", "PREDICTORS", "DEFAULT_STEP_TIME"]

#: ``(t0 seconds, kappa seconds per token)``; derivation in the module docstring.
DEFAULT_STEP_TIME = (0.040, 0.22e-6)

#: Predictors BR-H can use inside the simulator (:class:`PredictorKind` labels).
PREDICTORS = tuple(PredictorKind.names())

_FUNC = "simulate"


@dataclass(frozen=True, eq=False, kw_only=True)
class SimReport:
    """Metrics of one simulated run.

    Step metrics (imbalance, balance ratio, throughput) are averaged over the measurement
    window: every step, or in saturated mode the steps until the last request was admitted
    (while the pool was never drained for lack of arrivals). Request metrics cover every
    request that finished.

    Attributes
    ----------
    policy, trace : str
        Policy label (``"brh:oracle"`` for BR-H with a predictor) and trace name.
    n_replicas, n_requests, n_finished, n_steps, n_ticks : int
    mean_imbalance : float
        Mean over window steps of ``I = G*max L - sum L`` (tokens).
    balance_ratio : float
        Mean over window steps (with ``max L > 0``) of ``mean L / max L``.
    throughput_tps : float
        Tokens decoded per second over the window (one token per running request per step).
    mean_step_ms : float
        Mean step time in the window.
    tpot_p50_ms, tpot_p95_ms, tpot_p99_ms : float
        Time per output token of each finished request: ``(finish - start) / output_len``
        (the mean step time over its decode).
    ttft_p50_ms, ttft_p99_ms : float
        Arrival to the end of the first decode step (prefill + pool wait + one step).
    queue_p50_ms, queue_p99_ms : float
        Time in the prompt pool (admission - prefill done).
    sched_us_p50, sched_us_p99, sched_us_mean : float
        Router time per tick (the kernel call inside the jitted loop), microseconds.
    series : dict of ndarray
        Per step: ``time_s`` (start), ``step_s``, ``max_load``, ``sum_load``, ``imbalance``,
        ``running``, ``pool``.
    requests : dict of ndarray
        Per request (ready order): ``arrival_s``, ``ready_s``, ``start_s``, ``first_s``,
        ``finish_s``, ``replica``, ``prompt_len``, ``output_len``.
    window : tuple of int
        ``(first, end)`` step indices of the measurement window.
    config : dict
        Every setting of the run.
    wall_s : float
        Host time of the simulation (engine call).
    """

    policy: str
    trace: str
    n_replicas: int
    n_requests: int
    n_finished: int
    n_steps: int
    n_ticks: int
    mean_imbalance: float
    balance_ratio: float
    throughput_tps: float
    mean_step_ms: float
    tpot_p50_ms: float
    tpot_p95_ms: float
    tpot_p99_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    queue_p50_ms: float
    queue_p99_ms: float
    sched_us_p50: float
    sched_us_p99: float
    sched_us_mean: float
    series: dict[str, np.ndarray] = field(repr=False)
    requests: dict[str, np.ndarray] = field(repr=False)
    window: tuple[int, int]
    config: dict[str, Any] = field(repr=False)
    wall_s: float

    def summary(self) -> dict[str, float | str | int]:
        """The scalar fields as a plain dict (for JSON)."""
        skip = {"series", "requests", "config"}
        out = {}
        for k in self.__dataclass_fields__:
            if k in skip:
                continue
            v = getattr(self, k)
            out[k] = list(v) if isinstance(v, tuple) else v
        return out


def _check_int(x, name, lo, hi=None):
    if (
        not isinstance(x, (int, np.integer))
        or isinstance(x, bool)
        or x < lo
        or (hi is not None and x > hi)
    ):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise param_error(name, _FUNC, f"an integer {rng}", repr(x))
    return int(x)


def _check_num(x, name, lo, *, open_lo=False):
    if (
        not isinstance(x, Real)
        or isinstance(x, bool)
        or not math.isfinite(x)
        or (x <= lo if open_lo else x < lo)
    ):
        cmp = ">" if open_lo else ">="
        raise param_error(name, _FUNC, f"a finite number {cmp} {lo}", repr(x))
    return float(x)


def _survival_tables(output_len: np.ndarray, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Age-indexed ``(p_fin, mu_rem)`` of H4's empirical-survival predictor fitted on
    ``output_len``, for ages ``0..max(output_len)`` (older ages use the last entry)."""
    from ..solvers.predictors import SurvivalPredictor

    pred = SurvivalPredictor(output_len)
    ages = np.arange(int(output_len.max()) + 1, dtype=np.float64)
    p, mu = pred.predict(np.zeros_like(ages), ages, horizon)
    return np.ascontiguousarray(p, dtype=np.float64), np.ascontiguousarray(mu, dtype=np.float64)


def _two_stage(trace: Trace, horizon: int, fit) -> tuple[tuple, dict[str, Any]]:
    """The engine's ``two_stage`` tuple for ``trace`` (in trace order) and a summary.

    ``fit``: None (cross-fitting on the two halves of the trace in arrival order: the model
    fitted on the first half predicts the second half's requests and vice versa), ``"in_sample"``
    (one model fitted on every request of ``trace``), a :class:`Trace` (one model fitted on it),
    or a fitted :class:`~straggler.solvers.predictors.TwoStagePredictor` for ``horizon``. The
    summary holds the split and a :func:`~straggler.solvers.predictors.calibration_report` of
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


def simulate(
    trace: Trace | str = "bursty",
    policy: str = "br0",
    *,
    n_replicas: int = 8,
    max_slots: int = 16,
    kv_capacity: int = 500_000,
    t0: float = DEFAULT_STEP_TIME[0],
    kappa: float = DEFAULT_STEP_TIME[1],
    prefill_base_s: float = 0.02,
    prefill_per_token_s: float = 5e-5,
    tick: int = 1,
    stale: int = 0,
    optimistic: bool = True,
    max_pool: int = 256,
    predictor: str = "survival",
    horizon: int = 80,
    predictor_fit: Trace | TwoStagePredictor | str | None = None,
    r_max: int = 4,
    s_greedy: float | None = None,
    alpha: float = 1.0,
    beta: float | None = None,
    gamma: float = 1.0,
    saturated: bool = False,
    min_output: int = 0,
    overload: float = 1.5,
    seed: int = 0,
    max_steps: int | None = None,
    engine: str = "numba",
    time_router: bool = True,
    refill: bool = False,
    new_presence: bool = False,
) -> SimReport:
    """Replay ``trace`` on ``n_replicas`` lock-step decode replicas routed by ``policy``.

    Parameters
    ----------
    trace : Trace or str
        A :class:`~straggler.sim.traces.Trace`, or the name of a generator preset (default
        ``"bursty"``: one hour of the shipped generator, seed 0).
    policy : str
        A routing policy of :func:`straggler.solvers.route_batch`: ``br0``, ``brh``,
        ``round_robin``, ``random``, ``jsq``, ``jsq_requests``, ``vllm``, ``p2c``,
        ``trtllm``. ``brh`` uses ``predictor`` and ``horizon``.
    n_replicas : int
        ``G`` decode replicas.
    max_slots : int
        Request slots per replica (its decode batch size).
    kv_capacity : int
        KV tokens per replica; a request is admitted only if ``L_g + prompt <= kv_capacity``.
    t0, kappa : float
        Step time ``t0 + kappa * max_g L_g`` (seconds, seconds per token); defaults in
        :data:`DEFAULT_STEP_TIME`, derived in the module docstring.
    prefill_base_s, prefill_per_token_s : float
        Prefill delay ``prefill_base_s + prefill_per_token_s * prompt`` before a request
        enters the prompt pool (defaults: 20 ms + 20k tokens/s).
    tick : int
        A routing tick every ``tick`` steps.
    stale : int
        The router sees loads (projections) ``stale`` steps old.
    optimistic : bool
        Optimistic local update: within a tick each policy adds a placed request's prompt to
        its copy of the replica's load (policy option ``optimistic``); across ticks, with
        ``stale > 0``, the prompts placed since the stale snapshot are added too. False turns
        off both.
    max_pool : int
        The router sees the oldest ``max_pool`` requests of the pool.
    predictor : {"survival", "exact_match", "oracle", "two_stage"}
        BR-H's predictor: empirical survival (ECDF of the trace's output lengths by age, H4's
        ``SurvivalPredictor``), exact-match (output length of the last finished request with
        the same prompt hash, falling back to survival; traces without hashes fall back
        always), oracle (true remaining length), two-stage (the paper's calibrated termination
        classifier and conditional-mean regressor on prompt length and age,
        :class:`~straggler.solvers.predictors.TwoStagePredictor` trained for ``horizon``; see
        ``predictor_fit``). The survival ECDF is fitted on the simulated trace itself (the
        marginal output lengths); the two-stage model by default is not.
    horizon : int
        BR-H's ``H`` (default 80, the paper's).
    predictor_fit : None, "in_sample", Trace or TwoStagePredictor
        Training data of the two-stage predictor (only with ``predictor="two_stage"``).
        Default None: cross-fitting on the simulated trace (after the saturated-mode
        filter), split in two halves by arrival; the model fitted on the first half predicts
        the requests of the second half and vice versa, so no request is predicted by a model
        that saw it. ``"in_sample"``: one model fitted on all simulated requests (optimistic).
        A :class:`~straggler.sim.traces.Trace`: one model fitted on it. A fitted
        ``TwoStagePredictor`` (for ``horizon``): used as is. ``config["two_stage"]`` of the
        report records the split and the classifier's calibration (Brier, log loss, AUC,
        ECE) on the simulated requests.
    r_max, s_greedy, alpha, beta, gamma
        BR-0/BR-H options of :func:`~straggler.solvers.route_batch`.
    saturated : bool
        Saturated mode (the paper's): keep requests with ``output_len >= min_output`` and
        compress arrivals to ``overload`` times the cluster's capacity
        (:func:`~straggler.sim.traces.saturate_trace`); step metrics over the steps until the
        last admission.
    seed : int
        Seed of ``random``/``p2c`` (per tick: ``seed * 1_000_003 + step``).
    max_steps : int, optional
        Stop after this many steps.
    engine : {"numba", "python"}
        The jitted step loop or its plain-Python reference (slow; for checks).
    time_router : bool
        Time each router call (a monotonic clock read around it).
    refill : bool
        BR-H, not in the paper (default False): project that a slot freed within the horizon
        is refilled by a request of the mean prefill length of the router's visible pool
        (:func:`~straggler.solvers.routing.project_loads` ``refill``); without it a replica
        whose requests are about to finish looks empty over the horizon.
    new_presence : bool
        BR-H, not in the paper (default False): weigh horizon column ``h`` of the F-score by
        ``pi_h = P(output > h)`` of the trace's output lengths, the chance that a request
        placed now is still resident then (``route_batch`` option ``new_presence``).
        Both together (``benchmarks/routing_table.py``, "+fix" rows, saturated, G = 8, H = 80):
        BR-H oracle 1.10x -> 0.35x JSQ's imbalance on Azure code (outputs ~28 tokens, far
        shorter than H), 0.45x -> 0.36x on Azure conversation, but 0.11x -> 0.14x on the
        Mooncake conversation trace (long prompts), so they stay off by default.

    Returns
    -------
    SimReport

    Examples
    --------
    >>> from straggler.sim.traces import Trace
    >>> tr = Trace(arrival_s=[0, 0, 0], prompt_len=[100, 50, 50], output_len=[2, 2, 2])
    >>> r = simulate(tr, "jsq", n_replicas=2, max_slots=2, t0=0.01, kappa=0.0,
    ...              prefill_base_s=0.0, prefill_per_token_s=0.0, engine="python")
    >>> r.n_finished, r.n_steps, r.series["max_load"].tolist(), r.mean_imbalance
    (3, 2, [100.0, 102.0], 0.5)
    """
    cfg = dict(
        policy=policy,
        n_replicas=_check_int(n_replicas, "n_replicas", 1),
        max_slots=_check_int(max_slots, "max_slots", 1),
        kv_capacity=_check_int(kv_capacity, "kv_capacity", 1),
        t0=_check_num(t0, "t0", 0.0),
        kappa=_check_num(kappa, "kappa", 0.0),
        prefill_base_s=_check_num(prefill_base_s, "prefill_base_s", 0.0),
        prefill_per_token_s=_check_num(prefill_per_token_s, "prefill_per_token_s", 0.0),
        tick=_check_int(tick, "tick", 1),
        stale=_check_int(stale, "stale", 0),
        optimistic=bool(optimistic),
        max_pool=_check_int(max_pool, "max_pool", 1),
        horizon=_check_int(horizon, "horizon", 0),
        r_max=_check_int(r_max, "r_max", 1, 16),
        alpha=_check_num(alpha, "alpha", 0.0, open_lo=True),
        gamma=_check_num(gamma, "gamma", 0.0, open_lo=True),
        saturated=bool(saturated),
        min_output=_check_int(min_output, "min_output", 0),
        overload=_check_num(overload, "overload", 0.0, open_lo=True),
        seed=_check_int(seed, "seed", 0),
        engine=engine,
        refill=bool(refill) and policy == "brh",
        new_presence=bool(new_presence) and policy == "brh",
    )
    if not isinstance(optimistic, (bool, np.bool_)):
        raise param_error("optimistic", _FUNC, "a bool", repr(optimistic))
    if cfg["t0"] == 0 and cfg["kappa"] == 0:
        raise param_error("t0", _FUNC, "positive when kappa is 0 (steps must take time)", "0")
    if cfg["gamma"] > 1:
        raise param_error("gamma", _FUNC, "in (0, 1]", repr(gamma))
    pol = get_routing_policy(policy, _FUNC)
    if engine not in ("numba", "python"):
        raise param_error("engine", _FUNC, "'numba' or 'python'", repr(engine), InvalidOptionError)
    G = cfg["n_replicas"]
    if pol.horizon:
        pred_kind = PredictorKind.from_name(predictor)
        H = cfg["horizon"]
        label = f"{policy}:{pred_kind.label}"
    else:
        pred_kind, H, label = PredictorKind.NONE, 0, policy
    if predictor_fit is not None and pred_kind != PredictorKind.TWO_STAGE:
        raise param_error(
            "predictor_fit",
            _FUNC,
            'None unless policy="brh" with predictor="two_stage"',
            repr(predictor_fit),
            InvalidOptionError,
        )
    cfg.update(predictor=pred_kind.label if pol.horizon else None, label=label)
    given = dict(r_max=r_max, s_greedy=s_greedy, alpha=alpha, beta=beta, gamma=gamma)
    opts = {k: v for k, v in given.items() if k in pol.options}
    if "optimistic" in pol.options:
        opts["optimistic"] = cfg["optimistic"]
    params, _, resolved = resolve_options(pol, opts, G, H, _FUNC)
    cfg.update({k: v for k, v in resolved.items() if k != "new_presence"})

    if isinstance(trace, str):
        trace = generate_trace(trace)
    if not isinstance(trace, Trace):
        raise param_error(
            "trace", _FUNC, "a Trace or a generator preset name", type(trace).__name__
        )
    if len(trace) == 0:
        raise param_error("trace", _FUNC, "a non-empty Trace", "an empty one")
    if cfg["saturated"]:
        mean_res = float(np.mean(trace.prompt_len + trace.output_len / 2.0))
        step_est = cfg["t0"] + cfg["kappa"] * cfg["max_slots"] * mean_res
        trace = saturate_trace(
            trace,
            n_replicas=G,
            max_slots=cfg["max_slots"],
            step_time_s=step_est,
            min_output=cfg["min_output"],
            overload=cfg["overload"],
        )
    if int(trace.prompt_len.max()) > cfg["kv_capacity"]:
        raise param_error(
            "kv_capacity",
            _FUNC,
            "at least the longest prompt of the trace",
            f"{cfg['kv_capacity']} < {int(trace.prompt_len.max())}",
        )

    ready = trace.arrival_s + cfg["prefill_base_s"] + cfg["prefill_per_token_s"] * trace.prompt_len
    order = np.argsort(ready, kind="stable")
    ready = np.ascontiguousarray(ready[order])
    prompt = np.ascontiguousarray(trace.prompt_len[order])
    output = np.ascontiguousarray(trace.output_len[order])
    group, n_groups = _groups(
        None if trace.prefix_hash is None else trace.prefix_hash[order], len(trace)
    )
    if pred_kind in (PredictorKind.SURVIVAL, PredictorKind.EXACT_MATCH):
        surv_p, surv_mu = _survival_tables(trace.output_len, H)
    else:
        surv_p, surv_mu = np.zeros(1), np.ones(1)
    if pred_kind == PredictorKind.TWO_STAGE:
        two_stage, cfg["two_stage"] = _two_stage(trace, H, predictor_fit)
        two_stage = (np.ascontiguousarray(two_stage[0][order]),) + two_stage[1:]
    else:
        two_stage = no_two_stage()
    if cfg["new_presence"]:
        params = np.concatenate([params, new_request_presence(trace.output_len, H)])
    if max_steps is None:
        max_steps = int(output.sum()) + len(trace) + 1
    max_steps = _check_int(max_steps, "max_steps", 1)
    args = (
        params,
        ready,
        prompt,
        output,
        group,
        n_groups,
        G,
        cfg["max_slots"],
        cfg["kv_capacity"],
        cfg["t0"],
        cfg["kappa"],
        cfg["tick"],
        cfg["stale"],
        cfg["optimistic"],
        cfg["max_pool"],
        H,
        int(pred_kind),
        surv_p,
        surv_mu,
        cfg["seed"],
        max_steps,
        bool(time_router),
        cfg["refill"],
        two_stage,
    )
    w0 = time.perf_counter()
    if engine == "numba":
        out = run_engine(pol.policy_id, *args)
    else:
        out = run_engine_reference(pol.reference, *args)
    wall = time.perf_counter() - w0
    return _report(trace, ready, prompt, output, order, out, cfg, label, wall)


def _pct(x: np.ndarray, q: float, scale: float) -> float:
    return float(np.percentile(x, q) * scale) if x.size else float("nan")


def _report(trace, ready, prompt, output, order, out, cfg, label, wall) -> SimReport:
    start, first, finish, replica, series, tick_ns, _tick_pool = out
    G = cfg["n_replicas"]
    n_steps = series.shape[0]
    clock, dt, mx, sm, running, pool = (series[:, j] for j in range(6))
    imb = G * mx - sm
    lo, hi = 0, n_steps
    if cfg["saturated"] and n_steps:
        # window: until the step at which the last request was admitted
        last_admit = np.nanmax(start)
        hi = int(np.searchsorted(clock, last_admit, side="right"))
        hi = max(hi, 1)
    w = slice(lo, hi)
    if hi > lo:
        span = clock[hi - 1] + dt[hi - 1] - clock[lo]
        mean_imb = float(imb[w].mean())
        pos = mx[w] > 0
        ratio = float(np.mean(sm[w][pos] / G / mx[w][pos])) if pos.any() else 1.0
        thr = float(running[w].sum() / span) if span > 0 else 0.0
        mean_step = float(dt[w].mean() * 1e3)
    else:
        mean_imb, ratio, thr, mean_step = 0.0, 1.0, 0.0, float("nan")
    done = ~np.isnan(finish)
    tpot = (finish[done] - start[done]) / output[done]
    arrival = trace.arrival_s[order]
    ttft = first[~np.isnan(first)] - arrival[~np.isnan(first)]
    admitted = ~np.isnan(start)
    queue = start[admitted] - ready[admitted]
    us = tick_ns / 1e3
    return SimReport(
        policy=label,
        trace=trace.name,
        n_replicas=G,
        n_requests=len(trace),
        n_finished=int(done.sum()),
        n_steps=int(n_steps),
        n_ticks=int(tick_ns.size),
        mean_imbalance=mean_imb,
        balance_ratio=ratio,
        throughput_tps=thr,
        mean_step_ms=mean_step,
        tpot_p50_ms=_pct(tpot, 50, 1e3),
        tpot_p95_ms=_pct(tpot, 95, 1e3),
        tpot_p99_ms=_pct(tpot, 99, 1e3),
        ttft_p50_ms=_pct(ttft, 50, 1e3),
        ttft_p99_ms=_pct(ttft, 99, 1e3),
        queue_p50_ms=_pct(queue, 50, 1e3),
        queue_p99_ms=_pct(queue, 99, 1e3),
        sched_us_p50=_pct(us, 50, 1.0) if cfg["engine"] == "numba" else float("nan"),
        sched_us_p99=_pct(us, 99, 1.0) if cfg["engine"] == "numba" else float("nan"),
        sched_us_mean=float(us.mean()) if us.size and cfg["engine"] == "numba" else float("nan"),
        series={
            "time_s": clock,
            "step_s": dt,
            "max_load": mx,
            "sum_load": sm,
            "imbalance": imb,
            "running": running,
            "pool": pool,
        },
        requests={
            "arrival_s": arrival,
            "ready_s": ready,
            "start_s": start,
            "first_s": first,
            "finish_s": finish,
            "replica": replica,
            "prompt_len": prompt,
            "output_len": output,
        },
        window=(lo, hi),
        config=cfg,
        wall_s=wall,
    )
