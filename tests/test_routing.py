"""route_batch, its kernels and references, the baselines, and bad input."""

import itertools
import types
from typing import NamedTuple

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit
from straggler.baselines.routing import sglang as SG
from straggler.formulations import InvalidInputError, InvalidOptionError
from straggler.formulations.results import RoutingResult, Status
from straggler.formulations.routing import (
    apply_assignment,
    check_assignment,
    f_score,
    imbalance,
)
from straggler.formulations.validation import check_int
from straggler.proofs.routing_strategies import (
    best_tick_imbalance,
    kernel_args,
    routing_instances,
)
from straggler.sim import simulate
from straggler.sim.workloads.traces import Trace
from straggler.solvers import DEFAULT_POLICY, get_routing_policy, routing_policies
from straggler.solvers._numba import address
from straggler.solvers._numba.cache import cache_stamp
from straggler.solvers.routing import _balanceroute as B
from straggler.solvers.routing import _core as K
from straggler.solvers.routing import registry as routing_registry
from straggler.solvers.routing.policy import public_carry, routing_policy
from straggler.solvers.routing.registry import register_routing_policy, router_options
from straggler.solvers.routing.route import route_batch

POLICIES = routing_policies()
#: A memory of zeros for a direct kernel call (a kernel reads its own fields, by slot, and
#: passes the array on; no policy here has more than two fields).
ZERO = np.zeros(2, np.int64)
#: The option values the kernel-level tests below are written for (stated, not defaults).
_BASE = dict(r_max=4, s_greedy=0.0, alpha=1.0, beta=1.0, gamma=1.0, optimistic=True,
             age_window=32, window=0, patience=0, age_fraction=1.0, safe=True, kv_weight=0.15,
             throughput=2000.0, block_size=16, overlap_weight=1.0, timeout_iters=50,
             batching_wait_iters=10)  # fmt: skip


def _opts(policy, **kw):
    """``policy``'s RouterOptions of ``_BASE`` with ``kw`` (through the registry's checks)."""
    pi = kw.get("new_presence")
    H = 0 if pi is None else len(pi) - 1
    pol = get_routing_policy(policy)
    base = {k: v for k, v in _BASE.items() if k in pol.options}
    return router_options(pol, 1, H, **{**base, **kw})[0]


def _state(s, L, free, n_running=None, n_waiting=None, **fields):
    """``(pool, reps)`` for a direct kernel call: lengths, loads (G,) or (G, H+1), free slots,
    optional counts and other fields (defaults as ``route_batch``'s)."""
    L = np.asarray(L, dtype=np.float64)
    L = L.reshape(-1, 1) if L.ndim == 1 else L
    G, n = L.shape[0], len(s)
    z = np.zeros(G, np.int64)
    reps = K.ReplicaState(
        loads=np.ascontiguousarray(L),
        free_slots=np.asarray(free, dtype=np.int64),
        n_running=z if n_running is None else np.asarray(n_running, np.int64),
        n_waiting=z if n_waiting is None else np.asarray(n_waiting, np.int64),
        prompt_tokens=np.asarray(fields.get("prompt_tokens", np.zeros(G)), np.float64),
        waiting_tokens=np.zeros(G),
        kv_usage=np.zeros(G),
        kv_capacity=np.full(G, np.inf),
    )
    pool = K.PoolState(
        prefill=np.asarray(s, dtype=np.float64),
        wait=np.asarray(fields.get("wait", np.zeros(n)), np.int64),
        key=np.arange(n, dtype=np.int64),
        cached=np.zeros((0, G)),
    )
    return pool, reps


def _run(kernel, s, L, free, p, seed=0, **fields):
    """Assignment of ``kernel`` on a state built by :func:`_state` (zero carry)."""
    pool, reps = _state(s, L, free, **fields)
    return kernel(pool, reps, p, ZERO, seed)[0]


def _snapshot(inst):
    """A copy of every array of ``inst`` (and of the tuples of arrays in it)."""

    def cp(v):
        if isinstance(v, tuple):
            return tuple(x.copy() if isinstance(x, np.ndarray) else x for x in v)
        return v.copy() if isinstance(v, np.ndarray) else v

    return {k: cp(v) for k, v in inst.items()}


def _equal(a, b):
    if isinstance(a, tuple):
        return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    return np.array_equal(a, b)


@pytest.mark.parametrize("policy", POLICIES)
@given(inst=routing_instances(max_horizon=2))
def test_kernel_equals_py_func_equals_reference(policy, inst):
    """Every registered policy: kernel == py_func == reference (assignment and carry), inputs
    untouched, the independent checker passes, and as many requests placed as possible."""
    pol = get_routing_policy(policy)
    for version in pol.versions or (None,):
        args = kernel_args(inst, pol, **({"version": version} if version else {}))
        before = _snapshot(dict(enumerate(args)))
        a, ca = pol.kernel(*args)
        b, cb = getattr(pol.kernel, "py_func", pol.kernel)(*args)
        c, cc = pol.reference(*args)
        for k, v in before.items():  # inputs not mutated
            assert _equal(v, args[k]), (policy, k)
        assert (
            a.dtype == np.int64 and ca.dtype == np.int64 and ca.shape == (len(pol.carry._fields),)
        )
        assert a.tolist() == b.tolist() == c.tolist(), (policy, version)
        assert ca.tolist() == cb.tolist() == cc.tolist(), (policy, version)
        pool, reps = inst["pool"], inst["reps"]
        placed = check_assignment(a, pool.prefill, reps.free_slots)
        n_max = min(pool.prefill.size, int(reps.free_slots.sum()))
        capped = ("trtllm", "trtllm_balance", "follow_bootstrap_room")
        if policy in capped or (policy == "brs" and np.isfinite(reps.kv_capacity).any()):
            assert placed.sum() <= n_max  # a per-rank cap or a fixed rank; KV room (BR-S)
        else:  # every other policy places as many requests as it can
            assert placed.sum() == n_max, policy


def test_registry_lists_every_policy_once():
    assert DEFAULT_POLICY in POLICIES
    for name in POLICIES:
        pol = get_routing_policy(name)
        assert pol.name == name and pol.summary and pol.source
        assert pol.kernel.py_func.__name__ == f"{name}_kernel"
        assert pol.reference.__name__ == f"{name}_reference"
        assert len(pol.versions) == len(pol.version_sources)
        assert ("version" in pol.options) == bool(pol.versions)
        assert all(pol.version_sources), name


