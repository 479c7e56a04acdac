"""The engine plug-ins' own logic, without the engines: the variable naming the policy, the
vLLM policy's argument contract, and the entry points declared for the engines' loaders.
The engines' loaders and state objects run them in tests/conformance/."""

import importlib
import pathlib
import tomllib

import numpy as np
import pytest
from straggler.formulations import InvalidInputError
from straggler.formulations.dispatch import logical_to_physical
from straggler.runtime.engines import (
    PLUGIN_POLICIES,
    PLUGIN_POLICY_ENV,
    plugin_policy,
    register_sglang_plugin,
    register_vllm_plugin,
    sglang_dispatch_rule,
    sglang_rebalance,
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


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_unset_registers_nothing(run_python, engine):
    """Unset, the entry point returns before importing the engine (not needed here)."""
    out = run_python(
        "import sys\n"
        f"from straggler.runtime.engines.{engine}_plugin import register_{engine}_plugin\n"
        f"print(register_{engine}_plugin(), '{engine}' in sys.modules)",
        env={PLUGIN_POLICY_ENV: ""},
    )
    assert out.split() == ["None", "False"]
    assert register_vllm_plugin({}) is None and register_sglang_plugin({}) is None


def test_entry_points_declared():
    for group, name in [("vllm.general_plugins", "straggler"), ("sglang.srt.plugins", "straggler")]:
        module, func = ENTRY_POINTS[group][name].split(":")
        assert callable(getattr(importlib.import_module(module), func))


def _weight(seed, L=3, E=16):
    return np.random.default_rng(seed).integers(0, 1000, size=(L, E))


def test_vllm_rebalance_is_place_experts_with_vllms_slot_rule():
    w = _weight(0)
    want = place_experts(w[None], 24, 4, 2, 4, dispatch="vllm")[0]
    got = vllm_rebalance(w, 24, 4, 2, 4)
    assert got.dtype == np.int64 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    rng = np.random.default_rng(1)
    old = np.stack([rng.permutation(24) % 16 for _ in range(3)])
    kept = vllm_rebalance(w, 24, 4, 2, 4, old)
    np.testing.assert_array_equal(kept, preserve_intragpu_slots(want, 4, old))
    np.testing.assert_array_equal(
        kept, place_experts(w[None], 24, 4, 2, 4, dispatch="vllm", previous=old)[0]
    )
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
        vllm_rebalance(w, 16, 3, 2, 4), place_experts(w[None], 16, 1, 1, 4, dispatch="vllm")[0]
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


def test_sglang_rebalance_is_place_experts_on_the_window():
    window = np.random.default_rng(3).integers(0, 100, size=(5, 2, 16))
    p2l, l2p, cnt = sglang_rebalance(window, 24, 6, 4, 1)  # static dispatch by default
    want = place_experts(window, 24, 4, 1, 4, dispatch="static")[0]
    np.testing.assert_array_equal(p2l, want)
    for got, ref in zip((l2p, cnt), logical_to_physical(want, 16)):
        np.testing.assert_array_equal(got, ref)
    # one step given 2-D, as init_by_eplb accepts; no groups (None) is one group
    np.testing.assert_array_equal(
        sglang_rebalance(window[0], 24, 6, None, 1, dispatch="lp")[0],
        place_experts(window[:1], 24, 1, 1, 4, dispatch="lp")[0],
    )
    assert sglang_dispatch_rule("fake") == "dynamic" and sglang_dispatch_rule(None) == "static"
    # the unwritten (all-zero) rows of SGLang's circular buffer are left out
    padded = np.concatenate([np.zeros((3, 2, 16), int), window, np.zeros((2, 2, 16), int)])
    np.testing.assert_array_equal(sglang_rebalance(padded, 24, 6, 4, 1)[0], want)


@pytest.mark.parametrize(
    "args, name",
    [
        ((np.ones((2, 16)), 24, 5, 4, 1), "num_physical_experts"),
        ((np.ones((2, 16)), 24, 0, 4, 1), "num_local_physical_experts"),
        ((np.ones(16), 24, 6, 4, 1), "tokens_per_expert"),
        ((-np.ones((2, 16)), 24, 6, 4, 1), "tokens_per_expert"),
        ((np.ones((2, 16)), 24, 6, 0, 1), "num_groups"),
    ],
)
def test_sglang_rebalance_refuses_bad_input(args, name):
    with pytest.raises(InvalidInputError, match=f"'{name}' parameter of sglang_rebalance"):
        sglang_rebalance(*args)
    with pytest.raises(InvalidInputError, match="'dispatch' parameter of sglang_rebalance"):
        sglang_rebalance(np.ones((2, 16)), 24, 6, 4, 1, dispatch="tempo")
    with pytest.raises(InvalidInputError, match="'ep_dispatch_algorithm' parameter"):
        sglang_dispatch_rule("random")


def test_vllm_logical_maps_from_any_slot_map():
    from straggler.runtime.engines import vllm_logical_maps

    p2l = np.array([[2, -1, 0, 2], [1, 1, -1, -1]], dtype=np.int32)
    l2p, cnt = vllm_logical_maps(p2l, 3)
    assert l2p.dtype == cnt.dtype == np.int32
    assert l2p.tolist() == [[[2, -1], [-1, -1], [0, 3]], [[-1, -1], [0, 1], [-1, -1]]]
    assert cnt.tolist() == [[1, 0, 2], [0, 2, 0]]  # an expert without a slot: count 0
    l2p1, cnt1 = vllm_logical_maps(p2l[0].tolist(), 3)  # one layer, 1-D, int64
    assert l2p1.tolist() == l2p[0].tolist() and cnt1.dtype == np.int64
    for bad, name in (
        ([[0, 3]], "physical_to_logical_map"),
        ([[0, -2]], "physical_to_logical_map"),
    ):
        with pytest.raises(InvalidInputError, match=f"'{name}' parameter of vllm_logical_maps"):
            vllm_logical_maps(bad, 3)
    with pytest.raises(InvalidInputError, match="'num_logical_experts' parameter"):
        vllm_logical_maps([[0]], 0)
