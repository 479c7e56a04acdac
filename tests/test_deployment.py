"""The deployment step model: kernels against references, exactness against solve_dispatch,
scaling, placement and table cadence, validation."""

from __future__ import annotations

import numpy as np
import pytest
from straggler.formulations import CostModel, DispatchProblem, InvalidInputError, evaluate
from straggler.sim.engine import _deployment_kernels as K
from straggler.sim.engine.deployment import (
    METHOD_OPTIONS,
    MODEL_PRESETS,
    AttentionCost,
    DeploymentConfig,
    RoutingModel,
    StepModel,
    simulate_steps,
)
from straggler.solvers import solve_dispatch


def _three(fn_kernel, fn_ref, *args):
    """kernel, its py_func and the reference on the same arguments (overflow is SplitMix64's
    intended uint64 wrap-around when the kernel runs as Python)."""
    with np.errstate(over="ignore"):
        return (
            fn_kernel(*args),
            getattr(fn_kernel, "py_func", fn_kernel)(*args),
            fn_ref(*args),
        )


@pytest.mark.parametrize("case", range(12))
def test_sample_choices_kernel_matches_reference(case):
    rng = np.random.default_rng(case)
    E = int(rng.integers(2, 10))
    k = int(rng.integers(1, E + 1))
    q = rng.dirichlet(np.full(E, 0.3), size=2) + 1e-3
    if case % 3 == 0:  # zero-mass experts, and one huge mass: rejections and the fallback
        q[:, : max(0, E - k - 1)] = 0.0
        q[:, -1] = 1e6
    tokens = rng.integers(0, 6, size=int(rng.integers(1, 4)))
    a, b, c = _three(K.sample_choices_kernel, K.sample_choices_reference, q, tokens, k, case)
    assert np.array_equal(a, b) and np.array_equal(a, c)
    # every token picks k distinct experts of positive mass
    assert (a.sum(axis=2) == tokens[None, :] * k).all()
    assert (a <= tokens[None, :, None]).all()
    assert (a[np.broadcast_to(q[:, None, :] == 0, a.shape)] == 0).all()


def test_sample_choices_first_pick_follows_the_popularity():
    q = np.array([[8.0, 4.0, 2.0, 1.0, 1.0]])
    n = 40_000
    c = K.sample_choices_kernel(q, np.array([n]), 1, 7)[0, 0]
    p = q[0] / q[0].sum()
    sd = np.sqrt(n * p * (1 - p))
    assert (np.abs(c - n * p) < 5 * sd).all()


@pytest.mark.parametrize("case", range(6))
def test_layer_times_kernel_matches_reference(case):
    rng = np.random.default_rng(100 + case)
    L, E, G = 2, int(rng.integers(1, 9)), int(rng.choice([1, 2, 4]))
    src = rng.integers(0, 30, size=(L, G, E))
    frac = rng.random((L, E, G)) * (rng.random((L, E, G)) < 0.6)
    frac[..., 0] += 1e-9
    frac /= frac.sum(axis=2, keepdims=True)
    x = src.sum(axis=1)[:, :, None] * frac
    node = np.arange(G) // max(1, G // 2)
    cost = CostModel.preset(["qwen3_235b_b_tile", "dsv3_a_offline"][case % 2]).as_array()
    for node_first in (False, True):
        a, b, c = _three(
            K.layer_times_kernel, K.layer_times_reference, x, src, node, cost, 0.3, node_first
        )
        assert np.array_equal(a, b) and np.array_equal(a, c)


