"""Data a command names ships inside the package: the traces ``straggler-simulate`` accepts by
name are read from the package (no ``../shared``), each file restores its original bytes, the
README beside them lists every file with its source, license and sha256, and pyproject ships
them in the wheel."""

import hashlib
import lzma
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest
import straggler.sim.workloads as workloads
from straggler.formulations import InvalidInputError
from straggler.sim.experiments.load_sweep import SWEEP_TRACES, sweep_trace
from straggler.sim.workloads.traces import find_trace, load_trace, traces_dir

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "sim" / "workloads" / "data"
#: Where the installed package keeps them (the checkout's folder in an editable install, the
#: wheel's copy under site-packages otherwise).
INSTALLED = pathlib.Path(workloads.__file__).resolve().parent / "data"


def _package_data():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"
    ]


def test_every_shipped_file_is_package_data():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "straggler.sim.workloads.data" in setuptools["packages"]
    globs = _package_data()["straggler.sim.workloads.data"]
    files = sorted(p.name for p in DATA.iterdir())
    assert files, "no shipped traces"
    for f in files:
        assert any(pathlib.PurePosixPath(f).match(g) for g in globs), f


def test_readme_names_source_license_and_hash_of_every_trace():
    readme = (DATA / "README.md").read_text()
    listed = dict(
        (name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, re.M)
    )
    shipped = {p.name[: -len(".xz")] for p in DATA.glob("*.xz")}
    named = {f for f, _ in SWEEP_TRACES.values() if f is not None}
    assert shipped == named == set(listed)
    for name in shipped:
        raw = lzma.decompress((DATA / f"{name}.xz").read_bytes())
        assert hashlib.sha256(raw).hexdigest() == listed[name], name
        row = next(ln for ln in readme.splitlines() if f"| {name} |" in ln)
        assert re.search(r"CC-BY-4.0|Apache-2.0|MIT", row), row
    assert "Creative Commons Attribution 4.0" in " ".join(readme.split())  # CC-BY attribution


def test_names_resolve_to_the_package_without_the_environment(monkeypatch):
    monkeypatch.delenv("STRAGGLER_TRACES", raising=False)
    assert traces_dir().resolve() == INSTALLED
    path = find_trace("AzureLLMInferenceTrace_code.csv")
    assert path == traces_dir() / "AzureLLMInferenceTrace_code.csv.xz"
    tr = load_trace(path)
    assert len(tr) == 8819 and tr.prompt_len.mean() == pytest.approx(2048, abs=1)


def test_environment_folder_wins_and_a_missing_file_names_the_trace(tmp_path, monkeypatch):
    src = DATA / "synthetic_trace.jsonl.xz"
    (tmp_path / "synthetic_trace.jsonl").write_bytes(lzma.decompress(src.read_bytes())[:2000])
    monkeypatch.setenv("STRAGGLER_TRACES", str(tmp_path))
    sweep_trace.cache_clear()
    try:
        assert find_trace("synthetic_trace.jsonl") == tmp_path / "synthetic_trace.jsonl"
        with pytest.raises(InvalidInputError) as e:
            sweep_trace("azure_conv")
    finally:
        sweep_trace.cache_clear()
    msg = str(e.value)
    assert "'azure_conv'" in msg and str(tmp_path) in msg and "STRAGGLER_TRACES" in msg
    assert "sweep_trace" not in msg


def test_a_broken_xz_file_is_refused_with_its_name(tmp_path):
    bad = tmp_path / "t.csv.xz"
    bad.write_bytes(lzma.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n")[:-8])
    with pytest.raises(InvalidInputError, match="t.csv.xz.*xz file"):
        load_trace(bad)


def _command(args, cwd, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != "STRAGGLER_TRACES"}
    env.update(env_extra or {})
    code = "import sys; from straggler.runtime.commands.simulate import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_simulate_names_a_trace_from_an_empty_folder(tmp_path):
    """The README's example (fewer requests) from a folder with no ``../shared`` beside it."""
    r = _command(
        ["azure_conv", "--load", "1.2", "--replicas", "8", "--policies", "brs,jsq",
         "--requests", "400"],
        tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("azure_conv: 400 requests"), r.stdout


def test_simulate_errors_name_the_argument(tmp_path):
    r = _command(["azure_conv", "--policies", "brs"], tmp_path, {"STRAGGLER_TRACES": "/nowhere"})
    assert r.returncode == 2
    line = r.stderr.strip()
    assert "\n" not in line and "'azure_conv'" in line and "sweep_trace" not in line
    (tmp_path / "l.csv").write_text("num_prefill_tokens,num_decode_tokens\n10,5\n")
    r = _command(["l.csv", "--policies", "brs"], tmp_path)
    assert r.returncode == 2 and "'l.csv'" in r.stderr and "--rate" in r.stderr
    assert "load_trace" not in r.stderr
    r = _command([str(tmp_path), "--policies", "brs"], tmp_path)
    assert r.returncode == 2 and "folder" in r.stderr and "load_trace" not in r.stderr
