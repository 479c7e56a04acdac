"""SGLang's expert-distribution recorder dumps and ``--init-expert-location`` inputs.

What SGLang writes (``srt/eplb/expert_distribution.py``, ``torch.save`` into
``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR``):

* **stat** mode (``--expert-distribution-recorder-mode stat``; also ``stat_approx``):
  rank 0 writes ``expert_distribution_recorder_{time.time()}.pt`` =
  ``{"rank": 0, "logical_count": int32 [buffer_steps, n_layers, n_experts],
  "average_utilization_rate_over_window": float or None}``. The counts were already
  folded to logical experts by SGLang, through the map in force **at dump time**, and
  summed over ranks (``all_reduce``). The buffer is circular
  (``--expert-distribution-recorder-buffer-size``): unfilled steps are all zero, and the
  rows are in buffer order, not time order.
* **per_pass** and **per_token** modes: every rank writes
  ``expert_distribution_recorder_{time.time()}_{rank}.pt`` = ``{"records": [...],
  "last_physical_to_logical_map": int64 [n_layers, P]}``; a record is
  ``{"forward_pass_id", "rank", "gatherer_key", "global_physical_count": int32 [n_layers,
  P]}`` (the rank's own tokens counted on every physical slot), per-token records also
  ``"topk_ids_of_layer": int32 [n_layers, n_tokens, 8]`` (physical slot ids, ``-1``
  padded; 8 columns whatever the model's top-k), ``"input_ids"``, ``"positions"``,
  ``"extend_seq_lens"``, ``"forward_mode"``, ``"misc_objects"``. SGLang's own reader
  (``eplb_simulator/reader.py``) sums the ranks of each forward pass.

``--init-expert-location`` takes ``trivial``, a ``.pt`` file, a ``.json`` file or inline
JSON, holding either ``physical_to_logical_map`` (passed as ``**data_dict`` to
``init_by_mapping``: it must be the only key) or ``logical_count`` (``[n_layers,
n_experts]`` or ``[steps, n_layers, n_experts]``, placed by EPLB at start-up; other keys
ignored, so a stat dump is a valid input).

Folding: physical counts are folded to logical experts through the map in force when they
were recorded. SGLang stores only the last map of each dump (``last_physical_to_logical_map``,
"this may change during recording"); each record is folded through its own file's map, the
ranks of one forward pass must agree on it, and ``physical_to_logical=`` overrides it (one
map, or ``{first_forward_pass_id: map}`` for a recording that spans EPLB rebalances).
"""

from __future__ import annotations

import glob
import os
import re
import time

import numpy as np

from ...formulations.errors import InvalidInputError
from ...formulations.validation import check_int, check_real
from ._common import (
    EngineLog,
    Writing,
    at_record,
    check_count_total,
    check_every_expert_placed,
    check_path,
    check_physical_to_logical,
    checked_sum,
    exact_ints,
    field_array,
    field_error,
    field_int,
    fold_physical_counts,
    get_field,
    load_json,
    load_pt,
    save_json,
    save_pt,
    source_name,
)

__all__ = [
    "RECORDER_PREFIX",
    "SGLANG_TOPK_COLUMNS",
    "read_sglang_recorder",
    "parse_sglang_dump",
    "write_sglang_stat_dump",
    "write_sglang_detail_dump",
    "sglang_per_token_record",
    "read_sglang_init_location",
    "parse_sglang_init_location",
    "write_sglang_init_location",
]

RECORDER_PREFIX = "expert_distribution_recorder_"
#: Columns of SGLang's per-token ``topk_ids_of_layer`` buffer (``_TOP_K_NUM = 8``).
SGLANG_TOPK_COLUMNS = 8
_NAME_RE = re.compile(
    r"^expert_distribution_recorder_(?P<ts>[0-9.eE+-]+?)(?:_(?P<rank>[0-9]+))?\.pt$", re.ASCII
)


# --- writers (what SGLang writes) -----------------------------------------------------------


def _dump_name(timestamp, rank=None) -> str:
    # a number, as SGLang's time.time(): anything else could carry a path into the name
    ts = (
        time.time()
        if timestamp is None
        else check_real(timestamp, "timestamp", "SGLang dump", lo=0)
    )
    return f"{RECORDER_PREFIX}{ts}" + ("" if rank is None else f"_{rank}") + ".pt"


