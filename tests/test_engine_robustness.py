"""Engine readers and writers on malformed input: a valid answer or one clear error naming
the file and the field; never a silent misread, a silent cast, a raw error or a partial
file."""

import importlib.util
import os

import numpy as np
import pytest
from straggler.formulations import InvalidInputError
from straggler.runtime.engines import (
    fold_physical_counts,
    read_engine_log,
    read_eplb_maps,
    read_moe_load_balancer,
    read_trtllm_statistics,
    read_vllm_state,
    vllm_maps,
    write_eplb_maps,
    write_moe_load_balancer,
    write_sglang_init_location,
    write_sglang_stat_dump,
    write_trtllm_statistics,
    write_vllm_state,
)
from straggler.runtime.engines._common import save_json
from straggler.runtime.engines._yaml import parse_yaml

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_ST = importlib.util.find_spec("safetensors") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
needs_st = pytest.mark.skipif(not HAS_ST, reason="safetensors not installed")
BIG = 2**62


def _vllm_state(window, rank=0):
    p2l = np.array([[0, 1, 0, 1]])
    return {
        "physical_to_logical_map": p2l,
        "expert_load_window": np.asarray(window, dtype=np.int64),
        "rank": rank,
    }


# --- overflow where counts are summed -----------------------------------------------------


def test_vllm_counts_summed_over_ranks_do_not_overflow(tmp_path):
    w = np.full((1, 1, 4), BIG, dtype=np.int64)
    for r in range(2):
        save_json(_vllm_state(w, r), tmp_path / f"s_rank{r}.json")
    with pytest.raises(InvalidInputError, match="expert_load_window.*2\\*\\*53"):
        read_vllm_state(tmp_path)


def test_eplb_weight_too_large_for_counts(tmp_path):
    phy2log = np.array([[0, 1]])
    obj = {
        "phy2log": phy2log,
        "log2phy": [[[0], [1]]],
        "logcnt": [[1, 1]],
        "weight": [[1e300, 5.0]],
    }
    save_json(obj, tmp_path / "m.json")
    with pytest.raises(InvalidInputError, match="'weight' field of .*m.json"):
        read_eplb_maps(tmp_path / "m.json")


def test_sglang_stat_counts_whose_total_overflows(tmp_path):
    p = tmp_path / "x.json"
    save_json({"logical_count": [[[BIG, BIG]], [[BIG, 1]]]}, p)
    with pytest.raises(InvalidInputError, match="logical_count.*2\\*\\*53"):
        read_engine_log(str(p))


def test_fold_checks_ids_and_totals():
    with pytest.raises(InvalidInputError, match="physical_to_logical.*below n_experts=2"):
        fold_physical_counts([[1, 1]], [[0, 5]], 2)
    with pytest.raises(InvalidInputError, match="2\\*\\*53"):
        fold_physical_counts([[BIG, BIG]], [[0, 0]], 1)
    with pytest.raises(InvalidInputError, match="n_experts"):
        fold_physical_counts([[1, 1]], [[0, 1]], 8.9)


# --- writers refuse what they cannot store exactly ----------------------------------------


@needs_torch
@pytest.mark.parametrize("bad", [[[[2**32, 1]]], [[[2.9, 1]]], [[[-1, 1]]]])
def test_sglang_stat_writer_refuses_inexact_values(tmp_path, bad):
    with pytest.raises(InvalidInputError, match="logical_count"):
        write_sglang_stat_dump(tmp_path, bad)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("bad", [2**32, 2.9, np.nan])
def test_vllm_writer_refuses_inexact_values(tmp_path, bad):
    st = _vllm_state([[[1, 2, 3, 4]]])
    st["expert_load_window"] = np.array([[[bad, 2, 3, 4]]], dtype=float)
    with pytest.raises(InvalidInputError, match="expert_load_window"):
        write_vllm_state(tmp_path / "s_rank0.json", st)
    assert os.listdir(tmp_path) == []


@needs_st
@pytest.mark.parametrize(
    "kw, match",
    [
        ({"layer_ids": [3]}, "layer_ids"),  # short
        ({"layer_ids": [3, 3]}, "layer_ids"),  # repeated
        ({"layer_ids": [3, 4], "iter_ids": [0]}, "iter_ids"),
        ({"layer_ids": [3, 4], "iter_ids": [5, 5]}, "iter_ids"),
        ({"layer_ids": [3, 4], "top_k": 0}, "top_k"),
    ],
)
def test_trtllm_writer_refuses_ids_that_would_drop_data(tmp_path, kw, match):
    counts = np.ones((1, 2, 2, 4), dtype=np.int64)
    with pytest.raises(InvalidInputError, match=match):
        write_trtllm_statistics(tmp_path / "d", counts, **{"top_k": 2, **kw})
    assert not (tmp_path / "d").exists()
    with pytest.raises(InvalidInputError, match="counts"):
        # int64, as torch.bincount writes them: 2**31 is stored exactly, 2**63 cannot be
        write_trtllm_statistics(
            tmp_path / "d", counts.astype(object) * 2**63, layer_ids=[3, 4], top_k=2
        )
    write_trtllm_statistics(tmp_path / "e", counts * 2**31, layer_ids=[3, 4], top_k=2)


