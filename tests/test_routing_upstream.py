"""The routing baselines pinned rule by rule against their upstreams.

Every expected assignment below was worked out by hand from the upstream code the baseline
names (SGLang's DP controller and gateway, vLLM's DP load balancer, TensorRT-LLM's attention-DP
router and balance, Dynamo's KV router), version by version.
"""

import pytest
from straggler.formulations import InvalidInputError, InvalidOptionError
from straggler.solvers import get_routing_policy
from straggler.solvers.routing.route import route_batch
from straggler.solvers.routing.routers import ROUTERS, Router

_M, _A = 2147483647, 48271


def _first_draw(seed: int) -> int:
    """The first MINSTD number of a tick seeded ``seed`` (the kernels' documented stream)."""
    return (_A * (seed % (_M - 1) + 1)) % _M


def _a(*args, **kw):
    return route_batch(*args, **kw).assignment.tolist()


# --- SGLang DP controller: total_tokens (jsq), total_requests ---------------------------------


def test_jsq_versions_differ_by_the_token_increment():
    # +prompt (#22614): the 50-token request makes rank 0 heavier than rank 1 (30 tokens)
    assert _a([50, 10], [0, 30], [2, 2], policy="jsq") == [0, 1]
    # +1 only (before #22614): rank 0 still reads 0 tokens, so the second request follows
    assert _a([50, 10], [0, 30], [2, 2], policy="jsq", version="plus_one") == [0, 0]


def test_jsq_counts_the_waiting_queue_as_sglang_num_total_tokens():
    # num_total_tokens = KV in use + the waiting requests' lengths: 10 < 0 + 20
    assert _a([5], [10, 0], [1, 1], policy="jsq", waiting_tokens=[0, 20]) == [0]
    # ties on tokens fall to fewer running + waiting requests (1 < 0 + 2)
    kw = dict(policy="jsq", n_running=[1, 0], n_waiting=[0, 2])
    assert _a([5], [5, 5], [1, 1], **kw) == [0]


def test_jsq_requests_is_first_minimum_of_running_plus_waiting():
    kw = dict(policy="jsq_requests", n_running=[2, 1], n_waiting=[0, 2])
    assert _a([5], [0, 0], [1, 1], **kw) == [0]
    assert _a([5, 5, 5], [0, 0], [3, 3], **kw) == [0, 0, 1]  # 2<3, then 3=3 (first), 4>3


# --- vLLM DP load balancer --------------------------------------------------------------------


def test_vllm_issue_example_waiting_versus_running():
    """(waiting, running) = (0, 6) vs (2, 0): 6 < 8 under 4w + r; 6 > 2 under #49204."""
    kw = dict(policy="vllm", n_running=[6, 0], n_waiting=[0, 2])
    assert _a([1], [0, 0], [1, 1], version="legacy", **kw) == [0]
    assert _a([1], [0, 0], [1, 1], version="rotate_4w", **kw) == [0]
    assert _a([1], [0, 0], [1, 1], **kw) == [1]


def test_vllm_kv_pressure_penalty_on_waiting_requests():
    kw = dict(policy="vllm", n_running=[0, 3], n_waiting=[2, 0])
    # 2 + 2 * 6 * (0.9 - 0.5) = 6.8 > 3: the queue on a KV-bound engine is avoided
    assert _a([1], [0, 0], [1, 1], kv_usage=[0.9, 0.1], **kw) == [1]
    # at <= 50% usage the penalty is off: 2 < 3
    assert _a([1], [0, 0], [1, 1], kv_usage=[0.5, 0.1], **kw) == [0]


