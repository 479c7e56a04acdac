"""The test suite's JIT warm-up on an empty numba cache, this checkout beside an older one.

Each run is a new ``python -m pytest tests -k test_version`` in a checkout's folder, on its own
empty ``NUMBA_CACHE_DIR``: every test module is collected (as in the full suite, so kernels a
module compiles at import are compiled as they are there), ``tests/test_packaging.py`` is among
the selected files (so the warm-up covers every method, policy and the simulator), and the run
ends with the warm-up's own summary line (``JIT warm-up: <wall> s, ...``, printed by
``tests/conftest.py``), which this script reads. With ``--old PATH`` the two checkouts
alternate, run for run (``--pairs`` pairs), so both see the same machine load; the older
checkout is imported from a temporary folder holding a ``straggler`` link to it (the library
imports itself relatively), ahead of this one on ``PYTHONPATH``.

On a 2-core machine the same code's warm-up has varied twofold within hours: quote the ratio
of a pair, not a wall time alone.

Writes ``straggler-results/suite_warmup.json`` and prints a table.

Usage: ``python benchmarks/suite_warmup.py [--old PATH] [--pairs 3] [--jobs 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _results import results_dir  # benchmarks/_results.py (the scripts' folder)

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = results_dir() / "suite_warmup.json"
LINE = re.compile(r"JIT warm-up: ([0-9.]+) s")


def _git_head(path: pathlib.Path) -> str:
    r = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return r.stdout.strip() or "?"


def run_once(checkout: pathlib.Path, pythonpath: str | None, jobs: int) -> dict:
    """One warm-up of ``checkout``'s test suite on an empty cache, in a new process."""
    cache = tempfile.mkdtemp(prefix="straggler-suite-warmup-")
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, STRAGGLER_WARMUP_JOBS=str(jobs))
    if pythonpath:  # ahead of the caller's own path, which may name this checkout
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "pytest", "tests", "-k", "test_version", "-q"]
    cmd += ["-p", "no:cacheprovider"]
    load = os.getloadavg()[0]
    t = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    wall = time.perf_counter() - t
    line = next((ln for ln in r.stdout.splitlines() if LINE.search(ln)), None)
    if r.returncode != 0 or line is None:
        tail = (r.stdout + r.stderr)[-2000:]
        raise SystemExit(f"suite_warmup: the run in {checkout} failed (rc {r.returncode}):\n{tail}")
    return {
        "warmup_s": float(LINE.search(line).group(1)),
        "pytest_wall_s": round(wall, 2),
        "load_before": round(load, 2),
        "line": line.strip(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", default=None, help="an older checkout of this repository")
    p.add_argument("--pairs", type=int, default=3, help="runs of each checkout, alternating")
    p.add_argument("--jobs", type=int, default=2, help="STRAGGLER_WARMUP_JOBS of every run")
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)
    if a.pairs < 1:
        p.exit(2, f"suite_warmup: --pairs must be >= 1, got {a.pairs}\n")
    old = None
    links = None
    if a.old is not None:
        old = pathlib.Path(a.old).resolve()
        if not (old / "tests" / "conftest.py").is_file():
            p.exit(2, f"suite_warmup: --old must be a checkout with tests/conftest.py: {old}\n")
        links = tempfile.mkdtemp(prefix="straggler-old-")
        os.symlink(old, pathlib.Path(links) / "straggler")
    runs = []
    try:
        for i in range(a.pairs):
            order = [("old", old, links), ("new", ROOT, None)] if old else [("new", ROOT, None)]
            if i % 2 and old:
                order.reverse()
            for name, checkout, pp in order:
                r = run_once(checkout, pp, a.jobs)
                r.update(pair=i, code=name, at=time.strftime("%H:%M:%S"))
                runs.append(r)
                print(f"pair {i} {name:3s} {r['warmup_s']:6.1f} s  (load {r['load_before']})")
    finally:
        if links:
            shutil.rmtree(links, ignore_errors=True)
    new = [r["warmup_s"] for r in runs if r["code"] == "new"]
    result = {
        "command": "python benchmarks/suite_warmup.py" + (f" --old {a.old}" if old else ""),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "new_commit": _git_head(ROOT),
        "jobs": a.jobs,
        "runs": runs,
        "new_median_s": statistics.median(new),
    }
    print(f"\nsuite warm-up, empty cache, STRAGGLER_WARMUP_JOBS={a.jobs} (s)")
    print(f"{'pair':>4} {'old':>8} {'new':>8} {'new/old':>8}")
    if old:
        olds = [r["warmup_s"] for r in runs if r["code"] == "old"]
        ratios = [n / o for n, o in zip(new, olds)]
        result.update(
            old_commit=_git_head(old),
            old_median_s=statistics.median(olds),
            ratios=[round(x, 3) for x in ratios],
            ratio_median=round(statistics.median(ratios), 3),
        )
        for i, (o, n, x) in enumerate(zip(olds, new, ratios)):
            print(f"{i:>4} {o:8.1f} {n:8.1f} {x:8.2f}")
        print(f"median new/old: {result['ratio_median']:.2f} (goal, halved: <= 0.50)")
    else:
        for i, n in enumerate(new):
            print(f"{i:>4} {'':>8} {n:8.1f}")
    pathlib.Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
