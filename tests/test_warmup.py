"""Cold start: the warm-up reaches every dispatch kernel, and compile time is never run time."""

import json
import os
import sys
import time

import numpy as np
import pytest
from numba import njit
from straggler.formulations import CostModel, DispatchProblem, InvalidInputError
from straggler.runtime.commands.warmup import main
from straggler.runtime.warmup import dispatch_kernels, eplb_kernels, needs_compile, warmup
from straggler.solvers import solve_dispatch
from straggler.solvers._numba.compile import JitTimer, merged_length
from straggler.solvers.dispatch import registry
from straggler.solvers.dispatch.method import LayerSolution
from straggler.solvers.routing.registry import routing_policies


def test_warmup_reaches_every_dispatch_kernel():
    rep = warmup(routing=False, simulator=False)
    assert rep.missed_kernels == ()
    kernels = dispatch_kernels()
    # every kernel solve_dispatch calls from Python: tempo's four, the bounds', A3's
    assert len(kernels) >= 6
    assert all(k.signatures for k in kernels.values())
    assert not needs_compile()
    eplb = eplb_kernels()
    assert len(eplb) == 2 and all(k.signatures for k in eplb.values())
    names = [s.name for s in rep.steps]
    assert names == [f"solve_dispatch[{m}]" for m in registry.dispatch_methods()] + [
        "rebalance_experts"
    ]
    assert rep.jit_s <= rep.total_s + 1e-6 and rep.compile_s <= rep.jit_s + 1e-6


def test_after_warmup_the_default_instance_compiles_nothing():
    from straggler.sim import make_decode_problem

    warmup(routing=False, simulator=False, methods=["tempo", "milp"])
    p = make_decode_problem(n_layers=2)
    cost = CostModel.preset("dsv3_a_offline")
    for method in ("tempo", "milp"):
        for problem in (p, p.layer(0)):
            with JitTimer() as jt:
                res = solve_dispatch(problem, cost, method=method)
            assert jt.compile_s == 0.0 and res.compile_s == jt.jit_s == 0.0, method


def _fresh_kernel():
    """A kernel numba has never seen: a new function object each call, so it compiles."""

    def body(x):
        s = 0.0
        for v in x:
            s += v * v
        return s

    return njit(cache=False)(body)


