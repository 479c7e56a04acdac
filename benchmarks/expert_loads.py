"""Dispatch layers from recorded expert loads and at wide EP, for the benchmarks.

Two sources of real routing (``../shared/data/expert_loads/``, README there):

* Mixtral-8x7B (base and Instruct, top-2): total expert popularity per layer over the prefill
  of one MMLU subject (efeslab/fiddler, Apache-2.0). A batch is sampled from a layer's
  popularity (:func:`~straggler.sim.workloads.batches.sample_counts`: a Dirichlet-perturbed
  popularity, then ``top_k`` distinct experts per token).
* DeepSeek-V2-Lite (ESFT-vanilla-lite, 64 routed experts, top-6): expert counts of every
  recorded sequence and MoE layer (deepseek-ai/ESFT, MIT). Batched as an engine would:
  a *prefill* batch packs whole recorded sequences (drawn with replacement from the task's
  pool) until the GPUs' token budget is full, and its counts are the sum of theirs, exactly
  as recorded; a *decode* batch holds ``B`` running sequences per GPU, each adding one token
  routed to ``top_k`` distinct experts drawn from that sequence's own recorded expert
  frequencies (the exponential race of ``sample_counts``, without the Dirichlet step).

A layer is placed from a window of ``WINDOW`` earlier batches of the same source and kind
(its mean for DeepSeek's EPLB, ``rebalance_experts(..., distinct=True)``, hierarchical over
the nodes; the window itself for :func:`~straggler.solvers.placement.place_experts`), then one
more batch is the layer to dispatch.

Wide-EP layers use generated popularity (Zipf, :func:`zipf_popularity`) for DeepSeek-V3
(256 experts, top-8, 8 groups) and a 384-expert top-8 model (Kimi-K2's shape, no groups).

Each generator yields ``(params, problem, cost_name)`` deterministically from its seeds.
"""

from __future__ import annotations

import functools
import itertools
import json
import pathlib

import numpy as np
from straggler.formulations import PRESETS, DispatchProblem
from straggler.sim.workloads.batches import DEFAULT_KAPPA, sample_counts, zipf_popularity
from straggler.solvers.placement.eplb import rebalance_experts
from straggler.solvers.placement.place import place_experts

#: The recorded loads (the repository's ``../shared/data/expert_loads``).
LOADS = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data" / "expert_loads"
COSTS = tuple(sorted(PRESETS))
#: Token-expert draws up to which a batch is sampled token by token (:func:`routed_batch`).
SAMPLED = 1 << 22
#: Batches in the window a placement is made from.
WINDOW = 16
#: EP widths: (GPUs, nodes); EP32 spans 4 nodes of 8, EP72 is one NVL72 domain.
WIDTHS = ((8, 1), (32, 4), (72, 1), (128, 16), (256, 32))
#: Wide-EP shapes: (experts, top_k, groups).
WIDE_SHAPES = {"dsv3": (256, 8, 8), "k2_384": (384, 8, 1)}


@functools.cache
def mixtral_popularity(variant: str, subject: str) -> np.ndarray:
    """``(32, 8)`` expert popularity of Mixtral-8x7B ``variant`` (``"instruct"`` or
    ``"original"``) on one MMLU subject, normalized per layer."""
    path = LOADS / "fiddler_mixtral8x7b_popularity"
    data = json.loads(
        (path / f"mixtral_8x7b_{variant}__expert_popularity_{subject}.json").read_text()
    )
    pop = np.asarray(data["expert_popularity"], dtype=float)
    return pop / pop.sum(axis=1, keepdims=True)


def mixtral_subjects() -> list[str]:
    names = sorted((LOADS / "fiddler_mixtral8x7b_popularity").glob("mixtral_8x7b_instruct__*.json"))
    return [p.name.split("expert_popularity_", 1)[1][: -len(".json")] for p in names]


@functools.cache
def esft_sequences(task: str) -> tuple[np.ndarray, np.ndarray]:
    """``(counts (n_seq, 26, 64), tokens (n_seq,))`` of the recorded ESFT ``task``."""
    with np.load(LOADS / "esft_per_sequence_counts.npz") as d:
        return d[f"{task}_counts"].astype(np.int64), d[f"{task}_tokens_per_seq"].astype(np.int64)


