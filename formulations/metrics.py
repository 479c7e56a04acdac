"""Balance metrics of expert-parallel loads, one definition each, as the engines compute them.

Every function takes per-GPU (per-rank) loads with the **GPU axis last**: shape
``(n_gpus,)``, ``(n_layers, n_gpus)`` or ``(n_steps, n_layers, n_gpus)`` (steps are forward
passes, iterations or recorded batches). The axis a metric reduces is named in its
docstring and never guessed: the bug class these functions are tested against is the one
vLLM shipped twice (vLLM #36304 and #51784), a balancedness reduced over the **layer**
axis instead of the rank axis, which reads 1.0 for a rank that carries twice the mean in
every layer of every step. ``tests/test_metrics.py`` pins it for every metric.

Loads are whatever the caller balances: routed tokens per GPU (what the engines log) or
modeled time per GPU (what :func:`~straggler.formulations.evaluate` returns, what TEMPO
balances). ``gpu_loads`` sums physical-slot counts into GPU loads the way SGLang's
``compute_gpu_physical_count`` does.

The plain ratios of one layer:

* :func:`mean_over_max` ``= mean_g / max_g`` (1 = balanced; TensorRT-LLM calls the
  per-step token version its *balance ratio*);
* :func:`imbalance_ratio` ``= (max_g - mean_g) / mean_g`` (0 = balanced; TensorRT-LLM's
  *imbalance ratio*, "the excessive workload received by the hottest rank").

And each engine's aggregate, with its exact reduction order: :func:`trtllm_imbalance_ratio`,
:func:`ideal_throughput_gain`, :func:`vllm_balancedness`, :func:`sglang_balancedness`.

Examples
--------
A steady 2x skew (rank 0 carries twice the others in every layer) is not balanced by any
of them:

>>> load = np.ones((3, 4, 8)); load[..., 0] = 2.0      # 3 steps, 4 layers, 8 ranks
>>> float(vllm_balancedness(load)[0]), round(float(sglang_balancedness(load)[0]), 4)
(0.5625, 0.5625)
>>> round(float(trtllm_imbalance_ratio(load)[0]), 4)
0.7778
"""

from __future__ import annotations

import numpy as np

from .errors import param_error
from .validation import check_array, check_int

__all__ = [
    "SGLANG_EPS",
    "gpu_loads",
    "mean_over_max",
    "imbalance_ratio",
    "ideal_throughput_gain",
    "trtllm_imbalance_ratio",
    "vllm_balancedness",
    "sglang_balancedness",
    "layer_balance",
]

#: The additive constant of SGLang's ``compute_utilization_rate`` (``(avg + 1e-5) /
#: (max + 1e-5)``), which makes an idle layer read 1.0.
SGLANG_EPS = 1e-5


def _loads_iv(load, func: str, min_ndim: int = 1, max_ndim: int = 8) -> np.ndarray:
    """``load`` as a float64 array of non-negative finite numbers, GPU axis last."""
    return check_array(
        load,
        "load",
        func,
        kind="real",
        ndim=tuple(range(min_ndim, max_ndim + 1)),
        lo=0,
        expected=(
            f"a {min_ndim}-D or higher array of non-negative finite per-GPU loads with the "
            "GPU axis last (shape (..., n_gpus))"
        ),
    )


