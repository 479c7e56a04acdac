"""formulations/: cost model, dispatch instances, layouts, evaluator, feasibility checker."""

import numpy as np
import pytest
from straggler.formulations import (
    PRESETS,
    CostModel,
    DispatchProblem,
    InfeasibleSharesError,
    InvalidInputError,
    InvalidOptionError,
    basic_lower_bound,
    check_shares,
    evaluate,
    logical_to_physical,
)
from straggler.solvers import solve_dispatch

FULL2 = np.ones((3, 2), bool)


# --- CostModel ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, param",
    [
        (dict(a=-1, b=1, c=0, beta=0.1), "'a'"),
        (dict(a=0, b=float("nan"), c=0, beta=0.1), "'b'"),
        (dict(a=0, b=1, c=float("inf"), beta=0.1), "'c'"),
        (dict(a=0, b=1, c=0, beta="x"), "'beta'"),
        # numeric strings are refused, not read as numbers
        (dict(a="0", b=1, c=0, beta=0.1), "'a'.*Got '0'"),
        (dict(a=0, b=1, c=0, beta=0.1, c2="25", gamma=0.1), "'c2'"),
        (dict(a=0, b=True, c=0, beta=0.1), "'b'"),
        (dict(a=0, b=1, c=0, beta=0.1, tile=True), "'tile'"),
        (dict(a=0, b=1, c=0, beta=0.1, b2=-0.5), "'b2'"),
        (dict(a=0, b=1, c=0, beta=0.1, tile=0), "'tile'"),
        (dict(a=0, b=1, c=0, beta=0.1, tile=1.5), "'tile'"),
        (dict(a=0, b=1, c=0, beta=0.1, c2=25.0), "'c2' and 'gamma'"),
        (dict(a=0, b=1, c=0, beta=0.1, gamma=0.1), "'c2' and 'gamma'"),
    ],
)
def test_cost_model_rejects_bad_parameters(kw, param):
    with pytest.raises(InvalidInputError, match=param):
        CostModel(**kw)


def test_cost_model_time_all_pieces():
    m = CostModel(a=10, b=2, b2=1, c=5, beta=0.5, c2=1, gamma=0.75, tile=4)
    # G=3, T=5: 10 + 6 + 2 = 18; N=20: 5 + 10 = 15; traffic 1 + 15 = 16
    assert float(m.time(3, 20, 5)) == 18.0
    # N=40: compute 25, traffic 31 binds
    assert float(m.time(3, 40, 5)) == 31.0
    assert m.n_star == 4.0


def test_every_preset_builds_and_names_are_checked():
    for name in PRESETS:
        assert isinstance(CostModel.preset(name), CostModel)
    assert CostModel.preset("qwen3_235b_b_tile").b2 == 1.23
    with pytest.raises(InvalidOptionError, match="'name'"):
        CostModel.preset("nope")
    with pytest.raises(InvalidOptionError):
        CostModel.preset("dsv3_a_offline").replace(bogus=1)
    assert CostModel.preset("dsv3_a_offline").replace(a=1.0).a == 1.0


def test_as_array_zero_traffic_is_exact():
    m = CostModel(a=1, b=2, c=3, beta=0.5)
    assert m.as_array().tolist() == [1, 2, 0, 3, 0.5, 0, 0, 128]


# --- DispatchProblem validation -------------------------------------------------------------
@pytest.mark.parametrize(
    "counts, match",
    [
        ([1, -3, 2], "value -3 at index 1"),
        ([1.0, 2.5, 3.0], "non-integral value 2.5 at index 1"),
        ([1.0, float("nan"), 3.0], "NaN or infinite"),
        ([1.0, float("inf"), 3.0], "NaN or infinite"),
        ([True, False, True], "boolean"),
        (["a", "b", "c"], "strings"),
        (["1", "2", "3"], "strings"),
        ([1, 2, 2**60], "value 1152921504606846976 at index 2"),
        ([1, 2, 10**30], "too large"),
        ([1 + 0j, 2, 3], "complex"),
        (np.zeros((2, 3, 4)), r"shape \(2, 3, 4\)"),
        ([], r"shape \(0,\)"),
        # a zero-layer stack is refused before np.stack sees it
        (np.zeros((0, 3)), r"shape \(0, 3\)"),
    ],
)
def test_problem_rejects_bad_counts(counts, match):
    with pytest.raises(InvalidInputError, match="'counts' parameter of DispatchProblem") as err:
        DispatchProblem(counts=counts, replicas=FULL2)
    assert err.match(match)


