"""The one module of input checks: every refusal names the parameter and what was given."""

import numpy as np
import pytest
from straggler.formulations import InvalidInputError, InvalidOptionError
from straggler.formulations.validation import (
    check_array,
    check_bool,
    check_choice,
    check_int,
    check_options,
    check_real,
    check_rng,
    check_time_limit,
    rng_seed,
)

BAD_ARRAYS = [
    ("3", "'3'"),
    (["1", "2"], "strings"),
    ([1 + 2j], "complex"),
    ([[1, 2], [3]], "ragged"),
    ([True, 1], "boolean"),
    (np.array([True, False]), "booleans"),
    ([None, 1], "None"),
    ([10**30], "too large"),
    (np.array([2**64 - 1], dtype=np.uint64), "too large"),
    ({"a": 1}, "dict"),
]


@pytest.mark.parametrize("x, reason", BAD_ARRAYS)
@pytest.mark.parametrize("kind", ["int", "real"])
def test_check_array_refuses_with_the_parameter_named(x, reason, kind):
    with pytest.raises(InvalidInputError) as e:
        check_array(x, "lengths", "route_batch", kind=kind, lo=0)
    msg = str(e.value)
    assert msg.startswith("The 'lengths' parameter of route_batch must be")
    assert reason in msg


@pytest.mark.parametrize("x", [[1.0, np.nan], [np.inf], [1e400], [-1.0]])
def test_check_array_values(x):
    with pytest.raises(InvalidInputError, match="'v' parameter of f"):
        check_array(x, "v", "f", lo=0)


def test_check_array_int_from_integral_floats_and_ranges():
    assert check_array([1.0, 2.0], "v", "f", kind="int").dtype == np.int64
    with pytest.raises(InvalidInputError, match="non-integral value 1.5 at index 1"):
        check_array([1.0, 1.5], "v", "f", kind="int")
    with pytest.raises(InvalidInputError, match=r"value 9 at index \(1, 0\)"):
        check_array([[1], [9]], "v", "f", kind="int", ndim=2, hi=8)
    with pytest.raises(InvalidInputError, match=r"shape \(2, 3\)"):
        check_array(np.zeros((2, 3)), "v", "f", shape=(2, 4), ndim=2)
    assert check_array([np.inf], "v", "f", finite=False)[0] == np.inf


def test_check_array_does_not_alias_when_asked():
    x = np.arange(3.0)
    y = check_array(x, "v", "f", copy=True, readonly=True)
    assert y is not x and not y.flags.writeable and x.flags.writeable
    assert check_array(x, "v", "f") is x  # no copy on the fast path


def test_bool_values_are_not_accepted_as_bool_arrays_of_other_kinds():
    with pytest.raises(InvalidInputError, match="values other than 0 and 1"):
        check_array([0, 2], "replicas", "f", kind="bool")
    assert check_array([0, 1], "replicas", "f", kind="bool").tolist() == [False, True]


@pytest.mark.parametrize("x", [True, 1.0, "1", None, 2**70 + 0.5])
def test_check_int_refuses(x):
    with pytest.raises(InvalidInputError, match="'k' parameter of f must be an integer"):
        check_int(x, "k", "f")


@pytest.mark.parametrize("x", [True, "1", 1j, float("nan"), float("inf"), 10**400])
def test_check_real_refuses(x):
    with pytest.raises(InvalidInputError, match="'x' parameter of f must be a finite number"):
        check_real(x, "x", "f")


def test_scalar_ranges_and_wording():
    with pytest.raises(InvalidInputError, match=r"a number in \(0, 1\]. Got 0 instead"):
        check_real(0, "gamma", "f", lo=0, hi=1, lo_open=True, finite=False)
    with pytest.raises(InvalidInputError, match="an integer >= 1. Got 0 instead"):
        check_int(0, "n", "f", lo=1)
    assert check_time_limit(float("inf"), "f") == float("inf")
    with pytest.raises(InvalidInputError, match="time_limit"):
        check_time_limit(0, "f")


def test_choices_options_bools_rngs():
    with pytest.raises(InvalidOptionError):
        check_choice(1, "policy", "f", ["br0"])
    with pytest.raises(InvalidOptionError, match=r"unknown option\(s\) \['x'\]"):
        check_options({"x": 1}, [], "f")
    with pytest.raises(InvalidInputError, match="a bool"):
        check_bool(1, "optimistic", "f")
    with pytest.raises(InvalidInputError, match="'rng' parameter of f"):
        check_rng(-1, "f")
    assert rng_seed(5, "f") == 5
    g = np.random.default_rng(0)
    assert rng_seed(g, "f") == int(np.random.default_rng(0).integers(2**62))


def test_check_rng_names_the_parameter():
    with pytest.raises(InvalidInputError, match="'seed' parameter of make_decode_problem"):
        check_rng(True, "make_decode_problem", "seed")
    with pytest.raises(InvalidInputError, match="'rng' parameter of f"):
        check_rng(-1, "f")


def test_check_array_small_float_dtypes_do_not_overflow_the_bound():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_array(np.array([0.0, 3.0], np.float16), "v", "f", kind="int").tolist() == [
            0,
            3,
        ]
