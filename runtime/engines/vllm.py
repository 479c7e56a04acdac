"""vLLM's ``EplbState``: the expert maps and the per-rank load windows.

The fields (``vllm/distributed/eplb/eplb_state.py``, one state per EP rank):

* ``physical_to_logical_map`` ``[n_layers, P]``: logical expert of each physical slot
  (slot ``p`` on rank ``p // (P / n_ranks)``), the same on every rank;
* ``logical_to_physical_map`` ``[n_layers, n_experts, num_redundant_experts + 1]``: each
  expert's slots, ``-1`` padded;
* ``logical_replica_count`` ``[n_layers, n_experts]``: its non-``-1`` entries;
* ``expert_load_pass`` ``[n_layers, P_local]`` (the first versions: the rank's local slots)
  or ``[n_layers, P]`` (later ones: the rank's own tokens counted on every slot): the
  forward pass in progress;
* ``expert_load_window`` ``[window_size, n_layers, P_local or P]``: a circular buffer of
  the last ``window_size`` passes (1000 by default), written at
  ``expert_load_window_step``, which wraps.

vLLM (CPU build 0.32.0, ``vllm/distributed/eplb/eplb_state.py``) keeps these in memory
only: ``EPLBConfig`` has no option that writes them, and the tensors live on one
``EplbModelState`` per model under ``EplbState.model_states`` (the main model, and a
speculative drafter as a second entry), with ``expert_load_window_step`` on the
``EplbState``. ``logical_to_physical_map`` is ``MAX_EXPERT_REDUNDANCY + 1 = 1024`` columns
wide; 0.32.0 lists each expert's slots in increasing slot id (``compute_logical_maps``,
also after a rearrangement). Each rank's window counts the tokens the rank routed, on
every slot; with an all-to-all that gathers every DP rank's tokens before routing
(``allgather_reducescatter``, the default, and the removed ``naive``), every rank routes
all of them, so the recorded load is ``dp_size`` times the true one (the
``EplbModelState.expert_load_window`` docstring).

The file format is therefore **ours** (:data:`VLLM_DUMP_FORMAT`): :func:`dump_vllm_eplb_state`
is the hook to call on a live ``EplbState`` (for instance after ``EplbState.step`` on every
EP rank); it writes one file per model state and rank, ``eplb_m{model}_rank{rank}.pt``,
holding the fields above under their vLLM names, ``expert_load_window_step``, ``rank``,
``model_index``, ``model_name``, ``dp_size``, ``all2all_backend`` and ``load_divisor``
(``dp_size`` for the gathering all-to-alls, else 1). :func:`write_vllm_state` writes the
same keys (``.pt``, ``.safetensors`` or ``.json``); :func:`read_vllm_state` reads the files
of every rank of one model, checks that they agree, puts the window in time order (from
``expert_load_window_step``), drops all-zero steps (unfilled, or dummy), places ``P_local``
windows at their rank's slots or sums ``P``-wide ones over ranks, divides by
``load_divisor``, and folds them to logical experts through the map in force (the saved
``physical_to_logical_map``, or ``physical_to_logical=``).
"""

from __future__ import annotations

import glob
import os

import numpy as np

from ...formulations.dispatch import logical_to_physical
from ...formulations.errors import InvalidInputError
from ...formulations.validation import check_array, check_int
from ._common import (
    EngineLog,
    Writing,
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
    load_by_extension,
    rank_of,
    save_json,
    save_pt,
    save_safetensors,
    source_name,
    to_numpy,
)

__all__ = [
    "VLLM_DUMP_FORMAT",
    "VLLM_MAP_WIDTH",
    "dump_vllm_eplb_state",
    "VLLM_FIELDS",
    "VLLM_MAP_FIELDS",
    "vllm_maps",
    "vllm_logical_maps",
    "write_vllm_state",
    "read_vllm_state",
    "parse_vllm_states",
    "is_vllm_state",
]

