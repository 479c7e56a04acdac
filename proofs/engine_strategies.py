"""Synthetic engine recordings and hypothesis strategies for the engine-file tests.

:func:`synthetic_recording` routes decode tokens the way an EP deployment records them:
per pass and per rank, each of ``tokens_per_gpu`` tokens picks ``top_k`` distinct logical
experts (Zipf popularity fluctuating from pass to pass, as :mod:`straggler.sim.workloads.batches`
draws it), each choice then goes to a uniformly random replica of the expert (SGLang's
``dynamic`` dispatch), giving the physical slot ids the engines count. The placement is
EPLB's on the long-run popularity, optionally changed halfway (an EPLB rebalance inside
the recording). Everything the writers of :mod:`straggler.runtime.engines` need, and the
logical counts a reader must recover.

:func:`malformed_arrays` draws values a field must refuse (wrong rank, wrong length,
negative, fractional, NaN, strings, ragged lists, None); :func:`engine_files` whole files,
valid or damaged (a field replaced by :data:`FILE_JUNK`, dropped or added; YAML with
duplicate keys, deep nesting, bad scalars or indentation; truncation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from ..sim.workloads.batches import zipf_popularity
from ..solvers.placement.eplb import rebalance_experts

__all__ = [
    "synthetic_recording",
    "malformed_arrays",
    "file_bytes_mutations",
    "DEMO",
    "write_demo_dumps",
    "FILE_JUNK",
    "EngineFile",
    "engine_files",
    "placement_maps",
    "replica_maps",
    "BinaryFile",
    "binary_engine_files",
    "statistics_writes",
    "SPECIAL_PATHS",
    "make_special_path",
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


#: The synthetic recording of tests/test_plan.py and benchmarks/plan_demo.py:
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


# --- whole malformed files ------------------------------------------------------------------

#: Values a malformed file puts where a field belongs (JSON-serialisable): past int64, past
#: 2**53, negative, fractional, non-finite spelled as huge, strings, nulls, ragged or deep.
FILE_JUNK = (
    2**62,
    2**64,
    -1,
    -(2**63),
    1.5,
    8.9,
    1e308,
    "3",
    "",
    None,
    True,
    [],
    {},
    [[1, 2], [3]],
    [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]],
    {"a": {"b": {"c": 1}}},
)


@dataclass
class EngineFile:
    """One drawn file: its name, its bytes, whether it was left valid, and (for a valid one)
    what a reader must return."""

    name: str
    data: bytes
    valid: bool
    kind: str
    want: dict = field(default_factory=dict)

    def write(self, directory) -> str:
        import os

        path = os.path.join(os.fspath(directory), self.name)
        with open(path, "wb") as f:
            f.write(self.data)
        return path


def _placement(draw, L: int, E: int, P: int) -> np.ndarray:
    """A map ``[L, P]`` placing every expert at least once (as the engines require)."""
    rows = []
    for _ in range(L):
        extra = draw(st.lists(st.integers(0, E - 1), min_size=P - E, max_size=P - E))
        row = list(range(E)) + extra
        rows.append(draw(st.permutations(row)))
    return np.array(rows, dtype=np.int64)


def _json_mutation(draw, obj: dict) -> tuple[dict, bool]:
    """``obj`` with one field replaced, dropped or added (or unchanged)."""
    how = draw(st.sampled_from(["none", "replace", "replace", "entry", "drop", "add"]))
    out = dict(obj)
    keys = sorted(out)
    if how == "none" or not keys:
        return out, True
    k = draw(st.sampled_from(keys))
    if how == "replace":
        out[k] = draw(st.sampled_from(FILE_JUNK))
    elif how == "entry":
        a = np.array(out[k], dtype=object)
        if a.size:
            flat = a.reshape(-1)
            flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from(FILE_JUNK))
            out[k] = flat.reshape(a.shape).tolist()
    elif how == "drop":
        del out[k]
    else:
        out[draw(st.sampled_from(["extra", "rank", "weight", "logical_count"]))] = draw(
            st.sampled_from(FILE_JUNK)
        )
    return out, False


def _yaml_mutation(draw, text: str) -> tuple[str, bool]:
    how = draw(
        st.sampled_from(["none", "dup", "flowdup", "deep", "scalar", "indent", "value", "cut"])
    )
    lines = text.splitlines()
    if how == "none":
        return text, True
    if how == "dup":
        lines.insert(1, lines[1])  # a second row for one layer
    elif how == "flowdup":
        lines.append("ep_size: {a: 1, a: 2}")
    elif how == "deep":
        n = draw(st.integers(60, 400))
        lines.append("layer_updates_per_iter: " + "[" * n + "]" * n)
    elif how == "scalar":
        lines[-1] = "num_slots: " + draw(
            st.sampled_from(["0x_", "0b_", "1e999", "~", "'4'", "4.5"])
        )
    elif how == "indent":
        i = draw(st.integers(0, len(lines) - 1))
        lines[i] = " " * draw(st.integers(1, 5)) + lines[i]
    elif how == "value":
        i = draw(st.integers(1, max(1, len(lines) - 3)))
        key = lines[i].split(":")[0]
        lines[i] = f"{key}: {draw(st.sampled_from([str(v) for v in FILE_JUNK]))}"
    else:
        cut = draw(st.integers(0, len(text)))
        return text[:cut], cut == len(text)
    return "\n".join(lines) + "\n", False


@st.composite
def engine_files(draw) -> EngineFile:
    """A file of one of the formats the readers take without torch (SGLang's
    ``--init-expert-location`` JSON, a stat dump as JSON, a vLLM state dump, EPLB maps,
    ``moe_load_balancer.yaml``), valid or with one field replaced by :data:`FILE_JUNK`,
    dropped or added, or its text damaged (duplicate keys, deep nesting, bad scalars,
    bad indentation, truncation)."""
    import json

    from ..runtime.engines import vllm_maps
    from ..runtime.engines._yaml import dump_yaml

    L = draw(st.integers(1, 3))
    E = draw(st.integers(1, 5))
    G = draw(st.integers(1, 3))
    P = G * draw(st.integers(max(1, -(-E // G)), -(-E // G) + 2))
    p2l = _placement(draw, L, E, P)
    kind = draw(st.sampled_from(["sglang_map", "sglang_count", "vllm", "eplb", "trtllm_yaml"]))
    counts = np.array(
        draw(st.lists(st.integers(0, 50), min_size=2 * L * E, max_size=2 * L * E)), np.int64
    ).reshape(2, L, E)
    if kind == "trtllm_yaml":
        layers = draw(st.lists(st.integers(0, 64), min_size=L, max_size=L, unique=True))
        cfg = {
            "initial_global_assignments": {i: row.tolist() for i, row in zip(layers, p2l)},
            "layer_updates_per_iter": 0,
            "num_slots": P,
        }
        text, valid = _yaml_mutation(draw, dump_yaml(cfg))
        order = np.argsort(layers)
        want = {"physical_to_logical": p2l[order], "n_experts": E}
        return EngineFile("moe_load_balancer.yaml", text.encode(), valid, kind, want)
    if kind == "sglang_map":
        obj = {"physical_to_logical_map": p2l.tolist()}
        want = {"physical_to_logical": p2l, "n_experts": E}
        name = "init_expert_location.json"
    elif kind == "sglang_count":
        obj = {"logical_count": counts.tolist(), "rank": 0}
        live = counts.reshape(2, -1).any(axis=1)
        want = {"counts": counts[live], "n_experts": E}
        name = "stat_dump.json"
    elif kind == "vllm":
        obj = {k: v.tolist() for k, v in vllm_maps(p2l, E).items()}
        window = np.array(
            draw(st.lists(st.integers(0, 9), min_size=2 * L * P, max_size=2 * L * P)), np.int64
        ).reshape(2, L, P)
        obj["expert_load_window"] = window.tolist()
        obj["expert_load_window_step"] = 0
        obj["rank"] = 0
        live = window.reshape(2, -1).any(axis=1)
        from ..runtime.engines import fold_physical_counts

        want = {"counts": fold_physical_counts(window[live], p2l, E), "n_experts": E}
        name = "eplb_state_rank0.json"
    else:
        from ..formulations.dispatch import logical_to_physical

        l2p, cnt = logical_to_physical(p2l, E)
        obj = {"phy2log": p2l.tolist(), "log2phy": l2p.tolist(), "logcnt": cnt.tolist()}
        want = {"physical_to_logical": p2l, "n_experts": E}
        name = "eplb_maps.json"
    obj, valid = _json_mutation(draw, obj)
    return EngineFile(name, json.dumps(obj).encode(), valid, kind, want)


# --- writer inputs, valid or not (for the writer/reader contract) --------------------------


@st.composite
def placement_maps(draw, *, max_layers: int = 3, max_slots: int = 5) -> np.ndarray:
    """A ``(n_layers, P)`` expert map: a placement giving every expert a slot, or one spoiled
    the ways a caller spoils it: an expert left without a slot, an empty slot (``-1``), an
    id at or past ``P``, or random ids in ``[-1, P + 1]``."""
    L = draw(st.integers(1, max_layers))
    P = draw(st.integers(1, max_slots))
    E = draw(st.integers(1, P))
    m = _placement(draw, L, E, P)
    how = draw(st.sampled_from(["valid", "valid", "hole", "empty", "past", "random"]))
    if how == "hole" and E > 1:  # every slot of one expert given to another
        layer, e = draw(st.integers(0, L - 1)), draw(st.integers(0, E - 1))
        m[layer][m[layer] == e] = (e + 1) % E
    elif how == "empty":
        m.flat[draw(st.integers(0, m.size - 1))] = -1
    elif how == "past":
        m.flat[draw(st.integers(0, m.size - 1))] = P + draw(st.integers(0, 2))
    elif how == "random":
        ids = draw(st.lists(st.integers(-1, P + 1), min_size=L * P, max_size=L * P))
        m = np.array(ids, dtype=np.int64).reshape(L, P)
    return m


@st.composite
def replica_maps(draw, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(logical_to_physical [L, E, X], replica_count [L, E])`` of the map ``m`` (each
    expert's slots in increasing order, ``-1`` padded), for ``E`` the map's own number of
    experts or one drawn around it, and spoiled or not: a slot moved to another expert, a
    replica count off by one, an expert's slots reordered (which the readers accept)."""
    L, P = m.shape
    top = int(m.max()) + 1
    E = draw(st.sampled_from([max(top, 1), max(top, 1), max(1, top - 1), top + 1]))
    slots = [[[p for p in range(P) if m[layer, p] == e] for e in range(E)] for layer in range(L)]
    X = max(1, max((len(x) for row in slots for x in row), default=1)) + draw(st.integers(0, 1))
    l2p = np.full((L, E, X), -1, dtype=np.int64)
    cnt = np.zeros((L, E), dtype=np.int64)
    for layer in range(L):
        for e in range(E):
            got = slots[layer][e]
            l2p[layer, e, : len(got)] = got
            cnt[layer, e] = len(got)
    how = draw(st.sampled_from(["valid", "valid", "slot", "count", "reorder"]))
    layer, e = draw(st.integers(0, L - 1)), draw(st.integers(0, E - 1))
    if how == "slot":
        l2p[layer, e, 0] = draw(st.integers(-1, P))
    elif how == "count":
        cnt[layer, e] += draw(st.sampled_from([-1, 1]))
    elif how == "reorder":
        k = int(cnt[layer, e])
        l2p[layer, e, :k] = l2p[layer, e, :k][::-1]
    return l2p, cnt