def test_vllm_start_rotates_after_every_pick_and_persists_in_the_carry():
    L, free = [0, 0, 0], [1, 1, 1]
    d = route_batch([1], L, free, policy="vllm")
    assert d.assignment.tolist() == [0] and d.extras["carry"].start == 1
    # the next tick sees the same (fresh) counts: the tie now goes to rank 1 (#47420)
    d2 = route_batch([1], L, free, policy="vllm", carry=d.extras["carry"])
    assert d2.assignment.tolist() == [1] and d2.extras["carry"].start == 2
    d3 = route_batch([1], L, free, policy="vllm", version="rotate_4w", carry=d2.extras["carry"])
    assert d3.assignment.tolist() == [2]
    # legacy: the scan starts where the carry says and the start never moves
    old = route_batch([1], L, free, policy="vllm", version="legacy", carry=d2.extras["carry"])
    assert old.assignment.tolist() == [2] and old.extras["carry"].start == 2
    # a strictly lower score still wins wherever the scan starts (rank 2 is busier)
    c = get_routing_policy("vllm").carry(start=2)
    assert _a([1], L, free, policy="vllm", n_running=[0, 0, 1], carry=c) == [0]


def test_vllm_inflight_count_spreads_a_burst_even_without_the_optimistic_update():
    L, free = [0, 0, 0], [3, 3, 3]
    assert _a([1, 1, 1], L, free, policy="vllm", optimistic=False) == [0, 1, 2]
    assert _a([1, 1, 1], L, free, policy="vllm", version="legacy") == [0, 1, 2]
    # legacy without the local waiting += 1: every pick reads the same snapshot
    kw = dict(policy="vllm", version="legacy", optimistic=False)
    assert _a([1, 1, 1], L, free, **kw) == [0, 0, 0]


def _p2c_seed(G: int, a: int, u: int) -> int:
    """The first seed whose tick draws ``randrange(G) = a`` then ``randrange(G - 1) = u``
    (every replica with a free slot; the kernels' MINSTD stream)."""
    for seed in range(200_000):
        x = _first_draw(seed)
        if x % G == a and (_A * x) % _M % (G - 1) == u:
            return seed
    raise AssertionError((G, a, u))


@pytest.mark.parametrize("version", ["current", "rotate_4w", "legacy", "p2c"])
def test_vllm_start_option_seeds_the_scan(version):
    """vLLM's eng_start_index = (G * client_index) // client_count: front-end ``c`` of ``C``
    passes ``start=``; on idle engines the scan's first engine wins (strict ``<``)."""
    L, free = [0] * 3, [1] * 3
    for start in range(3):
        d = route_batch([1], L, free, policy="vllm", version=version, start=start)
        assert d.assignment.tolist() == [start]
        again = route_batch([1], L, free, policy="vllm", version=version, carry=d.extras["carry"])
        assert again.assignment.tolist() == [(start + (version in ("current", "rotate_4w"))) % 3]
    pol = get_routing_policy("vllm")
    c = pol.carry(start=5)  # the start is taken modulo G, as the option is
    assert _a([1], L, free, policy="vllm", carry=c) == _a([1], L, free, policy="vllm", start=5)
    with pytest.raises(InvalidInputError, match="start"):
        route_batch([1], L, free, policy="vllm", start=-1)


def test_vllm_p2c_full_scan_up_to_four_engines_draws_nothing():
    """vLLM #43279: at G <= 4 the legacy scan decides, whatever the seed."""
    run, wait = [1, 0, 4, 0], [2, 0, 3, 5]  # 4w + r = 9, 0, 16, 20
    for G in (1, 2, 3, 4):
        kw = dict(policy="vllm", n_running=run[:G], n_waiting=wait[:G])
        legacy = _a([1] * 5, [0] * G, [5] * G, version="legacy", **kw)
        for seed in range(5):
            assert _a([1] * 5, [0] * G, [5] * G, version="p2c", rng=seed, **kw) == legacy
    assert _a([1], [0] * 4, [1] * 4, policy="vllm", version="p2c", n_running=run,
              n_waiting=wait) == [1]  # fmt: skip


