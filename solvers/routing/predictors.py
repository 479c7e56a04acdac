"""Termination predictors for BR-H's projected loads (BalanceRoute, arXiv
2605.06113: BR-H's termination classifier and its training losses).

Every predictor answers one question for running requests, given prompt length, age (tokens
decoded so far ``a_i``) and the horizon ``H``::

    predict(prompt, decoded, horizon, *, prefix=None, output=None) -> (p_fin, mu_rem)

with ``r_i`` the tokens still to decode (``r_i >= 1``; the request leaves after them),
``p_fin = P(r_i <= H | x_i, a_i)`` and ``mu_rem = E[r_i | r_i <= H, x_i, a_i]`` (arrays of the
running requests' shape). ``observe(prompt, output, prefix=None)`` feeds finished requests
(online learning). :func:`~straggler.solvers.routing.route.project_loads` turns the pair into the
expected presence ``c_i`` with the confidence gate ``p_fin < 0.5 -> c_i = H+1``.

* :class:`OraclePredictor`: the true output length (simulation only).
* :class:`SurvivalPredictor`: empirical CDF of output lengths conditioned on age, O(log n) per
  query (two binary searches and a prefix sum), fitted from a trace or online.
* :class:`ExactMatchPredictor`: prompt-prefix hash -> last seen output length; falls back to
  survival on a miss (or when the memo says the request should already have finished).
* :class:`TwoStagePredictor`: the paper's calibrated termination classifier (logistic
  regression, binary cross-entropy, isotonic calibration on held-out requests) and
  conditional-mean regressor (least squares, MSE, on the samples that do finish within ``H``),
  trained on samples taken every ``H/2`` tokens (from a random first age per request);
  evaluated with the C library's ``log1p``/``exp`` and a fixed summation order, so that the
  simulator's step loop reproduces its predictions exactly from
  :meth:`TwoStagePredictor.model_arrays`;
  :func:`calibration_report` gives reliability bins, Brier score, log loss and AUC.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from ...formulations.errors import InvalidInputError, param_error
from ...formulations.validation import check_array, check_choice, check_int, check_real, check_rng

__all__ = [
    "PredictorKind",
    "Predictor",
    "OraclePredictor",
    "SurvivalPredictor",
    "ExactMatchPredictor",
    "TwoStagePredictor",
    "CalibrationReport",
    "calibration_report",
    "termination_samples",
]


class PredictorKind(enum.IntEnum):
    """The predictors BR-H can use inside the simulator's jitted step loop (the integer value is
    what the engine receives; ``NONE`` for a policy without projected loads).

    Examples
    --------
    >>> PredictorKind.from_name("exact_match"), PredictorKind.from_name(PredictorKind.ORACLE)
    (<PredictorKind.EXACT_MATCH: 3>, <PredictorKind.ORACLE: 1>)
    >>> PredictorKind.names()
    ['oracle', 'survival', 'exact_match', 'two_stage']
    """

    NONE = 0
    """No projection (the router sees current loads only)."""
    ORACLE = 1
    """The true remaining output length (:class:`OraclePredictor`, simulation only)."""
    SURVIVAL = 2
    """Empirical survival of output lengths by age (:class:`SurvivalPredictor`)."""
    EXACT_MATCH = 3
    """Prompt-hash memo with the survival fallback (:class:`ExactMatchPredictor`)."""
    TWO_STAGE = 4
    """The paper's termination classifier and regressor (:class:`TwoStagePredictor`)."""

    @property
    def label(self) -> str:
        """The lower-case name (``"exact_match"``)."""
        return self.name.lower()

    @classmethod
    def names(cls) -> list[str]:
        """The labels of the real predictors (``NONE`` excluded)."""
        return [k.label for k in cls if k is not cls.NONE]

    @classmethod
    def from_name(cls, x, name: str = "predictor", func: str = "simulate") -> PredictorKind:
        """A member from itself or its label; :class:`InvalidOptionError` naming ``name``."""
        if isinstance(x, cls) and x is not cls.NONE:
            return x
        if isinstance(x, str) and x in cls.names():
            return cls[x.upper()]
        from ...formulations.errors import InvalidOptionError
        from ...formulations.validation import describe

        raise param_error(name, func, f"one of {cls.names()}", describe(x), InvalidOptionError)