# --- damaged binary files, sets written over sets, special paths ----------------------------


@dataclass
class BinaryFile:
    """An engine file as its writer wrote it, then perhaps damaged (``damage``: none, flip,
    tensor or truncate). A reader must refuse it naming the file, or read exactly the
    counts written (``want``); a truncated file is always refused. Where the format cannot
    detect the damage (``detectable`` False: a bit flipped inside a safetensors tensor or in
    JSON text, neither of which has a checksum), what is read need only be a valid log."""

    name: str
    data: bytes
    damage: str
    want: np.ndarray
    detectable: bool = True


@st.composite
def binary_engine_files(draw, *, torch_ok: bool = True) -> BinaryFile:
    """An SGLang stat or per-pass dump, or a vLLM state (``.pt``, ``.safetensors`` or
    ``.json``), written by the library's writers, then one bit flipped (anywhere, or inside
    the first tensor's bytes), truncated, or left whole. ``want`` is the counts the file holds as
    every reader returns them: a stat dump's and a vLLM window's all-zero rows (buffer rows
    never written) left out, a per-pass dump's kept (a pass that routed nothing)."""
    import os
    import tempfile
    import zipfile

    from ..runtime.engines import (
        vllm_maps,
        write_sglang_detail_dump,
        write_sglang_stat_dump,
        write_vllm_state,
    )

    kinds = ["vllm_st", "vllm_json"]
    kinds += ["sglang_stat", "sglang_detail", "vllm_pt"] if torch_ok else []
    kind = draw(st.sampled_from(kinds))
    L, P = draw(st.integers(1, 2)), draw(st.integers(2, 4))
    m = _placement(draw, L, draw(st.integers(1, P)), P)
    cells = st.lists(st.integers(0, 50), min_size=L * P, max_size=L * P)
    gpc = np.array(draw(cells), dtype=np.int64).reshape(L, P)
    with tempfile.TemporaryDirectory() as d:
        if kind == "sglang_stat":
            counts = gpc[None]  # a (1, L, P) logical count
            path = write_sglang_stat_dump(d, counts, timestamp=1.0)
            want = counts[counts.any(axis=(1, 2))]
        elif kind == "sglang_detail":
            rec = [{"forward_pass_id": 0, "global_physical_count": gpc}]
            path = write_sglang_detail_dump(d, rec, m, rank=0, timestamp=1.0)
            want = None  # the fold: computed by the test from the map
        else:
            ext = {"vllm_pt": ".pt", "vllm_st": ".safetensors", "vllm_json": ".json"}[kind]
            state = dict(vllm_maps(m, int(m.max()) + 1, width=None), expert_load_window=gpc[None])
            path = write_vllm_state(os.path.join(d, "s_rank0" + ext), state)
            want = None
        with open(path, "rb") as f:
            data = f.read()
        name = os.path.basename(path)
        tensor_at, payload_at = None, len(data)
        if path.endswith(".safetensors"):
            payload_at = 8 + int(np.frombuffer(data[:8], "<u8")[0])
            tensor_at = payload_at
        if path.endswith(".pt"):
            with zipfile.ZipFile(path) as z:
                info = next(i for i in z.infolist() if "/data/" in i.filename)
            n, x = np.frombuffer(data[info.header_offset + 26 : info.header_offset + 30], "<u2")
            tensor_at = info.header_offset + 30 + int(n) + int(x)
    how = draw(st.sampled_from(["none", "flip", "flip", "tensor", "truncate"]))
    if how == "tensor" and tensor_at is None:
        how = "flip"
    if how == "truncate":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif how in ("flip", "tensor"):
        i = tensor_at + draw(st.integers(0, 7)) if how == "tensor" else None
        i = draw(st.integers(0, len(data) - 1)) if i is None else i
        b = bytearray(data)
        b[i] ^= 1 << draw(st.integers(0, 7))
        data = bytes(b)
        if i >= payload_at:
            how = "tensor"
    keep_zero = kind == "sglang_detail"
    if want is None:
        E = int(m.max()) + 1
        want = np.zeros((1, L, E), dtype=np.int64)
        for layer in range(L):
            for p in range(P):
                want[0, layer, m[layer, p]] += gpc[layer, p]
        if not keep_zero:
            want = want[want.any(axis=(1, 2))]
    # no checksum: a bit flipped inside a safetensors tensor, or anywhere in JSON text (a
    # digit for another), may read as other valid data
    blind = how == "tensor" and kind == "vllm_st" or how == "flip" and kind == "vllm_json"
    return BinaryFile(name, data, how, want, detectable=not blind)