def test_vllm_p2c_picks_the_better_of_the_two_drawn():
    G = 8
    kw = dict(policy="vllm", version="p2c", n_waiting=list(range(G)))  # score 4 * g
    # (a, b) = (2, 7): randrange(7) = 6 >= 2 is bumped to 7; 8 < 28 keeps a
    assert _a([1], [0] * G, [1] * G, rng=_p2c_seed(G, 2, 6), **kw) == [2]
    # (a, b) = (7, 2): b scores strictly lower
    assert _a([1], [0] * G, [1] * G, rng=_p2c_seed(G, 7, 2), **kw) == [2]
    # randrange(G - 1) equal to a: b moves to a + 1, never a itself
    w = [0] * G
    w[3] = 10
    kw = dict(policy="vllm", version="p2c", n_waiting=w)
    assert _a([1], [0] * G, [1] * G, rng=_p2c_seed(G, 3, 3), **kw) == [4]
    # equal scores: the first draw is kept
    kw = dict(policy="vllm", version="p2c", n_waiting=[2] * G, n_running=[1] * G)
    assert _a([1], [0] * G, [1] * G, rng=_p2c_seed(G, 1, 5), **kw) == [1]


@pytest.mark.parametrize("G", [5, 6, 8])
def test_vllm_p2c_reaches_every_ordered_pair_once(G):
    """Every (randrange(G), randrange(G - 1)) maps to a distinct ordered pair of distinct
    engines; with score = g the lower index wins."""
    kw = dict(policy="vllm", version="p2c", n_running=list(range(G)))
    pairs = set()
    for a in range(G):
        for u in range(G - 1):
            b = u + 1 if u >= a else u
            assert _a([1], [0] * G, [1] * G, rng=_p2c_seed(G, a, u), **kw) == [min(a, b)]
            pairs.add((a, b))
    assert pairs == {(i, j) for i in range(G) for j in range(G) if i != j}


def test_vllm_p2c_starves_no_engine_and_updates_only_the_chosen():
    G = 16
    seen = set()
    for seed in range(2000):  # idle engines, one request per tick
        seen.update(_a([1], [0] * G, [1] * G, policy="vllm", version="p2c", rng=seed))
    assert seen == set(range(G))
    # a burst: the chosen engine's waiting += 1 only, so a second draw of the same pair moves
    # on to the other engine (all other engines keep their snapshot)
    G = 5
    seed = _p2c_seed(G, 1, 3)  # (1, 4), then the stream's next pair
    one = _a([1], [0] * G, [2] * G, policy="vllm", version="p2c", rng=seed)
    two = _a([1, 1], [0] * G, [2] * G, policy="vllm", version="p2c", rng=seed)
    assert one == [1] and two[0] == 1
    x = (_A * ((_A * _first_draw(seed)) % _M)) % _M
    a2, u2 = x % G, (_A * x) % _M % (G - 1)
    b2 = u2 + 1 if u2 >= a2 else u2
    waiting = [0, 1, 0, 0, 0]
    want = a2 if 4 * waiting[a2] <= 4 * waiting[b2] else b2
    assert two[1] == want


# --- SGLang gateway: power of two -------------------------------------------------------------


@pytest.mark.parametrize(
    "version, state, expected",
    [
        # (0 + 0) / 2000 + 0.15 * 0.5 / 0.5 = 0.15 < 4000 / 2000 + 0.15 * 0.1 / 0.9
        ("expected_wait", dict(waiting_tokens=[0, 4000], kv_usage=[0.5, 0.1]), 0),
        # the KV ratio alone ignores the queue: 0.5 > 0.1
        ("token_usage", dict(waiting_tokens=[0, 4000], kv_usage=[0.5, 0.1]), 1),
        ("tokens", dict(waiting_tokens=[15, 0]), 1),  # 10 + 15 > 20 + 0
        ("tokens", dict(), 0),  # 10 < 20
        ("inflight", dict(n_running=[5, 1], n_waiting=[0, 1]), 1),  # 5 > 2
    ],
)
def test_p2c_metric_by_gateway_version(version, state, expected):
    for seed in range(6):  # with two replicas the pair is always {0, 1}: the metric decides
        got = _a([1], [10, 20], [1, 1], policy="p2c", version=version, rng=seed, **state)
        assert got == [expected], (version, seed)


def test_p2c_ties_go_to_the_first_draw_and_the_pair_is_distinct():
    for seed in range(20):
        first = _first_draw(seed) % 2
        assert _a([1], [5, 5], [1, 1], policy="p2c", version="tokens", rng=seed) == [first]
    # the most loaded of three is always compared with a lighter one: it never wins
    kw = dict(policy="p2c", version="tokens")
    picks = {_a([1], [0, 1, 2], [1, 1, 1], rng=s, **kw)[0] for s in range(60)}
    assert picks == {0, 1}


