"""Fuzzing every public entry point against the library's contract (README, "Bad input").

Called with anything, an entry point returns a valid answer that the independent checkers
accept, or raises an ``InvalidInputError`` naming the offending parameter (for a trace file:
the file, and the line of a bad row). Never another exception, never a hang (each call runs
under an alarm), never a silent no-op (a clean trace file yields all its requests, a routing
tick places what it can, every dispatch conserves every expert's tokens).

Numbers at the library's bounds (``CostModel``'s ``2**900``, ``tile`` and counts around
``2**53``): refused naming what is past the bound, or solved finitely. The library's own text
files (a sweep table's CSV, a calibration log): a write succeeds exactly when the same content,
saved without any check, is read back as written; a refused write leaves no file. Each of
these properties is shown to fail against a deliberately broken writer or reader.

Strategies: ``straggler.proofs.fuzz``. Example counts: a few dozen per test by default, more
with ``HYPOTHESIS_PROFILE=ci`` (what CI runs).
"""

import contextlib
import math
import os
import signal
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from straggler.formulations import (
    CostModel,
    DispatchProblem,
    InvalidInputError,
    Status,
    check_shares,
    evaluate,
)
from straggler.proofs.certificates import certify
from straggler.proofs.fuzz import (
    Call,
    bound_calls,
    calibration_logs,
    calibration_results,
    cost_model_calls,
    extreme_calls,
    extreme_deployment_calls,
    placement_calls,
    problem_calls,
    routing_calls,
    simulate_calls,
    solve_calls,
    spoil,
    sweep_tables,
    trace_files,
)
from straggler.proofs.strategies import dispatch_instances
from straggler.sim import Trace, load_trace, make_decode_problem, simulate
from straggler.solvers import certified_lower_bound, dispatch_methods, route_batch, solve_dispatch

CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"
#: Examples per fuzz test: small by default (the suite stays fast), more in CI.
N = 400 if CI else 20
FUZZ = settings(max_examples=N, suppress_health_check=list(HealthCheck))
#: Seconds any one call may take before it counts as a hang.
HANG_S = 60


@contextlib.contextmanager
def no_hang(seconds=HANG_S):
    def alarm(signum, frame):
        raise TimeoutError(f"the call did not return within {seconds} s (a hang)")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def contract(fn, call: Call, may_name=(), func=None):
    """Run ``fn``; return its value, or None after an InvalidInputError that names one of the
    spoiled parameters (or of ``may_name``, the parameters a mismatch can be blamed on) and,
    given ``func``, the function the caller called (not a function it calls in turn).
    Any other exception fails the test; so does an error for a call nothing spoiled."""
    try:
        with no_hang():
            return fn()
    except InvalidInputError as exc:
        msg = str(exc)
        assert call.spoiled, f"a valid call was refused: {msg}"
        names = set(call.spoiled) | set(may_name)
        assert any(f"'{p}'" in msg for p in names), f"{msg!r} names none of {sorted(names)}"
        assert func is None or func in msg, f"{msg!r} does not name {func}, the function called"
        return None


# --- formulations ---------------------------------------------------------------------------
@FUZZ
@given(cost_model_calls())
@example(Call(kwargs=dict(a="0", b=1, c=0, beta=0.1), spoiled={"a"}))  # numeric string
def test_cost_model(call):
    m = contract(lambda: CostModel(**call.kwargs), call, func="CostModel")
    if m is not None:
        for name in ("a", "b", "c", "beta", "b2"):
            v = getattr(m, name)
            assert type(v) is float and math.isfinite(v) and v >= 0
        assert type(m.tile) is int and m.tile >= 1
        assert (m.c2 is None) == (m.gamma is None)
        assert np.isfinite(m.time(3, 100, 4))


def _check_problem(p: DispatchProblem):
    assert p.counts.dtype == np.int64 and p.counts.ndim in (1, 2) and p.counts.size
    assert not p.counts.flags.writeable and not p.replicas.flags.writeable
    assert p.replicas.dtype == np.bool_ and p.replicas.shape[:-1] == p.counts.shape
    assert p.n_gpus >= 1 and (p.counts >= 0).all()
    assert not ((p.counts > 0) & ~p.replicas.any(axis=-1)).any()


