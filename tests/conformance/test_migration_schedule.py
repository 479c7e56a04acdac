"""Our port of vLLM's migration schedule beside vLLM 0.32's own.

``vllm.distributed.eplb.migration_scheduler.schedule_migration_batches`` (who sends each copy,
and the rounds of PR #52641) and
:func:`straggler.solvers.placement.rebalance.transfer.migration_batches` on the same random
slot maps (duplicates, every rank sending and receiving): equal flows, in the same rounds and
order. Skipped where vLLM is not installed.
"""

import numpy as np
import pytest

scheduler = pytest.importorskip("vllm.distributed.eplb.migration_scheduler")

from straggler.solvers.placement.rebalance.transfer import migration_batches  # noqa: E402


@pytest.mark.parametrize("seed", range(300))
def test_migration_batches_equal_vllms(seed):
    rng = np.random.default_rng(seed)
    G, per = int(rng.integers(1, 9)), int(rng.integers(1, 5))
    E = int(rng.integers(1, G * per + 1))

    def placement():
        return rng.permutation(np.concatenate([np.arange(E), rng.integers(0, E, G * per - E)]))

    old, new = placement(), placement()
    theirs = scheduler.schedule_migration_batches(per, old, new)
    ours = migration_batches(old, new, G)
    assert [[(f.src_rank, f.dst_rank, tuple(f.expert_ids)) for f in r] for r in theirs] == [
        [tuple(f) for f in r] for r in ours
    ]