def esft_prefill_batch(task: str, layer: int, n_tokens: int, rng) -> np.ndarray:
    """Whole recorded sequences (with replacement) packed until ``n_tokens`` tokens: the
    sum of their recorded counts at ``layer`` (the last sequence is the one that fills the
    budget; it is kept whole, as a scheduler admits a prompt whole)."""
    counts, tokens = esft_sequences(task)
    seq = np.empty(0, np.int64)
    while tokens[seq].sum() < n_tokens:  # draw enough sequences, then keep the prefix
        more = n_tokens // int(tokens.min()) + 1
        seq = np.concatenate([seq, rng.integers(len(tokens), size=more)])
    n_seq = int(np.searchsorted(np.cumsum(tokens[seq]), n_tokens)) + 1
    return counts[seq[:n_seq], layer].sum(axis=0)


def esft_decode_batch(task: str, layer: int, n_running: int, rng, top_k: int = 6) -> np.ndarray:
    """One decode step of ``n_running`` recorded sequences (drawn with replacement): each
    token picks ``top_k`` distinct experts with probability proportional to its sequence's
    recorded counts at ``layer`` (exponential race)."""
    counts, _ = esft_sequences(task)
    seq = rng.integers(len(counts), size=n_running)
    freq = counts[seq, layer].astype(float)
    inv = np.where(freq > 0, 1.0 / np.where(freq > 0, freq, 1.0), np.inf)
    keys = rng.standard_exponential(freq.shape) * inv
    chosen = np.argpartition(keys, top_k - 1, axis=1)[:, :top_k]
    return np.bincount(chosen.ravel(), minlength=counts.shape[2]).astype(np.int64)


def routed_batch(pop: np.ndarray, n_tokens: int, top_k: int, rng) -> np.ndarray:
    """One batch routed from popularity ``pop``: :func:`sample_counts` (``top_k`` distinct
    experts per token) up to ``SAMPLED`` token-expert draws, beyond that the same
    Dirichlet-perturbed popularity with the ``n_tokens * top_k`` assignments drawn as one
    multinomial (distinctness is immaterial when every expert's share of a token's ``top_k``
    picks is small, and the exact race costs ``n_tokens * n_experts`` draws)."""
    if n_tokens * pop.size <= SAMPLED:
        return sample_counts(pop, n_tokens=n_tokens, top_k=top_k, rng=rng)
    live = pop > 0
    q = np.zeros(pop.size)
    q[live] = rng.dirichlet(DEFAULT_KAPPA * pop[live] / pop.sum())
    return rng.multinomial(n_tokens * top_k, q / q.sum()).astype(np.int64)


