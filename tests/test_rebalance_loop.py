"""Rebalance in the loop: the copies a rearrangement needs and their time, the rebalance
path (kernel and reference), the decision, the policies and their names, SGLang's
elasticity-aware EPLB, place_experts on the active ranks, and the step model charging
rearrangements (sync stall, asynchronous delay, rank lost and back)."""

import pathlib

import numpy as np
import pytest
from straggler.baselines.placement.elasticity_aware import elasticity_aware_rebalance
from straggler.baselines.placement.sglang_clock import SGLangClock, window_utilization
from straggler.baselines.placement.vllm_clock import VllmClock
from straggler.formulations import CostModel
from straggler.formulations.errors import InvalidInputError, InvalidOptionError
from straggler.sim import drifting_windows
from straggler.sim.engine.deployment import (
    MODEL_PRESETS,
    DeploymentConfig,
    RoutingModel,
    RoutingSequence,
    StepModel,
    simulate_steps,
)
from straggler.sim.workloads.batches import num_physical_slots
from straggler.solvers import place_experts
from straggler.solvers.placement.eplb import rebalance_experts
from straggler.solvers.placement.place import moved_replicas
from straggler.solvers.placement.rebalance import _path as K
from straggler.solvers.placement.rebalance.auto import Auto, decide_rebalance
from straggler.solvers.placement.rebalance.every import Every
from straggler.solvers.placement.rebalance.never import Never
from straggler.solvers.placement.rebalance.path import (
    eplb_target,
    even_split_makespan,
    rebalance_path,
)
from straggler.solvers.placement.rebalance.policy import RebalanceContext
from straggler.solvers.placement.rebalance.registry import (
    get_rebalance_policy,
    parse_rebalance_policies,
    rebalance_policies,
)
from straggler.solvers.placement.rebalance.transfer import (
    HOST,
    MoveCost,
    expert_bytes,
    layer_transfer,
    migration_batches,
)

COST = CostModel.preset("dsv3_b_tile")


# --- the copies and their time ------------------------------------------------------------
def test_expert_bytes_of_the_presets():
    assert MODEL_PRESETS["dsv3"].expert_bytes == 3 * 7168 * 2048  # fp8: 44 MB
    assert MODEL_PRESETS["qwen3_235b"].expert_bytes == 3 * 4096 * 1536
    assert MODEL_PRESETS["dsv2_lite"].expert_bytes == 3 * 2048 * 1408 * 2  # bf16
    assert expert_bytes(10, 20, "bf16") == 1200.0
    with pytest.raises(InvalidOptionError, match="dtype"):
        expert_bytes(10, 20, "int3")


def test_migration_batches_are_vllms():
    # vLLM 0.32 schedule_migration_batches(2, old, new) on these maps, run in its environment
    old = [0, 1, 2, 3, 4, 5, 0, 1]
    new = [4, 5, 0, 1, 2, 3, 2, 3]
    got = [[tuple(f) for f in r] for r in migration_batches(old, new, 4)]
    assert got == [[(0, 1, (0, 1))], [(1, 2, (2, 3))], [(1, 3, (2, 3)), (2, 0, (4, 5))]]
    # a rank that keeps an expert in another slot needs no copy
    assert migration_batches([0, 1, 2, 3], [1, 0, 3, 2], 2) == []


def test_every_gained_expert_is_copied_once_per_rank_and_rounds_are_matchings():
    rng = np.random.default_rng(3)
    for _ in range(50):
        G, per = int(rng.integers(2, 6)), int(rng.integers(1, 4))
        E = int(rng.integers(G, G * per + 1))
        old = rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, G * per - E)]))
        new = rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, G * per - E)]))
        rounds = migration_batches(old, new, G)
        got = sorted((d, e) for r in rounds for s, d, ex in r for e in ex)
        want = sorted(
            (r, e)
            for r in range(G)
            for e in set(new[r * per : (r + 1) * per]) - set(old[r * per : (r + 1) * per])
        )
        assert got == want
        for r in rounds:
            ends = [x for s, d, _ in r for x in (s, d)]
            assert len(ends) == len(set(ends))
            for s, _, ex in r:
                assert all(e in old[s * per : (s + 1) * per] for e in ex)


