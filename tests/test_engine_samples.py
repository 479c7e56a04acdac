"""The sample recordings shipped in ``runtime/samples``: one per engine format, the same real
loads in each, named ``sample:ENGINE`` by ``straggler-plan``, made by
``tests/engine_samples.py`` from ``../shared/data/expert_loads``, listed in package-data, and
a missing reader dependency is one line naming the extra."""

import importlib.util
import json
import pathlib
import subprocess
import sys
import tomllib

import numpy as np
import pytest
from straggler.formulations import InvalidInputError
from straggler.runtime.commands import plan as plan_cmd
from straggler.runtime.engines import SAMPLES, read_engine_log, sample_recording

ROOT = pathlib.Path(__file__).resolve().parents[1]
HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_ST = importlib.util.find_spec("safetensors") is not None
READABLE = {"sglang": HAVE_TORCH, "vllm": True, "trtllm": HAVE_ST}


def _readable(engine):
    if not READABLE[engine]:
        pytest.skip(f"reading the {engine} sample needs the runtime extra")


def test_every_sample_file_is_package_data():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    files = [p for p in (ROOT / "runtime" / "samples").rglob("*") if p.is_file()]
    assert len(files) >= 7
    for p in files:
        # each folder is a package of its own (pyproject lists it), its files package data
        rel = p.parent.relative_to(ROOT / "runtime").as_posix().replace("/", ".")
        package = f"straggler.runtime.{rel}"
        assert package in setuptools["packages"], package
        globs = setuptools["package-data"][package]
        assert any(pathlib.PurePosixPath(p.name).match(g) for g in globs), p


@pytest.mark.parametrize("engine", sorted(SAMPLES))
def test_each_sample_holds_the_same_real_loads(engine):
    _readable(engine)
    log = read_engine_log(sample_recording(engine))
    counts = log.counts
    if engine == "sglang":  # a row per hidden layer: DeepSeek-V2-Lite's layer 0 is dense
        assert counts.shape == (16, 27, 64) and not counts[:, 0].any()
        counts = counts[:, 1:]
    assert log.engine == engine and counts.shape == (16, 26, 64)
    vllm = read_engine_log(sample_recording("vllm"))
    np.testing.assert_array_equal(counts, vllm.counts)
    # top-6: every step's tokens add 6 per token to each layer, the same in every layer
    per_layer = counts.sum(axis=2)
    assert (per_layer % 6 == 0).all() and (per_layer == per_layer[:, :1]).all()


def test_the_samples_are_what_the_script_makes_from_the_real_loads(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import engine_samples
    finally:
        sys.path.pop(0)
    if not engine_samples.SOURCE.exists():
        pytest.skip("../shared/data/expert_loads is not here")
    if not (HAVE_TORCH and HAVE_ST):
        pytest.skip("writing the samples needs torch and safetensors")
    made = engine_samples.write(tmp_path)
    for engine, folder in made.items():
        shipped = sample_recording(engine)
        assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in shipped.iterdir())
        np.testing.assert_array_equal(
            read_engine_log(folder).counts, read_engine_log(shipped).counts
        )
    for f in (made["vllm"]).iterdir():  # JSON: the same bytes
        assert f.read_bytes() == (sample_recording("vllm") / f.name).read_bytes()


def test_plan_names_a_sample(tmp_path, capsys):
    out = tmp_path / "plan"
    args = ["sample:vllm", "--gpus", "8", "--slots", "80", "--holdout", "0.5"]
    assert plan_cmd.main([*args, "--no-progress", "--json", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["meta"]["engine"] == "vllm" and len(report["meta"]["scored_batches"]) == 8
    assert (out / "eplb_state.json").exists() and (out / "dispatch_tables.npz").exists()
    assert report["summary"]["total_table_us"] < report["summary"]["total_eplb_even_us"]


def test_a_bad_sample_name_is_one_line(capsys):
    assert plan_cmd.main(["sample:deepseek", "--gpus", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "sample:sglang" in err and "'deepseek'" in err
    with pytest.raises(InvalidInputError):
        sample_recording("nope")


BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "safetensors"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
from straggler.runtime.commands.plan import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("engine,needs", [("sglang", "torch"), ("trtllm", "safetensors")])
def test_without_the_extra_the_command_says_which_to_install(engine, needs, tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", BLOCK, f"sample:{engine}", "--gpus", "8"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and needs in err[0] and "pip install 'straggler[runtime]'" in err[0]


def test_the_engine_pages_sample_commands_run(tmp_path, capsys, monkeypatch):
    """Each engine page's first command (``straggler-plan sample:ENGINE ...``) as written."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import doc_commands
    finally:
        sys.path.pop(0)
    monkeypatch.chdir(tmp_path)
    for engine in sorted(SAMPLES):
        page = (ROOT / "docs" / "guides" / "engines" / f"{engine}.md").read_text()
        (cmd,) = [c for c in doc_commands.commands(page, "straggler-plan") if "sample:" in c[1]]
        assert cmd[1] == f"sample:{engine}"
        if not READABLE[engine]:
            continue
        assert plan_cmd.main([*cmd[1:], "--no-progress"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert "modeled time vs EPLB even split" in out and "wrote" in out
