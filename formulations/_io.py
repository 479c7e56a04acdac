"""What the commands and the writers share: atomic writes, output checks made before any
work, and an argument parser whose usage errors are one line.

A write goes to a temporary name in the destination's directory and is renamed over the
destination (``os.replace``, atomic on POSIX within one file system), so a write that fails
half way leaves the destination as it was and no partial file beside it. The file ends with
the permissions a plain ``open(path, "w")`` gives it: an existing destination's mode, else
``0o666`` less the process's umask (so an engine running as another user can read it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import stat
import sys

from .errors import InvalidInputError

__all__ = [
    "atomic_path",
    "atomic_open",
    "check_output_dir",
    "check_output_file",
    "OneLineParser",
]


def _create_beside(p: str, d: str) -> str:
    """A new empty file in ``d`` named after ``p`` (its extension kept: some writers, torch
    and numpy, act on it), created with mode ``0o666`` so that the umask applies as for
    ``open`` (``tempfile.mkstemp`` would make it ``0o600``)."""
    base = os.path.basename(p)
    for _ in range(100):
        tmp = os.path.join(d, f".{base}.{secrets.token_hex(4)}.tmp{os.path.splitext(base)[1]}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise InvalidInputError(f"Cannot write {p}: {exc.strerror}.") from None
        os.close(fd)
        return tmp
    raise InvalidInputError(f"Cannot write {p}: no free temporary name beside it.")


@contextlib.contextmanager
def atomic_path(path):
    """A temporary path beside ``path``; renamed to ``path`` when the block succeeds,
    removed when it raises.

    Examples
    --------
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with atomic_path(os.path.join(d, "a.txt")) as tmp:
    ...     _ = open(tmp, "w").write("x")
    >>> sorted(os.listdir(d))
    ['a.txt']
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        raise InvalidInputError(f"Cannot write {p}: it is a directory, not a file.")
    d = os.path.dirname(p) or "."
    if os.path.exists(d) and not os.path.isdir(d):
        raise InvalidInputError(f"Cannot write {p}: {d} is a file, not a directory.")
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"Cannot create the directory of {p}: {exc.strerror}.") from None
    tmp = _create_beside(p, d)
    try:
        yield tmp
        with contextlib.suppress(FileNotFoundError):  # keep an existing file's mode
            os.chmod(tmp, stat.S_IMODE(os.stat(p).st_mode))
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", **kwargs):
    """``open`` on a temporary name, renamed over ``path`` when the block succeeds."""
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def _probe_dir(d: str, what: str) -> None:
    if os.path.exists(d) and not os.path.isdir(d):
        raise InvalidInputError(f"{what} {d} is a file, not a directory.")
    probe = d
    while probe and not os.path.exists(probe):  # the nearest existing ancestor
        parent = os.path.dirname(probe)
        probe = parent if parent != probe else ""
    probe = probe or "."
    if not os.path.isdir(probe):
        raise InvalidInputError(f"{what} {d} cannot be created: {probe} is a file.")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InvalidInputError(f"{what} {d} is not writable (no write permission on {probe}).")


def check_output_dir(path, what: str = "The output directory") -> str:
    """Check, before any work, that ``path`` is or can become a writable directory; returns
    it as a string. Nothing is created."""
    p = os.fspath(path)
    if not p:
        raise InvalidInputError(f"{what} must be a non-empty path.")
    _probe_dir(p, what)
    return p


def check_output_file(path, what: str = "The output file") -> str:
    """Check, before any work, that ``path`` can be written as a file (not a directory, its
    directory writable or creatable); returns it as a string. Nothing is created."""
    p = os.fspath(path)
    if not p or p.endswith(os.sep):
        raise InvalidInputError(f"{what} must be a file path. Got {p!r} instead.")
    if os.path.isdir(p):
        raise InvalidInputError(f"{what} {p} is a directory, not a file.")
    if os.path.exists(p) and not os.access(p, os.W_OK):
        raise InvalidInputError(f"{what} {p} is not writable.")
    _probe_dir(os.path.dirname(p) or ".", f"The directory of {what[0].lower()}{what[1:]}")
    return p


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors print one line (``prog: error: ...``,
    with a pointer to ``--help``) and exit with status 2."""

    def error(self, message: str):  # noqa: D401 - argparse's signature
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)
