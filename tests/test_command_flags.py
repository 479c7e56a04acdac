"""The four commands read every list flag with one parser (``formulations._io.name_list``):
a list that names nothing, an empty name or one name twice is a usage error (exit 2, one
line on stderr), never the default; every flag and output path is checked before anything
is printed, the error naming the flag; and the warm-up's child processes start through an
entry of their own, not through hidden flags of ``straggler-warmup``."""

import contextlib
import importlib
import io
import json
import os
import subprocess

import pytest
from straggler.runtime.commands.compare import main as compare_main
from straggler.runtime.commands.plan import main as plan_main
from straggler.runtime.commands.simulate import main as simulate_main
from straggler.runtime.commands.warmup import main as warmup_main

warmup_mod = importlib.import_module("straggler.runtime.warmup")  # the module, not warmup()
MAINS = {
    "straggler-compare": compare_main,
    "straggler-simulate": simulate_main,
    "straggler-warmup": warmup_main,
    "straggler-plan": plan_main,
}


def run(prog, argv):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = MAINS[prog](argv)
        except SystemExit as e:
            rc = e.code
    return rc, err.getvalue(), out.getvalue()


def assert_usage_error(rc, err, out, flag):
    lines = err.strip().splitlines()
    assert rc == 2, (rc, err)
    assert len(lines) == 1 and "error:" in lines[0] and flag in lines[0], err
    assert out == ""


LIST_FLAGS = [
    ("straggler-compare", ["--methods"]),
    ("straggler-simulate", ["azure_conv", "--policies"]),
    ("straggler-simulate", ["azure_conv", "--moe", "dsv3", "--routings"]),
    ("straggler-simulate", ["azure_conv", "--moe", "dsv3", "--dispatches"]),
    ("straggler-simulate", ["azure_conv", "--moe", "dsv3", "--placements"]),
    ("straggler-simulate", ["azure_conv", "--moe", "dsv3", "--rebalance"]),
    ("straggler-warmup", ["--methods"]),
    ("straggler-warmup", ["--policies"]),
]


@pytest.mark.parametrize("value", ["", ",", " , ", "tempo,,token_lp", "tempo,"])
@pytest.mark.parametrize("prog, argv", LIST_FLAGS)
def test_an_empty_list_is_refused_the_same_way_everywhere(prog, argv, value):
    rc, err, out = run(prog, [*argv, value])
    assert_usage_error(rc, err, out, argv[-1])
    assert "at least one and none empty" in err


@pytest.mark.parametrize("value", ["tempo,tempo", "jsq, jsq", "a,b,a"])
@pytest.mark.parametrize("prog, argv", LIST_FLAGS)
def test_a_list_naming_a_thing_twice_is_refused_everywhere(prog, argv, value):
    rc, err, out = run(prog, [*argv, value])
    assert_usage_error(rc, err, out, argv[-1])
    assert "each once" in err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--child-steps", "foo"], "--child-steps"),
        (["--parent", "-5"], "--parent"),
        (["--child-steps", "dispatch", "--parent", "1"], "--child-steps"),
    ],
)
def test_warmup_has_no_hidden_flags(argv, flag):
    rc, err, out = run("straggler-warmup", argv)
    assert_usage_error(rc, err, out, flag)


@pytest.mark.parametrize(
    "argv",
    [[], ["x"], ["not json", "1"], ["[]", "1"], ['["dispatch"]', "-5"], ['["dispatch"]', "0"],
     ['[""]', "1"], ["[1]", "1"], ['["dispatch"]', "1x"], ['"dispatch"', "1"]],
)  # fmt: skip
def test_the_warmup_child_entry_refuses_what_its_parent_never_passes(argv, capsys):
    assert warmup_mod._child_entry(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0]


