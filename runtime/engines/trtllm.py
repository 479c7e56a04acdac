"""TensorRT-LLM's offline EP load balancer: expert statistics in, ``moe_load_balancer.yaml`` out.

Statistics (``tensorrt_llm/tools/.../expert_statistic.py``, enabled by
``EXPERT_STATISTIC_ITER_RANGE=start-stop``, written to ``EXPERT_STATISTIC_PATH`` when the
iteration reaches ``stop``): rank 0 writes ``meta_info.json`` = ``{"num_experts": E,
"num_experts_per_token": k}``; every rank writes ``rank{r}.safetensors`` whose tensor
``"{iter}_{layer}"`` is the int32 ``[E]`` bincount of the rank's ``token_selected_experts``
(logical expert ids) in that iteration and MoE layer (DeepSeek's MoE layers are 3..60).
Other files beside them (``cooccurrence_rank*``, ``token_selected_experts_rank*``,
``*_raw.safetensors``) are not statistics. The example scripts
(``examples/wide_ep/ep_load_balancer/utils.py``) sum the ranks key by key.

The plan (``generate_eplb_config.py``; read by ``MoeLoadBalancerConfig``, a strict
pydantic model with exactly these fields): ``num_slots``, ``initial_global_assignments``
(``{layer: [expert of slot 0, ..., expert of slot num_slots - 1]}``, every successive
``num_slots / ep_size`` slots on one rank) and ``layer_updates_per_iter`` (0: static
placement), dumped by PyYAML with sorted keys and one-line lists; no YAML library is
needed here (:mod:`straggler.runtime.engines._yaml`).
"""

from __future__ import annotations

import glob
import os
import re

import numpy as np

from ...formulations._io import atomic_open
from ...formulations.errors import InvalidInputError
from ...formulations.validation import check_int
from ._common import (
    EngineLog,
    check_count_total,
    check_path,
    check_physical_to_logical,
    checked_sum,
    exact_ints,
    field_array,
    field_error,
    field_int,
    load_json,
    load_safetensors,
    read_error,
    require_file,
    save_json,
    save_safetensors,
)
from ._yaml import dump_yaml, parse_yaml

__all__ = [
    "write_trtllm_statistics",
    "read_trtllm_statistics",
    "write_moe_load_balancer",
    "read_moe_load_balancer",
    "parse_moe_load_balancer",
    "TRTLLM_CONFIG_FIELDS",
]

# ASCII digits, no leading zeros: one (iteration, layer) has one key ("01_3" and "1_3" would
# be two tensors summed into one cell).
_KEY_RE = re.compile(r"^(0|[1-9][0-9]*)_(0|[1-9][0-9]*)$", re.ASCII)
#: Largest MoE layer index read or written (DeepSeek's are 3..60): a bound checked before
#: anything is allocated per layer index.
MAX_LAYER_ID = 65535
_RANK_FILE_RE = re.compile(r"^rank(0|[1-9][0-9]*)\.safetensors$", re.ASCII)
#: The fields ``MoeLoadBalancerConfig`` accepts (it forbids others).
TRTLLM_CONFIG_FIELDS = ("initial_global_assignments", "layer_updates_per_iter", "num_slots")


