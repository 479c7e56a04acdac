"""Our SGLang DP routers beside SGLang 0.5.23's ``DataParallelController``, choice by choice.

The controller is built without a server (``object.__new__``; only the fields its selection
methods read are set) and fed the same states as our routers: each tick, every rank reports
a ``LoadSnapshot`` (``DPBudget.update_budget``, SGLang's own update path), then a burst of
requests is dispatched one by one through ``round_robin_scheduler``,
``total_requests_scheduler`` or ``total_tokens_scheduler`` (``sock_send`` recorded instead
of sent). Ours route the same burst in one :func:`straggler.solvers.route_batch` call
(``round_robin``, ``jsq_requests``, ``jsq``), with enough free slots that no replica is full
(SGLang's controller has no slot limit). Skipped where SGLang is not installed.
"""

import types

import numpy as np
import pytest

dpc = pytest.importorskip("sglang.srt.managers.data_parallel_controller")
load_snapshot = pytest.importorskip("sglang.srt.managers.load_snapshot")

from straggler.solvers import route_batch  # noqa: E402

N_CASES = 200
TICKS = 6


@pytest.fixture
def controller(monkeypatch):
    """A factory of ``DataParallelController`` objects without a server; ``sent`` records
    the worker each request went to."""
    sent = []
    monkeypatch.setattr(dpc, "sock_send", lambda worker, req: sent.append(worker))

    def make(n_ranks):
        c = object.__new__(dpc.DataParallelController)
        c.workers = list(range(n_ranks))  # the "socket" of rank i is i
        c.status = [True] * n_ranks
        c.dp_active = [True] * n_ranks
        c._refresh_active_workers()
        c.round_robin_counter = 0
        c.dp_budget = dpc.DPBudget(n_ranks)
        return c

    return make, sent


def _request(n_tokens):
    return types.SimpleNamespace(routed_dp_rank=None, input_ids=[0] * n_tokens)


def _tick_state(rng, G):
    running = rng.integers(0, 20, size=G)
    waiting = rng.integers(0, 4, size=G) * (rng.random(G) < 0.5)
    used = rng.integers(0, 30, size=G) * 100 * (rng.random(G) < 0.9)  # KV tokens in use
    queued = waiting * rng.integers(1, 2000, size=G)  # prompt tokens of the waiting ones
    if rng.random() < 0.3:  # equal loads: the tie-breaks decide
        used[:] = used[0]
        queued[:] = queued[0]
    return running, waiting, used, queued


@pytest.mark.parametrize("policy", ["round_robin", "total_requests", "total_tokens"])
@pytest.mark.parametrize("seed", range(N_CASES))
def test_dp_controller_choices_equal_ours(controller, policy, seed):
    make, sent = controller
    rng = np.random.default_rng(seed)
    G = int(rng.integers(2, 9))
    ctl = make(G)
    schedule = {
        "round_robin": ctl.round_robin_scheduler,
        "total_requests": ctl.total_requests_scheduler,
        "total_tokens": ctl.total_tokens_scheduler,
    }[policy]
    ours_policy = {"round_robin": "round_robin", "total_requests": "jsq_requests"}
    carry = None
    for tick in range(TICKS):
        running, waiting, used, queued = _tick_state(rng, G)
        ctl.dp_budget.update_budget(
            [
                load_snapshot.LoadSnapshot(
                    timestamp=float(tick + 1),
                    dp_rank=g,
                    num_running_reqs=int(running[g]),
                    num_waiting_reqs=int(waiting[g]),
                    num_total_tokens=int(used[g] + queued[g]),
                )
                for g in range(G)
            ]
        )
        burst = rng.integers(1, 4000, size=int(rng.integers(1, 3 * G)))
        sent.clear()
        for n_tokens in burst:
            schedule(_request(int(n_tokens)))
        res = route_batch(
            burst.astype(float),
            used.astype(float),
            np.full(G, len(burst)),
            policy=ours_policy.get(policy, "jsq"),
            n_running=running,
            n_waiting=waiting,
            waiting_tokens=queued.astype(float),
            carry=carry,
        )
        carry = res.extras.get("carry")
        assert res.assignment.tolist() == sent, f"tick {tick}"
