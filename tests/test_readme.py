"""README.md says what runs: its API example prints what its comments say, every command in
its shell blocks runs as written from an empty folder (no ``../shared`` beside it), its links
point at files that exist, and it stays a front page (at most 200 lines, CI's markers kept)."""

import contextlib
import io
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
sys.path.insert(0, str(ROOT / "tests"))
import doc_commands  # noqa: E402

sys.path.pop(0)


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


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for marker in ("<!-- ci:main -->", "<!-- ci:test -->"):
        after = text.split(marker, 1)[1].lstrip("\n").splitlines()
        assert after[0] == "```bash" and after[1].startswith("pip install "), marker
    for word in ("before", "today", "previous code", "previously"):
        assert not re.search(rf"\b{word}\b", text, re.I), word


def test_readme_links_exist():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#]+)\)", text)
    assert targets
    for target in targets:
        if "://" not in target:
            assert (ROOT / target).exists(), target


def _commands():
    """Every command of README's shell blocks, ``a && b`` split in two."""
    out = []
    for words in doc_commands.commands(README.read_text(), ""):
        while "&&" in words:
            i = words.index("&&")
            out.append(words[:i])
            words = words[i + 1 :]
        out.append(words)
    return out


#: Commands the README gives that this test does not run, and why.
NOT_RUN = {
    ("pip", "install"): "installs the package (CI runs README's two set-up commands as written)",
    ("python", "-m"): "the test suite itself",
}
#: Arguments added to a command that takes minutes as written, so the test stays short.
SMALLER = {("straggler-simulate", "--moe"): ["--requests", "120", "--layers", "1"]}


def _entry(name):
    from straggler.runtime.commands import compare, plan, simulate, warmup

    return {
        "straggler-compare": compare.main,
        "straggler-plan": plan.main,
        "straggler-simulate": simulate.main,
        "straggler-warmup": warmup.main,
    }[name]


@pytest.mark.parametrize("words", _commands(), ids=lambda w: " ".join(w)[:60])
def test_every_readme_command_runs_from_an_empty_folder(words, tmp_path, monkeypatch, capsys):
    if tuple(words[:2]) in NOT_RUN:
        pytest.skip(NOT_RUN[tuple(words[:2])])
    assert words[0].startswith("straggler-"), f"README names a command no test runs: {words}"
    monkeypatch.chdir(tmp_path)  # no ../shared here
    monkeypatch.delenv("STRAGGLER_TRACES", raising=False)
    args = list(words[1:])
    for (name, flag), extra in SMALLER.items():
        if words[0] == name and flag in args:
            args += extra
    if "--no-progress" not in args and words[0] in ("straggler-plan", "straggler-simulate"):
        args.append("--no-progress")
    rc = _entry(words[0])(args)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert cap.out.strip()
