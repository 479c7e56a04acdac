"""Prompt prefix blocks per request, for the simulator's prefix caches (Dynamo's KV router).

A :class:`PrefixBlocks` lists each request's prompt as a chain of block hashes (Mooncake's
``hash_ids``: one id per 512-token block, equal ids meaning an equal prefix up to that block).
:func:`~straggler.sim.simulate` takes one aligned with its trace (``prefix_blocks=``); when the
policy reads prefix-cache data (``dynamo``), each replica then keeps an LRU cache of the blocks
of the prompts it admitted, and the router sees, per visible request and replica, the prompt
tokens already cached there (the leading blocks found, times the block size).

:func:`load_prefix_blocks` reads them from a Mooncake trace file in the order
:func:`~straggler.sim.workloads.traces.load_trace` gives its requests (arrival order, stable), so
``load_trace(path)`` and ``load_prefix_blocks(path)`` line up request by request.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from ...formulations._io import check_input_file
from ...formulations.errors import InvalidInputError, param_error
from ...formulations.validation import check_array, check_int, describe
from .traces import _read_text

__all__ = ["PrefixBlocks", "load_prefix_blocks"]

_FUNC = "PrefixBlocks"


@dataclass(frozen=True, eq=False, kw_only=True)
class PrefixBlocks:
    """Each request's prompt as a chain of block ids (CSR layout).

    Parameters
    ----------
    offsets : array of int, shape (n + 1,)
        Request ``i``'s blocks are ``ids[offsets[i]:offsets[i + 1]]`` (non-decreasing, from 0).
    ids : array of int, shape (offsets[-1],)
        Block ids ``>= 0`` (hashes of the prefix up to each block).
    block_tokens : int
        Tokens per block (Mooncake: 512).

    Examples
    --------
    >>> pb = PrefixBlocks.from_lists([[7, 8], [], [7]], block_tokens=4)
    >>> len(pb), pb.blocks(0).tolist(), pb.subset([True, False, True]).offsets.tolist()
    (3, [7, 8], [0, 2, 3])
    """

    offsets: np.ndarray
    ids: np.ndarray
    block_tokens: int = 512

    def __post_init__(self) -> None:
        off = check_array(self.offsets, "offsets", _FUNC, kind="int", ndim=1, lo=0)
        if off.size == 0 or off[0] != 0 or np.any(np.diff(off) < 0):
            raise param_error(
                "offsets", _FUNC, "a non-decreasing array starting at 0", describe(self.offsets)
            )
        ids = check_array(self.ids, "ids", _FUNC, kind="int", ndim=1, lo=0)
        if ids.size != off[-1]:
            raise param_error("ids", _FUNC, f"offsets[-1] = {int(off[-1])} ids", f"{ids.size} ids")
        bt = check_int(self.block_tokens, "block_tokens", _FUNC, lo=1, hi=2**30)
        for name, v in (("offsets", off), ("ids", ids)):
            v = np.ascontiguousarray(v, dtype=np.int64)
            v.setflags(write=False)
            object.__setattr__(self, name, v)
        object.__setattr__(self, "block_tokens", bt)

    @classmethod
    def from_lists(cls, lists, *, block_tokens: int = 512) -> PrefixBlocks:
        """From one list of block ids per request."""
        lists = [list(x) for x in lists]
        off = np.zeros(len(lists) + 1, dtype=np.int64)
        off[1:] = np.cumsum([len(x) for x in lists])
        ids = np.array([b for x in lists for b in x], dtype=np.int64)
        return cls(offsets=off, ids=ids, block_tokens=block_tokens)

    def __len__(self) -> int:
        return self.offsets.size - 1

    def blocks(self, i: int) -> np.ndarray:
        """Request ``i``'s block ids."""
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    def counts(self) -> np.ndarray:
        """Blocks per request."""
        return np.diff(self.offsets)

    def subset(self, mask) -> PrefixBlocks:
        """The requests where ``mask`` (boolean, one per request) is true, in order."""
        mask = np.asarray(mask, dtype=bool)
        keep = np.flatnonzero(mask)
        return PrefixBlocks.from_lists(
            [self.blocks(i) for i in keep], block_tokens=self.block_tokens
        )


def load_prefix_blocks(path, *, block_tokens: int = 512) -> PrefixBlocks:
    """Each request's ``hash_ids`` from a Mooncake trace file (JSON lines), in the request
    order of :func:`~straggler.sim.workloads.traces.load_trace` (timestamps sorted stably).

    A record without ``hash_ids`` has no blocks. ``block_tokens``: tokens per id (512 in the
    Mooncake FAST'25 traces). The file is read as ``load_trace`` reads it (optionally
    gzip-compressed UTF-8 text).

    Raises
    ------
    InvalidInputError
        ``path`` is not a path, or names no regular file (missing, a folder, a FIFO, ...);
        the file is not UTF-8 text; a line that is not a JSON object with a finite
        ``timestamp``, or ``hash_ids`` that is not a list of non-negative integers.
    """
    path = check_input_file(path, "path", "load_prefix_blocks")
    ts, lists = [], []
    for line, s in enumerate(_read_text(path).splitlines(), start=1):
        if not s.strip():
            continue
        try:
            d = json.loads(s)
            t = float(d["timestamp"])
        except (json.JSONDecodeError, RecursionError, KeyError, TypeError, ValueError) as e:
            raise InvalidInputError(
                f"Line {line} of {path!r} is not a Mooncake record ({type(e).__name__})."
            ) from None
        ids = d.get("hash_ids") or []
        ok = isinstance(ids, list) and all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in ids
        )
        if not ok or not math.isfinite(t):
            raise InvalidInputError(
                f"Line {line} of {path!r}: 'hash_ids' must be a list of non-negative "
                "integers and 'timestamp' finite."
            )
        ts.append(t)
        lists.append(ids)
    order = np.argsort(np.asarray(ts, dtype=float), kind="stable")
    return PrefixBlocks.from_lists([lists[i] for i in order], block_tokens=block_tokens)
