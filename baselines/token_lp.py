"""``token_lp``: LPLB's per-batch objective (Lemma 1), solved exactly with HiGHS.

LPLB (deepseek-ai/LPLB) balances token counts only: ``min max_g N_g`` over the replicas,
ignoring the activation cost. Optionally each expert is restricted to at most two copies
along one of LPLB's fixed replica graphs, as its redundant experts are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formulations.dispatch import DispatchProblem
from ..formulations.errors import InvalidInputError, InvalidOptionError
from ..formulations.results import Status
from ..formulations.validation import check_choice
from ..solvers.exact import solve_token_lp
from ..solvers.registry import LayerSolution, register_dispatch_method

__all__ = ["TokenLP", "TOPOLOGIES", "topology_r2o", "restrict_to_topology"]

TOPOLOGIES = ("ring", "cube", "hypercube", "torus")

#: LPLB README's example ``r2o`` for one 8-GPU group (``r2o[r, j]``: the GPU whose
#: original expert the ``j``-th redundant slot of GPU ``r`` replicates).
_CUBE8 = np.array([[3, 0, 1, 2, 7, 4, 5, 6], [6, 7, 4, 5, 0, 1, 2, 3]]).T


def topology_r2o(topology: str, n_gpus: int, gpu_node=None) -> np.ndarray:
    """LPLB's redundant-to-original map ``r2o`` of shape ``(n_gpus, k)`` for a topology.

    * ``"ring"`` (any ``n_gpus >= 2``): GPU ``r`` replicates GPU ``r - 1``'s expert (k = 1);
    * ``"cube"`` (``n_gpus`` a multiple of 8): per 8-GPU group, the ``r2o`` example of LPLB's
      README (k = 2, a cube with diagonal edges);
    * ``"hypercube"`` (``n_gpus == 16``): ``r2o[r, j] = r XOR 2**j``, ``j < 4`` (no diagonals);
    * ``"torus"`` (``gpu_node`` with at least 2 nodes of equal size at least 2, GPUs of a
      node contiguous): one neighbour in the same node (local rank ``- 1``) and one on the
      previous node (same local rank), k = 2.

    Raises
    ------
    InvalidInputError
        A topology the GPU count (or nodes) does not fit.

    Examples
    --------
    >>> topology_r2o("ring", 3).ravel().tolist()
    [2, 0, 1]
    >>> topology_r2o("cube", 8)[0].tolist()
    [3, 6]
    """
    func = "token_lp"
    g = int(n_gpus)
    if topology == "ring":
        if g < 2:
            raise InvalidInputError(f"The 'ring' topology of {func} needs >= 2 GPUs; got {g}.")
        return ((np.arange(g) - 1) % g)[:, None]
    if topology == "cube":
        if g % 8:
            raise InvalidInputError(
                f"The 'cube' topology of {func} needs a multiple of 8 GPUs; got {g}."
            )
        base = (np.arange(g) // 8 * 8)[:, None]
        return base + _CUBE8[np.arange(g) % 8]
    if topology == "hypercube":
        if g != 16:
            raise InvalidInputError(f"The 'hypercube' topology of {func} needs 16 GPUs; got {g}.")
        return np.arange(16)[:, None] ^ (1 << np.arange(4))[None, :]
    if topology == "torus":
        node = None if gpu_node is None else np.asarray(gpu_node)
        if node is None:
            raise InvalidInputError(f"The 'torus' topology of {func} needs the problem's gpu_node.")
        nodes, sizes = np.unique(node, return_counts=True)
        m = int(sizes[0])
        contiguous = np.array_equal(node, np.repeat(nodes, m))
        if nodes.size < 2 or m < 2 or (sizes != m).any() or not contiguous:
            raise InvalidInputError(
                f"The 'torus' topology of {func} needs >= 2 nodes of equal size >= 2 with "
                f"contiguous GPUs. Got gpu_node={node.tolist()} instead."
            )
        r = np.arange(g)
        local, nd = r % m, r // m
        same = nd * m + (local - 1) % m
        other = ((nd - 1) % nodes.size) * m + local
        return np.stack([same, other], axis=1)
    raise InvalidOptionError(
        f"The 'topology' parameter of {func} must be None or one of {list(TOPOLOGIES)}. "
        f"Got {topology!r} instead."
    )


def restrict_to_topology(problem: DispatchProblem, topology: str) -> np.ndarray:
    """The replica mask LPLB's graph allows: each expert on at most two GPUs.

    An expert's original GPU is its lowest-index replica GPU ``o``; its one redundant copy
    may sit on a GPU ``r`` with ``o`` in ``r2o[r]`` (an edge of the graph) that holds a
    replica in the instance's mask; the first such ``r`` in column order ``j``, then GPU
    order, is kept. Other replicas are dropped.

    Examples
    --------
    >>> p = DispatchProblem(counts=[4, 1, 1], replicas=np.ones((3, 3), bool))
    >>> restrict_to_topology(p, "ring").astype(int).tolist()
    [[1, 1, 0], [1, 1, 0], [1, 1, 0]]
    """
    r2o = topology_r2o(topology, problem.n_gpus, problem.gpu_node)
    rep = problem.replicas
    out = np.zeros_like(rep)
    for e in range(problem.n_experts):
        gs = np.flatnonzero(rep[e])
        if gs.size == 0:
            continue
        o = gs[0]
        out[e, o] = True
        for j in range(r2o.shape[1]):
            hosts = np.flatnonzero((r2o[:, j] == o) & rep[e])
            hosts = hosts[hosts != o]
            if hosts.size:
                out[e, hosts[0]] = True
                break
    return out


@register_dispatch_method("token_lp")
@dataclass(frozen=True)
class TokenLP:
    """LPLB: minimize the largest per-GPU token count (Lemma 1), exactly.

    Parameters
    ----------
    topology : {None, "ring", "cube", "hypercube", "torus"}
        None uses every replica of the instance; otherwise each expert keeps at most two
        copies along LPLB's graph (:func:`restrict_to_topology`).

    Notes
    -----
    Status is HEURISTIC: the LP is exact for its own objective, not for the makespan (it
    ignores the activation cost ``b``). Shares are cleaned by the LP decoder (no share
    below ``1e-9 n_e``, exact conservation). LPLB's own solver runs a few interior-point
    steps on the GPU and falls back to a 50/50 split on failure; this baseline solves the
    LP to optimality, i.e. it is LPLB at its best.

    References
    ----------
    TEMPO Lemma 1; deepseek-ai/LPLB README ("How LPLB works", "Typical topologies").
    """

    topology: str | None = None

    def __post_init__(self) -> None:
        if self.topology is not None:
            check_choice(self.topology, "topology", "solve_dispatch(method='token_lp')", TOPOLOGIES)

    def solve(self, problem, cost, *, time_limit, rng) -> LayerSolution:
        sub = problem
        if self.topology is not None:
            sub = DispatchProblem(
                counts=problem.counts,
                replicas=restrict_to_topology(problem, self.topology),
                gpu_node=problem.gpu_node,
            )
        lp = solve_token_lp(sub, cost, time_limit=time_limit, full_output=True)
        # at the time limit: the incumbent (or LPLB's even split), not claimed as the LP optimum
        status = Status.HEURISTIC if lp.status is Status.OPTIMAL else Status.FEASIBLE
        extras = {"max_tokens": lp.value, "topology": self.topology}
        if lp.fallback is not None:
            extras["fallback"] = lp.fallback
        return LayerSolution(shares=lp.shares, status=status, extras=extras)