def test_layer_transfer_times():
    m = MoveCost(expert_bytes=1e9, intra_gbps=100.0, inter_gbps=10.0, host_gbps=5.0)
    # rank 0 gets two experts from rank 1 (another node): 2 GB at 10 GB/s
    t = layer_transfer([0, 1, 2, 3], [2, 3, 2, 3], 2, m, node=[0, 1])
    assert (t.copies, t.bytes, t.seconds, t.batched_seconds, t.rounds, t.peers) == (
        2, 2e9, 0.2, 0.2, 1, 1,
    )  # fmt: skip
    # same node: NVLink
    assert layer_transfer([0, 1, 2, 3], [2, 3, 2, 3], 2, m).seconds == 0.02
    # rank 1 lost: experts 2 and 3 come from host memory
    t = layer_transfer([0, 1, 2, 3], [2, 3, -1, -1], 2, m, active=[True, False])
    assert t.copies == 2 and t.seconds == 0.4 and t.peers == 0
    assert migration_batches([0, 1, 2, 3], [2, 3, -1, -1], 2, active=[1, 0])[0][0].src == HOST
    # three ranks send to one: all at once the receiver's 3 GB; in rounds 3 x 1 GB
    old = list(range(12))
    t = layer_transfer(old, [3, 6, 9] + old[3:], 4, m, node=[0, 1, 2, 3])
    assert t.seconds == pytest.approx(0.3) and t.batched_seconds == pytest.approx(0.3)
    assert t.peers == 3 and t.rounds == 3


def test_move_cost_validation_names_the_parameter():
    with pytest.raises(InvalidOptionError, match="mode"):
        MoveCost(expert_bytes=1.0, mode="lazy")
    with pytest.raises(InvalidInputError, match="expert_bytes"):
        MoveCost(expert_bytes=0.0)
    with pytest.raises(InvalidOptionError, match="links"):
        MoveCost(expert_bytes=1.0, links="tpu")
    assert MoveCost(expert_bytes=1.0, links="h800", inter_gbps=25).inter_gbps == 25.0


# --- the rebalance path -------------------------------------------------------------------
def _placement(rng, E, G, per, act):
    n = int(act.sum()) * per
    row = rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, n - E)]))
    out = np.full((G, per), -1, np.int64)
    out[act] = row.reshape(-1, per)
    return out


def _path_case(case):
    rng = np.random.default_rng(100 + case)
    G, per = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    act = np.ones(G, bool)
    if G > 1 and case % 3 == 1:
        act[rng.integers(G)] = False
    E = int(rng.integers(1, int(act.sum()) * per + 1))
    slots = _placement(rng, E, G, per, np.ones(G, bool))
    if case % 3 == 1:
        slots[~act] = -1
    if case % 4 == 2:
        slots[rng.integers(G), 0] = -1
        slots[~act] = -1
    target = _placement(rng, E, G, per, act)
    X = rng.poisson(rng.random(E) * 20, size=(int(rng.integers(1, 5)), E)).astype(np.int64)
    return slots, target, X, act, COST.as_array()


@pytest.mark.parametrize("case", range(40))
def test_path_kernel_matches_reference_and_reaches_the_target(case):
    args = _path_case(case)
    fns = (K.even_path_kernel, getattr(K.even_path_kernel, "py_func", K.even_path_kernel),
           K.even_path_reference)  # fmt: skip
    outs = [fn(*args) for fn in fns]
    for out in outs[1:]:
        for a, b in zip(out, outs[0]):
            assert np.array_equal(a, b, equal_nan=True)
    slots, target, X, act, _ = args
    g, j, o, n, score, _, valid = outs[0]
    s = slots.copy()
    for k in range(len(g)):
        assert s[g[k], j[k]] == o[k] and act[g[k]]
        s[g[k], j[k]] = n[k]
        if valid[k + 1]:  # a valid prefix places every expert: its score is the makespan's
            p2l = s.reshape(1, -1)
            want = even_split_makespan(X[:, None, :], p2l, s.shape[0], COST, active=act)
            assert score[k + 1] == pytest.approx(want, rel=1e-12)
    for h in range(s.shape[0]):
        assert sorted(s[h]) == sorted(target[h])
    assert valid[-1]
    assert np.array_equal(args[0], slots)  # inputs unchanged