@FUZZ
@given(problem_calls())
def test_dispatch_problem(call):
    p = contract(
        lambda: DispatchProblem(**call.kwargs), call, ("counts", "replicas"), func="DispatchProblem"
    )
    if p is not None:
        _check_problem(p)


@FUZZ
@given(placement_calls())
@example(  # expert 1 has a token and no slot: the error names the map, not a mask
    Call(kwargs=dict(counts=[0, 1, 0], physical_to_logical=[-1, 2], n_gpus=2),
         spoiled={"physical_to_logical"})
)  # fmt: skip
def test_from_placement(call):
    def build():
        kw = call.kwargs
        return DispatchProblem.from_placement(
            kw["counts"], kw["physical_to_logical"], n_gpus=kw["n_gpus"]
        )

    p = contract(build, call, ("counts", "physical_to_logical", "n_gpus"))
    if p is not None:
        _check_problem(p)
        # accepted: integral values (any numeric dtype), as int64
        p2l = np.asarray(call.kwargs["physical_to_logical"], dtype=float).astype(int).reshape(-1)
        per = p2l.size // p.n_gpus
        for slot, e in enumerate(p2l):
            if e >= 0:
                assert p.replicas[e, slot // per]


@FUZZ
@given(dispatch_instances(max_experts=4, max_gpus=3), st.data())
def test_evaluate_and_check_shares(inst, data):
    problem, cost = inst
    x = np.zeros((problem.n_experts, problem.n_gpus))
    live = problem.counts > 0
    x[live, problem.replicas[live].argmax(axis=1)] = problem.counts[live]
    call = data.draw(spoil({"shares": x}, at_most=1))
    ev = contract(lambda: evaluate(problem, cost, call.kwargs["shares"]), call, func="evaluate")
    if ev is not None:
        assert np.shape(ev.times) == (problem.n_gpus,)
    try:
        with no_hang():
            check_shares(problem, call.kwargs["shares"])
    except InvalidInputError as exc:  # InfeasibleSharesError included
        assert call.spoiled and "'shares'" in str(exc), str(exc)
    else:  # accepted: a feasible dispatch, as the evaluator sees it
        assert np.array_equal(np.asarray(call.kwargs["shares"], dtype=float), x)


# --- solve_dispatch, every method --------------------------------------------------------
def check_dispatch_result(problem, cost, res, options):
    """The independent checker: feasible on the mask it is scored on, the evaluator's
    makespan, a bound at most the makespan, a status the numbers back, certify() holding."""
    want = problem.counts.shape + (problem.n_gpus,)
    assert res.shares.shape == want
    cert = certify(problem, cost, res, tau=options.get("tau", 0.01))
    assert cert.holds, cert.details
    mk = np.atleast_1d(res.makespan)
    lb = np.atleast_1d(res.lower_bound)
    assert np.all(np.isfinite(mk)) and np.all(lb <= mk * (1 + 1e-9) + 1e-9)
    gap = float(options.get("mip_rel_gap", 1e-4)) + 1e-6
    if res.status is Status.OPTIMAL:
        assert np.all(mk <= lb + gap * np.abs(mk) + 1e-9)
    assert res.success == (res.status in (Status.OPTIMAL, Status.HEURISTIC))
    assert res.runtime_s >= 0 and res.compile_s >= 0


@pytest.mark.parametrize("method", dispatch_methods())
def test_solve_dispatch(method):
    @FUZZ
    @given(solve_calls(method))
    def run(call):
        kw = dict(call.kwargs)
        problem, cost = kw.pop("problem"), kw.pop("cost")
        res = contract(
            lambda: solve_dispatch(problem, cost, method=method, **kw),
            call,
            func="solve_dispatch",
        )
        if res is not None:
            check_dispatch_result(problem, cost, res, kw)

    run()


@FUZZ
@given(bound_calls())
def test_certified_lower_bound(call):
    """The certificate takes only the problem and the cost: junk in either is refused naming
    it, and a valid call's bound (one per layer) is never above a feasible dispatch's
    makespan."""
    lb = contract(lambda: certified_lower_bound(**call.kwargs), call)
    if lb is not None:
        problem, cost = call.kwargs["problem"], call.kwargs["cost"]
        mk = np.atleast_1d(solve_dispatch(problem, cost, method="uniform").makespan)
        assert np.shape(lb) == (() if not problem.is_stack else (problem.n_layers,))
        assert np.all(np.atleast_1d(lb) <= mk * (1 + 1e-9) + 1e-9)


@FUZZ
@given(extreme_calls())
@example(  # the held-out run's b=1e308: infinite makespans reported OPTIMAL
    Call(
        kwargs=dict(
            cost=dict(a=0, b=1e308, c=0, beta=1, b2=0, c2=0, gamma=0),
            tile=128, counts=[5, 3, 2, 1], n_gpus=2, method="tempo",
        ),
        spoiled={"b"},
    )
)  # fmt: skip
def test_extreme_finite_numbers(call):
    """Numbers at and around the library's bounds: refused naming what is past a bound (a
    method may refuse more, naming what it cannot hold), or solved with a finite makespan
    and feasible shares."""
    kw = call.kwargs
    method = kw["method"]
    may = set(call.spoiled)
    if method == "milp":
        may.add("cost")  # HiGHS's own limits (1e15 coefficients, 1e20 bounds)
    if method == "static" and sum(kw["counts"]) > 2**26:
        may.add("counts")  # the per-token layout's bound
    try:
        with no_hang():
            cost = CostModel(**(kw["cost"] | ({"tile": kw["tile"]} if "tile" in kw else {})))
            rep = np.ones((len(kw["counts"]), kw["n_gpus"]), dtype=bool)
            problem = DispatchProblem(counts=kw["counts"], replicas=rep)
            res = solve_dispatch(problem, cost, method=method, time_limit=20)
    except InvalidInputError as exc:
        msg = str(exc)
        assert may, f"a call within every bound was refused: {msg}"
        assert any(f"'{n}'" in msg for n in may), f"{msg!r} names none of {sorted(may)}"
        return
    assert not call.spoiled, f"accepted past a bound: {sorted(call.spoiled)}"
    check_shares(problem, res.shares)
    assert math.isfinite(res.makespan) and np.isfinite(res.gpu_time).all()
    assert evaluate(problem, cost, res.shares).makespan == pytest.approx(res.makespan)


@FUZZ
@given(call=extreme_deployment_calls())
def test_extreme_deployment_numbers(call):
    """A deployment whose numbers sit at the bounds: refused naming what is past a bound,
    or run with finite step times (a step's sampling stays within its bound: the kernel
    takes no alarm)."""
    from straggler.sim.engine.deployment import DeploymentConfig, simulate_steps

    kw = call.kwargs
    G = kw["config"]["n_gpus"]
    try:
        with no_hang():
            cfg = DeploymentConfig(**kw["config"])
            run = simulate_steps(cfg, np.full((2, G), kw["kv"]), np.full((2, G), kw["requests"]))
    except InvalidInputError as exc:
        msg = str(exc)
        assert call.spoiled, f"a deployment within every bound was refused: {msg}"
        assert any(f"'{n}'" in msg for n in call.spoiled), f"{msg!r} names none of {call.spoiled}"
        assert "DeploymentConfig" in msg or "simulate_steps" in msg, msg
        return
    assert not call.spoiled, f"accepted past a bound: {sorted(call.spoiled)}"
    for name, v in run.steps.items():
        assert np.isfinite(v).all() and (v >= 0).all(), (name, v)
    assert np.isfinite(run.time_s).all()


def test_solve_dispatch_regressions():
    """Dispatch inputs fuzzing once broke, pinned: each must be refused clearly or answered
    correctly."""
    # a zero-layer stack: refused before np.stack sees it
    with pytest.raises(InvalidInputError, match="'counts' parameter of DispatchProblem"):
        DispatchProblem(counts=np.zeros((0, 4), int), replicas=np.ones((4, 2), bool))
    # moonep: its lower bound stays below its makespan (50.3), so it is not reported OPTIMAL
    rep = np.zeros((4, 2), bool)
    rep[:, 0] = True
    rep[3, 1] = True
    p = DispatchProblem(counts=[100, 100, 100, 1], replicas=rep)
    cost = CostModel(a=0, b=0, c=5, beta=0.3)
    res = solve_dispatch(p, cost, method="moonep")
    assert res.lower_bound <= res.makespan and res.makespan == pytest.approx(50.3)
    assert res.status is Status.HEURISTIC  # 50.15 <= 50.3: not proved optimal
    assert certify(p, cost, res).holds
    check_shares(DispatchProblem(counts=p.counts, replicas=res.extras["replicas"]), res.shares)
    # token_lp at a tiny time limit returns its incumbent instead of raising
    r = solve_dispatch(p, cost, method="token_lp", time_limit=1e-6)
    assert r.status is Status.FEASIBLE and not r.success
    # ragged masks and maps: refused before numpy sees them
    with pytest.raises(InvalidInputError, match="'replicas'.*ragged"):
        DispatchProblem(counts=[1, 2], replicas=[[1, 0], [1]])
    with pytest.raises(InvalidInputError, match="'physical_to_logical'.*ragged"):
        DispatchProblem.from_placement([[1, 1], [1, 1]], [[0, 1], [1]], n_gpus=2)
    # numeric strings in CostModel were accepted
    with pytest.raises(InvalidInputError, match="'beta' parameter of CostModel"):
        CostModel(a=0, b=1, c=0, beta="0.1")


def test_huge_top_k_does_not_hang():
    """A huge top_k once hung the synthetic token layout (found by this suite)."""
    p = DispatchProblem(counts=[17, 13, 0], replicas=np.ones((3, 2), bool))
    with no_hang(3):
        try:
            solve_dispatch(p, CostModel(a=0, b=0, c=2, beta=0.5), method="static", top_k=10**9)
        except InvalidInputError as exc:
            assert "'top_k'" in str(exc)


# --- routing --------------------------------------------------------------------------------
def check_routing(kw, d):
    """Independent check of a routing tick: indices in range, slots respected, the reported
    imbalance recomputed, and everything placed that could be (all policies place
    ``min(n_pool, S_tot)`` requests; TRT-LLM's per-rank cap may place fewer, never none; its
    balance may hold the tick back; ``follow_bootstrap_room`` fills each rank's slots from the
    requests whose room maps to it)."""
    s = np.asarray(kw["prefill_lengths"], dtype=float).reshape(-1)
    loads = np.asarray(kw["loads"], dtype=float)
    L = loads[:, 0] if loads.ndim == 2 else loads
    free = [int(v) for v in np.asarray(kw["free_slots"]).reshape(-1)]
    G = L.size
    a = np.asarray(d.assignment)
    assert a.shape == s.shape and a.dtype.kind == "i"
    assert ((a >= -1) & (a < G)).all()
    placed = np.bincount(a[a >= 0], minlength=G)
    assert all(int(placed[g]) <= free[g] for g in range(G))
    assert d.n_placed == int((a >= 0).sum())
    after = L + np.bincount(a[a >= 0], weights=s[a >= 0], minlength=G)
    for got, want in (
        (d.imbalance_before, G * L.max() - L.sum()),
        (d.imbalance_after, G * after.max() - after.sum()),
    ):
        assert math.isfinite(got) and got == pytest.approx(want, rel=1e-9, abs=1e-6)
    can = min(s.size, sum(free))
    if kw["policy"] == "trtllm":
        assert d.n_placed >= min(1, can)
    elif kw["policy"] == "trtllm_balance":  # TensorRT-LLM's assignment, or all held back
        assert d.n_placed in (0, route_batch(**{**kw, "policy": "trtllm"}).n_placed)
    elif kw["policy"] == "follow_bootstrap_room":  # each request waits for its own rank
        rank = np.asarray(kw.get("pool_key", np.arange(s.size)), dtype=np.int64) % G
        assert d.n_placed == sum(min(int((rank == g).sum()), free[g]) for g in range(G))
    else:
        assert d.n_placed == can


@FUZZ
@given(routing_calls())
def test_route_batch(call):
    kw = dict(call.kwargs)
    kw.pop("_edge")  # free slots past int64, lengths near 1.7e308, ... (pinned below)
    d = contract(
        lambda: route_batch(**kw),
        call,
        ("prefill_lengths", "loads", "free_slots", "n_running"),
        func="route_batch",
    )
    if d is not None:
        check_routing(kw, d)


@pytest.mark.parametrize("policy", ["br0", "brh", "trtllm"])
def test_route_batch_free_slots_past_int64(policy):
    """Free slots summing past int64 are refused (or routed correctly), never a silent
    tick that places nothing."""
    kw = dict(prefill_lengths=[10, 20, 30, 40], loads=[0.0, 5.0, 9.0, 1.0])
    kw.update(free_slots=[2**63 - 1, 1, 1, 1], policy=policy)
    try:
        d = route_batch(**kw)
    except InvalidInputError as exc:
        assert "'free_slots'" in str(exc)
        return
    check_routing(kw, d)


def test_route_batch_lengths_near_float_max():
    """Lengths near the float maximum are refused, never answered with a NaN imbalance."""
    kw = dict(prefill_lengths=[1.7e308, 1.7e308], loads=[0.0, 0.0], free_slots=[1, 1])
    for policy in ("br0", "jsq"):
        try:
            d = route_batch(**kw, policy=policy)
        except InvalidInputError as exc:
            assert "'prefill_lengths'" in str(exc)
            continue
        check_routing(dict(kw, policy=policy), d)


# --- simulate -------------------------------------------------------------------------------
@FUZZ
@given(simulate_calls())
def test_simulate(call):
    rep = contract(lambda: simulate(**call.kwargs), call, func="simulate")
    if rep is not None:
        n = len(call.kwargs["trace"])
        assert rep.n_requests == n and rep.n_finished <= n
        if call.kwargs.get("max_steps") is None:
            assert rep.n_finished == n  # every request leaves, whatever the tick
        assert math.isfinite(rep.mean_imbalance) and rep.mean_imbalance >= 0
        assert math.isnan(rep.balance_ratio) or 0 <= rep.balance_ratio <= 1 + 1e-12
        assert rep.throughput_tps >= 0 and rep.n_steps >= 1


def test_simulate_with_tick_finishes_all():
    t = Trace(arrival_s=np.zeros(4), prompt_len=np.zeros(4, int), output_len=np.ones(4, int))
    rep = simulate(t, policy="br0", n_replicas=1, max_slots=1, tick=3)
    assert rep.n_finished == 4


def test_simulate_refuses_integers_past_int64():
    t = Trace(arrival_s=[0.0], prompt_len=[0], output_len=[1])
    with pytest.raises(InvalidInputError, match="'max_slots'"):
        simulate(t, policy="br0", n_replicas=1, max_slots=2**63)


# --- traces ---------------------------------------------------------------------------------
@FUZZ
@given(trace_files())
def test_load_trace_from_bytes(tf):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"fuzz.{'jsonl' if tf.kind == 'mooncake' else 'csv'}")
        with open(path, "wb") as f:
            f.write(tf.data)
        try:
            with no_hang():
                t = load_trace(path, rate=2.0)
        except InvalidInputError as exc:
            msg = str(exc)
            assert tf.n_requests is None, f"a clean {tf.kind} file was refused: {msg}"
            assert path in msg, msg
            if msg.startswith("Malformed row"):
                assert ", line " in msg
            return
    assert isinstance(t, Trace)
    if tf.n_requests is not None:
        assert len(t) == tf.n_requests  # nothing silently dropped
    assert (t.prompt_len >= 0).all() and (t.output_len >= 1).all()
    assert len(t) == 0 or (t.arrival_s[0] == 0 and (np.diff(t.arrival_s) >= 0).all())


