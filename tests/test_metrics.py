"""Balance metrics: each engine's exact reduction, and the wrong-dimension bug class pinned."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from straggler.formulations import InvalidInputError
from straggler.formulations.metrics import (
    gpu_loads,
    ideal_throughput_gain,
    imbalance_ratio,
    layer_balance,
    mean_over_max,
    sglang_balancedness,
    trtllm_imbalance_ratio,
    vllm_balancedness,
)


def steady_skew(n_steps, n_layers, n_ranks, hot=2.0):
    """Rank 0 carries ``hot`` times the others, in every layer of every step."""
    load = np.ones((n_steps, n_layers, n_ranks))
    load[..., 0] = hot
    return load


def buggy_vllm_balancedness(load):
    """vLLM #36304 / #51784: mean and max over the layer axis instead of the rank axis."""
    per_rank_layer = np.swapaxes(load, -1, -2)  # [step, rank, layer] reduced on the wrong axis
    return per_rank_layer.mean(axis=-1).sum(axis=-1) / per_rank_layer.max(axis=-1).sum(axis=-1)


@pytest.mark.parametrize("shape", [(3, 4, 8), (2, 8, 8), (5, 61, 32), (1, 1, 2)])
def test_steady_2x_skew_never_reads_balanced(shape):
    load = steady_skew(*shape)
    g = shape[-1]
    want = (g + 1) / (2 * g)  # mean (g + 1)/g over max 2
    np.testing.assert_allclose(mean_over_max(load), want)
    np.testing.assert_allclose(vllm_balancedness(load), want)
    np.testing.assert_allclose(sglang_balancedness(load), want, rtol=1e-5)
    np.testing.assert_allclose(imbalance_ratio(load), 1 / want - 1)
    np.testing.assert_allclose(trtllm_imbalance_ratio(load), 1 / want - 1)
    np.testing.assert_allclose(ideal_throughput_gain(load), 1 / want)
    b = layer_balance(load)
    assert b["vllm_balancedness"] == pytest.approx(want)
    assert b["trtllm_imbalance"] == pytest.approx(1 / want - 1)
    # the bug this guards against reads a steady skew as perfectly balanced
    np.testing.assert_allclose(buggy_vllm_balancedness(load), 1.0)


def test_rank_axis_is_the_last_even_when_square():
    # 8 layers x 8 ranks: a transposed reduction would not fail on shape, only on value
    rng = np.random.default_rng(0)
    load = rng.integers(0, 50, size=(4, 8, 8)).astype(float)
    per_layer_mean = load.mean(axis=2)
    per_layer_max = load.max(axis=2)
    np.testing.assert_allclose(
        vllm_balancedness(load), per_layer_mean.sum(axis=1) / per_layer_max.sum(axis=1)
    )
    assert not np.allclose(vllm_balancedness(load), buggy_vllm_balancedness(load))


def test_sglang_reduction_order_and_eps():
    # per layer (avg + 1e-5) / (max + 1e-5), then the mean over layers (not a ratio of sums)
    load = np.array([[[4.0, 0.0], [1.0, 1.0], [0.0, 0.0]]])
    rate = np.array([(2 + 1e-5) / (4 + 1e-5), 1.0, 1.0])
    np.testing.assert_allclose(sglang_balancedness(load), [rate.mean()])
    # vLLM's ratio of sums differs on the same loads
    assert vllm_balancedness(load)[0] == pytest.approx(3 / 5)


def test_trtllm_averages_the_ratio_over_iterations_not_the_loads():
    load = np.array([[[3.0, 1.0]], [[1.0, 1.0]]])  # iteration 0 skewed, iteration 1 even
    assert trtllm_imbalance_ratio(load).tolist() == [0.25]  # mean(0.5, 0), not 4/3.5 - 1
    empty = np.zeros((2, 1, 2))
    assert np.isnan(trtllm_imbalance_ratio(empty)[0])
    assert layer_balance(empty)["trtllm_imbalance"] == 0.0


def test_gpu_loads_follow_the_slot_layout():
    counts = np.arange(12).reshape(2, 6)  # 2 layers, 6 slots, 3 GPUs of 2 slots
    np.testing.assert_array_equal(gpu_loads(counts, 3), [[1, 5, 9], [13, 17, 21]])
    with pytest.raises(InvalidInputError, match="divisible by n_gpus=4"):
        gpu_loads(counts, 4)


@pytest.mark.parametrize(
    "func",
    [
        mean_over_max,
        imbalance_ratio,
        ideal_throughput_gain,
        vllm_balancedness,
        sglang_balancedness,
        trtllm_imbalance_ratio,
    ],
)
@pytest.mark.parametrize("bad", [[[-1.0, 1.0]], [[np.nan, 1.0]], "x", 3.0])
def test_bad_loads_are_refused_by_name(func, bad):
    with pytest.raises(InvalidInputError, match="'load' parameter"):
        func(bad)


@given(arrays(np.float64, (3, 5), elements=st.floats(0, 1e6, allow_subnormal=False)))
def test_ratio_identities(load):
    mom, imb, gain = mean_over_max(load), imbalance_ratio(load), ideal_throughput_gain(load)
    live = load.max(axis=-1) > 0
    assert np.all((mom > 0) & (mom <= 1 + 1e-12))
    np.testing.assert_allclose(gain[live] * mom[live], 1.0, rtol=1e-9)
    np.testing.assert_allclose(imb[live], gain[live] - 1, rtol=1e-9, atol=1e-12)
    # permuting GPUs and scaling the load change nothing
    np.testing.assert_allclose(mean_over_max(load[:, ::-1] * 3.0), mom)
