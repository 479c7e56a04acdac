"""Predictors: oracle, survival, exact-match, two-stage; projected loads."""

import pathlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from straggler.formulations import ClusterState, InvalidInputError
from straggler.solvers.routing import _balanceroute as B
from straggler.solvers.routing.predictors import (
    ExactMatchPredictor,
    OraclePredictor,
    SurvivalPredictor,
    TwoStagePredictor,
    calibration_report,
    termination_samples,
)
from straggler.solvers.routing.route import (
    new_request_presence,
    presence_from_prediction,
    project_loads,
)

TRACE = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared/data/traces"


@st.composite
def running(draw, max_g=4, max_n=8):
    G = draw(st.integers(1, max_g))
    n = draw(st.integers(0, max_n))
    rep = draw(st.lists(st.integers(0, G - 1), min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    dec = draw(st.lists(st.integers(0, 20), min_size=n, max_size=n))
    extra = draw(st.lists(st.integers(1, 15), min_size=n, max_size=n))
    out = [a + e for a, e in zip(dec, extra)]
    return ClusterState(
        free_slots=[1] * G,
        running_replica=rep,
        running_prompt=prompt,
        running_decoded=dec,
        running_output=out,
        pool_prefill=[],
    )


@given(st_=running(), H=st.integers(0, 12))
def test_oracle_projection_is_the_true_future(st_, H):
    """With the oracle, projected loads equal a step-by-step replay of the running requests."""
    P = project_loads(st_, OraclePredictor(), H)
    truth = np.zeros((st_.n_replicas, H + 1))
    for g, s, a, o in zip(
        st_.running_replica, st_.running_prompt, st_.running_decoded, st_.running_output
    ):
        for h in range(H + 1):
            if a + h < o:  # still resident after h more steps
                truth[g, h] += s + a + h
    assert np.array_equal(P, truth)
    assert np.array_equal(P[:, 0], st_.loads)


@given(
    rep=st.lists(st.integers(0, 2), max_size=6),
    H=st.integers(0, 6),
    data=st.data(),
)
def test_project_loads_kernel_equals_reference(rep, H, data):
    n = len(rep)
    tokens = np.array(data.draw(st.lists(st.integers(0, 99), min_size=n, max_size=n)), float)
    c = np.array(data.draw(st.lists(st.floats(0, 10, width=16), min_size=n, max_size=n)), float)
    r = np.array(rep, dtype=np.int64)
    a = B.project_loads_kernel(r, tokens, c, 3, H)
    b = B.project_loads_kernel.py_func(r, tokens, c, 3, H)
    ref = B.project_loads_reference(r, tokens, c, 3, H)
    assert np.array_equal(a, b) and np.array_equal(a, ref)
    refill = data.draw(st.sampled_from([0.0, 0.5, 37.0]))
    a = B.project_loads_kernel(r, tokens, c, 3, H, refill)
    b = B.project_loads_kernel.py_func(r, tokens, c, 3, H, refill)
    ref = B.project_loads_reference(r, tokens, c, 3, H, refill)
    assert np.array_equal(a, b) and np.array_equal(a, ref)
    # each running request's slot holds it or its refill: refill weight 1 - w_ih per request
    one = B.project_loads_reference(r, tokens, c, 3, H, 1.0)
    diff = (one - B.project_loads_reference(r, tokens, c, 3, H)).sum(axis=0)
    want = (1.0 - np.clip(c[:, None] - np.arange(H + 1), 0.0, 1.0)).sum(axis=0)
    assert np.allclose(diff, want)


def test_project_loads_refill_options():
    st_ = ClusterState(
        free_slots=[1, 1],
        running_replica=[0, 1],
        running_prompt=[4, 2],
        running_decoded=[0, 0],
        running_output=[2, 5],
        pool_prefill=[3, 7],
    )
    paper = project_loads(st_, OraclePredictor(), 3)
    assert np.array_equal(project_loads(st_, OraclePredictor(), 3, refill=0), paper)
    got = project_loads(st_, OraclePredictor(), 3, refill=10.0)
    assert got.tolist() == [[4.0, 5.0, 10.0, 10.0], [2.0, 3.0, 4.0, 5.0]]
    assert np.array_equal(project_loads(st_, OraclePredictor(), 3, refill="pool")[:, 0], [4, 2])
    for bad in (-1.0, np.nan, np.inf, "mean", True, [1.0]):
        with pytest.raises(InvalidInputError, match="'refill'"):
            project_loads(st_, OraclePredictor(), 3, refill=bad)


def test_new_request_presence_is_the_output_survival():
    o = np.array([1, 3, 3, 10, 2])
    pi = new_request_presence(o, 12)
    assert pi.tolist() == [float(np.mean(o > h)) for h in range(13)]
    assert pi[0] == 1.0
    for bad in ([], [0, 2], [np.nan]):
        with pytest.raises(InvalidInputError, match="'output_lengths'"):
            new_request_presence(bad, 3)
    with pytest.raises(InvalidInputError, match="'horizon'"):
        new_request_presence([1], -1)


def test_confidence_gate():
    c = presence_from_prediction([0.49, 0.5, 1.0], [2.0, 2.0, 2.0], 8)
    assert c.tolist() == [9.0, 0.5 * 9 + 0.5 * 2, 2.0]


@given(
    outs=st.lists(st.integers(1, 60), min_size=1, max_size=40),
    ages=st.lists(st.integers(0, 70), min_size=1, max_size=5),
    H=st.integers(0, 30),
)
def test_survival_matches_direct_conditional_frequencies(outs, ages, H):
    sp = SurvivalPredictor(outs)
    p, mu = sp.predict(np.zeros(len(ages)), ages, H)
    o = np.array(outs, float)
    for a, pi, mi in zip(ages, p, mu):
        alive = o[o > a]
        fin = alive[alive - a <= H]
        assert pi == pytest.approx(fin.size / alive.size if alive.size else 0.0)
        if fin.size:
            assert mi == pytest.approx((fin - a).mean())


def test_survival_online_equals_fit():
    rng = np.random.default_rng(0)
    outs = rng.integers(1, 500, 1000).astype(float)
    online = SurvivalPredictor(refresh=0.0)
    for o in outs:
        online.observe(0, o)
    online._rebuild()
    fitted = SurvivalPredictor(outs)
    ages = np.arange(0, 600, 7.0)
    for x, y in zip(online.predict(ages, ages, 40), fitted.predict(ages, ages, 40)):
        assert np.array_equal(x, y)
    assert online.n_observed == 1000


def test_exact_match_hits_and_falls_back():
    fb = SurvivalPredictor([10, 20, 30])
    em = ExactMatchPredictor(fb)
    em.observe([5, 5], [12, 100], prefix=[1, 2])
    p, mu = em.predict([5, 5, 5, 5], [3, 3, 3, 150], 10, prefix=[1, 2, 9, 2])
    fp, fmu = fb.predict([5] * 4, [3, 3, 3, 150], 10)
    assert p[0] == 1.0 and mu[0] == 9.0  # hit: 12 - 3 = 9 <= 10
    assert p[1] == 0.0 and mu[1] == 97.0  # hit, finishes beyond the horizon
    assert p[2] == fp[2] and mu[2] == fmu[2]  # miss
    assert p[3] == fp[3]  # memo says it should be done already: fallback


def test_termination_samples_count_and_labels():
    s, a, y, r = termination_samples([3, 4], [5, 1], 4)  # stride 2
    assert a.tolist() == [0, 2, 4, 0] and s.tolist() == [3, 3, 3, 4]
    assert y.tolist() == [0, 1, 1, 1] and r.tolist() == [5, 3, 1, 1]


def test_two_stage_is_calibrated_on_synthetic_data():
    rng = np.random.default_rng(0)
    n = 3000
    s = rng.integers(16, 4096, n).astype(float)
    # output length depends on the prompt: geometric with a prompt-dependent mean
    mean = np.where(s > 1000, 40.0, 300.0)
    o = rng.geometric(1.0 / mean).astype(float)
    tp = TwoStagePredictor(40).fit(s[:2000], o[:2000])
    rep = tp.calibration(s[2000:], o[2000:])
    _, _, y, _ = termination_samples(s[2000:], o[2000:], 40)
    base = calibration_report(np.full(y.size, y.mean()), y)
    assert rep.auc > 0.75
    assert rep.brier < base.brier
    assert rep.ece < 0.05
    p, mu = tp.predict([3000.0, 100.0], [0.0, 0.0], 40)
    assert p[0] > p[1]
    assert 1.0 <= mu.min() and mu.max() <= 40.0
    assert "Brier" in rep.table()


def test_calibration_report_perfect_and_errors():
    r = calibration_report([0.0, 1.0, 1.0], [0, 1, 1])
    assert r.brier == 0.0 and r.auc == 1.0 and r.ece == 0.0
    with pytest.raises(InvalidInputError, match="'y'"):
        calibration_report([0.5], [2])
    with pytest.raises(InvalidInputError, match="'output'"):
        OraclePredictor().predict([1], [1], 3)
    with pytest.raises(InvalidInputError, match="'horizon'"):
        SurvivalPredictor([1]).predict([1], [1], -1)


@pytest.mark.skipif(not (TRACE / "AzureLLMInferenceTrace_conv.csv").exists(), reason="no trace")
def test_predictors_on_azure_conversation_trace():
    data = np.loadtxt(
        TRACE / "AzureLLMInferenceTrace_conv.csv", delimiter=",", skiprows=1, usecols=(1, 2)
    )
    s, o = data[:, 0], np.maximum(data[:, 1], 1)
    half = s.size // 2
    tp = TwoStagePredictor(80).fit(s[:half], o[:half])
    rep = tp.calibration(s[half:], o[half:])
    _, a, y, _ = termination_samples(s[half:], o[half:], 80)
    sp = SurvivalPredictor(o[:half])
    p_surv, _ = sp.predict(a, a, 80)
    surv = calibration_report(np.clip(p_surv, 0, 1), y)
    assert rep.auc > 0.6 and surv.auc > 0.6
    assert rep.ece < 0.1


def test_two_stage_model_arrays_recompute_predict():
    """model_arrays + the evaluation order written in its docstring give predict's numbers."""
    import bisect
    import math

    rng = np.random.default_rng(1)
    s = rng.integers(0, 3000, 400)
    o = np.maximum(1, rng.geometric(np.where(s > 1500, 1 / 10, 1 / 60)))
    for tp in (TwoStagePredictor(16).fit(s, o), TwoStagePredictor(16, calibration=0.0).fit(s, o)):
        knots, lin, iso, nb = tp.model_arrays()
        qs, qa = rng.integers(0, 4000, 300).astype(float), rng.integers(0, 300, 300).astype(float)
        p, mu = tp.predict(qs, qa, 16)
        for x, a, pi, mi in zip(qs, qa, p, mu):
            ls, la = math.log1p(x), math.log1p(a)
            f = [1.0, ls, la, ls * ls, la * la, ls * la]
            f += [max(ls - k, 0.0) for k in knots[0]] + [max(la - k, 0.0) for k in knots[1]]
            z = y = 0.0
            for j, fj in enumerate(f):
                phi = (fj - lin[0, j]) / lin[1, j]
                z, y = z + phi * lin[2, j], y + phi * lin[3, j]
            q = 1.0 / (1.0 + math.exp(-z))
            if nb:
                q = iso[1, min(bisect.bisect_left(list(iso[0]), q), nb - 1)]
            assert q == pi and min(max(y, 1.0), 16.0) == mi
        assert np.all((p >= 0) & (p <= 1)) and np.all((mu >= 1) & (mu <= 16))
    with pytest.raises(InvalidInputError, match="before fit"):
        TwoStagePredictor(4).model_arrays()
    with pytest.raises(InvalidInputError, match="'horizon'"):
        tp.predict([1.0], [1.0], 8)


def test_termination_samples_random_phase_brute_force():
    rng = np.random.default_rng(5)
    s, o = rng.integers(0, 50, 40), rng.integers(1, 30, 40)
    for stride in (1, 4, 7):
        ps, pa, py, pr = termination_samples(s, o, 6, stride, rng=11)
        k = 0
        firsts = []
        for si, oi in zip(s, o):
            ages = pa[k : k + int(np.ceil(oi / stride)) + 1]
            b = ages[0]
            firsts.append(b)
            assert 0 <= b < min(stride, oi) and b == int(b)
            want = np.arange(b, oi, stride, dtype=float)
            assert np.array_equal(pa[k : k + want.size], want)
            assert np.all(ps[k : k + want.size] == si)
            assert np.array_equal(pr[k : k + want.size], oi - want)
            assert np.array_equal(py[k : k + want.size], (oi - want <= 6).astype(float))
            k += want.size
        assert k == pa.size
        if stride == 7:
            assert len(set(firsts)) > 3  # not all on the grid
    same = termination_samples(s, o, 6, 4, rng=11)
    assert all(np.array_equal(x, y) for x, y in zip(same, termination_samples(s, o, 6, 4, rng=11)))


def test_two_stage_random_phase_covers_the_ages_between_samples():
    """Outputs that depend on age strongly (near-constant per prompt class): with samples only at
    ages 0, H/2, H, ... the regressor is biased at the ages in between; random phases fix it."""
    rng = np.random.default_rng(0)
    n = 1500
    s = rng.integers(16, 4096, n).astype(float)
    o = (np.where(s > 1000, 60, 200) + rng.integers(-20, 21, n)).astype(float)
    S, a, y, r = termination_samples(s[1000:], o[1000:], 40, stride=1)  # every age
    bias, ece = {}, {}
    for ph in ("zero", "random"):
        tp = TwoStagePredictor(40, phase=ph).fit(s[:1000], o[:1000])
        _, mu = tp.predict(S, a, 40)
        bias[ph] = float(np.mean(mu[y == 1] - r[y == 1]))
        ece[ph] = tp.calibration(s[1000:], o[1000:], stride=1).ece
    assert abs(bias["random"]) < 1.0 < 3.0 < abs(bias["zero"])
    assert ece["random"] < ece["zero"]
    with pytest.raises(InvalidInputError, match="'phase'"):
        TwoStagePredictor(4, phase="middle")


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(free_slots=["1", "2"]), "free_slots"),
        (dict(free_slots=[True, 1]), "free_slots"),
        (dict(running_prompt=[1 + 1j]), "running_prompt"),
        (dict(running_prompt=["4"]), "running_prompt"),
        (dict(running_replica=[2]), "running_replica"),
        (dict(pool_prefill=[1.7e308]), "pool_prefill"),
        (dict(loads=[1.0]), "loads"),
    ],
)
def test_cluster_state_validation(kwargs, param):
    base = dict(
        free_slots=[1, 1],
        running_replica=[0],
        running_prompt=[4],
        running_decoded=[1],
        pool_prefill=[3],
    )
    with pytest.raises(InvalidInputError, match=f"'{param}'"):
        ClusterState(**{**base, **kwargs})


