"""Readers and writers of the files SGLang, vLLM, TensorRT-LLM and DeepSeek EPLB use.

``read_engine_log(path)`` detects the format and returns an :class:`EngineLog` (logical
expert loads per recorded batch and the placement in force); the writers produce the files
each engine loads. torch (``.pt``) and safetensors are imported only when such a file is
read or written (the ``runtime`` extra); JSON and YAML need nothing.

Each is read and written (round-tripped by the tests through files written as the engine
writes them):

* SGLang: recorder dumps (stat, per-pass, per-token) and ``--init-expert-location``
  (``.pt``, ``.json``, inline JSON);
* vLLM: ``EplbState`` maps and load windows, one file per rank;
* TensorRT-LLM: ``meta_info.json`` + ``rank*.safetensors`` statistics, and
  ``moe_load_balancer.yaml``;
* DeepSeek EPLB: ``phy2log``, ``log2phy``, ``logcnt`` (and the ``weight`` placed).

Every writer runs its reader's own checks on what it is about to write (through
``_common.Writing``, which words their errors as the writer's parameter errors), so a writer
refuses exactly what its reader would refuse, before any file is touched. A placement must
give every expert a slot in every layer, as every engine's routing requires
(``_common.check_every_expert_placed``).

The engine plug-ins serve straggler's placement through the engines' own extension points,
named by one environment variable (:data:`PLUGIN_POLICY_ENV`): :func:`register_vllm_plugin`
(vLLM's ``vllm.general_plugins`` entry point; ``runtime/engines/vllm_plugin.py``) and
:func:`register_sglang_plugin` (SGLang's ``sglang.srt.plugins`` entry point, the EPLB
algorithm ``--eplb-algorithm straggler``; ``runtime/engines/sglang_plugin.py``).

:func:`sample_recording` gives the folder of a real recording shipped in each engine's format.
"""

from ._common import EngineLog, fold_physical_counts
from ._policies import PLUGIN_POLICIES, PLUGIN_POLICY_ENV, plugin_policy
from .detect import ENGINES, detect_format, read_engine_log
from .eplb import read_eplb_maps, write_eplb_maps
from .samples import SAMPLES, sample_recording
from .sglang import (
    read_sglang_init_location,
    read_sglang_recorder,
    sglang_per_token_record,
    write_sglang_detail_dump,
    write_sglang_init_location,
    write_sglang_stat_dump,
)
from .sglang_plugin import (
    SGLANG_ALGORITHM,
    SGLANG_DISPATCH_RULES,
    register_sglang_plugin,
    sglang_dispatch_rule,
    sglang_rebalance,
)
from .trtllm import (
    read_moe_load_balancer,
    read_trtllm_statistics,
    write_moe_load_balancer,
    write_trtllm_statistics,
)
from .vllm import (
    VLLM_DUMP_FORMAT,
    VLLM_FIELDS,
    VLLM_MAP_WIDTH,
    dump_vllm_eplb_state,
    read_vllm_state,
    vllm_logical_maps,
    vllm_maps,
    write_vllm_state,
)
from .vllm_plugin import VLLM_DISPATCH, register_vllm_plugin, vllm_policy_class, vllm_rebalance

__all__ = [
    "EngineLog",
    "fold_physical_counts",
    "ENGINES",
    "detect_format",
    "read_engine_log",
    "read_eplb_maps",
    "SAMPLES",
    "sample_recording",
    "write_eplb_maps",
    "read_sglang_init_location",
    "read_sglang_recorder",
    "sglang_per_token_record",
    "write_sglang_detail_dump",
    "write_sglang_init_location",
    "write_sglang_stat_dump",
    "read_moe_load_balancer",
    "read_trtllm_statistics",
    "write_moe_load_balancer",
    "write_trtllm_statistics",
    "VLLM_FIELDS",
    "read_vllm_state",
    "vllm_maps",
    "vllm_logical_maps",
    "VLLM_DUMP_FORMAT",
    "VLLM_MAP_WIDTH",
    "dump_vllm_eplb_state",
    "write_vllm_state",
    "PLUGIN_POLICIES",
    "PLUGIN_POLICY_ENV",
    "plugin_policy",
    "VLLM_DISPATCH",
    "register_vllm_plugin",
    "vllm_policy_class",
    "vllm_rebalance",
    "SGLANG_ALGORITHM",
    "SGLANG_DISPATCH_RULES",
    "register_sglang_plugin",
    "sglang_dispatch_rule",
    "sglang_rebalance",
]
