"""Calibration: fit the max-affine cost model to logged ``(G, N, t)`` (TEMPO §4.1, App. B).

The deployed pipeline (or its microbenchmark) is run over a grid of activated experts
``G`` and tokens ``N`` per GPU, each measured time ``t`` logged; :func:`fit_cost_model`
fits

.. math::

    t = \\max(a + b G + b_2 (T - G),\\; c + \\beta N\\; [,\\; c_2 + \\gamma N])

by **alternating assignment** (App. B): each sample is assigned to the piece that attains
the max, each piece is refit by least squares on its samples, repeat until the assignment
is stable (at most ``max_iter = 50`` rounds), from several starts; the best fit is kept.
``b2`` (the tile staircase of Eq. 2) is fitted when the tile counts ``T`` are given, the
third piece (Eq. 4's form) with ``pieces=3``. Bootstrap replicates (samples drawn with
replacement, refit) give percentile intervals for every parameter; the paper's
identifiability warning (§5.2: ``a`` and ``b`` lie on one ridge when the log covers few
``G``) shows up as wide intervals, not as a confident wrong answer.

:func:`read_calibration_log` / :func:`write_calibration_log` read and write the CSV log
(``benchmarks/calibrate_gpu.py`` writes it); :meth:`CalibrationResult.save` writes the fit
``straggler-plan --calibration`` reads.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from ...formulations._io import atomic_open, check_input_file, check_path_arg, utf8_problem
from ...formulations.cost import MAX_TILE, CostModel
from ...formulations.errors import InvalidInputError, param_error
from ...formulations.validation import check_array, check_choice, check_int, check_real, check_rng

__all__ = [
    "CalibrationResult",
    "fit_cost_model",
    "read_calibration_log",
    "write_calibration_log",
    "PIECE_NAMES",
]

#: Names of the pieces, in the order of ``CalibrationResult.piece``.
PIECE_NAMES = ("activation", "compute", "traffic")
_FUNC = "fit_cost_model"
#: Relative tolerance under which two pieces' predictions count as a tie (lower piece wins).
_TIE_RTOL = 1e-12


@dataclass(frozen=True, eq=False, kw_only=True)
class CalibrationResult:
    """A fitted cost model and how well the log determines it.

    Attributes
    ----------
    cost : CostModel
        The fit (``b2 = 0`` without tiles, no traffic piece with ``pieces=2``).
    params : dict of str to float
        The fitted parameters by name: ``a, b, [b2], c, beta, [c2, gamma]``.
    intervals : dict of str to (float, float)
        Bootstrap percentile interval of each parameter at ``level`` (``(nan, nan)``
        without bootstrap).
    level : float
        Coverage of the intervals (0.95 by default).
    rel_rms, max_rel_error : float
        ``sqrt(mean(((t_hat - t) / t)^2))`` and ``max |t_hat - t| / t`` of the fit.
    n_star : float
        Inflection tokens per expert ``b / beta`` (``inf`` when ``beta = 0``).
    piece : ndarray of int, shape (n_samples,)
        Piece attaining the max for each sample: 0 activation, 1 compute, 2 traffic
        (ties to the lower index).
    bootstrap_params : ndarray, shape (n_bootstrap, n_params)
        The replicates' parameters, columns in the order of ``params``.
    iterations : int
        Alternating-assignment rounds of the kept fit.
    converged : bool
        Whether the kept fit's assignment stopped changing before ``max_iter``.
    pieces, tile : int
    meta : dict
        Free-form provenance (GPU, dtype, expert shape), saved with the fit.
    """

    cost: CostModel
    params: dict
    intervals: dict
    level: float
    rel_rms: float
    max_rel_error: float
    n_star: float
    piece: np.ndarray
    bootstrap_params: np.ndarray
    iterations: int
    converged: bool
    pieces: int
    tile: int
    meta: dict = field(default_factory=dict)

    @property
    def n_samples(self) -> int:
        """Number of logged samples fitted."""
        return int(self.piece.size)

    def to_dict(self) -> dict:
        """A JSON-ready dict (what :meth:`save` writes; :meth:`from_dict` reads it back)."""
        return {
            "format": "straggler-calibration",
            "version": 1,
            "cost": {
                k: v
                for k, v in dict(
                    a=self.cost.a,
                    b=self.cost.b,
                    c=self.cost.c,
                    beta=self.cost.beta,
                    b2=self.cost.b2,
                    tile=self.cost.tile,
                    c2=self.cost.c2,
                    gamma=self.cost.gamma,
                ).items()
                if v is not None
            },
            "params": dict(self.params),
            "intervals": {k: list(v) for k, v in self.intervals.items()},
            "level": self.level,
            "rel_rms": self.rel_rms,
            "max_rel_error": self.max_rel_error,
            "n_star": self.n_star if math.isfinite(self.n_star) else None,
            "piece": self.piece.tolist(),
            "bootstrap_params": self.bootstrap_params.tolist(),
            "iterations": self.iterations,
            "converged": self.converged,
            "pieces": self.pieces,
            "tile": self.tile,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: dict, *, source: str = "the calibration") -> CalibrationResult:
        """Rebuild a result from :meth:`to_dict`'s output (raises on a malformed one, naming
        the field)."""
        if not isinstance(d, dict):
            raise InvalidInputError(
                f"{source} must hold a JSON object (what CalibrationResult.save writes). Got "
                f"{type(d).__name__} instead."
            )
        field = "format"

        def get(name):
            nonlocal field
            field = name
            return d[name]

        try:
            if get("format") != "straggler-calibration":
                raise ValueError
            cost = CostModel(**get("cost"))
            params = {str(k): float(v) for k, v in get("params").items()}
            intervals = {str(k): (float(v[0]), float(v[1])) for k, v in get("intervals").items()}
            n_params = len(params)
            boot = np.asarray(get("bootstrap_params"), dtype=float).reshape(-1, n_params)
            return cls(
                cost=cost,
                params=params,
                intervals=intervals,
                level=float(get("level")),
                rel_rms=float(get("rel_rms")),
                max_rel_error=float(get("max_rel_error")),
                n_star=math.inf if get("n_star") is None else float(d["n_star"]),
                piece=np.asarray(get("piece"), dtype=np.int64),
                bootstrap_params=boot,
                iterations=int(get("iterations")),
                converged=bool(get("converged")),
                pieces=int(get("pieces")),
                tile=int(get("tile")),
                meta=dict(d.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            got = "nothing" if isinstance(exc, KeyError) else repr(d.get(field))[:60]
            raise InvalidInputError(
                f"The '{field}' field of {source} must be what CalibrationResult.save writes "
                f"(a straggler calibration). Got {got} instead."
            ) from None

    def save(self, path) -> None:
        """Write the fit as JSON (read back by :meth:`load` and ``straggler-plan``).

        Only what :meth:`load` gives back as written is written: the JSON is read back
        through :meth:`from_dict` first, and a result it refuses, or gives back otherwise
        (``iterations=2.5`` read as 2, a ``bootstrap_params`` of the wrong width), is refused
        naming the field, before anything is written; so is ``meta`` that JSON does not give
        back as given (a tuple read as a list, an int key read as a string)."""
        func = "CalibrationResult.save"
        path = check_path_arg(path, "path", func)
        try:
            d = self.to_dict() | {"meta": _meta_iv(self.meta, func)}
            text = json.dumps(d, indent=1)
        except InvalidInputError:
            raise
        except (AttributeError, TypeError, ValueError, RecursionError) as exc:
            raise InvalidInputError(
                f"{func} writes the fields fit_cost_model gives, as JSON. Got a field that is "
                f"not one ({type(exc).__name__}: {str(exc)[:120]})."
            ) from None
        try:
            back = type(self).from_dict(json.loads(text), source="the result to save")
        except InvalidInputError as exc:
            raise InvalidInputError(
                f"{func} refuses what CalibrationResult.load would: {exc}"
            ) from None
        again = back.to_dict()
        for k, v in d.items():
            if json.dumps(again[k], indent=1) != json.dumps(v, indent=1):
                raise InvalidInputError(
                    f"{func} cannot write the {k!r} field as given: CalibrationResult.load "
                    f"would give back {json.dumps(again[k])[:60]} for {json.dumps(v)[:60]}."
                )
        with atomic_open(path, "w", encoding="utf-8") as f:
            f.write(text)

    @classmethod
    def load(cls, path) -> CalibrationResult:
        """Read a fit written by :meth:`save`."""
        path = check_input_file(path, "path", "CalibrationResult.load")
        try:
            with open(path) as f:
                d = json.load(f)
        except OSError as exc:
            raise InvalidInputError(
                f"Cannot read the calibration {os.fspath(path)!r}: {exc.strerror}."
            ) from None
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise InvalidInputError(
                f"The calibration {os.fspath(path)!r} is not JSON (CalibrationResult.save "
                "writes JSON)."
            ) from None
        if not isinstance(d, dict):
            raise InvalidInputError(f"{os.fspath(path)!r} is not a straggler calibration.")
        return cls.from_dict(d, source=repr(os.fspath(path)))

    def table(self) -> str:
        """The parameters with their intervals, one per line (units: us, us/expert, us/token)."""
        lo_hi = self.intervals
        lines = [f"{'param':6s} {'fit':>10s} {'interval':>24s}"]
        for k, v in self.params.items():
            lo, hi = lo_hi.get(k, (math.nan, math.nan))
            lines.append(f"{k:6s} {v:10.4f} [{lo:10.4f}, {hi:10.4f}]")
        lines.append(
            f"rel RMS {100 * self.rel_rms:.2f}%, max {100 * self.max_rel_error:.2f}%, "
            f"n* = {self.n_star:.1f} tokens/expert, {self.n_samples} samples"
        )
        return "\n".join(lines)


def _param_names(pieces: int, tiles: bool) -> list[str]:
    names = ["a", "b"] + (["b2"] if tiles else []) + ["c", "beta"]
    return names + (["c2", "gamma"] if pieces == 3 else [])


def _design(G, N, T, pieces):
    """Feature matrices of the pieces: ``[1, G, (T - G)]`` (or ``[1, G]``), ``[1, N]``..."""
    one = np.ones_like(G)
    act = np.column_stack([one, G] + ([T - G] if T is not None else []))
    tok = np.column_stack([one, N])
    return [act] + [tok] * (pieces - 1)


def _fit_pieces(X, y, z, pieces, scale):
    """Each piece refit by non-negative least squares on its samples: one Gauss-Newton step
    of ``sum (log t_hat - log t)^2`` linearised at the current predictions ``scale``,
    ``log t_hat ~ log s + (t_hat - s) / s``, i.e. residuals ``(t_hat - s (1 + log(t / s)))
    / s``. With ``scale = t`` (the first round) it is the plain relative fit."""
    thetas = []
    target = scale * (1.0 + np.log(y / scale))
    for k in range(pieces):
        rows = z == k
        Xk = X[k]
        if not rows.any():
            thetas.append(np.zeros(Xk.shape[1]))
            continue
        w = 1.0 / scale[rows]
        A = Xk[rows] * w[:, None]
        thetas.append(nnls(A, target[rows] * w, maxiter=50 * A.shape[1])[0])
    return thetas


def _predict(X, thetas):
    return np.column_stack([Xk @ th for Xk, th in zip(X, thetas)])


def _argmax_piece(P):
    """Index of the piece attaining the max; ties (within ``_TIE_RTOL``) to the lower one."""
    top = P.max(axis=1, keepdims=True)
    hit = P >= top - _TIE_RTOL * np.abs(top)
    return np.argmax(hit, axis=1)


def _scale(pred, y):
    """Per-sample scale of the relative residual: the model's prediction (the data where the
    prediction is not positive, e.g. before the first fit)."""
    return np.where(pred > 0, pred, y)


def _alternate(X, y, z, pieces, max_iter):
    """Alternating assignment from ``z``, each round's least squares a Gauss-Newton step of
    the log-residual loss at the previous round's predictions; returns (thetas, z, loss,
    iterations, converged)."""
    converged = False
    scale = y
    it = 0
    while it < max_iter:
        it += 1
        thetas = _fit_pieces(X, y, z, pieces, scale)
        P = _predict(X, thetas)
        znew = _argmax_piece(P)
        new_scale = _scale(P.max(axis=1), y)
        if np.array_equal(znew, z) and np.allclose(new_scale, scale, rtol=1e-6, atol=0):
            converged = True
            break
        z, scale = znew, new_scale
    pred = _predict(X, thetas).max(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        loss = float(np.sum(np.log(pred / y) ** 2)) if np.all(pred > 0) else math.inf
    return thetas, _argmax_piece(_predict(X, thetas)), loss, it, converged


def _starts(G, N, pieces, n_random, gen, quantile_starts=3):
    """Initial assignments: splits of the samples by tokens per expert ``N / G`` at
    quantiles (flat regime below, linear above; the middle split first), then uniformly
    random assignments."""
    n = N / np.maximum(G, 1e-12)
    out = []
    qs = (0.5, 0.25, 0.75) if pieces == 2 else ((0.33, 0.67), (0.2, 0.6), (0.5, 0.8))
    for q in qs[:quantile_starts]:
        cuts = np.quantile(n, np.atleast_1d(q))
        out.append(np.searchsorted(cuts, n, side="right").astype(np.int64))
    for _ in range(n_random):
        out.append(gen.integers(0, pieces, size=n.size))
    return out


def _canonical(thetas, z, pieces):
    """Order the two token pieces of ``pieces=3``: ``(c, beta)`` the flatter line, ``(c2,
    gamma)`` the steeper (ties: lower intercept first); relabel the assignment to match."""
    if pieces == 3:
        (c1, s1), (c2, s2) = thetas[1], thetas[2]
        if (s1, c1) > (s2, c2):
            thetas = [thetas[0], thetas[2], thetas[1]]
            z = np.where(z == 1, 2, np.where(z == 2, 1, z))
    return thetas, z


def _best_fit(X, y, G, N, pieces, starts, max_iter, gen, extra_start=None, quantile_starts=3):
    best = None
    inits = _starts(G, N, pieces, starts, gen, quantile_starts)
    if extra_start is not None:
        inits.insert(0, extra_start)
    for z0 in inits:
        fit = _alternate(X, y, z0, pieces, max_iter)
        if best is None or fit[2] < best[2] - 1e-15 * max(1.0, best[2]):
            best = fit
    return best


def _flatten(thetas, tiles):
    a = thetas[0]
    vals = [a[0], a[1]] + ([a[2]] if tiles else []) + [thetas[1][0], thetas[1][1]]
    for th in thetas[2:]:
        vals += [th[0], th[1]]
    return np.array(vals, dtype=float)


def _fit_cost_model_iv(G, N, t, T, pieces, bootstrap, rng, starts, max_iter, level, tile):
    G = check_array(G, "G", _FUNC, kind="real", lo=0)
    n = G.size
    N = check_array(N, "N", _FUNC, kind="real", lo=0, shape=(n,))
    t = check_array(t, "t", _FUNC, kind="real", lo=0, lo_open=True, shape=(n,))
    if T is not None:
        T = check_array(T, "T", _FUNC, kind="real", lo=0, shape=(n,))
        if np.any(T < G):
            i = int(np.argmax(T < G))
            raise param_error(
                "T",
                _FUNC,
                "tile counts of at least G (each activated replica is one tile or more)",
                f"T = {T[i]!r} < G = {G[i]!r} at sample {i}",
            )
    pieces = check_choice(pieces, "pieces", _FUNC, [2, 3])
    n_params = len(_param_names(pieces, T is not None))
    if n < n_params + 1:
        raise param_error(
            "t", _FUNC, f"at least {n_params + 1} samples for {n_params} parameters", f"{n}"
        )
    # Identifiability: a + b*G needs two values of G; telling the activation piece from a
    # token piece needs two values of tokens per expert (with N = k*G throughout, both
    # pieces are lines in G and any split of the slope between b and beta fits as well).
    if np.unique(G).size < 2:
        raise param_error(
            "G", _FUNC, "a log sweeping at least two values of G", f"G = {G[0]!r} only"
        )
    live = G > 0
    per = N[live] / G[live]
    if per.size and np.ptp(per) <= 1e-12 * max(1.0, float(np.abs(per).max())):
        raise param_error(
            "N",
            _FUNC,
            "a log sweeping at least two values of tokens per expert N/G (with one value, "
            "the activation and token pieces are the same line in G)",
            f"N/G = {per[0]!r} in every sample",
        )
    bootstrap = check_int(bootstrap, "bootstrap", _FUNC, lo=0)
    gen = check_rng(rng, _FUNC)
    starts = check_int(starts, "starts", _FUNC, lo=0)
    max_iter = check_int(max_iter, "max_iter", _FUNC, lo=1)
    level = check_real(level, "level", _FUNC, lo=0, hi=1, lo_open=True, hi_open=True)
    tile = check_int(tile, "tile", _FUNC, lo=1, hi=MAX_TILE)
    return G, N, t, T, pieces, bootstrap, gen, starts, max_iter, level, tile


def _meta_iv(meta, func: str) -> dict:
    """``meta`` as a fresh dict: None or a dict with string keys whose values JSON holds
    and gives back equal (:meth:`CalibrationResult.save` writes it as JSON, infinities as
    ``Infinity`` as Python's ``json`` does, read back by :meth:`CalibrationResult.load`)."""
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) for k in meta):
        raise param_error("meta", func, "None or a dict with string keys", repr(meta)[:60])
    try:
        back = json.loads(json.dumps(meta))
    except (TypeError, ValueError, RecursionError) as exc:
        raise param_error(
            "meta", func, "a dict of values JSON can store (strings, numbers, lists, dicts)",
            f"{repr(meta)[:60]} ({exc})",
        ) from None  # fmt: skip
    if back != meta:  # NaN included: it is not equal to the NaN read back
        raise param_error(
            "meta", func, "a dict JSON gives back as given (lists, not tuples; string keys at "
            "every level; no NaN)", repr(meta)[:60],
        )  # fmt: skip
    return dict(meta)


