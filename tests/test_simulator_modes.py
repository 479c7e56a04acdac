"""The simulator's issue-11 mechanisms: the engines' own queues, bootstrap rooms, prefix caches,
aggregated serving (context phases inside the step), and their checks."""

import pathlib

import numpy as np
import pytest
from straggler.formulations import InvalidInputError, InvalidOptionError
from straggler.sim import SimConfig, engine_inputs, simulate
from straggler.sim.engine._loop import run_engine_reference
from straggler.sim.engine.simulator import bootstrap_rooms
from straggler.sim.workloads.prefix import PrefixBlocks, load_prefix_blocks
from straggler.sim.workloads.traces import Trace, generate_trace, load_trace
from straggler.solvers import get_routing_policy

TRACES = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "traces"
INSTANT = dict(prefill_instances=0, prefill_base_s=0.0, prefill_tokens_per_s=np.inf)
FAST = dict(n_replicas=3, max_slots=4, t0=0.01, kappa=1e-5, **INSTANT)


def _trace(n=60, seed=1):
    tr = generate_trace("azure_conv", n_requests=n, rng=seed, rate=40.0)
    return Trace(
        arrival_s=tr.arrival_s, prompt_len=tr.prompt_len, output_len=np.minimum(tr.output_len, 30)
    )


def _views(tr, policy, **kw):
    """The ReplicaState of every tick (the Python engine with a spying router)."""
    run = engine_inputs(tr, SimConfig.from_settings(policy, **{**FAST, **kw}))
    inp, pol = run.inputs, run.policy
    seen = []

    def spy(pool, reps, params, carry, seed):
        seen.append((pool, reps))
        return pol.reference(pool, reps, params, carry, seed)

    run_engine_reference(inp, spy)
    return seen


def test_queue_mode_shows_the_engines_queues_to_the_router():
    tr = _trace()
    pool = _views(tr, "vllm", load=3.0)
    queue = _views(tr, "vllm", load=3.0, admission="queue")
    assert all(r.n_waiting.sum() == 0 and r.waiting_tokens.sum() == 0 for _, r in pool)
    assert any(r.n_waiting.sum() > 0 for _, r in queue)
    # every request is routed at its first tick: a queue takes it whatever the slots
    assert all((r.free_slots == len(p.prefill)).all() for p, r in queue)
    # the queued tokens are the queued requests' lengths: never more than waiting * longest
    longest = float((tr.prompt_len + tr.output_len).max())
    assert all((r.waiting_tokens <= r.n_waiting * longest).all() for _, r in queue)


def test_queue_mode_changes_the_run_and_vllm_versions_differ_there():
    tr = _trace(n=120)
    kw = dict(load=3.0, **FAST)
    a = simulate(tr, "vllm", admission="queue", **kw)
    b = simulate(tr, "vllm", admission="queue", version="legacy", **kw)
    c = simulate(tr, "vllm", **kw)
    assert a.n_finished == b.n_finished == c.n_finished == len(tr)
    assert not np.array_equal(a.requests["replica"], b.requests["replica"])
    assert not np.array_equal(a.requests["replica"], c.requests["replica"])
    # requests wait in the queues, not in the pool: the series counts both
    assert a.series["pool"].max() > 0


def test_dispatch_is_the_deprecated_name_of_admission():
    """``admission`` (pool or queue) was ``dispatch``, which names the expert-parallel problem
    elsewhere (``DeploymentConfig.dispatch``): the old keyword still works, with a warning,
    checked under its own name."""
    tr = _trace(n=30)
    new = simulate(tr, "vllm", admission="queue", load=2.0, **FAST)
    with pytest.warns(DeprecationWarning, match="admission"):
        old = simulate(tr, "vllm", dispatch="queue", load=2.0, **FAST)
    assert new.config["admission"] == old.config["admission"] == "queue"
    assert "dispatch" not in new.config
    assert np.array_equal(new.series["step_s"], old.series["step_s"])
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidOptionError, match="'dispatch'"):
        simulate(tr, "vllm", dispatch="fifo", **FAST)
    with pytest.warns(DeprecationWarning), pytest.raises(InvalidInputError, match="'dispatch'"):
        simulate(tr, "vllm", dispatch="queue", admission="queue", **FAST)


