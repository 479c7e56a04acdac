"""Synthetic routed decode batches (TEMPO §3.2) and their EPLB placement.

A batch of ``B`` decode tokens per GPU on ``n_gpus`` GPUs is routed top-``k`` (``k``
distinct experts per token) with expert popularity that is Zipf(``s``) over the experts,
fluctuating from batch to batch as a Dirichlet with concentration ``kappa`` around the
long-run popularity; every layer has its own random permutation, so the hot experts
differ by layer. EPLB places replicas from the long-run average loads.

Skew against published aggregated routing of Qwen3 and Qwen2 MoE models (hottest expert's
load over the mean load, long-run, measured on 400k tokens by ``tests/test_workload.py``; a
Zipf exponent alone sets it, the top-``k`` distinctness caps it at ``E / k``):

======================  =====  =====  ================  =======================
routing                   E      k    real max/mean     Zipf ``s`` reproducing it
======================  =====  =====  ================  =======================
Qwen3-235B/30B prover     128    8    ~11 (median)      0.85 (11.2)
Qwen2-57B chat, median     64    8    ~1.5              0.14 (1.5)
Qwen2-57B chat, worst      64    8    ~4                0.55 (4.0)
Mixtral-8x7B, MMLU          8    2    1.29 (median)     0.22 (1.29)
======================  =====  =====  ================  =======================

The Mixtral figure is the median over layers and subjects of the busiest expert's load over
the mean in efeslab/fiddler's per-subject popularity recordings (seven MMLU subjects, base and
Instruct; ``../shared/data/expert_loads/fiddler_mixtral8x7b_popularity``), measured on
200k top-2 tokens.

A pure Zipf cannot also match the Qwen3 figure's ``k^-2`` decay of sorted loads: at
``s = 0.85`` the head decays as about ``k^-0.8`` after top-``k`` saturation (reaching a
``k^-2`` head needs ``s`` near 2.5, which saturates the hottest expert at ``E / k = 16``
times the mean). :data:`SKEWS` names these values; ``skew`` may also be given per layer.
For DSv3 (E = 256) no public figure exists; ``s = 0.85`` gives about 20x there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ...formulations.dispatch import DispatchProblem
from ...formulations.errors import InvalidInputError, param_error
from ...formulations.validation import (
    check_array,
    check_bool,
    check_choice,
    check_int,
    check_real,
    check_rng,
    describe,
)
from ...solvers.placement.eplb import rebalance_experts

__all__ = [
    "ModelShape",
    "SHAPES",
    "SKEWS",
    "DEFAULT_KAPPA",
    "MAX_GPUS",
    "MAX_EXPERTS",
    "MAX_LAYERS",
    "MAX_TOKENS",
    "zipf_popularity",
    "sample_counts",
    "decode_batches",
    "num_physical_slots",
    "eplb_placement",
    "make_decode_problem",
]

#: TEMPO §3.2's batch-to-batch Dirichlet concentration.
DEFAULT_KAPPA = 2000.0
#: Largest sizes the generators accept (far above any deployment: EP degrees reach a few
#: hundred, MoE models a few hundred layers and experts; they bound the work of one call).
MAX_GPUS = 65_536
MAX_EXPERTS = 65_536
MAX_LAYERS = 4096
MAX_TOKENS = 2**26


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The MoE shape a workload is generated for."""

    name: str
    n_experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Experts per token (distinct)."""
    n_groups: int
    """Expert groups EPLB's hierarchical policy packs onto nodes (1: none)."""
    n_moe_layers: int
    """MoE layers of the full model (a workload may generate fewer)."""


#: Model shapes: DeepSeek-V3 (256 experts, top-8, 8 groups, 58 MoE layers), Qwen3-235B-A22B
#: (128, top-8, 94 layers), Qwen3-30B-A3B (128, top-8, 48), Qwen2-57B-A14B (64, top-8, 28).
SHAPES: dict[str, ModelShape] = {
    "dsv3": ModelShape(name="dsv3", n_experts=256, top_k=8, n_groups=8, n_moe_layers=58),
    "qwen3_235b": ModelShape(
        name="qwen3_235b", n_experts=128, top_k=8, n_groups=1, n_moe_layers=94
    ),
    "qwen3_30b": ModelShape(name="qwen3_30b", n_experts=128, top_k=8, n_groups=1, n_moe_layers=48),
    "qwen2_57b": ModelShape(name="qwen2_57b", n_experts=64, top_k=8, n_groups=1, n_moe_layers=28),
}

#: Zipf exponents reproducing the published measured skew (see the module docstring).
SKEWS: dict[str, float] = {
    "qwen3_prover": 0.85,
    "qwen2_chat_median": 0.14,
    "qwen2_chat_worst": 0.55,
    "mixtral_mmlu": 0.22,
}