@given(inst=routing_instances(max_horizon=0))
def test_brh_with_h0_alpha1_betaG_is_br0(inst):
    """Theorem R3: BR-H with H = 0, alpha = 1, beta = G makes BR-0's decisions."""
    G = inst["reps"].loads.shape[0]
    # gamma is irrelevant at H = 0
    brh = kernel_args(inst, "brh", alpha=1.0, beta=float(G), gamma=0.5)
    assert B.brh_kernel(*brh)[0].tolist() == B.br0_kernel(*kernel_args(inst, "br0"))[0].tolist()


@given(inst=routing_instances(max_horizon=0))
def test_route_batch_brh_reduction(inst):
    kw = dict(r_max=inst["options"]["r_max"], s_greedy=inst["options"]["s_greedy"])
    pool, reps = inst["pool"], inst["reps"]
    a = route_batch(pool.prefill, reps.loads[:, 0], reps.free_slots, policy="br0", **kw)
    b = route_batch(
        pool.prefill,
        reps.loads,
        reps.free_slots,
        policy="brh",
        alpha=1.0,
        beta=float(reps.loads.shape[0]),
        gamma=0.3,
        **kw,
    )
    assert a.assignment.tolist() == b.assignment.tolist()


@given(
    s=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    m=st.integers(0, 60),
    G=st.integers(1, 8),
    q=st.integers(1, 6),
)
def test_best_subset_is_optimal_among_candidates(s, m, G, q):
    """Stage 2's subset search equals brute force over every subset of the candidates."""
    prefill = np.array(s, dtype=np.float64)
    cand = np.arange(prefill.size, dtype=np.int64)
    nc = prefill.size
    q = min(q, nc)
    best = np.empty(nc, np.int64)
    f, k = B.best_subset_kernel(prefill, cand, nc, q, float(m), float(G), best, best.copy())
    brute = max(
        f_score(sum(c), m, G) for size in range(1, q + 1) for c in itertools.combinations(s, size)
    )
    assert f == brute
    assert 1 <= k <= q
    assert f_score(prefill[best[:k]].sum(), m, G) == f


def test_stage1_and_stage2_examples():
    # Stage 1 (S_tot = 3 > S_greedy = 0): the replica with most free slots (1) takes the request
    # with the largest single F (margin 6: s = 6), then replica 1 again (2 slots left vs 1).
    d = route_batch([6, 2, 3], [10, 4, 7], [1, 2, 1], policy="br0", s_greedy=0)
    assert d.stage == 1
    assert d.assignment.tolist() == [1, 0, 2]
    # Stage 2 with the guard: every request is placed even when F <= 0.
    d = route_batch([5, 5], [0, 0], [2, 0], policy="br0")
    assert d.assignment.tolist() == [0, 0] and d.imbalance == 10.0


def test_imbalance_summary_matches_formulation():
    rng = np.random.default_rng(1)
    for _ in range(20):
        G = int(rng.integers(1, 6))
        L = rng.integers(0, 50, G).astype(float)
        s = rng.integers(0, 30, int(rng.integers(0, 8))).astype(float)
        free = rng.integers(0, 3, G)
        for policy in POLICIES:
            d = route_batch(s, L, free, policy=policy, rng=3)
            assert isinstance(d, RoutingResult) and d.policy == policy
            assert d.status is Status.HEURISTIC and d.success
            assert d.imbalance_before == imbalance(L)
            after = apply_assignment(L, d.assignment, s)
            assert d.imbalance == d.imbalance_after == imbalance(after)
            assert d.loads.tolist() == after.tolist()
            assert d.n_placed == int((d.assignment >= 0).sum())
            assert 0 <= d.runtime_s < 1.0


def test_seeded_policies_repeat():
    s, L, free = np.arange(20.0), np.zeros(6), np.full(6, 5)
    for policy in ("random", "p2c"):
        a = route_batch(s, L, free, policy=policy, rng=7).assignment
        b = route_batch(s, L, free, policy=policy, rng=np.random.default_rng(7)).assignment
        c = route_batch(s, L, free, policy=policy, rng=np.random.default_rng(7)).assignment
        assert a.tolist() == route_batch(s, L, free, policy=policy, rng=7).assignment.tolist()
        assert b.tolist() == c.tolist()


def _draw_eligible_reference(cap, x, min_k):
    """``draw_eligible`` written out (MINSTD: x <- 48271 x mod 2**31 - 1)."""
    elig = [j for j, c in enumerate(cap) if c > 0]
    if len(elig) < min_k:
        return len(elig), x, 0, elig
    x = 48271 * x % 2147483647
    return len(elig), x, x % len(elig), elig


@settings(max_examples=60)
@given(
    cap=st.lists(st.integers(-2, 3), max_size=9),
    x=st.integers(1, 2**31 - 2),
    min_k=st.integers(1, 2),
)
def test_draw_eligible_kernel_equals_py_func_equals_reference(cap, x, min_k):
    """The seeded policies' one draw among the replicas with a free slot (random, p2c)."""
    c = np.array(cap, dtype=np.int64)
    want = _draw_eligible_reference(cap, x, min_k)
    for f in (K.draw_eligible, getattr(K.draw_eligible, "py_func", K.draw_eligible)):
        elig = np.full(len(cap), -1, np.int64)
        k, x2, a = f(c, elig, x, min_k)
        assert (k, x2, a, elig[:k].tolist()) == want
    assert K.minstd_start(0) == 1 and K.minstd_start(2147483646) == 1
    assert K.minstd_next(1) == 48271


def test_policy_kernels_are_cached_with_their_callees(jitted_reach):
    """A policy kernel on numba's disk cache that calls jitted code of another file has that
    file's source in its cache key (``cache_depends_on``), so an edit there recompiles it; so
    has a kernel that reads option or memory slots (compile-time constants from
    ``_core.option_slots``/``carry_slots``), the file of ``_core``."""
    import sys

    from numba.core.registry import CPUDispatcher
    from straggler.solvers._numba.jit import source_digest

    if not isinstance(get_routing_policy("jsq").kernel, CPUDispatcher):
        pytest.skip("NUMBA_DISABLE_JIT")
    checked = 0
    for name in POLICIES:
        kernel = get_routing_policy(name).kernel
        own = kernel.py_func.__module__
        modules = {d.py_func.__module__ for d in jitted_reach(kernel)}
        pol = get_routing_policy(name)
        if pol.carry._fields or any(o.to == "values" for o in pol.declared):
            modules.add(K.__name__)
        others = sorted(modules - {own})
        if not others:
            continue
        stamp = cache_stamp(kernel)
        assert isinstance(stamp, tuple) and len(stamp) == 2, (name, others)
        assert stamp[1] == source_digest(*(sys.modules[m] for m in others)), (name, others)
        checked += 1
    assert checked >= 4  # jsq, random, p2c, dynamo, brs at least reach _routing_core


