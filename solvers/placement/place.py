"""``place_experts``: replica placement that knows the dispatch will be time-aware.

EPLB (:func:`~straggler.solvers.placement.eplb.rebalance_experts`) chooses replica counts and packs
replicas onto GPUs assuming every expert's tokens are split evenly over its replicas
(``w / count`` per replica, mean loads of the window). Under tempo dispatch neither
assumption holds: tempo keeps cold experts whole, splits hot ones where it pays, and the
step costs the *per-batch* maximum over GPUs of ``max(a + b G, c + beta N)``. This module
places for that.

``method="greedy"`` (the default from scratch; :mod:`._placement_greedy` states it): EPLB's
two stages, one pass each, on weights that see what tempo pays for. Replicate: each
redundant slot to the largest ``max(s * peak tokens, alpha * b * share of batches live) /
replicas`` (``s`` the token slope), so an expert gets replicas for its peak tokens or, live in
most batches, to let the dispatch even out the GPUs' activated experts. Pack: replicas by
decreasing ``max(b * live share, s * mean tokens) / replicas`` onto the GPU whose pressure
``max(a + b F, c + beta M)`` (``F``, ``M``: the live shares and mean tokens of its replicas,
each a replica's ``1 / r``) ends lowest, plus ``spread * b`` per expert already sharing that
GPU with one holding the replica's expert: replica sets kept apart, so no pair of GPUs
shares so many replicated experts that the dispatch cannot relieve it (packed by load
alone, equally weighted replicas fall on the same pairs). No candidate is scored: it costs
about one EPLB call (``O(T E + (P - E) log E + P g)`` per layer), and on
``benchmarks/placement.py``'s cells it captured more of the headroom than the local search
below with its default budget, never below EPLB in a cell (``docs/performance/dispatch.md``,
"Placement for a time-aware dispatch"). ``alpha`` and ``spread`` are :data:`GREEDY_ALPHA` and
:data:`GREEDY_SPREAD`. With several nodes, EPLB's group-to-node packing is kept and both
stages run inside each node.

``method="local_search"`` (the rebalance's target by default), per layer:

1. **Batches.** The scored batches are the window's (``n_samples`` of them, evenly spaced)
   and ``n_resamples`` batches built expert by expert from it (each expert's counts are the
   window's in an order of its own, a random permutation seeded by the layer index): they
   keep each expert's distribution exactly and mix which experts are hot together, so the
   search tunes less to the window's particular batches.
2. **Score.** A placement is scored by the mean, over the scored batches, of the mean of
   two cheap estimates of tempo's makespan (:mod:`._placement_kernels` states both): the
   *Hall bound*, a lower bound of tempo's layer bound ``max(a + b SM, c + beta lambda*,
   c2 + gamma lambda*)`` (TEMPO Lemmas 1 and 2) that takes Hall's condition on a few sets
   of GPUs only (all of them, each GPU with its single-replica experts, each replicated
   expert's replica set), and the makespan of a *greedy dispatch* (replicated experts by
   decreasing mean load, each whole on its best replica or split evenly), a feasible
   dispatch's, which sees what the bound cannot: that a GPU carries activations and tokens
   at once. Both cost ``O(g + sum of replica sets)`` per batch with the per-GPU rigid loads
   kept up to date move by move. On the phase grid of ``benchmarks/placement.py`` (8-batch
   windows, scored on the next window, 256 resamples) the bound alone captured 75% of the
   headroom, the mix 84%.
3. **Start** from EPLB with ``distinct=True`` on the window's mean load (no two replicas of
   one expert on one GPU).
4. **Moves** (jitted first-improvement search, kernel and plain reference in
   :mod:`._placement_kernels`), keeping ``P / n_gpus`` slots per GPU and distinctness: a
   *replica move* gives the slot of a donor expert (count >= 2, least need per replica
   first) to a receiver expert not on that GPU (most need per replica first), need
   measured as peak tokens (the compute piece) and then as how often the expert is live
   (the floor piece: a replica of an expert live in most batches is what lets the
   semi-matching even out the GPUs' activated experts); a *swap* exchanges a
   single-replica expert of a GPU of high rigid pressure with a lighter expert of one of
   low pressure. The first candidate that lowers the score is applied. A candidate
   rejected is not scored again until a round finds nothing among the others (a full pass
   then tries them all again): the search stops when a full pass finds no candidate that
   lowers the score, after ``patience`` scored candidates in a row that lower nothing, or
   after ``max_evals`` scored candidates (work limits, not a clock: the result is
   deterministic). With several nodes, both moves stay inside one node
   (EPLB's group-to-node packing is kept).
5. **Guard.** Of the result and the start, the one with the lower mean exact layer bound
   (:func:`~straggler.solvers.dispatch.tempo.tempo_layer_bound`: token-LP and optimal semi-matching
   values by the library's kernels) on the window's own batches is returned (ties: the
   result). So on its window a placement is never worse, under the bound tempo stays
   within about 1% of, than EPLB's.

The search's budget is ``n_resamples``, ``max_evals`` and ``patience``: its time grows with
the batches times the candidates scored (each costs one pass over the scored batches). The
defaults (64, 300, 50) are the cheapest budget of ``benchmarks/placement.py``'s frontier
that kept at least 80% of the headroom and no cell below -0.3% on both its cell sets, at
hundreds of times one EPLB call; that frontier is in ``docs/performance/dispatch.md``.

``method="eplb"``: EPLB with ``distinct=True`` (the start, for comparison).

**Rebalance from the placement in force** (``previous`` with ``max_moves`` or
``move_cost``). Engines pay for a rebalance in weight copies: every slot whose expert
changes is one expert's weights copied into it (a *moved replica*,
:func:`moved_replicas`). Per layer:

1. **Start** from ``previous``; a duplicate replica of an expert on one GPU (upstream EPLB
   places them) leaves its slot to the expert not on that GPU with the largest mean load per
   replica (those refills are moves, counted but outside ``max_moves``).
2. **Target**: the placement from scratch above (``method``'s plan without a move limit).
3. **Moves**, best improvement: every round scores the replica moves *toward the target*
   (on each GPU where they differ, the target's missing expert with the highest peak load
   per replica takes the slot of the dropped expert with the lowest that keeps a replica
   elsewhere) and the moves and swaps of the search from scratch (peak-token need), and
   applies the one that lowers the mean score (step 2 above) plus ``move_cost`` per moved
   replica the most, within ``max_moves`` replicas moved from ``previous``. When none lowers it, the
   round applies the best move toward the target instead (the bound is a maximum over
   GPUs: single moves often change nothing until the last GPU is relieved) and the next
   rounds try the moves toward the target only, until one lowers the objective again; it
   stops when the target is reached, the budget spent or no move is left, and returns the
   best placement met on the way.
4. **Guard**: kept only if its mean exact layer bound on the window's own batches plus the
   moves' price is no higher than the start's.

The rebalance scores on the same batches as the search from scratch (the window's and the
resampled ones).

Slots keep their experts where they can: an expert staying on a GPU stays in its slot (the
rule of vLLM's ``preserve_intragpu_slots``, ``vllm/distributed/eplb/policy/default.py``),
so the slot map changes in the moved replicas only.

**Placement for an engine's dispatch rule** (``dispatch="vllm"``, ``"static"``,
``"dynamic"``, ``"lp"``). The engines do not run tempo: vLLM picks a replica per token by
a hash, SGLang by its ``--ep-dispatch-algorithm``. ``solvers/placement/rules.py``
states each rule's expected per-GPU tokens and activated replicas and the modelled step
``max_h t_h`` they imply; per layer:

1. **Starts**: the engine's own EPLB on what the engine gives it, the window's total
   (:func:`~straggler.solvers.placement.eplb.rebalance_experts`, ``version="vllm"`` for
   vLLM's rule, ``"sglang"`` for SGLang's), and, when a GPU's slots do not exceed the
   experts, the greedy placement above and EPLB with ``distinct=True``; the one of lowest
   mean modelled step on the scored batches (the window's ``n_samples`` and
   ``n_resamples`` resampled ones, as the local search) is kept, ties to the earlier.
2. **Search**: ``rules.rule_search``, replica moves and
   swaps scored by the rule's mean modelled step, first improvement, within
   ``max_evals`` (default 300) and ``patience``; inside a node with several.
3. **Guard**: the result is kept only if its mean modelled step on the window's own
   sampled batches is lower than the engine's EPLB's by more than
   ``RULE_SWITCH_TAU`` (1%); otherwise EPLB's map is returned. So on the batches it
   was placed from, the placement is never worse, under the rule's model, than what the
   engine would deploy itself, and it leaves the engine's placement alone for gains
   within the model's noise.

With ``previous`` the slots are then arranged by vLLM's ``preserve_intragpu_slots``
(:func:`~straggler.solvers.placement.eplb.preserve_intragpu_slots`), what vLLM's own
policy does with the map in force.

Everything is deterministic (no clock-based stopping). Slots of a GPU hold its experts
in increasing index order (tempo's placements).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.dispatch import logical_to_physical
from ...formulations.errors import InvalidInputError, InvalidOptionError, param_error
from ...formulations.validation import check_array, check_choice, check_int, check_real, check_type
from ..dispatch._semi_matching import semi_matching_kernel
from ..dispatch._token_lp_fast import token_lp_kernel
from ..dispatch.tempo import tempo_layer_bound
from ._greedy import greedy_placement_kernel
from ._kernels import hall_score_kernel, placement_search_kernel
from .eplb import (
    EPLB_VERSIONS,
    _rebalance_experts_iv,
    balanced_packing,
    preserve_intragpu_slots,
    rebalance_experts,
)
from .rebalance.path import active_ranks_iv, rebalance_path, restore_experts
from .rules import DISPATCH_RULES, _RuleScore, rule_search

__all__ = [
    "place_experts",
    "placement_kernels",
    "warm_placement",
    "moved_replicas",
    "PLACEMENT_METHODS",
    "DEFAULT_PLACEMENT_COST",
    "RULE_SWITCH_TAU",
    "EXHAUSTIVE_LIMIT",
]

_FUNC = "place_experts"
#: ``method`` values of :func:`place_experts`.
PLACEMENT_METHODS = ("greedy", "local_search", "eplb", "exhaustive")
#: ``alpha`` and ``spread`` of ``method="greedy"`` (:mod:`._placement_greedy`): chosen on the
#: 80 cells of ``benchmarks/placement.py`` (every variant tried, ``alpha`` 1-3 with ``spread``
#: 0.1 and ``spread`` 0.1-0.5 with ``alpha`` 2, kept every cell at or above EPLB's makespan;
#: ``spread`` 0.05 lost 3.1% in one cell).
GREEDY_ALPHA, GREEDY_SPREAD = 2.0, 0.2
#: Under an engine's dispatch rule, the placement replaces the engine's own EPLB only when
#: its mean modelled step on the window is lower by more than this fraction (TEMPO §4.2's
#: ensemble switch, tau = 1%): smaller modelled gains did not carry over to the held-out
#: halves of ``benchmarks/placement_rules.py``'s recordings, and each switch moves replicas.
RULE_SWITCH_TAU = 0.01
#: The cost model used when none is given: DSv3 Testbed A offline fit (TEMPO Table 6).
DEFAULT_PLACEMENT_COST = "dsv3_a_offline"


def _mask_from_p2l(p2l: np.ndarray, n_experts: int, n_gpus: int) -> np.ndarray:
    per = p2l.size // n_gpus
    mask = np.zeros((n_experts, n_gpus), dtype=bool)
    mask[p2l, np.arange(p2l.size) // per] = True
    return mask


def _maps(masks: np.ndarray, per: int):
    """``physical_to_logical``, ``logical_to_physical`` and ``logical_count`` of masks."""
    L, E, g = masks.shape
    p2l = np.empty((L, g * per), dtype=np.int64)
    for l in range(L):
        for h in range(g):
            p2l[l, h * per : (h + 1) * per] = np.flatnonzero(masks[l, :, h])
    l2p, count = logical_to_physical(p2l, E)
    return p2l, l2p, count


def _maps_keeping(masks: np.ndarray, previous: np.ndarray, per: int):
    """:func:`_maps` with each GPU's slots arranged as in ``previous``: an expert that stays
    on a GPU keeps its old slot there (its first, if ``previous`` held it twice), and the
    experts new on the GPU fill the other slots in increasing slot and expert order. So
    ``physical_to_logical`` differs from ``previous`` in exactly the moved replicas."""
    L, E, g = masks.shape
    p2l = np.empty_like(previous)
    for l in range(L):
        for h in range(g):
            old = previous[l, h * per : (h + 1) * per]
            row = np.full(per, -1, dtype=np.int64)
            kept = set()
            for i, e in enumerate(old):
                if masks[l, e, h] and e not in kept:
                    row[i] = e
                    kept.add(int(e))
            new = [e for e in np.flatnonzero(masks[l, :, h]) if int(e) not in kept]
            row[row < 0] = new
            p2l[l, h * per : (h + 1) * per] = row
    l2p, count = logical_to_physical(p2l, E)
    return p2l, l2p, count


def moved_replicas(previous, physical_to_logical) -> np.ndarray:
    """Replicas moved per layer: slots whose expert differs between two slot maps.

    A moved replica is one expert's weights copied into another GPU slot, what a rebalance
    costs an engine (EPLB's weight transfer; vLLM's ``preserve_intragpu_slots`` exists to
    lower it).

    Parameters
    ----------
    previous, physical_to_logical : array_like of int, shape (n_layers, P)

    Returns
    -------
    ndarray of int64, shape (n_layers,)

    Examples
    --------
    >>> moved_replicas([[0, 1, 2, 0]], [[0, 2, 1, 0]]).tolist()
    [2]
    """
    a = check_array(previous, "previous", "moved_replicas", ndim=2, kind="int")
    b = check_array(
        physical_to_logical, "physical_to_logical", "moved_replicas", ndim=2, kind="int",
        shape=a.shape,
    )  # fmt: skip
    return (a != b).sum(axis=1).astype(np.int64)


class _Scorer:
    """Mean of tempo's exact layer bound
    (:func:`~straggler.solvers.dispatch.tempo.tempo_layer_bound`:
    token-LP and optimal semi-matching values) over the batches of one layer."""

    def __init__(self, samples: np.ndarray, cost: CostModel):
        self.bound = [np.ascontiguousarray(c, dtype=np.int64) for c in samples]
        self.live = [c > 0 for c in self.bound]
        self.cost = cost

    def __call__(self, mask: np.ndarray) -> float:
        rep = np.ascontiguousarray(mask)
        total = 0.0
        for c, live in zip(self.bound, self.live):
            _, num, den = token_lp_kernel(c, rep)
            _, sm, _ = semi_matching_kernel(rep, live)
            total += tempo_layer_bound(self.cost, num / den, int(sm))
        return total / len(self.bound)


def _candidates(mask, samples, node_of):
    """Replica moves and swaps of the rebalance (module notes, rebalance step 3), in trial
    order; each a list of (expert, gpu, value)."""
    count = mask.sum(axis=1)
    peak = samples.max(axis=0) / np.maximum(count, 1)
    donors = [e for e in np.argsort(peak, kind="stable") if count[e] >= 2][:6]
    receivers = [e for e in np.argsort(-peak, kind="stable")][:6]
    out = []
    for u in receivers:
        for d in donors:
            if d == u:
                continue
            for h in np.flatnonzero(mask[d]):
                # the receiver must be new on h and (several nodes) already on h's node
                same_node = mask[u, node_of == node_of[h]].any() or node_of.max() == 0
                if not mask[u, h] and same_node:
                    out.append([(d, h, False), (u, h, True)])
                    break
    single = mask & (count == 1)[:, None]
    # Swaps for the compute piece (mean tokens of single-replica experts) and for the floor
    # piece (how often single-replica experts are live: what the semi-matching must place).
    for weight in (samples.mean(axis=0), (samples > 0).mean(axis=0)):
        rigid = (weight[:, None] * single).sum(axis=0)
        order = np.argsort(-rigid, kind="stable")
        for h1 in order[:2]:
            for h2 in order[::-1][:2]:
                if h1 == h2 or node_of[h1] != node_of[h2]:
                    continue
                down = np.argsort(-weight, kind="stable")
                e1s = [e for e in down if single[e, h1] and not mask[e, h2]][:3]
                e2s = [e for e in down[::-1] if mask[e, h2] and not mask[e, h1]][:3]
                for e1 in e1s:
                    for e2 in e2s:
                        if weight[e1] > weight[e2]:
                            out.append([(e1, h1, 0), (e1, h2, 1), (e2, h2, 0), (e2, h1, 1)])
    return out


def _repair(mask, mean, node_of, per):
    """Fill the slots freed by collapsing duplicate replicas (upstream EPLB can put two
    replicas of an expert on one GPU): each vacancy of GPU ``h`` (increasing ``h``) goes to
    the expert not on ``h`` (and, with several nodes, already on ``h``'s node) with the
    largest mean load per replica, ties to the lower index."""
    mask = mask.copy()
    for h in range(mask.shape[1]):
        while mask[:, h].sum() < per:
            ok = ~mask[:, h] & mask[:, node_of == node_of[h]].any(axis=1)
            if node_of.max() == 0:
                ok = ~mask[:, h]
            ratio = np.where(ok, mean / np.maximum(mask.sum(axis=1), 1), -np.inf)
            mask[int(np.argmax(ratio)), h] = True
    return mask


def _resample(window: np.ndarray, n: int, seed) -> np.ndarray | None:
    """``n`` batches built expert by expert from ``window`` (``(T, E)``): each expert's
    counts are the window's in an order of its own (an independent random permutation per
    expert, ``default_rng(seed)``, of the window's batches repeated ``ceil(n / T)`` times,
    the first ``n`` kept). Each expert's distribution over the window is kept exactly (when
    ``T`` divides ``n``) while which experts are hot together is mixed, so a placement
    scored on them is tuned less to the window's particular batches."""
    if n == 0 or window.shape[0] < 2:
        return None
    T, E = window.shape
    base = np.tile(np.arange(T), -(-n // T))
    order = np.argsort(np.random.default_rng(seed).random((base.size, E)), axis=0)
    return window[base[order[:n]], np.arange(E)]


def _slots_of(mask: np.ndarray) -> np.ndarray:
    """``(g, per)`` experts of each GPU, increasing, of a mask with ``per`` per GPU."""
    g = mask.shape[1]
    return np.ascontiguousarray(np.nonzero(mask.T)[1].reshape(g, -1), dtype=np.int64)


#: Weight of the greedy dispatch's makespan in the search's score (module notes, step 2).
_GREEDY_WEIGHT = 0.5


def _cost_args(cost: CostModel):
    has3 = bool(cost.has_traffic)
    return (float(cost.a), float(cost.b), float(cost.c), float(cost.beta),
            float(cost.c2) if has3 else 0.0, float(cost.gamma) if has3 else 0.0, has3)  # fmt: skip


def _hall_search(start, samples, cost, node_of, max_evals, patience, extra=None):
    """The search from scratch (module notes, steps 1-4) for one layer: ``start`` is the
    EPLB mask, ``samples`` the window's scored batches, ``extra`` the resampled ones."""
    batches = samples if extra is None else np.concatenate([samples, extra])
    batches = np.ascontiguousarray(batches, dtype=np.int64)
    freq = (batches > 0).mean(axis=0)
    mean = batches.mean(axis=0)
    args = (_GREEDY_WEIGHT, *_cost_args(cost))
    # receivers and donors of replica moves by peak tokens, then by how often live
    need = np.stack([batches.max(axis=0).astype(np.float64), freq])
    nodes = np.ascontiguousarray(node_of, dtype=np.int64)
    slots, _, _ = placement_search_kernel(
        _slots_of(start), batches, freq, mean, need, nodes, *args, max_evals, patience
    )
    mask = np.zeros_like(start)
    mask[slots, np.arange(slots.shape[0])[:, None]] = True
    # Step 4: the guard: of the result and the start, the lower mean exact layer bound over
    # the window's own batches (ties: the result).
    if np.array_equal(mask, start):
        return start
    scorer = _Scorer(samples, cost)
    return min([mask, start], key=scorer)


def _toward(mask, target, samples, node_of, limit=32):
    """Replica moves toward ``target`` (the plan without a move limit), at most one per GPU
    where they differ (GPUs in increasing order, at most ``limit``). On GPU ``h`` the
    expert of ``target`` missing there with the highest peak load per replica, ``u``, takes
    the slot of the expert ``target`` drops there with the lowest, ``d``, if ``d`` keeps a
    replica elsewhere; if every dropped expert is the last replica of its expert, ``d``
    (the lowest) also moves to a GPU ``h2`` where ``target`` has it (the first), taking the
    slot of an expert ``target`` drops on ``h2`` that keeps a replica (the lowest): two moved
    replicas."""
    count = mask.sum(axis=1)
    peak = samples.max(axis=0) / np.maximum(count, 1)
    add_all = target & ~mask
    drop_all = mask & ~target
    out = []
    for h in range(mask.shape[1]):
        add = np.flatnonzero(add_all[:, h])
        drop = np.flatnonzero(drop_all[:, h])
        if not add.size or not drop.size:
            continue
        u = add[np.argmax(peak[add])]
        spare = drop[count[drop] >= 2]
        if spare.size:
            out.append([(spare[np.argmin(peak[spare])], h, False), (u, h, True)])
        else:
            d = drop[np.argmin(peak[drop])]
            for h2 in np.flatnonzero(add_all[d]):
                d2s = [x for x in np.flatnonzero(drop_all[:, h2]) if count[x] >= 2 and x != u]
                if d2s:
                    d2 = min(d2s, key=lambda x: peak[x])
                    out.append([(d, h, False), (u, h, True), (d2, h2, False), (d, h2, True)])
                    break
        if len(out) >= limit:
            break
    return out


def _budgeted_search(prev, start, target, samples, cost, node_of, max_moves, move_cost,
                     max_evals, extra=None):  # fmt: skip
    """Best-improvement search from ``start`` (the placement in force, duplicates refilled)
    for the lowest score plus ``move_cost`` per move with at most ``max_moves``
    replicas moved from ``prev``; guarded by the exact layer bound on the window's own
    batches (module notes, "Rebalance from the placement in force")."""
    batches = samples if extra is None else np.concatenate([samples, extra])
    batches = np.ascontiguousarray(batches, dtype=np.int64)
    args = (batches.mean(axis=0), _GREEDY_WEIGHT, *_cost_args(cost))
    evals = [0]

    def scorer(m):
        evals[0] += 1
        return hall_score_kernel(_slots_of(m), batches, *args)

    def moves(m):
        return int((m & ~prev).sum())

    mask = start.copy()
    cur = scorer(mask) + move_cost * moves(mask)
    best_mask, best = mask, cur
    walking = False
    while evals[0] < max_evals:
        toward = _toward(mask, target, samples, node_of)
        others = [] if walking else _candidates(mask, samples, node_of)
        choice, choice_s, choice_toward = None, np.inf, False
        for i, move in enumerate(toward + others):
            if evals[0] >= max_evals:
                break
            trial = mask.copy()
            for e, h, v in move:
                trial[e, h] = v
            k = moves(trial)
            if k > max_moves:
                continue
            t = scorer(trial) + move_cost * k
            if t < choice_s:
                choice, choice_s, choice_toward = trial, t, i < len(toward)
        # an improving move, or else a step toward the target (the bound is a maximum over
        # GPUs, so single moves often change nothing until the last GPU is relieved)
        improving = choice is not None and choice_s < cur * (1 - 1e-12)
        if choice is None or (not improving and not choice_toward):
            break
        mask, cur, walking = choice, choice_s, not improving
        if cur < best * (1 - 1e-12):
            best_mask, best = mask, cur
    mask = best_mask
    if not np.array_equal(mask, start):
        exact = _Scorer(samples, cost)
        if exact(mask) + move_cost * moves(mask) > exact(start) + move_cost * moves(start):
            return start
    return mask


def _restored(previous, h, P, g, slots) -> np.ndarray:
    """``previous`` (``active_ranks`` given) restricted to ``slots`` (the active ranks'),
    each layer's lost experts and empty slots restored (``restore_experts``)."""
    L, E = h.shape[1], h.shape[2]
    if isinstance(previous, (tuple, list)) and len(previous) == 3 and np.ndim(previous[0]) == 2:
        previous = previous[0]
    full = check_array(
        previous, "previous", _FUNC, ndim=2, kind="int", shape=(L, P), lo=-1, hi=E - 1,
        expected=f"the placement in force: physical_to_logical of shape ({L}, {P}) with "
        f"experts in [-1, {E - 1}]",
    )  # fmt: skip
    mean = h.mean(axis=0)
    A = slots.size // (P // g)
    return np.stack([
        restore_experts(full[l, slots], mean[l], A, np.ones(A, dtype=bool), fill_empty=True)
        for l in range(L)
    ])  # fmt: skip


def _place_on_active(h, P, g, act, previous, options):
    """:func:`place_experts` on the active ranks' slots only (its ``active_ranks``)."""
    L, E = h.shape[1], h.shape[2]
    per = P // g
    A = int(act.sum())
    if per * A < E:
        raise param_error(
            "active_ranks", _FUNC, f"enough active ranks for the {E} experts ({per} slots "
            "each)", f"{A} active",
        )  # fmt: skip
    slots = np.concatenate([np.arange(r * per, (r + 1) * per) for r in np.flatnonzero(act)])
    prev = None if previous is None else _restored(previous, h, P, g, slots)
    sub, _, _ = place_experts(h, per * A, 1, 1, A, previous=prev, **options)
    out = np.full((L, P), -1, dtype=np.int64)
    out[:, slots] = sub
    l2p, cnt = logical_to_physical(out, E)
    return out, l2p, cnt


#: Largest number of placements ``method="exhaustive"`` enumerates per layer.
EXHAUSTIVE_LIMIT = 200_000


def _exhaustive(prev, samples, cost, E, g, per, max_moves, move_cost):
    """The exact optimum of the search's objective by enumeration: over every placement of
    ``per`` distinct experts on each of ``g`` GPUs holding every expert (and, with ``prev``,
    moving at most ``max_moves`` replicas from it), the lowest mean tempo layer bound plus
    ``move_cost`` per moved replica; ties to the first in lexicographic order of the GPUs'
    expert sets."""
    scorer = _Scorer(samples, cost)
    subsets = list(itertools.combinations(range(E), per))
    best, best_mask = np.inf, None
    for combo in itertools.product(subsets, repeat=g):
        mask = np.zeros((E, g), dtype=bool)
        for h, sub in enumerate(combo):
            mask[list(sub), h] = True
        if not mask.any(axis=1).all():
            continue
        k = 0 if prev is None else int((mask & ~prev).sum())
        if k > max_moves:
            continue
        v = scorer(mask) + move_cost * k
        if v < best:
            best, best_mask = v, mask
    return best_mask


def _previous_iv(previous, L, E, P):
    """``previous`` (a ``physical_to_logical`` map, or the engines' three maps with it first)
    as an int64 ``(L, P)`` array holding every expert of every layer."""
    if isinstance(previous, (tuple, list)) and len(previous) == 3 and np.ndim(previous[0]) == 2:
        previous = previous[0]
    prev = check_array(
        previous, "previous", _FUNC, ndim=2, kind="int", shape=(L, P), lo=0, hi=E - 1,
        expected=f"the placement in force: physical_to_logical of shape ({L}, {P}) with "
        f"experts in [0, {E - 1}], or the three maps with it first",
    )  # fmt: skip
    for l in range(L):
        missing = np.setdiff1d(np.arange(E), prev[l])
        if missing.size:
            raise param_error(
                "previous", _FUNC, "a placement holding every expert of every layer",
                f"layer {l} without expert {int(missing[0])}",
            )  # fmt: skip
    return prev


def _place_iv(history, num_replicas, num_groups, num_nodes, num_gpus, cost, method, n_samples,
              n_resamples, max_evals, dispatch):  # fmt: skip
    h = check_array(history, "history", _FUNC, ndim=(2, 3), lo=0, hi=2.0**53, kind="real")
    if h.ndim == 2:
        h = h[:, None, :]
    if h.shape[0] < 1 or h.shape[2] < 1:
        raise param_error(
            "history", _FUNC, "recorded batches of shape (n_batches, n_layers, n_experts)",
            f"shape {h.shape}",
        )  # fmt: skip
    num_replicas = check_int(num_replicas, "num_replicas", _FUNC, lo=1)
    num_groups = check_int(num_groups, "num_groups", _FUNC, lo=1)
    num_nodes = check_int(num_nodes, "num_nodes", _FUNC, lo=1)
    num_gpus = check_int(num_gpus, "num_gpus", _FUNC, lo=1)
    if cost is None:
        cost = CostModel.preset(DEFAULT_PLACEMENT_COST)
    elif isinstance(cost, str):
        cost = CostModel.preset(cost)
    check_type(cost, "cost", _FUNC, CostModel, "a CostModel, a preset name or None")
    dispatch = check_choice(dispatch, "dispatch", _FUNC, DISPATCH_RULES)
    if method is not None:
        method = check_choice(method, "method", _FUNC, PLACEMENT_METHODS)
        if dispatch != "tempo":
            raise InvalidOptionError(
                f"The 'method' option of {_FUNC} chooses how to place for tempo's dispatch; "
                f"under an engine's rule the search is its own. Got method={method!r} with "
                f"dispatch={dispatch!r} instead."
            )
    n_samples = check_int(n_samples, "n_samples", _FUNC, lo=1)
    n_resamples = check_int(n_resamples, "n_resamples", _FUNC, lo=0, hi=100_000)
    if max_evals is not None:
        max_evals = check_int(max_evals, "max_evals", _FUNC, lo=0)
    E = h.shape[2]
    if num_gpus % num_nodes or num_replicas % num_gpus:
        raise InvalidInputError(
            f"{_FUNC} needs num_gpus % num_nodes == 0 and num_replicas % num_gpus == 0. Got "
            f"num_replicas={num_replicas}, num_nodes={num_nodes}, num_gpus={num_gpus} instead."
        )
    if num_replicas // num_gpus > E and dispatch == "tempo":
        raise InvalidInputError(
            f"{_FUNC} never puts two replicas of one expert on one GPU, so a GPU holds at most "
            f"{E} experts. Got {num_replicas // num_gpus} slots per GPU instead."
        )
    return (h, num_replicas, num_groups, num_nodes, num_gpus, cost, method, n_samples,
            n_resamples, max_evals, dispatch)  # fmt: skip


def _greedy_layout(mean, P, G, N, g):
    """Each expert's node (``(L, E)``) and the number of nodes for ``method="greedy"``:
    EPLB's layout, checked by EPLB's own validation with ``distinct=True`` (``mean``: the
    window's mean tokens, ``(L, E)``): with ``G % N == 0`` its groups packed onto the nodes
    by their mean tokens (its hierarchical step 1, float32 group loads), else one node."""
    L, E = mean.shape
    try:
        w, _, groups, nodes, *_ = _rebalance_experts_iv(mean, P, G, N, g, True, "deepseek")
    except InvalidInputError as exc:
        raise InvalidInputError(f"{_FUNC}: EPLB cannot place this layout: {exc}") from exc
    if nodes == 1:
        return np.zeros((L, E), dtype=np.int64), 1
    loads = w.reshape(L, groups, E // groups).sum(-1, dtype=np.float32)
    pack, _ = balanced_packing(loads, nodes)
    return np.ascontiguousarray(np.repeat(pack, E // groups, axis=1)), nodes


def _rule_previous_iv(previous, L, E, P):
    """``previous`` for an engine's rule: a slot map of shape ``(L, P)`` (or the three maps
    with it first) with expert ids in ``[-1, E - 1]`` (``-1``: an empty slot)."""
    if isinstance(previous, (tuple, list)) and len(previous) == 3 and np.ndim(previous[0]) == 2:
        previous = previous[0]
    return check_array(
        previous, "previous", _FUNC, ndim=2, kind="int", shape=(L, P), lo=-1, hi=E - 1,
        expected=f"the slot map in force of shape ({L}, {P}) with experts in [-1, {E - 1}]",
    )  # fmt: skip


def _greedy_p2l(counts, mean, P, G, N, g, cost):
    """The ``method="greedy"`` slot map (``(L, P)``) and its other maps."""
    expert_node, n_nodes = _greedy_layout(mean, P, G, N, g)
    return greedy_placement_kernel(
        counts, expert_node, n_nodes, P, g, GREEDY_ALPHA, GREEDY_SPREAD, *_cost_args(cost)
    )


def _place_for_rule(h, P, G, N, g, cost, rule, n_samples, n_resamples, max_evals, patience,
                    prev):  # fmt: skip
    """``place_experts`` under an engine's dispatch rule (module notes, "Placement for an
    engine's dispatch rule")."""
    n_batches, L, E = h.shape
    counts = np.rint(h).astype(np.int64)
    per = P // g
    gpu_node = np.arange(g) // (g // N)  # the physical nodes (SGLang's same-node rule)
    node_of = gpu_node if G % N == 0 else np.zeros(g, dtype=np.int64)  # where moves stay
    # the engine's own EPLB, on what the engine gives it: the window's total
    version = "vllm" if rule == "vllm" else "sglang"
    try:
        starts = [rebalance_experts(h.sum(axis=0), P, G, N, g, version=version)[0]]
    except InvalidInputError as exc:
        raise InvalidInputError(f"{_FUNC}: EPLB cannot place this layout: {exc}") from exc
    if per <= E:  # the distinct starts: tempo's greedy placement, EPLB without duplicates
        starts.append(_greedy_p2l(counts, h.mean(axis=0), P, G, N, g, cost)[0])
        try:
            starts.append(rebalance_experts(h.mean(axis=0), P, G, N, g, distinct=True)[0])
        except InvalidInputError:
            pass  # a layout without a distinct placement: the others remain
    idx = np.unique(np.linspace(0, n_batches - 1, min(n_samples, n_batches)).round().astype(int))
    out = np.empty((L, P), dtype=np.int64)
    for l in range(L):
        own = counts[idx, l]
        extra = _resample(counts[:, l], n_resamples, l)
        batches = own if extra is None else np.concatenate([own, extra])
        score = _RuleScore(batches, E, g, gpu_node, rule, cost)
        values = [score(score.state(s[l])) for s in starts]
        first = int(np.argmin(values))  # ties: the earlier start, the engine's EPLB first
        best, _ = rule_search(starts[first][l], score, node_of, max_evals, patience)
        # guard: below the engine's EPLB by more than RULE_SWITCH_TAU on the window's own
        # scored batches, or EPLB's map
        check = _RuleScore(own, E, g, gpu_node, rule, cost)
        eplb = starts[0][l]
        better = check(check.state(best)) < check(check.state(eplb)) * (1 - RULE_SWITCH_TAU)
        out[l] = best if better else eplb
    if prev is not None:
        out = preserve_intragpu_slots(out, g, prev)
    l2p, cnt = logical_to_physical(out, E)
    return out, l2p, cnt


def place_experts(
    history,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    cost: CostModel | str | None = None,
    method: str | None = None,
    n_samples: int = 8,
    n_resamples: int = 64,
    max_evals: int | None = None,
    patience: int | None = 50,
    previous=None,
    max_moves: int | None = None,
    move_cost: float | None = None,
    active_ranks=None,
    dispatch: str = "tempo",
):
    """Choose replica counts and GPUs to minimise the expected step of a window under a
    dispatch: tempo's (default), or an engine's own rule (``dispatch=``).

    Without ``previous``: a placement from scratch (module notes). With ``previous``, the
    placement in force: with ``max_moves`` or ``move_cost``, a rebalance that moves few
    replicas (module notes, "Rebalance from the placement in force"); with neither, the
    placement from scratch, its slots arranged so that every expert staying on a GPU keeps
    its old slot there (vLLM's ``preserve_intragpu_slots`` rule).

    With ``dispatch`` naming an engine's rule (module notes, "Placement for an engine's
    dispatch rule"), the placement minimises that rule's modelled step instead
    (``solvers/placement/rules.py``).

    Parameters
    ----------
    history : array_like, shape (n_batches, n_layers, n_experts) or (n_batches, n_experts)
        Recorded routed batches (tokens per expert), the window to place for. Non-negative
        real loads are accepted, as :func:`~straggler.solvers.placement.eplb.rebalance_experts`
        accepts them: the EPLB start and the group-to-node packing use them as given; the
        greedy placement's weights and tempo, which dispatches whole tokens, use them rounded
        to the nearest integer.
    num_replicas, num_groups, num_nodes, num_gpus : int
        As for :func:`~straggler.solvers.placement.eplb.rebalance_experts`.
    cost : CostModel or preset name, optional
        The dispatch cost model; default ``DEFAULT_PLACEMENT_COST`` (DSv3 Table 6).
    method : {"greedy", "local_search", "eplb", "exhaustive"}, optional
        See the module notes. Default: ``"greedy"``, except for a rebalance with a move
        budget (``previous`` with ``max_moves`` or ``move_cost``), whose target stays the
        ``"local_search"`` plan (its figures were measured with it). ``n_samples``,
        ``n_resamples``, ``max_evals`` and ``patience`` apply to the searches, not to
        ``"greedy"``. ``"exhaustive"`` is the exact reference of the searches for
        small layouts (one node, at most ``EXHAUSTIVE_LIMIT`` placements per layer): the
        optimum of the objective they approximate (the mean exact tempo layer bound on the
        window's sampled batches, plus ``move_cost`` per moved replica, within
        ``max_moves``) by enumeration.
    n_samples : int, default 8
        Batches of the window the local search scores on (evenly spaced).
    n_resamples : int, default 64
        Batches resampled from the window the searches also score on (module notes, step
        1); 0: none.
    max_evals : int, optional
        Scored candidate placements per layer, for each search (its budget); default 300 for
        the search from scratch and ``40 + 60 * max_moves`` (``P`` without ``max_moves``) for
        the rebalance from ``previous``.
    patience : int or None, default 50
        The search from scratch also stops after this many scored candidates in a row
        that lower nothing (a work limit, deterministic); ``None``: no such limit.
    previous : array_like of int, shape (n_layers, P), or the three maps, optional
        The placement in force (``physical_to_logical``, or ``(physical_to_logical,
        logical_to_physical, logical_count)``); may hold two replicas of an expert on one
        GPU (upstream EPLB does): the duplicate's slot is refilled, a moved replica.
    max_moves : int, optional
        At most this many replicas moved per layer (needs ``previous``), besides the refills
        of the duplicates ``previous`` may hold (moves that are not a choice).
    move_cost : float, optional
        The price of one moved replica in the units of the makespan (the copy's cost spread
        over the steps it serves); the rebalance minimises the mean makespan plus
        ``move_cost`` times the replicas moved (needs ``previous``; default 0 with
        ``max_moves``).
    active_ranks : array_like of bool, shape (num_gpus,), optional
        Ranks that hold weights (default all; SGLang's ``elasticity_aware`` takes the same
        input; a rank down needs tempo's dispatch). With a rank down, the placement is made
        on the active ranks' slots only, with the global policy (one group, one node), and
        the inactive ranks' slots are ``-1``. Given ``active_ranks``, a ``previous`` may
        hold ``-1`` slots and lose experts with the inactive ranks: it is first restored
        (:func:`~straggler.solvers.placement.rebalance.path.restore_experts` with
        ``fill_empty``: each lost expert into an empty slot or the slot of a spare replica of
        the least load per replica, then the empty slots filled), moves that are not a
        choice, outside ``max_moves``, as the refills of duplicates.
    dispatch : {"tempo", "vllm", "static", "dynamic", "lp"}, default "tempo"
        The dispatch that will use the placement: tempo's, or an engine's own rule
        (vLLM's per-token hash; SGLang's ``--ep-dispatch-algorithm`` static, dynamic or
        lp). With a rule, ``method``, ``max_moves`` and ``move_cost`` do not apply, a GPU
        may hold more slots than there are experts, and ``previous`` only arranges the
        slots (vLLM's ``preserve_intragpu_slots``, ``-1`` slots allowed).

    Returns
    -------
    physical_to_logical : ndarray of int64, shape (n_layers, P)
        Slot ``p`` on GPU ``p // (P / num_gpus)``; a GPU's experts in increasing order
        (with ``previous``: staying experts in their old slots, new ones in the others).
    logical_to_physical : ndarray of int64, shape (n_layers, n_experts, X)
        Slots of each expert in increasing order, ``-1`` padded.
    logical_count : ndarray of int64, shape (n_layers, n_experts)

    Raises
    ------
    InvalidInputError
        Bad shapes or values, a layout EPLB (distinct) cannot place, ``max_moves`` or
        ``move_cost`` without ``previous``, or a ``previous`` of another shape or missing
        an expert.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> hist = rng.poisson([40, 20, 5, 5, 3, 1, 1, 1], size=(6, 1, 8))
    >>> p2l, l2p, cnt = place_experts(hist, 12, 1, 1, 4)
    >>> p2l.shape, int(cnt.sum()), bool((cnt >= 1).all())
    ((1, 12), 12, True)
    >>> all(len(set(p2l[0, 3 * h : 3 * h + 3])) == 3 for h in range(4))  # distinct per GPU
    True
    >>> old = [[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]]  # expert 0 cold here, 1 and 2 not
    >>> new, _, _ = place_experts(hist, 12, 1, 1, 4, previous=old, max_moves=1)
    >>> int(moved_replicas(old, new)[0]) <= 1
    True
    """
    h, P, G, N, g, cost, method, n_samples, n_resamples, max_evals, dispatch = _place_iv(
        history, num_replicas, num_groups, num_nodes, num_gpus, cost, method, n_samples,
        n_resamples, max_evals, dispatch,
    )  # fmt: skip
    n_batches, L, E = h.shape
    if active_ranks is not None:
        act = active_ranks_iv(active_ranks, g, _FUNC)
        if not act.all():
            if dispatch != "tempo":
                raise InvalidOptionError(
                    f"The 'active_ranks' option of {_FUNC} places on the active ranks for "
                    f"tempo's dispatch only. Got {int((~act).sum())} inactive ranks with "
                    f"dispatch={dispatch!r} instead."
                )
            return _place_on_active(
                h, P, g, act, previous, dict(
                    cost=cost, method=method, n_samples=n_samples, n_resamples=n_resamples,
                    max_evals=max_evals, patience=patience, max_moves=max_moves,
                    move_cost=move_cost,
                ),
            )  # fmt: skip
        if previous is not None and dispatch == "tempo":  # all active: empty slots filled first
            previous = _restored(previous, h, P, g, np.arange(P))
    if dispatch != "tempo":
        if max_moves is not None or move_cost is not None:
            name = "max_moves" if max_moves is not None else "move_cost"
            raise InvalidOptionError(
                f"The '{name}' option of {_FUNC} prices moves for tempo's dispatch only. Got "
                f"{name}={max_moves if name == 'max_moves' else move_cost!r} with "
                f"dispatch={dispatch!r} instead."
            )
        prev = None if previous is None else _rule_previous_iv(previous, L, E, P)
        patience = 1 << 62 if patience is None else check_int(patience, "patience", _FUNC, lo=1)
        return _place_for_rule(
            h, P, G, N, g, cost, dispatch, n_samples, n_resamples,
            300 if max_evals is None else max_evals, patience, prev,
        )  # fmt: skip
    prev = None if previous is None else _previous_iv(previous, L, E, P)
    if previous is None and (max_moves is not None or move_cost is not None):
        name, value = (
            ("max_moves", max_moves) if max_moves is not None else ("move_cost", move_cost)
        )
        raise InvalidInputError(
            f"The '{name}' parameter of {_FUNC} counts moves from the placement in force, so "
            f"it needs 'previous'. Got {name}={value!r} and previous=None instead."
        )
    patience = 1 << 62 if patience is None else check_int(patience, "patience", _FUNC, lo=1)
    if max_moves is not None:
        max_moves = check_int(max_moves, "max_moves", _FUNC, lo=0)
    if move_cost is not None:
        move_cost = check_real(move_cost, "move_cost", _FUNC, lo=0.0)
    budgeted = prev is not None and (max_moves is not None or move_cost is not None)
    budget = P if max_moves is None else max_moves
    ls_evals = 300 if max_evals is None else max_evals
    move_evals = 40 + 60 * min(budget, P) if max_evals is None else max_evals
    if method is None:  # the rebalance's figures were measured with the search's target
        method = "local_search" if budgeted else "greedy"
    counts = np.rint(h).astype(np.int64)
    per = P // g
    mean = h.mean(axis=0)
    if method == "greedy":
        p2l, l2p, cnt = _greedy_p2l(counts, mean, P, G, N, g, cost)
        if prev is None:
            return p2l, np.ascontiguousarray(l2p[:, :, : int(cnt.max())]), cnt
        start_p2l = p2l
    else:
        try:
            start_p2l, _, _ = rebalance_experts(mean, P, G, N, g, distinct=True)
        except InvalidInputError as exc:
            raise InvalidInputError(f"{_FUNC}: EPLB cannot place this layout: {exc}") from exc
    node_of = np.arange(g) // (g // N) if G % N == 0 else np.zeros(g, dtype=np.int64)
    if method == "exhaustive":
        n = math.comb(E, per) ** g
        if n > EXHAUSTIVE_LIMIT or node_of.max() > 0:
            raise InvalidInputError(
                f"The 'exhaustive' method of {_FUNC} enumerates at most {EXHAUSTIVE_LIMIT} "
                f"placements per layer on one node. Got {n} placements (C({E}, {per})^{g}) on "
                f"{int(node_of.max()) + 1} nodes instead."
            )
    idx = np.unique(np.linspace(0, n_batches - 1, min(n_samples, n_batches)).round().astype(int))
    masks = np.stack([_mask_from_p2l(start_p2l[l], E, g) for l in range(L)])
    if method == "local_search":
        for l in range(L):
            extra = _resample(counts[:, l], n_resamples, l)
            masks[l] = _hall_search(
                masks[l], counts[idx, l], cost, node_of, ls_evals, patience, extra
            )  # fmt: skip
    if method == "exhaustive":
        price = 0.0 if move_cost is None else move_cost
        for l in range(L):
            old = None if not budgeted else _mask_from_p2l(prev[l], E, g)
            forced = 0 if old is None else per * g - int(old.sum())
            masks[l] = _exhaustive(old, counts[idx, l], cost, E, g, per, forced + budget, price)
        return _maps(masks, per) if prev is None else _maps_keeping(masks, prev, per)
    if prev is None:
        return _maps(masks, per)
    if budgeted:
        price = 0.0 if move_cost is None else move_cost
        for l in range(L):
            old = _mask_from_p2l(prev[l], E, g)
            start = _repair(old, mean[l], node_of, per)  # duplicates' slots refilled
            forced = int((start & ~old).sum())  # on top of the budget
            masks[l] = _budgeted_search(
                old, start, masks[l], counts[idx, l], cost, node_of, forced + budget, price,
                move_evals, _resample(counts[:, l], n_resamples, l),
            )  # fmt: skip
    return _maps_keeping(masks, prev, per)


def placement_kernels() -> dict[str, object]:
    """The Numba kernels :func:`place_experts` and
    :func:`~straggler.solvers.placement.eplb.rebalance_experts` call, by ``module.name``."""
    from . import _eplb_kernels
    from . import _greedy as _placement_greedy
    from . import _kernels as _placement_kernels
    from .rebalance import _path

    out = {}
    for mod, names in (
        (_placement_greedy, ("greedy_placement_kernel",)),
        (_placement_kernels, ("hall_score_kernel", "placement_search_kernel")),
        (_eplb_kernels, ("packing_kernel", "packing_distinct_kernel", "replicate_kernel")),
        (_path, ("even_path_kernel",)),
    ):
        for name in names:
            out[f"{mod.__name__.rsplit('.', 1)[1]}.{name}"] = getattr(mod, name)
    return out


def warm_placement() -> None:
    """Compile (or load from numba's disk cache) every kernel of :func:`placement_kernels`
    with the argument types the public calls pass: a tiny window placed from scratch (the
    greedy placement and the local search) and rebalanced from the placement in force (the
    budgeted search and the rebalance path), and EPLB in each version and distinct.

    Examples
    --------
    >>> warm_placement()
    >>> all(k.signatures for k in placement_kernels().values())
    True
    """
    hist = np.random.default_rng(0).poisson([40, 20, 5, 5, 3, 1, 1, 1], size=(4, 1, 8))
    place_experts(hist, 12, 1, 1, 4)
    p2l = place_experts(hist, 12, 1, 1, 4, method="local_search", n_resamples=4)[0]
    place_experts(hist, 12, 1, 1, 4, n_resamples=4, previous=p2l, max_moves=1)
    target = rebalance_experts(hist.mean(axis=0), 12, 1, 1, 4, distinct=True)[0]
    rebalance_path(hist, p2l, target, 4, CostModel.preset(DEFAULT_PLACEMENT_COST))
    for version in EPLB_VERSIONS:
        rebalance_experts(hist.mean(axis=0), 12, 1, 1, 4, version=version)
    rebalance_experts(hist.mean(axis=0), 12, 2, 2, 4, distinct=True)