def test_path_frontier_on_a_drifted_window():
    w = drifting_windows(n_windows=2, window=16, n_layers=2, n_experts=32, n_tokens=512,
                         top_k=4, skew=1.0, drift=1.0, rng=0)  # fmt: skip
    prev = rebalance_experts(w[0].mean(0), 40, 1, 1, 8, distinct=True)[0]
    target = eplb_target(w[1].mean(0), 40, 1, 1, 8, np.ones(8, bool))
    path = rebalance_path(w[1], prev, target, 8, COST)
    for l in range(2):
        # the placement after k moves differs from the one in force in exactly k slots
        for k in (0, 1, len(path.moves[l]) // 2, len(path.moves[l])):
            p = path.placement([k, 0] if l == 0 else [0, k])
            assert moved_replicas(prev, p)[l] == k
        assert path.score[l][-1] <= path.score[l][0] + 1e-9
    full = path.placement([len(m) for m in path.moves])
    for l in range(2):
        assert sorted(full[l]) == sorted(target[l])


# --- the decision -------------------------------------------------------------------------
def test_decision_pays_for_itself_and_grows_with_the_horizon():
    w = drifting_windows(n_windows=2, window=32, n_layers=2, n_experts=32, n_tokens=2048,
                         top_k=4, skew=1.0, drift=1.5, rng=1)  # fmt: skip
    prev = rebalance_experts(w[0].mean(0), 40, 1, 1, 8, distinct=True)[0]
    move = MoveCost(expert_bytes=44e6, inter_gbps=10.0)
    kw = dict(cost=COST, move=move, layer_scale=20.0)
    short = decide_rebalance(w[1], prev, 40, 1, 1, 8, horizon=1, **kw)
    long = decide_rebalance(w[1], prev, 40, 1, 1, 8, horizon=10**6, **kw)
    assert not short.rebalance and short.moves == 0
    assert np.array_equal(short.physical_to_logical, prev)
    assert long.rebalance and long.moves > 0 and long.gain_s > long.cost_s > 0
    assert (moved_replicas(prev, long.physical_to_logical) == long.moves_per_layer).all()
    assert str(long) == f"rebalance: yes, moves {long.moves}"
    # what it chose is, per layer, the best priced point of the frontier
    for l, (moves, _, gain, cost) in enumerate(long.frontier):
        assert long.moves_per_layer[l] == moves[int(np.argmax(gain - cost))]


def test_decision_restores_a_lost_ranks_experts_whatever_they_cost():
    w = drifting_windows(n_windows=1, window=8, n_layers=1, n_experts=16, n_tokens=256,
                         top_k=2, skew=1.0, rng=2)[0]  # fmt: skip
    prev = rebalance_experts(w.mean(0), 24, 1, 1, 4)[0]
    act = np.array([True, False, True, True])
    d = decide_rebalance(w, prev, 24, 1, 1, 4, cost=COST, move=MoveCost(expert_bytes=1e12),
                         horizon=0, active_ranks=act)  # fmt: skip
    assert d.forced and d.rebalance
    new = d.physical_to_logical
    assert (new[0, 6:12] == -1).all()
    assert set(new[0][new[0] >= 0].tolist()) == set(range(16))


# --- the policies -------------------------------------------------------------------------
def test_policy_names_and_clocks():
    assert rebalance_policies() == ["auto", "every", "never", "sglang", "vllm"]
    assert [p.label for p in parse_rebalance_policies("never,auto,vllm:100,sglang,every:7", "f")
            ] == ["never", "auto:250", "vllm:100", "sglang:1000", "every:7"]  # fmt: skip
    assert VllmClock().schedule() == (750, 3000)  # vLLM starts its counter at 3/4
    assert SGLangClock(num_iterations=4).schedule() == (5, 4)  # EPLBManager's generator
    assert Every(interval=10).schedule() == (10, 10) and Never().schedule() == (0, 0)
    assert Auto(period=5, horizon=7).horizon_steps == 7
    assert get_rebalance_policy(Never()) == Never()
    for bad in ("", "  ,", ",", "never,,auto", "auto,"):
        with pytest.raises(InvalidInputError, match="at least one"):
            parse_rebalance_policies(bad, "f")
    for bad in ("auto,auto", "never, vllm:100, vllm:100", "vllm,vllm:3000"):
        with pytest.raises(InvalidInputError, match="once"):
            parse_rebalance_policies(bad, "f")
    with pytest.raises(InvalidOptionError, match="rebalance"):
        get_rebalance_policy("sometimes")
    with pytest.raises(InvalidInputError, match="never"):
        get_rebalance_policy("never:3")
    with pytest.raises(InvalidInputError, match="every:N"):
        get_rebalance_policy("every:x")
    with pytest.raises(InvalidInputError, match="buffer_size"):
        SGLangClock(num_iterations=10, buffer_size=20)


def _ctx(hist, prev, act=None, forced=False, G=4):
    return RebalanceContext(
        history=hist, previous=prev, num_replicas=prev.shape[1], num_groups=1, num_nodes=1,
        num_gpus=G, cost=COST, move=MoveCost(expert_bytes=1e6),
        active=np.ones(G, bool) if act is None else act, forced=forced,
    )  # fmt: skip


def test_vllm_clock_plans_vllms_eplb_with_its_slots_kept():
    hist = np.random.default_rng(0).poisson([40, 20, 5, 5, 3, 1, 1, 1], size=(6, 1, 8))
    prev = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]])
    new = VllmClock().plan(_ctx(hist, prev)).physical_to_logical
    want = rebalance_experts(hist.sum(0), 12, 1, 1, 4, version="vllm",
                             old_physical_to_logical=prev)[0]  # fmt: skip
    assert np.array_equal(new, want)


def test_sglang_clock_skips_above_its_threshold_and_uses_sglangs_eplb():
    hist = np.random.default_rng(0).poisson([40, 20, 5, 5, 3, 1, 1, 1], size=(6, 1, 8))
    prev = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]])
    rate = window_utilization(hist, prev, 4)
    assert 0 < rate < 1
    assert SGLangClock(threshold=rate - 1e-9).plan(_ctx(hist, prev)) is None
    got = SGLangClock().plan(_ctx(hist, prev)).physical_to_logical
    assert np.array_equal(got, rebalance_experts(hist.sum(0), 12, 1, 1, 4, version="sglang")[0])


