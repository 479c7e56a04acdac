"""One module of input checks, used by every public entry point.

Each entry point validates once, in one ``_<entry>_iv`` function (scipy's ``_milp_iv``) built
from the checks below, and hands normalized values to the code behind it; kernels assume valid
input. Every check raises :class:`~straggler.formulations.errors.InvalidInputError` (a
``ValueError``), or :class:`~straggler.formulations.errors.InvalidOptionError` for an unknown
choice or option, worded as scikit-learn words it: the parameter, the function, the expected
form, and what was given. The same mistake gets the same class and wording everywhere.

What every check refuses (the library's contract for bad input): booleans where numbers are
expected (``True`` is not a length), strings (``"3"`` is not a number), complex values, NaN and
infinities unless asked for, ragged nested sequences, object arrays, integers that do not fit
in int64, and values outside the stated range.

Examples
--------
>>> check_int(3, "n_gpus", "f", lo=1)
3
>>> check_int(True, "n_gpus", "f", lo=1)
Traceback (most recent call last):
...
straggler.formulations.errors.InvalidInputError: ... of f must be an integer >= 1. Got True instead.
>>> check_array([1, 2.0], "counts", "f", kind="int", lo=0).tolist()
[1, 2]
>>> check_array([[1, 2], [3]], "counts", "f", kind="int", lo=0)
Traceback (most recent call last):
...
straggler.formulations.errors.InvalidInputError: ... integers. Got a ragged nested sequence instead.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from .errors import InvalidInputError, InvalidOptionError, param_error

__all__ = [
    "MAX_EXACT_INT",
    "INT64_MAX",
    "describe",
    "check_int",
    "check_real",
    "check_bool",
    "check_choice",
    "check_type",
    "check_array",
    "check_rng",
    "rng_seed",
    "check_time_limit",
    "check_options",
]

#: Largest integer a float64 holds exactly (token counts and lengths stay below it).
MAX_EXACT_INT = 2**53
INT64_MAX = 2**63 - 1

_REPR_MAX = 80


def describe(x) -> str:
    """A short description of ``x`` for an error message (long reprs are cut, arrays named by
    shape and dtype when their repr would be long).

    >>> describe(np.zeros((100, 3)))
    'an array of shape (100, 3) and dtype float64'
    >>> describe("abc")
    "'abc'"
    """
    if isinstance(x, np.ndarray) and x.size > 8:
        return f"an array of shape {x.shape} and dtype {x.dtype}"
    try:
        r = repr(x)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        r = f"an object of type {type(x).__name__}"
    return r if len(r) <= _REPR_MAX else r[: _REPR_MAX - 3] + "..."


def _range_text(kind: str, lo, hi, lo_open: bool, hi_open: bool) -> str:
    if lo is None and hi is None:
        return ""
    if hi is None:
        if lo == 0 and not lo_open:
            return "non-negative"
        if lo == 0 and lo_open:
            return "positive"
        return f"{'>' if lo_open else '>='} {lo}"
    if lo is None:
        return f"{'<' if hi_open else '<='} {hi}"
    return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"


def _scalar_expected(kind: str, lo, hi, lo_open: bool, hi_open: bool, finite: bool) -> str:
    noun = {"int": "integer", "real": "number"}[kind]
    if kind == "real" and finite:
        noun = "finite number"
    rng = _range_text(kind, lo, hi, lo_open, hi_open)
    if not rng:
        return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"
    if rng in ("non-negative", "positive"):
        art = "a"
        return f"{art} {noun} {'>= 0' if rng == 'non-negative' else '> 0'}"
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun} {rng}"


def _in_range(v, lo, hi, lo_open: bool, hi_open: bool) -> bool:
    if lo is not None and (v <= lo if lo_open else v < lo):
        return False
    if hi is not None and (v >= hi if hi_open else v > hi):
        return False
    return True


def check_int(x, name: str, func: str, *, lo=None, hi=None) -> int:
    """``x`` as a Python int: an integral number (int, numpy integer), never a bool, a float or
    a string, within ``[lo, hi]`` (either end optional).

    >>> check_int(np.int32(4), "k", "f", lo=0, hi=8)
    4
    >>> check_int(2.0, "k", "f")
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidInputError: ... f must be an integer. Got 2.0 instead.
    """
    ok = isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))
    if ok:
        v = int(x)
        ok = _in_range(v, lo, hi, False, False)
    if not ok:
        raise param_error(
            name, func, _scalar_expected("int", lo, hi, False, False, True), describe(x)
        )
    return v


def check_real(
    x,
    name: str,
    func: str,
    *,
    lo=None,
    hi=None,
    lo_open: bool = False,
    hi_open: bool = False,
    finite: bool = True,
) -> float:
    """``x`` as a Python float: a real number (int, float, numpy scalar), never a bool, a
    string or a complex number; finite unless ``finite=False`` (NaN is always refused); within
    the stated range.

    >>> check_real(0.5, "gamma", "f", lo=0, hi=1, lo_open=True)
    0.5
    >>> check_real("1", "gamma", "f")
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidInputError: ... f must be a finite number. Got '1' instead.
    """
    t = type(x)
    # (exactly a float or an int: the common case, without the ABC check of numbers.Real)
    ok = t is float or t is int
    ok = ok or (isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)))
    if ok:
        try:
            v = float(x)
        except (OverflowError, ValueError, TypeError):
            ok = False
        else:
            ok = not math.isnan(v) and (math.isfinite(v) or not finite)
            ok = ok and _in_range(v, lo, hi, lo_open, hi_open)
    if not ok:
        raise param_error(
            name, func, _scalar_expected("real", lo, hi, lo_open, hi_open, finite), describe(x)
        )
    return v


def check_bool(x, name: str, func: str) -> bool:
    """``x`` as a bool: ``True``/``False`` or a numpy bool, nothing else (``1`` is refused).

    >>> check_bool(np.True_, "optimistic", "f")
    True
    """
    if not isinstance(x, (bool, np.bool_)):
        raise param_error(name, func, "a bool (True or False)", describe(x))
    return bool(x)


def check_choice(x, name: str, func: str, choices: Iterable):
    """``x`` itself when it is one of ``choices``; :class:`InvalidOptionError` otherwise.

    >>> check_choice("ray", "backend", "f", ["process", "ray"])
    'ray'
    >>> check_choice("mpi", "backend", "f", ["process", "ray"])
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidOptionError: ... ['process', 'ray']. Got 'mpi' instead.
    """
    choices = list(choices)
    try:
        ok = any(type(x) is type(c) and x == c for c in choices)
    except Exception:  # noqa: BLE001 - an object whose == raises is simply not a choice
        ok = False
    if not ok:
        raise param_error(name, func, f"one of {choices}", describe(x), InvalidOptionError)
    return x


def check_type(x, name: str, func: str, cls, expected: str):
    """``x`` itself when it is an instance of ``cls``; otherwise an error stating ``expected``
    and the type that was given."""
    if not isinstance(x, cls):
        raise param_error(name, func, expected, f"an object of type {type(x).__name__}")
    return x


_KIND_NOUN = {"int": "integers", "real": "numbers", "bool": "booleans"}


def _ndim_text(ndim: Sequence[int]) -> str:
    return " or ".join(f"{d}-D" for d in ndim)


def _array_expected(kind, ndim, lo, hi, lo_open, hi_open, finite, shape_text) -> str:
    noun = _KIND_NOUN[kind]
    rng = _range_text(kind, lo, hi, lo_open, hi_open)
    if rng in ("non-negative", "positive"):
        noun = f"{rng} {noun}"
    elif rng:
        noun = f"{noun} {rng}"
    if kind == "real" and finite:
        noun = f"finite {noun}"
    dims = shape_text or f"{_ndim_text(ndim)} array"
    return f"{'an' if dims[0] in 'aeiou8' else 'a'} {dims} of {noun}"


def check_array(
    x,
    name: str,
    func: str,
    *,
    kind: str = "real",
    ndim: int | Sequence[int] = 1,
    shape: Sequence[int | None] | None = None,
    lo=None,
    hi=None,
    lo_open: bool = False,
    hi_open: bool = False,
    finite: bool = True,
    values: bool = True,
    copy: bool = False,
    readonly: bool = False,
    expected: str | None = None,
) -> np.ndarray:
    """``x`` as a C-contiguous numpy array of float64 (``kind="real"``), int64 (``"int"``) or
    bool (``"bool"``), after checking everything a caller can get wrong.

    Parameters
    ----------
    x : array_like
    name, func : str
        The parameter and the function, for the message.
    kind : {"real", "int", "bool"}
        ``"int"`` accepts integer arrays and float arrays whose values are all integral
        (``[1.0, 2.0]``), never bools or strings; ``"real"`` accepts integers and floats, never
        bools, strings or complex numbers; ``"bool"`` accepts bools only (and 0/1 integers).
    ndim : int or sequence of int
        Allowed numbers of dimensions.
    shape : sequence of int or None, optional
        Required length per dimension (``None`` = any), checked when ``ndim`` matches.
    lo, hi, lo_open, hi_open : optional
        Range of every value. Integers must also fit in int64.
    finite : bool
        Refuse NaN and infinities (NaN is refused even when False).
    values : bool
        Check values (range, finiteness). ``False`` checks only type and shape, for callers
        that check values in a jitted pass of their own.
    copy, readonly : bool
        Return a fresh copy; mark the result read-only.
    expected : str, optional
        The expected form to state in messages (default: composed from the arguments).

    Examples
    --------
    >>> check_array([[0, 1], [1, 1]], "replicas", "f", kind="bool", ndim=2).dtype
    dtype('bool')
    >>> check_array([1.5, -1], "lengths", "f", lo=0)
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidInputError: ... numbers. Got value -1.0 at index 1 instead.
    >>> check_array([True, 2], "lengths", "f", lo=0)
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidInputError: ... numbers. Got a boolean value instead.
    """
    dims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    shape_text = None
    if shape is not None and len(dims) == 1:
        parts = ["n" if s is None else str(s) for s in shape]
        shape_text = f"array of shape ({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    exp = expected or _array_expected(kind, dims, lo, hi, lo_open, hi_open, finite, shape_text)

    def fail(got: str) -> InvalidInputError:
        return param_error(name, func, exp, got)

    target = {"real": np.float64, "int": np.int64, "bool": np.bool_}[kind]
    if isinstance(x, np.ndarray):
        a = x
    else:
        if isinstance(x, (str, bytes)):
            raise fail(describe(x))
        if isinstance(x, Mapping):
            raise fail(f"a {type(x).__name__}")
        has_bool = _has_bool_scalar(x)
        try:
            a = np.asarray(x)
        except (ValueError, TypeError):
            raise fail("a ragged nested sequence") from None
        except OverflowError:
            raise fail("an integer too large for int64") from None
        if has_bool and kind != "bool" and a.dtype.kind != "b":
            raise fail("a boolean value")
    dk = a.dtype.kind
    if dk == "O":
        # object arrays: ragged lists, huge Python ints, None, mixed types
        raise fail(_object_reason(a))
    if dk in "US":
        raise fail(f"strings (dtype {a.dtype})")
    if dk == "c":
        raise fail("complex numbers")
    if dk == "b" and kind != "bool":
        raise fail("a boolean value" if a.ndim == 0 else "an array of booleans")
    if dk not in "biuf":
        raise fail(f"dtype {a.dtype}")
    if a.ndim not in dims:
        raise fail(f"shape {a.shape}")
    if shape is not None:
        for want, have in zip(shape, a.shape):
            if want is not None and want != have:
                raise fail(f"shape {a.shape}")
    if kind == "int":
        a = _to_int64(a, fail)
    elif kind == "bool":
        if dk != "b":
            if dk == "f" and not np.all(np.isfinite(a)):
                raise fail("NaN or infinite values")
            if a.size and not np.all((a == 0) | (a == 1)):
                raise fail("values other than 0 and 1")
            a = a.astype(np.bool_)
    else:
        if dk == "u" and a.size and a.dtype.itemsize >= 8 and a.max() > MAX_EXACT_INT:
            raise fail("an integer too large to be represented exactly")
        if a.dtype != np.float64:
            a = a.astype(np.float64)
    if values and kind != "bool" and a.size:
        if kind == "real":
            bad = np.isnan(a) if not finite else ~np.isfinite(a)
            if bad.any():
                i = _first(bad)
                raise fail(f"value {a.flat[i]!r} at index {_index(a, i)}")
        if lo is not None or hi is not None:
            bad = np.zeros(a.shape, bool)
            if lo is not None:
                bad |= (a <= lo) if lo_open else (a < lo)
            if hi is not None:
                bad |= (a >= hi) if hi_open else (a > hi)
            if bad.any():
                i = _first(bad)
                v = a.flat[i].item()
                raise fail(f"value {v!r} at index {_index(a, i)}")
    if a.dtype != target:
        a = a.astype(target)
    if copy or not a.flags.c_contiguous or (readonly and a is x):
        a = np.array(a, dtype=target, order="C", copy=True)
    if readonly:
        a.flags.writeable = False
    return a


def _has_bool_scalar(x) -> bool:
    """True when ``x`` is a bool or a (shallow, small) sequence holding one among numbers."""
    if isinstance(x, (bool, np.bool_)):
        return True
    if isinstance(x, (list, tuple)) and len(x) <= 4096:
        for v in x:
            if isinstance(v, (bool, np.bool_)):
                return True
            if isinstance(v, (list, tuple)) and _has_bool_scalar(v):
                return True
    return False


def _object_reason(a: np.ndarray) -> str:
    for v in a.flat:
        if isinstance(v, (list, tuple, np.ndarray)):
            return "a ragged nested sequence"
        if isinstance(v, numbers.Integral) and not isinstance(v, bool):
            if not -(2**63) <= int(v) <= INT64_MAX:
                return "an integer too large for int64"
        if v is None:
            return "a None value"
        if isinstance(v, (str, bytes)):
            return "strings"
        if not isinstance(v, numbers.Real):
            return f"a value of type {type(v).__name__}"
    return "an array of Python objects"


def _to_int64(a: np.ndarray, fail) -> np.ndarray:
    dk = a.dtype.kind
    if dk == "f":
        if a.size:
            if not np.all(np.isfinite(a)):
                raise fail("NaN or infinite values")
            frac = a != np.floor(a)
            if frac.any():
                i = _first(frac)
                raise fail(f"non-integral value {a.flat[i].item()!r} at index {_index(a, i)}")
            if float(np.abs(a).max()) >= 2.0**63:  # in float64: 2**63 overflows float16
                raise fail("an integer too large for int64")
        return a.astype(np.int64)
    if dk == "u" and a.dtype.itemsize >= 8 and a.size and a.max() > INT64_MAX:
        raise fail("an integer too large for int64")
    if dk == "b":
        raise fail("an array of booleans")
    return a.astype(np.int64) if a.dtype != np.int64 else a


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask.ravel())[0])


def _index(a: np.ndarray, flat: int):
    if a.ndim <= 1:
        return flat
    return tuple(int(i) for i in np.unravel_index(flat, a.shape))


def check_rng(rng, func: str, name: str = "rng") -> np.random.Generator:
    """``rng`` (None, a non-negative int seed or a numpy Generator) as a Generator.

    ``name`` is the parameter's name where it is not ``rng`` (``seed=`` of
    ``make_decode_problem``).

    >>> bool(check_rng(3, "f").integers(10) == np.random.default_rng(3).integers(10))
    True
    >>> check_rng(True, "f", "seed")
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidInputError: The 'seed' parameter of f must be ...
    """
    if rng is None or isinstance(rng, np.random.Generator):
        return np.random.default_rng(rng)
    if isinstance(rng, numbers.Integral) and not isinstance(rng, (bool, np.bool_)) and rng >= 0:
        return np.random.default_rng(int(rng))
    raise param_error(
        name, func, "None, a non-negative int seed or a numpy Generator", describe(rng)
    )


def rng_seed(rng, func: str) -> int:
    """An integer seed in ``[0, 2**62)`` for a kernel: ``rng`` itself when it is an int seed, one
    draw from it when it is a Generator, a fresh random seed for None."""
    if isinstance(rng, numbers.Integral) and not isinstance(rng, (bool, np.bool_)) and rng >= 0:
        return int(rng) % (2**62)
    return int(check_rng(rng, func).integers(2**62))


def check_time_limit(time_limit, func: str) -> float:
    """A positive number of seconds (``math.inf`` allowed: no limit).

    >>> check_time_limit(0.5, "f")
    0.5
    """
    return check_real(time_limit, "time_limit", func, lo=0, lo_open=True, finite=False)


def check_options(options: Mapping, allowed: Iterable[str], func: str, what: str = "option"):
    """Raise :class:`InvalidOptionError` naming every key of ``options`` not in ``allowed``.

    >>> check_options({"r_max": 4}, ["r_max", "s_greedy"], "route_batch")
    >>> check_options({"rmax": 4}, ["r_max"], "route_batch")
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidOptionError: ... option(s) ['rmax']; it accepts ['r_max'].
    """
    allowed = sorted(allowed)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise InvalidOptionError(
            f"{func} got unknown {what}(s) {unknown}; it accepts {allowed or 'no ' + what + 's'}."
        )
