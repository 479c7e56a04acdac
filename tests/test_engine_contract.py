"""The writer/reader contract of every engine format: a writer refuses exactly what its
reader refuses.

For each writer ``write`` and its reader ``read``, on inputs ``x`` drawn valid or spoiled
(:func:`~straggler.proofs.engine_strategies.placement_maps` and friends): ``write(x)``
succeeds exactly when the same content, saved without any check (the raw bytes of the same
format), is read back by ``read`` as ``x``; a refused write leaves no file; a written file
reads back as ``x``. "As ``x``" is checked against an independent decoding (plain loops),
not against the reader itself.
"""

import importlib.util
import json
import os
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from straggler.formulations import InvalidInputError
from straggler.proofs.engine_strategies import placement_maps, replica_maps
from straggler.runtime.engines import (
    read_eplb_maps,
    read_moe_load_balancer,
    read_sglang_init_location,
    read_sglang_recorder,
    read_trtllm_statistics,
    read_vllm_state,
    write_eplb_maps,
    write_moe_load_balancer,
    write_sglang_detail_dump,
    write_sglang_init_location,
    write_sglang_stat_dump,
    write_trtllm_statistics,
    write_vllm_state,
)
from straggler.runtime.engines._common import save_json, save_pt, save_safetensors
from straggler.runtime.engines._yaml import dump_yaml

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_ST = importlib.util.find_spec("safetensors") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
needs_st = pytest.mark.skipif(not HAS_ST, reason="needs safetensors")
PROP = settings(
    max_examples=40 if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else 25,
    suppress_health_check=list(HealthCheck),
    database=None,
    deadline=None,
)


def _placed(m) -> bool:
    """Whether ``m`` places every expert ``0..max`` at least once in every layer, with no
    empty slot and every id below the slots (what every engine requires of a placement)."""
    m = np.asarray(m)
    if (m < 0).any() or m.max() >= m.shape[1]:
        return False
    return all(set(range(int(m.max()) + 1)) <= set(row.tolist()) for row in m)


def _fold(phys, m, E):
    """``[..., L, P]`` slot counts summed onto experts through ``m`` (plain loops)."""
    phys = np.asarray(phys)
    out = np.zeros(phys.shape[:-1] + (E,), dtype=np.int64)
    for idx in np.ndindex(phys.shape[:-1]):
        for p in range(phys.shape[-1]):
            if m[idx[-1], p] >= 0:
                out[idx + (int(m[idx[-1], p]),)] += phys[idx + (p,)]
    return out


def contract(write, save_raw, read, decode_ok):
    """``write()`` succeeds iff ``read(save_raw())`` returns what ``decode_ok`` accepts;
    a refused write leaves the directory empty; a written file reads back accepted."""
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as raw_dir:
        try:
            path = write(d)
            wrote = True
        except InvalidInputError:
            wrote = False
            assert os.listdir(d) == [], "a refused write left a file"
        try:
            raw_ok = decode_ok(read(save_raw(raw_dir)))
        except InvalidInputError:
            raw_ok = False
        assert wrote == raw_ok, (
            "the writer wrote what its reader refuses"
            if wrote
            else "the writer refused a file its reader reads back as written"
        )
        if wrote:
            assert decode_ok(read(path)), "a written file does not read back as written"


# --- SGLang -------------------------------------------------------------------------------


@PROP
@given(m=placement_maps(), ext=st.sampled_from([".json", ".pt"] if HAS_TORCH else [".json"]))
@example(m=np.array([[0, 0, 2, 2]]), ext=".json")  # expert 1 has no slot
@example(m=np.array([[0, 1, 4]]), ext=".json")  # id past the slots
@example(m=np.array([[0, -1]]), ext=".json")
def test_sglang_init_location_mapping(m, ext):
    def decode_ok(log):
        return np.array_equal(log.physical_to_logical, m) and log.n_experts == int(m.max()) + 1

    def raw(d):
        p = os.path.join(d, "loc" + ext)
        (save_pt if ext == ".pt" else save_json)({"physical_to_logical_map": m}, p)
        return p

    contract(
        lambda d: write_sglang_init_location(os.path.join(d, "loc" + ext), physical_to_logical=m),
        raw,
        read_sglang_init_location,
        decode_ok,
    )
    # SGLang serves exactly the maps that place every expert
    try:
        read_sglang_init_location(json.dumps({"physical_to_logical_map": m.tolist()}))
        served = True
    except InvalidInputError:
        served = False
    assert served == _placed(m)


