"""TensorRT-LLM's offline EP load balancer: expert statistics in, ``moe_load_balancer.yaml`` out.

Statistics (``tensorrt_llm/_torch/expert_statistic.py`` at TensorRT-LLM commit
``0fccc5b97dd7b23c438e740b3bf4dcde607266c4``, enabled by
``EXPERT_STATISTIC_ITER_RANGE=start-stop``, written to ``EXPERT_STATISTIC_PATH`` when the
iteration reaches ``stop``): rank 0 writes ``meta_info.json`` = ``{"num_experts": N,
"num_experts_per_token": k}`` (``null`` when nothing was recorded); every rank writes
``rank{r}.safetensors`` whose tensor ``"{iter}_{layer}"`` is the ``torch.bincount`` (int64)
``[N]`` of the ids the rank routed in that iteration and MoE layer (DeepSeek's MoE layers
are 3..60). The MoE modules call ``ExpertStatistic.maybe_add_info(self.num_slots,
token_selected_slots)``: with the MoE load balancer off ``num_slots`` is the number of
experts and the ids are expert ids; with it on, the ids are the **slot ids** chosen by the
balancer's routing, and ``N`` is ``num_slots``. Slot-id statistics are folded back to
logical experts through the placement they were recorded under
(``initial_global_assignments``, slot ``s`` of layer ``l`` holding expert
``assignments[l][s]``): the ``moe_load_balancer.yaml`` in the statistics directory, or the
one passed as ``placement``. Other files beside them (``cooccurrence_rank*``,
``token_selected_experts_rank*``, ``*_raw.safetensors``) are not statistics. The example
scripts (``examples/wide_ep/ep_load_balancer/utils.py``) sum the ranks key by key.

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

from ...formulations._io import atomic_dir, atomic_open
from ...formulations.errors import InvalidInputError
from ...formulations.validation import check_int
from ._common import (
    EngineLog,
    Writing,
    check_count_total,
    check_path,
    check_physical_to_logical,
    checked_sum,
    exact_ints,
    field_array,
    field_error,
    field_int,
    fold_physical_counts,
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
#: The field of ``meta_info.json`` in which :func:`write_trtllm_statistics` lists the rank
#: files of its set (``["rank0.safetensors", ...]``), written with the set in one step;
#: TensorRT-LLM neither writes nor reads it (its scripts read the two fields they know).
MANIFEST_FIELD = "straggler_rank_files"
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
    counts : array_like of int, shape (n_ranks, n_iters, n_layers, n_ids)
        Each rank's routed tokens per id: per expert (load balancer off) or per slot (on;
        ``n_ids`` is then ``num_slots``). Written as int64, as ``torch.bincount`` returns.
    layer_ids : sequence of int, length n_layers
        The MoE layer indices (``"{iter}_{layer}"`` keys).
    iter_ids : sequence of int, optional
        Iteration of each batch (default ``0..n_iters-1``).
    top_k : int
        ``num_experts_per_token`` for ``meta_info.json``.

    Returns
    -------
    list of str : the files written.

    Notes
    -----
    The files are written as a set: into a staging folder that then replaces the
    directory's ``meta_info.json`` and ``rank*.safetensors`` whole
    (``formulations._io.atomic_dir``; other files in the directory are
    kept). Rank files of an earlier write with more ranks do not survive, and a failure
    part way leaves the earlier set as it was.

    ``meta_info.json`` also carries the set's manifest: its field ``straggler_rank_files``
    (``trtllm.MANIFEST_FIELD``) lists the rank files written, and
    :func:`read_trtllm_statistics` refuses a rank file it does not list (one copied in or
    written later) instead of summing it. TensorRT-LLM ignores the field; a
    ``meta_info.json`` TensorRT-LLM writes over it has none, and the directory is then read
    as TensorRT-LLM's own.
    """
    func = "write_trtllm_statistics"
    d = check_path(directory, "directory", func)
    c = exact_ints(counts, "counts", func, np.int64, ndim=4)  # torch.bincount's dtype
    R, I, L, E = c.shape
    if min(R, I, L, E) < 1:
        raise InvalidInputError(
            f"The 'counts' parameter of {func} must be a non-empty (n_ranks, n_iters, n_layers, "
            f"n_experts) array. Got shape {c.shape} instead."
        )
    iters = _distinct_ids(range(I) if iter_ids is None else iter_ids, I, "iter_ids", func)
    layers = _distinct_ids(layer_ids, L, "layer_ids", func, hi=MAX_LAYER_ID)
    top_k = check_int(top_k, "top_k", func, lo=1, hi=E)
    meta = {
        "num_experts": int(E),
        "num_experts_per_token": top_k,
        MANIFEST_FIELD: [f"rank{r}.safetensors" for r in range(R)],
    }
    ranks = [
        {
            f"{it}_{layer}": c[r, i, j]
            for i, it in enumerate(iters)
            for j, layer in enumerate(layers)
        }
        for r in range(R)
    ]
    # never write a set its reader refuses: the reader's checks, on what is written
    where = Writing(func, {"num_experts_per_token": "top_k"}, "counts")
    _parse_statistics(meta, where, [(where, t) for t in ranks], where)
    # the set replaces the directory's statistics whole: no rank file of an earlier write
    # survives, and a failure part way leaves the earlier set as it was
    with atomic_dir(d, _is_statistics_file) as stage:
        save_json(meta, os.path.join(stage, "meta_info.json"))
        for r, tensors in enumerate(ranks):
            save_safetensors(tensors, os.path.join(stage, f"rank{r}.safetensors"))
    return [os.path.join(d, "meta_info.json")] + [
        os.path.join(d, f"rank{r}.safetensors") for r in range(R)
    ]


