"""The main job, ``straggler-compare``: one row per registered method, JSON, skips, errors."""

import json

import pytest
import straggler.sim.experiments.compare as compare_mod
from straggler.formulations import BackendUnavailableError
from straggler.runtime.commands.compare import main
from straggler.solvers import dispatch_methods

SMALL = ["--shape", "qwen2_57b", "--gpus", "4", "--tokens-per-gpu", "8", "--time-limit", "5"]


def _table_rows(out):
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("method"))
    rows = {}
    for line in lines[start + 2 :]:
        if line.startswith("notes"):
            break
        cells = line.split()
        rows[cells[0].rstrip("*")] = cells
    return lines[:start], rows


def test_table_has_every_method_and_consistent_numbers(capsys):
    assert main(SMALL) == 0
    header, rows = _table_rows(capsys.readouterr().out)
    assert "qwen2_57b: 64 experts top-8, EP4, 8 tokens/GPU" in header[0]
    assert "dsv2_lite_a_offline" in header[1]
    assert sorted(rows) == dispatch_methods()
    ratios = {m: float(c[2]) for m, c in rows.items() if c[0] == m}  # on the replica mask
    assert min(ratios.values()) == 1.0
    for m, c in rows.items():
        makespan, bound = float(c[1]), float(c[3])
        assert bound <= makespan + 0.05, m
        assert c[5] in ("OPTIMAL", "HEURISTIC", "FEASIBLE"), m
    if "milp" in rows and rows["milp"][5] == "OPTIMAL":
        assert ratios["milp"] == 1.0


def test_json_output(capsys):
    assert main([*SMALL, "--json", "--methods", "uniform,metro,moonep", "--layers", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    inst = data["instance"]
    assert inst["n_experts"] == 64 and inst["n_layers"] == 2 and inst["physical_slots"] == 80
    res = {r["method"]: r for r in data["results"]}
    assert list(res) == ["uniform", "metro", "moonep"]
    assert not res["moonep"]["on_mask"] and "charged" in res["moonep"]["note"]
    best = min(res[m]["makespan_us"] for m in ("uniform", "metro"))
    assert res["metro"]["ratio_vs_best"] == pytest.approx(res["metro"]["makespan_us"] / best)


def test_missing_backend_is_skipped_and_failures_reported(capsys, monkeypatch):
    real = compare_mod.solve_dispatch

    def fake(problem, cost, *, method, **kw):
        if method == "metro":
            raise BackendUnavailableError("ortools is not installed")
        if method == "static":
            raise RuntimeError("boom")
        return real(problem, cost, method=method, **kw)

    monkeypatch.setattr(compare_mod, "solve_dispatch", fake)
    assert main([*SMALL, "--methods", "uniform,metro,static"]) == 1
    out = capsys.readouterr().out
    _, rows = _table_rows(out)
    assert rows["metro"][5] == "SKIPPED" and rows["static"][5] == "ERROR"
    assert rows["uniform"][2] == "1.000"
    assert "metro: skipped: ortools is not installed" in out
    assert "static: RuntimeError: boom" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--methods", "nope"],
        ["--gpus", "6", "--nodes", "4"],
        ["--time-limit", "0"],
        ["--shape", "gpt5"],
        ["--methods", ","],
        ["--replication", "1e9"],
        ["--replication", "nan"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*SMALL, *argv])
    assert exc.value.code == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("straggler-compare: error:"), err