@PROP
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(0, 2), st.integers(0, 3)),
    fill=st.sampled_from([0, 1, 7, 2**40, 2**52]),
)
def test_sglang_init_location_counts(shape, fill):
    counts = np.full(shape, fill, dtype=np.int64)
    if counts.size:
        counts.flat[0] = 0

    def decode_ok(log):
        live = counts.any(axis=(1, 2))
        return np.array_equal(log.counts, counts[live]) and log.n_experts == counts.shape[2]

    def raw(d):
        p = os.path.join(d, "loc.json")
        save_json({"logical_count": counts}, p)
        return p

    contract(
        lambda d: write_sglang_init_location(os.path.join(d, "loc.json"), logical_count=counts),
        raw,
        read_sglang_init_location,
        decode_ok,
    )


@needs_torch
@PROP
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(0, 2), st.integers(0, 3)),
    fill=st.sampled_from([0, 1, 5, 2**31 - 1]),
    rate=st.sampled_from([None, 0.5, float("nan"), 1, "high", [0.5, 0.5]]),
)
def test_sglang_stat_dump(shape, fill, rate):
    counts = np.full(shape, fill, dtype=np.int64)
    if counts.size:
        counts.flat[0] = 0  # an unfilled buffer step or two

    def decode_ok(log):
        live = counts.any(axis=(1, 2))
        got = log.extras.get("average_utilization_rate_over_window")
        same_rate = (rate is None and got is None) or (
            got is not None and np.isclose(got, float(rate), equal_nan=True)
        )
        return np.array_equal(log.counts, counts[live]) and same_rate

    def raw(d):
        p = os.path.join(d, "expert_distribution_recorder_1.0.pt")
        save_pt(
            {
                "rank": 0,
                "logical_count": counts.astype(np.int32),
                "average_utilization_rate_over_window": rate,
            },
            p,
        )
        return p

    contract(
        lambda d: write_sglang_stat_dump(d, counts, average_utilization_rate=rate, timestamp=1.0),
        raw,
        read_sglang_recorder,
        decode_ok,
    )


@needs_torch
@PROP
@given(data=st.data(), m=placement_maps())
def test_sglang_detail_dump(data, m):
    L, P = m.shape
    n = data.draw(st.integers(1, 2))
    gpcs = [
        np.array(data.draw(st.lists(st.integers(0, 3), min_size=L * P, max_size=L * P))).reshape(
            L, P
        )
        for _ in range(n)
    ]
    records = [{"forward_pass_id": f, "global_physical_count": g} for f, g in enumerate(gpcs)]

    def decode_ok(log):
        E = int(m.max()) + 1
        return log.n_experts == E and np.array_equal(log.counts, _fold(np.stack(gpcs), m, E))

    def raw(d):
        p = os.path.join(d, "expert_distribution_recorder_1.0_0.pt")
        recs = [dict(r, rank=0, gatherer_key="primary") for r in records]
        save_pt({"records": recs, "last_physical_to_logical_map": m}, p)
        return p

    contract(
        lambda d: write_sglang_detail_dump(d, records, m, rank=0, timestamp=1.0),
        raw,
        read_sglang_recorder,
        decode_ok,
    )


# --- vLLM ---------------------------------------------------------------------------------