def write_sglang_stat_dump(
    directory, logical_count, *, average_utilization_rate=None, rank: int = 0, timestamp=None
) -> str:
    """Write a stat-mode dump as SGLang's ``_StatAccumulator.dump`` does (needs torch).

    Parameters
    ----------
    directory : path
        ``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR`` (created if missing).
    logical_count : array_like of int, shape (buffer_steps, n_layers, n_experts)
    average_utilization_rate : float or None
    timestamp : float, optional
        The ``time.time()`` in the file name (default: now).

    Returns
    -------
    str : the file written.
    """
    func = "write_sglang_stat_dump"
    count = exact_ints(logical_count, "logical_count", func, np.int32, ndim=3)
    rank = check_int(rank, "rank", func, lo=0)
    obj = {
        "rank": int(rank),
        "logical_count": count,
        "average_utilization_rate_over_window": average_utilization_rate,
    }
    where = Writing(func, {"average_utilization_rate_over_window": "average_utilization_rate"})
    obj["average_utilization_rate_over_window"] = _utilization_rate(obj, where)
    parse_sglang_dump([obj], [where])  # never write a dump its reader refuses
    path = os.path.join(check_path(directory, "directory", func), _dump_name(timestamp))
    save_pt(obj, path)
    return path


def sglang_per_token_record(
    forward_pass_id: int, topk_ids_of_layer, n_physical: int, input_ids=None, positions=None
) -> dict:
    """A per-token record as SGLang's ``_DetailSinglePassGatherer.collect`` builds it.

    ``topk_ids_of_layer [n_layers, n_tokens, k]`` (physical slot ids) is padded with
    ``-1`` to SGLang's 8 columns; ``global_physical_count`` is its per-layer bincount, as
    ``_convert_per_token_to_global_physical_count`` computes it.
    """
    func = "sglang_per_token_record"
    n_physical = check_int(n_physical, "n_physical", func, lo=1, hi=2**31 - 1)
    ids = exact_ints(topk_ids_of_layer, "topk_ids_of_layer", func, np.int32, ndim=3, lo=-1)
    if ids.size and ids.max() >= n_physical:
        raise InvalidInputError(
            f"The 'topk_ids_of_layer' parameter of {func} must hold slot ids below "
            f"n_physical={n_physical}. Got id {int(ids.max())} instead."
        )
    if ids.shape[2] > SGLANG_TOPK_COLUMNS:
        raise InvalidInputError(
            f"The 'topk_ids_of_layer' parameter of {func} must have at most "
            f"{SGLANG_TOPK_COLUMNS} columns (SGLang's buffer). Got shape {ids.shape} instead."
        )
    L, n_tok, k = ids.shape
    pid = check_int(forward_pass_id, "forward_pass_id", func)
    for name, given in (("input_ids", input_ids), ("positions", positions)):
        if given is not None and (
            isinstance(given, (str, bytes)) or not hasattr(given, "__len__") or len(given) != n_tok
        ):
            raise InvalidInputError(
                f"The '{name}' parameter of {func} must hold one entry per token ({n_tok}). "
                f"Got {repr(given)[:60]} instead."
            )
    if k < SGLANG_TOPK_COLUMNS:
        ids = np.concatenate([ids, np.full((L, n_tok, SGLANG_TOPK_COLUMNS - k), -1, np.int32)], 2)
    gpc = np.zeros((L, n_physical), dtype=np.int32)
    for layer in range(L):
        row = ids[layer].ravel()
        row = row[row >= 0]
        gpc[layer] = np.bincount(row, minlength=n_physical)[:n_physical]
    return {
        "forward_pass_id": pid,
        "input_ids": list(range(n_tok)) if input_ids is None else list(input_ids),
        "positions": list(range(n_tok)) if positions is None else list(positions),
        "extend_seq_lens": None,
        "forward_mode": 2,
        "topk_ids_of_layer": ids,
        "misc_objects": [],
        "global_physical_count": gpc,
    }


