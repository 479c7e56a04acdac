"""``tempo``: the tempo_fast dispatcher of TEMPO §4.2, and the exact fast token LP.

``solve_dispatch(problem, cost, method="tempo")`` runs four stages and restarts on each layer (a
Numba kernel, :mod:`straggler.solvers.dispatch._tempo`, with a plain-Python reference beside it),
then exact steps. Shares are fractional where the exact token LP puts them (stage 0 and
5d; ``fractional=False``: whole tokens, int-valued float64, throughout). ``t(G, N, T)`` is
the cost model.

0. **The exact token LP** (*extension*; ``fractional=False`` switches it off). The
   fractional token-optimal dispatch (``max_g N_g = lambda*`` exactly, from the integral
   one of :func:`token_lp_fast` scaled by the denominator of ``lambda*`` and pushed to its
   numerator) is scored first; when it meets the certified bound it is optimal and is
   returned at once (stages 1-5 skipped, ``extras["stages_skipped"]``): at wide EP, where
   the token LP is the optimum, this is most layers. Otherwise it stays a candidate, taken
   at the end where it is strictly lower (``extras["choice"] = "token_lp_exact"``), so tempo
   is never above it.

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
3. **Bottleneck local search.** Each iteration applies one improving move from the GPUs
   ``s`` at the makespan ``M``: the best move or partial migration (a) when there is one,
   else the best of the token paths, swaps, ejection chains and exchanges (b-e; the lowest
   largest new time, first found on ties in this order, sources ``s`` by increasing
   index). A move improves iff every GPU it changes ends below ``M`` (then the makespan
   drops or, with several GPUs at ``M``, the number of GPUs at it does, so the search
   cannot cycle; proofs/THEOREMS.md, Proposition 2):

   a. *moves*: ``q`` tokens of an expert from ``s`` to another of its replicas ``d``, the
      whole share or a partial migration ``1 <= q < x[e, s]`` (``e``, ``d`` increasing,
      whole before partial). Split size: the source time ``A(q)`` is nonincreasing and the
      destination time ``B(q)`` nondecreasing in ``q``, tiles included, so ``max(A, B)``
      is unimodal and its integer minimum is at ``q* - 1`` or ``q*``, ``q* = min{q :
      B(q) >= A(q)}``, found by bisection (written once, for every neighbourhood that
      splits): the exact integer form of the paper's ternary search (``q* - 1`` on ties).
      It is exact over all integer splits, so it includes every tile-boundary split the
      paper snaps to, with the tile staircase priced in ``A`` and ``B``;
   b. *token paths* (``flows``): ``q`` tokens leave ``s`` along a path of GPUs found by
      breadth-first search, each intermediate forwarding ``q`` tokens of an expert it
      holds to the next (a GPU joins the path only below the best value so far, and, where
      the arc activates a new replica, only if one more activation and tile keep it
      below); the last GPU keeps them. ``q`` is the bisection split between ``s`` and the
      end, capped by the smallest share on the path, then the cap itself. This is the
      exact token-flow rebalance through split experts that a single move cannot make:
      the intermediates' token counts do not change;
   c. *swaps*: ``q`` tokens of ``e`` from ``s`` to ``d`` (whole or by the bisection)
      while another expert's whole share goes from ``d`` to ``s``;
   d. *ejection chains*: ``q`` tokens of ``e`` from ``s`` to ``m``, another expert's
      whole share from ``m`` to ``d`` (``d`` not ``s``). The first leg is ``e``'s whole
      share, or (``tile_chains``, ``b2 > 0``) a tile-boundary partial split: the part of
      the share above its last full tile (``x % tile``), then the part filling ``m``'s
      share of ``e`` to a tile boundary;
   e. *path and cyclic exchanges* (``exchanges``) of whole shares, by shortest-path
      search on an improvement graph (the very-large-scale neighbourhood of the min-max
      partitioning literature): nodes are the shares, an arc ``i -> j`` moves share ``i``
      to ``j``'s GPU while ``j`` leaves it, weighted by that GPU's new time; a path from a
      share on ``s`` ends at a GPU that only gains (an ejection chain of any length) or
      closes back at ``s`` (a cycle: every GPU gains one share and loses one, so
      activation counts stay: the move left when GPUs sit at an activation cap).
      Dijkstra on (largest new time, share index), one search per share leaving ``s``
      (the closing arc of a cycle depends on it), one label per share, the GPUs of each
      path distinct; the best exchange found is applied;
   f. *leximax*: without any of these at ``M``, the first GPU below ``M`` by decreasing
      time (ties: lower index) that has a move (a), else a token path or exchange (the
      better of the two), taking all its new times below its own time (a strict decrease
      of the sorted vector of times, so the search still cannot cycle), which makes room
      for the moves above.

   The search stops at ``max_iter`` moves, without a move, at the lower bound
   ``max(t(0, ceil(lambda*), 0), t(SM, 0, SM), certified bound)`` that no whole-token
   dispatch can beat, or after ``MAX_PROBES`` (1,000) *probes*: a probe is one
   evaluation of the neighbourhoods from one GPU (the step at ``M`` makes one per GPU at
   ``M``, the leximax step one per GPU it tries, and it tries none once the budget is
   spent; a step at ``M`` starts only below it). Counted in probes, not moves: a search
   on a plateau applies few moves but tries every GPU before each, and at wide EP a probe
   (the exchange search above all) costs tens of microseconds. A work bound, not a
   clock, so the kernel and its reference stop at the same point.
4. **Ensemble** (Proposition 1). Candidates, in this order: the token-LP dispatch, A3
   round robin (rank ``r`` to GPU ``r mod g``) when every live expert is replicated on
   every GPU, and (*extension*) the optimal semi-matching with whole experts, twice. When
   stage 3 is on and the bound leaves room below ``M(A_H)``, every candidate is polished
   by the stage-3 search (the semi-matching one first under the activation cap ``G_g <=
   SM``, then ``G_g <= SM + 1``, each followed by the uncapped search; a move over the cap
   costs infinity, which keeps the search among the activation-tight dispatches that the
   uncapped search trades away for token balance), and the first polished candidate
   strictly below the output so far replaces it. Without stage 3, a raw candidate
   replaces ``A_H`` iff it is below ``(1 - tau) M(A_H)``. Polishing only lowers a
   candidate and a polished one is taken only below ``M(A_H)``, so ``M(A*) <= min(M(A_H),
   min_C M(C) / (1 - tau))`` holds for the raw candidates, and under full replication
   ``M(A*) <= (OPT + max_k phi_k(n_max)) / (1 - tau)`` (Theorem 2); ``tau = 0`` gives the
   additive bound exactly. (``tau`` only acts on raw candidates: a polished candidate is
   the local search's own output, like ``A_H``.)

   4b. **Ruin-and-recreate restarts** (*extension*; ``restarts=False`` switches it off).
   Run only when the stage-4 makespan ``M`` is more than ``RESTART_GAP`` (0.2%, relative)
   above the stop bound of stage 3, and B8 and B9
   (:func:`~straggler.solvers.dispatch.bounds.forced_bound`, tried inside the kernel at
   ``M`` from the bound B1-B7, B9 only where B8 leaves ``M`` unproved) do not prove ``M``
   optimal by ``solve_dispatch``'s OPTIMAL rule (``M <= B * (1 + OPTIMALITY_RTOL) +
   1e-12``, ``B`` the larger of the two): a restart applies only a
   strictly lower makespan, which such a layer does not have, so skipping them changes no
   output and saves their searches (up to ``RESTART_PROBES`` probes, the slowest part of
   tempo on wide-EP layers); the value tried is ``extras["bound_forced"]`` (nan: not
   tried), and stage 5 reuses it where no restart applied. A round tries every GPU ``h``
   (increasing): the experts active on ``h`` leave the dispatch (all their shares) and go
   back whole by stage 1's rule on the rest of it; the result is polished by the stage-3 search
   uncapped, and, for each of the two largest floor levels ``F = a + b*G + b2*j < M``,
   first under the floor cap ``F`` (a GPU whose floor ``a + b*G + b2*(T - G)`` exceeds
   ``F`` costs infinity) and then uncapped. The round's strictly lowest makespan (first
   found on ties) is applied; at most ``RESTART_ROUNDS`` (2) rounds, and no polish starts
   once the stage's searches have made ``RESTART_PROBES`` (10,000) probes in all (a work
   bound, deterministic, unlike a clock; it counts the probes of the searches that end
   without a move, which are most of a round's work). The first eight times a round's best
   makespan falls, B8 and B9 are tried once at it; where they prove it optimal the stage
   ends there, with the dispatch the whole stage would return (no later restart is
   strictly lower). Every start of
   stages 1-4 can end on the same plateau: GPUs at ``G + 1`` activations with one tile
   over, where any single move, swap, chain or exchange raises some GPU to the makespan
   (on the ``decode16`` layer of ``benchmarks/tempo_quality.py`` that shows it, the
   fewest activation changes to any better dispatch is 18, on 9 GPUs). The floor cap
   forbids that floor, so the search must trade the tile or the activation away first,
   which is the step single moves cannot price. ``extras["restarts"]`` counts the rounds
   applied, ``extras["restart_probes"]`` the probes of their searches (0 where the stage
   did not run).

5. **Support rebalance** (*extension*; ``rebalance=False`` switches it off). The token LP
   restricted to the support of the stage-4 output (only its active replicas, by
   :func:`~straggler.solvers.dispatch._token_lp_fast.support_rebalance_kernel`, with a
   plain-Python reference beside it) moves tokens only between replicas that are
   already active, so it adds no activation and no split; its integral optimum replaces
   the output iff its makespan is strictly lower. It is skipped when the output already
   meets the certified bound (nothing can be lower). ``extras["makespan_stage4"]`` is the
   makespan before it and ``extras["rebalanced"]`` says whether it (or 5b) applied.

   5b. **Support contraction** (*extension*; ``contract=False`` switches it off). Each
   round drops one active replica of a split expert, the one whose removal gives the
   lowest makespan when the token LP on the remaining support redistributes the tokens
   (:func:`~straggler.solvers.dispatch._token_lp_fast.support_contract_kernel`, plain-Python
   reference beside it; replicas by expert, then GPU, increasing; first found on ties),
   while that makespan is strictly lower. Stage 3 splits an expert one move at a time;
   undoing a split frees an activation (the floor ``a + b*G``) but needs the tokens
   re-routed through every other split at once, which no single move prices and the LP
   does exactly. Run only when the makespan is more than ``SUPPORT_GAP`` (0.1%, relative)
   above the certified bound (within it, the layer is within 0.1% of the optimum already);
   ``extras["contracted"]`` is the number of replicas dropped.

   5c. **Activation swaps** (*extension*; ``swap=False`` switches it off). On a GPU ``h``
   below the makespan, one of its active shares moves whole to another replica of its
   expert while ``h`` activates a replica it holds unused, so ``h``'s activation count
   stays; the token LP on the new support routes tokens into ``h`` through every split
   (:func:`~straggler.solvers.dispatch._token_lp_fast.support_swap_kernel`, plain-Python
   reference beside it). Each round applies the swap of lowest makespan if strictly
   lower (GPUs, moved share, its destination, new replica, each increasing; first found
   on ties), at most ``SWAP_ROUNDS`` (4) rounds. This is how a GPU left under-loaded at
   an activation cap (all GPUs at ``G`` replicas, the floor ``a + b*(G + 1)`` above the
   makespan) takes tokens: stage 3 only adds activations or moves tokens along existing
   splits. Run under the same gap condition as 5b; ``extras["swapped"]`` counts the
   swaps. Before 5b and 5c, B8 and B9 (:func:`~straggler.solvers.dispatch.bounds.forced_bound`)
   are tried at the makespan reached; where it proves that makespan optimal, neither runs
   (nor 5d): each applies only a strictly lower makespan, which does not exist, so the
   output is the same, without their LP rounds (tens of milliseconds at EP128-256).
   5d. **Fractional support LP** (*extension*; ``fractional=False`` switches it off). The
   exact (fractional) token LP restricted to the support of the output
   (:func:`~straggler.solvers.dispatch._token_lp_fast.support_fractional_kernel`, plain-Python
   reference beside it) replaces it iff its makespan is strictly lower: whole tokens leave
   up to one token per GPU above ``lambda*`` of the support, which decides the makespan
   where tokens bind. Skipped when the output meets the certified bound.
6. **Bounded exact repair** (*extension*; ``repair_budget_s=0`` switches it off). When the
   makespan is more than ``repair_gap`` (relative) above the certified lower bound, at
   most ``repair_budget_s`` seconds per call (a stack shares them, largest relative gap
   first) go to MILPs of the layer warm-started with tempo's shares: every expert whole,
   then only tempo's split experts split, then the whole layer
   (:mod:`straggler.solvers.dispatch._tempo_repair`; ``benchmarks/tempo_outliers.py`` measured the
   alternatives); a solution, in whole tokens again, is taken only when strictly better, and the
   whole layer's dual bound raises the reported lower bound. Extras: ``repaired`` (the repair ran),
   ``repair_status`` (``"optimal"``: the repaired makespan meets the raised bound, the
   layer is proved optimal; ``"improved"``; ``"unchanged"``; or
   ``"off"``/``"not needed"``/``"budget spent"``), ``repair_milp_status`` (the MILP's
   status name: ``"OPTIMAL"`` when it proved its optimum over fractional shares, which
   whole tokens may stay above), ``makespan_before_repair``, ``repair_gain`` (makespan
   drop), ``repair_bound_gain`` (bound rise), ``repair_runtime_s``. HiGHS stops on
   wall-clock time, so a layer whose MILP runs into the budget may differ between runs on a
   loaded machine; with the repair off, tempo is deterministic.

   What a caller pays: nothing on a layer within ``repair_gap`` of its bound (84-100% of
   the layers of each family of ``benchmarks/tempo_quality.py``); otherwise the MILPs'
   time, at most the budget per call, all of it when nothing proves the layer optimal
   (a layer already optimal under a loose bound pays the whole budget). The default
   budget, 2 s, is where the sequence leaves one layer of the tuning families above 1.001
   of the optimum that whole tokens could bring within it (decode16 194: 1.018 -> 1.006),
   against four at 1 s, and three for the whole layer's MILP alone at 1 s and at 2 s alike
   (``benchmarks/tempo_outliers.py --budget-curve``).

Speed (results unchanged by any of it): the kernels build the replica lists without
branches, order experts by a stable radix sort, keep per-GPU sorted lists of the experts
that hold tokens (so no search scans empty replicas, which matters under full
replication), score candidates from their live entries, and prune the chain, swap and
ejection searches only by lower bounds that cannot beat the best found (``t`` is
nondecreasing in ``G``, ``N``, ``T`` and ``T >= G``); the plain-Python reference
enumerates everything.

The stage-4 token-LP candidate is the integral token-optimal dispatch of
:func:`token_lp_fast` (``max_g N_g = ceil(lambda*)``); with ``fractional=False`` tempo can
therefore stay above a fractional OPT by the cost of about one token per GPU.
``lower_bound`` is the certified bound of :func:`~straggler.solvers.certified_lower_bound`
(with :func:`tempo_layer_bound` inside it), raised by the repair's MILP dual bound when one
ran. Its bounds B1-B7 are computed once per layer, before stage 3 (which stops there), from
the semi-matching and token-LP values tempo computes anyway; B8 (activations and tokens
forced per GPU) is tried at the makespan tempo reaches, where it proves most optimal layers
optimal, and B9 (activations counted per GPU) after it where the makespan is still unproved
(:mod:`straggler.solvers.dispatch.bounds`). The bound is handed to
``solve_dispatch`` as the layer's
:class:`~straggler.solvers.dispatch.method.BoundCertificate`, so the entry point does not
compute it again.

Each kernel is called through its kernel/reference pair
(``straggler.solvers.dispatch._backend``): on a cold numba cache the plain-Python references
serve (same results) until the kernels are compiled or their time budget is spent.
"""

