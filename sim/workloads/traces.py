"""Request traces: a :class:`Trace` type, loaders for public formats, and shipped generators.

A trace is what the decode-cluster simulator replays: per request an arrival time (seconds
from the first request), a prompt length (tokens the prefill produced, i.e. the KV cache moved
to the decode replica), an output length (decode steps until the request leaves) and, where the
format carries one, a prompt hash for exact-match length prediction.

Formats understood by :func:`load_trace` (detected from the header or the first record):

* **Azure LLM inference** CSV (Azure/AzurePublicDataset; 2023 Splitwise traces and the 2024
  week-long ones): ``TIMESTAMP,ContextTokens,GeneratedTokens``; wall-clock timestamps with
  7 fractional digits, without (2023) or with (2024) a ``+00:00`` UTC offset; CRLF line ends
  and no final newline are accepted.
* **Mooncake** JSONL (kvcache-ai/Mooncake FAST'25): ``timestamp`` (ms from start),
  ``input_length``, ``output_length``, ``hash_ids`` (hashes of 512-token prompt blocks). The
  prompt hash is a 63-bit hash of the whole ``hash_ids`` list, so equal hashes mean equal
  prompts (block by block).
* **BurstGPT** CSV: ``Timestamp`` (seconds from start), ``Model``, ``Request tokens``,
  ``Response tokens``, ``Total tokens``, ``Log Type``. BurstGPT records a failed request
  with ``Response tokens`` = 0; those rows are skipped (their count is in ``meta``), as are
  rows with a ``Log Type`` containing ``fail`` (case-insensitive), in case a release marks
  failures that way.
* **length-only** CSV (ShareGPT / Vidur / Sarathi ``processed_traces``):
  ``num_prefill_tokens,num_decode_tokens,...`` with no times; arrivals are generated
  (Poisson, or a gamma renewal process with a given coefficient of variation) at ``rate``
  requests per second with a seeded generator.

Shipped traces: six public traces (Azure 2023 code and conversation, Mooncake conversation and
synthetic, ShareGPT and arXiv length statistics) ship inside the package, xz-compressed, with
their sources and licenses (``data/README.md`` beside this module); :func:`find_trace` finds a
trace file there, or in the folder ``$STRAGGLER_TRACES`` names.

Shipped generators (:func:`generate_trace`) draw prompt and output lengths from lognormal
mixtures (three components, fitted by EM in log space to the public traces, clipped to the
trace's range) and arrivals from a gamma renewal process (burstiness = its coefficient of
variation, fitted to the traces) or a two-state MMPP. See :data:`WORKLOAD_PRESETS` for the
fitted parameters and the figures they reproduce.
"""

from __future__ import annotations

import csv
import datetime as _dt
import gzip
import hashlib
import io
import json
import lzma
import math
import os
import pathlib
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...formulations._io import check_input_file
from ...formulations.errors import InvalidInputError, param_error
from ...formulations.validation import (
    MAX_EXACT_INT,
    check_array,
    check_choice,
    check_int,
    check_options,
    check_real,
    check_rng,
    check_type,
    describe,
)

__all__ = [
    "Trace",
    "LengthModel",
    "WORKLOAD_PRESETS",
    "load_trace",
    "generate_trace",
    "generate_arrivals",
    "fit_length_model",
    "saturate_trace",
    "find_trace",
    "traces_dir",
]


# ----------------------------------------------------------------------------------------
# The Trace type


#: Longest prompt or output accepted, in tokens (loads sum lengths in float64, exact below 2**53).
MAX_LENGTH = MAX_EXACT_INT
#: Most requests a generator draws in one call (a month of the busiest public trace is 2**24).
MAX_REQUESTS = 2**30


def _trace_iv(t) -> dict:
    """Validated, sorted, read-only arrays of a :class:`Trace` (and its name and meta)."""
    func = "Trace"
    arr = check_array(t.arrival_s, "arrival_s", func, ndim=1, lo=0)
    n = arr.size
    p = check_array(t.prompt_len, "prompt_len", func, kind="int", shape=(n,), lo=0, hi=MAX_LENGTH)
    o = check_array(t.output_len, "output_len", func, kind="int", shape=(n,), lo=1, hi=MAX_LENGTH)
    h = None
    if t.prefix_hash is not None:
        h = check_array(t.prefix_hash, "prefix_hash", func, kind="int", shape=(n,), lo=-1)
    check_type(t.name, "name", func, str, "a string")
    check_type(t.meta, "meta", func, Mapping, "a dict")
    order = np.argsort(arr, kind="stable")
    out = {"arrival_s": arr[order], "prompt_len": p[order], "output_len": o[order]}
    out["prefix_hash"] = None if h is None else h[order]
    for k, v in out.items():
        if v is not None:
            v = np.ascontiguousarray(v)
            v.setflags(write=False)
            out[k] = v
    out["meta"] = dict(t.meta)
    return out


