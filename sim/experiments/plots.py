"""Plots of simulator runs (matplotlib, an optional extra: ``pip install straggler[plot]``).

matplotlib is imported only when a plot is drawn; without it the functions raise
:class:`~straggler.formulations.errors.BackendUnavailableError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import numpy as np

from ...formulations._io import atomic_path
from ...formulations.errors import BackendUnavailableError, param_error

__all__ = ["smooth_series", "plot_imbalance"]


def smooth_series(time_s, values, bin_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Step-weighted mean of ``values`` in consecutive ``bin_s``-second bins of ``time_s``.

    Returns the bin centres and means (empty bins dropped).

    Examples
    --------
    >>> t, v = smooth_series([0.0, 0.5, 1.0, 1.5], [2, 4, 6, 8], 1.0)
    >>> t.tolist(), v.tolist()
    ([0.5, 1.5], [3.0, 7.0])
    """
    t = np.asarray(time_s, dtype=float)
    v = np.asarray(values, dtype=float)
    if t.shape != v.shape or t.ndim != 1:
        raise param_error("values", "smooth_series", f"shape {t.shape} like time_s", str(v.shape))
    if not bin_s > 0:
        raise param_error("bin_s", "smooth_series", "positive", repr(bin_s))
    if t.size == 0:
        return t, v
    b = np.floor((t - t[0]) / bin_s).astype(np.int64)
    cnt = np.bincount(b)
    tot = np.bincount(b, weights=v)
    keep = cnt > 0
    centres = t[0] + (np.arange(cnt.size) + 0.5) * bin_s
    return centres[keep], tot[keep] / cnt[keep]


def _pyplot():
    try:
        import matplotlib

        if "MPLBACKEND" not in os.environ:
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise BackendUnavailableError(
            "Plotting needs matplotlib: pip install 'straggler[plot]'."
        ) from e
    return plt


def plot_imbalance(
    reports: Sequence | Mapping,
    path: str | os.PathLike | None = None,
    *,
    bin_s: float = 30.0,
    window_only: bool = True,
    title: str | None = None,
):
    """Imbalance ``G*max L - sum L`` over simulated time, one line per run.

    Parameters
    ----------
    reports : sequence of SimReport, or mapping label -> SimReport
    path : path, optional
        Where to save the figure (PNG by extension); the figure is returned either way.
    bin_s : float
        Width of the time bins the per-step series is averaged over.
    window_only : bool
        Plot only each run's measurement window (saturated mode).
    title : str, optional

    Returns
    -------
    matplotlib.figure.Figure
    """
    plt = _pyplot()
    items = (
        list(reports.items()) if isinstance(reports, Mapping) else [(r.policy, r) for r in reports]
    )
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for label, r in items:
        lo, hi = r.window if window_only else (0, r.n_steps)
        t = r.series["time_s"][lo:hi]
        x, y = smooth_series(t, r.series["imbalance"][lo:hi], bin_s)
        ax.plot(x / 60.0, y, label=f"{label} (mean {r.mean_imbalance:,.0f})", lw=1.2)
    ax.set_xlabel("simulated time (min)")
    ax.set_ylabel(f"imbalance G*max L - sum L (tokens, {bin_s:g} s bins)")
    ax.set_yscale("symlog", linthresh=1000)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.13))
    if title:
        ax.set_title(title)
    fig.tight_layout()
    if path is not None:
        with atomic_path(path) as tmp:  # a failed save leaves no partial file
            fig.savefig(tmp, dpi=120, format=os.path.splitext(os.fspath(path))[1][1:] or "png")
    return fig