from __future__ import annotations

import functools
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import DispatchProblem
from ...formulations.errors import param_error
from ...formulations.validation import check_bool, check_int, check_real, check_type
from . import _backend as kernels
from ._tempo import CHOICES, INFO_FIELDS, KernelOptions, kernel_cost
from ._tempo_repair import repair_layer
from .bounds import forced_bound
from .method import OPTIMALITY_RTOL, BoundCertificate, LayerSolution

__all__ = ["Tempo", "ExactTokenLP", "token_lp_fast", "tempo_layer_bound", "CHOICES"]

_FUNC = "solve_dispatch(method='tempo')"
#: Most activation swaps (stage 5c) per layer.
SWAP_ROUNDS = 4
#: Stages 5b and 5c run only on a layer more than this (relative) above its bound.
SUPPORT_GAP = 1e-3
#: Stage 4b runs only on a layer more than this (relative) above its stop bound.
RESTART_GAP = 2e-3
#: Stage 4b starts no polish after this many neighbourhood probes of its searches in all.
RESTART_PROBES = 10_000
#: Where the kernel's ``info`` holds B8 and B9 tried at the stage-4 makespan (nan: not tried).
_BOUND_FORCED = INFO_FIELDS.index("bound_forced")
#: The kernel's info of a layer whose exact token-LP dispatch is optimal (tempo not run):
#: nan for its makespans and ``bound_forced``, 0 for its counters; ``info[0]`` set per layer.
_LP_EXACT_INFO = [math.nan] * 8 + [0.0] * (len(INFO_FIELDS) - 8)
_LP_EXACT_INFO[_BOUND_FORCED] = math.nan
#: The kernel's counters, reported as ints in a layer's extras.
_INT_INFO = ("chain_moves", "ls_moves", "flow_moves", "exchange_moves", "restarts",
             "restart_probes")  # fmt: skip