def test_problem_rejects_bad_replicas_and_orphans():
    with pytest.raises(InvalidInputError, match="'replicas'.*shape"):
        DispatchProblem(counts=[1, 2, 3], replicas=np.ones((2, 2), bool))
    with pytest.raises(InvalidInputError, match="'replicas'.*values other than 0 and 1"):
        DispatchProblem(counts=[1, 2, 3], replicas=np.full((3, 2), 0.5))
    # ragged masks are refused before numpy sees them
    with pytest.raises(InvalidInputError, match="'replicas'.*ragged"):
        DispatchProblem(counts=[1, 2, 3], replicas=[[1, 0], [1], [0, 1]])
    with pytest.raises(InvalidInputError, match="'replicas'.*strings"):
        DispatchProblem(counts=[1, 2], replicas=[["1", "0"], ["0", "1"]])
    with pytest.raises(InvalidInputError, match="expert 1 with 2 tokens and no replica"):
        DispatchProblem(counts=[1, 2, 3], replicas=[[1, 0], [0, 0], [0, 1]])
    with pytest.raises(InvalidInputError, match="expert 0 of layer 1"):
        DispatchProblem(
            counts=[[1, 0], [4, 0]], replicas=np.array([[[1, 0], [0, 0]], [[0, 0], [0, 0]]], bool)
        )
    with pytest.raises(InvalidInputError, match="'gpu_node'"):
        DispatchProblem(counts=[1, 2, 3], replicas=FULL2, gpu_node=[0, 0, 1])
    # an expert with no tokens needs no replica
    DispatchProblem(counts=[1, 0, 3], replicas=[[1, 0], [0, 0], [0, 1]])


def test_problem_is_frozen_and_copies_input():
    counts = np.array([5, 1, 0])
    p = DispatchProblem(counts=counts, replicas=FULL2)
    counts[0] = 99
    assert p.counts[0] == 5
    with pytest.raises(ValueError):
        p.counts[0] = 1
    with pytest.raises(AttributeError):
        p.counts = np.zeros(3)


def test_stack_broadcasts_a_shared_mask_and_slices_layers():
    p = DispatchProblem(counts=[[1, 2, 3], [4, 0, 6]], replicas=FULL2)
    assert (p.n_layers, p.n_experts, p.n_gpus, p.is_stack) == (2, 3, 2, True)
    assert p.layer(1).counts.tolist() == [4, 0, 6] and not p.layer(1).is_stack
    assert p.full_replication


# --- layouts: SGLang / vLLM / EPLB -----------------------------------------------------------
def test_from_placement_and_to_tables_roundtrip():
    # 4 experts, 8 slots on 4 GPUs (2 slots each); expert 0 on GPUs 0 and 2, expert 1 twice
    # on GPU 1 (EPLB's duplicate-on-one-GPU case), expert 3 on GPUs 2 and 3, one empty slot.
    p2l = np.array([0, 2, 1, 1, 0, 3, 3, -1])
    p = DispatchProblem.from_placement([8, 4, 2, 6], p2l, n_gpus=4)
    assert p.replicas.astype(int).tolist() == [
        [1, 0, 1, 0],
        [0, 1, 0, 0],
        [1, 0, 0, 0],
        [0, 0, 1, 1],
    ]
    x = np.zeros((4, 4))
    x[0] = [3, 0, 5, 0]
    x[1, 1] = 4
    x[2, 0] = 2
    x[3, 2] = 6
    check_shares(p, x)
    l2p, cnt, prob = p.to_tables(x, p2l)
    assert cnt[0].tolist() == [2, 2, 1, 2]
    assert l2p[0, 0].tolist() == [0, 4] and l2p[0, 1].tolist() == [2, 3]
    assert prob[0, 0].tolist() == [3 / 8, 5 / 8]
    # duplicate replicas on one GPU: the whole GPU share goes to the first slot
    assert prob[0, 1].tolist() == [1.0, 0.0]
    assert prob[0, 3].tolist() == [1.0, 0.0]
    assert np.allclose(prob[0].sum(axis=1), 1.0)
    # slot tables are consistent with physical_to_logical
    for e in range(4):
        for k in range(cnt[0, e]):
            assert p2l[l2p[0, e, k]] == e


