"""Our port of SGLang's ``elasticity_aware`` EPLB beside SGLang 0.5.23's own, decision for
decision.

``sglang.srt.eplb.eplb_algorithms.elasticity_aware.rebalance_experts`` and
:func:`straggler.baselines.placement.elasticity_aware.elasticity_aware_rebalance` on the same
random instances (loads with many ties and without, rows of more than 16 replicas where
torch's sort is not stable, every rank active, one or several lost, hierarchical or not):
``physical_to_logical``, ``logical_to_physical`` (replica-rank order, the lost ranks' shift)
and the counts must be equal. The policy built on it
(:class:`~straggler.baselines.placement.sglang_clock.SGLangClock`) asks the same function.
Skipped where SGLang is not installed.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
elasticity_aware = pytest.importorskip("sglang.srt.eplb.eplb_algorithms.elasticity_aware")

from straggler.baselines.placement.elasticity_aware import elasticity_aware_rebalance  # noqa: E402

N_CASES = 300


def _instance(seed):
    rng = np.random.default_rng(seed)
    nodes = int(rng.choice([1, 2]))
    gpus = nodes * int(rng.choice([2, 3, 4]))
    groups = nodes * int(rng.choice([1, 2]))
    E = groups * int(rng.integers(2, 9))
    per_gpu = -(-E // gpus) + int(rng.integers(1, 4))
    P = gpus * per_gpu
    L = int(rng.integers(1, 4))
    kind = seed % 3
    if kind == 0:
        w = rng.integers(0, 4, size=(L, E))  # ties everywhere
    elif kind == 1:
        w = rng.integers(0, 100_000, size=(L, E))
    else:
        w = (1000 * rng.pareto(1.2, size=(L, E))).astype(np.int64)
    active = np.ones(gpus, dtype=np.int64)
    if seed % 4:  # a lost rank or two, as long as the experts fit on the rest
        for r in rng.permutation(gpus)[: int(rng.integers(1, 3))]:
            active[r] = 0
            if per_gpu * int(active.sum()) < E:
                active[r] = 1
    hier = bool(seed % 2)
    return w, P, groups, nodes, gpus, hier, active


@pytest.mark.parametrize("seed", range(N_CASES))
def test_elasticity_aware_equals_sglangs(seed):
    w, P, groups, nodes, gpus, hier, active = _instance(seed)
    theirs = elasticity_aware.rebalance_experts(
        torch.tensor(w), P, groups, nodes, gpus, hier, torch.tensor(active, dtype=torch.int32)
    )
    ours = elasticity_aware_rebalance(w, P, groups, nodes, gpus, hier, active)
    for a, b in zip(ours, theirs):
        assert np.array_equal(a, b.numpy()), (seed, a, b)


def test_a_large_row_of_ties_with_a_lost_rank():
    # 64 experts of equal load on 7 of 8 ranks: 72 replicas in one row, torch's introsort order
    w = np.ones((2, 64), dtype=np.int64)
    active = np.array([1, 1, 1, 0, 1, 1, 1, 1])
    theirs = elasticity_aware.rebalance_experts(
        torch.tensor(w), 96, 1, 1, 8, False, torch.tensor(active, dtype=torch.int32)
    )
    ours = elasticity_aware_rebalance(w, 96, 1, 1, 8, False, active)
    for a, b in zip(ours, theirs):
        assert np.array_equal(a, b.numpy())
