"""The conformance group: our files, tables and rules checked by the engines' own code.

Each test module imports its engine with ``pytest.importorskip`` (SGLang 0.5.23,
vLLM CPU 0.32.0; TensorRT-LLM, which needs CUDA, is followed from its published code), so
in an environment without the engine the module is skipped, never an error.
``tests/conformance/setup_envs.sh`` builds one environment per engine; CI runs this folder
in each. Every test here carries the ``conformance`` marker (``-m conformance`` selects
them, ``-m "not conformance"`` leaves them out).

The JIT warm-up of the main suite is not needed here: the engines' code is torch, and the
few library kernels a test reaches compile on first use.
"""

import pytest


@pytest.fixture(scope="session", autouse=True)
def warm_jit():
    """No warm-up for the conformance group (overrides the suite's session fixture)."""
    return None


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/conformance/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.conformance)
