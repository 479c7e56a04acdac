"""straggler.sim.experiments.sweep: one table from independent cells, on every backend,
resumable."""

import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from straggler.formulations.errors import BackendUnavailableError, InvalidInputError
from straggler.sim.experiments.sweep import SweepError, SweepTable, grid_cells, sweep

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import sweep_cells  # noqa: E402

GRID = {"tokens_per_gpu": [8, 32], "skew": [0.0, 1.2], "method": ["tempo", "uniform"]}
FIXED = {"seed": 3}


@pytest.fixture
def importable(monkeypatch):
    """Worker processes (spawn, Ray) import the cell module by name: put it on their path."""
    old = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", HERE + (os.pathsep + old if old else ""))


@pytest.fixture(scope="module")
def serial_table():
    return sweep(sweep_cells.decode_cell, GRID, fixed=FIXED, backend="serial", progress=False)


def test_grid_order_and_settings_recorded(serial_table):
    t = serial_table
    assert len(t) == 8
    assert t.settings == ("tokens_per_gpu", "skew", "method", "seed")
    assert t.results == ("makespan", "tokens")
    assert [r["method"] for r in t.rows[:2]] == ["tempo", "uniform"]  # last name fastest
    assert all(r["seed"] == 3 for r in t.rows)
    assert t.column("tokens").tolist() == [8 * 4 * 8] * 4 + [32 * 4 * 8] * 4
    # tempo never worse than the even split on the same batch
    mk = t.column("makespan").reshape(2, 2, 2)
    assert (mk[..., 0] <= mk[..., 1] + 1e-9).all()


def test_process_pool_identical(serial_table, importable):
    t = sweep(
        sweep_cells.decode_cell, GRID, fixed=FIXED, backend="process", workers=2, progress=False
    )
    assert t.rows == serial_table.rows


def test_ray_identical(serial_table, importable):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        t = sweep(sweep_cells.decode_cell, GRID, fixed=FIXED, backend="ray", progress=False)
        assert ray.is_initialized()  # a caller's Ray is left running
    finally:
        ray.shutdown()
    assert t.rows == serial_table.rows


def test_ray_missing_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(BackendUnavailableError, match=r"straggler\[ray\]"):
        sweep(sweep_cells.failing_cell, {"x": [1]}, backend="ray", progress=False)


def test_resume_skips_finished_cells(tmp_path, serial_table):
    path = tmp_path / "t.csv"
    calls = []

    # First run: only half the grid.
    half = {**GRID, "tokens_per_gpu": [8]}
    sweep(sweep_cells.decode_cell, half, fixed=FIXED, backend="serial", path=path, progress=False)
    journal = Path(str(path) + ".cells.jsonl")
    assert len(journal.read_text().splitlines()) == 4
    # A torn last line (interrupted write) is ignored and that cell recomputed.
    with journal.open("a") as fh:
        fh.write('{"settings": {"tokens_per_gpu": 32')

    def counting(**kw):
        calls.append(kw)
        return sweep_cells.decode_cell(**kw)

    t = sweep(counting, GRID, fixed=FIXED, backend="serial", path=path, progress=False)
    assert len(calls) == 4 and all(c["tokens_per_gpu"] == 32 for c in calls)
    assert t.rows == serial_table.rows
    back = SweepTable.read_csv(path, settings=t.settings)
    assert back.rows == t.rows
    # Everything finished: nothing recomputed; resume=False recomputes all.
    calls.clear()
    sweep(counting, GRID, fixed=FIXED, backend="serial", path=path, progress=False)
    assert calls == []
    sweep(counting, GRID, fixed=FIXED, backend="serial", path=path, resume=False, progress=False)
    assert len(calls) == 8
    assert len(journal.read_text().splitlines()) == 8


def test_failing_cell_keeps_finished(tmp_path):
    path = tmp_path / "f.csv"
    with pytest.raises(SweepError, match=r"\{'x': 2\}.*cell two fails"):
        sweep(sweep_cells.failing_cell, {"x": [1, 2, 3]}, backend="serial", path=path)
    lines = Path(str(path) + ".cells.jsonl").read_text().splitlines()
    assert [json.loads(s)["settings"] for s in lines] == [{"x": 1}]


