"""Problem 1, fixed-charge makespan dispatch (TEMPO §3.1), stated exactly.

An instance is a :class:`DispatchProblem` (token counts per expert, replica mask, optional
node of each GPU). A dispatch is a ``shares`` matrix ``x[e, g] >= 0`` with
``sum_g x[e, g] = n[e]`` and ``x[e, g] = 0`` off the replica set. :func:`evaluate` is the
independent evaluator every solver and test is scored by; it owes nothing to any solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .cost import CostModel
from .errors import InfeasibleSharesError, InvalidInputError, param_error
from .validation import MAX_EXACT_INT, check_array, check_int, check_real, check_type

__all__ = [
    "DispatchProblem",
    "Evaluation",
    "evaluate",
    "evaluate_arrays",
    "check_shares",
    "tile_count",
    "basic_lower_bound",
    "logical_to_physical",
]

#: Relative tolerance of conservation in :func:`check_shares`.
CONSERVATION_RTOL = 1e-9
#: Shares are compared to tile boundaries with this absolute slack (tokens), so that an LP
#: share of 128.0000000001 tokens is one tile, not two.
TILE_SLACK = 1e-7


#: Largest token count accepted per expert (float64 sums of counts stay exact below 2**53).
MAX_COUNT = 2**52

_COUNTS_FORM = (
    "a non-empty 1-D (n_experts,) or 2-D (n_layers >= 1, n_experts) array of non-negative "
    "integers below 2**52, at most 2**53 per layer"
)


def _counts_iv(counts, func: str) -> np.ndarray:
    """``counts`` as int64, 1-D ``(E,)`` or 2-D ``(L, E)`` with ``E, L >= 1``."""
    arr = check_array(
        counts, "counts", func, kind="int", ndim=(1, 2), lo=0, hi=MAX_COUNT, expected=_COUNTS_FORM
    )
    if 0 in arr.shape:
        raise param_error("counts", func, _COUNTS_FORM, f"shape {arr.shape}")
    # the float64 sums every solver takes of a layer stay exact (and times finite,
    # cost.MAX_COST_PARAMETER)
    totals = np.atleast_1d(arr.astype(np.float64).sum(axis=-1))
    if float(totals.max()) <= 2 * MAX_EXACT_INT:  # then the int64 sums cannot overflow
        totals = np.atleast_1d(arr.sum(axis=-1))
    if totals.max() > MAX_EXACT_INT:
        i = int(np.argmax(totals))
        raise param_error(
            "counts",
            func,
            f"counts whose total per layer is at most 2**53 = {MAX_EXACT_INT} (float64 sums "
            "stay exact)",
            f"a total of {int(totals[i])}" + (f" in layer {i}" if arr.ndim == 2 else ""),
        )
    return arr


def _problem_iv(counts, replicas, gpu_node, func: str = "DispatchProblem"):
    """Validated, normalized ``(counts, replicas, gpu_node)`` of a :class:`DispatchProblem`.

    Returns fresh read-only arrays: counts int64 ``(E,)`` or ``(L, E)``; replicas bool
    ``(E, g)`` or ``(L, E, g)`` (a 2-D mask with 2-D counts is repeated for every layer);
    gpu_node int64 ``(g,)`` or None.
    """
    counts = _counts_iv(counts, func)
    if counts.ndim == 1:
        E = counts.shape[0]
        form = f"a boolean (or 0/1) mask of shape (n_experts={E}, n_gpus >= 1)"
        rep = check_array(replicas, "replicas", func, kind="bool", ndim=2, expected=form)
        if rep.shape[0] != E or rep.shape[1] < 1:
            raise param_error("replicas", func, form, f"shape {rep.shape}")
    else:
        L, E = counts.shape
        form = f"a boolean (or 0/1) mask of shape ({E}, n_gpus >= 1) or ({L}, {E}, n_gpus >= 1)"
        rep = check_array(replicas, "replicas", func, kind="bool", ndim=(2, 3), expected=form)
        if rep.ndim == 2:
            if rep.shape[0] != E or rep.shape[1] < 1:
                raise param_error("replicas", func, form, f"shape {rep.shape}")
            rep = np.broadcast_to(rep, (L, *rep.shape))
        elif rep.shape[:2] != (L, E) or rep.shape[2] < 1:
            raise param_error("replicas", func, form, f"shape {rep.shape}")
    orphan = (counts > 0) & ~rep.any(axis=-1)
    if orphan.any():
        idx = tuple(int(i) for i in np.argwhere(orphan)[0])
        raise InvalidInputError(
            f"The 'replicas' parameter of {func} must give every expert with tokens at "
            f"least one replica. Got expert {idx[-1]}"
            + (f" of layer {idx[0]}" if len(idx) == 2 else "")
            + f" with {int(counts[idx])} tokens and no replica instead."
        )
    node = None
    if gpu_node is not None:
        n_gpus = rep.shape[-1]
        node = check_array(
            gpu_node, "gpu_node", func, kind="int", ndim=1, shape=(n_gpus,), lo=0, copy=True
        )
    counts = np.array(counts, dtype=np.int64, order="C", copy=True)
    rep = np.array(rep, dtype=np.bool_, order="C", copy=True)
    for a in (counts, rep, node):
        if a is not None:
            a.setflags(write=False)
    return counts, rep, node


@dataclass(frozen=True, eq=False, kw_only=True)
class DispatchProblem:
    """One MoE layer (or a stack of layers) to dispatch.

    Parameters
    ----------
    counts : array_like of int, shape (n_experts,) or (n_layers, n_experts)
        Tokens routed to each expert (non-negative integers).
    replicas : array_like of bool, shape (n_experts, n_gpus) or (n_layers, n_experts, n_gpus)
        ``replicas[e, g]`` is True when GPU ``g`` holds a replica of expert ``e``. A 2-D mask
        with 2-D counts is shared by every layer.
    gpu_node : array_like of int, shape (n_gpus,), optional
        Node of each GPU (for topology-aware splits); default: one node.

    Raises
    ------
    InvalidInputError
        Negative, non-integer, NaN or infinite counts; mismatched shapes; an expert with
        tokens but no replica.

    Examples
    --------
    >>> p = DispatchProblem(counts=[600, 30, 30], replicas=np.ones((3, 2), bool))
    >>> p.n_experts, p.n_gpus, p.is_stack
    (3, 2, False)
    """

    counts: np.ndarray
    replicas: np.ndarray
    gpu_node: np.ndarray | None = None

    def __post_init__(self) -> None:
        counts, rep, node = _problem_iv(self.counts, self.replicas, self.gpu_node)
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "replicas", rep)
        object.__setattr__(self, "gpu_node", node)

    # --- shape --------------------------------------------------------------------
    @property
    def is_stack(self) -> bool:
        """True for a stack of layers (2-D counts)."""
        return self.counts.ndim == 2

    @property
    def n_layers(self) -> int:
        """Number of layers (1 for a single layer)."""
        return self.counts.shape[0] if self.is_stack else 1

    @property
    def n_experts(self) -> int:
        """Number of logical experts."""
        return self.counts.shape[-1]

    @property
    def n_gpus(self) -> int:
        """Number of GPUs."""
        return self.replicas.shape[-1]

    @property
    def full_replication(self) -> bool:
        """True when every expert with tokens has a replica on every GPU (per layer for stacks)."""
        live = self.counts > 0
        return bool(np.all(self.replicas.all(axis=-1) | ~live))

    def layer(self, l: int) -> DispatchProblem:
        """The single-layer problem of layer ``l`` (the problem itself if not a stack)."""
        l = check_int(l, "l", "DispatchProblem.layer", lo=0, hi=self.n_layers - 1)
        if not self.is_stack:
            return self
        # The stack was validated once; its slices are valid read-only views, so the
        # layer skips __post_init__ (validation happens once, at the entry point).
        layer = object.__new__(DispatchProblem)
        object.__setattr__(layer, "counts", self.counts[l])
        object.__setattr__(layer, "replicas", self.replicas[l])
        object.__setattr__(layer, "gpu_node", self.gpu_node)
        return layer

    def layers(self):
        """Iterate over single-layer problems."""
        for l in range(self.n_layers):
            yield self.layer(l)

    # --- SGLang / vLLM layouts ---------------------------------------------------------
    @classmethod
    def from_placement(cls, counts, physical_to_logical, n_gpus: int, gpu_node=None):
        """Build from an SGLang/vLLM/EPLB physical-to-logical map.

        Parameters
        ----------
        counts : array_like, shape (n_experts,) or (n_layers, n_experts)
        physical_to_logical : array_like of int, shape (P,) or (n_layers, P)
            Logical expert held by physical slot ``p``; slot ``p`` lives on GPU
            ``p // (P // n_gpus)``; ``-1`` marks an empty slot.
        n_gpus : int
            Number of GPUs; must divide ``P``.

        Notes
        -----
        Two replicas of one expert on one GPU (EPLB can produce them) collapse to one
        entry of the mask: for dispatch they are the same GPU.

        Examples
        --------
        >>> p = DispatchProblem.from_placement([5, 1], [0, 1, 0, 1], n_gpus=2)
        >>> p.replicas.astype(int).tolist()
        [[1, 1], [1, 1]]
        """
        counts_arr, p2l, n_gpus, node = _from_placement_iv(
            counts, physical_to_logical, n_gpus, gpu_node
        )
        P = p2l.shape[-1]
        gpu_of_slot = np.arange(P) // (P // n_gpus)
        p2l2 = p2l.reshape(-1, P)
        E = counts_arr.shape[-1]
        rep = np.zeros((p2l2.shape[0], E, n_gpus), dtype=bool)
        for l in range(p2l2.shape[0]):
            ok = p2l2[l] >= 0
            rep[l, p2l2[l][ok], gpu_of_slot[ok]] = True
        orphan = (counts_arr.reshape(-1, E) > 0) & ~rep.any(axis=-1)
        if orphan.any():  # (named here: the caller passed a map, not a mask)
            l, e = (int(i) for i in np.argwhere(orphan)[0])
            raise param_error(
                "physical_to_logical", "DispatchProblem.from_placement",
                "a map giving every expert with tokens at least one slot",
                f"no slot for expert {e}" + (f" of layer {l}" if counts_arr.ndim == 2 else "")
                + f", which has {int(counts_arr.reshape(-1, E)[l, e])} tokens",
            )  # fmt: skip
        rep = rep[0] if p2l.ndim == 1 else rep
        return cls(counts=counts_arr, replicas=rep, gpu_node=node)

    def to_tables(self, shares, physical_to_logical):
        """Express a dispatch in SGLang's layout.

        Parameters
        ----------
        shares : ndarray, shape (n_experts, n_gpus) or (n_layers, n_experts, n_gpus)
        physical_to_logical : array_like of int, shape (P,) or (n_layers, P)

        Returns
        -------
        logical_to_physical : ndarray of int64, shape (n_layers, n_experts, X)
            Physical slots of each expert in slot order, padded with -1.
        logical_count : ndarray of int64, shape (n_layers, n_experts)
        probabilities : ndarray of float64, shape (n_layers, n_experts, X)
            Probability of sending a token of expert ``e`` to each listed slot; each row of an
            expert with a replica sums to 1. An expert without tokens gets the uniform split.
            Where one GPU holds two replicas of an expert, its whole share goes to the first.
            Rows of experts with no replica are all zero.

        Examples
        --------
        >>> p = DispatchProblem.from_placement([6, 2], [0, 1, 0, 1], n_gpus=2)
        >>> l2p, cnt, prob = p.to_tables(np.array([[3.0, 3.0], [2.0, 0.0]]), [0, 1, 0, 1])
        >>> l2p[0].tolist(), cnt[0].tolist(), prob[0].tolist()
        ([[0, 2], [1, 3]], [2, 2], [[0.5, 0.5], [1.0, 0.0]])
        """
        sh, p2l2 = _to_tables_iv(self, shares, physical_to_logical)
        P = p2l2.shape[1]
        l2p, count = logical_to_physical(p2l2, self.n_experts)
        per = P // self.n_gpus
        # Vectorized over the listed slots only (L * P of them, in (layer, expert, column)
        # order); the loop it replaces visited every slot in Python (0.1-0.2 s for 61 layers
        # x 256 experts, too slow for a 200 ms refresh).
        li, ei, ji = np.nonzero(l2p >= 0)
        gpu = l2p[li, ei, ji] // per
        # Slots are listed in increasing order, so a row's GPUs are nondecreasing: a slot is
        # the first of its GPU iff the previous listed slot of the row is on another GPU.
        first = np.ones(li.size, dtype=bool)
        first[1:] = (li[1:] != li[:-1]) | (ei[1:] != ei[:-1]) | (gpu[1:] != gpu[:-1])
        tot = sh.sum(axis=-1)[li, ei]
        with np.errstate(divide="ignore", invalid="ignore"):
            split = np.where(first, sh[li, ei, gpu] / tot, 0.0)
        prob = np.zeros(l2p.shape, dtype=float)
        prob[li, ei, ji] = np.where(tot > 0, split, 1.0 / count[li, ei])
        return l2p, count, prob


def _p2l_iv(p2l, n_experts: int, n_gpus: int, func: str) -> np.ndarray:
    """A ``physical_to_logical`` map ``(P,)`` or ``(L, P)`` of ints in ``[-1, n_experts - 1]``
    with ``P >= 1`` slots, a multiple of ``n_gpus``."""
    form = (
        f"a non-empty 1-D (P,) or 2-D (n_layers, P) integer array with entries in "
        f"[-1, {n_experts - 1}] and P a multiple of n_gpus={n_gpus}"
    )
    p2l = check_array(
        p2l, "physical_to_logical", func, kind="int", ndim=(1, 2), lo=-1, hi=n_experts - 1,
        expected=form,
    )  # fmt: skip
    if p2l.shape[-1] == 0 or (p2l.ndim == 2 and p2l.shape[0] == 0):
        raise param_error("physical_to_logical", func, form, f"shape {p2l.shape}")
    if p2l.shape[-1] % n_gpus:
        raise param_error("physical_to_logical", func, form, f"{p2l.shape[-1]} slots")
    return p2l


def _from_placement_iv(counts, physical_to_logical, n_gpus, gpu_node):
    func = "DispatchProblem.from_placement"
    n_gpus = check_int(n_gpus, "n_gpus", func, lo=1)
    counts = _counts_iv(counts, func)
    p2l = _p2l_iv(physical_to_logical, counts.shape[-1], n_gpus, func)
    if counts.ndim == 1 and p2l.ndim != 1:
        raise param_error(
            "physical_to_logical", func, "a 1-D (P,) map for 1-D counts", f"shape {p2l.shape}"
        )
    if counts.ndim == 2 and p2l.ndim == 2 and p2l.shape[0] != counts.shape[0]:
        raise param_error(
            "physical_to_logical",
            func,
            f"a (P,) map or a ({counts.shape[0]}, P) map matching the layers of counts",
            f"shape {p2l.shape}",
        )
    if gpu_node is not None:
        gpu_node = check_array(gpu_node, "gpu_node", func, kind="int", shape=(n_gpus,), lo=0)
    return counts, p2l, n_gpus, gpu_node


def _to_tables_iv(problem: DispatchProblem, shares, physical_to_logical):
    func = "DispatchProblem.to_tables"
    L, E, g = problem.n_layers, problem.n_experts, problem.n_gpus
    want = problem.counts.shape + (g,)
    sh = check_array(
        shares, "shares", func, ndim=len(want), shape=want, lo=0,
        expected=f"an array of shape {want} of finite non-negative numbers",
    )  # fmt: skip
    p2l = _p2l_iv(physical_to_logical, E, g, func)
    if p2l.ndim == 2 and p2l.shape[0] not in (1, L):
        raise param_error(
            "physical_to_logical", func, f"a (P,) map or a ({L}, P) map", f"shape {p2l.shape}"
        )
    p2l2 = np.broadcast_to(p2l.reshape(-1, p2l.shape[-1]), (L, p2l.shape[-1]))
    return sh.reshape(L, E, g), p2l2


def logical_to_physical(physical_to_logical, n_experts: int):
    """Invert a ``physical_to_logical [L, P]`` map into EPLB's padded layout.

    Returns ``(logical_to_physical [L, E, X] padded with -1, logical_count [L, E])`` with
    slots in increasing order and ``X = max(1, max count)``.

    Examples
    --------
    >>> l2p, cnt = logical_to_physical(np.array([[1, 0, 1, -1]]), 2)
    >>> l2p.tolist(), cnt.tolist()
    ([[[1, -1], [0, 2]]], [[1, 2]])
    """
    func = "logical_to_physical"
    n_experts = check_int(n_experts, "n_experts", func, lo=1)
    p2l = np.atleast_2d(
        check_array(
            physical_to_logical, "physical_to_logical", func, kind="int", ndim=(1, 2), lo=-1,
            hi=n_experts - 1,
        )
    )  # fmt: skip
    L, P = p2l.shape
    ok = p2l >= 0
    # experts of each layer counted by one bincount over (layer, expert) keys
    key = np.where(ok, np.arange(L)[:, None] * n_experts + p2l, L * n_experts)
    count = np.bincount(key.ravel(), minlength=L * n_experts + 1)[: L * n_experts]
    count = count.reshape(L, n_experts).astype(np.int64)
    X = max(1, int(count.max(initial=0)))
    l2p = np.full((L, n_experts, X), -1, dtype=np.int64)
    # a stable sort by key keeps each expert's slots in increasing order
    order = np.argsort(key.ravel(), kind="stable")
    keys = key.ravel()[order]
    keep = keys < L * n_experts
    order, keys = order[keep], keys[keep]
    start = np.concatenate(([0], np.cumsum(count.ravel())))[keys]
    col = np.arange(keys.size) - start
    l2p.reshape(L * n_experts, X)[keys, col] = order % P
    return l2p, count


class Evaluation(NamedTuple):
    """Per-GPU quantities of a dispatch under a cost model (leading layer axis for stacks)."""

    G: np.ndarray
    """Activated replicas per GPU, ``#{e : x[e, g] > 0}``."""
    N: np.ndarray
    """Tokens per GPU, ``sum_e x[e, g]``."""
    T: np.ndarray
    """M-tiles per GPU, ``sum_e ceil(x[e, g] / tile)``."""
    times: np.ndarray
    """Modeled time of each GPU (us)."""
    makespan: np.ndarray | float
    """``max_g times`` (a float for one layer)."""


