"""MILP references of the routing problem, as plain data (:class:`~.milp.MilpModel`).

* :func:`build_fscore_knapsack_milp`: Stage 2's per-replica problem, ``max F_g(Q)`` over subsets
  of a candidate set with ``|Q| <= k`` (BR-0's F or BR-H's horizon F).
* :func:`build_joint_tick_milp`: the joint one-tick problem over every replica,
  ``max sum_g D_g - G*u`` with ``u >= L_g + D_g - M``, slot limits, each request at most once;
  with ``must_place=True`` exactly ``min(n_pool, S_tot)`` requests are placed (as BR-0 and every
  baseline do), so the optimum is the least imbalance any such tick can reach.

Solve with :func:`straggler.solvers.highs.solve_milp` (models are minimized; see each builder
for the objective's meaning).
"""

from __future__ import annotations

import numpy as np

from .errors import param_error
from .milp import MilpModel, RowBuilder
from .routing import discount_vector

__all__ = ["build_fscore_knapsack_milp", "build_joint_tick_milp"]


def _lengths(x, name, func):
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or not np.all(np.isfinite(a)) or (a.size and a.min() < 0):
        raise param_error(name, func, "a 1-D array of finite non-negative numbers", f"{a!r}")
    return a


def build_fscore_knapsack_milp(
    prefill,
    margin,
    n_replicas: int,
    max_items: int,
    *,
    alpha: float = 1.0,
    beta: float | None = None,
    gamma: float = 1.0,
    nonempty: bool = True,
) -> MilpModel:
    r"""Stage 2's F-score knapsack for one replica.

    .. math::
        \max_{x \in \{0,1\}^n,\ e \ge 0}\ \alpha (1'd) \sum_i s_i x_i - \beta \sum_h d_h e_h
        \quad\text{s.t.}\quad e_h \ge \sum_i s_i x_i - m_h,\ \ \sum_i x_i \le k
        \ (\text{and } \ge 1 \text{ if nonempty})

    With a scalar margin, ``alpha = 1`` and ``beta = G`` (default) this is ``max F_g(Q)`` of
    BR-0; with a margin vector ``m_g`` (length ``H+1``) it is the horizon F-score. Since
    ``beta >= 0`` the optimum has ``e_h = (D - m_h)_+``. Minimized objective: ``-F``.

    Blocks: ``x`` (n,), ``e`` (H+1,). ``encode(indices)`` / ``decode(x) -> indices``.

    Examples
    --------
    >>> from straggler.solvers.highs import solve_milp
    >>> mdl = build_fscore_knapsack_milp([6, 2, 3], 6.0, 3, 2)
    >>> sol = solve_milp(mdl, mip_rel_gap=0)
    >>> mdl.decode(sol.x), -sol.objective
    ([0], 6.0)
    >>> mdl.objective(mdl.encode([0, 1]))  # F({6, 2}) = 8 - 3*2
    -2.0
    """
    f = "build_fscore_knapsack_milp"
    s = _lengths(prefill, "prefill", f)
    m = np.atleast_1d(np.asarray(margin, dtype=np.float64))
    if m.ndim != 1 or not np.all(np.isfinite(m)):
        raise param_error("margin", f, "a finite number or 1-D array", f"{margin!r}")
    if not isinstance(n_replicas, (int, np.integer)) or n_replicas < 1:
        raise param_error("n_replicas", f, "an integer >= 1", repr(n_replicas))
    if not isinstance(max_items, (int, np.integer)) or max_items < 0:
        raise param_error("max_items", f, "an integer >= 0", repr(max_items))
    beta = float(n_replicas) if beta is None else float(beta)
    if beta < 0:
        raise param_error("beta", f, "a number >= 0", repr(beta))
    n, H1 = s.size, m.size
    d = discount_vector(H1 - 1, gamma)
    c = np.concatenate((-alpha * d.sum() * s, beta * d))
    rb = RowBuilder(n + H1)
    # e_h - sum_i s_i x_i >= -m_h
    rows = np.concatenate((np.repeat(np.arange(H1), n), np.arange(H1)))
    cols = np.concatenate((np.tile(np.arange(n), H1), n + np.arange(H1)))
    vals = np.concatenate((np.tile(-s, H1), np.ones(H1)))
    rb.add("overflow", rows, cols, vals, -m, np.inf, n_rows=H1)
    rb.add(
        "count",
        np.zeros(n, np.int64),
        np.arange(n),
        np.ones(n),
        1.0 if nonempty else 0.0,
        float(max_items),
        n_rows=1,
    )
    A, lo, hi, row_blocks = rb.build()

    def encode(indices):
        x = np.zeros(n + H1)
        idx = np.asarray(list(indices), dtype=np.int64)
        x[idx] = 1.0
        x[n:] = np.maximum(s[idx].sum() - m, 0.0)
        return x

    def decode(x):
        return np.flatnonzero(np.asarray(x)[:n] > 0.5).tolist()

    return MilpModel(
        c=c,
        A=A,
        row_lower=lo,
        row_upper=hi,
        col_lower=np.zeros(n + H1),
        col_upper=np.concatenate((np.ones(n), np.full(H1, np.inf))),
        integrality=np.concatenate((np.ones(n, bool), np.zeros(H1, bool))),
        blocks={"x": np.arange(n), "e": n + np.arange(H1)},
        row_blocks=row_blocks,
        encode=encode,
        decode=decode,
        name="fscore_knapsack",
    )


