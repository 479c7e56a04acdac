"""One sweep runner: independent cells on one process, a local process pool, or Ray.

A sweep calls ``func(**settings)`` once per cell of a grid and gathers what each call
returns (a mapping of scalar results) into one :class:`SweepTable`, one row per cell with
every setting beside its results. The phase diagram and the routing load sweeps use it.

* **Cells are independent tasks.** ``func`` must be a module-level function (it is pickled
  by reference to reach worker processes) and deterministic given its settings (put the
  seed in the settings): every backend then gives the same table, row for row, in grid
  order, whatever order the cells finish in.
* **Backends.** ``"serial"`` runs in this process; ``"process"`` (default) on a local pool
  of ``workers`` processes started with ``spawn`` (a forked child would inherit dead
  thread pools, e.g. tempo's stack solver, and hang on them; a script using it needs the
  ``if __name__ == "__main__":`` guard, as every spawn-based pool does: a script without
  one, or a ``func`` defined interactively, is refused before any worker starts);
  ``"ray"`` as Ray tasks
  (optional extra ``straggler[ray]``): a Ray already initialized by the caller is used as
  it is, otherwise ``ray.init(address=address)`` reaches an existing cluster, or, with
  ``address=None``, starts a local one of ``workers`` CPUs that is shut down at the end.
* **Resumable.** With ``path``, each finished cell is appended (and flushed) to the journal
  ``<path>.cells.jsonl`` as it finishes; a later call with the same ``path`` computes only
  the cells whose settings are not in the journal (``resume=False`` starts afresh). The
  journal is checked in full before the sweep starts: a torn line (an interrupted write)
  reruns its cell; a malformed record is an error naming the line. The
  table itself is written to ``path`` at the end: CSV, or Parquet when ``path`` ends in
  ``.parquet`` (needs ``pyarrow``). JSON keeps the journal's types exact, so a resumed
  sweep returns the very table an uninterrupted one does.
* **Progress.** On stderr, the cells to run before the first starts, an estimate of the
  time once the first has finished, and a tqdm bar with the time left; ``progress=False`` is
  silent.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import itertools
import json
import math
import multiprocessing
import numbers
import os
import pickle
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from ...formulations._io import (
    atomic_open,
    atomic_path,
    check_input_file,
    check_output_file,
    check_path_arg,
    utf8_problem,
)
from ...formulations.errors import BackendUnavailableError, InvalidInputError, StragglerError
from ...formulations.validation import check_bool, check_choice, check_int, check_type, describe

__all__ = ["sweep", "SweepTable", "SweepError", "grid_cells", "SWEEP_BACKENDS"]

#: The backends of :func:`sweep`.
SWEEP_BACKENDS = ("serial", "process", "ray")

_FUNC = "sweep"
#: Most cells a grid may expand to (checked before they are built).
MAX_CELLS = 10_000_000


class SweepError(StragglerError):
    """A cell of a sweep raised; the cells finished before it are in the journal."""


def _scalar(value, what: str, func: str = _FUNC):
    """``value`` as a plain Python scalar (bool, int, float, str or None), or raise."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise InvalidInputError(
        f"{what} of {func} must be a scalar (bool, int, float, str or None). "
        f"Got {describe(value)} instead."
    )


