"""The YAML that TensorRT-LLM's load-balancer files use, and nothing more (no dependency).

:func:`dump_yaml` writes what ``yaml.dump(config, width=float("inf"))`` writes with
TensorRT-LLM's ``represent_list_inline`` representer (``generate_eplb_config.py``): block
mappings with sorted keys, lists as one-line flow sequences. :func:`parse_yaml` reads that,
plus what other writers of these files produce: PyYAML's default block sequences
(``- 3``) and wrapped flow sequences, comments, ``---``, quoted and plain scalars (null,
booleans, integers, floats, strings) and small flow mappings. Anchors, aliases, tags,
block scalars (``|``, ``>``), complex keys and several documents are refused with the
line they are on, as is anything else outside this subset: a silently misread placement
is worse than an error.
"""

from __future__ import annotations

import json
import math
import re

from ...formulations.errors import InvalidInputError

__all__ = ["dump_yaml", "parse_yaml"]

# PyYAML's (YAML 1.1) implicit resolvers, without the sexagesimal forms.
_INT_RE = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_INT_BASES = (
    (re.compile(r"^[-+]?0b[0-1_]+$"), 2),
    (re.compile(r"^[-+]?0x[0-9a-fA-F_]+$"), 16),
    (re.compile(r"^[-+]?0[0-7_]+$"), 8),
)
_FLOAT_RE = re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?)$"
)
_TRUE = ("yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")
_FALSE = ("no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
_PLAIN_SAFE = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
#: Deepest nesting of collections read (TensorRT-LLM's files nest 2 deep): deeper input is
#: refused with its line instead of exhausting Python's recursion limit.
MAX_DEPTH = 64


def _scalar_text(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ".nan"
        if math.isinf(v):
            return ".inf" if v > 0 else "-.inf"
        return repr(v)
    if isinstance(v, str):
        if _PLAIN_SAFE.match(v) and _resolve(v) == v:
            return v
        return json.dumps(v)
    raise TypeError(f"cannot write {type(v).__name__} as a YAML scalar")


def _sort_key(k):
    return (0, k, "") if isinstance(k, int) and not isinstance(k, bool) else (1, 0, str(k))


def dump_yaml(obj: dict) -> str:
    """A mapping as block YAML, keys sorted, lists inline (TensorRT-LLM's layout).

    Examples
    --------
    >>> print(dump_yaml({"num_slots": 4, "initial_global_assignments": {3: [1, 0, 2, 1]},
    ...                  "layer_updates_per_iter": 0}), end="")
    initial_global_assignments:
      3: [1, 0, 2, 1]
    layer_updates_per_iter: 0
    num_slots: 4
    """
    lines: list[str] = []

    def emit(d: dict, indent: int) -> None:
        for k in sorted(d, key=_sort_key):
            v = d[k]
            key = _scalar_text(k)
            pad = " " * indent
            if isinstance(v, dict):
                if v:
                    lines.append(f"{pad}{key}:")
                    emit(v, indent + 2)
                else:
                    lines.append(f"{pad}{key}: {{}}")
            elif isinstance(v, (list, tuple)):
                lines.append(f"{pad}{key}: [{', '.join(_scalar_text(x) for x in v)}]")
            else:
                lines.append(f"{pad}{key}: {_scalar_text(v)}")

    emit(obj, 0)
    return "\n".join(lines) + "\n"


def _resolve(text: str):
    """A plain scalar's value, as PyYAML's safe loader resolves it (YAML 1.1: null, the
    booleans including yes/no/on/off, decimal, binary, octal and hex ints, floats with a
    dot, .inf, .nan; sexagesimal numbers are left as strings)."""
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    if _INT_RE.match(text):
        return int(text.replace("_", ""))
    for pattern, base in _INT_BASES:
        if pattern.match(text):
            t = text.replace("_", "")
            sign = -1 if t[0] == "-" else 1
            digits = t.lstrip("+-")
            digits = digits[2:] if base in (2, 16) else digits[1:]
            if not digits:
                raise ValueError(f"no digits in the integer {text!r}")
            return sign * int(digits, base)
    if _FLOAT_RE.match(text):
        return float(text.replace("_", ""))
    if text in (".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"):
        return math.inf
    if text in ("-.inf", "-.Inf", "-.INF"):
        return -math.inf
    if text in (".nan", ".NaN", ".NAN"):
        return math.nan
    return text


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines: list[tuple[int, int, str]] = []  # (line number, indent, content)
        docs = 0
        for no, raw in enumerate(text.splitlines(), 1):
            if "\t" in raw[: len(raw) - len(raw.lstrip())]:
                self.fail(no, "a tab in the indentation")
            content = self.strip_comment(raw, no).rstrip()
            if not content.strip():
                continue
            if content.strip() == "---":
                docs += 1
                if docs > 1 or self.lines:
                    self.fail(no, "a second YAML document")
                continue
            if content.strip() == "...":
                break
            indent = len(content) - len(content.lstrip(" "))
            self.lines.append((no, indent, content.strip()))
        self.i = 0
        self.depth = 0

    def fail(self, no, what):
        raise InvalidInputError(
            f"{self.source} must be YAML of the subset TensorRT-LLM's load-balancer files use "
            f"(block mappings, sequences, scalars). Got {what} on line {no} instead."
        )

    def strip_comment(self, line: str, no: int) -> str:
        quote = None
        for j, ch in enumerate(line):
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "'\"":
                quote = ch
            elif ch == "#" and (j == 0 or line[j - 1] in " \t"):
                return line[:j]
        return line

    # --- flow and scalars -------------------------------------------------------------
    def value(self, text: str, no: int):
        """An inline value: a flow collection (joined over following lines if open) or a
        scalar."""
        if text[:1] in "[{":
            while _depth(text) > 0:
                if self.i >= len(self.lines):
                    self.fail(no, "an unterminated flow collection")
                text = text + " " + self.lines[self.i][2]
                self.i += 1
            val, rest = self.flow(text, 0, no)
            if rest.strip():
                self.fail(no, f"text after a flow collection ({rest.strip()[:20]!r})")
            return val
        return self.scalar(text, no)

    def scalar(self, text: str, no: int):
        t = text.strip()
        if not t:
            return None
        if t[0] in "&*!|>%@`?":
            self.fail(no, f"YAML syntax outside the subset ({t[:20]!r})")
        if t[0] == "'":
            if len(t) < 2 or t[-1] != "'":
                self.fail(no, "an unterminated quoted string")
            return t[1:-1].replace("''", "'")
        if t[0] == '"':
            try:
                return json.loads(t)
            except ValueError:
                self.fail(no, "a malformed double-quoted string")
        if ": " in t or t.endswith(":"):
            self.fail(no, f"a mapping where a value was expected ({t[:20]!r})")
        try:
            return _resolve(t)
        except ValueError as exc:
            self.fail(no, f"a malformed scalar ({exc})")

    def nest(self, no: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(no, f"collections nested more than {MAX_DEPTH} deep")

    def flow(self, text: str, j: int, no: int):
        self.nest(no)
        try:
            return self._flow(text, j, no)
        finally:
            self.depth -= 1

    def _flow(self, text: str, j: int, no: int):
        """Parse a flow collection starting at ``text[j]``; returns (value, rest)."""
        opening = text[j]
        closing = "]" if opening == "[" else "}"
        j += 1
        items: list = []
        mapping: dict = {}
        while True:
            j = _skip_spaces(text, j)
            if j >= len(text):
                self.fail(no, "an unterminated flow collection")
            if text[j] == closing:
                return (items if opening == "[" else mapping), text[j + 1 :]
            if opening == "{":
                key, j = self.flow_item(text, j, ":", no)
                if j >= len(text) or text[j] != ":":
                    self.fail(no, "a flow mapping entry without ':'")
                if isinstance(key, (list, dict)):
                    self.fail(no, "a collection as a mapping key")
                value, j = self.flow_item(text, j + 1, ",}", no)
                if key in mapping:
                    self.fail(no, f"the duplicate key {key!r}")
                mapping[key] = value
            else:
                item, j = self.flow_item(text, j, ",]", no)
                items.append(item)
            j = _skip_spaces(text, j)
            if j < len(text) and text[j] == ",":
                j += 1
            elif j < len(text) and text[j] != closing:
                self.fail(no, f"unexpected {text[j]!r} in a flow collection")

    def flow_item(self, text: str, j: int, stops: str, no: int):
        """One entry of a flow collection: a nested collection or a scalar ending before a
        character of ``stops`` (outside quotes); returns (value, index after it)."""
        j = _skip_spaces(text, j)
        if j < len(text) and text[j] in "[{":
            val, rest = self.flow(text, j, no)
            return val, len(text) - len(rest)
        k = j
        quote = None
        while k < len(text):
            ch = text[k]
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "'\"":
                quote = ch
            elif ch in stops or ch in "]}":
                break
            k += 1
        return self.scalar(text[j:k], no), k

    # --- blocks ------------------------------------------------------------------------
    def block(self, indent: int):
        no, ind, content = self.lines[self.i]
        self.nest(no)
        try:
            return self._block(indent)
        finally:
            self.depth -= 1

    def _block(self, indent: int):
        no, ind, content = self.lines[self.i]
        if ind != indent:
            self.fail(no, "unexpected indentation")
        if content == "-" or content.startswith("- "):
            return self.sequence(indent)
        return self.mapping(indent)

    def sequence(self, indent: int):
        out = []
        while self.i < len(self.lines):
            no, ind, content = self.lines[self.i]
            if ind < indent:
                break
            if ind > indent or not (content == "-" or content.startswith("- ")):
                if ind == indent:
                    break
                self.fail(no, "unexpected indentation in a sequence")
            self.i += 1
            rest = content[1:].strip()
            if not rest:
                if self.i < len(self.lines) and self.lines[self.i][1] > indent:
                    out.append(self.block(self.lines[self.i][1]))
                else:
                    out.append(None)
            elif _key_split(rest) is not None:
                self.fail(no, "a mapping inside a block sequence")
            else:
                out.append(self.value(rest, no))
        return out

    def mapping(self, indent: int):
        out: dict = {}
        while self.i < len(self.lines):
            no, ind, content = self.lines[self.i]
            if ind < indent:
                break
            if ind > indent:
                self.fail(no, "unexpected indentation in a mapping")
            if content == "-" or content.startswith("- "):
                break
            split = _key_split(content)
            if split is None:
                self.fail(no, f"a line that is not 'key: value' ({content[:30]!r})")
            key_text, rest = split
            key = self.scalar(key_text, no)
            if isinstance(key, float) or key is None:
                self.fail(no, f"an unusable mapping key ({key_text!r})")
            if key in out:
                self.fail(no, f"the duplicate key {key!r}")
            self.i += 1
            if rest:
                out[key] = self.value(rest, no)
            elif self.i < len(self.lines) and self.lines[self.i][1] > indent:
                out[key] = self.block(self.lines[self.i][1])
            elif (
                self.i < len(self.lines)
                and self.lines[self.i][1] == indent
                and (self.lines[self.i][2] == "-" or self.lines[self.i][2].startswith("- "))
            ):
                out[key] = self.sequence(indent)
            else:
                out[key] = None
        return out

    def document(self):
        if not self.lines:
            return None
        val = self.block(self.lines[0][1])
        if self.i < len(self.lines):
            self.fail(self.lines[self.i][0], "text after the top-level block")
        return val


def _skip_spaces(text: str, j: int) -> int:
    while j < len(text) and text[j] == " ":
        j += 1
    return j


def _unquoted(text: str):
    """``(index, char, bracket depth after it)`` of every character of ``text`` outside
    quotes (the quote characters themselves skipped)."""
    quote = None
    depth = 0
    for j, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
            continue
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        yield j, ch, depth


def _depth(text: str) -> int:
    """Bracket depth at the end of ``text`` (0 when balanced)."""
    depths = [depth for _, _, depth in _unquoted(text)]
    return depths[-1] if depths else 0


def _key_split(content: str):
    """``(key, rest)`` of a ``key: value`` line (colon outside quotes and brackets)."""
    for j, ch, depth in _unquoted(content):
        if ch == ":" and depth == 0 and (j + 1 == len(content) or content[j + 1] == " "):
            return content[:j].strip(), content[j + 1 :].strip()
    return None


def parse_yaml(text: str, source: str = "the YAML text"):
    """Parse the YAML subset described in the module docstring.

    Examples
    --------
    >>> parse_yaml("initial_global_assignments:\\n  3: [1, 0]\\n  4:\\n  - 0\\n  - 1\\n"
    ...            "num_slots: 2  # two slots\\n")
    {'initial_global_assignments': {3: [1, 0], 4: [0, 1]}, 'num_slots': 2}
    """
    return _Parser(text, source).document()
