"""The benchmark scripts write under ``./straggler-results`` (or ``$STRAGGLER_RESULTS``, or the
path given), never into the tracked ``benchmarks/results``: no script builds a default output
path from its own folder."""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
#: A path into the tracked results folder, built from the script's folder or the checkout.
TRACKED = re.compile(r'(__file__\)[^\n]*|ROOT[^\n]*)/ "results"')
#: Tracked results a script may read (its inputs), by script.
READS = {"routing_brs_ablation.py": "REFERENCE = ", "tempo_quality.py": "ORACLE = "}


def test_no_script_writes_into_the_tracked_results_by_default():
    offenders = []
    for script in sorted(BENCH.glob("*.py")):
        for line in script.read_text().splitlines():
            if TRACKED.search(line) and READS.get(script.name, "\0") not in line:
                offenders.append(f"{script.name}: {line.strip()}")
    assert not offenders, offenders


def test_results_dir_is_the_current_folder_or_the_environment(tmp_path, monkeypatch):
    sys.path.insert(0, str(BENCH))
    try:
        import _results
    finally:
        sys.path.pop(0)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STRAGGLER_RESULTS", raising=False)
    assert _results.results_dir().resolve() == tmp_path / "straggler-results"
    monkeypatch.setenv("STRAGGLER_RESULTS", str(tmp_path / "elsewhere"))
    assert _results.results_dir() == tmp_path / "elsewhere" and (tmp_path / "elsewhere").is_dir()
    info = _results.run_info()
    assert set(info) >= {"command", "commit", "machine"} and info["commit"] != "unknown"