def test_from_placement_rejects_bad_maps():
    with pytest.raises(InvalidInputError, match="a multiple of n_gpus=2. Got 3 slots"):
        DispatchProblem.from_placement([1, 1], [0, 1, 0], n_gpus=2)
    with pytest.raises(InvalidInputError, match=r"entries in \[-1, 1\]"):
        DispatchProblem.from_placement([1, 1], [0, 2], n_gpus=2)
    with pytest.raises(InvalidInputError, match="'n_gpus'"):
        DispatchProblem.from_placement([1, 1], [0, 1], n_gpus=0)
    # a ragged map is refused before numpy sees it
    with pytest.raises(InvalidInputError, match="'physical_to_logical'.*ragged"):
        DispatchProblem.from_placement([[1, 1], [1, 1]], [[0, 1], [1]], n_gpus=2)
    with pytest.raises(InvalidInputError, match="'physical_to_logical'.*strings"):
        DispatchProblem.from_placement([1, 1], ["0", "1"], n_gpus=2)
    with pytest.raises(InvalidInputError, match="'counts' parameter of DispatchProblem.from"):
        DispatchProblem.from_placement([[1, 1], [1]], [0, 1], n_gpus=2)


def test_logical_to_physical_padding():
    l2p, cnt = logical_to_physical(np.array([[2, 2, 0, -1], [1, 0, 1, 1]]), 3)
    assert cnt.tolist() == [[1, 0, 2], [1, 3, 0]]
    assert l2p[0].tolist() == [[2, -1, -1], [-1, -1, -1], [0, 1, -1]]


# --- evaluator and checker -------------------------------------------------------------------
def test_evaluate_counts_tiles_with_slack_and_strict_activation():
    p = DispatchProblem(counts=[257, 1], replicas=[[1, 1], [1, 1]])
    cost = CostModel(a=1, b=10, b2=2, c=0, beta=0.01, tile=128)
    x = np.array([[128.0000000001, 128.9999999999], [1e-12, 1 - 1e-12]])
    ev = evaluate(p, cost, x)
    assert ev.G.tolist() == [2, 2]  # a 1e-12 share still activates the expert
    assert ev.T.tolist() == [2, 3]  # 128.0000000001 is one tile; 128.99... is two
    assert ev.times.tolist() == [1 + 20, 1 + 20 + 2]
    assert ev.makespan == 23.0


def test_check_shares_catches_each_violation():
    p = DispatchProblem(counts=[4, 2], replicas=[[1, 0], [1, 1]])
    check_shares(p, [[4.0, 0.0], [1.0, 1.0]])
    cases = [
        ([[4.0, 0.0], [3.0, -1.0]], "non-negative"),
        ([[4.0, 0.0], [1.0, 0.5]], "conserving"),
        ([[2.0, 2.0], [1.0, 1.0]], "zero where no replica"),
        ([[4.0, 0.0], [np.nan, 1.0]], "finite"),
        ([[4.0, 0.0, 0.0]], "shape"),
    ]
    for x, match in cases:
        with pytest.raises(InfeasibleSharesError, match=match):
            check_shares(p, x)
    # conservation is relative: 1e-10 off on a count of 4 passes
    check_shares(p, [[4.0 + 4e-10, 0.0], [1.0, 1.0]])


