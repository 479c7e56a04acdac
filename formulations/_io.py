"""What the commands, the readers and the writers share: atomic writes, input and output
checks made before any work, and an argument parser whose usage errors are one line.

A write goes to a temporary name in the destination's directory and is renamed over the
destination (``os.replace``, atomic on POSIX within one file system), so a write that fails
half way leaves the destination as it was and no partial file beside it. The file ends with
the permissions a plain ``open(path, "w")`` gives it: an existing destination's mode, else
``0o666`` less the process's umask (so an engine running as another user can read it).

A set of files (:func:`atomic_dir`) is staged in a folder beside its directory, which then
replaces the directory whole: a reader sees the old set or the new one, never a mix.

Special paths. A destination that is a symbolic link is written through: the file the link
points to is replaced (as ``open(path, "w")`` writes to it) and the link stays a link; a
dangling link creates its target, a link loop is refused. A destination that is a FIFO, a
socket or a device is refused before anything is written: an atomic write replaces a file,
which would put a regular file where the special one was (and reading one back, or writing
to a FIFO nobody reads, blocks). On the reading side :func:`check_input_file` accepts a
regular file only (links followed): a missing file, a folder, a broken link or a loop, a
FIFO, a socket or a device, and anything that is not a path (an ``int`` would be opened as
a file descriptor) are refused with an error naming the parameter.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import stat
import sys
import tempfile

from .errors import InvalidInputError, WriteError

__all__ = [
    "utf8_problem",
    "atomic_path",
    "atomic_open",
    "atomic_dir",
    "check_output_dir",
    "check_output_file",
    "name_list",
    "check_input_file",
    "check_path_arg",
    "file_problem",
    "write_error",
    "OneLineParser",
]


def file_problem(path) -> str | None:
    """Why ``path`` cannot be read as a file (a phrase to follow its name), or None when it
    is a regular file (symbolic links followed).

    >>> file_problem("/")
    'is a directory, not a file'
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (
            isinstance(exc, FileNotFoundError) and os.path.islink(path)
        ):
            return "is a broken symbolic link or a symbolic-link loop"
        if isinstance(exc, (FileNotFoundError, NotADirectoryError)):
            return "does not exist"
        return f"cannot be examined ({exc.strerror or type(exc).__name__})"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(st.st_mode):
        return (
            "is not a regular file (a FIFO, socket or device: reading it could block or never end)"
        )
    return None


def check_path_arg(path, name: str, func: str) -> str:
    """``path`` as a non-empty ``str`` (from a ``str`` or an ``os.PathLike`` giving one),
    else an error naming the parameter (an ``int`` would be a file descriptor to ``open``,
    ``bytes`` are refused, as every reader refuses them).

    >>> check_path_arg(b"a.csv", "path", "write_x")
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidInputError: ... Got bytes b'a.csv' instead.
    """
    if isinstance(path, (bytes, bool)) or not isinstance(path, (str, os.PathLike)):
        raise InvalidInputError(
            f"The '{name}' parameter of {func} must be a path (str or os.PathLike). Got "
            f"{type(path).__name__} {repr(path)[:60]} instead."
        )
    p = os.fspath(path)
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p or "\0" in p:
        raise InvalidInputError(
            f"The '{name}' parameter of {func} must be a non-empty path. Got {p[:60]!r} instead."
        )
    return p


def check_input_file(path, name: str, func: str) -> str:
    """``path`` as a ``str`` when it names a regular file to read (symbolic links followed),
    else an error naming the parameter: not a path (an ``int`` would be opened as a file
    descriptor, ``bytes`` are refused), empty, or :func:`file_problem`.

    >>> check_input_file(3, "path", "load_x")
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidInputError: ... Got int 3 instead.
    """
    p = check_path_arg(path, name, func)
    why = file_problem(p)
    if why is not None:
        raise InvalidInputError(
            f"The '{name}' parameter of {func} must be an existing regular file. Got {p!r}, "
            f"which {why}."
        )
    return p


