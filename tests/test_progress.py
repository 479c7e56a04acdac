"""Long work says what it will do and how long it should take before it starts, then shows a
progress bar with the time left: the levers table (its command's quick grid and --full), the
sweeps (and so the phase diagram and the load sweeps)."""

import numpy as np
import pytest
from straggler.runtime.commands import simulate as simulate_cmd
from straggler.sim import DeploymentConfig
from straggler.sim.experiments.levers import estimate_levers_seconds, levers
from straggler.sim.workloads.traces import Trace, generate_trace


def _trace(n, seed=0):
    rng = np.random.default_rng(seed)
    return Trace(
        arrival_s=np.sort(rng.uniform(0, n / 20, n)),
        prompt_len=rng.integers(100, 2000, n),
        output_len=rng.integers(5, 60, n),
    )


def test_levers_prints_the_cells_and_an_estimate_then_a_bar(capsys):
    dep = DeploymentConfig(preset="qwen3_235b", n_gpus=4, layers=1, seed=1)
    cells = [("jsq", "even", "eplb"), ("brs", "even", "eplb")]
    levers(_trace(240), dep, routings=("jsq", "brs"), dispatches=("even",),
           placements=("eplb",), max_slots=8, progress=True)  # fmt: skip
    err = capsys.readouterr().err
    assert "levers: 2 cells of 240 requests; estimated time about " in err
    assert "2/2" in err and "cell" in err  # the bar, finished
    est = estimate_levers_seconds(_trace(240), dep, cells, max_slots=8, n_replicas=4)
    assert est is not None and est > 0
    assert estimate_levers_seconds(_trace(20), dep, cells, max_slots=8, n_replicas=4) is None


def test_the_levers_command_runs_a_small_grid_unless_full(capsys, monkeypatch):
    monkeypatch.setattr(simulate_cmd, "LEVERS_QUICK_REQUESTS", 80)
    args = ["bursty", "--moe", "qwen3_235b", "--ep", "4", "--layers", "1", "--max-slots", "8"]
    assert simulate_cmd.main([*args, "--no-progress"]) == 0
    cap = capsys.readouterr()
    assert "the first 80 of" in cap.err and "--full" in cap.err
    rows = [ln.split("|") for ln in cap.out.splitlines() if ln.count("|") > 10]
    cells = {tuple(c.strip() for c in r[:3]) for r in rows if r[0].strip() != "routing"}
    assert cells == {(r, d, p) for r in ("jsq", "brs") for d in ("even", "tempo")
                     for p in ("eplb", "place_experts")}  # fmt: skip
    assert cap.out.splitlines()[0].startswith(f"{generate_trace('bursty').name}: 80 requests")
    assert simulate_cmd.main([*args, "--requests", "40", "--full", "--no-progress",
                              "--dispatches", "even", "--placements", "eplb"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    routings = {ln.split("|")[0].strip() for ln in out.splitlines() if ln.count("|") > 10}
    assert routings - {"routing"} == {"jsq", "brs", "br0", "trtllm_balance"}
    assert "40 requests" in out.splitlines()[0]


@pytest.mark.parametrize("backend", ["serial"])
def test_a_sweep_says_its_cells_then_an_estimate(capsys, backend):
    from straggler.sim.experiments.sweep import sweep

    def cell(x):
        return {"y": x * 2}

    sweep(cell, {"x": [1, 2, 3]}, backend=backend, desc="demo")
    err = capsys.readouterr().err
    assert "demo: 3 cells to run" in err
    assert "estimated" in err and "3/3" in err


def test_warmup_says_its_steps_and_an_estimate_then_a_bar(capsys):
    from straggler.runtime.warmup import estimate_warmup_seconds, warmup

    rep = warmup(dispatch=False, simulator=False, policies=["jsq"], progress=True)
    err = capsys.readouterr().err
    assert "warm-up: 1 steps, " in err and "units to compile" in err and "estimated" in err
    assert "1/1" in err
    line = rep.summary()
    assert line.startswith(f"warm-up {rep.total_s:.1f} s: ") and "\n" not in line
    assert "loaded every kernel" in line or "kernel(s) compiled" in line or "loaded from" in line
    seconds, cold, units = estimate_warmup_seconds(["route_batch[jsq]", "simulate[jsq]"])
    assert units == 2 and 0 <= cold <= 2 and seconds >= 0