#: A layer's repair fields before any repair runs (off, or not run yet).
_REPAIR_FIELDS = dict(repaired=False, repair_status="", repair_milp_status="NOT_RUN",
                      repair_gain=0.0, repair_bound_gain=0.0, repair_runtime_s=0.0)  # fmt: skip
_REPAIR_OFF = {**_REPAIR_FIELDS, "repair_status": "off"}
_REPAIR_NOT_NEEDED = {**_REPAIR_FIELDS, "repair_status": "not needed"}
#: A layer's extras in their order, the kernel's fields, then this method's, then the repair's
#: (with the repair off, and not needed): each layer's a copy, its values then set (a copy
#: of a full dict, where filling an empty one resizes it three times)
_LAYER_FIELDS = dict.fromkeys(INFO_FIELDS) | dict.fromkeys(
    ("rebalanced", "contracted", "swapped", "makespan_stage4", "choice", "makespan_lp_exact",
     "stages_skipped", "makespan_before_repair")
)  # fmt: skip
_EXTRAS_OFF = _LAYER_FIELDS | _REPAIR_OFF
_EXTRAS_NOT_NEEDED = _LAYER_FIELDS | _REPAIR_NOT_NEEDED
#: Neighbourhood probes of each stage-3 search.
MAX_PROBES = 1_000


