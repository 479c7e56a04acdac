"""The budgeted rebalance under EPLB's even split: one path from the placement in force to the
plan, every budget on it.

:func:`rebalance_path` moves, one replica at a time, from the placement in force toward a
target (EPLB's plan of the window), each time the replica move that lowers the window's mean
makespan under the even split the most (:mod:`._path` states the rules); the placement after
the first ``k`` moves is the budget-``k`` rebalance, so one call draws the whole frontier,
from no move to the full plan. :func:`even_split_makespan` is the score it minimises, for a
whole placement.

Why not ``place_experts(previous=..., max_moves=k)``: that search targets tempo's dispatch
(its score estimates tempo's makespan) and is one call per budget, 0.1-1 s per layer at
DeepSeek-V3's shape on this machine; a simulation that decides every thousand steps needs
the frontier of every layer at each decision, under the dispatch the deployment runs (the
engines' even split). The path costs one call per layer for every budget (about 45 ms per
DeepSeek-V3 layer here: ``benchmarks/rebalance_loop.py`` measures it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ....formulations.cost import CostModel
from ....formulations.errors import InvalidInputError, param_error
from ....formulations.validation import check_array, check_int, check_type
from ..eplb import rebalance_experts
from ._path import even_path_kernel

__all__ = [
    "RebalancePath",
    "rebalance_path",
    "even_split_makespan",
    "active_ranks_iv",
    "eplb_target",
    "restore_experts",
    "sample_batches",
]


def active_ranks_iv(active_ranks, num_gpus: int, func: str) -> np.ndarray:
    """``active_ranks`` as a bool ``(num_gpus,)`` array (None: all active), at least one."""
    if active_ranks is None:
        return np.ones(num_gpus, dtype=bool)
    a = check_array(
        active_ranks, "active_ranks", func, ndim=1, kind="bool", shape=(num_gpus,),
        expected=f"an array of {num_gpus} booleans (or 0/1), one per rank",
    ).astype(bool)  # fmt: skip
    if not a.any():
        raise param_error("active_ranks", func, "at least one active rank", "none")
    return a


def sample_batches(history: np.ndarray, n_samples: int) -> np.ndarray:
    """``n_samples`` batches of ``history`` evenly spaced, the last one included (all when
    there are fewer)."""
    T = history.shape[0]
    if T <= n_samples:
        return history
    idx = np.unique(np.linspace(0, T - 1, n_samples).round().astype(np.int64))
    return history[idx]


def even_split_makespan(batches, physical_to_logical, n_gpus: int, cost, *, active=None):
    """Mean over ``batches`` of the summed layer makespans under EPLB's even split.

    Each layer: expert ``e`` with ``c_e`` replicas, ``m`` of them on GPU ``h``, sends it
    ``x = n_e * (m / c_e)`` tokens; GPU ``h`` takes ``max(a + b A + b2 (T - A), c + beta N,
    c2 + gamma N)`` (``A`` its experts with tokens, ``T`` their tiles, ``N`` their tokens) and
    the layer the slowest active GPU (``active``: ranks holding weights, default all).

    Parameters
    ----------
    batches : array_like of int, shape (n, n_layers, n_experts)
    physical_to_logical : array_like of int, shape (n_layers, P)
        ``-1``: an empty slot.
    n_gpus : int
    cost : CostModel

    Returns
    -------
    float
        Microseconds per step, summed over the layers.

    Examples
    --------
    >>> c = CostModel(a=0, b=1, c=0, beta=1)
    >>> even_split_makespan([[[4, 4]]], [[0, 1, 0, 1]], 2, c)
    4.0
    """
    func = "even_split_makespan"
    X = check_array(batches, "batches", func, ndim=3, kind="int", lo=0)
    p2l = check_array(physical_to_logical, "physical_to_logical", func, ndim=2, kind="int",
                      lo=-1, hi=X.shape[2] - 1, shape=(X.shape[1], None))  # fmt: skip
    G = check_int(n_gpus, "n_gpus", func, lo=1)
    check_type(cost, "cost", func, CostModel, "a CostModel")
    if p2l.shape[1] % G:
        raise param_error("n_gpus", func, f"a divisor of the {p2l.shape[1]} slots", repr(n_gpus))
    act = active_ranks_iv(active, G, func)
    a, b, b2, c, beta, c2, gamma, tile = cost.as_array()
    L, P = p2l.shape
    E = X.shape[2]
    per = P // G
    total = 0.0
    for l in range(L):
        m = np.zeros((E, G))
        ok = p2l[l] >= 0
        np.add.at(m, (p2l[l][ok], np.flatnonzero(ok) // per), 1.0)
        m[:, ~act] = 0.0
        cnt = m.sum(axis=1)
        frac = np.divide(m, cnt[:, None], out=np.zeros_like(m), where=cnt[:, None] > 0)
        n = X[:, l, :].astype(float)
        x = n[:, :, None] * frac[None]
        on = (x > 0) & (n[:, :, None] > 0)
        A = on.sum(axis=1)
        T = np.where(on, np.ceil(x / tile), 0.0).sum(axis=1)
        N = x.sum(axis=1)
        t = np.maximum(np.maximum(a + b * A + b2 * (T - A), c + beta * N), c2 + gamma * N)
        total += float(t[:, act].max(axis=1).mean())
    return total


def restore_experts(row, mean, num_gpus: int, active, *, fill_empty: bool = False):
    """One layer's slot map ``row`` with every expert on an active rank, moving as few replicas
    as it can (what a lost rank forces; every copy here is a moved replica).

    The active ranks' slots are used; an inactive rank's are emptied (``-1``). Each expert
    without a replica there, largest mean load ``mean`` first (ties: lower index), takes the
    first empty slot of an active rank, else the slot of the replica with the smallest mean
    load per replica among the experts with two or more (ties: lower slot). With
    ``fill_empty``, every empty slot of an active rank left, in slot order, then takes the
    expert of largest mean load per replica not on its rank (ties: lower index).

    Examples
    --------
    Rank 2 lost: expert 3 takes the slot of a replica of expert 0 (the one with two); a rank
    back empty, filled:

    >>> restore_experts([0, 1, 2, 0, 3, 1], np.array([9, 5, 1, 1.0]), 3, [True, True, False])
    array([ 3,  1,  2,  0, -1, -1])
    >>> restore_experts([0, 1, -1, -1, 3, 2], np.array([9, 5, 1, 1.0]), 3, [True] * 3,
    ...                 fill_empty=True)
    array([0, 1, 0, 1, 3, 2])
    """
    row = np.array(row, dtype=np.int64)
    active = np.asarray(active, dtype=bool)
    E = mean.size
    per = row.size // num_gpus
    use = np.repeat(active, per)
    row[~use] = -1
    cnt = np.bincount(row[row >= 0], minlength=E)
    for e in sorted(np.flatnonzero(cnt == 0), key=lambda x: (-mean[x], x)):
        free = np.flatnonzero(use & (row < 0))
        if free.size:
            p = int(free[0])
        else:
            spare = np.flatnonzero(use & (row >= 0))
            spare = spare[cnt[row[spare]] >= 2]
            if not spare.size:
                raise InvalidInputError(
                    f"{E} experts do not fit on the active ranks' {int(use.sum())} slots."
                )
            p = int(spare[np.argmin(mean[row[spare]] / cnt[row[spare]])])
            cnt[row[p]] -= 1
        row[p] = e
        cnt[e] += 1
    if fill_empty:
        for p in np.flatnonzero(use & (row < 0)):
            on = row[(p // per) * per : (p // per + 1) * per]
            ratio = np.where(np.isin(np.arange(E), on), -np.inf, mean / np.maximum(cnt, 1))
            e = int(np.argmax(ratio))
            row[p] = e
            cnt[e] += 1
    return row


def eplb_target(mean, num_replicas, num_groups, num_nodes, num_gpus, active) -> np.ndarray:
    """EPLB's plan (no two replicas of an expert on one GPU) of the mean loads ``mean (L, E)``
    on the active ranks: with every rank active, the hierarchical or global policy as
    :func:`~straggler.solvers.placement.eplb.rebalance_experts` picks it; with some down, the
    global policy on the active ranks' slots (SGLang's ``elasticity_aware`` does the same),
    the inactive ranks' slots ``-1``."""
    G = num_gpus
    per = num_replicas // G
    if active.all():
        return rebalance_experts(mean, num_replicas, num_groups, num_nodes, G, distinct=True)[0]
    A = int(active.sum())
    sub = rebalance_experts(mean, per * A, 1, 1, A, distinct=True)[0]
    out = np.full((mean.shape[0], num_replicas), -1, dtype=np.int64)
    ranks = np.flatnonzero(active)
    for i, r in enumerate(ranks):
        out[:, r * per : (r + 1) * per] = sub[:, i * per : (i + 1) * per]
    return out