class Predictor:
    """Interface of every predictor (see the module docstring)."""

    def predict(self, prompt, decoded, horizon, *, prefix=None, output=None):
        raise NotImplementedError

    def observe(self, prompt, output, prefix=None) -> None:
        """Learn from finished requests (default: nothing to learn)."""


class OraclePredictor(Predictor):
    """The truth: ``r = output - decoded``, ``p_fin = 1{r <= H}``, ``mu_rem = r``.

    Examples
    --------
    >>> p, mu = OraclePredictor().predict([5, 5], [2, 0], 4, output=[6, 20])
    >>> p.tolist(), mu.tolist()
    ([1.0, 0.0], [4.0, 20.0])
    """

    def predict(self, prompt, decoded, horizon, *, prefix=None, output=None):
        f = "OraclePredictor.predict"
        H = check_int(horizon, "horizon", f, lo=0)
        if output is None:
            raise param_error("output", f, "the true output lengths (oracle)", "None")
        a = check_array(decoded, "decoded", f, lo=0)
        o = check_array(output, "output", f, lo=0)
        if o.shape != a.shape or np.any(o <= a):
            raise param_error(
                "output", f, "an array like decoded with output > decoded", f"shape {o.shape}"
            )
        r = o - a
        return (r <= H).astype(np.float64), r


class SurvivalPredictor(Predictor):
    """Empirical survival of output lengths, conditioned on age.

    With ``F`` the ECDF of observed output lengths ``o`` and age ``a``:
    ``p_fin = #{a < o <= a+H} / #{o > a}`` and ``mu_rem = mean{o - a : a < o <= a+H}``. An age
    beyond every observation gives ``p_fin = 0`` (the gate then keeps the request for the
    whole horizon). Online: :meth:`observe` buffers; the sorted table is rebuilt when the buffer
    exceeds ``max(64, refresh * n)`` (amortized O(log n) per observation), so predictions use
    the table as of the last rebuild.

    Parameters
    ----------
    outputs : array, optional
        Output lengths to fit from (a trace).
    refresh : float
        Relative buffer size that triggers a rebuild (default 0.05).

    Examples
    --------
    >>> sp = SurvivalPredictor([2, 4, 4, 10])
    >>> p, mu = sp.predict([0, 0], [1, 5], 3)
    >>> p.tolist(), mu.tolist()
    ([0.75, 0.0], [2.3333333333333335, 1.0])
    """

    def __init__(self, outputs=None, *, refresh: float = 0.05) -> None:
        self._sorted = np.zeros(0)
        self._csum = np.zeros(1)
        self._pending: list[float] = []
        self.refresh = float(refresh)
        if outputs is not None:
            self.fit(outputs)

    def fit(self, outputs) -> SurvivalPredictor:
        """Replace the table by the ECDF of ``outputs``."""
        o = check_array(outputs, "outputs", "SurvivalPredictor.fit", lo=0)
        self._sorted = np.sort(o)
        self._csum = np.concatenate(([0.0], np.cumsum(self._sorted)))
        self._pending = []
        return self

    def observe(self, prompt, output, prefix=None) -> None:
        self._pending.extend(np.atleast_1d(np.asarray(output, dtype=np.float64)).tolist())
        if len(self._pending) >= max(64, self.refresh * self._sorted.size):
            self._rebuild()

    def _rebuild(self) -> None:
        self.fit(np.concatenate((self._sorted, np.asarray(self._pending))))

    @property
    def n_observed(self) -> int:
        return int(self._sorted.size + len(self._pending))

    def predict(self, prompt, decoded, horizon, *, prefix=None, output=None):
        f = "SurvivalPredictor.predict"
        H = check_int(horizon, "horizon", f, lo=0)
        a = check_array(decoded, "decoded", f, lo=0)
        if self._sorted.size == 0 and self._pending:
            self._rebuild()
        o = self._sorted
        lo = np.searchsorted(o, a, side="right")  # #{o <= a}
        hi = np.searchsorted(o, a + H, side="right")  # #{o <= a+H}
        alive = o.size - lo
        n_in = hi - lo
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(alive > 0, n_in / np.maximum(alive, 1), 0.0)
            mu = np.where(
                n_in > 0, (self._csum[hi] - self._csum[lo]) / np.maximum(n_in, 1) - a, 1.0
            )
        return p, mu