def write_sglang_detail_dump(
    directory, records, last_physical_to_logical_map, *, rank: int, timestamp=None
) -> str:
    """Write one rank's per-pass / per-token dump as ``_DetailAccumulator.dump`` does.

    ``records`` are dicts with ``forward_pass_id`` and ``global_physical_count [n_layers,
    P]`` (per-pass), or :func:`sglang_per_token_record` dicts (per-token); ``rank`` and
    ``gatherer_key`` are filled in as SGLang does. Needs torch.
    """
    func = "write_sglang_detail_dump"
    rank = check_int(rank, "rank", func, lo=0)
    last = check_physical_to_logical(
        last_physical_to_logical_map, func, "last_physical_to_logical_map"
    )
    if isinstance(records, (str, bytes, dict)) or not hasattr(records, "__iter__"):
        raise InvalidInputError(
            f"The 'records' parameter of {func} must be a list of record dicts. Got "
            f"{type(records).__name__} instead."
        )
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or not {"forward_pass_id", "global_physical_count"} <= set(
            rec
        ):
            raise InvalidInputError(
                f"Record {i} of the 'records' parameter of {func} must be a dict with "
                f"'forward_pass_id' and 'global_physical_count'. Got {repr(rec)[:60]} instead."
            )
        r = {
            "forward_pass_id": check_int(rec["forward_pass_id"], "forward_pass_id", func),
            "rank": rank,
            "gatherer_key": "primary",
        }
        r.update({k: v for k, v in rec.items() if k not in r})
        gpc = exact_ints(rec["global_physical_count"], "global_physical_count", func, np.int32)
        if gpc.shape != last.shape:
            raise InvalidInputError(
                f"The 'global_physical_count' of record {i} passed to {func} must have the "
                f"map's shape {last.shape}. Got shape {gpc.shape} instead."
            )
        r["global_physical_count"] = gpc
        out.append(r)
    obj = {"records": out, "last_physical_to_logical_map": last}
    parse_sglang_dump([obj], [Writing(func)])  # never write a dump its reader refuses
    path = os.path.join(check_path(directory, "directory", func), _dump_name(timestamp, rank))
    save_pt(obj, path)
    return path


# --- readers --------------------------------------------------------------------------------


def _counts_3d(value, source, name):
    c = field_array(
        value,
        source,
        name,
        ndim=(2, 3),
        lo=0,
        expected="a non-negative integer array of shape (n_steps, n_layers, n_experts) "
        "or (n_layers, n_experts)",
    )
    if c.ndim == 2:
        c = c[None]
    if 0 in c.shape[1:]:
        raise field_error(source, name, "at least one layer and one expert", f"shape {c.shape}")
    return c


def _utilization_rate(obj, source):
    """The ``average_utilization_rate_over_window`` of a stat dump: None, or one real number
    (SGLang saves ``tensor.item()`` of a float32, or None when the threshold is off)."""
    rate = obj.get("average_utilization_rate_over_window")
    if rate is None:
        return None
    a = None
    if not isinstance(rate, (bool, np.bool_, str, bytes)):
        try:
            a = np.asarray(rate)
        except Exception:  # noqa: BLE001 - anything numpy cannot take is not a number
            a = None
    if a is None or a.ndim != 0 or a.dtype.kind not in "iuf":
        raise field_error(
            source, "average_utilization_rate_over_window", "a number or None", repr(rate)[:60]
        )
    return float(a)


def _stat_log(obj, source, kind):
    count = _counts_3d(get_field(obj, "logical_count", source), source, "logical_count")
    check_count_total(count, source, "logical_count")
    live = count.any(axis=(1, 2))
    rate = _utilization_rate(obj, source)
    extras = {"buffer_steps": int(count.shape[0])}
    if rate is not None:
        extras["average_utilization_rate_over_window"] = rate
    return dict(
        engine="sglang",
        kind=kind,
        counts=count[live],
        batch_ids=np.flatnonzero(live),
        n_experts=int(count.shape[2]),
        extras=extras,
    )