def test_follow_bootstrap_room_sends_each_request_to_its_room_mod_G():
    tr = _trace(n=80)
    for admission in ("pool", "queue"):
        r = simulate(tr, "follow_bootstrap_room", admission=admission, seed=5, load=2.0, **FAST)
        rooms = bootstrap_rooms(len(tr), 5)
        assert np.array_equal(r.requests["replica"], rooms % 3)
    other = simulate(tr, "follow_bootstrap_room", seed=6, load=2.0, **FAST)
    assert not np.array_equal(other.requests["replica"], r.requests["replica"])


def test_prefix_caches_evict_the_least_recently_used_blocks():
    """Small caches that must evict: the jitted engine (a touch log with lazy eviction) finds
    exactly the prefixes the reference finds with an OrderedDict LRU per replica, request by
    request; with room for every block more is found, so eviction happened."""
    rng = np.random.default_rng(0)
    n = 120
    tr = Trace(
        arrival_s=np.sort(rng.uniform(0, 2.0, n)),
        prompt_len=np.full(n, 12),
        output_len=rng.integers(1, 6, n),
    )
    # a few shared first blocks, then blocks from a small universe: many partial hits
    pb = PrefixBlocks.from_lists(
        [
            [int(rng.integers(3)), int(rng.integers(3, 9)), int(rng.integers(9, 30))]
            for _ in range(n)
        ],
        block_tokens=4,
    )
    kw = dict(n_replicas=3, max_slots=2, t0=0.01, kappa=0.0, **INSTANT)
    hits = {}
    for kv in (24, 4000):  # 6 blocks per replica (evicts), or room for all
        jit = simulate(tr, "jsq", prefix_blocks=pb, kv_capacity=kv, **kw)
        ref = simulate(tr, "jsq", prefix_blocks=pb, kv_capacity=kv, engine="python", **kw)
        assert np.array_equal(jit.requests["cache_hit"], ref.requests["cache_hit"])
        assert np.array_equal(jit.requests["replica"], ref.requests["replica"])
        hits[kv] = jit.requests["cache_hit"].sum()
    assert 0 < hits[24] < hits[4000]


@pytest.mark.parametrize("n_keys", [1, 5, 40])
def test_the_block_table_behaves_as_a_dict(n_keys):
    """The prefix caches' open-addressing table (insert, look up, delete with backward shift)
    against a Python dict, on random operations over keys that collide often (a table of
    ``n_keys`` keys, keys drawn from a few times more, sequential and far apart)."""
    from straggler.sim.engine._loop import _slot, _table_size, _unslot

    rng = np.random.default_rng(n_keys)
    size = _table_size(n_keys)
    D = (np.zeros(size, np.int64), np.full(size, -1, np.int64))
    ref = {}
    universe = np.concatenate([np.arange(3 * n_keys), rng.integers(0, 2**62, 2 * n_keys)])
    for t in range(4000):
        key = int(universe[rng.integers(universe.size)])
        s = _slot(D, key)
        assert (D[1][s] >= 0) == (key in ref)
        if key in ref:
            assert D[0][s] == key and D[1][s] == ref[key]
            if rng.random() < 0.5:
                _unslot(D, s)
                del ref[key]
                continue
        elif len(ref) == n_keys:
            continue
        D[0][s] = key
        D[1][s] = t
        ref[key] = t
    live = {int(k): int(v) for k, v in zip(*D) if v >= 0}
    assert live == ref


def _shared_prefix_trace():
    # request 1 shares request 0's first two blocks (block 4 tokens); request 2 shares none;
    # request 0 has left when the two others arrive
    tr = Trace(arrival_s=[0.0, 0.05, 0.05], prompt_len=[12, 12, 12], output_len=[2, 20, 20])
    pb = PrefixBlocks.from_lists([[1, 2, 3], [1, 2, 9], [5, 6, 7]], block_tokens=4)
    return tr, pb