def _check_manifest(meta, meta_path: str, d: str, found: list) -> None:
    """The rank files ``found`` in ``d`` against the manifest of ``meta_info.json``
    (:data:`MANIFEST_FIELD`), when it has one: exactly the files it lists, else an error
    naming the others (never summed) or the missing ones."""
    if not isinstance(meta, dict) or MANIFEST_FIELD not in meta:
        return  # written by TensorRT-LLM: every rank file counts
    listed = meta[MANIFEST_FIELD]
    if (
        not isinstance(listed, list)
        or not listed
        or listed != [f"rank{r}.safetensors" for r in range(len(listed))]
    ):
        raise field_error(
            meta_path,
            MANIFEST_FIELD,
            "the list of the set's rank files, ['rank0.safetensors', ..., 'rank<n-1>.safetensors']",
            repr(listed)[:120],
        )
    extra = [f for f in found if f not in listed]
    if extra:
        raise InvalidInputError(
            f"{d} holds {extra}, which the '{MANIFEST_FIELD}' field of {meta_path} does not "
            f"list (the set written is {listed}): a rank file of another recording, copied in "
            "or written later, is never summed into the set. Remove it, or write the whole "
            "set again."
        )
    missing = [f for f in listed if f not in found]
    if missing:
        raise InvalidInputError(
            f"{d} lacks {missing}, which the '{MANIFEST_FIELD}' field of {meta_path} lists: "
            "the set is incomplete."
        )


def _is_statistics_file(name: str) -> bool:
    """Whether a file of a statistics directory belongs to the set (what the reader reads:
    ``meta_info.json`` and ``rank<r>.safetensors``)."""
    return name == "meta_info.json" or _RANK_FILE_RE.match(name) is not None


def _placement_in(d: str):
    """The ``moe_load_balancer`` YAML files of a statistics directory that hold a placement
    (``initial_global_assignments``)."""
    found = []
    for f in sorted(glob.glob(os.path.join(glob.escape(d), "*.y*ml"))):
        if not f.endswith((".yaml", ".yml")):
            continue
        try:
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        if "initial_global_assignments" in text:
            found.append(f)
    return found