def test_jit_timer_measures_compilation_and_merges_threads():
    k = _fresh_kernel()
    with JitTimer() as jt:
        t = time.perf_counter()
        k(np.ones(3))
        wall = time.perf_counter() - t
    assert 0 < jt.compile_s <= jt.jit_s <= wall + 1e-6
    assert any(name.endswith("body") for name in jt.compiled)
    with JitTimer() as again:
        k(np.ones(3))
    assert again.jit_s == 0.0 and again.compiled == {}
    assert merged_length([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0


def test_runtime_excludes_compilation(monkeypatch):
    """A method whose first call compiles a kernel: runtime_s leaves the compile out and
    compile_s reports it (both times from the same call)."""
    import dataclasses

    kernel = _fresh_kernel()

    @dataclasses.dataclass(frozen=True)
    class Probe:
        def solve(self, problem, cost, *, time_limit, rng):
            kernel(np.ones(2))
            x = np.zeros((problem.n_experts, problem.n_gpus))
            x[:, 0] = problem.counts
            return LayerSolution(shares=x)

    monkeypatch.setitem(registry._DISPATCH, "jit_probe", Probe)  # removed after the test
    p = DispatchProblem(counts=[3, 1], replicas=[[1, 0], [1, 1]])
    res = solve_dispatch(p, CostModel(a=0, b=1, c=0, beta=0), method="jit_probe")
    assert res.compile_s > 0.01
    assert res.runtime_s < res.compile_s
    again = solve_dispatch(p, CostModel(a=0, b=1, c=0, beta=0), method="jit_probe")
    assert again.compile_s == 0.0


def test_warmup_validates_and_the_cli_reports(capsys):
    with pytest.raises(InvalidInputError, match="'methods' parameter of warmup"):
        warmup(methods=["nope"])
    with pytest.raises(InvalidInputError, match="'dispatch' parameter of warmup"):
        warmup(dispatch=1)
    with pytest.raises(InvalidInputError, match="'policies'"):
        warmup(dispatch=False, simulator=False, policies=["jsq", "lifo"])
    assert main(["--no-routing", "--no-simulator", "--methods", "round_robin", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in out["steps"]] == ["solve_dispatch[round_robin]", "rebalance_experts"]
    assert {"total_s", "jit_s", "compile_s", "kernels", "cache_dir"} <= set(out)


def test_warmup_runs_without_the_jit(run_python):
    """With ``NUMBA_DISABLE_JIT=1`` (the plain-Python functions serve) the warm-up runs and
    reports no missed kernel: nothing compiles, so nothing can be missed; ``jobs=2`` starts
    no child."""
    code = (
        "from straggler.runtime import warmup\n"
        "r = warmup(routing=False, simulator=False, methods=['round_robin'])\n"
        "print(r.missed_kernels)\n"
        "r = warmup(simulator=False, methods=['round_robin'], policies=['jsq'], jobs=2)\n"
        "print(r.children, r.serial_reason)\n"
    )
    out = run_python(code, env={"NUMBA_DISABLE_JIT": "1"})
    assert out.strip().splitlines() == ["()", "() NUMBA_DISABLE_JIT=1 (nothing compiles)"]


_REPORT_CODE = """
import gc, json, sys
from numba.core.registry import CPUDispatcher
from straggler.runtime.warmup import warmup
r = warmup(dispatch=False, policies=["jsq"], jobs=int(sys.argv[1]))
warm = sorted(
    f"{d.py_func.__module__}.{d.py_func.__qualname__}"
    for d in gc.get_objects()
    if isinstance(d, CPUDispatcher) and d.signatures
)
print(json.dumps({
    "share": [list(r.share.steps), r.share.compile_s] if r.share else None,
    "children": [[list(c.steps), c.compile_s, c.start_s, c.wall_s] for c in r.children],
    "compile_s": r.compile_s, "kernels": r.kernels, "missed": list(r.missed_kernels),
    "after": r.compiled_after_children, "twice": list(r.compiled_twice),
    "reason": r.serial_reason, "warm": warm, "summary": r.summary(), "steps": len(r.steps),
}))
"""


def _report_in_new_process(run_python, jobs: int, cache) -> dict:
    out = run_python(_REPORT_CODE, str(jobs), env={"NUMBA_CACHE_DIR": str(cache)})
    return json.loads(out.strip().splitlines()[-1])


def test_parallel_warmup_on_an_empty_cache_ends_as_warm_as_serial(tmp_path, run_python):
    """``jobs=2`` on an empty cache: the process compiles the simulator's unit while one
    child compiles routing, then loads the child's work, compiling nothing more, and ends
    with every kernel in memory that a serial warm-up has (run next, in a new process, on
    the cache the two filled)."""
    par = _report_in_new_process(run_python, 2, tmp_path / "cache")
    share, share_compile_s = par["share"]
    assert share == ["simulate[jsq]"] and share_compile_s > 0
    [(steps, compile_s, start_s, wall_s)] = par["children"]
    assert steps == ["route_batch[jsq]"] and compile_s > 0 and 0 < start_s < wall_s
    assert par["compile_s"] == share_compile_s and par["after"] == {} and par["missed"] == []
    assert "run_engine" in str(par["kernels"]) and "route_batch_kernel" not in str(par["kernels"])
    assert "this process" in par["summary"] and "1 child process" in par["summary"]
    # jsq's kernel and the least-tokens helper (route_batch's entry and the simulator's
    # engine both call them) are compiled by both shares, each the same signature (both
    # write the same cache entries), unless the child wrote them before this process
    # reached them, which then loads them
    assert set(par["twice"]) <= {
        "straggler.baselines.routing.sglang.jsq_kernel__by_address",
        "straggler.solvers.routing._core.least_tokens_kernel",
    }
    ser = _report_in_new_process(run_python, 1, tmp_path / "cache")
    assert ser["children"] == [] and ser["share"] is None and ser["kernels"] == {}
    # every function warm after the serial warm-up is warm after the parallel one (which
    # also holds the callees and numba overloads it compiled itself in its share, as a
    # serial warm-up on an empty cache does)
    assert (
        set(ser["warm"]) <= set(par["warm"])
        and "straggler.sim.engine._loop.run_engine" in ser["warm"]
    )
    assert par["steps"] == ser["steps"] == 2


def test_shares_keep_units_whole_and_balance_them(monkeypatch):
    import sys

    from straggler.runtime.warmup import _shares

    methods = [f"solve_dispatch[{m}]" for m in registry.dispatch_methods()]
    dispatch = [*methods, "rebalance_experts"]
    routing = ["route_batch[br0]", "route_batch[jsq]", "route_batch[brs]"]
    simulate = ["simulate[br0]", "simulate[jsq]", "simulate[brs]"]
    names = dispatch + routing + simulate
    # tempo's kernels weigh more than routing and the engine together with a child's start:
    # this process takes the dispatch methods, one child the rest (EPLB's kernels, apart
    # from dispatch's, go where they balance best); a third process would not finish
    # sooner, so none starts
    assert _shares(names, 2) == [tuple(methods), ("rebalance_experts", *routing, "simulate[jsq]")]
    assert _shares(names, 3) == _shares(names, 8) == _shares(names, 2)
    assert _shares(names, 1) == [] and _shares(methods, 2) == []
    assert _shares(dispatch, 2) == [tuple(methods), ("rebalance_experts",)]
    # without tempo the units weigh alike: three processes, this one the heaviest
    no_tempo = [n for n in names if n != "solve_dispatch[tempo]"]
    light = [n for n in dispatch if n != "solve_dispatch[tempo]"]
    assert _shares(no_tempo, 3) == [("simulate[jsq]",), tuple(light), tuple(routing)]
    assert _shares(no_tempo, 2) == [(*light[:-1], *routing), ("rebalance_experts", "simulate[jsq]")]
    # without routing, the simulator's share compiles every policy's kernel itself
    no_routing = [n for n in names if not n.startswith("route_batch")]
    assert _shares(no_routing, 2) == [tuple(methods), ("rebalance_experts", *simulate)]
    # every registered policy: routing and the engine weigh a little less than dispatch, and
    # EPLB joins them
    policies = [f"route_batch[{p}]" for p in routing_policies()]
    every = [*dispatch, *policies, *(f"simulate[{p}]" for p in routing_policies())]
    assert _shares(every, 2)[0] == tuple(methods)
    assert _shares(every, 2)[1][:-1] == ("rebalance_experts", *policies)
    # place_experts runs EPLB: one unit with dispatch
    assert _shares([*dispatch, "place_experts"], 2) == []
    # a child that takes longer to start than the work it would take over: none starts
    monkeypatch.setattr(sys.modules["straggler.runtime.warmup"], "_CHILD_START_S", 80.0)
    assert _shares(names, 2) == []


def test_parallel_warmup_runs_serially_when_it_cannot_help(tmp_path):
    import types

    from straggler.runtime.warmup import _cache_obstacle

    rep = warmup(routing=False, simulator=False, methods=["round_robin"], jobs=1)
    assert rep.children == () and rep.serial_reason == ""
    # the session's warm-up compiled every dispatch kernel: nothing left for a child
    rep = warmup(routing=False, simulator=False, jobs=2)
    assert rep.children == ()
    assert rep.serial_reason.startswith("every kernel is in numba's disk cache")
    assert _cache_obstacle(list(dispatch_kernels().values())) == ""
    assert "has no disk cache" in _cache_obstacle([_fresh_kernel()])
    gone = types.SimpleNamespace(
        _cache=types.SimpleNamespace(cache_path=str(tmp_path / "gone")), py_func=_fresh_kernel
    )
    assert "is not writable" in _cache_obstacle([gone])


def test_warmup_validates_jobs(capsys):
    from straggler.runtime.commands.warmup import _jobs_arg
    from straggler.runtime.warmup import MAX_JOBS

    for bad in (0, -1, 1.5, True, "2", None):
        with pytest.raises(InvalidInputError, match="'jobs' parameter of warmup"):
            warmup(jobs=bad)
    assert 1 <= _jobs_arg("auto") <= MAX_JOBS and _jobs_arg("3") == 3
    # the command: one line naming the parameter, exit status 2
    for argv, what in ((["--jobs", "two"], "jobs"), (["--jobs", "0"], "'jobs'"),
                       (["--methods", "nope"], "'methods'"), (["--bogus"], "--bogus")):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and what in err, (argv, err)


def _fake_children(monkeypatch, shares) -> list:
    """Make ``warmup(jobs=...)`` use ``shares`` (this process's first) and start, for a
    child's share, a stand-in process: one that fails in step ``route_batch[jsq]`` after
    printing the step marker and a traceback, or one that sleeps (still compiling). Returns
    the list the started processes are appended to."""
    import subprocess
    import sys

    wm = sys.modules["straggler.runtime.warmup"]
    started = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    def argv(steps):
        if steps == ("route_batch[jsq]",):
            code = (
                "import sys; print('warmup child: step route_batch[jsq]', file=sys.stderr, "
                "flush=True); raise RuntimeError('typing of route_batch_kernel failed')"
            )
        else:
            code = "import time; time.sleep(60)"
        return [sys.executable, "-c", code]

    monkeypatch.setattr(wm, "_child_argv", argv)
    monkeypatch.setattr(wm.subprocess, "Popen", Recorded)
    monkeypatch.setattr(wm, "_parallel_plan", lambda names, jobs: (shares, ""))
    return started


def test_a_failing_child_names_its_step_and_stops_the_others(monkeypatch):
    """This process runs its share (warm: the session's warm-up compiled it), then waits:
    one child fails, the other, still compiling, is stopped."""
    import sys

    wm = sys.modules["straggler.runtime.warmup"]
    shares = [("simulate[jsq]",), ("simulate[jsq]",), ("route_batch[jsq]",)]
    started = _fake_children(monkeypatch, shares)
    with pytest.raises(wm.WarmupChildError) as err:
        warmup(dispatch=False, policies=["jsq"], jobs=3)
    msg = str(err.value)
    assert "in step 'route_batch[jsq]'" in msg and "typing of route_batch_kernel failed" in msg
    assert len(started) == 2 and all(p.poll() is not None for p in started)


def test_a_failing_share_in_this_process_stops_the_children(monkeypatch):
    """An exception in this process's own share propagates as in a serial warm-up, and the
    child still compiling is stopped."""
    import sys

    wm = sys.modules["straggler.runtime.warmup"]
    started = _fake_children(monkeypatch, [("route_batch[jsq]",), ("simulate[jsq]",)])

    def fails(policy):
        raise RuntimeError(f"typing of {policy}'s kernel failed")

    monkeypatch.setattr(wm, "_routing_case", fails)
    with pytest.raises(RuntimeError, match="typing of jsq's kernel failed"):
        warmup(dispatch=False, policies=["jsq"], jobs=2)
    assert len(started) == 1 and started[0].poll() is not None


def test_a_child_skips_the_steps_it_does_not_know():
    """A policy or method registered at run time in the parent is unknown to a child: it
    skips the step and says so (the parent compiles it)."""
    import sys

    got = sys.modules["straggler.runtime.warmup"]._child_main(["route_batch[registered_here]"])
    assert got["skipped"] == ["route_batch[registered_here]"] and got["compile_s"] == 0.0


@pytest.mark.skipif(sys.platform == "win32", reason="fcntl locks")
def test_cache_saves_wait_for_the_lock_other_warmup_processes_hold(tmp_path):
    """Under ``_cache_saves_locked`` a numba cache save (which reads the index, picks a free
    data file name and rewrites both) waits while another process of the warm-up holds the
    folder's lock, then keeps the entry that process wrote: two signatures of one function
    saved side by side never share a data file."""
    import fcntl
    import threading

    from numba.core.caching import IndexDataCacheFile
    from straggler.runtime.warmup import _cache_saves_locked

    def index(stamp="s"):
        return IndexDataCacheFile(str(tmp_path), "f-1.py311", stamp)

    index().save(("sig A",), "code A")  # another process's entry, saved before
    with open(tmp_path / ".straggler-warmup.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process is saving
        with _cache_saves_locked():
            t = threading.Thread(target=index().save, args=(("sig B",), "code B"))
            t.start()
            t.join(0.5)
            assert t.is_alive()  # waiting for the lock, nothing written yet
            assert index()._load_index() == {("sig A",): "f-1.py311.1.nbc"}
            fcntl.flock(held, fcntl.LOCK_UN)
            t.join(30)
            assert not t.is_alive()
    assert index()._load_index() == {("sig A",): "f-1.py311.1.nbc", ("sig B",): "f-1.py311.2.nbc"}
    assert index().load(("sig A",)) == "code A" and index().load(("sig B",)) == "code B"
    assert IndexDataCacheFile.save.__qualname__ == "IndexDataCacheFile.save"  # numba's again


_EPLB_UNIT_CODE = r"""
import importlib, json, sys
import numpy as np
wm = importlib.import_module("straggler.runtime.warmup")
from straggler.solvers.placement.eplb import rebalance_experts

kernels = list(wm.eplb_kernels().values())
before = wm._unit_warm("eplb", ["rebalance_experts"], kernels)
if sys.argv[1] == "other types":  # compiled, and cached, for vLLM's types only
    rebalance_experts(np.arange(1.0, 17.0).reshape(2, 8), 12, 2, 2, 4, version="vllm")
other = wm._unit_warm("eplb", ["rebalance_experts"], kernels)
if sys.argv[1] == "other types":
    wm.warmup(methods=[], routing=False, simulator=False)  # the unit's steps, serially
plan = wm._parallel_plan(["rebalance_experts", "route_batch[jsq]"], 2)
print(json.dumps({
    "before": before, "other": other, "plan": plan,
    "warm": wm._unit_warm("eplb", ["rebalance_experts"], kernels),
    "more_steps": wm._unit_warm("eplb", ["rebalance_experts", "x"], kernels),
    "signatures": [len(k.signatures) for k in kernels],
}))
"""


@pytest.mark.skipif(sys.platform == "win32", reason="fcntl locks")
def test_a_unit_compiled_for_other_types_is_still_shared_out(tmp_path, run_python):
    """EPLB's kernels compiled and cached for other argument types (vLLM's, as LPLB or
    ``make_decode_problem`` at a test module's import compile them) do not make the EPLB
    unit warm: a parallel warm-up still gives it to a share, instead of this process
    compiling it after the children. Once a warm-up has run the unit's steps on that cache,
    a new process finds it warm and compiles nothing for it."""
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def run(mode):
        out = run_python(_EPLB_UNIT_CODE, mode, env=env)
        return json.loads(out.strip().splitlines()[-1])

    first = run("other types")
    assert first["before"] is first["other"] is False
    assert first["warm"] is True and first["more_steps"] is False
    assert first["plan"][0] == []  # only routing left: one unit, no child
    assert "1 of 2 units" in first["plan"][1]
    again = run("new process")
    assert again["before"] is again["warm"] is True and again["signatures"] == [0, 0]
    # another stamp (the sources changed): not warm
    folder = tmp_path / "cache"
    [record] = folder.rglob("straggler-warmup-eplb.json")
    text = json.loads(record.read_text())
    text["stamps"] = {k: "(0, 0)" for k in text["stamps"]}
    record.write_text(json.dumps(text))
    assert run("new process")["before"] is False


_ORPHAN_CODE = r"""
import importlib, sys, time
wm = importlib.import_module("straggler.runtime.warmup")
with wm._Children([("solve_dispatch[tempo]",)], False) as kids:
    print(kids.runs[0][0].pid, flush=True)
    time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("after_s", [0.0, 2.0])
def test_a_child_stops_when_its_parent_is_killed(tmp_path, after_s):
    """A child of a parallel warm-up compiling on an empty cache (tempo: many seconds) ends
    within seconds of its parent's SIGKILL, which skips the parent's own clean-up: killed
    while the child still starts (0 s) or while it compiles (2 s)."""
    import signal
    import subprocess

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_CODE], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(parent.stdout.readline())
        time.sleep(after_s)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)

        def alive():
            try:
                with open(f"/proc/{child}/status") as f:
                    return "\nState:\tZ" not in f.read()
            except FileNotFoundError:
                return False

        deadline = time.monotonic() + 15.0
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        still = alive()
        if still:
            os.kill(child, signal.SIGKILL)
        assert not still
    finally:
        parent.kill()
        parent.stdout.close()
