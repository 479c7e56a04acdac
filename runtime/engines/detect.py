"""Which engine wrote a path, and one reader for all of them.

:func:`read_engine_log` takes a file, a directory or (SGLang's ``--init-expert-location``
form) inline JSON, works out what it is (:func:`detect_format`) unless told, and returns
the :class:`~straggler.runtime.engines.EngineLog` of the matching reader.

Detection, first match wins:

* inline JSON (text starting with ``{``): SGLang ``--init-expert-location``;
* a directory with ``meta_info.json``: TensorRT-LLM statistics; with
  ``expert_distribution_recorder_*.pt``: SGLang recorder dumps; with ``*rank<r>.pt``,
  ``.safetensors`` or ``.json`` holding ``EplbState`` fields: vLLM; with one
  ``moe_load_balancer*.yaml``: TensorRT-LLM's plan;
* a file: ``.yaml``/``.yml``: TensorRT-LLM's plan; ``meta_info.json`` or
  ``rank<r>.safetensors`` with ``"{iter}_{layer}"`` keys: TensorRT-LLM statistics (their
  directory); otherwise its content: ``records`` or a stat dump's ``rank`` and
  ``logical_count``: SGLang recorder; ``phy2log``: EPLB maps; ``EplbState`` fields: vLLM;
  ``physical_to_logical_map`` alone or ``logical_count``: SGLang ``--init-expert-location``.
"""

from __future__ import annotations

import os
import re

from ...formulations.errors import InvalidInputError, InvalidOptionError
from ...formulations.validation import check_int
from ._common import EngineLog, check_path, load_by_extension
from .eplb import is_eplb_maps, parse_eplb_maps, read_eplb_maps
from .sglang import (
    RECORDER_PREFIX,
    parse_sglang_dump,
    parse_sglang_init_location,
    read_sglang_init_location,
    read_sglang_recorder,
)
from .trtllm import read_moe_load_balancer, read_trtllm_statistics
from .vllm import is_vllm_state, parse_vllm_states, read_vllm_state

__all__ = ["ENGINES", "detect_format", "read_engine_log"]

#: The engines (``--format`` values) this package reads and writes.
ENGINES = ("sglang", "vllm", "trtllm", "eplb")
_STAT_KEY = re.compile(r"^[0-9]+_[0-9]+$", re.ASCII)


def _load_any(path: str):
    return load_by_extension(
        path,
        f"Cannot tell which engine wrote {path}: expected a directory, .pt, .json, .safetensors, "
        ".yaml or inline JSON.",
    )


def _classify_obj(obj, source: str = "this file") -> tuple[str, str]:
    if isinstance(obj, dict):
        if "records" in obj or ("logical_count" in obj and "rank" in obj):
            return "sglang", "recorder"
        if is_eplb_maps(obj):
            return "eplb", "maps"
        if is_vllm_state(obj):
            return "vllm", "state"
        if "physical_to_logical_map" in obj or "logical_count" in obj:
            return "sglang", "init"
        if obj and all(isinstance(k, str) and _STAT_KEY.match(k) for k in obj):
            return "trtllm", "statistics"
    raise InvalidInputError(
        f"Cannot tell which engine wrote {source}: it holds "
        + (f"keys {sorted(map(str, obj))[:12]}" if isinstance(obj, dict) else type(obj).__name__)
        + " (expected an SGLang dump or --init-expert-location, vLLM EplbState fields, "
        "TensorRT-LLM statistics or EPLB maps)."
    )


def _is_lb_yaml(name: str) -> bool:
    return name.startswith("moe_load_balancer") and name.endswith((".yaml", ".yml"))


def _listdir(p: str) -> list[str]:
    try:
        return os.listdir(p)
    except OSError as exc:
        raise InvalidInputError(f"Cannot list the directory {p}: {exc.strerror}.") from None