@FUZZ
@given(st.data())
def test_trace_and_generators(data):
    n = data.draw(st.integers(0, 5))
    base = {
        "arrival_s": np.arange(n, dtype=float),
        "prompt_len": np.full(n, 10),
        "output_len": np.full(n, 2),
    }
    call = data.draw(spoil(base, at_most=1))
    t = contract(lambda: Trace(**call.kwargs), call, ("arrival_s", "prompt_len", "output_len"))
    if t is not None:
        assert len(t) == np.asarray(call.kwargs["arrival_s"]).size
    base = {"n_requests": data.draw(st.integers(0, 20)), "rate": 3.0, "rng": 0, "duration_s": 4.0}
    gen = data.draw(spoil(base, at_most=1))
    from straggler.sim import generate_trace

    tr = contract(lambda: generate_trace("azure_conv", **gen.kwargs), gen)
    if tr is not None:
        # junk can be a valid value: n_requests=None is the default, rate * duration_s requests
        n_req = gen.kwargs["n_requests"]
        assert len(tr) == (round(3.0 * 4.0) if n_req is None else n_req)
    mk = data.draw(
        spoil({"n_gpus": 2, "tokens_per_gpu": 4, "n_layers": 1, "n_history": 1, "seed": 0})
    )
    p = contract(lambda: make_decode_problem("qwen2_57b", **mk.kwargs), mk, ("num_nodes",))
    if p is not None:
        _check_problem(p)