class ExactMatchPredictor(Predictor):
    """Prompt-prefix hash memo (last seen output length), survival fallback.

    A hit with remembered output ``o > a`` is treated as the truth (``r = o - a``); a miss, or a
    memo ``o <= a`` (the request outlived its twin), asks the fallback.

    Examples
    --------
    >>> em = ExactMatchPredictor(SurvivalPredictor([3, 3, 8]))
    >>> em.observe([10], [5], prefix=[42])
    >>> p, mu = em.predict([10, 10], [1, 1], 3, prefix=[42, 7])
    >>> p.tolist(), mu.tolist()
    ([0.0, 0.6666666666666666], [4.0, 2.0])
    """

    def __init__(self, fallback: Predictor | None = None) -> None:
        self.fallback = fallback if fallback is not None else SurvivalPredictor()
        self.memo: dict[int, float] = {}

    def observe(self, prompt, output, prefix=None) -> None:
        out = np.atleast_1d(np.asarray(output, dtype=np.float64))
        if prefix is not None:
            for h, o in zip(np.atleast_1d(prefix).tolist(), out.tolist()):
                self.memo[h] = o
        self.fallback.observe(prompt, output, prefix)

    def predict(self, prompt, decoded, horizon, *, prefix=None, output=None):
        f = "ExactMatchPredictor.predict"
        H = check_int(horizon, "horizon", f, lo=0)
        a = check_array(decoded, "decoded", f, lo=0)
        p, mu = self.fallback.predict(prompt, decoded, H, prefix=prefix)
        if prefix is None or not self.memo:
            return p, mu
        memo = np.array([self.memo.get(h, -1.0) for h in np.asarray(prefix).tolist()])
        hit = memo > a
        r = memo - a
        return np.where(hit, (r <= H).astype(np.float64), p), np.where(hit, r, mu)