@pytest.mark.parametrize("case", range(6))
def test_node_first_split_keeps_loads_and_sends_fewest_tokens_across_nodes(case):
    rng = np.random.default_rng(300 + case)
    L, E, G = 2, int(rng.integers(2, 12)), 4
    src = rng.integers(0, 40, size=(L, G, E))
    frac = rng.random((L, E, G)) * (rng.random((L, E, G)) < 0.7)
    frac[..., case % G] += 1e-3
    frac /= frac.sum(axis=2, keepdims=True)
    x = src.sum(axis=1)[:, :, None] * frac
    node = np.array([0, 0, 1, 1])
    cost = CostModel.preset("qwen3_235b_b_tile").as_array()
    flat = K.layer_times_kernel(x, src, node, cost, 0.0, False)
    topo = K.layer_times_kernel(x, src, node, cost, 0.0, True)
    assert np.array_equal(flat[:, :4], topo[:, :4])  # per-GPU times: the dispatch's own
    assert (topo[:, 5] <= flat[:, 5] + 1e-9).all()  # own rank first: fewer from other GPUs
    # across nodes, what a node cannot keep (max(0, D_k - S_k) per expert and node: the
    # fewest any split has), never more in total than the flat table's D_k (1 - S_k / n_e)
    for l in range(L):
        per_gpu = np.zeros(G)
        flat_total = 0.0
        for e in range(E):
            n_e = src[l, :, e].sum()
            for k in (0, 1):
                g = node == k
                S, D = src[l, g, e].sum(), x[l, e, g].sum()
                flat_total += D * (n_e - S) / n_e if n_e else 0.0
            for k in (0, 1):
                g = node == k
                S, D = src[l, g, e].sum(), x[l, e, g].sum()
                keep = min(S, D)
                own = np.minimum(src[l, g, e], x[l, e, g])
                r = (keep - own.sum()) / (D - own.sum()) if D > own.sum() else 0.0
                r = 1.0 if S >= D * (1 - 1e-12) else r
                per_gpu[g] += x[l, e, g] - (own + (x[l, e, g] - own) * r)
        np.testing.assert_allclose(topo[l, 4], per_gpu.max(), rtol=1e-9, atol=1e-9)
        assert per_gpu.sum() <= flat_total + 1e-9
    one = np.zeros(G, dtype=np.int64)
    assert (K.layer_times_kernel(x, src, one, cost, 0.0, True)[:, 4] == 0).all()


def test_node_first_split_in_the_step_model():
    kw = dict(preset="dsv3", n_gpus=8, n_nodes=2, layers=1, seed=4, internode_us_per_token=0.1)
    kv, req = np.full((3, 8), 1000), np.full((3, 8), 32)
    flat = simulate_steps(DeploymentConfig(**kw), kv, req)
    topo = simulate_steps(DeploymentConfig(**kw, split="node_first"), kv, req)
    assert not np.array_equal(topo.steps["cross_node_tokens"], flat.steps["cross_node_tokens"])
    np.testing.assert_allclose(  # the same per-GPU loads: only the inter-node term moves
        flat.steps["moe_us"] - topo.steps["moe_us"],
        58 * 0.1 * (flat.steps["cross_node_tokens"] - topo.steps["cross_node_tokens"]),
        rtol=1e-9,
    )
    with pytest.raises(InvalidInputError, match="'split'"):
        DeploymentConfig(preset="dsv3", n_gpus=8, split="ring")


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 15, 16, 17, 94, 127, 128, 129, 130, 300, 1000, 4099])
def test_pairwise_sum_is_numpys_sum_bit_for_bit(n):
    rng = np.random.default_rng(n)
    v = rng.random(n + 3) * 10.0 ** rng.integers(-6, 6, n + 3)
    got = K._pairwise_sum(v, 2, n), getattr(K._pairwise_sum, "py_func", K._pairwise_sum)(v, 2, n)
    want = v[2 : 2 + n].sum()
    assert got[0] == want and got[1] == want  # numpy's pairwise order, not a plain loop


