"""Problem 1 as a MILP (TEMPO §3.1, Appendix A) and the token LP (Lemma 1), as plain data.

:func:`build_dispatch_milp` states the fixed-charge makespan problem of one layer exactly;
:func:`build_token_lp` states LPLB's objective ``min max_g N_g``. Both return a
:class:`~straggler.formulations.MilpModel` with ``encode(shares) -> x`` and
``decode(x) -> shares``; no solver is imported here.
"""

from __future__ import annotations

import math

import numpy as np

from .cost import CostModel
from .dispatch import DispatchProblem, basic_lower_bound
from .errors import param_error
from .milp import MilpModel, RowBuilder
from .validation import check_array, check_bool, check_real, check_type

__all__ = ["build_dispatch_milp", "build_token_lp", "live_pairs", "token_cap"]

#: Relative slack added to an upper bound before rows are derived from it, so a dispatch
#: whose makespan equals the bound up to rounding still satisfies them.
UB_RTOL = 1e-9


def _builder_iv(problem, cost, func: str, *, cost_optional: bool = False) -> None:
    """A model builder takes one layer (a single-layer :class:`DispatchProblem`) and a
    :class:`CostModel` (or None where the objective ignores it)."""
    check_type(problem, "problem", func, DispatchProblem, "a single-layer DispatchProblem")
    if problem.is_stack:
        raise param_error(
            "problem", func, "a single-layer DispatchProblem", f"a stack of {problem.n_layers}"
        )
    if cost is not None or not cost_optional:
        expected = "a CostModel or None" if cost_optional else "a CostModel"
        check_type(cost, "cost", func, CostModel, expected)


def _shares_iv(shares, problem, func: str) -> np.ndarray:
    want = (problem.n_experts, problem.n_gpus)
    return check_array(
        shares, "shares", func, ndim=2, shape=want, expected=f"an array of shape {want} of "
        "finite numbers",
    )  # fmt: skip


def live_pairs(problem: DispatchProblem):
    """``(expert, gpu)`` index arrays of the replica entries that may carry tokens.

    An entry is live when ``replicas[e, g]`` holds and ``n[e] > 0``; entries are listed in
    row-major order (by expert, then GPU).

    Examples
    --------
    >>> p = DispatchProblem(counts=[3, 0, 2], replicas=[[1, 1], [1, 0], [0, 1]])
    >>> [a.tolist() for a in live_pairs(p)]
    [[0, 0, 2], [0, 1, 1]]
    """
    live = problem.replicas & (problem.counts > 0)[:, None]
    e, g = np.nonzero(live)
    return e.astype(np.int64), g.astype(np.int64)


def token_cap(cost: CostModel, upper_bound: float) -> float:
    """Most tokens any GPU can hold in a dispatch of makespan ``<= upper_bound``.

    Every token piece gives ``c + beta*N_g <= t_g <= upper_bound``, so
    ``N_g <= (upper_bound - c) / beta`` for each piece with a positive slope (inf if none).

    Examples
    --------
    >>> token_cap(CostModel(a=0, b=15, c=0, beta=0.1), 60.0) > 600.0
    True
    """
    ub = upper_bound * (1 + UB_RTOL) + UB_RTOL
    cap = math.inf
    for c0, slope in cost.token_pieces:
        if slope > 0:
            cap = min(cap, (ub - c0) / slope)
    return max(cap, 0.0)


