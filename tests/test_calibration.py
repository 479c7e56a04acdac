"""fit_cost_model: recovery of known models, intervals, the H20 anchor, logs, bad input."""

import dataclasses
import math

import numpy as np
import pytest
from straggler.formulations import CostModel, InvalidInputError, InvalidOptionError
from straggler.solvers import CalibrationResult, fit_cost_model
from straggler.solvers.dispatch.calibration import read_calibration_log, write_calibration_log

G_GRID = np.array([1, 2, 4, 8, 12, 16, 24, 32, 40])
TPE = 2 ** np.arange(13)  # tokens per expert 1..4096 (App. B's log ladder)


def grid(reps=1, g=G_GRID, tpe=TPE, tile=None):
    G = np.tile(np.repeat(g, len(tpe)), reps).astype(float)
    per = np.tile(np.tile(tpe, len(g)), reps)
    N = G * per
    T = None if tile is None else G * np.ceil(per / tile)
    return G, N, T


def logged(cost, G, N, T=None, noise=0.0, seed=0):
    t = cost.time(G, N, T)
    if noise:
        t = t * np.exp(np.random.default_rng(seed).normal(0, noise, t.shape))
    return t


H20 = CostModel(a=19.0, b=7.1, c=40.0, beta=0.178)  # ANCHORS.md's H20 max-affine fit


def test_noise_free_two_piece_recovered_exactly():
    G, N, _ = grid()
    fit = fit_cost_model(G, N, logged(H20, G, N), bootstrap=0, rng=0)
    for k in ("a", "b", "c", "beta"):
        assert fit.params[k] == pytest.approx(getattr(H20, k), rel=1e-9), k
    assert fit.rel_rms < 1e-9 and fit.max_rel_error < 1e-9
    assert fit.n_star == pytest.approx(7.1 / 0.178)
    assert fit.converged
    # each sample is labelled with the piece that attains the max in the fitted model
    act = H20.a + H20.b * G
    tok = H20.c + H20.beta * N
    np.testing.assert_array_equal(fit.piece, np.where(act >= tok, 0, 1))
    assert math.isnan(fit.intervals["b"][0])


def test_tile_term_and_three_pieces_recovered_exactly():
    tile_model = CostModel.preset("qwen3_235b_b_tile").replace(c2=None, gamma=None)
    G, N, T = grid(tile=128)
    fit = fit_cost_model(G, N, logged(tile_model, G, N, T), T=T, bootstrap=0, rng=0)
    for k in ("a", "b", "b2", "c", "beta"):
        assert fit.params[k] == pytest.approx(getattr(tile_model, k), rel=1e-6), k
    assert fit.cost.has_tiles and not fit.cost.has_traffic
    # three pieces whose token lines cross inside the logged range (N = 312 tokens)
    three = CostModel(a=16.4, b=2.99, c=30.0, beta=0.02, c2=5.0, gamma=0.1)
    G, N, _ = grid()
    fit = fit_cost_model(G, N, logged(three, G, N), pieces=3, bootstrap=0, rng=1)
    assert list(fit.params) == ["a", "b", "c", "beta", "c2", "gamma"]
    for k, v in fit.params.items():
        assert v == pytest.approx(getattr(three, k), rel=1e-6), k
    assert set(np.unique(fit.piece)) == {0, 1, 2}


def test_noisy_recovery_within_intervals():
    """3% multiplicative noise: the true parameters lie inside the 95% bootstrap intervals
    about as often as they should (percentile intervals; 40 chances over 10 seeds)."""
    G, N, _ = grid()
    hits = {k: 0 for k in ("a", "b", "c", "beta")}
    for seed in range(10):
        fit = fit_cost_model(G, N, logged(H20, G, N, noise=0.03, seed=seed), rng=seed)
        assert 0.02 < fit.rel_rms < 0.04
        assert fit.bootstrap_params.shape == (200, 4)
        for k in hits:
            lo, hi = fit.intervals[k]
            hits[k] += lo <= getattr(H20, k) <= hi
            assert abs(fit.params[k] - getattr(H20, k)) <= 3 * (hi - lo), (seed, k)
    assert sum(hits.values()) >= 32, hits
    assert min(hits.values()) >= 7, hits


