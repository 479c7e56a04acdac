"""The synthetic decode workload: skew calibrated to ANCHORS.md, top-k routing, Dirichlet
fluctuation, EPLB placement, ready-to-solve problems."""

import numpy as np
import pytest
from straggler.formulations import InvalidInputError
from straggler.sim.workloads.batches import (
    SHAPES,
    SKEWS,
    eplb_placement,
    make_decode_problem,
    num_physical_slots,
    sample_counts,
    zipf_popularity,
)


@pytest.mark.parametrize(
    "name, n_experts, top_k, measured, real",
    [
        ("qwen3_prover", 128, 8, 11.2, 11.0),  # Qwen3 prover prompts: ~11x in the median layer
        ("qwen2_chat_median", 64, 8, 1.5, 1.5),  # Qwen2-57B chat: ~1.5x in the median layer
        ("qwen2_chat_worst", 64, 8, 4.0, 4.0),  # ... up to ~4x
        ("mixtral_mmlu", 8, 2, 1.29, 1.29),  # Mixtral-8x7B on MMLU: median 1.29x
    ],
)
def test_skew_reproduces_anchor_figures(name, n_experts, top_k, measured, real):
    """Long-run hottest/mean load of the documented Zipf exponents (200k tokens)."""
    pop = zipf_popularity(n_experts, SKEWS[name], rng=0)
    c = sample_counts(pop, n_tokens=200_000, top_k=top_k, kappa=None, rng=1)[0]
    ratio = c.max() / c.mean()
    assert ratio == pytest.approx(measured, rel=0.02)
    assert ratio == pytest.approx(real, rel=0.05)


def test_popularity_is_zipf_with_a_permutation_per_layer():
    p = zipf_popularity(16, 1.5, n_layers=3, rng=4)
    expect = np.arange(1, 17) ** -1.5
    for row in p:
        assert np.allclose(np.sort(row)[::-1], expect / expect.sum())
    assert len({int(row.argmax()) for row in zipf_popularity(64, 1.0, n_layers=8, rng=0)}) > 1
    assert np.allclose(zipf_popularity(5, 0.0, rng=0), 0.2)
    p = zipf_popularity(8, [0.0, 2.0], n_layers=2, rng=0)
    assert np.allclose(p[0], 1 / 8) and p[1].max() > 0.5


def test_top_k_routing_distinct_and_conserving():
    pop = zipf_popularity(32, 1.2, n_layers=2, rng=0)
    c = sample_counts(pop, n_tokens=100, top_k=8, rng=1)
    assert c.dtype == np.int64 and (c.sum(axis=1) == 800).all()
    assert (c <= 100).all()  # a token picks an expert at most once
    # a token taking every expert: each exactly once
    assert sample_counts(np.full(6, 1 / 6), n_tokens=1, top_k=6, rng=0).tolist() == [1] * 6
    # the hottest expert saturates at one pick per token
    assert sample_counts(zipf_popularity(16, 3.0, rng=0), n_tokens=50, top_k=4, rng=0).max() == 50


def test_seeded_and_deterministic():
    a = make_decode_problem("qwen3_30b", n_gpus=4, tokens_per_gpu=16, n_layers=2, seed=5)
    b = make_decode_problem("qwen3_30b", n_gpus=4, tokens_per_gpu=16, n_layers=2, seed=5)
    c = make_decode_problem("qwen3_30b", n_gpus=4, tokens_per_gpu=16, n_layers=2, seed=6)
    assert (a.counts == b.counts).all() and (a.replicas == b.replicas).all()
    assert (a.counts != c.counts).any()


def test_dirichlet_fluctuation_shrinks_with_kappa():
    pop = zipf_popularity(16, 1.0, rng=0)
    hot = int(pop.argmax())

    def spread(kappa):
        rng = np.random.default_rng(0)
        shares = [
            sample_counts(pop, n_tokens=2000, top_k=2, kappa=kappa, rng=rng)[0, hot] / 4000
            for _ in range(60)
        ]
        return np.std(shares), np.mean(shares)

    sd_low, mean_low = spread(20.0)
    sd_high, mean_high = spread(2000.0)
    sd_none, _ = spread(None)
    assert sd_low > 2 * sd_high and sd_high >= 0.8 * sd_none
    # around the same long-run popularity
    assert mean_low == pytest.approx(mean_high, rel=0.15)