def _decode_shares(problem, e_idx, g_idx, xs, zs=None, caps=None) -> np.ndarray:
    """Clean a column slice into a feasible shares matrix.

    Entries with ``z < 1/2`` or ``|x| < 1e-9 * n_e`` become 0, negatives 0; each expert's
    row is then made to conserve exactly: scaled down when it sums above ``n_e``, topped up
    (within ``caps``, e.g. the tile capacity ``tile * t``, so no tile count grows) when below.
    """
    n = problem.counts.astype(float)
    xs = np.array(xs, dtype=float)
    ne = n[e_idx]
    xs[(xs < 1e-9 * ne) | ~np.isfinite(xs)] = 0.0
    if zs is not None:
        xs[np.asarray(zs) < 0.5] = 0.0
    if caps is not None:
        xs = np.minimum(xs, caps)
    out = np.zeros((problem.n_experts, problem.n_gpus))
    out[e_idx, g_idx] = xs
    for e in np.flatnonzero(n > 0):
        row = out[e]
        s = row.sum()
        if s > n[e]:
            row *= n[e] / s
        elif s < n[e]:
            k = np.flatnonzero(e_idx == e)
            if s <= 0:
                # nothing survived: the whole expert on its first replica
                row[:] = 0.0
                row[g_idx[k[0]]] = n[e]
                continue
            deficit = n[e] - s
            if caps is not None:
                room = np.maximum(caps[k] - xs[k], 0.0) * (xs[k] > 0)
                for j in np.argsort(-room, kind="stable"):
                    add = min(room[j], deficit)
                    row[g_idx[k[j]]] += add
                    deficit -= add
                    if deficit <= 0:
                        break
            if deficit > 0:
                row *= (n[e]) / row.sum()
        # the scaling above leaves conservation within one ulp per entry; put the rest on
        # the largest entry
        row[np.argmax(row)] += n[e] - row.sum()
    return out + 0.0  # no negative zeros