@PROP
@given(data=st.data(), m=placement_maps(), ext=st.sampled_from([".json", ".pt", ".safetensors"]))
def test_vllm_state(data, m, ext):
    if ext == ".pt" and not HAS_TORCH or ext == ".safetensors" and not HAS_ST:
        ext = ".json"
    l2p, cnt = data.draw(replica_maps(m))
    L, P = m.shape
    E = cnt.shape[1]
    state = {
        "physical_to_logical_map": m,
        "logical_to_physical_map": l2p,
        "logical_replica_count": cnt,
    }
    window = None
    if data.draw(st.booleans()):
        W = data.draw(st.integers(1, 3))
        window = np.array(
            data.draw(st.lists(st.integers(0, 2), min_size=W * L * P, max_size=W * L * P))
        ).reshape(W, L, P)
        state["expert_load_window"] = window
        state["expert_load_window_step"] = data.draw(st.integers(0, W))
    state["rank"] = 0

    def decode_ok(log):
        if not (np.array_equal(log.physical_to_logical, m) and log.n_experts == E):
            return False
        if window is None:
            return log.counts is None
        step = state["expert_load_window_step"]
        ordered = np.concatenate([window[step:], window[:step]])
        live = ordered.any(axis=(1, 2))
        return np.array_equal(log.counts, _fold(ordered[live], m, E))

    def raw(d):
        p = os.path.join(d, "eplb_state_rank0" + ext)
        if ext == ".json":
            save_json(state, p)
        elif ext == ".pt":
            save_pt(state, p)
        else:
            save_safetensors({k: np.asarray(v) for k, v in state.items()}, p)
        return p

    contract(
        lambda d: write_vllm_state(os.path.join(d, "eplb_state_rank0" + ext), state),
        raw,
        read_vllm_state,
        decode_ok,
    )


# --- TensorRT-LLM -------------------------------------------------------------------------


@PROP
@given(data=st.data(), m=placement_maps())
@example(data=None, m=np.array([[0, 0, 2, 2]]))
def test_moe_load_balancer(data, m):
    L = m.shape[0]
    ids = (
        list(range(3, 3 + L))
        if data is None
        else data.draw(
            st.lists(
                st.sampled_from([0, 3, 60, 65535, 65536, 10**6]),
                min_size=L,
                max_size=L,
                unique=True,
            )
        )
    )
    order = np.argsort(ids)

    def decode_ok(log):
        return np.array_equal(log.physical_to_logical, m[order]) and log.layer_ids.tolist() == [
            ids[i] for i in order
        ]

    def raw(d):
        p = os.path.join(d, "moe_load_balancer.yaml")
        cfg = {
            "initial_global_assignments": {i: [int(x) for x in row] for i, row in zip(ids, m)},
            "layer_updates_per_iter": 0,
            "num_slots": int(m.shape[1]),
        }
        with open(p, "w") as f:
            f.write(dump_yaml(cfg))
        return p

    contract(
        lambda d: write_moe_load_balancer(
            os.path.join(d, "moe_load_balancer.yaml"), m, layer_ids=ids
        ),
        raw,
        read_moe_load_balancer,
        decode_ok,
    )


@needs_st
@PROP
@given(
    shape=st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(1, 2), st.integers(1, 3)),
    fill=st.sampled_from([0, 1, 9, 2**52, 2**62]),
    layer=st.sampled_from([3, 65535, 65536]),
    top_k=st.integers(1, 4),
)
def test_trtllm_statistics(shape, fill, layer, top_k):
    counts = np.full(shape, fill, dtype=np.int64)
    R, I, L, E = shape
    layers = list(range(layer, layer + L))

    def decode_ok(log):
        return (
            np.array_equal(log.counts, counts.sum(axis=0))
            and log.layer_ids.tolist() == layers
            and log.top_k == top_k
            and log.n_ranks == R
        )

    def raw(d):
        save_json(
            {"num_experts": E, "num_experts_per_token": top_k}, os.path.join(d, "meta_info.json")
        )
        for r in range(R):
            save_safetensors(
                {f"{i}_{lay}": counts[r, i, j] for i in range(I) for j, lay in enumerate(layers)},
                os.path.join(d, f"rank{r}.safetensors"),
            )
        return d

    def write(d):
        write_trtllm_statistics(d, counts, layer_ids=layers, top_k=top_k)
        return d

    contract(
        write,
        raw,
        read_trtllm_statistics,
        decode_ok,
    )