def test_eplb_placement_from_long_run_loads():
    loads = np.array([[50.0, 1, 1, 2, 3, 1, 10, 4]])
    p2l = eplb_placement(loads, n_gpus=2, replication=1.5)
    assert p2l.shape == (1, 12)
    counts = np.bincount(p2l[0], minlength=8)
    assert (counts >= 1).all() and counts.argmax() == 0 and counts.sum() == 12
    assert num_physical_slots(256, 8, 1.25) == 320
    assert num_physical_slots(128, 8, 1.5) == 192
    assert num_physical_slots(100, 16, 1.25) == 128
    with pytest.raises(InvalidInputError, match="'replication'"):
        num_physical_slots(8, 2, 0.9)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_make_decode_problem_presets(shape):
    s = SHAPES[shape]
    p = make_decode_problem(shape, n_gpus=8, tokens_per_gpu=16, n_layers=2, n_history=2, seed=0)
    assert p.counts.shape == (2, s.n_experts)
    assert p.replicas.shape == (2, s.n_experts, 8)
    assert (p.counts.sum(axis=1) == 16 * 8 * s.top_k).all()
    assert p.replicas.any(axis=-1).all()  # every expert has a replica
    # 1.25x replication: more replica entries than experts, fewer than slots allow
    per_layer = p.replicas.sum(axis=(1, 2))
    assert (per_layer > s.n_experts).all()
    assert (per_layer <= num_physical_slots(s.n_experts, 8, 1.25)).all()


def test_make_decode_problem_nodes_and_distinct():
    p = make_decode_problem(n_gpus=8, tokens_per_gpu=8, n_layers=1, num_nodes=2, seed=0)
    assert p.gpu_node.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # the distinct placement fills all 320 slots with distinct (expert, GPU) pairs
    p = make_decode_problem(n_gpus=8, tokens_per_gpu=8, n_layers=1, distinct=True, seed=0)
    assert p.replicas.sum() == 320


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"shape": "gpt5"}, "shape"),
        ({"n_gpus": 6, "num_nodes": 4}, "num_nodes"),
        ({"skew": -1.0}, "skew"),
        ({"skew": [1.0, 2.0, 3.0]}, "skew"),
        ({"tokens_per_gpu": 0}, "tokens_per_gpu"),
        ({"kappa": -5.0}, "kappa"),
        ({"replication": 0.5}, "replication"),
        ({"seed": "x"}, "seed"),
    ],
)
def test_bad_input(kwargs, param):
    with pytest.raises(InvalidInputError, match=f"'{param}'"):
        make_decode_problem(**{"n_layers": 2, "tokens_per_gpu": 4, "n_history": 1, **kwargs})


def test_sample_counts_near_zero_experts_raise_no_overflow():
    """Real loads have experts a Dirichlet draw underflows to 0 for: they stay in the support
    (a top-k that needs them still gets them) and no race key overflows (no warning)."""
    import warnings

    pop = np.array([[1e6, 1e6, 1e6, 1, 1, 1, 1, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = sample_counts(pop, n_tokens=4096, top_k=2, rng=0)[0]
        assert c[:3].sum() == 2 * 4096 and c[3:].sum() == 0
        c = sample_counts(pop, n_tokens=4096, top_k=4, rng=0)[0]  # each token needs one more
        assert (c[:3] == 4096).all() and c[3:].sum() == 4096


def test_mixtral_skew_is_the_recordings_median():
    """SKEWS["mixtral_mmlu"]'s target: the median busiest/mean load of the recorded Mixtral
    popularity (every file, every layer)."""
    import json
    import pathlib

    folder = (pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
              / "expert_loads" / "fiddler_mixtral8x7b_popularity")  # fmt: skip
    files = sorted(folder.glob("*.json"))
    if not files:
        pytest.skip(f"no recordings in {folder}")
    ratios = []
    for f in files:
        a = np.asarray(json.loads(f.read_text())["expert_popularity"], dtype=float)
        ratios.extend(a.max(axis=1) / a.mean(axis=1))
    assert len(files) == 14 and np.median(ratios) == pytest.approx(1.29, abs=0.005)