def test_placement_writers_refuse_fractional_ids(tmp_path):
    with pytest.raises(InvalidInputError, match="physical_to_logical"):
        write_moe_load_balancer(tmp_path / "m.yaml", [[0.0, 1.5]])
    with pytest.raises(InvalidInputError, match="phy2log"):
        write_eplb_maps(tmp_path / "e.json", [[0, 1.5]], [[[0], [1]]], [[1, 1]])
    with pytest.raises(InvalidInputError, match="logical_count"):
        write_sglang_init_location(tmp_path / "i.json", logical_count=[[2.5, 1]])
    assert os.listdir(tmp_path) == []


def test_writes_are_atomic(tmp_path, monkeypatch):
    target = tmp_path / "m.yaml"
    target.write_text("old")
    real = os.replace

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        write_moe_load_balancer(target, [[0, 1]])
    with pytest.raises(OSError):
        save_json({"a": 1}, tmp_path / "x.json")
    monkeypatch.setattr(os, "replace", real)
    assert sorted(os.listdir(tmp_path)) == ["m.yaml"] and target.read_text() == "old"


# --- TensorRT-LLM keys and ids ------------------------------------------------------------


@needs_st
@pytest.mark.parametrize("key", ["01_3", "1_03", "\u0661_3", "1_3 ", "+1_3"])
def test_trtllm_keys_that_would_alias_are_refused(tmp_path, key):
    import safetensors.numpy as stn

    write_trtllm_statistics(tmp_path, np.ones((1, 2, 1, 4)), layer_ids=[3], top_k=2)
    data = stn.load_file(str(tmp_path / "rank0.safetensors"))
    data[key] = np.ones(4, dtype=np.int32)
    stn.save_file(data, str(tmp_path / "rank0.safetensors"))
    with pytest.raises(InvalidInputError, match="without leading zeros"):
        read_trtllm_statistics(tmp_path)


def test_yaml_ids_and_options_bounded(tmp_path):
    p = tmp_path / "moe_load_balancer.yaml"
    p.write_text("initial_global_assignments:\n  3: [0, 1000000000000]\nnum_slots: 2\n")
    with pytest.raises(InvalidInputError, match="below num_slots=2"):
        read_moe_load_balancer(p)
    p.write_text("initial_global_assignments:\n  100000000000: [0, 1]\nnum_slots: 2\n")
    with pytest.raises(InvalidInputError, match="layer index at most"):
        read_moe_load_balancer(p)
    p.write_text("initial_global_assignments:\n  3: [0, 1]\nnum_slots: 2\n")
    for bad in (8.9, 3, "2", 0):
        with pytest.raises(InvalidInputError, match="n_experts"):
            read_moe_load_balancer(p, n_experts=bad)
    with pytest.raises(InvalidInputError, match="n_experts"):
        read_engine_log(p, n_experts=8.9)
    assert read_moe_load_balancer(p, n_experts=2).n_experts == 2


def test_sglang_mapping_ids_bounded_by_the_slots():
    with pytest.raises(InvalidInputError, match="below the 2 slots"):
        read_engine_log('{"physical_to_logical_map": [[0, 1000000000000]]}')


@pytest.mark.parametrize(
    "text, match",
    [
        ("a: {x: 1, x: 2}", "duplicate key 'x'"),
        ("a: {1: 2, 1: 3}", "duplicate key 1"),
        ("a: " + "[" * 3000 + "]" * 3000, "nested more than"),
        ("\n".join(" " * i + f"k{i}:" for i in range(300)), "nested more than"),
        ("a: 0x_", "malformed scalar"),
        ("a: 0b_", "malformed scalar"),
        ("a: -0_", "malformed scalar"),
    ],
)
def test_yaml_subset_refuses_with_the_line(text, match):
    with pytest.raises(InvalidInputError, match=match):
        parse_yaml(text, "f.yaml")


# --- paths and tensors --------------------------------------------------------------------


@pytest.mark.parametrize("bad", [5, None, b"x.pt", 3.5, ["a"]])
def test_read_engine_log_refuses_non_paths(bad):
    with pytest.raises(InvalidInputError, match="'path' parameter of read_engine_log"):
        read_engine_log(bad)