def tile_count(shares, tile: int) -> np.ndarray:
    """``ceil(x / tile)`` per entry, with ``TILE_SLACK`` tokens of slack at boundaries.

    >>> tile_count([0.0, 1.0, 128.0000000001, 129.0], 128).tolist()
    [0, 1, 1, 2]
    """
    tile = check_int(tile, "tile", "tile_count", lo=1)
    x = check_array(shares, "shares", "tile_count", ndim=(0, 1, 2, 3), lo=-MAX_COUNT, hi=MAX_COUNT)
    return _tile_count(x, tile)


def _tile_count(x: np.ndarray, tile: int) -> np.ndarray:
    k = np.maximum(1.0, np.ceil((x - TILE_SLACK) / tile))
    return np.where(x > 0, k, 0.0).astype(np.int64)


def evaluate(problem: DispatchProblem, cost: CostModel, shares) -> Evaluation:
    """Score a dispatch under the cost model, independently of how it was produced.

    Activation is strict: ``x[e, g] > 0`` counts, however small. Feasibility is not
    checked here (shares must be numbers of the right shape, at most ``2**52`` in size, the
    largest token count); see :func:`check_shares`.

    Examples
    --------
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> cost = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> x = np.zeros((7, 2)); x[0] = [300, 300]; x[1:4, 0] = 30; x[4:, 1] = 30
    >>> evaluate(p, cost, x).makespan
    60.0
    """
    x = _evaluate_iv(problem, cost, shares)
    return evaluate_arrays(problem, cost, x)


