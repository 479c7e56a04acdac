"""SolverWorker: a spawned solver fed through shared memory that never blocks the engine.

The end-to-end test drives a fake engine loop (numpy dispatch with a cumulative counter,
windows by differencing, tables published as they arrive) through a real worker process.
"""

import importlib.util
import logging
import os
import signal
import time
from multiprocessing import shared_memory

import numpy as np
import pytest
from straggler.formulations import CostModel, DispatchProblem, InvalidInputError
from straggler.formulations.dispatch import logical_to_physical
from straggler.formulations.errors import InvalidOptionError
from straggler.runtime import SolverWorker, dispatch_and_count, uniform_table, window_delta
from straggler.runtime.worker import _Solver
from straggler.solvers import solve_dispatch

HAS_TORCH = importlib.util.find_spec("torch") is not None
COST = CostModel.preset("dsv3_a_offline")
READY_TIMEOUT = 600  # a cold numba cache compiles tempo in the child (about a minute)


def _placement(rng, L, E, n_gpus, per_gpu):
    """EPLB-like: every expert once, the extra slots to random experts, shuffled."""
    P = n_gpus * per_gpu
    rows = [rng.permutation(np.concatenate([np.arange(E), rng.choice(E, P - E)])) for _ in range(L)]
    return np.stack(rows)


def test_window_delta():
    a = np.array([[2**31 - 1, 5]], np.int32)
    b = (a.astype(np.int64) + [[10, 3]]).astype(np.int64)
    b32 = ((b + 2**31) % 2**32 - 2**31).astype(np.int32)  # the counter wrapped
    assert window_delta(b32, a).tolist() == [[10, 3]]
    c = np.array([2**63 - 1], np.int64)
    d = np.array([-(2**63) + 4], np.int64)  # wrapped by 5
    assert window_delta(d, c).tolist() == [5]
    with pytest.raises(InvalidInputError, match="current"):
        window_delta(np.zeros(2, np.int32), np.zeros(2, np.int64))