VLLM_MAP_FIELDS = ("physical_to_logical_map", "logical_to_physical_map", "logical_replica_count")
VLLM_FIELDS = VLLM_MAP_FIELDS + ("expert_load_pass", "expert_load_window")
_EXTS = (".pt", ".safetensors", ".json")
#: ``format`` field of the files :func:`dump_vllm_eplb_state` writes (vLLM has no such file).
VLLM_DUMP_FORMAT = "straggler.vllm_eplb_dump/1"
#: Columns of vLLM's ``logical_to_physical_map``: ``MAX_EXPERT_REDUNDANCY + 1``.
VLLM_MAP_WIDTH = 1024
#: All-to-all backends that give every rank every DP rank's tokens before routing.
_GATHERING_A2A = ("allgather_reducescatter", "naive")
_META = ("expert_load_window_step", "rank", "model_index", "load_divisor", "dp_size")
_TEXT_META = ("format", "model_name", "all2all_backend")


def vllm_maps(physical_to_logical, n_experts: int, *, width: int | None = VLLM_MAP_WIDTH) -> dict:
    """The three ``EplbModelState`` maps of a placement, in vLLM's layout.

    ``logical_to_physical_map`` lists each expert's slots in slot order (as
    ``compute_logical_maps`` fills it), padded with ``-1`` to ``width`` columns: vLLM's
    ``MAX_EXPERT_REDUNDANCY + 1 = 1024`` by default, ``None`` for the narrowest
    (``P - n_experts + 1``, enough for any placement). A ``width`` below the most replicas
    of an expert, or above ``max(1024, P)`` (more columns than vLLM's or than there are
    slots), is refused.

    Examples
    --------
    vLLM's docstring example (6 slots, 4 experts, 3 ranks):

    >>> m = vllm_maps([[0, 1, 2, 3, 0, 1], [0, 2, 0, 1, 0, 3]], 4, width=None)
    >>> m["logical_to_physical_map"][1].tolist()
    [[0, 2, 4], [3, -1, -1], [1, -1, -1], [5, -1, -1]]
    >>> m["logical_replica_count"].tolist()
    [[2, 2, 1, 1], [3, 1, 1, 1]]
    """
    n_experts = check_int(n_experts, "n_experts", "vllm_maps", lo=1)
    p2l = check_physical_to_logical(
        physical_to_logical, "vllm_maps", "physical_to_logical", n_experts=n_experts
    )
    L, P = p2l.shape
    # vLLM gives every expert a slot: more experts than slots is a wrong n_experts (and
    # would size the maps by it)
    check_int(n_experts, "n_experts", "vllm_maps", lo=1, hi=P)
    l2p, count = logical_to_physical(p2l, n_experts)
    need = max(P - n_experts + 1, l2p.shape[2])
    if width is None:
        width = need
    else:
        # at least the most replicas of an expert; at most vLLM's own width or the slots
        # (no expert has more replicas than there are slots): the map is L x E x width
        width = check_int(width, "width", "vllm_maps", lo=l2p.shape[2], hi=max(VLLM_MAP_WIDTH, P))
    pad = np.full((L, n_experts, width), -1, dtype=np.int64)
    pad[:, :, : l2p.shape[2]] = l2p
    return {
        "physical_to_logical_map": p2l,
        "logical_to_physical_map": pad,
        "logical_replica_count": count,
    }