def _check_exists(p: str) -> None:
    if not os.path.exists(p):
        if os.path.islink(p):
            raise InvalidInputError(f"{p} is a broken symbolic link or a symbolic-link loop.")
        raise InvalidInputError(f"No such file or directory: {p}.")


def _read_as(engine: str, path, physical_to_logical, n_experts) -> EngineLog:
    """Read ``path`` with ``engine``'s readers, without asking which engine wrote it (a
    stray file of another engine beside the logs is then ignored)."""
    if isinstance(path, str) and path.lstrip().startswith("{"):
        if engine != "sglang":
            raise InvalidInputError(
                f"Inline JSON is SGLang's --init-expert-location form, not a {engine} file."
            )
        return read_sglang_init_location(path)
    p = check_path(path, "path", "read_engine_log")
    _check_exists(p)
    is_dir = os.path.isdir(p)
    if engine == "vllm":
        return read_vllm_state(p, physical_to_logical=physical_to_logical)
    if engine == "eplb":
        if is_dir:
            raise InvalidInputError(f"{p} is a directory; EPLB maps are one .json or .pt file.")
        return read_eplb_maps(p)
    if engine == "trtllm":
        if p.endswith((".yaml", ".yml")) and not is_dir:
            return read_moe_load_balancer(p, n_experts=n_experts)
        d = p if is_dir else os.path.dirname(p) or "."
        if os.path.isfile(os.path.join(d, "meta_info.json")) or not is_dir:
            return read_trtllm_statistics(d)
        yamls = [n for n in _listdir(d) if _is_lb_yaml(n)]
        if len(yamls) != 1:
            raise InvalidInputError(
                f"{d} holds neither meta_info.json (TensorRT-LLM statistics) nor one "
                f"moe_load_balancer.yaml (found {sorted(yamls)[:4]})."
            )
        return read_moe_load_balancer(os.path.join(d, yamls[0]), n_experts=n_experts)
    # sglang
    if is_dir:
        return read_sglang_recorder(p, physical_to_logical=physical_to_logical, n_experts=n_experts)
    if p.endswith(".json"):
        return read_sglang_init_location(p)
    obj = _load_any(p)
    if isinstance(obj, dict) and ("records" in obj or "rank" in obj):
        return parse_sglang_dump(
            [obj], [p], physical_to_logical=physical_to_logical, n_experts=n_experts
        )
    return parse_sglang_init_location(obj, p)


def _check_options(engine, kind, path, physical_to_logical, n_experts) -> None:
    """Refuse an option the reader of ``engine`` (and ``kind``, when known) would ignore."""
    where = path[:60] if isinstance(path, str) else os.fspath(path)
    p2l_ok = engine == "vllm" or (engine == "sglang" and kind in (None, "recorder", "recorder_dir"))
    e_ok = (engine == "sglang" and kind in (None, "recorder", "recorder_dir")) or (
        engine == "trtllm" and kind in (None, "config")
    )
    for name, given, ok in (
        ("physical_to_logical", physical_to_logical is not None, p2l_ok),
        ("n_experts", n_experts is not None, e_ok),
    ):
        if given and not ok:
            raise InvalidInputError(
                f"The '{name}' parameter of read_engine_log does not apply to {where} "
                f"({engine}{'' if kind is None else ' ' + kind}): the file says it."
            )


