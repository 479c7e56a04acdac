"""``token_lp`` and ``sglang_lp``: the token LP (Lemma 1), exact and as SGLang realises it.

``token_lp`` solves ``min max_g N_g`` over the instance's replicas exactly with HiGHS: the
objective of LPLB and of SGLang's ``lp`` dispatch, at its optimum, shares used as solved.

``sglang_lp`` is SGLang's ``--ep-dispatch-algorithm lp`` (sgl-project/sglang PR #24515; the
LP built from ``lplb`` in SGLang's kernels and ``expert_location_dispatch.py``,
``_topk_ids_logical_to_physical_probability``): the same min-max LP over every replica of
the EPLB placement, turned into per-replica probabilities ``x[e, g] / n[e]``, and then
**every token sampled** from them (a fused CUDA kernel). The realised split is a
multinomial draw around the LP's, not the LP's: an expert's tokens scatter over all its
replicas with positive mass, and per-GPU token counts deviate from the optimum by the
sampling noise.

LPLB itself (its own placement, shared ratios, IPM, token map) is ``method="lplb"``
(:mod:`straggler.baselines.dispatch.lplb`). ``token_lp(topology=...)`` only restricts the
instance's EPLB replicas to LPLB's graph; it is kept for that ablation and is **not**
LPLB's placement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...formulations.dispatch import DispatchProblem
from ...formulations.results import Status
from ...formulations.validation import check_choice, check_rng
from ...solvers.dispatch.exact import solve_token_lp
from ...solvers.dispatch.method import LayerSolution
from .lplb import TOPOLOGIES, topology_r2o

__all__ = ["TokenLP", "SGLangLP", "TOPOLOGIES", "topology_r2o", "restrict_to_topology"]


def restrict_to_topology(problem: DispatchProblem, topology: str) -> np.ndarray:
    """The instance's replica mask cut down to LPLB's graph: each expert on at most two GPUs.

    An expert's original GPU is its lowest-index replica GPU ``o``; its one redundant copy
    may sit on a GPU ``r`` with ``o`` in ``r2o[r]`` (:func:`~straggler.baselines.dispatch.lplb.
    topology_r2o`, upstream's graphs) that holds a replica in the mask; the first such
    ``r`` in column order, then GPU order, is kept. Other replicas are dropped. This is not
    LPLB's placement (which copies each GPU's hottest experts, see ``method="lplb"``).

    Examples
    --------
    >>> p = DispatchProblem(counts=[4, 1, 1], replicas=np.ones((3, 3), bool))
    >>> restrict_to_topology(p, "ring").astype(int).tolist()
    [[1, 0, 1], [1, 0, 1], [1, 0, 1]]
    """
    r2o = topology_r2o(topology, problem.n_gpus, problem.gpu_node, func="token_lp")
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


def _token_lp_iv(method) -> None:
    if method.topology is not None:
        check_choice(method.topology, "topology", "solve_dispatch(method='token_lp')", TOPOLOGIES)


@dataclass(frozen=True)
class TokenLP:
    """The token LP ``min max_g N_g`` (Lemma 1), exactly, shares as solved.

    Parameters
    ----------
    topology : {None, "ring", "cube", "hypercube", "torus"}
        None uses every replica of the instance; otherwise each expert keeps at most two
        copies along LPLB's graph (:func:`restrict_to_topology`, an ablation; LPLB itself is
        ``method="lplb"``).

    Notes
    -----
    Status is HEURISTIC: the LP is exact for its own objective, not for the makespan (it
    ignores the activation cost ``b``). Shares are cleaned by the LP decoder (no share
    below ``1e-9 n_e``, exact conservation) and fractional.

    References
    ----------
    TEMPO Lemma 1; deepseek-ai/LPLB README; sgl-project/sglang PR #24515.
    """

    topology: str | None = None

    def __post_init__(self) -> None:
        _token_lp_iv(self)

    def solve(self, problem, cost, *, time_limit, rng) -> LayerSolution:
        """Dispatch one layer (see the class docstring)."""
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


def sglang_lp_sample(counts, lp_shares, rng) -> np.ndarray:
    """Every token of expert ``e`` drawn from the replica probabilities ``x[e] / n[e]``:
    ``shares[e] ~ Multinomial(n[e], x[e] / n[e])`` (i.i.d. per token, so per-token draws
    and one multinomial per expert have the same law).

    Examples
    --------
    >>> x = sglang_lp_sample([4, 0], np.array([[4.0, 0.0], [0.0, 0.0]]), np.random.default_rng(0))
    >>> x.tolist()
    [[4.0, 0.0], [0.0, 0.0]]
    """
    n = np.asarray(counts, dtype=np.int64)
    x = np.asarray(lp_shares, dtype=float)
    out = np.zeros(x.shape, dtype=float)
    for e in np.flatnonzero(n > 0):
        p = np.clip(x[e], 0.0, None)
        p = p / p.sum()
        out[e] = rng.multinomial(int(n[e]), p)
    return out


@dataclass(frozen=True)
class SGLangLP:
    """SGLang's ``lp`` dispatch: the token LP's optimum, realised by per-token sampling.

    Notes
    -----
    The LP is solved exactly (HiGHS; SGLang's GPU solver is approximate), over the
    instance's replica GPUs (several replicas of one expert on one GPU are one LP column
    here: they carry the same GPU load). The draws come from the ``rng`` of
    :func:`~straggler.solvers.solve_dispatch`. ``extras["lp_max_tokens"]`` is the LP's
    value, ``extras["max_tokens"]`` the realised one.

    References
    ----------
    SGLang 0.5.23 ``srt/eplb/lplb_solver.py`` (``--ep-dispatch-algorithm lp``); TEMPO §5.9, §5.12.

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> from straggler.solvers import solve_dispatch
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> r = solve_dispatch(p, CostModel(a=0, b=15, c=0, beta=0.1), method="sglang_lp", rng=0)
    >>> r.extras["lp_max_tokens"], r.shares.sum() == 780, (r.shares == r.shares.round()).all()
    (390.0, np.True_, np.True_)
    """

    def solve(self, problem, cost, *, time_limit, rng) -> LayerSolution:
        """Dispatch one layer (see the class docstring)."""
        lp = solve_token_lp(problem, cost, time_limit=time_limit, full_output=True)
        gen = check_rng(rng, "solve_dispatch(method='sglang_lp')")
        shares = sglang_lp_sample(problem.counts, lp.shares, gen)
        realised = float(shares.sum(axis=0).max(initial=0.0))
        extras = {"lp_max_tokens": lp.value, "max_tokens": realised}
        # at the time limit the LP's incumbent is sampled, and the status says so
        status = Status.HEURISTIC if lp.status is Status.OPTIMAL else Status.FEASIBLE
        return LayerSolution(shares=shares, status=status, extras=extras)