@pytest.mark.parametrize("engine", ["numba", "python"])
def test_dynamo_follows_the_cached_prefix(engine):
    tr, pb = _shared_prefix_trace()
    kw = dict(n_replicas=2, max_slots=4, t0=0.01, kappa=0.0, engine=engine, **INSTANT)
    r = simulate(tr, "dynamo", prefix_blocks=pb, block_size=4, **kw)
    rep = r.requests["replica"]
    # request 1 on request 0's replica X: (12 - 8)/4 + 0 + 3 = 4 < 12/4 + 0 + 3 = 6; request 2
    # then: X costs 12/4 + 12/4 + 3 = 9 (request 1's tokens), the other 6
    assert rep[1] == rep[0] and rep[2] != rep[0]
    assert r.requests["cache_hit"].tolist() == [0.0, 8.0, 0.0]
    assert r.prefix_hit_rate == pytest.approx(8 / 36)
    # block_size 16 credits whole blocks only: floor(8 / 16) = 0, no credit, a fresh tie
    assert simulate(tr, "dynamo", prefix_blocks=pb, **kw).prefix_hit_rate <= 8 / 36
    # JSQ does not read the caches, but its hits are measured too
    j = simulate(tr, "jsq", prefix_blocks=pb, **kw)
    assert j.prefix_hit_rate == pytest.approx(j.requests["cache_hit"].sum() / 36)
    assert np.isnan(simulate(tr, "jsq", **kw).prefix_hit_rate)


def test_dynamo_trades_the_credit_against_the_sharers_own_load():
    # request 0 (40 tokens, 10 blocks) still runs on X when request 1 (the same 10 blocks)
    # arrives: X costs 0 + (40 + 5)/4 + 10 = 21.25 against 40/4 + 0 + 10 = 20 elsewhere; with
    # overlap_weight 2 the other replica costs 30
    tr = Trace(arrival_s=[0.0, 0.05], prompt_len=[40, 40], output_len=[50, 20])
    pb = PrefixBlocks.from_lists([list(range(10)), list(range(10))], block_tokens=4)
    kw = dict(n_replicas=2, max_slots=4, t0=0.01, kappa=0.0, block_size=4, **INSTANT)
    w1 = simulate(tr, "dynamo", prefix_blocks=pb, **kw).requests
    w2 = simulate(tr, "dynamo", prefix_blocks=pb, overlap_weight=2.0, **kw).requests
    assert w1["replica"][1] != w1["replica"][0] and w1["cache_hit"][1] == 0
    assert w2["replica"][1] == w2["replica"][0] and w2["cache_hit"][1] == 40


def test_a_small_cache_evicts():
    # kv_capacity 35 tokens holds 8 blocks of 4: after request 0 (3 blocks) and a filler of 6
    # blocks on the same single replica, request 0's first blocks are gone
    tr = Trace(arrival_s=[0.0, 0.02, 0.5], prompt_len=[12, 24, 12], output_len=[2, 2, 2])
    pb = PrefixBlocks.from_lists([[1, 2, 3], [20, 21, 22, 23, 24, 25], [1, 2, 9]], block_tokens=4)
    kw = dict(n_replicas=1, max_slots=4, t0=0.01, kappa=0.0, **INSTANT)
    small = simulate(tr, "dynamo", prefix_blocks=pb, kv_capacity=35, **kw)
    large = simulate(tr, "dynamo", prefix_blocks=pb, kv_capacity=400, **kw)
    assert large.requests["cache_hit"][2] == 8.0
    assert small.requests["cache_hit"][2] == 0.0