# --- DeepSeek EPLB ------------------------------------------------------------------------


@PROP
@given(data=st.data(), m=placement_maps(), ext=st.sampled_from([".json", ".pt"]))
def test_eplb_maps(data, m, ext):
    if ext == ".pt" and not HAS_TORCH:
        ext = ".json"
    l2p, cnt = data.draw(replica_maps(m))

    def decode_ok(log):
        return (
            np.array_equal(log.physical_to_logical, m)
            and log.n_experts == cnt.shape[1]
            and np.array_equal(log.extras["log2phy"], l2p)
        )

    def raw(d):
        p = os.path.join(d, "maps" + ext)
        (save_pt if ext == ".pt" else save_json)({"phy2log": m, "log2phy": l2p, "logcnt": cnt}, p)
        return p

    contract(
        lambda d: write_eplb_maps(os.path.join(d, "maps" + ext), m, l2p, cnt),
        raw,
        read_eplb_maps,
        decode_ok,
    )


# --- the cases the contract was written for -----------------------------------------------


@pytest.mark.parametrize(
    "m, why",
    [
        ([[0, 0, 2, 2]], "no slot for expert 1"),
        ([[0, 1, 2, 5]], "below the 4 slots"),
        # vLLM has empty slots (-1, compute_logical_maps' valid_mask); SGLang and
        # TensorRT-LLM have none
        ([[0, 1, -1, 2]], "no empty slots|>= 0"),
    ],
)
def test_placements_no_engine_serves_are_refused_by_every_writer(tmp_path, m, why):
    m = np.array(m)
    writers = {
        "sglang": lambda: write_sglang_init_location(tmp_path / "a.json", physical_to_logical=m),
        "trtllm": lambda: write_moe_load_balancer(tmp_path / "b.yaml", m),
        "vllm": lambda: write_vllm_state(
            tmp_path / "c_rank0.json",
            {"physical_to_logical_map": m, "logical_replica_count": np.ones((1, 3), np.int64)},
        ),
    }
    if (m < 0).any():
        del writers["vllm"]
    for write in writers.values():
        with pytest.raises(InvalidInputError, match="parameter of write_"):
            write()
    assert os.listdir(tmp_path) == []
    # and the readers refuse the same maps written without a check
    save_json({"physical_to_logical_map": m}, tmp_path / "a.json")
    with pytest.raises(InvalidInputError, match=why):
        read_sglang_init_location(str(tmp_path / "a.json"))


# --- the contract can fail ----------------------------------------------------------------


def test_contract_fails_for_a_writer_that_skips_its_readers_checks(falsified, monkeypatch):
    """write_vllm_state and write_eplb_maps with the reader's checks skipped on the writer's
    side (as they were when they wrote placements with an expert in no slot, or maps that
    disagree): the properties fail."""
    from straggler.runtime.engines import eplb as eplb_mod
    from straggler.runtime.engines import vllm as vllm_mod
    from straggler.runtime.engines._common import Writing

    def skip_for_writers(check):
        return lambda obj, where, *a, **k: (
            None if isinstance(where, Writing) else check(obj, where, *a, **k)
        )

    monkeypatch.setattr(vllm_mod, "_check_state", skip_for_writers(vllm_mod._check_state))
    ext = st.just(".json")
    assert falsified(test_vllm_state, data=st.data(), m=placement_maps(), ext=ext)
    monkeypatch.setattr(eplb_mod, "parse_eplb_maps", skip_for_writers(eplb_mod.parse_eplb_maps))
    assert falsified(test_eplb_maps, data=st.data(), m=placement_maps(), ext=ext)
