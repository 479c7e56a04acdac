"""The one home of numba's internals (``straggler.solvers._numba``): calls by address
(``call_compiled``, ``address_call``), the compile without a CPython wrapper, ``readonly``, the
disk cache's state and its tolerant index, the option sets; and no other module reaching into
numba's compiler or cache."""

import ast
import pathlib
import textwrap

import numba
import numpy as np
import pytest
from numba import njit, types
from straggler.solvers._numba import address, cache, jit
from straggler.solvers._numba.address import (
    address_call,
    call_compiled,
    compiled_address,
    readonly,
    wrapperless_address,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]


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
            from straggler.solvers._numba.address import call_compiled, compiled_address

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


# -- address_call: one compiled caller for every callee of a signature -----------------------


@njit
def _double(x, k):
    if k < 0:
        raise ValueError("negative k in _double")
    return x * 2.0 + k


@njit
def _square(x, k):
    return x * x + k


_CALL_AT = address_call(lambda argtypes: argtypes[0])


@njit
def _by_address(addr, x, k):
    return _CALL_AT(addr, x, k) + 1.0


def _address(kernel):
    addr, returns = wrapperless_address(kernel, (types.float64, types.int64))
    assert returns == types.float64
    return addr


def test_address_call_runs_each_callee_with_one_compiled_caller():
    if not hasattr(_by_address, "compile"):
        pytest.skip("NUMBA_DISABLE_JIT")
    assert _by_address(_address(_double), 3.0, 1) == 8.0
    assert _by_address(_address(_square), 3.0, 1) == 11.0
    assert len(_by_address.overloads) == 1
    with pytest.raises(ValueError, match="negative k in _double"):
        _by_address(_address(_double), 3.0, -1)


def test_the_wrapperless_version_has_no_cpython_wrapper_and_its_own_symbols():
    """A callee called by address is compiled without numba's CPython wrapper, named apart
    from the function's own version (one process may load both); the function itself still
    runs from Python."""
    if not hasattr(_double, "compile"):
        pytest.skip("NUMBA_DISABLE_JIT")
    _address(_double)
    assert _double(3.0, 1) == 7.0
    twin = address._wrapperless(_double)
    sig = (types.float64, types.int64)
    mine, its = twin.overloads[sig], _double.overloads[sig]
    assert "__by_address" in mine.fndesc.mangled_name
    assert "__by_address" not in its.fndesc.mangled_name
    assert mine.library.get_pointer_to_function(mine.fndesc.llvm_cpython_wrapper_name) == 0
    assert its.library.get_pointer_to_function(its.fndesc.llvm_cpython_wrapper_name) != 0


@njit
def _sum_readonly(a):
    return readonly(a).sum()


@njit
def _write_first(a):
    a[0] = 1.0
    return a


def test_readonly_types_an_array_read_only_without_copying():
    a = np.arange(4.0)
    v = readonly(a)
    assert not v.flags.writeable and np.shares_memory(v, a) and a.flags.writeable
    assert _sum_readonly(a) == 6.0
    if not hasattr(_write_first, "compile"):
        return  # NUMBA_DISABLE_JIT: readonly is the view above
    # jitted: the same array, typed read-only (numba refuses a write to it)
    (sig,) = _sum_readonly.signatures
    assert sig[0].mutable  # the argument as given
    with pytest.raises(numba.TypingError, match="readonly"):
        njit(lambda a: _write_first(readonly(a)))(a)


# -- the disk cache's state, read here only ---------------------------------------------------


def test_the_cache_state_of_a_kernel_in_a_new_process(tmp_path, run_python):
    """is_cached, cache_folder, cache_stamp, has_disk_cache, cache_misses on a cached kernel:
    a first process compiles (a miss, then cached), a second loads (no miss)."""
    (tmp_path / "statemod.py").write_text(
        textwrap.dedent(
            """
            from numba import njit
            from straggler.solvers._numba import cache

            @njit(cache=True)
            def f(x):
                return x + 1

            @njit
            def g(x):
                return x + 1

            before = cache.is_cached(f)
            f(1)
            print(before, cache.is_cached(f), cache.cache_misses([f]), cache.has_disk_cache(f),
                  cache.has_disk_cache(g), cache.cache_folder(g), cache.cache_stamp(g),
                  cache.cache_folder(f) is not None, cache.cache_stamp(f) is not None)
            """
        )
    )
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path)}
    first = run_python("import statemod", env=env).split()
    second = run_python("import statemod", env=env).split()
    assert first == ["False", "True", "1", "True", "False", "None", "None", "True", "True"]
    assert second == ["True", "True", "0", "True", "False", "None", "None", "True", "True"]


def test_cache_depends_on_ties_the_stamp_to_the_other_files():
    @njit(cache=True)
    def tied(x):
        return x

    if not hasattr(tied, "compile"):
        pytest.skip("NUMBA_DISABLE_JIT")
    own = cache.cache_stamp(tied)
    assert jit.cache_depends_on(tied, address, cache)
    assert cache.cache_stamp(tied) == (own, jit.source_digest(address, cache))
    assert jit.cache_depends_on(tied, jit)  # a later call replaces the digest
    assert cache.cache_stamp(tied) == (own, jit.source_digest(jit))