def vllm_logical_maps(physical_to_logical_map, num_logical_experts: int):
    """vLLM's ``compute_logical_maps(physical_to_logical_map, num_logical_experts)`` in numpy.

    The logical-to-physical map and the replica counts of any slot map, in vLLM 0.32's
    layout (``vllm/distributed/eplb/eplb_state.py``): each expert's slots in increasing slot
    id, ``-1`` padded to the largest replica count (not to 1024: :func:`vllm_maps` pads
    for ``EplbModelState``); a ``-1`` slot (elastic scale-up leaves them) counts for no
    expert, and an expert without a slot gets count 0 and a row of ``-1``. Both outputs
    keep the map's integer dtype; a 1-D map is one layer.

    Parameters
    ----------
    physical_to_logical_map : array_like of int, shape (n_layers, P) or (P,)
        Expert ids in ``[-1, num_logical_experts)``.
    num_logical_experts : int

    Returns
    -------
    logical_to_physical_map : ndarray, shape (n_layers, num_logical_experts, max_replicas)
        (or without the layer axis for a 1-D map)
    logical_replica_count : ndarray, shape (n_layers, num_logical_experts)

    Raises
    ------
    InvalidInputError
        A map that is not a non-empty 1-D or 2-D integer array of ids in ``[-1,
        num_logical_experts)``.

    Examples
    --------
    vLLM's test case with empty slots (``tests/distributed/test_eplb_algo.py``):

    >>> l2p, cnt = vllm_logical_maps([[0, 1, -1, 2, 3, -1], [3, -1, 2, 1, 0, -1]], 4)
    >>> l2p[0, :, 0].tolist(), l2p.shape, cnt.tolist()
    ([0, 1, 3, 4], (2, 4, 1), [[1, 1, 1, 1], [1, 1, 1, 1]])
    """
    func = "vllm_logical_maps"
    dtype = np.asarray(physical_to_logical_map).dtype
    dtype = dtype if dtype.kind == "i" else np.dtype(np.int64)
    E = check_int(num_logical_experts, "num_logical_experts", func, lo=1)
    p2l = check_array(
        physical_to_logical_map, "physical_to_logical_map", func, kind="int", ndim=(1, 2),
        lo=-1, hi=E - 1,
        expected=f"a non-empty (n_layers, P) or (P,) map of expert ids in [-1, {E - 1}]",
    )  # fmt: skip
    if p2l.size == 0:
        raise InvalidInputError(
            f"The 'physical_to_logical_map' parameter of {func} must be a non-empty map. Got "
            f"shape {p2l.shape} instead."
        )
    two = np.atleast_2d(p2l)
    L, P = two.shape
    count = np.zeros((L, E), dtype=np.int64)
    for layer in range(L):
        live = two[layer][two[layer] >= 0]
        count[layer] = np.bincount(live, minlength=E)
    width = int(count.max())
    l2p = np.full((L, E, width), -1, dtype=np.int64)
    seen = np.zeros((L, E), dtype=np.int64)
    for p in range(P):  # slots in increasing id, as vLLM's loop
        rows = np.flatnonzero(two[:, p] >= 0)
        experts = two[rows, p]
        l2p[rows, experts, seen[rows, experts]] = p
        seen[rows, experts] += 1
    l2p, count = l2p.astype(dtype, copy=False), count.astype(dtype, copy=False)
    return (l2p[0], count[0]) if p2l.ndim == 1 else (l2p, count)


def write_vllm_state(path, state: dict) -> str:
    """Write one rank's ``EplbState`` fields (a dict keyed by :data:`VLLM_FIELDS`, plus
    optionally ``expert_load_window_step`` and ``rank``) as ``.pt``, ``.safetensors`` or
    ``.json``. Maps are int64, loads int32 (vLLM's dtypes)."""
    func = "write_vllm_state"
    if not isinstance(state, dict):
        raise InvalidInputError(
            f"The 'state' parameter of {func} must be a dict of EplbState fields. Got "
            f"{type(state).__name__} instead."
        )
    p = check_path(path, "path", func)
    out = {}
    for k, v in state.items():
        if k in VLLM_MAP_FIELDS:
            out[k] = exact_ints(v, k, func, np.int64, lo=-1)
        elif k in ("expert_load_pass", "expert_load_window"):
            out[k] = exact_ints(v, k, func, np.int32)
        elif k in _META:
            out[k] = check_int(v, k, func, lo=1 if k == "load_divisor" else 0)
        elif k in _TEXT_META:
            out[k] = str(v)
        else:
            raise InvalidInputError(
                f"write_vllm_state got an unknown field {k!r}; it writes {list(VLLM_FIELDS)}, "
                f"{list(_META)} and {list(_TEXT_META)}."
            )
    if not p.endswith(_EXTS):
        raise InvalidInputError(
            f"The 'path' parameter of write_vllm_state must end in {', '.join(_EXTS)}. "
            f"Got {p!r} instead."
        )
    _check_state(out, Writing(func))  # never write a rank's file its reader refuses
    if p.endswith(".pt"):
        save_pt(out, p)
    elif p.endswith(".json"):
        save_json(out, p)
    else:
        text = [k for k in out if k in _TEXT_META]
        if text:
            raise InvalidInputError(
                f"write_vllm_state cannot store the text fields {text} in {p}: safetensors "
                "holds tensors only (write .pt or .json)."
            )
        save_safetensors(
            {
                k: np.asarray(v, dtype=np.int64 if isinstance(v, int) else None)
                for k, v in out.items()
            },
            p,
        )
    return p


