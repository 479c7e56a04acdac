"""Drifting expert loads: generated windows, and real recordings that switch between tasks.

:func:`load_esft_counts` reads real drift: DeepSeek-V2-Lite's per-sequence expert counts on
four tasks (``../shared/data/expert_loads/esft_per_sequence_counts.npz``, counted from
deepseek-ai/ESFT; MIT), whose popularity differs from task to task; played one task after
another (``straggler.sim.engine.deployment.RoutingSequence`` of
``RoutingModel.recorded`` per task), a deployment sees its hot experts change as its traffic
changes task. :func:`load_mixtral_popularity` reads Mixtral-8x7B's expert popularity per
MMLU subject (``../shared/data/expert_loads/fiddler_mixtral8x7b_popularity``, recorded by
efeslab/fiddler; Apache-2.0), base and Instruct: one total per subject, played the same way
(one ``RoutingModel.recorded`` of the subject's total per subject). The rest of this module
generates drift.

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

import json
import os

import numpy as np

from ...formulations._io import check_path_arg
from ...formulations.errors import param_error
from ...formulations.validation import check_choice, check_int, check_real, check_rng
from .batches import DEFAULT_KAPPA, MAX_EXPERTS, MAX_LAYERS, sample_counts, zipf_popularity

__all__ = [
    "drifting_windows",
    "load_esft_counts",
    "ESFT_TASKS",
    "read_popularity",
    "load_mixtral_popularity",
    "mixtral_popularity_file",
    "MIXTRAL_SUBJECTS",
    "MIXTRAL_VARIANTS",
]

#: The four ESFT tasks of ``esft_per_sequence_counts.npz``, in the file's order.
ESFT_TASKS = ("intent", "law", "summary", "translation")
#: The seven MMLU subjects of the Mixtral popularity recordings, in the order they are played:
#: alphabetical (the files' order in their folder).
MIXTRAL_SUBJECTS = (
    "college_computer_science", "college_medicine", "high_school_biology",
    "high_school_mathematics", "high_school_us_history", "international_law",
    "machine_learning",
)  # fmt: skip
#: The recorded Mixtral-8x7B variants: the Instruct model and the base model ("original").
MIXTRAL_VARIANTS = ("instruct", "original")

_FUNC = "drifting_windows"
#: Largest token count a popularity file may hold (a layer of MAX_EXPERTS such counts sums
#: within int64).
_MAX_COUNT = 2**40


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


def read_popularity(path) -> np.ndarray:
    """One recorded expert popularity: tokens routed to each expert of each MoE layer.

    The format of efeslab/fiddler's popularity benchmark (branch ``popularity``,
    ``benchmarks/results/popularity/``): a JSON object whose ``"expert_popularity"`` holds one
    list per MoE layer of one non-negative integer per expert, the token-to-expert assignments
    summed over a workload (a top-``k`` token adds 1 to each of its ``k`` experts); other
    fields (``"total_input_tokens"``) are not read. Every layer routes the same tokens, so
    every layer's sum is the same, and positive.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    ndarray of int64, shape (n_layers, n_experts)

    Raises
    ------
    InvalidInputError
        A file that cannot be read or is not such an object; the message names the file and
        the field.

    Examples
    --------
    >>> import json, tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "p.json")
    >>> _ = open(f, "w").write(json.dumps({"expert_popularity": [[3, 1, 2], [2, 2, 2]]}))
    >>> read_popularity(f).tolist()
    [[3, 1, 2], [2, 2, 2]]
    """
    func = "read_popularity"
    p = check_path_arg(path, "path", func)
    form = ('a JSON object whose "expert_popularity" is a list of n_layers lists of n_experts '
            "integers in [0, 2**40], every layer with the same positive sum")  # fmt: skip
    try:
        with open(p, encoding="utf-8") as fh:
            obj = json.load(fh)
    except (OSError, ValueError) as e:
        raise param_error("path", func, form, f"{p} ({e})") from None
    rows = obj.get("expert_popularity") if isinstance(obj, dict) else None
    if not isinstance(rows, list) or not rows:
        what = f"keys {sorted(obj)[:8]}" if isinstance(obj, dict) else type(obj).__name__
        raise param_error("path", func, form, f"{p} holding {what}")
    E = len(rows[0]) if isinstance(rows[0], list) else 0
    for l, row in enumerate(rows):
        if not isinstance(row, list) or not row or len(row) != E:
            raise param_error(
                "path", func, form,
                f'{p}: "expert_popularity"[{l}] is {str(row)[:40]} (layer 0 has {E} experts)',
            )  # fmt: skip
        for e, v in enumerate(row):
            if type(v) is not int or not 0 <= v <= _MAX_COUNT:
                raise param_error(
                    "path", func, form, f'{p}: "expert_popularity"[{l}][{e}] = {v!r}'
                )  # fmt: skip
    if len(rows) > MAX_LAYERS or E > MAX_EXPERTS:
        raise param_error("path", func, f"at most {MAX_LAYERS} layers of {MAX_EXPERTS} experts",
                          f"{p}: {len(rows)} layers of {E} experts")  # fmt: skip
    out = np.array(rows, dtype=np.int64)
    sums = out.sum(axis=1)
    if sums[0] <= 0 or (sums != sums[0]).any():
        l = int(np.argmax(sums != sums[0])) if sums[0] > 0 else 0
        raise param_error(
            "path", func, form,
            f'{p}: "expert_popularity"[{l}] sums to {int(sums[l])}, layer 0 to {int(sums[0])}',
        )  # fmt: skip
    return out


def mixtral_popularity_file(folder, variant: str, subject: str) -> str:
    """The path of one Mixtral popularity recording in ``folder``:
    ``mixtral_8x7b_<variant>__expert_popularity_<subject>.json``."""
    folder = check_path_arg(folder, "folder", "mixtral_popularity_file")
    return os.path.join(folder, f"mixtral_8x7b_{variant}__expert_popularity_{subject}.json")


def load_mixtral_popularity(folder, *, variant: str = "original",
                            subjects=MIXTRAL_SUBJECTS) -> dict[str, np.ndarray]:  # fmt: skip
    """Mixtral-8x7B's recorded expert popularity per MMLU subject, in the order given.

    Each subject's file (:func:`mixtral_popularity_file`, read by :func:`read_popularity`)
    holds the top-2 assignments of the subject's test questions summed per layer (32) and
    expert (8). Played one subject after another
    (``RoutingSequence([RoutingModel.recorded(p[None], top_k=2) for p in ...])``), each
    step's popularity is the subject's total: the batch-to-batch fluctuation is the tokens'
    own sampling (no fluctuation is recorded).

    Parameters
    ----------
    folder : str or os.PathLike
        The recordings' folder (``../shared/data/expert_loads/fiddler_mixtral8x7b_popularity``).
    variant : {"original", "instruct"}, default "original"
        The base model or the Instruct model.
    subjects : sequence of str, default :data:`MIXTRAL_SUBJECTS`
        Distinct subjects of :data:`MIXTRAL_SUBJECTS`, in the order to play them.

    Returns
    -------
    dict of str to ndarray of int64, shape (n_layers, n_experts)
        One per subject, in ``subjects``' order, all of one shape.

    Raises
    ------
    InvalidInputError
        A missing or malformed file (the message names it and the field), or recordings of
        different shapes.
    InvalidOptionError
        An unknown variant or subject.
    """
    func = "load_mixtral_popularity"
    folder = check_path_arg(folder, "folder", func)
    variant = check_choice(variant, "variant", func, MIXTRAL_VARIANTS)
    if isinstance(subjects, str) or not hasattr(subjects, "__iter__"):
        raise param_error("subjects", func, "a sequence of subject names", repr(subjects)[:60])
    subjects = [check_choice(s, "subjects", func, MIXTRAL_SUBJECTS) for s in subjects]
    if not subjects or len(set(subjects)) != len(subjects):
        raise param_error("subjects", func, "distinct subjects, at least one", repr(subjects))
    out: dict[str, np.ndarray] = {}
    for s in subjects:
        path = mixtral_popularity_file(folder, variant, s)
        pop = read_popularity(path)
        first = next(iter(out.values()), pop)
        if pop.shape != first.shape:
            raise param_error(
                "folder", func, f"recordings of one shape ({first.shape[0]} layers, "
                f"{first.shape[1]} experts)", f"{path} with shape {pop.shape}",
            )  # fmt: skip
        out[s] = pop
    return out
