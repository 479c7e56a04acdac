"""The lock-step simulator: kernel == py_func == reference, invariants checked from scratch,
projection == project_loads, metrics, staleness, saturated mode, validation."""

import pathlib

import numpy as np
import pytest
from straggler.formulations import InvalidInputError, InvalidOptionError
from straggler.formulations.routing import ClusterState
from straggler.sim._engine import (
    no_two_stage,
    project_view,
    run_engine,
    run_engine_reference,
    two_stage_predict,
)
from straggler.sim.simulator import SimReport, _two_stage, simulate
from straggler.sim.traces import Trace, generate_trace, load_trace
from straggler.solvers import get_routing_policy, routing_policies
from straggler.solvers.predictors import (
    ExactMatchPredictor,
    OraclePredictor,
    SurvivalPredictor,
    TwoStagePredictor,
    termination_samples,
)
from straggler.solvers.routing import make_params, new_request_presence, project_loads

TRACES = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"


def _small_trace(n=60, seed=1, hashes=False):
    tr = generate_trace("azure_conv", n_requests=n, rng=seed, rate=40.0)
    out = np.minimum(tr.output_len, 40)
    h = None
    if hashes:
        h = np.random.default_rng(seed).integers(0, 6, n)  # few prompts: many exact-match hits
    return Trace(arrival_s=tr.arrival_s, prompt_len=tr.prompt_len, output_len=out, prefix_hash=h)


def _engine_args(
    tr,
    *,
    G=3,
    slots=4,
    stale=0,
    optimistic=True,
    pred_kind=0,
    H=0,
    tick=1,
    kv=10**9,
    max_pool=8,
    seed=5,
    refill=False,
    presence=False,
):
    order = np.argsort(tr.arrival_s + 0.001, kind="stable")
    ready = tr.arrival_s[order] + 0.001
    prompt = tr.prompt_len[order]
    output = tr.output_len[order]
    if tr.prefix_hash is not None:
        group = tr.prefix_hash[order].astype(np.int64)
        n_groups = int(group.max()) + 1
    else:
        group = np.full(len(tr), -1, np.int64)
        n_groups = 0
    sp = SurvivalPredictor(output)
    ages = np.arange(int(output.max()) + 1, dtype=float)
    p, mu = sp.predict(np.zeros_like(ages), ages, H)
    two_stage = no_two_stage()
    if pred_kind == 4:  # cross-fitted models (trace order), then in engine order
        ts, _ = _two_stage(tr, H, None)
        two_stage = (np.ascontiguousarray(ts[0][order]),) + ts[1:]
    params = make_params(
        r_max=3,
        s_greedy=4,
        beta=float(G),
        optimistic=optimistic,
        new_presence=new_request_presence(output, H) if presence else None,
    )
    return (
        params,
        ready,
        prompt,
        output,
        group,
        n_groups,
        G,
        slots,
        kv,
        0.01,
        1e-5,
        tick,
        stale,
        optimistic,
        max_pool,
        H,
        pred_kind,
        p,
        mu,
        seed,
        10**6,
        True,
        refill,
        two_stage,
    )


def _same(a, b):
    for x, y in zip(a[:5], b[:5]):
        assert x.shape == y.shape
        assert np.array_equal(x, y, equal_nan=True)
    assert np.array_equal(a[6], b[6])  # pool size per tick (a[5] holds timings)


# Each policy compiles the step loop once (~5 s), so the default run covers four of them (BR-0,
# JSQ, random, BR-H with its four predictors); the other baselines run with -m slow.
CASES = [
    ("br0", dict()),
    ("br0", dict(stale=4, tick=3, tight_kv=True)),
    ("jsq", dict(stale=3)),
    ("jsq", dict(stale=3, optimistic=False)),
    ("random", dict(tick=2, tight_kv=True)),
    ("brh", dict(pred_kind=1, H=6)),
    ("brh", dict(pred_kind=2, H=6, stale=2)),
    ("brh", dict(pred_kind=3, H=6)),
    ("brh", dict(pred_kind=1, H=6, refill=True, presence=True, stale=2)),
    ("brh", dict(pred_kind=2, H=6, refill=True, max_pool=3)),
    ("brh", dict(pred_kind=4, H=6, stale=2)),
    ("brh", dict(pred_kind=4, H=6, refill=True, presence=True, max_pool=3)),
]
SLOW_CASES = [
    ("p2c", dict(tight_kv=True)),
    ("round_robin", dict()),
    ("trtllm", dict()),
    ("vllm", dict(stale=2)),
    ("jsq_requests", dict()),
]


def _check_engines(policy, kw):
    kw = dict(kw)
    tr = _small_trace(hashes=kw.get("pred_kind") == 3)
    if kw.pop("tight_kv", False):
        kw["kv"] = int(tr.prompt_len.max()) + 300  # binds often, yet every prompt fits
    args = _engine_args(tr, **kw)
    pol = get_routing_policy(policy)
    a = run_engine(pol.policy_id, *args)
    b = run_engine.py_func(pol.policy_id, *args)
    c = run_engine_reference(pol.reference, *args)
    _same(a, b)
    _same(a, c)
    assert np.all(np.isfinite(a[2])), "every request finishes"