def grid_cells(grid, fixed: Mapping | None = None) -> list[dict]:
    """The cells of a grid, in order: one dict of settings per cell.

    Parameters
    ----------
    grid : mapping of str to sequence, or sequence of mappings
        ``{name: values}`` gives the Cartesian product (the first name varies slowest,
        as in ``itertools.product``); a sequence of mappings lists the cells themselves
        (all with the same names).
    fixed : mapping of str to scalar, optional
        Settings shared by every cell (recorded in every row).

    Examples
    --------
    >>> grid_cells({"b": [1, 2], "s": [0.5]}, fixed={"seed": 0})
    [{'b': 1, 's': 0.5, 'seed': 0}, {'b': 2, 's': 0.5, 'seed': 0}]
    """
    fixed = {} if fixed is None else fixed
    check_type(fixed, "fixed", _FUNC, Mapping, "a mapping of setting names to scalars")
    if isinstance(grid, Mapping):
        names = list(grid)
        values = []
        for name in names:
            v = grid[name]
            if (
                isinstance(v, (str, bytes))
                or not isinstance(v, (Sequence, np.ndarray))
                or not len(v)
            ):
                raise InvalidInputError(
                    f"The values of grid setting {name!r} of {_FUNC} must be a non-empty "
                    f"sequence. Got {describe(v)} instead."
                )
            values.append([_scalar(x, f"A value of grid setting {name!r}") for x in v])
        n_cells = math.prod(len(v) for v in values)
        if n_cells > MAX_CELLS:  # checked before the cells are built
            raise InvalidInputError(
                f"The 'grid' parameter of {_FUNC} must have at most {MAX_CELLS:,} cells. Got "
                f"{n_cells:,} ({' x '.join(str(len(v)) for v in values)}) instead."
            )
        cells = [dict(zip(names, combo)) for combo in itertools.product(*values)]
    elif isinstance(grid, Sequence) and not isinstance(grid, (str, bytes)) and len(grid):
        cells = []
        for cell in grid:
            check_type(cell, "grid", _FUNC, Mapping, "a mapping or a sequence of mappings")
            cells.append({k: _scalar(v, f"Setting {k!r}") for k, v in cell.items()})
        names = list(cells[0])
        if any(list(c) != names for c in cells):
            raise InvalidInputError(
                f"The cells of the 'grid' parameter of {_FUNC} must all have the same setting "
                f"names in the same order. Got {names} and "
                f"{next(list(c) for c in cells if list(c) != names)} instead."
            )
    else:
        raise InvalidInputError(
            f"The 'grid' parameter of {_FUNC} must be a mapping of setting names to non-empty "
            f"sequences, or a non-empty sequence of mappings. Got {describe(grid)} instead."
        )
    for name in [*names, *fixed]:
        if not isinstance(name, str) or not name.isidentifier():
            raise InvalidInputError(
                f"Setting names of {_FUNC} must be Python identifiers (they become keyword "
                f"arguments of func). Got {describe(name)} instead."
            )
    clash = sorted(set(names) & set(fixed))
    if clash:
        raise InvalidInputError(
            f"The settings {clash} of {_FUNC} are given both in 'grid' and in 'fixed'."
        )
    fixed = {k: _scalar(v, f"Fixed setting {k!r}") for k, v in fixed.items()}
    cells = [{**c, **fixed} for c in cells]
    keys = [_key(c) for c in cells]
    if len(set(keys)) != len(keys):
        raise InvalidInputError(f"The 'grid' parameter of {_FUNC} repeats a cell.")
    return cells


def _key(settings: Mapping) -> str:
    """A cell's identity in the journal: its settings as canonical JSON."""
    return json.dumps(settings, sort_keys=True, allow_nan=True)


def _run_cell(func, index: int, settings: dict):
    """What a worker runs: one cell, its results as plain scalars."""
    out = func(**settings)
    if not isinstance(out, Mapping):
        raise InvalidInputError(
            f"The 'func' parameter of {_FUNC} must return a mapping of result names to "
            f"scalars. Got {describe(out)} instead."
        )
    res = {}
    for k, v in out.items():
        if not isinstance(k, str):
            raise InvalidInputError(
                f"The 'func' parameter of {_FUNC} must return string result names. Got "
                f"{describe(k)} instead."
            )
        res[k] = _scalar(v, f"Result {k!r}")
    return index, res


