"""Fuzzing the engine path against the library's contract: engine files, the three commands,
and the runtime's stateful objects.

Engine files: read, they give an ``EngineLog`` whose invariants hold (and, for a file left
valid, what was written), or an ``InvalidInputError`` naming the file. Commands: exit 0 (or
1 when a compared method failed), or exit 2 with one ``prog: error:`` line; never a
traceback, never an output written after a refusal. ``TablePublisher`` and ``SolverWorker``:
a refused call names its parameter and changes nothing; a published table is a
distribution over each expert's listed replicas. Damaged binary files (a bit flipped, cut
short): refused naming the file, or read exactly as written (a flip safetensors cannot
detect: a valid log). TensorRT-LLM statistics written over each other, some writes failing
on one rank file: the directory reads as the last write that succeeded. Special paths
(missing, folder, FIFO, socket, device, links, an int): every reader refuses them without
blocking; a writer writes through a link and refuses the rest. Each of these properties is
shown to fail against a deliberately broken reader or writer. (The writer/reader round trip
of every engine format: ``tests/test_engine_contract.py``.)

Strategies: ``straggler.proofs.engine_strategies`` (``engine_files``,
``binary_engine_files``, ``statistics_writes``, ``make_special_path``) and
``straggler.proofs.fuzz.{cli_calls, publisher_ops, worker_ops}``. Examples: 20 per test by
default, hundreds with ``HYPOTHESIS_PROFILE=ci`` (fewer for the commands, which run work).
"""

import contextlib
import importlib.util
import io
import os
import signal
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from straggler.formulations import CostModel, InvalidInputError, WriteError
from straggler.formulations.validation import MAX_EXACT_INT
from straggler.proofs.engine_strategies import (
    SPECIAL_PATHS,
    binary_engine_files,
    engine_files,
    make_special_path,
    statistics_writes,
)
from straggler.proofs.fuzz import cli_calls, publisher_ops, worker_ops
from straggler.runtime import SolverWorker
from straggler.runtime.engines import read_engine_log, write_sglang_init_location

CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"
N = 400 if CI else 20
N_CLI = 100 if CI else 20  # each valid invocation runs a small plan / simulation
FUZZ = settings(max_examples=N, suppress_health_check=list(HealthCheck), database=None)
FUZZ_CLI = settings(max_examples=N_CLI, suppress_health_check=list(HealthCheck), database=None)
HAS_TORCH = importlib.util.find_spec("torch") is not None
#: Seconds a read or write of a special path may take before it counts as a hang.
SPECIAL_HANG_S = 30


@contextlib.contextmanager
def no_hang(seconds=120):
    def alarm(signum, frame):
        raise TimeoutError(f"the call did not return within {seconds} s (a hang)")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def check_log(log) -> None:
    """The invariants of any EngineLog a reader returns."""
    E = log.n_experts
    assert isinstance(E, int) and E >= 1
    if log.counts is not None:
        c = log.counts
        assert c.dtype == np.int64 and c.ndim == 3 and c.shape[1:] == (log.n_layers, E)
        assert (c >= 0).all() and float(c.astype(float).sum()) <= MAX_EXACT_INT
    if log.physical_to_logical is not None:
        m = log.physical_to_logical
        assert m.ndim == 2 and m.shape[1] >= 1 and (m >= -1).all() and (m < E).all()


@FUZZ
@given(engine_files())
def test_engine_files(ef):
    with tempfile.TemporaryDirectory() as d:
        path = ef.write(d)
        try:
            with no_hang():
                log = read_engine_log(path)
        except InvalidInputError as exc:
            assert not ef.valid, f"a valid {ef.kind} file was refused: {exc}"
            assert ef.name in str(exc), f"the error does not name the file: {exc}"
            return
    check_log(log)
    if ef.valid:
        assert log.n_experts == ef.want["n_experts"]
        for k in ("counts", "physical_to_logical"):
            if k in ef.want:
                np.testing.assert_array_equal(getattr(log, k), ef.want[k])


def _run_cli(command: str, argv: list) -> tuple[int, str]:
    from straggler.runtime.commands.compare import main as compare_main
    from straggler.runtime.commands.plan import main as plan_main
    from straggler.runtime.commands.simulate import main as simulate_main

    main = {"plan": plan_main, "simulate": simulate_main, "compare": compare_main}[command]
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), no_hang(300):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def small_log(tmp_path_factory):
    d = tmp_path_factory.mktemp("log")
    rng = np.random.default_rng(0)
    p = d / "stat.json"
    from straggler.runtime.engines._common import save_json

    save_json({"logical_count": rng.integers(0, 50, (3, 1, 4)), "rank": 0}, p)
    return str(p)