@dataclass(frozen=True, eq=False)
class RebalancePath:
    """The moves of :func:`rebalance_path`, per layer, and the score after each prefix.

    Attributes
    ----------
    previous : ndarray of int64, shape (n_layers, P)
        The placement in force (inactive ranks' slots ``-1``).
    target : ndarray of int64, shape (n_layers, P)
    moves : list of ndarray, one ``(D_l, 4)`` int64 per layer
        ``(gpu, slot, old expert, new expert)`` in order (``old = -1``: an empty slot).
    score : list of ndarray, one ``(D_l + 1,)`` per layer
        The mean makespan (us, one layer) after ``0..D_l`` moves; NaN inside a cycle.
    valid : list of ndarray of bool
        The prefixes a rebalance may stop at (every expert placed, no cycle cut).
    n_gpus : int
    """

    n_gpus: int
    previous: np.ndarray
    target: np.ndarray
    moves: list
    score: list
    valid: list

    @property
    def n_layers(self) -> int:
        return self.previous.shape[0]

    def placement(self, k) -> np.ndarray:
        """The placement after the first ``k[l]`` moves of each layer (``k`` an int for all
        layers, or one per layer)."""
        k = np.broadcast_to(np.asarray(k, dtype=np.int64), (self.n_layers,))
        out = self.previous.copy()
        per = out.shape[1] // self.n_gpus
        for l in range(self.n_layers):
            for g, j, _, e in self.moves[l][: int(k[l])]:
                out[l, g * per + j] = e
        return out

    def first_valid(self) -> np.ndarray:
        """Per layer, the fewest moves to a placement holding every expert (0 unless an
        expert lost its last replica)."""
        return np.array([int(np.argmax(v)) for v in self.valid], dtype=np.int64)