def _step_case(case):
    """Arguments of deployment_step_kernel: random state, tables or SGLang's static table."""
    rng = np.random.default_rng(200 + case)
    L, E, G = int(rng.integers(1, 4)), int(rng.integers(8, 20)), int(rng.choice([2, 4, 8]))
    q = rng.dirichlet(np.full(E, 0.5), size=L) + 1e-4
    req = rng.integers(0, 9, size=G)
    kv = rng.integers(0, 90_000, size=G).astype(float)
    tables = rng.random((L, E, G)) * (rng.random((L, E, G)) < 0.5)
    tables[..., 0] += 1e-9
    tables /= tables.sum(axis=2, keepdims=True)
    static = rng.integers(0, G, size=(G, L, E)) if case % 2 else np.zeros((0, L, E), np.int64)
    node = np.arange(G) // max(1, G // 2)
    cost = CostModel.preset(["qwen3_235b_b_tile", "dsv3_a_offline"][case % 2]).as_array()
    par = np.array(
        [23.8, 6.8e-4, 0.14, 61.0, 14.5, 396.0 * (case % 3), 0.05 * (case % 2), case % 4 // 2]
    )
    W = 3
    state = (rng.integers(0, 5, size=(W, L, E)), rng.integers(0, 50, size=(L, E)),
             rng.random((5, len(K.STEP_COLUMNS))))  # fmt: skip
    return (q, case, kv, req, min(3, E), tables, static, node, cost, par), state


@pytest.mark.parametrize("case", range(8))
def test_step_kernel_matches_reference_with_its_state(case):
    args, state = _step_case(case)
    fns = (
        K.deployment_step_kernel,
        getattr(K.deployment_step_kernel, "py_func", K.deployment_step_kernel),
        K.deployment_step_reference,
    )
    outs = []
    for fn in fns:
        window, acc, log = (a.copy() for a in state)
        with np.errstate(over="ignore"):
            moe = fn(*args, window, 1, acc, log, 2)
        outs.append((moe, window, acc, log))
    for moe, window, acc, log in outs[1:]:
        assert moe == outs[0][0]
        for a, b in zip((window, acc, log), outs[0][1:]):
            assert np.array_equal(a, b)
    moe, window, acc, log = outs[0]
    n = window[1]
    assert np.array_equal(acc, state[1] + n) and (n.sum(axis=1) == args[3].sum() * args[4]).all()
    assert np.array_equal(np.delete(log, 2, axis=0), np.delete(state[2], 2, axis=0))
    assert log[2, 2] == moe > 0 and log[2, 6] == log[2, 0] + log[2, 2] + log[2, 5]


@pytest.mark.parametrize("dispatch", ["even", "tempo", "token_lp", "static"])
def test_fused_step_is_the_python_step_bit_for_bit(dispatch, monkeypatch):
    kw = dict(preset="qwen3_235b", n_gpus=4, layers=2, seed=6, dispatch=dispatch,
              n_nodes=2, internode_us_per_token=0.02, placement_period=4,
              placement_window=3, dispatch_period_s=0.01,
              split="node_first" if dispatch in ("even", "tempo") else "flat")  # fmt: skip
    rng = np.random.default_rng(1)
    kv, req = rng.integers(0, 40_000, size=(11, 4)), rng.integers(0, 12, size=(11, 4))
    runs = []
    for fused in (True, False):
        monkeypatch.setattr(StepModel, "fused", fused)
        runs.append(simulate_steps(DeploymentConfig(**kw), kv, req))
    a, b = runs
    assert a.n_placements == b.n_placements > 1
    assert dispatch not in ("tempo", "token_lp") or a.n_refreshes == b.n_refreshes > 1
    assert np.array_equal(a.time_s, b.time_s)
    for k in a.steps:
        assert np.array_equal(a.steps[k], b.steps[k]), k


def test_fused_engine_run_is_the_python_step_bit_for_bit(monkeypatch):
    from straggler.sim import simulate

    dep = DeploymentConfig(preset="qwen3_235b", n_gpus=4, layers=2, dispatch="tempo", seed=3,
                           dispatch_period_s=0.05, placement_period=50)  # fmt: skip
    runs = []
    for fused in (True, False):
        monkeypatch.setattr(StepModel, "fused", fused)
        runs.append(simulate(_trace(60, 4), "jsq", n_replicas=4, max_slots=8, deployment=dep))
    a, b = runs
    assert a.step_breakdown == b.step_breakdown and a.step_breakdown["placements"] > 1
    for k in a.series:
        assert np.array_equal(a.series[k], b.series[k], equal_nan=True), k


@pytest.mark.parametrize("method", ["tempo", "uniform", "token_lp", "metro"])
def test_per_batch_moe_time_is_solve_dispatch_makespan(method):
    pre = MODEL_PRESETS["qwen3_235b"]
    cfg = DeploymentConfig(
        preset=pre, n_gpus=8, layers=3, dispatch="per_batch", per_batch_method=method, seed=2
    )
    m = StepModel(cfg)
    src, rows = m.moe_layers(np.arange(10, 90, 10))
    problem = DispatchProblem(counts=src.sum(axis=1), replicas=m._replicas)
    ref = solve_dispatch(problem, cfg.cost, method=method, rng=0, **METHOD_OPTIONS.get(method, {}))
    assert np.array_equal(rows[:, 1], np.asarray(ref.makespan))
    assert np.array_equal(rows[:, 0], rows[:, 1])  # no inter-node term


@pytest.mark.parametrize("dispatch", ["tempo", "token_lp"])
def test_tables_applied_to_the_batch_they_were_solved_on_give_its_makespan(dispatch):
    pre = MODEL_PRESETS["qwen3_235b"]
    cfg = DeploymentConfig(
        preset=pre, n_gpus=8, layers=2, dispatch=dispatch, dispatch_period_s=0.0, seed=5
    )
    m = StepModel(cfg)
    m.step(np.full(8, 50_000), np.full(8, 40), now_s=0.0)  # refreshes on this step's counts
    assert m.n_refreshes == 1
    counts = m._window[0]
    problem = DispatchProblem(counts=counts, replicas=m._replicas)
    ref = solve_dispatch(
        problem, cfg.cost, method=dispatch, rng=0, **METHOD_OPTIONS.get(dispatch, {})
    )
    x = counts[:, :, None] * m.tables
    got = evaluate(problem, cfg.cost, x).makespan
    np.testing.assert_allclose(got, ref.makespan, rtol=1e-9)


@pytest.mark.parametrize("table_counts", ["mean", "window"])
def test_a_refresh_solves_the_mean_batch_or_the_window(table_counts):
    cfg = DeploymentConfig(preset="qwen3_235b", n_gpus=8, layers=2, dispatch="tempo", seed=5,
                           dispatch_period_s=0.2, table_counts=table_counts)  # fmt: skip
    m = StepModel(cfg)
    for now in (0.0, 0.1, 0.2):  # the third step refreshes, on the three steps' counts
        m.step(np.full(8, 50_000), np.full(8, 12), now_s=now)
    assert m.n_refreshes == 1 and not m._acc.any()
    total = m._window[:3].sum(axis=0)
    counts = (2 * total + 3) // 6 if table_counts == "mean" else total
    problem = DispatchProblem(counts=counts, replicas=m._replicas)
    ref = solve_dispatch(problem, cfg.cost, method="tempo", rng=0, **METHOD_OPTIONS["tempo"])
    got = evaluate(problem, cfg.cost, counts[:, :, None] * m.tables).makespan
    np.testing.assert_allclose(got, ref.makespan, rtol=1e-9)
    assert not np.array_equal((2 * total + 3) // 6, total)  # the two bases differ here


def test_moe_off_is_attention_and_dense_only():
    pre = MODEL_PRESETS["dsv3"]
    m = StepModel(DeploymentConfig(preset=pre, n_gpus=4, moe=False))
    kv, req = np.array([1000, 4000, 0, 2000]), np.array([2, 8, 0, 4])
    s = m.step(kv, req, 0.0)
    att = pre.attention.a + pre.attention.b * kv + pre.attention.c * req
    assert s.attention_us == pre.n_layers * att.max()
    assert s.attention_straggler_us == pytest.approx(pre.n_layers * (att.max() - att.mean()))
    assert s.moe_us == s.moe_straggler_us == s.comm_us == 0.0
    assert s.dense_us == (pre.n_layers - pre.n_moe_layers) * pre.dense_ffn_us
    assert s.total_us == s.attention_us + s.dense_us


def test_representative_layers_scale_to_depth():
    pre = MODEL_PRESETS["qwen3_235b"]
    cfg = DeploymentConfig(preset=pre, n_gpus=4, layers=2, seed=1)
    m = StepModel(cfg)
    src, rows = StepModel(cfg).moe_layers(np.full(4, 16))
    s = m.step(np.full(4, 100), np.full(4, 16), 0.0)
    assert cfg.layer_scale == 47.0
    assert s.moe_us == pytest.approx(47.0 * rows[:, 0].sum(), rel=1e-12)


def test_straggler_shares_vanish_when_balanced_and_appear_when_not():
    pre = MODEL_PRESETS["qwen3_235b"]
    m = StepModel(DeploymentConfig(preset=pre, n_gpus=4, layers=1))
    s = m.step(np.full(4, 5000), np.full(4, 10), 0.0)
    assert s.attention_straggler_us == 0.0
    s = m.step(np.array([5000, 20000, 5000, 5000]), np.full(4, 10), 0.0)
    assert s.attention_straggler_us > 0.0
    assert s.moe_straggler_us >= 0.0 and s.moe_us >= s.moe_straggler_us


def test_placement_rebuilds_and_table_refreshes_on_their_periods():
    pre = MODEL_PRESETS["qwen3_235b"]
    kv, req = np.full((12, 4), 3000), np.full((12, 4), 12)
    kw = dict(preset=pre, n_gpus=4, layers=1, placement_period=5, placement_window=3, seed=0)
    assert simulate_steps(DeploymentConfig(**kw), kv, req).n_placements == 3
    assert simulate_steps(DeploymentConfig(**kw, placement="fixed"), kv, req).n_placements == 1
    run = simulate_steps(
        DeploymentConfig(**kw, dispatch="token_lp", dispatch_period_s=0.0), kv, req
    )
    assert run.n_refreshes == 12
    run = simulate_steps(
        DeploymentConfig(**kw, dispatch="token_lp", dispatch_period_s=1e9), kv, req
    )
    assert run.n_refreshes == 0


def test_cross_node_traffic_and_internode_term():
    pre = MODEL_PRESETS["dsv3"]
    kw = dict(preset=pre, n_gpus=8, layers=1, seed=4)
    kv, req = np.full((2, 8), 1000), np.full((2, 8), 32)
    one = simulate_steps(DeploymentConfig(**kw), kv, req)
    assert (one.steps["cross_node_tokens"] == 0).all()
    two = simulate_steps(DeploymentConfig(**kw, n_nodes=2), kv, req)
    assert (two.steps["cross_node_tokens"] > 0).all()
    priced = simulate_steps(DeploymentConfig(**kw, n_nodes=2, internode_us_per_token=0.1), kv, req)
    extra = priced.steps["moe_us"] - two.steps["moe_us"]
    np.testing.assert_allclose(extra, 58 * 0.1 * two.steps["cross_node_tokens"], rtol=1e-9)


def test_same_seed_same_run_and_static_keeps_tokens_local():
    kw = dict(preset="qwen3_235b", n_gpus=8, layers=2, seed=9)
    kv, req = np.full((3, 8), 2000), np.full((3, 8), 24)
    a = simulate_steps(DeploymentConfig(**kw, dispatch="static"), kv, req)
    b = simulate_steps(DeploymentConfig(**kw, dispatch="static"), kv, req)
    assert all(np.array_equal(a.steps[k], b.steps[k]) for k in a.steps)


def test_drift_moves_the_hot_experts_and_keeps_the_skew():
    kw = dict(preset="qwen3_235b", n_gpus=4, layers=2, seed=2, kappa=None)
    still = StepModel(DeploymentConfig(**kw))
    moving = StepModel(DeploymentConfig(**kw, drift=1.0, drift_steps=10))
    a = np.stack([still._next_batch()[0] for _ in range(40)])
    b = np.stack([moving._next_batch()[0] for _ in range(40)])
    assert np.array_equal(a[:10], b[:10])  # before the first drift step: the same routing
    assert (a == a[0]).all() and not np.array_equal(b[10], b[0])  # then the hot experts move
    assert all(np.array_equal(b[k], b[10 * (k // 10)]) for k in range(40))  # every 10 steps
    np.testing.assert_array_equal(np.sort(b, axis=2), np.sort(a, axis=2))  # still Zipf
    with_noise = dict(kw, kappa=2000.0)
    x = StepModel(DeploymentConfig(**with_noise))._next_batch()[0]
    y = StepModel(DeploymentConfig(**with_noise, drift=0.5, drift_steps=300))._next_batch()[0]
    assert np.array_equal(x, y)  # the drift draws its own stream: the batch noise is unchanged
    for bad, name in ((dict(drift=-1.0), "drift"), (dict(drift_steps=0), "drift_steps")):
        with pytest.raises(InvalidInputError, match=f"'{name}'"):
            DeploymentConfig(preset="qwen3_235b", n_gpus=4, **bad)


def test_attention_cost_and_presets():
    assert AttentionCost(a=1, b=0.5, c=2).time([2], [1]).tolist() == [4.0]
    for pre in MODEL_PRESETS.values():
        assert pre.n_moe_layers <= pre.n_layers and pre.source


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(preset="llama"), "preset"),
        (dict(n_gpus=8, n_nodes=3), "n_nodes"),
        (dict(dispatch="fast"), "dispatch"),
        (dict(placement="random"), "placement"),
        (dict(layers=0), "layers"),
        (dict(layers=95), "layers"),
        (dict(dispatch_period_s=-1), "dispatch_period_s"),
        (dict(per_batch_method="nope"), "per_batch_method"),
        (dict(routing=RoutingModel.zipf(64, 0.5, rng=0)), "routing"),
    ],
)
def test_config_validation_names_the_parameter(kw, name):
    base = dict(preset="qwen3_235b", n_gpus=8)
    with pytest.raises(InvalidInputError, match=f"'{name}'"):
        DeploymentConfig(**{**base, **kw})


def test_step_and_recorded_validation():
    m = StepModel(DeploymentConfig(preset="qwen3_235b", n_gpus=4, layers=1))
    with pytest.raises(InvalidInputError, match="'kv'"):
        m.step([1, 2, 3], [1, 1, 1, 1], 0.0)
    with pytest.raises(InvalidInputError, match="'requests'"):
        m.step([1, 2, 3, 4], [1, -1, 1, 1], 0.0)
    n = m.n_steps
    assert n == 0  # a failed call changes nothing
    with pytest.raises(InvalidInputError, match="'counts'"):
        RoutingModel.recorded(np.ones((2, 3, 4), dtype=np.int64), top_k=8)
    with pytest.raises(InvalidInputError, match="'counts'"):
        RoutingModel.recorded(np.ones((2, 3)), top_k=1)
    kept = RoutingModel.recorded(np.ones((5, 10, 16), dtype=np.int64), top_k=2, layers=3)
    assert kept.n_layers == 3 and kept.n_experts == 16


# --- the deployment step inside the simulator's one engine --------------------------------


def _trace(n=120, seed=0):
    from straggler.sim.workloads.traces import Trace

    rng = np.random.default_rng(seed)
    return Trace(
        arrival_s=np.sort(rng.random(n) * 10),
        prompt_len=rng.integers(50, 2000, n),
        output_len=rng.integers(2, 120, n),
    )


@pytest.mark.parametrize("engine", ["numba", "python"])
@pytest.mark.parametrize("policy, admission", [("jsq", "pool"), ("br0", "pool"), ("vllm", "queue")])
def test_one_layer_without_moe_is_the_routing_simulator_exactly(engine, policy, admission):
    import dataclasses

    from straggler.sim import simulate

    t0, kappa = 0.03, 2e-7
    pre = dataclasses.replace(
        MODEL_PRESETS["qwen3_235b"], n_layers=1, n_moe_layers=1,
        attention=AttentionCost(a=t0 * 1e6, b=kappa * 1e6, c=0.0),
    )  # fmt: skip
    assert pre.attention.a / 1e6 == t0 and pre.attention.b / 1e6 == kappa
    kw = dict(n_replicas=4, max_slots=8, t0=t0, kappa=kappa, engine=engine, admission=admission)
    tr = _trace()
    base = simulate(tr, policy, **kw)
    dep = DeploymentConfig(preset=pre, n_gpus=4, moe=False, layers=1)
    r = simulate(tr, policy, deployment=dep, **kw)
    assert r.n_steps == base.n_steps
    for k in base.series:
        assert np.array_equal(r.series[k], base.series[k], equal_nan=True), k
    for k in base.requests:
        assert np.array_equal(r.requests[k], base.requests[k], equal_nan=True), k


def test_engine_with_moe_kernel_equals_reference_and_decomposes_the_step():
    from straggler.sim import simulate

    dep = DeploymentConfig(preset="qwen3_235b", n_gpus=4, layers=2, dispatch="tempo", seed=3)
    kw = dict(n_replicas=4, max_slots=8, deployment=dep)
    tr = _trace(80, 1)
    a = simulate(tr, "jsq", engine="numba", **kw)
    b = simulate(tr, "jsq", engine="python", **kw)
    for k in a.series:
        assert np.array_equal(a.series[k], b.series[k], equal_nan=True), k
    assert a.step_breakdown == b.step_breakdown
    bd = a.step_breakdown
    assert bd["layers_simulated"] == 2 and bd["layer_scale"] == 47.0
    assert bd["table_refreshes"] > 0 and bd["moe_us"] > bd["moe_straggler_us"] >= 0
    # the engine's step is the decomposition's total (attention priced in seconds there)
    np.testing.assert_allclose(a.series["step_s"], a.series["total_us"] / 1e6, rtol=1e-9)


def test_a_config_with_a_deployment_is_wired_once_and_every_run_starts_alike():
    """SimConfig holds the deployment's step (attention, layers, dense part, the load basis's
    linear step); each run prices with a fresh copy of its step model, so one config run
    twice gives the same run."""
    from straggler.sim import SimConfig, simulate
    from straggler.sim.engine.deployment import full_batch_step

    dep = DeploymentConfig(preset="qwen3_235b", n_gpus=4, layers=2, dispatch="tempo", seed=3,
                           dispatch_period_s=0.05, placement_period=30)  # fmt: skip
    cfg = SimConfig.from_settings("jsq", n_replicas=4, max_slots=8, deployment=dep)
    pre = dep.preset
    assert cfg.step.deploy and cfg.step.n_layers == pre.n_layers
    assert (cfg.step.t0, cfg.step.kappa) == (pre.attention.a / 1e6, pre.attention.b / 1e6)
    assert (cfg.cluster.t0, cfg.cluster.kappa) == full_batch_step(StepModel(dep), 8)
    a, b = (simulate(_trace(60, 2), config=cfg) for _ in range(2))
    assert a.step_breakdown == b.step_breakdown and a.step_breakdown["placements"] > 1
    for k in a.series:
        assert np.array_equal(a.series[k], b.series[k], equal_nan=True), k


def test_deployment_must_match_the_cluster():
    from straggler.sim import simulate

    with pytest.raises(InvalidInputError, match="'deployment'"):
        simulate(
            _trace(5), "jsq", n_replicas=4, deployment=DeploymentConfig(preset="dsv3", n_gpus=8)
        )
    with pytest.raises(InvalidInputError, match="'deployment'"):
        simulate(_trace(5), "jsq", n_replicas=4, deployment="dsv3")


# --- offered load against the binding stage -----------------------------------------------


def test_load_basis_and_binding_stage():
    from straggler.sim import simulate
    from straggler.sim.engine.simulator import decode_capacity, prefill_capacity

    tr = _trace(200, 2)
    kw = dict(n_replicas=4, max_slots=8, prefill_instances=1, prefill_tokens_per_s=5_000.0)
    dec = simulate(tr, "jsq", load=0.8, load_basis="decode", **kw)
    cap = decode_capacity(tr, n_replicas=4, max_slots=8, kv_capacity=500_000)
    pf = prefill_capacity(tr, prefill_instances=1, prefill_tokens_per_s=5_000.0)
    assert cap["rate_per_s"] > pf  # one slow prefill instance binds
    assert dec.binding_stage == "prefill" and dec.offered_load == 0.8
    assert dec.offered_decode_load == pytest.approx(0.8)
    assert dec.offered_prefill_load == pytest.approx(0.8 * cap["rate_per_s"] / pf)
    bind = simulate(tr, "jsq", load=0.8, load_basis="binding", **kw)
    assert bind.offered_prefill_load == pytest.approx(0.8)
    default = simulate(tr, "jsq", load=0.8, **kw)  # the default basis is the binding stage
    assert default.offered_load == 0.8 and default.offered_prefill_load == pytest.approx(0.8)
    assert np.array_equal(default.series["step_s"], bind.series["step_s"])
    assert default.prefill_utilisation == bind.prefill_utilisation
    assert bind.offered_decode_load == pytest.approx(0.8 * pf / cap["rate_per_s"])
    # measured: prefill near its offered share, decode slots far from full
    assert 0.5 < bind.prefill_utilisation <= 1.0 + 1e-9
    assert bind.decode_utilisation < bind.prefill_utilisation
    assert bind.decode_utilisation == bind.window_slot_utilisation
    unl = simulate(tr, "jsq", load=0.8, n_replicas=4, max_slots=8, prefill_instances=0)
    assert unl.binding_stage == "decode" and np.isnan(unl.prefill_utilisation)
    # unlimited prefill: the binding stage is decode, and the default basis is decode's
    assert unl.offered_decode_load == pytest.approx(0.8)
    with pytest.raises(InvalidInputError, match="'load_basis'"):
        simulate(tr, "jsq", load=0.8, load_basis="prefill", n_replicas=4, prefill_instances=0)
    with pytest.raises(InvalidInputError, match="'load_basis'"):
        simulate(tr, "jsq", load_basis="tokens", n_replicas=4)


# --- the levers table and its command -----------------------------------------------------


def test_levers_table_cells_and_labels():
    from straggler.sim.experiments.levers import DEFAULT_CELL, levers

    dep = DeploymentConfig(preset="qwen3_235b", n_gpus=4, layers=1, seed=1)
    table = levers(
        _trace(60, 3), dep, routings=("jsq", "br0"), dispatches=("even", "token_lp"),
        placements=("eplb",), max_slots=8,
    )  # fmt: skip
    cells = [(r["routing"], r["dispatch"], r["placement"]) for r in table.rows]
    assert cells[0] == DEFAULT_CELL and len(cells) == 4 == len(set(cells))
    assert table.rows[0]["levers"] == "default" and table.rows[0]["throughput_gain_pct"] == 0.0
    labels = {c: r["levers"] for c, r in zip(cells, table.rows)}
    assert labels[("br0", "even", "eplb")] == "routing"
    assert labels[("jsq", "token_lp", "eplb")] == "dispatch"
    assert labels[("br0", "token_lp", "eplb")] == "routing+dispatch"
    for c, r in zip(cells, table.rows):
        rep = table.reports[c]
        assert r["moe_ms"] == rep.step_breakdown["moe_us"] / 1e3
        assert rep.config["deployment"].count(f"dispatch='{c[1]}'") == 1
    text = table.format()
    assert "tput %" in text and "MoE strag ms" in text
    with pytest.raises(InvalidInputError, match="'dispatches'"):
        levers(_trace(5), dep, dispatches=("fast",))


def test_simulate_command_prints_the_levers_table(capsys):
    from straggler.runtime.commands.simulate import main

    args = ["bursty", "--moe", "qwen3_235b", "--ep", "4", "--requests", "40", "--layers", "1"]
    rc = main(args + ["--routings", "jsq", "--dispatches", "even,tempo", "--placements",
                      "eplb", "--no-progress"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "qwen3_235b, EP = DP = 4" in out and "dispatch" in out
    assert main(["bursty", "--moe", "llama", "--requests", "5", "--no-progress"]) == 2
    assert "'preset'" in capsys.readouterr().err


def test_load_sweep_cells_say_which_stage_binds():
    from straggler.sim.experiments.load_sweep import load_sweep_cell

    kw = dict(n_requests=150, prefill="default")
    cell = load_sweep_cell("azure_code", 2, 1.0, "jsq", load_basis="decode", **kw)
    assert cell["binding_stage"] == "prefill"  # one default prefill instance binds here
    assert cell["offered_prefill_load"] > 1.0 and cell["offered_load"] == 1.0
    assert 0.0 <= cell["decode_utilisation"] <= 1.0
    bind = load_sweep_cell("azure_code", 2, 1.0, "jsq", **kw)  # default: the binding stage
    assert bind["binding_stage"] == "prefill"
    assert bind["offered_prefill_load"] == pytest.approx(1.0)
    assert bind["decode_utilisation"] < cell["decode_utilisation"]


def test_simulate_command_states_the_load_basis(capsys):
    from straggler.runtime.commands.simulate import main

    args = ["azure_code", "--requests", "60", "--replicas", "2", "--policies", "jsq",
            "--load", "1.0", "--prefill-instances", "1", "--no-progress"]  # fmt: skip
    assert main(args) == 0
    assert "of the binding (prefill) capacity" in capsys.readouterr().out
    assert main(args + ["--load-basis", "decode"]) == 0
    assert "of the decode capacity" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(args + ["--load-basis", "tokens"])
    assert e.value.code == 2 and "--load-basis" in capsys.readouterr().err