def _slot_placement(placement, d: str, n_ids: int, layers, n_experts, meta_path: str):
    """``(physical_to_logical [L, num_slots], source)`` that folds slot-id statistics, or
    ``None`` where the ids are expert ids; see :func:`read_trtllm_statistics`."""
    if placement is None:
        found = _placement_in(d)
        if len(found) > 1:
            raise InvalidInputError(
                f"{d} holds several placements {[os.path.basename(f) for f in found]}: pass "
                "the one the statistics were recorded under as 'placement'."
            )
        placement = found[0] if found else None
    if placement is None:
        if n_experts is not None and int(n_experts) != n_ids:
            raise field_error(
                meta_path,
                "num_experts",
                f"the model's {int(n_experts)} experts, or the num_slots of the placement the "
                "statistics were recorded under (TensorRT-LLM records slot ids when its MoE "
                "load balancer is on: pass its moe_load_balancer.yaml as 'placement', or put "
                "it in the statistics directory)",
                f"{n_ids} and no placement",
            )
        return None
    cfg = placement if isinstance(placement, EngineLog) else None
    if cfg is None:
        cfg = read_moe_load_balancer(placement, n_experts=n_experts)
    src = cfg.sources[0]
    if cfg.kind != "trtllm_config":
        raise InvalidInputError(
            f"The 'placement' parameter of read_trtllm_statistics must be a TensorRT-LLM "
            f"moe_load_balancer.yaml. Got a {cfg.kind} log ({src}) instead."
        )
    if cfg.extras.get("layer_updates_per_iter", 0) != 0:
        raise field_error(
            src,
            "layer_updates_per_iter",
            "0 to fold slot-id statistics (the online balancer moves experts between slots "
            "after the first update, so initial_global_assignments no longer says which "
            "expert a slot held)",
            str(cfg.extras["layer_updates_per_iter"]),
        )
    slots = cfg.physical_to_logical.shape[1]
    if slots != n_ids:
        raise field_error(
            meta_path,
            "num_experts",
            f"the num_slots={slots} of the placement {src} (slot-id statistics record one "
            "count per slot)",
            str(n_ids),
        )
    rows = {int(layer): i for i, layer in enumerate(cfg.layer_ids)}
    missing = [layer for layer in layers if layer not in rows]
    if missing:
        raise field_error(
            src,
            "initial_global_assignments",
            f"a row for every recorded layer {list(layers)[:8]}",
            f"no row for layer {missing[0]}",
        )
    return cfg.physical_to_logical[[rows[layer] for layer in layers]], src, cfg.n_experts


def _parse_statistics(meta, meta_path, rank_data, d):
    """Check a statistics set (``meta_info.json``'s dict and each rank file's ``{key:
    array}``) as :func:`read_trtllm_statistics` reads it; returns ``(num_experts, top_k,
    {(iter, layer): counts summed over ranks}, iterations, layers)``.
    :func:`write_trtllm_statistics` runs it on what it is about to write."""
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
    if k > E:
        raise field_error(
            meta_path,
            "num_experts_per_token",
            f"at most num_experts={E} (a token picks distinct experts)",
            str(k),
        )
    total: dict[tuple[int, int], np.ndarray] = {}
    keys0 = None
    for path, data in rank_data:
        keys = set()
        for key, arr in data.items():
            m = _KEY_RE.match(key)
            if m is None:
                raise InvalidInputError(
                    f"{path} must hold tensors keyed '{{iter}}_{{layer}}' (decimal integers "
                    f"without leading zeros). Got the key {key!r} instead."
                )
            it, layer = int(m.group(1)), int(m.group(2))
            if layer > MAX_LAYER_ID:
                raise InvalidInputError(
                    f"{path} must hold tensors of MoE layers at most {MAX_LAYER_ID}. Got the "
                    f"key {key!r} instead."
                )
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
                f"{path} must hold the same '{{iter}}_{{layer}}' keys as {rank_data[0][0]}. They "
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
    check_count_total(np.stack(list(total.values())), d, "statistics")
    return E, k, total, iters, layers