@FUZZ_CLI
@given(call=cli_calls())
def test_commands(call, small_log):
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "a_file"), "w") as f:
            f.write("x")
        before = sorted(os.listdir(tmp))
        rc, err = _run_cli(call.command, call.resolve(tmp, small_log))
        assert "Traceback" not in err, err
        assert rc in (0, 1, 2), (rc, err)
        if rc == 2:
            errors = [x for x in err.splitlines() if "error:" in x]
            assert len(errors) == 1, err
            assert sorted(os.listdir(tmp)) == before  # refused: nothing written
        else:
            assert not (call.spoiled - {"--seed", "--skew"}) or rc == 0, (call, err)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@FUZZ
@given(ops=publisher_ops((2, 3, 2)))
def test_publisher_sequences(ops):
    from straggler.runtime import TablePublisher

    l2p = np.array([[[0, 1], [2, -1], [3, 4]], [[5, -1], [0, 6], [7, 1]]])
    pub = TablePublisher(l2p, device="cpu")
    for op, a, b in ops:
        before = (pub.log2phy.clone().numpy(), pub.snapshot(), pub.version)
        try:
            pub.publish(a, rows=b) if op == "publish" else pub.reset(a, b)
        except InvalidInputError as exc:
            names = ("'probs'", "'rows'") if op == "publish" else ("'log2phy'", "'probs'")
            assert any(n in str(exc) for n in names), str(exc)
            assert np.array_equal(pub.log2phy.numpy(), before[0])
            assert np.array_equal(pub.snapshot(), before[1]) and pub.version == before[2]
            continue
        assert pub.version == before[2] + 1
        table, listed = pub.snapshot(), pub.log2phy.numpy() >= 0
        assert np.isfinite(table).all() and (table >= 0).all() and (table[~listed] == 0).all()
        has = listed.any(axis=-1)
        assert np.allclose(table.sum(axis=-1)[has], 1, atol=1e-5)


@FUZZ
@given(ops=worker_ops(2, 3, 4))
def test_worker_engine_side_sequences(ops):
    p2l = np.array([[0, 1, 2, 0], [2, 1, 0, 1]])
    w = SolverWorker(p2l, 2, CostModel(a=0, b=15, c=0, beta=0.1))
    for op, arg in ops:
        before = (w.log2phy.copy(), w._place_version, w._window, w._p2l.copy())
        try:
            w.submit(arg) if op == "submit" else w.set_placement(arg)
        except InvalidInputError as exc:
            msg = str(exc)
            # valid input on an unstarted worker is refused for that; bad input by name
            assert "'counts'" in msg or "'physical_to_logical'" in msg or "start" in msg, msg
            after = (w.log2phy, w._place_version, w._window, w._p2l)
            assert all(np.array_equal(x, y) for x, y in zip(before, after))
            continue
        pytest.fail(f"{op} on an unstarted worker did not refuse")


def test_cli_strategy_reaches_every_command():
    seen = set()

    @settings(max_examples=30, database=None)
    @given(cli_calls())
    def collect(call):
        seen.add(call.command)

    collect()
    assert seen == {"plan", "simulate", "compare"}


def test_sglang_writer_then_reader_round_trip(tmp_path):
    p = write_sglang_init_location(tmp_path / "x.json", physical_to_logical=[[0, 1, 1]])
    assert read_engine_log(p).physical_to_logical.tolist() == [[0, 1, 1]]


@pytest.fixture(scope="module")
def started_worker():
    p2l = np.array([[0, 1, 2, 0], [2, 1, 0, 1]])
    w = SolverWorker(p2l, 2, CostModel(a=0, b=15, c=0, beta=0.1), period=0.01).start()
    assert w.wait_ready(600), w.status()
    yield w
    w.close()


@pytest.mark.slow
@settings(max_examples=50 if CI else 10, suppress_health_check=list(HealthCheck), database=None)
@given(ops=worker_ops(2, 3, 4))
def test_started_worker_sequences(ops, started_worker):
    """On a live worker: a refused call changes neither the engine side nor the shared
    block, the worker stays healthy, and every accepted window is solved for the placement
    in force."""
    w = started_worker
    for op, arg in ops:
        before = (w.log2phy.copy(), w._place_version, w._window, w._views["place"].copy())
        try:
            got = w.submit(arg) if op == "submit" else w.set_placement(arg)
        except InvalidInputError as exc:
            assert "'counts'" in str(exc) or "'physical_to_logical'" in str(exc), str(exc)
            after = (w.log2phy, w._place_version, w._window, w._views["place"])
            assert all(np.array_equal(x, y) for x, y in zip(before, after))
            continue
        if op == "submit":
            t = w.wait_tables(got, timeout=60)
            assert t is not None and t.placement == w._place_version, w.status()
    st = w.status()
    assert st.healthy and st.n_failing == 0, st


