"""One hierarchy of exceptions for the whole library.

Every error raised on bad user input derives from :class:`InvalidInputError`, which is
also a :class:`ValueError`, so ``except ValueError`` keeps working for callers who do not
know this library. Messages follow scikit-learn's wording: the parameter, the function,
the expected form, and what was given.
"""

from __future__ import annotations

__all__ = [
    "StragglerError",
    "InvalidInputError",
    "InvalidOptionError",
    "InfeasibleSharesError",
    "BackendUnavailableError",
    "WriteError",
    "param_error",
]


class StragglerError(Exception):
    """Base class of every exception raised by straggler."""


class InvalidInputError(StragglerError, ValueError):
    """A parameter has the wrong shape, type, sign or value."""


class InvalidOptionError(InvalidInputError):
    """An unknown method, policy, backend or keyword option was requested."""


class InfeasibleSharesError(InvalidInputError):
    """A dispatch (shares matrix) violates conservation, sign or replica support."""


class WriteError(StragglerError, OSError):
    """Writing a file failed in the operating system or a writer library (a full disk, a
    quota, a file-size limit, torch's or safetensors' own error); the message names the file,
    ``errno`` is the system's when there is one, and nothing was written."""


class BackendUnavailableError(StragglerError, ImportError):
    """An optional backend (OR-Tools, torch, triton, matplotlib) is not installed."""


def param_error(
    param: str, func: str, expected: str, got: str, cls: type[InvalidInputError] = InvalidInputError
) -> InvalidInputError:
    """Build an error with the library's standard wording.

    Examples
    --------
    >>> str(param_error("counts", "solve_dispatch", "a 1-D array", "shape (3, 4, 5)"))
    "The 'counts' parameter of solve_dispatch must be a 1-D array. Got shape (3, 4, 5) instead."
    """
    return cls(f"The '{param}' parameter of {func} must be {expected}. Got {got} instead.")