def _map_for(physical_to_logical, pass_id, file_map, source):
    """The map in force for ``pass_id``: the override (one map, or the latest entry of a
    ``{first_pass_id: map}`` history at or before it), else the file's last map."""
    if physical_to_logical is None:
        return file_map
    if isinstance(physical_to_logical, dict):
        starts = sorted(k for k in physical_to_logical if k <= pass_id)
        if not starts:
            raise InvalidInputError(
                f"The 'physical_to_logical' history passed for {source} must cover forward pass "
                f"{pass_id}. Got maps from pass {min(physical_to_logical)} on instead."
            )
        return physical_to_logical[starts[-1]]
    return physical_to_logical


def _override_iv(physical_to_logical, n_experts):
    if physical_to_logical is None:
        return None
    if isinstance(physical_to_logical, (str, bytes)):
        raise InvalidInputError(
            "The 'physical_to_logical' parameter must be a map (n_layers, P) or a dict "
            f"{{first_forward_pass_id: map}}. Got the string {physical_to_logical[:40]!r} instead."
        )
    what = "the physical_to_logical argument"
    if isinstance(physical_to_logical, dict):
        out = {}
        for k, v in physical_to_logical.items():
            out[field_int(k, what, "first_forward_pass_id")] = check_physical_to_logical(
                v, what, f"map from pass {k}", n_experts=n_experts
            )
        if not out:
            raise InvalidInputError("The 'physical_to_logical' history must hold at least one map.")
        return out
    return check_physical_to_logical(
        physical_to_logical, what, "physical_to_logical", n_experts=n_experts
    )


def _n_experts_iv(n_experts, maps, source) -> int:
    """Logical experts: the argument, or the largest id in the maps + 1; never more than
    the slots of a map (SGLang gives every logical expert a slot)."""
    P = min(m.shape[1] for m in maps)
    top = int(max(m.max() for m in maps)) + 1
    if n_experts is None:
        if top > P:
            raise field_error(
                source,
                "physical_to_logical",
                f"expert ids below the {P} physical slots (SGLang places every expert)",
                f"id {top - 1}",
            )
        return top
    return check_int(n_experts, "n_experts", "read_sglang_recorder", lo=max(top, 1), hi=P)


def _detail_records(obj, source):
    """(records, last map) of one detail dump, every field checked."""
    records = get_field(obj, "records", source, "a list of per-pass records")
    if not isinstance(records, (list, tuple)):
        raise field_error(source, "records", "a list of per-pass records", type(records).__name__)
    last = check_physical_to_logical(
        get_field(obj, "last_physical_to_logical_map", source),
        source,
        "last_physical_to_logical_map",
    )
    L, P = last.shape
    out = []
    for i, rec in enumerate(records):
        where = at_record(source, i)
        pid = field_int(get_field(rec, "forward_pass_id", where), where, "forward_pass_id")
        rank = field_int(get_field(rec, "rank", where), where, "rank", lo=0)
        gpc = field_array(
            get_field(rec, "global_physical_count", where),
            where,
            "global_physical_count",
            ndim=2,
            lo=0,
            shape=(L, P),
            expected=f"a non-negative integer array of shape ({L}, {P}) (layers x physical "
            "slots of last_physical_to_logical_map)",
        )
        topk = None
        if "topk_ids_of_layer" in rec:
            topk = field_array(
                rec["topk_ids_of_layer"],
                where,
                "topk_ids_of_layer",
                ndim=3,
                lo=-1,
                hi=P - 1,
                shape=(L, None, None),
                expected=f"an integer array of shape ({L}, n_tokens, k) of physical slot ids in "
                f"[-1, {P - 1}]",
            )
            n_ids = rec.get("input_ids")
            if n_ids is not None and hasattr(n_ids, "__len__") and len(n_ids) != topk.shape[1]:
                raise field_error(
                    where,
                    "topk_ids_of_layer",
                    f"{len(n_ids)} tokens (one per input id)",
                    f"{topk.shape[1]} tokens",
                )
            want = np.zeros((L, P), dtype=np.int64)
            for layer in range(L):
                row = topk[layer].ravel()
                want[layer] = np.bincount(row[row >= 0], minlength=P)[:P]
            if not np.array_equal(want, gpc):
                raise field_error(
                    where,
                    "global_physical_count",
                    "the per-layer count of topk_ids_of_layer (as SGLang computes it)",
                    "different counts",
                )
        out.append((pid, rank, gpc, topk))
    return out, last


