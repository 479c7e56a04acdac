"""Every patch point ``docs/guides/engines/integration.md`` names exists in the pinned engine
with the signature the text shows (``inspect.signature`` of the installed package)."""

import importlib
import importlib.util
import inspect
import pathlib
import re

import pytest

TEXT = (
    pathlib.Path(__file__).parents[2] / "docs" / "guides" / "engines" / "integration.md"
).read_text()


def _points():
    block = re.search(r"<!-- patch-points -->\n```text\n(.*?)\n```", TEXT, re.S)
    assert block, "the integration page has no patch-points block"
    for line in block.group(1).splitlines():
        name, sig = line.split(" ", 1)
        yield name, sig


POINTS = list(_points())


def test_the_block_names_both_engines():
    engines = {name.split(".", 1)[0] for name, _ in POINTS}
    assert engines == {"sglang", "vllm"} and len(POINTS) >= 10


@pytest.mark.parametrize("name,sig", POINTS, ids=[n for n, _ in POINTS])
def test_patch_point_signature(name, sig):
    module, _, attr = name.partition(":")
    engine = module.split(".", 1)[0]
    if importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} is not installed")
    pytest.importorskip("torch")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    assert str(inspect.signature(obj)) == sig
