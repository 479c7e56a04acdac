"""The engines' own dispatch rules as expected per-GPU loads, and a placement search for them.

A placement is only as good as the dispatch that uses it. The engines do not run tempo:
each picks a replica per token by a rule of its own. This module states each rule's
*expected* per-GPU load for a batch of per-expert counts on a slot map, and the modelled
step it implies, so that :func:`~straggler.solvers.place_experts` can place for the rule in
force (``dispatch=``). The rules live as baselines (``straggler.baselines.dispatch``:
``vllm_ep``, ``static``, ``dynamic``, ``token_lp``) where they decide token by token; the
layering keeps solvers from importing them, so the load models are written here from the
same upstream code, and ``tests/test_placement_rules.py`` checks them against the
baselines' realised loads.

Tokens come from every GPU (attention data parallelism): each source GPU is modelled as
sending ``n_e / g`` of expert ``e``'s ``n_e`` tokens, a uniform source. Per slot ``p`` of
expert ``e`` (``r`` slots):

* ``"vllm"``: vLLM's hash rule (``eplb_map_to_physical_and_record``, the replica
  ``hash(t) % r`` of the token's local index ``t``): every slot gets ``n_e / r``, and is
  activated (gets at least one token) with probability ``1 - (1 - 1/r)**n_e``, the hash
  taken as uniform. It is not exactly: over a source's ``T`` token positions the residues
  deviate from ``T / r`` each by a few tokens (``d_r(T) = max_i |#{t < T: hash(t) % r =
  i} / T - 1/r|``, e.g. ``T d_3(T) <= 3.4`` for ``T <= 160``; ``0`` for ``r`` 2 or 4 with
  ``T`` a multiple of ``r``), so a replica's expected share is ``n_e / r`` up to ``n_e
  d_r(T)``.
* ``"dynamic"``: SGLang's dynamic rule (``_topk_ids_logical_to_physical_dynamic`` with the
  lists of ``_compute_logical_to_all_physical_map``): a source GPU with a *nearest* replica
  (SGLang's ``_find_nearest_expert``: the only replica; the first on the source's GPU; the
  first on its node when that narrows the set) sends all its tokens there, the others draw
  uniformly over the ``r`` slots. So slot ``p`` gets the fraction ``alpha_p = (k_p + k0 /
  r) / g`` of the tokens (``k_p`` sources whose nearest replica it is, ``k0`` sources
  without one), each token independently: activated with probability ``1 - (1 -
  alpha_p)**n_e``.
* ``"static"``: SGLang's static table (``compute_logical_to_rank_dispatch_physical_map``):
  the same nearest rule, and the ``k0`` sources without one dealt fairly over the ``r``
  slots by SGLang's seeded shuffle, one slot per (source, expert) for all tokens. In
  expectation over the shuffle the same shares as ``"dynamic"``; a slot is activated when
  a source mapped to it has a token of the expert: probability ``1 - (1 - a)**k_p (1 -
  a / r)**k0`` with ``a = 1 - (1 - 1/g)**n_e`` (a source has a token).
* ``"lp"``: SGLang's ``lp`` (the token LP ``min max_g N_g`` per batch over the replicas,
  tokens then sampled from its masses): the per-GPU tokens of an optimal integral dispatch
  (``token_lp_kernel`` of ``solvers/dispatch/_token_lp_fast.py``, whose maximum is
  ``ceil(lambda*)``). SGLang solves the LP by five iterations of a barrier method
  (``sglang/kernels/ops/lplb/torch_solver.py``): its solution is interior, every replica
  of an expert gets part of the mass, so every slot is taken as activated as under an
  even split, with probability ``1 - (1 - 1/r)**n_e`` (not only where an optimal vertex,
  which uses few replicas, puts tokens).

The modelled step of a layer is ``max_h t_h`` with ``t_h`` the cost model at the GPU's
expected activated replicas ``G_h`` and tokens ``N_h`` (``T_h = G_h + sum_p max(0,
ceil(share_p / tile) - 1)`` tiles). Two slots of one expert on one GPU are two replicas
(the engines run each slot's weights), as vLLM and SGLang count them.
"""