def build_joint_tick_milp(prefill, loads, free_slots, *, must_place: bool = False) -> MilpModel:
    r"""The joint one-tick routing problem over all replicas.

    .. math::
        \max\ \sum_g D_g - G u \quad\text{s.t.}\quad u \ge L_g + D_g - M\ \forall g,\ u \ge 0,
        \ \sum_i x_{ig} \le cap_g,\ \sum_g x_{ig} \le 1,\ D_g = \sum_i s_i x_{ig}

    (``M = max_g L_g``). Since the new imbalance is ``I' = G*(M + u) - sum L - sum D``, the
    model minimizes ``-sum D + G u`` with offset ``I``, so **its objective value is the
    imbalance after the tick**. ``must_place=True`` adds ``sum x = min(n, S_tot)``.

    Blocks: ``x`` (n, G), ``u`` (1,). ``encode(assignment)`` / ``decode(x) -> assignment``
    (``-1`` = stays in the pool).

    Examples
    --------
    >>> from straggler.solvers.highs import solve_milp
    >>> mdl = build_joint_tick_milp([6, 2, 3], [10, 4, 7], [1, 2, 1], must_place=True)
    >>> sol = solve_milp(mdl, mip_rel_gap=0)
    >>> sol.objective, mdl.objective(mdl.encode([1, 0, 2]))  # BR-0 reaches the optimum here
    (4.0, 4.0)
    """
    f = "build_joint_tick_milp"
    s = _lengths(prefill, "prefill", f)
    L = _lengths(loads, "loads", f)
    cap = np.asarray(free_slots)
    if cap.shape != L.shape or (cap.size and cap.min() < 0):
        raise param_error(
            "free_slots", f, f"non-negative integers of shape {L.shape}", f"{free_slots!r}"
        )
    if L.size == 0:
        raise param_error("loads", f, "a non-empty 1-D array", "an empty array")
    n, G = s.size, L.size
    M = float(L.max())
    I0 = G * M - float(L.sum())
    nx = n * G
    ui = nx  # column of u
    xid = np.arange(nx).reshape(n, G)
    c = np.concatenate((-np.repeat(s, G), [float(G)]))
    rb = RowBuilder(nx + 1)
    # u - sum_i s_i x_ig >= L_g - M
    rows = np.concatenate((np.tile(np.arange(G), n), np.arange(G)))
    cols = np.concatenate((xid.ravel(), np.full(G, ui)))
    vals = np.concatenate((-np.repeat(s, G), np.ones(G)))
    rb.add("overflow", rows, cols, vals, L - M, np.inf, n_rows=G)
    rb.add(
        "slots",
        np.tile(np.arange(G), n),
        xid.ravel(),
        np.ones(nx),
        -np.inf,
        cap.astype(float),
        n_rows=G,
    )
    rb.add("once", np.repeat(np.arange(n), G), xid.ravel(), np.ones(nx), -np.inf, 1.0, n_rows=n)
    if must_place:
        k = float(min(n, int(cap.sum())))
        rb.add("must_place", np.zeros(nx, np.int64), np.arange(nx), np.ones(nx), k, k, n_rows=1)
    A, lo, hi, row_blocks = rb.build()

    def encode(assignment):
        a = np.asarray(assignment, dtype=np.int64)
        x = np.zeros(nx + 1)
        placed = np.flatnonzero(a >= 0)
        x[xid[placed, a[placed]]] = 1.0
        D = np.bincount(a[placed], weights=s[placed], minlength=G)
        x[ui] = max(0.0, float((L + D).max()) - M)
        return x

    def decode(x):
        X = np.asarray(x)[:nx].reshape(n, G) > 0.5
        return np.where(X.any(axis=1), X.argmax(axis=1), -1).astype(np.int64)

    return MilpModel(
        c=c,
        A=A,
        row_lower=lo,
        row_upper=hi,
        col_lower=np.zeros(nx + 1),
        col_upper=np.concatenate((np.ones(nx), [np.inf])),
        integrality=np.concatenate((np.ones(nx, bool), [False])),
        blocks={"x": xid, "u": np.array([ui])},
        row_blocks=row_blocks,
        offset=I0,
        encode=encode,
        decode=decode,
        name="joint_tick" + ("_must_place" if must_place else ""),
    )
