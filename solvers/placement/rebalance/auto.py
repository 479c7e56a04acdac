"""``decide_rebalance``: from a recorded window only, whether to rebalance now, and how far.

The decision of the ``auto`` rebalance policy, the same function in the simulator
(:mod:`straggler.sim.engine.deployment`) and beside an engine
(:class:`~straggler.runtime.SolverWorker`). From the window of recorded batches and the
placement in force:

1. **Target**: EPLB's plan, on the active ranks, of the mean loads of the window's even
   steps (0, 2, 4, ...; :func:`~straggler.solvers.placement.rebalance.path.eplb_target`).
2. **Frontier**: the rebalance path of every layer toward it
   (:func:`~straggler.solvers.placement.rebalance.path.rebalance_path`), scored on the
   window's odd steps: the mean makespan under the even split after each number of moved
   replicas, from none to the full plan. Planning on one half and scoring on the other keeps
   the prediction honest about the batches' noise: scored on the steps it was fitted to, a
   plan looks better than it serves (on per-sequence recorded loads, ``auto`` then moved to
   placements worse than the one in force).
3. **Price** each point of a layer's frontier (at most ``max_points`` of them, evenly spaced,
   the first and last included): its **gain**, the makespan it saves per step times the
   model's layers it stands for (``layer_scale``) times the steps it serves, ``horizon``
   less the steps before it applies (the planning time, and in the asynchronous modes one
   step per layer before it); its **cost**, its copies' time by
   :func:`~straggler.solvers.placement.rebalance.transfer.layer_transfer` (in rounds for
   ``"batched"``): in ``"sync"`` mode the stall, in the asynchronous modes what is left after
   the step's idle link time ``step_s - comm_s`` (:class:`~straggler.solvers.placement.
   rebalance.transfer.MoveCost`'s model; the whole copy time when the step is not known).
4. **Choose** each layer's point of largest gain minus cost (the fewest moves on ties):
   gain and cost are both sums over layers (the stall of a synchronous rearrangement is its
   layers' copies one after another), so the best total is each layer's best. Rebalance
   when the total is positive, or when an expert has no replica on an active rank (a rank
   was lost): the moves that restore it
   (:func:`~straggler.solvers.placement.rebalance.path.restore_experts`) are made whatever
   they cost, the path starts from there and the rest is chosen as above.

The prediction assumes the window's loads go on for the horizon: a drift that turns within it
makes the move pay less than predicted (the decision is rerun every period on the newest
window).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ....formulations.cost import CostModel
from ....formulations.errors import InvalidInputError, param_error
from ....formulations.validation import check_array, check_int, check_real, check_type
from .never import Never
from .path import active_ranks_iv, eplb_target, rebalance_path, restore_experts
from .policy import RebalanceContext, RebalancePlan, RebalancePolicy
from .transfer import MoveCost, _batches, _transfer

__all__ = ["RebalanceDecision", "decide_rebalance", "Auto", "AUTO_PLANNING_S_PER_LAYER"]

#: :func:`decide_rebalance` per DeepSeek-V3 layer (64 scored batches, 16 priced points), one
#: thread, on this project's shared 2-core machine: 40 ms (``benchmarks/rebalance_loop.py``,
#: "planning" table).
AUTO_PLANNING_S_PER_LAYER = 0.04

_FUNC = "decide_rebalance"


@dataclass(frozen=True, eq=False)
class RebalanceDecision:
    """What :func:`decide_rebalance` decided for one window.

    Attributes
    ----------
    rebalance : bool
    moves : int
        Replicas moved, summed over the layers given.
    moves_per_layer : ndarray of int64, shape (n_layers,)
    physical_to_logical : ndarray of int64, shape (n_layers, P)
        The placement to move to (the placement in force when ``rebalance`` is False; an
        inactive rank's slots ``-1``).
    gain_s, cost_s : float
        Predicted seconds saved over the horizon, and the copies' predicted cost, for the
        layers given (the model's depth through ``layer_scale``).
    forced : bool
        An expert had no replica on an active rank.
    frontier : list of tuple
        Per layer, ``(moves, makespan_us, gain_s, cost_s)`` arrays at the priced points.
    """

    rebalance: bool
    moves: int
    moves_per_layer: np.ndarray
    physical_to_logical: np.ndarray
    gain_s: float
    cost_s: float
    forced: bool
    frontier: list = field(repr=False, default_factory=list)

    def __str__(self) -> str:
        return f"rebalance: {'yes' if self.rebalance else 'no'}, moves {self.moves}"


def _node_of(num_gpus: int, num_nodes: int) -> np.ndarray:
    if num_gpus % num_nodes:
        return np.zeros(num_gpus, dtype=np.int64)
    return np.arange(num_gpus, dtype=np.int64) // (num_gpus // num_nodes)


def decide_rebalance(
    history,
    previous,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    cost: CostModel,
    move: MoveCost,
    horizon: int,
    layer_scale: float = 1.0,
    step_s: float | None = None,
    comm_s: float | None = None,
    planning_s: float = 0.0,
    active_ranks=None,
    n_samples: int = 64,
    max_points: int = 16,
) -> RebalanceDecision:
    """Whether to rebalance from ``previous`` now, and to which point of the frontier.

    Parameters
    ----------
    history : array_like of int, shape (n_batches, n_layers, n_experts)
        The recorded window (tokens per expert per step).
    previous : array_like of int, shape (n_layers, P)
        The placement in force (``-1``: an empty slot).
    num_replicas, num_groups, num_nodes, num_gpus : int
        As for :func:`~straggler.solvers.placement.eplb.rebalance_experts` (``P =
        num_replicas``; GPU ``g`` on node ``g // (num_gpus / num_nodes)``).
    cost : CostModel
        The MoE layer's cost model.
    move : MoveCost
        Expert size, bandwidths and the mode the copies run in.
    horizon : int
        Steps the new placement is expected to serve.
    layer_scale : float, default 1
        Model MoE layers each layer of ``history`` stands for (a simulation of a few
        representative layers).
    step_s, comm_s : float, optional
        The step's time and its all-to-all's share, seconds (for the asynchronous modes'
        cost and the steps before a placement applies).
    planning_s : float, default 0
        Seconds before the plan is ready (it runs beside serving).
    active_ranks : array_like of bool, shape (num_gpus,), optional
        Ranks that hold weights (default all).
    n_samples : int, default 64
        Batches of the window scored.
    max_points : int, default 16
        Points priced per layer's frontier.

    Returns
    -------
    RebalanceDecision

    Raises
    ------
    InvalidInputError
        Bad shapes or values, naming the parameter.

    Examples
    --------
    >>> hist = np.array([[[90, 10, 10, 10]]] * 4)
    >>> move = MoveCost(expert_bytes=1e9)  # 2.2 ms per copy over NVLink
    >>> c = CostModel(a=0, b=1, c=0, beta=1)
    >>> d = decide_rebalance(hist, [[0, 1, 2, 3, 0, 1]], 6, 1, 1, 3, cost=c, move=move,
    ...                      horizon=1000)
    >>> str(d), d.physical_to_logical.tolist()
    ('rebalance: yes, moves 2', [[0, 1, 2, 0, 0, 3]])
    >>> str(decide_rebalance(hist, [[0, 1, 2, 3, 0, 1]], 6, 1, 1, 3, cost=c, move=move,
    ...                      horizon=100))
    'rebalance: no, moves 0'
    """
    h = check_array(history, "history", _FUNC, ndim=3, kind="int", lo=0)
    if h.shape[0] < 1:
        raise param_error("history", _FUNC, "at least one recorded batch", "none")
    L, E = h.shape[1], h.shape[2]
    P = check_int(num_replicas, "num_replicas", _FUNC, lo=1)
    prev = check_array(previous, "previous", _FUNC, ndim=2, kind="int", lo=-1, hi=E - 1,
                       shape=(L, P))  # fmt: skip
    groups = check_int(num_groups, "num_groups", _FUNC, lo=1)
    nodes = check_int(num_nodes, "num_nodes", _FUNC, lo=1)
    G = check_int(num_gpus, "num_gpus", _FUNC, lo=1)
    if P % G or G % nodes:
        raise InvalidInputError(
            f"{_FUNC} needs num_replicas % num_gpus == 0 and num_gpus % num_nodes == 0. Got "
            f"num_replicas={P}, num_gpus={G}, num_nodes={nodes} instead."
        )
    check_type(cost, "cost", _FUNC, CostModel, "a CostModel")
    check_type(move, "move", _FUNC, MoveCost, "a MoveCost")
    horizon = check_int(horizon, "horizon", _FUNC, lo=0)
    layer_scale = check_real(layer_scale, "layer_scale", _FUNC, lo=0, lo_open=True)
    if step_s is not None:
        step_s = check_real(step_s, "step_s", _FUNC, lo=0, lo_open=True)
    if comm_s is not None:
        comm_s = check_real(comm_s, "comm_s", _FUNC, lo=0)
    planning_s = check_real(planning_s, "planning_s", _FUNC, lo=0)
    max_points = check_int(max_points, "max_points", _FUNC, lo=2)
    act = active_ranks_iv(active_ranks, G, _FUNC)
    per = P // G
    if per * int(act.sum()) < E:
        raise param_error(
            "active_ranks", _FUNC, f"enough active ranks to hold the {E} experts "
            f"({per} slots each)", f"{int(act.sum())} active",
        )  # fmt: skip
    mean = h.mean(axis=0)
    fit, scored = (h[0::2], h[1::2]) if h.shape[0] >= 2 else (h, h)
    target = eplb_target(fit.mean(axis=0), P, groups, nodes, G, act)
    # what a lost rank forces first: every expert back on an active rank, the fewest copies
    start = np.stack([restore_experts(prev[l], mean[l], G, act) for l in range(L)])
    cleared = prev.copy()
    cleared[:, ~np.repeat(act, per)] = -1
    forced_moves = (start != cleared).sum(axis=1)
    path = rebalance_path(scored, start, target, G, cost, active_ranks=act, n_samples=n_samples)
    node = _node_of(G, nodes)
    asynchronous = move.mode != "sync"
    idle = 0.0
    if asynchronous and step_s is not None:
        idle = max(0.0, step_s - (comm_s or 0.0))
    forced = bool(forced_moves.any())
    choice = np.zeros(L, dtype=np.int64)
    gain = np.zeros(L)
    spent = np.zeros(L)
    frontier = []
    for l in range(L):
        ok = np.flatnonzero(path.valid[l])  # every prefix: the path starts restored
        pts = ok[np.unique(np.linspace(0, ok.size - 1, min(max_points, ok.size)).round()
                           .astype(np.int64))]  # fmt: skip
        delay = planning_s / step_s if step_s else 0.0
        if asynchronous:
            delay += layer_scale * (l + 1)
        served = max(0.0, horizon - delay)
        row = start[l].copy()
        done = 0
        g_l, c_l = np.zeros(pts.size), np.zeros(pts.size)
        for i, k in enumerate(pts):
            for gpu, j, _, e in path.moves[l][done:k]:
                row[gpu * per + j] = e
            done = k
            tr = _transfer(_batches(prev[l], row, G, act), G, node, move)
            t = tr.batched_seconds if move.mode == "batched" else tr.seconds
            c_l[i] = layer_scale * (max(0.0, t - idle) if asynchronous else t)
            g_l[i] = (path.score[l][pts[0]] - path.score[l][k]) * 1e-6 * layer_scale * served
        net = g_l - c_l
        best = int(np.argmax(net))
        choice[l], gain[l], spent[l] = pts[best], g_l[best], c_l[best]
        frontier.append((pts + forced_moves[l], path.score[l][pts].copy(), g_l, c_l))
    rebalance = forced or (float((gain - spent).sum()) > 0.0 and int(choice.sum()) > 0)
    if not rebalance:
        choice[:] = 0
        gain[:] = 0.0
        spent[:] = 0.0
    new = path.placement(choice) if rebalance else cleared
    moves = choice + forced_moves if rebalance else choice
    return RebalanceDecision(
        rebalance=bool(rebalance),
        moves=int(moves.sum()),
        moves_per_layer=moves,
        physical_to_logical=new,
        gain_s=float(gain.sum()),
        cost_s=float(spent.sum()),
        forced=forced,
        frontier=frontier,
    )


@dataclass(frozen=True, kw_only=True)
class Auto(RebalancePolicy):
    """``auto``: every ``period`` steps, :func:`decide_rebalance` on the last ``window`` steps.

    Its planning runs beside serving (in the :class:`~straggler.runtime.SolverWorker`), in
    every mode: the copies start ``planning_s_per_layer`` times the model's MoE layers after
    the decision, and nothing stalls for it. A rank lost (``ctx.forced``) is answered at once
    with the fewest copies that place every expert again (``never``'s answer, no planning
    time: it is a few array operations); the next decision on the clock does the rest,
    refilling a rank that came back where that pays.

    Parameters
    ----------
    period : int, default 250
        Steps between decisions.
    window : int, default 500
        Steps of recorded loads each decision reads.
    horizon : int, optional
        Steps a new placement is expected to serve (default ``8 * period``).
    n_samples : int, default 64
        Batches of the window scored.
    planning_s_per_layer : float
        Default :data:`AUTO_PLANNING_S_PER_LAYER`.

    Notes
    -----
    The defaults were chosen on one drift only (DeepSeek-V3 EP32 on 4 nodes, 64 requests per
    rank, Zipf popularity whose log scores take a N(0, 1) step every 2000 steps, seed 1), in
    both modes, among periods 250 and 500, windows 250, 500 and 1000 and horizons of 4 and 8
    periods; ``benchmarks/rebalance_loop.py`` judges them on other drifts, seeds and presets.

    Examples
    --------
    >>> p = Auto(period=500)
    >>> p.schedule(), p.window_steps(), p.horizon_steps, p.label
    ((500, 500), 500, 4000, 'auto:500')
    """

    name: ClassVar[str] = "auto"
    offloaded: ClassVar[bool] = True
    spec_field: ClassVar[str] = "period"

    period: int = 250
    window: int = 500
    horizon: int | None = None
    n_samples: int = 64
    planning_s_per_layer: float = AUTO_PLANNING_S_PER_LAYER

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("period", "window", "n_samples"):
            object.__setattr__(self, name, check_int(getattr(self, name), name, "auto", lo=1))
        if self.horizon is not None:
            object.__setattr__(self, "horizon", check_int(self.horizon, "horizon", "auto", lo=0))

    @property
    def horizon_steps(self) -> int:
        return 8 * self.period if self.horizon is None else self.horizon

    def schedule(self) -> tuple[int, int]:
        return self.period, self.period

    def window_steps(self) -> int:
        return self.window

    def decide(self, ctx: RebalanceContext) -> RebalanceDecision:
        """The decision for ``ctx`` (:func:`decide_rebalance` with this policy's settings)."""
        n_moe = ctx.layer_scale * ctx.history.shape[1]
        return decide_rebalance(
            ctx.history, ctx.previous, ctx.num_replicas, ctx.num_groups, ctx.num_nodes,
            ctx.num_gpus, cost=ctx.cost, move=ctx.move, horizon=self.horizon_steps,
            layer_scale=ctx.layer_scale, step_s=ctx.step_s, comm_s=ctx.comm_s,
            planning_s=self.planning_s_per_layer * n_moe, active_ranks=ctx.active,
            n_samples=self.n_samples,
        )  # fmt: skip

    def plan(self, ctx: RebalanceContext) -> RebalancePlan | None:
        if ctx.forced:  # a rank lost: restore at once; the clock's next decision does the rest
            new = Never().plan(ctx)
            if new is None or np.array_equal(new.physical_to_logical, ctx.previous):
                return None
            return RebalancePlan(new.physical_to_logical, {}, planning_s=0.0)
        d = self.decide(ctx)
        if not d.rebalance:
            return None
        return RebalancePlan(
            d.physical_to_logical,
            {"predicted_gain_s": d.gain_s, "predicted_cost_s": d.cost_s},
        )
