"""The README's example runs and prints what the README says it prints."""

import contextlib
import io
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _api_block() -> str:
    text = README.read_text()
    section = text[text.index("## Public API") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_output_matches_its_comments():
    code = _api_block()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    printed = out.getvalue().splitlines()
    expected = [
        line.split("#", 1)[1].strip()
        for line in code.splitlines()
        if line.startswith("# ") and re.match(r"# \w+\s+[\d.]+ us|# \[", line)
    ]
    expected += [line.split("#", 1)[1].strip() for line in code.splitlines() if "print(d." in line]
    # every commented output line (up to its trailing remark) is what the code printed
    for want in expected:
        head = re.split(r"\s{3,}\(", want)[0].strip()
        assert any(p.strip().startswith(head) for p in printed), (head, printed)
    assert len(printed) == 6