def read_trtllm_statistics(
    directory, *, iter_start=None, iter_stop=None, placement=None, n_experts=None
) -> EngineLog:
    """Read ``EXPERT_STATISTIC_PATH``: ``meta_info.json`` and every ``rank<r>.safetensors``.

    Counts are summed over ranks key by key (as TensorRT-LLM's scripts do); iterations in
    ``[iter_start, iter_stop)`` are kept (default: all). Every rank file must hold the same
    keys, every iteration every layer, each tensor ``[num_experts]`` (int32 or int64).

    Which rank files count:

    * a set :func:`write_trtllm_statistics` wrote: exactly the files its manifest lists
      (``meta_info.json``'s ``straggler_rank_files``, written with the set in one step). A
      ``rank<r>.safetensors`` beside them that the manifest does not list (copied in,
      or written by something else later) is refused with an error naming it, never
      summed; a listed file that is missing is refused too.
    * a directory TensorRT-LLM wrote (no manifest): every ``rank<r>.safetensors``, which
      must be ``rank0`` .. ``rank<n-1>``. TensorRT-LLM does not clear
      ``EXPERT_STATISTIC_PATH`` before it writes, and nothing in its files tells a rank
      file of an earlier recording from one of this recording: record into an empty
      directory.

    With the MoE load balancer on, TensorRT-LLM counts **slot ids** (``meta_info.json``'s
    ``num_experts`` is then ``num_slots``): they are folded to logical experts through
    ``initial_global_assignments`` of ``placement``, or of the one ``moe_load_balancer``
    YAML in the directory that holds a placement. Without a placement the ids are taken as
    expert ids (what TensorRT-LLM records with the balancer off), and ``n_experts``, if
    given, must then equal ``num_experts``.

    Parameters
    ----------
    directory : path
    iter_start, iter_stop : int, optional
    placement : path or EngineLog, optional
        The ``moe_load_balancer.yaml`` the statistics were recorded under (default: the one
        in ``directory``, if any). Its ``layer_updates_per_iter`` must be 0: the online
        balancer moves experts after its first update.
    n_experts : int, optional
        The model's logical experts.

    Returns
    -------
    EngineLog
        kind ``"trtllm_statistics"``; ``layer_ids`` are TensorRT-LLM's layer indices,
        ``batch_ids`` the iterations, ``n_ranks`` the rank files found; for slot-id
        statistics ``physical_to_logical`` is the recorded placement and
        ``extras["recorded_ids"]`` is ``"slots"`` (else ``"experts"``).

    Raises
    ------
    InvalidInputError
        A missing or malformed ``meta_info.json``, no rank file, unreadable files, keys
        not ``"{iter}_{layer}"``, wrong shapes, ranks holding different keys, an
        incomplete (iteration x layer) grid; ``num_experts`` that matches neither the
        model (``n_experts``) nor the placement's ``num_slots``; a placement without a row
        for a recorded layer, or with ``layer_updates_per_iter > 0``; several placements in
        the directory.
    BackendUnavailableError
        safetensors is not installed.
    """
    func = "read_trtllm_statistics"
    d = check_path(directory, "directory", func)
    for name, v in (("iter_start", iter_start), ("iter_stop", iter_stop)):
        if v is not None:
            check_int(v, name, func)
    if n_experts is not None:  # before the files are checked against it
        n_experts = check_int(n_experts, "n_experts", func, lo=1)
    meta_path = os.path.join(d, "meta_info.json")
    if not os.path.isfile(meta_path):
        raise InvalidInputError(f"{d} has no meta_info.json (TensorRT-LLM expert statistics).")
    meta = load_json(meta_path)
    files = sorted(
        (int(m.group(1)), f)
        for f in glob.glob(os.path.join(glob.escape(d), "rank*.safetensors"))
        if (m := _RANK_FILE_RE.match(os.path.basename(f)))
    )
    _check_manifest(meta, meta_path, d, [os.path.basename(f) for _, f in files])
    if not files:
        raise InvalidInputError(f"{d} has meta_info.json but no rank<r>.safetensors file.")
    ranks = [r for r, _ in files]
    if ranks != list(range(len(ranks))):
        raise InvalidInputError(
            f"The rank files of {d} must be rank0..rank{len(ranks) - 1}. Got ranks {ranks} instead."
        )
    E, k, total, iters, layers = _parse_statistics(
        meta, meta_path, [(f, load_safetensors(f)) for _, f in files], d
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
    folded = _slot_placement(placement, d, E, layers, n_experts, meta_path)
    p2l, extras, sources = None, {"recorded_ids": "experts"}, [meta_path] + [f for _, f in files]
    if folded is not None:
        p2l, src, E = folded
        counts = fold_physical_counts(counts, p2l, E, source=meta_path, name="num_experts")
        extras = {"recorded_ids": "slots", "placement": src}
        sources.append(src)
    return EngineLog(
        engine="trtllm",
        kind="trtllm_statistics",
        sources=sources,
        n_experts=E,
        counts=counts,
        physical_to_logical=p2l,
        layer_ids=np.array(layers),
        batch_ids=np.array(keep),
        n_ranks=len(files),
        top_k=k,
        extras=extras,
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
    # never write a file its reader refuses: the reader's checks, on what is written
    parse_moe_load_balancer(
        cfg,
        Writing(
            func,
            {
                "initial_global_assignments": "physical_to_logical",
                "initial_global_assignments key (layer)": "layer_ids",
                "num_slots": "physical_to_logical",
            },
        ),
    )
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
        expected=f"one list of {n_slots or 'num_slots'} expert ids >= 0 per layer "
        "(TensorRT-LLM has no empty slots)",
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
    if n_experts is not None:  # before the file is checked against it
        check_int(n_experts, "n_experts", "read_moe_load_balancer", lo=1)
    try:
        with open(src, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise read_error(src, exc) from None
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"Cannot read {src} as UTF-8 text: {exc}.") from None
    return parse_moe_load_balancer(parse_yaml(text, src), src, n_experts=n_experts)
