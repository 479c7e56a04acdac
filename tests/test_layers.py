"""The layers are true: every library module's imports, at module level and inside functions,
go to its own layer or one below. The order is written once here and in docs/architecture.md.
And no library function is longer than :data:`MAX_FUNCTION_LINES`.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("formulations", "solvers", "baselines", "sim", "runtime", "proofs")

#: The layers, lowest first: a module may import its own layer and those before it.
LAYERS = (
    "formulations",
    "solvers (algorithms)",
    "baselines",
    "solvers (entry points and name tables)",
    "sim",
    "runtime",
    "runtime.commands",
    "proofs",
)
#: The modules of ``solvers`` above ``baselines``: the package's facade, the entry points, the
#: name tables and lookup, and what is built on them (the ``milp`` method warm-starts from any
#: method by name; the routers call ``route_batch``).
SOLVERS_ENTRY = {
    "straggler.solvers",
    "straggler.solvers.dispatch.solve",
    "straggler.solvers.dispatch.registry",
    "straggler.solvers.dispatch.milp",
    "straggler.solvers.routing.route",
    "straggler.solvers.routing.registry",
    "straggler.solvers.routing.routers",
    "straggler.solvers.placement.rebalance.registry",
}


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of a ``straggler.*`` module."""
    parts = module.split(".")
    top = parts[1]
    if top == "solvers":
        return LAYERS.index(
            "solvers (entry points and name tables)"
            if module in SOLVERS_ENTRY
            else "solvers (algorithms)"
        )
    if top == "runtime":
        return LAYERS.index("runtime.commands" if parts[2:3] == ["commands"] else "runtime")
    return LAYERS.index(top)


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["straggler", *parts])


def _is_module(name: str) -> bool:
    """Whether ``straggler.a.b`` is a module or package of the tree (not a name in one)."""
    rel = pathlib.Path(*name.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def imports(module: str, source: str, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, imported module)`` of every ``straggler`` import in ``source`` (the code of
    ``module``), wherever it is written; ``from pkg import name`` is an import of the module
    ``pkg.name`` when there is one, else of ``pkg``."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.append((node.lineno, sub if _is_module(sub) else target))
    return [(line, name) for line, name in found if name.split(".")[0] == "straggler"]


def upward(module: str, source: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that go to a higher layer, as readable lines."""
    own = layer(module)
    found = dict.fromkeys(imports(module, source, is_package))  # once per line and module
    return [
        f"{module}:{line} imports {target} ({LAYERS[layer(target)]} above {LAYERS[own]})"
        for line, target in found
        if layer(target) > own
    ]


def _library():
    for pkg in PACKAGES:
        yield from sorted((ROOT / pkg).rglob("*.py"))


def test_no_library_module_imports_upward():
    bad = []
    for path in _library():
        name = _module_name(path)
        bad += upward(name, path.read_text(), path.name == "__init__.py")
    assert not bad, "\n".join(bad)


def test_every_library_module_has_a_layer():
    """Every module of the tree maps to a layer, and the named entry modules exist."""
    names = {_module_name(p) for p in _library()}
    assert SOLVERS_ENTRY <= names, SOLVERS_ENTRY - names
    assert {layer(n) for n in names} == set(range(len(LAYERS)))


@pytest.mark.parametrize(
    "module, source, found",
    [
        ("straggler.solvers.x", "from ..sim import simulate", "straggler.sim"),
        ("straggler.solvers.x", "def f():\n    from ..baselines.tables import T\n", "baselines"),
        ("straggler.baselines.x", "from ..solvers import route_batch", "straggler.solvers ("),
        ("straggler.baselines.x", "from ..solvers.routing.route import route_batch", "route"),
        ("straggler.sim.x", "import straggler.runtime.plan", "straggler.runtime.plan"),
        ("straggler.runtime.plan", "from .commands import plan", "runtime.commands"),
        ("straggler.sim.x", "from ..proofs import certify", "straggler.proofs"),
    ],
)
def test_an_upward_import_is_found(module, source, found):
    """The check finds an upward import at module level and inside a function, through the
    package facade and through a submodule."""
    (line,) = upward(module, source)
    assert found in line


@pytest.mark.parametrize(
    "module, source",
    [
        ("straggler.baselines.x", "from ..solvers import _order"),  # a submodule, not the facade
        ("straggler.baselines.x", "from ..solvers.routing._core import PoolState"),
        ("straggler.sim.x", "from ..solvers import route_batch"),
        ("straggler.proofs.x", "from ..runtime.commands import plan"),
    ],
)
def test_a_downward_import_passes(module, source):
    assert upward(module, source) == []


#: The longest a library function may be, in lines (its docstring included): a longer one is
#: split into the stages or phases it runs, each beside its reference twin.
MAX_FUNCTION_LINES = 250


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``name (lines)`` of every function (methods and nested ones included) of ``source``
    longer than ``limit`` lines."""
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_library_function_is_over_the_limit():
    bad = []
    for path in _library():
        bad += [f"{_module_name(path)}: {f}" for f in long_functions(path.read_text())]
    assert not bad, "\n".join(bad)


def test_a_long_function_is_found():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions("def f():\n" + body) == [f"f ({MAX_FUNCTION_LINES + 1})"]
    assert long_functions("def f():\n" + body[: -len("    x249 = 249\n")]) == []