def build_dispatch_milp(
    problem: DispatchProblem,
    cost: CostModel,
    *,
    tightened: bool = True,
    upper_bound: float | None = None,
) -> MilpModel:
    """The fixed-charge makespan problem of one layer as a MILP.

    .. math::

        \\min M \\quad\\text{s.t.}\\quad
        \\sum_g x_{eg} = n_e,\\;
        x_{eg} \\le U_{eg} z_{eg},\\;
        M \\ge a + b \\sum_e z_{eg} + b_2 \\sum_e (t_{eg} - z_{eg}),\\;
        M \\ge c + \\beta N_g,\\; M \\ge c_2 + \\gamma N_g

    with ``x >= 0`` continuous, ``z`` binary and, when ``b2 > 0``, integer tile counts
    ``t`` with ``x <= tile*t``, ``t >= z``, ``t <= ceil(U/tile)*z``.

    Parameters
    ----------
    problem : DispatchProblem
        One layer.
    cost : CostModel
    tightened : bool, default True
        ``False`` gives the plain big-M model (``U = n_e``, nothing else). ``True`` adds the
        rows of the Notes.
    upper_bound : float, optional
        The makespan of a known dispatch (only used when ``tightened``): rows derived from it
        keep every dispatch of makespan ``<= upper_bound``, hence every optimum.

    Returns
    -------
    MilpModel
        Blocks ``"x"``, ``"z"`` (one column per live entry, see ``live_pairs``), ``"t"``
        (when ``b2 > 0``), ``"K"`` and, with tiles, ``"X"`` (tightened: one per GPU) and
        ``"M"``. ``encode(shares)``
        gives the column vector of a feasible dispatch (for the tightened model with an
        ``upper_bound``, of one whose makespan is at most that bound), with ``z = [x > 0]``,
        ``t = ceil(x/tile)``, ``K_g = G_g`` and ``M`` its makespan; ``decode(x)`` gives a clean
        feasible shares matrix ``(n_experts, n_gpus)``.

    Notes
    -----
    **Big-M.** Every share satisfies ``x_eg <= n_e`` by conservation and ``x >= 0``, so
    ``U_eg = n_e`` never cuts a dispatch: with ``z = [x > 0]``, ``x <= n_e z`` holds. With
    an ``upper_bound`` UB, any dispatch of makespan ``<= UB`` has ``c + beta N_g <= UB`` on
    every GPU, so ``x_eg <= N_g <= (UB - c)/beta`` (and ``(UB - c2)/gamma``), see
    ``token_cap``; ``U_eg = min(n_e, cap)`` keeps every such dispatch, in particular
    every optimum (whose makespan is ``<= UB``).

    **Tightened rows**, each valid for every feasible dispatch with ``z = [x > 0]``,
    ``K_g = G_g`` (or, where marked, for every dispatch of makespan ``<= UB``):

    * integer activation counts ``K_g >= sum_e z_eg`` with ``M >= a + b K_g + b2 sum(t - z)``:
      the LP relaxation can no longer spread a fraction of an activation over GPUs, and
      branching on ``K_g`` decides whole activations at once (``K_g = G_g`` is feasible);
    * integer extra tiles per GPU ``X_g >= sum_e (t_eg - z_eg)`` with
      ``M >= a + b K_g + b2 X_g`` when ``b2 > 0`` (``X_g = T_g - G_g`` is feasible);
    * tile total ``sum_g t_eg >= ceil(n_e/tile)`` per live expert when ``b2 > 0``
      (``n_e = sum_g x_eg <= tile * sum_g t_eg`` and the left side is an integer);
    * cover ``sum_g z_eg >= 1`` per live expert (``n_e > 0`` and conservation force one
      positive share) and ``sum_g K_g >= E_live`` (sum of the covers);
    * forced entries: an expert with one replica has ``x = n_e``, ``z = 1``,
      ``t = ceil(n_e/tile)`` (column bounds);
    * ``M >= basic_lower_bound`` (column bound; every makespan is at least the optimum,
      which is at least that bound); with UB, ``M <= UB`` and
      ``K_g <= floor((UB - a)/b)`` (from ``a + b G_g <= t_g <= UB``);
    * symmetry: GPUs with identical live replica columns are interchangeable (swapping
      their whole loads keeps feasibility and every ``t_g``), so some optimum has their
      ``K`` non-increasing in GPU order; the rows ``K_g >= K_g'`` for consecutive GPUs of
      one such class keep it. ``encode`` relabels such GPUs (stable sort by decreasing
      ``G_g``) before encoding, which leaves the makespan unchanged.

    References
    ----------
    TEMPO §3.1 (problem), Appendix A (MILP), Eq. (1), (2), (4).

    Examples
    --------
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> m = build_dispatch_milp(p, CostModel(a=0, b=15, c=0, beta=0.1))
    >>> x = np.zeros((7, 2)); x[0] = [300, 300]; x[1:4, 0] = 30; x[4:, 1] = 30
    >>> v = m.encode(x); m.objective(v), m.violation(v)
    (60.0, 0.0)
    >>> bool(np.allclose(m.decode(v).sum(axis=1), p.counts))
    True
    """
    func = "build_dispatch_milp"
    _builder_iv(problem, cost, func)
    tightened = check_bool(tightened, "tightened", func)
    if upper_bound is not None:
        upper_bound = check_real(upper_bound, "upper_bound", func)
    use_ub = bool(tightened and upper_bound is not None)
    n = problem.counts.astype(float)
    n_gpus = problem.n_gpus
    e_idx, g_idx = live_pairs(problem)
    P = e_idx.size
    live_e = np.flatnonzero(n > 0)
    tiles = cost.has_tiles
    tile = float(cost.tile)

    U = n[e_idx].copy()
    if use_ub:
        U = np.minimum(U, token_cap(cost, float(upper_bound)))
    kmax = np.ceil(U / tile - 1e-12) if tiles else None

    cols, n_cols = _milp_columns(P, n_gpus, tiles, tightened)
    xc, zc, Mc = cols["x"], cols["z"], int(cols["M"][0])

    col_lo = np.zeros(n_cols)
    col_hi = np.full(n_cols, np.inf)
    integ = np.zeros(n_cols, bool)
    col_hi[xc] = U
    col_hi[zc] = 1.0
    integ[zc] = True
    if tiles:
        col_hi[cols["t"]] = kmax
        integ[cols["t"]] = True
    col_lo[Mc] = -np.inf

    rb = RowBuilder(n_cols)
    # conservation: sum_g x[e, g] = n_e for each live expert
    pos = np.searchsorted(live_e, e_idx)
    rb.add("conservation", pos, xc, np.ones(P), n[live_e], n[live_e], n_rows=live_e.size)
    # linking: x - U z <= 0
    r = np.arange(P)
    rb.add("link", np.r_[r, r], np.r_[xc, zc], np.r_[np.ones(P), -U], -np.inf, 0.0, n_rows=P)
    if tiles:
        tc = cols["t"]
        rb.add(
            "tile_cover",
            np.r_[r, r],
            np.r_[xc, tc],
            np.r_[np.ones(P), -tile * np.ones(P)],
            -np.inf,
            0.0,
            n_rows=P,
        )
        rb.add(
            "tile_active",
            np.r_[r, r],
            np.r_[tc, zc],
            np.r_[np.ones(P), -np.ones(P)],
            0.0,
            np.inf,
            n_rows=P,
        )
        rb.add(
            "tile_cap",
            np.r_[r, r],
            np.r_[tc, zc],
            np.r_[np.ones(P), -kmax],
            -np.inf,
            0.0,
            n_rows=P,
        )
    _makespan_rows(rb, cost, cols, g_idx, n_gpus, integ)

    bounds = (col_lo, col_hi, integ)
    if tightened:
        sym_prev = _tightened_rows(rb, problem, cost, cols, bounds, U, kmax, upper_bound)
    else:
        sym_prev = np.zeros(0, np.int64)

    A, row_lo, row_hi, row_blocks = rb.build()
    c = np.zeros(n_cols)
    c[Mc] = 1.0
    classes = _symmetry_classes(problem.replicas & (n > 0)[:, None]) if sym_prev.size else None

    encode, decode = _milp_codec(problem, cost, cols, n_cols, classes)
    return MilpModel(
        c=c,
        A=A,
        row_lower=row_lo,
        row_upper=row_hi,
        col_lower=col_lo,
        col_upper=col_hi,
        integrality=integ,
        blocks=cols,
        row_blocks=row_blocks,
        encode=encode,
        decode=decode,
        name="dispatch_milp_tightened" if tightened else "dispatch_milp_naive",
    )