def test_the_warmup_child_entry_runs_a_step(tmp_path):
    """What ``warmup(jobs=2)`` starts: the child's report, as JSON on stdout."""
    argv = warmup_mod._child_argv(["no_such_step"])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=os.environ)
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout.strip().splitlines()[-1])
    assert rep["skipped"] == ["no_such_step"] and rep["functions"] == []


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--nodes", "0"], "--nodes"),
        (["--layers", "0"], "--layers"),
        (["--table-period", "nan"], "--table-period"),
        (["--table-period", "-1"], "--table-period"),
        (["--moe", "nope"], "--moe"),
        (["--layers", "-2"], "--layers"),
        (["--layers", "59"], "--layers"),  # dsv3 has 58 MoE layers
        (["--ep", "8", "--nodes", "3"], "--nodes"),
        (["--ep", "8", "--nodes", "16"], "--nodes"),
        (["--routings", "nope"], "--routings"),
        (["--dispatches", "jsq"], "--dispatches"),
        (["--placements", "even"], "--placements"),
        (["--policies", "jsq"], "--policies"),
        (["--prefix-cache"], "--prefix-cache"),
        (["--json", "/proc/nope/x.json"], "--json"),
        (["--kv-capacity", "1"], "--kv-capacity"),
    ],
)
def test_simulate_deployment_flags_are_checked_first(extra, flag, monkeypatch):
    """Each deployment flag checked against the preset before anything is printed (the
    trace's first-N notice included), the error naming the flag, not the parameter of the
    deployment model it becomes."""
    levers_module = importlib.import_module("straggler.sim.experiments.levers")
    monkeypatch.setattr(levers_module, "levers", lambda *a, **k: pytest.fail("ran"))
    rc, err, out = run("straggler-simulate", ["azure_conv", "--moe", "dsv3", *extra])
    assert_usage_error(rc, err, out, flag)


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--policies", "vllm:bogus"], "--policies"),
        (["--policies", "jsq:v1"], "--policies"),
        (["--policies", "nope"], "--policies"),
        (["--routings", "jsq"], "--routings"),
        (["--layers", "2"], "--layers"),
        (["--full"], "--full"),
        (["--json", "/proc/nope/x.json"], "--json"),
        (["--plot", "/proc/nope/x.png"], "--plot"),
        (["--rate", "5"], "--rate"),  # a preset has its own arrivals
        (["--kv-capacity", "1"], "--kv-capacity"),  # below the longest request
        (["--prefill-instances", "0", "--load-basis", "prefill"], "--load-basis"),
    ],
)
def test_simulate_policy_flags_are_checked_first(extra, flag, monkeypatch):
    """The policy table: a policy's version, and the levers table's flags given without
    ``--moe``, refused naming the flag before any kernel compiles or any run starts."""
    cmd = importlib.import_module("straggler.runtime.commands.simulate")
    monkeypatch.setattr(cmd, "warm_engine", lambda *a, **k: pytest.fail("compiled"))
    monkeypatch.setattr(cmd, "simulate", lambda *a, **k: pytest.fail("ran"))
    rc, err, out = run("straggler-simulate", ["bursty", "--requests", "5", *extra])
    assert_usage_error(rc, err, out, flag)


def test_a_valid_list_still_runs():
    rc, err, out = run(
        "straggler-warmup", ["--no-routing", "--no-simulator", "--methods", " tempo "]
    )
    assert rc == 0, err
    assert "tempo" in out


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--gpus", "0"], "--gpus"),
        (["--tokens-per-gpu", "-1"], "--tokens-per-gpu"),
        (["--gpus", "65536", "--tokens-per-gpu", "65536"], "--tokens-per-gpu"),
        (["--skew", "nan"], "--skew"),
        (["--kappa", "-1"], "--kappa"),
        (["--replication", "0.5"], "--replication"),
        (["--layers", "0"], "--layers"),
        (["--nodes", "3"], "--nodes"),
        (["--seed", "-1"], "--seed"),
        (["--time-limit", "nan"], "--time-limit"),
        (["--methods", "nope"], "--methods"),
    ],
)
def test_compare_names_the_flag_before_generating_anything(argv, flag, monkeypatch):
    cmd = importlib.import_module("straggler.runtime.commands.compare")
    monkeypatch.setattr(cmd, "make_decode_problem", lambda *a, **k: pytest.fail("generated"))
    rc, err, out = run("straggler-compare", argv)
    assert_usage_error(rc, err, out, flag)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--methods", "nope"], "--methods"),
        (["--policies", "nope"], "--policies"),
        (["--jobs", "0"], "--jobs"),
        (["--jobs", "two"], "--jobs"),
    ],
)
def test_warmup_names_the_flag(argv, flag, monkeypatch):
    cmd = importlib.import_module("straggler.runtime.commands.warmup")
    monkeypatch.setattr(cmd, "warmup", lambda *a, **k: pytest.fail("ran"))
    rc, err, out = run("straggler-warmup", argv)
    assert_usage_error(rc, err, out, flag)


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--gpus", "100000"], "--gpus"),
        (["--gpus", "6"], "--gpus"),  # 64 experts, 64 slots by default
        (["--gpus", "8", "--slots", "68"], "--gpus"),
        (["--gpus", "8", "--slots", "3"], "--slots"),
        (["--gpus", "8", "--slots", "10000000"], "--slots"),
        (["--gpus", "8", "--groups", "3"], "--groups"),
    ],
)
def test_plan_names_the_flag_a_recording_refuses(extra, flag, monkeypatch):
    """straggler-plan checks the flags that depend on the recording (its 64 experts) once
    it is read, naming the flag, not plan()'s or rebalance_experts' parameter."""
    cmd = importlib.import_module("straggler.runtime.commands.plan")
    monkeypatch.setattr(cmd, "plan", lambda *a, **k: pytest.fail("planned"))
    rc, err, out = run("straggler-plan", ["sample:vllm", "--no-progress", *extra])
    assert_usage_error(rc, err, out, flag)