def dump_vllm_eplb_state(state, directory, *, rank: int, fmt: str = ".pt") -> list:
    """Write one rank's live vLLM ``EplbState``: one file per model state (needs torch).

    Parameters
    ----------
    state : vllm.distributed.eplb.eplb_state.EplbState
        The rank's state (``model_states``: the main model, and a drafter when speculative
        decoding has one); its ``parallel_config`` gives ``dp_size`` and the all-to-all.
    directory : path
        Created if missing; files ``eplb_m{model}_rank{rank}{fmt}`` (model ``0`` is the
        first model state added, the main model).
    rank : int
        The EP rank (``get_ep_group().rank_in_group``).
    fmt : {".pt", ".json"}

    Returns
    -------
    list of str : the files written.

    Examples
    --------
    A hook after each step, on every EP rank::

        dump_vllm_eplb_state(engine_eplb_state, "/data/eplb", rank=ep_rank)
    """
    if fmt not in (".pt", ".json"):
        raise InvalidInputError(
            "The 'fmt' parameter of dump_vllm_eplb_state must be '.pt' or '.json'. Got "
            f"{fmt!r} instead."
        )
    rank = field_int(rank, "dump_vllm_eplb_state", "rank", lo=0)
    models = getattr(state, "model_states", None)
    if not isinstance(models, dict) or not models:
        raise InvalidInputError(
            "The 'state' parameter of dump_vllm_eplb_state must be a vLLM EplbState with at "
            f"least one model state (model_states). Got {type(state).__name__} instead."
        )
    pc = getattr(state, "parallel_config", None)
    dp = int(getattr(pc, "data_parallel_size", 1) or 1)
    a2a = str(getattr(pc, "all2all_backend", ""))
    divisor = dp if a2a in _GATHERING_A2A else 1
    files = []
    for m, ms in enumerate(models.values()):
        fields = {k: to_numpy(getattr(ms, k)) for k in VLLM_FIELDS}
        fields.update(
            expert_load_window_step=int(state.expert_load_window_step),
            rank=rank,
            model_index=m,
            model_name=str(getattr(ms, "model_name", "")),
            dp_size=dp,
            all2all_backend=a2a,
            load_divisor=divisor,
            format=VLLM_DUMP_FORMAT,
        )
        files.append(
            write_vllm_state(
                os.path.join(os.fspath(directory), f"eplb_m{m}_rank{rank}{fmt}"), fields
            )
        )
    return files


def is_vllm_state(obj) -> bool:
    """Whether a loaded dict looks like an ``EplbState`` dump (any map or load field)."""
    return isinstance(obj, dict) and any(
        k in obj
        for k in (
            "logical_to_physical_map",
            "logical_replica_count",
            "expert_load_window",
            "expert_load_pass",
        )
    )


def _load(path):
    p = os.fspath(path)
    return load_by_extension(p, f"{p} is not a vLLM state dump (expected {', '.join(_EXTS)}).")