def gpu_loads(physical_counts, n_gpus: int) -> np.ndarray:
    """Per-GPU loads from per-slot counts: slot ``p`` is on GPU ``p // (P / n_gpus)``.

    SGLang's ``compute_gpu_physical_count`` (``einops.reduce(..., "... (num_gpu
    num_expert_per_gpu) -> ... num_gpu", "sum")``), also the slot layout of vLLM's
    ``physical_to_logical_map`` and TensorRT-LLM's ``initial_global_assignments``.

    Parameters
    ----------
    physical_counts : array_like, shape (..., P)
    n_gpus : int, dividing ``P``

    Returns
    -------
    ndarray of float64, shape (..., n_gpus)

    Examples
    --------
    >>> gpu_loads([[3, 1, 0, 2]], 2).tolist()
    [[4.0, 2.0]]
    """
    func = "gpu_loads"
    x = _loads_iv(physical_counts, func)
    n_gpus = check_int(n_gpus, "n_gpus", func, lo=1)
    P = x.shape[-1]
    if P % n_gpus:
        raise param_error(
            "physical_counts",
            func,
            f"a last axis (slots) divisible by n_gpus={n_gpus}",
            f"shape {x.shape}",
        )
    return x.reshape(*x.shape[:-1], n_gpus, P // n_gpus).sum(axis=-1)


def mean_over_max(load) -> np.ndarray:
    """``mean_g load / max_g load`` over the last (GPU) axis: 1 when balanced.

    TensorRT-LLM's attention-DP *balance ratio* is this ratio of tokens per rank in one
    step (TensorRT-LLM's attention-DP balance report: 54% -> 88% gave 1.33x throughput on
    DeepSeek-V3 DP8). A row of zeros (nothing to balance) reads 1.

    Returns
    -------
    ndarray of float64, shape ``load.shape[:-1]``

    Examples
    --------
    >>> mean_over_max([[2, 1, 1, 0], [0, 0, 0, 0]]).tolist()
    [0.5, 1.0]
    """
    x = _loads_iv(load, "mean_over_max")
    mx = x.max(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mx > 0, x.mean(axis=-1) / np.where(mx > 0, mx, 1.0), 1.0)


def imbalance_ratio(load) -> np.ndarray:
    """``(max_g - mean_g) / mean_g`` over the last (GPU) axis: 0 when balanced.

    The per-step, per-layer quantity of TensorRT-LLM's ``report_load_statistics.py``
    (``max / mean - 1``), "the excessive workload received by the hottest rank"; the
    wide-EP report quotes 1.564 -> 0.109 for DeepSeek-R1 at EP32 with 288 slots. A row of
    zeros reads 0.

    Examples
    --------
    >>> imbalance_ratio([[2, 1, 1, 0], [0, 0, 0, 0]]).tolist()
    [1.0, 0.0]
    """
    x = _loads_iv(load, "imbalance_ratio")
    mean = x.mean(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mean > 0, x.max(axis=-1) / np.where(mean > 0, mean, 1.0) - 1.0, 0.0)


def ideal_throughput_gain(load) -> np.ndarray:
    """Throughput multiple perfect balance would give a lock-step step: ``max_g / mean_g``.

    In lock-step execution a step lasts as long as its most loaded rank, so with time
    proportional to load, spreading the same total evenly divides the step time by
    ``max / mean``: the ideal throughput figure that goes with TensorRT-LLM's balance
    ratio ``r = mean / max`` is ``1 / r``, and moving from ``r1`` to ``r2`` ideally gains
    ``r2 / r1`` (TensorRT-LLM's 54% -> 88% would ideally give 1.63x; it measured 1.33x,
    because a step is not all MoE). This is our reading, stated as a derivation: the
    engines print only the ratio. A row of zeros reads 1.

    Examples
    --------
    >>> ideal_throughput_gain([2, 1, 1, 0]).tolist()
    2.0
    """
    x = _loads_iv(load, "ideal_throughput_gain")
    mean = x.mean(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mean > 0, x.max(axis=-1) / np.where(mean > 0, mean, 1.0), 1.0)


def trtllm_imbalance_ratio(load) -> np.ndarray:
    """TensorRT-LLM's per-layer imbalance ratio: ``max/mean - 1`` over ranks, averaged over
    iterations.

    Exactly ``report_load_statistics.py``'s ``calculate_load_statistics``: for each layer,
    ``(load.max(dim=-1) / load.mean(dim=-1) - 1).mean()`` over the iterations of
    ``load[iter, rank]`` (the rank axis reduced first, then the iteration axis averaged);
    its "average" row is the mean of this over layers. *Deviation:* an iteration with no
    load in a layer is 0/0 (NaN) upstream; here it is left out of that layer's average
    (NaN if every iteration is empty).

    Parameters
    ----------
    load : array_like, shape (n_iters, n_layers, n_ranks) or (n_iters, n_ranks)

    Returns
    -------
    ndarray, shape (n_layers,) (or a 0-D array for 2-D input)

    Examples
    --------
    >>> trtllm_imbalance_ratio([[[2, 1, 1, 0]], [[1, 1, 1, 1]]]).tolist()
    [0.5]
    """
    x = _loads_iv(load, "trtllm_imbalance_ratio", min_ndim=2, max_ndim=3)
    mean = x.mean(axis=-1)
    live = mean > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(live, x.max(axis=-1) / np.where(live, mean, 1.0) - 1.0, 0.0)
        return np.where(live.any(axis=0), r.sum(axis=0) / live.sum(axis=0), np.nan)


def vllm_balancedness(load) -> np.ndarray:
    """vLLM's EPLB balancedness of each step: ``sum_l mean_r / sum_l max_r``.

    ``EplbState.step(log_stats=True)`` (after the fixes of #36305 and #51813): from
    ``num_tokens_per_rank [n_ranks, n_layers]`` it takes, **per layer**, the mean and the
    max **over ranks**, sums each over layers, and logs ``avg_tokens / max_tokens``
    (``0.0`` when ``max_tokens == 0``). The per-rank token count it feeds is the rank's
    logical expert load summed over experts (what the rank's ``expert_load_pass`` saw:
    its own routed tokens in current versions, its local experts' tokens in the first).
    Reduced over layers instead (#36304, and again #51784), a rank at twice the mean in
    every layer reads 1.0; this function cannot do that: the rank axis is the last one.

    Parameters
    ----------
    load : array_like, shape (n_steps, n_layers, n_ranks) or (n_layers, n_ranks)

    Returns
    -------
    ndarray of float64, shape (n_steps,) (or a 0-D array for 2-D input)

    Examples
    --------
    >>> round(float(vllm_balancedness([[2, 1], [1, 1]])), 4)      # (1.5 + 1) / (2 + 1)
    0.8333
    """
    x = _loads_iv(load, "vllm_balancedness", min_ndim=2, max_ndim=3)
    avg = x.mean(axis=-1).sum(axis=-1)
    mx = x.max(axis=-1).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(mx > 0, avg / np.where(mx > 0, mx, 1.0), 0.0)


def sglang_balancedness(load) -> np.ndarray:
    """SGLang's expert balancedness of each forward pass: the layer mean of
    ``(mean_g + 1e-5) / (max_g + 1e-5)``.

    ``srt/eplb/expert_distribution.py``: ``compute_utilization_rate`` takes
    ``gpu_physical_count [..., n_layers, n_gpus]`` (tokens received by each GPU's slots,
    ``gpu_loads``), returns ``(avg + 1e-5) / (max + 1e-5)`` per layer, and the
    recorder logs ``torch.mean`` of it over layers as ``current_pass_balancedness`` (and
    means of that over the last 10/100/1000 passes). The eps makes an idle layer read 1.

    Parameters
    ----------
    load : array_like, shape (n_passes, n_layers, n_gpus) or (n_layers, n_gpus)

    Returns
    -------
    ndarray of float64, shape (n_passes,) (or a 0-D array for 2-D input)

    Examples
    --------
    >>> round(float(sglang_balancedness([[2, 1], [0, 0]])), 4)    # mean(0.75, 1)
    0.875
    """
    x = _loads_iv(load, "sglang_balancedness", min_ndim=2, max_ndim=3)
    rate = (x.mean(axis=-1) + SGLANG_EPS) / (x.max(axis=-1) + SGLANG_EPS)
    return rate.mean(axis=-1)


def layer_balance(load) -> dict:
    """Every metric of this module for loads ``(n_steps, n_layers, n_gpus)``, in one dict.

    Per layer (averaged over steps): ``mean`` and ``max`` load, ``mean_over_max``,
    ``imbalance`` (``(max - mean)/mean``), ``ideal_gain``; aggregates: ``trtllm_imbalance``
    (mean over layers of :func:`trtllm_imbalance_ratio`, its "average" row),
    ``vllm_balancedness`` and ``sglang_balancedness`` (means over steps).

    Examples
    --------
    >>> b = layer_balance(np.array([[[2.0, 1, 1, 0]]]))
    >>> b["mean_over_max"].tolist(), float(b["vllm_balancedness"])
    ([0.5], 0.5)
    """
    x = _loads_iv(load, "layer_balance", min_ndim=3, max_ndim=3)
    with np.errstate(invalid="ignore"):
        trt = trtllm_imbalance_ratio(x)
    return {
        "mean": x.mean(axis=-1).mean(axis=0),
        "max": x.max(axis=-1).mean(axis=0),
        "mean_over_max": mean_over_max(x).mean(axis=0),
        "imbalance": imbalance_ratio(x).mean(axis=0),
        "ideal_gain": ideal_throughput_gain(x).mean(axis=0),
        "trtllm_imbalance": float(np.nanmean(trt)) if np.isfinite(trt).any() else 0.0,
        "vllm_balancedness": float(vllm_balancedness(x).mean()),
        "sglang_balancedness": float(sglang_balancedness(x).mean()),
    }