def test_optimistic_update_spreads_a_burst():
    s, L, free = np.full(8, 100.0), np.zeros(4), np.full(4, 8)
    on = route_batch(s, L, free, policy="jsq").assignment
    off = route_batch(s, L, free, policy="jsq", optimistic=False).assignment
    assert np.bincount(on, minlength=4).tolist() == [2, 2, 2, 2]
    assert off.tolist() == [0] * 8  # stale metric: the whole burst goes to one replica


def test_baseline_rules():
    # JSQ ties: tokens, then requests, then lowest index
    d = route_batch([1], [5, 5, 5], [1, 1, 1], policy="jsq", n_running=[3, 2, 2])
    assert d.assignment.tolist() == [1]
    # vLLM before #47420: 4*waiting + running; now max(inflight, waiting + running) + penalty
    kw = dict(policy="vllm", n_running=[0, 5], n_waiting=[2, 0])
    assert route_batch([1], [0, 0], [1, 1], version="legacy", **kw).assignment.tolist() == [1]
    assert route_batch([1], [0, 0], [1, 1], **kw).assignment.tolist() == [0]
    # TRT-LLM: longest prompt first onto the least-token rank
    d = route_batch([1, 9], [0, 5], [2, 2], policy="trtllm", n_running=[0, 0])
    assert d.assignment.tolist() == [1, 0]
    # round robin skips full replicas and reports the next cursor
    d = route_batch([1, 1, 1], [0, 0, 0], [1, 0, 2], policy="round_robin", cursor=1)
    assert d.assignment.tolist() == [2, 0, 2] and d.extras["next_cursor"] == 0
    # p2c with two replicas compares both
    d = route_batch([1], [9, 1], [1, 1], policy="p2c", version="tokens", rng=0)
    assert d.assignment.tolist() == [1]


@pytest.mark.parametrize(
    "args, kwargs, param",
    [
        (([-1.0], [0, 0], [1, 1]), {}, "prefill_lengths"),
        (([np.nan], [0, 0], [1, 1]), {}, "prefill_lengths"),
        (([[1.0]], [0, 0], [1, 1]), {}, "prefill_lengths"),
        (([1.0], [0, np.nan], [1, 1]), {}, "loads"),
        (([1.0], [0, -2], [1, 1]), {}, "loads"),
        (([1.0], [0, 0], [1, 1, 1]), {}, "free_slots"),
        (([1.0], [0, 0], [1, -1]), {}, "free_slots"),
        (([1.0], [0, 0], [1, 1]), {"r_max": 0, "policy": "br0"}, "r_max"),
        (([1.0], [0, 0], [1, 1]), {"gamma": 0.0, "policy": "brh"}, "gamma"),
        (([1.0], [0, 0], [1, 1]), {"s_greedy": -1, "policy": "br0"}, "s_greedy"),
        (([1.0], [0, 0], [1, 1]), {"n_running": [1]}, "n_running"),
        (([1.0], [0, 0], [1, 1]), {"rng": "x", "policy": "random"}, "rng"),
        (([1.0], [0, 0], [1, 1]), {"optimistic": 1}, "optimistic"),
    ],
)
def test_bad_input_names_the_parameter(args, kwargs, param):
    with pytest.raises(InvalidInputError, match=f"'{param}'"):
        route_batch(*args, **kwargs)


def test_unknown_policy_and_option():
    with pytest.raises(InvalidOptionError, match="'policy'"):
        route_batch([1.0], [0], [1], policy="nope")
    with pytest.raises(InvalidOptionError, match="bogus"):
        route_batch([1.0], [0], [1], bogus=3)
    with pytest.raises(InvalidOptionError, match="r_max"):  # jsq has no Stage-2 candidates
        route_batch([1.0], [0], [1], policy="jsq", r_max=2)
    with pytest.raises(ValueError):
        route_batch([1.0], [0], [1], policy="nope")


@settings(max_examples=20)
@given(inst=routing_instances())
def test_route_batch_through_public_api_matches_kernel(inst):
    """route_batch fills the kernel's state from its keyword arguments: the same decision as
    the reference on the same state, for every policy."""
    pool, reps = inst["pool"], inst["reps"]
    for name in POLICIES:
        pol = get_routing_policy(name)
        opts = {k: v for k, v in inst["options"].items() if k in pol.options and v is not None}
        if pol.versions:
            opts["version"] = pol.versions[-1]
        _, _, q, carry_in, _ = kernel_args(inst, pol, **opts)
        carry = public_carry(pol, carry_in)
        if "cursor" in pol.carry._fields:  # the cursor option sets the memory it starts from
            opts["cursor"] = carry.cursor
        d = route_batch(
            pool.prefill,
            reps.loads,
            reps.free_slots,
            policy=name,
            n_running=reps.n_running,
            n_waiting=reps.n_waiting,
            prompt_tokens=reps.prompt_tokens,
            waiting_tokens=reps.waiting_tokens,
            kv_usage=reps.kv_usage,
            kv_capacity=reps.kv_capacity,
            pool_wait=pool.wait,
            pool_key=pool.key,
            pool_cached=pool.cached if pool.cached.shape[0] else None,
            carry=carry,
            rng=inst["seed"],
            **opts,
        )
        ref, carry_out = pol.reference(pool, reps, q, carry_in, inst["seed"] if pol.seeded else 0)
        assert d.assignment.tolist() == ref.tolist(), name
        assert d.extras["carry"] == public_carry(pol, carry_out), name


# A toy policy with an option and a memory of its own, declared here and nowhere else.
LAST_FREE_OPTIONS = (
    K.PolicyOption(
        "reserve",
        lambda v, f: check_int(v, "reserve", f, lo=0, hi=64),
        0,
        "free slots each replica keeps unused",
    ),  # fmt: skip
)


class LastFreeCarry(NamedTuple):
    placed: int  # requests placed by the policy so far


_LF = K.option_slots(LAST_FREE_OPTIONS)
_LFC = K.carry_slots(LastFreeCarry)


