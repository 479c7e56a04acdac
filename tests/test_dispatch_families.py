"""The real-load and wide-EP dispatch families (benchmarks/expert_loads.py) and the two scripts
that measure them: benchmarks/tempo_quality.py (bound gap, tempo against the token LP, speed
ratio per family) and benchmarks/wide_ep.py (per method across EP widths)."""

import json
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
LOADS = ROOT / ".." / "shared" / "data" / "expert_loads"

pytestmark = pytest.mark.skipif(not LOADS.exists(), reason="../shared/data/expert_loads is absent")


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import expert_loads
        import tempo_quality
        import wide_ep
    finally:
        sys.path.remove(str(BENCH))
    return expert_loads, tempo_quality, wide_ep


def test_prefill_batch_is_whole_recorded_sequences(bench):
    el, _, _ = bench
    counts, tokens = el.esft_sequences("law")
    batch = el.esft_prefill_batch("law", 3, 1000, np.random.default_rng(5))
    # the same draws, replayed: whole sequences until the budget is reached
    rng = np.random.default_rng(5)
    seq = rng.integers(len(tokens), size=1000 // int(tokens.min()) + 1)
    n = int(np.searchsorted(np.cumsum(tokens[seq]), 1000)) + 1
    assert np.array_equal(batch, counts[seq[:n], 3].sum(axis=0))
    assert tokens[seq[: n - 1]].sum() < 1000 <= tokens[seq[:n]].sum()


def test_decode_batch_routes_each_token_to_its_sequence_experts(bench):
    el, _, _ = bench
    counts, _ = el.esft_sequences("intent")
    batch = el.esft_decode_batch("intent", 7, 50, np.random.default_rng(2))
    assert batch.sum() == 50 * 6 and batch.shape == (64,)
    rng = np.random.default_rng(2)
    seq = rng.integers(len(counts), size=50)
    seen = counts[seq, 7].sum(axis=0) > 0
    assert not batch[~seen].any()  # no token goes to an expert its sequence never used


def test_eplb_placement_keeps_replicas_on_distinct_gpus(bench):
    el, _, _ = bench
    rng = np.random.default_rng(0)
    hist = rng.integers(0, 100, size=(el.WINDOW, 64)).astype(float)
    p2l = el.place(hist, 128, 32, 4, 1, "eplb")
    per_gpu = p2l.reshape(32, 4)
    assert all(len(set(row)) == 4 for row in per_gpu)
    assert set(p2l) == set(range(64))


def test_every_builds_the_same_layers(bench):
    _, tq, _ = bench
    all_ = list(tq.instances("real_heldout", False))
    some = list(tq.instances("real_heldout", False, every=3))
    assert [p["i"] for p, _, _ in some] == list(range(0, len(all_), 3))
    for p, prob, cname in some:
        q, prob_all, c_all = all_[p["i"]]
        assert q == p and c_all == cname
        assert np.array_equal(prob.counts, prob_all.counts)
        assert np.array_equal(prob.replicas, prob_all.replicas)


def test_quality_reports_bound_gap_token_lp_and_speed(bench, tmp_path, capsys):
    _, tq, _ = bench
    out = tmp_path / "q.json"
    tq.main(["--families", "real_heldout", "--limit", "2", "--repeat", "1",
             "--cache", str(tmp_path / "oracle.json"), "--out", str(out)])  # fmt: skip
    s = json.loads(out.read_text())["summary"]["real_heldout"]
    assert s["layers"] == 2 and s["proved"] == 2  # optima from the committed cache
    assert s["bound_gap_max"] <= 0.005 and s["bound_gap_over_0005"] == 0
    assert s["tempo_above_token_lp"] == 0
    assert s["tempo_optimal_reported"] == s["tempo_optimal"]
    assert s["speed_ratio_median"] > 0 and s["speed_ratio_b2b_median"] > 0
    assert not (tmp_path / "oracle.json").exists()  # nothing new to solve
    assert "bound gap max" in capsys.readouterr().out


def test_bound_and_speed_summary(bench):
    _, tq, _ = bench
    row = dict(opt=10.0, tempo_lb=9.9, tempo=10.0, tokenlp=10.5, tempo_status="HEURISTIC",
               speed_ratio=0.1, tempo_call_s=1e-4, tokenlp_call_s=1e-3)  # fmt: skip
    worse = dict(row, tempo=11.0, tempo_lb=11.0, opt=11.0, tempo_status="OPTIMAL",
                 speed_ratio=0.3)  # fmt: skip
    s = tq._bound_and_speed([row, worse], [row, worse])
    assert s["bound_gap_max"] == pytest.approx(0.01) and s["bound_gap_over_0005"] == 1
    assert s["tempo_optimal"] == 2 and s["tempo_optimal_reported"] == 1
    assert s["tempo_above_token_lp"] == 1
    assert s["tempo_above_token_lp_max"] == pytest.approx(0.5 / 10.5)
    assert s["speed_ratio_median"] == pytest.approx(0.2)
    assert s["speed_ratio_b2b_median"] is None  # (rows without the back-to-back timings)
    assert s["tempo_slower_than_token_lp"] == 0 and s["tempo_call_us_max"] == pytest.approx(100)


def test_wide_ep_writes_table_json_and_plot(bench, tmp_path, capsys):
    _, _, we = bench
    out = tmp_path / "res"
    args = ["--widths", "8", "--shapes", "dsv3", "--methods", "tempo,token_lp,round_robin",
            "--costs", "dsv3_a_offline", "--tokens", "16", "--repeat", "1",
            "--cache", str(tmp_path / "oracle.json"), "--out", str(out)]  # fmt: skip
    assert we.main(args) == 0
    data = json.loads((out / "wide_ep.json").read_text())
    assert set(data["run"]) >= {"command", "commit", "machine"}
    (cell,) = data["cells"]
    assert (cell["E"], cell["g"], cell["layers"]) == (256, 8, 1)
    assert cell["slots"] == 288 and cell["proved"] == 1
    m = cell["methods"]
    assert 1.0 - 1e-9 <= m["tempo"]["ratio_mean"] <= m["token_lp"]["ratio_mean"] + 1e-9
    assert m["round_robin"]["ratio_mean"] >= 1.0 - 1e-9
    assert cell["speed_ratio_median"] > 0
    assert 0.0 <= cell["bound_gap_max"] <= 1.0  # the certified bound never above the optimum
    pytest.importorskip("matplotlib")
    assert (out / "wide_ep.png").stat().st_size > 0


def test_wide_ep_refuses_an_unknown_width(bench, capsys):
    _, _, we = bench
    with pytest.raises(SystemExit) as exc:
        we.main(["--widths", "8,48"])
    assert exc.value.code == 2 and "--widths" in capsys.readouterr().err