def test_p2c_expected_wait_credits_what_it_placed_this_tick():
    kw = dict(policy="p2c", kv_usage=[0.2, 0.2], rng=3)
    # two requests on two equal replicas: the credit of the first sends the second elsewhere
    assert sorted(_a([4000, 4000], [0, 0], [2, 2], **kw)) == [0, 1]
    # without it both are ties, each going to its own first draw (draws 1 and 3 of the stream)
    x1 = _first_draw(3)
    x3 = (_A * ((_A * x1) % _M)) % _M
    assert _a([4000, 4000], [0, 0], [2, 2], optimistic=False, **kw) == [x1 % 2, x3 % 2]


# --- TensorRT-LLM attention DP --------------------------------------------------------------------


def test_trtllm_counts_original_prompt_lengths_not_resident_kv():
    """Loads [5100, 3000], rank 0 holds a 100-token prompt that decoded 5,000."""
    assert _a([10], [5100, 3000], [1, 1], policy="trtllm", prompt_tokens=[100, 3000]) == [0]
    # the active requests include the rank's queued ones: 100 < 0 + 200
    kw = dict(policy="trtllm", prompt_tokens=[100, 0], waiting_tokens=[0, 200])
    assert _a([10], [0, 0], [1, 1], **kw) == [0]


def test_trtllm_longest_first_and_cap_on_active_requests():
    assert _a([1, 9], [0, 0], [2, 2], policy="trtllm", prompt_tokens=[0, 5]) == [1, 0]
    # active = running + waiting = [3, 0]; cap max(ceil((3 + 3) / 2), 3) = 3 excludes rank 0
    kw = dict(policy="trtllm", n_waiting=[3, 0])
    assert _a([1, 1, 1], [0, 0], [5, 5], **kw) == [1, 1, 1]


def test_trtllm_balance_waits_for_every_rank_then_times_out():
    kw = dict(policy="trtllm_balance", n_running=[1, 1], timeout_iters=2)
    d = route_batch([5], [0, 0], [2, 2], **kw)  # one request: rank 1 gets no context request
    assert d.assignment.tolist() == [-1] and d.extras["carry"].adp_wait == 1
    d = route_batch([5], [0, 0], [2, 2], carry=d.extras["carry"], **kw)
    assert d.assignment.tolist() == [0] and d.extras["carry"].adp_wait == 0  # timeout


def test_trtllm_balance_releases_when_a_rank_has_no_running_request():
    kw = dict(policy="trtllm_balance", n_running=[1, 0])  # rank 1 idle: no point waiting
    assert _a([5], [0, 0], [2, 2], **kw) == [1]  # fewer requests on rank 1


def test_trtllm_balance_batching_wait_once_every_rank_can_take_some():
    kw = dict(policy="trtllm_balance", n_running=[1, 1], batching_wait_iters=1)
    d = route_batch([5, 3], [0, 0], [2, 2], **kw)
    assert d.assignment.tolist() == [-1, -1] and d.extras["carry"].adp_batch == 1
    d = route_batch([5, 3], [0, 0], [2, 2], carry=d.extras["carry"], **kw)
    assert d.assignment.tolist() == [0, 1] and d.extras["carry"].adp_batch == 0
    # a rank with no free slot: not every rank can take one, so hold (and count toward timeout)
    full = route_batch([5, 3], [0, 0], [2, 0], **kw)
    assert full.assignment.tolist() == [-1, -1] and full.extras["carry"].adp_wait == 1
    # a request already queued on rank 1 counts as its context request
    kw = dict(policy="trtllm_balance", n_running=[1, 1], batching_wait_iters=0)
    assert _a([5], [0, 0], [2, 2], n_waiting=[0, 1], **kw) == [0]