def _skews(skew, n_layers: int, func: str) -> np.ndarray:
    """One non-negative finite Zipf exponent per layer (a scalar is shared)."""
    form = f"a finite number >= 0 or a sequence of {n_layers} (one per layer)"
    arr = check_array(skew, "skew", func, ndim=(0, 1), lo=0, expected=form)
    if arr.size not in (1, n_layers):
        raise param_error("skew", func, form, f"{arr.size} values")
    return np.broadcast_to(arr.reshape(-1), (n_layers,))


def zipf_popularity(n_experts: int, skew, *, n_layers: int = 1, rng=None) -> np.ndarray:
    """Long-run expert popularity: Zipf(``skew``) over ranks, a random permutation per layer.

    ``p[l, perm_l[r]] = (r + 1)^-s_l / sum_j (j + 1)^-s_l`` for rank ``r`` (0 = hottest).

    Parameters
    ----------
    n_experts : int
    skew : float or sequence of float
        Zipf exponent ``s >= 0`` (0: uniform), one for all layers or one per layer.
    n_layers : int, default 1
    rng : None, int or numpy.random.Generator
        Draws the per-layer permutations.

    Returns
    -------
    ndarray of float64, shape (n_layers, n_experts)
        Rows sum to 1.

    Examples
    --------
    >>> p = zipf_popularity(4, 1.0, n_layers=2, rng=0)
    >>> np.sort(p[0])[::-1].round(3).tolist(), p.sum(axis=1).round(12).tolist()
    ([0.48, 0.24, 0.16, 0.12], [1.0, 1.0])
    """
    func = "zipf_popularity"
    n_experts = check_int(n_experts, "n_experts", func, lo=1, hi=MAX_EXPERTS)
    n_layers = check_int(n_layers, "n_layers", func, lo=1, hi=MAX_LAYERS)
    s = _skews(skew, n_layers, func)
    gen = check_rng(rng, func)
    ranks = np.arange(1, n_experts + 1, dtype=float)
    out = np.empty((n_layers, n_experts))
    for l in range(n_layers):
        w = ranks ** -s[l]
        out[l, gen.permutation(n_experts)] = w / w.sum()
    return out


def _sample_counts_iv(popularity, n_tokens, top_k, kappa, func: str = "sample_counts"):
    n_tokens = check_int(n_tokens, "n_tokens", func, lo=0, hi=MAX_TOKENS)
    top_k = check_int(top_k, "top_k", func, lo=1, hi=MAX_EXPERTS)
    form = (
        f"a finite non-negative (n_experts,) or (n_layers, n_experts) array with at least "
        f"top_k={top_k} positive entries per row"
    )
    p = check_array(popularity, "popularity", func, ndim=(1, 2), lo=0, expected=form)
    squeeze = p.ndim == 1
    p = np.atleast_2d(p)
    if p.shape[0] == 0 or ((p > 0).sum(axis=1) < top_k).any():
        raise param_error("popularity", func, form, describe(popularity))
    if kappa is not None:
        kappa = check_real(kappa, "kappa", func, lo=0, lo_open=True)
    return p, n_tokens, top_k, kappa, squeeze


#: Least batch popularity of an expert in the support (:func:`sample_counts`): ``1 / q`` times
#: any ``Exp(1)`` draw stays below the largest float, so no race key overflows.
_Q_FLOOR = 1e-300


def sample_counts(popularity, *, n_tokens: int, top_k: int, kappa=DEFAULT_KAPPA, rng=None):
    """Route one batch: tokens per expert of every layer.

    Per layer: the batch popularity is ``q ~ Dirichlet(kappa * p)`` (``kappa=None``: no
    fluctuation, ``q = p``); each of ``n_tokens`` tokens then picks ``top_k`` distinct
    experts by sequential sampling without replacement proportional to ``q`` (drawn as the
    ``top_k`` smallest of ``Exp(1) / q``, the exponential race, in chunks of 8192 tokens).

    Parameters
    ----------
    popularity : array_like, shape (n_layers, n_experts) or (n_experts,)
        Non-negative, rows with at least ``top_k`` positive entries (normalized here).
    n_tokens : int
        Tokens in the batch (``tokens_per_gpu * n_gpus``).
    top_k : int
    kappa : float or None, default 2000
    rng : None, int or numpy.random.Generator

    Returns
    -------
    ndarray of int64, same shape as ``popularity``
        Every row sums to ``n_tokens * top_k``; no entry exceeds ``n_tokens``.

    Examples
    --------
    >>> c = sample_counts(np.full((2, 8), 1 / 8), n_tokens=16, top_k=2, rng=0)
    >>> c.shape, c.sum(axis=1).tolist(), bool(c.max() <= 16)
    ((2, 8), [32, 32], True)
    """
    p, n_tokens, top_k, kappa, squeeze = _sample_counts_iv(popularity, n_tokens, top_k, kappa)
    gen = check_rng(rng, "sample_counts")
    p = p / p.max(axis=1, keepdims=True)  # first by the max: a sum of huge values overflows
    p = p / p.sum(axis=1, keepdims=True)
    n_layers, n_experts = p.shape
    counts = np.zeros((n_layers, n_experts), dtype=np.int64)
    for l in range(n_layers):
        q = p[l]
        if kappa is not None:
            live = q > 0
            q = np.zeros(n_experts)
            q[live] = gen.dirichlet(kappa * p[l, live])
            # a Dirichlet draw can underflow to 0 for tiny concentrations; keep the support,
            # at a floor whose race keys Exp(1) / q stay finite (an Exp(1) draw is < 750)
            q[live] = np.maximum(q[live], _Q_FLOOR)
        inv = np.where(q > 0, 1.0 / np.where(q > 0, q, 1.0), np.inf)
        for start in range(0, n_tokens, 8192):
            n = min(8192, n_tokens - start)
            keys = gen.standard_exponential((n, n_experts)) * inv
            chosen = np.argpartition(keys, top_k - 1, axis=1)[:, :top_k]
            counts[l] += np.bincount(chosen.ravel(), minlength=n_experts)
    return counts[0] if squeeze else counts