def _check_maps(obj, source):
    p2l = check_physical_to_logical(
        get_field(obj, "physical_to_logical_map", source), source, "physical_to_logical_map"
    )
    L, P = p2l.shape
    if p2l.max() >= P:
        raise field_error(
            source,
            "physical_to_logical_map",
            f"expert ids below the {P} slots (vLLM gives every expert a slot)",
            f"id {int(p2l.max())}",
        )
    E = None
    if "logical_replica_count" in obj:
        cnt = field_array(
            obj["logical_replica_count"],
            source,
            "logical_replica_count",
            ndim=2,
            lo=0,
            shape=(L, None),
            expected=f"a non-negative integer array of shape ({L}, n_experts)",
        )
        E = cnt.shape[1]
        if E > P:
            raise field_error(
                source,
                "logical_replica_count",
                f"at most {P} experts (one slot each at least)",
                f"shape {cnt.shape}",
            )
    if "logical_to_physical_map" in obj:
        l2p = field_array(
            obj["logical_to_physical_map"],
            source,
            "logical_to_physical_map",
            ndim=3,
            lo=-1,
            hi=P - 1,
            shape=(L, E, None),
            expected=f"an integer array of shape ({L}, n_experts, max_replicas) of slot ids in "
            f"[-1, {P - 1}]",
        )
        E = l2p.shape[1]
    if E is None:
        E = int(p2l.max()) + 1
    if p2l.max() >= E:
        raise field_error(
            source, "physical_to_logical_map", f"expert ids below {E}", f"id {p2l.max()}"
        )
    check_every_expert_placed(p2l, E, source, "physical_to_logical_map")
    want_l2p, want_cnt = logical_to_physical(p2l, E)
    if "logical_replica_count" in obj and not np.array_equal(cnt, want_cnt):
        raise field_error(
            source,
            "logical_replica_count",
            "the replica counts of physical_to_logical_map",
            "different counts",
        )
    if "logical_to_physical_map" in obj:
        for layer in range(L):
            for e in range(E):
                got = l2p[layer, e]
                k = int(want_cnt[layer, e])
                if (
                    sorted(got[got >= 0].tolist()) != want_l2p[layer, e, :k].tolist()
                    or (got[:k] < 0).any()
                ):
                    raise field_error(
                        source,
                        "logical_to_physical_map",
                        "the slots of each expert in physical_to_logical_map (first entries, "
                        "-1 padded)",
                        f"{got.tolist()[:8]} for expert {e} of layer {layer}",
                    )
    return p2l, E


def _window(obj, src, p2l):
    """One rank's load in time order, ``[steps, L, width]`` (``expert_load_window`` from
    ``expert_load_window_step``, or ``expert_load_pass`` as one step), or None when the file
    holds neither. ``width`` divides the map's ``P`` slots (all of them, or the rank's own);
    no token lies on an empty slot the window can be placed on."""
    L, P = p2l.shape
    if "expert_load_window" in obj:
        w = field_array(
            obj["expert_load_window"],
            src,
            "expert_load_window",
            ndim=3,
            lo=0,
            shape=(None, L, None),
            expected=f"a non-negative integer array of shape (window_size, {L}, P_local or {P})",
        )
        step = obj.get("expert_load_window_step")
        if step is not None:
            step = field_int(step, src, "expert_load_window_step", lo=0)
            if w.shape[0] and step >= w.shape[0]:
                raise field_error(
                    src,
                    "expert_load_window_step",
                    f"an index below window_size={w.shape[0]}",
                    str(step),
                )
            w = np.concatenate([w[step:], w[:step]]) if w.shape[0] else w
        name = "expert_load_window"
    elif "expert_load_pass" in obj:
        w = field_array(
            obj["expert_load_pass"],
            src,
            "expert_load_pass",
            ndim=2,
            lo=0,
            shape=(L, None),
            expected=f"a non-negative integer array of shape ({L}, P_local or {P})",
        )[None]
        name = "expert_load_pass"
    else:
        return None
    if w.shape[2] == 0 or P % w.shape[2]:
        raise field_error(
            src,
            name,
            f"P_local (the rank's own slots, a divisor of {P}) or {P} (all slots) columns",
            f"shape {w.shape}",
        )
    check_count_total(w, src, name)
    rank = obj.get("rank")
    if w.shape[2] == P:
        empty = p2l < 0
    elif rank is not None:  # the rank's own slots
        r = field_int(rank, src, "rank", lo=0)
        if (r + 1) * w.shape[2] > P:
            raise field_error(
                src,
                "rank",
                f"a rank below {P // w.shape[2]} (the ranks holding {w.shape[2]} of {P} slots)",
                str(r),
            )
        empty = p2l[:, r * w.shape[2] : (r + 1) * w.shape[2]] < 0
    else:
        empty = None
    if empty is not None and empty.any() and np.any(w[:, empty] != 0):
        raise field_error(src, name, "zero on every empty slot (map entry -1)", "tokens on one")
    return w