# --- the library's own files: write(x) succeeds exactly when read(write(x)) == x -------------


def _plain(v):
    """A value as the Python scalar a text format stores (numpy scalars unwrapped)."""
    return v.item() if isinstance(v, np.generic) else v


def _same(a, b) -> bool:
    """Equal and of one type (NaN equal to NaN; 1 is not True, not 1.0, not '1')."""
    return type(a) is type(b) and (a == b or (a != a and b != b))


def _table_back(table, back) -> bool:
    """Whether ``back`` (read) is ``table`` (written): the same columns, each row's values
    the same (a missing entry read as None)."""
    return (
        back.columns == table.columns
        and len(back.rows) == len(table.rows)
        and all(
            _same(_plain(a.get(c)), b.get(c))
            for a, b in zip(table.rows, back.rows)
            for c in table.columns
        )
    )


def _table_held(path, table) -> bool:
    """Whether CSV holds ``table``: written with no check (each value's ``str``, a float's
    ``repr``), does ``SweepTable.read_csv`` give it back?"""
    import csv

    from straggler.sim.experiments.sweep import SweepTable

    def text(v):
        v = _plain(v)
        return "" if v is None else repr(v) if isinstance(v, float) else str(v)

    try:
        with open(path, "w", encoding="utf-8", newline="") as fh:
            w = csv.writer(fh)  # RFC 4180's CRLF: any field with a CR or LF quoted
            w.writerow(table.columns)
            for r in table.rows:
                w.writerow([text(r.get(c)) for c in table.columns])
        back = SweepTable.read_csv(path, settings=table.settings)
    except (UnicodeEncodeError, InvalidInputError):
        return False
    return _table_back(table, back)