@dataclass(frozen=True, eq=False, kw_only=True)
class Trace:
    """A request trace, sorted by arrival.

    Parameters
    ----------
    arrival_s : array_like of float, shape (n,)
        Arrival times in seconds (finite, non-negative). Sorted stably on construction; every
        other array is permuted with it.
    prompt_len : array_like of int, shape (n,)
        Prompt (prefill) lengths in tokens, ``>= 0``.
    output_len : array_like of int, shape (n,)
        Output lengths in tokens (decode steps), ``>= 1``.
    prefix_hash : array_like of int, shape (n,), optional
        Prompt hash per request (``-1`` = unknown), for exact-match prediction.
    name : str
        A label used in reports.
    meta : dict
        Loader notes (source file, skipped rows, generated arrivals...).

    Examples
    --------
    >>> t = Trace(arrival_s=[0.5, 0.0], prompt_len=[10, 20], output_len=[3, 4])
    >>> t.prompt_len.tolist(), t.output_len.tolist(), len(t)
    ([20, 10], [4, 3], 2)
    """

    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    prefix_hash: np.ndarray | None = None
    name: str = "trace"
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for k, v in _trace_iv(self).items():
            object.__setattr__(self, k, v)

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def duration_s(self) -> float:
        """Time from the first to the last arrival."""
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    def subset(self, mask_or_index, *, name: str | None = None) -> Trace:
        """The requests selected by a boolean mask or an index array (times kept).

        Examples
        --------
        >>> t = Trace(arrival_s=[0, 1, 2], prompt_len=[5, 6, 7], output_len=[1, 2, 3])
        >>> t.subset(t.output_len >= 2).prompt_len.tolist()
        [6, 7]
        """
        sel = _selection_iv(mask_or_index, len(self), "Trace.subset")
        return Trace(
            arrival_s=self.arrival_s[sel],
            prompt_len=self.prompt_len[sel],
            output_len=self.output_len[sel],
            prefix_hash=None if self.prefix_hash is None else self.prefix_hash[sel],
            name=self.name if name is None else name,
            meta=self.meta,
        )

    def window(self, start_s: float, end_s: float) -> Trace:
        """Requests arriving in ``[start_s, end_s)`` (relative to the first arrival), re-based
        so the first kept request arrives at 0.

        Examples
        --------
        >>> t = Trace(arrival_s=[0, 1, 2, 3], prompt_len=[5, 6, 7, 8], output_len=[1, 1, 1, 1])
        >>> w = t.window(1, 3)
        >>> w.arrival_s.tolist(), w.prompt_len.tolist()
        ([0.0, 1.0], [6, 7])
        """
        start_s = check_real(start_s, "start_s", "Trace.window", finite=False)
        end_s = check_real(end_s, "end_s", "Trace.window", finite=False)
        rel = self.arrival_s - (self.arrival_s[0] if len(self) else 0.0)
        s = self.subset((rel >= start_s) & (rel < end_s))
        return s.rebase()

    def rebase(self) -> Trace:
        """The same trace with the first arrival at time 0."""
        if not len(self) or self.arrival_s[0] == 0:
            return self
        return Trace(
            arrival_s=self.arrival_s - self.arrival_s[0],
            prompt_len=self.prompt_len,
            output_len=self.output_len,
            prefix_hash=self.prefix_hash,
            name=self.name,
            meta=self.meta,
        )

    def compress(self, factor: float) -> Trace:
        """Divide every arrival time by ``factor`` (``factor > 1`` raises the request rate).

        Examples
        --------
        >>> Trace(arrival_s=[0, 4], prompt_len=[1, 1], output_len=[1, 1]).compress(2).arrival_s
        array([0., 2.])
        """
        factor = check_real(factor, "factor", "Trace.compress", lo=0, lo_open=True)
        return Trace(
            arrival_s=self.arrival_s / factor,
            prompt_len=self.prompt_len,
            output_len=self.output_len,
            prefix_hash=self.prefix_hash,
            name=self.name,
            meta={**self.meta, "compressed": float(factor)},
        )

    def stats(self) -> dict[str, float]:
        """Means and p50s of prompt and output lengths, request rate (per second).

        Examples
        --------
        >>> Trace(arrival_s=[0, 2], prompt_len=[10, 30], output_len=[1, 3]).stats()["prompt_mean"]
        20.0
        """
        n = len(self)
        dur = self.duration_s
        return {
            "n_requests": float(n),
            "duration_s": dur,
            "rate_per_s": (n / dur) if dur > 0 else float("nan"),
            "prompt_mean": float(self.prompt_len.mean()) if n else float("nan"),
            "prompt_p50": float(np.median(self.prompt_len)) if n else float("nan"),
            "output_mean": float(self.output_len.mean()) if n else float("nan"),
            "output_p50": float(np.median(self.output_len)) if n else float("nan"),
        }


# ----------------------------------------------------------------------------------------
# Arrival processes and length models


def _selection_iv(sel, n: int, func: str) -> np.ndarray:
    """A boolean mask of shape ``(n,)`` or an index array of ints in ``[-n, n - 1]``."""
    is_mask = (isinstance(sel, np.ndarray) and sel.dtype == np.bool_) or (
        isinstance(sel, (list, tuple))
        and len(sel) > 0
        and all(isinstance(v, (bool, np.bool_)) for v in sel)
    )
    if is_mask:
        return check_array(sel, "mask_or_index", func, kind="bool", shape=(n,))
    return check_array(
        sel, "mask_or_index", func, kind="int", ndim=1, lo=-n, hi=n - 1,
        expected=f"a boolean mask of shape ({n},) or an array of indices in [{-n}, {n - 1}]",
    )  # fmt: skip