class _Progress:
    """On stderr: the cells to run before the first starts, an estimate of the time they take
    once the first has finished (its wall time times the cells left, over the workers), and a
    tqdm bar with the time left."""

    def __init__(self, total: int, done: int, desc: str, enabled: bool, workers: int = 1):
        self.total, self.done, self.desc, self.enabled = total, done, desc, enabled
        self.workers = max(1, workers)
        self.t0 = time.perf_counter()
        self.ran = 0
        self.bar = None
        if not enabled:
            return
        from tqdm.auto import tqdm

        todo = total - done
        before = f" ({done} of {total} done before)" if done else ""
        print(
            f"{desc}: {todo} cells to run{before} on {self.workers} worker(s); estimated time "
            "after the first cell",
            file=sys.stderr,
        )
        self.bar = tqdm(total=total, initial=done, desc=desc, unit="cell", file=sys.stderr)

    def update(self) -> None:
        self.done += 1
        self.ran += 1
        if not self.enabled:
            return
        self.bar.update(1)
        left = self.total - self.done
        if self.ran == 1 and left:
            first = time.perf_counter() - self.t0
            est = first * left / min(self.workers, left)
            when = f"{est:.0f} s" if est < 90 else f"{est / 60:.1f} min"
            self.bar.write(
                f"{self.desc}: estimated {when} more for {left} cells (the first took "
                f"{first:.1f} s)",
                file=sys.stderr,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _ends_in_newline(path: Path) -> bool:
    with path.open("rb") as fh:
        fh.seek(-1, os.SEEK_END)
        return fh.read(1) == b"\n"


def _read_journal(path: Path, settings_names=()) -> dict[str, dict]:
    """The finished cells of a journal, every record checked: a line that is not JSON (torn
    by an interrupted write) is skipped and its cell reruns; a JSON line that is not a
    ``{"settings": {...}, "result": {...}}`` record of scalars, results whose names differ
    from the other records' or that are setting names of this grid, is an error naming the
    file and the line."""
    done: dict[str, dict] = {}
    names = None
    try:
        fh = path.open(encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"Cannot read the sweep journal {path}: {exc.strerror}.") from None
    with fh:
        for no, line in enumerate(fh, 1):
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                continue  # a line torn by an interrupted write: that cell reruns
            where = f"{path}, line {no}"

            def bad(what, where=where):
                return InvalidInputError(
                    f'The sweep journal {where} must hold {{"settings": {{name: scalar}}, '
                    f'"result": {{name: scalar}}}} records. Got {what} instead (move the '
                    "journal away, or pass resume=False to start afresh)."
                )

            if not isinstance(rec, dict) or set(rec) != {"settings", "result"}:
                raise bad(f"{str(rec)[:80]!r}")
            settings, result = rec["settings"], rec["result"]
            for part, d in (("settings", settings), ("result", result)):
                if not isinstance(d, dict) or not d and part == "settings":
                    raise bad(f"{part} {str(d)[:60]!r}")
                for k, v in d.items():
                    if v is not None and not isinstance(v, (bool, int, float, str)):
                        raise bad(f"{part} {k!r} = {str(v)[:40]!r}")
            clash = sorted((set(settings) | set(settings_names)) & set(result))
            if clash:
                raise bad(f"result names that are settings ({clash})")
            if names is None:
                names = set(result)
            elif set(result) != names:
                raise bad(f"result names {sorted(result)} (earlier records: {sorted(names)})")
            done[_key(settings)] = result
    return done


class _Journal:
    """Finished cells, one JSON line each: ``{"settings": {...}, "result": {...}}``."""

    def __init__(self, path: Path | None, resume: bool, settings_names=()):
        self.path = path
        self.done: dict[str, dict] = {}
        self.fh = None
        if path is None:
            return
        if resume and path.exists():
            # checked in full before anything is written
            self.done = _read_journal(path, settings_names)
        path.parent.mkdir(parents=True, exist_ok=True)
        torn = resume and path.exists() and path.stat().st_size and not _ends_in_newline(path)
        self.fh = path.open("a" if resume else "w", encoding="utf-8")
        if torn:
            self.fh.write("\n")  # close the torn line so the next record starts clean

    def add(self, settings: dict, result: dict) -> None:
        self.done[_key(settings)] = result
        if self.fh is not None:
            self.fh.write(json.dumps({"settings": settings, "result": result}) + "\n")
            self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


class SweepTable:
    """The rows of a sweep: every setting of a cell, then its results.

    Parameters
    ----------
    rows : sequence of dict
        One dict per cell, all with the same keys.
    settings : sequence of str
        The keys that are settings (the others are results).

    Examples
    --------
    >>> t = SweepTable([{"b": 1, "y": 2.5}, {"b": 2, "y": 5.0}], settings=["b"])
    >>> t.columns, t.column("y").tolist(), len(t)
    (('b', 'y'), [2.5, 5.0], 2)
    >>> print(t.to_csv().strip())
    b,y
    1,2.5
    2,5.0
    """

    def __init__(self, rows: Sequence[Mapping], settings: Sequence[str]):
        func = "SweepTable"
        if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, (Sequence, tuple)):
            raise InvalidInputError(
                f"The 'rows' parameter of {func} must be a sequence of mappings. Got "
                f"{describe(rows)} instead."
            )
        if isinstance(settings, (str, bytes)) or not all(isinstance(s, str) for s in settings):
            raise InvalidInputError(
                f"The 'settings' parameter of {func} must be a sequence of column names. Got "
                f"{describe(settings)} instead."
            )
        for i, r in enumerate(rows):
            if not isinstance(r, Mapping):
                raise InvalidInputError(
                    f"Row {i} of the 'rows' parameter of {func} must be a mapping. Got "
                    f"{describe(r)} instead."
                )
            missing = [s for s in settings if s not in r]
            if missing:
                raise InvalidInputError(
                    f"Row {i} of the 'rows' parameter of {func} must hold every setting "
                    f"{list(settings)}. Got no {missing[0]!r} in {sorted(map(str, r))[:8]}."
                )
        self.rows = tuple(dict(r) for r in rows)
        self.settings = tuple(settings)
        cols = list(self.settings)
        for r in self.rows:
            for k in r:
                if k not in cols:
                    cols.append(k)
        self.columns = tuple(cols)
        self.results = tuple(c for c in cols if c not in self.settings)

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return (
            f"SweepTable({len(self)} rows, settings={list(self.settings)}, "
            f"results={list(self.results)})"
        )

    def column(self, name: str) -> np.ndarray:
        """One column as a numpy array (missing entries as None)."""
        if name not in self.columns:
            raise InvalidInputError(
                f"The 'name' parameter of SweepTable.column must be one of {list(self.columns)}. "
                f"Got {name!r} instead."
            )
        return np.array([r.get(name) for r in self.rows])

    def to_csv(self, path=None) -> str | None:
        """Write CSV to ``path`` (floats as their shortest exact repr), or return it as text.

        CSV holds text only: :meth:`read_csv` gives each value back by parsing it (int,
        float, bool, None, else the text), and a missing entry back as None. What it would
        not give back as written is refused before anything is written: a column name that
        is not a string, a value that is not a scalar (bool, int, float, str, None, or a
        numpy scalar, written as the Python scalar it holds), a string that would parse as
        something else (``"1"``, ``"nan"``, ``"True"``, ``""``), text UTF-8 cannot encode,
        rows of no column.
        """
        if path is not None:
            path = check_path_arg(path, "path", "SweepTable.to_csv")
        buf = io.StringIO()
        if self.rows and not self.columns:
            raise InvalidInputError(
                f"SweepTable.to_csv cannot write {len(self.rows)} rows of no column: CSV "
                "holds a row as its fields."
            )
        for c in self.columns:
            if not isinstance(c, str) or utf8_problem(c):
                raise InvalidInputError(
                    f"SweepTable.to_csv writes column names as UTF-8 text, which read_csv "
                    f"gives back as strings. Got the column name {c!r} instead."
                )
        buf.write(_csv_line(self.columns))
        for i, r in enumerate(self.rows):
            buf.write(_csv_line([_csv_cell(r.get(c), i, c) for c in self.columns]))
        if path is None:
            return buf.getvalue()
        with atomic_open(path, "w", encoding="utf-8") as fh:
            fh.write(buf.getvalue())
        return None

    def to_parquet(self, path) -> None:
        """Write Parquet (needs ``pyarrow``)."""
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise BackendUnavailableError(
                "Writing a sweep table as Parquet needs pyarrow (pip install pyarrow); "
                "write CSV instead (a path ending in .csv)."
            ) from None
        path = check_path_arg(path, "path", "SweepTable.to_parquet")
        table = pa.Table.from_pylist([{c: r.get(c) for c in self.columns} for r in self.rows])
        table = table.replace_schema_metadata({"straggler.settings": json.dumps(self.settings)})
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)

    def write(self, path) -> None:
        """CSV or Parquet by the suffix of ``path``."""
        if str(path).endswith(".parquet"):
            self.to_parquet(path)
        else:
            self.to_csv(path)

    @classmethod
    def read_csv(cls, path, settings: Sequence[str] = ()) -> SweepTable:
        """Read a table written by :meth:`to_csv`; each value parsed as int, float, bool,
        None (empty) or left a string, in that order of preference."""
        path = check_input_file(path, "path", "SweepTable.read_csv")
        try:
            with open(path, newline="", encoding="utf-8") as fh:
                rows = list(csv.DictReader(fh))
        except OSError as exc:
            raise InvalidInputError(
                f"Cannot read the sweep table {path}: {exc.strerror}."
            ) from None
        except (UnicodeDecodeError, csv.Error) as exc:
            raise InvalidInputError(
                f"The sweep table {path} is not UTF-8 CSV as to_csv writes it: {exc}."
            ) from None
        for i, r in enumerate(rows, 1):
            if None in r or None in r.values():
                raise InvalidInputError(
                    f"Record {i} of the sweep table {path} must have as many "
                    "fields as its header (to_csv writes every column of every row)."
                )
        return cls([{k: _parse(v) for k, v in r.items()} for r in rows], settings=settings)