@njit
def last_free_kernel(pool, reps, opts, carry, seed):
    """A toy policy: each request to the highest-index replica with more than ``reserve``
    free slots; its memory counts the requests it placed."""
    reserve = int(opts.values[_LF.reserve])
    cap = reps.free_slots.copy()
    out = np.full(pool.prefill.shape[0], -1, np.int64)
    placed = 0
    for i in range(out.shape[0]):
        for g in range(cap.shape[0] - 1, -1, -1):
            if cap[g] > reserve:
                out[i] = g
                cap[g] -= 1
                placed += 1
                break
    return out, K.with_carry(carry, _LFC.placed, carry[_LFC.placed] + placed)


def last_free_reference(pool, reps, opts, carry, seed):
    reserve = int(opts.values[_LF.reserve])
    cap = [int(c) for c in reps.free_slots]
    out = []
    for _ in range(len(pool.prefill)):
        free = [g for g in range(len(cap)) if cap[g] > reserve]
        out.append(free[-1] if free else -1)
        if free:
            cap[free[-1]] -= 1
    placed = sum(1 for g in out if g >= 0)
    if placed:
        carry = carry.copy()
        carry[_LFC.placed] += placed
    return np.array(out, dtype=np.int64), carry


def test_a_new_policy_is_one_definition_and_one_line(monkeypatch):
    """Adding a policy takes its kernel, its reference, its own options and memory and one
    routing_policy(...) (one module: here this test's), and one line naming it (the table;
    here the run-time registration), and no edit anywhere else: route_batch (its option, its
    memory passed from tick to tick) and simulate (the jitted engine and the reference
    engine) then run it by name."""
    monkeypatch.setattr(routing_registry, "_USER", {})  # this test's registration only
    toy = routing_policy(
        "last_free",
        kernel=last_free_kernel,
        reference=last_free_reference,
        options=LAST_FREE_OPTIONS,
        carry=LastFreeCarry,
        summary="highest-index replica with more than reserve free slots",
        source="a test",
    )
    register_routing_policy(toy)
    assert "last_free" in routing_policies()
    d = route_batch([5.0, 1.0, 3.0], [4.0, 0.0, 2.0], [1, 0, 2], policy="last_free")
    assert d.policy == "last_free" and d.assignment.tolist() == [2, 2, 0]
    assert d.extras["carry"] == LastFreeCarry(placed=3)
    d = route_batch([5.0, 1.0], [4.0, 0.0, 2.0], [2, 0, 2], policy="last_free", reserve=1,
                    carry=d.extras["carry"])  # fmt: skip
    assert d.assignment.tolist() == [2, 0] and d.extras["carry"] == LastFreeCarry(5)
    with pytest.raises(InvalidOptionError, match="r_max"):
        route_batch([1.0], [0.0], [1], policy="last_free", r_max=2)
    with pytest.raises(InvalidInputError, match="'carry'"):
        route_batch([1.0], [0.0], [1], policy="last_free", carry={"placed": 0})
    with pytest.raises(ValueError, match="registered twice"):
        register_routing_policy(toy)
    tr = Trace(arrival_s=[0, 0, 0], prompt_len=[100, 50, 50], output_len=[2, 3, 2])
    kw = dict(n_replicas=2, max_slots=2, t0=0.01, kappa=0.0, prefill_instances=0)
    jit = simulate(tr, "last_free", **kw)
    ref = simulate(tr, "last_free", engine="python", **kw)
    assert jit.policy == "last_free" and jit.n_finished == 3
    # prefill order 1, 2, 0 (shorter prompts first): both slots of replica 1, then replica 0
    assert jit.requests["replica"].tolist() == ref.requests["replica"].tolist() == [0, 1, 1]
    # one slot kept free per replica: one request per replica at a time (request 0 waits for
    # replica 0, where request 2 leaves first)
    jit = simulate(tr, "last_free", reserve=1, **kw)
    ref = simulate(tr, "last_free", reserve=1, engine="python", **kw)
    assert jit.config["options"] == {"reserve": 1} and jit.n_finished == 3
    assert jit.requests["replica"].tolist() == ref.requests["replica"].tolist() == [0, 1, 0]


def test_route_batch_compiles_its_entry_once_for_every_policy():
    """route_batch's jitted entry calls a policy's kernel by the address of its code: one
    compiled entry serves every policy (one specialised per policy would add one version
    each), and the kernel it calls is the very version simulate's engine calls."""
    from straggler.sim.engine._loop import tick_signature

    if not hasattr(K.route_batch_kernel, "overloads"):
        pytest.skip("NUMBA_DISABLE_JIT")
    for policy in POLICIES:
        route_batch([5.0, 1.0, 3.0], [4.0, 0.0, 2.0], [1, 0, 2], policy=policy, rng=0)
    (sig,) = K.route_batch_kernel.overloads
    assert sig[0] == numba.types.int64
    pool = numba.types.NamedTuple(sig[1:5], K.PoolState)
    reps = numba.types.NamedTuple(sig[5:13], K.ReplicaState)
    inp = types.SimpleNamespace(options=_opts("brs"), carry=ZERO)
    assert tuple(tick_signature(inp)) == (pool, reps, sig[13], sig[14], sig[15])
    for policy in POLICIES:
        kernel = get_routing_policy(policy).kernel
        assert tuple(tick_signature(inp)) in address._wrapperless(kernel).overloads


def test_the_kernel_called_by_address_has_no_wrapper_and_its_own_symbols():
    """route_batch calls a policy's version compiled without numba's CPython wrapper, named
    apart from the kernel's own (both can be loaded in one process, e.g. from the disk cache:
    same-named symbols would let one's wrapper call the other's code); the kernel itself is
    still callable from Python and decides the same."""
    if not hasattr(K.route_batch_kernel, "overloads"):
        pytest.skip("NUMBA_DISABLE_JIT")
    G = 3
    pool = K.PoolState(np.array([5.0, 1.0, 3.0]), np.zeros(3, np.int64), np.zeros(3, np.int64),
                       np.zeros((0, G)))  # fmt: skip
    reps = K.ReplicaState(np.array([[4.0], [0.0], [2.0]]), np.array([1, 0, 2]),
                          np.zeros(G, np.int64), np.zeros(G, np.int64), np.zeros(G), np.zeros(G),
                          np.zeros(G), np.full(G, np.inf))  # fmt: skip
    r = route_batch([5.0, 1.0, 3.0], [4.0, 0.0, 2.0], [1, 0, 2], policy="brs", rng=0,
                    **{k: _BASE[k] for k in get_routing_policy("brs").options})  # fmt: skip
    kernel = get_routing_policy("brs").kernel
    out, _ = kernel(pool, reps, _opts("brs"), ZERO[:1], 0)
    assert out.tolist() == r.assignment.tolist()
    twin = address._wrapperless(kernel)
    (sig,) = [s for s in twin.overloads if s in kernel.overloads]
    mine, its = twin.overloads[sig], kernel.overloads[sig]
    assert "__by_address" in mine.fndesc.mangled_name
    assert "__by_address" not in its.fndesc.mangled_name
    assert mine.library.get_pointer_to_function(mine.fndesc.llvm_cpython_wrapper_name) == 0
    assert its.library.get_pointer_to_function(its.fndesc.llvm_cpython_wrapper_name) != 0


