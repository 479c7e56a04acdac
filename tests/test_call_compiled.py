"""``call_compiled``: a jitted caller runs a separately compiled kernel by its address."""

import textwrap

import numba
import numpy as np
import pytest
from numba import njit, types
from straggler.solvers._numba.jit import call_compiled, compiled_address


@njit
def _stage(x, k):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = x[i] * k
    if k < 0:
        raise ValueError("negative k")
    return out, out.sum()


@njit
def _caller(handle, x, k):
    out, total = call_compiled(handle, _stage, (x, k))
    return out, total + 1.0


X = np.arange(5.0)
ARGTYPES = (numba.typeof(X), types.int64)


def test_same_result_as_python_and_callee_not_linked():
    handle = compiled_address(_stage, ARGTYPES)
    got = _caller(handle, X, 3)
    want = _caller.py_func(None, X, 3)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1] == 31.0
    (cres,) = _caller.overloads.values()
    linked = {lib.name for lib in cres.library._linking_libraries}
    assert not any("_stage" in name for name in linked), linked


def test_callee_exception_propagates():
    handle = compiled_address(_stage, ARGTYPES)
    with pytest.raises(ValueError, match="negative k"):
        _caller(handle, X, -1)


def test_handle_for_other_types_is_refused():
    wrong = compiled_address(_stage, (numba.typeof(X), types.float64))
    with pytest.raises(ValueError, match="not the address of _stage"):
        _caller(wrong, X, 3)


def test_cached_caller_in_a_new_process(tmp_path, run_python):
    (tmp_path / "ccmod.py").write_text(
        textwrap.dedent(
            """
            import numba, numpy as np
            from numba import njit, types
            from straggler.solvers._numba.jit import call_compiled, compiled_address

            @njit(cache=True)
            def stage(x):
                return x * 2.0

            @njit(cache=True)
            def caller(handle, x):
                return call_compiled(handle, stage, (x,)).sum()

            x = np.arange(4.0)
            h = compiled_address(stage, (numba.typeof(x),))
            print(caller(h, x), sum(caller.stats.cache_hits.values()))
            """
        )
    )
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}
    runs = [run_python("import ccmod", env=env).split() for _ in range(2)]
    assert runs == [["12.0", "0"], ["12.0", "1"]]


def test_caller_holds_no_dynamic_address():
    """numba refuses to cache code that keeps a dispatcher's run-time address; the caller's
    final module must not keep one, even where LLVM would not inline a helper."""
    compiled_address(_stage, ARGTYPES)
    _caller(compiled_address(_stage, ARGTYPES), X, 3)
    (cres,) = _caller.overloads.values()
    assert not cres.library.has_dynamic_globals
    assert "numba.dynamic.globals" not in cres.library.get_llvm_str()


def test_a_cache_index_naming_a_removed_class_is_a_miss(tmp_path, run_python):
    """numba unpickles a function's cache index before it checks that the index is fresh; an
    index written by an older version of a module, whose signature names a record class the
    new version no longer has, is taken as stale (compiled again) instead of raising."""
    source = """
        import typing
        import straggler.solvers._numba.jit  # noqa: F401  (loads the index stale-tolerantly)
        from numba import njit

        class {name}(typing.NamedTuple):
            a: float

        @njit(cache=True)
        def total(r):
            return r.a * 2.0

        print(total({name}(1.5)), sum(total.stats.cache_misses.values()))
        """
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}
    mod = tmp_path / "recmod.py"
    mod.write_text(textwrap.dedent(source.format(name="OldRecord")))
    assert run_python("import recmod", env=env).split() == ["3.0", "1"]
    mod.write_text(textwrap.dedent(source.format(name="NewRecord")))  # OldRecord is gone
    assert run_python("import recmod", env=env).split() == ["3.0", "1"]
    assert run_python("import recmod", env=env).split() == ["3.0", "0"]  # the fresh index
