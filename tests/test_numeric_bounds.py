"""Numbers the code cannot hold are refused up front, with the bound named; the largest
accepted value is solved.

Each bound is derived where it is defined: ``CostModel``'s parameters (every time stays
finite), its ``tile`` (float64-exact), a layer's total tokens (float64 sums exact), the
per-token baselines' layout (memory per token), the deployment's replication (every expert
on every GPU at most), and the HiGHS backend's own limits for ``milp``.
"""

import math

import numpy as np
import pytest
from straggler.baselines.dispatch import tokens as tokens_mod
from straggler.formulations import CostModel, DispatchProblem, InvalidInputError, evaluate
from straggler.formulations.cost import MAX_COST_PARAMETER, MAX_TILE
from straggler.formulations.validation import MAX_EXACT_INT
from straggler.sim.engine import deployment as deployment_mod
from straggler.sim.engine.deployment import (
    DeploymentConfig,
    RoutingModel,
    StepModel,
    simulate_steps,
)
from straggler.solvers import solve_dispatch
from straggler.solvers.dispatch.milp import HIGHS_INFINITE_BOUND, HIGHS_LARGE_MATRIX_VALUE

PARAMS = ("a", "b", "c", "beta", "b2", "c2", "gamma")
BASE = dict(a=0.0, b=1.0, c=0.0, beta=0.1, b2=0.0, c2=1.0, gamma=0.01)
REP = np.ones((3, 2), bool)


def _above(x):
    return float(np.nextafter(x, math.inf))


@pytest.mark.parametrize("name", PARAMS)
def test_a_cost_parameter_at_its_bound_gives_finite_times(name):
    cost = CostModel(**(BASE | {name: MAX_COST_PARAMETER}))
    # the most tokens a layer may hold, on one expert and over three
    for counts in ([2**52, 2**52, 0], [2**52, 2**50, 3]):
        p = DispatchProblem(counts=counts, replicas=REP)
        for method in ("tempo", "round_robin", "semi_matching"):
            r = solve_dispatch(p, cost, method=method)
            assert math.isfinite(r.makespan) and np.isfinite(r.gpu_time).all(), method
            assert math.isfinite(evaluate(p, cost, r.shares).makespan)
    with pytest.raises(InvalidInputError, match=f"'{name}' parameter of CostModel.*8.45"):
        CostModel(**(BASE | {name: _above(MAX_COST_PARAMETER)}))
    with pytest.raises(InvalidInputError, match=f"'{name}' parameter of CostModel"):
        CostModel(**(BASE | {name: 1e308}))


def test_tile_bound():
    p = DispatchProblem(counts=[2**52, 5, 0], replicas=REP)
    cost = CostModel(a=0, b=1, b2=2, c=0, beta=0.1, tile=MAX_TILE)
    r = solve_dispatch(p, cost, method="tempo")
    assert math.isfinite(r.makespan)
    for tile in (MAX_TILE + 1, 2**70):
        with pytest.raises(InvalidInputError, match="'tile' parameter of CostModel"):
            CostModel(a=0, b=1, c=0, beta=0.1, tile=tile)


def test_a_layer_holds_at_most_2_53_tokens():
    ok = DispatchProblem(counts=[2**52, 2**52 - 7, 7], replicas=REP)
    r = solve_dispatch(ok, CostModel(a=0, b=1, c=0, beta=1e-9), method="tempo")
    assert r.shares.sum() == MAX_EXACT_INT  # every token placed, exactly
    with pytest.raises(InvalidInputError, match="'counts' parameter of DispatchProblem.*2\\*\\*53"):
        DispatchProblem(counts=[2**52, 2**52 - 6, 7], replicas=REP)
    with pytest.raises(InvalidInputError, match="in layer 1"):
        DispatchProblem(counts=[[1, 1, 1], [2**52] * 3], replicas=REP)


@pytest.mark.parametrize("method", ["static", "sglang_dynamic", "vllm_ep", "lplb"])
def test_per_token_methods_refuse_a_layer_they_cannot_lay_out(method, monkeypatch):
    cost = CostModel(a=0, b=1, c=0, beta=0.1)
    # the real bound: refused before anything is laid out (not a MemoryError)
    big = DispatchProblem(counts=[2**40, 3, 2], replicas=REP)
    with pytest.raises(InvalidInputError, match="'counts' of a layer dispatched token by token"):
        solve_dispatch(big, cost, method=method)
    # the edge, on a small bound: the largest accepted layer is dispatched, the next refused
    monkeypatch.setattr(tokens_mod, "MAX_LAYOUT_ASSIGNMENTS", 60)
    r = solve_dispatch(DispatchProblem(counts=[30, 20, 10], replicas=REP), cost, method=method)
    assert r.shares.sum() == 60
    with pytest.raises(InvalidInputError, match="at most 2\\*\\*26"):
        solve_dispatch(DispatchProblem(counts=[30, 20, 11], replicas=REP), cost, method=method)


def test_deployment_replication_at_most_every_expert_on_every_gpu():
    kw = dict(preset="dsv3", n_gpus=4, layers=1, seed=0)
    kv, req = np.full((2, 4), 1000), np.full((2, 4), 8)
    run = simulate_steps(DeploymentConfig(**kw, replication=4), kv, req)
    assert np.isfinite(run.steps["moe_us"]).all()
    for bad in (_above(4.0), 1e12):
        with pytest.raises(InvalidInputError, match="'replication' parameter of DeploymentConfig"):
            DeploymentConfig(**kw, replication=bad)
    # the preset's replication, on fewer GPUs than it needs, is capped
    assert DeploymentConfig(preset="dsv3", n_gpus=1, layers=1).replication == 1.0


