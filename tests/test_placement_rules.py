"""Placement for an engine's own dispatch rule (``place_experts(dispatch=...)``).

The rules' expected per-GPU loads (``straggler.solvers.placement.rules``) against the
baselines that realise the same rules token by token (``straggler.baselines.dispatch``:
``vllm_ep``, ``sglang_dynamic``, ``static``, ``sglang_lp``), within their sampling error;
the placement never above the engine's EPLB on the window it was placed from; the options.
"""

import numpy as np
import pytest
from straggler.formulations import CostModel, DispatchProblem, InvalidInputError
from straggler.formulations.errors import InvalidOptionError
from straggler.solvers import place_experts, solve_dispatch
from straggler.solvers.placement.eplb import preserve_intragpu_slots, rebalance_experts
from straggler.solvers.placement.rules import (
    DISPATCH_RULES,
    ENGINE_DISPATCH_RULES,
    rule_loads,
    rule_step_times,
)

COST = CostModel.preset("dsv3_a_offline")
E, G_GPUS, P = 12, 4, 20


def _distinct_p2l(seed):
    """A slot map with every expert and no expert twice on a GPU (the baselines' masks
    merge duplicates, so agreement is checked without them)."""
    rng = np.random.default_rng(seed)
    per = P // G_GPUS
    while True:
        extra = rng.choice(E, P - E, replace=False)
        slots = rng.permutation(np.concatenate([np.arange(E), extra]))
        if all(len(set(slots[h * per : (h + 1) * per])) == per for h in range(G_GPUS)):
            return slots