_PROCESSES = ("poisson", "gamma", "mmpp")
_ARRIVAL_OPTIONS = ("process", "cv", "burst_ratio", "burst_frac", "burst_sojourn_s")
#: Most expected MMPP state switches :func:`generate_arrivals` draws (each is a Python step).
_MAX_SWITCHES = 1e7


def generate_arrivals(
    n: int,
    rate: float,
    *,
    process: str = "poisson",
    cv: float = 1.0,
    burst_ratio: float = 4.0,
    burst_frac: float = 0.2,
    burst_sojourn_s: float = 30.0,
    rng=None,
) -> np.ndarray:
    """Arrival times (seconds, the first at 0) of ``n`` requests at mean ``rate`` per second.

    ``process``:

    * ``"poisson"``: exponential gaps.
    * ``"gamma"``: a renewal process with gamma gaps of mean ``1/rate`` and coefficient of
      variation ``cv`` (shape ``1/cv**2``; ``cv = 1`` is Poisson, larger is burstier).
    * ``"mmpp"``: a two-state Markov-modulated Poisson process: a burst state with rate
      ``burst_ratio`` times the calm state's, occupied a fraction ``burst_frac`` of the time
      with mean sojourn ``burst_sojourn_s``; rates scaled so the time-average rate is ``rate``.

    Examples
    --------
    >>> a = generate_arrivals(4, 2.0, rng=0)
    >>> a.shape, float(a[0]), bool(np.all(np.diff(a) >= 0))
    ((4,), 0.0, True)
    """
    func = "generate_arrivals"
    n = check_int(n, "n", func, lo=0, hi=MAX_REQUESTS)
    rate = check_real(rate, "rate", func, lo=0, lo_open=True)
    process = check_choice(process, "process", func, _PROCESSES)
    cv = check_real(cv, "cv", func, lo=0, lo_open=True)
    burst_ratio = check_real(burst_ratio, "burst_ratio", func, lo=0, lo_open=True)
    burst_sojourn_s = check_real(burst_sojourn_s, "burst_sojourn_s", func, lo=0, lo_open=True)
    burst_frac = check_real(burst_frac, "burst_frac", func, lo=0, hi=1, lo_open=True, hi_open=True)
    if process == "mmpp":
        # the sampler draws every state switch: bound their expected number
        switches = n / rate / min(burst_sojourn_s, burst_sojourn_s * (1 - burst_frac) / burst_frac)
        if not switches <= _MAX_SWITCHES:
            raise param_error(
                "burst_sojourn_s",
                func,
                f"long enough for at most {_MAX_SWITCHES:.0e} expected state switches over "
                f"{n} arrivals at rate {rate:g}",
                f"{burst_sojourn_s!r} ({switches:.3g} switches)",
            )
    g = check_rng(rng, func)
    if not math.isfinite(n / rate):
        raise param_error("rate", func, f"large enough for {n} finite arrival times", repr(rate))
    if n == 0:
        return np.zeros(0)
    if process == "poisson":
        gaps = g.exponential(1.0 / rate, size=n - 1)
    elif process == "gamma":
        shape = 1.0 / (cv * cv)
        gaps = g.gamma(shape, 1.0 / (rate * shape), size=n - 1)
    else:  # "mmpp"
        lo = rate / (burst_frac * burst_ratio + (1 - burst_frac))
        hi = lo * burst_ratio
        calm_sojourn = burst_sojourn_s * (1 - burst_frac) / burst_frac
        out = np.empty(n - 1)
        k, state, t_left = 0, 0, g.exponential(calm_sojourn)
        while k < n - 1:
            r = hi if state else lo
            gap = g.exponential(1.0 / r)
            if gap <= t_left:
                # Exponential gaps are memoryless: restart the draw at each state switch.
                t_left -= gap
                out[k] = gap
                k += 1
            else:
                # Carry the time spent in this state into the next gap.
                carry = t_left
                state = 1 - state
                t_left = g.exponential(burst_sojourn_s if state else calm_sojourn)
                while True:
                    r = hi if state else lo
                    gap = g.exponential(1.0 / r)
                    if gap <= t_left:
                        t_left -= gap
                        out[k] = carry + gap
                        k += 1
                        break
                    carry += t_left
                    state = 1 - state
                    t_left = g.exponential(burst_sojourn_s if state else calm_sojourn)
        gaps = out
    out = np.concatenate([[0.0], np.cumsum(gaps)])
    if not np.isfinite(out[-1]):  # a tiny rate: gaps near the float maximum overflow
        raise param_error("rate", func, f"large enough for {n} finite arrival times", repr(rate))
    return out