def _evaluate_iv(problem, cost, shares) -> np.ndarray:
    func = "evaluate"
    check_type(problem, "problem", func, DispatchProblem, "a DispatchProblem")
    check_type(cost, "cost", func, CostModel, "a CostModel")
    want = problem.counts.shape + (problem.n_gpus,)
    return check_array(
        shares, "shares", func, ndim=len(want), shape=want, lo=-MAX_COUNT, hi=MAX_COUNT,
        expected=f"an array of shape {want} of numbers in [-2**52, 2**52]",
    )  # fmt: skip


def evaluate_arrays(problem: DispatchProblem, cost: CostModel, x: np.ndarray) -> Evaluation:
    """:func:`evaluate` on a float64 ``shares`` array of the problem's shape, unchecked.

    For callers that produced ``x`` themselves (``solve_dispatch`` scores every method's
    output with it); user input goes through :func:`evaluate`.
    """
    G = (x > 0).sum(axis=-2)
    N = x.sum(axis=-2)
    T = _tile_count(x, cost.tile).sum(axis=-2)
    times = cost.time(G, N, T)
    makespan = times.max(axis=-1)
    if makespan.ndim == 0:
        makespan = float(makespan)
    return Evaluation(G=G, N=N, T=T, times=times, makespan=makespan)