def _raising_kernel(pool, reps, opts, carry, seed):
    if pool.prefill.shape[0] > 2:
        raise ValueError("too many requests for this test kernel")
    return np.full(pool.prefill.shape[0], -1, np.int64), carry


def test_a_kernel_route_batch_cannot_call_is_refused_by_name(monkeypatch):
    """A policy kernel that is not jitted, or returns another type than every kernel does, is
    refused naming the policy (route_batch calls the kernel's code by its address, which
    relies on both); an exception the kernel raises reaches the caller."""
    if not hasattr(K.route_batch_kernel, "overloads"):
        pytest.skip("NUMBA_DISABLE_JIT")
    monkeypatch.setattr(routing_registry, "_USER", {})  # this test's registrations only
    jsq = get_routing_policy("jsq")
    for name, kernel in (
        ("py_kernel", jsq.kernel.py_func),
        ("bad_return", njit(lambda pool, reps, opts, carry, seed: (0, carry))),
        ("raising", njit(_raising_kernel)),
    ):
        pol = routing_policy(
            name, kernel=kernel, reference=jsq.reference, options=(), summary="t", source="t"
        )
        register_routing_policy(pol)
    with pytest.raises(InvalidInputError, match="route_batch.*py_kernel.*numba.njit function"):
        route_batch([5.0], [4.0, 0.0], [1, 1], policy="py_kernel")
    with pytest.raises(InvalidInputError, match="route_batch.*bad_return.*must return"):
        route_batch([5.0], [4.0, 0.0], [1, 1], policy="bad_return")
    d = route_batch([5.0, 1.0], [4.0, 0.0], [1, 1], policy="raising")
    assert d.assignment.tolist() == [-1, -1]
    with pytest.raises(ValueError, match="too many requests for this test kernel"):
        route_batch([5.0, 1.0, 3.0], [4.0, 0.0], [1, 1], policy="raising")


def test_stage2_not_optimal_beyond_candidates():
    """THEOREMS.md Part II R4's example: {6, 5} from the top-2 candidates, while {6, 4} is best."""
    from straggler.formulations.routing_milp import build_joint_tick_milp
    from straggler.solvers.highs import solve_milp

    d = route_batch([6, 5, 4], [10, 0], [0, 2], policy="br0", r_max=2)
    assert d.stage == 2
    assert d.assignment.tolist() == [1, 1, -1] and d.imbalance == 1.0
    opt = solve_milp(
        build_joint_tick_milp([6, 5, 4], [10, 0], [0, 2], must_place=True), mip_rel_gap=0
    )
    assert opt.objective == 0.0


@settings(max_examples=40)
@given(inst=routing_instances(max_horizon=24, max_pool=14, max_slots=6, fractional=True))
def test_brh_long_horizon_kernel_equals_reference(inst):
    """The two-walk ranking of BR-H against the plain scan, with fractional projected loads."""
    args = kernel_args(inst, "brh")
    assert B.brh_kernel(*args)[0].tolist() == B.brh_reference(*args)[0].tolist()


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"beta": np.inf, "policy": "brh"}, "beta"),
        ({"alpha": 0.0, "policy": "brh"}, "alpha"),
        ({"alpha": np.nan, "policy": "brh"}, "alpha"),
        ({"cursor": np.inf, "policy": "round_robin"}, "cursor"),
        ({"cursor": -1, "policy": "round_robin"}, "cursor"),
        ({"r_max": True, "policy": "br0"}, "r_max"),
        ({"n_waiting": [1, -1]}, "n_waiting"),
    ],
)
def test_bad_scalar_options(kwargs, param):
    with pytest.raises(InvalidInputError, match=f"'{param}'"):
        route_batch([1.0], [0.0, 0.0], [1, 1], **kwargs)


@settings(max_examples=60)
@given(
    x=st.lists(
        st.one_of(
            st.integers(0, 40).map(float),
            st.sampled_from([0.0, -0.0, 0.25, 1e-300, 5e-324, 1e300, 2.0**52 + 1]),
            st.floats(0, 1e6, allow_nan=False),
        ),
        max_size=300,
    )
)
def test_stable_argsort_is_numpy_stable_argsort(x):
    """The radix sort of BR-0 orders by (value, index) exactly as a stable sort."""
    a = np.array(x, dtype=np.float64)
    assert B._stable_argsort(a).tolist() == np.argsort(a, kind="stable").tolist()
    # BR-S's longest-first order: by (-value, index), as numpy's stable sort of -x
    assert B._stable_argsort_desc(a).tolist() == np.argsort(-a, kind="stable").tolist()


@settings(max_examples=60)
@given(
    w=st.lists(
        st.one_of(st.integers(-5, 40), st.sampled_from([-(2**63), 2**63 - 1, -1, 0, 256])),
        min_size=1,
        max_size=300,
    ),
    data=st.data(),
)
def test_kth_largest_is_numpy_sort(w, data):
    """BR-S's window bound: the k-th largest wait, as ``np.sort(w)[n - k]``."""
    a = np.array(w, dtype=np.int64)
    k = data.draw(st.integers(1, len(w)))
    assert B._kth_largest(a, k) == np.sort(a)[len(w) - k]


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 200, 4095, 4096, 4097, 9000])
def test_live_set_queries_equal_a_plain_scan(n):
    """Two-level bitset of BR-0: next/previous live position against numpy on the live mask,
    with random deletions and whole blocks (empty words and summary words)."""
    rng = np.random.default_rng(n)
    words, summary = B._live_set(n)
    live = np.ones(n, bool)
    kills = rng.permutation(n)
    if n > 1000:  # empty whole words and summary words too
        lo, hi = sorted(rng.integers(0, n, 2))
        block = np.arange(lo, hi)
        kills = np.concatenate([block, np.setdiff1d(kills, block)])
    steps = np.unique(np.linspace(0, n, 25).astype(int))
    done = 0
    for step in steps:
        for i in kills[done:step]:
            B._kill(words, summary, int(i))
            live[i] = False
        done = step
        for p in np.unique(np.concatenate([rng.integers(0, n + 1, 40), [0, n - 1, n]])):
            p = int(p)
            if p < 0:
                continue
            after = np.flatnonzero(live[p:])
            want = p + after[0] if after.size else n
            assert B._next_live(words, summary, p, n) == want
            assert getattr(B._next_live, "py_func", B._next_live)(words, summary, p, n) == want
            before = np.flatnonzero(live[: p + 1])
            want = before[-1] if before.size else -1
            assert B._prev_live(words, summary, p) == want
            assert getattr(B._prev_live, "py_func", B._prev_live)(words, summary, p) == want
    assert B._prev_live(words, summary, -1) == -1


