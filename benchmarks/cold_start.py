"""Cold start: what a new process pays before its first answer, with a cold and a warm cache.

Every measurement runs in a fresh subprocess (nothing compiled in memory). Scenarios:

* ``cold``: a fresh, empty ``NUMBA_CACHE_DIR`` (a fresh install, or CI):
``straggler.runtime.warmup``
  of everything (dispatch methods, routing policies, the simulator), with the compile seconds
  per step and per kernel;
* ``warm``: the same cache folder again, now filled: the first ``solve_dispatch`` on the default
  instance (``straggler-compare``'s batch: DSv3, EP8, 128 tokens per GPU, ``dsv3_a_offline``,
  method ``tempo``) and the first ``simulate`` (default trace and policy), each against its
  steady-state time (median of the next calls in the same process); the goal is
  ``first <= 3 * steady + 1 s``;
* ``cold_first``: a fresh cache again, the first ``solve_dispatch`` on the default instance
  without any warm-up: its wall time, the ``runtime_s`` it reports (which must exclude the
  compile) and its ``compile_s``;
* ``first_command`` (:func:`first_command`): a new user's first commands. The install
  (``pip install --no-deps .`` into a fresh virtual environment that sees this one's
  dependencies: the package itself, built in pip's isolated build environment and
  installed, apart from downloading numpy, numba and HiGHS), then, each in a new process
  with an empty ``NUMBA_CACHE_DIR``: ``straggler-compare`` (defaults), ``straggler-compare
  --layers 61``, ``straggler-plan`` on ``plan_demo.py``'s vLLM recording, and a notebook's
  first cell (``solve_dispatch`` on the default instance,
  then on 61 layers generated beforehand). Goal: the first ``straggler-compare`` in <= 15
  s, everything it compiles included. Whether the plain-Python references served
  (``straggler.solvers.dispatch._backend``) is read from the command's output;
* ``warmup_jobs`` (:func:`warmup_jobs`): the whole warm-up on an empty cache with ``jobs=1``
  (everything compiles in the process) and ``jobs=2`` (the process compiles its share while
  a child process compiles the other, then the process loads the child's work), each in a
  new process on its own empty cache, alternating, ``--rounds`` times: wall time, compile
  seconds in the process (its share apart) and in each child (and the child's start), CPU
  seconds of the process and its children. ``--warmup-jobs-only`` runs it alone
  (the test suite's own warm-up, beside an older checkout: ``benchmarks/suite_warmup.py``);
* ``first_route_batch`` and ``first_simulate``: each in its own fresh process on its own empty
  cache, the first ``route_batch(policy="jsq")`` on a 3-request tick (goal <= 10 s) and the
  first ``simulate(policy="brs")`` on the default trace (goal <= 20 s), each beside the next
  call in the same process (steady). ``--routing-only`` runs these two alone; run it with
  ``PYTHONPATH`` pointing at another checkout's package to measure that code side by side.

Writes ``straggler-results/cold_start.json`` and prints a table. Compile time is reported
apart from run time throughout. Timings depend on the machine's load: say so when quoting.

    python benchmarks/cold_start.py              # all scenarios (~3-6 min on 2 busy cores)
    python benchmarks/cold_start.py --skip-cold  # warm cache only (reuses a filled folder)
    python benchmarks/cold_start.py --first-command-only  # the install and first commands
    python benchmarks/cold_start.py --warmup-jobs-only    # warm-up, jobs=1 vs jobs=2
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from _results import results_dir  # benchmarks/_results.py (the scripts' folder)

RESULTS = results_dir()


def _child(mode: str, repeats: int) -> dict:
    """Runs inside the subprocess; returns the measurements as a dict."""
    if mode in ("first_route_batch", "first_simulate"):
        return _child_routing(mode)
    if mode.startswith("warmup_jobs="):
        return _child_warmup_jobs(int(mode.partition("=")[2]))
    t_import = time.perf_counter()
    from straggler.formulations import CostModel
    from straggler.runtime.warmup import warmup
    from straggler.sim import make_decode_problem, simulate
    from straggler.solvers import solve_dispatch

    out = {"import_s": time.perf_counter() - t_import}
    if mode == "cold":
        from numba.core import event

        cpu = time.process_time()
        with event.install_recorder("numba:compile") as rec:
            rep = warmup()
        out["warmup"] = rep.as_dict()
        out["warmup_cpu_s"] = time.process_time() - cpu
        out["breakdown"] = _breakdown(rec.buffer)
        return out
    problem = make_decode_problem(n_layers=1)
    cost = CostModel.preset("dsv3_a_offline")

    def timed(fn):
        t = time.perf_counter()
        r = fn()
        return time.perf_counter() - t, r

    wall, res = timed(lambda: solve_dispatch(problem, cost))
    out["dispatch_first"] = {"wall_s": wall, "runtime_s": res.runtime_s, "compile_s": res.compile_s}
    if mode == "cold_first":
        return out
    steady = [timed(lambda: solve_dispatch(problem, cost))[0] for _ in range(repeats)]
    out["dispatch_steady_s"] = statistics.median(steady)
    wall, rep = timed(lambda: simulate())
    out["simulate_first"] = {"wall_s": wall, "engine_wall_s": rep.wall_s}
    steady = [timed(lambda: simulate())[0] for _ in range(max(2, repeats // 10))]
    out["simulate_steady_s"] = statistics.median(steady)
    return out


def _child_routing(mode: str) -> dict:
    """The first ``route_batch(policy="jsq")`` or ``simulate(policy="brs")`` of a process."""
    t = time.perf_counter()
    if mode == "first_route_batch":
        from straggler.solvers import route_batch

        def call():
            return route_batch([6.0, 2.0, 3.0], [10.0, 4.0, 7.0], [1, 2, 1], policy="jsq")
    else:
        from straggler.sim import simulate

        def call():
            return simulate(policy="brs")

    out = {"import_s": time.perf_counter() - t}
    t, cpu = time.perf_counter(), time.process_time()
    call()
    out["first_s"] = time.perf_counter() - t
    out["first_cpu_s"] = time.process_time() - cpu
    t = time.perf_counter()
    call()
    out["steady_s"] = time.perf_counter() - t
    return out


def _child_warmup_jobs(jobs: int) -> dict:
    """The whole ``warmup(jobs=jobs)``, with the CPU seconds of this process and of the
    child processes it waited for."""
    t = time.perf_counter()
    from straggler.runtime.warmup import warmup

    out = {"import_s": time.perf_counter() - t, "load_avg": os.getloadavg()[0]}
    cpu, kids = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    rep = warmup(jobs=jobs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["cpu_s"] = time.process_time() - cpu
    out["children_cpu_s"] = (after.ru_utime - kids.ru_utime) + (after.ru_stime - kids.ru_stime)
    out["warmup"] = rep.as_dict()
    return out


def warmup_jobs(tmp: str, rounds: int) -> dict:
    """The whole warm-up on an empty cache, ``jobs=1`` and ``jobs=2`` alternating, each in a
    new process on its own empty cache (module notes)."""
    runs: dict = {"jobs_1": [], "jobs_2": []}
    for r in range(rounds):
        for jobs in (1, 2):
            cache = os.path.join(tmp, f"warmup-jobs{jobs}-{r}")
            runs[f"jobs_{jobs}"].append(_run(f"warmup_jobs={jobs}", cache, 0))
    return runs


def format_warmup_jobs(runs: dict) -> str:
    """The rows of :func:`warmup_jobs`."""
    lines = ["full warm-up on an empty cache, new process each (jobs=1 | jobs=2, alternating):"]
    for one, two in zip(runs["jobs_1"], runs["jobs_2"], strict=True):
        w1, w2 = one["warmup"], two["warmup"]
        each = " + ".join(
            f"{c['compile_s']:.1f} s (started in {c['start_s']:.1f} s)" for c in w2["children"]
        )
        share = w2["share"]["compile_s"] if w2["share"] else 0.0
        lines.append(
            f"  jobs=1: {w1['total_s']:.1f} s wall, compiling {w1['compile_s']:.1f} s, "
            f"CPU {one['cpu_s']:.1f} s (load {one['load_avg']:.1f}) | jobs=2: "
            f"{w2['total_s']:.1f} s wall ({w2['total_s'] / w1['total_s']:.2f}x), compiling "
            f"{w2['compile_s']:.1f} s in the process ({share:.1f} s its share) and {each} "
            f"in {len(w2['children'])} child(ren), CPU {two['cpu_s']:.1f} + "
            f"{two['children_cpu_s']:.1f} s (load {two['load_avg']:.1f})"
        )
        after = w2["compiled_after_children"] if w2["children"] else {}
        if after:
            lines.append(f"    compiled in the process after the children: {', '.join(after)}")
        if w2["compiled_twice"]:
            lines.append(f"    compiled by more than one share: {', '.join(w2['compiled_twice'])}")
    return "\n".join(lines)


def _breakdown(buffer, top: int = 25) -> dict:
    """Where compile time goes: inclusive seconds per compiled function (nested compiles of
    callees, numba's own overloads included), and numba's pass times (type inference,
    lowering, ...) of each top-level kernel."""
    stack, incl, passes = [], {}, {}
    for ts, ev in buffer:
        disp = ev.data["dispatcher"]
        name = f"{disp.py_func.__module__}.{disp.py_func.__qualname__}"
        if ev.is_start:
            stack.append((name, ts))
            continue
        n, t0 = stack.pop()
        incl[n] = incl.get(n, 0.0) + (ts - t0)
        if not stack:  # a top-level kernel: numba's pass times of its last compile
            for sig in disp.signatures[-1:]:
                md = disp.get_metadata(sig)
                times = {}
                for pipe in md.get("pipeline_times", {}).values():
                    for k, v in pipe.items():
                        times[k.split("_", 1)[-1]] = times.get(k.split("_", 1)[-1], 0.0) + v.run
                big = sorted(times.items(), key=lambda kv: -kv[1])[:4]
                passes[n] = {k: round(v, 2) for k, v in big}
                passes[n]["llvm_lock_s"] = round(md.get("timers", {}).get("llvm_lock", 0.0), 2)
    heavy = sorted(incl.items(), key=lambda kv: -kv[1])[:top]
    return {"inclusive_s": {k: round(v, 2) for k, v in heavy}, "passes": passes}


def _run(mode: str, cache: str, repeats: int) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--repeats", str(repeats)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"child {mode} failed:\n{proc.stderr[-4000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_s"] = time.perf_counter() - t
    return res


_NOTEBOOK_CELL = """
import time
t = time.perf_counter()
from straggler.formulations import CostModel
from straggler.sim import make_decode_problem
from straggler.solvers import solve_dispatch
cost = CostModel.preset("dsv3_a_offline")
layer, layers = make_decode_problem(n_layers=1), make_decode_problem(n_layers=61)
t0 = time.perf_counter()
one = solve_dispatch(layer, cost)
t1 = time.perf_counter()
stack = solve_dispatch(layers, cost)
t2 = time.perf_counter()
print(t0 - t, t1 - t0, t2 - t1, one.reference_s, stack.reference_s, stack.compile_s)
"""


def first_command(tmp: str) -> dict:
    """The install and a new user's first commands, each timed in a new process on an
    empty numba cache (module notes)."""
    root = pathlib.Path(__file__).resolve().parent.parent
    venv = os.path.join(tmp, "venv")
    t = time.perf_counter()
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", venv], check=True)
    site = next(pathlib.Path(venv, "lib").glob("python*/site-packages"))
    # this environment's dependencies, as a plain path (its editable install is not seen)
    deps = [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    (site / "deps.pth").write_text("\n".join(deps) + "\n")
    venv_s = time.perf_counter() - t
    t = time.perf_counter()
    pip = [os.path.join(venv, "bin", "pip"), "install", "-q", "--no-deps", str(root)]
    subprocess.run(pip, check=True, cwd=tmp, capture_output=True)
    install_s = time.perf_counter() - t
    out = {"venv_s": venv_s, "install_s": install_s}
    bin_ = os.path.join(venv, "bin")
    from straggler.proofs.engine_strategies import write_demo_dumps

    # plan_demo.py's recording, as vLLM writes it (JSON: no torch needed)
    dumps = write_demo_dumps(pathlib.Path(tmp, "dumps"), engines=("vllm",))
    runs = {
        "compare": [os.path.join(bin_, "straggler-compare")],
        "compare_61_layers": [os.path.join(bin_, "straggler-compare"), "--layers", "61"],
        "plan": [
            os.path.join(bin_, "straggler-plan"),
            dumps["vllm"],
            "--gpus",
            "8",
            "--slots",
            "80",
            "--holdout",
            "0.5",
            "--no-progress",
        ],  # fmt: skip
        "notebook_first_cell": [os.path.join(bin_, "python"), "-c", _NOTEBOOK_CELL],
    }
    for name, cmd in runs.items():
        env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join(tmp, f"cache-{name}"))
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t
        if proc.returncode:
            raise RuntimeError(f"{name} failed:\n{proc.stderr[-4000:]}")
        said = proc.stdout + proc.stderr
        row = {"wall_s": wall, "references": "plain-Python references" in said}
        if name == "notebook_first_cell":
            prep, a, b, ref1, ref61, comp61 = (float(v) for v in proc.stdout.split())
            row.update(imports_and_problems_s=prep, first_call_s=a, stack_61_s=b,
                       reference_s_first=ref1, reference_s_stack=ref61,
                       compile_s_stack=comp61)  # fmt: skip
            row["references"] = ref1 > 0
        out[name] = row
    out["goal"] = {"compare_s": out["compare"]["wall_s"], "bound_s": 15.0,
                   "met": out["compare"]["wall_s"] <= 15.0}  # fmt: skip
    return out


def format_first_command(r: dict) -> str:
    """The rows of :func:`first_command`."""
    lines = [
        f"fresh install (package only, dependencies present): venv {r['venv_s']:.1f} s, "
        f"pip install {r['install_s']:.1f} s",
    ]
    for name in ("compare", "compare_61_layers", "plan", "notebook_first_cell"):
        row = r[name]
        how = "references served" if row["references"] else "kernels"
        lines.append(f"  first {name:22s} {row['wall_s']:7.1f} s wall, empty cache ({how})")
    nb = r["notebook_first_cell"]
    lines.append(
        f"  notebook: imports and problems {nb['imports_and_problems_s']:.2f} s, first "
        f"solve_dispatch {nb['first_call_s']:.2f} s, "
        f"then 61 layers {nb['stack_61_s']:.2f} s (references {nb['reference_s_stack']:.2f} s, "
        f"compile {nb['compile_s_stack']:.1f} s)"
    )
    g = r["goal"]
    lines.append(
        f"first straggler-compare {g['compare_s']:.1f} s (goal <= 15 s, compiles included): "
        f"{'met' if g['met'] else 'MISSED'}"
    )
    return "\n".join(lines)


def _goal(first: float, steady: float) -> dict:
    bound = 3 * steady + 1.0
    return {"first_s": first, "steady_s": steady, "bound_s": bound, "met": first <= bound}


def _one_study(out, key, run, fmt) -> int:
    """Run one study on an empty cache folder, store it under ``key`` in the JSON at ``out``
    (the other keys kept), print its table."""
    with tempfile.TemporaryDirectory(prefix="straggler-study-") as tmp:
        r = run(tmp)
    path = pathlib.Path(out)
    report = json.loads(path.read_text()) if path.exists() else {}
    report[key] = r
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(fmt(r))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=20, help="steady-state repeats (dispatch)")
    p.add_argument("--skip-cold", action="store_true", help="warm-cache scenario only")
    p.add_argument("--cache", default=None, help="cache folder to reuse (with --skip-cold)")
    p.add_argument("--routing-only", action="store_true", help="first route_batch and simulate")
    p.add_argument("--out", default=str(RESULTS / "cold_start.json"))
    p.add_argument("--first-command-only", action="store_true", help="only first_command()")
    p.add_argument("--warmup-jobs-only", action="store_true", help="only warmup_jobs()")
    p.add_argument("--rounds", type=int, default=1, help="rounds of warmup_jobs()")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.repeats)))
        return 0
    if args.warmup_jobs_only:
        return _one_study(args.out, "warmup_jobs", lambda tmp: warmup_jobs(tmp, args.rounds),
                          format_warmup_jobs)  # fmt: skip
    if args.first_command_only:
        return _one_study(args.out, "first_command", first_command, format_first_command)

    report = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    with tempfile.TemporaryDirectory(prefix="straggler-cold-") as tmp:
        for mode, goal in (("first_route_batch", 10.0), ("first_simulate", 20.0)):
            r = _run(mode, os.path.join(tmp, mode), args.repeats)
            report[mode] = {**r, "goal_s": goal, "met": r["first_s"] <= goal}
    if args.routing_only:
        pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(format_report(report))
        return 0
    with tempfile.TemporaryDirectory(prefix="straggler-cold-") as tmp:
        cache = args.cache or os.path.join(tmp, "cache")
        if not args.skip_cold:
            report["cold"] = _run("cold", cache, args.repeats)
        warm = _run("warm", cache, args.repeats)
        report["warm"] = warm
        report["goals"] = {
            "dispatch": _goal(warm["dispatch_first"]["wall_s"], warm["dispatch_steady_s"]),
            "simulate": _goal(warm["simulate_first"]["wall_s"], warm["simulate_steady_s"]),
        }
        if not args.skip_cold:
            report["cold_first"] = _run("cold_first", os.path.join(tmp, "fresh"), args.repeats)
            report["warmup_jobs"] = warmup_jobs(tmp, args.rounds)
            report["first_command"] = first_command(tmp)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(format_report(report))
    return 0


def format_report(r: dict) -> str:
    lines = [f"cold start ({r['cpus']} CPUs, Python {r['python']}); seconds"]
    for mode in ("first_route_batch", "first_simulate"):
        if mode in r:
            m = r[mode]
            lines.append(
                f"empty cache, new process, {mode}: {m['first_s']:.1f} s wall, "
                f"{m['first_cpu_s']:.1f} s CPU (next call {m['steady_s']:.3f} s; goal <= "
                f"{m['goal_s']:.0f} s: "
                f"{'met' if m['met'] else 'MISSED'})"
            )
    if "cold" in r:
        w = r["cold"]["warmup"]
        lines.append(
            f"cold cache, full warm-up: {w['total_s']:.1f} s wall, {w['compile_s']:.1f} s "
            f"compiling (goal < 30 s), import {r['cold']['import_s']:.1f} s"
        )
        lines.append(f"  {'step':32s} {'wall_s':>8s} {'compile_s':>9s} {'cpu_s':>8s}")
        for s in w["steps"]:
            lines.append(
                f"  {s['name']:32s} {s['wall_s']:8.2f} {s['compile_s']:9.2f} {s['cpu_s']:8.2f}"
            )
        lines.append(f"  {'kernel (callees included)':60s} {'compile_s':>9s}")
        for k, v in sorted(w["kernels"].items(), key=lambda kv: -kv[1]):
            lines.append(f"  {k:60s} {v:9.2f}")
        lines.append(f"  process CPU time of the warm-up: {r['cold']['warmup_cpu_s']:.1f} s")
        b = r["cold"]["breakdown"]
        lines.append("  heaviest compiled functions, inclusive seconds (numba overloads included):")
        for k, v in list(b["inclusive_s"].items())[:12]:
            lines.append(f"    {k[:70]:70s} {v:7.2f}")
        lines.append("  numba passes of each top-level kernel (seconds):")
        for k, v in b["passes"].items():
            lines.append(f"    {k.split('.')[-1]:28s} {v}")
    for name, g in r.get("goals", {}).items():
        lines.append(
            f"warm cache, first {name}: {g['first_s']:.3f} s vs steady {g['steady_s']:.4f} s "
            f"(goal <= 3x steady + 1 s = {g['bound_s']:.3f} s): {'met' if g['met'] else 'MISSED'}"
        )
    if "first_command" in r:
        lines.append(format_first_command(r["first_command"]))
    if "warmup_jobs" in r:
        lines.append(format_warmup_jobs(r["warmup_jobs"]))
    if "cold_first" in r:
        d = r["cold_first"]["dispatch_first"]
        lines.append(
            f"cold cache, first solve_dispatch without warm-up: wall {d['wall_s']:.1f} s, "
            f"runtime_s {d['runtime_s']:.4f} s, compile_s {d['compile_s']:.1f} s"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
