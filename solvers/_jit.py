"""All ``@njit`` options come from here.

``cache=True`` is used only by modules whose jitted callees all live in the same file
(numba's cache does not see edits in other files); CI points ``NUMBA_CACHE_DIR`` at a
fresh directory.
"""

from __future__ import annotations

NJIT = dict(nogil=True, cache=True, fastmath=False, error_model="numpy")
NJIT_PARALLEL = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", parallel=True)
#: For a jitted helper with one call site, inlined into its caller at numba's IR level: every
#: jitted function's library links and re-optimizes all its callees, so each level of calls
#: adds a pass over everything below it (this keeps tempo's cold compile down).
NJIT_INLINE = dict(NJIT, inline="always")

__all__ = ["NJIT", "NJIT_INLINE", "NJIT_PARALLEL"]