from __future__ import annotations

import numpy as np

from ...formulations.cost import CostModel
from ...formulations.errors import param_error
from ...formulations.validation import check_array, check_choice, check_int, check_type
from ..dispatch._token_lp_fast import token_lp_kernel

__all__ = ["DISPATCH_RULES", "ENGINE_DISPATCH_RULES", "rule_loads", "rule_step_times"]

#: ``dispatch=`` values of :func:`~straggler.solvers.place_experts` (default first).
DISPATCH_RULES = ("tempo", "vllm", "static", "dynamic", "lp")
#: The engines' rules this module models.
ENGINE_DISPATCH_RULES = DISPATCH_RULES[1:]


def _nearest(slots, slot_gpu, gpu_node, source):
    """SGLang's ``_find_nearest_expert`` for one source GPU (``-1``: none)."""
    if len(slots) == 1:
        return slots[0]
    for p in slots:
        if slot_gpu[p] == source:
            return p
    near = [p for p in slots if gpu_node[slot_gpu[p]] == gpu_node[source]]
    if 0 < len(near) < len(slots):
        return near[0]
    return -1


class _Coefficients:
    """Per-slot coefficients of one layer's slot map under a rule (module notes): the
    expert of each slot, its slots ``r``, the token fraction ``alpha``, and for
    ``"static"`` the sources ``k`` mapped to it and ``k0`` of its expert dealt fairly."""

    def __init__(self, p2l, n_experts, n_gpus, gpu_node, rule):
        self.p2l = np.asarray(p2l, dtype=np.int64)
        P = self.p2l.size
        self.g, self.per, self.rule = n_gpus, P // n_gpus, rule
        self.slot_gpu = np.arange(P) // self.per
        self.gpu_node = gpu_node
        self.r = np.zeros(P)
        self.alpha = np.zeros(P)
        self.k = np.zeros(P)
        self.k0 = np.zeros(P)
        self.slots = [[] for _ in range(n_experts)]
        for p, e in enumerate(self.p2l):
            self.slots[e].append(p)
        for e in range(n_experts):
            self._expert(e)

    def _expert(self, e):
        slots = self.slots[e]
        r = len(slots)
        if r == 0:
            return
        self.r[slots] = r
        if self.rule == "vllm":
            self.alpha[slots] = 1.0 / r
            return
        k = dict.fromkeys(slots, 0)
        k0 = 0
        for s in range(self.g):
            p = _nearest(slots, self.slot_gpu, self.gpu_node, s)
            if p < 0:
                k0 += 1
            else:
                k[p] += 1
        for p in slots:
            self.k[p] = k[p]
            self.alpha[p] = (k[p] + k0 / r) / self.g
        self.k0[slots] = k0

    def changed(self, p2l, experts):
        """A copy for ``p2l``, which differs from this map in the slots of ``experts``."""
        out = object.__new__(_Coefficients)
        out.__dict__.update(self.__dict__)
        out.p2l = p2l
        out.r, out.alpha, out.k, out.k0 = (a.copy() for a in (self.r, self.alpha, self.k, self.k0))
        out.slots = list(self.slots)
        for e in experts:
            out.slots[e] = [int(p) for p in np.flatnonzero(p2l == e)]
        for e in experts:
            out._expert(e)
        return out


def _slot_model(counts, co):
    """Expected tokens and activation of every slot, ``(B, P)`` each."""
    n = counts[:, co.p2l]
    share = n * co.alpha
    if co.rule == "static":
        a = 1.0 - (1.0 - 1.0 / co.g) ** n
        act = 1.0 - (1.0 - a) ** co.k * (1.0 - a / np.maximum(co.r, 1)) ** co.k0
    else:
        act = 1.0 - (1.0 - co.alpha) ** n
    return share, act