def _check_state(obj, source):
    """Everything one rank's file must satisfy on its own (its maps agree, its window fits
    them, its fields are in range); returns ``(physical_to_logical, n_experts, window)``
    (:func:`_window`). The
    reader runs it on every file before comparing the ranks; :func:`write_vllm_state` on
    what it is about to write."""
    if not isinstance(obj, dict):
        raise InvalidInputError(
            f"{source} must hold a dict of EplbState fields. Got {type(obj).__name__} instead."
        )
    known = (*VLLM_FIELDS, *_META, *_TEXT_META)
    unknown = [k for k in obj if k not in known]
    if unknown:  # the writer's fields only: a renamed tensor (a bit flipped in a
        # safetensors header, which has no checksum) is damage, never a file without loads
        raise InvalidInputError(
            f"{source} holds the field {unknown[0]!r}, which is not an EplbState field this "
            f"reader knows; expected fields among {list(known)}."
        )
    for key in ("rank", "model_index"):
        if obj.get(key) is not None:
            field_int(obj[key], source, key, lo=0)
    field_int(obj.get("load_divisor", 1), source, "load_divisor", lo=1)
    p2l, E = _check_maps(obj, source)
    return p2l, E, _window(obj, source, p2l)


def parse_vllm_states(objs, sources, *, physical_to_logical=None, model: int = 0) -> EngineLog:
    """Interpret the loaded state dumps of the ranks (see the module docstring); files with
    a ``model_index`` other than ``model`` (a drafter's, or the main model's) are left out."""
    sources = [source_name(s) for s in sources]
    if not objs:
        raise InvalidInputError("No vLLM EplbState dump was given.")
    indexed = [
        field_int(o["model_index"], s, "model_index", lo=0)
        if isinstance(o, dict) and "model_index" in o
        else 0
        for o, s in zip(objs, sources)
    ]
    if model not in indexed:
        raise InvalidInputError(
            f"The vLLM dumps {sources[:4]} hold model states {sorted(set(indexed))}. Got "
            f"model={model!r} instead."
        )
    keep = [i for i, m in enumerate(indexed) if m == model]
    objs, sources = [objs[i] for i in keep], [sources[i] for i in keep]
    ranks = []
    for i, (obj, src) in enumerate(zip(objs, sources)):
        if not isinstance(obj, dict):
            raise InvalidInputError(
                f"{src} must hold a dict of EplbState fields. Got {type(obj).__name__} instead."
            )
        r = obj.get("rank")
        r = field_int(r, src, "rank", lo=0) if r is not None else rank_of(src)
        ranks.append(i if r is None and len(objs) == 1 else r)
    if any(r is None for r in ranks):
        raise InvalidInputError(
            f"Cannot tell the rank of {[s for s, r in zip(sources, ranks) if r is None]}: name "
            "the files ...rank<r>.pt or save a 'rank' field."
        )
    if len(set(ranks)) != len(ranks) or sorted(ranks) != list(range(len(ranks))):
        raise InvalidInputError(
            f"The vLLM state dumps must be one per rank 0..n-1. Got ranks {sorted(ranks)} "
            f"from {sources} instead."
        )
    order = np.argsort(ranks)
    objs = [objs[i] for i in order]
    sources = [sources[i] for i in order]
    n_ranks = len(objs)
    p2l, E, w0 = _check_state(objs[0], sources[0])
    loads = [w0]
    for obj, src in zip(objs[1:], sources[1:]):
        other, _, w = _check_state(obj, src)
        loads.append(w)
        if other.shape != p2l.shape or not np.array_equal(other, p2l):
            raise field_error(
                src, "physical_to_logical_map", f"rank 0's map ({sources[0]})", "a different map"
            )
    L, P = p2l.shape
    if P % n_ranks:
        raise field_error(
            sources[0],
            "physical_to_logical_map",
            f"a number of slots divisible by the {n_ranks} ranks",
            f"{P} slots",
        )
    fold_map = p2l
    if physical_to_logical is not None:
        if isinstance(physical_to_logical, (str, bytes, dict)):
            raise InvalidInputError(
                "The 'physical_to_logical' parameter of read_vllm_state must be one map of "
                f"shape {p2l.shape}. Got {type(physical_to_logical).__name__} instead."
            )
        fold_map = check_physical_to_logical(
            physical_to_logical,
            "the physical_to_logical argument",
            "physical_to_logical",
            n_experts=E,
        )
        if fold_map.shape != p2l.shape:
            raise InvalidInputError(
                f"The 'physical_to_logical' argument must have the dumps' shape {p2l.shape}. "
                f"Got {fold_map.shape} instead."
            )
    P_local = P // n_ranks
    if all(w is None for w in loads):  # the maps alone (what straggler-plan writes): a placement
        return EngineLog(
            engine="vllm",
            kind="vllm_maps",
            sources=sources,
            n_experts=E,
            physical_to_logical=p2l,
            n_ranks=n_ranks,
        )
    windows = []
    for w, src in zip(loads, sources):
        if w is None:
            raise field_error(src, "expert_load_window", "present (or expert_load_pass)", "neither")
        if w.shape[2] not in (P_local, P):
            raise InvalidInputError(
                f"{src} holds the load of {w.shape[2]} of {P} slots, the window of one of "
                f"{P // w.shape[2]} ranks, but {n_ranks} rank file(s) were given: read the files "
                "of every rank (their directory)."
            )
        windows.append(w)
    if len({w.shape for w in windows}) > 1:
        raise field_error(
            sources[-1],
            "expert_load_window",
            f"rank 0's shape {windows[0].shape}",
            f"shapes {[w.shape for w in windows]}",
        )
    W = windows[0].shape[0]
    if windows[0].shape[2] == P:
        physical = checked_sum(np.stack(windows), 0, sources[0], "expert_load_window")
        layout = "global"
    else:
        physical = np.concatenate(windows, axis=2)
        layout = "local"
    divisors = {
        field_int(o.get("load_divisor", 1), src, "load_divisor", lo=1)
        for o, src in zip(objs, sources)
    }
    if len(divisors) > 1:
        raise field_error(
            sources[-1], "load_divisor", "the same on every rank", f"{sorted(divisors)}"
        )
    divisor = divisors.pop()
    if divisor > 1:
        if np.any(physical % divisor):
            raise field_error(
                sources[0],
                "expert_load_window",
                f"counts divisible by load_divisor={divisor} (dp_size: every rank routed "
                "every DP rank's tokens)",
                "a count that is not",
            )
        physical = physical // divisor
    live = physical.any(axis=(1, 2))
    counts = check_count_total(
        fold_physical_counts(
            physical[live], fold_map, E, source=sources[0], name="expert_load_window"
        ),
        sources[0],
        "expert_load_window",
    )
    return EngineLog(
        engine="vllm",
        kind="vllm_state",
        sources=sources,
        n_experts=E,
        counts=counts,
        physical_to_logical=p2l,
        batch_ids=np.flatnonzero(live),
        n_ranks=n_ranks,
        extras={"window_size": int(W), "load_layout": layout, "load_divisor": divisor},
    )