def test_the_option_sets():
    assert jit.NJIT["cache"] and jit.NJIT["no_cfunc_wrapper"]
    assert jit.NJIT_JITTED["no_cpython_wrapper"]
    assert jit.NJIT_BORROW["_nrt"] is False and jit.NJIT_BORROW["no_cpython_wrapper"]
    assert jit.NJIT_BORROW_INLINE["inline"] == "always" and jit.NJIT_BORROW_INLINE["_nrt"] is False
    assert (
        jit.NJIT_BORROW_ENTRY["_nrt"] is False and "no_cpython_wrapper" not in jit.NJIT_BORROW_ENTRY
    )
    assert jit.NJIT_OBJMODE["nogil"] is False and jit.NJIT_OBJMODE["_nrt"] is True


# -- nothing else reaches into numba's compiler or cache --------------------------------------

#: numba's compiler and cache modules: imported only in ``solvers/_numba``.
_NUMBA_CORE = "numba.core"
#: The private names of numba's disk cache: read only in ``solvers/_numba/cache.py``.
_PRIVATE = {
    "_cache",
    "_cache_file",
    "_source_stamp",
    "_load_index",
    "_cache_path",
    "cache_path",
    "_index_key",
    "IndexDataCacheFile",
    "FunctionCache",
    "NullCache",
}
_HOME = ROOT / "solvers" / "_numba"


def _reaches(path):
    """What ``path`` does with numba's internals: ``(kind, line, what)`` rows."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_NUMBA_CORE):
            out.append(("core", node.lineno, f"imports {node.module}"))
            out += [("cache", node.lineno, a.name) for a in node.names if a.name in _PRIVATE]
        elif isinstance(node, ast.Import):
            out += [
                ("core", node.lineno, f"imports {a.name}")
                for a in node.names
                if a.name.startswith(_NUMBA_CORE)
            ]
        elif isinstance(node, ast.Attribute) and node.attr in _PRIVATE:
            out.append(("cache", node.lineno, f"reads .{node.attr}"))
        elif isinstance(node, ast.Constant) and node.value in _PRIVATE:
            out.append(("cache", node.lineno, f"names {node.value!r}"))
        elif isinstance(node, ast.Constant) and node.value == "_nrt":
            out.append(("nrt", node.lineno, "names '_nrt'"))
        elif isinstance(node, ast.keyword) and node.arg == "_nrt":
            out.append(("nrt", node.lineno, "sets _nrt"))
    return out


def _library_files():
    for pkg in ("formulations", "solvers", "baselines", "sim", "runtime", "proofs"):
        yield from sorted((ROOT / pkg).rglob("*.py"))


def test_only_the_numba_home_touches_numba_internals():
    """numba's compiler and cache modules are imported in ``solvers/_numba`` only; the disk
    cache's private names are read in ``solvers/_numba/cache.py`` only; reference counting is
    switched off (``_nrt``) in ``solvers/_numba/jit.py``'s option sets only."""
    allowed = {"core": _HOME, "cache": _HOME / "cache.py", "nrt": _HOME / "jit.py"}
    bad = []
    for path in _library_files():
        for kind, line, what in _reaches(path):
            home = allowed[kind]
            if not (path == home or (home.is_dir() and path.parent == home)):
                bad.append(f"{path.relative_to(ROOT)}:{line} {what}")
    assert not bad, "\n".join(bad)


def test_the_internals_check_sees_each_kind(tmp_path):
    """The check above reads an import of numba.core, a private cache attribute, a private
    cache class imported by name and an ``_nrt`` option."""
    src = tmp_path / "bad.py"
    src.write_text(
        "from numba.core.caching import NullCache\n"
        "import numba.core.event\n"
        "x = f._cache._cache_file\n"
        "opts = dict(_nrt=False)\n"
    )
    kinds = sorted({k for k, _, _ in _reaches(src)})
    assert kinds == ["cache", "core", "nrt"]
    assert {w for _, _, w in _reaches(src)} >= {"NullCache", "reads ._cache", "sets _nrt"}


def test_the_installed_numba_is_in_the_pinned_range():
    """pyproject pins numba to the minor release these tests pass on: the internals above
    (the lowering class, the cache's index, the calling convention) change between minor
    releases."""
    import importlib.metadata
    import re

    text = (ROOT / "pyproject.toml").read_text()
    (pin,) = re.findall(r'"numba(>=[0-9.]+,<[0-9.]+)"', text)
    lo, hi = (tuple(int(x) for x in v.split(".")) for v in re.findall(r"[<>]=?([0-9.]+)", pin))
    have = tuple(int(x) for x in importlib.metadata.version("numba").split(".")[:3])
    assert lo <= have < hi, (pin, have)
