"""certified_lower_bound: kernel == reference, never above the exact optimum."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from straggler.formulations import CostModel, DispatchProblem, basic_lower_bound
from straggler.proofs.brute import brute_force_dispatch
from straggler.proofs.conjecture import exact_optimum, support_optimum
from straggler.proofs.strategies import coupled_instances, dispatch_instances, forced_instances
from straggler.solvers import certified_lower_bound, semi_matching, solve_dispatch, solve_token_lp
from straggler.solvers.dispatch._backend import PRELUDE
from straggler.solvers.dispatch._bounds import (
    coupling_bound_kernel,
    coupling_bound_reference,
    forced_bound_kernel,
    forced_bound_reference,
    forced_kernel,
    forced_reference,
    lower_bound_kernel,
    lower_bound_reference,
)
from straggler.solvers.dispatch._counting import (
    COUNTING_STEPS,
    counting_bound_kernel,
    counting_bound_reference,
    counting_kernel,
    counting_reference,
)
from straggler.solvers.dispatch._semi_matching import semi_matching_reference
from straggler.solvers.dispatch.bounds import (
    FORCED_STEPS,
    counting_bound,
    forced_bound,
    layer_bound,
    token_lp_bound,
)


def _both(p, cost):
    params = cost.as_array()
    sm_k = semi_matching(p.replicas, p.counts > 0)[1]
    sm_r = semi_matching_reference(p.replicas, p.counts > 0)[1]
    k = lower_bound_kernel(p.counts, p.replicas, params, sm_k)
    py = lower_bound_kernel.py_func(p.counts, p.replicas, params, sm_k)
    r = lower_bound_reference(p.counts, p.replicas, params, sm_r)
    return k, py, r


@given(dispatch_instances(max_experts=10, max_gpus=5, max_tokens=300))
@example((DispatchProblem(counts=[0, 0, 1, 3], replicas=np.array([[1, 0]] * 3 + [[1, 1]], bool)),
          CostModel(a=0, b=1, c=0, beta=0, b2=0.5, tile=2)))  # fmt: skip
def test_kernel_equals_reference(inst):
    p, cost = inst
    k, py, r = _both(p, cost)
    assert k == py == r
    # B5 and B7 (from the exact token-LP value) on top of the kernel's B1-B4 and B6
    _, v = solve_token_lp(p, cost)
    b5 = max(c0 + s * v for c0, s in cost.token_pieces)
    b57 = token_lp_bound(cost, v)
    assert b57 >= b5
    counts = np.ascontiguousarray(p.counts, dtype=np.int64)
    c = cost.as_array()
    _, _, _, _, _, bound, _, m_lp = PRELUDE(counts, np.ascontiguousarray(p.replicas), c, True)
    assert bound == pytest.approx(max(k, b57), rel=1e-9, abs=1e-12)
    # and B8, tried from the exact token-LP dispatch's makespan, on top (it can raise them:
    # counts [0, 0, 1, 3], expert 3 on both GPUs, the rest on GPU 0, b = 1, b2 = 0.5, tiles
    # of 2: B1-B7 give 1.25, the optimum and B8 1.5)
    assert certified_lower_bound(p, cost) == forced_bound(counts, p.replicas, c, bound, m_lp)


def test_kernel_equals_reference_many_gpus():
    """g > 64 uses per-expert sets only; both implementations agree there too."""
    rng = np.random.default_rng(0)
    rep = rng.random((40, 70)) < 0.05
    rep[np.arange(40), rng.integers(0, 70, 40)] = True
    p = DispatchProblem(counts=rng.integers(0, 500, 40), replicas=rep)
    k, py, r = _both(p, CostModel.preset("qwen3_235b_b_tile"))
    assert k == py == r


@given(dispatch_instances(max_experts=6, max_gpus=3))
@example(
    (
        DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool)),
        CostModel(a=0, b=15, c=0, beta=0.1),
    )
)
@example(
    (
        DispatchProblem(counts=[8] * 6, replicas=np.ones((6, 2), bool)),
        CostModel(a=0, b=1, c=0, beta=0, b2=10, tile=4),
    )
)
def test_never_above_the_optimum(inst):
    p, cost = inst
    opt = exact_optimum(p, cost)
    lb = certified_lower_bound(p, cost)
    assert lb <= opt * (1 + 1e-9) + 1e-9
    # at least as strong as the averaging bound it extends
    assert lb >= basic_lower_bound(p, cost) * (1 - 1e-12) - 1e-12


@given(dispatch_instances(max_experts=4, max_gpus=3, tiles=False))
def test_support_oracle_agrees_with_the_milp(inst):
    """The independent support-enumeration oracle equals the MILP optimum (b2 = 0)."""
    p, cost = inst
    assert support_optimum(p, cost) == pytest.approx(exact_optimum(p, cost), rel=1e-7, abs=1e-7)


def test_against_brute_force_with_tiles():
    """A few tiny instances against the brute-force oracle (independent of the MILP)."""
    rng = np.random.default_rng(7)
    for _ in range(6):
        rep = rng.random((3, 2)) < 0.6
        rep[np.arange(3), rng.integers(0, 2, 3)] = True
        p = DispatchProblem(counts=rng.integers(0, 12, 3), replicas=rep)
        cost = CostModel(a=1, b=3, c=1, beta=0.5, b2=float(rng.choice([1, 5])), tile=4)
        value, _ = brute_force_dispatch(p, cost)
        assert certified_lower_bound(p, cost) <= value * (1 + 1e-9) + 1e-9


def test_restricted_bounds_bind():
    # B3: expert 0 lives only on GPU 0
    p = DispatchProblem(counts=[90, 10], replicas=[[1, 0], [1, 1]])
    assert certified_lower_bound(p, CostModel(a=0, b=0, c=0, beta=1)) == 90.0
    # B2: three experts only on GPU 0 -> 3 activations there
    p = DispatchProblem(counts=[1, 1, 1, 1], replicas=[[1, 0]] * 3 + [[1, 1]])
    assert certified_lower_bound(p, CostModel(a=1, b=2, c=0, beta=0)) == 7.0
    # B4: 300 tokens on 2 replicas, tile 128: the larger piece has 2 tiles
    p = DispatchProblem(counts=[300], replicas=[[1, 1]])
    assert certified_lower_bound(p, CostModel(a=0, b=4, c=0, beta=0, b2=1)) == 5.0
    # B6: one hot expert (600 tokens) and three cold ones on 2 GPUs, b = 15, beta = 0.1:
    # with 2 activations per GPU the hot one stays whole (60), with 3 it halves (45); the
    # semi-matching (30) and the token LP (31.5) stay below the optimum 45
    p = DispatchProblem(counts=[600, 10, 10, 10], replicas=np.ones((4, 2), bool))
    cost = CostModel(a=0, b=15, c=0, beta=0.1)
    sm = semi_matching(p.replicas, p.counts > 0)[1]
    assert max(cost.b * sm, token_lp_bound(cost, solve_token_lp(p)[1])) < 45.0
    assert certified_lower_bound(p, cost) == 45.0 == exact_optimum(p, cost)
    # B7: 35 tokens over 3 GPUs, tiles of 8: the GPU with 35/3 tokens holds 2 tiles
    p = DispatchProblem(counts=[23, 12], replicas=np.ones((2, 3), bool))
    cost = CostModel(a=0, b=3, c=0, beta=0.01, b2=1, tile=8)
    assert token_lp_bound(cost, 35 / 3) == 4.0 == certified_lower_bound(p, cost)
    assert token_lp_bound(cost, 0.0) == 0.0  # no tokens, no activation


@given(coupled_instances(), st.sampled_from([-np.inf, 0.0, 10.0, 40.0]))
def test_coupling_kernel_equals_reference(inst, best):
    p, cost = inst
    c = cost.as_array()
    k = coupling_bound_kernel(p.counts, p.replicas, c, best)
    assert k == coupling_bound_kernel.py_func(p.counts, p.replicas, c, best)
    assert k == coupling_bound_reference(p.counts, p.replicas, c, best)
    assert k >= best


@settings(max_examples=40)
@given(coupled_instances(max_experts=5, max_gpus=3))
def test_coupling_never_above_the_optimum(inst):
    """B6 and B7 (inside certified_lower_bound) against the MILP optimum, on instances where
    activations and tokens bind together; the coupling alone too (from -inf)."""
    p, cost = inst
    opt = exact_optimum(p, cost)
    assert certified_lower_bound(p, cost) <= opt * (1 + 1e-9) + 1e-9
    b6 = coupling_bound_kernel(p.counts, p.replicas, cost.as_array(), 0.0)
    assert b6 <= opt * (1 + 1e-9) + 1e-9


def test_certificate_validates_its_inputs_and_takes_no_hints():
    """Junk is refused naming the parameter; the caller cannot hand in the semi-matching or
    token-LP value (a wrong one made a "certified" bound 10^6 times the optimum); a stack
    gets one bound per layer."""
    from straggler.formulations import InvalidInputError

    p = DispatchProblem(counts=[600] + [30] * 6, replicas=np.ones((7, 2), bool))
    cost = CostModel(a=0, b=15, c=0, beta=0.1)
    with pytest.raises(InvalidInputError, match="'problem' parameter of certified_lower_bound"):
        certified_lower_bound([1, 2], cost)
    with pytest.raises(InvalidInputError, match="'cost' parameter of certified_lower_bound"):
        certified_lower_bound(p, None)
    for hint in ("token_lp_value", "semi_matching_value"):
        with pytest.raises(TypeError, match=hint):
            certified_lower_bound(p, cost, **{hint: 1e9})
    stack = DispatchProblem(counts=[p.counts, p.counts[::-1]], replicas=p.replicas)
    lb = certified_lower_bound(stack, cost)
    assert lb.shape == (2,)
    assert lb.tolist() == [certified_lower_bound(q, cost) for q in stack.layers()]


# --- B8: activations and tokens forced per GPU ------------------------------------------


def _b1_b7(p, cost):
    """B1-B7 (certified_lower_bound without B8)."""
    counts = np.asarray(p.counts, np.int64)
    sm = semi_matching(p.replicas, counts > 0)[1]
    return layer_bound(counts, p.replicas, cost, cost.as_array(), sm, solve_token_lp(p)[1])


def _trials(opt):
    """Trial values around the optimum: at it, just above and below, far away."""
    return [opt, opt * (1 + 1e-3) + 1e-9, opt * (1 - 1e-3), 2 * opt + 1, opt / 2, 0.0]


@given(st.one_of(forced_instances(), dispatch_instances(max_experts=6, max_gpus=4)),
       st.floats(0, 50))  # fmt: skip
def test_forced_kernel_equals_reference(inst, T):
    p, cost = inst
    c = cost.as_array()
    k = forced_kernel(p.counts, p.replicas, c, T)
    assert k == forced_kernel.py_func(p.counts, p.replicas, c, T)
    assert k == forced_reference(p.counts, p.replicas, c, T)
    assert k <= T
    best = T / 3
    k = forced_bound_kernel(p.counts, p.replicas, c, best, T, FORCED_STEPS)
    assert k == forced_bound_kernel.py_func(p.counts, p.replicas, c, best, T, FORCED_STEPS)
    assert k == forced_bound_reference(p.counts, p.replicas, c, best, T, FORCED_STEPS)
    assert k >= best


@settings(max_examples=60)
@given(forced_instances(max_experts=6, max_gpus=3))
@example(
    (
        DispatchProblem(counts=[7, 3, 1], replicas=[[1, 1], [1, 0], [1, 0]]),
        CostModel(a=0, b=1, c=0, beta=0.5),
    )
)
def test_forced_never_above_the_optimum(inst):
    """``OPT >= min(T, LB(T))`` at every trial value, the optimum from the MILP at zero
    gap; the bound with B8 never above it either."""
    p, cost = inst
    opt = exact_optimum(p, cost)
    tol = 1e-9 * max(1.0, opt)
    c = cost.as_array()
    for T in _trials(opt):
        assert forced_kernel(p.counts, p.replicas, c, T) <= opt + tol, T
        assert forced_bound(p.counts, p.replicas, c, 0.0, T) <= opt + tol, T
    assert certified_lower_bound(p, cost) <= opt + tol


def test_forced_against_brute_force_with_tiles():
    """Tiny instances with tiles against the brute-force oracle (independent of the MILP):
    B8 at the optimum and around it never claims more."""
    rng = np.random.default_rng(8)
    bound_above = 0
    for _ in range(12):
        # GPU 0 holds two experts of its own, expert 2 is shared, expert 3 is GPU 1's
        rep = np.array([[1, 0], [1, 0], [1, 1], [0, 1]], bool)
        p = DispatchProblem(counts=rng.integers(1, 12, 4), replicas=rep)
        cost = CostModel(a=0.5, b=2, c=0, beta=0.5, b2=float(rng.choice([0.5, 3])), tile=4)
        value, _ = brute_force_dispatch(p, cost)
        c = cost.as_array()
        for T in _trials(value):
            assert forced_kernel(p.counts, p.replicas, c, T) <= value * (1 + 1e-9) + 1e-9
        lb = certified_lower_bound(p, cost)
        assert lb <= value * (1 + 1e-9) + 1e-9
        bound_above += lb > _b1_b7(p, cost) + 1e-9
    assert bound_above  # B8 added something on some of them


def test_forced_bound_binds():
    """A GPU full of the experts only it holds pushes the shared expert whole elsewhere:
    B1-B7 give 2.75, B8 the optimum 3 (the docstring example of forced_bound)."""
    p = DispatchProblem(counts=[7, 3, 1], replicas=[[1, 1], [1, 0], [1, 0]])
    cost = CostModel(a=0, b=1, c=0, beta=0.5)
    assert _b1_b7(p, cost) == 2.75
    assert certified_lower_bound(p, cost) == 3.0 == exact_optimum(p, cost)
    res = solve_dispatch(p, cost, method="tempo", repair_budget_s=0)
    assert res.makespan == 3.0 and res.status.name == "OPTIMAL"
    # B8 from a method's own makespan: the token LP's dispatch (3.5) and metro's
    for method in ("token_lp", "metro"):
        r = solve_dispatch(p, cost, method=method)
        assert 3.0 <= r.lower_bound <= r.makespan


def test_forced_bound_proves_deepseek_v3_at_ep32():
    """The layer that motivated B8: DeepSeek-V3 loads (Zipf 0.85, 64 tokens per GPU), EP32
    over 4 nodes, 288 slots placed by place_experts (9 distinct experts per GPU). The
    semi-matching and every bound before B8 stop at 8 activations (118.24 = 8 b); the
    optimum needs 9 (133.02), which tempo reaches without repair and B8 proves."""
    from straggler.sim.workloads.batches import sample_counts, zipf_popularity
    from straggler.solvers.placement.place import place_experts

    g, P, E = 32, 288, 256
    rng = np.random.default_rng(0)
    pop = zipf_popularity(E, 0.85, n_layers=1, rng=rng)
    hist = np.stack([sample_counts(pop, n_tokens=64 * g, top_k=8, rng=rng) for _ in range(16)])
    p2l, _, _ = place_experts(hist, P, 8, 4, g)
    counts = sample_counts(pop, n_tokens=64 * g, top_k=8, rng=rng)
    p = DispatchProblem.from_placement(counts, p2l, g).layer(0)
    cost = CostModel.preset("dsv3_a_offline")
    assert all(len(set(p2l[0, 9 * h : 9 * h + 9])) == 9 for h in range(g))
    assert _b1_b7(p, cost) == pytest.approx(8 * cost.b)
    res = solve_dispatch(p, cost, method="tempo", repair_budget_s=0)
    assert res.makespan == pytest.approx(9 * cost.b)
    assert res.status.name == "OPTIMAL" and res.lower_bound == res.makespan


# --- B9: activations counted per GPU ----------------------------------------------------


@given(
    st.one_of(
        forced_instances(), coupled_instances(max_experts=8, max_gpus=4),
        dispatch_instances(max_experts=8, max_gpus=4),
    ),
    st.floats(0, 60),
)  # fmt: skip
@example(
    (DispatchProblem(counts=[100, 10, 10, 10], replicas=np.ones((4, 2), bool)),
     CostModel(a=0, b=4, c=0, beta=0.1)),
    12.0,
)  # fmt: skip
@example(  # a tiny T: 30 / U overflows to inf, which the reference compares, never rounds
    (DispatchProblem(counts=[30, 0], replicas=np.array([[1, 0], [1, 0]], bool)),
     CostModel(a=0, b=2, c=0, beta=0.2)),
    1.1125369292536007e-308,
)  # fmt: skip
def test_counting_kernel_equals_reference(inst, T):
    p, cost = inst
    c = cost.as_array()
    k = counting_kernel(p.counts, p.replicas, c, T)
    assert k == counting_kernel.py_func(p.counts, p.replicas, c, T)
    assert k == counting_reference(p.counts, p.replicas, c, T)
    assert k <= T
    best = T / 3
    k = counting_bound_kernel(p.counts, p.replicas, c, best, T, COUNTING_STEPS)
    assert k == counting_bound_kernel.py_func(p.counts, p.replicas, c, best, T, COUNTING_STEPS)
    assert k == counting_bound_reference(p.counts, p.replicas, c, best, T, COUNTING_STEPS)
    assert k >= best


@settings(max_examples=60)
@given(st.one_of(forced_instances(max_experts=6, max_gpus=3),
                 coupled_instances(max_experts=6, max_gpus=3)))  # fmt: skip
@example(
    (DispatchProblem(counts=[100, 10, 10, 10], replicas=np.ones((4, 2), bool)),
     CostModel(a=0, b=4, c=0, beta=0.1)),
)  # fmt: skip
def test_counting_never_above_the_optimum(inst):
    """``OPT >= min(T, LB(T))`` of B9 at every trial value, the optimum from the MILP at
    zero gap; B9's search and the certified bound never above it either."""
    p, cost = inst
    opt = exact_optimum(p, cost)
    tol = 1e-9 * max(1.0, opt)
    c = cost.as_array()
    for T in _trials(opt):
        assert counting_kernel(p.counts, p.replicas, c, T) <= opt + tol, T
        assert counting_bound(p.counts, p.replicas, c, 0.0, T) <= opt + tol, T
    assert certified_lower_bound(p, cost) <= opt + tol