def test_project_loads_and_predictors_validation():
    st = ClusterState(
        free_slots=[1, 1],
        running_replica=[0],
        running_prompt=[4],
        running_decoded=[1],
        pool_prefill=[3],
    )
    for bad, param in ((True, "horizon"), (-1, "horizon"), ("3", "horizon")):
        with pytest.raises(InvalidInputError, match=f"'{param}'"):
            project_loads(st, SurvivalPredictor([3, 4]), bad)
    with pytest.raises(InvalidInputError, match="'refill'"):
        project_loads(st, SurvivalPredictor([3, 4]), 3, refill="all")
    with pytest.raises(InvalidInputError, match="'predictor'"):
        project_loads(st, object(), 3)
    with pytest.raises(InvalidInputError, match="'outputs'"):
        SurvivalPredictor(["3", "4"])
    with pytest.raises(InvalidInputError, match="'decoded'"):
        SurvivalPredictor([3, 4]).predict([1], [True], 2)
    with pytest.raises(InvalidInputError, match="'calibration'"):
        TwoStagePredictor(4, calibration=1.0)
    with pytest.raises(InvalidInputError, match="'stride'"):
        termination_samples([1], [5], 4, stride=0)
    with pytest.raises(InvalidInputError, match="'p'"):
        calibration_report([0.5, 1.5], [0, 1])