def check_shares(problem: DispatchProblem, shares, *, rtol: float = CONSERVATION_RTOL) -> None:
    """Raise :class:`InfeasibleSharesError` unless ``shares`` is a feasible dispatch.

    Feasible means: right shape, finite, non-negative, exactly zero off the replica mask,
    and ``|sum_g x[e, g] - n[e]| <= rtol * max(1, n[e])`` for every expert.

    Examples
    --------
    >>> p = DispatchProblem(counts=[4], replicas=[[True, False]])
    >>> check_shares(p, [[4.0, 0.0]])
    >>> check_shares(p, [[2.0, 2.0]])
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InfeasibleSharesError: The 'shares' ... must be zero where no
    replica exists. Got 2.0 tokens of expert 0 on GPU 1 instead.
    """
    func = "check_shares"
    check_type(problem, "problem", func, DispatchProblem, "a DispatchProblem")
    rtol = check_real(rtol, "rtol", func, lo=0)
    want = problem.counts.shape + (problem.n_gpus,)
    x = check_array(
        shares, "shares", func, ndim=(1, 2, 3, 4), values=False,
        expected=f"an array of shape {want} of numbers",
    )  # fmt: skip
    if x.shape != want:
        raise param_error(
            "shares", func, f"an array of shape {want}", f"shape {x.shape}", InfeasibleSharesError
        )
    if not np.all(np.isfinite(x)):
        raise param_error(
            "shares", func, "finite", "NaN or infinite entries", InfeasibleSharesError
        )
    if (x < 0).any():
        raise param_error(
            "shares", func, "non-negative", f"minimum {float(x.min())!r}", InfeasibleSharesError
        )
    off = (x != 0) & ~problem.replicas
    if off.any():
        idx = tuple(int(i) for i in np.argwhere(off)[0])
        where = f"expert {idx[-2]} on GPU {idx[-1]}" + (
            f" of layer {idx[0]}" if len(idx) == 3 else ""
        )
        raise param_error(
            "shares",
            func,
            "zero where no replica exists",
            f"{float(x[idx])!r} tokens of {where}",
            InfeasibleSharesError,
        )
    n = problem.counts.astype(float)
    err = np.abs(x.sum(axis=-1) - n)
    bad = err > rtol * np.maximum(1.0, n)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise param_error(
            "shares",
            func,
            f"conserving every expert's tokens (relative tolerance {rtol:g})",
            f"{float(x[idx].sum())!r} tokens for expert {idx[-1]} with {int(n[idx])}",
            InfeasibleSharesError,
        )