def _csv_line(fields) -> str:
    """One CSV record, ``\\n``-terminated: a field holding a comma, a quote or a line break
    (``\\r`` included, which Python 3.11's ``csv.writer`` leaves bare under a ``\\n``
    terminator) quoted, its quotes doubled; a record of one empty field written ``""`` (an
    empty line is no record to ``csv.reader``)."""
    if list(fields) == [""]:
        return '""\n'
    out = []
    for f in fields:
        if any(ch in f for ch in ',"\r\n'):
            f = '"' + f.replace('"', '""') + '"'
        out.append(f)
    return ",".join(out) + "\n"


def _csv_cell(v, row: int, col: str) -> str:
    """The text :meth:`SweepTable.to_csv` writes for ``v``: one that :func:`_parse` gives
    back as ``v`` (NaN as NaN), or an error naming the row and the column."""
    if v is None:
        return ""
    where = f"SweepTable.to_csv cannot write row {row}'s {col!r} = {str(v)[:60]!r}"
    try:
        v = _scalar(v, f"Row {row}'s {col!r}", "SweepTable.to_csv")
    except InvalidInputError:
        raise InvalidInputError(
            f"{where}: CSV holds scalars (bool, int, float, str, None). Got {describe(v)} instead."
        ) from None
    text = repr(v) if isinstance(v, float) else str(v)
    back = _parse(text)
    same = type(back) is type(v) and (back == v or v != v and back != back)
    if not same or utf8_problem(text):
        got = "text UTF-8 cannot encode" if same else f"{back!r} ({type(back).__name__})"
        raise InvalidInputError(
            f"{where}: read_csv would give back {got}, not the {type(v).__name__} written "
            "(CSV holds text; give the value another spelling, or keep the sweep's .cells.jsonl "
            "journal, which is JSON)."
        )
    return text


