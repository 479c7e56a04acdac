"""The vLLM plug-in, loaded by vLLM CPU 0.32.0's own plug-in loader, in fresh processes.

Each case runs a new interpreter (``load_general_plugins`` runs once per process and the
plug-in changes vLLM's module state): the entry point is found among the installed
package's ``vllm.general_plugins``; with ``STRAGGLER_EPLB_POLICY=place_experts`` the policy
vLLM's config resolves (``EPLB_POLICIES[EPLBConfig().policy]``) is ours and returns the map
of :func:`~straggler.solvers.place_experts` on the same input (``dispatch="vllm"``); two
real ``EplbState`` ranks (``add_model`` then ``rearrange``, the synchronous path, two
processes on a gloo group, only the weight transfer and communicator faked) resolve and call
it and commit the same map; with the variable unset nothing in vLLM's policy table changes;
a bad value stops the process at plug-in load with one line and exit status 2.
"""

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import numpy as np
import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from straggler.runtime.engines import PLUGIN_POLICY_ENV, vllm_rebalance  # noqa: E402
from straggler.solvers import place_experts  # noqa: E402
from straggler.solvers.placement.eplb import preserve_intragpu_slots  # noqa: E402

ENTRY = "straggler.runtime.engines.vllm_plugin:register_vllm_plugin"


def _run(code, policy, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != PLUGIN_POLICY_ENV}
    if policy is not None:
        env[PLUGIN_POLICY_ENV] = policy
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout
    )


def _json(out):
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_entry_point_is_installed():
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("straggler") == ENTRY


RESOLVE = """
import json, torch
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.config.parallel import EPLBConfig
from vllm.distributed.eplb.policy import EPLB_POLICIES, AbstractEplbPolicy, DefaultEplbPolicy
cfg = EPLBConfig()
cls = EPLB_POLICIES[cfg.policy]
g = torch.Generator().manual_seed(0)
w = torch.randint(0, 1000, (3, 16), generator=g)
old = torch.stack([torch.randperm(24, generator=g) % 16 for _ in range(3)])
new = cls.rebalance_experts(w, 24, 4, 2, 4)
kept = cls.rebalance_experts(w, 24, 4, 2, 4, old)
print(json.dumps(dict(
    name=cls.__name__, ours=issubclass(cls, AbstractEplbPolicy) and cls is not DefaultEplbPolicy,
    policy=cfg.policy, use_async=cfg.use_async, keys=sorted(EPLB_POLICIES),
    dtype=str(new.dtype), device=str(new.device), shape=list(new.shape),
    w=w.tolist(), old=old.tolist(), new=new.tolist(), kept=kept.tolist(),
    moved=cls.moved_replicas.tolist())))
"""


def test_vllm_resolves_our_policy_and_it_returns_place_experts():
    r = _json(_run(RESOLVE, "place_experts"))
    assert r["ours"] and r["name"] == "StragglerEplbPolicy"
    # vLLM's config unchanged: the "default" name, the asynchronous rebalance kept
    assert r["policy"] == "default" and r["use_async"] is True and r["keys"] == ["default"]
    assert (r["dtype"], r["device"], r["shape"]) == ("torch.int64", "cpu", [3, 24])
    w, old = np.array(r["w"]), np.array(r["old"])
    want = place_experts(w[None], 24, 4, 2, 4, dispatch="vllm")[0]
    np.testing.assert_array_equal(r["new"], want)
    np.testing.assert_array_equal(r["kept"], preserve_intragpu_slots(want, 4, old))
    np.testing.assert_array_equal(r["kept"], vllm_rebalance(w, 24, 4, 2, 4, old))
    np.testing.assert_array_equal(
        r["kept"], place_experts(w[None], 24, 4, 2, 4, dispatch="vllm", previous=old)[0]
    )
    assert r["moved"] == (np.array(r["kept"]) != old).sum(axis=1).tolist()


UNSET = """
import json, sys
import vllm.distributed.eplb.policy as pol
before = dict(pol.EPLB_POLICIES)
from vllm.plugins import load_general_plugins
load_general_plugins()
print(json.dumps(dict(
    same=before == pol.EPLB_POLICIES, default=pol.EPLB_POLICIES["default"] is pol.DefaultEplbPolicy,
    solvers="straggler.solvers.placement.place" in sys.modules)))
"""


@pytest.mark.parametrize("value", [None, ""])
def test_unset_changes_nothing(value):
    r = _json(_run(UNSET, value))
    assert r["same"] and r["default"]


BAD = """
from vllm.plugins import load_general_plugins
load_general_plugins()
print("still running")
"""


def test_bad_value_is_refused_at_plugin_load():
    out = _run(BAD, "place_expert")
    assert out.returncode == 2 and "still running" not in out.stdout
    ours = [line for line in out.stderr.splitlines() if PLUGIN_POLICY_ENV in line]
    assert ours == [
        "error: STRAGGLER_EPLB_POLICY='place_expert' names no straggler placement policy; "
        "expected one of 'place_experts', or unset for the engine's own."
    ]