def test_bit_scans_in_jitted_code_equal_their_python_versions():
    """``_low_bit``/``_high_bit``: LLVM's cttz/ctlz in jitted code, ``int.bit_length`` in
    Python, both the index of the lowest/highest set bit, on every single bit and on random
    words."""
    low = njit(lambda x: B._low_bit(x))
    high = njit(lambda x: B._high_bit(x))
    rng = np.random.default_rng(0)
    words = [np.uint64(1) << np.uint64(b) for b in range(64)]
    words += [np.uint64(w) for w in rng.integers(1, 2**63, 200)]
    words += [np.uint64(0xFFFFFFFFFFFFFFFF), np.uint64(0x8000000000000001)]
    for w in words:
        bits = [b for b in range(64) if (int(w) >> b) & 1]
        assert low(w) == B._low_bit(w) == bits[0], hex(int(w))
        assert high(w) == B._high_bit(w) == bits[-1], hex(int(w))


@settings(max_examples=8)
@given(
    G=st.sampled_from([1, 2, 5, 16]),
    n=st.integers(60, 260),
    spread=st.sampled_from([8, 60, 3000]),
    slots=st.integers(1, 40),
    stage=st.sampled_from(["one", "two", "both"]),
    seed=st.integers(0, 2**16),
)
def test_br0_large_pool_kernel_equals_py_func_equals_reference(G, n, spread, slots, stage, seed):
    """Pools over several bitset words, many ties (small spread) or few; Stage 1 only, Stage 2
    only, or Stage 1 then Stage 2 within the tick."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, spread, n).astype(np.float64)
    L = rng.integers(0, 4 * spread, (G, 1)).astype(np.float64)
    free = rng.integers(slots // 2, slots + 1, G).astype(np.int64)
    s_greedy = {"one": 0, "two": 10**9, "both": int(free.sum()) // 2}[stage]
    p = _opts("br0", r_max=3, s_greedy=s_greedy, optimistic=bool(seed % 4))
    a = _run(B.br0_kernel, s, L, free, p)
    assert a.tolist() == _run(B.br0_kernel.py_func, s, L, free, p).tolist()
    assert a.tolist() == _run(B.br0_reference, s, L, free, p).tolist()


def test_stage1_tie_between_the_two_sides_of_the_margin_goes_to_the_lower_index():
    # G = 2, margin of replica 1 = 10: F(8) = 8 = F(12) = 12 - 2*(12 - 10).
    p = _opts("br0", r_max=2, s_greedy=0)
    for s, want in (([8.0, 12.0], [1, -1]), ([12.0, 8.0], [1, -1])):
        for kernel in (B.br0_kernel, B.br0_kernel.py_func, B.br0_reference):
            assert _run(kernel, s, [10.0, 0.0], [0, 1], p).tolist() == want
    # runs of equal lengths, margin 10: F(9) = 9 = F(11) = 11 - 2*1; the lowest index wins,
    # then the margin shrinks and the shortest request is best (F = s - 2*(s - m)).
    for s, want in (([11.0, 9.0, 7.0, 9.0], [1, -1, 1, -1]), ([9.0, 11.0, 9.0], [1, -1, 1])):
        for kernel in (B.br0_kernel, B.br0_kernel.py_func, B.br0_reference):
            assert _run(kernel, s, [10.0, 0.0], [0, 2], p).tolist() == want


def test_br0_replica_pop_reads_rounded_margins_as_the_reference():
    """Margins ``M - L`` that round to the same value for different loads tie, and the tie goes
    to the lower index (not to the smaller load): at ``M = 2**53`` the loads 0.5 and 0.25 both
    leave a margin of ``2**53``."""
    M = 2.0**53
    p = _opts("br0", r_max=2, s_greedy=0)
    for L, want in (([M, 0.5, 0.25], [1]), ([M, 0.25, 0.5], [1]), ([M, 2.0, 1.0], [2])):
        for kernel in (B.br0_kernel, getattr(B.br0_kernel, "py_func", None), B.br0_reference):
            assert _run(kernel or B.br0_kernel, [1.0], L, [0, 1, 1], p).tolist() == want, L


def _presence(inst, data):
    """A presence tail ``pi_0..pi_H`` for the instance (pi_0 = 1)."""
    H1 = inst["reps"].loads.shape[1]
    tail = data.draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=H1, max_size=H1))
    return np.array([1.0, *tail[1:]])


@given(inst=routing_instances(max_horizon=6, fractional=True), data=st.data())
def test_brh_presence_weights_kernel_equals_py_func_equals_reference(inst, data):
    args = kernel_args(inst, "brh", new_presence=_presence(inst, data))
    a = B.brh_kernel(*args)[0]
    assert a.tolist() == B.brh_kernel.py_func(*args)[0].tolist()
    assert a.tolist() == B.brh_reference(*args)[0].tolist()


@given(inst=routing_instances(max_horizon=0), data=st.data())
def test_brh_presence_weights_h0_alpha1_betaG_is_br0(inst, data):
    """pi_0 = 1: at H = 0 the presence weights change nothing (Theorem R3 still holds)."""
    G = inst["reps"].loads.shape[0]
    brh = kernel_args(inst, "brh", alpha=1.0, beta=float(G), gamma=0.7,
                      new_presence=_presence(inst, data))  # fmt: skip
    assert B.brh_kernel(*brh)[0].tolist() == B.br0_kernel(*kernel_args(inst, "br0"))[0].tolist()


def test_route_batch_new_presence_option():
    s = np.array([9.0, 1.0, 4.0, 6.0, 2.0])
    P = np.array([[10.0, 9.0, 0.0], [0.0, 0.0, 0.0], [5.0, 5.0, 5.0]])
    free = np.array([2, 2, 2])
    plain = route_batch(s, P, free, policy="brh")
    ones = route_batch(s, P, free, policy="brh", new_presence=[1.0, 1.0, 1.0])
    assert ones.assignment.tolist() == plain.assignment.tolist()
    pi = [1.0, 0.5, 0.0]
    got = route_batch(s, P, free, policy="brh", new_presence=pi, r_max=3)
    q = _opts("brh", r_max=3, s_greedy=12, beta=3.0, new_presence=pi)
    assert got.assignment.tolist() == _run(B.brh_reference, s, P, free, q).tolist()
    for bad in ([1.0, 1.0], [1.0, 2.0, 0.0], [1.0, np.nan, 0.0], "x"):
        with pytest.raises(InvalidInputError, match="'new_presence'"):
            route_batch(s, P, free, policy="brh", new_presence=bad)


def _brs_state(data, G, n, slots, kv_inf=True):
    """A BR-S tick: small integer lengths and loads, waits in non-increasing pool order."""
    s = data.draw(st.lists(st.integers(0, 30), min_size=n, max_size=n))
    L = data.draw(st.lists(st.integers(0, 60), min_size=G, max_size=G))
    free = data.draw(st.lists(st.integers(0, slots), min_size=G, max_size=G))
    waits = sorted(data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)), reverse=True)
    pool, reps = _state(s, L, free, wait=waits)
    if not kv_inf:
        cap = np.array(data.draw(st.lists(st.integers(1, 150), min_size=G, max_size=G)), float)
        reps = reps._replace(kv_capacity=cap)
    return pool, reps


@settings(max_examples=60)
@given(data=st.data(), G=st.integers(1, 3), n=st.integers(0, 5))
def test_R7_brs_never_leaves_a_larger_one_tick_imbalance_than_jsq(data, G, n):
    """THEOREMS.md R7, against brute force: OPT <= I(BR-S) <= I(JSQ) on the same state, BR-S
    places as many requests as JSQ (unbounded KV), and an unsaturated tick is JSQ's."""
    pool, reps = _brs_state(data, G, n, 3)
    patience = data.draw(st.sampled_from([0, 5, 100]))
    p = _opts(
        "brs",
        age_window=data.draw(st.sampled_from([0, 2, 40])),
        window=data.draw(st.sampled_from([0, 1, 8])),
        patience=patience,
        age_fraction=data.draw(st.sampled_from([0.1, 1.0])),
    )
    c = np.array([data.draw(st.booleans())], np.int64)  # BR-S's memory: the backlog
    out, c_out = B.brs_kernel(pool, reps, p, c, 0)
    jsq = SG.jsq_reference(pool, reps, _opts("jsq"), np.zeros(0, np.int64), 0)[0]
    L = reps.loads[:, 0]
    i_brs = imbalance(apply_assignment(L, out, pool.prefill))
    i_jsq = imbalance(apply_assignment(L, jsq, pool.prefill))
    opt = best_tick_imbalance(pool.prefill, L, reps.free_slots)
    assert opt <= i_brs <= i_jsq
    assert (out >= 0).sum() == (jsq >= 0).sum() == min(n, int(reps.free_slots.sum()))
    calm = n == 0 or pool.wait.max() < patience
    if calm and not c[0]:
        assert out.tolist() == jsq.tolist()
    # the backlog flag: cleared when the visible pool fits, set while it is in a backlog
    if n <= reps.free_slots.sum():
        assert not c_out[0]
    else:
        assert bool(c_out[0]) == (not calm or bool(c[0]))