def _parse(text: str):
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _sweep_iv(func, backend, workers, path, resume, progress, address, desc):
    if not callable(func):
        raise InvalidInputError(
            f"The 'func' parameter of {_FUNC} must be a callable. Got {describe(func)} instead."
        )
    backend = check_choice(backend, "backend", _FUNC, SWEEP_BACKENDS)
    if workers is not None:
        workers = check_int(workers, "workers", _FUNC, lo=1)
    if path is not None:
        check_type(path, "path", _FUNC, (str, os.PathLike), "a file path (str or PathLike)")
        path = Path(check_output_file(path, f"The 'path' of {_FUNC}"))
        if str(path).endswith(".parquet") and importlib.util.find_spec("pyarrow") is None:
            raise BackendUnavailableError(
                "Writing a sweep table as Parquet needs pyarrow (pip install pyarrow); "
                "write CSV instead (a path ending in .csv)."
            )
    resume = check_bool(resume, "resume", _FUNC)
    progress = check_bool(progress, "progress", _FUNC)
    if address is not None:
        check_type(address, "address", _FUNC, str, "a Ray cluster address (str) or None")
        if backend != "ray":
            raise InvalidInputError(
                f"The 'address' parameter of {_FUNC} is for backend='ray'. Got backend={backend!r}."
            )
    check_type(desc, "desc", _FUNC, str, "a string")
    return backend, workers, path, resume, progress


