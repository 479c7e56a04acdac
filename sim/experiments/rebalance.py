"""How much makespan each moved replica buys: the rebalance frontier, and upstream's points.

A rebalance costs weight copies (one per *moved replica*, a slot whose expert changes,
:func:`~straggler.solvers.placement.place.moved_replicas`) and buys a lower step time.
:func:`rebalance_frontier` draws the trade-off from the placement in force: for a range of
move budgets ``k`` per layer, :func:`~straggler.solvers.place_experts` with
``previous=..., max_moves=k`` (from 0 moves up to as many as a full EPLB rebalance copies),
each scored by tempo's mean makespan on the scoring batches; and, on the same axes, where
upstream's rebalancers land from the same placement:

* ``"eplb"``: DeepSeek's EPLB on the window, every changed slot copied (SGLang, DeepSeek);
* ``"vllm_eplb"``: vLLM's ``DefaultEplbPolicy`` (EPLB, then ``preserve_intragpu_slots``:
  :func:`~straggler.solvers.placement.eplb.rebalance_experts` with ``version="vllm"`` and
  ``old_physical_to_logical``);
* ``"flashlb"``: FlashLB's update from the previous placement (minimum-move matching, at
  most 16 layers, :func:`~straggler.baselines.placement.flashlb.flashlb_rebalance`);
* ``"place_experts"``: the placement from scratch with its slots kept where they can be;
* ``"previous"``: no rebalance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...baselines.placement.flashlb import flashlb_rebalance
from ...formulations.cost import PRESETS, CostModel
from ...formulations.dispatch import DispatchProblem
from ...formulations.errors import InvalidInputError, param_error
from ...formulations.validation import check_array, check_choice, check_int, check_type
from ...solvers.dispatch.solve import solve_dispatch
from ...solvers.placement.eplb import rebalance_experts
from ...solvers.placement.place import DEFAULT_PLACEMENT_COST, moved_replicas, place_experts

__all__ = ["RebalanceFrontier", "rebalance_frontier", "tempo_makespan"]

_FUNC = "rebalance_frontier"


def tempo_makespan(batches, physical_to_logical, num_gpus: int, cost) -> float:
    """Tempo's mean makespan per step over ``batches`` (``(n, n_layers, n_experts)`` tokens),
    summed over the layers, on the placement ``physical_to_logical``.

    Examples
    --------
    >>> c = CostModel(a=0, b=1, c=0, beta=1)
    >>> tempo_makespan(np.array([[[4, 4]]]), np.array([[0, 1]]), 2, c)
    4.0
    """
    tot = 0.0
    for c in batches:
        p = DispatchProblem.from_placement(c, physical_to_logical, num_gpus)
        res = solve_dispatch(p, cost, method="tempo", repair_budget_s=0.0)
        tot += float(np.sum(res.makespan))
    return tot / len(batches)


@dataclass(frozen=True, kw_only=True, eq=False)
class RebalanceFrontier:
    """The makespan-vs-moves curve of :func:`rebalance_frontier` and upstream's points."""

    budgets: np.ndarray
    """Move budgets per layer (``max_moves``) of the curve's points."""
    moves: np.ndarray
    """Replicas moved, summed over layers, at each budget."""
    makespan: np.ndarray
    """Tempo's mean makespan per step (summed over layers) at each budget."""
    points: dict = field(default_factory=dict)
    """``name -> (moves, makespan)`` for ``"previous"``, ``"eplb"``, ``"vllm_eplb"``,
    ``"flashlb"`` and ``"place_experts"``."""

    def gain_captured(self, budget_moves: int, reference: str = "eplb") -> float:
        """Share of ``reference``'s makespan gain over ``"previous"`` reached by the curve
        within ``budget_moves`` moved replicas in all (``nan`` without a gain)."""
        base = self.points["previous"][1]
        gain = base - self.points[reference][1]
        ok = self.moves <= budget_moves
        if gain <= 0 or not ok.any():
            return float("nan")
        return float((base - self.makespan[ok].min()) / gain)

    def plot(self, ax=None):
        """Draw the curve and the points (matplotlib, the ``plot`` extra); returns ``ax``."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 4))
        ax.plot(self.moves, self.makespan, "o-", color="k", label="place_experts(max_moves=k)")
        marks = {
            "previous": "s",
            "eplb": "^",
            "vllm_eplb": "v",
            "flashlb": "D",
            "place_experts": "*",
        }
        for name, (m, t) in self.points.items():
            ax.plot([m], [t], marks.get(name, "x"), markersize=9, label=name)
        ax.set_xlabel("replicas moved (all layers)")
        ax.set_ylabel("tempo mean makespan per step (us)")
        ax.legend(fontsize=8)
        return ax


def _rebalance_frontier_iv(
    history,
    previous,
    num_replicas,
    num_groups,
    num_nodes,
    num_gpus,
    cost,
    score_on,
    n_samples,
    budgets,
):
    """Every argument of :func:`rebalance_frontier` checked before any work, errors naming
    its parameters (the functions it calls would name theirs)."""
    if cost is None:
        cost = CostModel.preset(DEFAULT_PLACEMENT_COST)
    elif isinstance(cost, str):
        cost = CostModel.preset(check_choice(cost, "cost", _FUNC, sorted(PRESETS)))
    check_type(cost, "cost", _FUNC, CostModel, "a CostModel, a preset name or None")
    form = "a non-empty (n_batches, n_layers, n_experts) array of non-negative integers"
    h = check_array(history, "history", _FUNC, ndim=3, kind="int", lo=0, expected=form)
    if 0 in h.shape:
        raise param_error("history", _FUNC, form, f"shape {h.shape}")
    _, L, E = h.shape
    P = check_int(num_replicas, "num_replicas", _FUNC, lo=1)
    prev = check_array(
        previous, "previous", _FUNC, ndim=2, kind="int", lo=0, hi=E - 1, shape=(L, P),
        expected=f"the placement in force: an ({L}, {P}) array of experts",
    )  # fmt: skip
    held = h
    if score_on is not None:
        form = (
            f"a non-empty (n, {L}, {E}) array of non-negative integers (history's layers, experts)"
        )
        held = check_array(score_on, "score_on", _FUNC, ndim=3, kind="int", lo=0, expected=form)
        if held.shape[0] == 0 or held.shape[1:] != (L, E):
            raise param_error("score_on", _FUNC, form, f"shape {held.shape}")
    args = (
        P,
        check_int(num_groups, "num_groups", _FUNC, lo=1),
        check_int(num_nodes, "num_nodes", _FUNC, lo=1),
        check_int(num_gpus, "num_gpus", _FUNC, lo=1),
    )
    try:  # EPLB's constraints between them, worded for this function
        rebalance_experts(np.ones((1, E)), *args)
    except InvalidInputError as exc:
        raise InvalidInputError(
            str(exc).replace(" of rebalance_experts ", f" of {_FUNC} ")
        ) from None
    n_samples = check_int(n_samples, "n_samples", _FUNC, lo=1)
    if budgets is not None:
        budgets = check_array(budgets, "budgets", _FUNC, ndim=1, kind="int", lo=0)
    return h, prev, held, args, cost, n_samples, budgets


def rebalance_frontier(
    history,
    previous,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    cost: CostModel | str | None = None,
    score_on=None,
    budgets=None,
    n_samples: int = 8,
) -> RebalanceFrontier:
    """Expected makespan vs replicas moved, from ``previous`` to a full EPLB rebalance.

    Parameters
    ----------
    history : array_like of int, shape (n_batches, n_layers, n_experts)
        The window the rebalance plans on.
    previous : array_like of int, shape (n_layers, P)
        The placement in force.
    num_replicas, num_groups, num_nodes, num_gpus : int
        As for :func:`~straggler.solvers.placement.eplb.rebalance_experts`.
    cost : CostModel or preset name, optional
        Default ``straggler.solvers.placement.place.DEFAULT_PLACEMENT_COST``.
    score_on : array_like of int, shape (n, n_layers, n_experts), optional
        Batches the makespans are measured on; default ``history`` (pass the next window to
        judge on held-out batches).
    budgets : sequence of int, optional
        Move budgets per layer; default 9 evenly spaced from 0 to the most replicas a full
        EPLB rebalance moves in one layer.
    n_samples : int, default 8
        As for :func:`~straggler.solvers.place_experts`.

    Returns
    -------
    RebalanceFrontier

    Raises
    ------
    InvalidInputError
        Bad shapes or values (checked by the functions it calls, naming the parameter).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> hist = rng.poisson([90, 30, 9, 5, 3, 2, 1, 1], size=(6, 1, 8))
    >>> fr = rebalance_frontier(hist, [[7, 6, 5, 4, 3, 2, 1, 0, 7, 6, 5, 4]], 12, 1, 1, 4,
    ...                         budgets=[0, 2])
    >>> fr.moves.tolist()[0], sorted(fr.points)
    (0, ['eplb', 'flashlb', 'place_experts', 'previous', 'vllm_eplb'])
    """
    h, prev, held, args, cost, n_samples, budgets = _rebalance_frontier_iv(
        history, previous, num_replicas, num_groups, num_nodes, num_gpus, cost, score_on,
        n_samples, budgets,
    )  # fmt: skip
    num_replicas, g = args[0], args[3]
    mean = h.mean(axis=0)
    eplb = rebalance_experts(mean, *args)[0]
    vllm = rebalance_experts(mean, *args, version="vllm", old_physical_to_logical=prev)[0]
    flash = flashlb_rebalance(h, num_replicas, g, previous=prev)[0] if h.shape[0] >= 2 else eplb
    fresh = place_experts(h, *args, cost=cost, n_samples=n_samples, previous=prev)[0]
    points = {}
    for name, p2l in (("previous", prev), ("eplb", eplb), ("vllm_eplb", vllm),
                      ("flashlb", flash), ("place_experts", fresh)):  # fmt: skip
        points[name] = (int(moved_replicas(prev, p2l).sum()), tempo_makespan(held, p2l, g, cost))
    if budgets is None:
        top = int(moved_replicas(prev, eplb).max())
        budgets = np.unique(np.linspace(0, top, 9).round().astype(np.int64))
    moves, spans = [], []
    for k in budgets:
        p2l = place_experts(
            h, *args, cost=cost, n_samples=n_samples, previous=prev, max_moves=int(k)
        )[0]  # fmt: skip
        moves.append(int(moved_replicas(prev, p2l).sum()))
        spans.append(tempo_makespan(held, p2l, g, cost))
    return RebalanceFrontier(
        budgets=budgets, moves=np.array(moves), makespan=np.array(spans), points=points
    )
