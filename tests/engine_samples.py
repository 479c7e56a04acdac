"""Write the sample recordings shipped in ``runtime/samples`` from the real expert loads in
``../shared/data/expert_loads`` (DeepSeek-V2-Lite, ESFT per-sequence counts, MIT).

One recording, three engine formats: 32 of the 213 ESFT sequences (seeded shuffle of the four
tasks pooled) served as 16 steps of 2 data-parallel ranks, one sequence per rank per step; each
step's loads are ``[26 MoE layers, 64 experts]`` (top-6). Written as

* ``sglang/``: a stat-mode recorder dump (``logical_count [16, 27, 64]`` int32, the ranks
  summed, as SGLang all-reduces it; one row per hidden layer as SGLang records DeepSeek
  models, the dense layer 0 all zero; ``torch.save``, so reading it needs torch);
* ``vllm/``: each rank's ``EplbState`` as JSON (``expert_load_window [16, 26, 64]``, the
  identity placement of 64 slots, window full; ``logical_to_physical_map``, 1,024 columns of
  padding, left out: the reader rebuilds the maps from ``physical_to_logical_map``);
* ``trtllm/``: ``meta_info.json`` and ``rank{r}.safetensors`` (keys ``"{iter}_{layer}"``,
  iterations 100-115, MoE layers 1-26 of the model; reading it needs safetensors).

Run ``python tests/engine_samples.py OUT`` (``OUT`` defaults to ``runtime/samples``);
``tests/test_engine_samples.py`` regenerates them into a temporary folder and compares.
"""

import argparse
import pathlib
import shutil
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / ".." / "shared" / "data" / "expert_loads" / "esft_per_sequence_counts.npz"
TASKS = ("intent", "law", "summary", "translation")
N_STEPS, N_RANKS, TOP_K = 16, 2, 6
TIMESTAMP = 1767225600.0  # the file name's time stamp: fixed, so the files are reproducible


def rank_counts(source=SOURCE) -> np.ndarray:
    """``[N_RANKS, N_STEPS, 26, 64]`` int64: the sequence each rank served at each step."""
    z = np.load(source)
    seqs = np.concatenate([z[f"{t}_counts"] for t in TASKS]).astype(np.int64)
    order = np.random.default_rng(0).permutation(len(seqs))[: N_STEPS * N_RANKS]
    return seqs[order].reshape(N_STEPS, N_RANKS, *seqs.shape[1:]).transpose(1, 0, 2, 3)


def write(out, source=SOURCE) -> dict:
    """Write the three samples under ``out``; returns ``{engine: folder}``."""
    from straggler.runtime.engines import (
        vllm_maps,
        write_sglang_stat_dump,
        write_trtllm_statistics,
        write_vllm_state,
    )

    out = pathlib.Path(out)
    counts = rank_counts(source)
    n_experts = counts.shape[-1]
    folders = {e: out / e for e in ("sglang", "vllm", "trtllm")}
    for d in folders.values():
        shutil.rmtree(d, ignore_errors=True)
    # SGLang's recorder has a row per hidden layer of a DeepSeek model: layer 0 is dense
    summed = counts.sum(0)
    per_hidden_layer = np.concatenate([np.zeros_like(summed[:, :1]), summed], axis=1)
    write_sglang_stat_dump(folders["sglang"], per_hidden_layer, timestamp=TIMESTAMP)
    identity = np.tile(np.arange(n_experts), (counts.shape[2], 1))
    for r in range(N_RANKS):
        state = dict(vllm_maps(identity, n_experts))
        del state["logical_to_physical_map"]
        state["expert_load_window"] = counts[r]
        state["expert_load_window_step"] = 0
        state["rank"] = r
        write_vllm_state(folders["vllm"] / f"eplb_m0_rank{r}.json", state)
    write_trtllm_statistics(
        folders["trtllm"],
        counts,
        layer_ids=range(1, 1 + counts.shape[2]),
        iter_ids=range(100, 100 + N_STEPS),
        top_k=TOP_K,
    )
    return folders


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=str(ROOT / "runtime" / "samples"))
    args = ap.parse_args()
    if not SOURCE.exists():
        sys.exit(f"engine_samples: {SOURCE} is missing")
    for engine, folder in write(args.out).items():
        print(engine, sorted(p.name for p in folder.iterdir()))