def _milp_columns(P: int, n_gpus: int, tiles: bool, tightened: bool) -> tuple[dict, int]:
    """The column layout ``x | z | t | K | X | M`` of :func:`build_dispatch_milp`: ``x``,
    ``z`` (and ``t`` with tiles) one per live entry, ``K`` (and ``X`` with tiles) one per GPU
    in the tightened model, then ``M``; and the number of columns."""
    cols = {"x": np.arange(P)}
    cols["z"] = P + np.arange(P)
    nxt = 2 * P
    if tiles:
        cols["t"] = nxt + np.arange(P)
        nxt += P
    if tightened:
        cols["K"] = nxt + np.arange(n_gpus)
        nxt += n_gpus
        if tiles:
            cols["X"] = nxt + np.arange(n_gpus)
            nxt += n_gpus
    cols["M"] = np.array([nxt])
    return cols, nxt + 1


def _makespan_rows(rb, cost, cols, g_idx, n_gpus: int, integ) -> None:
    """The rows that bound the makespan ``M`` from below on every GPU (TEMPO Eq. (1)-(2)):
    the activation floor ``M >= a + b K_g + b2 (extra tiles)`` (the tightened model counts
    activations in ``K`` and, with tiles, extra tiles in the integer ``X``, marked in
    ``integ``; the plain model sums ``z`` and ``t - z``) and one row per token piece
    ``M >= c + beta N_g``, added to ``rb``."""
    P = g_idx.size
    tiles = cost.has_tiles
    tightened = "K" in cols
    xc, zc, Mc = cols["x"], cols["z"], int(cols["M"][0])
    gr = np.arange(n_gpus)
    # activation floor per GPU: M - b*(count) - b2*sum(t - z) >= a
    if tightened:
        Kc = cols["K"]
        rb.add(
            "count",
            np.r_[g_idx, gr],
            np.r_[zc, Kc],
            np.r_[np.ones(P), -np.ones(n_gpus)],
            -np.inf,
            0.0,
            n_rows=n_gpus,
        )
        rows, cc, vv = (
            [gr, gr],
            [np.full(n_gpus, Mc), Kc],
            [np.ones(n_gpus), -cost.b * np.ones(n_gpus)],
        )
    else:
        rows, cc, vv = (
            [gr, g_idx],
            [np.full(n_gpus, Mc), zc],
            [np.ones(n_gpus), -cost.b * np.ones(P)],
        )
    if tiles and tightened:
        # integer extra tiles per GPU: X_g >= sum_e (t - z), M >= ... + b2 X_g
        Xc = cols["X"]
        rb.add(
            "extra_tiles",
            np.r_[g_idx, g_idx, gr],
            np.r_[cols["t"], zc, Xc],
            np.r_[np.ones(P), -np.ones(P), -np.ones(n_gpus)],
            -np.inf,
            0.0,
            n_rows=n_gpus,
        )
        integ[Xc] = True
        rows += [gr]
        cc += [Xc]
        vv += [-cost.b2 * np.ones(n_gpus)]
    elif tiles:
        rows += [g_idx, g_idx]
        cc += [cols["t"], zc]
        vv += [-cost.b2 * np.ones(P), cost.b2 * np.ones(P)]
    rb.add(
        "activation",
        np.concatenate(rows),
        np.concatenate(cc),
        np.concatenate(vv),
        cost.a,
        np.inf,
        n_rows=n_gpus,
    )
    # token pieces per GPU: M - slope * sum_e x >= intercept
    for name, (c0, slope) in zip(("tokens", "traffic"), cost.token_pieces):
        rb.add(
            name,
            np.r_[gr, g_idx],
            np.r_[np.full(n_gpus, Mc), xc],
            np.r_[np.ones(n_gpus), -slope * np.ones(P)],
            c0,
            np.inf,
            n_rows=n_gpus,
        )