@FUZZ
@given(x=sweep_tables())
def test_sweep_table_csv_round_trip(x):
    """``SweepTable.to_csv`` writes exactly the tables CSV holds: those ``read_csv`` gives
    back value for value, type for type (``'1'`` is not 1, ``np.float64(1.5)`` is 1.5)."""
    from straggler.sim.experiments.sweep import SweepTable

    rows, settings_ = x
    table = SweepTable(rows, settings=settings_)
    with tempfile.TemporaryDirectory() as d:
        held = _table_held(os.path.join(d, "raw.csv"), table)
        path = os.path.join(d, "t.csv")
        try:
            table.to_csv(path)
        except InvalidInputError as exc:
            assert not held, f"refused a table CSV holds: {exc}"
            assert "SweepTable.to_csv" in str(exc) and not os.path.exists(path)
            return
        assert held, "wrote a table read_csv does not give back"
        assert _table_back(table, SweepTable.read_csv(path, settings=settings_))


def _log_back(x, back) -> bool:
    """Whether ``back`` (read_calibration_log's dict) is what ``x`` wrote: the columns as
    float64, exactly; the metadata as text."""
    for k in ("G", "N", "t"):
        if not np.array_equal(back[k], np.asarray(x[k], dtype=float)):
            return False
    if (back["T"] is None) != ("T" not in x) or (
        "T" in x and not np.array_equal(back["T"], np.asarray(x["T"], dtype=float))
    ):
        return False
    return back["meta"] == {k: str(v) for k, v in (x.get("meta") or {}).items()}


