"""TEMPO's phase diagram (§3.2-3.3, Fig. 6 and 12): which fixed proxy wins where, and by how
much a time-aware dispatcher beats the best of them.

Grid: batch ``B`` tokens per GPU x Zipf skew ``s`` x replication ratio, on one model shape
and EP degree. Per ``(s, replication)`` column and layer, a popularity (Zipf ``s`` over a
random permutation of the experts) and an EPLB placement built from the long-run average
loads (``n_history`` routed batches, :func:`~straggler.sim.workloads.batches.eplb_placement` with
the shape's expert groups); the same placement serves every ``B`` of the column. Per cell,
``n_batches`` routed batches of ``B * n_gpus`` tokens with Dirichlet fluctuation
(``kappa``) are dispatched by each policy and scored by the independent evaluator:

* the fixed proxies of Fig. 6, by their registered methods: M, METRO-like activation
  balancing, whole experts minimizing ``max_g G_g`` (``activation=``: by default
  ``semi_matching``, the exact optimum of that objective, TEMPO Lemma 2; ``metro``,
  METRO's deployed greedy with ties to the lowest GPU index; ``metro_exact``, METRO's
  binary search + max-flow; ``round_robin``, the greedy with token tie-break), ``token_lp``
  (L, LPLB's exact min max ``N``) and ``uniform`` (E, EPLB-even: every expert split evenly
  over its replica GPUs, whole tokens);
* ``tempo`` (tempo_fast, the library's default method, its exact repair off so that every cell
  is deterministic).

``winner`` is the fixed policy with the smallest mean makespan (ties within a relative
``1e-9``: the first in M, L, E order), ``gain = 1 - mean(tempo) /
mean(winner)``.

**The analytic flip boundary** (§3.2 (ii)). With ``T = B K n_gpus`` routed token slots,
``p_e`` the long-run share of slots of expert ``e`` and ``r_e`` its replica GPUs,
``E_eff(B) = sum_e (1 - (1 - p_e)^T) r_e`` is the expected number of activated replicas.
The balanced pieces cross at ``B_avg`` (``c + beta B K = a + b E_eff / n_gpus``), and the
GPU holding the hottest expert (share ``p_1``, kept whole by activation balancing) goes
linear at ``B_hot`` (``c + beta p_1 T = a + b E_eff / n_gpus``)::

    B_avg = (a - c + b E_eff / g) / (beta K)      = n* E_eff / (K g)         (a = c = 0)
    B_hot = (a - c + b E_eff / g) / (beta K g p_1) = n* E_eff / (p_1 K g^2)  (a = c = 0)

``B* = min(B_avg, B_hot)`` depends on ``B`` through ``E_eff``; it is the largest fixed
point of ``B -> min(B_avg(B), B_hot(B))``, reached by iterating from ``E_eff = sum_e r_e``
(the map is nondecreasing, so the iterates decrease monotonically to it). With nonzero
intercepts the crossing keeps ``a - c`` (the paper's form is the ``a = c = 0`` case of the
offline fits). Per column, ``b_star`` is the mean over the layers' fixed points.

**The observed flip band** of a column: ``[min(lo, hi), max(lo, hi)]`` with ``lo`` the
largest grid ``B`` won by ``metro`` (0 if none) and ``hi`` the smallest won by a
token-balancing proxy (``token_lp`` or ``uniform``; infinity if none): the two adjacent
grid points between which the winner flips when the sequence is monotone, the whole mixed
stretch when it is not. ``b_star_inside`` tells whether ``B*`` lies in it.

The sweep runs on :func:`~straggler.sim.experiments.sweep.sweep` (one cell per ``(B, s,
replication)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem, evaluate
from ...formulations.errors import BackendUnavailableError, param_error
from ...formulations.validation import (
    check_array,
    check_choice,
    check_int,
    check_real,
    check_type,
    describe,
)
from ...solvers.dispatch.solve import solve_dispatch
from ..workloads.batches import (
    DEFAULT_KAPPA,
    SHAPES,
    eplb_placement,
    sample_counts,
    zipf_popularity,
)
from .compare import DEFAULT_PRESETS
from .sweep import SWEEP_BACKENDS, SweepTable, sweep

__all__ = [
    "PhaseDiagram",
    "phase_diagram",
    "phase_cell",
    "column_placement",
    "b_star",
    "effective_activations",
    "flip_band",
    "comm_aware",
    "ACTIVATION_METHODS",
    "BATCH_SIZES",
    "PHASE_SKEWS",
    "REPLICATIONS",
    "K_R",
]

#: What can play M (METRO-like activation balancing): name -> (registered method, options).
ACTIVATION_METHODS = {
    "metro": ("metro", {}),
    "metro_exact": ("metro", {"exact": True}),
    "round_robin": ("round_robin", {}),
    "semi_matching": ("semi_matching", {}),
}
#: §3.2's grid: B in 16..2048 tokens per GPU, s in 0..1.5, replication 1.25x and 1.5x.
BATCH_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048)
PHASE_SKEWS = (0.0, 0.3, 0.6, 0.9, 1.2, 1.5)
REPLICATIONS = (1.25, 1.5)
#: §3.3's all-to-all slope, fitted from the microbenchmark's per-rank logs (us per token).
K_R = 0.0037
#: Tokens per history batch of the long-run average EPLB places from (per GPU).
HISTORY_TOKENS_PER_GPU = 512

_FUNC = "phase_diagram"


def comm_aware(cost: CostModel, k_r: float = K_R) -> CostModel:
    """The cost with the all-to-all receive time of §3.3 as the traffic piece of Eq. (4).

    Each GPU receives its ``N`` tokens before computing on them, so the compute piece
    becomes ``c + (beta + k_r) N``; written as the traffic piece ``c2 = c``, ``gamma =
    beta + k_r`` it stays in the library's max-affine family, so every policy is scored and
    tempo optimizes under it exactly. Where the floor binds, the additive ``k_r N`` this
    leaves out is at most ``k_r / beta`` of the compute time (4% for the DSv3 fit).

    Examples
    --------
    >>> m = comm_aware(CostModel.preset("dsv3_a_offline"))
    >>> (m.c2, round(m.gamma, 4))
    (0.0, 0.0982)
    """
    check_type(cost, "cost", "comm_aware", CostModel, "a CostModel")
    k_r = check_real(k_r, "k_r", "comm_aware", lo=0)
    return cost.replace(c2=cost.c, gamma=cost.beta + k_r)


def effective_activations(shares_of_slots, replica_gpus, n_slots) -> np.ndarray:
    """``E_eff = sum_e (1 - (1 - p_e)^T) r_e`` for each total ``T`` of ``n_slots``.

    Examples
    --------
    >>> effective_activations([0.5, 0.5], [2, 1], [1, 2]).tolist()
    [1.5, 2.25]
    """
    p = np.asarray(shares_of_slots, dtype=float)
    r = np.asarray(replica_gpus, dtype=float)
    T = np.atleast_1d(np.asarray(n_slots, dtype=float))
    return ((1.0 - (1.0 - p[None, :]) ** T[:, None]) * r[None, :]).sum(axis=1)


def b_star(shares_of_slots, replica_gpus, *, top_k: int, n_gpus: int, cost: CostModel, hot="paper"):
    """The analytic flip boundary ``B* = min(B_avg, B_hot)`` of one layer (module notes).

    Parameters
    ----------
    shares_of_slots : array_like, shape (n_experts,)
        Long-run share ``p_e`` of routed token slots (sums to 1).
    replica_gpus : array_like of int, shape (n_experts,)
        GPUs holding a replica of each expert.
    top_k, n_gpus : int
    cost : CostModel
    hot : {"paper", "loaded"}, default "paper"
        ``"paper"``: §3.2's ``B_hot``, the hottest expert's tokens alone against the floor.
        ``"loaded"`` (not in the paper): the GPU holding the hottest expert also carries its
        share of the other experts, ``p_1 T + (1 - p_1) T / g`` tokens, so
        ``B_hot = (a - c + b E_eff / g) / (beta K (p_1 g + 1 - p_1))``.

    Returns
    -------
    b_star, b_avg, b_hot : float
        Tokens per GPU at the fixed point; ``b_avg`` and ``b_hot`` evaluated there.

    Examples
    --------
    Eight equally popular experts, one replica each, top-1 on two GPUs, ``n* = 100``:
    every expert is live at the fixed point, so ``B* = n* * 8 / 2 = 400``.

    >>> m = CostModel(a=0, b=10, c=0, beta=0.1)
    >>> [round(v, 3) for v in b_star(np.full(8, 1 / 8), np.ones(8), top_k=1, n_gpus=2, cost=m)]
    [400.0, 400.0, 1600.0]
    """
    p = np.asarray(shares_of_slots, dtype=float)
    r = np.asarray(replica_gpus, dtype=float)
    g, K = float(n_gpus), float(top_k)
    if cost.beta <= 0:
        return math.inf, math.inf, math.inf
    p1 = float(p.max())

    hot_share = g * p1 if hot == "paper" else g * p1 + 1.0 - p1

    def pieces(e_eff):
        floor = cost.a - cost.c + cost.b * e_eff / g
        return max(floor, 0.0) / (cost.beta * K), max(floor, 0.0) / (cost.beta * K * hot_share)

    B = min(pieces(float(r[p > 0].sum())))
    for _ in range(200):
        e_eff = float(effective_activations(p, r, B * K * g)[0])
        b_avg, b_hot = pieces(e_eff)
        nxt = min(b_avg, b_hot)
        if abs(nxt - B) <= 1e-12 * max(1.0, B):
            B = nxt
            break
        B = nxt
    e_eff = float(effective_activations(p, r, B * K * g)[0])
    b_avg, b_hot = pieces(e_eff)
    return float(B), float(b_avg), float(b_hot)


def _column_rng(seed: int, skew: float, replication: float, salt: int) -> np.random.Generator:
    """A generator for one column (``salt`` 0: placement) or one cell (``salt = B``)."""
    return np.random.default_rng([seed, round(skew * 1e6), round(replication * 1e6), salt])


def column_placement(
    shape: str,
    n_gpus: int,
    skew: float,
    replication: float,
    *,
    kappa,
    n_layers: int,
    n_history: int,
    seed: int,
):
    """Popularity, long-run loads and EPLB placement of one ``(skew, replication)`` column.

    Returns ``(popularity [L, E], loads [L, E], physical_to_logical [L, P])``; loads are
    the mean of ``n_history`` routed batches of ``512 * n_gpus`` tokens. Deterministic in
    ``(seed, skew, replication)`` and independent of ``B``.

    Examples
    --------
    >>> pop, loads, p2l = column_placement("qwen3_30b", 4, 0.9, 1.25, kappa=2000.0,
    ...                                     n_layers=1, n_history=2, seed=0)
    >>> pop.shape, loads.shape, p2l.shape
    ((1, 128), (1, 128), (1, 160))
    """
    sh = SHAPES[shape]
    gen = _column_rng(seed, skew, replication, 0)
    pop = zipf_popularity(sh.n_experts, skew, n_layers=n_layers, rng=gen)
    loads = np.zeros((n_layers, sh.n_experts))
    for _ in range(n_history):
        loads += sample_counts(
            pop, n_tokens=HISTORY_TOKENS_PER_GPU * n_gpus, top_k=sh.top_k, kappa=kappa, rng=gen
        )
    loads /= n_history
    groups = sh.n_groups if sh.n_experts % sh.n_groups == 0 else 1
    p2l = eplb_placement(loads, n_gpus=n_gpus, replication=replication, num_groups=groups)
    return pop, loads, p2l


def _cost_settings(cost: CostModel) -> dict:
    return {
        "cost_a": cost.a,
        "cost_b": cost.b,
        "cost_b2": cost.b2,
        "cost_c": cost.c,
        "cost_beta": cost.beta,
        "cost_tile": cost.tile,
        "cost_c2": cost.c2,
        "cost_gamma": cost.gamma,
    }


def _cost_from(settings) -> CostModel:
    return CostModel(
        a=settings["cost_a"],
        b=settings["cost_b"],
        b2=settings["cost_b2"],
        c=settings["cost_c"],
        beta=settings["cost_beta"],
        tile=settings["cost_tile"],
        c2=settings["cost_c2"],
        gamma=settings["cost_gamma"],
    )


def phase_cell(
    *,
    shape: str,
    n_gpus: int,
    tokens_per_gpu: int,
    skew: float,
    replication: float,
    kappa,
    n_batches: int,
    n_layers: int,
    n_history: int,
    seed: int,
    activation: str = "semi_matching",
    **cost_settings,
) -> dict:
    """One cell of the phase diagram: mean makespan of each policy (the sweep's ``func``).

    ``cost_settings`` are ``cost_a, cost_b, cost_b2, cost_c, cost_beta, cost_tile, cost_c2,
    cost_gamma``. Returns ``mean_<policy>`` (us, mean over batches and layers) for every
    fixed policy and tempo, and ``worst_ratio``: the largest per-layer ratio of tempo's
    makespan to the best fixed policy's on that layer.
    """
    cost = _cost_from(cost_settings)
    sh = SHAPES[shape]
    pop, _, p2l = column_placement(
        shape,
        n_gpus,
        skew,
        replication,
        kappa=kappa,
        n_layers=n_layers,
        n_history=n_history,
        seed=seed,
    )
    gen = _column_rng(seed, skew, replication, int(tokens_per_gpu))
    fixed = _fixed_policies(activation)
    policies = (*fixed, "tempo")
    method = {m: (m, {}) for m in policies}
    method[activation] = ACTIVATION_METHODS[activation]
    # tempo as the paper has it: its exact repair off (a sweep cell must be deterministic,
    # and the repair's HiGHS stops on wall-clock time)
    method["tempo"] = ("tempo", {"repair_budget_s": 0.0})
    total = dict.fromkeys(policies, 0.0)
    worst = 0.0
    for _ in range(n_batches):
        counts = sample_counts(
            pop, n_tokens=tokens_per_gpu * n_gpus, top_k=sh.top_k, kappa=kappa, rng=gen
        )
        problem = DispatchProblem.from_placement(counts, p2l, n_gpus)
        mk = {}
        for m in policies:
            name, options = method[m]
            res = solve_dispatch(problem, cost, method=name, **options)
            mk[m] = np.atleast_1d(evaluate(problem, cost, res.shares).makespan)
            total[m] += float(mk[m].sum())
        best = np.min([mk[m] for m in fixed], axis=0)
        worst = max(worst, float(np.max(mk["tempo"] / best)))
    n = n_batches * n_layers
    out = {f"mean_{m}": total[m] / n for m in policies}
    out["worst_ratio"] = worst
    return out


def _fixed_policies(activation: str) -> tuple[str, str, str]:
    """The fixed policies M, L, E (tie-breaking order) with ``activation`` as M."""
    return (activation, "token_lp", "uniform")


def flip_band(batch_sizes, winners, activation: str = "semi_matching") -> tuple[float, float]:
    """The observed flip band ``(low, high)`` of one column (module notes).

    Examples
    --------
    >>> flip_band([16, 32, 64, 128], ["metro", "metro", "token_lp", "token_lp"], "metro")
    (32.0, 64.0)
    >>> flip_band([16, 32], ["token_lp", "uniform"])
    (0.0, 16.0)
    >>> flip_band([16, 32, 64], ["semi_matching", "token_lp", "semi_matching"])
    (32.0, 64.0)
    """
    Bs = np.asarray(batch_sizes, dtype=float)
    w = np.asarray(winners)
    act = Bs[w == activation]
    tok = Bs[(w == "token_lp") | (w == "uniform")]
    lo = float(act.max()) if act.size else 0.0
    hi = float(tok.min()) if tok.size else math.inf
    return min(lo, hi), max(lo, hi)


@dataclass(frozen=True, eq=False, kw_only=True)
class PhaseDiagram:
    """A measured phase diagram; arrays are indexed ``[batch, skew, replication]``.

    Attributes
    ----------
    policies : tuple of str
        The fixed policies M, L, E by method name (M as chosen by ``activation``).
    makespan : dict of str to ndarray, shape (n_B, n_s, n_r)
        Mean modeled makespan (us) of each policy (the fixed ones and ``"tempo"``).
    winner : ndarray of str, shape (n_B, n_s, n_r)
        The fixed policy with the smallest mean makespan (its method name).
    gain : ndarray, shape (n_B, n_s, n_r)
        ``1 - tempo / winner`` (0.05 = tempo 5% below the best fixed policy).
    b_star : ndarray, shape (n_s, n_r)
        The analytic flip boundary (tokens per GPU), §3.2's formula.
    b_star_loaded : ndarray, shape (n_s, n_r)
        The same with the hot GPU's other tokens counted (``b_star(hot="loaded")``).
    band : ndarray, shape (n_s, n_r, 2)
        The observed flip band of each column.
    worst_ratio : ndarray, shape (n_B, n_s, n_r)
        Largest per-layer ``tempo / best fixed`` in each cell.
    table : SweepTable
        The sweep's rows, every setting recorded.
    """

    shape: str
    n_gpus: int
    batch_sizes: tuple
    skews: tuple
    replications: tuple
    cost: CostModel
    policies: tuple
    makespan: dict
    winner: np.ndarray
    gain: np.ndarray
    b_star: np.ndarray
    b_star_loaded: np.ndarray
    band: np.ndarray
    worst_ratio: np.ndarray
    table: SweepTable = field(repr=False)

    @property
    def b_star_inside(self) -> np.ndarray:
        """``[skew, replication]``: whether ``B*`` lies in the observed flip band."""
        return (self.band[..., 0] <= self.b_star) & (self.b_star <= self.band[..., 1])

    @property
    def b_star_loaded_inside(self) -> np.ndarray:
        """``[skew, replication]``: whether ``b_star_loaded`` lies in the flip band."""
        lo, hi = self.band[..., 0], self.band[..., 1]
        return (lo <= self.b_star_loaded) & (self.b_star_loaded <= hi)

    @property
    def letter_of(self) -> dict:
        """Fig. 6's letters by policy: M = METRO-like activation balancing, L = token-LP,
        E = EPLB-even."""
        return dict(zip(self.policies, "MLE"))

    def letters(self) -> np.ndarray:
        """The winners as Fig. 6's letters (M, L, E)."""
        return np.vectorize(self.letter_of.get)(self.winner)

    def summary(self) -> dict:
        """Headline figures: tempo's min and max gain (and where), B* columns inside.

        Asymmetry of mispricing (§3.2 (iv)): ``metro_worst`` is METRO's largest mean
        makespan over the best fixed policy, ``token_lp_worst`` token-LP's, each with its
        cell.
        """
        best = np.min([self.makespan[m] for m in self.policies], axis=0)
        out = {
            "gain_min": float(self.gain.min()),
            "gain_max": float(self.gain.max()),
            "gain_min_at": self._at(np.argmin(self.gain)),
            "gain_max_at": self._at(np.argmax(self.gain)),
            "b_star_inside": int(self.b_star_inside.sum()),
            "b_star_loaded_inside": int(self.b_star_loaded_inside.sum()),
            "columns": int(self.b_star_inside.size),
        }
        for role, m in (("activation", self.policies[0]), ("token_lp", "token_lp")):
            ratio = self.makespan[m] / best
            out[f"{role}_worst"] = float(ratio.max())
            out[f"{role}_worst_at"] = self._at(np.argmax(ratio))
        return out

    def _at(self, flat: int) -> dict:
        i, j, k = np.unravel_index(flat, self.gain.shape)
        return {
            "tokens_per_gpu": self.batch_sizes[i],
            "skew": self.skews[j],
            "replication": self.replications[k],
        }

    def format_table(self, replication_index: int = 0) -> str:
        """Fig. 6 as text for one replication: rows B, columns s, cells ``letter gain%``."""
        k = replication_index
        head = ["B \\ s"] + [f"{s:g}" for s in self.skews]
        rows = []
        for i, B in enumerate(self.batch_sizes):
            cells = [str(B)]
            for j in range(len(self.skews)):
                letter = self.letter_of[self.winner[i, j, k]]
                g = 100 * self.gain[i, j, k]
                cells.append(f"{letter} {0.0 if abs(g) < 0.05 else g:+.1f}%")
            rows.append(cells)
        rows.append(["B*"] + [f"{b:.0f}" for b in self.b_star[:, k]])
        band = [f"{lo:g}-{hi:g}" if math.isfinite(hi) else f">{lo:g}" for lo, hi in self.band[:, k]]
        rows.append(["band"] + band)
        rows.append(["inside"] + ["yes" if v else "NO" for v in self.b_star_inside[:, k]])
        rows.append(["B*load"] + [f"{b:.0f}" for b in self.b_star_loaded[:, k]])
        rows.append(["inside"] + ["yes" if v else "NO" for v in self.b_star_loaded_inside[:, k]])
        widths = [max(len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(head)]
        lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths))]
        lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
        return "\n".join(lines)

    def plot(self, axes=None):
        """Fig. 6: one panel per replication; letters for winners, shading for tempo's gain,
        the dashed analytic ``B*``. Returns the matplotlib figure (needs ``matplotlib``)."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise BackendUnavailableError(
                "PhaseDiagram.plot needs matplotlib: pip install 'straggler[plot]'."
            ) from None
        n_r = len(self.replications)
        if axes is None:
            fig, axes = plt.subplots(1, n_r, figsize=(4.2 * n_r, 4.2), squeeze=False)
            axes = axes[0]
        else:
            axes = np.atleast_1d(axes)
            fig = axes[0].figure
        logB = np.log2(np.asarray(self.batch_sizes, dtype=float))
        vmax = max(0.01, float(np.abs(self.gain).max()) * 100)
        im = None
        for k, ax in enumerate(axes):
            im = ax.imshow(
                100 * self.gain[:, :, k],
                origin="lower",
                aspect="auto",
                cmap="Greens",
                vmin=0,
                vmax=vmax,
            )
            for i in range(len(self.batch_sizes)):
                for j in range(len(self.skews)):
                    g = 100 * self.gain[i, j, k]
                    g = 0.0 if abs(g) < 0.05 else g  # no "-0.0"
                    ax.text(
                        j,
                        i,
                        f"{self.letter_of[self.winner[i, j, k]]}\n{g:.1f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if g > 0.6 * vmax else "black",
                    )
            # B* in grid coordinates: interpolate log2(B*) on the row index.
            y = np.interp(np.log2(np.maximum(self.b_star[:, k], 1e-9)), logB, np.arange(logB.size))
            ax.plot(np.arange(len(self.skews)), y, "k--", lw=1.5, label="analytic B*")
            ax.set_xticks(range(len(self.skews)), [f"{s:g}" for s in self.skews])
            ax.set_yticks(range(len(self.batch_sizes)), [str(b) for b in self.batch_sizes])
            ax.set_xlabel("Zipf skew s")
            if k == 0:
                ax.set_ylabel("tokens per GPU B")
            ax.set_title(f"{self.shape} EP{self.n_gpus}, {self.replications[k]:g}x replication")
            ax.legend(loc="upper right", fontsize=7)
        fig.colorbar(im, ax=list(axes), label="tempo gain over best fixed (%)", shrink=0.8)
        return fig


def _phase_iv(shape, n_gpus, batch_sizes, skews, replications, cost, n_batches, n_layers,
              n_history, kappa, seed, backend, workers, activation):  # fmt: skip
    shape = check_choice(shape, "shape", _FUNC, sorted(SHAPES))
    n_gpus = check_int(n_gpus, "n_gpus", _FUNC, lo=1)
    Bs = check_array(batch_sizes, "batch_sizes", _FUNC, kind="int", lo=1)
    ss = check_array(skews, "skews", _FUNC, lo=0)
    rs = check_array(replications, "replications", _FUNC, lo=1)
    for name, arr in (("batch_sizes", Bs), ("skews", ss), ("replications", rs)):
        if arr.size == 0 or (np.diff(arr) <= 0).any():
            raise param_error(
                name, _FUNC, "a non-empty strictly increasing sequence", describe(arr)
            )
    if cost is None:
        cost = CostModel.preset(DEFAULT_PRESETS[shape])
    elif isinstance(cost, str):
        cost = CostModel.preset(cost)
    check_type(cost, "cost", _FUNC, CostModel, "a CostModel or a preset name")
    n_batches = check_int(n_batches, "n_batches", _FUNC, lo=1)
    n_layers = check_int(n_layers, "n_layers", _FUNC, lo=1)
    n_history = check_int(n_history, "n_history", _FUNC, lo=1)
    kappa = None if kappa is None else check_real(kappa, "kappa", _FUNC, lo=0, lo_open=True)
    seed = check_int(seed, "seed", _FUNC, lo=0)
    check_choice(activation, "activation", _FUNC, ACTIVATION_METHODS)
    check_choice(backend, "backend", _FUNC, SWEEP_BACKENDS)
    return (
        shape,
        n_gpus,
        tuple(int(b) for b in Bs),
        tuple(map(float, ss)),
        tuple(map(float, rs)),
        cost,
        n_batches,
        n_layers,
        n_history,
        kappa,
        seed,
    )


def phase_diagram(
    shape: str = "dsv3",
    n_gpus: int = 8,
    *,
    batch_sizes: Sequence[int] = BATCH_SIZES,
    skews: Sequence[float] = PHASE_SKEWS,
    replications: Sequence[float] = REPLICATIONS,
    cost: CostModel | str | None = None,
    n_batches: int = 8,
    n_layers: int = 2,
    n_history: int = 32,
    kappa: float | None = DEFAULT_KAPPA,
    seed: int = 0,
    activation: str = "semi_matching",
    backend: str = "process",
    workers: int | None = None,
    path=None,
    progress: bool = True,
) -> PhaseDiagram:
    """Measure TEMPO's phase diagram (§3.2, Fig. 6) on a model shape and EP degree.

    Parameters
    ----------
    shape : str, default "dsv3"
        A key of :data:`~straggler.sim.workloads.batches.SHAPES`.
    n_gpus : int, default 8
        EP degree.
    batch_sizes, skews, replications : sequences, strictly increasing
        The grid (defaults: §3.2's).
    cost : CostModel or preset name, optional
        Default: the shape's calibrated preset (``DEFAULT_PRESETS`` of
        ``straggler-compare``: DSv3 and Qwen3-30B offline fits of Table 6).
    n_batches : int, default 8
        Routed batches per cell (each a stack of ``n_layers`` layers).
    n_layers : int, default 2
        Layers per batch, each with its own popularity permutation and placement.
    n_history : int, default 32
        Batches averaged into the long-run load EPLB places from.
    kappa : float or None, default 2000
    seed : int, default 0
    activation : str, default "semi_matching"
        The method playing M, a key of ``ACTIVATION_METHODS`` (module notes).
    backend, workers, path, progress
        Passed to :func:`~straggler.sim.experiments.sweep.sweep` (``path`` makes it resumable).

    Returns
    -------
    PhaseDiagram

    Examples
    --------
    >>> pd = phase_diagram("qwen3_30b", 4, batch_sizes=[16, 1024], skews=[1.2],
    ...                    replications=[1.25], n_batches=1, n_layers=1, n_history=2,
    ...                    backend="serial", progress=False)
    >>> pd.winner[:, 0, 0].tolist(), bool(pd.gain.min() > -0.01)
    (['semi_matching', 'token_lp'], True)
    """
    (shape, n_gpus, Bs, ss, rs, cost, n_batches, n_layers, n_history, kappa, seed) = _phase_iv(
        shape, n_gpus, batch_sizes, skews, replications, cost, n_batches, n_layers, n_history,
        kappa, seed, backend, workers, activation,
    )  # fmt: skip
    fixed = {
        "shape": shape,
        "n_gpus": n_gpus,
        "kappa": kappa,
        "n_batches": n_batches,
        "n_layers": n_layers,
        "n_history": n_history,
        "seed": seed,
        "activation": activation,
        **_cost_settings(cost),
    }
    grid = {"tokens_per_gpu": list(Bs), "skew": list(ss), "replication": list(rs)}
    table = sweep(
        phase_cell,
        grid,
        fixed=fixed,
        backend=backend,
        workers=workers,
        path=path,
        progress=progress,
        desc=f"phase {shape} EP{n_gpus}",
    )
    shp = (len(Bs), len(ss), len(rs))
    fixed_policies = _fixed_policies(activation)
    policies = (*fixed_policies, "tempo")
    makespan = {m: table.column(f"mean_{m}").astype(float).reshape(shp) for m in policies}
    fixed_mk = np.stack([makespan[m] for m in fixed_policies])
    best = fixed_mk.min(axis=0)
    tie = fixed_mk <= best * (1 + 1e-9)
    winner = np.array(fixed_policies)[np.argmax(tie, axis=0)]
    with np.errstate(invalid="ignore", divide="ignore"):
        gain = np.where(best > 0, 1.0 - makespan["tempo"] / best, 0.0)
    worst = table.column("worst_ratio").astype(float).reshape(shp)
    bstar = np.zeros(shp[1:])
    bstar_loaded = np.zeros(shp[1:])
    band = np.zeros((*shp[1:], 2))
    sh = SHAPES[shape]
    for j, s in enumerate(ss):
        for k, r in enumerate(rs):
            pop, loads, p2l = column_placement(
                shape, n_gpus, s, r, kappa=kappa, n_layers=n_layers, n_history=n_history,
                seed=seed,
            )  # fmt: skip
            rep = DispatchProblem.from_placement(np.zeros_like(loads, dtype=np.int64), p2l, n_gpus)
            r_e = rep.replicas.sum(axis=-1)
            for out, hot in ((bstar, "paper"), (bstar_loaded, "loaded")):
                out[j, k] = np.mean(
                    [
                        b_star(pop[l], r_e[l], top_k=sh.top_k, n_gpus=n_gpus, cost=cost, hot=hot)[0]
                        for l in range(n_layers)
                    ]
                )
            band[j, k] = flip_band(Bs, winner[:, j, k], activation)
    return PhaseDiagram(
        shape=shape,
        n_gpus=n_gpus,
        batch_sizes=Bs,
        skews=ss,
        replications=rs,
        cost=cost,
        policies=fixed_policies,
        makespan=makespan,
        winner=winner,
        gain=gain,
        b_star=bstar,
        b_star_loaded=bstar_loaded,
        band=band,
        worst_ratio=worst,
        table=table,
    )