def test_progress_on_stderr(capsys):
    """tqdm is a core dependency: the cells, an estimate after the first, then the bar."""
    sweep(sweep_cells.failing_cell, {"x": [1, 3]}, backend="serial", desc="demo")
    err = capsys.readouterr().err
    assert "demo: 2 cells to run on 1 worker(s)" in err
    assert "demo: estimated" in err and "2/2" in err


def test_parquet_needs_pyarrow_or_writes(tmp_path):
    path = tmp_path / "t.parquet"
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(BackendUnavailableError, match="pyarrow"):
            sweep(sweep_cells.failing_cell, {"x": [1]}, backend="serial", path=path)
    else:
        sweep(sweep_cells.failing_cell, {"x": [1]}, backend="serial", path=path)
        assert path.exists()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"grid": {"x": []}}, "non-empty sequence"),
        ({"grid": {"x": "ab"}}, "non-empty sequence"),
        ({"grid": {"x": [[1, 2]]}}, "must be a scalar"),
        ({"grid": {"x": [1, 1]}}, "repeats a cell"),
        ({"grid": {"x": [1]}, "fixed": {"x": 2}}, "both in 'grid' and in 'fixed'"),
        ({"grid": {"not a name": [1]}}, "identifiers"),
        ({"grid": 5}, "'grid' parameter"),
        ({"grid": {"x": [1]}, "backend": "mpi"}, "'backend' parameter"),
        ({"grid": {"x": [1]}, "workers": 0}, "'workers' parameter"),
        ({"grid": {"x": [1]}, "address": "auto"}, "for backend='ray'"),
        ({"grid": {"x": [1]}, "progress": 1}, "'progress' parameter"),
    ],
)
def test_bad_input(kw, match):
    with pytest.raises(InvalidInputError, match=match):
        sweep(sweep_cells.failing_cell, backend=kw.pop("backend", "serial"), **kw)


def test_bad_results():
    with pytest.raises(SweepError, match="must be a scalar"):
        sweep(sweep_cells.bad_result_cell, {"x": [1]}, backend="serial", progress=False)
    with pytest.raises(InvalidInputError, match="must not reuse setting names"):
        sweep(lambda x: {"x": 1}, {"x": [1]}, backend="serial", progress=False)
    for bad in (lambda x: None, lambda x: {1: 2}):
        with pytest.raises(InvalidInputError, match="'func' parameter") as e:
            sweep(bad, {"x": [1]}, backend="serial", progress=False)
        assert isinstance(e.value, SweepError) and "{'x': 1}" in str(e.value)


def test_grid_as_cell_list():
    cells = grid_cells([{"a": 1, "b": "u"}, {"a": 2, "b": "v"}], fixed={"s": 0.5})
    assert cells == [{"a": 1, "b": "u", "s": 0.5}, {"a": 2, "b": "v", "s": 0.5}]
    with pytest.raises(InvalidInputError, match="same setting"):
        grid_cells([{"a": 1}, {"b": 2}])


@pytest.mark.parametrize(
    "line, match",
    [
        ('{"settings": {"x": 1}, "result": [1, 2]}', "result"),
        ('{"settings": {"x": 1}, "result": {"y": [1]}}', "'y'"),
        ('{"settings": {"x": 1}, "result": {"x": 3}}', "names that are settings"),
        ('{"settings": {"x": 2}, "result": {"z": 3}}', "result names"),
        ('{"settings": {"x": 1}}', "settings"),
        ("[1, 2, 3]", "line 2"),
    ],
)
def test_a_bad_journal_is_refused_before_anything_changes(tmp_path, line, match):
    path = tmp_path / "j.csv"
    journal = Path(str(path) + ".cells.jsonl")
    journal.write_text('{"settings": {"x": 0}, "result": {"y": 0}}\n' + line + "\n")
    before = journal.read_bytes()
    with pytest.raises(InvalidInputError, match=match) as e:
        sweep(sweep_cells.square_cell, {"x": [0, 1, 2]}, backend="serial", path=path)
    assert str(journal) in str(e.value) and "resume=False" in str(e.value)
    assert journal.read_bytes() == before and not path.exists()
    t = sweep(sweep_cells.square_cell, {"x": [0, 1, 2]}, backend="serial", path=path, resume=False)
    assert t.column("y").tolist() == [0, 1, 4]