def _log_held(path, x) -> bool:
    """Whether the log format holds ``x``: written with no check (``# key: value`` lines,
    the header, each number's ``repr``), does ``read_calibration_log`` give it back?"""
    from straggler.solvers.dispatch.calibration import read_calibration_log

    names = ["G", "N"] + (["T"] if "T" in x else []) + ["t"]
    lines = [f"# {k}: {v}" for k, v in (x.get("meta") or {}).items()]
    lines.append(",".join(names[:-1] + ["t_us"]))
    for i in range(len(x["G"])):
        lines.append(",".join(repr(float(x[k][i])) for k in names))
    try:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write("\n".join(lines) + "\n")
        back = read_calibration_log(path)
    except (UnicodeEncodeError, InvalidInputError):
        return False
    return _log_back(x, back)


@FUZZ
@given(x=calibration_logs())
def test_calibration_log_round_trip(x):
    """``write_calibration_log`` writes exactly the logs ``read_calibration_log`` gives back
    (no empty log, no negative count, no metadata it would read back otherwise)."""
    from straggler.solvers.dispatch.calibration import (
        read_calibration_log,
        write_calibration_log,
    )

    with tempfile.TemporaryDirectory() as d:
        held = _log_held(os.path.join(d, "raw.csv"), x)
        path = os.path.join(d, "log.csv")
        try:
            write_calibration_log(path, x["G"], x["N"], x["t"], T=x.get("T"), meta=x.get("meta"))
        except InvalidInputError as exc:
            assert not held, f"refused a log the format holds: {exc}"
            assert "write_calibration_log" in str(exc) and not os.path.exists(path)
            return
        assert held, "wrote a log read_calibration_log does not give back"
        assert _log_back(x, read_calibration_log(path))