def fit_cost_model(
    G,
    N,
    t,
    *,
    T=None,
    pieces: int = 2,
    bootstrap: int = 200,
    rng=None,
    starts: int = 8,
    max_iter: int = 50,
    level: float = 0.95,
    tile: int = 128,
    meta: dict | None = None,
) -> CalibrationResult:
    """Fit ``t = max(a + b*G + b2*(T - G), c + beta*N [, c2 + gamma*N])`` to a timing log.

    Parameters
    ----------
    G, N, t : array_like, shape (n_samples,)
        Activated experts, tokens and measured time (us, > 0) of each logged GPU-step.
    T : array_like, shape (n_samples,), optional
        M-tiles ``sum_e ceil(n_e / tile)`` of each sample (``T >= G``); fits ``b2``.
    pieces : {2, 3}
        Two pieces (Eq. 1) or three (a second token-linear piece, Eq. 4's form).
    bootstrap : int, default 200
        Bootstrap replicates for the intervals (0: none, intervals are NaN).
    rng : None, int or numpy.random.Generator
        Random starts and bootstrap draws (same seed, same result).
    starts : int, default 8
        Random starting assignments, on top of three quantile splits by ``N / G``.
    max_iter : int, default 50
        Alternating-assignment rounds per start (App. B uses 50).
    level : float, default 0.95
        Coverage of the percentile intervals.
    tile : int, default 128
        M-tile size recorded in the fitted :class:`CostModel` (``T`` must use it).
    meta : dict, optional
        Provenance stored with the result (GPU, dtype, expert shape).

    Returns
    -------
    CalibrationResult

    Raises
    ------
    InvalidInputError
        Mismatched lengths, negative ``G``/``N``, a non-positive ``t``, ``T < G``, too few
        samples, ``pieces`` not 2 or 3.

    Notes
    -----
    *Loss.* ``sum_i (log t_hat_i - log t_i)^2``, the relative error in log scale, because
    timing noise is multiplicative: an overestimate and an underestimate by the same factor
    cost the same, a 20 us sample weighs as much as a 2 ms one, and an interference spike
    (a time 10x too long) costs ``log(10)^2``, not ``81``. Each round of the alternating
    assignment refits every piece by one Gauss-Newton step of it, a non-negative least
    squares on residuals relative to the previous round's predictions (relative to ``t``
    in the first round, the plain relative fit), until the assignment and the predictions
    no longer change (``rtol`` 1e-6) or ``max_iter`` rounds (``converged`` says which).
    Dividing by the measured ``t`` throughout, the plain relative fit, shrinks every
    parameter by about ``1.5 sigma^2`` (1% at 8% noise, more than the intervals' width on
    a 117-sample grid); dividing by the prediction instead lets a single spike win by
    predicting everything huge. The fits are non-negative (scipy's NNLS), because
    :class:`CostModel` parameters are: a slope the log cannot support is reported as 0,
    never negative (the paper's degenerate Qwen3 refit had ``b < 0``). A start is scored
    by the loss of the **max** of the pieces; the best of ``3 + starts`` is kept (ties:
    the first).

    *Starts.* Three splits by tokens per expert ``N / G`` at quantiles (0.5, 0.25, 0.75
    for two pieces; three pairs of cut points for three), then ``starts`` uniformly
    random assignments. A piece left without samples is the zero line (it never binds).

    *Labels.* The activation piece is the one with features ``[1, G, T - G]``. With
    ``pieces=3`` the two token lines are ordered by slope: ``(c, beta)`` the flatter,
    ``(c2, gamma)`` the steeper. Two token lines are told apart only where they cross
    inside the logged range of ``N``; otherwise one of them is redundant and its interval
    says so.

    *Bootstrap.* Each replicate resamples the samples with replacement and refits from two
    starts, the full fit's assignment and the median split (no random starts); the
    intervals are the replicates' percentiles. They measure the spread of the fit, not
    its bias; ``benchmarks/calibration_recovery.py`` measures their coverage. The
    paper's cluster bootstrap (resampling whole ``G`` columns) is not reproduced.

    Complexity: ``O((3 + starts + 2 * bootstrap) * max_iter * pieces)`` NNLS solves of at
    most ``n_samples`` rows.

    References
    ----------
    TEMPO §4.1, §5.2 (identifiability), Appendix B (grid, alternating assignment, 50
    iterations), Table 6 (fit errors 4-8%).

    Examples
    --------
    Noise-free samples of ``max(19 + 7*G, 40 + 0.2*N)`` are recovered exactly:

    >>> G = np.repeat([1, 2, 4, 8, 16], 4)
    >>> N = G * np.tile([1, 64, 512, 2048], 5)
    >>> t = np.maximum(19 + 7 * G, 40 + 0.2 * N)
    >>> fit = fit_cost_model(G, N, t, bootstrap=0, rng=0)
    >>> {k: round(v, 6) for k, v in fit.params.items()}
    {'a': 19.0, 'b': 7.0, 'c': 40.0, 'beta': 0.2}
    >>> fit.rel_rms < 1e-9, round(fit.n_star, 6)
    (True, 35.0)
    """
    G, N, t, T, pieces, bootstrap, gen, starts, max_iter, level, tile = _fit_cost_model_iv(
        G, N, t, T, pieces, bootstrap, rng, starts, max_iter, level, tile
    )
    meta = _meta_iv(meta, _FUNC)
    tiles = T is not None
    X = _design(G, N, T, pieces)
    thetas, z, _, iters, converged = _best_fit(X, t, G, N, pieces, starts, max_iter, gen)
    thetas, z = _canonical(thetas, z, pieces)
    names = _param_names(pieces, tiles)
    values = _flatten(thetas, tiles)

    boot = np.empty((bootstrap, len(names)))
    n = t.size
    for r in range(bootstrap):
        idx = gen.integers(0, n, size=n)
        Xr = [Xk[idx] for Xk in X]
        th_r, z_r, _, _, _ = _best_fit(
            Xr, t[idx], G[idx], N[idx], pieces, 0, max_iter, gen, z[idx], quantile_starts=1
        )
        th_r, _ = _canonical(th_r, z_r, pieces)
        boot[r] = _flatten(th_r, tiles)
    if bootstrap:
        alpha = (1 - level) / 2
        lo, hi = np.quantile(boot, [alpha, 1 - alpha], axis=0)
        intervals = {k: (float(a), float(b)) for k, a, b in zip(names, lo, hi)}
    else:
        intervals = {k: (math.nan, math.nan) for k in names}

    params = {k: float(v) for k, v in zip(names, values)}
    cost_kw = {k: params[k] for k in ("a", "b", "c", "beta")}
    cost_kw["b2"] = params.get("b2", 0.0)
    if pieces == 3:
        cost_kw.update(c2=params["c2"], gamma=params["gamma"])
    cost = CostModel(tile=tile, **cost_kw)
    pred = cost.time(G, N, T)
    rel = (pred - t) / t
    return CalibrationResult(
        cost=cost,
        params=params,
        intervals=intervals,
        level=level,
        rel_rms=float(np.sqrt(np.mean(rel**2))),
        max_rel_error=float(np.max(np.abs(rel))),
        n_star=cost.n_star,
        piece=z.astype(np.int64),
        bootstrap_params=boot,
        iterations=int(iters),
        converged=bool(converged),
        pieces=pieces,
        tile=tile,
        meta=meta,
    )