def test_counting_against_brute_force():
    """Tiny layers where every activation is needed (four or five experts, two GPUs, a
    high activation cost), with and without tiles, against the brute-force oracle
    (independent of the MILP): B9 at the optimum and around it never claims more, and it
    raises the bound of B1-B8 on some of them."""
    rng = np.random.default_rng(9)
    raised = 0
    for i in range(40):
        E = int(rng.integers(3, 6))
        rep = rng.random((E, 2)) < 0.7
        rep[np.arange(E), rng.integers(0, 2, E)] = True
        p = DispatchProblem(counts=rng.integers(1, 33, E), replicas=rep)
        tiles = dict(b2=float(rng.choice([0.5, 3.0])), tile=16) if i % 2 else {}
        cost = CostModel(a=float(rng.choice([0, 1])), b=float(rng.choice([2, 4, 8])), c=0,
                         beta=0.25, **tiles)  # fmt: skip
        value, _ = brute_force_dispatch(p, cost)
        c = cost.as_array()
        tol = 1e-9 * max(1.0, value)
        for T in _trials(value):
            assert counting_kernel(p.counts, p.replicas, c, T) <= value + tol, T
        lb = certified_lower_bound(p, cost)
        assert lb <= value + tol
        b8 = forced_bound_kernel(p.counts, p.replicas, c, _b1_b7(p, cost), value, FORCED_STEPS)
        raised += lb > b8 + 1e-9
    assert raised  # B9 added something on some of them