def decode_batches(
    popularity, *, n_tokens: int, top_k: int, kappa=DEFAULT_KAPPA, rng=None
) -> Iterator[np.ndarray]:
    """An endless stream of routed batches (see :func:`sample_counts`), one per step.

    Examples
    --------
    >>> from itertools import islice
    >>> stream = decode_batches(np.full((1, 4), 0.25), n_tokens=3, top_k=2, rng=1)
    >>> [int(c.sum()) for c in islice(stream, 3)]
    [6, 6, 6]
    """
    gen = check_rng(rng, "decode_batches")
    # validate once here (the first batch would, but only when the caller draws it)
    sample_counts(
        popularity, n_tokens=n_tokens, top_k=top_k, kappa=kappa, rng=np.random.default_rng(0)
    )
    while True:
        yield sample_counts(popularity, n_tokens=n_tokens, top_k=top_k, kappa=kappa, rng=gen)


def num_physical_slots(n_experts: int, n_gpus: int, replication: float) -> int:
    """Physical slots for a replication ratio: ``ceil(replication * E)`` rounded up to a
    multiple of ``n_gpus`` (EPLB needs ``P % n_gpus == 0``).

    Examples
    --------
    >>> num_physical_slots(256, 8, 1.25), num_physical_slots(128, 8, 1.5)
    (320, 192)
    >>> num_physical_slots(7, 2, 1.0)
    8
    """
    func = "num_physical_slots"
    n_experts = check_int(n_experts, "n_experts", func, lo=1, hi=MAX_EXPERTS)
    n_gpus = check_int(n_gpus, "n_gpus", func, lo=1, hi=MAX_GPUS)
    replication = check_real(replication, "replication", func, lo=1)
    need = math.ceil(round(replication * n_experts, 9))
    return n_gpus * -(-need // n_gpus)


def eplb_placement(
    loads,
    *,
    n_gpus: int,
    replication: float = 1.25,
    num_groups: int = 1,
    num_nodes: int = 1,
    distinct: bool = False,
) -> np.ndarray:
    """EPLB's ``physical_to_logical [L, P]`` for long-run average ``loads [L, E]``.

    ``P = num_physical_slots(E, n_gpus, replication)``; see
    :func:`~straggler.solvers.placement.eplb.rebalance_experts` for the algorithm and ``distinct``.

    Examples
    --------
    Upstream puts two replicas of the hot expert on GPU 0 (slots 0-2); ``distinct`` not:

    >>> eplb_placement([[9, 1, 1, 1]], n_gpus=2, replication=1.5).tolist()
    [[0, 0, 3, 0, 1, 2]]
    >>> eplb_placement([[9, 1, 1, 1]], n_gpus=2, replication=1.5, distinct=True).tolist()
    [[0, 2, 1, 0, 3, 1]]
    """
    func = "eplb_placement"
    w = check_array(
        loads, "loads", func, ndim=2, lo=0,
        expected="a 2-D (n_layers >= 1, n_experts >= 1) array of finite non-negative loads",
    )  # fmt: skip
    if 0 in w.shape:
        raise param_error(
            "loads", func, "a 2-D (n_layers >= 1, n_experts >= 1) array", f"shape {w.shape}"
        )
    n_gpus = check_int(n_gpus, "n_gpus", func, lo=1, hi=MAX_GPUS)
    num_groups = check_int(num_groups, "num_groups", func, lo=1, hi=MAX_EXPERTS)
    num_nodes = check_int(num_nodes, "num_nodes", func, lo=1, hi=MAX_GPUS)
    distinct = check_bool(distinct, "distinct", func)
    P = num_physical_slots(w.shape[1], n_gpus, replication)
    p2l, _, _ = rebalance_experts(w, P, num_groups, num_nodes, n_gpus, distinct=distinct)
    return p2l


def make_decode_problem(
    shape: str | ModelShape = "dsv3",
    *,
    n_gpus: int = 8,
    tokens_per_gpu: int = 128,
    skew=SKEWS["qwen3_prover"],
    kappa=DEFAULT_KAPPA,
    replication: float = 1.25,
    n_layers: int = 4,
    n_history: int = 16,
    num_nodes: int = 1,
    distinct: bool = False,
    seed=0,
) -> DispatchProblem:
    """A stack of routed decode layers on an EPLB placement, ready for ``solve_dispatch``.

    Draws the per-layer popularity (:func:`zipf_popularity`), ``n_history`` batches whose
    mean is the long-run load EPLB places from (:func:`eplb_placement`, with the shape's
    expert groups), then one more batch: the instance. All from one seeded generator.

    Parameters
    ----------
    shape : str or ModelShape, default "dsv3"
        A key of :data:`SHAPES` or a ``ModelShape``.
    n_gpus : int, default 8
        EP degree.
    tokens_per_gpu : int, default 128
        Decode batch ``B`` per GPU: the batch has ``B * n_gpus`` tokens.
    skew : float or sequence, default ``SKEWS["qwen3_prover"]`` (0.85)
    kappa : float or None, default 2000
    replication : float, default 1.25
    n_layers : int, default 4
    n_history : int, default 16
        Batches averaged into the long-run load (at least 1).
    num_nodes : int, default 1
        Nodes (GPU ``g`` on node ``g // (n_gpus / num_nodes)``; EPLB's hierarchical policy).
    distinct : bool, default False
        EPLB's placement without two replicas of one expert on one GPU.
    seed : None, int or numpy.random.Generator

    Returns
    -------
    DispatchProblem
        ``counts (n_layers, E)``, ``replicas (n_layers, E, n_gpus)``, ``gpu_node``.

    Examples
    --------
    >>> p = make_decode_problem("qwen3_235b", n_gpus=4, tokens_per_gpu=8, n_layers=2, seed=1)
    >>> p.counts.shape, p.replicas.shape, p.counts.sum(axis=1).tolist()
    ((2, 128), (2, 128, 4), [256, 256])
    """
    func = "make_decode_problem"
    if not isinstance(shape, ModelShape):
        shape = SHAPES[check_choice(shape, "shape", func, sorted(SHAPES))]
    n_gpus = check_int(n_gpus, "n_gpus", func, lo=1, hi=MAX_GPUS)
    tokens_per_gpu = check_int(tokens_per_gpu, "tokens_per_gpu", func, lo=1, hi=MAX_TOKENS)
    n_layers = check_int(n_layers, "n_layers", func, lo=1, hi=MAX_LAYERS)
    n_history = check_int(n_history, "n_history", func, lo=1, hi=MAX_LAYERS)
    num_nodes = check_int(num_nodes, "num_nodes", func, lo=1, hi=MAX_GPUS)
    if n_gpus * tokens_per_gpu > MAX_TOKENS:
        raise param_error(
            "tokens_per_gpu", func, f"at most {MAX_TOKENS} tokens in the batch (n_gpus * "
            f"tokens_per_gpu)", f"{tokens_per_gpu} per GPU on {n_gpus} GPUs",
        )  # fmt: skip
    distinct = check_bool(distinct, "distinct", func)
    if n_gpus % num_nodes:
        raise param_error("num_nodes", func, f"a divisor of n_gpus={n_gpus}", repr(num_nodes))
    gen = check_rng(seed, func, "seed")
    E, k = shape.n_experts, shape.top_k
    pop = zipf_popularity(E, skew, n_layers=n_layers, rng=gen)
    n_tokens = tokens_per_gpu * n_gpus
    history = np.zeros((n_layers, E))
    for _ in range(n_history):
        history += sample_counts(pop, n_tokens=n_tokens, top_k=k, kappa=kappa, rng=gen)
    history /= n_history
    groups = shape.n_groups if E % shape.n_groups == 0 else 1
    try:
        p2l = eplb_placement(
            history,
            n_gpus=n_gpus,
            replication=replication,
            num_groups=groups,
            num_nodes=num_nodes,
            distinct=distinct,
        )
    except InvalidInputError as exc:
        raise InvalidInputError(f"{func}: no EPLB placement for these parameters: {exc}") from exc
    counts = sample_counts(pop, n_tokens=n_tokens, top_k=k, kappa=kappa, rng=gen)
    node = np.arange(n_gpus) // (n_gpus // num_nodes)
    return DispatchProblem.from_placement(counts, p2l, n_gpus, gpu_node=node)