def _result_held(path, result) -> bool:
    """Whether JSON holds ``result``: its ``to_dict`` written with no check, does
    ``CalibrationResult.load`` give back the same JSON, and the same ``meta``?"""
    import json

    from straggler.solvers import CalibrationResult

    try:
        text = json.dumps(result.to_dict() | {"meta": result.meta}, indent=1)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        back = CalibrationResult.load(path)
    except (AttributeError, TypeError, ValueError, RecursionError):
        return False  # InvalidInputError included: the reader refused it
    return json.dumps(back.to_dict(), indent=1) == text and back.meta == result.meta


@FUZZ
@given(kw=calibration_results())
def test_calibration_result_round_trip(kw):
    """``CalibrationResult.save`` writes exactly the results ``CalibrationResult.load``
    gives back as written."""
    import json

    from straggler.solvers import CalibrationResult

    result = CalibrationResult(**kw)
    with tempfile.TemporaryDirectory() as d:
        held = _result_held(os.path.join(d, "raw.json"), result)
        path = os.path.join(d, "fit.json")
        try:
            result.save(path)
        except InvalidInputError as exc:
            assert not held, f"refused a result JSON holds: {exc}"
            assert "CalibrationResult.save" in str(exc) and not os.path.exists(path)
            return
        assert held, "wrote a result CalibrationResult.load does not give back"
        back = CalibrationResult.load(path)
        assert json.dumps(back.to_dict()) == json.dumps(result.to_dict())


# --- each property can fail -------------------------------------------------------------------


def test_extreme_numbers_property_can_fail(falsified, monkeypatch):
    """Without CostModel's bound on its parameters, b=1e308 is accepted and the makespan is
    infinite; without it on internode_us_per_token, 1.8e308 gives infinite step times: the
    properties fail."""
    import straggler.formulations.cost as cost_mod

    monkeypatch.setattr(cost_mod, "MAX_COST_PARAMETER", math.inf)
    assert falsified(test_extreme_finite_numbers, call=extreme_calls())
    from straggler.sim.engine import deployment as deployment_mod

    monkeypatch.setattr(deployment_mod, "MAX_COST_PARAMETER", math.inf)
    assert falsified(test_extreme_deployment_numbers, call=extreme_deployment_calls())


def test_round_trip_properties_can_fail(falsified, monkeypatch):
    """Writers that write what they are given unchecked (as to_csv and save did), a reader
    that drops the metadata: the round-trip properties fail."""
    import json

    import straggler.sim.experiments.sweep as sweep_mod
    import straggler.solvers.dispatch.calibration as calib_mod

    monkeypatch.setattr(sweep_mod, "_csv_cell", lambda v, row, col: "" if v is None else str(v))
    assert falsified(test_sweep_table_csv_round_trip, x=sweep_tables())

    def save_unchecked(self, path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.to_dict() | {"meta": self.meta}))

    monkeypatch.setattr(calib_mod.CalibrationResult, "save", save_unchecked)
    assert falsified(test_calibration_result_round_trip, kw=calibration_results())
    read = calib_mod.read_calibration_log
    monkeypatch.setattr(calib_mod, "read_calibration_log", lambda p: read(p) | {"meta": {}})
    assert falsified(test_calibration_log_round_trip, x=calibration_logs())
