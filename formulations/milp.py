"""A MILP/LP as plain data, owing nothing to any solver (scipy.milp's arrays).

Builders in this package return a :class:`MilpModel`; ``straggler.solvers`` passes it to a
backend (HiGHS, or CP-SAT after integer scaling). Rows are ``row_lower <= A @ x <=
row_upper``, columns ``col_lower <= x <= col_upper``; the objective ``c @ x + offset`` is
minimized.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

__all__ = ["MilpModel", "RowBuilder"]


@dataclass(frozen=True, eq=False, kw_only=True)
class MilpModel:
    """A linear model with integrality markers and named variable blocks.

    Attributes
    ----------
    c : ndarray (n_cols,)
    A : scipy.sparse.csc_matrix (n_rows, n_cols)
    row_lower, row_upper : ndarray (n_rows,)   (``-inf``/``inf`` for one-sided rows)
    col_lower, col_upper : ndarray (n_cols,)
    integrality : ndarray of bool (n_cols,)
    blocks : dict[str, ndarray of int]
        Column indices of each named variable block (e.g. ``"x"`` of shape (E, g)).
    row_blocks : dict[str, slice]
        Row ranges of each named constraint family.
    offset : float
        Constant added to the objective.
    encode : callable
        Maps a problem-level solution (e.g. a shares matrix) to a full column vector.
    decode : callable
        Maps a column vector back to the problem-level solution.
    name : str
    """

    c: np.ndarray
    A: sp.csc_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray
    col_lower: np.ndarray
    col_upper: np.ndarray
    integrality: np.ndarray
    blocks: dict = field(default_factory=dict)
    row_blocks: dict = field(default_factory=dict)
    offset: float = 0.0
    encode: Callable | None = None
    decode: Callable | None = None
    name: str = "model"

    @property
    def n_cols(self) -> int:
        return int(self.c.shape[0])

    @property
    def n_rows(self) -> int:
        return int(self.A.shape[0])

    @property
    def is_mip(self) -> bool:
        return bool(np.any(self.integrality))

    def objective(self, x) -> float:
        """``c @ x + offset``."""
        return float(self.c @ np.asarray(x, dtype=float) + self.offset)

    def violation(self, x) -> float:
        """Largest violation of any row, bound or integrality by the column vector ``x``."""
        x = np.asarray(x, dtype=float)
        ax = self.A @ x
        v = [
            np.max(self.row_lower - ax, initial=0.0),
            np.max(ax - self.row_upper, initial=0.0),
            np.max(self.col_lower - x, initial=0.0),
            np.max(x - self.col_upper, initial=0.0),
        ]
        if self.is_mip:
            xi = x[self.integrality]
            v.append(np.max(np.abs(xi - np.round(xi)), initial=0.0))
        return float(max(v))


class RowBuilder:
    """Collect constraint rows from vectorized index arithmetic, then emit one CSC matrix.

    Each :meth:`add` takes parallel arrays ``(row_offsets, cols, vals)`` for a family of
    rows, with ``row_offsets`` local to the family (0-based), and the family's bounds.

    Examples
    --------
    >>> rb = RowBuilder(n_cols=3)
    >>> rb.add("sum", np.array([0, 0, 0]), np.array([0, 1, 2]), np.ones(3), 1.0, 1.0)
    slice(0, 1, None)
    >>> A, lo, hi, blocks = rb.build()
    >>> A.toarray().tolist(), lo.tolist(), hi.tolist()
    ([[1.0, 1.0, 1.0]], [1.0], [1.0])
    """

    def __init__(self, n_cols: int) -> None:
        self.n_cols = n_cols
        self._r: list[np.ndarray] = []
        self._c: list[np.ndarray] = []
        self._v: list[np.ndarray] = []
        self._lo: list[np.ndarray] = []
        self._hi: list[np.ndarray] = []
        self._blocks: dict[str, slice] = {}
        self.n_rows = 0

    def add(self, name, rows, cols, vals, lower, upper, n_rows: int | None = None) -> slice:
        rows = np.asarray(rows, dtype=np.int64)
        k = int(n_rows if n_rows is not None else (rows.max() + 1 if rows.size else 0))
        self._r.append(rows + self.n_rows)
        self._c.append(np.asarray(cols, dtype=np.int64))
        self._v.append(np.asarray(vals, dtype=float))
        self._lo.append(np.broadcast_to(np.asarray(lower, dtype=float), (k,)))
        self._hi.append(np.broadcast_to(np.asarray(upper, dtype=float), (k,)))
        sl = slice(self.n_rows, self.n_rows + k)
        self._blocks[name] = sl
        self.n_rows += k
        return sl

    def build(self):
        if self._r:
            r, c, v = (np.concatenate(a) for a in (self._r, self._c, self._v))
            lo, hi = np.concatenate(self._lo), np.concatenate(self._hi)
        else:
            r = c = np.zeros(0, np.int64)
            v = lo = hi = np.zeros(0)
        A = sp.csc_matrix((v, (r, c)), shape=(self.n_rows, self.n_cols))
        A.sum_duplicates()
        return A, lo.copy(), hi.copy(), dict(self._blocks)