def _state_files(path) -> list[str]:
    if isinstance(path, (list, tuple)):
        if not path:
            raise InvalidInputError("The 'path' parameter of read_vllm_state got no file.")
        return [check_path(p, "path", "read_vllm_state") for p in path]
    p = check_path(path, "path", "read_vllm_state")
    if os.path.isdir(p):
        files = sorted(
            f for ext in _EXTS for f in glob.glob(os.path.join(glob.escape(p), f"*rank*{ext}"))
        )
        if not files:
            raise InvalidInputError(
                f"{p} holds no vLLM state dump (*rank<r>.pt/.safetensors/.json)."
            )
        return files
    return [p]


def read_vllm_state(path, *, physical_to_logical=None, model: int = 0) -> EngineLog:
    """Read the ``EplbState`` dumps of every rank: a directory (``*rank<r>.pt``,
    ``.safetensors`` or ``.json``), a list of files, or one file (a single rank).

    Returns an :class:`EngineLog` of kind ``"vllm_state"``: the window's steps as batches,
    folded to logical experts, with the saved placement (kind ``"vllm_maps"``, no loads,
    for files holding the maps alone, as ``straggler-plan --format vllm`` writes them).
    ``model`` picks the model state of :func:`dump_vllm_eplb_state` files (0: the main
    model, 1: a drafter). Every rank's file in the directory counts: each rank writes its
    own (one process per rank), so dump one recording per directory.

    Raises
    ------
    InvalidInputError
        Unreadable or malformed files, maps inconsistent with each other or across ranks,
        missing or repeated ranks, window shapes that disagree, counts on empty slots.
    """
    files = _state_files(path)
    return parse_vllm_states(
        [_load(f) for f in files], files, physical_to_logical=physical_to_logical, model=model
    )
