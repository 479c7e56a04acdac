"""Drifting expert loads: generated windows, and real recordings that switch between tasks.

:func:`load_esft_counts` reads real drift: DeepSeek-V2-Lite's per-sequence expert counts on
four tasks (``../shared/data/expert_loads/esft_per_sequence_counts.npz``, counted from
deepseek-ai/ESFT; MIT), whose popularity differs from task to task; played one task after
another (``straggler.sim.engine.deployment.RoutingSequence`` of
``RoutingModel.recorded`` per task), a deployment sees its hot experts change as its traffic
changes task. The rest of this module generates drift.

Drifting windows of routed batches: the workload of the plan-on-one-window benchmark.

An EPLB replacement is judged the way EPLB runs: a placement is planned from the loads
recorded over window ``i`` and serves window ``i + 1``, which it has not seen. What makes
that hard is drift: the hot experts of one window are not quite those of the next.
:func:`drifting_windows` generates such windows. Each layer starts from a Zipf(``skew``)
popularity over a random permutation of the experts
(:func:`~straggler.sim.workloads.batches.zipf_popularity`), and every expert a latent score, the log
of its popularity. Between windows, every score takes an independent Gaussian step of
standard deviation ``drift``; the experts are re-ranked by score and each takes the Zipf
popularity of its new rank. So the popularity *distribution* (the skew) stays exactly Zipf
while *which* experts are hot drifts, gradually: at the head, where the Zipf ranks are far
apart in log popularity (``s log((r + 2) / (r + 1))``), ranks change rarely, in the tail
often. Within a window, every
batch is routed by :func:`~straggler.sim.workloads.batches.sample_counts` (Dirichlet(``kappa``)
batch-to-batch noise around the window's popularity, top-``k`` distinct experts per token,
TEMPO §3.2).
"""

from __future__ import annotations

import numpy as np

from ...formulations.errors import param_error
from ...formulations.validation import check_int, check_real, check_rng
from .batches import DEFAULT_KAPPA, MAX_EXPERTS, MAX_LAYERS, sample_counts, zipf_popularity

__all__ = ["drifting_windows", "load_esft_counts", "ESFT_TASKS"]

#: The four ESFT tasks of ``esft_per_sequence_counts.npz``, in the file's order.
ESFT_TASKS = ("intent", "law", "summary", "translation")

_FUNC = "drifting_windows"


def drifting_windows(
    *,
    n_windows: int,
    window: int,
    n_layers: int,
    n_experts: int,
    n_tokens: int,
    top_k: int,
    skew: float,
    drift: float = 0.1,
    kappa: float = DEFAULT_KAPPA,
    rng=None,
):
    """Routed batches in ``n_windows`` consecutive windows whose hot experts drift.

    Parameters
    ----------
    n_windows : int
        Windows (``>= 1``).
    window : int
        Batches per window (``>= 1``).
    n_layers, n_experts : int
    n_tokens : int
        Tokens per batch (tokens per GPU times GPUs).
    top_k : int
        Distinct experts per token (``<= n_experts``).
    skew : float
        Zipf exponent of the popularity (``>= 0``).
    drift : float, default 0.1
        Standard deviation of the step of every expert's log popularity between two windows
        (``>= 0``; 0: no drift).
    kappa : float, default 2000
        Dirichlet concentration of the batch-to-batch noise.
    rng : None, int or numpy.random.Generator

    Returns
    -------
    ndarray of int64, shape (n_windows, window, n_layers, n_experts)
        Tokens per expert; every (batch, layer) row sums to ``n_tokens * top_k``.

    Raises
    ------
    InvalidInputError
        A parameter out of range.

    Examples
    --------
    >>> w = drifting_windows(n_windows=3, window=2, n_layers=1, n_experts=8, n_tokens=64,
    ...                      top_k=2, skew=1.0, drift=0.3, rng=0)
    >>> w.shape, sorted(set(w.sum(axis=3).ravel().tolist()))
    ((3, 2, 1, 8), [128])
    """
    n_windows = check_int(n_windows, "n_windows", _FUNC, lo=1, hi=10_000)
    window = check_int(window, "window", _FUNC, lo=1, hi=100_000)
    n_layers = check_int(n_layers, "n_layers", _FUNC, lo=1, hi=MAX_LAYERS)
    n_experts = check_int(n_experts, "n_experts", _FUNC, lo=1, hi=MAX_EXPERTS)
    top_k = check_int(top_k, "top_k", _FUNC, lo=1, hi=n_experts)
    skew = check_real(skew, "skew", _FUNC, lo=0.0)
    drift = check_real(drift, "drift", _FUNC, lo=0.0, hi=10.0)
    gen = check_rng(rng, _FUNC)
    pop = zipf_popularity(n_experts, skew, n_layers=n_layers, rng=gen)
    weights = -np.sort(-pop, axis=1)  # each layer's Zipf popularity by rank
    score = np.log(pop)
    out = np.empty((n_windows, window, n_layers, n_experts), dtype=np.int64)
    for i in range(n_windows):
        if i and drift > 0:
            score = score + drift * gen.standard_normal(score.shape)
            for l in range(n_layers):
                pop[l, np.argsort(-score[l], kind="stable")] = weights[l]
        for b in range(window):
            out[i, b] = sample_counts(pop, n_tokens=n_tokens, top_k=top_k, kappa=kappa, rng=gen)
    return out


def load_esft_counts(path) -> dict[str, np.ndarray]:
    """DeepSeek-V2-Lite's per-sequence expert counts on the ESFT tasks, by task.

    Parameters
    ----------
    path : path
        ``esft_per_sequence_counts.npz`` (arrays ``<task>_counts`` of shape ``(n_seq, 26,
        64)``: tokens of one sequence routed to each of the 64 experts of each of the 26 MoE
        layers, top-6; ``../shared/data/expert_loads/README.md``).

    Returns
    -------
    dict of str to ndarray of int64, shape (n_seq, 26, 64)
        For each of :data:`ESFT_TASKS` present in the file, in that order.

    Raises
    ------
    InvalidInputError
        A file that is not such an archive.
    """
    func = "load_esft_counts"
    try:
        with np.load(path) as z:
            out = {t: np.asarray(z[f"{t}_counts"], dtype=np.int64) for t in ESFT_TASKS
                   if f"{t}_counts" in z.files}  # fmt: skip
    except (OSError, ValueError) as e:
        raise param_error("path", func, "an .npz archive of <task>_counts arrays",
                          f"{path!r} ({e})") from None  # fmt: skip
    if not out:
        raise param_error("path", func, f"an archive with <task>_counts for {ESFT_TASKS}",
                          repr(path))  # fmt: skip
    for t, c in out.items():
        if c.ndim != 3 or (c < 0).any():
            raise param_error("path", func, "(n_seq, n_layers, n_experts) non-negative counts",
                              f"{t}_counts of shape {c.shape}")  # fmt: skip
    return out