def test_trtllm_balance_defaults_are_upstreams():
    pol = get_routing_policy("trtllm_balance")
    d = route_batch([5], [0, 0], [2, 2], policy=pol.name, n_running=[1, 1])
    assert d.extras["carry"].adp_wait == 1  # held: 50 iterations before the timeout
    defaults = {o.name: o.default for o in pol.declared}
    assert defaults["timeout_iters"] == 50 and defaults["batching_wait_iters"] == 10


# --- SGLang follow_bootstrap_room -------------------------------------------------------------


def test_follow_bootstrap_room_is_room_mod_dp_and_waits_on_its_rank():
    kw = dict(policy="follow_bootstrap_room", pool_key=[5, 8, 3, 9, 6, 4])
    # 5%4=1, 8%4=0, 3%4=3, 9%4=1 (rank 1 full now), 6%4=2 (no slot), 4%4=0 (full after 8)
    assert _a([1] * 6, [0] * 4, [1, 1, 0, 1], **kw) == [1, 0, 3, -1, -1, -1]
    # a later request whose rank has room still goes: no head-of-line blocking
    kw = dict(policy="follow_bootstrap_room", pool_key=[2, 1])
    assert _a([1, 1], [0] * 4, [1, 1, 0, 1], **kw) == [-1, 1]


def test_pool_keys_must_be_non_negative():
    with pytest.raises(InvalidInputError, match="'pool_key'"):
        route_batch([1], [0, 0], [1, 1], policy="follow_bootstrap_room", pool_key=[-3])


# --- Dynamo KV router -------------------------------------------------------------------------


def test_dynamo_cost_credits_the_cached_prefix():
    # logits (block 16): replica 0: 1024/16 + 0 + 64 = 128; replica 1: 0 + 512/16 + 64 = 96
    kw = dict(policy="dynamo", pool_cached=[[0, 1024]])
    assert _a([1024], [0, 512], [1, 1], **kw) == [1]
    assert _a([1024], [0, 512], [1, 1], policy="dynamo") == [0]  # no cache data: load only
    # credit in whole blocks: floor(1000 / 16) * 16 = 992 tokens, prefill 2 blocks: 2 + 32 + 64
    assert _a([1024], [0, 512], [1, 1], policy="dynamo", pool_cached=[[0, 1000]]) == [1]
    # a heavier replica 1 (1100 tokens): 2 + 68.75 + 64 > 128
    assert _a([1024], [0, 1100], [1, 1], policy="dynamo", pool_cached=[[0, 1000]]) == [0]
    # overlap_weight 0 ignores the cache: pure load
    assert _a([1024], [0, 512], [1, 1], overlap_weight=0, **kw) == [0]


def test_dynamo_ties_are_random_and_seeded():
    got = {s: _a([16], [0, 0], [1, 1], policy="dynamo", rng=s)[0] for s in range(20)}
    assert set(got.values()) == {0, 1}
    for s, g in got.items():
        assert g == _first_draw(s) % 2
        assert _a([16], [0, 0], [1, 1], policy="dynamo", rng=s) == [g]
    # the optimistic update sends the second of two equal requests to the other replica
    assert sorted(_a([16, 16], [0, 0], [2, 2], policy="dynamo", rng=1)) == [0, 1]


# --- versions as options ----------------------------------------------------------------------


def test_version_option_is_checked_per_policy():
    with pytest.raises(InvalidOptionError, match="'version'"):
        route_batch([1], [0, 0], [1, 1], policy="vllm", version="nope")
    with pytest.raises(InvalidOptionError, match="version"):
        route_batch([1], [0, 0], [1, 1], policy="random", version="legacy")
    assert get_routing_policy("vllm").versions[0] == "current"
    assert get_routing_policy("jsq").versions == ("prompt", "plus_one")
    assert get_routing_policy("p2c").versions[0] == "expected_wait"


def test_router_objects_pass_the_version():
    r = Router(policy="vllm", version="legacy")
    out = r([1], [0, 0], [1, 1], n_running=[6, 0], n_waiting=[0, 2]).assignment.tolist()
    assert out == [0]
    assert ROUTERS["vllm"]([1], [0, 0], [1, 1], n_running=[6, 0], n_waiting=[0, 2]).assignment[0]