def sweep(
    func: Callable[..., Mapping],
    grid,
    *,
    fixed: Mapping | None = None,
    backend: str = "process",
    workers: int | None = None,
    path=None,
    resume: bool = True,
    progress: bool = True,
    address: str | None = None,
    desc: str = "sweep",
) -> SweepTable:
    """Run ``func(**settings)`` on every cell of ``grid`` and gather one table.

    Parameters
    ----------
    func : callable
        A module-level function taking every setting as a keyword argument and returning
        a mapping of result names to scalars (bool, int, float, str, None; numpy scalars
        are converted). Deterministic given its settings.
    grid : mapping of str to sequence, or sequence of mappings
        The cells (see ``grid_cells``).
    fixed : mapping of str to scalar, optional
        Settings passed to every cell and recorded in every row.
    backend : {"process", "serial", "ray"}, default "process"
    workers : int, optional
        Processes (``"process"``; default ``os.cpu_count()``, never more than the cells
        left) or CPUs of a local Ray instance started here (``"ray"``).
    path : str or PathLike, optional
        Where to write the table (CSV, or Parquet for ``.parquet``); its journal
        ``<path>.cells.jsonl`` makes the sweep resumable.
    resume : bool, default True
        Reuse the journal's finished cells (False: recompute everything).
    progress : bool, default True
    address : str, optional
        Ray cluster address for ``ray.init(address=...)`` (``"auto"``, ``"ray://host:10001"``).
    desc : str, default "sweep"
        Label of the progress bar.

    Returns
    -------
    SweepTable
        One row per cell, in grid order.

    Raises
    ------
    InvalidInputError
        A bad grid, setting value or option.
    BackendUnavailableError
        ``backend="ray"`` without Ray, or a Parquet path without pyarrow.
    SweepError
        A cell raised (the message names its settings); finished cells stay journaled.

    Examples
    --------
    >>> from straggler.sim.workloads.batches import num_physical_slots
    >>> def slots(n_experts, replication):  # a module-level function in real use
    ...     return {"slots": num_physical_slots(n_experts, 8, replication)}
    >>> t = sweep(slots, {"n_experts": [64, 256], "replication": [1.25]},
    ...           backend="serial", progress=False)
    >>> t.column("slots").tolist()
    [80, 320]
    """
    backend, workers, path, resume, progress = _sweep_iv(
        func, backend, workers, path, resume, progress, address, desc
    )
    cells = grid_cells(grid, fixed)
    settings_names = list(cells[0])
    if backend == "process":
        _check_spawnable(func)
    journal = _Journal(
        None if path is None else Path(str(path) + ".cells.jsonl"), resume, settings_names
    )
    results: list[dict | None] = [journal.done.get(_key(c)) for c in cells]
    todo = [i for i, r in enumerate(results) if r is None]
    n_workers = 1 if backend == "serial" else min(workers or os.cpu_count() or 1, len(todo) or 1)
    bar = _Progress(len(cells), len(cells) - len(todo), desc, progress, n_workers)

    def finish(index: int, res: dict) -> None:
        clash = sorted(set(res) & set(settings_names))
        if clash:
            raise InvalidInputError(
                f"The results of {_FUNC}'s func must not reuse setting names; got {clash}."
            )
        results[index] = res
        journal.add(cells[index], res)
        bar.update()

    try:
        if todo:
            runner = {"serial": _serial, "process": _process, "ray": _ray}[backend]
            runner(func, cells, todo, finish, workers, address)
    finally:
        bar.close()
        journal.close()
    first = results[0]
    for i, r in enumerate(results):
        if set(r) != set(first):
            raise InvalidInputError(
                f"Every cell of {_FUNC} must return the same result names: cell {cells[i]} "
                f"returned {sorted(r)}, cell {cells[0]} returned {sorted(first)}."
            )
    table = SweepTable([{**c, **r} for c, r in zip(cells, results)], settings=settings_names)
    if path is not None:
        table.write(path)
    return table


class _CellInputError(SweepError, InvalidInputError):
    """A cell failed on bad input or returned what a sweep cannot record: both a
    :class:`SweepError` (a cell failed) and an ``InvalidInputError``."""