class ExactTokenLP(NamedTuple):
    """Exact token LP (Lemma 1) of one layer."""

    shares: np.ndarray
    """Integral token-optimal dispatch ``(n_experts, n_gpus)``, ``max_g N_g = ceil(value)``."""
    value: float
    """``lambda* = min max_g N_g`` over fractional dispatches (``num / den``)."""
    num: int
    """Numerator of ``lambda*`` in lowest terms."""
    den: int
    """Denominator of ``lambda*`` (at most ``n_gpus``)."""


def _token_lp_fast_iv(problem) -> DispatchProblem:
    check_type(
        problem, "problem", "token_lp_fast", DispatchProblem, "a single-layer DispatchProblem"
    )
    if problem.is_stack:
        raise param_error(
            "problem", "token_lp_fast", "a single-layer DispatchProblem",
            f"a stack of {problem.n_layers} layers",
        )  # fmt: skip
    return problem


def token_lp_fast(problem: DispatchProblem) -> ExactTokenLP:
    """Solve the token LP ``min max_g N_g`` (Lemma 1) exactly, without an LP solver.

    ``lambda* = max_S W(S)/|S|`` over GPU sets ``S``, where ``W(S)`` sums the tokens of the
    experts whose replicas all lie in ``S`` (max-flow/min-cut). Augmenting paths find the
    integral optimum ``ceil(lambda*)`` and a Dinkelbach iteration on the ratio the exact
    ``lambda*``; see ``straggler.solvers.dispatch._token_lp_fast``.

    Parameters
    ----------
    problem : DispatchProblem
        One layer.

    Returns
    -------
    ExactTokenLP
        ``shares``, ``value``, ``num``, ``den``.

    Raises
    ------
    InvalidInputError
        Not a single-layer :class:`DispatchProblem`.

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
    problem = _token_lp_fast_iv(problem)
    x, num, den = kernels.TOKEN_LP(
        np.ascontiguousarray(problem.counts, dtype=np.int64), np.ascontiguousarray(problem.replicas)
    )
    return ExactTokenLP(shares=x, value=num / den, num=int(num), den=int(den))


def tempo_layer_bound(cost: CostModel, lp_value: float, sm_value: int) -> float:
    """``max(c + beta*lambda*, c2 + gamma*lambda*, a + b*SM)``: tempo's own integral bound.

    ``lambda*`` is the token-LP value (some GPU carries at least that many tokens) and
    ``SM`` the optimal semi-matching value (some GPU activates at least ``SM`` replicas,
    and ``b2*(T - G) >= 0``). The bound tempo reports is the stronger
    :func:`~straggler.solvers.certified_lower_bound`, which contains this one.

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