def test_never_restores_only_what_a_lost_rank_forces():
    hist = np.random.default_rng(0).poisson([40, 20, 5, 5, 3, 1, 1, 1], size=(6, 1, 8))
    prev = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]])
    assert Never().plan(_ctx(hist, prev)) is None
    act = np.array([True, False, True, True])
    new = Never().plan(_ctx(hist, prev, act, True)).physical_to_logical
    # experts 3, 4, 5 lost: 3 survives elsewhere; 4 and 5 take the slots of two spare replicas
    assert (new[0, 3:6] == -1).all()
    assert set(new[0][new[0] >= 0].tolist()) == set(range(8))
    assert int((new[0] != prev[0]).sum()) == 3 + 2


# --- SGLang's elasticity-aware EPLB -------------------------------------------------------
def test_elasticity_aware_fixed_expectations():
    w = [[90, 132, 40, 61, 104, 165, 39, 4]]
    p2l, l2p, cnt = elasticity_aware_rebalance(w, 12, 1, 1, 4, False, [1, 0, 1, 1])
    assert p2l.tolist() == [[1, 3, 7, 0, 0, 0, 4, 5, 6, 0, 5, 2]]  # the lost rank: expert 0
    assert l2p[0, 5].tolist() == [10, 7] and cnt.tolist() == [[1, 1, 1, 1, 1, 2, 1, 1]]
    # every rank active: SGLang's deepseek EPLB
    p2l, l2p, cnt = elasticity_aware_rebalance(w, 12, 1, 1, 4, False, [1, 1, 1, 1])
    ref = rebalance_experts(w, 12, 1, 1, 4, version="sglang")
    assert all(np.array_equal(a, b) for a, b in zip((p2l, l2p, cnt), ref))
    with pytest.raises(InvalidInputError, match="active_ranks"):
        elasticity_aware_rebalance(w, 12, 1, 1, 4, False, [0, 1, 1, 0])  # 6 slots, 8 experts
    with pytest.raises(InvalidInputError, match="active_ranks"):
        elasticity_aware_rebalance(w, 12, 1, 1, 4, False, [1, 1, 2, 1])


# --- place_experts on the active ranks ----------------------------------------------------
def test_place_experts_on_the_active_ranks():
    hist = np.random.default_rng(0).poisson([40, 20, 5, 5, 3, 1, 1, 1], size=(6, 1, 8))
    act = [1, 0, 1, 1]
    p2l, l2p, cnt = place_experts(hist, 12, 1, 1, 4, active_ranks=act)
    assert (p2l[0, 3:6] == -1).all() and set(p2l[0, p2l[0] >= 0]) == set(range(8))
    assert cnt.sum() == 9
    prev = place_experts(hist, 12, 1, 1, 4)[0]
    kept = place_experts(hist, 12, 1, 1, 4, previous=prev, active_ranks=act, max_moves=0)[0]
    lost = set(prev[0, 3:6]) - set(np.delete(prev[0], [3, 4, 5]))
    # only the lost experts move in (the budget does not count them)
    assert int((kept[0] != prev[0]).sum()) == 3 + len(lost)
    back = place_experts(hist, 12, 1, 1, 4, previous=kept, active_ranks=[1, 1, 1, 1])[0]
    assert (back >= 0).all()
    with pytest.raises(InvalidInputError, match="active_ranks"):
        place_experts(hist, 12, 1, 1, 4, active_ranks=[1, 0, 0, 0])
    with pytest.raises(InvalidInputError, match="active_ranks"):
        place_experts(hist, 12, 1, 1, 4, active_ranks=[1, 1])
    # an engine's own dispatch rule with a rank down is refused; with every rank up it places
    with pytest.raises(InvalidOptionError, match="'active_ranks'.*dispatch='vllm'"):
        place_experts(hist, 12, 1, 1, 4, active_ranks=act, dispatch="vllm")
    ref = place_experts(hist, 12, 1, 1, 4, dispatch="vllm")[0]
    got = place_experts(hist, 12, 1, 1, 4, active_ranks=[1, 1, 1, 1], dispatch="vllm")[0]
    assert np.array_equal(ref, got)


# --- the step model -----------------------------------------------------------------------
def _run(rebalance, mode="sync", n=700, events=(), **kw):
    cfg = DeploymentConfig(
        preset="qwen3_235b", n_gpus=8, layers=2, drift=1.0, drift_steps=100, seed=1,
        rebalance=rebalance, move=MoveCost(expert_bytes=18.9e6, mode=mode, inter_gbps=5.0),
        n_nodes=2, rank_events=events, **kw,
    )  # fmt: skip
    kv = np.full((n, 8), 100_000)
    req = np.full((n, 8), 64)
    model = StepModel(cfg)
    now = 0.0
    for k in range(n):
        now += model.step(kv[k], req[k], now).total_us * 1e-6
    return model