def test_directories_and_symlink_loops_as_files(tmp_path):
    (tmp_path / "s_rank0.json").mkdir()
    with pytest.raises(InvalidInputError, match="is a directory"):
        read_vllm_state(tmp_path)
    loop = tmp_path / "loop.json"
    os.symlink(loop, loop)
    with pytest.raises(InvalidInputError, match="symbolic-link loop"):
        read_engine_log(loop)
    (tmp_path / "m.yaml").mkdir()
    with pytest.raises(InvalidInputError, match="is a directory"):
        read_moe_load_balancer(tmp_path / "m.yaml")


def test_reader_options_validated(tmp_path):
    save_json(_vllm_state([[[1, 2, 3, 4]]]), tmp_path / "s_rank0.json")
    with pytest.raises(InvalidInputError, match="physical_to_logical"):
        read_vllm_state(tmp_path, physical_to_logical="[[0, 1, 0, 1]]")
    with pytest.raises(InvalidInputError, match="format"):
        read_engine_log(tmp_path, format=["vllm"])
    with pytest.raises(InvalidInputError, match="iter_start"):
        read_trtllm_statistics(tmp_path, iter_start="3")


@needs_torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float8_e4m3fn"])
def test_low_precision_tensors_are_read_exactly(tmp_path, dtype):
    import torch

    if not hasattr(torch, dtype):
        pytest.skip(f"torch has no {dtype}")
    counts = torch.tensor([[[3, 1, 0, 2]]], dtype=getattr(torch, dtype))
    torch.save({"logical_count": counts, "rank": 0}, tmp_path / "x.pt")
    log = read_engine_log(tmp_path / "x.pt")
    assert log.counts.tolist() == [[[3, 1, 0, 2]]]


@needs_torch
def test_sparse_tensors_are_refused(tmp_path):
    import torch

    counts = torch.tensor([[[3, 1, 0, 2]]]).to_sparse()
    torch.save({"logical_count": counts, "rank": 0}, tmp_path / "x.pt")
    with pytest.raises(InvalidInputError, match="x.pt.*sparse"):
        read_engine_log(tmp_path / "x.pt")


def test_json_writer_refuses_nan(tmp_path):
    with pytest.raises(InvalidInputError, match="NaN"):
        save_json({"a": float("nan")}, tmp_path / "x.json")
    assert os.listdir(tmp_path) == []


def test_a_fifo_is_refused_instead_of_blocking(tmp_path):
    fifo = tmp_path / "moe_load_balancer.yaml"
    os.mkfifo(fifo)
    with pytest.raises(InvalidInputError, match="not a regular file"):
        read_engine_log(fifo)
    json_fifo = tmp_path / "x.json"
    os.mkfifo(json_fifo)
    with pytest.raises(InvalidInputError, match="not a regular file"):
        read_eplb_maps(json_fifo)


def test_writers_refuse_a_directory_as_the_file(tmp_path):
    with pytest.raises(InvalidInputError, match="is a directory"):
        write_moe_load_balancer(tmp_path, [[0, 1]])
    (tmp_path / "f").write_text("x")
    with pytest.raises(InvalidInputError, match="is a file"):
        save_json({"a": 1}, tmp_path / "f" / "x.json")


@needs_torch
def test_odd_tensor_kinds_are_refused_and_empty_windows_read(tmp_path):
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    for name, value in (("nested", nested), ("meta", torch.empty((1, 1, 2), device="meta"))):
        torch.save({"logical_count": value, "rank": 0}, tmp_path / f"{name}.pt")
        with pytest.raises(InvalidInputError, match=f"{name}.pt.*{name}"):
            read_engine_log(tmp_path / f"{name}.pt")
    torch.save({"logical_count": torch.zeros((0, 1, 2)), "rank": 0}, tmp_path / "empty.pt")
    log = read_engine_log(tmp_path / "empty.pt")
    assert log.counts.shape == (0, 1, 2) and not log.has_loads
    st = {k: torch.as_tensor(v) for k, v in _vllm_state(np.zeros((0, 1, 4), np.int64)).items()}
    torch.save(st, tmp_path / "v_rank0.pt")
    assert read_vllm_state(tmp_path / "v_rank0.pt").n_batches == 0