@functools.lru_cache(maxsize=64)
def _kernel_params_of(cost: CostModel):
    c = cost.as_array()
    return c, tuple(kernel_cost(c))  # (a plain tuple: the kernel's cheaper argument)


#: The last cost model and its kernel parameters, as one tuple (threads replace it whole).
_LAST_PARAMS: list = [(None, None)]


def _kernel_params(cost: CostModel):
    """``cost.as_array()`` and its :class:`KernelCost` (a plain tuple of its fields), once
    per cost model (a frozen,
    hashable value; building them costs a few microseconds per layer otherwise), the last
    one by identity (hashing a model's fields costs a microsecond). The array stays
    writeable (a read-only one is another numba type, compiled again); no kernel writes to
    its inputs."""
    last, params = _LAST_PARAMS[0]
    if last is not cost:
        params = _kernel_params_of(cost)
        _LAST_PARAMS[0] = (cost, params)
    return params


class _Layer(NamedTuple):
    """What the kernels return for one layer (before the repair)."""

    shares: np.ndarray
    info: list
    """The kernel's ``info`` (``INFO_FIELDS``), as Python floats."""
    num: int
    den: int
    sm: int
    makespan: float
    bound: float
    contracted: int
    swapped: int
    makespan_lp_exact: float
    """Of the exact token-LP dispatch (nan when ``fractional`` is off)."""
    choice: str
    """``CHOICES`` entry of the stages, or ``"token_lp_exact"`` / ``"support_fractional"``."""
    skipped: bool
    """The exact token-LP dispatch met the bound: stages 1-5 did not run."""