# --- damage, sets, special paths ------------------------------------------------------------


@FUZZ
@given(bf=binary_engine_files(torch_ok=HAS_TORCH))
def test_damaged_binary_files(bf):
    """A file with a bit flipped or cut short: refused naming the file (always, when cut
    short), or read exactly as written (a byte no reader uses, such as a time stamp inside
    the archive). A flip the format cannot detect (inside a safetensors tensor, in JSON
    text) may be read, as a valid log."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, bf.name)
        with open(path, "wb") as f:
            f.write(bf.data)
        try:
            with no_hang():
                log = read_engine_log(path)
        except InvalidInputError as exc:
            assert bf.damage != "none", f"an undamaged file was refused: {exc}"
            assert bf.name in str(exc), str(exc)
            return
    assert bf.damage != "truncate", "a truncated file was read"
    check_log(log)
    if bf.detectable:
        np.testing.assert_array_equal(log.counts, bf.want)


@pytest.mark.skipif(importlib.util.find_spec("safetensors") is None, reason="safetensors")
@FUZZ
@given(writes=statistics_writes())
def test_statistics_sets_written_over_each_other(writes):
    """TensorRT-LLM statistics written again and again into one directory, some writes
    failing on one rank file: the directory always reads as the last write that succeeded,
    never as a mix, never with a stale rank."""
    from straggler.runtime.engines import read_trtllm_statistics, write_trtllm_statistics
    from straggler.runtime.engines import trtllm as trtllm_mod

    real = trtllm_mod.save_safetensors
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "stats")
        last = None
        for n, fill, fail in writes:
            calls = []

            def save(tensors, path, fail=fail, calls=calls):
                calls.append(path)
                if fail is not None and len(calls) == fail + 1:
                    raise OSError(28, "No space left on device")
                real(tensors, path)

            counts = np.full((n, 2, 1, 3), fill, dtype=np.int64)
            trtllm_mod.save_safetensors = save
            try:
                write_trtllm_statistics(d, counts, layer_ids=[3], top_k=1)
                last = counts
            except WriteError as exc:
                assert fail is not None and d in str(exc), str(exc)
            finally:
                trtllm_mod.save_safetensors = real
            if last is None:
                assert not os.path.exists(d)
                continue
            log = read_trtllm_statistics(d)
            assert log.n_ranks == last.shape[0]
            np.testing.assert_array_equal(log.counts, last.sum(axis=0))
            assert sorted(os.listdir(tmp)) == ["stats"]  # no staging folder left


def _readers():
    from straggler.runtime.engines import read_eplb_maps
    from straggler.sim import load_prefix_blocks, load_trace
    from straggler.solvers import CalibrationResult

    return {
        "read_engine_log": read_engine_log,
        "read_eplb_maps": read_eplb_maps,
        "load_trace": load_trace,
        "load_prefix_blocks": load_prefix_blocks,
        "CalibrationResult.load": CalibrationResult.load,
    }


@FUZZ
@given(kind=st.sampled_from(SPECIAL_PATHS), reader=st.sampled_from(sorted(_readers())))
def test_readers_on_special_paths(kind, reader):
    """Anything but a regular file is refused by every reader, naming the parameter or the
    file, without blocking; a link to a file is followed (and then read, or refused for its
    content)."""
    with tempfile.TemporaryDirectory() as d:
        path, cleanup = make_special_path(kind, d)
        try:
            with no_hang(SPECIAL_HANG_S):
                _readers()[reader](path)
        except InvalidInputError as exc:
            msg = str(exc)
            assert "'path'" in msg or str(path) in msg or "x.json" in msg, msg
            return
        finally:
            cleanup()
    assert kind == "link to a file", f"{reader} read a {kind}"


def _writers():
    """Each writer of a single file: ``(name, write(path), read(path) == what was written)``."""
    from straggler.runtime.engines import (
        read_eplb_maps,
        read_vllm_state,
        vllm_maps,
        write_eplb_maps,
        write_vllm_state,
    )
    from straggler.sim.experiments.sweep import SweepTable
    from straggler.solvers.dispatch.calibration import (
        read_calibration_log,
        write_calibration_log,
    )

    m = [[0, 1, 1]]
    v = vllm_maps(m, 2, width=None)
    l2p, cnt = v["logical_to_physical_map"], v["logical_replica_count"]
    return {
        "write_sglang_init_location": (
            "x.json",
            lambda p: write_sglang_init_location(p, physical_to_logical=m),
            lambda p: read_engine_log(p).physical_to_logical.tolist() == m,
        ),
        "write_vllm_state": (
            "x.json",
            lambda p: write_vllm_state(p, v),
            lambda p: read_vllm_state(p).physical_to_logical.tolist() == m,
        ),
        "write_eplb_maps": (
            "x.json",
            lambda p: write_eplb_maps(p, m, l2p, cnt),
            lambda p: read_eplb_maps(p).physical_to_logical.tolist() == m,
        ),
        "write_calibration_log": (
            "x.csv",
            lambda p: write_calibration_log(p, [1], [2], [3.5]),
            lambda p: read_calibration_log(p)["t"].tolist() == [3.5],
        ),
        "SweepTable.to_csv": (
            "x.csv",
            lambda p: SweepTable([{"a": 1}], settings=["a"]).to_csv(p),
            lambda p: SweepTable.read_csv(p).rows == ({"a": 1},),
        ),
    }


@FUZZ
@given(kind=st.sampled_from(SPECIAL_PATHS), writer=st.sampled_from(sorted(_writers())))
def test_writers_on_special_paths(kind, writer):
    """A write to a link goes to its target (the link stays); to anything else that is not a
    regular file (or a path to one), it is refused before anything is written."""
    name, write, read_back = _writers()[writer]
    with tempfile.TemporaryDirectory() as d:
        path, cleanup = make_special_path(kind, d, name)
        try:
            with no_hang(SPECIAL_HANG_S):
                write(path)
        except InvalidInputError:
            assert kind not in ("missing", "link to a file", "broken link"), kind
            return
        finally:
            cleanup()
        assert kind in ("missing", "link to a file", "broken link"), f"wrote to a {kind}"
        if kind != "missing":
            assert os.path.islink(path)
        assert read_back(path)


# --- each property can fail -------------------------------------------------------------------


def test_damage_property_can_fail(falsified, monkeypatch):
    """A torch reader that skips the archive's checksums reads a flipped tensor bit as data:
    the property fails."""
    if not HAS_TORCH:
        pytest.skip("torch not installed")
    from straggler.runtime.engines import _common

    monkeypatch.setattr(_common, "check_zip_members", lambda path, what: None)
    assert falsified(test_damaged_binary_files, bf=binary_engine_files())


@pytest.mark.skipif(importlib.util.find_spec("safetensors") is None, reason="safetensors")
def test_statistics_set_property_can_fail(falsified, monkeypatch):
    """A statistics writer that writes into the directory in place (no staging folder)
    leaves the ranks of a larger earlier write, and half a set after a failure: the property
    fails."""
    from straggler.formulations._io import write_error
    from straggler.runtime.engines import trtllm as trtllm_mod

    @contextlib.contextmanager
    def in_place(directory, owns):
        os.makedirs(directory, exist_ok=True)
        try:
            yield directory
        except OSError as exc:
            raise write_error(directory, exc) from None

    monkeypatch.setattr(trtllm_mod, "atomic_dir", in_place)
    assert falsified(test_statistics_sets_written_over_each_other, writes=statistics_writes())


def test_special_path_properties_can_fail(falsified, monkeypatch):
    """Readers that open whatever they are given (a FIFO blocks them), and writers that
    replace whatever is at the path (a link, a FIFO): the properties fail."""
    from straggler.formulations import _io
    from straggler.runtime.engines import _common

    monkeypatch.setattr(sys.modules[__name__], "SPECIAL_HANG_S", 1)
    monkeypatch.setattr(_io, "file_problem", lambda path: None)
    monkeypatch.setattr(_common, "file_problem", lambda path: None)
    kinds, readers = st.sampled_from(SPECIAL_PATHS), st.sampled_from(sorted(_readers()))
    assert falsified(test_readers_on_special_paths, kind=kinds, reader=readers)
    monkeypatch.setattr(_io, "_write_target", lambda p: p)
    writers = st.sampled_from(sorted(_writers()))
    assert falsified(test_writers_on_special_paths, kind=kinds, writer=writers)
