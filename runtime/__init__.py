"""The deployment adapter (TEMPO §4.4): what runs inside or beside an engine.

- :func:`dispatch_and_count`: the fused dispatch-and-count step (stratified replica choice
  and per-expert token counts in one pass), as a Triton kernel, a torch reference and a
  plain-Python reference with identical integer outputs.
- :class:`TablePublisher`: the live ``[L, E, X]`` table on the device, published in place
  with one copy from pinned staging; races with the kernel cannot route a token wrong.
- :class:`SolverWorker`: tempo (or any dispatch method) in a spawned process, fed count
  windows through shared memory, posting tables at a refresh period; the engine never waits.
- ``converters``: the tables in SGLang's ``lp`` and vLLM's layouts.
- :class:`TableSolver`: stands in for SGLang's per-layer ``LPLBSolver`` and serves the
  publisher's live table.
- :mod:`straggler.runtime.engines`: readers and writers of the engines' files
  (:func:`read_engine_log`, :func:`detect_format`, :class:`EngineLog`).

The documentation's engine guide, *Putting straggler.runtime into an engine*
(``docs/guides/engines/integration.md``), names the patch points an engine needs.

torch and triton are imported lazily (the ``runtime`` extra), so ``import
straggler.runtime`` works without them.
"""

from .dispatch_count import BACKENDS, dispatch_and_count, torch_available, triton_available
from .engines import EngineLog, detect_format, read_engine_log
from .publisher import TablePublisher, normalize_table, uniform_table
from .table_solver import TableSolver, install_table_solvers
from .warmup import WarmupReport, warmup
from .worker import (
    SolverWorker,
    WorkerDecision,
    WorkerStatus,
    WorkerTables,
    decide_for_windows,
    window_delta,
)

__all__ = [
    "BACKENDS",
    "dispatch_and_count",
    "torch_available",
    "triton_available",
    "TablePublisher",
    "normalize_table",
    "uniform_table",
    "TableSolver",
    "install_table_solvers",
    "SolverWorker",
    "WorkerStatus",
    "WorkerTables",
    "WorkerDecision",
    "decide_for_windows",
    "window_delta",
    "warmup",
    "WarmupReport",
    "EngineLog",
    "detect_format",
    "read_engine_log",
]