def parse_sglang_dump(objs, sources, *, physical_to_logical=None, n_experts=None) -> EngineLog:
    """Interpret loaded recorder dumps (one stat dump, or the detail dumps of all ranks).

    ``objs`` are the dicts ``torch.load`` returned (tensors as numpy), ``sources`` their
    file names. See the module docstring for the layout and the fold.
    """
    sources = [source_name(s) for s in sources]
    if not objs:
        raise InvalidInputError("No SGLang expert-distribution dump was given.")
    is_stat = ["logical_count" in o if isinstance(o, dict) else False for o in objs]
    if all(is_stat):
        if physical_to_logical is not None or n_experts is not None:
            raise InvalidInputError(
                f"{sources[0]} is a stat-mode dump, already folded to logical experts by SGLang: "
                "the 'physical_to_logical' and 'n_experts' options apply to per-pass and "
                "per-token dumps only."
            )
        parts = [_stat_log(o, s, "sglang_stat") for o, s in zip(objs, sources)]
        E = {p["n_experts"] for p in parts}
        L = {p["counts"].shape[1] for p in parts}
        if len(E) > 1 or len(L) > 1:
            raise field_error(
                sources[-1],
                "logical_count",
                "the same (n_layers, n_experts) in every dump",
                f"shapes {sorted((p['counts'].shape[1:]) for p in parts)}",
            )
        counts = check_count_total(
            np.concatenate([p["counts"] for p in parts]), sources[-1], "logical_count"
        )
        # buffer positions, offset past the earlier dumps' buffers
        offsets = np.cumsum([0] + [p["extras"]["buffer_steps"] for p in parts[:-1]])
        ids = np.concatenate([p["batch_ids"] + o for p, o in zip(parts, offsets)])
        extras = parts[0]["extras"] if len(parts) == 1 else {"dumps": [p["extras"] for p in parts]}
        return EngineLog(
            engine="sglang",
            kind="sglang_stat",
            sources=sources,
            n_experts=E.pop(),
            counts=counts,
            batch_ids=ids,
            n_ranks=None,
            extras=extras,
        )
    if any(is_stat):
        raise InvalidInputError(
            f"The SGLang dumps {sources} mix stat-mode files (logical_count) with per-pass or "
            "per-token files (records); read one recording at a time."
        )
    if n_experts is not None:  # before the maps are checked against it
        n_experts = check_int(n_experts, "n_experts", "read_sglang_recorder", lo=1)
    override = _override_iv(physical_to_logical, n_experts)
    by_pass: dict[int, dict[int, tuple]] = {}
    maps = []
    per_token = None
    for obj, src in zip(objs, sources):
        recs, last = _detail_records(obj, src)
        maps.append(last)
        for pid, rank, gpc, topk in recs:
            if per_token is None:
                per_token = topk is not None
            elif per_token != (topk is not None):
                raise InvalidInputError(
                    f"{src} mixes per-pass and per-token records (topk_ids_of_layer present in "
                    "some only)."
                )
            slot = by_pass.setdefault(pid, {})
            if rank in slot:
                raise InvalidInputError(
                    f"{src} repeats forward pass {pid} of rank {rank} (also in {slot[rank][3]})."
                )
            slot[rank] = (gpc, _map_for(override, pid, last, src), topk, src)
    if not by_pass:
        raise field_error(sources[0], "records", "at least one record", "none")
    shapes = {m.shape for m in maps}
    if len(shapes) > 1:
        raise field_error(
            sources[-1],
            "last_physical_to_logical_map",
            "the same (n_layers, P) in every rank's file",
            f"shapes {sorted(shapes)}",
        )
    ranks = None
    if override is None:
        all_maps = maps
    elif isinstance(override, dict):
        all_maps = list(override.values())
    else:
        all_maps = [override]
    E = _n_experts_iv(n_experts, all_maps, sources[0])
    for m in all_maps:
        check_every_expert_placed(m, E, sources[0], "physical_to_logical")
    passes = sorted(by_pass)
    counts = []
    for pid in passes:
        slot = by_pass[pid]
        if ranks is None:
            ranks = sorted(slot)
        elif sorted(slot) != ranks:
            raise InvalidInputError(
                f"Forward pass {pid} has records from ranks {sorted(slot)} but forward pass "
                f"{passes[0]} from ranks {ranks}: a rank's file is missing or from another "
                f"recording ({sorted({v[3] for v in slot.values()})})."
            )
        m0 = next(iter(slot.values()))[1]
        for _rank, (gpc, m, _, src) in sorted(slot.items()):
            if m.shape != m0.shape or not np.array_equal(m, m0):
                raise field_error(
                    src,
                    "last_physical_to_logical_map",
                    f"the map of the other ranks that recorded forward pass {pid}",
                    "a different map",
                )
            if gpc.shape != m.shape:
                raise field_error(
                    src, "global_physical_count", f"shape {m.shape}", f"shape {gpc.shape}"
                )
        total = checked_sum(
            [v[0] for _, v in sorted(slot.items())], 0, sources[0], "global_physical_count"
        )
        if m0.max() >= E:
            raise field_error(
                sources[0],
                "physical_to_logical",
                f"expert ids below n_experts={E}",
                f"id {m0.max()}",
            )
        counts.append(
            fold_physical_counts(total, m0, E, source=sources[0], name="global_physical_count")
        )
    top_k = None
    if per_token:
        top_k = int(
            max(
                int((t >= 0).sum(axis=-1).max(initial=0))
                for s in by_pass.values()
                for (_, _, t, _) in s.values()
            )
        )
    return EngineLog(
        engine="sglang",
        kind="sglang_per_token" if per_token else "sglang_per_pass",
        sources=sources,
        n_experts=E,
        counts=check_count_total(np.stack(counts), sources[0], "global_physical_count"),
        physical_to_logical=next(iter(by_pass[passes[-1]].values()))[1],
        batch_ids=np.array(passes),
        n_ranks=len(ranks),
        top_k=top_k,
    )