def _tightened_rows(rb, problem, cost, cols, bounds, U, kmax, upper_bound) -> np.ndarray:
    """The tightened model's rows and column bounds (:func:`build_dispatch_milp`'s Notes, in
    their order: cover and activation total, tile total, forced entries, the bounds on ``M``
    and ``K``, symmetry), added to ``rb`` and to ``bounds = (col_lo, col_hi, integ)`` in
    place. Returns the first GPU of each symmetry row (empty: no symmetry class)."""
    col_lo, col_hi, integ = bounds
    n = problem.counts.astype(float)
    n_gpus = problem.n_gpus
    e_idx, g_idx = live_pairs(problem)
    P = e_idx.size
    live_e = np.flatnonzero(n > 0)
    pos = np.searchsorted(live_e, e_idx)
    tiles = cost.has_tiles
    tile = float(cost.tile)
    use_ub = upper_bound is not None
    xc, zc, Mc = cols["x"], cols["z"], int(cols["M"][0])
    Kc = cols["K"]
    rb.add("cover", pos, zc, np.ones(P), 1.0, np.inf, n_rows=live_e.size)
    rb.add("count_total", np.zeros(n_gpus), Kc, np.ones(n_gpus), live_e.size, np.inf, n_rows=1)
    if tiles:
        # every expert needs ceil(n_e/tile) tiles in all (rounded CG cut of conservation)
        rb.add(
            "tile_total",
            pos,
            cols["t"],
            np.ones(P),
            np.ceil(n[live_e] / tile - 1e-12),
            np.inf,
            n_rows=live_e.size,
        )
    # forced entries (experts with a single live replica)
    n_rep = np.bincount(e_idx, minlength=problem.n_experts)
    forced = n_rep[e_idx] == 1
    col_lo[xc[forced]] = U[forced]
    col_lo[zc[forced]] = 1.0
    if tiles:
        col_lo[cols["t"][forced]] = kmax[forced]
    per_gpu = np.bincount(g_idx, minlength=n_gpus).astype(float)
    kcap = per_gpu
    col_lo[Mc] = float(basic_lower_bound(problem, cost)) * (1 - 1e-12)
    if use_ub:
        ub = float(upper_bound) * (1 + UB_RTOL) + UB_RTOL
        col_hi[Mc] = ub
        if cost.b > 0:
            kcap = np.minimum(kcap, math.floor((ub - cost.a) / cost.b + 1e-9))
    col_hi[Kc] = np.maximum(kcap, 0.0)
    integ[Kc] = True
    # symmetry classes: GPUs with identical live replica columns
    live_mask = problem.replicas & (n > 0)[:, None]
    sym_prev, sym_next = _symmetry_pairs(live_mask)
    if sym_prev.size:
        k = sym_prev.size
        rr = np.arange(k)
        rb.add(
            "symmetry",
            np.r_[rr, rr],
            np.r_[Kc[sym_prev], Kc[sym_next]],
            np.r_[np.ones(k), -np.ones(k)],
            0.0,
            np.inf,
            n_rows=k,
        )
    return sym_prev