def test_basic_lower_bound_is_below_brute_optimum():
    from straggler.proofs.brute import brute_force_dispatch

    rng = np.random.default_rng(7)
    for _ in range(40):
        E, g = int(rng.integers(1, 5)), int(rng.integers(1, 4))
        counts = rng.integers(0, 12, E)
        rep = rng.random((E, g)) < 0.6
        rep[np.arange(E), rng.integers(0, g, E)] = True
        cost = CostModel(
            a=float(rng.integers(0, 3)),
            b=float(rng.integers(0, 5)),
            b2=float(rng.integers(0, 3)),
            c=float(rng.integers(0, 3)),
            beta=float(rng.random()),
            tile=4,
        )
        p = DispatchProblem(counts=counts, replicas=rep)
        opt, _ = brute_force_dispatch(p, cost)
        assert basic_lower_bound(p, cost) <= opt + 1e-9


# --- entry point: honest errors ----------------------------------------------------------------
def test_solve_dispatch_rejects_bad_arguments():
    p = DispatchProblem(counts=[3, 1, 0], replicas=FULL2)
    cost = CostModel(a=0, b=1, c=0, beta=0.1)
    with pytest.raises(InvalidOptionError, match="'method'.*Got 'nope'"):
        solve_dispatch(p, cost, method="nope")
    with pytest.raises(InvalidOptionError, match="unknown option.*'bogus'"):
        solve_dispatch(p, cost, method="tempo", bogus=1)
    with pytest.raises(InvalidInputError, match="'problem'"):
        solve_dispatch([3, 1, 0], cost)
    with pytest.raises(InvalidInputError, match="'cost'"):
        solve_dispatch(p, {"a": 0})
    with pytest.raises(InvalidInputError, match="'rng'"):
        solve_dispatch(p, cost, rng=-1)


def test_stack_result_is_stacked():
    p = DispatchProblem(counts=[[600, 30, 30], [0, 0, 0], [5, 5, 5]], replicas=FULL2)
    r = solve_dispatch(p, CostModel(a=0, b=15, c=0, beta=0.1))
    assert r.shares.shape == (3, 3, 2)
    assert r.makespan.shape == r.lower_bound.shape == (3,)
    assert r.gpu_time.shape == (3, 2)
    assert len(r.extras["layer_status"]) == 3
    for l in range(3):
        single = solve_dispatch(p.layer(l), CostModel(a=0, b=15, c=0, beta=0.1))
        assert single.makespan == r.makespan[l]
        assert np.array_equal(single.shares, r.shares[l])


def test_a_problem_in_fortran_order_is_stored_and_scored_in_c_order():
    """A problem's arrays are C-ordered whatever order they are given in (the score kernel
    views a layer as a stack of one, which needs C order), and its stack scores as its
    layers do."""
    counts = np.asfortranarray([[600, 30, 30], [5, 5, 5]])
    p = DispatchProblem(counts=counts, replicas=np.asfortranarray(np.ones((2, 3, 2), bool)))
    assert p.counts.flags.c_contiguous and p.replicas.flags.c_contiguous
    cost = CostModel(a=0, b=15, c=0, beta=0.1)
    r = solve_dispatch(p, cost, method="static")
    for l in range(2):
        single = solve_dispatch(p.layer(l), cost, method="static")
        assert single.makespan == r.makespan[l]
        assert np.array_equal(single.gpu_time, r.gpu_time[l])


