"""All ``@njit`` options come from here.

``cache=True`` is used only by modules whose jitted callees all live in the same file
(numba's cache does not see edits in other files); CI points ``NUMBA_CACHE_DIR`` at a
fresh directory.
"""

from __future__ import annotations

NJIT = dict(nogil=True, cache=True, fastmath=False, error_model="numpy")
NJIT_PARALLEL = dict(nogil=True, cache=True, fastmath=False, error_model="numpy", parallel=True)

__all__ = ["NJIT", "NJIT_PARALLEL"]
