"""``uniform``: EPLB's load model, every expert's tokens split evenly over its replicas.

DeepSeek's EPLB (deepseek-ai/EPLB ``eplb.py``, 2025) places replicas assuming each replica
of expert ``e`` receives ``n_e / r_e`` tokens. TEMPO calls that split "EPLB-even" (§3.2,
Fig. 6) and "uni" (Table 10). It is the **model** the placement assumes, not an engine's
dispatcher: the engines realise it token by token and only approximately, see
``sglang_dynamic`` (a random replica per token, same GPU first since SGLang #10874) and
``vllm_ep`` (``flat_index % count``, then a hash of the token index since vLLM #40810).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...formulations.dispatch import DispatchProblem
from ...formulations.validation import check_bool
from ...solvers.dispatch.method import LayerSolution

__all__ = ["UniformSplit", "even_integer_split"]


def even_integer_split(n: int, k: int) -> np.ndarray:
    """Split ``n`` whole tokens into ``k`` parts as evenly as possible.

    The first ``n % k`` parts get ``n // k + 1`` tokens, the others ``n // k``: the
    whole-token version of the even split.

    Examples
    --------
    >>> even_integer_split(7, 3).tolist()
    [3, 2, 2]
    >>> even_integer_split(1, 4).tolist()
    [1, 0, 0, 0]
    """
    q, r = divmod(int(n), int(k))
    out = np.full(int(k), q, dtype=np.int64)
    out[:r] += 1
    return out


@dataclass(frozen=True, kw_only=True)
class UniformSplit:
    """Split every expert's tokens evenly over all GPUs holding one of its replicas.

    Parameters
    ----------
    integer : bool, default True
        Whole tokens: an expert with ``n`` tokens and ``r`` replicas gives ``n // r + 1``
        tokens to its first ``n % r`` replica GPUs (in increasing GPU index) and ``n // r``
        to the others; a replica that gets no token is not activated. With ``False``, the
        fluid split ``n / r`` of the EPLB load model: every replica of an expert with
        tokens is activated, however few tokens it has (TEMPO's "EPLB-even").

    Notes
    -----
    Replicas are counted per GPU: two replicas of one expert on one GPU (which EPLB can
    produce) are one entry of the replica mask, so that GPU gets one share, not two.
    Experts without tokens are not dispatched. ``O(E * g)``.

    References
    ----------
    DeepSeek EPLB (the uniform-split load model); TEMPO §3.2 ("E = EPLB-even"), Fig. 1b.

    Examples
    --------
    TEMPO Fig. 1b: token balancing splits every expert and pays seven floors per GPU.

    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> from straggler.solvers import solve_dispatch
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> r = solve_dispatch(p, CostModel(a=0, b=15, c=0, beta=0.1), method="uniform")
    >>> r.makespan, r.shares[:2].tolist()
    (105.0, [[300.0, 300.0], [15.0, 15.0]])
    >>> p = DispatchProblem(counts=[5, 1], replicas=np.ones((2, 2), bool))
    >>> solve_dispatch(p, CostModel(a=0, b=1, c=0, beta=0), method="uniform").shares.tolist()
    [[3.0, 2.0], [1.0, 0.0]]
    >>> solve_dispatch(
    ...     p, CostModel(a=0, b=1, c=0, beta=0), method="uniform", integer=False
    ... ).shares.tolist()
    [[2.5, 2.5], [0.5, 0.5]]
    """

    integer: bool = True

    def __post_init__(self) -> None:
        check_bool(self.integer, "integer", "solve_dispatch(method='uniform')")

    def solve(self, problem: DispatchProblem, cost, *, time_limit=None, rng=None) -> LayerSolution:
        """Dispatch one layer (see the class docstring)."""
        n = problem.counts
        rep = problem.replicas
        shares = np.zeros(rep.shape, dtype=float)
        for e in np.flatnonzero(n > 0):
            gpus = np.flatnonzero(rep[e])
            if self.integer:
                shares[e, gpus] = even_integer_split(n[e], gpus.size)
            else:
                shares[e, gpus] = n[e] / gpus.size
        return LayerSolution(shares=shares, extras={"integer": bool(self.integer)})