def _classify(path) -> tuple[str, str, object]:
    """(engine, kind, loaded object or None) of ``path``."""
    if isinstance(path, str) and path.lstrip().startswith("{"):
        return "sglang", "init_inline", None
    p = check_path(path, "path", "read_engine_log")
    if os.path.isdir(p):
        names = _listdir(p)
        if "meta_info.json" in names:
            return "trtllm", "statistics_dir", None
        if any(n.startswith(RECORDER_PREFIX) and n.endswith(".pt") for n in names):
            return "sglang", "recorder_dir", None
        ranked = [n for n in names if "rank" in n and n.endswith((".pt", ".safetensors", ".json"))]
        if ranked:
            return "vllm", "state_dir", None
        yamls = [
            n for n in names if n.startswith("moe_load_balancer") and n.endswith((".yaml", ".yml"))
        ]
        if len(yamls) == 1:
            return "trtllm", "config", os.path.join(p, yamls[0])
        raise InvalidInputError(
            f"Cannot tell which engine wrote the directory {p}: no meta_info.json (TensorRT-LLM), "
            f"{RECORDER_PREFIX}*.pt (SGLang), *rank<r>.pt/.safetensors/.json (vLLM) or "
            f"moe_load_balancer.yaml in {sorted(names)[:10]}."
        )
    _check_exists(p)
    base = os.path.basename(p)
    if p.endswith((".yaml", ".yml")):
        return "trtllm", "config", p
    if base == "meta_info.json" or re.match(r"^rank\d+\.safetensors$", base):
        return "trtllm", "statistics_dir", None
    obj = _load_any(p)
    engine, kind = _classify_obj(obj, p)
    return engine, kind, obj


def detect_format(path) -> str:
    """The engine that wrote ``path``: one of :data:`ENGINES` (see the module docstring).

    Raises
    ------
    InvalidInputError
        Nothing recognisable (the message lists what was found), or an unreadable file.
    """
    return _classify(path)[0]


def read_engine_log(
    path, *, format: str | None = None, physical_to_logical=None, n_experts=None
) -> EngineLog:
    """Read whatever an engine recorded at ``path`` (detected unless ``format`` is given).

    Parameters
    ----------
    path : path or str
        A file, a directory, or inline JSON (SGLang ``--init-expert-location``).
    format : {"sglang", "vllm", "trtllm", "eplb"}, optional
        Read with that engine's readers and skip detection (a stray file of another
        engine beside the logs is then ignored; a file that is not that engine's is an
        error from its reader).
    physical_to_logical : optional
        The map(s) in force while recording, for formats that record physical-slot counts
        (SGLang per-pass/per-token: one map or ``{first_forward_pass_id: map}``; vLLM: one
        map). Default: the map saved with the counts.
    n_experts : int, optional
        Logical experts, where the files do not say (SGLang per-pass/per-token).

    Returns
    -------
    EngineLog
    """
    func = "read_engine_log"
    if format is not None and (not isinstance(format, str) or format not in ENGINES):
        raise InvalidOptionError(
            f"The 'format' parameter of {func} must be one of {list(ENGINES)}. Got "
            f"{format!r} instead."
        )
    if n_experts is not None:
        n_experts = check_int(n_experts, "n_experts", func, lo=1)
    if format is not None:
        _check_options(format, None, path, physical_to_logical, n_experts)
        return _read_as(format, path, physical_to_logical, n_experts)
    engine, kind, obj = _classify(path)
    _check_options(engine, kind, path, physical_to_logical, n_experts)
    p = path if isinstance(path, str) else os.fspath(path)
    if engine == "sglang":
        if kind == "init_inline":
            return read_sglang_init_location(p)
        if kind == "init":
            return parse_sglang_init_location(obj, p)
        if kind == "recorder":
            return parse_sglang_dump(
                [obj], [p], physical_to_logical=physical_to_logical, n_experts=n_experts
            )
        return read_sglang_recorder(p, physical_to_logical=physical_to_logical, n_experts=n_experts)
    if engine == "vllm":
        if kind == "state":
            return parse_vllm_states([obj], [p], physical_to_logical=physical_to_logical)
        return read_vllm_state(p, physical_to_logical=physical_to_logical)
    if engine == "trtllm":
        if kind == "config":
            return read_moe_load_balancer(obj if isinstance(obj, str) else p, n_experts=n_experts)
        d = p if os.path.isdir(p) else os.path.dirname(p) or "."
        return read_trtllm_statistics(d)
    return parse_eplb_maps(obj, p)