def rebalance_path(history, previous, target, num_gpus: int, cost, *, active_ranks=None,
                   n_samples: int = 64) -> RebalancePath:  # fmt: skip
    """The rebalance path of every layer (module notes): from ``previous`` to ``target``.

    Parameters
    ----------
    history : array_like of int, shape (n_batches, n_layers, n_experts)
        The recorded window; ``n_samples`` of its batches, evenly spaced, are scored.
    previous : array_like of int, shape (n_layers, P)
        The placement in force (``-1``: an empty slot; an inactive rank's slots are emptied).
    target : array_like of int, shape (n_layers, P)
        The plan to move toward: every expert placed and every active rank's slots filled,
        the inactive ranks' slots ``-1`` (:func:`eplb_target`).
    num_gpus : int
    cost : CostModel
    active_ranks : array_like of bool, shape (num_gpus,), optional
        Ranks that hold weights (default all).
    n_samples : int, default 64

    Returns
    -------
    RebalancePath

    Examples
    --------
    >>> hist = np.array([[[90, 10, 10, 10]]] * 4)
    >>> p = rebalance_path(hist, [[0, 1, 2, 3, 0, 1]], [[0, 1, 2, 0, 3, 0]], 3,
    ...                    CostModel(a=0, b=1, c=0, beta=1))
    >>> p.moves[0].tolist(), p.score[0].tolist()
    ([[2, 1, 1, 3], [1, 1, 3, 0]], [50.0, 55.0, 40.0])
    >>> p.placement(2).tolist()
    [[0, 1, 2, 0, 0, 3]]
    """
    func = "rebalance_path"
    h = check_array(history, "history", func, ndim=3, kind="int", lo=0)
    L, E = h.shape[1], h.shape[2]
    if h.shape[0] < 1:
        raise param_error("history", func, "at least one recorded batch", "none")
    prev = check_array(previous, "previous", func, ndim=2, kind="int", lo=-1, hi=E - 1,
                       shape=(L, None))  # fmt: skip
    tgt = check_array(target, "target", func, ndim=2, kind="int", lo=-1, hi=E - 1,
                      shape=prev.shape)  # fmt: skip
    G = check_int(num_gpus, "num_gpus", func, lo=1)
    P = prev.shape[1]
    if P % G:
        raise param_error("num_gpus", func, f"a divisor of the {P} slots", repr(num_gpus))
    check_type(cost, "cost", func, CostModel, "a CostModel")
    n_samples = check_int(n_samples, "n_samples", func, lo=1)
    act = active_ranks_iv(active_ranks, G, func)
    per = P // G
    prev = prev.copy()
    for r in np.flatnonzero(~act):
        prev[:, r * per : (r + 1) * per] = -1
    for l in range(L):
        t = tgt[l].reshape(G, per)
        if (t[~act] >= 0).any() or (t[act] < 0).any():
            raise param_error("target", func, "every active rank's slots filled and every "
                              "inactive rank's empty", f"layer {l} otherwise")  # fmt: skip
        if np.setdiff1d(np.arange(E), t[act]).size:
            raise param_error("target", func, "a plan placing every expert",
                              f"layer {l} missing expert "
                              f"{int(np.setdiff1d(np.arange(E), t[act])[0])}")  # fmt: skip
    X = sample_batches(h, n_samples)
    arr = np.ascontiguousarray(cost.as_array(), dtype=np.float64)
    moves, scores, valid = [], [], []
    for l in range(L):
        g, j, o, n, sc, _, ok = even_path_kernel(
            np.ascontiguousarray(prev[l].reshape(G, per)),
            np.ascontiguousarray(tgt[l].reshape(G, per)),
            np.ascontiguousarray(X[:, l, :]), act, arr,
        )  # fmt: skip
        moves.append(np.stack([g, j, o, n], axis=1))
        scores.append(sc)
        valid.append(ok)
    return RebalancePath(
        n_gpus=G, previous=prev, target=tgt, moves=moves, score=scores, valid=valid
    )