def write_error(path, exc: BaseException) -> WriteError:
    """One error naming the file a write failed on, for any failure of the write itself (an
    ``OSError``: a full disk, a quota, a file-size limit; a writer library's own error, such
    as torch's ``RuntimeError`` from ``inline_container.cc``): a :class:`WriteError`, so
    callers that catch ``OSError`` still catch it, with the system's ``errno`` kept."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    err = WriteError(
        f"Cannot write {os.fspath(path)}: {reason[:200]} ({type(exc).__name__}); nothing was "
        "written."
    )
    err.errno = exc.errno if isinstance(exc, OSError) else None
    return err


def _write_target(p: str) -> str:
    """The file a write to ``p`` replaces: ``p``, or the file a symbolic link ``p`` points to
    (written through, as ``open(p, "w")`` does); a link loop, a folder, a FIFO, a socket or a
    device is refused."""
    if os.path.islink(p):
        try:
            os.stat(p)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InvalidInputError(f"Cannot write {p}: it is a symbolic-link loop.") from None
        p = os.path.realpath(p)  # a dangling link: its target is created, as open() does
    try:
        st = os.stat(p)
    except OSError:
        return p  # absent (created), or a failure the write itself reports
    if stat.S_ISDIR(st.st_mode):
        raise InvalidInputError(f"Cannot write {p}: it is a directory, not a file.")
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInputError(
            f"Cannot write {p}: it is a FIFO, socket or device, not a regular file (an atomic "
            "write would replace it with a regular file)."
        )
    return p


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
            raise write_error(p, exc) from None
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
    p = _write_target(check_path_arg(path, "path", "a write"))
    d = os.path.dirname(p) or "."
    if os.path.exists(d) and not os.path.isdir(d):
        raise InvalidInputError(f"Cannot write {p}: {d} is a file, not a directory.")
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as exc:
        raise write_error(d, exc) from None
    tmp = _create_beside(p, d)
    try:
        yield tmp
        with contextlib.suppress(FileNotFoundError):  # keep an existing file's mode
            os.chmod(tmp, stat.S_IMODE(os.stat(p).st_mode))
        os.replace(tmp, p)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):  # a full disk, ...
            raise write_error(p, exc) from None
        raise


@contextlib.contextmanager
def atomic_open(path, mode: str = "w", **kwargs):
    """``open`` on a temporary name, renamed over ``path`` when the block succeeds."""
    with atomic_path(path) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux ``renameat2(..., RENAME_EXCHANGE)``); False where
    the system or the file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _carry(src: str, dst: str) -> None:
    """``src`` (a file, a link or a folder) recreated at ``dst``: files hard-linked (copied
    where links fail), links as links, folders entry by entry."""
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    elif os.path.isdir(src):
        shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(src, dst)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


@contextlib.contextmanager
def atomic_dir(directory, owns):
    """Write a set of files as a set: a staging folder beside ``directory``, which replaces
    it whole when the block succeeds and is removed when the block raises.

    The block writes the new set into the staging folder it is given. On success every entry
    of the old ``directory`` whose name ``owns(name)`` is false (files the set does not
    own: a placement beside statistics, a user's notes) is carried into the staging folder
    (hard links, so nothing is copied), and the staging folder takes the place of
    ``directory`` in one ``renameat2(RENAME_EXCHANGE)`` where Linux offers it (else two
    renames, with a moment where ``directory`` is absent but never mixed). So a reader sees
    the old set or the new one, never a mix, and never a file of the old set the new one
    does not have (a ``rank3`` left by an earlier 4-rank write under a 2-rank one). A
    ``directory`` that is a symbolic link is written through: the folder it points to is
    replaced.

    Examples
    --------
    >>> import tempfile, os
    >>> d = os.path.join(tempfile.mkdtemp(), "stats")
    >>> for n in (2, 1):
    ...     with atomic_dir(d, lambda name: name.startswith("rank")) as stage:
    ...         for r in range(n):
    ...             _ = open(os.path.join(stage, f"rank{r}"), "w").write("x")
    >>> sorted(os.listdir(d))
    ['rank0']
    """
    p = os.fspath(directory)
    if os.path.islink(p):
        p = os.path.realpath(p)
    if os.path.exists(p) and not os.path.isdir(p):
        raise InvalidInputError(f"Cannot write the files of {p}: it is a file, not a directory.")
    parent = os.path.dirname(os.path.abspath(p))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise write_error(parent, exc) from None
    base = os.path.basename(os.path.abspath(p))
    for _ in range(100):
        stage = os.path.join(parent, f".{base}.{secrets.token_hex(4)}.tmp")
        try:
            os.mkdir(stage, 0o777)  # the umask applies, as for os.makedirs
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise write_error(p, exc) from None
    else:
        raise InvalidInputError(f"Cannot write {p}: no free temporary name beside it.")
    retired = None  # the old set once swapped out, removed at the end
    try:
        yield stage
        if os.path.isdir(p):
            os.chmod(stage, stat.S_IMODE(os.stat(p).st_mode))
            for name in sorted(os.listdir(p)):
                if not owns(name) and not os.path.lexists(os.path.join(stage, name)):
                    _carry(os.path.join(p, name), os.path.join(stage, name))
            if _exchange(stage, p):
                retired = stage
            else:
                aside = os.path.join(parent, f".{base}.{secrets.token_hex(4)}.old")
                os.rename(p, aside)
                try:
                    os.rename(stage, p)
                except BaseException:
                    os.rename(aside, p)  # the old set back in place
                    raise
                retired = aside
        else:
            os.rename(stage, p)
    except BaseException as exc:
        if retired is None:
            shutil.rmtree(stage, ignore_errors=True)
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise write_error(p, exc) from None
        if isinstance(exc, InvalidInputError | WriteError) and stage in str(exc):
            renamed = type(exc)(str(exc).replace(stage, p))  # the staged file's name
            renamed.errno = getattr(exc, "errno", None)
            raise renamed from None
        raise
    finally:
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)


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
    # Permission bits do not tell the superuser, or a special file system such as /proc,
    # what can be created: create a probe and remove it at once.
    try:
        fd, name = tempfile.mkstemp(prefix=".straggler-probe-", dir=probe)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise InvalidInputError(
            f"{what} {d} is not writable (nothing can be created in {probe}: {reason})."
        ) from None
    os.close(fd)
    os.unlink(name)


def check_output_dir(path, what: str = "The output directory") -> str:
    """Check, before any work, that ``path`` is or can become a writable directory; returns
    it as a string. Nothing is left behind: a probe file is created in the nearest existing
    folder and removed at once (permission bits alone do not tell the superuser, or a file
    system such as ``/proc``, what can be created)."""
    p = os.fspath(path)
    if not p:
        raise InvalidInputError(f"{what} must be a non-empty path.")
    _probe_dir(p, what)
    return p


def check_output_file(path, what: str = "The output file") -> str:
    """Check, before any work, that ``path`` can be written as a file (not a directory, its
    directory writable or creatable); returns it as a string. Nothing is left behind (a
    probe file is created and removed in the nearest existing folder, as
    :func:`check_output_dir` does)."""
    p = os.fspath(path)
    if not p or p.endswith(os.sep):
        raise InvalidInputError(f"{what} must be a file path. Got {p!r} instead.")
    if os.path.isdir(p):
        raise InvalidInputError(f"{what} {p} is a directory, not a file.")
    _write_target(p)  # a link loop, a FIFO, a socket or a device: refused
    if os.path.exists(p) and not os.access(p, os.W_OK):
        raise InvalidInputError(f"{what} {p} is not writable.")
    _probe_dir(os.path.dirname(p) or ".", f"The directory of {what[0].lower()}{what[1:]}")
    return p


def name_list(text: str) -> list[str]:
    """The ``type=`` of every comma-separated list flag of the commands: the names, stripped,
    in order. A list naming nothing (``""``, ``","``), with an empty name (``"a,,b"``,
    ``"a,"``) or naming one thing twice (``"jsq,jsq"``, ``"jsq, jsq"``) is refused, so that
    every command reads such a list the same way: as a usage error, never as its default
    and never as a cell, a column or a compile step run twice.

    >>> name_list(" tempo, token_lp")
    ['tempo', 'token_lp']
    >>> name_list(",")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected comma-separated names, at least one and none empty; got ','
    >>> name_list("jsq,jsq")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected comma-separated names, each once; got 'jsq' twice ...
    """
    names = [x.strip() for x in str(text).split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated names, at least one and none empty; got {text!r}"
        )
    seen = set()
    for name in names:
        if name in seen:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated names, each once; got {name!r} twice in {text!r}"
            )
        seen.add(name)
    return names


class OneLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors print one line (``prog: error: ...``,
    with a pointer to ``--help``) and exit with status 2."""

    def error(self, message: str):  # noqa: D401 - argparse's signature
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(2)


def utf8_problem(text: str) -> bool:
    """Whether ``text`` cannot be written as UTF-8 (a lone surrogate): the text writers
    refuse such text before writing, since their readers decode UTF-8.

    >>> utf8_problem("a"), utf8_problem(chr(0xD800))
    (False, True)
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