def _distinct_ids(ids, n: int, name: str, func: str, hi=None) -> list:
    """``n`` distinct integer ids >= 0 (a short or repeated list would drop data)."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
        raise InvalidInputError(
            f"The '{name}' parameter of {func} must be a sequence of {n} distinct integers. "
            f"Got {type(ids).__name__} instead."
        )
    out = [check_int(i, name, func, lo=0, hi=hi) for i in ids]
    if len(out) != n or len(set(out)) != n:
        raise InvalidInputError(
            f"The '{name}' parameter of {func} must be {n} distinct integers (one per row of "
            f"counts). Got {out[:8]}{' ...' if len(out) > 8 else ''} ({len(out)}) instead."
        )
    return out


def write_trtllm_statistics(directory, counts, *, layer_ids, iter_ids=None, top_k: int) -> list:
    """Write statistics as TensorRT-LLM's ``ExpertStatistic`` does (needs safetensors).

    Parameters
    ----------
    directory : path
        ``EXPERT_STATISTIC_PATH`` (created if missing).
    counts : array_like of int, shape (n_ranks, n_iters, n_layers, n_experts)
        Each rank's routed tokens per logical expert.
    layer_ids : sequence of int, length n_layers
        The MoE layer indices (``"{iter}_{layer}"`` keys).
    iter_ids : sequence of int, optional
        Iteration of each batch (default ``0..n_iters-1``).
    top_k : int
        ``num_experts_per_token`` for ``meta_info.json``.

    Returns
    -------
    list of str : the files written.
    """
    func = "write_trtllm_statistics"
    d = check_path(directory, "directory", func)
    c = exact_ints(counts, "counts", func, np.int32, ndim=4)
    R, I, L, E = c.shape
    if min(R, I, L, E) < 1:
        raise InvalidInputError(
            f"The 'counts' parameter of {func} must be a non-empty (n_ranks, n_iters, n_layers, "
            f"n_experts) array. Got shape {c.shape} instead."
        )
    iters = _distinct_ids(range(I) if iter_ids is None else iter_ids, I, "iter_ids", func)
    layers = _distinct_ids(layer_ids, L, "layer_ids", func, hi=MAX_LAYER_ID)
    top_k = check_int(top_k, "top_k", func, lo=1, hi=E)
    meta = os.path.join(d, "meta_info.json")
    save_json({"num_experts": int(E), "num_experts_per_token": top_k}, meta)
    files = [meta]
    for r in range(R):
        path = os.path.join(directory, f"rank{r}.safetensors")
        save_safetensors(
            {
                f"{it}_{layer}": c[r, i, j]
                for i, it in enumerate(iters)
                for j, layer in enumerate(layers)
            },
            path,
        )
        files.append(path)
    return files


def read_trtllm_statistics(directory, *, iter_start=None, iter_stop=None) -> EngineLog:
    """Read ``EXPERT_STATISTIC_PATH``: ``meta_info.json`` and every ``rank<r>.safetensors``.

    Counts are summed over ranks key by key (as TensorRT-LLM's scripts do); iterations in
    ``[iter_start, iter_stop)`` are kept (default: all). Every rank file must hold the same
    keys, every iteration every layer, each tensor ``[num_experts]``.

    Returns
    -------
    EngineLog
        kind ``"trtllm_statistics"``; ``layer_ids`` are TensorRT-LLM's layer indices,
        ``batch_ids`` the iterations, ``n_ranks`` the rank files found.

    Raises
    ------
    InvalidInputError
        A missing or malformed ``meta_info.json``, no rank file, unreadable files, keys
        not ``"{iter}_{layer}"``, wrong shapes, ranks holding different keys, an
        incomplete (iteration x layer) grid.
    BackendUnavailableError
        safetensors is not installed.
    """
    func = "read_trtllm_statistics"
    d = check_path(directory, "directory", func)
    for name, v in (("iter_start", iter_start), ("iter_stop", iter_stop)):
        if v is not None:
            check_int(v, name, func)
    meta_path = os.path.join(d, "meta_info.json")
    if not os.path.isfile(meta_path):
        raise InvalidInputError(f"{d} has no meta_info.json (TensorRT-LLM expert statistics).")
    meta = load_json(meta_path)
    if not isinstance(meta, dict):
        raise InvalidInputError(
            f"{meta_path} must hold a dict with num_experts and num_experts_per_token. Got "
            f"{type(meta).__name__} instead (TensorRT-LLM writes null when nothing was recorded)."
        )
    for key in ("num_experts", "num_experts_per_token"):
        if key not in meta:
            raise field_error(meta_path, key, "present", f"keys {sorted(meta)}")
    E = field_int(meta["num_experts"], meta_path, "num_experts", lo=1)
    k = field_int(meta["num_experts_per_token"], meta_path, "num_experts_per_token", lo=1)
    files = sorted(
        (int(m.group(1)), f)
        for f in glob.glob(os.path.join(glob.escape(d), "rank*.safetensors"))
        if (m := _RANK_FILE_RE.match(os.path.basename(f)))
    )
    if not files:
        raise InvalidInputError(f"{d} has meta_info.json but no rank<r>.safetensors file.")
    ranks = [r for r, _ in files]
    if ranks != list(range(len(ranks))):
        raise InvalidInputError(
            f"The rank files of {d} must be rank0..rank{len(ranks) - 1}. Got ranks {ranks} instead."
        )
    total: dict[tuple[int, int], np.ndarray] = {}
    keys0 = None
    for _rank, path in files:
        data = load_safetensors(path)
        keys = set()
        for key, arr in data.items():
            m = _KEY_RE.match(key)
            if m is None:
                raise InvalidInputError(
                    f"{path} must hold tensors keyed '{{iter}}_{{layer}}' (decimal integers "
                    f"without leading zeros). Got the key {key!r} instead."
                )
            it, layer = int(m.group(1)), int(m.group(2))
            v = field_array(
                arr,
                path,
                key,
                ndim=1,
                lo=0,
                shape=(E,),
                expected=f"a non-negative integer array of shape ({E},) (num_experts)",
            )
            keys.add((it, layer))
            total[(it, layer)] = checked_sum([total.get((it, layer), 0 * v), v], 0, path, key)
        if keys0 is None:
            keys0 = keys
        elif keys != keys0:
            missing = sorted(keys0 - keys)[:3] or sorted(keys - keys0)[:3]
            raise InvalidInputError(
                f"{path} must hold the same '{{iter}}_{{layer}}' keys as {files[0][1]}. They "
                f"differ at {[f'{a}_{b}' for a, b in missing]}."
            )
    if not total:
        raise InvalidInputError(
            f"The rank files of {d} hold no '{{iter}}_{{layer}}' tensor (nothing was recorded)."
        )
    iters = sorted({it for it, _ in total})
    layers = sorted({layer for _, layer in total})
    if len(total) != len(iters) * len(layers):
        gap = next((it, layer) for it in iters for layer in layers if (it, layer) not in total)
        raise InvalidInputError(
            f"The statistics of {d} must cover every layer in every iteration. Got no tensor "
            f"'{gap[0]}_{gap[1]}' instead."
        )
    keep = [
        it
        for it in iters
        if (iter_start is None or it >= iter_start) and (iter_stop is None or it < iter_stop)
    ]
    if not keep:
        raise InvalidInputError(
            f"No iteration of {d} ({iters[0]}..{iters[-1]}) lies in [{iter_start}, {iter_stop})."
        )
    counts = np.stack([np.stack([total[(it, layer)] for layer in layers]) for it in keep])
    check_count_total(counts, d, "statistics")
    return EngineLog(
        engine="trtllm",
        kind="trtllm_statistics",
        sources=[meta_path] + [f for _, f in files],
        n_experts=E,
        counts=counts,
        layer_ids=np.array(layers),
        batch_ids=np.array(keep),
        n_ranks=len(files),
        top_k=k,
    )


def write_moe_load_balancer(
    path, physical_to_logical, *, layer_ids=None, layer_updates_per_iter: int = 0
) -> str:
    """Write ``moe_load_balancer.yaml`` as ``generate_eplb_config.py`` does.

    Parameters
    ----------
    path : path
    physical_to_logical : array_like of int, shape (n_layers, num_slots)
        Expert of each slot (no empty slots: TensorRT-LLM has none).
    layer_ids : sequence of int, optional
        TensorRT-LLM's MoE layer index of each row (default ``0..n_layers-1``).
    layer_updates_per_iter : int, default 0
        0: the static (offline) load balancer.

    Examples
    --------
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "moe_load_balancer.yaml")
    >>> _ = write_moe_load_balancer(p, [[0, 1, 2, 0], [2, 1, 0, 1]], layer_ids=[3, 4])
    >>> print(open(p).read(), end="")
    initial_global_assignments:
      3: [0, 1, 2, 0]
      4: [2, 1, 0, 1]
    layer_updates_per_iter: 0
    num_slots: 4
    """
    func = "write_moe_load_balancer"
    p = check_path(path, "path", func)
    m = check_physical_to_logical(
        exact_ints(physical_to_logical, "physical_to_logical", func, lo=-1),
        func,
        "physical_to_logical",
    )
    if (m < 0).any():
        raise InvalidInputError(
            "TensorRT-LLM has no empty slots: every entry of the "
            "'physical_to_logical' parameter must be an expert id >= 0."
        )
    ids = _distinct_ids(
        range(m.shape[0]) if layer_ids is None else layer_ids,
        m.shape[0],
        "layer_ids",
        func,
        hi=MAX_LAYER_ID,
    )
    cfg = {
        "initial_global_assignments": {i: [int(x) for x in row] for i, row in zip(ids, m)},
        "layer_updates_per_iter": check_int(
            layer_updates_per_iter, "layer_updates_per_iter", func, lo=0
        ),
        "num_slots": int(m.shape[1]),
    }
    with atomic_open(p, "w", encoding="utf-8") as f:
        f.write(dump_yaml(cfg))
    return p


def parse_moe_load_balancer(cfg, source: str, *, n_experts=None) -> EngineLog:
    """Interpret a parsed ``moe_load_balancer.yaml`` (a dict) as ``MoeLoadBalancerConfig``
    reads it; ``ep_size`` (which TensorRT-LLM's report script reads from its projection
    configs) is kept in ``extras``, any other key is refused as the strict model does."""
    if not isinstance(cfg, dict):
        raise InvalidInputError(
            f"{source} must hold a mapping (moe_load_balancer.yaml). Got "
            f"{type(cfg).__name__} instead."
        )
    unknown = sorted(str(k) for k in cfg if k not in TRTLLM_CONFIG_FIELDS + ("ep_size",))
    if unknown:
        raise InvalidInputError(
            f"{source} holds fields {unknown} that TensorRT-LLM's MoeLoadBalancerConfig rejects; "
            f"it accepts {list(TRTLLM_CONFIG_FIELDS)}."
        )
    assign = cfg.get("initial_global_assignments")
    if not isinstance(assign, dict) or not assign:
        raise field_error(
            source,
            "initial_global_assignments",
            "a mapping {layer: [expert of each slot]} (online-mode files without it hold no "
            "placement)",
            repr(assign)[:60],
        )
    layers = []
    for key in assign:
        if isinstance(key, str):  # PyYAML reads '3' as a string; TensorRT-LLM int(...)s keys
            key = int(key) if re.fullmatch(r"0|[1-9][0-9]{0,8}", key, re.ASCII) else key
        v = field_int(key, source, "initial_global_assignments key (layer)", lo=0)
        if v > MAX_LAYER_ID:
            raise field_error(
                source,
                "initial_global_assignments key (layer)",
                f"a layer index at most {MAX_LAYER_ID}",
                str(v),
            )
        layers.append(v)
    if len(set(layers)) != len(layers):
        raise field_error(
            source,
            "initial_global_assignments",
            "one row per layer",
            f"two keys for layer {next(x for x in layers if layers.count(x) > 1)}",
        )
    order = np.argsort(layers, kind="stable")
    layers_sorted = [layers[i] for i in order]
    keys = list(assign)
    slots = cfg.get("num_slots")
    rows = [assign[keys[i]] for i in order]
    n_slots = None if slots is None else field_int(slots, source, "num_slots", lo=1)
    m = field_array(
        rows,
        source,
        "initial_global_assignments",
        ndim=2,
        lo=0,
        shape=(None, n_slots),
        expected=f"one list of {n_slots or 'num_slots'} expert ids >= 0 per layer",
    )
    if m.shape[0] == 0 or m.shape[1] == 0:
        raise field_error(source, "initial_global_assignments", "non-empty rows", "empty ones")
    if m.max() >= m.shape[1]:
        raise field_error(
            source,
            "initial_global_assignments",
            f"expert ids below num_slots={m.shape[1]} (every expert needs a slot)",
            f"id {int(m.max())}",
        )
    E = (
        int(m.max()) + 1
        if n_experts is None
        else check_int(n_experts, "n_experts", "read_moe_load_balancer", lo=1, hi=m.shape[1])
    )
    for i, row in enumerate(m):
        missing = np.setdiff1d(np.arange(E), row)
        if missing.size:
            raise field_error(
                source,
                "initial_global_assignments",
                f"a slot for every expert 0..{E - 1} in each layer",
                f"no slot for expert {int(missing[0])} in layer {layers_sorted[i]}",
            )
        if row.max() >= E:
            raise field_error(
                source, "initial_global_assignments", f"expert ids below {E}", f"{int(row.max())}"
            )
    extras = {
        "layer_updates_per_iter": field_int(
            cfg.get("layer_updates_per_iter", 0), source, "layer_updates_per_iter", lo=0
        )
    }
    if "ep_size" in cfg:
        ep = field_int(cfg["ep_size"], source, "ep_size", lo=1)
        if m.shape[1] % ep:
            raise field_error(source, "ep_size", f"a divisor of num_slots={m.shape[1]}", str(ep))
        extras["ep_size"] = ep
    return EngineLog(
        engine="trtllm",
        kind="trtllm_config",
        sources=[source],
        n_experts=E,
        physical_to_logical=m,
        layer_ids=np.array(layers_sorted),
        n_ranks=extras.get("ep_size"),
        extras=extras,
    )


def read_moe_load_balancer(path, *, n_experts=None) -> EngineLog:
    """Read ``moe_load_balancer.yaml`` (the placement; kind ``"trtllm_config"``).

    Raises
    ------
    InvalidInputError
        Unreadable text, YAML outside the subset TensorRT-LLM writes, fields the strict
        config rejects, rows that are not ``num_slots`` long, an expert without a slot.
    """
    src = require_file(check_path(path, "path", "read_moe_load_balancer"))
    try:
        with open(src, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise read_error(src, exc) from None
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"Cannot read {src} as UTF-8 text: {exc}.") from None
    return parse_moe_load_balancer(parse_yaml(text, src), src, n_experts=n_experts)
