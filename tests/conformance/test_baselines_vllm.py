"""Our vLLM baselines beside vLLM CPU 0.32.0's own code, decision for decision.

* EPLB: ``vllm.distributed.eplb.policy.default.DefaultEplbPolicy.rebalance_experts``, with
  and without ``old_global_expert_indices`` (``preserve_intragpu_slots``), against
  :func:`straggler.solvers.placement.eplb.rebalance_experts` with ``version="vllm"``.
* DP load balancer: ``vllm.v1.engine.core_client.DPLBAsyncMPClient.get_core_engine_for_request``,
  built without a server (``object.__new__`` plus the attributes the method reads), its
  ``eng_start_index`` set to every engine in turn, fed a coordinator snapshot per tick and a
  burst of requests, against our ``vllm`` router (:func:`straggler.solvers.route_batch`, the
  same start given as its ``start`` option at the first tick, then carried between ticks).

Skipped where vLLM is not installed.
"""

import types
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")
default_policy = pytest.importorskip("vllm.distributed.eplb.policy.default")
core_client = pytest.importorskip("vllm.v1.engine.core_client")

from straggler.solvers import route_batch  # noqa: E402
from straggler.solvers.placement.eplb import rebalance_experts  # noqa: E402

N_CASES = 200
Policy = default_policy.DefaultEplbPolicy


def _instance(seed):
    """Random loads ``(L, E)`` and cluster shape; every third case has many ties."""
    rng = np.random.default_rng(seed)
    nodes = int(rng.choice([1, 2, 4]))
    gpus = nodes * int(rng.choice([1, 2, 4]))
    groups = nodes * int(rng.choice([1, 2])) if rng.random() < 0.8 else int(rng.choice([1, 3]))
    E = groups * int(rng.integers(2 if groups == 1 else 1, 9))
    per_gpu = -(-E // gpus) + int(rng.integers(0, 3))
    P = gpus * per_gpu
    L = int(rng.integers(1, 4))
    hi = 4 if seed % 3 == 0 else 100_000
    w = rng.integers(0, hi, size=(2, L, E))  # two windows: the old map is built on the first
    hier = groups % nodes == 0
    if hier and (E % groups or gpus % nodes):
        groups = 1  # the global policy
    return w, P, groups, nodes, gpus


@pytest.mark.parametrize("seed", range(N_CASES))
def test_eplb_equals_vllm_default_policy(seed):
    w, P, groups, nodes, gpus = _instance(seed)
    # no old map (vLLM's first rebalance is given the initial one; this is the bare policy)
    theirs = Policy.rebalance_experts(torch.tensor(w[1]), P, groups, nodes, gpus).numpy()
    ours, l2p, cnt = rebalance_experts(w[1], P, groups, nodes, gpus, version="vllm")
    assert np.array_equal(ours, theirs)
    # the old map in service: the previous window's placement, then a random one
    rng = np.random.default_rng(seed)
    for old in (
        rebalance_experts(w[0], P, groups, nodes, gpus, version="vllm")[0],
        rng.integers(0, w.shape[2], size=(w.shape[1], P)),
    ):
        theirs = Policy.rebalance_experts(
            torch.tensor(w[1]), P, groups, nodes, gpus, torch.tensor(old)
        ).numpy()
        ours = rebalance_experts(
            w[1], P, groups, nodes, gpus, version="vllm", old_physical_to_logical=old
        )[0]
        assert np.array_equal(ours, theirs)


# --- DP load balancer ---------------------------------------------------------------------


def _client(G, start):
    """``DPLBAsyncMPClient`` without a server: one front-end, its scan starting at ``start``
    (upstream ``(G * client_index) // client_count``; upstream's own unit tests set it so)."""
    c = object.__new__(core_client.DPLBAsyncMPClient)
    c.client_count = 1
    c.reqs_in_flight = {}
    c.engine_inflight = Counter()
    c.core_engines = [g.to_bytes(2, "little") for g in range(G)]  # engine identities
    c.lb_engines = [[0, 0, 0.0] for _ in range(G)]
    c.eng_start_index = start
    return c


@pytest.mark.parametrize("seed", range(N_CASES))
def test_dp_load_balancer_choices_equal_ours(seed):
    rng = np.random.default_rng(seed)
    G = int(rng.integers(2, 9))
    start = seed % G
    client = _client(G, start)
    carry = None
    n_req = 0
    for tick in range(6):
        running = rng.integers(0, 20, size=G)
        waiting = rng.integers(0, 5, size=G) * (rng.random(G) < 0.6)
        kv = np.round(rng.random(G), 3)
        if rng.random() < 0.3:  # idle, equal engines: the rotating start decides
            running[:], waiting[:], kv[:] = 0, 0, 0.0
        # the coordinator's snapshot replaces the counts; this front-end's in-flight count
        # is what the engines hold (one front-end, fresh snapshot)
        client.lb_engines = [[int(waiting[g]), int(running[g]), float(kv[g])] for g in range(G)]
        client.engine_inflight = Counter(
            {client.core_engines[g]: int(running[g] + waiting[g]) for g in range(G)}
        )
        burst = int(rng.integers(1, 3 * G))
        theirs = []
        for _ in range(burst):
            req = types.SimpleNamespace(
                request_id=f"r{n_req}", data_parallel_rank=None, pooling_params=None
            )
            n_req += 1
            theirs.append(client.core_engines.index(client.get_core_engine_for_request(req)))
        res = route_batch(
            np.full(burst, 100.0),
            np.zeros(G),
            np.full(G, burst),
            policy="vllm",
            n_running=running,
            n_waiting=waiting,
            kv_usage=kv,
            **({"carry": carry} if carry is not None else {"start": start}),
        )
        carry = res.extras["carry"]
        assert res.assignment.tolist() == theirs, f"tick {tick}"
        assert [c[0] for c in client.lb_engines] == (
            waiting + np.bincount(theirs, minlength=G)  # waiting += client_count (1)
        ).tolist()