def _cell_failed(cell: dict, exc: BaseException) -> SweepError:
    cls = _CellInputError if isinstance(exc, InvalidInputError) else SweepError
    return cls(f"sweep cell {cell} raised {type(exc).__name__}: {exc}")


def _serial(func, cells, todo, finish, workers, address) -> None:
    for i in todo:
        try:
            index, res = _run_cell(func, i, cells[i])
        except Exception as exc:
            raise _cell_failed(cells[i], exc) from exc
        finish(index, res)


_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""", re.M)
_NO_GUARD = (
    "backend='process' starts its workers with spawn, and each re-runs the main script "
    "{script}, which has no 'if __name__ == \"__main__\":' guard, so every worker would start "
    "the sweep again. Put the script's top-level code under that guard, or pass "
    "backend='serial'."
)


def _check_spawnable(func) -> None:
    """Refuse, before starting anything, what spawned workers cannot run: a ``func`` pickle
    cannot send (a lambda, a nested function: workers receive it by reference), a ``func``
    defined in an interactive session or a script read from standard input (nothing to
    import it from), or a main script that has no ``__main__`` guard (each worker would
    re-run it)."""
    try:
        pickle.dumps(func)
    except Exception as exc:  # noqa: BLE001 - PicklingError, AttributeError, TypeError, ...
        raise InvalidInputError(
            f"The 'func' parameter of {_FUNC} must be a function the worker processes of "
            "backend='process' can receive (pickle sends a module-level function by name; a "
            "lambda, a nested function or a local class cannot be sent). Got "
            f"{describe(func)} ({type(exc).__name__}: {str(exc)[:120]}) instead. Define it at "
            "the top level of a module or pass backend='serial'."
        ) from None
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if script is None or not os.path.isfile(script):
        if getattr(func, "__module__", None) == "__main__":
            raise InvalidInputError(
                f"The 'func' parameter of {_FUNC} is defined in an interactive session or a "
                "script read from standard input, which the spawned workers of "
                "backend='process' cannot import. Define it in a module (a .py file) or pass "
                "backend='serial'."
            )
        return
    try:
        with open(script, encoding="utf-8", errors="replace") as fh:
            source = fh.read()
    except OSError:
        return  # nothing to inspect (an unreadable script): let the pool try
    if not _GUARD.search(source):
        raise InvalidInputError(_NO_GUARD.format(script=script))


def _process(func, cells, todo, finish, workers, address) -> None:
    n = min(workers or os.cpu_count() or 1, len(todo))
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        pending = {pool.submit(_run_cell, func, i, cells[i]): i for i in todo}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    i = pending.pop(fut)
                    try:
                        index, res = fut.result()
                    except BrokenProcessPool:
                        script = getattr(sys.modules.get("__main__"), "__file__", "(none)")
                        raise SweepError(
                            "A worker process of backend='process' died before returning a "
                            "result (killed, out of memory, or a main script re-run without "
                            f"its 'if __name__ == \"__main__\":' guard: {script}); no cell "
                            "failed on its own. Finished cells are journaled; backend='serial' "
                            "runs without workers."
                        ) from None
                    except Exception as exc:
                        raise _cell_failed(cells[i], exc) from exc
                    finish(index, res)
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


def _ray(func, cells, todo, finish, workers, address) -> None:
    try:
        import ray
    except ImportError:
        raise BackendUnavailableError(
            "backend='ray' of sweep needs Ray: pip install 'straggler[ray]'."
        ) from None
    started = False
    if not ray.is_initialized():
        kw = {"address": address} if address is not None else {"num_cpus": workers}
        ray.init(include_dashboard=False, log_to_driver=False, **kw)
        started = True
    try:
        task = ray.remote(num_cpus=1)(_run_cell)
        fn = ray.put(func)
        pending = {task.remote(fn, i, cells[i]): i for i in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                try:
                    index, res = ray.get(ref)
                except Exception as exc:
                    for other in pending:
                        ray.cancel(other)
                    raise _cell_failed(cells[i], exc) from exc
                finish(index, res)
    finally:
        if started:
            ray.shutdown()
