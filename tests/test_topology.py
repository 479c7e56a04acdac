"""solvers.topology: same-node-first is the minimum cross-node traffic (checked by an LP)."""

import numpy as np
import pytest
from scipy.optimize import linprog
from straggler.formulations.errors import InvalidInputError
from straggler.solvers.dispatch.topology import (
    flat_cross_node,
    node_uniform_sources,
    topology_split,
)


def _lp_min_cross(x, node, s):
    """The transportation LP per expert, solved by HiGHS (scipy's linprog)."""
    E, g = x.shape
    n_nodes = s.shape[1]
    total = 0.0
    for e in range(E):
        # variables f[n, j] for n in nodes, j in GPUs
        c = np.array([float(node[j] != n) for n in range(n_nodes) for j in range(g)])
        A, b = [], []
        for n in range(n_nodes):
            row = np.zeros(n_nodes * g)
            row[n * g : (n + 1) * g] = 1
            A.append(row)
            b.append(s[e, n])
        for j in range(g):
            row = np.zeros(n_nodes * g)
            row[j::g] = 1
            A.append(row)
            b.append(x[e, j])
        res = linprog(c, A_eq=np.array(A), b_eq=np.array(b), bounds=(0, None), method="highs")
        assert res.status == 0
        total += res.fun
    return total


def _instance(rng, integer):
    E = int(rng.integers(1, 12))
    n_nodes = int(rng.integers(1, 4))
    per = int(rng.integers(1, 4))
    g = n_nodes * per
    node = np.repeat(np.arange(n_nodes), per)
    if rng.random() < 0.5:
        node = rng.permutation(node)  # nodes need not be contiguous
    mask = rng.random((E, g)) < 0.5
    mask[np.arange(E), rng.integers(0, g, E)] = True
    x = rng.integers(0, 50, (E, g)) * mask
    if not integer:
        x = x * rng.random((E, g))
    x[rng.random(E) < 0.15] = 0  # some experts without tokens
    n = x.sum(axis=1)
    w = rng.dirichlet(np.ones(n_nodes), E)
    if integer:
        s = np.floor(w * n[:, None])
        s[:, 0] += n - s.sum(axis=1)
    else:
        s = w * n[:, None]
    return x.astype(float), node, s


@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("seed", range(25))
def test_minimum_equals_lp(seed, integer):
    rng = np.random.default_rng(seed)
    x, node, s = _instance(rng, integer)
    sp = topology_split(x, node, s)
    f = sp.flows
    np.testing.assert_allclose(f.sum(axis=1), x, atol=1e-9)  # per-GPU shares unchanged
    np.testing.assert_allclose(f.sum(axis=2), s, atol=1e-9)  # every source routed
    assert (f >= 0).all()
    assert sp.cross_node == pytest.approx(_lp_min_cross(x, node, s), abs=1e-7)
    assert sp.cross_node <= sp.cross_node_flat + 1e-9
    # the closed form of the module's claim
    X = np.stack([x[:, node == m].sum(axis=1) for m in range(s.shape[1])], axis=1)
    assert sp.cross_node == pytest.approx(float((x.sum(1) - np.minimum(s, X).sum(1)).sum()))
    if integer:
        assert np.array_equal(f, np.round(f))
    # tables: rows are distributions (or zero for experts without tokens)
    rows = sp.tables.sum(axis=-1)
    live = x.sum(axis=1) > 0
    np.testing.assert_allclose(rows[:, live], 1.0)
    np.testing.assert_allclose(rows[:, ~live], 0.0)


def test_flat_baseline_formula():
    x = np.array([[6.0, 2.0, 0.0, 0.0], [0.0, 0.0, 3.0, 1.0]])
    node = [0, 0, 1, 1]
    s = node_uniform_sources(x.sum(axis=1), node)
    # flat: node 1 sends all of its half of expert 0 away, node 0 all of its half of expert 1
    assert flat_cross_node(x, node, s) == 4.0 + 2.0
    sp = topology_split(x, node)
    assert sp.cross_node == 6.0  # nothing can stay local here: each expert lives on one node
    assert sp.saved == 0.0


def test_stack_and_single_node():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 9, (3, 5, 4)).astype(float)
    sp = topology_split(x, [0, 0, 1, 1])
    assert sp.flows.shape == (3, 5, 2, 4) and sp.tables.shape == (3, 2, 5, 4)
    per = [topology_split(x[l], [0, 0, 1, 1]) for l in range(3)]
    assert sp.cross_node == pytest.approx(sum(p.cross_node for p in per))
    np.testing.assert_array_equal(sp.flows[1], per[1].flows)
    one = topology_split(x[0], [7, 7, 7, 7])
    assert one.cross_node == 0.0 and one.cross_node_flat == 0.0


def test_bad_input():
    with pytest.raises(InvalidInputError, match="'sources'"):
        topology_split([[4.0, 4.0]], [0, 1], [[1.0, 1.0]])
    with pytest.raises(InvalidInputError, match="'sources'"):
        topology_split([[4.0, 4.0]], [0, 1], [[4.0, 4.0, 0.0]])
    with pytest.raises(InvalidInputError, match="'gpu_node'"):
        topology_split([[4.0, 4.0]], [0])
    with pytest.raises(InvalidInputError, match="'shares'"):
        topology_split([[-1.0, 4.0]], [0, 1])


def test_compare_reports_traffic_on_two_nodes():
    from straggler.formulations import CostModel
    from straggler.sim.experiments.compare import compare, format_table
    from straggler.sim.workloads.batches import make_decode_problem

    p = make_decode_problem("qwen3_30b", n_gpus=4, tokens_per_gpu=64, num_nodes=2, n_layers=1)
    rows = compare(p, CostModel.preset("qwen3_30b_a_offline"), methods=["uniform", "tempo"])
    for r in rows:
        assert 0 <= r["cross_node"] <= r["cross_node_flat"]
    assert "xnode_tok flat->split" in format_table(rows)
    one = make_decode_problem("qwen3_30b", n_gpus=4, tokens_per_gpu=64, n_layers=1)
    rows = compare(one, CostModel.preset("qwen3_30b_a_offline"), methods=["uniform"])
    assert "cross_node" not in rows[0] and "xnode" not in format_table(rows)