def _milp_codec(problem, cost, cols, n_cols: int, classes):
    """``(encode, decode)`` of :func:`build_dispatch_milp`'s model: ``encode(shares)`` the
    column vector of a feasible dispatch (GPUs of one symmetry class of ``classes``
    relabelled first, see the Notes), ``decode(x)`` a clean feasible shares matrix."""
    e_idx, g_idx = live_pairs(problem)
    n_gpus = problem.n_gpus
    tiles = cost.has_tiles
    tile = float(cost.tile)
    tightened = "K" in cols
    xc, zc, Mc = cols["x"], cols["z"], int(cols["M"][0])

    def encode(shares) -> np.ndarray:
        s = _shares_iv(shares, problem, "encode")
        if classes is not None:
            s = _canonical_order(s, classes)
        v = np.zeros(n_cols)
        xs = s[e_idx, g_idx]
        zs = (xs > 0).astype(float)
        v[xc] = xs
        v[zc] = zs
        G = np.bincount(g_idx, weights=zs, minlength=n_gpus)
        Ng = np.bincount(g_idx, weights=xs, minlength=n_gpus)
        floor = cost.a + cost.b * G
        if tiles:
            ts = np.where(xs > 0, np.maximum(1.0, np.ceil((xs - 1e-7) / tile)), 0.0)
            v[cols["t"]] = ts
            floor = floor + cost.b2 * np.bincount(g_idx, weights=ts - zs, minlength=n_gpus)
        if tightened:
            v[cols["K"]] = G
            if tiles:
                v[cols["X"]] = np.bincount(g_idx, weights=ts - zs, minlength=n_gpus)
        pieces = [floor] + [c0 + slope * Ng for c0, slope in cost.token_pieces]
        v[Mc] = float(np.max(np.maximum.reduce(pieces)))
        return v

    def decode(v) -> np.ndarray:
        v = np.asarray(v, dtype=float)
        caps = tile * np.round(v[cols["t"]]) if tiles else None
        return _decode_shares(problem, e_idx, g_idx, v[xc], v[zc], caps)

    return encode, decode


def _symmetry_classes(live_mask: np.ndarray) -> list[np.ndarray]:
    """GPUs grouped by identical live replica columns (classes of size >= 2, GPU order)."""
    cols = np.ascontiguousarray(live_mask.T)
    _, inv = np.unique(cols, axis=0, return_inverse=True)
    inv = np.asarray(inv).ravel()
    out = []
    for k in np.unique(inv):
        members = np.flatnonzero(inv == k)
        if members.size >= 2:
            out.append(members)
    return out