@dataclass(frozen=True)
class Tempo:
    """tempo_fast (TEMPO §4.2): seed, chains, local search, ensemble; rebalance, repair.

    Parameters
    ----------
    seed, chains, local_search, ensemble : bool, default True
        Switch each stage (the Table 2 / Table 8 ablations).
    flows, exchanges, tile_chains : bool, default True
        Switch the token paths, the path and cyclic exchanges, and the ejection chains
        with a tile-boundary first leg in stage 3 (extensions, see the module notes).
    rebalance : bool, default True
        The support rebalance after stage 4 (an extension, see the module notes).
    contract, swap : bool, default True
        The support contraction and the activation swaps after it (extensions, see the
        module notes).
    restarts : bool, default True
        The ruin-and-recreate restarts after stage 4 (an extension, see the module notes).
    fractional : bool, default True
        Shares may be fractional: the exact token-LP dispatch is a candidate (and returned
        at once when it meets the certified bound), and the output's support is rebalanced
        by the exact token LP (stage 5d; an extension, see the module notes). ``False``:
        whole tokens only.
    tau : float in [0, 1), default 0.01
        Switching tolerance of the ensemble for raw candidates (Proposition 1).
    max_iter : int >= 0, default 300
        Iteration cap of each local search.
    repair_budget_s : float >= 0, default 2.0
        Wall-clock seconds of bounded exact repair per call (0: off): one layer gets all
        of it; a stack shares it, layers with the largest relative gap first (a layer left
        without budget reports ``repair_status = "budget spent"``). Only layers more than
        ``repair_gap`` above their certified bound spend any of it.
    repair_gap : float >= 0, default 0.001
        Relative gap ``(makespan - lower_bound) / makespan`` above which a layer is
        repaired.

    Notes
    -----
    See ``straggler.solvers.dispatch.tempo`` for the stages, guarantees and tie-breaking. The
    reported ``lower_bound`` is the certified bound (raised by the repair's MILP when it
    ran); ``extras`` holds the makespan after each stage, the candidates' makespans, the
    choice, the move counts and what the repair did.

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
    flows: bool = True
    exchanges: bool = True
    tile_chains: bool = True
    rebalance: bool = True
    contract: bool = True
    swap: bool = True
    restarts: bool = True
    fractional: bool = True
    tau: float = 0.01
    max_iter: int = 300
    repair_budget_s: float = 2.0
    repair_gap: float = 0.001

    def __post_init__(self) -> None:
        _tempo_iv(self)
        # built once, not per layer; a plain tuple, the kernel's cheaper argument
        object.__setattr__(self, "_kernel_opts", tuple(self._opts()))

    def _opts(self) -> KernelOptions:
        return KernelOptions(
            bool(self.seed),
            bool(self.chains),
            bool(self.local_search),
            bool(self.ensemble),
            bool(self.flows),
            bool(self.exchanges),
            bool(self.tile_chains),
            float(self.tau),
            int(self.max_iter),
            bool(self.restarts),
            RESTART_GAP,
            RESTART_PROBES,
            MAX_PROBES,
        )

    def _arrays(self, cost, kcost, c, counts, replicas) -> _Layer:
        """Token LP, semi-matching, the certified bound, tempo, the support stages and B8
        (kernels, ``nogil``): everything of one layer but the repair."""
        # the token LP, semi-matching, B1-B7 (stage 3 stops there, solve_dispatch reports it,
        # with B8 below) and the exact token-LP dispatch, in one kernel call
        lp, num, den, assign, sm, bound, x_lp, m_lp = kernels.PRELUDE(
            counts, replicas, c, self.fractional
        )
        if self.fractional and m_lp <= bound * (1 + OPTIMALITY_RTOL) + 1e-12:
            # optimal: nothing to search
            info = _LP_EXACT_INFO.copy()
            info[0] = float(m_lp)
            return _Layer(x_lp, info, int(num), int(den), int(sm), float(m_lp),
                          float(bound), 0, 0, float(m_lp), "token_lp_exact", True)  # fmt: skip
        shares, info = kernels.TEMPO(counts, replicas, kcost, lp, assign, bound, self._kernel_opts)
        info = info.tolist()  # (Python floats: numpy scalars cost more in every step below)
        choice = CHOICES[int(info[8])]
        m = info[0]
        if self.rebalance and m > bound:
            shares, _, m = kernels.SUPPORT_REBALANCE(counts, shares, c)
        contracted = swapped = 0
        forced = None  # (makespan, B8 and B9 tried at it)
        if not math.isnan(info[_BOUND_FORCED]) and info[13] == 0:
            # the kernel tried B8 and B9 at the stage-4 makespan, and no restart changed it
            forced = (info[0], info[_BOUND_FORCED])
        if (self.contract or self.swap) and m > bound + SUPPORT_GAP * m:
            # B8, B9 at the makespan reached: where they prove that makespan optimal, no stage
            # below finds a strictly lower one, so none runs (the same output, sooner)
            if forced is None or forced[0] != m:
                forced = (m, forced_bound(counts, replicas, c, bound, float(m)))
            if forced[1] >= m:
                return self._layer(shares, info, num, den, sm, m, forced[1], 0, 0, m_lp, choice)
        if self.contract and m > bound + SUPPORT_GAP * m:
            shares, m, contracted = kernels.SUPPORT_CONTRACT(counts, shares, c)
        if self.swap and m > bound + SUPPORT_GAP * m:
            shares, m, swapped = kernels.SUPPORT_SWAP(counts, replicas, shares, c, SWAP_ROUNDS)
        if self.fractional and m > bound:  # Stage 5d: the exact token LP on the support
            shares, frac, m = kernels.SUPPORT_FRACTIONAL(counts, shares, c)
            if frac:
                choice = "support_fractional"
            if m_lp < m:
                shares, m, choice = x_lp, m_lp, "token_lp_exact"
        # B8 and B9 from the makespan reached: prove it optimal where it is
        if forced is not None and forced[0] == m:
            bound = forced[1]
        else:
            bound = forced_bound(counts, replicas, c, bound, float(m))
        return self._layer(shares, info, num, den, sm, m, bound, contracted, swapped, m_lp,
                           choice)  # fmt: skip

    @staticmethod
    def _layer(shares, info, num, den, sm, m, bound, contracted, swapped, m_lp, choice):
        return _Layer(shares, info, int(num), int(den), int(sm), float(m), float(bound),
                      int(contracted), int(swapped), float(m_lp), choice, False)  # fmt: skip

    def _needs_repair(self, m, bound) -> bool:
        return self.repair_budget_s > 0 and m > bound + self.repair_gap * m + 1e-12

    def _solution(self, problem, cost, lay: _Layer, budget: float | None = None) -> LayerSolution:
        """Extras and the repair of one layer; ``budget``: the repair seconds left to this call
        (default ``repair_budget_s``)."""
        info = lay.info
        extras = (_EXTRAS_OFF if self.repair_budget_s == 0 else _EXTRAS_NOT_NEEDED).copy()
        extras.update(zip(INFO_FIELDS, info))
        m, bound = lay.makespan, lay.bound
        # (the kernel's counters as ints, then the fields of this method)
        for k in _INT_INFO:
            extras[k] = int(extras[k])
        extras["rebalanced"] = m < info[0]
        extras["contracted"] = lay.contracted
        extras["swapped"] = lay.swapped
        extras["makespan_stage4"] = info[0]
        extras["choice"] = lay.choice
        extras["makespan_lp_exact"] = lay.makespan_lp_exact
        extras["stages_skipped"] = lay.skipped
        extras["makespan_before_repair"] = m
        cert = BoundCertificate(bound, lay.sm, lay.num / lay.den)
        shares = lay.shares
        budget = self.repair_budget_s if budget is None else budget
        if self._needs_repair(m, bound) and budget <= 0:
            extras["repair_status"] = "budget spent"  # the call's budget went to other layers
        elif self._needs_repair(m, bound):
            r = repair_layer(problem, cost, shares, budget_s=budget, lower_bound=bound,
                             fractional=self.fractional)  # fmt: skip
            extras["repaired"] = True
            extras["repair_status"] = r.status
            extras["repair_milp_status"] = r.milp_status
            extras["repair_gain"] = m - r.makespan
            extras["repair_bound_gain"] = r.lower_bound - bound
            extras["repair_runtime_s"] = r.runtime_s
            shares, m, bound = r.shares, r.makespan, max(bound, r.lower_bound)
        extras["makespan"] = float(m)
        # the kernels' int64 shares as they are: solve_dispatch scores a float64 copy of them
        return LayerSolution(shares=shares, lower_bound=bound, extras=extras, certificate=cert)

    def solve(self, problem: DispatchProblem, cost: CostModel, *, time_limit, rng) -> LayerSolution:
        """One validated layer."""
        counts = np.ascontiguousarray(problem.counts, dtype=np.int64)
        replicas = np.ascontiguousarray(problem.replicas)
        c, kcost = _kernel_params(cost)
        return self._solution(problem, cost, self._arrays(cost, kcost, c, counts, replicas))

    def solve_stack(self, problems, cost: CostModel, *, time_limit, rng) -> list[LayerSolution]:
        """Every layer, in parallel over layers on a thread pool around the ``nogil`` kernels.

        Results are identical to :meth:`solve` layer by layer (the kernels are
        deterministic and share no state; the repairs, which run after the kernels in
        layer order, are deterministic up to their time limits). Threads:
        ``numba.get_num_threads()``, from a pool kept for the process (made on the first
        stack solve); one (the caller's) while a kernel is not compiled yet and its
        plain-Python reference serves instead (``straggler.solvers.dispatch._backend``).
        """
        problems = list(problems)
        c, kcost = _kernel_params(cost)
        counts = [np.ascontiguousarray(p.counts, dtype=np.int64) for p in problems]
        replicas = [np.ascontiguousarray(p.replicas) for p in problems]
        n_threads = max(1, min(numba.get_num_threads(), len(problems)))
        if not kernels.all_ready(*_PAIRS):
            n_threads = 1

        def chunk(k):
            return [
                self._arrays(cost, kcost, c, counts[l], replicas[l])
                for l in range(k, len(problems), n_threads)
            ]

        if n_threads == 1:
            parts = [chunk(0)]
        else:
            parts = list(_pool(n_threads).map(chunk, range(n_threads)))
        layers = [None] * len(problems)
        for k, part in enumerate(parts):
            for i, lay in enumerate(part):
                layers[k + i * n_threads] = lay
        # one repair budget for the whole call, spent on the layers with the largest
        # relative gap first (a stack solve stays inside a serving refresh)
        order = sorted(range(len(problems)), key=lambda l: _rel_gap(layers[l]), reverse=True)
        out = [None] * len(problems)
        left = self.repair_budget_s
        for l in order:
            out[l] = self._solution(problems[l], cost, layers[l], left)
            left = max(0.0, left - out[l].extras["repair_runtime_s"])
        return out


#: The kernels of one layer (:meth:`Tempo._arrays`).
_PAIRS = (kernels.PRELUDE, kernels.TEMPO, kernels.SUPPORT_REBALANCE, kernels.SUPPORT_CONTRACT,
          kernels.SUPPORT_SWAP, kernels.SUPPORT_FRACTIONAL, kernels.FORCED_BOUND,
          kernels.COUNTING_BOUND)  # fmt: skip


def _rel_gap(lay: _Layer) -> float:
    return (lay.makespan - lay.bound) / lay.makespan if lay.makespan > 0 else 0.0


def _tempo_iv(t: Tempo) -> None:
    """Validate :class:`Tempo`'s options (raises ``InvalidInputError`` naming the option)."""
    for name in ("seed", "chains", "local_search", "ensemble", "flows", "exchanges",
                 "tile_chains", "rebalance", "contract", "swap", "restarts",
                 "fractional"):  # fmt: skip
        check_bool(getattr(t, name), name, _FUNC)
    check_real(t.tau, "tau", _FUNC, lo=0, hi=1, hi_open=True)
    check_int(t.max_iter, "max_iter", _FUNC, lo=0)
    check_real(t.repair_budget_s, "repair_budget_s", _FUNC, lo=0)
    check_real(t.repair_gap, "repair_gap", _FUNC, lo=0)