def test_score_kernel_equals_reference_check_shares_and_the_evaluator():
    """solve_dispatch's one-pass check and evaluation: kernel == py_func == reference, the
    feasibility answer is check_shares's, and G, N, T, times equal evaluate_arrays's bit for
    bit (fractional shares, tiles, the traffic piece, stacks)."""
    from straggler.formulations.dispatch import evaluate_arrays
    from straggler.solvers.dispatch._score import (
        score_kernel,
        score_reference,
        score_times_kernel,
        score_times_reference,
    )

    rng = np.random.default_rng(11)
    costs = [
        CostModel.preset("dsv3_a_offline"),
        CostModel.preset("qwen3_235b_b_tile").replace(tile=4),
        CostModel.preset("dsv2_lite_a_serving"),
    ]
    seen = {True: 0, False: 0}
    for _ in range(300):
        L, E, g = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(1, 4))
        rep = rng.random((L, E, g)) < 0.6
        for l in range(L):
            rep[l, np.arange(E), rng.integers(0, g, E)] = True
        counts = rng.integers(0, 20, (L, E))
        p = DispatchProblem(counts=counts, replicas=rep)
        x = np.zeros((L, E, g))
        for l in range(L):
            for e in range(E):
                gs = np.flatnonzero(rep[l, e])
                w = rng.dirichlet(np.ones(gs.size)) if rng.random() < 0.3 else None
                x[l, e, gs] = (
                    counts[l, e] * w
                    if w is not None
                    else rng.multinomial(counts[l, e], np.ones(gs.size) / gs.size)
                )
        kind = rng.integers(0, 6)
        if kind == 1:
            x[rng.integers(L), rng.integers(E), rng.integers(g)] += 0.5  # conservation / mask
        elif kind == 2:
            x.flat[rng.integers(x.size)] = -1.0
        elif kind == 3:
            x.flat[rng.integers(x.size)] = rng.choice([np.nan, np.inf])
        elif kind == 4 and (~rep).any():
            l, e, h = np.argwhere(~rep)[0]
            x[l, e, h] = 1.0
        cost = costs[int(rng.integers(len(costs)))]
        c = np.append(cost.as_array(), 1.0 if cost.has_traffic else 0.0)
        args = (x, p.replicas, p.counts, c, 1e-9)
        want = score_reference(*args)
        for got in (score_kernel(*args), score_kernel.py_func(*args)):
            assert got[0] == want[0]
            for a, b in zip(got[1:], want[1:]):
                assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
        # solve_dispatch's kernel: ok and the times
        assert score_times_reference(*args)[0] == want[0]
        assert np.array_equal(score_times_reference(*args)[1], want[4], equal_nan=True)
        for ok_k, times_k in (score_times_kernel(*args), score_times_kernel.py_func(*args)):
            assert ok_k == want[0] and np.array_equal(times_k, want[4], equal_nan=True)
        if L == 1:  # one layer, as solve_dispatch passes it: (E, g) shares and mask, (E,) counts
            one = (x[0], p.replicas[0], p.counts[0], c, 1e-9)
            for ok_k, times_k in (score_times_kernel(*one), score_times_reference(*one)):
                assert ok_k == want[0] and np.array_equal(times_k, want[4], equal_nan=True)
        try:
            check_shares(p, x)
            ok = True
        except InfeasibleSharesError:
            ok = False
        assert ok == want[0]
        seen[ok] += 1
        if ok:
            ev = evaluate_arrays(p, cost, x)
            assert np.array_equal(ev.G, want[1]) and np.array_equal(ev.N, want[2])
            assert np.array_equal(ev.T, want[3]) and np.array_equal(ev.times, want[4])
    assert min(seen.values()) > 50  # both answers exercised


def test_atomic_writes_get_the_permissions_open_gives(tmp_path):
    """A file written through ``atomic_open`` ends as ``open(path, "w")`` leaves it: a new
    file ``0o666`` less the umask (readable by an engine running as another user, not
    ``mkstemp``'s ``0o600``), an existing file with its own mode; a write that raises
    leaves the destination as it was and nothing beside it."""
    import os
    import stat

    from straggler.formulations._io import atomic_open

    old = os.umask(0o022)
    try:
        new = tmp_path / "table.json"
        with atomic_open(new) as f:
            f.write("{}")
        assert stat.S_IMODE(new.stat().st_mode) == 0o644
        kept = tmp_path / "kept.json"
        kept.write_text("old")
        kept.chmod(0o640)
        with atomic_open(kept) as f:
            f.write("new")
        assert kept.read_text() == "new" and stat.S_IMODE(kept.stat().st_mode) == 0o640
        with pytest.raises(RuntimeError), atomic_open(kept) as f:
            f.write("half")
            raise RuntimeError("the writer failed")
        assert kept.read_text() == "new"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "table.json"]
    finally:
        os.umask(old)