@needs_st
def test_rank_names_are_ascii_and_empty_rank_files_refused(tmp_path):
    import safetensors.numpy as stn

    one = {"0_3": np.ones(2, np.int32)}
    save_json({"num_experts": 2, "num_experts_per_token": 1}, tmp_path / "meta_info.json")
    stn.save_file(one, str(tmp_path / "rank0.safetensors"))
    stn.save_file(one, str(tmp_path / "rank\u0661.safetensors"))  # not a rank file
    log = read_trtllm_statistics(tmp_path)
    assert log.n_ranks == 1 and log.counts.tolist() == [[[1, 1]]]
    stn.save_file({}, str(tmp_path / "rank0.safetensors"))
    with pytest.raises(InvalidInputError, match="no '\\{iter\\}_\\{layer\\}' tensor"):
        read_trtllm_statistics(tmp_path)
    st = _vllm_state([[[1, 1, 1, 1]]])
    del st["rank"]
    save_json(st, tmp_path / "s_rank\u0661.json")
    with pytest.raises(InvalidInputError, match="Cannot tell the rank"):
        read_vllm_state([tmp_path / "s_rank\u0661.json", tmp_path / "s_rank\u0661.json"])


def test_options_a_reader_would_ignore_are_refused(tmp_path):
    stat = tmp_path / "stat.json"
    save_json({"logical_count": [[[1, 2]]], "rank": 0}, stat)
    maps = tmp_path / "eplb.json"
    save_json({"phy2log": [[0, 1]], "log2phy": [[[0], [1]]], "logcnt": [[1, 1]]}, maps)
    for path, kw in (
        (stat, {"n_experts": 2}),
        (stat, {"physical_to_logical": [[0, 1]]}),
        (maps, {"physical_to_logical": [[0, 1]]}),
        (maps, {"n_experts": 2}),
    ):
        with pytest.raises(InvalidInputError, match=f"'{next(iter(kw))}'.*(does not|apply to)"):
            read_engine_log(path, **kw)
    assert read_engine_log(stat).counts.tolist() == [[[1, 2]]]


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"counts": [[[2.9]]]}, "counts"),
        ({"counts": "abc"}, "counts"),
        ({"counts": [[1]]}, "counts"),
        ({"counts": [[[-1]]]}, "counts"),
        ({"counts": [[[2**62]], [[2**62]]]}, "counts"),
        ({"physical_to_logical": [[0, 5]]}, "physical_to_logical"),
        ({}, "neither"),
        ({"counts": [[[1]]], "layer_ids": [0, 1]}, "layer_ids"),
        ({"counts": [[[1]]], "batch_ids": [0, 1]}, "batch_ids"),
        ({"counts": [[[1]]], "physical_to_logical": [[0], [0]]}, "physical_to_logical"),
        ({"counts": [[[1]]], "n_experts": 1.0}, "n_experts"),
    ],
)
def test_engine_log_validates_what_it_is_given(kw, match):
    from straggler.runtime import EngineLog

    kw = {"n_experts": 1, **kw}
    with pytest.raises(InvalidInputError, match=match):
        EngineLog(engine="sglang", kind="k", sources=["s"], **kw)


def test_map_and_record_builders_check_their_arguments(tmp_path):
    from straggler.runtime.engines import sglang_per_token_record, vllm_maps

    with pytest.raises(InvalidInputError, match="n_experts"):
        vllm_maps([[0, 1]], 10**12)  # would size the maps by it
    with pytest.raises(InvalidInputError, match="n_experts"):
        vllm_maps([[0, 1]], 2.5)
    with pytest.raises(InvalidInputError, match="input_ids"):
        sglang_per_token_record(0, [[[0]]], 2, input_ids=[1, 2, 3])
    with pytest.raises(InvalidInputError, match="forward_pass_id"):
        sglang_per_token_record("a", [[[0]]], 2)


@needs_torch
def test_dump_timestamp_cannot_carry_a_path(tmp_path):
    with pytest.raises(InvalidInputError, match="timestamp"):
        write_sglang_stat_dump(tmp_path, [[[1]]], timestamp="x/../y")
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(importlib.util.find_spec("safetensors") is None, reason="safetensors")
@pytest.mark.parametrize("ext", [".safetensors", ".json"])
def test_a_renamed_vllm_field_is_damage_not_a_file_without_loads(tmp_path, ext):
    """safetensors and JSON carry no checksum: one flipped bit can rename a tensor
    (``expert_load_window`` -> ``dxpert_load_window``). The reader knows the writer's fields
    only, so the file is refused naming the field, never read as maps without loads."""
    m = np.array([[0, 1, 0, 2]])
    state = dict(vllm_maps(m, 3, width=None), expert_load_window=np.ones((1, 1, 4), np.int32))
    path = write_vllm_state(str(tmp_path / f"s_rank0{ext}"), state)
    assert read_vllm_state(path).counts.sum() == 4
    data = open(path, "rb").read()
    assert data.count(b"expert_load_window") == 1
    open(path, "wb").write(data.replace(b"expert_load_window", b"dxpert_load_window"))
    with pytest.raises(InvalidInputError, match="'dxpert_load_window'"):
        read_vllm_state(path)
