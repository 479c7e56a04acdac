"""``moonep``: replay of MoonEP's weight-moving policy under the cost model.

MoonEP (MoonshotAI, 2026) gives every EP rank exactly the same number of routed tokens by
prefetching copies of experts, planned per batch from the router output. Its built-in
planner (the allocation step of its planning kernel, whose readable form is the torch
reference ``launch_planning_torch_reference``) is:

1. Every expert has one home rank; rank ``h``'s home group carries ``group[h]`` tokens and
   every rank's receive target is ``CAP`` (``N / R``), so ``balance = group - CAP``
   sums to zero.
2. Repeatedly take the most overloaded home group ``h = argmax(balance)`` and the roomiest
   rank ``u = argmin(balance)``; stop when ``balance[h] <= 0``. Otherwise ``h`` sends
   ``u`` exactly ``-balance[u]`` tokens (``u`` is filled completely, so every receiving
   rank is fed by one donor), ``balance[h] += balance[u]``, ``balance[u] = 0``.
3. Each donor serves its receivers by repeatedly taking its largest remaining quota and
   its local expert with the most remaining tokens, moving ``min`` of the two.

Each receiving rank thus holds at most its own experts plus one donor's experts: at most
two segments per local expert slot, the bound MoonEP's buffers are sized for.

TEMPO §5.7 and Appendix H replay this policy with the weight prefetch either free
(overlapped) or charged at a 4x HBM-to-interconnect bandwidth ratio per duplicated expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ...formulations.dispatch import DispatchProblem, evaluate
from ...formulations.errors import param_error
from ...formulations.validation import check_array, check_real
from ...solvers.dispatch.method import LayerSolution

__all__ = ["MoonEP", "moonep_plan"]


def moonep_plan(counts, replicas):
    """MoonEP's allocation for one layer, on whole tokens.

    Parameters
    ----------
    counts : ndarray of int, shape (n_experts,)
    replicas : ndarray of bool, shape (n_experts, n_gpus)
        The expert's home rank is its lowest-index replica GPU (MoonEP itself shards
        experts ``e -> e // (E / R)`` without static replicas; other static replicas are
        not used by its planner).

    Returns
    -------
    alloc : ndarray of int64, shape (n_experts, n_gpus)
        Tokens of expert ``e`` computed on rank ``d``.
    home : ndarray of int64, shape (n_experts,)
        Home rank of each expert (``-1`` for an expert with no replica and no tokens).
    quota : ndarray of int64, shape (n_gpus, n_gpus)
        ``quota[h, u]``: tokens home group ``h`` sends to rank ``u`` (MoonEP's ``z``).

    Notes
    -----
    Receive targets: ``CAP[d] = N // R``, plus one for the first ``N % R`` ranks (MoonEP's
    rule with ``total_num_tokens``; with ``N`` divisible by ``R`` all ranks get
    ``N / R``, as with equal per-rank token counts). ``argmax``/``argmin`` take the first
    (lowest index) extremum, as ``torch.argmax`` does; local experts are scanned in
    increasing expert index. A donor may send more than its surplus (it fills its receiver
    completely) and is then refilled by another donor.

    Examples
    --------
    >>> import numpy as np
    >>> rep = np.eye(4, dtype=bool)
    >>> alloc, home, quota = moonep_plan(np.array([10, 2, 3, 1]), rep)
    >>> alloc.sum(axis=0).tolist(), alloc.tolist()
    ([4, 4, 4, 4], [[4, 2, 1, 3], [0, 2, 0, 0], [0, 0, 3, 0], [0, 0, 0, 1]])
    """
    counts, replicas = _moonep_plan_iv(counts, replicas)
    n_experts, n_gpus = replicas.shape
    home = np.where(replicas.any(axis=1), replicas.argmax(axis=1), -1).astype(np.int64)
    total = int(counts.sum())
    cap = np.full(n_gpus, total // n_gpus, dtype=np.int64)
    cap[: total % n_gpus] += 1
    group = np.zeros(n_gpus, dtype=np.int64)
    has_home = home >= 0
    np.add.at(group, home[has_home], counts[has_home])
    balance = group - cap

    alloc = np.zeros((n_experts, n_gpus), dtype=np.int64)
    alloc[has_home, home[has_home]] = counts[has_home]

    # Step 2: receivers and their quotas (each receiver filled by one donor).
    quota = np.zeros((n_gpus, n_gpus), dtype=np.int64)
    while True:
        h = int(np.argmax(balance))
        u = int(np.argmin(balance))
        if balance[h] <= 0:
            break
        move = -balance[u]
        quota[h, u] = move
        balance[h] -= move
        balance[u] = 0

    # Step 3: which tokens each donor sends, largest quota first, largest expert first.
    for h in range(n_gpus):
        local = np.flatnonzero(home == h)
        remaining = counts[local].copy()
        left = quota[h].copy()
        while True:
            d = int(np.argmax(left))
            if left[d] <= 0:
                break
            j = int(np.argmax(remaining))
            # A donor never owes more than it holds: it gives while its balance is
            # positive, each time at most one rank's target, and targets differ by <= 1.
            take = min(int(remaining[j]), int(left[d]))
            e = local[j]
            alloc[e, d] += take
            alloc[e, h] -= take
            remaining[j] -= take
            left[d] -= take
    return alloc, home, quota


def _moonep_plan_iv(counts, replicas):
    func = "moonep_plan"
    counts = check_array(counts, "counts", func, kind="int", ndim=1, lo=0)
    E = counts.shape[0]
    form = f"a boolean mask of shape ({E}, n_gpus >= 1)"
    replicas = check_array(replicas, "replicas", func, kind="bool", ndim=2, expected=form)
    if replicas.shape[0] != E or replicas.shape[1] < 1:
        raise param_error("replicas", func, form, f"shape {replicas.shape}")
    return counts, replicas


@dataclass(frozen=True, kw_only=True)
class MoonEP:
    """MoonEP's perfect token balance by moving weights, replayed under the cost model.

    **The shares leave the replica mask.** MoonEP creates replicas per batch, so its
    ``shares`` lie on the *augmented* mask ``extras["replicas"]`` (the problem's mask plus
    the moved replicas ``extras["moved_replicas"]``), not on the problem's own mask:
    ``check_shares(DispatchProblem(counts=n, replicas=extras["replicas"]), shares)`` holds,
    ``check_shares(problem, shares)`` fails whenever a weight moved. The class attribute
    ``moves_weights = True`` marks this for generic code.

    ``solve_dispatch`` scores, checks and certifies the result on that augmented mask (the
    method hands it over as ``LayerSolution.replicas``): the ``lower_bound`` is a bound on
    the optimum *with the replicas MoonEP created*, never above its makespan, and a status
    OPTIMAL means optimal on that mask (bounds on the problem's own mask do not bound
    MoonEP, which uses more replicas than the problem allows). The makespan it reports is
    the evaluator's on these shares, i.e. with the weight prefetch **free** (TEMPO's
    optimistic accounting), also in ``extras["makespan_weight_free"]``.
    ``extras["makespan_charged"]`` adds the prefetch to every receiving GPU:
    ``t_g + charge_ratio * b * m_g`` with ``m_g`` moved replicas on ``g`` (reading a weight
    over the interconnect at ``1/charge_ratio`` of HBM bandwidth costs ``charge_ratio`` times
    the HBM floor ``b``; the prefetch precedes the GEMMs).

    Parameters
    ----------
    charge_ratio : float, default 4.0
        HBM-to-interconnect bandwidth ratio of the charged accounting (TEMPO App. H: 4x).

    Notes
    -----
    See :func:`moonep_plan` for the policy and its tie-breaks. A segment landing on a GPU
    that already holds a static replica of the expert moves no weight and is not charged.
    Whole tokens. ``O(g^2 + E g)``.

    References
    ----------
    The UltraEP and MoonEP write-ups; TEMPO §5.7, Appendix H.

    Examples
    --------
    >>> import numpy as np
    >>> from straggler.formulations import CostModel, DispatchProblem
    >>> from straggler.solvers import solve_dispatch
    >>> rep = np.zeros((7, 2), bool); rep[:4, 0] = True; rep[4:, 1] = True
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=rep)
    >>> r = solve_dispatch(p, CostModel(a=0, b=15, c=0, beta=0.1), method="moonep")
    >>> r.shares[0].tolist(), r.extras["n_moved"], r.makespan, r.extras["makespan_charged"]
    ([300.0, 300.0], 1, 60.0, 120.0)
    """

    charge_ratio: float = 4.0
    moves_weights: ClassVar[bool] = True

    def __post_init__(self) -> None:
        func = "solve_dispatch(method='moonep')"
        object.__setattr__(
            self, "charge_ratio", check_real(self.charge_ratio, "charge_ratio", func, lo=0)
        )

    def solve(self, problem: DispatchProblem, cost, *, time_limit=None, rng=None) -> LayerSolution:
        """Dispatch one layer (see the class docstring)."""
        alloc, home, quota = moonep_plan(problem.counts, problem.replicas)
        moved = (alloc > 0) & ~problem.replicas
        augmented = problem.replicas | moved
        shares = alloc.astype(float)
        ev = evaluate(DispatchProblem(counts=problem.counts, replicas=augmented), cost, shares)
        per = float(self.charge_ratio) * cost.b
        charged = ev.times + per * moved.sum(axis=0)
        extras = {
            "replicas": augmented,
            "moved_replicas": moved,
            "n_moved": int(moved.sum()),
            "home": home,
            "quota": quota,
            "makespan_weight_free": float(ev.makespan),
            "gpu_time_charged": charged,
            "makespan_charged": float(charged.max()),
            "charge_us_per_replica": per,
        }
        return LayerSolution(shares=shares, extras=extras, replicas=augmented)