def test_sync_rearrangement_stalls_the_next_step_by_its_copies():
    m = _run("vllm:200", n=400)
    steps = m.breakdowns()
    ev = m.rebalances[0]
    assert ev["step"] == 50 and ev["applied_step"] == 50 and ev["copies"] > 0
    assert steps["rebalance_us"][50] == pytest.approx(ev["stall_s"] * 1e6)
    assert ev["stall_s"] > ev["planning_s"] > 0
    assert (np.delete(steps["rebalance_us"], [r["step"] for r in m.rebalances]) == 0).all()
    assert m.summary()["stall_s"] == pytest.approx(sum(r["stall_s"] for r in m.rebalances))
    tot = steps["attention_us"] + steps["moe_us"] + steps["dense_us"] + steps["rebalance_us"]
    assert np.allclose(steps["total_us"], tot)
    assert [r["step"] for r in m.rebalances] == [50, 250]


def test_async_rearrangement_applies_layer_by_layer_one_model_layer_per_step():
    m = _run("vllm:200", mode="async", n=400)
    ev = m.rebalances[0]
    assert ev["stall_s"] == 0.0
    # 94 model layers copied one per step, after the planning delay
    assert ev["applied_step"] >= ev["step"] + 94
    assert m.summary()["async_delay_s"] >= 0.0


def test_never_never_moves_and_a_lost_rank_is_restored():
    m = _run("never", n=300)
    assert m.rebalances == [] and m.summary()["rearrangements"] == 0
    m = _run("never", n=300, events=((100, 3, False), (200, 3, True)))
    assert [r["forced"] for r in m.rebalances] == [True]
    assert m.rebalances[0]["step"] == 100
    per = m.physical_to_logical.shape[1] // 8
    # the rank came back empty: never refills nothing it is not forced to
    assert (m.physical_to_logical[:, 3 * per : 4 * per] == -1).all()


def test_a_lost_rank_under_auto_and_sglang():
    for pol in ("auto", "sglang"):
        m = _run(pol, n=300, events=((100, 3, False), (200, 3, True)))
        down = [r for r in m.rebalances if r["step"] == 100]
        assert down and down[0]["forced"] and down[0]["stall_s"] > 0
        up = [r for r in m.rebalances if r["step"] == 200]
        per = m.physical_to_logical.shape[1] // 8
        back = m.physical_to_logical[:, 3 * per : 4 * per]
        if pol == "sglang":  # its EPLB places on every rank again
            assert up and (back >= 0).all()
        else:  # auto fills the rank back only where its decision finds it pays
            assert (back >= 0).any() == bool(up)


def test_auto_answers_a_lost_rank_as_never_does_without_planning_time():
    a = _run("auto", n=150, events=((100, 3, False),))
    nv = _run("never", n=150, events=((100, 3, False),))
    down = [r for r in a.rebalances if r["step"] == 100]
    assert len(down) == 1 and down[0]["forced"] and down[0]["planning_s"] == 0.0
    ref = [r for r in nv.rebalances if r["step"] == 100][0]
    assert down[0]["copies"] == ref["copies"] and down[0]["stall_s"] == ref["stall_s"]


def test_esft_counts_are_read_by_task_and_bad_archives_refused(tmp_path):
    from straggler.sim.workloads.drift import ESFT_TASKS, load_esft_counts

    c = np.zeros((3, 2, 8), dtype=np.int64)
    c[:, :, 1] = 6
    np.savez(tmp_path / "ok.npz", law_counts=c, intent_counts=c + 1)
    got = load_esft_counts(tmp_path / "ok.npz")
    assert list(got) == ["intent", "law"] and list(got) == [t for t in ESFT_TASKS if t in got]
    assert np.array_equal(got["law"], c)
    np.savez(tmp_path / "none.npz", other=c)
    np.savez(tmp_path / "neg.npz", law_counts=-c)
    (tmp_path / "text.npz").write_text("not an archive")
    for name in ("none.npz", "neg.npz", "text.npz", "missing.npz"):
        with pytest.raises(InvalidInputError, match="'path'.*load_esft_counts"):
            load_esft_counts(tmp_path / name)


MIXTRAL = (
    pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "expert_loads"
    / "fiddler_mixtral8x7b_popularity"
)  # fmt: skip


