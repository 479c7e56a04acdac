"""Cell functions for tests/test_sweep.py: importable by name in worker processes (the tests
put this folder on sys.path and PYTHONPATH), as a sweep's func must be."""

import numpy as np
from straggler.formulations import CostModel
from straggler.sim.workloads.batches import make_decode_problem
from straggler.solvers import solve_dispatch


def decode_cell(tokens_per_gpu, skew, seed, method):
    """Makespan of one small generated decode layer under one method."""
    p = make_decode_problem(
        "qwen3_30b", n_gpus=4, tokens_per_gpu=tokens_per_gpu, skew=skew, n_layers=1, seed=seed
    )
    r = solve_dispatch(p, CostModel.preset("qwen3_30b_a_offline"), method=method)
    return {"makespan": float(np.sum(r.makespan)), "tokens": int(p.counts.sum())}


def failing_cell(x):
    if x == 2:
        raise RuntimeError("cell two fails")
    return {"y": x * 10}


def bad_result_cell(x):
    return {"y": np.zeros(3)}


def square_cell(x):
    return {"y": x * x}
