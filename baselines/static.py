"""``static``: SGLang's static dispatch, one fixed replica per expert.

SGLang's ``--ep-dispatch-algorithm static`` precomputes, for every (source GPU, expert),
one physical replica (``compute_logical_to_rank_dispatch_physical_map``): a replica on the
token's own GPU when there is one (the first such slot), otherwise a seeded "fair" random
choice among all replicas. The table never changes between rebalances, whatever the batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from ..formulations.dispatch import DispatchProblem
from ..formulations.errors import InvalidOptionError
from ..solvers.registry import LayerSolution, register_dispatch_method
from .uniform import even_integer_split

__all__ = ["StaticDispatch", "STATIC_RULES"]

#: Accepted values of :attr:`StaticDispatch.rule`.
STATIC_RULES = ("first", "random", "sglang")


@register_dispatch_method("static")
@dataclass(frozen=True, kw_only=True)
class StaticDispatch:
    """Send all tokens of an expert to one fixed replica (no per-batch decision).

    Parameters
    ----------
    rule : {"first", "random", "sglang"}, default "first"
        How the fixed replica is chosen:

        * ``"first"``: the replica on the lowest-index GPU (in the SGLang/EPLB layout,
          where slot ``p`` sits on GPU ``p // slots_per_gpu``, this is the replica with the
          lowest physical slot). One replica per expert, whole experts.
        * ``"random"``: one replica per expert drawn uniformly with
          ``numpy.random.default_rng(seed)``, experts visited in index order. The draw
          depends only on ``seed`` and the replica mask, never on the batch, so the same
          expert goes to the same replica in every batch (a fixed table).
        * ``"sglang"``: SGLang's table itself, for a batch whose tokens come evenly from
          every GPU (the dispatcher sees no per-token source here; each expert's tokens
          are split over the ``g`` source GPUs with :func:`even_integer_split`). A source
          GPU holding a replica keeps its tokens; the other sources get replicas by
          SGLang's ``_fair_choices`` (every replica ``k // r`` times, ``k % r`` more drawn
          without replacement, shuffled) with ``random.Random(seed)``, experts visited in
          index order. Replicas are GPUs here (SGLang draws physical slots; with at most
          one replica per GPU the two coincide). This rule splits an expert over several
          replicas, as SGLang's static does.
    seed : int, default 42
        Seed of the ``"random"`` and ``"sglang"`` rules (SGLang's default seed is 42).

    Notes
    -----
    ``O(E * g)``. Experts without tokens are not dispatched. For a stack, each layer is
    solved with the same seed, as SGLang seeds its table once for all layers.

    References
    ----------
    ANCHORS.md ("SGLang dispatch algorithms"); TEMPO Table 1 and §5 ("static").

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> from straggler.solvers import solve_dispatch
    >>> cost = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> r = solve_dispatch(p, cost, method="static")
    >>> r.makespan, r.shares.sum(axis=0).tolist()
    (105.0, [780.0, 0.0])
    >>> r = solve_dispatch(p, cost, method="static", rule="sglang")
    >>> r.shares[0].tolist()
    [300.0, 300.0]
    """

    rule: str = "first"
    seed: int = 42

    def __post_init__(self) -> None:
        if self.rule not in STATIC_RULES:
            raise InvalidOptionError(
                f"The 'rule' option of the static method must be one of {list(STATIC_RULES)}. "
                f"Got {self.rule!r} instead."
            )
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool):
            raise InvalidOptionError(
                f"The 'seed' option of the static method must be an int. Got {self.seed!r} instead."
            )

    def solve(self, problem: DispatchProblem, cost, *, time_limit=None, rng=None) -> LayerSolution:
        """Dispatch one layer (see the class docstring)."""
        n = problem.counts
        rep = problem.replicas
        g = problem.n_gpus
        shares = np.zeros(rep.shape, dtype=float)
        np_rng = np.random.default_rng(int(self.seed))
        py_rng = random.Random(int(self.seed))
        for e in range(problem.n_experts):
            gpus = np.flatnonzero(rep[e])
            if gpus.size == 0:  # only experts without tokens lack replicas
                continue
            if self.rule == "first":
                shares[e, gpus[0]] = n[e]
            elif self.rule == "random":
                # drawn for every expert with a replica, so the table is batch-independent
                shares[e, gpus[np_rng.integers(gpus.size)]] = n[e]
            else:
                target = _sglang_table(gpus, g, py_rng)
                np.add.at(shares[e], target, even_integer_split(n[e], g))
        return LayerSolution(shares=shares, extras={"rule": self.rule})


def _sglang_table(gpus: np.ndarray, n_gpus: int, r: random.Random) -> np.ndarray:
    """Replica GPU used by each source GPU for one expert (SGLang's static table)."""
    target = np.full(n_gpus, -1, dtype=np.int64)
    target[gpus] = gpus  # a replica on the token's own GPU
    remain = int((target == -1).sum())
    cand = gpus.tolist()
    quotient, remainder = divmod(remain, len(cand))
    fair = cand * quotient + r.sample(cand, k=remainder)
    r.shuffle(fair)
    target[target == -1] = fair
    return target
