"""The simulator engine's per-step speed against another checkout's, alternating in one run.

Two worker processes, one importing this checkout's package and one importing the package
under ``--old`` (a folder holding ``straggler/``, put first on its ``PYTHONPATH``), each load
the default one-hour trace (``AzureLLMInferenceTrace_conv.csv``, G = 8) and run ``simulate``
once per policy to compile (or load the disk cache). Then, ``--rounds`` times, each worker in
turn runs one warm ``simulate`` per policy and reports the engine's wall time
(``SimReport.wall_s``, the step loop alone) and the whole call's; old and new alternate, so
the machine's load falls on both alike. Goal: the new engine's median <= 1.1x the old one's.
Both must also report the same ``n_steps`` (a cheap check that they simulate the same thing).

    python benchmarks/engine_speed.py --old /path/to/old/pkg [--rounds 9] [--policies brs,jsq]

Writes ``straggler-results/engine_speed.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.sim.workloads.traces import find_trace

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = results_dir()
#: the trace: the package's copy, or the file in ``$STRAGGLER_TRACES`` (``find_trace``)
TRACE = find_trace("AzureLLMInferenceTrace_conv.csv")
GOAL = 1.1

_WORKER = r"""
import json, sys, time
from straggler.sim import load_trace, simulate
trace = load_trace(sys.argv[1])
for line in sys.stdin:
    pol = line.strip()
    t = time.perf_counter()
    r = simulate(trace, pol)
    total = time.perf_counter() - t
    print(json.dumps({"engine_s": r.wall_s, "total_s": total, "n_steps": int(r.n_steps)}),
          flush=True)
"""


def _worker(pythonpath: str | None) -> subprocess.Popen:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(TRACE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _ask(proc: subprocess.Popen, policy: str) -> dict:
    proc.stdin.write(policy + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"worker exited (code {proc.wait()})")
    return json.loads(line)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="folder holding the old package 'straggler/'")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--policies", default="brs,jsq,brh")
    ap.add_argument("--out", default=str(RESULTS / "engine_speed.json"))
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    if not TRACE.is_file():
        ap.error(f"the trace {TRACE} is missing (set STRAGGLER_TRACES to its folder)")
    workers = {"old": _worker(args.old), "new": _worker(None)}
    try:
        first = {w: {p: _ask(proc, p) for p in policies} for w, proc in workers.items()}
        runs = {w: {p: [] for p in policies} for w in workers}
        for _ in range(args.rounds):
            for p in policies:
                for w, proc in workers.items():
                    runs[w][p].append(_ask(proc, p))
    finally:
        for proc in workers.values():
            proc.stdin.close()
            proc.wait()
    rows = {}
    print(f"{'policy':8s} {'steps':>8s} {'old s':>8s} {'new s':>8s} {'new/old':>8s}  goal")
    for p in policies:
        old = statistics.median(r["engine_s"] for r in runs["old"][p])
        new = statistics.median(r["engine_s"] for r in runs["new"][p])
        steps = {r["n_steps"] for w in workers for r in runs[w][p]}
        if len(steps) != 1:
            raise RuntimeError(f"{p}: old and new simulate different step counts {steps}")
        rows[p] = {
            "n_steps": steps.pop(),
            "old_engine_s": [r["engine_s"] for r in runs["old"][p]],
            "new_engine_s": [r["engine_s"] for r in runs["new"][p]],
            "old_median_s": old,
            "new_median_s": new,
            "ratio": new / old,
            "met": new / old <= GOAL,
            "first_call": {w: first[w][p] for w in workers},
        }
        print(
            f"{p:8s} {rows[p]['n_steps']:8d} {old:8.3f} {new:8.3f} {new / old:8.2f}  "
            f"{'met' if new / old <= GOAL else 'NOT met'}"
        )
    out = {
        "benchmark": "engine_speed",
        "trace": TRACE.name,
        "old": args.old,
        "rounds": args.rounds,
        "goal_ratio": GOAL,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