_LOG_COLUMNS = ("G", "N", "T", "t_us")


def write_calibration_log(path, G, N, t, *, T=None, meta: dict | None = None) -> None:
    """Write a timing log as CSV: ``# key: value`` metadata lines, then ``G,N[,T],t_us`` rows.

    The file is written atomically, as UTF-8. :func:`read_calibration_log` gives back the
    metadata as text (``str(value)``), so a key or value it could not give back as written
    is refused: a key that is not a string, or holds ``:``, and either with a line
    break, surrounding spaces or a character UTF-8 cannot encode; so is a log of no rows,
    which it refuses.

    Examples
    --------
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "log.csv")
    >>> write_calibration_log(p, [1, 2], [1, 2], [25.5, 29.4], meta={"gpu": "H20"})
    >>> log = read_calibration_log(p)
    >>> log["G"].tolist(), log["t"].tolist(), log["T"], log["meta"]
    ([1.0, 2.0], [25.5, 29.4], None, {'gpu': 'H20'})
    """
    func = "write_calibration_log"
    path = check_path_arg(path, "path", func)
    G = check_array(G, "G", func, kind="real", lo=0)
    n = G.size
    if n == 0:
        raise param_error("G", func, "at least one sample (a log of no rows is unreadable)", "none")
    N = check_array(N, "N", func, kind="real", lo=0, shape=(n,))
    t = check_array(t, "t", func, kind="real", lo=0, lo_open=True, shape=(n,))
    if T is not None:
        T = check_array(T, "T", func, kind="real", lo=0, shape=(n,))
    if meta is not None and not isinstance(meta, dict):
        raise param_error("meta", func, "None or a dict", type(meta).__name__)
    buf = io.StringIO()
    for k, v in (meta or {}).items():
        if not isinstance(k, str) or ":" in k:
            raise param_error("meta", func, "a dict whose keys are strings without ':'", repr(k))
        for text in (k, str(v)):
            if text != text.strip() or (text and text.splitlines() != [text]) or utf8_problem(text):
                raise param_error(
                    "meta", func, "a dict whose keys and values have no line breaks, "
                    "surrounding spaces or characters UTF-8 cannot encode (stored as "
                    "'# key: value' lines)", repr(text),
                )  # fmt: skip
        buf.write(f"# {k}: {v}\n")
    cols = ["G", "N"] + (["T"] if T is not None else []) + ["t_us"]
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for i in range(n):
        row = [repr(float(G[i])), repr(float(N[i]))]
        if T is not None:
            row.append(repr(float(T[i])))
        row.append(repr(float(t[i])))
        w.writerow(row)
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(buf.getvalue())