def _recorder_files(path) -> list[str]:
    if os.path.isdir(path):
        files = sorted(
            f
            for f in glob.glob(os.path.join(glob.escape(os.fspath(path)), RECORDER_PREFIX + "*.pt"))
            if _NAME_RE.match(os.path.basename(f))
        )
        if not files:
            raise InvalidInputError(
                f"{source_name(path)} holds no SGLang recorder dump "
                f"({RECORDER_PREFIX}<time>[_<rank>].pt)."
            )
        return files
    return [os.fspath(path)]


def read_sglang_recorder(path, *, physical_to_logical=None, n_experts=None) -> EngineLog:
    """Read SGLang expert-distribution dumps: one ``.pt`` file, or a recorder directory.

    Parameters
    ----------
    path : path
        A dump file, or ``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR`` (every
        ``expert_distribution_recorder_*.pt`` in it: one stat dump or more, or the per-rank
        files of per-pass / per-token recordings).
    physical_to_logical : array (n_layers, P) or dict {first_forward_pass_id: array}, optional
        The map(s) in force while recording (per-pass / per-token only; default: each
        file's ``last_physical_to_logical_map``).
    n_experts : int, optional
        Logical experts (per-pass / per-token files do not say; default: the largest id
        in the maps + 1).

    Returns
    -------
    EngineLog
        kind ``"sglang_stat"``, ``"sglang_per_pass"`` or ``"sglang_per_token"``.

    Raises
    ------
    InvalidInputError
        Unreadable, truncated or malformed files; ranks that disagree (maps, shapes, a
        missing rank); counts on empty slots; per-token counts that do not match their ids.
    BackendUnavailableError
        torch is not installed (``.pt`` files are torch pickles).
    """
    files = _recorder_files(check_path(path, "path", "read_sglang_recorder"))
    objs = [load_pt(f) for f in files]
    return parse_sglang_dump(
        objs, files, physical_to_logical=physical_to_logical, n_experts=n_experts
    )


# --- --init-expert-location ----------------------------------------------------------------