def test_mixtral_popularity_is_read_by_subject_in_order():
    from straggler.sim.workloads.drift import MIXTRAL_SUBJECTS, load_mixtral_popularity

    if not MIXTRAL.is_dir():
        pytest.skip(f"no recordings in {MIXTRAL}")
    base = load_mixtral_popularity(MIXTRAL)
    inst = load_mixtral_popularity(MIXTRAL, variant="instruct")
    assert list(base) == list(inst) == list(MIXTRAL_SUBJECTS)
    for name, p in base.items():
        assert p.shape == (32, 8) and p.dtype == np.int64 and (p.min() >= 0)
        assert len(set(p.sum(axis=1).tolist())) == 1  # the same tokens at every layer
        assert np.array_equal(p.sum(axis=1), inst[name].sum(axis=1))  # the same questions
        assert not np.array_equal(p, inst[name])
    # the subjects' popularity differs: the hottest expert of some layer changes
    hot = np.stack([p.argmax(axis=1) for p in base.values()])
    assert (hot != hot[0]).any(axis=0).sum() >= 16
    two = load_mixtral_popularity(MIXTRAL, subjects=["machine_learning", "college_medicine"])
    assert list(two) == ["machine_learning", "college_medicine"]
    assert np.array_equal(two["machine_learning"], base["machine_learning"])


def _popularity_file(folder, variant, subject, obj):
    import json

    from straggler.sim.workloads.drift import mixtral_popularity_file

    path = mixtral_popularity_file(folder, variant, subject)
    with open(path, "w") as fh:
        fh.write(obj if isinstance(obj, str) else json.dumps(obj))
    return path


@pytest.mark.parametrize(
    "obj, words",
    [
        ("not json", "Expecting value"),
        ([[1, 2]], "holding list"),
        ({"total_input_tokens": 3}, "holding keys ['total_input_tokens']"),
        ({"expert_popularity": []}, "holding keys ['expert_popularity']"),
        ({"expert_popularity": [[1, 2], [3]]}, '"expert_popularity"[1] is [3]'),
        ({"expert_popularity": [[1, 2], 3]}, '"expert_popularity"[1] is 3'),
        ({"expert_popularity": [[1, -2], [0, -1]]}, '"expert_popularity"[0][1] = -2'),
        ({"expert_popularity": [[1, 2.0], [2, 1]]}, '"expert_popularity"[0][1] = 2.0'),
        ({"expert_popularity": [[True, 2], [2, 1]]}, '"expert_popularity"[0][0] = True'),
        ({"expert_popularity": [[2**70, 2], [2, 1]]}, f'"expert_popularity"[0][0] = {2**70}'),
        ({"expert_popularity": [[1, 2], [2, 2]]}, '"expert_popularity"[1] sums to 4, layer 0 to 3'),
        ({"expert_popularity": [[0, 0], [0, 0]]}, '"expert_popularity"[0] sums to 0'),
    ],
)
def test_popularity_reader_names_file_and_field(tmp_path, obj, words):
    from straggler.sim.workloads.drift import load_mixtral_popularity, read_popularity

    path = _popularity_file(tmp_path, "original", "machine_learning", obj)
    for call in (
        lambda: read_popularity(path),
        lambda: load_mixtral_popularity(tmp_path, subjects=["machine_learning"]),
    ):
        with pytest.raises(InvalidInputError, match="'path'.*read_popularity") as exc:
            call()
        assert path in str(exc.value) and words in str(exc.value)


def test_mixtral_loader_refuses_missing_files_mixed_shapes_and_bad_names(tmp_path):
    from straggler.sim.workloads.drift import load_mixtral_popularity

    a = _popularity_file(tmp_path, "instruct", "college_medicine", {"expert_popularity": [[1, 1]]})
    with pytest.raises(InvalidInputError, match="No such file") as exc:
        load_mixtral_popularity(tmp_path, variant="instruct")  # the first subject is missing
    assert "college_computer_science" in str(exc.value)
    b = _popularity_file(tmp_path, "instruct", "machine_learning",
                         {"expert_popularity": [[1, 1], [2, 0]]})  # fmt: skip
    with pytest.raises(InvalidInputError, match="'folder'.*one shape") as exc:
        load_mixtral_popularity(tmp_path, variant="instruct",
                                subjects=["college_medicine", "machine_learning"])  # fmt: skip
    assert b in str(exc.value) and a not in str(exc.value)
    got = load_mixtral_popularity(tmp_path, variant="instruct", subjects=("college_medicine",))
    assert got["college_medicine"].tolist() == [[1, 1]]
    for kw, name in (
        (dict(variant="chat"), "variant"),
        (dict(subjects=["law"]), "subjects"),
        (dict(subjects=[]), "subjects"),
        (dict(subjects="machine_learning"), "subjects"),
        (dict(subjects=["college_medicine", "college_medicine"]), "subjects"),
    ):
        with pytest.raises(InvalidInputError, match=f"'{name}'"):
            load_mixtral_popularity(tmp_path, **kw)


