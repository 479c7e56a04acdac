"""The lock-step simulator: kernel == py_func == reference, invariants checked from scratch,
projection == project_loads, metrics, staleness, saturated mode, validation."""

import pathlib

import numpy as np
import pytest
from numba import njit, types
from straggler.formulations import InvalidInputError, InvalidOptionError
from straggler.formulations.routing import ClusterState
from straggler.sim import SimConfig, engine_inputs
from straggler.sim.engine._loop import (
    SERIES,
    engine_depends,
    engine_entry,
    no_two_stage,
    project_view,
    run_engine,
    run_engine_reference,
    two_stage_predict,
    two_stage_predict_reference,
)
from straggler.sim.engine.simulator import (
    SimReport,
    _two_stage,
    decode_capacity,
    offered_load,
    simulate,
)
from straggler.sim.workloads.prefix import PrefixBlocks
from straggler.sim.workloads.traces import Trace, generate_trace, load_trace
from straggler.solvers import get_routing_policy, routing_policies
from straggler.solvers._numba import address as _address
from straggler.solvers._numba import clock as _clock
from straggler.solvers._numba import jit as _jit
from straggler.solvers._numba.cache import cache_stamp
from straggler.solvers._numba.jit import source_digest
from straggler.solvers.routing import _core as _routing_core
from straggler.solvers.routing import predictors
from straggler.solvers.routing.policy import routing_policy
from straggler.solvers.routing.predictors import (
    ExactMatchPredictor,
    OraclePredictor,
    SurvivalPredictor,
    TwoStagePredictor,
    termination_samples,
)
from straggler.solvers.routing.route import project_loads

TRACES = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"


def _small_trace(n=60, seed=1, hashes=False):
    tr = generate_trace("azure_conv", n_requests=n, rng=seed, rate=40.0)
    out = np.minimum(tr.output_len, 40)
    h = None
    if hashes:
        h = np.random.default_rng(seed).integers(0, 6, n)  # few prompts: many exact-match hits
    return Trace(arrival_s=tr.arrival_s, prompt_len=tr.prompt_len, output_len=out, prefix_hash=h)


#: Unlimited, instant prefill: arrival = ready (the replays from scratch need no queue model).
INSTANT = dict(prefill_instances=0, prefill_base_s=0.0, prefill_tokens_per_s=np.inf)


def _inputs(tr, policy, options=None, **kw):
    """simulate's engine inputs for ``tr`` (small cluster and fast steps unless overridden)."""
    full = {**dict(n_replicas=3, max_slots=4, t0=0.01, kappa=1e-5), **kw, **(options or {})}
    run = engine_inputs(tr, SimConfig.from_settings(policy, **full))
    return run.inputs, run.policy, run.trace, run.record, run.record["label"]


def _same(a, b):
    for name in a._fields:
        if name == "tick_ns":  # timings
            continue
        x, y = getattr(a, name), getattr(b, name)
        assert x.shape == y.shape, name
        assert np.array_equal(x, y, equal_nan=True), name


BR = dict(r_max=3, s_greedy=4)
CASES = [
    ("br0", dict(), BR),
    ("br0", dict(stale=4, tick=3, tight_kv=True), BR),
    ("jsq", dict(stale=3), {}),
    ("jsq", dict(stale=3, optimistic=False), {}),
    ("random", dict(tick=2, tight_kv=True), {}),
    ("p2c", dict(tight_kv=True), {}),
    ("round_robin", dict(), {"cursor": 2}),
    ("trtllm", dict(prefill_instances=1), {}),
    ("vllm", dict(stale=2), {}),
    ("jsq_requests", dict(load=2.0), {}),
    ("brh", dict(predictor="oracle", horizon=6), BR),
    ("brh", dict(predictor="survival", horizon=6, stale=2, tight_kv=True), BR),
    ("brh", dict(predictor="exact_match", horizon=6), BR),
    ("brh", dict(predictor="oracle", horizon=6, refill=True, new_presence=True, stale=2), BR),
    ("brh", dict(predictor="survival", horizon=6, refill=True, max_pool=3), BR),
    ("brh", dict(predictor="two_stage", horizon=6, stale=2), BR),
    (
        "brh",
        dict(predictor="two_stage", horizon=6, refill=True, new_presence=True, max_pool=3),
        BR,
    ),
    ("br0", dict(prefill_instances=1, prefill_tokens_per_s=20_000.0, load=1.5), BR),
    ("jsq", dict(tight_kv=True, load=3.0, prefill_instances=2), {}),
    ("br0", dict(load=0.3, max_slots=2), BR),
    ("brs", dict(), {}),
    ("brs", dict(load=3.0, tight_kv=True, stale=2), {"patience": 0, "age_window": 4}),
    ("brs", dict(load=2.0), {"patience": 2, "window": 2, "age_fraction": 0.5}),
    ("brs", dict(load=2.0, optimistic=False), {"patience": 1, "safe": False}),
    # the upstream baselines, the engines' own queues, the replicas' prefix caches
    ("trtllm_balance", dict(load=1.5), {"timeout_iters": 3, "batching_wait_iters": 1}),
    ("trtllm_balance", dict(load=1.5, stale=2), {}),
    ("follow_bootstrap_room", dict(load=1.5, tight_kv=True), {}),
    ("dynamo", dict(load=1.5, blocks=True), {"block_size": 16}),
    ("dynamo", dict(load=1.5, blocks=True, tight_kv=True, admission="queue"), {}),
    ("dynamo", dict(load=1.5), {}),
    ("vllm", dict(load=2.0, admission="queue", stale=2), {}),
    ("vllm", dict(load=2.0, admission="queue", tight_kv=True), {"version": "legacy"}),
    ("jsq", dict(load=2.0, admission="queue", stale=3), {"version": "plus_one"}),
    ("p2c", dict(load=2.0, admission="queue"), {"version": "expected_wait"}),
    ("trtllm", dict(load=2.0, admission="queue", stale=1), {}),
    ("follow_bootstrap_room", dict(load=2.0, admission="queue"), {}),
    ("br0", dict(load=2.0, admission="queue", optimistic=False, stale=2), BR),
    ("jsq", dict(load=1.5, blocks=True, tight_kv=True), {}),
    ("trtllm_balance", dict(load=1.5, ctx_cost=2e-6, **INSTANT), {"timeout_iters": 4}),
    ("trtllm", dict(load=1.5, ctx_cost=2e-6, tight_kv=True, **INSTANT), {}),
    ("vllm", dict(load=1.5, ctx_cost=2e-6, admission="queue", **INSTANT), {}),
    ("dynamo", dict(load=1.5, ctx_cost=2e-6, admission="queue", blocks=True, **INSTANT), {}),
]