@dataclass(frozen=True, eq=False, kw_only=True)
class LengthModel:
    """A lognormal mixture of token lengths, rounded and clipped to ``[lo, hi]``.

    Component ``j`` has weight ``weights[j]`` and ``log(length) ~ N(log_means[j],
    log_stds[j]**2)``. Lognormal mixtures are heavy-tailed (subexponential), which is what the
    public traces show: a long right tail of prompts (Mooncake p99 is 12x the median).

    Examples
    --------
    >>> m = LengthModel(weights=(1.0,), log_means=(np.log(100),), log_stds=(0.0,), lo=1, hi=500)
    >>> m.sample(3, rng=0).tolist()
    [100, 100, 100]
    """

    weights: tuple[float, ...]
    log_means: tuple[float, ...]
    log_stds: tuple[float, ...]
    lo: int = 1
    hi: int = 1_000_000

    def __post_init__(self) -> None:
        for k, v in _length_model_iv(self).items():
            object.__setattr__(self, k, v)

    def sample(self, n: int, *, rng=None) -> np.ndarray:
        """Draw ``n`` integer lengths."""
        n = check_int(n, "n", "LengthModel.sample", lo=0, hi=MAX_REQUESTS)
        g = check_rng(rng, "LengthModel.sample")
        w = np.asarray(self.weights, dtype=float)
        comp = g.choice(w.size, size=n, p=w / w.sum())
        x = g.normal(np.asarray(self.log_means)[comp], np.asarray(self.log_stds)[comp])
        with np.errstate(over="ignore"):  # exp overflows to inf, clipped to hi below
            return np.clip(np.rint(np.exp(x)), self.lo, self.hi).astype(np.int64)


def _length_model_iv(m: LengthModel) -> dict:
    func = "LengthModel"
    w = check_array(m.weights, "weights", func, ndim=1, lo=0)
    if w.size == 0 or not math.isclose(w.sum(), 1.0, rel_tol=1e-6):
        raise param_error(
            "weights", func, "a non-empty sequence of non-negative numbers summing to 1",
            describe(m.weights),
        )  # fmt: skip
    k = w.size
    mu = check_array(m.log_means, "log_means", func, shape=(k,))
    sd = check_array(m.log_stds, "log_stds", func, shape=(k,), lo=0)
    lo = check_int(m.lo, "lo", func, lo=1, hi=MAX_LENGTH)
    hi = check_int(m.hi, "hi", func, lo=lo, hi=MAX_LENGTH)
    return {
        "weights": tuple(float(v) for v in w),
        "log_means": tuple(float(v) for v in mu),
        "log_stds": tuple(float(v) for v in sd),
        "lo": lo,
        "hi": hi,
    }


def fit_length_model(lengths, *, n_components: int = 3, n_iter: int = 200) -> LengthModel:
    """Fit a :class:`LengthModel` by EM on ``log(lengths)`` (deterministic initialisation).

    Components start at evenly spaced quantiles of the log lengths; ``[lo, hi]`` is the
    sample's range. This is how :data:`WORKLOAD_PRESETS` was produced.

    Examples
    --------
    >>> m = fit_length_model([10, 10, 10, 1000, 1000, 1000], n_components=2)
    >>> [round(float(np.exp(mu))) for mu in m.log_means], m.lo, m.hi
    ([10, 1000], 10, 1000)
    """
    func = "fit_length_model"
    k = check_int(n_components, "n_components", func, lo=1)
    n_iter = check_int(n_iter, "n_iter", func, lo=0)
    a = check_array(lengths, "lengths", func, ndim=1, lo=1, hi=MAX_LENGTH)
    if a.size < k:
        raise param_error(
            "lengths", func, f"at least n_components={k} values >= 1", f"{a.size} values"
        )
    x = np.log(a)
    mu = np.quantile(x, np.linspace(0.1, 0.9, k)) if k > 1 else np.array([x.mean()])
    sd = np.full(k, max(x.std() / k, 1e-3))
    w = np.full(k, 1.0 / k)
    for _ in range(n_iter):
        dens = w * np.exp(-0.5 * ((x[:, None] - mu) / sd) ** 2) / sd
        tot = dens.sum(axis=1, keepdims=True)
        r = dens / np.where(tot > 0, tot, 1.0)
        nk = r.sum(axis=0) + 1e-12
        w = nk / nk.sum()
        mu = (r * x[:, None]).sum(axis=0) / nk
        sd = np.sqrt((r * (x[:, None] - mu) ** 2).sum(axis=0) / nk) + 1e-3
    return LengthModel(
        weights=tuple(float(v) for v in w / w.sum()),
        log_means=tuple(float(v) for v in mu),
        log_stds=tuple(float(v) for v in sd),
        lo=int(a.min()),
        hi=int(a.max()),
    )


def _lm(w, mu, sd, lo, hi) -> LengthModel:
    return LengthModel(weights=w, log_means=mu, log_stds=sd, lo=lo, hi=hi)


