"""Multi-file outputs are written as a set: TensorRT-LLM's statistics directory
(``meta_info.json`` + ``rank*.safetensors``) is replaced whole, so no file of an earlier set
is read with a later one and a failure part way leaves the earlier set as it was
(``straggler.formulations._io.atomic_dir``)."""

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
from straggler.formulations import InvalidInputError, _io
from straggler.runtime.engines import (
    read_trtllm_statistics,
    write_moe_load_balancer,
    write_trtllm_statistics,
)
from straggler.runtime.engines import trtllm as trtllm_mod
from straggler.runtime.engines._common import save_json

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("safetensors") is None, reason="needs safetensors"
)


def _counts(n_ranks, fill):
    return np.full((n_ranks, 2, 1, 3), fill, dtype=np.int64)


def _write(d, n_ranks, fill):
    return write_trtllm_statistics(d, _counts(n_ranks, fill), layer_ids=[3], top_k=1)


@pytest.fixture(params=["exchange", "two renames"])
def swap(request, monkeypatch):
    """Both ways of swapping the set in: Linux's RENAME_EXCHANGE, and the fallback."""
    if request.param == "two renames":
        monkeypatch.setattr(_io, "_exchange", lambda a, b: False)
    return request.param


def test_fewer_ranks_over_more_leave_no_stale_rank(tmp_path, swap):
    d = tmp_path / "stats"
    _write(d, 4, 100)
    write_moe_load_balancer(d / "moe_load_balancer.yaml", [[0, 1, 2]], layer_ids=[3])
    (d / "notes.txt").write_text("mine")
    files = _write(d, 2, 1)
    log = read_trtllm_statistics(d)
    assert log.n_ranks == 2
    np.testing.assert_array_equal(log.counts, np.full((2, 1, 3), 2))  # 2 where 2 were written
    assert sorted(os.listdir(d)) == [
        "meta_info.json",
        "moe_load_balancer.yaml",  # files the set does not own are kept
        "notes.txt",
        "rank0.safetensors",
        "rank1.safetensors",
    ]
    assert (d / "notes.txt").read_text() == "mine"
    assert files == [
        str(d / "meta_info.json"),
        str(d / "rank0.safetensors"),
        str(d / "rank1.safetensors"),
    ]
    assert sorted(os.listdir(tmp_path)) == ["stats"]  # no staging folder left


def test_a_failure_part_way_leaves_the_earlier_set(tmp_path, monkeypatch, swap):
    d = tmp_path / "stats"
    _write(d, 3, 5)
    before = {f: (d / f).read_bytes() for f in os.listdir(d)}
    real = trtllm_mod.save_safetensors
    calls = []

    def fail_on_second_rank(tensors, path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(tensors, path)

    monkeypatch.setattr(trtllm_mod, "save_safetensors", fail_on_second_rank)
    with pytest.raises((OSError, InvalidInputError)):
        _write(d, 3, 7)
    assert {f: (d / f).read_bytes() for f in os.listdir(d)} == before
    np.testing.assert_array_equal(read_trtllm_statistics(d).counts, np.full((2, 1, 3), 15))
    assert sorted(os.listdir(tmp_path)) == ["stats"]


def test_a_failed_swap_puts_the_earlier_set_back(tmp_path, monkeypatch):
    d = tmp_path / "stats"
    _write(d, 2, 5)
    monkeypatch.setattr(_io, "_exchange", lambda a, b: False)
    real_rename = os.rename

    def rename(a, b):
        if os.path.basename(a).endswith(".tmp"):  # the staged set moving in
            raise OSError(5, "Input/output error")
        real_rename(a, b)

    monkeypatch.setattr(_io.os, "rename", rename)
    with pytest.raises((OSError, InvalidInputError)):
        _write(d, 1, 9)
    monkeypatch.setattr(_io.os, "rename", real_rename)
    np.testing.assert_array_equal(read_trtllm_statistics(d).counts, np.full((2, 1, 3), 10))
    assert sorted(os.listdir(tmp_path)) == ["stats"]


def test_a_linked_directory_is_written_through(tmp_path):
    real = tmp_path / "real"
    _write(real, 3, 1)
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    _write(link, 1, 4)
    assert link.is_symlink()
    assert sorted(os.listdir(real)) == ["meta_info.json", "rank0.safetensors"]
    assert read_trtllm_statistics(link).n_ranks == 1


def test_a_file_in_the_way_is_refused(tmp_path):
    f = tmp_path / "stats"
    f.write_text("x")
    with pytest.raises(InvalidInputError, match="not a directory"):
        _write(f, 1, 1)
    assert f.read_text() == "x"


def test_a_rank_file_the_manifest_does_not_list_is_refused(tmp_path):
    """A set written here lists its rank files in meta_info.json: a rank file copied in
    beside it is named and refused, never summed; a listed file that went missing too."""
    d = tmp_path / "stats"
    _write(d, 2, 1)
    meta = json.loads((d / "meta_info.json").read_text())
    assert meta["straggler_rank_files"] == ["rank0.safetensors", "rank1.safetensors"]
    shutil.copy(d / "rank0.safetensors", d / "rank2.safetensors")
    with pytest.raises(InvalidInputError, match=r"\['rank2.safetensors'\].*never summed"):
        read_trtllm_statistics(d)
    (d / "rank2.safetensors").unlink()
    (d / "rank1.safetensors").unlink()
    with pytest.raises(InvalidInputError, match=r"lacks \['rank1.safetensors'\]"):
        read_trtllm_statistics(d)


@pytest.mark.parametrize("listed", ["rank0.safetensors", [], ["rank1.safetensors"], [0]])
def test_a_malformed_manifest_is_refused(tmp_path, listed):
    d = tmp_path / "stats"
    _write(d, 1, 1)
    meta = {"num_experts": 3, "num_experts_per_token": 1, "straggler_rank_files": listed}
    save_json(meta, d / "meta_info.json")
    with pytest.raises(InvalidInputError, match="'straggler_rank_files' field"):
        read_trtllm_statistics(d)


def test_a_directory_without_the_manifest_reads_every_rank_file(tmp_path):
    """TensorRT-LLM's own meta_info.json has no manifest: every rank file counts, as its
    scripts sum them (record into an empty directory)."""
    d = tmp_path / "stats"
    _write(d, 2, 1)
    save_json({"num_experts": 3, "num_experts_per_token": 1}, d / "meta_info.json")
    shutil.copy(d / "rank0.safetensors", d / "rank2.safetensors")
    log = read_trtllm_statistics(d)
    assert log.n_ranks == 3
    np.testing.assert_array_equal(log.counts, np.full((2, 1, 3), 3))
