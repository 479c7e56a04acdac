"""The restricted-replication conjecture of TEMPO (Appendix A.4, Remark), tested.

Conjecture: under restricted replicas, the "fewest-experts replica, token tie-break"
variant of A3 (:func:`~straggler.solvers.dispatch.round_robin.round_robin_shares`) satisfies
``M(A3') <= OPT + delta`` with ``delta`` the additive term of Theorem 2
(:func:`~straggler.solvers.dispatch.round_robin.a3_bound`). This module measures the excess
``M(A3') - OPT - delta`` against an exact optimum and searches for counterexamples
(random search here; ``benchmarks/conjecture_search.py`` adds hypothesis ``target()``).

It also holds the exact oracles used by the proofs' tests: :func:`exact_optimum` (the MILP at
``mip_rel_gap = 0``) and :func:`support_optimum`, an independent enumeration for ``b2 = 0``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem, evaluate
from ..formulations.errors import param_error
from ..formulations.results import Status
from ..formulations.validation import check_int, check_type
from ..solvers.dispatch.round_robin import a3_bound, round_robin_shares
from ..solvers.dispatch.solve import solve_dispatch

__all__ = [
    "exact_optimum",
    "support_optimum",
    "ConjectureCheck",
    "check_conjecture",
    "random_restricted_instance",
    "random_search",
    "targeted_search",
    "COUNTEREXAMPLE",
]


def exact_optimum(problem: DispatchProblem, cost: CostModel, *, time_limit: float = 60.0) -> float:
    """The proven optimal makespan of one layer (MILP, ``mip_rel_gap = 0``).

    Raises ``RuntimeError`` when the MILP does not prove optimality within ``time_limit``.
    """
    # solve_dispatch validates problem, cost and time_limit
    res = solve_dispatch(problem, cost, method="milp", mip_rel_gap=0.0, time_limit=time_limit)
    if res.status is not Status.OPTIMAL:
        raise RuntimeError(f"MILP did not prove optimality: {res.status}")
    return float(res.makespan)


def support_optimum(problem: DispatchProblem, cost: CostModel, *, max_supports: int = 20_000):
    """Exact optimum for ``b2 = 0`` by enumerating activation supports (no LP solver).

    For a support (a non-empty replica subset ``S_e`` per live expert), the floor
    ``a + b*max_g |{e : g in S_e}|`` is fixed, and the least possible ``max_g N_g`` with
    shares on the support is the token-LP value ``max_Y N(E(Y))/|Y|`` over GPU sets ``Y``
    (``E(Y)``: live experts with ``S_e`` inside ``Y``; max-flow/min-cut duality). Shares
    that end at zero only lower the floor, which another support accounts for, so the least
    ``max(floor, c + beta*v, c2 + gamma*v)`` over supports is the optimum.

    Examples
    --------
    >>> p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    >>> support_optimum(p, CostModel(a=0, b=15, c=0, beta=0.1))
    60.0
    """
    func = "support_optimum"
    check_type(problem, "problem", func, DispatchProblem, "a single-layer DispatchProblem")
    check_type(cost, "cost", func, CostModel, "a CostModel")
    max_supports = check_int(max_supports, "max_supports", func, lo=1)
    if problem.is_stack:
        raise param_error(
            "problem", func, "a single-layer DispatchProblem", f"a stack of {problem.n_layers}"
        )
    if cost.b2 > 0:
        raise param_error(
            "cost", func, "a cost model with b2 = 0 (no tile staircase)", f"b2={cost.b2}"
        )
    n = problem.counts
    rep = problem.replicas
    g = problem.n_gpus
    live = [int(e) for e in np.flatnonzero(n > 0)]
    if not live:
        return float(max(cost.a, cost.c, cost.c2 or 0.0))
    options = []
    total = 1
    for e in live:
        gpus = [int(h) for h in np.flatnonzero(rep[e])]
        subs = [
            frozenset(s) for r in range(1, len(gpus) + 1) for s in itertools.combinations(gpus, r)
        ]
        options.append(subs)
        total *= len(subs)
    if total > max_supports:
        raise param_error(
            "problem", func, f"small enough for max_supports={max_supports}", f"{total} supports"
        )
    gpu_sets = [frozenset(s) for r in range(1, g + 1) for s in itertools.combinations(range(g), r)]
    best = np.inf
    for choice in itertools.product(*options):
        load = [0] * g
        for s in choice:
            for h in s:
                load[h] += 1
        v = max(sum(int(n[e]) for e, s in zip(live, choice) if s <= y) / len(y) for y in gpu_sets)
        t = max(cost.a + cost.b * max(load), cost.c + cost.beta * v)
        if cost.has_traffic:
            t = max(t, cost.c2 + cost.gamma * v)
        best = min(best, t)
    return float(best)


@dataclass(frozen=True)
class ConjectureCheck:
    """One instance scored against the conjecture."""

    makespan: float
    """``M(A3')`` of the fewest-experts variant."""
    opt: float
    """The exact optimum."""
    term: float
    """The additive term ``delta`` (:func:`a3_bound`)."""

    @property
    def excess(self) -> float:
        """``M(A3') - OPT - delta`` (positive: a counterexample)."""
        return self.makespan - self.opt - self.term

    @property
    def ratio(self) -> float:
        """``M(A3') / (OPT + delta)`` (above 1: a counterexample)."""
        den = self.opt + self.term
        return self.makespan / den if den > 0 else (0.0 if self.makespan == 0 else np.inf)

    @property
    def violated(self) -> bool:
        """True when the excess is positive beyond floating-point noise."""
        return self.excess > 1e-7 * max(1.0, self.opt + self.term)


def check_conjecture(
    problem: DispatchProblem,
    cost: CostModel,
    *,
    opt: float | None = None,
    rule: str = "fewest",
    time_limit: float = 60.0,
):
    """Score the fewest-experts variant on one layer against ``OPT + delta``.

    ``rule="a3"`` scores A3 instead (full replication only: Theorem 2, the control).
    Raises ``RuntimeError`` when the MILP does not prove the optimum within ``time_limit``.

    Examples
    --------
    The counterexample found by the search (:data:`COUNTEREXAMPLE`):

    >>> chk = check_conjecture(**COUNTEREXAMPLE)
    >>> chk.makespan, chk.opt, chk.term, chk.violated
    (6.0, 4.0, 1.0, True)
    """
    shares = round_robin_shares(problem.counts, problem.replicas, rule=rule)
    m = float(evaluate(problem, cost, shares).makespan)
    if opt is None:
        opt = exact_optimum(problem, cost, time_limit=time_limit)
    return ConjectureCheck(makespan=m, opt=float(opt), term=a3_bound(problem, cost))


def random_restricted_instance(
    rng: np.random.Generator,
    *,
    max_experts: int = 10,
    max_gpus: int = 4,
    max_tokens: int = 64,
    balanced_slots: bool = False,
    full: bool = False,
):
    """A random restricted-replica instance and cost model (``full``: all-ones mask).

    ``balanced_slots=True`` mimics EPLB placements: every GPU holds the same number of
    replica slots, each expert has one or two replicas on distinct GPUs.
    """
    g = int(rng.integers(2, max_gpus + 1))
    if balanced_slots:
        per = int(rng.integers(2, max(3, max_experts // g + 2)))
        slots = per * g
        E = int(rng.integers(max(1, slots // 2), slots + 1))
        E = min(E, slots)
        owners = np.concatenate([np.arange(E), rng.integers(0, E, slots - E)])
        rng.shuffle(owners)
        rep = np.zeros((E, g), bool)
        for p, e in enumerate(owners):
            rep[e, p // per] = True
    else:
        E = int(rng.integers(2, max_experts + 1))
        rep = rng.random((E, g)) < rng.uniform(0.2, 0.8)
        rep[np.arange(E), rng.integers(0, g, E)] = True
    if full:
        rep = np.ones_like(rep)
    skew = rng.uniform(0, 2)
    w = rng.permutation(np.arange(1, E + 1, dtype=float) ** -skew)
    counts = rng.multinomial(int(rng.integers(E, max_tokens * E // 2 + E + 1)), w / w.sum())
    cost = CostModel(
        a=float(rng.choice([0.0, 5.0])),
        b=float(rng.choice([1.0, 4.0, 15.0])),
        c=float(rng.choice([0.0, 3.0])),
        beta=float(rng.choice([0.0, 0.05, 0.1, 0.5])),
        **(dict(c2=25.0, gamma=float(rng.choice([0.1, 1.0]))) if rng.random() < 0.3 else {}),
    )
    return DispatchProblem(counts=counts, replicas=rep), cost


def random_search(
    n: int,
    *,
    seed: int = 0,
    balanced_slots: bool = False,
    rule: str = "fewest",
    milp_time_limit: float = 5.0,
    **kw,
) -> dict:
    """Score ``n`` random instances; return the worst ratio (over ``delta > 0``), the largest
    excess, the number of violations and the first counterexample."""
    rng = np.random.default_rng(seed)
    worst = None
    first = None
    n_viol = 0
    unproved = 0
    max_excess = -np.inf
    for _ in range(n):
        p, cost = random_restricted_instance(rng, balanced_slots=balanced_slots, **kw)
        try:
            chk = check_conjecture(p, cost, rule=rule, time_limit=milp_time_limit)
        except RuntimeError:
            unproved += 1
            continue
        max_excess = max(max_excess, chk.excess)
        if chk.term > 0 and (worst is None or chk.ratio > worst[0].ratio):
            worst = (chk, p, cost)
        if chk.violated:
            n_viol += 1
            if first is None:
                first = (chk, p, cost)
    return {
        "n": n - unproved,
        "unproved": unproved,
        "violations": n_viol,
        "max_excess": max_excess,
        "worst": worst,
        "first_counterexample": first,
    }


def targeted_search(
    max_examples: int,
    *,
    seed: int = 0,
    slot_balanced: bool = False,
    full: bool = False,
    rule: str = "fewest",
    shrink: bool = True,
    max_experts: int = 8,
    max_gpus: int = 3,
    milp_time_limit: float = 5.0,
) -> dict:
    """Hypothesis search steered by ``target(excess)`` toward a counterexample.

    Phase 1 explores without failing and records the worst ratio ``M(A3')/(OPT + delta)``
    over instances with ``delta > 0`` (with ``delta = 0`` the ratio is 1 whenever the rule is
    optimal, which says nothing).
    Phase 2 (``shrink``) asserts the conjecture, so hypothesis shrinks the first violation it
    finds to a minimal one. Instances whose optimum the MILP does not prove within
    ``milp_time_limit`` are rejected (counted in ``"unproved"``).

    Returns a dict: ``"worst"`` ``(check, problem, cost)`` of the largest ratio,
    ``"examples"``, ``"violations"`` (phase 1), ``"unproved"``, ``"max_excess"`` (largest
    ``M - OPT - delta``) and ``"counterexample"`` ``(check, problem, cost)`` or None (the
    shrunk one when phase 2 finds one, else the first of phase 1).
    """
    from hypothesis import HealthCheck, assume, given, settings, target
    from hypothesis import seed as hseed

    from .strategies import dispatch_instances

    strategy = dispatch_instances(
        min_gpus=2,
        max_experts=max_experts,
        max_gpus=max_gpus,
        full=full,
        slot_balanced=slot_balanced,
    )
    state: dict = {
        "worst": None,
        "examples": 0,
        "violations": 0,
        "unproved": 0,
        "max_excess": -np.inf,
        "counterexample": None,
    }
    opts = dict(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )

    @hseed(seed)
    @settings(**opts)
    @given(strategy)
    def explore(inst):
        p, cost = inst
        try:
            chk = check_conjecture(p, cost, rule=rule, time_limit=milp_time_limit)
        except RuntimeError:
            state["unproved"] += 1
            assume(False)
        state["examples"] += 1
        state["max_excess"] = max(state["max_excess"], chk.excess)
        target(chk.excess, label="M(A3') - OPT - delta")
        if chk.term > 0 and (state["worst"] is None or chk.ratio > state["worst"][0].ratio):
            state["worst"] = (chk, p, cost)
        if chk.violated:
            state["violations"] += 1
            if state["counterexample"] is None:
                state["counterexample"] = (chk, p, cost)

    explore()
    if shrink:
        last: dict = {}

        @hseed(seed + 1)
        @settings(**opts)
        @given(strategy)
        def falsify(inst):
            p, cost = inst
            try:
                chk = check_conjecture(p, cost, rule=rule, time_limit=milp_time_limit)
            except RuntimeError:
                assume(False)
            target(chk.excess, label="M(A3') - OPT - delta")
            if chk.violated:
                last["found"] = (chk, p, cost)
            assert not chk.violated

        try:
            falsify()
        except AssertionError:
            # hypothesis replays the shrunk failing example last
            state["counterexample"] = last.get("found", state["counterexample"])
    return state


#: A minimal counterexample to the conjecture (pure activation cost, two GPUs): four
#: flexible experts of 10 tokens alternate between the GPUs, then four single-replica
#: experts of 1 token all land on GPU 0, which ends with 6 experts; the optimum puts the
#: flexible experts on GPU 1 (4 and 4). ``M = 6 > OPT + b = 5``.
COUNTEREXAMPLE = dict(
    problem=DispatchProblem(
        counts=[10, 10, 10, 10, 1, 1, 1, 1],
        replicas=[[1, 1]] * 4 + [[1, 0]] * 4,
    ),
    cost=CostModel(a=0, b=1, c=0, beta=0),
)