def _small_blocks(tr, block_tokens=64, seed=3):
    """Block chains for ``tr``: four shared conversation prefixes of random depth, then blocks
    of the request's own (the Mooncake layout: one id per ``block_tokens`` prompt tokens)."""
    rng = np.random.default_rng(seed)
    lists = []
    for i, p in enumerate(tr.prompt_len):
        nb = -(-int(p) // block_tokens)
        conv, depth = int(rng.integers(4)), int(rng.integers(0, nb + 1))
        lists.append(
            [conv * 10_000 + j for j in range(depth)]
            + [10**6 + 1000 * i + j for j in range(nb - depth)]
        )
    return PrefixBlocks.from_lists(lists, block_tokens=block_tokens)


def _check_engines(policy, kw, options):
    kw = dict(kw)
    tr = _small_trace(hashes=kw.get("predictor") == "exact_match")
    if kw.pop("tight_kv", False):
        # binds often (preemptions), yet every request fits alone
        kw["kv_capacity"] = int((tr.prompt_len + tr.output_len).max()) + 300
    if kw.pop("blocks", False):
        kw["prefix_blocks"] = _small_blocks(tr)
    inp, pol, _, cfg, _ = _inputs(tr, policy, options, **kw)
    assert cfg["prefix_cache"] == ("prefix_blocks" in kw)
    assert cfg["prefix_cache_router"] == ("prefix_blocks" in kw and policy == "dynamo")
    a = engine_entry(pol, inp)(inp)
    c = run_engine_reference(inp, pol.reference)
    # (run_engine's py_func calls jitted phases and the kernel by its address; it runs as
    # Python, against the same reference, under NUMBA_DISABLE_JIT=1)
    _same(a, c)
    assert np.all(np.isfinite(a.finish_t)), "every request finishes"
    return a


@pytest.mark.parametrize("policy,kw,options", CASES)
def test_kernel_equals_py_func_equals_reference(policy, kw, options):
    """The jitted engine and the plain-Python reference agree exactly, for every
    registered policy and with each mechanism on: staleness, ticks, preemption (tight KV),
    finite prefill capacity, the load knob, the four predictors."""
    _check_engines(policy, kw, options)


def test_simulate_keywords_are_the_config_settings_with_their_defaults():
    """simulate's keywords are SimConfig's flat settings, each defaulting to its group's
    default: the settings are written once, in the config's groups."""
    import inspect

    from straggler.sim.engine import config as sim_config

    params = inspect.signature(simulate).parameters
    names = [
        k for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k not in ("config", "dispatch")
    ]
    assert sorted(names) == sorted(sim_config.SETTINGS)
    defaults = {g: typ() for g, typ in sim_config._GROUPS.items()}
    for name in names:
        group, field_name = sim_config._FLAT[name]
        assert params[name].default == getattr(defaults[group], field_name), name


def test_every_policy_is_covered_by_the_engine_cases():
    assert {c[0] for c in CASES} == set(routing_policies())


def test_engine_is_cached_with_its_callees(jitted_reach):
    """The engine's disk cache is keyed on every file holding one of its jitted callees (its
    own helpers through its globals, the routing records and clock); no policy's kernel is
    among them: the loop calls the kernel through a function pointer."""
    from straggler.sim.engine import _loop as _engine

    simulate(Trace(arrival_s=[0, 0], prompt_len=[5, 5], output_len=[2, 2]), "jsq", n_replicas=2)
    deps = engine_depends()
    assert cache_stamp(run_engine)[1] == source_digest(*deps)
    assert {_jit, _address, _clock, _routing_core, predictors} <= set(deps)
    reached = jitted_reach(run_engine)
    files = {pathlib.Path(d.py_func.__code__.co_filename).resolve() for d in reached}
    assert len(reached) > 10  # the engine and its helpers
    here = {pathlib.Path(m.__file__).resolve() for m in (_engine, _routing_core)}
    assert files <= here, files - here


def test_the_step_loop_compiles_once_for_every_policy():
    """Each policy's kernel is an argument of the loop (the address of its code): one
    compiled loop serves them all (a loop specialised per policy would add one version
    each)."""
    tr = Trace(arrival_s=[0, 0, 0.01], prompt_len=[5, 7, 3], output_len=[2, 3, 2])
    simulate(tr, "jsq", n_replicas=2)
    before = set(run_engine.overloads)
    for policy in ("random", "brs", "vllm", "dynamo"):
        simulate(tr, policy, n_replicas=2)
    assert set(run_engine.overloads) == before
    assert len(before) == 1 and all(sig[0] == types.int64 for sig in before)


def test_a_kernel_the_engine_cannot_call_is_refused_by_name(monkeypatch):
    from straggler.solvers.routing import registry as routing_registry

    monkeypatch.setattr(routing_registry, "_USER", {})  # this test's registrations only
    jsq = get_routing_policy("jsq")
    tr = Trace(arrival_s=[0, 0], prompt_len=[5, 5], output_len=[2, 2])
    for name, kernel, match in (
        ("py_kernel", jsq.kernel.py_func, "py_kernel.*numba.njit function"),
        ("bad_return", njit(lambda pool, reps, opts, carry, seed: (0, carry)), "must return"),
    ):
        pol = routing_policy(
            name, kernel=kernel, reference=jsq.reference, options=(), summary="t", source="t"
        )
        routing_registry.register_routing_policy(pol)
        with pytest.raises(InvalidInputError, match=match):
            simulate(tr, name, n_replicas=2)


@pytest.mark.slow
def test_a_new_process_with_a_warm_cache_does_not_recompile(run_python):
    code = (
        "from straggler.sim import simulate\n"
        "from straggler.sim.engine._loop import run_engine\n"
        "from straggler.sim.workloads.traces import Trace\n"
        "tr = Trace(arrival_s=[0, 0], prompt_len=[5, 5], output_len=[2, 2])\n"
        "simulate(tr, 'jsq', n_replicas=2)\n"
        "print(sum(run_engine.stats.cache_misses.values()))\n"
    )
    simulate(Trace(arrival_s=[0, 0], prompt_len=[5, 5], output_len=[2, 2]), "jsq", n_replicas=2)
    assert run_python(code).strip() == "0"


def _replay_loads(series, req, G, kv_prompt=None):
    """Recompute every step's loads from the per-request record (independent of the engine)."""
    clock = series[:, 0]
    loads = np.zeros((clock.size, G))
    counts = np.zeros((clock.size, G), dtype=int)
    start, finish, rep, prompt = req["start"], req["finish"], req["replica"], req["prompt"]
    for i in range(start.size):
        k0 = int(np.searchsorted(clock, start[i]))
        k1 = int(np.searchsorted(clock, finish[i]))  # the step ending at finish starts at k1-1
        assert clock[k0] == start[i]
        ages = np.arange(k1 - k0)
        loads[k0:k1, rep[i]] += prompt[i] + ages
        counts[k0:k1, rep[i]] += 1
    return loads, counts


@pytest.mark.parametrize("policy", ["br0", "jsq", "random"])
def test_invariants_from_scratch(policy):
    G, slots = 3, 4
    tr = _small_trace(n=80, seed=7)
    r = simulate(
        tr,
        policy,
        n_replicas=G,
        max_slots=slots,
        t0=0.01,
        kappa=1e-5,
        kv_capacity=10**6,  # never binds: the replay below has no preemption to model
        max_pool=8,
        **INSTANT,
    )
    rq = r.requests
    assert r.n_finished == len(tr) and r.n_unfinished == 0 and r.n_preempted == 0
    series = np.column_stack([r.series[k] for k in SERIES])
    clock, dt = series[:, 0], series[:, 1]
    # each request decodes exactly output_len steps, one per step, then leaves
    for i in range(len(tr)):
        k0 = np.searchsorted(clock, rq["start_s"][i])
        k1 = k0 + rq["output_len"][i]
        assert rq["finish_s"][i] == clock[k1 - 1] + dt[k1 - 1]
        assert rq["first_s"][i] == clock[k0] + dt[k0]
        assert rq["start_s"][i] >= rq["ready_s"][i] == rq["arrival_s"][i]
        assert rq["pool_wait_s"][i] == rq["start_s"][i] - rq["ready_s"][i]
    loads, counts = _replay_loads(
        series,
        dict(
            start=rq["start_s"],
            finish=rq["finish_s"],
            replica=rq["replica"],
            prompt=rq["prompt_len"],
        ),
        G,
    )
    assert np.array_equal(loads.max(axis=1), r.series["max_load"])
    assert np.array_equal(loads.sum(axis=1), r.series["sum_load"])
    assert counts.max() <= slots
    assert np.array_equal(counts.sum(axis=1), r.series["running"])
    assert np.allclose(dt, 0.01 + 1e-5 * loads.max(axis=1), rtol=0, atol=1e-15)
    # metrics from their definitions (whole run)
    imb = G * loads.max(axis=1) - loads.sum(axis=1)
    assert r.mean_imbalance == pytest.approx(imb.mean())
    span = clock[-1] + dt[-1] - clock[0]
    assert r.throughput_tps == pytest.approx(counts.sum() / span)
    assert r.slot_utilisation == pytest.approx(
        (counts.sum(axis=1) * dt).sum() / (G * slots * dt.sum())
    )
    assert counts.sum() == tr.output_len.sum()
    tpot = (rq["finish_s"] - rq["start_s"]) / rq["output_len"]
    assert r.tpot_p95_ms == pytest.approx(np.percentile(tpot, 95) * 1e3)
    assert r.max_pool_wait_s == pytest.approx(rq["pool_wait_s"].max())
    # the window: the steps starting before the last arrival
    lo, hi = r.window
    assert lo == 0 and clock[hi - 1] < tr.arrival_s[-1] <= clock[hi]
    assert r.window_mean_imbalance == pytest.approx(imb[:hi].mean())


def test_preemption_changes_the_outcome_and_keeps_kv_within_capacity():
    """A KV capacity that binds during decode: requests are preempted (recompute), the run
    differs from the unbounded one, the KV capacity holds at every step, every request still
    finishes with exactly output_len tokens, and numba == reference (CASES)."""
    tr = _small_trace(n=60, seed=3)
    cap = int((tr.prompt_len + tr.output_len).max()) + 300
    kw = dict(n_replicas=3, max_slots=4, t0=0.01, kappa=1e-5, **INSTANT)
    free = simulate(tr, "jsq", **kw)
    tight = simulate(tr, "jsq", kv_capacity=cap, **kw)
    assert free.n_preempted == 0 and tight.n_preempted > 0
    assert tight.series["preempted"].sum() == tight.n_preempted == tight.requests["n_preempt"].sum()
    assert tight.n_finished == len(tr)
    assert not np.array_equal(free.series["max_load"], tight.series["max_load"])
    assert np.all(tight.series["max_load"] <= cap)
    # a preempted request waits in the pool again: its TPOT includes the stall
    pre = tight.requests["n_preempt"] > 0
    tpot = (tight.requests["finish_s"] - tight.requests["start_s"]) / tr.output_len
    assert np.all(tpot[pre] > 0.01)
    tokens = (tight.series["running"]).sum()
    assert tokens == tr.output_len.sum()  # recompute keeps the decoded tokens
    b = simulate(tr, "jsq", kv_capacity=cap, engine="python", **kw)
    assert all(np.array_equal(tight.series[k], b.series[k]) for k in tight.series)


def test_prefill_capacity_changes_the_outcome_as_a_fifo_queue():
    """One prefill instance: ready times follow the single-server FCFS recursion; unlimited
    instances: arrival + base + tokens / rate; the runs differ and numba == reference."""
    tr = _small_trace(n=50, seed=5)
    base, rate = 0.01, 20_000.0
    kw = dict(n_replicas=3, max_slots=4, t0=0.01, kappa=1e-5, prefill_base_s=base)
    one = simulate(tr, "br0", prefill_instances=1, prefill_tokens_per_s=rate, **kw)
    many = simulate(tr, "br0", prefill_instances=0, prefill_tokens_per_s=rate, **kw)
    assert one.n_preempted == 0
    want, free_at = [], 0.0
    for t, p in zip(tr.arrival_s, tr.prompt_len):
        free_at = max(t, free_at) + (base + (1.0 / rate) * float(p))
        want.append(free_at)
    assert np.array_equal(one.requests["ready_s"], np.array(want))
    unlimited = tr.arrival_s + (base + (1.0 / rate) * tr.prompt_len)
    assert np.array_equal(many.requests["ready_s"], unlimited)
    assert one.ttft_p99_ms > many.ttft_p99_ms
    assert not np.array_equal(one.requests["start_s"], many.requests["start_s"])
    b = simulate(tr, "br0", prefill_instances=1, prefill_tokens_per_s=rate, engine="python", **kw)
    assert np.array_equal(one.requests["ready_s"], b.requests["ready_s"])
    assert all(np.array_equal(one.series[k], b.series[k]) for k in one.series)


def test_load_knob_rescales_arrivals_and_changes_the_outcome():
    tr = _small_trace(n=80, seed=2)
    kw = dict(n_replicas=2, max_slots=4, t0=0.01, kappa=1e-5, kv_capacity=10**6)
    cap = decode_capacity(tr, n_replicas=2, max_slots=4, kv_capacity=10**6, t0=0.01, kappa=1e-5)
    r = float(np.mean(tr.prompt_len + tr.output_len / 2))
    assert cap["concurrency"] == 4 and cap["step_s"] == pytest.approx(0.01 + 1e-5 * 4 * r)
    assert cap["rate_per_s"] == pytest.approx(8 / (tr.output_len.mean() * cap["step_s"]))
    low = simulate(tr, "jsq", load=0.5, **kw)
    high = simulate(tr, "jsq", load=1.5, **kw)
    assert low.offered_load == 0.5 and high.offered_load == 1.5
    for rep, x in ((low, 0.5), (high, 1.5)):
        sim_tr = Trace(
            arrival_s=rep.requests["arrival_s"],
            prompt_len=rep.requests["prompt_len"],
            output_len=rep.requests["output_len"],
        )
        got = offered_load(sim_tr, n_replicas=2, max_slots=4, kv_capacity=1e6, t0=0.01, kappa=1e-5)
        assert got == pytest.approx(x)
    gaps = np.diff(low.requests["arrival_s"]) / np.diff(high.requests["arrival_s"])
    assert np.allclose(gaps[np.isfinite(gaps)], 3.0)
    assert high.slot_utilisation > low.slot_utilisation
    assert high.queue_p99_ms > low.queue_p99_ms
    as_is = simulate(tr, "jsq", **kw)
    assert as_is.offered_load == pytest.approx(
        offered_load(tr, n_replicas=2, max_slots=4, kv_capacity=1e6, t0=0.01, kappa=1e-5)
    )
    b = simulate(tr, "jsq", load=1.5, engine="python", **kw)
    assert all(np.array_equal(high.series[k], b.series[k]) for k in high.series)


def test_numba_and_python_engines_give_the_same_report():
    tr = _small_trace(n=50, seed=11)
    kw = dict(n_replicas=4, max_slots=3, stale=2, saturated=True, max_pool=16, r_max=4)
    a = simulate(tr, "brh", predictor="survival", horizon=5, **kw)
    b = simulate(tr, "brh", predictor="survival", horizon=5, engine="python", **kw)
    for k in a.series:
        assert np.array_equal(a.series[k], b.series[k])
    assert a.mean_imbalance == b.mean_imbalance and a.tpot_p99_ms == b.tpot_p99_ms
    # the refill projection and the presence weights, in both engines
    kw.update(predictor="oracle", horizon=12, refill=True, new_presence=True)
    a = simulate(tr, "brh", **kw)
    b = simulate(tr, "brh", engine="python", **kw)
    for k in a.series:
        assert np.array_equal(a.series[k], b.series[k])
    assert a.config["refill"] and a.config["new_presence"]
    c = simulate(tr, "brh", **{**kw, "refill": False, "new_presence": False})
    assert not np.array_equal(a.requests["replica"], c.requests["replica"])


def _random_slots(rng, G, slots, n):
    slot_req = np.full((G, slots), -1, np.int64)
    cells = rng.choice(G * slots, size=n, replace=False)
    slot_req.ravel()[cells] = np.arange(n)
    return slot_req


class _ByFold:
    """Two-stage models by fold: request ``i`` (of the running list) asks ``models[fold[i]]``."""

    def __init__(self, models, fold):
        self.models, self.fold = models, fold

    def predict(self, prompt, decoded, horizon, *, prefix=None, output=None):
        p, mu = np.zeros(len(prompt)), np.zeros(len(prompt))
        for k, m in enumerate(self.models):
            sel = self.fold == k
            if sel.any():
                p[sel], mu[sel] = m.predict(
                    np.asarray(prompt)[sel], np.asarray(decoded)[sel], horizon
                )
        return p, mu


def _two_models(rng, H):
    """A calibrated and an uncalibrated two-stage model fitted on random requests."""
    s = rng.integers(0, 60, 300)
    o = np.where(s > 30, rng.integers(1, 2 * H, 300), rng.integers(H, 6 * H, 300))
    return [TwoStagePredictor(H).fit(s, o), TwoStagePredictor(H, calibration=0.0).fit(s, o)]


def _engine_tuple(models, fold):
    arrs = [m.model_arrays() for m in models]
    B = max(a[2].shape[1] for a in arrs)
    iso = np.zeros((len(arrs), 2, B))
    for k, a in enumerate(arrs):
        iso[k, :, : a[2].shape[1]] = a[2]
    return (
        np.asarray(fold, dtype=np.int64),
        np.stack([a[0] for a in arrs]),
        np.stack([a[1] for a in arrs]),
        iso,
        np.array([a[3] for a in arrs], dtype=np.int64),
    )


@pytest.mark.parametrize("kind", [1, 2, 3, 4])
def test_projection_equals_project_loads(kind):
    rng = np.random.default_rng(kind)
    G, slots, n, H = 3, 5, 11, 7
    for _ in range(20):
        slot_req = _random_slots(rng, G, slots, n)
        output = rng.integers(1, 30, n)
        decoded = (rng.random(n) * output).astype(np.int64)
        prompt = rng.integers(0, 50, n)
        group = rng.integers(-1, 4, n)
        memo = rng.integers(-1, 30, 4)
        sp = SurvivalPredictor(rng.integers(1, 30, 40))
        ages = np.arange(40, dtype=float)
        p, mu = sp.predict(np.zeros_like(ages), ages, H)
        refill = float(rng.integers(0, 3) * 17.5)
        ts = no_two_stage()
        if kind == 4:
            if _ == 0:
                models = _two_models(rng, H)
            fold = rng.integers(0, 2, n)
            ts = _engine_tuple(models, fold)
        got = project_view(
            slot_req, decoded, prompt, output, group, memo, p, mu, kind, H, refill, ts
        )
        # the same running requests, replica by replica in slot order
        order = [(g, i) for g in range(G) for i in slot_req[g] if i >= 0]
        rep = np.array([g for g, _ in order])
        idx = np.array([i for _, i in order])
        st = ClusterState(
            free_slots=np.zeros(G, int),
            running_replica=rep,
            running_prompt=prompt[idx],
            running_decoded=decoded[idx],
            running_output=output[idx],
            running_prefix=group[idx],
            pool_prefill=[],
        )
        if kind == 1:
            pred = OraclePredictor()
        elif kind == 2:
            pred = sp
        elif kind == 4:
            pred = _ByFold(models, fold[idx])
        else:
            pred = ExactMatchPredictor(sp)
            for h, m in enumerate(memo):
                if m >= 0:
                    pred.memo[h] = float(m)
        want = project_loads(st, pred, H, refill=refill)
        assert np.array_equal(got, want)


def test_two_stage_in_engine_equals_two_stage_predictor():
    """The engine's evaluation of a fitted model == TwoStagePredictor.predict, bit for bit, at
    every (prompt, age) of the training and calibration requests (their scores are the isotonic
    block ends) and on a grid."""
    rng = np.random.default_rng(3)
    n, H = 500, 20
    s = rng.integers(0, 4000, n)
    o = np.maximum(1, rng.geometric(np.where(s > 2000, 1 / 15, 1 / 90))).astype(np.int64)
    grid_s, grid_a = np.meshgrid(np.arange(0, 5000, 97.0), np.arange(0, 700, 13.0))
    samp_s, samp_a, _, _ = termination_samples(s, o, H, stride=1)  # every (prompt, age) seen
    qs = np.concatenate([grid_s.ravel(), samp_s, [0.0, 1e9]])
    qa = np.concatenate([grid_a.ravel(), samp_a, [1e9, 0.0]])
    for tp in (TwoStagePredictor(H).fit(s, o), TwoStagePredictor(H, calibration=0.0).fit(s, o)):
        knots, lin, iso, nb = tp.model_arrays()
        assert (nb > 0) == (tp._iso is not None)
        want_p, want_mu = tp.predict(qs, qa, H)
        got = [two_stage_predict(knots, lin, iso, nb, float(x), float(y)) for x, y in zip(qs, qa)]
        ref = [two_stage_predict_reference(knots, lin, iso, nb, x, y) for x, y in zip(qs, qa)]
        assert got == ref
        got_p = np.array([g[0] for g in got])
        got_mu = np.clip([g[1] for g in got], 1.0, H)
        assert np.array_equal(got_p, want_p)
        assert np.array_equal(got_mu, want_mu)
        assert len(np.unique(got_p)) > 3
        if nb:  # the raw scores of the calibration samples are the block ends: some are hit
            raw = TwoStagePredictor(H, calibration=0.0)
            raw.__dict__.update({k: v for k, v in tp.__dict__.items() if k != "_iso"})
            raw._iso = None
            assert np.isin(raw.predict(qs, qa, H)[0], iso[0, :nb]).sum() >= nb // 2


def test_two_stage_fit_options():
    tr = _small_trace(n=60, seed=4)
    H = 6
    half = len(tr) // 2
    ts, info = _two_stage(tr, H, None)
    first = TwoStagePredictor(H).fit(tr.prompt_len[:half], tr.output_len[:half]).model_arrays()
    second = TwoStagePredictor(H).fit(tr.prompt_len[half:], tr.output_len[half:]).model_arrays()
    # cross-fitting: the first half's requests use the model of the second half and vice versa
    assert ts[0].tolist() == [1] * half + [0] * (len(tr) - half)
    assert np.array_equal(ts[2][0], first[1]) and np.array_equal(ts[2][1], second[1])
    assert info["fit"].startswith("cross-fit") and 0.5 < info["auc"] <= 1.0
    kw = dict(n_replicas=3, max_slots=4, horizon=H)
    a = simulate(tr, "brh", predictor="two_stage", **kw)
    b = simulate(tr, "brh", predictor="two_stage", engine="python", **kw)
    for k in a.series:
        assert np.array_equal(a.series[k], b.series[k])
    assert a.policy == "brh:two_stage" and a.n_finished == len(tr)
    assert a.config["two_stage"]["fit"].startswith("cross-fit")
    ins = simulate(tr, "brh", predictor="two_stage", predictor_fit="in_sample", **kw)
    assert ins.config["two_stage"]["fit"].startswith("in sample")
    # a given model and a trace to fit on give the same run
    other = _small_trace(n=60, seed=9)
    tp = TwoStagePredictor(H).fit(other.prompt_len, other.output_len)
    c = simulate(tr, "brh", predictor="two_stage", predictor_fit=tp, **kw)
    d = simulate(tr, "brh", predictor="two_stage", predictor_fit=other, **kw)
    assert np.array_equal(c.requests["replica"], d.requests["replica"])
    assert np.array_equal(c.series["max_load"], d.series["max_load"])
    with pytest.raises(InvalidInputError, match="'predictor_fit'"):
        simulate(tr, "brh", predictor="two_stage", predictor_fit=tp, n_replicas=3, horizon=7)
    with pytest.raises(InvalidOptionError, match="'predictor_fit'"):
        simulate(tr, "brh", predictor="survival", predictor_fit="in_sample", **kw)
    with pytest.raises(InvalidOptionError, match="'predictor_fit'"):
        simulate(tr, "brh", predictor="two_stage", predictor_fit="halves", **kw)
    with pytest.raises(InvalidInputError, match="'predictor_fit'"):  # H = 0: nothing finishes
        simulate(tr, "brh", predictor="two_stage", horizon=0, n_replicas=3)


def test_staleness_without_optimistic_update_herds():
    # Two idle replicas, one request (prompt 100) per step (binary-exact times). With loads 50
    # steps stale and no optimistic update, JSQ sees tokens [0, 0] and requests [0, 0] at every
    # tick and herds everything onto replica 0 (the stale-metric failure mode).
    n = 6
    tr = Trace(
        arrival_s=np.arange(n) * 0.125, prompt_len=np.full(n, 100), output_len=np.full(n, 200)
    )
    kw = dict(n_replicas=2, max_slots=8, t0=0.125, kappa=0.0, **INSTANT)
    herd = simulate(tr, "jsq", stale=50, optimistic=False, **kw)
    assert herd.requests["replica"].tolist() == [0] * n
    # fresh loads seen at steps 1..5 (each running request adds a token per step):
    # [101, 0] -> 1, [102, 101] -> 1, [103, 203] -> 0, [205, 205] (tie, 2 = 2 requests) -> 0,
    # [308, 207] -> 1
    fresh = simulate(tr, "jsq", **kw)
    assert fresh.requests["replica"].tolist() == [0, 1, 1, 0, 0, 1]
    # stale [0, 0] plus the prompts (and counts) placed since: ties go to fewer requests
    opt = simulate(tr, "jsq", stale=50, optimistic=True, **kw)
    assert opt.requests["replica"].tolist() == [0, 1, 0, 1, 0, 1]
    assert herd.mean_imbalance > opt.mean_imbalance


def test_tick_every_k_steps():
    tr = Trace(arrival_s=[0.0, 0.0, 0.0], prompt_len=[5, 5, 5], output_len=[10, 10, 10])
    r = simulate(
        tr,
        "jsq",
        n_replicas=1,
        max_slots=1,
        t0=0.01,
        kappa=0.0,
        tick=4,
        **INSTANT,
    )
    # a slot frees after 10 steps, the next tick is at step 12, then 24 (step 22 frees it)
    assert (np.round(r.requests["start_s"] / 0.01)).astype(int).tolist() == [0, 12, 24]


def test_saturated_mode_is_load_overload_and_the_window_is_the_same_for_every_policy():
    tr = _small_trace(n=120, seed=2)
    kw = dict(n_replicas=2, max_slots=3)
    r = simulate(tr, "br0", saturated=True, overload=2.0, **kw)
    assert r.offered_load == 2.0
    same = simulate(tr, "br0", load=2.0, **kw)
    assert np.array_equal(r.series["max_load"], same.series["max_load"])
    lo, hi = r.window
    assert lo == 0 and 0 < hi < r.n_steps  # the drain after the last arrival is outside
    # while arrivals come the cluster is full almost all the time
    assert np.mean(r.series["running"][:hi] == 6) > 0.8
    # the window ends at the last arrival, whatever the policy admits last
    other = simulate(tr, "jsq", saturated=True, overload=2.0, **kw)
    last = r.requests["arrival_s"][-1]
    for rep in (r, other):
        t = rep.series["time_s"]
        assert t[rep.window[1] - 1] < last <= t[rep.window[1]]
    # whole-run metrics cover every step; windowed ones only the window
    imb = r.series["imbalance"]
    assert r.mean_imbalance == pytest.approx(imb.mean())
    assert r.window_mean_imbalance == pytest.approx(imb[:hi].mean())


def test_report_fields_and_summary():
    r = simulate(_small_trace(n=30), "jsq", n_replicas=2, max_slots=4)
    assert isinstance(r, SimReport)
    s = r.summary()
    for key in (
        "mean_imbalance",
        "balance_ratio",
        "throughput_tps",
        "slot_utilisation",
        "offered_load",
        "window_mean_imbalance",
        "window_throughput_tps",
        "window_slot_utilisation",
        "tpot_p50_ms",
        "tpot_p95_ms",
        "tpot_p99_ms",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "queue_p50_ms",
        "max_pool_wait_s",
        "sched_us_p50",
    ):
        assert np.isfinite(s[key]), key
    assert s["n_unfinished"] == 0 and s["n_preempted"] == 0
    assert 0 < r.balance_ratio <= 1 and 0 < r.slot_utilisation <= 1
    assert r.ttft_p50_ms >= r.queue_p50_ms
    assert r.config["prefill_instances"] == 1  # ceil(G / 2)


def test_max_steps_leaves_requests_unfinished():
    r = simulate(_small_trace(n=30), "jsq", n_replicas=2, max_slots=2, max_steps=40)
    assert r.n_steps == 40 and r.n_unfinished > 0
    assert r.n_finished + r.n_unfinished == r.n_requests
    waiting = np.isnan(r.requests["start_s"]) & ~np.isnan(r.requests["ready_s"])
    assert waiting.any()
    end = r.series["time_s"][-1] + r.series["step_s"][-1]
    i = np.flatnonzero(waiting)[0]
    assert r.requests["pool_wait_s"][i] == pytest.approx(end - r.requests["ready_s"][i])


def test_same_seed_same_run():
    tr = _small_trace(n=40)
    a = simulate(tr, "random", n_replicas=3, max_slots=2, seed=3)
    b = simulate(tr, "random", n_replicas=3, max_slots=2, seed=3)
    assert np.array_equal(a.requests["replica"], b.requests["replica"])


@pytest.mark.parametrize(
    "kw,name",
    [
        (dict(policy="nope"), "policy"),
        (dict(n_replicas=0), "n_replicas"),
        (dict(max_slots=-1), "max_slots"),
        (dict(kappa=float("nan")), "kappa"),
        (dict(stale=-1), "stale"),
        (dict(tick=0), "tick"),
        (dict(policy="brh", predictor="crystal_ball"), "predictor"),
        (dict(policy="brh", gamma=1.5), "gamma"),
        (dict(kv_capacity=10), "kv_capacity"),
        (dict(engine="fortran"), "engine"),
        (dict(optimistic="yes"), "optimistic"),
        (dict(load=0), "load"),
        (dict(load="1"), "load"),
        (dict(load=True), "load"),
        (dict(prefill_instances=-1), "prefill_instances"),
        (dict(prefill_tokens_per_s=0), "prefill_tokens_per_s"),
        (dict(policy="jsq", predictor="oracle"), "predictor"),
        (dict(policy="jsq", horizon=5), "horizon"),
        (dict(policy="jsq", refill=True), "refill"),
        (dict(policy="jsq", r_max=3), "r_max"),
        (dict(policy="brh", new_presence=[1.0]), "new_presence"),
        (dict(max_steps=0), "max_steps"),
    ],
)
def test_bad_input_names_the_parameter(kw, name):
    tr = _small_trace(n=5)
    with pytest.raises((InvalidInputError, InvalidOptionError), match=f"'{name}'|{name}"):
        simulate(tr, **kw)


def test_bad_trace_type():
    with pytest.raises(InvalidInputError, match="'trace'"):
        simulate([1, 2, 3])


@pytest.mark.skipif(
    not (TRACES / "AzureLLMInferenceTrace_conv.csv").exists(), reason="shared traces not available"
)
def test_real_trace_slice_br0_beats_jsq_when_saturated():
    tr = load_trace(TRACES / "AzureLLMInferenceTrace_conv.csv").window(0, 300)
    kw = dict(n_replicas=4, saturated=True)
    jsq = simulate(tr, "jsq", **kw)
    br0 = simulate(tr, "br0", **kw)
    assert br0.mean_imbalance < jsq.mean_imbalance
    assert br0.n_finished == jsq.n_finished == len(tr)


@pytest.mark.slow
@pytest.mark.skipif(
    not (TRACES / "AzureLLMInferenceTrace_conv.csv").exists(), reason="shared traces not available"
)
def test_full_hour_replay_every_policy():
    tr = load_trace(TRACES / "AzureLLMInferenceTrace_conv.csv")
    for pol in routing_policies():
        r = simulate(tr, pol)
        assert r.n_finished == len(tr)


def test_plot_imbalance_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    from straggler.sim.experiments.plots import plot_imbalance

    tr = _small_trace(n=30)
    reps = [simulate(tr, p, n_replicas=2, max_slots=4) for p in ("jsq", "br0")]
    out = tmp_path / "imb.png"
    fig = plot_imbalance(reps, out, bin_s=0.5)
    assert out.stat().st_size > 1000
    assert [t.get_text().split(" (")[0] for t in fig.axes[0].get_legend().get_texts()] == [
        "jsq",
        "br0",
    ]


def _max_overtake(r):
    """The largest ``enter_tick_j - enter_tick_o`` over pairs where ``j`` was admitted at a
    tick while ``o`` waited in the pool (how much younger an overtaker was, in ticks)."""
    e = r.requests["enter_tick"]
    a = r.requests["admit_tick"].astype(float)
    a[a < 0] = np.inf
    worst = -np.inf
    for j in np.flatnonzero(np.isfinite(a)):
        waiting = (e >= 0) & (e <= a[j]) & (a > a[j])
        if waiting.any():
            worst = max(worst, e[j] - e[waiting].min())
    return worst


def test_R8_pool_wait_bound_in_a_saturated_run():
    """THEOREMS.md R8 over a whole run: BR-S never admits a request that entered the pool
    more than A ticks after one still waiting (so each request is admitted before any request
    that entered more than A ticks after it); without the age window it does."""
    tr = _small_trace(n=120, seed=4)
    kw = dict(n_replicas=2, max_slots=3, load=3.0, kv_capacity=10**6, max_pool=512)
    for A in (4, 16):
        r = simulate(tr, "brs", age_window=A, age_fraction=1.0, patience=0, window=0, **kw)
        assert r.n_finished == len(tr)
        assert _max_overtake(r) <= A
    free = simulate(tr, "brs", age_window=10**6, age_fraction=1.0, patience=0, window=0, **kw)
    assert _max_overtake(free) > 16  # the F-score alone passes requests over for longer
    assert _max_overtake(simulate(tr, "jsq", **kw)) <= 0  # FCFS


def test_the_engine_frees_everything_it_allocates(run_python):
    """The phases that borrow the loop's arrays (no reference counting) leave numba's
    allocation counts balanced: a run frees every allocation it makes, in pool and queue
    mode, with a predictor and with prefix caches (NRT statistics, in a new process)."""
    code = (
        "from numba.core.runtime import rtsys\n"
        "from straggler.sim import simulate\n"
        "from straggler.sim.workloads.prefix import PrefixBlocks\n"
        "from straggler.sim.workloads.traces import generate_trace\n"
        "tr = generate_trace('azure_conv', n_requests=200, rng=1, rate=40.0)\n"
        "pb = PrefixBlocks.from_lists([[i % 7, i % 3 + 7] for i in range(200)], block_tokens=4)\n"
        "kws = (dict(policy='br0'), dict(policy='jsq', admission='queue'),\n"
        "       dict(policy='brh', predictor='survival'),\n"
        "       dict(policy='dynamo', prefix_blocks=pb))\n"
        "for kw in kws:  # compiled or loaded first (NRT starts with the first jitted call)\n"
        "    simulate(tr, n_replicas=3, **kw)\n"
        "for kw in kws:\n"
        "    a = rtsys.get_allocation_stats()\n"
        "    n = simulate(tr, n_replicas=3, **kw).n_finished  # the report is freed\n"
        "    b = rtsys.get_allocation_stats()\n"
        "    assert b.alloc - a.alloc > 0 and n == 200, kw\n"
        "    print(b.alloc - b.free - a.alloc + a.free)\n"
        "    print(b.mi_alloc - b.mi_free - a.mi_alloc + a.mi_free)\n"
    )
    out = run_python(code, env={"NUMBA_NRT_STATS": "1"})
    assert out.split() == ["0"] * 8, out
