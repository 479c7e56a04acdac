"""Commands and code blocks read from the Markdown the project ships (README.md, docs/), so
the tests run what a reader copies: ``commands(text, prefix)`` gives every shell command in a
fenced ``bash`` block that starts with ``prefix`` (line continuations joined, the command's
environment assignments and trailing comments dropped) as argument lists."""

import re
import shlex


def blocks(text: str, lang: str) -> list[str]:
    """The contents of every fenced block of ``lang`` (```` ```bash ````, ```` ```python ````)."""
    return re.findall(r"^```" + re.escape(lang) + r"\n(.*?)^```", text, re.S | re.M)


def commands(text: str, prefix: str) -> list[list[str]]:
    """Every command in a ``bash`` block whose words start with ``prefix`` (split like a shell)."""
    want = shlex.split(prefix)
    out = []
    for block in blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                words = words[1:]  # VAR=value before the command
            if words[: len(want)] == want:
                out.append(words)
    return out
