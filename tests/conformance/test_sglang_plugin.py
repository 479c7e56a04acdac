"""The SGLang plug-in, loaded by SGLang 0.5.23's own plug-in loader, in fresh processes.

Each case runs a new interpreter (``load_plugins`` runs once per process and the plug-in
patches SGLang's module functions through its ``HookRegistry``): the entry point is found
among the installed package's ``sglang.srt.plugins``; with
``STRAGGLER_EPLB_POLICY=place_experts``, SGLang's own ``ExpertLocationMetadata.init_by_eplb``
(the call its EPLB manager makes at each rebalance), configured ``--enable-eplb
--eplb-algorithm straggler``, resolves the name through ``compute_algorithm`` and builds its
metadata from our maps, equal to :func:`~straggler.solvers.place_experts` on the same
window under SGLang's ``--ep-dispatch-algorithm`` (``dispatch=``), and identical in two
processes (every rank runs the algorithm on its own copy); SGLang's own algorithms are
unchanged beside it; with the variable unset nothing is patched; a bad value stops the
process at plug-in load with one line and exit status 2.
"""

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import numpy as np
import pytest

pytest.importorskip("sglang.srt.plugins")
torch = pytest.importorskip("torch")

from straggler.formulations.dispatch import logical_to_physical  # noqa: E402
from straggler.runtime.engines import PLUGIN_POLICY_ENV  # noqa: E402
from straggler.solvers import place_experts  # noqa: E402

from .test_sglang import CONFIG, EP, N_EXPERTS, N_LAYERS, N_REDUNDANT  # noqa: E402

ENTRY = "straggler.runtime.engines.sglang_plugin:register_sglang_plugin"
P = N_EXPERTS + N_REDUNDANT


def _run(code, policy, *args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != PLUGIN_POLICY_ENV}
    if policy is not None:
        env[PLUGIN_POLICY_ENV] = policy
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def _json(out):
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_entry_point_is_installed():
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("straggler") == ENTRY


INIT_BY_EPLB = """
import json, sys
import torch
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt import runtime_context as rc
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.eplb import eplb_algorithms as ea
from sglang.srt.eplb import expert_location as el
from sglang.srt.server_args import ServerArgs

model_dir, algorithm, dispatch = sys.argv[1:4]
if dispatch == "static":  # SGLang's static table reads the rank from torch.distributed
    import socket, torch.distributed as dist
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
sa = ServerArgs(model_path=model_dir, device="cpu", tp_size=%(EP)d, ep_size=%(EP)d,
                ep_num_redundant_experts=%(R)d, moe_a2a_backend="deepep",
                skip_tokenizer_init=True, enable_eplb=True, eplb_algorithm=algorithm,
                ep_dispatch_algorithm=dispatch)
rc.publish(sa, role="scheduler")
mc = ModelConfig.from_server_args(sa)
g = torch.Generator().manual_seed(0)
counts = torch.randint(0, 100, (6, %(L)d, %(E)d), generator=g, dtype=torch.int32)
md = el.ExpertLocationMetadata.init_by_eplb(mc, logical_count=counts)
own = ea.deepseek.rebalance_experts(counts.sum(0), %(P)d, 4, 1, %(EP)d, True)[0]
print(json.dumps(dict(
    counts=counts.tolist(), p2l=md.physical_to_logical_map.tolist(),
    l2p=md.logical_to_all_physical_map.tolist(),
    num_valid=md.logical_to_all_physical_map_num_valid.tolist(),
    deepseek=own.tolist(), algorithm=str(ea.compute_algorithm(algorithm, 4, 1)))))
rc.reset_context()
""" % dict(EP=EP, R=N_REDUNDANT, L=N_LAYERS, E=N_EXPERTS, P=P)  # noqa: UP031


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("dsv3_shape_plugin")
    (d / "config.json").write_text(json.dumps(CONFIG))
    return str(d)


def test_init_by_eplb_runs_our_algorithm(model_dir):
    r = _json(_run(INIT_BY_EPLB, "place_experts", model_dir, "straggler", "dynamic"))
    assert r["algorithm"] == "straggler"
    counts = np.array(r["counts"])
    # DeepSeek-V3's n_group=4 on one node: the hierarchical layout
    want = place_experts(counts, P, 4, 1, EP, dispatch="dynamic")[0]
    np.testing.assert_array_equal(r["p2l"], want)
    l2p, cnt = logical_to_physical(want, N_EXPERTS)
    got_l2p = np.array(r["l2p"])  # SGLang pads it to P columns
    assert got_l2p.shape == (N_LAYERS, N_EXPERTS, P)
    np.testing.assert_array_equal(got_l2p[..., : l2p.shape[2]], l2p)
    assert (got_l2p[..., l2p.shape[2] :] == -1).all()
    np.testing.assert_array_equal(r["num_valid"], cnt)


def test_every_rank_gets_the_same_maps(model_dir):
    """Two processes (two ranks' schedulers) on the same window agree exactly."""
    a, b = (
        _json(_run(INIT_BY_EPLB, "place_experts", model_dir, "straggler", "static"))
        for _ in range(2)
    )
    assert a["p2l"] == b["p2l"] and a["l2p"] == b["l2p"]


def test_sglangs_own_algorithms_unchanged_beside_ours(model_dir):
    r = _json(_run(INIT_BY_EPLB, "place_experts", model_dir, "deepseek_hierarchical", "dynamic"))
    assert r["algorithm"] == "EplbAlgorithm.deepseek_hierarchical"
    np.testing.assert_array_equal(r["p2l"], r["deepseek"])


UNSET = """
import json
from sglang.srt.eplb import eplb_algorithms as ea
from sglang.srt.plugins.hook_registry import HookRegistry
before = (ea.compute_algorithm, ea.rebalance_experts)
from sglang.srt.plugins import load_plugins
load_plugins()
ours = [t for t, hooks in HookRegistry._hooks.items()
        if any("straggler" in getattr(h, "__module__", "") for _, h, _ in hooks)]
print(json.dumps(dict(same=before == (ea.compute_algorithm, ea.rebalance_experts), ours=ours)))
"""


@pytest.mark.parametrize("value", [None, ""])
def test_unset_changes_nothing(value):
    r = _json(_run(UNSET, value))
    assert r["same"] and r["ours"] == []


BAD = """
from sglang.srt.plugins import load_plugins
load_plugins()
print("still running")
"""


def test_bad_value_is_refused_at_plugin_load():
    out = _run(BAD, "place-experts")
    assert out.returncode == 2 and "still running" not in out.stdout
    ours = [line for line in out.stderr.splitlines() if PLUGIN_POLICY_ENV in line]
    assert ours == [
        "error: STRAGGLER_EPLB_POLICY='place-experts' names no straggler placement policy; "
        "expected one of 'place_experts', or unset for the engine's own."
    ]