def basic_lower_bound(problem: DispatchProblem, cost: CostModel):
    """A lower bound on the optimal makespan valid for any replica sets (per layer).

    Averaging argument (TEMPO Theorem 2, "lower bounds"): every live expert is activated at
    least once and its tokens are conserved, so some GPU carries at least the mean of each
    additive measure:

    * activations: ``a + b*ceil(E_live/g)`` when ``b2 = 0``; with tiles, each live expert
      costs at least ``min(b + b2*(k_e - 1), b*k_e)`` (``k_e = ceil(n_e/tile)``), because
      splitting it into ``j`` pieces costs ``b*j + b2*(max(j, k_e) - j)``; so
      ``a + sum_e phi_e / g``;
    * tokens: ``c + beta*N/g`` and ``c2 + gamma*N/g``.

    The maximum of these is returned (a float, or an array for stacks). Stronger bounds
    for restricted replication (semi-matching, token LP) live in ``straggler.solvers``.
    """
    check_type(problem, "problem", "basic_lower_bound", DispatchProblem, "a DispatchProblem")
    check_type(cost, "cost", "basic_lower_bound", CostModel, "a CostModel")
    n = problem.counts.reshape(problem.n_layers, problem.n_experts)
    g = problem.n_gpus
    out = np.empty(problem.n_layers)
    for l in range(problem.n_layers):
        live = n[l][n[l] > 0]
        N = float(live.sum())
        bounds = [cost.c + cost.beta * N / g]
        if cost.has_traffic:
            bounds.append(cost.c2 + cost.gamma * N / g)
        if cost.b2 > 0:
            k = np.ceil(live / cost.tile)
            per = np.minimum(cost.b + cost.b2 * (k - 1), cost.b * k)
            bounds.append(cost.a + per.sum() / g)
        # the busiest GPU holds an integer number of activations, and b2*(T - G) >= 0
        bounds.append(cost.a + cost.b * math.ceil(live.size / g))
        out[l] = max(bounds)
    return out if problem.is_stack else float(out[0])
