"""straggler.sim.experiments.phase_diagram: the grid, the winners, tempo's gain, the analytic B*."""

import math

import numpy as np
import pytest
from straggler.formulations import CostModel
from straggler.formulations.errors import InvalidInputError
from straggler.sim.experiments.phase_diagram import (
    b_star,
    comm_aware,
    effective_activations,
    flip_band,
    phase_cell,
    phase_diagram,
)


@pytest.fixture(scope="module")
def small():
    return phase_diagram(
        "qwen3_30b",
        4,
        batch_sizes=[16, 256, 2048],
        skews=[0.0, 1.2],
        replications=[1.25, 1.5],
        n_batches=1,
        n_layers=1,
        n_history=2,
        backend="serial",
        progress=False,
    )


def test_arrays_indexed_batch_skew_replication(small):
    pd = small
    assert pd.winner.shape == pd.gain.shape == (3, 2, 2)
    assert pd.b_star.shape == (2, 2) and pd.band.shape == (2, 2, 2)
    assert set(pd.makespan) == {*pd.policies, "tempo"}
    best = np.min([pd.makespan[m] for m in pd.policies], axis=0)
    np.testing.assert_allclose(pd.gain, 1 - pd.makespan["tempo"] / best)
    for i, j, k in np.ndindex(pd.winner.shape):
        assert pd.makespan[pd.winner[i, j, k]][i, j, k] == best[i, j, k]
    # rows of the table follow the grid, last setting fastest
    t = pd.table
    assert [r["tokens_per_gpu"] for r in t.rows[:4]] == [16] * 4
    assert [r["replication"] for r in t.rows[:2]] == [1.25, 1.5]
    assert all(r["shape"] == "qwen3_30b" and r["cost_b"] == 1.74 for r in t.rows)


def test_cells_are_what_phase_cell_measures(small):
    row = small.table.rows[5]
    settings = {k: row[k] for k in small.table.settings}
    again = phase_cell(**settings)
    assert again == {k: row[k] for k in small.table.results}


def test_regimes_and_tempo_tracks_best(small):
    pd = small
    # memory-bound: activation balancing wins; compute-bound: token LP
    assert (pd.winner[0] == pd.policies[0]).all()
    assert (pd.winner[-1] == "token_lp").all()
    assert pd.gain.min() >= -0.003
    assert (pd.worst_ratio <= 1 / (1 - 0.01) + 1e-9).all()  # within the ensemble's tau
    assert pd.b_star_inside.all()


def test_plot(small):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    fig = small.plot()
    assert len(fig.axes) == 3  # two panels and the colour bar
    assert "M\n" in "".join(t.get_text() for t in fig.axes[0].texts)


def test_effective_activations_formula():
    p = np.array([0.7, 0.2, 0.1])
    r = np.array([3, 1, 2])
    T = 5
    want = sum((1 - (1 - p[e]) ** T) * r[e] for e in range(3))
    assert effective_activations(p, r, T)[0] == pytest.approx(want)
    assert effective_activations(p, r, 1e9)[0] == pytest.approx(r.sum())


def _fixed_point_by_scan(p, r, K, g, cost):
    """The largest B with F(B) >= B, F = min(B_avg, B_hot), on a fine grid then bisection."""

    def F(B):
        e = effective_activations(p, r, B * K * g)[0]
        fl = cost.a - cost.c + cost.b * e / g
        return min(fl / (cost.beta * K), fl / (cost.beta * K * g * p.max()))

    hi = F(1e12)
    lo = 1e-9
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if F(mid) >= mid:
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize("s, g", [(0.0, 8), (0.9, 8), (1.5, 8), (1.2, 32)])
def test_b_star_is_the_fixed_point(s, g):
    E, K = 256, 8
    p = np.arange(1, E + 1, dtype=float) ** -s
    p /= p.sum()
    r = np.ones(E)
    r[:64] = 2
    cost = CostModel.preset("dsv3_a_offline")
    B, b_avg, b_hot = b_star(p, r, top_k=K, n_gpus=g, cost=cost)
    assert B == pytest.approx(min(b_avg, b_hot), rel=1e-9)
    assert B == pytest.approx(_fixed_point_by_scan(p, r, K, g, cost), rel=1e-6)
    n_star = cost.n_star
    e_eff = effective_activations(p, r, B * K * g)[0]
    assert b_avg == pytest.approx(n_star * e_eff / (K * g))
    assert b_hot == pytest.approx(n_star * e_eff / (p.max() * K * g * g))
    # the hot-expert mechanism takes over exactly when p_1 * g > 1
    assert (b_hot < b_avg) == (p.max() * g > 1)
    # the loaded variant counts the hot GPU's share of the other experts too
    B2, _, hot2 = b_star(p, r, top_k=K, n_gpus=g, cost=cost, hot="loaded")
    e2 = effective_activations(p, r, B2 * K * g)[0]
    p1 = p.max()
    assert hot2 == pytest.approx(n_star * e2 / (K * g * (p1 * g + 1 - p1)))
    assert B2 <= B * (1 + 1e-9)


def test_b_star_intercepts_and_no_compute():
    p = np.full(8, 1 / 8)
    m = CostModel(a=40, b=10, c=20, beta=0.1)
    B, _, _ = b_star(p, np.ones(8), top_k=1, n_gpus=2, cost=m)
    # c + beta * B * K = a + b * E_eff / g with every expert live
    assert 20 + 0.1 * B == pytest.approx(40 + 10 * 8 / 2)
    assert b_star(p, np.ones(8), top_k=1, n_gpus=2, cost=CostModel(a=0, b=1, c=0, beta=0))[0] == (
        math.inf
    )


def test_flip_band():
    assert flip_band([16, 32, 64], ["m", "token_lp", "uniform"], "m") == (16.0, 32.0)
    assert flip_band([16, 32], ["m", "m"], "m") == (32.0, math.inf)
    assert flip_band([16, 32, 64, 128], ["m", "uniform", "m", "token_lp"], "m") == (32.0, 64.0)


def test_comm_aware():
    base = CostModel(a=1, b=2, c=3, beta=0.1)
    m = comm_aware(base, 0.01)
    assert (m.c2, m.gamma) == (3, pytest.approx(0.11))
    N = np.array([0.0, 10.0, 1000.0])
    np.testing.assert_allclose(m.time(G=np.ones(3), N=N), np.maximum(3, 3 + 0.11 * N))
    with pytest.raises(InvalidInputError):
        comm_aware(base, -1)


@pytest.mark.parametrize(
    "kw",
    [
        {"shape": "nope"},
        {"batch_sizes": [64, 16]},
        {"skews": [-1.0]},
        {"replications": [0.5]},
        {"n_batches": 0},
        {"activation": "tempo"},
        {"cost": 3},
        {"backend": "mpi"},
    ],
)
def test_bad_input(kw):
    with pytest.raises(InvalidInputError):
        phase_diagram(**{"backend": "serial", **kw}, progress=False)