#: Generator presets fitted to the public traces in ``data/traces`` (see that folder's README).
#: Lengths: :func:`fit_length_model` with 3 components, rounded to 3 digits. Arrivals: the
#: mean request rate of the trace and the coefficient of variation of its inter-arrival gaps
#: (gamma renewal process). Figures (trace -> generator, 200k draws): mean / p50 tokens
#:
#: * ``azure_conv``: prompt 1,155 / 1,020 -> 1,175 / 1,001; output 211 / 129 -> 210 / 129;
#:   5.53 req/s, gap CV 1.09.
#: * ``azure_code``: prompt 2,048 / 1,469 -> 2,041 / 1,483; output 28 / 13 -> 27 / 13;
#:   2.57 req/s, gap CV 13.2 (very bursty).
#: * ``mooncake_conv``: prompt 12,035 / 6,909 -> 11,930 / 7,122; output 343 / 350 -> 341 / 349;
#:   3.40 req/s, gap CV 3.03.
#: * ``bursty`` (the default workload): ``azure_conv`` lengths with MMPP arrivals (bursts at 4x
#:   the calm rate, 20% of the time, 30 s mean), at the conversation trace's mean rate.
#:
#: ``tests/test_traces.py`` refits the real traces and checks these figures.
WORKLOAD_PRESETS: dict[str, dict[str, Any]] = {
    "azure_conv": dict(
        prompt=_lm((0.632, 0.295, 0.073), (6.277, 6.978, 8.316), (1.013, 0.062, 0.005), 2, 14050),
        output=_lm((0.284, 0.435, 0.281), (4.727, 4.573, 6.006), (1.021, 0.364, 0.05), 7, 1000),
        rate=5.53,
        process="gamma",
        cv=1.09,
    ),
    "azure_code": dict(
        prompt=_lm((0.313, 0.638, 0.049), (5.53, 7.574, 8.914), (1.291, 0.644, 0.002), 3, 7437),
        output=_lm((0.206, 0.5, 0.294), (1.998, 2.559, 3.735), (0.179, 0.362, 0.883), 6, 1899),
        rate=2.57,
        process="gamma",
        cv=13.2,
    ),
    "mooncake_conv": dict(
        prompt=_lm((0.082, 0.117, 0.801), (6.804, 7.156, 9.165), (0.01, 0.237, 0.927), 891, 126195),
        output=_lm((0.242, 0.295, 0.463), (3.454, 5.743, 6.06), (1.492, 0.654, 0.268), 1, 2000),
        rate=3.40,
        process="gamma",
        cv=3.03,
    ),
}
WORKLOAD_PRESETS["bursty"] = dict(
    prompt=WORKLOAD_PRESETS["azure_conv"]["prompt"],
    output=WORKLOAD_PRESETS["azure_conv"]["output"],
    rate=5.53,
    process="mmpp",
    cv=1.0,
)


def generate_trace(
    preset: str = "bursty",
    *,
    duration_s: float = 3600.0,
    n_requests: int | None = None,
    rate: float | None = None,
    rng=0,
    **arrival_options,
) -> Trace:
    """A synthetic trace from one of :data:`WORKLOAD_PRESETS`.

    Parameters
    ----------
    preset : str
        ``"bursty"`` (default), ``"azure_conv"``, ``"azure_code"`` or ``"mooncake_conv"``.
    duration_s : float
        Length of the trace; the number of requests is ``round(rate * duration_s)`` unless
        ``n_requests`` is given.
    n_requests : int, optional
    rate : float, optional
        Mean requests per second (default: the preset's, i.e. the real trace's).
    rng : None, int or Generator
        Seed (default 0: the same trace every call).
    **arrival_options
        Passed to :func:`generate_arrivals` (``process``, ``cv``, ``burst_ratio``...).

    Examples
    --------
    >>> t = generate_trace("azure_conv", n_requests=5, rng=1)
    >>> len(t), t.name, float(t.arrival_s[0])
    (5, 'gen:azure_conv', 0.0)
    """
    func = "generate_trace"
    p = WORKLOAD_PRESETS[check_choice(preset, "preset", func, sorted(WORKLOAD_PRESETS))]
    rate = p["rate"] if rate is None else check_real(rate, "rate", func, lo=0, lo_open=True)
    duration_s = check_real(duration_s, "duration_s", func, lo=0, lo_open=True)
    if n_requests is None:
        expected = rate * duration_s
        if not expected <= MAX_REQUESTS:
            raise param_error(
                "duration_s", func, f"short enough for at most {MAX_REQUESTS} requests at "
                f"rate {rate:g}", repr(duration_s),
            )  # fmt: skip
        n_requests = int(round(expected))
    n_requests = check_int(n_requests, "n_requests", func, lo=0, hi=MAX_REQUESTS)
    check_options(arrival_options, _ARRIVAL_OPTIONS, func)
    g = check_rng(rng, func)
    opts = {"process": p["process"], "cv": p["cv"], **arrival_options}
    arr = generate_arrivals(n_requests, rate, rng=g, **opts)
    return Trace(
        arrival_s=arr,
        prompt_len=p["prompt"].sample(n_requests, rng=g),
        output_len=p["output"].sample(n_requests, rng=g),
        name=f"gen:{preset}",
        meta={"preset": preset, "rate": rate, **opts},
    )


