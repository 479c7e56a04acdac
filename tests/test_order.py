"""The radix orders of ``straggler.solvers._order`` equal numpy's stable argsort, jitted and
as plain Python."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from straggler.solvers import _order as O

_BIG = [0, 1, 255, 256, 65535, 65536, 2**32, 2**62, 2**63 - 1]

nonneg = st.lists(
    st.one_of(
        st.integers(0, 40).map(float),
        st.sampled_from([0.0, -0.0, 0.25, 1e-300, 5e-324, 1e300, 2.0**52 + 1, np.inf]),
        st.floats(0, 1e6, allow_nan=False),
    ),
    max_size=300,
)
anyfloat = st.lists(
    st.one_of(
        st.integers(-40, 40).map(float),
        st.sampled_from([0.0, -0.0, -5e-324, 5e-324, -1e300, 1e300, -np.inf, np.inf]),
        st.floats(allow_nan=False),
    ),
    max_size=300,
)
ints = st.lists(
    st.one_of(st.integers(-40, 40), st.sampled_from([-(2**63) + 1, *_BIG, *(-b for b in _BIG)])),
    max_size=300,
)
uints = st.lists(
    st.one_of(st.integers(0, 40), st.sampled_from([*_BIG, 2**63, 2**64 - 1])), max_size=300
)


def _both(f):
    return [f, getattr(f, "py_func", f)]


@settings(max_examples=60)
@given(x=nonneg)
def test_float_nonneg_orders_equal_numpy(x):
    a = np.array(x, dtype=np.float64)
    for f in _both(O.stable_argsort):
        assert f(a).tolist() == np.argsort(a, kind="stable").tolist()
    for f in _both(O.stable_argsort_desc):
        assert f(a).tolist() == np.argsort(-a, kind="stable").tolist()


@settings(max_examples=60)
@given(x=anyfloat)
def test_float_order_equals_numpy(x):
    a = np.array(x, dtype=np.float64)
    for f in _both(O.stable_argsort_float):
        assert f(a).tolist() == np.argsort(a, kind="stable").tolist()


@settings(max_examples=60)
@given(x=ints)
def test_int_desc_order_equals_numpy(x):
    a = np.array(x, dtype=np.int64)
    for f in _both(O.stable_argsort_int_desc):
        assert f(a).tolist() == np.argsort(-a, kind="stable").tolist()


@settings(max_examples=60)
@given(x=uints)
def test_uint_order_equals_numpy(x):
    a = np.array(x, dtype=np.uint64)
    for f in _both(O.stable_argsort_uint):
        assert f(a).tolist() == np.argsort(a, kind="stable").tolist()


@pytest.mark.parametrize("n", [0, 1, 2, 1000])
def test_sizes_and_all_equal_keys(n):
    a = np.full(n, 7.0)
    assert O.stable_argsort_float(a).tolist() == list(range(n))
    assert O.stable_argsort_int_desc(np.arange(n)).tolist() == list(range(n))[::-1]