@settings(max_examples=80)
@given(data=st.data(), G=st.integers(1, 4), n=st.integers(1, 9), kv_inf=st.booleans())
def test_R8_brs_never_places_a_request_far_younger_than_one_it_leaves(data, G, n, kv_inf):
    """THEOREMS.md R8: with the pool in age order, every request BR-S places has waited at
    least (wait of any request it leaves) - A, KV limits or not."""
    pool, reps = _brs_state(data, G, n, 3, kv_inf=kv_inf)
    A = data.draw(st.sampled_from([0, 1, 3, 10]))
    p = _opts(
        "brs",
        age_window=A,
        window=data.draw(st.sampled_from([0, 1, 8])),
        patience=0,
        age_fraction=data.draw(st.sampled_from([0.1, 0.5, 1.0])),
        safe=data.draw(st.booleans()),
    )
    out = B.brs_kernel(pool, reps, p, ZERO[:1], 0)[0]
    for o in np.flatnonzero(out < 0):
        for j in np.flatnonzero(out >= 0):
            assert pool.wait[j] >= pool.wait[o] - A, (o, j)


def test_brs_mechanisms_each_change_the_decision():
    """Each piece of BR-S matters on a small state: the age window, the count window, the
    patience gate, the backlog carried across ticks and the safety net."""
    s = [9.0, 1.0, 5.0, 4.0]
    L = [20.0, 11.0, 15.0]
    free = [0, 1, 1]
    waits = [12, 11, 3, 0]
    kw = dict(age_window=100, window=0, patience=0, age_fraction=1.0, safe=False)
    base = _run(B.brs_kernel, s, L, free, _opts("brs", **kw), wait=waits)
    # margins 9 (replica 1) and 5 (replica 2): the F-score fills both exactly
    assert base.tolist() == [1, -1, 2, -1]
    # an age window of 1 tick: only the two oldest (waits 12 and 11) may be placed
    aged = _run(B.brs_kernel, s, L, free, _opts("brs", **{**kw, "age_window": 1}), wait=waits)
    assert aged.tolist() == [1, 2, -1, -1]
    # one candidate per free slot: the window holds the two oldest
    counted = _run(B.brs_kernel, s, L, free, _opts("brs", **{**kw, "window": 1}), wait=waits)
    assert counted.tolist() == [1, 2, -1, -1]
    # patience above every wait: JSQ's decision (the oldest two, in pool order)
    calm = _run(B.brs_kernel, s, L, free, _opts("brs", **{**kw, "patience": 13}), wait=waits)
    jsq = _run(SG.jsq_kernel, s, L, free, _opts("jsq"), wait=waits)
    assert calm.tolist() == jsq.tolist() == [1, 2, -1, -1]
    # a backlog carried from the previous tick: the same waits, routed as a backlog tick
    c = np.array([1], np.int64)  # BR-S's memory: in a backlog
    pool, reps = _state(s, L, free, wait=waits)
    kept, c_out = B.brs_kernel(pool, reps, _opts("brs", **{**kw, "patience": 13}), c, 0)
    assert kept.tolist() == base.tolist() and c_out[0]
    # ... and it ends at a tick whose pool fits in the free slots
    pool, reps = _state(s[:2], L, free, wait=waits[:2])
    _, c_out = B.brs_kernel(pool, reps, _opts("brs", **{**kw, "patience": 13}), c, 0)
    assert not c_out[0] and c[0]  # a fresh memory: the input kept
    # the safety net: margin-first fills replica 1's margin of 1 with the 1-token request and
    # puts 5 on the top replica (I = 5); JSQ's decision leaves I = 3, so it is kept
    s2, L2, free2, w2 = [5.0, 1.0, 6.0], [15.0, 14.0], [1, 1], [4, 2, 1]
    kw2 = dict(age_window=100, window=0, patience=0, age_fraction=1.0)
    unsafe = _run(B.brs_kernel, s2, L2, free2, _opts("brs", **kw2, safe=False), wait=w2)
    safe = _run(B.brs_kernel, s2, L2, free2, _opts("brs", **kw2, safe=True), wait=w2)
    jsq2 = _run(SG.jsq_kernel, s2, L2, free2, _opts("jsq"), wait=w2)
    assert unsafe.tolist() == [0, 1, -1] and imbalance(apply_assignment(L2, unsafe, s2)) == 5
    assert safe.tolist() == jsq2.tolist() == [1, 0, -1]
    assert imbalance(apply_assignment(L2, safe, s2)) == 3