def test_mixtral_preset_and_its_drift_in_the_step_model():
    from straggler.sim.workloads.drift import load_mixtral_popularity

    p = MODEL_PRESETS["mixtral_8x7b"]
    assert (p.n_layers, p.n_moe_layers, p.n_experts, p.top_k) == (32, 32, 8, 2)
    assert p.expert_bytes == 3 * 4096 * 14336 * 2  # bf16: 352 MB
    # the attention roofline: 41.9M bf16 weights and 4 KB of KV per token at 3.0 TB/s
    weights = 2 * (4096 * 4096 + 2 * 4096 * 8 * 128 + 4096 * 4096)
    assert p.attention.a == pytest.approx(weights / 3.0e6, abs=0.05)
    assert p.attention.b == pytest.approx(2 * 8 * 128 * 2 / 3.0e6, rel=1e-3)
    if not MIXTRAL.is_dir():
        pytest.skip(f"no recordings in {MIXTRAL}")
    pops = load_mixtral_popularity(MIXTRAL, subjects=["college_medicine", "international_law"])
    models = [RoutingModel.recorded(c[None], top_k=2, layers=2) for c in pops.values()]
    assert np.array_equal(models[1].long_run(), pops["international_law"][[0, 31]])
    kv, req = np.full((100, 8), 20_000), np.full((100, 8), 256)  # the loads bind
    runs = []
    for routing in (models[0], RoutingSequence(models, every_s=0.1)):
        cfg = DeploymentConfig(preset="mixtral_8x7b", n_gpus=8, layers=2, routing=routing,
                               placement="fixed", seed=0)  # fmt: skip
        runs.append(simulate_steps(cfg, kv, req))
    assert num_physical_slots(8, 8, cfg.replication) == 16
    # the same steps while the first subject routes, other MoE times once the second does
    second = runs[1].time_s >= 0.1
    assert 0 < second.sum() < 90
    a, b = runs[0].steps["moe_us"], runs[1].steps["moe_us"]
    assert np.array_equal(a[~second], b[~second]) and not np.array_equal(a[second], b[second])


def test_routing_sequence_switches_models_in_time():
    a = RoutingModel.zipf(128, 0.9, n_layers=2, rng=0)
    b = RoutingModel.zipf(128, 0.9, n_layers=2, rng=5)
    seq = RoutingSequence([a, b], every_s=0.5)
    cfg = DeploymentConfig(preset="qwen3_235b", n_gpus=8, layers=2, routing=seq, seed=0)
    run = simulate_steps(cfg, np.full((200, 8), 10_000), np.full((200, 8), 16))
    assert run.time_s[-1] > 1.0
    with pytest.raises(InvalidInputError, match="models"):
        RoutingSequence([a, RoutingModel.zipf(64, 0.9, rng=0)], every_s=1.0)


def test_deployment_config_refuses_rebalance_settings_without_a_policy():
    with pytest.raises(InvalidInputError, match="move"):
        DeploymentConfig(preset="dsv3", n_gpus=8, move=MoveCost(expert_bytes=1.0))
    with pytest.raises(InvalidInputError, match="rank_events"):
        DeploymentConfig(preset="dsv3", n_gpus=8, rebalance="never", rank_events=((1, 9, False),))
    with pytest.raises(InvalidOptionError, match="rebalance"):
        DeploymentConfig(preset="dsv3", n_gpus=8, rebalance="soon")


# --- the command --------------------------------------------------------------------------
def _cmd(*extra):
    from straggler.runtime.commands.simulate import main

    return main(["azure_conv", "--requests", "1500", "--moe", "dsv2_lite", "--ep", "8",
                 "--nodes", "2", "--layers", "2", "--max-slots", "64", "--prefill-instances",
                 "0", "--saturated", "--no-progress", *extra])  # fmt: skip