def saturate_trace(
    trace: Trace,
    *,
    n_replicas: int,
    max_slots: int,
    step_time_s: float,
    min_output: int = 0,
    overload: float = 1.5,
) -> Trace:
    """Filter and time-compress a trace so the decode cluster stays saturated.

    The paper kept the Azure-2024 requests with output > 1000 tokens so that the pool never
    drains. Our public traces are shorter (Azure 2023 conversation outputs are capped at
    1,000), so the equivalent here is: keep requests with ``output_len >= min_output``, then
    compress arrivals so that the offered decode work is ``overload`` times the cluster's
    capacity: ``rate * mean(output) * step_time_s = overload * n_replicas * max_slots``
    (Little's law with every slot busy and ``step_time_s`` an estimate of the step time).

    Examples
    --------
    >>> t = Trace(arrival_s=[0, 10, 20], prompt_len=[1, 1, 1], output_len=[5, 50, 50])
    >>> s = saturate_trace(t, n_replicas=1, max_slots=1, step_time_s=0.1, min_output=10)
    >>> s.arrival_s.tolist()
    [0.0, 3.333333333333333]
    """
    func = "saturate_trace"
    check_type(trace, "trace", func, Trace, "a Trace")
    n_replicas = check_int(n_replicas, "n_replicas", func, lo=1)
    max_slots = check_int(max_slots, "max_slots", func, lo=1)
    min_output = check_int(min_output, "min_output", func, lo=0)
    overload = check_real(overload, "overload", func, lo=0, lo_open=True)
    step_time_s = check_real(step_time_s, "step_time_s", func, lo=0, lo_open=True)
    kept = trace.subset(trace.output_len >= min_output).rebase()
    if len(kept) < 2:
        raise param_error("min_output", func, "a filter keeping >= 2 requests", str(min_output))
    capacity_rate = n_replicas * max_slots / (float(kept.output_len.mean()) * step_time_s)
    target_rate = overload * capacity_rate
    rate = (len(kept) - 1) / kept.duration_s if kept.duration_s > 0 else math.inf
    out = kept.compress(target_rate / rate) if math.isfinite(rate) else kept
    return Trace(
        arrival_s=out.arrival_s,
        prompt_len=out.prompt_len,
        output_len=out.output_len,
        prefix_hash=out.prefix_hash,
        name=trace.name + ":saturated",
        meta={**trace.meta, "saturated": dict(min_output=min_output, overload=overload)},
    )


# ----------------------------------------------------------------------------------------
# Loaders


def _bad_row(path: str, line: int, what: str) -> InvalidInputError:
    return InvalidInputError(f"Malformed row in trace file {path!r}, line {line}: {what}.")


_INT_RE = re.compile(r"\+?[0-9]+", re.ASCII)


def _parse_int(s: str, path: str, line: int, col: str) -> int:
    """A token length: a non-negative integer up to :data:`MAX_LENGTH` (``12``, ``12.0`` or
    ``1.2e1``; never ``nan``, ``inf``, ``1_2`` or ``True``)."""
    if _INT_RE.fullmatch(s):
        v = int(s)
    else:
        try:
            f = float(s) if "_" not in s else math.nan
        except ValueError:
            raise _bad_row(path, line, f"column {col!r} is not a number ({s[:40]!r})") from None
        if not math.isfinite(f) or f != math.floor(f):
            raise _bad_row(path, line, f"column {col!r} must be a non-negative integer ({s!r})")
        v = int(f)
    if not 0 <= v <= MAX_LENGTH:
        raise _bad_row(path, line, f"column {col!r} must be an integer in [0, 2**53] ({s[:40]!r})")
    return v


def _parse_float(s: str, path: str, line: int, col: str) -> float:
    try:
        v = float(s) if "_" not in s else math.nan
    except ValueError:
        raise _bad_row(path, line, f"column {col!r} is not a number ({s[:40]!r})") from None
    if not math.isfinite(v):
        raise _bad_row(path, line, f"column {col!r} is not a finite number ({s[:40]!r})")
    return v


