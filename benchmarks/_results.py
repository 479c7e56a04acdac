"""Where the benchmark scripts write: by default under ``straggler-results/`` in the current
directory (``$STRAGGLER_RESULTS`` names another folder), never into the tracked tree. A script
whose ``--out`` names a folder writes its files there under their own names; the scripts whose
``--out`` (or ``--json``, ``--plot``) names a file default to a file in that folder. The JSON
records the command, the commit and the machine (``run_info``)."""

from __future__ import annotations

import os
import pathlib
import platform
import subprocess
import sys

#: The default output folder, relative to the current directory.
DEFAULT_OUT = "straggler-results"


def results_dir() -> pathlib.Path:
    """The folder a script writes to by default: ``$STRAGGLER_RESULTS``, else
    ``./straggler-results`` (created)."""
    path = pathlib.Path(os.environ.get("STRAGGLER_RESULTS") or DEFAULT_OUT)
    path.mkdir(parents=True, exist_ok=True)
    return path


def add_out_argument(parser, what: str = "the JSON and plots") -> None:
    """``--out DIR``: the folder ``what`` are written to (created if missing)."""
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="DIR",
        help=f"folder for {what} (default ./{DEFAULT_OUT}; created if missing)",
    )


def out_file(folder, name: str) -> pathlib.Path:
    """``folder/name`` with ``folder`` created."""
    path = pathlib.Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path / name


def run_info() -> dict:
    """The command line, the checkout's commit and the machine, for a results file."""
    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", False
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "command": " ".join(["python", os.path.relpath(sys.argv[0], root), *sys.argv[1:]]),
        "commit": commit + ("+dirty" if dirty else ""),
        "machine": f"{platform.system()} {platform.machine()}, {cpu}",
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
