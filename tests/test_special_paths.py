"""Special paths, on both sides.

Writing (``straggler.formulations._io``): a destination that is a symbolic link is written
through (the target gets the content, the link stays a link); a link loop, a FIFO, a socket
or a device is refused before anything is written. Reading: every public function that
opens a caller's path refuses what is not a regular file to read (not a path, missing, a
folder, a broken link, a FIFO, which would block) with an error naming the parameter.
"""

import contextlib
import gzip
import json
import os
import signal
import socket

import numpy as np
import pytest
from straggler.formulations import CostModel, InvalidInputError
from straggler.formulations._io import (
    atomic_dir,
    atomic_open,
    check_output_dir,
    check_output_file,
)
from straggler.runtime.engines import read_engine_log
from straggler.runtime.engines._common import save_json
from straggler.sim import load_prefix_blocks, load_trace
from straggler.sim.experiments.sweep import SweepTable
from straggler.solvers.dispatch.calibration import (
    CalibrationResult,
    read_calibration_log,
    write_calibration_log,
)


@contextlib.contextmanager
def no_hang(seconds=20):
    def alarm(signum, frame):
        raise TimeoutError(f"the call did not return within {seconds} s (a hang)")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# --- writing ------------------------------------------------------------------------------


def test_a_link_is_written_through(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    save_json({"a": 1}, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(os.listdir(tmp_path)) == ["link.json", "real.json"]


def test_a_relative_link_into_another_folder_is_written_through(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "data" / "real.json").write_text("old")
    link = tmp_path / "out" / "x.json"
    link.symlink_to(os.path.join("..", "data", "real.json"))
    save_json([1, 2], link)
    assert json.loads((tmp_path / "data" / "real.json").read_text()) == [1, 2]
    assert link.is_symlink() and os.listdir(tmp_path / "out") == ["x.json"]
    assert os.listdir(tmp_path / "data") == ["real.json"]  # no temporary left beside it


def test_a_dangling_link_creates_its_target(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "new.json")
    save_json({"a": 1}, link)
    assert link.is_symlink() and json.loads((tmp_path / "new.json").read_text()) == {"a": 1}


def test_a_link_loop_is_refused(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(InvalidInputError, match="symbolic-link loop"):
        save_json({}, a)
    with pytest.raises(InvalidInputError, match="symbolic-link loop"):
        check_output_file(a)
    assert a.is_symlink() and b.is_symlink()


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("check", [check_output_file, check_output_dir])
def test_an_output_where_nothing_can_be_created_is_refused_up_front(tmp_path, check):
    """The check creates a probe instead of trusting permission bits, which tell the
    superuser that /proc is writable; nothing is left behind where it succeeds."""
    with pytest.raises(InvalidInputError, match="nothing can be created in /proc"):
        check("/proc/nope/x.json", "--json")
    assert check(tmp_path / "sub" / "x.json") == str(tmp_path / "sub" / "x.json")
    assert os.listdir(tmp_path) == []


def test_a_fifo_destination_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    with no_hang(), pytest.raises(InvalidInputError, match="FIFO, socket or device"):
        save_json({"a": 1}, fifo)
    assert fifo.is_fifo()
    with pytest.raises(InvalidInputError, match="FIFO, socket or device"):
        check_output_file(fifo)
    assert os.listdir(tmp_path) == ["out.json"]
    link = tmp_path / "via_link.json"
    link.symlink_to(fifo)
    with no_hang(), pytest.raises(InvalidInputError, match="FIFO, socket or device"):
        save_json({"a": 1}, link)
    assert fifo.is_fifo() and link.is_symlink()


def test_a_socket_or_a_device_destination_is_refused(tmp_path):
    sock_path = tmp_path / "s.json"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(sock_path))
        with pytest.raises(InvalidInputError, match="FIFO, socket or device"):
            save_json({}, sock_path)
    finally:
        s.close()
    with pytest.raises(InvalidInputError, match="FIFO, socket or device"):
        with atomic_open(os.devnull) as f:
            f.write("x")


def test_a_set_written_through_a_linked_folder_keeps_the_link(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with atomic_dir(link, lambda name: True) as stage:
        (open(os.path.join(stage, "a"), "w")).close()
    assert link.is_symlink() and os.listdir(real) == ["a"]


# --- reading ------------------------------------------------------------------------------


MOONCAKE = [
    {"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": [1, 2]},
    {"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1]},
]


def _mooncake(path, records=MOONCAKE):
    text = "".join(json.dumps(r) + "\n" for r in records)
    if str(path).endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def test_load_prefix_blocks_reads_what_load_trace_reads(tmp_path):
    for name in ("t.jsonl", "t.jsonl.gz"):
        p = _mooncake(tmp_path / name)
        pb = load_prefix_blocks(p)
        tr = load_trace(p)
        assert len(pb) == len(tr) == 2
        assert [pb.blocks(i).tolist() for i in range(2)] == [[1], [1, 2]]  # arrival order


READERS = {
    "load_prefix_blocks": load_prefix_blocks,
    "load_trace": load_trace,
    "CalibrationResult.load": CalibrationResult.load,
    "read_calibration_log": read_calibration_log,
    "SweepTable.read_csv": SweepTable.read_csv,
}


def _special(kind, tmp_path):
    if kind == "int":
        return 0  # opened, it would read standard input
    if kind == "bytes":
        return b"trace.jsonl"
    if kind == "empty":
        return ""
    if kind == "missing":
        return tmp_path / "nothing.jsonl"
    if kind == "folder":
        return tmp_path
    if kind == "broken link":
        (tmp_path / "l").symlink_to(tmp_path / "gone")
        return tmp_path / "l"
    if kind == "fifo":
        os.mkfifo(tmp_path / "f.jsonl")
        return tmp_path / "f.jsonl"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["int", "bytes", "empty", "missing", "folder", "broken link", "fifo"]
)
@pytest.mark.parametrize("func", list(READERS))
def test_readers_refuse_what_is_not_a_file(tmp_path, func, kind):
    path = _special(kind, tmp_path)
    with no_hang(), pytest.raises(InvalidInputError, match=f"'path' parameter of {func}"):
        READERS[func](path)


def test_load_prefix_blocks_refuses_binary_and_bad_text(tmp_path):
    (tmp_path / "b.jsonl").write_bytes(b"\x00\x01\x02\xff")
    with pytest.raises(InvalidInputError, match="b.jsonl"):
        load_prefix_blocks(tmp_path / "b.jsonl")
    (tmp_path / "z.jsonl.gz").write_bytes(gzip.compress(b'{"timestamp": 1}\n')[:-6])
    with pytest.raises(InvalidInputError, match="z.jsonl.gz"):
        load_prefix_blocks(tmp_path / "z.jsonl.gz")
    (tmp_path / "d.jsonl").write_text("[" * 100000 + "\n")
    with pytest.raises(InvalidInputError, match="Line 1 of"):
        load_prefix_blocks(tmp_path / "d.jsonl")


def test_engine_readers_refuse_a_fifo_through_a_link(tmp_path):
    os.mkfifo(tmp_path / "f")
    (tmp_path / "x.json").symlink_to(tmp_path / "f")
    with no_hang(), pytest.raises(InvalidInputError, match="not a regular file"):
        read_engine_log(tmp_path / "x.json")
    np.testing.assert_equal(os.path.exists(tmp_path / "f"), True)


def _a_result():
    return CalibrationResult(
        cost=CostModel(a=1, b=1, c=1, beta=1), params={}, intervals={}, level=0.95,
        rel_rms=0.0, max_rel_error=0.0, n_star=1.0, piece=np.zeros(0, np.int64),
        bootstrap_params=np.zeros((0, 0)), iterations=1, converged=True, pieces=2, tile=128,
    )  # fmt: skip


WRITERS = {
    "SweepTable.to_csv": lambda p: SweepTable([{"a": 1}], settings=["a"]).to_csv(p),
    "write_calibration_log": lambda p: write_calibration_log(p, [1], [2], [3.5]),
    "CalibrationResult.save": lambda p: _a_result().save(p),
}


@pytest.mark.parametrize("kind", ["int", "bytes", "empty"])
@pytest.mark.parametrize("func", list(WRITERS))
def test_writers_refuse_what_is_not_a_path(tmp_path, monkeypatch, func, kind):
    """An int or bytes path raised TypeError from os.fspath or os.path.join."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInputError, match=f"'path' parameter of {func}"):
        WRITERS[func](_special(kind, tmp_path))
    assert os.listdir(tmp_path) == []