ENGINE_ARGS = """
from vllm.engine.arg_utils import EngineArgs
EngineArgs(model="facebook/opt-125m")
print("still running")
"""


def test_bad_value_stops_engine_args_at_start_up():
    """vLLM loads its general plug-ins in ``EngineArgs.__post_init__``: a bad value stops
    the front end there, before any config is built."""
    out = _run(ENGINE_ARGS, "nonsense")
    assert out.returncode == 2 and "still running" not in out.stdout
    assert out.stderr.strip().splitlines()[-1].startswith("error: STRAGGLER_EPLB_POLICY=")


EPLB_STATE = """
import json, sys
from types import SimpleNamespace
import torch, torch.distributed as dist
from vllm.plugins import load_general_plugins
load_general_plugins()
import straggler.runtime.engines.vllm_plugin as plugin
from vllm.config.parallel import EPLBConfig, ParallelConfig
import vllm.distributed.eplb.eplb_state as es

rank, port = int(sys.argv[1]), sys.argv[2]
seen = []
original = plugin.vllm_rebalance
def spy(*args, **kw):
    seen.append([a.tolist() if hasattr(a, "tolist") else a for a in args])
    return original(*args, **kw)
plugin.vllm_rebalance = spy

# use_async=False: the synchronous rearrange calls the policy in this thread (the default
# asynchronous worker calls the same class, vllm/distributed/eplb/async_worker.py)
pc = ParallelConfig(eplb_config=EPLBConfig(use_async=False))
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
group = SimpleNamespace(device_group=dist.group.WORLD, rank_in_group=rank, world_size=2)
es.get_ep_group = lambda: group
es.get_eplb_group = lambda: group
es.get_node_count = lambda: 1
es.create_eplb_communicator = lambda **kw: None
es.rearrange_expert_weights_inplace = lambda *a, **k: None  # no weights to move here
pc.eplb_config.communicator = "torch_gloo"

class _Event:  # rearrange times itself with torch.Event, which the CPU build lacks
    def __init__(self, *a, **k): pass
    def record(self, *a): pass
    def synchronize(self): pass
    def elapsed_time(self, other): return 0.0
torch.Event = _Event

L, E, R = 2, 8, 4
class FakeMoE:
    num_moe_layers, num_logical_experts, num_routed_experts = L, E, E
    num_redundant_experts, num_physical_experts = R, E + R
    num_local_physical_experts, num_expert_groups = (E + R) // 2, 1
    moe_layers = []
    expert_weights = [[torch.zeros((E + R) // 2, 2)] for _ in range(L)]
    def set_eplb_state(self, *a): pass

st = es.EplbState(pc, torch.device("cpu"))
st.add_model(FakeMoE(), SimpleNamespace(model="fake", compute_hash=lambda: "h0"))
ms = st.model_states["h0"]
g = torch.Generator().manual_seed(rank)  # each rank's own tokens; vLLM all-reduces them
ms.expert_load_window[0] = torch.randint(0, 500, (L, E + R), generator=g, dtype=torch.int32)
window = ms.expert_load_window[0].tolist()
before = ms.physical_to_logical_map.clone()
st.rearrange()
print(json.dumps(dict(policy=st.policy.__name__, seen=seen, before=before.tolist(),
                      window=window, after=ms.physical_to_logical_map.tolist(),
                      count=ms.logical_replica_count.tolist())))
dist.destroy_process_group()
"""


def test_eplb_state_resolves_calls_and_commits_our_policy():
    """Two EP ranks (two processes, gloo): each resolves our policy by its config, calls it
    on the all-reduced window and commits the same map, place_experts' with vLLM's slot
    rule."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = str(s.getsockname()[1])
    s.close()
    env = {k: v for k, v in os.environ.items() if k != PLUGIN_POLICY_ENV}
    env[PLUGIN_POLICY_ENV] = "place_experts"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", EPLB_STATE, str(rank), port],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    r0, r1 = (json.loads(out.strip().splitlines()[-1]) for out, _ in outs)
    assert r0["policy"] == r1["policy"] == "StragglerEplbPolicy"
    assert len(r0["seen"]) == len(r1["seen"]) == 1 and r0["seen"] == r1["seen"]
    weight, P, G, N, R, old = r0["seen"][0]
    assert (P, G, N, R) == (12, 1, 1, 2) and old == r0["before"]
    # the window folded to logical experts through the map in force, summed over ranks
    phys = np.array(r0["window"]) + np.array(r1["window"])
    fold = np.zeros((2, 8), np.int64)
    for layer in range(2):
        np.add.at(fold[layer], np.array(old)[layer], phys[layer])
    np.testing.assert_array_equal(weight, fold)
    want = place_experts(fold[None], P, G, N, R, dispatch="vllm", previous=np.array(old))[0]
    np.testing.assert_array_equal(r0["after"], want)
    np.testing.assert_array_equal(r1["after"], want)
    np.testing.assert_array_equal(r0["count"], [np.bincount(row, minlength=8) for row in want])