def read_calibration_log(path) -> dict:
    """Read a CSV timing log: ``{"G", "N", "T" (or None), "t", "meta"}`` (arrays of float64).

    Columns by name (``G``, ``N``, optional ``T``, and ``t_us`` or ``t``); ``# key: value``
    lines before the header are metadata. Counts are non-negative and times positive, as
    :func:`write_calibration_log` writes them. Raises :class:`InvalidInputError` naming the
    file, the line and the column on anything else.
    """
    where = check_input_file(path, "path", "read_calibration_log")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"Cannot read the calibration log {where!r}: {exc}") from None
    meta = {}
    rows = []
    header = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
            continue
        cells = next(csv.reader([line]))
        if header is None:
            header = [c.strip() for c in cells]
            if "t" in header and "t_us" not in header:
                header[header.index("t")] = "t_us"
            missing = [c for c in ("G", "N", "t_us") if c not in header]
            if missing:
                raise InvalidInputError(
                    f"The calibration log {where!r} must have a header with columns G, N, "
                    f"t_us (and optionally T). Got {header} on line {lineno} instead."
                )
            continue
        if len(cells) != len(header):
            raise InvalidInputError(
                f"Line {lineno} of the calibration log {where!r} must have {len(header)} "
                f"fields ({', '.join(header)}). Got {len(cells)} instead."
            )
        try:
            row = [float(c) for c in cells]
            finite = all(map(math.isfinite, row))
        except ValueError:
            finite = False
        if not finite:
            raise InvalidInputError(
                f"Line {lineno} of the calibration log {where!r} must hold finite numbers. "
                f"Got {line!r} instead."
            )
        for name, v in zip(header, row):
            if name in _LOG_COLUMNS and (v <= 0 if name == "t_us" else v < 0):
                raise InvalidInputError(
                    f"Line {lineno} of the calibration log {where!r} must hold a "
                    f"{'positive time' if name == 't_us' else 'non-negative count'} in "
                    f"column {name}. Got {cells[header.index(name)]!r} instead."
                )
        rows.append(row)
    if header is None or not rows:
        raise InvalidInputError(
            f"The calibration log {where!r} must hold a header (G,N,t_us) and at least one "
            "row. Got none instead."
        )
    data = np.array(rows, dtype=float)
    col = {name: data[:, i] for i, name in enumerate(header)}
    return {
        "G": col["G"],
        "N": col["N"],
        "T": col.get("T"),
        "t": col["t_us"],
        "meta": meta,
    }