@st.composite
def statistics_writes(draw, *, max_writes: int = 4) -> list:
    """A sequence of TensorRT-LLM statistics writes into one directory: ``(n_ranks, fill,
    fail_at)`` each, ``fail_at`` the rank file whose write fails (None: none fails)."""
    out = []
    for _ in range(draw(st.integers(1, max_writes))):
        n = draw(st.integers(1, 4))
        fail = draw(st.one_of(st.none(), st.integers(0, n - 1)))
        out.append((n, draw(st.integers(0, 9)), fail))
    return out


#: The kinds of path :func:`make_special_path` makes.
SPECIAL_PATHS = (
    "missing",
    "folder",
    "fifo",
    "socket",
    "device",
    "link to a file",
    "link to a folder",
    "broken link",
    "link loop",
    "int",
    "bytes",
    "empty",
)


def make_special_path(kind: str, directory, name: str = "x.json"):
    """``(path, cleanup)``: a path of ``kind`` (one of :data:`SPECIAL_PATHS`) named
    ``name`` in ``directory``; ``cleanup()`` releases what it holds (a bound socket)."""
    import os
    import socket

    p = os.path.join(os.fspath(directory), name)
    nothing = lambda: None  # noqa: E731
    if kind == "missing":
        return p, nothing
    if kind == "folder":
        os.mkdir(p)
        return p, nothing
    if kind == "fifo":
        os.mkfifo(p)
        return p, nothing
    if kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(p)
        return p, s.close
    if kind == "device":
        return os.devnull, nothing
    if kind in ("link to a file", "link to a folder"):
        target = p + ".target"
        if kind == "link to a file":
            with open(target, "w") as f:
                f.write("{}")
        else:
            os.mkdir(target)
        os.symlink(target, p)
        return p, nothing
    if kind == "broken link":
        os.symlink(p + ".gone", p)
        return p, nothing
    if kind == "link loop":
        os.symlink(p + ".b", p)
        os.symlink(p, p + ".b")
        return p, nothing
    return {"int": 0, "bytes": os.fsencode(p), "empty": ""}[kind], nothing