def _hash_bias(counts, p2l):
    """The model's stated error for vLLM's hash, per GPU: the hash's replica indices over a
    source's ``T`` local token positions deviate from uniform by ``d_r(T) = max_i
    |#{t < T: hash(t) % r = i} / T - 1/r|``, so a replica's expected share is ``n / r`` up
    to ``n * d_r(T)`` (the layout's block sizes ``T``)."""
    from straggler.baselines.dispatch.tokens import layout_top_k
    from straggler.baselines.dispatch.vllm_ep import KNUTH_MULTIPLIER

    T = -(-int(counts.sum()) // layout_top_k(counts, 8))
    sizes = np.bincount(np.arange(T) * G_GPUS // T, minlength=G_GPUS)
    per = P // G_GPUS
    out = np.zeros(G_GPUS)
    for p, e in enumerate(p2l):
        r = int((p2l == e).sum())
        d = 0.0
        for size in sizes:
            res = ((np.arange(size) * KNUTH_MULTIPLIER) & 0xFFFFFFFF) % r
            d = max(d, np.abs(np.bincount(res, minlength=r) / size - 1 / r).max())
        out[p // per] += counts[e] * d
    return out


def _realised(method, counts, p2l, draw, **opts):
    problem = DispatchProblem.from_placement(counts, p2l, n_gpus=G_GPUS)
    res = solve_dispatch(problem, COST, method=method, rng=draw, **opts)
    x = res.shares
    return x.sum(axis=0), (x > 0).sum(axis=0)


@pytest.mark.parametrize(
    "rule, method, opts",
    [
        ("vllm", "vllm_ep", {}),
        ("dynamic", "sglang_dynamic", {}),
        ("static", "static", {}),
        ("lp", "sglang_lp", {}),
    ],
)
def test_model_agrees_with_the_baselines_realised_loads(rule, method, opts):
    """The model is the expectation of the realised per-GPU tokens and activated replicas:
    their mean over draws (token orders, and SGLang's table seed for static; the hash,
    the random draw and the LP's sampling otherwise) is within 4.5 standard errors."""
    rng = np.random.default_rng(7)
    for case in range(4):
        p2l = _distinct_p2l(case)
        counts = rng.integers(0, 300, size=E) * (rng.random(E) < 0.8)
        want_n, want_g = rule_loads(counts, p2l, G_GPUS, rule)
        draws = []
        for s in range(60):
            o = dict(opts)
            if method != "sglang_lp":
                o["layout_seed"] = s
            if method == "static":
                o["seed"] = 1000 + s
            draws.append(_realised(method, counts, p2l, s, **o))
        n = np.array([d[0] for d in draws])
        g = np.array([d[1] for d in draws])
        for name, got, want in (("tokens", n, want_n), ("activated", g, want_g)):
            se = got.std(axis=0, ddof=1) / np.sqrt(len(got)) + 1e-9
            if rule == "lp" and name == "tokens":
                # optimal LP dispatches differ per GPU (ours vs HiGHS's); their maximum,
                # the LP value, is the same: ours is the integral ceil(lambda*)
                lp = solve_dispatch(
                    DispatchProblem.from_placement(counts, p2l, n_gpus=G_GPUS), COST,
                    method="sglang_lp", rng=0,
                ).extras["lp_max_tokens"]  # fmt: skip
                assert want.max() == np.ceil(lp - 1e-9), case
                assert abs(got.mean(axis=0).max() - lp) <= 4.5 * se.max() + 1e-9, case
                continue
            if rule == "lp":
                continue  # the interior solution's activation: checked in its own test
            dev = np.abs(got.mean(axis=0) - want)
            bias = _hash_bias(counts, p2l) if rule == "vllm" and name == "tokens" else 0.0
            assert (dev <= 4.5 * se + bias + 0.01).all(), (case, name, got.mean(axis=0), want)


def test_lp_activation_is_the_interior_solutions():
    """SGLang's LP solution is interior (a 5-iteration barrier method): every replica gets
    part of an expert's mass, so the model activates every slot as the even split does;
    an optimal vertex (the baseline's HiGHS solution, sampled) activates no more replicas in
    all (``1 - (1 - p)**n`` is concave: the even split maximises their sum)."""
    counts = np.array([50, 3, 0, 7, 20, 1, 9, 2, 4, 30, 5, 6])
    p2l = _distinct_p2l(3)
    _, want = rule_loads(counts, p2l, G_GPUS, "lp")
    np.testing.assert_allclose(want, rule_loads(counts, p2l, G_GPUS, "vllm")[1])
    vertex = np.mean([_realised("sglang_lp", counts, p2l, s)[1] for s in range(200)], axis=0)
    assert vertex.sum() <= want.sum() + 0.05


def test_hand_checked_loads():
    # expert 0 (80 tokens) on GPUs 0 and 1, expert 1 on 0, expert 2 on 1; two GPUs
    tokens, act = rule_loads([80, 8, 8], [0, 1, 0, 2], 2, "vllm")
    assert tokens.tolist() == [48.0, 48.0] and act.tolist() == [2.0, 2.0]
    # static: one expert, replicas on GPUs 0 and 1 of four: GPUs 2, 3 dealt one each
    tokens, _ = rule_loads([40, 0], [0, 0, 1, 1], 4, "static")
    assert tokens.tolist() == [20.0, 20.0, 0.0, 0.0]
    # same node first (SGLang's _find_nearest_expert): two nodes of two GPUs, replicas of
    # expert 0 on GPUs 0 and 2: every source has a nearest replica on its node
    tokens, _ = rule_loads([40, 0, 0, 0], [0, 1, 2, 3, 0, 1, 2, 3], 4, "dynamic", n_nodes=2)
    assert tokens[[0, 2]].tolist() == [20.0, 20.0]
    # one batch per row; a step is the slowest GPU under the cost model
    t = rule_step_times([[80, 8, 8], [0, 0, 8]], [0, 1, 0, 2], 2, "vllm", COST)
    assert t.shape == (2,) and t[0] == pytest.approx(COST.time(2, 48).item())


def _window(seed, T=12, L=2, E_=16):
    rng = np.random.default_rng(seed)
    pop = rng.dirichlet(np.full(E_, 0.4), size=L)
    return np.stack([[rng.multinomial(400, pop[l]) for l in range(L)] for _ in range(T)])


@pytest.mark.parametrize("rule", ENGINE_DISPATCH_RULES)
def test_never_above_the_engines_eplb_on_its_window(rule):
    version = "vllm" if rule == "vllm" else "sglang"
    gains = []
    for seed in range(4):
        win = _window(seed)
        T, L, E_ = win.shape
        for P_, groups, nodes, gpus in ((24, 1, 1, 4), (32, 4, 2, 8)):
            p2l = place_experts(win, P_, groups, nodes, gpus, dispatch=rule, n_samples=T)[0]
            eplb = rebalance_experts(win.sum(0), P_, groups, nodes, gpus, version=version)[0]
            for layer in range(L):
                ours = rule_step_times(win[:, layer], p2l[layer], gpus, rule, COST, n_nodes=nodes)
                theirs = rule_step_times(
                    win[:, layer], eplb[layer], gpus, rule, COST, n_nodes=nodes
                )
                assert ours.mean() <= theirs.mean() + 1e-9
                gains.append(1 - ours.mean() / theirs.mean())
                # every expert placed, P / gpus slots per GPU by construction
                assert set(p2l[layer].tolist()) == set(range(E_))
    assert max(gains) > 0.01  # the search finds something on these skewed windows


def test_options_and_previous():
    win = _window(9)
    a = place_experts(win, 24, 1, 1, 4, dispatch="static")
    b = place_experts(win, 24, 1, 1, 4, dispatch="static")
    for x, y in zip(a, b):  # deterministic
        np.testing.assert_array_equal(x, y)
    old = np.tile(np.arange(24) % 16, (2, 1))
    old[:, 3] = -1  # an empty slot
    kept = place_experts(win, 24, 1, 1, 4, dispatch="static", previous=old)[0]
    np.testing.assert_array_equal(kept, preserve_intragpu_slots(a[0], 4, old))
    # vLLM's rule: a GPU may hold more slots than experts (EPLB's duplicates stay possible)
    p2l = place_experts(win[:, :, :4], 12, 1, 1, 2, dispatch="vllm")[0]
    assert p2l.shape == (2, 12)
    assert DISPATCH_RULES[0] == "tempo"


@pytest.mark.parametrize(
    "kw, cls, match",
    [
        ({"dispatch": "hash"}, InvalidOptionError, "'dispatch' parameter"),
        ({"dispatch": "vllm", "method": "greedy"}, InvalidOptionError, "'method' option"),
        ({"dispatch": "lp", "max_moves": 1}, InvalidOptionError, "'max_moves' option"),
        ({"dispatch": "lp", "move_cost": 1.0}, InvalidOptionError, "'move_cost' option"),
        ({"dispatch": "vllm", "previous": np.zeros((2, 23))}, InvalidInputError, "'previous'"),
    ],
)
def test_bad_options(kw, cls, match):
    with pytest.raises(cls, match=match):
        place_experts(_window(0), 24, 1, 1, 4, **kw)


@pytest.mark.parametrize(
    "args, name",
    [
        (([1, 2], [0, 1, 1], 2, "vllm"), "physical_to_logical"),  # 3 slots on 2 GPUs
        (([1, 2], [0, 0], 2, "vllm"), "physical_to_logical"),  # expert 1 has tokens, no slot
        (([1, 2], [0, 5], 2, "vllm"), "physical_to_logical"),
        (([1, -2], [0, 1], 2, "vllm"), "counts"),
        (([1, 2], [0, 1], 2, "vllm", 3), "n_nodes"),
    ],
)
def test_rule_loads_refuses_bad_input(args, name):
    kw = {"n_nodes": args[4]} if len(args) > 4 else {}
    with pytest.raises(InvalidInputError, match=f"'{name}' parameter of rule_loads"):
        rule_loads(*args[:4], **kw)


def test_small_modelled_gains_keep_the_engines_eplb(monkeypatch):
    """Flat windows: the search finds gains under RULE_SWITCH_TAU (1%), which would move
    replicas for nothing; the engine's EPLB is returned instead."""
    import straggler.solvers.placement.place as place_module
    from straggler.solvers.placement.place import RULE_SWITCH_TAU

    rng = np.random.default_rng(0)
    pop = rng.dirichlet(np.full(16, 5.0), size=2)
    win = np.stack([[rng.multinomial(400, pop[layer]) for layer in range(2)] for _ in range(12)])
    eplb = rebalance_experts(win.sum(0), 24, 1, 1, 4, version="sglang")[0]
    kept = place_experts(win, 24, 1, 1, 4, dispatch="static", n_samples=12)[0]
    np.testing.assert_array_equal(kept, eplb)
    monkeypatch.setattr(place_module, "RULE_SWITCH_TAU", 0.0)
    moved = place_experts(win, 24, 1, 1, 4, dispatch="static", n_samples=12)[0]
    for layer in range(2):
        assert not np.array_equal(moved[layer], eplb[layer])
        ours = rule_step_times(win[:, layer], moved[layer], 4, "static", COST).mean()
        theirs = rule_step_times(win[:, layer], eplb[layer], 4, "static", COST).mean()
        assert theirs * (1 - RULE_SWITCH_TAU) <= ours < theirs