def _hash_ids(ids) -> int:
    h = hashlib.blake2b(json.dumps(list(ids)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFF_FFFF_FFFF_FFFF


_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"


def _read_text(path: str) -> str:
    """The file's text: gzip- and xz-compressed files are decompressed; the bytes must be
    UTF-8 (a BOM is dropped) without NUL bytes. Errors name the file and the line."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise InvalidInputError(
                f"Trace file {path!r} starts like a gzip file but does not decompress ({e})."
            ) from None
    elif data[:6] == _XZ_MAGIC:
        try:
            data = lzma.decompress(data, format=lzma.FORMAT_XZ)
        except (lzma.LZMAError, EOFError) as e:
            raise InvalidInputError(
                f"Trace file {path!r} starts like an xz file but does not decompress ({e})."
            ) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InvalidInputError(
            f"Trace file {path!r} is not UTF-8 text: line {line} has the byte "
            f"{data[e.start : e.start + 1]!r} (offset {e.start}); expected a CSV or JSONL "
            "trace, optionally gzip- or xz-compressed."
        ) from None
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise InvalidInputError(
            f"Trace file {path!r} holds binary data: a NUL byte on line {line}; expected a "
            "CSV or JSONL trace, optionally gzip- or xz-compressed."
        )
    return text


def _read_rows(path: str, text: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise InvalidInputError(f"Trace file {path!r} is empty.") from None
        rows = [(reader.line_num, r) for r in reader if r and any(c.strip() for c in r)]
    except csv.Error as e:
        raise _bad_row(path, reader.line_num, f"not CSV ({e})") from None
    return header, rows


def _cols(header, names, path) -> list[int]:
    low = [h.lower() for h in header]
    idx = []
    for nm in names:
        if nm.lower() not in low:
            raise InvalidInputError(f"Trace file {path!r} has no column {nm!r} (header {header}).")
        idx.append(low.index(nm.lower()))
    return idx


def _load_azure(path, header, rows) -> Trace:
    it, ip, io = _cols(header, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], path)
    n = len(rows)
    t = np.empty(n)
    p = np.empty(n, dtype=np.int64)
    o = np.empty(n, dtype=np.int64)
    t0 = None
    for k, (line, r) in enumerate(rows):
        if len(r) != len(header):
            raise _bad_row(path, line, f"expected {len(header)} fields, got {len(r)}")
        try:
            ts = _dt.datetime.fromisoformat(r[it].strip())
        except ValueError:
            raise _bad_row(path, line, f"bad timestamp {r[it]!r}") from None
        if ts.tzinfo is None:
            ts = ts.replace(tzinfo=_dt.UTC)
        if t0 is None:
            t0 = ts
        t[k] = (ts - t0).total_seconds()
        p[k] = _parse_int(r[ip].strip(), path, line, header[ip])
        o[k] = _parse_int(r[io].strip(), path, line, header[io])
        if o[k] < 1:
            raise _bad_row(path, line, f"{header[io]} must be >= 1 (got {o[k]})")
    if n:
        t -= t.min()
    return Trace(arrival_s=t, prompt_len=p, output_len=o, meta={"format": "azure"})


def _load_burstgpt(path, header, rows) -> Trace:
    it, ip, io, il = _cols(
        header, ["Timestamp", "Request tokens", "Response tokens", "Log Type"], path
    )
    t, p, o = [], [], []
    skipped = 0
    for line, r in rows:
        if len(r) != len(header):
            raise _bad_row(path, line, f"expected {len(header)} fields, got {len(r)}")
        ts = _parse_float(r[it].strip(), path, line, header[it])
        pi = _parse_int(r[ip].strip(), path, line, header[ip])
        oi = _parse_int(r[io].strip(), path, line, header[io])
        if oi == 0 or "fail" in r[il].lower():
            skipped += 1
            continue
        t.append(ts)
        p.append(pi)
        o.append(oi)
    t = np.asarray(t, dtype=float)
    if t.size:
        t -= t.min()
    return Trace(
        arrival_s=t,
        prompt_len=np.asarray(p, dtype=np.int64),
        output_len=np.asarray(o, dtype=np.int64),
        meta={"format": "burstgpt", "skipped_failed": skipped},
    )


def _load_lengths(path, header, rows, rate, arrivals, cv, rng) -> Trace:
    ip, io = _cols(header, ["num_prefill_tokens", "num_decode_tokens"], path)
    if rate is None:
        raise param_error(
            "rate", "load_trace", "a positive request rate for a length-only trace", "None"
        )
    p = np.empty(len(rows), dtype=np.int64)
    o = np.empty(len(rows), dtype=np.int64)
    for k, (line, r) in enumerate(rows):
        if len(r) != len(header):
            raise _bad_row(path, line, f"expected {len(header)} fields, got {len(r)}")
        p[k] = _parse_int(r[ip].strip(), path, line, header[ip])
        o[k] = _parse_int(r[io].strip(), path, line, header[io])
        if o[k] < 1:
            raise _bad_row(path, line, f"{header[io]} must be >= 1 (got {o[k]})")
    g = check_rng(rng, "load_trace")
    t = generate_arrivals(len(rows), rate, process=arrivals, cv=cv, rng=g)
    return Trace(
        arrival_s=t,
        prompt_len=p,
        output_len=o,
        meta={"format": "lengths", "rate": rate, "process": arrivals, "cv": cv},
    )


def _mooncake_int(d: dict, key: str, lo: int, path: str, line: int) -> int:
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= MAX_LENGTH:
        raise _bad_row(
            path, line, f"{key!r} must be an integer in [{lo}, 2**53] (got {describe(v)})"
        )
    return v


def _load_mooncake(path, text) -> Trace:
    t, p, o, h = [], [], [], []
    for line, s in enumerate(text.splitlines(), start=1):
        if not s.strip():
            continue
        try:
            d = json.loads(s)
        except (json.JSONDecodeError, RecursionError) as e:
            raise _bad_row(path, line, f"not a JSON record ({type(e).__name__}: {e})") from None
        if not isinstance(d, dict):
            raise _bad_row(path, line, f"a Mooncake record is a JSON object (got {describe(d)})")
        missing = [k for k in ("timestamp", "input_length", "output_length") if k not in d]
        if missing:
            raise _bad_row(path, line, f"a Mooncake record needs the key(s) {missing}")
        ts = d["timestamp"]
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
            raise _bad_row(
                path, line, f"'timestamp' must be a finite number of ms (got {describe(ts)})"
            )
        pi = _mooncake_int(d, "input_length", 0, path, line)
        oi = _mooncake_int(d, "output_length", 1, path, line)
        ids = d.get("hash_ids")
        if ids is not None and not (
            isinstance(ids, list)
            and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
        ):
            raise _bad_row(
                path, line, f"'hash_ids' must be a list of integers (got {describe(ids)})"
            )
        t.append(float(ts) / 1000.0)
        p.append(pi)
        o.append(oi)
        h.append(_hash_ids(ids) if ids else -1)
    t = np.asarray(t, dtype=float)
    if t.size:
        t -= t.min()
    return Trace(
        arrival_s=t,
        prompt_len=np.asarray(p, dtype=np.int64),
        output_len=np.asarray(o, dtype=np.int64),
        prefix_hash=np.asarray(h, dtype=np.int64),
        meta={"format": "mooncake"},
    )


_FORMATS = ("azure", "mooncake", "burstgpt", "lengths")


#: Suffixes a trace file may carry beyond its name, in the order :func:`find_trace` tries them.
TRACE_SUFFIXES = ("", ".xz", ".gz")


def traces_dir() -> pathlib.Path:
    """The folder :func:`find_trace` reads: ``$STRAGGLER_TRACES`` when set, else the traces
    shipped inside the package (``straggler/sim/workloads/data``)."""
    env = os.environ.get("STRAGGLER_TRACES")
    if env:
        return pathlib.Path(env)
    return pathlib.Path(__file__).resolve().parent / "data"


def find_trace(file: str, directory=None, *, name: str | None = None) -> pathlib.Path:
    """The path of the trace ``file`` (a base name such as
    ``"AzureLLMInferenceTrace_conv.csv"``) in ``directory``, else in :func:`traces_dir`:
    the file itself, or the same name with ``.xz`` or ``.gz`` (:func:`load_trace` reads both).

    Parameters
    ----------
    file : str
        The trace's file name.
    directory : str or os.PathLike, optional
        The folder to look in (default :func:`traces_dir`).
    name : str, optional
        What the user called the trace (``"azure_conv"``), for the error message.

    Raises
    ------
    InvalidInputError
        No such file there; the message names the trace, the folder and where it came from.

    Examples
    --------
    >>> find_trace("AzureLLMInferenceTrace_code.csv").name
    'AzureLLMInferenceTrace_code.csv.xz'
    """
    if directory is None:
        folder, origin = (
            traces_dir(),
            ("$STRAGGLER_TRACES" if os.environ.get("STRAGGLER_TRACES") else "the package"),
        )
    else:
        folder, origin = pathlib.Path(os.fspath(directory)), "the folder given"
    for suffix in TRACE_SUFFIXES:
        path = folder / (file + suffix)
        if path.is_file():
            return path
    label = f"The trace {name!r}" if name else f"The trace file {file!r}"
    hint = (
        " (unset STRAGGLER_TRACES to use the traces shipped with the package)"
        if origin == "$STRAGGLER_TRACES"
        else ""
    )
    raise InvalidInputError(
        f"{label} needs {file} (or {file}.xz, {file}.gz) in {folder}, the folder {origin} "
        f"names; it is not there{hint}."
    )


def _load_trace_iv(path, format, rate, arrivals, cv, rng):
    func = "load_trace"
    path = check_input_file(path, "path", func)
    if format is not None:
        check_choice(format, "format", func, _FORMATS)
    if rate is not None:
        rate = check_real(rate, "rate", func, lo=0, lo_open=True)
    arrivals = check_choice(arrivals, "arrivals", func, _PROCESSES)
    cv = check_real(cv, "cv", func, lo=0, lo_open=True)
    check_rng(rng, func)
    return path, format, rate, arrivals, cv, rng


def load_trace(
    path,
    *,
    format: str | None = None,
    rate: float | None = None,
    arrivals: str = "poisson",
    cv: float = 1.0,
    rng=0,
) -> Trace:
    """Load a request trace; the format is detected from the header (or the first record).

    Parameters
    ----------
    path : str or os.PathLike
    format : {None, "azure", "mooncake", "burstgpt", "lengths"}
        Force a format instead of detecting it.
    rate, arrivals, cv, rng
        For length-only traces: mean request rate (per second, required), arrival process
        (``"poisson"`` or ``"gamma"`` with coefficient of variation ``cv``), seed.

    Returns
    -------
    Trace
        Sorted by arrival, first arrival at 0, ``name`` = the file's base name.

    Raises
    ------
    InvalidInputError
        Unknown format, missing column, or a malformed row (the message names the file and
        the line).

    Examples
    --------
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); f = os.path.join(d, "a.csv")
    >>> _ = open(f, "w", newline="").write(
    ...     "TIMESTAMP,ContextTokens,GeneratedTokens\\r\\n"
    ...     "2023-11-16 18:15:46.6805900,374,44\\r\\n2023-11-16 18:15:47.1805900,396,109")
    >>> t = load_trace(f)
    >>> t.arrival_s.tolist(), t.prompt_len.tolist(), t.output_len.tolist()
    ([0.0, 0.5], [374, 396], [44, 109])
    """
    path, format, rate, arrivals, cv, rng = _load_trace_iv(path, format, rate, arrivals, cv, rng)
    text = _read_text(path)
    if format is None:
        first = text.split("\n", 1)[0].strip()
        low = first.lower()
        if first.startswith("{"):
            format = "mooncake"
        elif "contexttokens" in low and "generatedtokens" in low:
            format = "azure"
        elif "request tokens" in low and "response tokens" in low:
            format = "burstgpt"
        elif "num_prefill_tokens" in low and "num_decode_tokens" in low:
            format = "lengths"
        else:
            raise InvalidInputError(
                f"Cannot detect the format of trace file {path!r} from its first line "
                f"{first[:80]!r}: expected an Azure, BurstGPT or length-only CSV header, or a "
                "Mooncake JSON record."
            )
    if format == "mooncake":
        tr = _load_mooncake(path, text)
    else:
        header, rows = _read_rows(path, text)
        if format == "azure":
            tr = _load_azure(path, header, rows)
        elif format == "burstgpt":
            tr = _load_burstgpt(path, header, rows)
        else:
            tr = _load_lengths(path, header, rows, rate, arrivals, cv, rng)
    return Trace(
        arrival_s=tr.arrival_s,
        prompt_len=tr.prompt_len,
        output_len=tr.output_len,
        prefix_hash=tr.prefix_hash,
        name=os.path.basename(path),
        meta={**tr.meta, "path": path},
    )
