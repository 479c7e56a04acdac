"""Synthetic engine recordings and hypothesis strategies for the engine-file tests.

:func:`synthetic_recording` routes decode tokens the way an EP deployment records them:
per pass and per rank, each of ``tokens_per_gpu`` tokens picks ``top_k`` distinct logical
experts (Zipf popularity fluctuating from pass to pass, as :mod:`straggler.sim.workload`
draws it), each choice then goes to a uniformly random replica of the expert (SGLang's
``dynamic`` dispatch), giving the physical slot ids the engines count. The placement is
EPLB's on the long-run popularity, optionally changed halfway (an EPLB rebalance inside
the recording). Everything the writers of :mod:`straggler.runtime.engines` need, and the
logical counts a reader must recover.

:func:`malformed_arrays` draws values a field must refuse (wrong rank, wrong length,
negative, fractional, NaN, strings, ragged lists, None).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..sim.workload import zipf_popularity
from ..solvers.eplb import rebalance_experts

__all__ = [
    "synthetic_recording",
    "malformed_arrays",
    "file_bytes_mutations",
    "DEMO",
    "write_demo_dumps",
]


def _route(q, n_tokens, top_k, gen):
    """``top_k`` distinct experts per token, proportional to ``q`` (the exponential race)."""
    keys = gen.exponential(size=(n_tokens, q.size)) / np.maximum(q, 1e-300)
    return np.argsort(keys, axis=1, kind="stable")[:, :top_k]


def synthetic_recording(
    *,
    n_layers: int = 3,
    n_experts: int = 16,
    n_gpus: int = 4,
    n_slots: int = 20,
    tokens_per_gpu: int = 8,
    top_k: int = 2,
    n_passes: int = 6,
    skew: float = 0.85,
    kappa: float = 200.0,
    rebalance_at: int | None = None,
    seed: int = 0,
) -> dict:
    """A recording of ``n_passes`` forward passes on ``n_gpus`` ranks.

    Returns
    -------
    dict with
        ``maps`` : list of ``(first_pass, physical_to_logical [L, P])`` (one, or two with
        ``rebalance_at``); ``logical_ids[pass][rank]`` : ``[L, tokens, top_k]``;
        ``physical_ids[pass][rank]`` : the same as slot ids; ``logical_counts`` :
        ``[n_passes, L, E]`` (summed over ranks); ``physical_counts`` : ``[n_ranks,
        n_passes, L, P]``; ``rank_logical_counts`` : ``[n_ranks, n_passes, L, E]``; and
        the sizes.
    """
    gen = np.random.default_rng(seed)
    pop = zipf_popularity(n_experts, skew, n_layers=n_layers, rng=gen)
    mean_load = pop * tokens_per_gpu * n_gpus * top_k
    p2l, _, _ = rebalance_experts(mean_load, n_slots, 1, 1, n_gpus)
    maps = [(0, p2l)]
    if rebalance_at is not None:
        shifted = np.roll(mean_load, 1, axis=1)  # a drifted load: a different placement
        p2l_b, _, _ = rebalance_experts(shifted, n_slots, 1, 1, n_gpus)
        maps.append((rebalance_at, p2l_b))
    L, E, P, G = n_layers, n_experts, n_slots, n_gpus
    logical_ids, physical_ids = [], []
    logical = np.zeros((n_passes, L, E), dtype=np.int64)
    physical = np.zeros((G, n_passes, L, P), dtype=np.int64)
    rank_logical = np.zeros((G, n_passes, L, E), dtype=np.int64)
    for f in range(n_passes):
        m = [mp for start, mp in maps if start <= f][-1]
        q = np.stack([gen.dirichlet(kappa * pop[l] + 1e-9) for l in range(L)])
        per_rank_l, per_rank_p = [], []
        for r in range(G):
            lid = np.stack([_route(q[l], tokens_per_gpu, top_k, gen) for l in range(L)])
            pid = np.empty_like(lid)
            for l in range(L):
                for e in range(E):
                    slots = np.flatnonzero(m[l] == e)
                    hit = lid[l] == e
                    pid[l][hit] = gen.choice(slots, size=int(hit.sum()))
                logical[f, l] += np.bincount(lid[l].ravel(), minlength=E)
                rank_logical[r, f, l] = np.bincount(lid[l].ravel(), minlength=E)
                physical[r, f, l] = np.bincount(pid[l].ravel(), minlength=P)
            per_rank_l.append(lid)
            per_rank_p.append(pid)
        logical_ids.append(per_rank_l)
        physical_ids.append(per_rank_p)
    return {
        "maps": maps,
        "logical_ids": logical_ids,
        "physical_ids": physical_ids,
        "logical_counts": logical,
        "physical_counts": physical,
        "rank_logical_counts": rank_logical,
        "n_layers": L,
        "n_experts": E,
        "n_gpus": G,
        "n_slots": P,
        "top_k": top_k,
        "n_passes": n_passes,
    }


@st.composite
def malformed_arrays(draw, shape: tuple[int, ...], *, fixed_dims=None):
    """A value that is not a non-negative integer array of ``shape``.

    ``fixed_dims``: the axes whose length the reader can check (default: all); a wrong
    length is drawn only on those (a window's length, say, is free)."""
    dims = list(range(len(shape))) if fixed_dims is None else list(fixed_dims)
    kinds = ["rank", "negative", "fraction", "nan", "string", "ragged", "none", "bool"]
    kind = draw(st.sampled_from(kinds + (["length"] if dims else [])))
    base = np.ones(shape, dtype=np.int64)
    if kind == "rank":
        return base.reshape(-1) if len(shape) > 1 else base[None, None]
    if kind == "length":
        bad = list(shape)
        i = draw(st.sampled_from(dims))
        bad[i] += draw(st.sampled_from([-1, 1, 3])) if bad[i] > 1 else 2
        return np.ones(tuple(bad), dtype=np.int64)
    if kind == "negative":
        out = base.copy()
        out.flat[draw(st.integers(0, out.size - 1))] = -5
        return out
    if kind == "fraction":
        return base * 0.5
    if kind == "nan":
        out = base.astype(float)
        out.flat[0] = np.nan
        return out
    if kind == "string":
        return "not an array"
    if kind == "ragged":
        return [[1, 2], [3]]
    if kind == "bool":
        return np.ones(shape, dtype=bool)
    return None


@st.composite
def file_bytes_mutations(draw, data: bytes):
    """Bytes of a damaged file: truncated, a span overwritten, or random."""
    how = draw(st.sampled_from(["truncate", "overwrite", "random", "empty"]))
    if how == "truncate" and len(data) > 1:
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "overwrite" and data:
        i = draw(st.integers(0, len(data) - 1))
        junk = draw(st.binary(min_size=1, max_size=16))
        return data[:i] + junk + data[i + len(junk) :]
    if how == "random":
        return draw(st.binary(max_size=256))
    return b""


#: The recording of the README's "From your engine's logs" demo (and tests/test_plan.py):
#: 16 decode passes of a 64-expert, top-8 model on 8 GPUs, 4 MoE layers, 80 slots.
DEMO = dict(
    n_layers=4,
    n_experts=64,
    n_gpus=8,
    n_slots=80,
    tokens_per_gpu=32,
    top_k=8,
    n_passes=16,
    skew=0.85,
    kappa=200.0,
    seed=7,
)


def write_demo_dumps(directory, *, engines=("sglang", "vllm", "trtllm"), **overrides) -> dict:
    """Write one :func:`synthetic_recording` as each engine records it, under ``directory``:
    ``sglang/`` (per-pass recorder dumps, one per rank; needs torch), ``vllm/`` (each
    rank's ``EplbState`` as JSON, loads in the current layout) and ``trtllm/``
    (``meta_info.json`` + ``rank*.safetensors``; needs safetensors). Returns ``{engine:
    path}`` and the recording under ``"recording"``."""
    import os

    from ..runtime.engines import (
        vllm_maps,
        write_sglang_detail_dump,
        write_trtllm_statistics,
        write_vllm_state,
    )

    rec = synthetic_recording(**(DEMO | overrides))
    G, F = rec["n_gpus"], rec["n_passes"]
    p2l = rec["maps"][-1][1]
    out = {"recording": rec}
    if "sglang" in engines:
        d = os.path.join(directory, "sglang")
        for r in range(G):
            records = [
                {"forward_pass_id": f, "global_physical_count": rec["physical_counts"][r, f]}
                for f in range(F)
            ]
            write_sglang_detail_dump(d, records, p2l, rank=r, timestamp=1.7e9 + r / 1000)
        out["sglang"] = d
    if "vllm" in engines:
        d = os.path.join(directory, "vllm")
        for r in range(G):
            state = dict(vllm_maps(p2l, rec["n_experts"]))
            state["expert_load_window"] = rec["physical_counts"][r]
            state["expert_load_window_step"] = 0
            write_vllm_state(os.path.join(d, f"eplb_state_rank{r}.json"), state)
        out["vllm"] = d
    if "trtllm" in engines:
        d = os.path.join(directory, "trtllm")
        write_trtllm_statistics(
            d,
            rec["rank_logical_counts"],
            layer_ids=range(3, 3 + rec["n_layers"]),
            iter_ids=range(100, 100 + F),
            top_k=rec["top_k"],
        )
        out["trtllm"] = d
    return out
