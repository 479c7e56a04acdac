"""The engine quickstarts (``docs/guides/engines/{sglang,vllm}.md``) against the pinned
engines: every server command the pages show parses with the engine's own argument parser to
the settings the page describes (the plug-in's command with the policy name the plug-in
accepts), and the vLLM worker extension the page gives runs with vLLM's names and writes
dumps ``straggler-plan`` reads."""

import argparse
import pathlib
import re
import sys
import types

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
import doc_commands  # noqa: E402
from straggler.runtime.engines import PLUGIN_POLICY_ENV  # noqa: E402
from straggler.runtime.engines._policies import plugin_policy  # noqa: E402

PAGES = HERE.parents[1] / "docs" / "guides" / "engines"


def _page(name):
    return (PAGES / f"{name}.md").read_text()


def test_the_pages_show_the_commands():
    assert len(doc_commands.commands(_page("sglang"), "python -m sglang.launch_server")) == 3
    assert len(doc_commands.commands(_page("vllm"), "vllm serve")) == 2


@pytest.mark.parametrize("name", ["sglang", "vllm"])
def test_the_plugin_variable_names_a_policy(name):
    """The one line each page gives sets the variable to a value the plug-in accepts."""
    (value,) = set(re.findall(rf"^{PLUGIN_POLICY_ENV}=(\S+) ", _page(name), re.M))
    assert plugin_policy({PLUGIN_POLICY_ENV: value}) == value


def test_sglang_commands_parse_with_sglangs_parser():
    pytest.importorskip("sglang")
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    plugin, record, load = doc_commands.commands(_page("sglang"), "python -m sglang.launch_server")
    ns = parser.parse_args(plugin[3:])
    assert ns.enable_eplb and ns.eplb_algorithm == "straggler"
    assert ns.ep_num_redundant_experts == 16 and ns.moe_a2a_backend == "deepep"
    ns = parser.parse_args(record[3:])
    assert ns.expert_distribution_recorder_mode == "stat"
    assert ns.expert_distribution_recorder_buffer_size == -1
    ns = parser.parse_args(load[3:])
    assert ns.init_expert_location == "plan/init_expert_location.json"
    assert ns.ep_num_redundant_experts == 16 and ns.ep_dispatch_algorithm == "static"
    assert not ns.enable_eplb


def test_vllm_command_parses_with_vllms_parser():
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    plugin, serve = doc_commands.commands(_page("vllm"), "vllm serve")
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", *plugin[2:]])
    assert ns.enable_eplb and ns.enable_expert_parallel and ns.data_parallel_size == 8
    args = EngineArgs.from_cli_args(ns)
    assert args.eplb_config.policy == "default"  # the entry the plug-in rebinds
    assert args.eplb_config.num_redundant_experts == 16
    model, rest = serve[2], serve[3:]
    ns = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", model, *rest])
    assert ns.enable_eplb and ns.enable_expert_parallel and ns.data_parallel_size == 8
    assert ns.worker_extension_cls == "straggler_vllm_ext.EplbDump"
    args = EngineArgs.from_cli_args(ns)  # the EPLBConfig validated as vLLM does
    assert args.eplb_config.num_redundant_experts == 16
    assert args.eplb_config.window_size == 1000


def test_vllm_worker_extension_writes_what_plan_reads(tmp_path, monkeypatch):
    pytest.importorskip("vllm")
    torch = pytest.importorskip("torch")
    from straggler.runtime.engines import VLLM_FIELDS, read_engine_log, vllm_maps
    from vllm.config import ParallelConfig
    from vllm.distributed.eplb import eplb_state as es

    (code,) = doc_commands.blocks(_page("vllm"), "python")
    ns = {}
    exec(compile(code, "vllm.md", "exec"), ns)
    ns["get_ep_group"] = lambda: types.SimpleNamespace(rank_in_group=0)  # no process group
    L, E = 3, 8
    rng = np.random.default_rng(0)
    window = rng.integers(0, 50, (4, L, E))
    maps = vllm_maps(np.tile(np.arange(E), (L, 1)), E)
    fields = {k: torch.tensor(np.asarray(maps[k])) for k in maps}
    fields["expert_load_window"] = torch.tensor(window, dtype=torch.int32)
    fields["expert_load_pass"] = torch.zeros((L, E), dtype=torch.int32)
    assert set(fields) == set(VLLM_FIELDS)
    state = es.EplbState(ParallelConfig(), torch.device("cpu"))
    state.model_states = {"main": types.SimpleNamespace(**fields, model_name="main")}
    state.expert_load_window_step = 0
    v1 = types.SimpleNamespace(model_runner=types.SimpleNamespace(eplb_state=state))
    v2 = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(eplb=types.SimpleNamespace(state=state))
    )
    for k, worker in enumerate((v1, v2)):
        out = tmp_path / str(k)
        files = ns["EplbDump"].straggler_dump_eplb(worker, str(out))
        assert [pathlib.Path(f).name for f in files] == ["eplb_m0_rank0.json"]
        np.testing.assert_array_equal(read_engine_log(out).counts, window)