def test_milp_refuses_what_highs_cannot_hold_naming_cost():
    p = DispatchProblem(counts=[50, 30, 20], replicas=REP)
    ok = solve_dispatch(p, CostModel(a=0, b=1e14, c=0, beta=0.1), method="milp")
    assert ok.success and math.isfinite(ok.makespan)
    for kw in (dict(b=HIGHS_LARGE_MATRIX_VALUE), dict(beta=1e200), dict(b=MAX_COST_PARAMETER)):
        with pytest.raises(
            InvalidInputError, match="'cost' parameter of solve_dispatch\\(method='milp'\\)"
        ):
            solve_dispatch(p, CostModel(**(dict(a=0, b=1, c=0, beta=0.1) | kw)), method="milp")
    near = solve_dispatch(
        p, CostModel(a=0.9 * HIGHS_INFINITE_BOUND, b=1, c=0, beta=0.1), method="milp"
    )
    assert near.success
    with pytest.raises(InvalidInputError, match="infinite_bound"):
        solve_dispatch(p, CostModel(a=HIGHS_INFINITE_BOUND, b=1, c=0, beta=0.1), method="milp")


def test_a_step_samples_at_most_2_26_choices(monkeypatch):
    """Every running request's top_k choices are sampled one by one: 2**40 requests ran for
    hours (no signal reaches the kernel); more than MAX_STEP_CHOICES is refused up front,
    naming 'requests', the bound itself is run."""
    assert deployment_mod.MAX_STEP_CHOICES == 2**26
    cfg = DeploymentConfig(preset="dsv3", n_gpus=2, layers=1, seed=0)  # top_k = 8
    kv = np.full((2, 2), 1000)
    monkeypatch.setattr(deployment_mod, "MAX_STEP_CHOICES", 2 * 8 * 50)
    run = simulate_steps(cfg, kv, np.full((2, 2), 50))
    assert np.isfinite(run.steps["total_us"]).all()
    for req in (np.array([[50, 50], [50, 51]]), np.full((2, 2), 2**40), np.full((2, 2), 2**62)):
        with pytest.raises(InvalidInputError, match="'requests' parameter of simulate_steps"):
            simulate_steps(cfg, kv, req)
    with pytest.raises(InvalidInputError, match="'requests' parameter of StepModel.step"):
        StepModel(cfg).step(kv[0], [2**40, 0], 0.0)


@pytest.mark.parametrize("kappa", [5e-324, 1e-300, 1e-6])
def test_dirichlet_fluctuation_at_tiny_kappa_is_one_hot_not_nan(kappa):
    """At a tiny kappa every gamma of a row underflows to 0; 0/0 gave NaN popularities
    (sampled as garbage). The row is the Dirichlet's limit: one expert takes the mass."""
    rm = RoutingModel.zipf(64, 1.0, n_layers=3, kappa=kappa, rng=0)
    rd = RoutingModel.zipf(64, 1.0, n_layers=3, kappa=kappa, drift=0.5, drift_steps=1, rng=0)
    gen = np.random.default_rng(0)
    for pop in (rm.batch_popularities(gen, 5), rd.batch_popularities(gen, 3, rd.drift_state(0))):
        assert np.isfinite(pop).all() and (pop > 0).all()
        np.testing.assert_allclose(pop.max(axis=-1), 1.0)  # one expert holds the mass
    # a kappa whose gammas do not underflow draws exactly what plain gammas give
    rm = RoutingModel.zipf(8, 1.0, kappa=2.0, rng=0)
    g = np.random.default_rng(1).standard_gamma(2.0 * rm.long_run(), size=(4, 1, 8))
    want = np.maximum(g / g.sum(axis=2, keepdims=True), np.finfo(float).tiny)
    np.testing.assert_array_equal(rm.batch_popularities(np.random.default_rng(1), 4), want)


def test_deployment_times_stay_finite():
    """internode_us_per_token=1.8e308 made step times infinite, and simulate_steps then
    failed naming StepModel.step's 'now_s', a parameter the caller never passed; resident
    KV tokens are bounded as counts are (2**53)."""
    kw = dict(preset="dsv3", n_gpus=2, n_nodes=2, layers=1, seed=0)
    kv, req = np.full((2, 2), 1000), np.full((2, 2), 8)
    run = simulate_steps(DeploymentConfig(**kw, internode_us_per_token=MAX_COST_PARAMETER), kv, req)
    assert np.isfinite(run.steps["total_us"]).all() and np.isfinite(run.time_s).all()
    with pytest.raises(InvalidInputError, match="'internode_us_per_token' parameter of Deploy"):
        DeploymentConfig(**kw, internode_us_per_token=float(np.finfo(float).max))
    cfg = DeploymentConfig(**kw)
    assert np.isfinite(simulate_steps(cfg, np.full((2, 2), 2.0**53), req).steps["total_us"]).all()
    for bad in (2.0**53 + 2, 1e300):
        with pytest.raises(InvalidInputError, match="'kv' parameter of simulate_steps"):
            simulate_steps(cfg, np.full((2, 2), bad), req)
        with pytest.raises(InvalidInputError, match="'kv' parameter of StepModel.step"):
            StepModel(cfg).step([bad, 0], [8, 8], 0.0)
