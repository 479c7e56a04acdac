"""The straggler-simulate command: table with ratios to JSQ, JSON, plot, progress, compile
notice, bad input."""

import json

import pytest
from straggler.runtime.commands import simulate as simulate_cmd


def test_table_json_and_progress(tmp_path, capsys):
    out = tmp_path / "runs.json"
    rc = simulate_cmd.main(
        [
            "bursty",
            "--requests",
            "300",
            "--replicas",
            "4",
            "--load",
            "1.2",
            "--policies",
            "brs,jsq,br0",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    assert "offered load 1.20x" in lines[0] and "300 requests" in lines[0]
    assert lines[1].startswith("policy") and "mean imbalance (tok)" in lines[1]
    assert "x jsq" in lines[1] and "TTFT p99 (s)" in lines[1]
    rows = {ln.split("|")[0].strip(): ln for ln in lines[3:6]}
    assert set(rows) == {"brs *", "jsq", "br0"}
    assert rows["jsq"].split("|")[1].split()[-1] == "1.00"  # JSQ's own ratio
    assert "simulating: 3/3 runs" in cap.err or "simulating" in cap.err
    data = json.loads(out.read_text())
    assert set(data) == {"brs", "jsq", "br0"} and data["jsq"]["offered_load"] == 1.2


def test_compile_notice_when_the_cache_is_cold(monkeypatch, capsys):
    monkeypatch.setattr(simulate_cmd, "engine_cache_is_warm", lambda names: False)
    assert (
        simulate_cmd.main(["bursty", "--requests", "50", "--policies", "jsq", "--no-progress"]) == 0
    )
    err = capsys.readouterr().err
    assert err.startswith("compiling kernels (first run only) ...") and err.strip().endswith("s")


def test_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "imb.png"
    assert (
        simulate_cmd.main(
            [
                "bursty",
                "--requests",
                "100",
                "--policies",
                "jsq,brs",
                "--plot",
                str(png),
                "--no-progress",
            ]
        )
        == 0
    )
    assert png.stat().st_size > 1000


def test_bad_input(capsys):
    assert simulate_cmd.main(["bursty", "--requests", "20", "--policies", "nope"]) == 2
    assert "--policies" in capsys.readouterr().err
    assert simulate_cmd.main(["no_such_trace_or_preset"]) == 2
    assert "neither a file" in _one_line(capsys.readouterr().err)
    assert simulate_cmd.main(["bursty", "--requests", "20", "--load", "-1"]) == 2


def test_versions_dispatch_and_prefix_cache(tmp_path, capsys):
    trace = tmp_path / "mooncake.jsonl"
    rec = {"input_length": 1024, "output_length": 8}
    rows = [
        json.dumps({**rec, "timestamp": 40 * i, "hash_ids": [i % 3, 100 + i]}) for i in range(40)
    ]
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "runs.json"
    args = [str(trace), "--policies", "jsq,vllm:legacy,dynamo", "--dispatch", "queue"]
    args += ["--prefix-cache", "--replicas", "2", "--no-progress", "--json", str(out)]
    assert simulate_cmd.main(args) == 0
    text = capsys.readouterr().out
    assert "queue dispatch" in text and "prefix hits" in text and "vllm:legacy" in text
    runs = json.loads(out.read_text())
    assert set(runs) == {"jsq", "vllm:legacy", "dynamo"}
    assert all(0 <= r["prefix_hit_rate"] <= 1 for r in runs.values())
    assert simulate_cmd.main(["bursty", "--requests", "20", "--policies", "vllm:nope"]) == 2
    assert "--policies" in capsys.readouterr().err


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--policies", ","], "--policies"),
        (["--policies", " , ,"], "--policies"),
        (["--max-slots", str(10**7)], "--max-slots"),
        (["--replicas", "0"], "--replicas"),
        (["--replicas", "4096", "--max-slots", "4096"], "--replicas x --max-slots"),
        (["--rate", "nan"], "--rate"),
        (["--ctx-cost", "-1"], "--ctx-cost"),
        (["--requests", "-3"], "--requests"),
    ],
)
def test_absurd_arguments_are_one_line_before_any_work(argv, match, capsys, monkeypatch):
    monkeypatch.setattr(simulate_cmd, "simulate", lambda *a, **k: pytest.fail("ran"))
    try:  # a usage error of the parser exits (SystemExit), a checked value returns 2
        status = simulate_cmd.main(["bursty", "--requests", "20", *argv])
    except SystemExit as e:
        status = e.code
    assert status == 2
    assert match in _one_line(capsys.readouterr().err)


def test_outputs_checked_before_the_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(simulate_cmd, "simulate", lambda *a, **k: pytest.fail("ran"))
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for bad in (["--json", str(tmp_path)], ["--json", str(a_file / "x.json")]):
        assert simulate_cmd.main(["bursty", "--requests", "20", *bad]) == 2
        assert "--json" in _one_line(capsys.readouterr().err)
    with pytest.raises(SystemExit) as e:
        simulate_cmd.main(["bursty", "--replicas", "two"])
    assert e.value.code == 2
    assert "--replicas" in _one_line(capsys.readouterr().err)


def test_the_levers_table_checks_its_arguments_and_outputs_first(tmp_path, capsys, monkeypatch):
    """``--moe`` (the levers table) checks the flags and ``--json`` before any work, as the
    policy table does: one line, exit 2, the levers never run."""
    import importlib

    levers_module = importlib.import_module("straggler.sim.experiments.levers")
    monkeypatch.setattr(levers_module, "levers", lambda *a, **k: pytest.fail("ran"))
    moe = ["bursty", "--requests", "20", "--moe", "dsv3"]
    for bad, flag in (
        (["--json", str(tmp_path)], "--json"),
        (["--replicas", "0"], "--replicas"),
        (["--ep", "0"], "--ep"),
        (["--load", "-1"], "--load"),
    ):
        assert simulate_cmd.main([*moe, *bad]) == 2
        assert flag in _one_line(capsys.readouterr().err), bad
