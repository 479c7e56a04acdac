"""``lplb``: DeepSeek's LPLB, with its own placement, its shared-ratio LP and its token map.

Upstream: deepseek-ai/LPLB (first public release, 2025; read in ``lplb/planner.py``,
``lplb/resources/csrc-tmpl/minilp.cu`` and ``tests/utils.py``). Three stages, all here:

1. **Placement** (``Planner.update_redundancy_mapping``): DeepSeek EPLB *without
   replication* (``rebalance_experts(workload, n_experts, n_group, n_nodes, n_gpus)``, i.e.
   a reordering of the experts over the GPUs), each GPU's experts sorted by descending
   workload, then each GPU's top ``combined * D`` experts copied once along the fixed graph
   ``r2o`` (:func:`lplb_r2o`): redundant slot ``(c, j)`` of GPU ``r`` holds the
   ``(c * D + j)``-th hottest expert of GPU ``r2o[r, j]``. Every copied expert has exactly
   two replicas.
2. **LP** (``kernel_solve``, one CUDA block per group of ``group_size`` GPUs): one variable
   per (GPU, redundant slot index ``j``), shared by the ``combined`` experts behind it: the
   fraction of their tokens kept on the original GPU (the rest goes to the copy); minimise
   the group's largest token load, workloads normalised by their maximum. Upstream solves
   it with **5 fp32 affine-scaling steps** from ``x = 1`` with a big-M artificial column,
   and, unless ``d_max < 0.1``, the artificial variable is in ``[0, 1e-4)`` and the
   residual is below ``0.05``, falls back to a **50/50 split** (``solver="ipm"``,
   :func:`_lplb_ipm`). ``solver="exact"`` (default) solves the same LP to optimality.
3. **Token map** (``kernel_map_idx``): on every source rank, of its ``n`` tokens of a
   copied expert the ones whose permuted index ``(499 k + 41) % n`` is below
   ``trunc(ratio * n)`` stay on the original, the others go to the copy.

Topologies (``tests/utils.py``): ring ``r -> r + 1``; cube (8 GPUs, 2 copies, the README's
``r2o``); hypercube (16 GPUs, 2 copies: ring ``r -> r - 1`` within groups of 4, and
``r -> r - 4`` across them); torus (``torus_2d(m, n)``: the next node's GPU of the same
local index, and the same node's local index ``+ 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.optimize import linprog

from ...formulations.dispatch import DispatchProblem, evaluate
from ...formulations.errors import InvalidInputError, InvalidOptionError, StragglerError
from ...formulations.validation import check_array, check_choice, check_int
from ...solvers.dispatch.method import LayerSolution
from ...solvers.placement.eplb import rebalance_experts
from .tokens import token_layout

__all__ = [
    "LPLB",
    "TOPOLOGIES",
    "LPLB_SOLVERS",
    "LPLBPlan",
    "lplb_r2o",
    "topology_r2o",
    "lplb_placement",
]

#: LPLB's topologies (``"auto"`` in :class:`LPLB` picks cube or ring).
TOPOLOGIES = ("ring", "cube", "hypercube", "torus")
#: Accepted values of :attr:`LPLB.solver`.
LPLB_SOLVERS = ("exact", "ipm")

#: ``CUBE_8P2E``: the README's ``r2o`` of one 8-GPU group (``r2o[r, j]``).
_CUBE8 = np.array([[3, 0, 1, 2, 7, 4, 5, 6], [6, 7, 4, 5, 0, 1, 2, 3]]).T
#: ``HYPERCUBE_16P2E`` of ``tests/utils.py``.
_HYPERCUBE16 = np.array(
    [
        [3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10, 15, 12, 13, 14],
        [12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    ]
).T


def _nodes_of(gpu_node, n_gpus: int, func: str, topology: str):
    """(number of nodes, GPUs per node) of a contiguous equal-block ``gpu_node``."""
    node = np.zeros(n_gpus, np.int64) if gpu_node is None else np.asarray(gpu_node)
    values, sizes = np.unique(node, return_counts=True)
    per = int(sizes[0])
    if (sizes != per).any() or not np.array_equal(node, np.repeat(values, per)):
        raise InvalidInputError(
            f"The '{topology}' topology of {func} needs nodes of equal size with contiguous "
            f"GPUs. Got gpu_node={node.tolist()} instead."
        )
    return values.size, per


def _eplb_nodes(gpu_node) -> int:
    """LPLB's ``num_nodes`` for EPLB (``ep_size // devices_per_node``): the number of nodes
    when they are contiguous blocks of equal size, else 1 (the global policy)."""
    if gpu_node is None:
        return 1
    node = np.asarray(gpu_node)
    values, sizes = np.unique(node, return_counts=True)
    if (sizes != sizes[0]).any() or not np.array_equal(node, np.repeat(values, sizes[0])):
        return 1
    return int(values.size)


def lplb_r2o(topology: str, n_gpus: int, gpu_node=None, *, func: str = "lplb_r2o"):
    """LPLB's redundant-to-original map of one group and the group size.

    Returns ``(r2o, group_size)``: ``r2o`` of shape ``(group_size, D)``, ``r2o[r, j]`` the
    GPU (within the group) whose experts the ``j``-th redundant slots of GPU ``r`` copy; the
    ``n_gpus // group_size`` groups are solved independently.

    * ``"ring"``: one group of all ``n_gpus >= 2`` GPUs, ``r2o[r] = (r + 1) % n`` (D = 1);
    * ``"cube"``: groups of 8, the README's graph (D = 2);
    * ``"hypercube"``: groups of 16 (D = 2);
    * ``"torus"``: one group of ``m >= 2`` nodes of ``n >= 2`` GPUs (``gpu_node``
      contiguous, equal), ``r2o[i n + j] = ((i + 1) % m) n + j, i n + (j + 1) % n`` (D = 2).

    Raises
    ------
    InvalidInputError
        A topology that the GPU count or nodes do not fit.
    InvalidOptionError
        An unknown topology.

    Examples
    --------
    >>> lplb_r2o("ring", 3)[0].ravel().tolist()
    [1, 2, 0]
    >>> r2o, size = lplb_r2o("torus", 4, [0, 0, 1, 1])
    >>> size, r2o.tolist()
    (4, [[2, 1], [3, 0], [0, 3], [1, 2]])
    """
    g = check_int(n_gpus, "n_gpus", func, lo=1)
    if gpu_node is not None:
        gpu_node = check_array(gpu_node, "gpu_node", func, kind="int", ndim=1, lo=0, shape=(g,))
    if topology == "ring":
        if g < 2:
            raise InvalidInputError(f"The 'ring' topology of {func} needs >= 2 GPUs; got {g}.")
        return ((np.arange(g) + 1) % g)[:, None], g
    if topology == "cube":
        if g % 8:
            raise InvalidInputError(
                f"The 'cube' topology of {func} needs a multiple of 8 GPUs; got {g}."
            )
        return _CUBE8.copy(), 8
    if topology == "hypercube":
        if g % 16:
            raise InvalidInputError(
                f"The 'hypercube' topology of {func} needs a multiple of 16 GPUs; got {g}."
            )
        return _HYPERCUBE16.copy(), 16
    if topology == "torus":
        if gpu_node is None:
            raise InvalidInputError(f"The 'torus' topology of {func} needs the problem's gpu_node.")
        m, n = _nodes_of(gpu_node, g, func, "torus")
        if m < 2 or n < 2:
            raise InvalidInputError(
                f"The 'torus' topology of {func} needs >= 2 nodes of >= 2 GPUs. Got "
                f"gpu_node={np.asarray(gpu_node).tolist()} instead."
            )
        r2o = [[(i + 1) % m * n + j, i * n + (j + 1) % n] for i in range(m) for j in range(n)]
        return np.array(r2o, dtype=np.int64), g
    raise InvalidOptionError(
        f"The 'topology' parameter of {func} must be one of {list(TOPOLOGIES)}. "
        f"Got {topology!r} instead."
    )


def topology_r2o(topology: str, n_gpus: int, gpu_node=None, *, func: str = "topology_r2o"):
    """:func:`lplb_r2o` over all GPUs: ``(n_gpus, D)`` global GPU indices.

    Examples
    --------
    >>> topology_r2o("ring", 3).ravel().tolist()
    [1, 2, 0]
    >>> topology_r2o("cube", 16)[8].tolist()
    [11, 14]
    """
    r2o, size = lplb_r2o(topology, n_gpus, gpu_node, func=func)
    r = np.arange(int(n_gpus))
    return (r // size * size)[:, None] + r2o[r % size]


class LPLBPlan(NamedTuple):
    """An LPLB placement: slots, the graph and the shapes its LP needs."""

    physical_to_logical: np.ndarray
    """``(n_gpus * slots_per_gpu,)`` expert of each slot (``-1``: an empty padding slot);
    GPU ``r``'s slots are its ``n_local`` originals (by descending workload) then its
    ``combined * D`` copies in ``(c, j)`` order."""
    r2o: np.ndarray
    """``(group_size, D)`` redundant-to-original map within a group."""
    group_size: int
    n_local: int
    """Original experts per GPU (experts padded up to a multiple of ``n_gpus``)."""
    combined: int
    """Experts per (GPU, redundant slot index) sharing one LP variable."""

    @property
    def n_gpus(self) -> int:
        """Number of GPUs."""
        return self.physical_to_logical.size // (self.n_local + self.combined * self.r2o.shape[1])

    def replicas(self, n_experts: int) -> np.ndarray:
        """The placement as a ``(n_experts, n_gpus)`` replica mask."""
        g = self.n_gpus
        per = self.physical_to_logical.size // g
        mask = np.zeros((n_experts, g), dtype=bool)
        for p, e in enumerate(self.physical_to_logical):
            if 0 <= e < n_experts:
                mask[e, p // per] = True
        return mask


def _lplb_placement_iv(workload, n_gpus, topology, redundant_per_gpu, gpu_node):
    func = "lplb_placement"
    w = check_array(workload, "workload", func, kind="real", ndim=1, lo=0)
    if w.size == 0:
        raise InvalidInputError(f"The 'workload' parameter of {func} must be non-empty.")
    g = check_int(n_gpus, "n_gpus", func, lo=1)
    check_choice(topology, "topology", func, TOPOLOGIES)
    red = check_int(redundant_per_gpu, "redundant_per_gpu", func, lo=0)
    if gpu_node is not None:
        gpu_node = check_array(gpu_node, "gpu_node", func, kind="int", ndim=1, lo=0, shape=(g,))
    return w, g, topology, red, gpu_node


def lplb_placement(workload, n_gpus: int, topology: str, *, redundant_per_gpu: int, gpu_node=None):
    """LPLB's placement (``Planner.update_redundancy_mapping``) for one layer.

    Parameters
    ----------
    workload : array_like of float, shape (n_experts,)
        Load statistics of every expert (upstream: the workload history).
    n_gpus : int
    topology : {"ring", "cube", "hypercube", "torus"}
    redundant_per_gpu : int
        Redundant slots per GPU; used in multiples of the topology's ``D`` copies per GPU
        (``combined = redundant_per_gpu // D``, at most ``n_local // D``).
    gpu_node : array_like of int, optional
        Node of every GPU: EPLB's reordering runs hierarchically over the nodes (LPLB
        passes ``num_nodes = ep_size // devices_per_node`` and ``num_groups =
        n_gpus // group_size``); the torus needs it.

    Returns
    -------
    LPLBPlan

    Notes
    -----
    Not upstream: experts are padded with zero-workload phantoms up to a multiple of
    ``n_gpus`` (upstream asserts divisibility); phantom slots read ``-1``. The per-GPU sort
    by workload is stable (upstream's ``argsort`` is not: ties may order differently).

    Examples
    --------
    Four experts on two GPUs (ring, one copy per GPU): EPLB packs {0, 3} and {1, 2}; each
    GPU's hottest expert is copied to the other GPU.

    >>> plan = lplb_placement([9, 5, 4, 1], 2, "ring", redundant_per_gpu=1)
    >>> plan.physical_to_logical.tolist()
    [0, 3, 1, 1, 2, 0]
    """
    w, g, topology, red, gpu_node = _lplb_placement_iv(
        workload, n_gpus, topology, redundant_per_gpu, gpu_node
    )
    func = "lplb_placement"
    r2o, size = lplb_r2o(topology, g, gpu_node, func=func)
    n_group = g // size
    D = r2o.shape[1]
    E = w.size
    n_local = -(-E // g)
    wp = np.zeros(n_local * g, dtype=np.float32)
    wp[:E] = w
    combined = min(red // D, n_local // D)
    nodes = _eplb_nodes(gpu_node)
    try:
        p2l, _, _ = rebalance_experts(wp[None], wp.size, n_group, nodes, g)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{func}: no EPLB reordering for these parameters: {exc}") from exc
    nored = p2l[0].reshape(n_group, size, n_local)
    order = np.argsort(-wp[nored], axis=-1, kind="stable")
    nored = np.take_along_axis(nored, order, axis=-1)
    tored = nored[:, :, : combined * D].reshape(n_group, size, combined, D)
    dup = np.empty_like(tored)
    for j in range(D):
        dup[..., j] = tored[:, r2o[:, j]][..., j]
    phy = np.concatenate([nored, dup.reshape(n_group, size, combined * D)], axis=-1).ravel()
    phy = np.where(phy < E, phy, -1).astype(np.int64)
    return LPLBPlan(phy, r2o.astype(np.int64), size, n_local, combined)


def _lplb_lp(workload, plan: LPLBPlan):
    """The LP data of every group: ``(W, fixed)`` with ``W[grp, r, j]`` the normalised
    workload of the ``combined`` experts behind GPU ``r``'s slot index ``j`` and
    ``fixed[grp, r]`` that of its experts without a copy (``kernel_solve``'s
    ``dup_workload`` and ``-b``), float32, workload divided by its maximum.

    Examples
    --------
    >>> plan = lplb_placement([9, 5, 4, 1], 2, "ring", redundant_per_gpu=1)
    >>> W, fixed = _lplb_lp([9, 5, 4, 1], plan)
    >>> np.round(W.astype(float), 4).tolist(), np.round(fixed.astype(float), 4).tolist()
    ([[[1.0], [0.5556]]], [[0.1111, 0.4444]])
    """
    w = np.asarray(workload, dtype=np.float32)
    peak = np.float32(w.max(initial=0))
    wn = w / peak if peak > 0 else np.zeros_like(w)
    g = plan.n_gpus
    D = plan.r2o.shape[1]
    per = plan.physical_to_logical.size // g
    p2l = plan.physical_to_logical.reshape(g, per)
    load = np.where(p2l >= 0, wn[np.maximum(p2l, 0)], np.float32(0)).astype(np.float32)
    n_group = g // plan.group_size
    orig = load[:, : plan.n_local]
    W = np.zeros((g, D), np.float32)
    for c in range(plan.combined):  # upstream sums over j < n_experts_per_var in order
        W = W + orig[:, c * D : (c + 1) * D]
    fixed = np.zeros(g, np.float32)
    for j in range(plan.combined * D, plan.n_local):
        fixed = fixed + orig[:, j]
    return W.reshape(n_group, plan.group_size, D), fixed.reshape(n_group, plan.group_size)


#: Lanes of the warp that reduces ``d_max`` in ``kernel_solve``.
_WARP = 32


def _ipm_model(W, fixed, r2o):
    """``kernel_solve``'s ``A``, ``b``, ``c`` for one group (float32)."""
    G, D = W.shape
    NC = G + G * D
    NV = G * D * 2 + G + 2
    A = np.zeros((NC, NV), np.float32)
    for ic in range(G):
        for r in range(G):
            for d in range(D):
                if ic == r:  # share kept on the original GPU
                    A[ic, r * D + d] = W[r, d]
                if r == r2o[ic, d]:  # share sent to the copy on GPU ic
                    A[ic, G * D + r * D + d] = W[r, d]
        A[ic, 2 * G * D + ic] = 1.0  # slack: max load minus this GPU's load
        A[ic, 2 * G * D + G] = -1.0  # the max load
    for i in range(G * D):
        A[G + i, i] = 1.0
        A[G + i, G * D + i] = 1.0
    b = np.concatenate([-fixed.astype(np.float32), np.ones(G * D, np.float32)])
    # big-M column making x = 1 feasible: A @ 1 = b
    col = b.copy()
    for iv in range(NV - 1):
        col = (col - A[:, iv]).astype(np.float32)
    A[:, NV - 1] = col
    c = np.zeros(NV, np.float32)
    c[NV - 2] = 1.0
    c[NV - 1] = 1000.0
    return A, b, c


def _lane_max(d: np.ndarray) -> np.float32:
    """``kernel_solve``'s ``d_max``: each of 32 lanes keeps the **last** ``d[j]`` it wrote
    (``j = lane, lane + 32, ...``; 0 for a lane with none), then the warp takes the max."""
    nv = d.size
    vals = []
    for lane in range(_WARP):
        if lane < nv:
            vals.append(d[lane + _WARP * ((nv - 1 - lane) // _WARP)])
        else:
            vals.append(np.float32(0.0))
    return np.float32(max(vals))


def _lplb_ipm(W, fixed, r2o, *, steps: int = 5):
    """Upstream's solver for one group: 5 fp32 affine-scaling steps, checked, with the
    50/50 fallback (``kernel_solve``).

    From ``x = 1`` (feasible through the big-M column, cost 1000; the max load costs 1),
    each step solves ``(A X^2 A^T) w = A X^2 c`` by Cholesky, sets ``d = x (c - A^T w)``,
    ``alpha = 0.999 / d_max`` and ``x <- x (1 - alpha d)``. ``d_max`` is upstream's warp
    reduction, which keeps only the last entry each of 32 lanes wrote (for 42 variables it
    misses ``d[0..9]``), reproduced by :func:`_lane_max`. The result is accepted when
    ``d_max < 0.1``, ``0 <= x_M < 1e-4`` and ``max |A x - b| < 0.05``; otherwise every
    ratio is 0.5.

    Parameters
    ----------
    W : ndarray, shape (group_size, D)
    fixed : ndarray, shape (group_size,)
    r2o : ndarray, shape (group_size, D)
    steps : int, default 5

    Returns
    -------
    ratios : ndarray of float32, shape (group_size, D)
        Share of each slot group's tokens kept on the original GPU.
    ok : bool
        False when the fallback was taken (also when the Cholesky factorisation fails,
        where upstream would carry on with its solver's status unchecked).

    Notes
    -----
    float32 throughout, as upstream; the GPU's cuBLASDx products and cuSolverDx Cholesky
    round in another order, so the ratios agree to float32 rounding, not bit for bit.

    Examples
    --------
    The group of :func:`_lplb_lp`'s example: five steps reach both GPUs at about ``19 / 18``
    of the hottest expert's load (the optimum); one step is not enough, and the fallback
    splits 50/50.

    >>> W, fixed = np.array([[1.0], [5 / 9]], np.float32), np.array([1 / 9, 4 / 9], np.float32)
    >>> y, ok = _lplb_ipm(W, fixed, np.array([[1], [0]]))
    >>> ok, round(float(1 / 9 + y[0, 0] + 5 / 9 * (1 - y[1, 0])), 2)
    (True, 1.06)
    >>> _lplb_ipm(W, fixed, np.array([[1], [0]]), steps=1)
    (array([[0.5],
           [0.5]], dtype=float32), False)
    """
    W = np.asarray(W, np.float32)
    G, D = W.shape
    A, b, c = _ipm_model(W, np.asarray(fixed, np.float32), np.asarray(r2o))
    x = np.ones(A.shape[1], np.float32)
    d_max = np.float32(0.0)
    # upstream divides and multiplies blindly; inf and NaN fail the check below
    with np.errstate(all="ignore"):
        try:
            for _ in range(steps):
                ax2 = (A * (x * x)[None, :]).astype(np.float32)
                m = (ax2 @ A.T).astype(np.float32)
                rhs = (ax2 @ c).astype(np.float32)
                low = np.linalg.cholesky(m)  # posv: Cholesky, then two triangular solves
                y = np.linalg.solve(low, rhs).astype(np.float32)
                w = np.linalg.solve(low.T, y).astype(np.float32)
                r = (w @ A).astype(np.float32)
                d = (x * (c - r)).astype(np.float32)
                d_max = _lane_max(d)
                alpha = np.float32(np.float64(0.999) / np.float64(d_max))  # a double literal
                x = (x * (np.float32(1.0) - alpha * d)).astype(np.float32)
        except np.linalg.LinAlgError:
            return np.full((G, D), 0.5, np.float32), False
        residual = float(np.abs((A @ x).astype(np.float32) - b).max())
    ok = bool(d_max < 0.1 and 0 <= x[-1] < 1e-4 and residual < 0.05)
    if not ok:
        return np.full((G, D), 0.5, np.float32), False
    return x[: G * D].reshape(G, D).astype(np.float32), True


def _lplb_exact(W, fixed, r2o):
    """The same LP solved to optimality (HiGHS through scipy): ratios ``y[r, j]`` in
    ``[0, 1]`` minimising ``max_r fixed[r] + sum_j W[r, j] y[r, j] +
    sum_j W[r2o[r, j], j] (1 - y[r2o[r, j], j])``.

    Returns ``(ratios float32 (group_size, D), True)``.

    Examples
    --------
    The README-sized example of :func:`_lplb_lp`: both GPUs end at ``19 / 18``.

    >>> W, fixed = np.array([[1.0], [5 / 9]]), np.array([1 / 9, 4 / 9])
    >>> y, ok = _lplb_exact(W, fixed, np.array([[1], [0]]))
    >>> y0, y1 = float(y[0, 0]), float(y[1, 0])
    >>> round(1 / 9 + y0 + 5 / 9 * (1 - y1), 4), round(4 / 9 + 5 / 9 * y1 + (1 - y0), 4)
    (1.0556, 1.0556)
    """
    W = np.asarray(W, float)
    fixed = np.asarray(fixed, float)
    G, D = W.shape
    n = G * D
    a_ub = np.zeros((G, n + 1))
    b_ub = -fixed.copy()
    for ic in range(G):
        for d in range(D):
            a_ub[ic, ic * D + d] += W[ic, d]
            q = int(r2o[ic, d])
            a_ub[ic, q * D + d] -= W[q, d]
            b_ub[ic] -= W[q, d]
        a_ub[ic, n] = -1.0
    cost = np.zeros(n + 1)
    cost[n] = 1.0
    bounds = [(0.0, 1.0)] * n + [(None, None)]
    res = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if res.status != 0:  # pragma: no cover - the LP is always feasible and bounded
        raise StragglerError(f"_lplb_exact: HiGHS did not solve the LP ({res.message}).")
    return np.clip(res.x[:n], 0.0, 1.0).reshape(G, D).astype(np.float32), True


def _kept_on_original(ratio: np.float32, n: int) -> int:
    """``kernel_map_idx``: tokens ``k < n`` with ``(499 k + 41) % n < trunc(ratio * n)``."""
    if n <= 0:
        return 0
    expected = int(np.float32(ratio) * np.float32(n))  # float -> int truncates toward zero
    k = np.arange(n, dtype=np.int64)
    return int(((k * 499 + 41) % n < expected).sum())


def _lplb_realise(source_counts, plan: LPLBPlan, ratios) -> np.ndarray:
    """LPLB's token map: whole-token shares ``(n_experts, n_gpus)``.

    Parameters
    ----------
    source_counts : ndarray of int, shape (n_experts, n_gpus)
        Tokens of each expert from each source rank.
    plan : LPLBPlan
    ratios : ndarray, shape (n_gpus, D)
        Share kept on the original GPU, per (GPU, slot index).

    Examples
    --------
    >>> plan = lplb_placement([9, 5, 4, 1], 2, "ring", redundant_per_gpu=1)
    >>> src = np.array([[5, 4], [3, 2], [2, 2], [1, 0]])
    >>> _lplb_realise(src, plan, np.array([[0.5], [1.0]], np.float32)).tolist()
    [[4.0, 5.0], [0.0, 5.0], [0.0, 4.0], [1.0, 0.0]]
    """
    src = np.asarray(source_counts, dtype=np.int64)
    n_experts, g = src.shape
    D = plan.r2o.shape[1]
    per = plan.physical_to_logical.size // g
    p2l = plan.physical_to_logical.reshape(g, per)
    ratios = np.asarray(ratios, np.float32).reshape(g, D)
    size = plan.group_size
    o2r = np.argsort(plan.r2o, axis=0, kind="stable")  # o2r[r, j]: the GPU copying r's slot j
    shares = np.zeros((n_experts, g), dtype=float)
    home = np.full(n_experts, -1, dtype=np.int64)
    copy = np.full(n_experts, -1, dtype=np.int64)
    ratio = np.zeros(n_experts, np.float32)
    for r in range(g):
        for pos in range(plan.n_local):
            e = p2l[r, pos]
            if e < 0 or e >= n_experts:
                continue
            home[e] = r
            if pos < plan.combined * D:
                j = pos % D
                copy[e] = r // size * size + o2r[r % size, j]
                ratio[e] = ratios[r, j]
    for e in range(n_experts):
        if home[e] < 0:
            continue
        if copy[e] < 0:
            shares[e, home[e]] += src[e].sum()
            continue
        for s in range(g):
            kept = _kept_on_original(ratio[e], int(src[e, s]))
            shares[e, home[e]] += kept
            shares[e, copy[e]] += src[e, s] - kept
    return shares


def _lplb_iv(method) -> None:
    func = "solve_dispatch(method='lplb')"
    check_choice(method.topology, "topology", func, ("auto", *TOPOLOGIES))
    check_choice(method.solver, "solver", func, LPLB_SOLVERS)
    if method.redundant_per_gpu is not None:
        check_int(method.redundant_per_gpu, "redundant_per_gpu", func, lo=0)
    check_int(method.top_k, "top_k", func, lo=1)
    check_int(method.layout_seed, "layout_seed", func, lo=0)


@dataclass(frozen=True, kw_only=True)
class LPLB:
    """LPLB end to end: its placement, its shared-ratio LP, its token map (module docstring).

    Parameters
    ----------
    topology : {"auto", "ring", "cube", "hypercube", "torus"}, default "auto"
        ``"auto"``: the cube (the README's graph) when the GPUs are a multiple of 8, else the
        ring.
    solver : {"exact", "ipm"}, default "exact"
        ``"ipm"``: upstream's 5 fp32 affine-scaling steps with the 50/50 fallback
        (:func:`_lplb_ipm`); ``"exact"``: the LP's optimum (:func:`_lplb_exact`), LPLB at its
        best.
    redundant_per_gpu : int, optional
        Redundant slots per GPU. Default: as many as the instance's placement has, its
        replica entries beyond one per expert divided by the GPUs, rounded.
    top_k, layout_seed : int, default 8 and 0
        Synthetic token order of the source ranks
        (:func:`~straggler.baselines.dispatch.tokens.token_layout`).

    Notes
    -----
    **Own placement.** LPLB places its replicas itself, so it does not dispatch on the
    instance's replica mask: ``extras["replicas"]`` is its mask (checked by the feasibility
    suite), ``extras["physical_to_logical"]`` its slots, ``extras["n_moved"]`` the replica
    entries its placement has and the instance's has not. The instance carries no load
    history, so the placement is built from **this batch's counts**: an optimistic LPLB
    (placement fitted to the very batch it serves). ``moves_weights`` is set so that
    comparisons keep it apart from the methods on the instance's mask; no weights move
    per batch (``extras["makespan_charged"]`` is the makespan).

    Upstream's limits stand: token counts only (its README: the grouped GEMM's
    non-linearity is ignored); the 50/50 fallback under ``solver="ipm"``.
    ``extras["ok"]`` says, per group, whether the solver's answer was used.

    References
    ----------
    deepseek-ai/LPLB README ("How LPLB works", "Typical topologies");
    TEMPO Lemma 1.

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> from straggler.solvers import solve_dispatch
    >>> p = DispatchProblem(counts=[9, 5, 4, 1], replicas=[[1, 1], [0, 1], [1, 0], [1, 0]])
    >>> r = solve_dispatch(p, CostModel(a=0, b=0, c=0, beta=1.0), method="lplb")
    >>> r.extras["physical_to_logical"].tolist(), r.shares.sum().tolist()
    ([0, 3, 1, 1, 2, 0], 19.0)
    >>> r.extras["replicas"].astype(int).tolist()  # not the instance's mask
    [[1, 1], [1, 1], [0, 1], [1, 0]]
    """

    topology: str = "auto"
    solver: str = "exact"
    redundant_per_gpu: int | None = None
    top_k: int = 8
    layout_seed: int = 0

    moves_weights = True
    own_placement = True

    def __post_init__(self) -> None:
        _lplb_iv(self)

    def _redundant(self, problem: DispatchProblem) -> int:
        if self.redundant_per_gpu is not None:
            return int(self.redundant_per_gpu)
        rep = problem.replicas
        extra = int(rep.sum()) - int(rep.any(axis=1).sum())
        return int(np.floor(extra / problem.n_gpus + 0.5))

    def solve(self, problem: DispatchProblem, cost, *, time_limit=None, rng=None) -> LayerSolution:
        """Dispatch one layer (see the class docstring)."""
        g = problem.n_gpus
        n = problem.counts
        E = problem.n_experts
        if g == 1:  # nothing to balance: every expert on the one GPU
            mask = np.ones((E, 1), bool)
            plan = None
            shares = n[:, None].astype(float)
            ok = []
        else:
            topology = self.topology
            if topology == "auto":
                topology = "cube" if g % 8 == 0 else "ring"
            red = self._redundant(problem)
            plan = lplb_placement(n, g, topology, redundant_per_gpu=red, gpu_node=problem.gpu_node)
            W, fixed = _lplb_lp(n, plan)
            solve = _lplb_ipm if self.solver == "ipm" else _lplb_exact
            ratios = np.zeros((g, plan.r2o.shape[1]), np.float32)
            ok = []
            for grp in range(W.shape[0]):
                y, good = solve(W[grp], fixed[grp], plan.r2o)
                ratios[grp * plan.group_size : (grp + 1) * plan.group_size] = y
                ok.append(good)
            lay = token_layout(n, g, top_k=int(self.top_k), seed=int(self.layout_seed))
            shares = _lplb_realise(lay.source_counts(E, g), plan, ratios)
            mask = plan.replicas(E)
        own = DispatchProblem(counts=n, replicas=mask)
        extras = {
            "replicas": own.replicas,
            "physical_to_logical": None if plan is None else plan.physical_to_logical,
            "n_moved": int((own.replicas & ~problem.replicas).sum()),
            "makespan_charged": float(evaluate(own, cost, shares).makespan),
            "ok": ok,
            "solver": self.solver,
        }
        return LayerSolution(shares=shares, extras=extras)