def test_context_phases_inside_the_step_cost_ctx_cost_per_uncached_token():
    tr = Trace(arrival_s=[0.0], prompt_len=[100], output_len=[3])
    kw = dict(n_replicas=2, max_slots=2, t0=0.01, kappa=1e-4, **INSTANT)
    r = simulate(tr, "jsq", ctx_cost=1e-3, **kw)
    # step 0: decode of the 100 resident tokens plus the 100-token context phase
    assert r.series["step_s"][0] == pytest.approx(0.01 + 1e-4 * 100 + 1e-3 * 100)
    assert r.series["step_s"][1] == pytest.approx(0.01 + 1e-4 * 101)
    assert r.series["ctx_tokens"].tolist() == [100, 0, 0]
    # TensorRT-LLM's balance ratio: mean/max processed tokens: (100 + 0) / 2 / 100, then 1/2
    assert r.series["token_balance"].tolist() == [0.5, 0.5, 0.5]
    assert r.token_balance == 0.5
    plain = simulate(tr, "jsq", **kw)
    assert plain.series["step_s"][0] == pytest.approx(0.01 + 1e-4 * 100)


def test_trtllm_balance_raises_the_token_balance_in_aggregated_serving():
    tr = generate_trace("azure_conv", n_requests=1500, rng=2, rate=30.0)
    kw = dict(n_replicas=8, max_slots=16, ctx_cost=3e-5, load=1.0, **INSTANT)
    plain = simulate(tr, "trtllm", **kw)
    held = simulate(tr, "trtllm_balance", **kw)
    assert held.token_balance > plain.token_balance + 0.2  # 0.56 -> 0.81 (seed 2)
    assert held.mean_step_ms < plain.mean_step_ms
    assert held.throughput_tps > plain.throughput_tps


def test_bad_settings_name_the_parameter():
    tr, pb = _shared_prefix_trace()
    with pytest.raises(InvalidOptionError, match="'admission'"):
        simulate(tr, "jsq", admission="engines")
    with pytest.raises(InvalidInputError, match="'ctx_cost'"):
        simulate(tr, "jsq", ctx_cost=-1.0)
    with pytest.raises(InvalidInputError, match="'prefix_blocks'"):
        simulate(tr, "dynamo", prefix_blocks=pb.subset([True, True, False]))
    with pytest.raises(InvalidInputError, match="'prefix_blocks'"):  # 4 blocks for 12 tokens
        simulate(
            tr,
            "dynamo",
            prefix_blocks=PrefixBlocks.from_lists([[1, 2, 3, 4], [], []], block_tokens=4),
        )
    with pytest.raises(InvalidInputError, match="'prefix_blocks'"):
        simulate(tr, "dynamo", prefix_blocks=[[1], [2], [3]])
    with pytest.raises(InvalidInputError, match="'offsets'"):
        PrefixBlocks(offsets=[1, 2], ids=[0])


def test_min_output_filters_the_blocks_with_the_trace():
    tr = Trace(arrival_s=[0.0, 0.05, 0.05], prompt_len=[12, 12, 12], output_len=[2, 1, 20])
    pb = PrefixBlocks.from_lists([[1, 2, 3], [7], [1, 2, 9]], block_tokens=4)
    kw = dict(n_replicas=2, max_slots=4, t0=0.01, kappa=0.0, block_size=4, **INSTANT)
    r = simulate(tr, "dynamo", prefix_blocks=pb, min_output=2, **kw)
    assert r.n_requests == 2 and r.requests["cache_hit"].tolist() == [0.0, 8.0]


@pytest.mark.skipif(
    not (TRACES / "conversation_trace.jsonl").exists(), reason="needs ../shared/data/traces"
)
def test_mooncake_blocks_line_up_with_load_trace():
    path = TRACES / "conversation_trace.jsonl"
    tr, pb = load_trace(path), load_prefix_blocks(path)
    assert len(pb) == len(tr) and pb.block_tokens == 512
    assert np.array_equal(pb.counts(), -(-tr.prompt_len // 512))  # one id per 512 tokens


def test_registry_marks_the_cache_reader():
    assert get_routing_policy("dynamo").prefix_cache
    assert not get_routing_policy("jsq").prefix_cache
