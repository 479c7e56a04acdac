"""``tempo``: the tempo_fast dispatcher of TEMPO §4.2, and the exact fast token LP.

``solve_dispatch(problem, cost, method="tempo")`` runs four stages on each layer (a
Numba kernel, :mod:`straggler.solvers._tempo`, with a plain-Python reference beside it).
Shares are whole tokens (int-valued float64). ``t(G, N, T)`` is the cost model.

1. **Cost-aware greedy seeding.** Live experts by descending tokens (ties: lower index),
   each placed whole on the replica of lowest marginal cost ``t(G+1, N+n, T+ceil(n/tile))
   - t(G, N, T)`` under the full model (floor, tiles, compute, traffic); ties: lower
   resulting time, then lower GPU index. A GPU already in the linear regime absorbs a cold
   expert's activation for free, which is the point. ``seed=False``: each expert whole on
   its lowest-index replica (the ablation's naive start).
2. **Augmenting chains on max G** (the 1/2-step truncation of the semi-matching augmenting
   paths of Lemma 2). ``Gmax = max_g G_g``. A 1-step chain moves an expert's whole share
   off a GPU at ``Gmax`` to another replica ``d`` that already holds it or has
   ``G_d <= Gmax - 2``; a 2-step chain moves it to a GPU ``m`` at ``Gmax - 1`` not holding
   it, and one other whole share off ``m`` to such a ``d`` (``d`` not the first GPU). A
   chain is applied only if the modeled makespan does not increase; the applied chain
   minimizes (makespan, largest time among the GPUs it changes), first enumerated on ties
   (GPUs, experts, GPUs by increasing index); 2-step chains are searched only when no
   1-step chain applies. Each chain lowers ``(Gmax, #GPUs at Gmax)`` lexicographically, so
   the stage ends.
3. **Bottleneck local search.** A move sends ``q`` tokens of an expert from a GPU ``s``
   at the makespan ``M`` to another of its replicas ``d``: the whole share, or a partial
   migration ``1 <= q < x[e, s]``. A move improves iff both new times are below ``M``:
   then the makespan drops or, with several GPUs at ``M``, the number of GPUs at it does
   (ties in the bottleneck: ``(M, #GPUs at M)`` decreases lexicographically, so the search
   cannot cycle). Each iteration applies the move minimizing ``max(t_s', t_d')``, first
   found on ties (``s``, ``e``, ``d`` increasing, whole before partial); at most
   ``max_iter`` iterations. Split size: the source time ``A(q)`` is nonincreasing and the
   destination time ``B(q)`` nondecreasing in ``q``, tiles included, so ``max(A, B)`` is
   unimodal and its integer minimum is at ``q* - 1`` or ``q*``, ``q* = min{q : B(q) >=
   A(q)}``, found by bisection: the exact integer form of the paper's ternary search
   (``q* - 1`` on ties). It is exact over all integer splits, so it includes every
   tile-boundary split the paper snaps to, with the tile staircase priced in ``A`` and
   ``B``. *Extension:* when no move improves, swaps are tried (``q`` tokens of ``e`` from
   ``s`` to ``d``, whole or by the same bisection, while another expert's whole share goes
   from ``d`` to ``s``), then ejection chains (an expert's whole share from ``s`` to ``m``
   and another whole share from ``m`` to ``d``, ``d`` not ``s``, all three new times
   below ``M``), with the same acceptance and tie rules; and last, leximax moves below
   the makespan (on the highest GPU not at ``M`` that has one: a move or split taking both
   of its new times below that GPU's time, which strictly lowers the sorted vector of
   times, so the search still cannot cycle), which make room for the moves above. The
   search stops early at the integral lower bound ``max(t(0, ceil(lambda*), 0),
   t(SM, 0, SM))`` that no whole-token dispatch can beat.
4. **Ensemble** (Proposition 1). Candidates: the token-LP dispatch, A3 round robin (rank
   ``r`` to GPU ``r mod g``) when every live expert is replicated on every GPU, and
   (*extension*) the optimal semi-matching with whole experts. *Extension:* a candidate
   below ``M(A_H)`` is first improved by the stage-3 search (when stage 3 is on and the
   integral lower bound leaves room to switch, ``stop_at < (1 - tau) M(A_H)``: otherwise
   no polished candidate could be taken, so it is scored raw); so is the
   semi-matching one when ``A_H`` activates more than ``SM`` replicas on a GPU whose floor
   ``t(Gmax, 0, Gmax)`` reaches ``M(A_H)``, and then first under the cap ``G_g <= SM``
   (a move over the cap costs infinity), which finds the activation-tight optima that
   the uncapped search trades away for token balance. Under the cap, when no move, swap
   or ejection chain improves, *rotations* are tried before the leximax moves: the whole
   shares of three distinct experts go around three distinct GPUs ``s -> m -> d -> s``
   (``s`` at the makespan, all three new times below it; first found on ties in the
   order ``s, e, m, e2, d, e3`` increasing): each GPU loses one expert and gains one, the
   move left when every GPU is at the cap. The best (first on ties) replaces ``A_H`` iff
   its makespan is below ``(1 - tau) M(A_H)``.
   Polishing only lowers a candidate, so ``M(A*) <= min(M(A_H), min_C M(C) / (1 - tau))``
   holds for the raw candidates, and under full replication ``M(A*) <= (OPT + max_k
   phi_k(n_max)) / (1 - tau)`` (Theorem 2); ``tau = 0`` gives the additive bound exactly.

5. **Support rebalance** (*extension*; ``rebalance=False`` switches it off). The token LP
   restricted to the support of the stage-4 output (only its active replicas, by
   :func:`~straggler.solvers._token_lp_fast.support_rebalance_kernel`, with a
   plain-Python reference beside it) moves tokens only between replicas that are
   already active, so it adds no activation and no split; its integral optimum replaces
   the output iff its makespan is strictly lower. It is skipped when the output already
   meets :func:`tempo_layer_bound` (nothing can be lower). The local search stops at a
   split one token off, or at ``max_iter``, where this exact step evens it out. It only
   lowers the output, so every bound above still holds; ``extras["makespan_stage4"]``
   is the makespan before it and ``extras["rebalanced"]`` says whether it applied.

Speed (results unchanged by any of it): the kernels build the replica lists without
branches, order experts by a stable radix sort, keep per-GPU sorted lists of the experts
that hold tokens (so no search scans empty replicas, which matters under full
replication), score candidates from their live entries, and prune the chain, swap and
ejection searches only by lower bounds that cannot beat the best found (``t`` is
nondecreasing in ``G``, ``N``, ``T`` and ``T >= G``); the plain-Python reference
enumerates everything. The swap and ejection fallbacks still examine every pair of
experts on two GPUs in the worst case (no cap), so under full replication a layer that
reaches them costs a few hundred microseconds.

The token-LP candidate is the integral token-optimal dispatch of :func:`token_lp_fast`
(``max_g N_g = ceil(lambda*)``, under one token per GPU above the fractional optimum); so
on tiny instances, where one token matters, tempo can be above a fractional OPT by the
cost of about one token per GPU. ``lower_bound`` is :func:`tempo_layer_bound`.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from numbers import Real
from typing import NamedTuple

import numba
import numpy as np

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem
from ..formulations.errors import param_error
from ._semi_matching import semi_matching_kernel
from ._tempo import INFO_FIELDS, tempo_kernel
from ._token_lp_fast import support_rebalance_kernel, token_lp_kernel
from .registry import LayerSolution, register_dispatch_method

__all__ = ["Tempo", "TokenLP", "token_lp_fast", "tempo_layer_bound", "CHOICES"]

#: What ``extras["choice"]`` can say: which dispatch tempo returned.
CHOICES = ("heuristic", "token_lp", "a3", "semi_matching")


class TokenLP(NamedTuple):
    """Exact token LP (Lemma 1) of one layer."""

    shares: np.ndarray
    """Integral token-optimal dispatch ``(n_experts, n_gpus)``, ``max_g N_g = ceil(value)``."""
    value: float
    """``lambda* = min max_g N_g`` over fractional dispatches (``num / den``)."""
    num: int
    """Numerator of ``lambda*`` in lowest terms."""
    den: int
    """Denominator of ``lambda*`` (at most ``n_gpus``)."""


def token_lp_fast(problem: DispatchProblem) -> TokenLP:
    """Solve the token LP ``min max_g N_g`` (Lemma 1) exactly, without an LP solver.

    ``lambda* = max_S W(S)/|S|`` over GPU sets ``S``, where ``W(S)`` sums the tokens of the
    experts whose replicas all lie in ``S`` (max-flow/min-cut). Augmenting paths find the
    integral optimum ``ceil(lambda*)`` and a Dinkelbach iteration on the ratio the exact
    ``lambda*``; see :mod:`straggler.solvers._token_lp_fast`.

    Parameters
    ----------
    problem : DispatchProblem
        One layer.

    Returns
    -------
    TokenLP
        ``shares``, ``value``, ``num``, ``den``.

    Notes
    -----
    ``c + beta*value`` (and ``c2 + gamma*value``) is a certified lower bound on the optimal
    makespan: every dispatch has a GPU with at least ``lambda*`` tokens.

    Examples
    --------
    Expert 0 (7 tokens) may go to GPU 0 or 1; expert 1 (2 tokens) only to GPU 1:

    >>> res = token_lp_fast(DispatchProblem(counts=[7, 2], replicas=[[1, 1], [0, 1]]))
    >>> res.shares.tolist(), res.value, (res.num, res.den)
    ([[5, 2], [0, 2]], 4.5, (9, 2))
    """
    if not isinstance(problem, DispatchProblem) or problem.is_stack:
        raise param_error(
            "problem", "token_lp_fast", "a single-layer DispatchProblem", repr(problem)
        )
    x, num, den = token_lp_kernel(
        np.ascontiguousarray(problem.counts, dtype=np.int64), np.ascontiguousarray(problem.replicas)
    )
    return TokenLP(shares=x, value=num / den, num=int(num), den=int(den))


def tempo_layer_bound(cost: CostModel, lp_value: float, sm_value: int) -> float:
    """``max(c + beta*lambda*, c2 + gamma*lambda*, a + b*SM)``: the bound tempo reports.

    ``lambda*`` is the token-LP value (some GPU carries at least that many tokens) and
    ``SM`` the optimal semi-matching value (some GPU activates at least ``SM`` replicas,
    and ``b2*(T - G) >= 0``).

    Examples
    --------
    >>> tempo_layer_bound(CostModel(a=0, b=15, c=0, beta=0.1), 390.0, 4)
    60.0
    """
    bound = max(cost.c + cost.beta * lp_value, cost.a + cost.b * sm_value)
    if cost.has_traffic:
        bound = max(bound, cost.c2 + cost.gamma * lp_value)
    return float(bound)


_POOL: list = [None, 0]  # the stack solver's thread pool and its size, made on first use
_POOL_LOCK = threading.Lock()


def _pool(n_threads):
    """A process-wide pool of ``n_threads`` threads (a new pool per call costs ~1 ms)."""
    with _POOL_LOCK:
        if _POOL[0] is None or _POOL[1] != n_threads:
            if _POOL[0] is not None:
                _POOL[0].shutdown(wait=False)
            _POOL[0] = ThreadPoolExecutor(n_threads, thread_name_prefix="straggler-tempo")
            _POOL[1] = n_threads
        return _POOL[0]


def _layer_bound(c, lam, sm):
    """:func:`tempo_layer_bound` from ``CostModel.as_array()`` (zero traffic terms are
    harmless): at or below it nothing can improve, so the support rebalance is skipped."""
    return max(c[3] + c[4] * lam, c[0] + c[1] * sm, c[5] + c[6] * lam)


def _check_flag(name, v):
    if not isinstance(v, (bool, np.bool_)):
        raise param_error(name, "solve_dispatch(method='tempo')", "a bool", repr(v))


@register_dispatch_method("tempo")
@dataclass(frozen=True)
class Tempo:
    """tempo_fast (TEMPO §4.2): seed, augmenting chains, local search, ensemble, rebalance.

    Parameters
    ----------
    seed, chains, local_search, ensemble : bool, default True
        Switch each stage (the Table 2 / Table 8 ablations).
    rebalance : bool, default True
        The support rebalance after stage 4 (an extension, see the module notes).
    tau : float in [0, 1), default 0.01
        Switching tolerance of the ensemble (Proposition 1).
    max_iter : int >= 0, default 300
        Iteration cap of the local search.

    Notes
    -----
    See :mod:`straggler.solvers.tempo` for the stages, guarantees and tie-breaking. The
    reported ``lower_bound`` is :func:`tempo_layer_bound`; ``extras`` holds the makespan
    after each stage, the candidates' makespans, the choice and the move counts.

    Examples
    --------
    TEMPO Fig. 1b: the optimum, 60 us, splitting only the hot expert.

    >>> from straggler.solvers import solve_dispatch
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> res = solve_dispatch(p, CostModel(a=0, b=15, c=0, beta=0.1), method="tempo")
    >>> res.makespan, res.status.name, (res.shares > 0).sum(axis=1).tolist()
    (60.0, 'OPTIMAL', [2, 1, 1, 1, 1, 1, 1])
    """

    seed: bool = True
    chains: bool = True
    local_search: bool = True
    ensemble: bool = True
    tau: float = 0.01
    max_iter: int = 300
    rebalance: bool = True

    def __post_init__(self) -> None:
        for name in ("seed", "chains", "local_search", "ensemble", "rebalance"):
            _check_flag(name, getattr(self, name))
        t = self.tau
        if not isinstance(t, Real) or isinstance(t, bool) or not (0 <= t < 1):
            raise param_error(
                "tau", "solve_dispatch(method='tempo')", "a number in [0, 1)", repr(t)
            )
        m = self.max_iter
        if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or m < 0:
            raise param_error(
                "max_iter", "solve_dispatch(method='tempo')", "a non-negative integer", repr(m)
            )

    def _flags(self):
        return (
            bool(self.seed),
            bool(self.chains),
            bool(self.local_search),
            bool(self.ensemble),
            float(self.tau),
            int(self.max_iter),
        )

    def _solution(self, cost, shares, info, num, den, sm, m_final) -> LayerSolution:
        extras = {name: float(v) for name, v in zip(INFO_FIELDS, info)}
        extras["rebalanced"] = bool(m_final < info[0])
        extras["makespan_stage4"] = extras["makespan"]
        extras["makespan"] = float(m_final)
        extras["choice"] = CHOICES[int(info[INFO_FIELDS.index("choice")])]
        extras["chain_moves"] = int(extras["chain_moves"])
        extras["ls_moves"] = int(extras["ls_moves"])
        extras["token_lp_value"] = num / den
        extras["semi_matching_value"] = int(sm)
        return LayerSolution(
            shares=shares.astype(np.float64),
            lower_bound=tempo_layer_bound(cost, num / den, int(sm)),
            extras=extras,
        )

    def _arrays(self, cost, counts, replicas):
        """Token LP, semi-matching, tempo and support-rebalance kernels on one layer (nogil)."""
        lp, num, den = token_lp_kernel(counts, replicas)
        assign, sm, _ = semi_matching_kernel(replicas, counts > 0)
        shares, info = tempo_kernel(counts, replicas, cost, lp, assign, *self._flags())
        m = info[0]
        if self.rebalance and m > _layer_bound(cost, num / den, sm):
            shares, _, m = support_rebalance_kernel(counts, shares, cost)
        return shares, info, num, den, sm, m

    def solve(self, problem: DispatchProblem, cost: CostModel, *, time_limit, rng) -> LayerSolution:
        """One validated layer."""
        counts = np.ascontiguousarray(problem.counts, dtype=np.int64)
        replicas = np.ascontiguousarray(problem.replicas)
        return self._solution(cost, *self._arrays(cost.as_array(), counts, replicas))

    def solve_stack(self, problems, cost: CostModel, *, time_limit, rng) -> list[LayerSolution]:
        """Every layer, in parallel over layers on a thread pool around the ``nogil`` kernels.

        Results are identical to :meth:`solve` layer by layer (the kernels are
        deterministic and share no state). Threads: ``numba.get_num_threads()``, from a
        pool kept for the process (made on the first stack solve).
        """
        problems = list(problems)
        c = cost.as_array()
        counts = [np.ascontiguousarray(p.counts, dtype=np.int64) for p in problems]
        replicas = [np.ascontiguousarray(p.replicas) for p in problems]
        n_threads = max(1, min(numba.get_num_threads(), len(problems)))

        def chunk(k):
            return [
                self._arrays(c, counts[l], replicas[l]) for l in range(k, len(problems), n_threads)
            ]

        if n_threads == 1:
            parts = [chunk(0)]
        else:
            parts = list(_pool(n_threads).map(chunk, range(n_threads)))
        out = [None] * len(problems)
        for k, part in enumerate(parts):
            for i, arrays in enumerate(part):
                out[k + i * n_threads] = self._solution(cost, *arrays)
        return out