def _to_tables_loop(problem, shares, p2l):
    """The loop DispatchProblem.to_tables replaced (slot by slot, the original code)."""
    from straggler.formulations.dispatch import logical_to_physical

    L, E, G = problem.n_layers, problem.n_experts, problem.n_gpus
    p2l2 = np.broadcast_to(np.asarray(p2l).reshape(-1, np.shape(p2l)[-1]), (L, np.shape(p2l)[-1]))
    sh = np.asarray(shares, float).reshape(L, E, G)
    l2p, count = logical_to_physical(p2l2, E)
    per = p2l2.shape[1] // G
    prob = np.zeros(l2p.shape)
    for l in range(L):
        for e in range(E):
            k = count[l, e]
            if k == 0:
                continue
            tot = sh[l, e].sum()
            if tot <= 0:
                prob[l, e, :k] = 1.0 / k
                continue
            seen = set()
            for j, g in enumerate(l2p[l, e, :k] // per):
                if g not in seen:
                    prob[l, e, j] = sh[l, e, g] / tot
                    seen.add(g)
    return l2p, count, prob


def test_to_tables_matches_the_loop_reference():
    """to_tables (vectorized for the worker's refresh budget) == the per-slot loop."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        L, E, G, per = (
            int(rng.integers(1, 4)),
            int(rng.integers(1, 7)),
            int(rng.integers(1, 5)),
            int(rng.integers(1, 4)),
        )
        p2l = rng.integers(-1, E, size=(L, G * per))
        counts = rng.integers(0, 5, size=(L, E)) * (rng.random((L, E)) < 0.7)
        absent = np.array([[e not in p2l[l] for e in range(E)] for l in range(L)])
        counts[absent] = 0  # an expert without a replica cannot have tokens
        p = DispatchProblem.from_placement(counts, p2l, n_gpus=G)
        sh = rng.random((L, E, G)) * p.replicas * (rng.random((L, E, G)) < 0.6)
        if rng.random() < 0.3:
            sh = np.round(sh * 10)
        got = p.to_tables(sh, p2l)
        want = _to_tables_loop(p, sh, p2l)
        for x, y in zip(got, want):
            assert x.shape == y.shape and np.array_equal(x, y)


class _NumpyEngine:
    """A fake engine on numpy: the plain dispatch reference and a host table."""

    def __init__(self, l2p):
        self.l2p = l2p
        self.probs = uniform_table(l2p)
        self.counter = np.zeros(l2p.shape[:2], np.int32)  # int32: windows by wrap-safe diff

    def dispatch(self, l, ids, seed):
        phys, _ = dispatch_and_count(
            ids, self.l2p[l], self.probs[l], counter=self.counter[l], seed=seed
        )
        return phys

    def snapshot_counter(self):
        return self.counter.copy()

    def publish(self, tables):
        self.probs[tables.active] = tables.probs[tables.active]

    def table(self):
        return self.probs.copy()


class _TorchEngine:
    """A fake engine on torch: the live TablePublisher tensor and a device counter."""

    def __init__(self, l2p):
        import torch
        from straggler.runtime import TablePublisher

        self.torch = torch
        self.pub = TablePublisher(l2p, device="cpu")
        self.counter = torch.zeros(l2p.shape[:2], dtype=torch.int32)

    def dispatch(self, l, ids, seed):
        log2phy, probs = self.pub.layer(l)
        phys, _ = dispatch_and_count(
            self.torch.tensor(ids), log2phy, probs, seed=seed, counter=self.counter[l], check=False
        )
        return phys.numpy()

    def snapshot_counter(self):
        return self.counter.numpy().copy()

    def publish(self, tables):
        self.pub.publish(tables.probs, rows=tables.active)

    def table(self):
        return self.pub.snapshot()


@pytest.fixture
def worker_factory():
    made = []

    def make(*args, **kwargs):
        w = SolverWorker(*args, **kwargs).start()
        made.append(w)
        assert w.wait_ready(READY_TIMEOUT), w.status()
        return w

    yield make
    for w in made:
        w.close()


def test_fake_engine_loop_end_to_end(worker_factory):
    """Engine: dispatch every layer against the live table, count cumulatively, hand the
    worker windows by differencing, publish the tables it posts. Each posted table is
    exactly what the same solve gives in this process, the rows of idle experts are kept,
    and the dispatch keeps routing tokens only to replicas of their expert."""
    rng = np.random.default_rng(1)
    L, E, G = 3, 12, 4
    p2l = _placement(rng, L, E, G, per_gpu=4)
    w = worker_factory(p2l, G, COST, period=0.02)
    assert w.status().healthy
    l2p = w.log2phy
    engine = _TorchEngine(l2p) if HAS_TORCH else _NumpyEngine(l2p)
    prev = engine.snapshot_counter()
    windows, received = {}, []
    skew = 1.0 / np.arange(1, E + 1) ** 1.2
    for step in range(60):
        for l in range(L):
            p = np.roll(skew, 3 * l + step // 20)
            ids = rng.choice(E, size=(64, 4), p=p / p.sum())
            ids[rng.random(64) < 0.1] = -1  # graph padding rows
            phys = engine.dispatch(l, ids, seed=step)
            ok = ids >= 0
            assert (phys[..., None] == l2p[l][np.maximum(ids, 0)]).any(-1)[ok].all()
        if step % 5 == 4:
            cur = engine.snapshot_counter()
            delta = window_delta(cur, prev)
            prev = cur
            windows[w.submit(delta)] = delta
        tables = w.poll()
        if tables is not None:
            assert np.array_equal(tables.active, windows[tables.window] > 0)
            before = engine.table()
            engine.publish(tables)
            after = engine.table()
            idle = ~tables.active
            assert np.array_equal(after[idle], before[idle])  # idle rows untouched
            received.append(tables)
        time.sleep(0.002)
    last = w.wait_tables(max(windows), timeout=30)
    assert last is not None and last.window == max(windows)
    received.append(last)
    assert len(received) >= 2 and all(t.placement == 0 for t in received)
    solver = _Solver(w._cfg, p2l)
    for t in received[-2:]:
        probs, makespan, _ = solver.solve(windows[t.window])
        assert np.array_equal(t.probs, probs)
        assert np.allclose(t.makespan, makespan)
        problem = DispatchProblem.from_placement(windows[t.window], p2l, n_gpus=G)
        ref = solve_dispatch(problem, COST, method="tempo")
        assert np.allclose(t.makespan, ref.makespan)
        assert set(t.timings) == {"read", "solve", "tables", "post", "age"}
    assert w.status().n_solves >= 2 and w.status().n_errors == 0


def test_dead_or_stopped_worker_never_blocks_and_is_reported(worker_factory, caplog):
    rng = np.random.default_rng(2)
    L, E, G = 2, 8, 2
    w = worker_factory(_placement(rng, L, E, G, per_gpu=5), G, COST, period=0.01, stale_after=0.3)
    first = w.wait_tables(w.submit(rng.integers(0, 50, (L, E))), timeout=30)
    assert first is not None
    pid = w._proc.pid
    caplog.set_level(logging.WARNING, logger="straggler.runtime")
    # Stopped (as a worker starved of CPU would look): reported, nothing blocks.
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(0.5)
        window = w.submit(rng.integers(0, 50, (L, E)))
        assert w.poll() is None
        st = w.status()
        assert st.alive and not st.healthy and st.heartbeat_age_s >= 0.3
        assert any("stalled" in r.message for r in caplog.records)
    finally:
        os.kill(pid, signal.SIGCONT)
    again = w.wait_tables(window, timeout=30)
    assert again is not None and w.status().healthy
    # Dead: reported once, every engine-side call still returns at once.
    os.kill(pid, signal.SIGKILL)
    w._proc.join(10)
    w.submit(rng.integers(0, 50, (L, E)))
    assert w.poll() is None
    st = w.status()
    assert not st.alive and not st.healthy and st.exitcode == -signal.SIGKILL
    assert sum("dead" in r.message for r in caplog.records) == 1
    assert w.close() == -signal.SIGKILL


def test_placement_change_errors_and_clean_shutdown():
    rng = np.random.default_rng(3)
    L, E, G = 2, 6, 2
    p2l = _placement(rng, L, E, G, per_gpu=4)
    p2l_hole = p2l.copy()
    p2l_hole[p2l_hole == E - 1] = 0  # expert E-1 loses every replica
    w = SolverWorker(p2l, G, COST, period=0.01, max_replicas=E).start()
    name = w._shm.name
    try:
        assert w.wait_ready(READY_TIMEOUT)
        w.wait_tables(w.submit(np.ones((L, E), np.int64)), timeout=30)
        new = _placement(rng, L, E, G, per_gpu=4)
        w.set_placement(new)
        l2p, _ = logical_to_physical(new, E)
        assert (w.log2phy[..., l2p.shape[-1] :] == -1).all()  # padded to max_replicas
        assert np.array_equal(w.log2phy[..., : l2p.shape[-1]], l2p)
        t = w.wait_tables(w.submit(np.full((L, E), 7)), timeout=30)
        assert t is not None and t.placement == 1
        with pytest.raises(InvalidInputError, match="physical_to_logical"):
            w.set_placement(np.zeros((L, 2 * G), np.int64))
        # A placement leaving an expert without a slot is refused before anything changes.
        with pytest.raises(InvalidInputError, match=f"no slot for expert {E - 1}"):
            w.set_placement(p2l_hole)
        assert np.array_equal(w.log2phy[..., : l2p.shape[-1]], l2p) and w._place_version == 1
        with pytest.raises(InvalidInputError, match="counts"):
            w.submit(np.full((L, E), 2**52 + 1))
        assert w.status().healthy and w.status().reason == ""
        # A refresh that fails in the worker (a placement written behind the checks, as a
        # corrupted block would be) is reported: unhealthy, with the reason; it carries on.
        w._place_version += 1
        w._write_placement(p2l_hole)
        bad = w.submit(np.ones((L, E), np.int64))
        deadline = time.monotonic() + 30
        while w.status().n_errors == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        st = w.status()
        assert st.n_errors >= 1 and f"window {bad}" in st.last_error and st.alive
        assert not st.healthy and st.n_failing >= 1
        assert "refresh" in st.reason and f"window {bad}" in st.reason
        counts = np.ones((L, E), np.int64)
        counts[:, E - 1] = 0
        t = w.wait_tables(w.submit(counts), timeout=30)
        assert t is not None and t.placement == 2
        st = w.status()
        assert st.healthy and st.n_failing == 0 and st.reason == ""
    finally:
        code = w.close()
    assert code == 0
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)


def test_bad_arguments():
    p2l = np.array([[0, 1, 0, 2]])
    with pytest.raises(InvalidOptionError, match="method"):
        SolverWorker(p2l, 2, COST, method="nope")
    with pytest.raises(InvalidOptionError, match="option"):
        SolverWorker(p2l, 2, COST, options={"tauu": 0.1})
    with pytest.raises(InvalidInputError, match="physical_to_logical"):
        SolverWorker(p2l, 3, COST)
    with pytest.raises(InvalidInputError, match="period"):
        SolverWorker(p2l, 2, COST, period=0)
    with pytest.raises(InvalidInputError, match="cost"):
        SolverWorker(p2l, 2, "dsv3")
    with pytest.raises(InvalidInputError, match="max_replicas"):
        SolverWorker(p2l, 2, COST, max_replicas=1)
    with pytest.raises(InvalidInputError, match="max_replicas"):
        SolverWorker(p2l, 2, COST, max_replicas=10**9)  # would size shared memory by it
    with pytest.raises(InvalidInputError, match="n_experts"):
        SolverWorker(p2l, 2, COST, n_experts=2)
    with pytest.raises(InvalidInputError, match="no slot for expert 3"):
        SolverWorker(p2l, 2, COST, n_experts=4)
    with pytest.raises(InvalidInputError, match="n_experts"):
        SolverWorker(p2l, 2, COST, n_experts=10**12)  # would size arrays by it
    with pytest.raises(InvalidInputError, match="below the 4 slots"):
        SolverWorker([[0, 1, 0, 10**9]], 2, COST)
    with pytest.raises(InvalidInputError, match="'options'"):
        SolverWorker(p2l, 2, COST, options=[1])
    w = SolverWorker(p2l, 2, COST)
    with pytest.raises(InvalidInputError, match="start"):
        w.poll()
    with pytest.raises(InvalidInputError, match="'timeout'"):
        w.wait_ready(timeout="x")
    with pytest.raises(InvalidInputError, match="start"):
        w.wait_ready(timeout=1)
    with pytest.raises(InvalidInputError, match="'window'"):
        w.wait_tables(None)
    with pytest.raises(InvalidInputError, match="'timeout'"):
        w.close(timeout=-1)
    with pytest.raises(InvalidInputError, match="counts"):
        w.submit([[1, 2]])


@pytest.mark.parametrize("method", ["tempo", "uniform", "metro", "static"])
def test_worker_solves_through_solve_dispatch_layer_loop(method):
    """The worker's solve is solve_dispatch's layer loop: every method reports the
    evaluator's makespan per layer (not only methods that put one in their extras)."""
    rng = np.random.default_rng(5)
    L, E, G = 3, 8, 2
    p2l = _placement(rng, L, E, G, per_gpu=5)
    w = SolverWorker(p2l, G, COST, method=method)  # not started: its solver runs here
    counts = rng.integers(0, 60, (L, E))
    probs, makespan, _ = _Solver(w._cfg, p2l).solve(counts)
    ref = solve_dispatch(DispatchProblem.from_placement(counts, p2l, n_gpus=G), COST, method=method)
    assert makespan.shape == (L,) and np.isfinite(makespan).all()
    assert np.array_equal(makespan, ref.makespan)


def test_worker_decides_rebalances_as_the_simulator_does():
    """The worker's decision for the windows it read is decide_rebalance's for them (the call
    the simulator's auto policy makes), posted without blocking the engine."""
    from straggler.runtime import decide_for_windows
    from straggler.sim import drifting_windows
    from straggler.solvers.placement.eplb import rebalance_experts
    from straggler.solvers.placement.rebalance.auto import Auto
    from straggler.solvers.placement.rebalance.transfer import MoveCost

    w = drifting_windows(n_windows=2, window=6, n_layers=2, n_experts=16, n_tokens=512,
                         top_k=2, skew=1.2, drift=2.0, rng=4)  # fmt: skip
    # a placement for the opposite loads: the hot experts unreplicated
    p2l = rebalance_experts(w[1].mean(0)[:, ::-1], 24, 1, 1, 4, distinct=True)[0]
    move = MoveCost(expert_bytes=1e6)
    policy = Auto(period=1, window=4, horizon=10**6)
    cost = CostModel(a=0, b=1, c=0, beta=1)  # tokens bind: the placement matters
    with SolverWorker(p2l, 4, cost, period=0.001, rebalance=policy, move=move,
                      rebalance_every=3) as worker:  # fmt: skip
        assert worker.wait_ready(timeout=READY_TIMEOUT)
        assert worker.rebalance_decision() is None
        ids = []
        for c in w[1]:
            ids.append(worker.submit(c))
            assert worker.wait_tables(ids[-1], timeout=60) is not None
        first = worker.wait_decision(timeout=60)
        second = worker.wait_decision(timeout=60)
    assert first.windows == (ids[0], ids[2]) and second.windows == (ids[2], ids[5])
    want = decide_for_windows(policy, w[1][2:6], p2l, 4, 1, 1, cost, move)
    assert second.rebalance == want.rebalance and second.moves == want.moves
    assert np.array_equal(second.physical_to_logical, want.physical_to_logical)
    assert second.gain_s == want.gain_s and second.cost_s == want.cost_s
    assert str(second) == str(want) and second.rebalance and second.moves > 0


def test_worker_rebalance_options_are_checked_before_it_starts():
    p2l = np.array([[0, 1, 0, 2]])
    from straggler.solvers.placement.rebalance.transfer import MoveCost

    with pytest.raises(InvalidInputError, match="move"):
        SolverWorker(p2l, 2, COST, rebalance="auto")
    with pytest.raises(InvalidInputError, match="rebalance"):
        SolverWorker(p2l, 2, COST, rebalance="vllm", move=MoveCost(expert_bytes=1.0))
    with pytest.raises(InvalidInputError, match="move"):
        SolverWorker(p2l, 2, COST, move=MoveCost(expert_bytes=1.0))
    with pytest.raises(InvalidOptionError, match="rebalance"):
        SolverWorker(p2l, 2, COST, rebalance="sometimes", move=MoveCost(expert_bytes=1.0))
