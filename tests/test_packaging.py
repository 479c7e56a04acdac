"""Packaging: every package folder is listed in pyproject, and modules import by dotted name."""

import importlib
import pathlib
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR = PYPROJECT["tool"]["setuptools"]["package-dir"]
PACKAGES = PYPROJECT["tool"]["setuptools"]["packages"]
TOP = ["formulations", "solvers", "baselines", "proofs", "sim", "runtime"]


def _package_folders():
    for top in TOP:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT)
            yield "straggler." + ".".join(rel.parts)


def test_every_top_folder_is_mapped():
    for top in TOP:
        assert PACKAGE_DIR.get(f"straggler.{top}") == top


@pytest.mark.parametrize("pkg", list(_package_folders()))
def test_every_package_is_listed(pkg):
    assert pkg in PACKAGES, f"{pkg} has an __init__.py but is not listed in pyproject packages"


def test_no_namespace_init():
    assert not (ROOT / "straggler" / "__init__.py").exists()


def _modules():
    for top in TOP:
        for py in sorted((ROOT / top).rglob("*.py")):
            rel = py.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield "straggler." + ".".join(parts)


@pytest.mark.parametrize("mod", list(_modules()))
def test_module_imports_and_has_all(mod):
    m = importlib.import_module(mod)
    assert hasattr(m, "__all__"), f"{mod} has no __all__"


def test_version():
    from importlib.metadata import version

    assert version("straggler")


@pytest.mark.parametrize("mod", list(_modules()))
def test_doctests(mod):
    """Each module's doctests, imported by its dotted name (not --doctest-modules)."""
    import doctest

    m = importlib.import_module(mod)
    res = doctest.testmod(m, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.failed == 0, f"{res.failed} doctest(s) failed in {mod}"


def test_no_bare_folder_imports():
    """Never `import solvers` / `from formulations import ...`: always straggler.<name>."""
    import re

    pat = re.compile(r"^\s*(from|import)\s+(" + "|".join(TOP) + r")(\.|\s|$)", re.M)
    offenders = []
    for folder in [*TOP, "tests", "benchmarks"]:
        for py in (ROOT / folder).rglob("*.py"):
            if pat.search(py.read_text()):
                offenders.append(str(py.relative_to(ROOT)))
    assert not offenders, f"bare folder imports in {offenders}"


def test_importing_a_package_loads_nothing_above_it(run_python):
    """What an import really loads (through the packages' ``__init__``; tests/test_layers.py
    checks every import statement): formulations alone; solvers (whose facade holds the entry
    points and name tables, above baselines) and baselines no sim, runtime or proofs; sim no
    runtime or proofs; runtime neither its commands nor proofs."""
    above = {
        "formulations": {"solvers", "baselines", "sim", "runtime", "proofs"},
        "solvers": {"sim", "runtime", "proofs"},
        "baselines": {"sim", "runtime", "proofs"},
        "sim": {"runtime", "proofs"},
        "runtime": {"proofs", "runtime.commands"},
    }
    for pkg, forbidden in above.items():
        code = (
            f"import sys, straggler.{pkg}\n"
            "print(sorted({'.'.join(m.split('.')[1:3]) for m in sys.modules"
            " if m.startswith('straggler.')}))"
        )
        loaded = set(eval(run_python(code).strip()))
        tops = {m.split(".")[0] for m in loaded} | {m for m in loaded if m in forbidden}
        assert not tops & forbidden, (pkg, tops & forbidden)


#: Names several modules export on purpose as different objects: each command's entry point.
_SHARED_BY_DESIGN = {"main"}


def test_an_exported_name_means_one_thing():
    """A name in two modules' ``__all__`` is the same object in both (a re-export), so an
    import never brings a different thing under a name a reader already knows."""
    seen: dict[str, tuple[str, object]] = {}
    clashes = []
    for mod in _modules():
        m = importlib.import_module(mod)
        for name in m.__all__:
            if name in _SHARED_BY_DESIGN:
                continue
            obj = getattr(m, name)
            if name in seen and seen[name][1] is not obj:
                clashes.append(f"{name}: {seen[name][0]} and {mod}")
            seen.setdefault(name, (mod, obj))
    assert not clashes, clashes