def _lp_gpu_model(counts, p2l, n_experts, n_gpus, tile):
    """``(tokens, activated, tiles)`` per batch and GPU under SGLang's ``lp``, ``(B, g)``
    each (module notes)."""
    per = p2l.size // n_gpus
    slot_gpu = np.arange(p2l.size) // per
    mask = np.zeros((n_experts, n_gpus), dtype=bool)
    mask[p2l, slot_gpu] = True
    mask = np.ascontiguousarray(mask)
    r = np.bincount(p2l, minlength=n_experts)[p2l]
    B = counts.shape[0]
    tokens = np.zeros((B, n_gpus))
    tiles = np.zeros((B, n_gpus))
    ints = np.rint(counts).astype(np.int64)
    n = ints[:, p2l]
    act = (1.0 - (1.0 - 1.0 / r) ** n).reshape(B, n_gpus, per).sum(axis=2)
    for b in range(B):
        x, _, _ = token_lp_kernel(np.ascontiguousarray(ints[b]), mask)
        tokens[b] = x.sum(axis=0)
        tiles[b] = act[b] + np.maximum(np.ceil(x / tile) - 1, 0).sum(axis=0)
    return tokens, act, tiles


def _gpu_model(counts, co, cost):
    """``(tokens, activated, tiles)`` per batch and GPU, ``(B, g)`` each."""
    share, act = _slot_model(counts, co)
    B = counts.shape[0]
    extra = np.maximum(np.ceil(share / cost.tile) - 1, 0)
    shape = (B, co.g, co.per)
    G = act.reshape(shape).sum(axis=2)
    return share.reshape(shape).sum(axis=2), G, G + extra.reshape(shape).sum(axis=2)


class _RuleScore:
    """Mean over batches of the modelled step (``max_h t_h``) of a slot map under a rule."""

    def __init__(self, counts, n_experts, n_gpus, gpu_node, rule, cost):
        self.counts = np.ascontiguousarray(counts, dtype=np.float64)
        self.E, self.g, self.gpu_node, self.rule, self.cost = (
            n_experts, n_gpus, gpu_node, rule, cost,
        )  # fmt: skip

    def state(self, p2l):
        if self.rule == "lp":
            return np.asarray(p2l, dtype=np.int64)
        return _Coefficients(p2l, self.E, self.g, self.gpu_node, self.rule)

    def changed(self, st, p2l, experts):
        return p2l if self.rule == "lp" else st.changed(p2l, experts)

    def gpu_times(self, st):
        if self.rule == "lp":
            N, G, T = _lp_gpu_model(self.counts, st, self.E, self.g, self.cost.tile)
        else:
            N, G, T = _gpu_model(self.counts, st, self.cost)
        return self.cost.time(G, N, T)

    def __call__(self, st) -> float:
        return float(self.gpu_times(st).max(axis=1).mean())


def _rule_loads_iv(counts, physical_to_logical, n_gpus, rule, n_nodes, func):
    rule = check_choice(rule, "rule", func, ENGINE_DISPATCH_RULES)
    p2l = check_array(physical_to_logical, "physical_to_logical", func, kind="int", ndim=1, lo=0)
    n_gpus = check_int(n_gpus, "n_gpus", func, lo=1)
    if p2l.size == 0 or p2l.size % n_gpus:
        raise param_error(
            "physical_to_logical", func, f"a non-empty slot map of a multiple of n_gpus={n_gpus} "
            "slots", f"{p2l.size} slots",
        )  # fmt: skip
    c = check_array(counts, "counts", func, kind="real", ndim=(1, 2), lo=0)
    E = c.shape[-1]
    if p2l.max() >= E:
        raise param_error(
            "physical_to_logical", func, f"expert ids below n_experts={E}", f"id {p2l.max()}"
        )
    live = (c.reshape(-1, E) > 0).any(axis=0)
    missing = np.setdiff1d(np.flatnonzero(live), p2l)
    if missing.size:
        raise param_error(
            "physical_to_logical", func, "a slot for every expert with tokens",
            f"no slot for expert {int(missing[0])}",
        )  # fmt: skip
    n_nodes = check_int(n_nodes, "n_nodes", func, lo=1)
    if n_gpus % n_nodes:
        raise param_error("n_nodes", func, f"a divisor of n_gpus={n_gpus}", repr(n_nodes))
    return c, p2l, n_gpus, rule, np.arange(n_gpus) // (n_gpus // n_nodes)


