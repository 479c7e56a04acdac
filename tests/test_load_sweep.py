"""The routing load sweep's cell function, on sim.sweep."""

import numpy as np
import pytest
from straggler.formulations import InvalidInputError, InvalidOptionError
from straggler.sim import simulate, sweep
from straggler.sim.experiments.load_sweep import (
    SWEEP_METRICS,
    load_sweep_cell,
    sized_prefill_instances,
    sweep_trace,
)


def test_cell_is_simulate_with_sized_prefill():
    cell = load_sweep_cell("generated", 2, 1.5, "brs", n_requests=200)
    assert set(SWEEP_METRICS) <= set(cell) and cell["offered_load"] == 1.5
    tr = sweep_trace("generated", 200)
    inst = sized_prefill_instances(tr, 2)
    assert cell["prefill_instances"] == inst
    r = simulate(tr, "brs", n_replicas=2, load=1.5, prefill_instances=inst)
    assert cell["mean_imbalance"] == r.mean_imbalance and cell["n_unfinished"] == 0
    default = load_sweep_cell("generated", 2, 1.5, "brs", n_requests=200, prefill="default")
    assert default["prefill_instances"] == 1


def test_cells_through_sim_sweep():
    t = sweep(
        load_sweep_cell,
        {"load": [0.5, 1.5], "policy": ["jsq", "brs"]},
        fixed={"trace": "generated", "n_replicas": 2, "n_requests": 150},
        backend="serial",
        progress=False,
    )
    assert len(t) == 4 and "mean_imbalance" in t.columns
    imb = t.column("mean_imbalance")
    assert np.all(np.isfinite(imb)) and np.all(imb >= 0)


def test_bad_cells():
    with pytest.raises(InvalidOptionError, match="'trace'"):
        load_sweep_cell("nope", 2, 1.0, "jsq")
    with pytest.raises(InvalidInputError, match="'load'"):
        load_sweep_cell("generated", 2, 0.0, "jsq", n_requests=10)
    with pytest.raises(InvalidOptionError, match="'prefill'"):
        load_sweep_cell("generated", 2, 1.0, "jsq", n_requests=10, prefill="huge")