def test_simulate_command_compares_rebalance_policies(tmp_path, capsys):
    import json

    out = tmp_path / "r.json"
    code = _cmd("--max-steps", "900", "--rebalance", "never,vllm:50,auto:200", "--json",
                str(out), "--drift", "1.0", "--drift-steps", "200")  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0 and "balancedness" in text and "stall s" in text
    rows = {r["policy"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["never", "vllm:50", "auto:200"]
    never, short = rows["never"], rows["vllm:50"]
    # vLLM PR #50647's direction: a short synchronous clock balances more and serves less,
    # its stall the cause
    assert short["balancedness"] > never["balancedness"]
    assert short["throughput_tps"] < never["throughput_tps"] and short["stall_s"] > 0
    assert never["rearrangements"] == 0 and never["stall_s"] == 0


def test_rebalance_plot_marks_every_rearrangement(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from straggler.sim.experiments.rebalance import rebalance_loop
    from straggler.sim.workloads.traces import generate_trace

    dep = DeploymentConfig(preset="dsv2_lite", n_gpus=8, n_nodes=2, layers=2, drift=1.0,
                           drift_steps=100, seed=3)  # fmt: skip
    trace = generate_trace("azure_conv", n_requests=1500, rng=0)
    res = rebalance_loop(trace, dep, ["never", "vllm:60"], max_slots=64, saturated=True,
                         max_steps=300, prefill_instances=0)  # fmt: skip
    fig = res.plot(tmp_path / "t.png", title="x " * 200)
    assert (tmp_path / "t.png").stat().st_size > 0
    ax = fig.axes[0]
    marks = [ln for ln in ax.get_lines() if ln.get_marker() == "|"]
    n = len(res.reports["vllm:60"].rebalances)
    assert n > 0 and len(marks) == 1 and len(marks[0].get_xdata()) == n
    assert [e["time_s"] for e in res.reports["vllm:60"].rebalances] == list(marks[0].get_xdata())
    assert len(ax.get_title().splitlines()) > 1  # a long title wraps


def test_simulate_command_replays_recordings_in_turn(tmp_path, capsys):
    import json

    from straggler.runtime.engines import sample_recording

    rec = f"{sample_recording('vllm')},{sample_recording('trtllm')}"
    out = tmp_path / "r.json"
    code = _cmd("--max-steps", "300", "--rebalance", "never,sglang:100", "--json", str(out),
                "--expert-loads", rec, "--rebalance-mode", "batched")  # fmt: skip
    assert code == 0, capsys.readouterr().err
    got = json.loads(out.read_text())
    assert [r["policy"] for r in got["rows"]] == ["never", "sglang:100"]
    assert all(r["mode"] == "batched" for r in got["rows"])
    assert got["rows"][1]["rearrangements"] == len(got["rearrangements"]["sglang:100"]) > 0


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--rebalance", " , "], "argument --rebalance: expected comma-separated names"),
        (["--rebalance", "never,never"], "argument --rebalance: expected comma-separated names"),
        (["--rebalance", "never", "--expert-loads", "a,a"], "argument --expert-loads"),
        (["--rebalance", "never,soon"], "rebalance"),
        (["--rebalance", "never", "--drift", "11"], "--drift must be at most 10"),
        (["--rebalance-mode", "async"], "--rebalance-mode needs --rebalance"),
        (["--rebalance", "never", "--fail", "9:10"], "--fail"),
        (["--rebalance", "never", "--drift-every", "2"], "--drift-every needs --expert-loads"),
        (["--rebalance", "never", "--drift", "-1"], "--drift"),
    ],
)
def test_simulate_command_refuses_bad_rebalance_flags(extra, words, capsys):
    try:
        code = _cmd("--max-steps", "10", *extra)
    except SystemExit as exc:  # a usage error of the list parser (argparse's exit)
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_simulate_command_refuses_recordings_of_another_model(capsys):
    from straggler.runtime.commands.simulate import main
    from straggler.runtime.engines import sample_recording

    code = main(["azure_conv", "--requests", "100", "--moe", "dsv3", "--ep", "8", "--rebalance",
                 "never", "--expert-loads", str(sample_recording("vllm"))])  # fmt: skip
    assert code == 2 and "64 experts" in capsys.readouterr().err


def _mixtral_cmd(*extra):
    from straggler.runtime.commands.simulate import main

    return main(["azure_conv", "--requests", "6000", "--moe", "mixtral_8x7b", "--ep", "8",
                 "--layers", "2", "--max-slots", "256", "--prefill-instances", "0",
                 "--saturated", "--no-progress", *extra])  # fmt: skip


def test_simulate_command_replays_popularity_files_in_turn(tmp_path, capsys):
    import json

    from straggler.sim.workloads.drift import read_popularity

    # three workloads: w0 and its copy w0b, and w1 whose hot experts differ in every layer
    # (the placement, fitted to the first workload, is stale on w1)
    pops = {}
    for name, hot in (("w0", [0, 1]), ("w0b", [0, 1]), ("w1", [2, 3])):
        pop = np.full((32, 8), 100)
        pop[:, hot] = 500
        pops[name] = tmp_path / f"{name}.json"
        pops[name].write_text(json.dumps({"expert_popularity": pop.tolist()}))
    assert read_popularity(pops["w1"]).tolist() == pop.tolist()
    bal = {}
    for second in ("w0b", "w1"):
        out = tmp_path / f"{second}.out.json"
        recs = f"popularity:{pops['w0']},popularity:{pops[second]}"
        code = _mixtral_cmd("--max-steps", "300", "--rebalance", "never", "--json", str(out),
                            "--expert-loads", recs, "--drift-every", "0.3")  # fmt: skip
        assert code == 0, capsys.readouterr().err
        bal[second] = json.loads(out.read_text())["rows"][0]["balancedness"]
    # w1's hot experts have one replica each in w0's placement: the layers balance worse
    assert bal["w1"] < bal["w0b"] - 0.1
    # without the prefix the file is no engine's: one line, the prefix named
    code = _mixtral_cmd("--max-steps", "10", "--rebalance", "never", "--expert-loads",
                        str(pops["w0"]))  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"popularity:{pops['w0']}" in err[0]
    # a bad popularity file: one line naming the file and the field
    pops["w1"].write_text(json.dumps({"expert_popularity": [[1, 2], [3]]}))
    code = _mixtral_cmd("--max-steps", "10", "--rebalance", "never", "--expert-loads", recs)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(pops["w1"]) in err[0]
    assert '"expert_popularity"[1]' in err[0]
