"""DeepSeek EPLB's maps: ``phy2log``, ``log2phy``, ``logcnt`` (and the ``weight`` placed).

``eplb.rebalance_experts(weight, num_replicas, num_groups, num_nodes, num_gpus)`` returns
``phy2log [n_layers, P]`` (expert of each slot), ``log2phy [n_layers, n_experts, X]``
(each expert's slots **in replica-rank order**, ``-1`` padded, ``X`` the largest replica
count) and ``logcnt [n_layers, n_experts]``; :func:`straggler.solvers.placement.eplb.
rebalance_experts` returns the same. EPLB has no file format of its own: this module
stores the three maps under those names (plus, optionally, the ``weight [n_layers,
n_experts]`` they were built from) in ``.json`` (no dependency) or ``.pt`` (torch), and
checks on reading that the three agree.
"""

from __future__ import annotations

import numpy as np

from ...formulations.errors import InvalidInputError
from ...formulations.validation import MAX_EXACT_INT, check_array
from ._common import (
    EngineLog,
    Writing,
    check_every_expert_placed,
    check_path,
    check_physical_to_logical,
    exact_ints,
    field_array,
    field_error,
    get_field,
    load_json,
    load_pt,
    save_json,
    save_pt,
)

__all__ = ["write_eplb_maps", "read_eplb_maps", "parse_eplb_maps", "is_eplb_maps"]


def is_eplb_maps(obj) -> bool:
    """Whether a loaded dict holds EPLB's maps."""
    return isinstance(obj, dict) and "phy2log" in obj


def write_eplb_maps(path, phy2log, log2phy, logcnt, *, weight=None) -> str:
    """Write EPLB's three maps (and optionally the weight) as ``.json`` or ``.pt``."""
    func = "write_eplb_maps"
    p = check_path(path, "path", func)
    obj = {
        "phy2log": exact_ints(phy2log, "phy2log", func, lo=-1),
        "log2phy": exact_ints(log2phy, "log2phy", func, lo=-1),
        "logcnt": exact_ints(logcnt, "logcnt", func),
    }
    if weight is not None:
        obj["weight"] = check_array(weight, "weight", func, kind="real", ndim=2, lo=0)
    parse_eplb_maps(obj, Writing(func))  # never write maps its reader refuses
    if p.endswith(".json"):
        save_json(obj, p)
    elif p.endswith(".pt"):
        save_pt(obj, p)
    else:
        raise InvalidInputError(
            f"The 'path' parameter of write_eplb_maps must end in .json or .pt. Got {p!r} instead."
        )
    return p


def parse_eplb_maps(obj, source: str) -> EngineLog:
    """Check and interpret a loaded maps dict (kind ``"eplb_maps"``).

    An integral ``weight`` becomes one recorded batch (``counts [1, n_layers, n_experts]``);
    a fractional one (long-run averages) is kept in ``extras["weight"]``.
    """
    phy2log = check_physical_to_logical(get_field(obj, "phy2log", source), source, "phy2log")
    if (phy2log < 0).any():
        raise field_error(source, "phy2log", "expert ids >= 0 (EPLB fills every slot)", "-1")
    L, P = phy2log.shape
    logcnt = field_array(
        get_field(obj, "logcnt", source),
        source,
        "logcnt",
        ndim=2,
        lo=0,
        shape=(L, None),
        expected=f"a non-negative integer array of shape ({L}, n_experts)",
    )
    E = logcnt.shape[1]
    log2phy = field_array(
        get_field(obj, "log2phy", source),
        source,
        "log2phy",
        ndim=3,
        lo=-1,
        hi=P - 1,
        shape=(L, E, None),
        expected=f"an integer array of shape ({L}, {E}, max_count) of slot ids in [-1, {P - 1}]",
    )
    if phy2log.max() >= E:
        raise field_error(
            source,
            "phy2log",
            f"expert ids below n_experts={E} (from logcnt)",
            f"id {int(phy2log.max())}",
        )
    check_every_expert_placed(phy2log, E, source, "phy2log")
    for layer in range(L):
        want = np.bincount(phy2log[layer], minlength=E)
        if not np.array_equal(want, logcnt[layer]):
            e = int(np.flatnonzero(want != logcnt[layer])[0])
            raise field_error(
                source,
                "logcnt",
                "the replica counts of phy2log",
                f"{int(logcnt[layer, e])} for expert {e} of layer {layer} "
                f"(phy2log has {int(want[e])})",
            )
        for e in range(E):
            k = int(logcnt[layer, e])
            row = log2phy[layer, e]
            if (
                (row[:k] < 0).any()
                or (row[k:] >= 0).any()
                or sorted(row[:k].tolist()) != sorted(np.flatnonzero(phy2log[layer] == e).tolist())
            ):
                raise field_error(
                    source,
                    "log2phy",
                    "each expert's slots of phy2log first, then -1",
                    f"{row.tolist()[:8]} for expert {e} of layer {layer}",
                )
    counts = None
    extras: dict = {}
    if "weight" in obj and obj["weight"] is not None:
        w = field_array(
            obj["weight"],
            source,
            "weight",
            kind="real",
            ndim=2,
            lo=0,
            shape=(L, E),
            expected=f"a non-negative array of shape ({L}, {E})",
        )
        if np.all(w == np.round(w)):
            if float(w.sum()) > MAX_EXACT_INT:
                raise field_error(
                    source,
                    "weight",
                    f"loads whose total stays below 2**53 = {MAX_EXACT_INT}",
                    f"a total of {float(w.sum()):.4g}",
                )
            counts = w.astype(np.int64)[None]
        else:
            extras["weight"] = w
    return EngineLog(
        engine="eplb",
        kind="eplb_maps",
        sources=[source],
        n_experts=E,
        counts=counts,
        physical_to_logical=phy2log,
        batch_ids=None if counts is None else np.zeros(1, dtype=np.int64),
        extras=extras | {"log2phy": log2phy},
    )


def read_eplb_maps(path) -> EngineLog:
    """Read maps written by :func:`write_eplb_maps` (``.json`` or ``.pt``)."""
    p = check_path(path, "path", "read_eplb_maps")
    obj = load_pt(p) if p.endswith(".pt") else load_json(p)
    return parse_eplb_maps(obj, p)