# Inputs once accepted without complaint (or mishandled), one regression each.
@pytest.mark.parametrize("policy", ["br0", "brh", "trtllm", "jsq", "brs"])
def test_free_slots_summing_past_int64_is_refused(policy):
    """[2**63 - 1, 1, 1, 1] wrapped to a negative total and placed nothing."""
    with pytest.raises(InvalidInputError, match="'free_slots'.*sum exceeds 2\\*\\*63 - 1"):
        route_batch([1.0, 2.0], [0, 0, 0, 0], [2**63 - 1, 1, 1, 1], policy=policy)


@pytest.mark.parametrize("policy", POLICIES)
def test_lengths_near_the_float_limit_are_refused(policy):
    """Lengths near 1.7e308 gave a NaN imbalance."""
    with pytest.raises(InvalidInputError, match="'prefill_lengths'.*1.7e\\+308"):
        route_batch([1.7e308, 1.0], [0.0, 0.0], [1, 1], policy=policy, rng=0)
    with pytest.raises(InvalidInputError, match="'loads'"):
        route_batch([1.0], [1.7e308, 0.0], [1, 1], policy=policy, rng=0)
    # the largest accepted token count still gives a finite, exact imbalance
    d = route_batch([2.0**53], [0.0, 0.0], [1, 1], policy=policy, rng=0)
    assert d.imbalance == 2.0**53


def test_uint64_max_free_slots_is_named_as_too_large():
    """Was reported as "NaN, infinite or negative"."""
    with pytest.raises(InvalidInputError, match="'free_slots'.*too large for int64"):
        route_batch([1.0], [0.0, 0.0], np.array([2**64 - 1, 1], dtype=np.uint64))


@pytest.mark.parametrize(
    "args, param",
    [
        ((["1", "2"], [0, 0], [1, 1]), "prefill_lengths"),  # numeric strings
        (([1.0], ["5", "0"], [1, 1]), "loads"),
        (([1.0], [0, 0], ["1", "1"]), "free_slots"),
        (([1 + 2j], [0, 0], [1, 1]), "prefill_lengths"),  # complex numbers
        (([1.0], [0j, 0j], [1, 1]), "loads"),
        (([True, 2], [0, 0], [1, 1]), "prefill_lengths"),  # JSON true
        (([1.0], [0, 0], [True, 1]), "free_slots"),
        (([1.0], [0, 0], [1.5, 1]), "free_slots"),
        ((np.array([1.0, np.nan]), [0, 0], [1, 1]), "prefill_lengths"),
    ],
)
def test_strings_complex_and_booleans_are_refused(args, param):
    with pytest.raises(InvalidInputError, match=f"'{param}'"):
        route_batch(*args)


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"n_running": ["1", "2"]}, "n_running"),
        ({"prompt_tokens": [-1.0, 0.0]}, "prompt_tokens"),
        ({"kv_capacity": 0}, "kv_capacity"),
        ({"kv_usage": [np.nan, 0.0]}, "kv_usage"),
        ({"pool_wait": [-1]}, "pool_wait"),
        ({"pool_wait": [1, 2]}, "pool_wait"),
        ({"pool_cached": [[1.0]]}, "pool_cached"),
        ({"carry": [1.0]}, "carry"),
        ({"policy": "jsq", "rng": "x"}, "rng"),
    ],
)
def test_state_keywords_are_checked(kwargs, param):
    with pytest.raises(InvalidInputError, match=f"'{param}'"):
        route_batch([1.0], [0.0, 0.0], [1, 1], **kwargs)


def test_state_keywords_reach_the_kernel():
    """prompt_tokens and n_running, KV usage and capacity, pool waits are what the kernel
    sees: TRT-LLM reads active counts, BR-S's KV check refuses a replica without room."""
    d = route_batch([1, 9], [0, 5], [2, 2], policy="trtllm", n_running=[3, 0])
    assert d.assignment.tolist() == [1, 1]
    sat = dict(pool_wait=[50, 50], kv_capacity=[100.0, 12.0])
    d = route_batch([30.0, 5.0], [0.0, 0.0], [1, 1], **sat)
    assert d.assignment.tolist() == [0, 1]  # 30 tokens do not fit replica 1's 12


def test_a_policy_declaration_is_checked_when_built():
    """routing_policy refuses what its kernel could not read: an option that is not a
    PolicyOption, one named twice, two vector options, a carry option without its memory
    field, a memory that is not a NamedTuple of int and bool fields."""
    kw = dict(kernel=last_free_kernel, reference=last_free_reference, summary="t", source="t")
    opt = LAST_FREE_OPTIONS[0]
    vec = K.PolicyOption("v", None, None, "", to="vector")

    class FloatCarry(NamedTuple):
        x: float

    for bad, match in (
        (dict(options=("reserve",)), "PolicyOption"),
        (dict(options=(opt, opt)), "named twice"),
        (dict(options=(vec, K.PolicyOption("w", None, None, "", to="vector"))), "vector"),
        (dict(options=(K.PolicyOption("cursor", None, 0, "", to="carry"),)), "no carry field"),
        (dict(carry=tuple), "NamedTuple"),
        (dict(carry=FloatCarry), "int or bool"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            routing_policy("bad", **kw, **bad)
    assert routing_policy("ok", **kw, options=(opt,), carry=LastFreeCarry).carry is LastFreeCarry
