"""The deployment step model: DP attention and EP MoE, two barriers per layer.

In DeepSeek-style serving (SGLang DP attention + EP MoE, TensorRT-LLM wide EP, vLLM DP+EP),
``G`` ranks are each an attention data-parallel replica and an expert-parallel GPU. Every
layer of a decode step runs attention on every rank and waits for the slowest (the rank with
the most KV: what routing decides), then the MoE layer, which waits for the slowest GPU
(what placement and dispatch decide; TEMPO §2.1). This module prices one such step:

``step_us = n_layers * max_g att_g + (L / k) * sum_{l in k simulated layers} moe_l
+ dense_us``

* **Attention** per rank and layer: ``att_g = a + b * KV_g + c * R_g`` (``KV_g`` resident KV
  tokens, ``R_g`` running requests), parameters per :class:`ModelPreset` (sources in
  :data:`MODEL_PRESETS`).
* **MoE** per layer: every running request's token (one per request per step, from its own
  rank: tokens keep their source) picks ``top_k`` distinct experts from the batch's expert
  popularity (``RoutingModel``: the phase diagram's Zipf skew with Dirichlet
  fluctuation, or batches resampled from an engine recording); the dispatch splits each
  expert's tokens over its replica GPUs; the layer's time is the slowest GPU under the
  :class:`~straggler.formulations.CostModel` (TEMPO Eq. 1, 2, 4: floor and tile staircase,
  compute, and the all-to-all traffic piece ``c2 + gamma * N_g``), plus
  ``internode_us_per_token`` times the most tokens any GPU receives from other nodes.
* **Placement** (replica sets) rebuilt every ``placement_period`` steps from the mean of the
  last ``placement_window`` steps' counts, as the engines rebalance (vLLM's EplbState: window
  1000 steps, rearrangement every 3000): ``"eplb"`` (DeepSeek EPLB), ``"place_experts"``
  (:func:`~straggler.solvers.place_experts`), or ``"fixed"`` (the initial placement, never
  rebuilt). The initial placement is built from the routing model's long-run loads.
* **Dispatch**: ``"even"`` (EPLB's even split over replicas), tables refreshed every
  ``dispatch_period_s`` of simulated time from the mean batch of the counts seen since the
  previous refresh (``table_counts``; ``"tempo"``, ``"token_lp"``: what a
  :class:`~straggler.runtime.SolverWorker` deploys; a
  table is each expert's split ``shares / n`` over GPUs and applies from the next step,
  the solve itself off the critical path), the engines' own rules (``"static"``, SGLang's
  static table: each source rank sends each expert's tokens to one replica, its own GPU's
  first, rebuilt with the placement; ``"lp"``, SGLang's ``lp``: the token LP per batch,
  tokens sampled from its masses), or ``"per_batch"``: ``solve_dispatch`` on every batch with
  ``per_batch_method`` (the bound on what a dispatcher can reach). A table's split is applied
  in expectation (``x[e, g] = n_e * frac[e, g]``); the in-graph kernel's per-token sampling
  noise is not modelled for tables. The traffic diagnostics (tokens received from other
  GPUs and nodes) follow ``split``: by default each source's tokens of an expert follow the
  expert's split (exact
  for tables and the even split; for ``"static"`` they ignore its locality).
* **Layers**: ``layers=k`` simulates ``k`` representative MoE layers (independent
  popularity; for a recording, ``k`` evenly spaced recorded layers) and scales their sum to
  the model's MoE depth; ``layers=None`` simulates all of them.

With the MoE term off (``moe=False``) and one layer the step is ``a + b KV_max + c R``-shaped
like the decode-routing simulator's ``t0 + kappa * max_g L_g``.

References
----------
TEMPO (``papers/001_4535d67528d990a1.txt``): §2.1 (EP synchronization, per-layer makespan),
Eq. (1), (2), (4) (cost model), §4.3 (traffic and topology), §5.10 (end-to-end on
Qwen3-235B and DeepSeek-V3), Table 7 (parameters).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ...baselines.dispatch.static import sglang_static_table
from ...formulations.cost import MAX_COST_PARAMETER, CostModel
from ...formulations.dispatch import DispatchProblem, logical_to_physical
from ...formulations.errors import param_error
from ...formulations.validation import (
    MAX_EXACT_INT,
    check_array,
    check_bool,
    check_choice,
    check_int,
    check_real,
    check_type,
    describe,
)
from ...solvers.dispatch.solve import solve_dispatch
from ...solvers.placement.place import place_experts
from ...solvers.placement.rebalance.policy import RebalanceContext, RebalancePolicy
from ...solvers.placement.rebalance.registry import get_rebalance_policy
from ...solvers.placement.rebalance.transfer import (
    DTYPE_BYTES,
    MoveCost,
    _batches,
    _transfer,
    expert_bytes,
)
from ..workloads.batches import (
    DEFAULT_KAPPA,
    SKEWS,
    eplb_placement,
    num_physical_slots,
    sample_counts,
    zipf_popularity,
)
from ._deployment_kernels import (
    STEP_COLUMNS,
    deployment_step_kernel,
    layer_times_kernel,
    sample_choices_kernel,
)

__all__ = [
    "AttentionCost",
    "ModelPreset",
    "MODEL_PRESETS",
    "RoutingModel",
    "RoutingSequence",
    "DeploymentConfig",
    "StepBreakdown",
    "StepModel",
    "DeploymentRun",
    "simulate_steps",
    "engine_moe_seconds",
    "running_step_model",
    "full_batch_step",
    "PLACEMENTS",
    "DISPATCHES",
    "METHOD_OPTIONS",
    "MAX_STEP_CHOICES",
]

#: Steps of the routing stream (popularity and sampling seed) drawn at once.
_BLOCK = 256

#: Values of ``DeploymentConfig.placement``.
PLACEMENTS = ("eplb", "place_experts", "fixed")
#: Values of ``DeploymentConfig.dispatch``.
DISPATCHES = ("even", "tempo", "token_lp", "static", "lp", "per_batch")
#: Table dispatches and the registered method each solves with.
_TABLE_METHODS = {"tempo": "tempo", "token_lp": "token_lp"}
#: Options of a method when the step model solves with it: tempo_fast as the paper has it,
#: its exact repair off (the repair's HiGHS stops on wall-clock time: a run must be
#: deterministic, and the repair is most of a refresh's cost).
METHOD_OPTIONS = {"tempo": {"repair_budget_s": 0.0}}
#: Per-batch dispatches (the engines' own per-batch rules) and their registered methods.
_BATCH_METHODS = {"lp": "sglang_lp"}
#: Dispatches a step prices in one kernel call (tables in force, or SGLang's static table).
_FUSED = ("even", "tempo", "token_lp", "static")


@dataclass(frozen=True, kw_only=True)
class AttentionCost:
    """Per-rank, per-layer decode attention time ``a + b * KV + c * R`` (microseconds).

    Parameters
    ----------
    a : float
        Fixed time per layer (the attention block's weights streamed from HBM: QKV and output
        projections; a rank with no request still runs it, as DP attention runs a dummy batch).
    b : float
        Per resident KV token (reading the KV cache, or the attention compute where that binds).
    c : float
        Per running request (the per-token work of the projections).

    Examples
    --------
    >>> AttentionCost(a=20.0, b=0.001, c=0.5).time([1000, 0], [4, 0]).tolist()
    [23.0, 20.0]
    """

    a: float
    b: float
    c: float

    def __post_init__(self) -> None:
        for name in ("a", "b", "c"):
            object.__setattr__(
                self, name, check_real(getattr(self, name), name, "AttentionCost", lo=0)
            )

    def time(self, kv, requests) -> np.ndarray:
        """Per-rank time (us) for resident KV tokens ``kv`` and running ``requests``."""
        return (
            self.a
            + self.b * np.asarray(kv, dtype=float)
            + self.c * np.asarray(requests, dtype=float)
        )


@dataclass(frozen=True, kw_only=True)
class ModelPreset:
    """A served MoE model: depth, experts, attention and dispatch cost models.

    Attributes
    ----------
    name : str
    n_layers : int
        Decoder layers (each has attention).
    n_moe_layers : int
        Layers whose FFN is a routed MoE (the rest are dense).
    n_experts, top_k, n_groups : int
        Routed experts, experts per token, EPLB expert groups.
    attention : AttentionCost
    dense_ffn_us : float
        A dense FFN layer's time (weights streamed), per dense layer.
    shared_expert_us : float
        The shared expert of an MoE layer (every rank runs it on its own tokens; weights
        streamed), per MoE layer.
    cost : CostModel
        The per-GPU MoE cost model (TEMPO Table 7).
    skew : float
        Zipf exponent of the routing model (see :data:`~straggler.sim.SKEWS`).
    replication : float
        Physical slots over logical experts of the default placement.
    source : str
        Where the numbers come from.
    hidden, moe_intermediate : int
        The model's hidden size and routed expert's intermediate size (``config.json``:
        ``hidden_size``, ``moe_intermediate_size``; 0: not known, then a rearrangement's
        copies need an explicit size).
    dtype : str
        The routed experts' weight dtype (a key of
        ``straggler.solvers.placement.rebalance.transfer.DTYPE_BYTES``).
    """

    name: str
    n_layers: int
    n_moe_layers: int
    n_experts: int
    top_k: int
    n_groups: int
    attention: AttentionCost
    dense_ffn_us: float
    shared_expert_us: float
    cost: CostModel
    skew: float
    replication: float
    source: str = ""
    hidden: int = 0
    moe_intermediate: int = 0
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        func = "ModelPreset"
        for name in ("hidden", "moe_intermediate"):
            object.__setattr__(self, name, check_int(getattr(self, name), name, func, lo=0))
        object.__setattr__(self, "dtype", check_choice(self.dtype, "dtype", func, DTYPE_BYTES))
        n_layers = check_int(self.n_layers, "n_layers", func, lo=1)
        object.__setattr__(self, "n_layers", n_layers)
        object.__setattr__(
            self, "n_moe_layers", check_int(self.n_moe_layers, "n_moe_layers", func, lo=1,
                                            hi=n_layers)
        )  # fmt: skip
        E = check_int(self.n_experts, "n_experts", func, lo=1)
        object.__setattr__(self, "n_experts", E)
        object.__setattr__(self, "top_k", check_int(self.top_k, "top_k", func, lo=1, hi=E))
        object.__setattr__(self, "n_groups", check_int(self.n_groups, "n_groups", func, lo=1))
        check_type(self.attention, "attention", func, AttentionCost, "an AttentionCost")
        check_type(self.cost, "cost", func, CostModel, "a CostModel")
        for name in ("dense_ffn_us", "shared_expert_us", "skew"):
            object.__setattr__(self, name, check_real(getattr(self, name), name, func, lo=0))
        object.__setattr__(
            self, "replication", check_real(self.replication, "replication", func, lo=1)
        )

    @property
    def expert_bytes(self) -> float:
        """Bytes of one routed expert's weights in one layer (``3 * hidden *
        moe_intermediate`` parameters at ``dtype``), what a rearrangement copies per moved
        replica; 0 when the shape is not known.

        Examples
        --------
        >>> round(MODEL_PRESETS["dsv3"].expert_bytes / 1e6, 1)
        44.0
        """
        if not (self.hidden and self.moe_intermediate):
            return 0.0
        return expert_bytes(self.hidden, self.moe_intermediate, self.dtype)


# Roofline derivation, at an effective 3.0 TB/s of HBM bandwidth (FlashMLA's measured
# memory-bound figure on H800, deepseek-ai/FlashMLA README) and 660 TFLOP/s for MLA decode
# attention (its compute-bound figure); weights in fp8 (1 byte per parameter):
#   Qwen3-235B-A22B (config.json: hidden 4096, 64 query heads, 4 KV heads, head_dim 128,
#   94 layers, 128 experts, top-8): attention weights 4096*8192 + 2*4096*512 + 8192*4096 =
#   71.3M -> a = 23.8 us; KV per token and layer 2*4*128*2 B (bf16) = 2048 B -> b = 6.83e-4
#   us; c = 2 * 71.3M FLOP at ~1 PFLOP/s = 0.14 us.
#   DeepSeek-V3 (config.json: hidden 7168, MLA q_lora 1536, kv_lora 512, rope 64, 128 heads,
#   61 layers of which the first 3 dense (intermediate 18432), 256 routed experts, top-8,
#   8 groups, one shared expert of 2048): attention weights 187M -> a = 62.3 us; absorbed MLA
#   decode does 128 * (576 + 512) * 2 = 278.5k FLOP per KV token -> b = 4.2e-4 us (compute
#   binds before the 1152 B/token bf16 KV read, 3.8e-4 us); c = 2 * 187M FLOP -> 0.37 us;
#   dense FFN 3 * 7168 * 18432 = 396M -> 132 us; shared expert 3 * 7168 * 2048 = 44M -> 14.7 us.
#   DeepSeek-V2-Lite (config.json: hidden 2048, q_proj without LoRA, kv_lora 512, rope 64,
#   16 heads of 128, 27 layers of which the first dense (intermediate 10944), 64 routed experts
#   of 1408, top-6, two shared experts; released in bf16, 2 bytes per parameter): attention
#   weights 2048*3072 + 2048*576 + 512*4096 + 2048*2048 = 13.8M -> a = 9.2 us; the 576-value
#   compressed KV in bf16 (1152 B per token and layer) binds before its 34.8k FLOP -> b =
#   3.84e-4 us; c = 2 * 13.8M FLOP -> 0.028 us; dense FFN 3 * 2048 * 10944 -> 44.8 us; shared
#   experts 2 * 3 * 2048 * 1408 -> 11.5 us.
#   Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1 config.json: hidden 4096, 32 query heads and
#   8 KV heads of 128, 32 layers all MoE, 8 experts of intermediate 14336, top-2, no shared
#   expert; released in bf16): attention weights 4096*4096 + 2*4096*1024 + 4096*4096 = 41.9M
#   -> 83.9 MB -> a = 28.0 us; KV per token and layer 2*8*128*2 B = 4096 B, read before its
#   32 * 128 * 2 * 2 = 16.4k FLOP bind -> b = 1.365e-3 us; c = 2 * 41.9M FLOP at ~1 PFLOP/s
#   = 0.084 us; no dense FFN, no shared expert.
# No public per-layer decode timing of these models was at hand to fit these to; the MoE
# cost models are TEMPO's Testbed B tile fits (Table 7), which include the traffic pair, and
# for DeepSeek-V2-Lite its serving three-term model (Table 7, measured on that shape). No fit
# of Mixtral's shape exists: its preset takes DeepSeek-V3's tile fit (``source`` says why).
# Expert shapes (hidden, moe_intermediate) are the config.json values (Mixtral's routed
# expert is its ``intermediate_size``); the dtype of the routed experts is the roofline's
# (fp8 for the two large models, bf16 for V2-Lite and Mixtral).
MODEL_PRESETS: dict[str, ModelPreset] = {
    "qwen3_235b": ModelPreset(
        name="qwen3_235b",
        n_layers=94,
        n_moe_layers=94,
        n_experts=128,
        top_k=8,
        n_groups=1,
        attention=AttentionCost(a=23.8, b=6.83e-4, c=0.14),
        dense_ffn_us=0.0,
        shared_expert_us=0.0,
        cost=CostModel.preset("qwen3_235b_b_tile"),
        skew=SKEWS["qwen3_prover"],
        replication=1.25,
        source="roofline from config.json; MoE cost TEMPO Table 7 (Testbed B tile)",
        hidden=4096,
        moe_intermediate=1536,
        dtype="fp8",
    ),
    "dsv3": ModelPreset(
        name="dsv3",
        n_layers=61,
        n_moe_layers=58,
        n_experts=256,
        top_k=8,
        n_groups=8,
        attention=AttentionCost(a=62.3, b=4.2e-4, c=0.37),
        dense_ffn_us=132.0,
        shared_expert_us=14.7,
        cost=CostModel.preset("dsv3_b_tile"),
        skew=SKEWS["qwen3_prover"],
        replication=1.125,
        source="roofline from config.json; MoE cost TEMPO Table 7 (Testbed B tile)",
        hidden=7168,
        moe_intermediate=2048,
        dtype="fp8",
    ),
    "dsv2_lite": ModelPreset(
        name="dsv2_lite",
        n_layers=27,
        n_moe_layers=26,
        n_experts=64,
        top_k=6,
        n_groups=1,
        attention=AttentionCost(a=9.2, b=3.84e-4, c=0.028),
        dense_ffn_us=44.8,
        shared_expert_us=11.5,
        cost=CostModel.preset("dsv2_lite_a_serving"),
        skew=SKEWS["qwen3_prover"],
        replication=1.25,
        source="roofline from config.json; MoE cost TEMPO Table 7 (serving three-term, "
        "DSv2-Lite shape); the shape of the recorded ESFT loads "
        "(../shared/data/expert_loads)",
        hidden=2048,
        moe_intermediate=1408,
        dtype="bf16",
    ),
    "mixtral_8x7b": ModelPreset(
        name="mixtral_8x7b",
        n_layers=32,
        n_moe_layers=32,
        n_experts=8,
        top_k=2,
        n_groups=1,
        attention=AttentionCost(a=28.0, b=1.365e-3, c=0.084),
        dense_ffn_us=0.0,
        shared_expert_us=0.0,
        cost=CostModel.preset("dsv3_b_tile"),
        skew=SKEWS["mixtral_mmlu"],
        replication=1.5,
        source="roofline from config.json (mistralai/Mixtral-8x7B-v0.1); MoE cost TEMPO Table 7 "
        "dsv3_b_tile, not a fit of Mixtral: of the fits with the traffic pair (Eq. 4) that the "
        "other presets use, DeepSeek-V3's expert is the nearest shape (44M parameters against "
        "Mixtral's 176M) and its traffic pair prices a token of about Mixtral's size (7168 B "
        "fp8 against 8192 B bf16); its per-expert terms are an fp8 expert of 44 MB against "
        "Mixtral's 352 MB bf16, so expert weight streaming is under-priced and the per-token "
        "terms weigh more than on Mixtral. Skew: the median of the recorded MMLU popularity "
        "(../shared/data/expert_loads/fiddler_mixtral8x7b_popularity, efeslab/fiddler, "
        "Apache-2.0); replication 1.5: 12 slots on EP4 (3 per GPU), 16 on EP8 (slots round up to "
        "a multiple of the GPUs)",
        hidden=4096,
        moe_intermediate=14336,
        dtype="bf16",
    ),
}


class RoutingModel:
    """Where each step's expert popularity comes from, per simulated layer.

    Build with :meth:`zipf` (long-run Zipf popularity, a random expert permutation per
    layer, each step's popularity ``Dirichlet(kappa * p)``: TEMPO §3.2 and the phase diagram)
    or :meth:`recorded` (each step draws one recorded batch uniformly at random and uses its
    counts as the popularity, so the recorded batch-to-batch fluctuation is kept).

    With ``drift > 0`` (:meth:`zipf`), which experts are hot drifts as in
    :func:`~straggler.sim.workloads.drift.drifting_windows`: every ``drift_steps`` steps each
    expert's
    log popularity takes an independent Gaussian step of standard deviation ``drift`` and the
    experts take the Zipf popularities of their new ranks (the skew stays exactly Zipf). The
    engines' placement, rebuilt from a window of past steps, then lags the routing, and
    tables refreshed more often than the placement can follow it (TEMPO §5.12: transient
    skew and stale placement are where dispatch pays). The drift draws its own random stream
    (:meth:`drift_state`); ``drift=0`` leaves every draw of the model as without it.

    Examples
    --------
    >>> m = RoutingModel.zipf(8, 0.85, n_layers=2, rng=0)
    >>> m.n_layers, m.n_experts, m.long_run().shape
    (2, 8, (2, 8))
    """

    def __init__(self, popularity, kappa, recorded, drift=0.0, drift_steps=1) -> None:
        self._popularity = popularity
        self._kappa = kappa
        self._recorded = recorded
        self.drift = drift
        self.drift_steps = drift_steps

    @classmethod
    def zipf(
        cls, n_experts: int, skew, *, n_layers: int = 1, kappa=DEFAULT_KAPPA, drift=0.0,
        drift_steps: int = 1000, rng=None,
    ):  # fmt: skip
        """Zipf(``skew``) popularity with Dirichlet(``kappa * p``) fluctuation per step; with
        ``drift > 0``, the hot experts drift every ``drift_steps`` steps (class docstring)."""
        func = "RoutingModel.zipf"
        p = zipf_popularity(n_experts, skew, n_layers=n_layers, rng=rng)
        if kappa is not None:
            kappa = check_real(kappa, "kappa", func, lo=0, lo_open=True)
        drift = check_real(drift, "drift", func, lo=0, hi=10)
        drift_steps = check_int(drift_steps, "drift_steps", func, lo=1)
        return cls(p, kappa, None, drift, drift_steps)

    def drift_state(self, rng) -> dict | None:
        """The drift's state for one run (None without drift): the current popularity, the
        latent log scores, the steps drawn, and the drift's own generator from ``rng``."""
        if self._recorded is not None or self.drift == 0:
            return None
        p = self._popularity
        return dict(
            pop=p.copy(), score=np.log(p), weights=-np.sort(-p, axis=1), step=0,
            gen=np.random.default_rng(rng),
        )  # fmt: skip

    @classmethod
    def recorded(cls, counts, *, top_k: int, layers: int | None = None):
        """Resample recorded batches ``counts (n_batches, n_layers, n_experts)`` (e.g.
        ``read_engine_log(path).counts``); ``layers=k`` keeps ``k`` evenly spaced layers.

        Batches with fewer than ``top_k`` experts with tokens in some kept layer are dropped
        (a token could not pick ``top_k`` distinct experts from them).
        """
        func = "RoutingModel.recorded"
        c = check_array(
            counts, "counts", func, kind="int", ndim=3, lo=0,
            expected="a 3-D (n_batches, n_layers, n_experts) array of non-negative integers",
        )  # fmt: skip
        top_k = check_int(top_k, "top_k", func, lo=1)
        if 0 in c.shape:
            raise param_error("counts", func, "a non-empty 3-D array", f"shape {c.shape}")
        if layers is not None:
            layers = check_int(layers, "layers", func, lo=1, hi=c.shape[1])
            keep = np.unique(np.linspace(0, c.shape[1] - 1, layers).round().astype(np.int64))
            c = c[:, keep]
        ok = ((c > 0).sum(axis=2) >= top_k).all(axis=1)
        if not ok.any():
            raise param_error(
                "counts", func,
                f"recorded batches with at least top_k={top_k} experts with tokens per layer",
                "none such",
            )  # fmt: skip
        return cls(None, None, np.ascontiguousarray(c[ok]))

    @property
    def n_layers(self) -> int:
        src = self._popularity if self._recorded is None else self._recorded[0]
        return int(src.shape[0])

    @property
    def n_experts(self) -> int:
        src = self._popularity if self._recorded is None else self._recorded[0]
        return int(src.shape[1])

    def long_run(self) -> np.ndarray:
        """Long-run load per layer and expert (``(n_layers, n_experts)``, float)."""
        if self._recorded is None:
            return self._popularity.copy()
        return self._recorded.mean(axis=0)

    def batch_popularity(self, gen: np.random.Generator) -> np.ndarray:
        """One step's popularity ``(n_layers, n_experts)`` (non-negative, unnormalized)."""
        return self.batch_popularities(gen, 1)[0]

    def batch_popularities(self, gen: np.random.Generator, n: int, drift=None) -> np.ndarray:
        """``n`` steps' popularities ``(n, n_layers, n_experts)``, drawn at once (``drift``:
        the run's :meth:`drift_state`, advanced here)."""
        if self._recorded is not None:
            return self._recorded[gen.integers(self._recorded.shape[0], size=n)].astype(float)
        p = self._popularity
        if drift is not None:  # the long-run popularity of each of the n steps
            p = np.empty((n,) + p.shape)
            pop, weights = drift["pop"], drift["weights"]
            for i in range(n):
                if drift["step"] and drift["step"] % self.drift_steps == 0:
                    score = drift["score"]
                    score = score + self.drift * drift["gen"].standard_normal(score.shape)
                    drift["score"] = score
                    for l in range(score.shape[0]):  # re-rank: the Zipf weights by new rank
                        pop[l, np.argsort(-score[l], kind="stable")] = weights[l]
                p[i] = pop
                drift["step"] += 1
            if self._kappa is None:
                return p
            return _dirichlet_rows(gen, self._kappa, p)
        if self._kappa is None:
            return np.broadcast_to(p, (n,) + p.shape).copy()
        # Dirichlet(kappa * p) per layer as independent gammas normalized by row; a draw can
        # underflow to 0: keep every expert reachable
        return _dirichlet_rows(gen, self._kappa, np.broadcast_to(p, (n,) + p.shape))


class RoutingSequence:
    """Routing models played one after another in simulated time: a drift between recorded
    workloads (e.g. one recording per task, :meth:`RoutingModel.recorded` each).

    Model ``i`` routes the steps that start in ``[i * every_s, (i + 1) * every_s)``, the
    sequence starting over after the last; the placement the run starts from is the first
    model's long-run loads'. Each model keeps its own batch-to-batch fluctuation.

    Parameters
    ----------
    models : sequence of RoutingModel
        At least one, all with the same layers and experts.
    every_s : float
        Seconds of simulated time each model routes.

    Examples
    --------
    >>> a = RoutingModel.zipf(8, 0.9, rng=0)
    >>> b = RoutingModel.zipf(8, 0.9, rng=1)
    >>> seq = RoutingSequence([a, b], every_s=10.0)
    >>> seq.phase_at(0.0), seq.phase_at(10.0), seq.phase_at(25.0), seq.n_experts
    (0, 1, 0, 8)
    """

    def __init__(self, models, *, every_s: float) -> None:
        func = "RoutingSequence"
        models = list(models)
        if not models:
            raise param_error("models", func, "at least one RoutingModel", "none")
        for m in models:
            check_type(m, "models", func, RoutingModel, "a sequence of RoutingModel")
        shape = (models[0].n_layers, models[0].n_experts)
        for i, m in enumerate(models):
            if (m.n_layers, m.n_experts) != shape:
                raise param_error(
                    "models", func, f"models of one shape ({shape[0]} layers, {shape[1]} "
                    "experts)", f"model {i} with {m.n_layers} layers, {m.n_experts} experts",
                )  # fmt: skip
        self.models = tuple(models)
        self.every_s = check_real(every_s, "every_s", func, lo=0, lo_open=True)

    @property
    def n_layers(self) -> int:
        return self.models[0].n_layers

    @property
    def n_experts(self) -> int:
        return self.models[0].n_experts

    def phase_at(self, now_s: float) -> int:
        """The model routing a step that starts at ``now_s``."""
        return int(max(0.0, now_s) // self.every_s) % len(self.models)

    def long_run(self) -> np.ndarray:
        """The first model's long-run loads (the initial placement's)."""
        return self.models[0].long_run()


@dataclass(frozen=True, kw_only=True)
class DeploymentConfig:
    """One deployment: model, EP width, routing model, placement and dispatch policies.

    Parameters
    ----------
    preset : str or ModelPreset
        A key of :data:`MODEL_PRESETS` or a preset.
    n_gpus : int
        Ranks: attention DP width = EP width.
    n_nodes : int, default 1
        Nodes (GPU ``g`` on node ``g // (n_gpus / n_nodes)``).
    layers : int or None, default 4
        Simulated MoE layers (scaled to the preset's depth); None: all of them.
    moe : bool, default True
        Whether the MoE term is on (off: attention and dense layers only).
    routing : None, RoutingModel or RoutingSequence
        None: ``RoutingModel.zipf`` with the preset's skew, ``kappa`` and ``seed``.
    kappa : float or None, default 2000
        Dirichlet concentration of the default routing model.
    drift : float, default 0
        The default routing model's drift (``RoutingModel``: standard deviation of
        each expert's log-popularity step; 0: the hot experts never change).
    drift_steps : int, default 1000
        Steps between two drift steps.
    placement : {"eplb", "place_experts", "fixed"}, default "eplb"
    placement_period : int, default 3000
        Steps between placement rebuilds.
    placement_window : int, default 1000
        Steps of counts a rebuild places from.
    dispatch : {"even", "tempo", "token_lp", "static", "lp", "per_batch"}, default "even"
    dispatch_period_s : float, default 0.2
        Simulated seconds between table refreshes (tables only).
    table_counts : {"mean", "window"}, default "mean"
        The batch a refresh solves: the mean batch of the steps since the last refresh
        (their counts summed, divided by their number, rounded half up), the scale of the
        batches the table then serves; or the window's summed counts (``"window"``: a batch
        ``steps`` times larger, which the cost model puts in the linear regime where
        splitting a hot expert pays, while the decode batches served sit in the flat regime
        where every split adds an activation; TEMPO §2.2).
    per_batch_method : str, default "tempo"
        The registered method ``dispatch="per_batch"`` solves every batch with.
    replication : float or None
        Physical slots over experts, in ``[1, n_gpus]`` (every expert on every GPU at
        most); None: the preset's (at most ``n_gpus``).
    cost : CostModel or None
        The MoE cost model; None: the preset's.
    internode_us_per_token : float, default 0
        Added per token the busiest GPU receives from other nodes (at most ``2**900``,
        ``CostModel``'s bound on a time parameter, so no time is infinite).
    rebalance : str or RebalancePolicy, optional
        A rebalance policy (a name of
        ``straggler.solvers.placement.rebalance.registry.REBALANCE_POLICIES``, ``name:N``,
        or a policy object): it decides when and to what the placement changes,
        and every change is charged by ``move`` (:class:`StepModel` notes). None: the
        placement is rebuilt every ``placement_period`` steps from ``placement_window``
        steps, instantly and for free (``placement``).
    move : MoveCost, optional
        The copies' price with a ``rebalance`` policy: expert size, bandwidths, mode
        (default: the preset's :attr:`ModelPreset.expert_bytes`, H100 links, ``"sync"``).
    rank_events : sequence of (int, int, bool), default ()
        With a ``rebalance`` policy: ``(step, rank, active)``, after ``step`` steps the rank
        goes down (``False``) or comes back (``True``): its expert slots are lost or empty,
        and the policy plans at once on the active ranks (a synchronous rearrangement
        whatever the mode: an expert without a replica stops the layer). The rank's attention
        replica is not modelled as lost (the routing simulator keeps its requests), as in a
        deployment whose MoE ranks are apart from attention.
    split : {"flat", "node_first"}, default "flat"
        Which source rank's tokens go to which replica (per-GPU loads are the dispatch's
        either way; the traffic columns and the inter-node term follow): each source in the
        expert's proportions (a flat table), or the topology-aware split of TEMPO §4.3 (own
        GPU's replica first, then the source's node, the fewest tokens across nodes;
        ``straggler.sim.engine._deployment_kernels.layer_times_kernel``).
    seed : int, default 0
    """

    preset: str | ModelPreset
    n_gpus: int
    n_nodes: int = 1
    layers: int | None = 4
    moe: bool = True
    routing: RoutingModel | None = None
    kappa: float | None = DEFAULT_KAPPA
    drift: float = 0.0
    drift_steps: int = 1000
    placement: str = "eplb"
    placement_period: int = 3000
    placement_window: int = 1000
    dispatch: str = "even"
    dispatch_period_s: float = 0.2
    table_counts: str = "mean"
    per_batch_method: str = "tempo"
    replication: float | None = None
    cost: CostModel | None = None
    internode_us_per_token: float = 0.0
    split: str = "flat"
    seed: int = 0
    rebalance: str | RebalancePolicy | None = None
    move: MoveCost | None = None
    rank_events: tuple = ()

    def __post_init__(self) -> None:
        func = "DeploymentConfig"
        preset = self.preset
        if not isinstance(preset, ModelPreset):
            preset = MODEL_PRESETS[check_choice(preset, "preset", func, sorted(MODEL_PRESETS))]
        object.__setattr__(self, "preset", preset)
        G = check_int(self.n_gpus, "n_gpus", func, lo=1, hi=65_536)
        object.__setattr__(self, "n_gpus", G)
        nodes = check_int(self.n_nodes, "n_nodes", func, lo=1, hi=G)
        if G % nodes:
            raise param_error("n_nodes", func, f"a divisor of n_gpus={G}", repr(self.n_nodes))
        object.__setattr__(self, "n_nodes", nodes)
        if self.layers is not None:
            object.__setattr__(
                self, "layers",
                check_int(self.layers, "layers", func, lo=1, hi=preset.n_moe_layers),
            )  # fmt: skip
        object.__setattr__(self, "moe", check_bool(self.moe, "moe", func))
        if self.routing is not None:
            check_type(
                self.routing, "routing", func, (RoutingModel, RoutingSequence),
                "None, a RoutingModel or a RoutingSequence",
            )  # fmt: skip
            if self.routing.n_experts != preset.n_experts:
                raise param_error(
                    "routing", func, f"a routing model over the preset's {preset.n_experts} "
                    "experts", f"{self.routing.n_experts} experts",
                )  # fmt: skip
        if self.kappa is not None:
            object.__setattr__(
                self, "kappa", check_real(self.kappa, "kappa", func, lo=0, lo_open=True)
            )
        object.__setattr__(self, "drift", check_real(self.drift, "drift", func, lo=0, hi=10))
        object.__setattr__(
            self, "drift_steps", check_int(self.drift_steps, "drift_steps", func, lo=1)
        )
        object.__setattr__(
            self, "placement", check_choice(self.placement, "placement", func, PLACEMENTS)
        )
        for name in ("placement_period", "placement_window"):
            object.__setattr__(self, name, check_int(getattr(self, name), name, func, lo=1))
        object.__setattr__(
            self, "dispatch", check_choice(self.dispatch, "dispatch", func, DISPATCHES)
        )
        object.__setattr__(
            self, "dispatch_period_s",
            check_real(self.dispatch_period_s, "dispatch_period_s", func, lo=0),
        )  # fmt: skip
        object.__setattr__(
            self, "table_counts",
            check_choice(self.table_counts, "table_counts", func, ("mean", "window")),
        )  # fmt: skip
        from ...solvers import dispatch_methods

        object.__setattr__(
            self, "per_batch_method",
            check_choice(self.per_batch_method, "per_batch_method", func, dispatch_methods()),
        )  # fmt: skip
        # at most every expert on every GPU: P <= n_experts * n_gpus slots, the size of the
        # replica masks the dispatch holds anyway (a further slot would be a second copy of
        # an expert on a GPU that already holds one)
        if self.replication is None:
            rep = min(preset.replication, float(G))
        else:
            rep = check_real(self.replication, "replication", func, lo=1, hi=G)
        object.__setattr__(self, "replication", rep)
        cost = preset.cost if self.cost is None else self.cost
        check_type(cost, "cost", func, CostModel, "None or a CostModel")
        object.__setattr__(self, "cost", cost)
        object.__setattr__(
            self, "internode_us_per_token",
            check_real(
                self.internode_us_per_token, "internode_us_per_token", func, lo=0,
                hi=MAX_COST_PARAMETER,  # a time per token, as CostModel's (never inf)
            ),  # fmt: skip
        )  # fmt: skip
        object.__setattr__(
            self, "split", check_choice(self.split, "split", func, ("flat", "node_first"))
        )
        object.__setattr__(self, "seed", check_int(self.seed, "seed", func, lo=0))
        self._rebalance_iv(func, preset, G)

    def _rebalance_iv(self, func: str, preset: ModelPreset, G: int) -> None:
        """``rebalance``, ``move`` and ``rank_events`` checked and filled."""
        if self.rebalance is None:
            for name in ("move", "rank_events"):
                if getattr(self, name):
                    raise param_error(
                        name, func, "left out without a rebalance policy",
                        describe(getattr(self, name)),
                    )  # fmt: skip
            return
        object.__setattr__(self, "rebalance", get_rebalance_policy(self.rebalance, func))
        move = self.move
        if move is None:
            if preset.expert_bytes <= 0:
                raise param_error(
                    "move", func, f"a MoveCost (preset {preset.name!r} states no expert "
                    "shape)", "None",
                )  # fmt: skip
            move = MoveCost(expert_bytes=preset.expert_bytes)
        check_type(move, "move", func, MoveCost, "None or a MoveCost")
        object.__setattr__(self, "move", move)
        events = []
        for ev in self.rank_events:
            if not isinstance(ev, (tuple, list)) or len(ev) != 3:
                raise param_error("rank_events", func, "(step, rank, active) triples", describe(ev))
            step = check_int(ev[0], "rank_events", func, lo=1)
            rank = check_int(ev[1], "rank_events", func, lo=0, hi=G - 1)
            events.append((step, rank, check_bool(ev[2], "rank_events", func)))
        object.__setattr__(self, "rank_events", tuple(sorted(events)))

    @property
    def n_sim_layers(self) -> int:
        """MoE layers simulated per step."""
        if self.routing is not None:
            return self.routing.n_layers
        return self.preset.n_moe_layers if self.layers is None else self.layers

    @property
    def layer_scale(self) -> float:
        """Factor from the simulated MoE layers to the model's MoE depth."""
        return self.preset.n_moe_layers / self.n_sim_layers


class StepBreakdown(NamedTuple):
    """One step's time, decomposed (microseconds; MoE figures scaled to the model's depth).

    ``attention_us``: ``n_layers * max_g att_g``; ``attention_straggler_us``: ``n_layers *
    (max_g - mean_g) att_g``; ``moe_us``: sum over MoE layers of the layer time;
    ``moe_straggler_us``: sum of ``max_g t_g - mean_g t_g``; ``comm_us``: sum of the traffic
    piece at its largest GPU (``c2 + gamma * max_g N_g``; inside the max of the layer time,
    reported apart) plus the inter-node term; ``dense_us``: dense FFN and shared-expert
    layers; ``total_us``: attention + MoE + dense + rebalance; ``cross_node_tokens``: per
    layer, the most tokens one GPU receives from other nodes (mean over simulated layers);
    ``balancedness``: vLLM's ``EplbState`` balancedness of the step, ``sum_l mean_g N_g /
    sum_l max_g N_g`` over the simulated layers (``N_g`` the tokens GPU ``g`` receives; 0
    without tokens; :func:`~straggler.formulations.metrics.vllm_balancedness`);
    ``rebalance_us``: what a rearrangement adds to the step (a synchronous stall, or the
    asynchronous copies' delay of its all-to-all; :class:`StepModel`), inside ``moe_us``'s
    share of the step the engine is charged."""

    attention_us: float
    attention_straggler_us: float
    moe_us: float
    moe_straggler_us: float
    comm_us: float
    dense_us: float
    total_us: float
    cross_node_tokens: float
    balancedness: float
    rebalance_us: float


def _slot_fracs(p2l: np.ndarray, n_experts: int, n_gpus: int) -> np.ndarray:
    """EPLB's even split as per-GPU fractions ``(L, E, G)``: replica slots of ``e`` on ``g``
    over its replica count (0 for an expert without a replica)."""
    L, P = p2l.shape
    per = P // n_gpus
    cnt = np.zeros((L, n_experts, n_gpus))
    li, pi = np.nonzero(p2l >= 0)
    np.add.at(cnt, (li, p2l[li, pi], pi // per), 1.0)
    tot = cnt.sum(axis=2, keepdims=True)
    return np.divide(cnt, tot, out=np.zeros_like(cnt), where=tot > 0)


#: Most token-expert choices one step samples (running requests over all ranks times the
#: preset's ``top_k``): each is drawn one by one (``sample_choices_kernel``, about 0.02 us
#: each on one core), so a step at this bound takes a second or two, and more is refused up
#: front rather than left running for hours. A decode step is far below it (256 ranks x 256
#: requests x top-8 = 524,288); the same bound as the per-token dispatch layout's.
MAX_STEP_CHOICES = 2**26


def _check_step_choices(req: np.ndarray, top_k: int, func: str) -> None:
    """``req`` (steps, G) or (G,): every step's requests times ``top_k`` at most
    :data:`MAX_STEP_CHOICES`, else an error naming ``requests``."""
    per_step = np.atleast_2d(req).astype(np.float64).sum(axis=1) * top_k
    if per_step.size and per_step.max() > MAX_STEP_CHOICES:
        k = int(per_step.argmax())
        raise param_error(
            "requests", func,
            f"at most 2**26 = {MAX_STEP_CHOICES} token-expert choices per step (the running "
            f"requests of all ranks times the preset's top_k = {top_k}; each is sampled)",
            f"{per_step[k]:.6g} in step {k}",
        )  # fmt: skip


def _dirichlet_rows(gen: np.random.Generator, kappa: float, p: np.ndarray) -> np.ndarray:
    """One Dirichlet(``kappa * p[..., :]``) draw per row, as gammas normalized by row, every
    entry at least the smallest positive float (an expert stays reachable).

    Where every gamma of a row underflows to 0 (all shapes tiny: ``kappa * p`` of about
    1e-3 and below on hundreds of experts; 0/0 would give NaN popularities), the row is the
    Dirichlet's limit as its shapes go to 0: all the mass on one expert, drawn with
    probability proportional to ``p``. Rows that do not underflow draw exactly what they
    drew without this (nothing more is drawn from ``gen`` unless a row underflows)."""
    g = gen.standard_gamma(kappa * p)
    total = g.sum(axis=-1, keepdims=True)
    dead = np.flatnonzero(total.reshape(-1) == 0)
    if dead.size:
        g = g.reshape(-1, g.shape[-1])
        w = np.asarray(p, dtype=float).reshape(-1, g.shape[-1])
        for r in dead:
            g[r, gen.choice(w.shape[1], p=w[r] / w[r].sum())] = 1.0
        g = g.reshape(total.shape[:-1] + (w.shape[1],))
        total = g.sum(axis=-1, keepdims=True)
    return np.maximum(g / total, np.finfo(float).tiny)


class StepModel:
    """The stateful step model of one :class:`DeploymentConfig` (call :meth:`step` per step).

    Holds the placement, the dispatch tables, the count windows and the random streams.
    Deterministic for a given config and sequence of calls.

    **Rebalancing with a policy** (``DeploymentConfig.rebalance``). Every step's tokens per
    expert go to a window of the policy's ``window_steps()``; after each step the policy is
    asked on its clock (``schedule()``; while a rearrangement is under way it is asked again
    at the next step, as vLLM holds its next rearrangement back) and a rank event makes it
    plan at once. A plan that changes the placement is a *rearrangement*, priced per layer by
    ``layer_transfer`` of ``straggler.solvers.placement.rebalance.transfer`` (the simulated
    layers each standing for ``layer_scale`` of the model's; copies, bytes and times scaled
    alike) and charged in the mode of ``DeploymentConfig.move``
    (the notes of ``MoveCost`` there):

    * ``"sync"`` (and every rank event): the next step is longer by the copies' time (the
      layers one after another) plus, when the policy plans on the critical path (not
      ``offloaded``), its planning time, and runs on the new placement. An offloaded policy's
      plan is ready ``planning`` seconds later: the old placement serves until then, and the
      stall comes at the first step after.
    * ``"async"`` / ``"batched"``: the copies start ``planning`` seconds after the decision,
      one model layer per step at most, in layer order; each step while they run is longer by
      ``min(k M, R - (S - M))`` (``S`` its time, ``M`` its all-to-all's, ``R`` the copy time
      left of the current layer, ``k`` that layer's ``peers``, 1 in rounds), and a simulated
      layer takes its new placement from the step after its last model layer landed.

    The stall or delay is the ``rebalance_us`` of the step's ``StepBreakdown``, in its
    ``total_us`` and in the MoE time the engine is charged. Every rearrangement is recorded in
    ``rebalances`` (decided ``step`` and ``time_s``, ``copies``, ``bytes``, ``stall_s``,
    ``delay_s``, ``planning_s``, ``applied_step``, and the policy's own figures); totals in
    :meth:`summary`.

    Examples
    --------
    >>> m = StepModel(DeploymentConfig(preset="qwen3_235b", n_gpus=4, layers=1, seed=1))
    >>> s = m.step([1000, 2000, 0, 500], [4, 6, 0, 2], now_s=0.0)
    >>> s.total_us > s.attention_us > 0, s.moe_us > 0
    (True, True)
    """

    def __init__(self, config: DeploymentConfig) -> None:
        check_type(config, "config", "StepModel", DeploymentConfig, "a DeploymentConfig")
        self.config = cfg = config
        pre = cfg.preset
        self._gen = np.random.default_rng([cfg.seed, 0x5EED])
        self.routing = cfg.routing or RoutingModel.zipf(
            pre.n_experts, pre.skew, n_layers=cfg.n_sim_layers, kappa=cfg.kappa,
            drift=cfg.drift, drift_steps=cfg.drift_steps,
            rng=np.random.default_rng([cfg.seed, 0x21FF]),
        )  # fmt: skip
        self._drift = (
            None if isinstance(self.routing, RoutingSequence)
            else self.routing.drift_state([cfg.seed, 0xD81F])
        )  # fmt: skip
        self._phase = 0
        self._now_s = 0.0
        G = cfg.n_gpus
        self.node = (np.arange(G) // (G // cfg.n_nodes)).astype(np.int64)
        self._cost_arr = cfg.cost.as_array()
        self.n_steps = 0
        self.n_placements = 0
        self.n_refreshes = 0
        L, E = cfg.n_sim_layers, pre.n_experts
        self.policy = cfg.rebalance
        self._wsize = cfg.placement_window if self.policy is None else self.policy.window_steps()
        self._window = np.zeros((self._wsize, L, E), dtype=np.int64)
        self._acc = np.zeros((L, E), dtype=np.int64)
        self._acc_steps = 0  # steps whose counts _acc holds
        self._last_refresh = 0.0
        self._log = np.zeros((1024, len(StepBreakdown._fields)))
        self._pops = np.zeros((0, L, E))
        self._seeds = np.zeros(0, dtype=np.int64)
        self._next = 0
        dense = (pre.n_layers - pre.n_moe_layers) * pre.dense_ffn_us
        if cfg.moe:
            dense += pre.n_moe_layers * pre.shared_expert_us
        self.dense_us = dense  # the dense FFN and shared-expert layers of a step (us)
        att = pre.attention
        self._par = np.array(
            [att.a, att.b, att.c, pre.n_layers, cfg.layer_scale, dense,
             cfg.internode_us_per_token, float(cfg.split == "node_first")],
        )  # fmt: skip
        self._no_static = np.zeros((0, L, E), dtype=np.int64)
        self.active = np.ones(G, dtype=bool)
        self._init_rebalance()
        self._set_placement(self._initial_placement())

    # --- placement -----------------------------------------------------------------------
    def _groups(self) -> int:
        pre = self.config.preset
        return pre.n_groups if pre.n_experts % pre.n_groups == 0 else 1

    def _place(self, loads: np.ndarray, history: np.ndarray) -> np.ndarray:
        cfg = self.config
        if cfg.placement == "place_experts":
            P = num_physical_slots(cfg.preset.n_experts, cfg.n_gpus, cfg.replication)
            p2l, _, _ = place_experts(
                history, P, self._groups(), cfg.n_nodes, cfg.n_gpus, cost=cfg.cost
            )
            return p2l
        return eplb_placement(
            loads, n_gpus=cfg.n_gpus, replication=cfg.replication, num_groups=self._groups(),
            num_nodes=cfg.n_nodes,
        )  # fmt: skip

    def _initial_placement(self) -> np.ndarray:
        """From the routing model's long-run loads (``place_experts``: 16 batches of 64
        tokens per GPU sampled from them)."""
        cfg = self.config
        loads = self.routing.long_run()
        history = None
        if cfg.placement == "place_experts":
            gen = np.random.default_rng([cfg.seed, 0x9A1])
            history = np.stack(
                [
                    sample_counts(loads, n_tokens=64 * cfg.n_gpus, top_k=cfg.preset.top_k,
                                  kappa=None, rng=gen)
                    for _ in range(16)
                ]
            )  # fmt: skip
        return self._place(loads, history)

    def _set_placement(self, p2l: np.ndarray) -> None:
        cfg = self.config
        self.physical_to_logical = p2l
        zeros = np.zeros(p2l.shape[:1] + (cfg.preset.n_experts,), dtype=np.int64)
        self._replicas = DispatchProblem.from_placement(zeros, p2l, cfg.n_gpus).replicas
        self._even = _slot_fracs(p2l, cfg.preset.n_experts, cfg.n_gpus)
        if cfg.dispatch == "static":  # the GPU each source rank sends each expert to
            l2p, _ = logical_to_physical(p2l, cfg.preset.n_experts)
            slot_gpu = np.arange(p2l.shape[1]) // (p2l.shape[1] // cfg.n_gpus)
            self._static_gpu = slot_gpu[sglang_static_table(l2p, slot_gpu, self.node)]
        self.tables = self._even  # an engine re-initializes its tables after a rebalance
        self.n_placements += 1

    # --- dispatch ------------------------------------------------------------------------
    def _solve(self, counts: np.ndarray, method: str) -> np.ndarray:
        problem = DispatchProblem(counts=counts, replicas=self._replicas)
        opts = METHOD_OPTIONS.get(method, {})
        res = solve_dispatch(problem, self.config.cost, method=method, rng=self._gen, **opts)
        return np.asarray(res.shares)

    def _refresh(self) -> None:
        """New tables from the counts seen since the last refresh, as their mean batch or
        their sum (``table_counts``; experts without tokens in it keep the even split)."""
        counts = self._acc
        if self.config.table_counts == "mean":
            k = self._acc_steps
            counts = (2 * counts + k) // (2 * k)
        shares = self._solve(counts, _TABLE_METHODS[self.config.dispatch])
        n = counts[:, :, None].astype(float)
        self.tables = np.where(n > 0, shares / np.where(n > 0, n, 1.0), self._even)
        self._acc[:] = 0
        self._acc_steps = 0
        self.n_refreshes += 1

    def dispatch(self, src: np.ndarray) -> np.ndarray:
        """Shares ``(L, E, G)`` of one batch's counts by source rank ``(L, S, E)`` under the
        current policy."""
        d = self.config.dispatch
        if d == "static":  # SGLang's table: every (source rank, expert) to one replica
            L, S, E = src.shape
            x = np.zeros((L, E, self.config.n_gpus))
            li, ei = np.meshgrid(np.arange(L), np.arange(E), indexing="ij")
            for s in range(S):
                np.add.at(x, (li, ei, self._static_gpu[s]), src[:, s, :])
            return x
        counts = src.sum(axis=1)
        if d == "per_batch":
            return self._solve(counts, self.config.per_batch_method)
        if d in _BATCH_METHODS:
            return self._solve(counts, _BATCH_METHODS[d])
        return counts[:, :, None] * self.tables

    # --- one step ------------------------------------------------------------------------
    def _next_batch(self) -> tuple[np.ndarray, int]:
        """The next step's popularity ``(L, E)`` and choice seed (the routing stream is drawn
        in blocks of :data:`_BLOCK` steps; a :class:`RoutingSequence` draws a new block from
        its next model when the phase changes)."""
        model = self.routing
        if isinstance(model, RoutingSequence):
            phase = model.phase_at(self._now_s)
            if phase != self._phase:
                self._phase = phase
                self._next = len(self._seeds)
            model = model.models[phase]
        if self._next == len(self._seeds):
            self._pops = model.batch_popularities(self._gen, _BLOCK, self._drift)
            self._seeds = self._gen.integers(2**62, size=_BLOCK)
            self._next = 0
        k = self._next
        self._next = k + 1
        return self._pops[k], int(self._seeds[k])

    def moe_layers(self, requests) -> tuple[np.ndarray, np.ndarray]:
        """Route one step's tokens and price every simulated layer: ``(counts (L, G, E),
        rows (L, len(LAYER_COLUMNS)))``. Advances the routing stream, not the windows."""
        cfg = self.config
        tokens = np.ascontiguousarray(requests, dtype=np.int64)
        q, seed = self._next_batch()
        src = sample_choices_kernel(q, tokens, cfg.preset.top_k, seed)
        x = np.ascontiguousarray(self.dispatch(src), dtype=float)
        rows = layer_times_kernel(
            x, src, self.node, self._cost_arr, cfg.internode_us_per_token,
            cfg.split == "node_first",
        )  # fmt: skip
        return src, rows

    def step(self, kv, requests, now_s: float) -> StepBreakdown:
        """Price one decode step: per-rank resident KV tokens ``kv`` and running
        ``requests`` (``(n_gpus,)`` each), at simulated time ``now_s`` (seconds)."""
        func = "StepModel.step"
        G = self.config.n_gpus
        kv = check_array(kv, "kv", func, ndim=1, shape=(G,), lo=0, hi=MAX_EXACT_INT)
        req = check_array(requests, "requests", func, kind="int", ndim=1, shape=(G,), lo=0)
        _check_step_choices(req, self.config.preset.top_k, func)
        now_s = check_real(now_s, "now_s", func)
        kv = np.ascontiguousarray(kv, dtype=float)
        req = np.ascontiguousarray(req, dtype=np.int64)
        return StepBreakdown(*map(float, self._price(kv, req, now_s)))

    def _price(self, kv: np.ndarray, req, now_s: float) -> np.ndarray:
        """Price and log one step; returns its log row (the ``StepBreakdown`` fields).

        A step is priced on the placement and tables in force at its start (one
        :func:`~straggler.sim.engine._deployment_kernels.deployment_step_kernel` call, or
        :meth:`_price_python`), then :meth:`_after_step` refreshes the tables and rebuilds
        the placement when due, for the steps after it."""
        cfg = self.config
        n = self.n_steps
        self._now_s = now_s
        if n == len(self._log):
            self._log = np.concatenate([self._log, np.zeros_like(self._log)])
        if not (cfg.moe and self.fused and cfg.dispatch in _FUSED):
            self._log[n] = self._price_python(kv, np.asarray(req, dtype=np.int64), now_s)
        else:
            q, seed = self._next_batch()
            static = self._static_gpu if cfg.dispatch == "static" else self._no_static
            deployment_step_kernel(
                q, seed, kv, req, cfg.preset.top_k, self.tables, static, self.node,
                self._cost_arr, self._par, self._window, n % self._wsize, self._acc,
                self._log, n,
            )  # fmt: skip
        if self.policy is not None:
            self._charge(n, now_s)
        self._after_step(now_s)
        self.n_steps = n + 1
        return self._log[n]

    def _price_python(self, kv: np.ndarray, req: np.ndarray, now_s: float) -> StepBreakdown:
        """One step in Python and numpy (see :attr:`fused`)."""
        cfg = self.config
        pre = cfg.preset
        att = pre.attention.time(kv, req)
        n_dense = pre.n_layers - pre.n_moe_layers
        dense = n_dense * pre.dense_ffn_us
        out = dict(
            attention_us=pre.n_layers * float(att.max()),
            attention_straggler_us=pre.n_layers * float(att.max() - att.mean()),
            moe_us=0.0, moe_straggler_us=0.0, comm_us=0.0, cross_node_tokens=0.0,
            balancedness=0.0, rebalance_us=0.0,
        )  # fmt: skip
        if cfg.moe:
            dense += pre.n_moe_layers * pre.shared_expert_us
            src, rows = self.moe_layers(req)
            scale = cfg.layer_scale
            out["moe_us"] = scale * float(rows[:, 0].sum())
            out["moe_straggler_us"] = scale * float((rows[:, 1] - rows[:, 2]).sum())
            out["comm_us"] = scale * float((rows[:, 3] + rows[:, 0] - rows[:, 1]).sum())
            out["cross_node_tokens"] = float(rows[:, 4].mean())
            mx = float(rows[:, 6].sum())
            out["balancedness"] = float(rows[:, 7].sum() / mx) if mx > 0 else 0.0
            self._observe(src.sum(axis=1))
        total = out["attention_us"] + out["moe_us"] + dense
        return StepBreakdown(dense_us=dense, total_us=total, **out)

    #: Whether a step with a table dispatch (``even``, ``tempo``, ``token_lp``, ``static``)
    #: runs as one ``straggler.sim.engine._deployment_kernels.deployment_step_kernel`` call
    #: (True) or step by step in Python (:meth:`moe_layers`, numpy, ``StepModel._observe``; the
    #: path per-batch dispatches take). Both give bit-identical results (tested); the
    #: Python path is kept for per-batch dispatches and for measuring the kernel against it.
    fused: bool = True

    def engine_step(self, load, nrun, now_s: float) -> float:
        """The MoE layers' time of one step of the simulator's engine, in seconds; the
        step's ``StepBreakdown`` (attention from the same loads) is logged
        (:meth:`breakdowns`). The engine has validated its state: no checks here."""
        row = self._price(np.asarray(load, dtype=float), nrun, now_s)
        return (row[2] + row[9]) * 1e-6

    def breakdowns(self) -> dict[str, np.ndarray]:
        """The logged steps' ``StepBreakdown`` fields, one ``(n_steps,)`` array each
        (microseconds; a copy)."""
        log = self._log[: self.n_steps]
        return {name: log[:, k].copy() for k, name in enumerate(STEP_COLUMNS)}

    @property
    def log(self) -> list[StepBreakdown]:
        """The logged steps, one ``StepBreakdown`` each (built on access)."""
        return [StepBreakdown(*map(float, r)) for r in self._log[: self.n_steps]]

    def summary(self) -> dict[str, float]:
        """The mean logged step decomposed (``StepBreakdown`` fields, microseconds per
        step; 0 before any step), and ``layers_simulated``, ``layer_scale``, ``placements``,
        ``table_refreshes``."""
        steps = self.breakdowns()
        out = {
            name: float(steps[name].mean()) if self.n_steps else 0.0
            for name in StepBreakdown._fields
        }
        cfg = self.config
        out["layers_simulated"] = cfg.n_sim_layers
        out["layer_scale"] = cfg.layer_scale
        out["placements"] = self.n_placements
        out["table_refreshes"] = self.n_refreshes
        if self.policy is not None:
            out.update({k: float(v) for k, v in self.totals.items()})
        return out

    def _observe(self, counts: np.ndarray) -> None:
        """Record a batch's counts (the window and the tables' accumulator)."""
        self._window[self.n_steps % self._wsize] = counts
        self._acc += counts

    def _after_step(self, now_s: float) -> None:
        """What follows a priced step whose counts are recorded: the tables' refresh and the
        placement's rebuild, each when due."""
        cfg = self.config
        self._acc_steps += 1
        if cfg.dispatch in _TABLE_METHODS and now_s - self._last_refresh >= cfg.dispatch_period_s:
            self._refresh()
            self._last_refresh = now_s
        done = self.n_steps + 1
        if self.policy is not None:
            self._rebalance_loop(done, now_s + self._log[self.n_steps, 6] * 1e-6)
        elif cfg.placement != "fixed" and done % cfg.placement_period == 0:
            self._rebalance(done)

    def _rebalance(self, done: int) -> None:
        """Rebuild the placement from the counts of the last ``placement_window`` steps (of
        the ``done`` so far): the one place the placement changes after the initial one. The
        change is instant and free here, taking effect from the next step (its tables reset
        to the even split); a cost of moving expert weights would be charged to the steps
        after it, where :meth:`_price` assembles a step."""
        cfg = self.config
        w = self._window[: min(done, cfg.placement_window)]
        self._set_placement(self._place(w.mean(axis=0), w))
        self._acc[:] = 0
        self._acc_steps = 0

    # --- rebalancing with a policy -------------------------------------------------------
    def _init_rebalance(self) -> None:
        """The state of a run with a rebalance policy (class notes)."""
        self.rebalances: list[dict] = []
        self._stall_us = 0.0  # charged to the next step
        self._move: dict | None = None  # a rearrangement under way
        self._rank_events = list(self.config.rank_events)
        self._due, self._period = None, 0
        if self.policy is not None:
            first, period = self.policy.schedule()
            self._due, self._period = (max(1, first), period) if period > 0 else (None, 0)
        self.totals = dict(
            rearrangements=0, copies=0.0, bytes_moved=0.0, stall_s=0.0, async_delay_s=0.0,
            planning_s=0.0,
        )  # fmt: skip

    def _history(self, done: int) -> np.ndarray:
        """The recorded window after ``done`` steps, oldest step first."""
        W = self._wsize
        if done <= W:
            return self._window[: max(done, 1)].copy()
        start = done % W
        return np.concatenate([self._window[start:], self._window[:start]])

    def _context(self, done: int, forced: bool) -> RebalanceContext:
        cfg = self.config
        n = self.n_steps + 1
        recent = self._log[max(0, n - 256) : n]
        return RebalanceContext(
            history=self._history(done), previous=self.physical_to_logical.copy(),
            num_replicas=self.physical_to_logical.shape[1], num_groups=self._groups(),
            num_nodes=cfg.n_nodes, num_gpus=cfg.n_gpus, cost=cfg.cost, move=cfg.move,
            layer_scale=cfg.layer_scale, active=self.active.copy(),
            step_s=float(recent[:, 6].mean()) * 1e-6 if n else None,
            comm_s=float(recent[:, 4].mean()) * 1e-6 if n else None, forced=forced,
        )  # fmt: skip

    def _rebalance_loop(self, done: int, end_s: float) -> None:
        """After ``done`` steps, the last ending at ``end_s``: rank events, a synchronous
        move whose plan is ready, the policy's clock."""
        changed = False
        while self._rank_events and self._rank_events[0][0] <= done:
            _, rank, up = self._rank_events.pop(0)
            changed |= bool(self.active[rank] != up)
            self.active[rank] = up
        if changed:
            self._move = None  # a rearrangement under way is dropped
            plan = self.policy.plan(self._context(done, True))
            if plan is None:  # the lost rank's slots emptied, nothing to plan
                self._rearrange(self.physical_to_logical, end_s, done, True, {}, 0.0)
            else:
                self._rearrange(plan.physical_to_logical, end_s, done, True, plan.detail,
                                plan.planning_s)  # fmt: skip
            return
        mv = self._move
        if mv is not None and mv["kind"] == "sync" and end_s >= mv["ready_s"]:
            self._move = None
            self._stall_us += mv["stall_s"] * 1e6
            self._set_placement(mv["new"])
            mv["event"]["applied_step"] = done
        if self._due is None or done < self._due:
            return
        if self._move is not None:  # vLLM: the next rearrangement waits for this one
            self._due = done + 1
            return
        self._due = done + self._period
        plan = self.policy.plan(self._context(done, False))
        if plan is not None:
            self._rearrange(plan.physical_to_logical, end_s, done, False, plan.detail,
                            plan.planning_s)  # fmt: skip

    def _rearrange(self, new, end_s: float, done: int, forced: bool, detail: dict,
                   planning_s: float | None = None) -> None:  # fmt: skip
        """Start a rearrangement to ``new`` decided after ``done`` steps (class notes)."""
        cfg = self.config
        move = cfg.move
        G = cfg.n_gpus
        per = self.physical_to_logical.shape[1] // G
        old = self.physical_to_logical
        new = np.array(new, dtype=np.int64)
        for r in np.flatnonzero(~self.active):
            new[:, r * per : (r + 1) * per] = -1
        L = old.shape[0]
        tr = [_transfer(_batches(old[l], new[l], G, self.active), G, self.node, move)
              for l in range(L)]  # fmt: skip
        if np.array_equal(new, old):
            return
        scale = cfg.layer_scale
        planning = (
            self.policy.planning_s_per_layer * cfg.preset.n_moe_layers
            if planning_s is None else planning_s
        )  # fmt: skip
        event = dict(
            step=done, time_s=end_s, policy=self.policy.label, forced=forced,
            copies=scale * sum(t.copies for t in tr), bytes=scale * sum(t.bytes for t in tr),
            planning_s=planning, stall_s=0.0, delay_s=0.0, applied_step=None, **detail,
        )  # fmt: skip
        self.rebalances.append(event)
        tot = self.totals
        tot["rearrangements"] += 1
        tot["copies"] += event["copies"]
        tot["bytes_moved"] += event["bytes"]
        tot["planning_s"] += planning
        if forced or move.mode == "sync":
            copy_s = scale * sum(t.seconds for t in tr)
            if forced or not self.policy.offloaded:  # planned on the critical path
                event["stall_s"] = planning + copy_s
                tot["stall_s"] += planning + copy_s
                self._stall_us += (planning + copy_s) * 1e6
                self._set_placement(new)
                event["applied_step"] = done
            else:  # planned beside serving, then every rank stops for the copies
                event["stall_s"] = copy_s
                tot["stall_s"] += copy_s
                self._move = dict(kind="sync", ready_s=end_s + planning, new=new,
                                  stall_s=copy_s, event=event)  # fmt: skip
            return
        batched = move.mode == "batched"
        n_moe = cfg.preset.n_moe_layers
        self._move = dict(
            kind="async", ready_s=end_s + planning, new=new, event=event, cursor=0,
            remaining=None,
            layer_of=[min(L - 1, j * L // n_moe) for j in range(n_moe)],
            copy_us=[(t.batched_seconds if batched else t.seconds) * 1e6 for t in tr],
            peers=[1 if batched else max(1, t.peers) for t in tr],
        )  # fmt: skip

    def _charge(self, n: int, now_s: float) -> None:
        """Add to step ``n`` (priced, starting at ``now_s``) what rearranging costs it: a
        pending synchronous stall, or the asynchronous copies' delay (class notes); apply a
        layer whose copies landed, from the next step."""
        row = self._log[n]
        extra = self._stall_us
        self._stall_us = 0.0
        mv = self._move
        if mv is not None and mv["kind"] == "async" and now_s >= mv["ready_s"]:
            j = mv["cursor"]
            l = mv["layer_of"][j]
            left = mv["copy_us"][l] if mv["remaining"] is None else mv["remaining"]
            comm = row[4]
            idle = max(0.0, row[6] - comm)
            delay = 0.0 if left <= idle else min(mv["peers"][l] * comm, left - idle)
            left = max(0.0, left - idle - delay)
            extra += delay
            mv["event"]["delay_s"] += delay * 1e-6
            self.totals["async_delay_s"] += delay * 1e-6
            if left > 0.0:
                mv["remaining"] = left
            else:
                mv["remaining"] = None
                mv["cursor"] = j + 1
                last = j + 1 == len(mv["layer_of"])
                if last or mv["layer_of"][j + 1] != l:
                    p2l = self.physical_to_logical.copy()
                    p2l[l] = mv["new"][l]
                    self._set_placement(p2l)
                if last:
                    mv["event"]["applied_step"] = n + 1
                    self._move = None
        row[9] += extra
        row[6] += extra


def full_batch_step(model: StepModel, max_slots: int) -> tuple[float, float]:
    """The linear step ``(t0, kappa)`` (seconds, seconds per KV token of the busiest rank)
    the simulator measures a deployment's offered load against: ``t0`` the mean of 8 steps of
    a copy of ``model`` with ``max_slots`` requests on every rank and no KV (attention's fixed
    and per-request parts, the MoE layers of a full batch, the dense layers), ``kappa =
    n_layers * b`` (``model`` itself is not stepped).

    Examples
    --------
    >>> m = StepModel(DeploymentConfig(preset="dsv3", n_gpus=4, layers=1, moe=False))
    >>> t0, kappa = full_batch_step(m, 8)
    >>> m.n_steps, round(t0 * 1e6, 6), round(kappa * 1e9, 3)
    (0, 4376.86, 25.62)
    """
    cfg = model.config
    probe = copy.deepcopy(model)
    full = np.full(cfg.n_gpus, int(max_slots))
    t0 = float(np.mean([probe.step(full * 0, full, 0.0).total_us for _ in range(8)])) * 1e-6
    return t0, cfg.preset.n_layers * cfg.preset.attention.b * 1e-6


#: Step models the simulator's engine is running, by key (see :func:`engine_moe_seconds`).
_ACTIVE: dict[int, StepModel] = {}


@contextlib.contextmanager
def running_step_model(model: StepModel | None):
    """Register ``model`` for the engine's steps while the block runs; yields its key (the
    engine's ``EngineInputs.moe_key``; -1 for None, no MoE term)."""
    if model is None:
        yield -1
        return
    key = max(_ACTIVE, default=-1) + 1
    _ACTIVE[key] = model
    try:
        yield key
    finally:
        del _ACTIVE[key]


def engine_moe_seconds(key: int, load, nrun, clock: float) -> float:
    """Called by the engine's step (in object mode) to price the MoE layers of a step:
    :meth:`StepModel.engine_step` of the model registered under ``key``."""
    return _ACTIVE[int(key)].engine_step(load, nrun, float(clock))


@dataclass(frozen=True)
class DeploymentRun:
    """Per-step breakdowns of :func:`simulate_steps`: one array per
    ``StepBreakdown`` field (``(n_steps,)``, microseconds), and the step start times."""

    time_s: np.ndarray
    steps: dict
    n_placements: int
    n_refreshes: int

    def total(self, name: str) -> float:
        """Sum of one field over the run (us)."""
        return float(self.steps[name].sum())


def simulate_steps(config: DeploymentConfig, kv, requests) -> DeploymentRun:
    """Run a :class:`StepModel` over given per-rank states, the clock advancing by each step.

    Parameters
    ----------
    config : DeploymentConfig
    kv, requests : array_like, shape (n_steps, n_gpus)
        Resident KV tokens (at most ``2**53``) and running requests of every rank at every
        step (at most :data:`MAX_STEP_CHOICES` over ``top_k`` in all per step).

    Returns
    -------
    DeploymentRun

    Examples
    --------
    >>> cfg = DeploymentConfig(preset="dsv3", n_gpus=4, layers=1, seed=0)
    >>> run = simulate_steps(cfg, np.full((3, 4), 4000), np.full((3, 4), 8))
    >>> run.steps["total_us"].shape, bool((run.steps["moe_us"] > 0).all())
    ((3,), True)
    """
    func = "simulate_steps"
    check_type(config, "config", func, DeploymentConfig, "a DeploymentConfig")
    G = config.n_gpus
    kv = check_array(kv, "kv", func, ndim=2, shape=(None, G), lo=0, hi=MAX_EXACT_INT)
    req = check_array(requests, "requests", func, kind="int", ndim=2, shape=(None, G), lo=0)
    if kv.shape != req.shape:
        raise param_error(
            "requests", func, f"an array of the shape of 'kv' {kv.shape}", describe(requests)
        )
    _check_step_choices(req, config.preset.top_k, func)
    model = StepModel(config)
    rows = []
    t = np.empty(kv.shape[0])
    now = 0.0
    for k in range(kv.shape[0]):
        t[k] = now
        s = model.step(kv[k], req[k], now)
        rows.append(s)
        now += s.total_us * 1e-6
    steps = {
        name: np.array([getattr(r, name) for r in rows], dtype=float)
        for name in StepBreakdown._fields
    }
    return DeploymentRun(t, steps, model.n_placements, model.n_refreshes)