@pytest.mark.parametrize("policy,kw", CASES)
def test_kernel_equals_py_func_equals_reference(policy, kw):
    _check_engines(policy, kw)


@pytest.mark.slow
@pytest.mark.parametrize("policy,kw", SLOW_CASES)
def test_kernel_equals_reference_other_baselines(policy, kw):
    _check_engines(policy, kw)


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
        tr, policy, n_replicas=G, max_slots=slots, t0=0.01, kappa=1e-5, kv_capacity=7000, max_pool=8
    )
    rq = r.requests
    assert r.n_finished == len(tr)
    # each request decodes exactly output_len steps, one per step, then leaves
    series = np.column_stack(
        [r.series[k] for k in ("time_s", "step_s", "max_load", "sum_load", "running", "pool")]
    )
    clock, dt = series[:, 0], series[:, 1]
    for i in range(len(tr)):
        k0 = np.searchsorted(clock, rq["start_s"][i])
        k1 = k0 + rq["output_len"][i]
        assert rq["finish_s"][i] == clock[k1 - 1] + dt[k1 - 1]
        assert rq["first_s"][i] == clock[k0] + dt[k0]
        assert rq["start_s"][i] >= rq["ready_s"][i]
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
    # KV capacity at admission
    for i in range(len(tr)):
        k0 = np.searchsorted(clock, rq["start_s"][i])
        g = rq["replica"][i]
        assert loads[k0, g] <= 7000
    # metrics from their definitions
    imb = G * loads.max(axis=1) - loads.sum(axis=1)
    assert r.mean_imbalance == pytest.approx(imb.mean())
    span = clock[-1] + dt[-1] - clock[0]
    assert r.throughput_tps == pytest.approx(counts.sum() / span)
    assert counts.sum() == tr.output_len.sum()
    tpot = (rq["finish_s"] - rq["start_s"]) / rq["output_len"]
    assert r.tpot_p95_ms == pytest.approx(np.percentile(tpot, 95) * 1e3)


def test_numba_and_python_engines_give_the_same_report():
    tr = _small_trace(n=50, seed=11)
    kw = dict(n_replicas=4, max_slots=3, stale=2, saturated=True, max_pool=16)
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
    # tick and herds everything onto replica 0 (the ANCHORS.md failure mode).
    n = 6
    tr = Trace(
        arrival_s=np.arange(n) * 0.125, prompt_len=np.full(n, 100), output_len=np.full(n, 200)
    )
    kw = dict(
        n_replicas=2, max_slots=8, t0=0.125, kappa=0.0, prefill_base_s=0.0, prefill_per_token_s=0.0
    )
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
        prefill_base_s=0.0,
        prefill_per_token_s=0.0,
    )
    # a slot frees after 10 steps, the next tick is at step 12, then 24 (step 22 frees it)
    assert (np.round(r.requests["start_s"] / 0.01)).astype(int).tolist() == [0, 12, 24]


def test_saturated_mode_window_and_pool():
    tr = _small_trace(n=120, seed=2)
    r = simulate(tr, "br0", n_replicas=2, max_slots=3, saturated=True, overload=2.0)
    lo, hi = r.window
    assert lo == 0 and 0 < hi <= r.n_steps
    # until the last admission the cluster is full almost all the time
    assert np.mean(r.series["running"][:hi] == 6) > 0.8
    assert r.series["time_s"][hi - 1] <= np.nanmax(r.requests["start_s"])


def test_report_fields_and_summary():
    r = simulate(_small_trace(n=30), "jsq", n_replicas=2, max_slots=4)
    assert isinstance(r, SimReport)
    s = r.summary()
    for key in (
        "mean_imbalance",
        "balance_ratio",
        "throughput_tps",
        "tpot_p50_ms",
        "tpot_p95_ms",
        "tpot_p99_ms",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "queue_p50_ms",
        "sched_us_p50",
    ):
        assert np.isfinite(s[key]), key
    assert 0 < r.balance_ratio <= 1
    assert r.ttft_p50_ms >= r.queue_p50_ms


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
        (dict(gamma=1.5), "gamma"),
        (dict(kv_capacity=10), "kv_capacity"),
        (dict(engine="fortran"), "engine"),
        (dict(optimistic="yes"), "optimistic"),
    ],
)
def test_bad_input_names_the_parameter(kw, name):
    tr = _small_trace(n=5)
    with pytest.raises((InvalidInputError, InvalidOptionError), match=f"'{name}'"):
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
    from straggler.sim.plots import plot_imbalance

    tr = _small_trace(n=30)
    reps = [simulate(tr, p, n_replicas=2, max_slots=4) for p in ("jsq", "br0")]
    out = tmp_path / "imb.png"
    fig = plot_imbalance(reps, out, bin_s=0.5)
    assert out.stat().st_size > 1000
    assert [t.get_text().split(" (")[0] for t in fig.axes[0].get_legend().get_texts()] == [
        "jsq",
        "br0",
    ]