def test_intervals_shrink_with_more_samples():
    widths = {}
    for reps in (1, 8):
        w = []
        for seed in (1, 2):
            G, N, _ = grid(reps)
            fit = fit_cost_model(
                G, N, logged(H20, G, N, noise=0.03, seed=10 * seed + reps), rng=seed, bootstrap=100
            )
            w.append([fit.intervals[k][1] - fit.intervals[k][0] for k in ("a", "b", "c", "beta")])
        widths[reps] = np.mean(w, axis=0)
    # about 1/sqrt(8) = 0.35 expected for 8x the samples
    assert np.all(widths[8] < 0.75 * widths[1]), widths


def test_h20_points_give_b_near_7_us_per_expert():
    """ANCHORS.md: H20 grouped GEMM (Qwen3-235B expert shape, bf16, one token per expert)."""
    G = np.array([1, 2, 4, 8, 12, 16], dtype=float)
    t = np.array([25.5, 29.4, 48.7, 74.0, 101.0, 129.7])
    # The anchor gives the token sweep only through its fit (c = 40, beta = 0.178): its
    # points, where the compute piece binds, identify the token piece, so b is fitted
    # from the measured G sweep alone.
    Gt = np.repeat([1.0, 2, 4, 8], 4)
    Nt = Gt * np.tile([256, 512, 1024, 2048], 4)
    fit = fit_cost_model(
        np.r_[G, Gt], np.r_[G, Nt], np.r_[t, 40 + 0.178 * Nt], rng=0, bootstrap=100
    )
    assert 6.5 <= fit.params["b"] <= 7.5
    assert fit.intervals["b"][0] <= 7.1 <= fit.intervals["b"][1]
    assert fit.rel_rms < 0.06
    # the marginal cost of one more activated expert on the measured sweep alone is ~7 us
    slope = (fit.cost.time(16, 16) - fit.cost.time(4, 4)) / 12
    assert 6.5 <= slope <= 7.5


def test_same_seed_same_result_and_json_round_trip(tmp_path):
    G, N, _ = grid()
    t = logged(H20, G, N, noise=0.05, seed=3)
    a = fit_cost_model(G, N, t, rng=7, bootstrap=20)
    b = fit_cost_model(G, N, t, rng=7, bootstrap=20)
    np.testing.assert_array_equal(a.bootstrap_params, b.bootstrap_params)
    assert a.params == b.params
    path = tmp_path / "fit.json"
    a.save(path)
    c = CalibrationResult.load(path)
    assert c.params == a.params and c.intervals == a.intervals and c.cost == a.cost
    np.testing.assert_array_equal(c.piece, a.piece)
    assert "rel RMS" in c.table()
    # what load would not give back as written is refused, naming the field; nothing written
    for field, value, match in (
        ("iterations", 2.5, "'iterations' field"),  # load read it as 2
        ("bootstrap_params", np.zeros((2, len(a.params) + 1)), "bootstrap_params"),
        ("meta", {"shape": (1, 2)}, "'meta' parameter of CalibrationResult.save"),  # a list
        ("meta", {"n": {1: 2}}, "'meta' parameter of CalibrationResult.save"),  # key '1'
        ("cost", None, "CalibrationResult.save writes the fields"),  # AttributeError
    ):
        with pytest.raises(InvalidInputError, match=match):
            dataclasses.replace(a, **{field: value}).save(tmp_path / "refused.json")
        assert not (tmp_path / "refused.json").exists()
    with pytest.raises(InvalidInputError, match="'meta' parameter of fit_cost_model"):
        fit_cost_model(G, N, t, bootstrap=0, meta={"shape": (1, 2)})
    (tmp_path / "bad.json").write_text('{"format": "straggler-calibration", "cost": {}}')
    with pytest.raises(InvalidInputError, match="'cost' field of .*bad.json") as e:
        CalibrationResult.load(tmp_path / "bad.json")
    assert "__init__" not in str(e.value)  # one message, not another nested inside it
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InvalidInputError, match="is not JSON"):
        CalibrationResult.load(tmp_path / "bad.json")