def _symmetry_pairs(live_mask: np.ndarray):
    """Consecutive GPU pairs ``(g, g')`` of each symmetry class."""
    prev, nxt = [], []
    for members in _symmetry_classes(live_mask):
        prev.extend(members[:-1])
        nxt.extend(members[1:])
    return np.asarray(prev, np.int64), np.asarray(nxt, np.int64)


def _canonical_order(shares: np.ndarray, classes) -> np.ndarray:
    """Relabel GPUs within each symmetry class so activations are non-increasing."""
    s = shares.copy()
    G = (shares > 0).sum(axis=0)
    for members in classes:
        order = members[np.argsort(-G[members], kind="stable")]
        s[:, members] = shares[:, order]
    return s


def build_token_lp(problem: DispatchProblem, cost: CostModel | None = None) -> MilpModel:
    """Lemma 1 (LPLB's objective): ``min max_g N_g`` over feasible dispatches, an LP.

    .. math::

        \\min T \\quad\\text{s.t.}\\quad \\sum_g x_{eg} = n_e,\\; T \\ge \\sum_e x_{eg},\\;
        x \\ge 0 \\text{ on live replica entries}

    Parameters
    ----------
    problem : DispatchProblem
        One layer.
    cost : CostModel, optional
        Unused by the objective (tokens only); accepted so every builder has one signature.

    Returns
    -------
    MilpModel
        Blocks ``"x"`` (live entries, see ``live_pairs``) and ``"T"``; ``encode(shares)``
        sets ``T = max_g N_g``; ``decode`` snaps ``|x| < 1e-9 n_e`` to 0 and restores
        conservation exactly.

    Examples
    --------
    >>> p = DispatchProblem(counts=[6, 2], replicas=[[1, 1], [1, 0]])
    >>> m = build_token_lp(p)
    >>> m.objective(m.encode(np.array([[2.0, 4.0], [2.0, 0.0]])))
    4.0
    """
    func = "build_token_lp"
    _builder_iv(problem, cost, func, cost_optional=True)
    n = problem.counts.astype(float)
    n_gpus = problem.n_gpus
    e_idx, g_idx = live_pairs(problem)
    P = e_idx.size
    live_e = np.flatnonzero(n > 0)
    Tc = P
    n_cols = P + 1
    rb = RowBuilder(n_cols)
    pos = np.searchsorted(live_e, e_idx)
    rb.add("conservation", pos, np.arange(P), np.ones(P), n[live_e], n[live_e], n_rows=live_e.size)
    gr = np.arange(n_gpus)
    rb.add(
        "balance",
        np.r_[gr, g_idx],
        np.r_[np.full(n_gpus, Tc), np.arange(P)],
        np.r_[np.ones(n_gpus), -np.ones(P)],
        0.0,
        np.inf,
        n_rows=n_gpus,
    )
    A, lo, hi, row_blocks = rb.build()
    c = np.zeros(n_cols)
    c[Tc] = 1.0
    col_hi = np.r_[n[e_idx], np.inf]

    def encode(shares) -> np.ndarray:
        s = _shares_iv(shares, problem, "encode")
        xs = s[e_idx, g_idx]
        return np.r_[xs, np.bincount(g_idx, weights=xs, minlength=n_gpus).max(initial=0.0)]

    def decode(v) -> np.ndarray:
        return _decode_shares(problem, e_idx, g_idx, np.asarray(v, dtype=float)[:P])

    return MilpModel(
        c=c,
        A=A,
        row_lower=lo,
        row_upper=hi,
        col_lower=np.zeros(n_cols),
        col_upper=col_hi,
        integrality=np.zeros(n_cols, bool),
        blocks={"x": np.arange(P), "T": np.array([Tc])},
        row_blocks=row_blocks,
        encode=encode,
        decode=decode,
        name="token_lp",
    )