def parse_sglang_init_location(obj, source: str) -> EngineLog:
    """Interpret an ``--init-expert-location`` dict as SGLang's
    ``compute_initial_expert_location_metadata`` does: ``physical_to_logical_map`` first
    (then it must be the only key, since SGLang passes ``**data_dict`` on), else
    ``logical_count``."""
    if not isinstance(obj, dict):
        raise InvalidInputError(
            f"{source} must hold a dict with 'physical_to_logical_map' or 'logical_count' "
            f"(SGLang's --init-expert-location). Got {type(obj).__name__} instead."
        )
    if "physical_to_logical_map" in obj:
        extra = sorted(str(k) for k in obj if k != "physical_to_logical_map")
        if extra:
            raise InvalidInputError(
                f"{source} must hold only 'physical_to_logical_map': SGLang passes the dict as "
                f"keyword arguments to init_by_mapping, which rejects {extra}."
            )
        m = check_physical_to_logical(
            obj["physical_to_logical_map"], source, "physical_to_logical_map"
        )
        if (m < 0).any():
            raise field_error(
                source,
                "physical_to_logical_map",
                "expert ids >= 0 (SGLang has no empty slots)",
                "-1",
            )
        if m.max() >= m.shape[1]:
            raise field_error(
                source,
                "physical_to_logical_map",
                f"expert ids below the {m.shape[1]} slots (SGLang places every expert)",
                f"id {int(m.max())}",
            )
        check_every_expert_placed(m, int(m.max()) + 1, source, "physical_to_logical_map")
        return EngineLog(
            engine="sglang",
            kind="sglang_init_mapping",
            sources=[source],
            n_experts=int(m.max()) + 1,
            physical_to_logical=m,
        )
    if "logical_count" in obj:
        return EngineLog(sources=[source], **_stat_log(obj, source, "sglang_init_count"))
    raise InvalidInputError(
        f"{source} must hold 'physical_to_logical_map' or 'logical_count' (SGLang's "
        f"--init-expert-location). Got keys {sorted(map(str, obj))[:12]} instead."
    )


def read_sglang_init_location(arg) -> EngineLog:
    """Read what ``--init-expert-location`` accepts: a ``.pt`` file, a ``.json`` file, or
    inline JSON (any other string, as SGLang parses it). ``trivial`` needs the model's
    shape and is refused."""
    text = check_path(arg, "arg", "read_sglang_init_location")
    if text == "trivial":
        raise InvalidInputError(
            "--init-expert-location trivial (logical expert p % E in slot p) holds no data: "
            "it needs the model's number of layers, experts and slots."
        )
    if text.endswith(".pt"):
        return parse_sglang_init_location(load_pt(text), text)
    if text.endswith(".json"):
        return parse_sglang_init_location(load_json(text), text)
    return parse_sglang_init_location(load_json(text, inline=True), "the inline JSON")


def write_sglang_init_location(path, *, physical_to_logical=None, logical_count=None) -> str:
    """Write an ``--init-expert-location`` file: ``.json`` (no dependency) or ``.pt`` (torch).

    Exactly one of ``physical_to_logical [n_layers, P]`` (the placement SGLang loads as is)
    or ``logical_count`` (loads SGLang places with its EPLB at start-up).
    """
    if (physical_to_logical is None) == (logical_count is None):
        raise InvalidInputError(
            "write_sglang_init_location needs exactly one of physical_to_logical and logical_count."
        )
    func = "write_sglang_init_location"
    if physical_to_logical is not None:
        obj = {
            "physical_to_logical_map": exact_ints(
                physical_to_logical, "physical_to_logical", func, lo=-1
            )
        }
    else:
        obj = {"logical_count": exact_ints(logical_count, "logical_count", func)}
    # never write a file its reader refuses
    parse_sglang_init_location(
        obj, Writing(func, {"physical_to_logical_map": "physical_to_logical"})
    )
    p = check_path(path, "path", func)
    if p.endswith(".pt"):
        save_pt(obj, p)
    elif p.endswith(".json"):
        save_json(obj, p)
    else:
        raise InvalidInputError(
            f"The 'path' parameter of write_sglang_init_location must end in .json or .pt "
            f"(what --init-expert-location reads as a file). Got {p!r} instead."
        )
    return p