def test_log_round_trip_and_malformed_logs(tmp_path):
    G, N, T = grid(tile=128)
    t = logged(H20, G, N)
    p = tmp_path / "log.csv"
    write_calibration_log(p, G, N, t, T=T, meta={"gpu": "test", "dtype": "bf16"})
    log = read_calibration_log(p)
    np.testing.assert_array_equal(log["G"], G)
    np.testing.assert_array_equal(log["T"], T)
    np.testing.assert_array_equal(log["t"], t)
    assert log["meta"] == {"gpu": "test", "dtype": "bf16"}
    # metadata the log could not give back as written is refused, and the file is untouched
    before = p.read_bytes()
    for meta in ({"gpu": "x\n1,1,1"}, {"a:b": 1}, {" gpu": "x"}, {"gpu": " x"},
                 {3: "x"}, {"gpu": "x\u2028y"}, {"gpu": "\ud800"}, ["gpu"]):  # fmt: skip
        with pytest.raises(InvalidInputError, match="'meta' parameter of write_calibration_log"):
            write_calibration_log(p, G, N, t, T=T, meta=meta)
    assert p.read_bytes() == before
    with pytest.raises(InvalidInputError, match="'G' parameter of write_calibration_log"):
        write_calibration_log(p, [], [], [])  # no rows: read_calibration_log refuses it
    assert p.read_bytes() == before
    write_calibration_log(tmp_path / "e.csv", G, N, t, meta={"": 1})  # '# : 1' reads back
    assert read_calibration_log(tmp_path / "e.csv")["meta"] == {"": "1"}
    bad = {
        "noheader.csv": "1,2,3\n",
        "short.csv": "G,N,t_us\n1,2\n",
        "text.csv": "G,N,t_us\n1,x,3\n",
        "nan.csv": "G,N,t_us\n1,2,nan\n",
        "inf.csv": "G,N,t_us\n1,2,3\n2,-inf,4\n",
        "empty.csv": "# gpu: x\n",
        "negative.csv": "G,N,t_us\n1,-2,3\n",
        "zero_time.csv": "G,N,t_us\n1,2,0\n",
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(InvalidInputError, match=name):
            read_calibration_log(tmp_path / name)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(G=[1, 2, 3], N=[1, 2], t=[1, 2, 3]), "'N' parameter"),
        (dict(G=[1, 2, 3, 4, 5], N=[1, 2, 3, 4, 9], t=[1, 2, 0, 4, 5]), "'t' parameter"),
        (dict(G=[1, 2, 3], N=[1, 4, 9], t=[1, 2, 3]), "at least 5 samples"),
        (dict(G=[2, 2, 2, 2, 2], N=[1, 2, 3, 4, 5], t=[1, 2, 3, 4, 5]), "two values of G"),
        (dict(G=[1, 2, 3, 4, 5], N=[2, 4, 6, 8, 10], t=[1, 2, 3, 4, 5]), "tokens per expert"),
        (dict(G=[1, 2, 3, 4, 5], N=[1, 4, 9, 16, 25], t=[1, 2, 3, 4, 5], T=[1, 1, 3, 4, 5]), "T"),
    ],
)
def test_bad_input_names_the_parameter(kwargs, match):
    with pytest.raises(InvalidInputError, match=match):
        fit_cost_model(**kwargs, bootstrap=0)


def test_pieces_must_be_two_or_three():
    G, N, _ = grid()
    with pytest.raises(InvalidOptionError, match="'pieces'"):
        fit_cost_model(G, N, logged(H20, G, N), pieces=4)


def test_a_timing_spike_barely_moves_the_fit():
    """Interference spikes (one time 10x too long) are the common timing outlier: the
    log-scale loss charges log(10)^2 for one, so the rest of the grid still decides."""
    G, N, _ = grid()
    t = logged(H20, G, N, noise=0.02, seed=5)
    clean = fit_cost_model(G, N, t, bootstrap=0, rng=0)
    spiked = t.copy()
    spiked[[3, 40]] *= 10
    fit = fit_cost_model(G, N, spiked, bootstrap=0, rng=0)
    for k in ("b", "beta"):
        assert fit.params[k] == pytest.approx(clean.params[k], rel=0.05), k
