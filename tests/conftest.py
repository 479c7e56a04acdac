"""Test configuration: hypothesis profiles (loaded here, so they take effect) and one JIT
warm-up per test run.

The warm-up (``straggler.runtime.warmup``) compiles, or loads from numba's disk cache, every
kernel the selected tests reach, once, before the first test: compilation is then never
charged to whichever test happens to run first, and a slow test is slow for its own work.
It warms only what the selected test files use (dispatch always; routing and the simulator
when a selected file names them), so a targeted run of one file stays quick. On a cold cache
it compiles in ``min(2, os.cpu_count())`` processes side by side (``warmup(jobs=...)``: the
test process compiles its share while a child process compiles the other;
``STRAGGLER_WARMUP_JOBS=1`` compiles everything in the test process). The terminal summary
says how long it took: wall time, compiling in the test process (its share, and anything
left after the children), compiling in the children.
"""

import os
import pathlib
import time

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

#: Files whose doctests or examples reach every entry point.
_ALL = ("test_packaging.py", "test_readme.py")
_WARMUP: dict = {}


def _sections(items) -> dict:
    files = {pathlib.Path(str(item.fspath)) for item in items}
    text = ""
    for f in files:
        if f.name in _ALL:
            return {"routing": True, "simulator": True}
        try:
            text += f.read_text()
        except OSError:
            pass
    return {"routing": "route_batch" in text or "routing" in text, "simulator": "simulate" in text}


@pytest.fixture(scope="session", autouse=True)
def warm_jit(request):
    """Warm the JIT once per test run (session-scoped; see the module docstring)."""
    from straggler.runtime.warmup import warmup

    t = time.perf_counter()
    rep = warmup(**_sections(request.session.items), jobs=_warmup_jobs())
    _WARMUP.update(wall_s=time.perf_counter() - t, report=rep)
    return rep


def _warmup_jobs() -> int:
    """Processes compiling side by side in the warm-up (the test process and children):
    ``STRAGGLER_WARMUP_JOBS``, else ``min(2, cpus)``."""
    text = os.environ.get("STRAGGLER_WARMUP_JOBS")
    if text is None:
        return min(2, os.cpu_count() or 1)
    if not text.isdigit() or int(text) < 1:
        raise pytest.UsageError(
            f"STRAGGLER_WARMUP_JOBS must be an integer >= 1. Got {text!r} instead."
        )
    return int(text)


@pytest.fixture(scope="session")
def jitted_reach():
    """``reach(root)``: every ``@njit`` function ``root`` (a numba dispatcher) reaches
    through its globals, ``root`` included, as a list."""
    from numba.core.registry import CPUDispatcher

    def reach(root):
        seen, found, todo = set(), [], [root]
        while todo:
            d = todo.pop()
            if id(d) in seen:
                continue
            seen.add(id(d))
            found.append(d)
            for name in d.py_func.__code__.co_names:
                obj = d.py_func.__globals__.get(name)
                if isinstance(obj, CPUDispatcher):
                    todo.append(obj)
        return found

    return reach


@pytest.fixture(scope="session")
def run_python():
    """``run(code, *args, env=None)``: ``code`` run by a new interpreter (``python -c code
    *args``) with ``env`` added to this process's environment; returns its stdout, and fails
    the test with the tail of its stderr when it exits with an error."""
    import subprocess
    import sys

    def run(code, *args, env=None):
        cmd = [sys.executable, "-c", code, *args]
        out = subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    return run


def pytest_terminal_summary(terminalreporter):
    if _WARMUP:
        rep = _WARMUP["report"]
        body = rep.summary().split(": ", 1)[1]  # WarmupReport's line, after its own wall time
        terminalreporter.write_line(
            f"JIT warm-up: {_WARMUP['wall_s']:.1f} s, {body} (straggler.runtime.warmup, once "
            "per test run)"
        )
        after = rep.compiled_after_children
        if rep.children and after:
            terminalreporter.write_line(
                f"  compiled in this process after the children: {', '.join(after)}"
            )


@pytest.fixture
def falsified():
    """``falsified(test, **strategies)``: whether the property of the ``@given`` test
    ``test`` fails on some example of ``strategies`` (up to 300 generated examples, the
    same every run, stopping at the first failure, not shrunk). The fuzz tests use it to
    show that each property can fail: against a deliberately broken writer or reader
    (monkeypatched), it must."""
    from hypothesis import Phase, given

    def run(test, **strategies) -> bool:
        prop = settings(
            max_examples=300,
            derandomize=True,  # the same examples every run: it fails every run, or never
            database=None,
            deadline=None,
            phases=[Phase.generate],
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
        )(given(**strategies)(test.hypothesis.inner_test))
        try:
            prop()
        except Exception as exc:  # noqa: BLE001 - any failure of the property counts
            print(f"falsified {test.__name__}: {type(exc).__name__}: {str(exc)[:300]}")
            return True
        return False

    return run