def rule_loads(counts, physical_to_logical, n_gpus: int, rule: str, *, n_nodes: int = 1):
    """Expected per-GPU tokens and activated replicas of an engine's dispatch rule.

    Parameters
    ----------
    counts : array_like, shape (n_experts,) or (n_batches, n_experts)
        Tokens per expert of each batch (non-negative).
    physical_to_logical : array_like of int, shape (P,)
        One layer's slot map (slot ``p`` on GPU ``p // (P / n_gpus)``).
    n_gpus : int
    rule : {"vllm", "static", "dynamic", "lp"}
        See the module notes.
    n_nodes : int, default 1
        Nodes of ``n_gpus / n_nodes`` consecutive GPUs (SGLang's same-node preference).

    Returns
    -------
    tokens, activated : ndarray of float64, shape (n_gpus,) or (n_batches, n_gpus)

    Examples
    --------
    One hot expert on GPUs 0 and 1, two cold ones on GPUs 0 and 1, four GPUs' tokens:

    >>> tokens, act = rule_loads([80, 8, 8], [0, 1, 0, 2], 2, "vllm")
    >>> tokens.tolist()
    [48.0, 48.0]
    >>> tokens, act = rule_loads([80, 8, 8], [0, 1, 0, 2], 2, "static")
    >>> tokens.tolist()  # each GPU keeps its own half of expert 0's tokens
    [48.0, 48.0]
    """
    c, p2l, g, rule, node = _rule_loads_iv(
        counts, physical_to_logical, n_gpus, rule, n_nodes, "rule_loads"
    )
    two = c.reshape(-1, c.shape[-1])
    if rule == "lp":
        N, G, _ = _lp_gpu_model(two, p2l, two.shape[1], g, 128)
    else:
        co = _Coefficients(p2l, two.shape[1], g, node, rule)
        N, G, _ = _gpu_model(two, co, CostModel(a=0, b=0, c=0, beta=0))
    return (N, G) if c.ndim == 2 else (N[0], G[0])


def rule_step_times(counts, physical_to_logical, n_gpus: int, rule: str, cost, *,
                    n_nodes: int = 1):  # fmt: skip
    """The modelled MoE layer time ``max_h t_h`` under an engine's rule (module notes).

    Parameters
    ----------
    counts, physical_to_logical, n_gpus, rule, n_nodes
        As for :func:`rule_loads`.
    cost : CostModel or preset name

    Returns
    -------
    float or ndarray of float64, shape (n_batches,)

    Examples
    --------
    >>> cost = CostModel(a=0, b=15, c=0, beta=0.1)
    >>> round(float(rule_step_times([80, 8, 8], [0, 1, 0, 2], 2, "vllm", cost)), 3)
    30.0
    """
    func = "rule_step_times"
    c, p2l, g, rule, node = _rule_loads_iv(counts, physical_to_logical, n_gpus, rule, n_nodes, func)
    if isinstance(cost, str):
        cost = CostModel.preset(cost)
    check_type(cost, "cost", func, CostModel, "a CostModel or a preset name")
    two = c.reshape(-1, c.shape[-1])
    score = _RuleScore(two, two.shape[1], g, node, rule, cost)
    t = score.gpu_times(score.state(p2l)).max(axis=1)
    return t if c.ndim == 2 else float(t[0])


