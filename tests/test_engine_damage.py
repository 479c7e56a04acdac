"""Damage is not read as data: a torch ``.pt`` file (a zip archive) whose bytes no longer
match its CRC-32 checksums, or whose directory records disagree with what was checked, is
refused with an error naming the file; truncated files of every binary format are refused.

(safetensors has no checksum: a flipped bit inside a tensor's bytes is undetectable, and
only its header and length are checked; JSON and YAML are text, checked field by field.)
"""

import importlib.util
import os
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from straggler.formulations import InvalidInputError
from straggler.runtime.engines import (
    read_sglang_recorder,
    read_trtllm_statistics,
    read_vllm_state,
    vllm_maps,
    write_sglang_detail_dump,
    write_sglang_stat_dump,
    write_trtllm_statistics,
    write_vllm_state,
)

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_ST = importlib.util.find_spec("safetensors") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
DAMAGE = settings(
    max_examples=200 if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else 40,
    suppress_health_check=list(HealthCheck),
    database=None,
    deadline=None,
)


def _member_offset(path, suffix):
    """Where the bytes of the archive member ending in ``suffix`` start."""
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        n, m = np.frombuffer(f.read(4), dtype="<u2")
    return info.header_offset + 30 + int(n) + int(m)


def _flip(path, offset, bit):
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 1 << bit
    with open(path, "wb") as f:
        f.write(bytes(data))


@needs_torch
def test_a_flipped_bit_in_a_tensor_is_refused(tmp_path):
    path = write_sglang_stat_dump(tmp_path, [[[42, 7, 3]]], timestamp=1.0)
    # the first byte of the counts: 42 = 0b101010, bit 6 makes it 106
    _flip(path, _member_offset(path, "data/0"), 6)
    with pytest.raises(InvalidInputError, match="damaged torch file.*CRC-32") as exc:
        read_sglang_recorder(path)
    assert path in str(exc.value)


@needs_torch
def test_a_file_flagged_as_a_folder_is_refused(tmp_path):
    """miniz (inside torch.load) reads a member whose directory record says "folder" as
    empty and hands back whatever memory the tensor got: zipfile's CRC check skips it."""
    path = write_sglang_stat_dump(tmp_path, [[[42, 7, 3]]], timestamp=1.0)
    with zipfile.ZipFile(path) as z:
        start = z.start_dir
        names = [i.filename for i in z.infolist()]
    data = bytearray(open(path, "rb").read())
    at = start
    for name in names:  # walk the central directory to the tensor's record
        n, m, k = np.frombuffer(bytes(data[at + 28 : at + 34]), dtype="<u2")
        if name.endswith("data/0"):
            data[at + 38] ^= 0x10  # external attributes: MS-DOS folder
            break
        at += 46 + int(n) + int(m) + int(k)
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(InvalidInputError, match="damaged torch file"):
        read_sglang_recorder(path)


def _pt_files(d):
    """A stat dump, a per-pass dump and a vLLM state as .pt, with their readers and what
    they read."""
    stat = write_sglang_stat_dump(os.path.join(d, "a"), [[[42, 7, 3]], [[0, 1, 2]]], timestamp=1)
    detail = write_sglang_detail_dump(
        os.path.join(d, "b"),
        [{"forward_pass_id": 0, "global_physical_count": [[3, 4, 5]]}],
        [[0, 1, 0]],
        rank=0,
        timestamp=1.0,
    )
    state = dict(vllm_maps([[0, 1, 0]], 2, width=None), expert_load_window=[[[3, 4, 5]]])
    vllm = write_vllm_state(os.path.join(d, "c", "s_rank0.pt"), state)
    return [(stat, read_sglang_recorder), (detail, read_sglang_recorder), (vllm, read_vllm_state)]


@needs_torch
@DAMAGE
@given(
    which=st.integers(0, 2),
    where=st.floats(0, 1, exclude_max=True),
    bit=st.integers(0, 7),
    how=st.sampled_from(["flip", "flip in a tensor", "cut"]),
)
def test_damaged_pt_files_are_refused_or_read_unchanged(tmp_path_factory, which, where, bit, how):
    d = tmp_path_factory.mktemp("pt")
    path, read = _pt_files(d)[which]
    want = read(path).counts
    data = open(path, "rb").read()
    i = int(where * len(data))
    if how == "flip in a tensor":  # the bytes of the first tensor stored (12 bytes at least)
        i = _member_offset(path, "data/0") + int(where * 12)
    if how == "cut":
        damaged = data[:i]
    else:
        damaged = bytearray(data)
        damaged[i] ^= 1 << bit
    with open(path, "wb") as f:
        f.write(bytes(damaged))
    try:
        got = read(path).counts
    except InvalidInputError as exc:
        assert os.path.basename(path) in str(exc)
        return
    np.testing.assert_array_equal(got, want)  # a byte no reader looks at (a file name, ...)


@pytest.mark.skipif(not HAS_ST, reason="needs safetensors")
def test_truncated_or_extended_safetensors_are_refused(tmp_path):
    d = tmp_path / "s"
    write_trtllm_statistics(d, np.full((1, 1, 1, 3), 42), layer_ids=[3], top_k=1)
    path = d / "rank0.safetensors"
    data = path.read_bytes()
    for damaged in [data[:k] for k in range(len(data))] + [data + b"\0", data + data]:
        path.write_bytes(damaged)
        with pytest.raises(InvalidInputError, match="rank0.safetensors"):
            read_trtllm_statistics(d)
