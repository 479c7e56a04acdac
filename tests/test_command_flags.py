"""The four commands read every list flag with one parser (``formulations._io.name_list``):
a list that names nothing, or an empty name, is a usage error (exit 2, one line on stderr),
never the default; every flag is validated, and the warm-up's child processes start through
an entry of their own, not through hidden flags of ``straggler-warmup``."""

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
    ],
)
def test_simulate_deployment_flags_are_checked_first(extra, flag):
    rc, err, out = run("straggler-simulate", ["azure_conv", "--moe", "dsv3", *extra])
    assert_usage_error(rc, err, out, flag)


def test_a_valid_list_still_runs():
    rc, err, out = run(
        "straggler-warmup", ["--no-routing", "--no-simulator", "--methods", " tempo "]
    )
    assert rc == 0, err
    assert "tempo" in out
