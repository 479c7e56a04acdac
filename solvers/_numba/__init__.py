"""The library's one home for numba: the option sets every kernel is compiled with
(:mod:`~straggler.solvers._numba.jit`), calls by the address of compiled code and the compile
without a CPython wrapper (:mod:`~straggler.solvers._numba.address`), every access to numba's
disk cache (:mod:`~straggler.solvers._numba.cache`), the clock jitted code reads
(:mod:`~straggler.solvers._numba.clock`) and compile-time measurement
(:mod:`~straggler.solvers._numba.compile`). No module outside this package imports
``numba.core``; ``tests/test_numba_home.py`` checks it."""

__all__: list[str] = []