def termination_samples(prompts, outputs, horizon: int, stride: int | None = None, *, rng=None):
    """Training tuples of the two-stage predictor, one every ``stride = max(1, H//2)`` tokens.

    For each request (prompt ``s``, output ``o``) and age ``a = b, b + stride, b + 2*stride,
    ... < o``: features ``(s, a)``, label ``y = 1{o - a <= H}`` and target ``r = o - a``. The
    first age ``b`` is 0 (``rng=None``), or with ``rng`` (a seed or ``numpy.random.Generator``)
    drawn per request uniformly from ``0 .. min(stride, o) - 1``, so that the samples cover
    every age, not only multiples of ``stride``.

    Returns ``(prompt, age, y, r)`` arrays.

    Examples
    --------
    >>> s, a, y, r = termination_samples([7], [5], 2)
    >>> a.tolist(), y.tolist(), r.tolist()
    ([0.0, 1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 1.0, 1.0], [5.0, 4.0, 3.0, 2.0, 1.0])
    >>> termination_samples([7, 7], [9, 9], 8)[1].tolist()  # stride 4, from age 0
    [0.0, 4.0, 8.0, 0.0, 4.0, 8.0]
    >>> termination_samples([7, 7], [9, 9], 8, rng=1)[1].tolist()  # first ages 2 and 3
    [2.0, 6.0, 3.0, 7.0]
    """
    f = "termination_samples"
    H = check_int(horizon, "horizon", f, lo=0)
    s = check_array(prompts, "prompts", f, lo=0)
    o = check_array(outputs, "outputs", f, lo=0)
    if s.shape != o.shape:
        raise param_error("outputs", f, f"shape {s.shape} like prompts", f"shape {o.shape}")
    step = max(1, H // 2) if stride is None else check_int(stride, "stride", f, lo=1)
    if rng is None:
        off = np.zeros(o.size)
    else:
        u = check_rng(rng, f).random(o.size)
        off = np.floor(u * np.minimum(float(step), np.maximum(o, 1.0)))
    counts = np.ceil((o - off) / step).astype(np.int64)
    idx = np.repeat(np.arange(o.size), counts)
    first = np.repeat(np.cumsum(counts) - counts, counts)
    age = off[idx] + (np.arange(idx.size) - first) * float(step)
    r = o[idx] - age
    return s[idx], age, (r <= H).astype(np.float64), r


def _libm(fn, x) -> np.ndarray:
    """Elementwise C-library ``fn`` (``math.log1p``, ``math.exp``) on a float array.

    numpy's SIMD loops for ``log1p``/``exp`` can differ from the C library by an ulp; the
    simulator's jitted step loop and its plain-Python reference call the C library, so the
    two-stage model is evaluated with it everywhere (exactly the same numbers).
    """
    x = np.asarray(x, dtype=np.float64)
    return np.frompyfunc(fn, 1, 1)(x).astype(np.float64).reshape(x.shape)


def _features(prompt, age, knots_s, knots_a) -> np.ndarray:
    """``(1, ls, la, ls^2, la^2, ls*la, (ls - k)_+ ..., (la - k)_+ ...)``, ``l* = log1p(*)``."""
    ls = _libm(math.log1p, prompt)
    la = _libm(math.log1p, age)
    cols = [np.ones_like(ls), ls, la, ls * ls, la * la, ls * la]
    cols += [np.maximum(ls - k, 0.0) for k in knots_s]
    cols += [np.maximum(la - k, 0.0) for k in knots_a]
    return np.column_stack(cols)


def _dot(X, w) -> np.ndarray:
    """``sum_j X[:, j] * w[j]`` accumulated left to right from 0 (no BLAS: a BLAS dot may
    reorder or fuse), the order of the simulator's step loops."""
    z = np.zeros(X.shape[0])
    for j in range(X.shape[1]):
        z = z + X[:, j] * w[j]
    return z


#: ``-z`` above this gives ``p = 0`` exactly (``exp`` would overflow); same rule in the engine.
EXP_CAP = 700.0


def _sigmoid(z) -> np.ndarray:
    t = -np.asarray(z, dtype=np.float64)
    e = _libm(math.exp, np.minimum(t, EXP_CAP))
    return np.where(t > EXP_CAP, 0.0, 1.0 / (1.0 + e))


def _isotonic(x, y):
    """Pool-adjacent-violators fit of a non-decreasing step map ``x -> E[y]``.

    Returns ``(ends, values)``: block ``b`` covers scores up to ``ends[b]``.
    """
    ux, inv, cnt = np.unique(x, return_inverse=True, return_counts=True)
    mean = np.bincount(inv, weights=y) / cnt
    vals: list[float] = []
    wts: list[float] = []
    ends: list[float] = []
    for v, w, e in zip(mean.tolist(), cnt.tolist(), ux.tolist()):
        vals.append(v)
        wts.append(w)
        ends.append(e)
        while len(vals) > 1 and vals[-2] >= vals[-1]:
            w2 = wts[-2] + wts[-1]
            v2 = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / w2
            vals.pop()
            wts.pop()
            e2 = ends.pop()
            vals[-1], wts[-1], ends[-1] = v2, w2, e2
    return np.array(ends), np.array(vals)


@dataclass(frozen=True, eq=False, kw_only=True)
class CalibrationReport:
    """Reliability of a termination classifier.

    Attributes
    ----------
    bins : ndarray, shape (n_bins, 4)
        Per probability bin: mean predicted probability, observed frequency, count, bin upper
        edge (empty bins have count 0 and NaN means).
    brier : float
        Mean ``(p - y)^2``.
    log_loss : float
        Mean binary cross-entropy.
    auc : float
        Area under the ROC curve (Mann-Whitney, ties counted half); NaN with one class only.
    ece : float
        Expected calibration error, ``sum_b count_b/n * |mean_pred_b - freq_b|``.
    n : int
    """

    bins: np.ndarray
    brier: float
    log_loss: float
    auc: float
    ece: float
    n: int

    def table(self) -> str:
        """The reliability table as text."""
        rows = ["bin<=  mean_p  freq    count"]
        for mp, fr, c, up in self.bins:
            rows.append(f"{up:5.2f}  {mp:6.3f}  {fr:6.3f}  {int(c):6d}")
        rows.append(
            f"Brier {self.brier:.4f}  log-loss {self.log_loss:.4f}  AUC {self.auc:.4f}  "
            f"ECE {self.ece:.4f}  n {self.n}"
        )
        return "\n".join(rows)


def calibration_report(p, y, n_bins: int = 10) -> CalibrationReport:
    """Reliability bins, Brier score, log loss, AUC and ECE of probabilities ``p`` for labels ``y``.

    Examples
    --------
    >>> r = calibration_report([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], n_bins=2)
    >>> round(r.brier, 4), r.auc, r.bins[:, 2].tolist()
    (0.1581, 0.75, [3.0, 1.0])
    """
    f = "calibration_report"
    p = check_array(p, "p", f, lo=0, hi=1, expected="a 1-D array of probabilities in [0, 1]")
    y = check_array(y, "y", f, expected="a 1-D array of labels in {0, 1}")
    if p.shape != y.shape or p.size == 0:
        raise param_error(
            "y", f, f"a non-empty 1-D array of shape {p.shape} like p", f"shape {y.shape}"
        )
    if not np.all((y == 0) | (y == 1)):
        raise param_error("y", f, "labels in {0, 1}", "other values")
    n_bins = check_int(n_bins, "n_bins", f, lo=1)
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    b = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, n_bins - 1)
    cnt = np.bincount(b, minlength=n_bins).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mp = np.bincount(b, weights=p, minlength=n_bins) / cnt
        fr = np.bincount(b, weights=y, minlength=n_bins) / cnt
    ece = float(np.nansum(cnt / p.size * np.abs(mp - fr)))
    eps = 1e-12
    pc = np.clip(p, eps, 1 - eps)
    ll = float(-np.mean(y * np.log(pc) + (1 - y) * np.log(1 - pc)))
    n_pos = int(y.sum())
    n_neg = p.size - n_pos
    if n_pos == 0 or n_neg == 0:
        auc = float("nan")
    else:
        ranks = rankdata(p)
        auc = float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
    return CalibrationReport(
        bins=np.column_stack((mp, fr, cnt, edges[1:])),
        brier=float(np.mean((p - y) ** 2)),
        log_loss=ll,
        auc=auc,
        ece=ece,
        n=int(p.size),
    )


