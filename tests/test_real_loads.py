"""benchmarks/real_loads.py on a few recorded batches: every configuration scored on the same
held-out batches, written under --out with the command, commit and machine."""

import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOADS = ROOT / ".." / "shared" / "data" / "expert_loads"


def _module():
    path = ROOT / "benchmarks" / "real_loads.py"
    spec = importlib.util.spec_from_file_location("real_loads", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not LOADS.exists(), reason="../shared/data/expert_loads is not here")
def test_real_loads_small(tmp_path, capsys):
    mod = _module()
    out = tmp_path / "res"
    assert mod.main(["--sequences", "12", "--per-subject", "1", "--out", str(out)]) == 0
    data = json.loads((out / "real_loads.json").read_text())
    assert set(data["run"]) >= {"command", "commit", "machine"}
    assert [r["loads"].split()[0] for r in data["results"]] == ["DeepSeek-V2-Lite", "Mixtral-8x7B",
                                                                 "Mixtral-8x7B"]  # fmt: skip
    for r in data["results"]:
        us = r["moe_us"]
        assert r["scored_batches"] >= 1 and r["planned_batches"] >= 1
        assert us["lower_bound"] <= us["tempo_per_batch"] + 1e-6
        assert us["tempo_per_batch"] <= us["eplb_even"] + 1e-6  # tempo never loses to even
        assert all(v > 0 for v in us.values())
    assert "relative to SGLang" in capsys.readouterr().out