def test_counting_bound_binds():
    """A big expert whole beside another (the docstring example of counting_bound): B1-B8
    give 10, B9 the optimum 11, so tempo's 11 is reported OPTIMAL without repair."""
    p = DispatchProblem(counts=[100, 10, 10, 10], replicas=np.ones((4, 2), bool))
    cost = CostModel(a=0, b=4, c=0, beta=0.1)
    c = cost.as_array()
    b17 = _b1_b7(p, cost)
    assert b17 == 10.0
    assert forced_bound_kernel(p.counts, p.replicas, c, b17, 12.0, FORCED_STEPS) == 10.0
    assert certified_lower_bound(p, cost) == 11.0 == exact_optimum(p, cost)
    res = solve_dispatch(p, cost, method="tempo", repair_budget_s=0)
    assert res.makespan == 11.0 and res.status.name == "OPTIMAL"


@pytest.mark.parametrize(
    "tokens, skew, seed, preset, opt",
    [
        # 64 experts at EP16, 4 activations a GPU, none to spare: the expert of 1223 tokens
        # sits whole beside three others (1448 tokens); B1-B8 stop at 4 b = 181.16
        (80, 1.1, 50_171, "dsv3_bf16_a_offline", 198.376),
        # the same shape with tiles: 4 activations and 64 tiles a GPU below a + 4 b + b2,
        # one expert of 146 tokens needs 2 tiles; B1-B8 stop at 70.55 (the token average)
        (32, 0.3, 3_192, "dsv3_b_tile", 73.03),
    ],
)
def test_counting_bound_proves_ep16_layers(tokens, skew, seed, preset, opt):
    """Qwen2-57B's 64 experts at EP16, 1.5x replication (layers of the ``heldout16b`` and
    ``decode16`` families of benchmarks/tempo_quality.py, whose MILP optimum is ``opt``):
    tempo without repair reaches the optimum and B9 proves it."""
    from straggler.sim.workloads.batches import make_decode_problem

    p = make_decode_problem(
        "qwen2_57b", n_gpus=16, tokens_per_gpu=tokens, skew=skew, replication=1.5,
        n_layers=1, num_nodes=1, distinct=False, seed=seed,
    ).layer(0)  # fmt: skip
    cost = CostModel.preset(preset)
    assert _b1_b7(p, cost) < opt * 0.97
    res = solve_dispatch(p, cost, method="tempo", repair_budget_s=0)
    assert res.makespan == pytest.approx(opt, rel=1e-9)
    assert res.status.name == "OPTIMAL" and res.lower_bound == pytest.approx(opt, rel=1e-9)