def test_process_backend_in_a_script_without_main_guard(tmp_path):
    import subprocess

    script = tmp_path / "noguard.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "import sweep_cells\n"
        "from straggler.sim.experiments.sweep import sweep\n"
        "try:\n"
        "    sweep(sweep_cells.square_cell, {'x': [1, 2]}, progress=False, workers=2)\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert "Traceback" not in out.stderr, out.stderr
    assert out.stdout.startswith("InvalidInputError"), out.stdout
    assert "__main__" in out.stdout and "backend='serial'" in out.stdout


def test_output_path_checked_before_any_cell_runs(tmp_path):
    (tmp_path / "f").write_text("x")
    for bad in (tmp_path, tmp_path / "f" / "t.csv"):
        with pytest.raises(InvalidInputError, match="path"):
            sweep(sweep_cells.failing_cell, {"x": [2]}, backend="serial", path=bad)


def test_grid_size_bounded_before_the_cells_are_built():
    grid = {f"k{i}": list(range(10)) for i in range(12)}  # 10**12 cells: tens of GiB
    with pytest.raises(InvalidInputError, match="at most 10,000,000 cells"):
        grid_cells(grid)


def test_sweep_table_checks_rows_and_files(tmp_path):
    with pytest.raises(InvalidInputError, match="Row 0"):
        SweepTable([1, 2], settings=["a"])
    with pytest.raises(InvalidInputError, match="'z'"):
        SweepTable([{"a": 1}], settings=["z"])
    with pytest.raises(InvalidInputError, match="'rows'"):
        SweepTable({"a": 1}, settings=["a"])
    t = SweepTable([{"a": 1, "y": 2.5}, {"a": 2}], settings=["a"])  # a missing result: None
    assert t.column("y").tolist() == [2.5, None]
    with pytest.raises(InvalidInputError, match="directory"):
        t.to_csv(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(InvalidInputError, match="is a file"):
        t.to_csv(tmp_path / "f" / "t.csv")
    with pytest.raises(InvalidInputError, match="missing.csv', which does not exist"):
        SweepTable.read_csv(tmp_path / "missing.csv")
    (tmp_path / "b.csv").write_bytes(b"\xff\xfe\x00a")
    with pytest.raises(InvalidInputError, match="not UTF-8 CSV"):
        SweepTable.read_csv(tmp_path / "b.csv")
    t.to_csv(tmp_path / "t.csv")
    back = SweepTable.read_csv(tmp_path / "t.csv", settings=["a"])
    assert back.column("y").tolist() == [2.5, None]


def test_sweep_table_csv_writes_only_what_it_reads_back(tmp_path):
    """to_csv writes numpy scalars as the Python scalars they hold (np.float64(1.5) was
    written as 'np.float64(1.5)' and read back as that string), quotes a carriage return
    (csv.writer left it bare and the row came back split), and refuses, before writing, a
    value read_csv would give back as something else."""
    rows = [{"a": np.int64(3), "y": np.float64(1.5), "ok": np.bool_(True), "s": "x\ry"}]
    t = SweepTable(rows, settings=["a"])
    t.to_csv(tmp_path / "t.csv")
    assert SweepTable.read_csv(tmp_path / "t.csv", settings=["a"]).rows == (
        {"a": 3, "y": 1.5, "ok": True, "s": "x\ry"},
    )
    for value, back in (("1", "1 (int)"), ("nan", "nan (float)"), ("True", "True (bool)"),
                        ("", "None (NoneType)"), ([1, 2], "Got [1, 2]")):  # fmt: skip
        bad = SweepTable([{"a": 1, "y": value}], settings=["a"])
        with pytest.raises(InvalidInputError, match=rf"row 0's 'y'.*{re.escape(back)}"):
            bad.to_csv(tmp_path / "bad.csv")
        assert not (tmp_path / "bad.csv").exists()
    with pytest.raises(InvalidInputError, match="column name 1"):
        SweepTable([{"a": 1, 1: 2}], settings=["a"]).to_csv()
    (tmp_path / "ragged.csv").write_text("a,y\n1\n")
    with pytest.raises(InvalidInputError, match="Record 1 of the sweep table"):
        SweepTable.read_csv(tmp_path / "ragged.csv")