def _moves(p2l, score, st, node_of, per):
    """Candidate moves of the rule search, in trial order (see :func:`rule_search`): each
    ``(slots, experts, changed)`` puts ``experts`` into ``slots``; ``changed`` lists the
    experts whose slots change."""
    times = score.gpu_times(st)  # (B, g)
    heat = times.mean(axis=0)
    hot = np.argsort(-heat, kind="stable")
    g = heat.size
    gpu_sets = [set(p2l[h * per : (h + 1) * per].tolist()) for h in range(g)]
    count = np.bincount(p2l, minlength=score.E)
    c = score.counts
    per_replica_peak = c.max(axis=0) / np.maximum(count, 1)
    per_replica_mean = c.mean(axis=0) / np.maximum(count, 1)
    out = []
    # replica moves: a hot expert of the hottest GPUs gains a slot, taken on a cool GPU
    # from an expert with another replica and the least tokens per replica
    receivers = []
    for h in hot[:2]:
        for e in sorted(gpu_sets[h], key=lambda e: -per_replica_peak[e]):
            if e not in receivers:
                receivers.append(e)
    donors = sorted((p for p in range(p2l.size) if count[p2l[p]] >= 2),
                    key=lambda p: (per_replica_mean[p2l[p]], -heat[p // per], p))  # fmt: skip
    for u in receivers[:6]:
        k = 0
        for p in donors:
            h = p // per
            same_node = node_of.max() == 0 or any(node_of[q // per] == node_of[h]
                                                 for q in np.flatnonzero(p2l == u))  # fmt: skip
            if u not in gpu_sets[h] and p2l[p] != u and same_node:
                out.append(([p], [u], [int(p2l[p]), int(u)]))
                k += 1
                if k == 6:
                    break
    # swaps: a slot of a hot GPU with a slot of a cool GPU of the same node
    for h in hot[:2]:
        mine = sorted(range(h * per, (h + 1) * per), key=lambda p: -per_replica_mean[p2l[p]])
        for h2 in hot[::-1][:3]:
            if h2 == h or node_of[h2] != node_of[h]:
                continue
            theirs = sorted(range(h2 * per, (h2 + 1) * per),
                            key=lambda q: per_replica_mean[p2l[q]])  # fmt: skip
            for p in mine:
                for q in theirs:
                    a, b = int(p2l[p]), int(p2l[q])
                    if a != b and a not in gpu_sets[h2] and b not in gpu_sets[h]:
                        out.append(([p, q], [b, a], [a, b]))
    return out


def rule_search(start, score, node_of, max_evals: int, patience: int):
    """First-improvement search for a slot map of lower modelled step under ``score``'s rule.

    Moves keep ``P / g`` slots per GPU and never put a second replica of an expert on a GPU
    (duplicates the start holds may stay); with several nodes (``node_of``) they stay
    inside a node. Candidates, in trial order: *replica moves* (an expert of the two GPUs
    with the highest mean modelled time, most peak tokens per replica first, takes a slot
    of an expert with another replica, least mean tokens per replica first, on a GPU
    without it) and *swaps* (a slot of one of the two hottest GPUs, most tokens per
    replica first, with a slot of one of the three coolest, least first). The first
    candidate that lowers the mean modelled step is applied and the candidates are
    generated again; it stops when none does, after ``patience`` candidates in a row that
    lower nothing, or after ``max_evals`` candidates scored. Deterministic.

    Returns
    -------
    p2l : ndarray of int64, shape (P,)
    value : float
        Its mean modelled step.
    """
    per = start.size // score.g
    cur = np.array(start, dtype=np.int64)
    st = score.state(cur)
    value = score(st)
    evals = since = 0
    while evals < max_evals and since < patience:
        improved = False
        for slots, experts, changed in _moves(cur, score, st, node_of, per):
            if evals >= max_evals or since >= patience:
                break
            trial = cur.copy()
            trial[slots] = experts
            tst = score.changed(st, trial, changed)
            v = score(tst)
            evals += 1
            if v < value * (1 - 1e-12):
                cur, st, value, since, improved = trial, tst, v, 0, True
                break
            since += 1
        if not improved:
            break
    return cur, value