class TwoStagePredictor(Predictor):
    """Calibrated termination classifier + conditional-mean regressor (the paper's training).

    Stage 1: logistic regression ``p = sigmoid(w'phi(s, a))`` fitted by Newton's method on the
    binary cross-entropy (small ridge ``l2`` on the non-intercept weights); ``phi`` holds
    ``log1p`` of prompt length and age, their squares and product, and hinge terms at the
    training quartiles (standardized). Calibration: the logistic probabilities are mapped by an
    isotonic (pool-adjacent-violators) fit on a held-out fraction ``calibration`` of the
    requests, so that predicted probabilities match observed frequencies. Stage 2: least
    squares (MSE) ``mu_rem = v'phi(s, a)`` on the samples with ``r <= H``, clipped to
    ``[1, H]``. Samples come from :func:`termination_samples` (the paper's stride ``H/2``).

    Sample phase: the router asks for predictions at every age, so by default
    (``phase="random"``) each training request's first sample age is drawn uniformly in
    ``[0, H/2)`` (seeded), then every ``H/2`` tokens. With ``phase="zero"`` (ages ``0, H/2,
    H, ...`` only) the log-age features never see the ages in between, and the fit extrapolates
    there: on the Azure-2023 conversation trace (``H = 80``, fitted on the first half, scored on
    the second half at every age) the regressor's mean error on finishing requests is -10.6
    tokens with ``"zero"`` and -1.4 with ``"random"``, the classifier's ECE 0.033 and 0.027.

    Parameters
    ----------
    horizon : int
        The ``H`` it is trained for (``predict`` must use the same).
    l2 : float
        Ridge weight (default 1e-4).
    calibration : float
        Fraction of requests held out for the isotonic map (0 disables it; default 0.2).
    seed : int
        Seed of the train/calibration split and of the sample phases.
    phase : {"random", "zero"}
        First sample age of each request: random in ``[0, H/2)`` (default) or 0.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> s = rng.integers(10, 1000, 400); o = np.where(s > 500, 20, 300)
    >>> tp = TwoStagePredictor(40).fit(s, o)
    >>> p, mu = tp.predict([900, 100], [0, 0], 40)
    >>> bool(p[0] > 0.9), bool(p[1] < 0.1)
    (True, True)
    """

    def __init__(
        self,
        horizon: int,
        *,
        l2: float = 1e-4,
        calibration: float = 0.2,
        seed: int = 0,
        phase: str = "random",
    ) -> None:
        self.horizon = check_int(horizon, "horizon", "TwoStagePredictor", lo=0)
        f = "TwoStagePredictor"
        self.l2 = check_real(l2, "l2", f, lo=0)
        self.calibration_fraction = check_real(
            calibration, "calibration", f, lo=0, hi=1, hi_open=True
        )
        self.seed = check_int(seed, "seed", f, lo=0)
        self.phase = check_choice(phase, "phase", f, ["random", "zero"])
        self.w = None
        self.v = None
        self._iso = None

    def _phi(self, prompt, age):
        return (_features(prompt, age, self._ks, self._ka) - self._mean) / self._std

    def _raw(self, X):
        return _sigmoid(_dot(X, self.w))

    def fit(self, prompts, outputs, *, stride: int | None = None, max_iter: int = 50):
        """Fit both stages (and the calibration map) on finished requests."""
        f = "TwoStagePredictor.fit"
        prompts = check_array(prompts, "prompts", f, lo=0)
        outputs = check_array(outputs, "outputs", f, lo=0)
        if prompts.shape != outputs.shape:
            raise param_error(
                "outputs", f, f"shape {prompts.shape} like prompts", f"shape {outputs.shape}"
            )
        held = np.zeros(prompts.size, bool)
        if self.calibration_fraction > 0 and prompts.size >= 10:
            rng = np.random.default_rng(self.seed)
            k = int(round(self.calibration_fraction * prompts.size))
            held[rng.choice(prompts.size, k, replace=False)] = True
        if self.phase == "random":

            def ph(k):
                return np.random.default_rng((self.seed, k))
        else:

            def ph(k):
                return None

        s, a, y, r = termination_samples(
            prompts[~held], outputs[~held], self.horizon, stride, rng=ph(1)
        )
        if s.size == 0 or y.min() == y.max():
            raise InvalidInputError(
                "TwoStagePredictor.fit needs samples that finish within the horizon and "
                "samples that do not."
            )
        q = [0.25, 0.5, 0.75]
        self._ks = np.quantile(np.log1p(s), q)
        self._ka = np.quantile(np.log1p(a), q)
        X = _features(s, a, self._ks, self._ka)
        self._mean = X.mean(axis=0)
        self._mean[0] = 0.0
        self._std = X.std(axis=0)
        self._std[self._std == 0] = 1.0
        X = (X - self._mean) / self._std
        reg = np.full(X.shape[1], self.l2)
        reg[0] = 0.0
        w = np.zeros(X.shape[1])
        for _ in range(max_iter):  # Newton / IRLS on the BCE
            p = 1.0 / (1.0 + np.exp(-(X @ w)))
            grad = X.T @ (p - y) / y.size + reg * w
            hess = (X.T * (p * (1 - p))) @ X / y.size + np.diag(reg + 1e-9)
            step = np.linalg.solve(hess, grad)
            w -= step
            if np.max(np.abs(step)) < 1e-10:
                break
        self.w = w
        pos = y == 1
        self.v = np.linalg.lstsq(X[pos], r[pos], rcond=None)[0]
        self._iso = None
        if held.any():
            cs, ca, cy, _ = termination_samples(
                prompts[held], outputs[held], self.horizon, stride, rng=ph(2)
            )
            if cs.size:
                self._iso = _isotonic(self._raw(self._phi(cs, ca)), cy)
        return self

    def predict(self, prompt, decoded, horizon, *, prefix=None, output=None):
        f = "TwoStagePredictor.predict"
        H = check_int(horizon, "horizon", f, lo=0)
        if self.w is None:
            raise InvalidInputError("TwoStagePredictor.predict called before fit.")
        if H != self.horizon:
            raise param_error(
                "horizon", f, f"the horizon it was trained for ({self.horizon})", repr(horizon)
            )
        a = check_array(decoded, "decoded", f, lo=0)
        s = check_array(prompt, "prompt", f, lo=0)
        X = self._phi(s, a)
        p = self._raw(X)
        if self._iso is not None:
            ends, vals = self._iso
            p = vals[np.minimum(np.searchsorted(ends, p, side="left"), vals.size - 1)]
        mu = np.clip(_dot(X, self.v), 1.0, max(H, 1))
        return p, mu

    def model_arrays(self):
        """The fitted model as plain arrays (what :func:`~straggler.sim.simulate` hands to its
        step loop), enough to recompute :meth:`predict` exactly.

        Returns ``(knots, lin, iso, n_blocks)``: ``knots`` ``(2, k)`` (prompt and age hinge
        knots, on ``log1p`` scale), ``lin`` ``(4, F)`` (feature means, standard deviations,
        classifier weights ``w``, regressor weights ``v``; ``F = 6 + 2k``), ``iso`` ``(2, B)``
        (isotonic block ends and values; ``B >= 1``) and ``n_blocks`` (0 = no calibration).
        Prediction at prompt ``s``, age ``a``, in this order: ``ls = log1p(s)``, ``la =
        log1p(a)`` (C library); features ``f = (1, ls, la, ls*ls, la*la, ls*la, (ls - knots[0,
        j])_+ ..., (la - knots[1, j])_+ ...)``; ``phi_j = (f_j - lin[0, j]) / lin[1, j]``;
        ``z = sum_j lin[2, j] * phi_j`` and ``y = sum_j lin[3, j] * phi_j`` accumulated from
        0 in ``j`` order; ``p = 0`` if ``-z > EXP_CAP`` else ``1 / (1 + exp(-z))``; with
        calibration ``p = iso[1, b]``, ``b`` the first block with ``iso[0, b] >= p`` (the last
        one if none); ``mu = clip(y, 1, max(H, 1))``.

        Examples
        --------
        >>> rng = np.random.default_rng(0)
        >>> s = rng.integers(10, 1000, 400); o = np.where(s > 500, 20, 300)
        >>> knots, lin, iso, nb = TwoStagePredictor(40).fit(s, o).model_arrays()
        >>> knots.shape, lin.shape, iso.shape[0], nb == iso.shape[1]
        ((2, 3), (4, 12), 2, True)
        """
        if self.w is None:
            raise InvalidInputError("TwoStagePredictor.model_arrays called before fit.")
        knots = np.vstack([self._ks, self._ka]).astype(np.float64)
        lin = np.vstack([self._mean, self._std, self.w, self.v]).astype(np.float64)
        if self._iso is None:
            iso, nb = np.zeros((2, 1)), 0
        else:
            iso, nb = np.vstack(self._iso).astype(np.float64), int(self._iso[0].size)
        return tuple(np.ascontiguousarray(x) for x in (knots, lin, iso)) + (nb,)

    def calibration(self, prompts, outputs, *, stride: int | None = None, n_bins: int = 10):
        """:func:`calibration_report` of the classifier on (held-out) requests."""
        s, a, y, _ = termination_samples(prompts, outputs, self.horizon, stride)
        p, _ = self.predict(s, a, self.horizon)
        return calibration_report(p, y, n_bins)
