"""The engine plug-ins' own logic, without the engines: the variable naming the policy, the
vLLM policy's argument contract, and the entry points declared for the engines' loaders.
The engines' loaders and state objects run them in tests/conformance/."""

import importlib
import pathlib
import tomllib

import numpy as np
import pytest
from straggler.formulations import InvalidInputError
from straggler.runtime.engines import (
    PLUGIN_POLICIES,
    PLUGIN_POLICY_ENV,
    plugin_policy,
    register_vllm_plugin,
    vllm_rebalance,
)
from straggler.solvers import place_experts
from straggler.solvers.placement.eplb import preserve_intragpu_slots

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENTRY_POINTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]


def test_policy_variable():
    assert plugin_policy({}) is None
    assert plugin_policy({PLUGIN_POLICY_ENV: ""}) is None
    assert plugin_policy({PLUGIN_POLICY_ENV: " place_experts "}) == "place_experts"
    assert set(PLUGIN_POLICIES) == {"place_experts"}


def test_bad_policy_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        plugin_policy({PLUGIN_POLICY_ENV: "eplb"})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: STRAGGLER_EPLB_POLICY='eplb' names")


def test_unset_registers_nothing(run_python):
    """Unset, the entry point returns before importing the engine (vLLM is not needed)."""
    out = run_python(
        "import sys\n"
        "from straggler.runtime.engines.vllm_plugin import register_vllm_plugin\n"
        "print(register_vllm_plugin(), 'vllm' in sys.modules)",
        env={PLUGIN_POLICY_ENV: ""},
    )
    assert out.split() == ["None", "False"]
    assert register_vllm_plugin({}) is None


def test_entry_points_declared():
    for group, name in [("vllm.general_plugins", "straggler")]:
        module, func = ENTRY_POINTS[group][name].split(":")
        assert callable(getattr(importlib.import_module(module), func))


def _weight(seed, L=3, E=16):
    return np.random.default_rng(seed).integers(0, 1000, size=(L, E))


def test_vllm_rebalance_is_place_experts_with_vllms_slot_rule():
    w = _weight(0)
    want = place_experts(w[None], 24, 4, 2, 4)[0]
    got = vllm_rebalance(w, 24, 4, 2, 4)
    assert got.dtype == np.int64 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    rng = np.random.default_rng(1)
    old = np.stack([rng.permutation(24) % 16 for _ in range(3)])
    kept = vllm_rebalance(w, 24, 4, 2, 4, old)
    np.testing.assert_array_equal(kept, preserve_intragpu_slots(want, 4, old))
    for h in range(4):  # the same experts on every GPU, only their slots differ
        sl = slice(6 * h, 6 * h + 6)
        assert (np.sort(kept[:, sl]) == np.sort(want[:, sl])).all()
    # an old map with empty slots (-1, elastic scale-up) is honoured; another width
    # (elastic scale-down) preserves nothing
    old[:, 5] = -1
    np.testing.assert_array_equal(
        vllm_rebalance(w, 24, 4, 2, 4, old), preserve_intragpu_slots(want, 4, old)
    )
    np.testing.assert_array_equal(vllm_rebalance(w, 24, 4, 2, 4, old[:, :20]), want)


def test_vllm_rebalance_global_policy_when_groups_do_not_split_over_nodes():
    w = _weight(2, E=12)
    np.testing.assert_array_equal(
        vllm_rebalance(w, 16, 3, 2, 4), place_experts(w[None], 16, 1, 1, 4)[0]
    )


@pytest.mark.parametrize(
    "args, name",
    [
        ((_weight(0), 25, 4, 2, 4), "num_replicas"),  # not a multiple of the ranks
        ((_weight(0, E=15), 24, 4, 2, 4), "num_groups"),  # groups must divide experts
        ((_weight(0), 24, 4, 2, 5), "num_replicas"),
        ((_weight(0), 24, 4, 4, 6), "num_ranks"),  # hierarchical: ranks % nodes
        ((_weight(0)[0], 24, 4, 2, 4), "weight"),
        ((-_weight(0), 24, 4, 2, 4), "weight"),
        ((_weight(0), 24, 4, 2, 4, np.zeros((2, 24), int)), "old_global_expert_indices"),
        ((_weight(0), 24, 4, 2, 4, np.full((3, 24), 16)), "old_global_expert_indices"),
    ],
)
def test_vllm_rebalance_refuses_what_vllm_asserts(args, name):
    with pytest.raises(InvalidInputError, match=f"'{name}' parameter of vllm_rebalance"):
        vllm_rebalance(*args)