def _slots(E: int, g: int, replication: float) -> int:
    """Physical slots: ``ceil(replication * E)`` rounded up to a multiple of ``g`` (and at
    least one slot per GPU)."""
    need = max(g, int(np.ceil(replication * E - 1e-9)))
    return g * -(-need // g)


def place(history: np.ndarray, P: int, g: int, nodes: int, groups: int, how: str):
    """``physical_to_logical (P,)`` of one layer from ``history (WINDOW, E)``: DeepSeek's EPLB
    (``"eplb"``, on the window's mean; no two replicas of an expert on one GPU where the
    layout allows it, ``rebalance_experts``' ``distinct`` condition, upstream's packing
    otherwise) or ``place_experts`` (``"place"``, the default greedy)."""
    E = history.shape[1]
    if groups > 1 and (E % groups or groups % nodes):
        groups = 1
    if how == "eplb":
        distinct = P // nodes <= (E // nodes) * (g // nodes)
        p2l, _, _ = rebalance_experts(history.mean(axis=0)[None], P, groups, nodes, g,
                                      distinct=distinct)  # fmt: skip
        return p2l[0]
    p2l, _, _ = place_experts(history[:, None, :], P, groups, nodes, g)
    return p2l[0]


def _layer(batches, P, g, nodes, groups, how) -> DispatchProblem:
    """Place from the first ``WINDOW`` batches, dispatch the last."""
    hist = np.stack(batches[:-1]).astype(float)
    p2l = place(hist, P, g, nodes, groups, how)
    node = np.arange(g) // (g // nodes)
    return DispatchProblem.from_placement(batches[-1], p2l, g, gpu_node=node)


def real_layers(heldout: bool = False, full: bool = False, every: int = 1):
    """Recorded-load layers (module notes): Mixtral (E = 8) at EP8 and EP32 and
    DeepSeek-V2-Lite (E = 64) at EP8, 32, 72, 128, 256, decode and prefill batch sizes,
    EPLB and ``place_experts`` placements, every cost preset in turn.

    The held-out part uses the Mixtral base model (Instruct otherwise), the ESFT tasks
    ``summary`` and ``translation`` (``intent`` and ``law`` otherwise), other batch sizes and
    another seed range. ``every``: only every ``every``-th layer of the grid is built (the
    others' seeds are skipped, so a layer is the same whatever ``every``)."""
    subjects = mixtral_subjects()
    variant = "original" if heldout else "instruct"
    tasks = ("summary", "translation") if heldout else ("intent", "law")
    decode = (24, 96) if heldout else (16, 64, 256)
    prefill = (3072,) if heldout else (2048, 8192)
    seed0 = 70_000 if heldout else 60_000
    grid = []
    for (g, nodes), how in itertools.product(WIDTHS, ("eplb", "place")):
        kinds = [("decode", B) for B in decode] + [("prefill", B) for B in prefill]
        if g <= 32:  # Mixtral's 8 experts: EP8 with 2 slots per GPU, EP32 with 2 per GPU
            for kind, B in kinds:
                grid.append(("mixtral", g, nodes, how, kind, B, 2.0 if g == 8 else 8.0))
        rep = {8: 1.25, 32: 1.5, 72: 2.0, 128: 2.0, 256: 4.0}[g]
        for kind, B in kinds:
            grid.append(("esft", g, nodes, how, kind, B, rep))
    if not full:
        grid = grid[:: 2 if heldout else 1]
    for i, (src, g, nodes, how, kind, B, rep) in enumerate(grid):
        if i % every:
            continue
        rng = np.random.default_rng([seed0, i])
        cname = COSTS[i % len(COSTS)]
        if src == "mixtral":
            subject = subjects[i % len(subjects)]
            layer = int(rng.integers(32))
            pop = mixtral_popularity(variant, subject)[layer]
            n_tok = B * g
            batches = [routed_batch(pop, n_tok, 2, rng) for _ in range(WINDOW + 1)]
            E, groups, what = 8, 1, subject
        else:
            task = tasks[i % len(tasks)]
            layer = int(rng.integers(26))
            if kind == "decode":
                batches = [esft_decode_batch(task, layer, B * g, rng) for _ in range(WINDOW + 1)]
            else:
                batches = [esft_prefill_batch(task, layer, B * g, rng) for _ in range(WINDOW + 1)]
            E, groups, what = 64, 1, task
        P = _slots(E, g, rep)
        prob = _layer(batches, P, g, nodes, groups, how)
        yield (
            dict(
                i=i,
                source=src,
                data=what,
                layer=layer,
                E=E,
                g=g,
                nodes=nodes,
                slots=P,
                placement=how,
                kind=kind,
                tokens_per_gpu=B,
            ),  # fmt: skip
            prob,
            cname,
        )


def wide_layers(heldout: bool = False, full: bool = False, widths=None, every: int = 1):
    """Wide-EP layers (module notes): DeepSeek-V3 and a 384-expert model at EP32 (4 nodes),
    72, 128 and 256, EPLB and ``place_experts``, decode and prefill batch sizes, Zipf
    popularity (skew 0.85 or 0.3), every cost preset in turn; held out: other batch sizes,
    skew 0.6 and another seed range; ``every`` as in :func:`real_layers`."""
    widths = [w for w in WIDTHS if w[0] >= 32] if widths is None else widths
    decode = (24, 96) if heldout else (16, 64, 128)
    prefill = (3072,) if heldout else (2048,)
    skews = (0.6,) if heldout else (0.85, 0.3)
    seed0 = 90_000 if heldout else 80_000
    grid = []
    for shape, (g, nodes), how in itertools.product(WIDE_SHAPES, widths, ("eplb", "place")):
        for kind, B in [("decode", B) for B in decode] + [("prefill", B) for B in prefill]:
            grid.append((shape, g, nodes, how, kind, B))
    if not full:
        grid = grid[:: 2 if heldout else 1]
    for i, (shape, g, nodes, how, kind, B) in enumerate(grid):
        if i % every:
            continue
        rng = np.random.default_rng([seed0, i])
        E, k, groups = WIDE_SHAPES[shape]
        skew = skews[i % len(skews)]
        pop = zipf_popularity(E, skew, rng=rng)[0]
        batches = [routed_batch(pop, B * g, k, rng) for _ in range(WINDOW + 1)]
        # about one extra slot per GPU at EP32, two-ish slots per GPU beyond
        P = _slots(E, g, {32: 1.125, 72: 1.125, 128: 1.5, 256: 2.0}.get(g, 1.25))
        prob = _layer(batches, P, g, nodes, groups, how)
        yield (
            dict(
                i=i,
                shape=shape,
                E=E,
                g=g,
                nodes=nodes,
                slots=P,
                placement=how,
                kind=kind,
                tokens_per_gpu=B,
                skew=skew,
            ),  # fmt: skip
            prob,
            COSTS[i % len(COSTS)],
        )
