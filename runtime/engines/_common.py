"""What every engine reader shares: the :class:`EngineLog` it returns, the file loaders
(torch, safetensors and JSON, each failure turned into one clear error), field checks that
name the file, the field and the expected shape, and the fold of physical-slot counts back
to logical experts."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ...formulations.errors import BackendUnavailableError, InvalidInputError
from ...formulations.validation import check_array

__all__ = [
    "EngineLog",
    "field_error",
    "field_array",
    "field_int",
    "get_field",
    "load_pt",
    "save_pt",
    "load_json",
    "save_json",
    "load_safetensors",
    "save_safetensors",
    "load_by_extension",
    "fold_physical_counts",
    "check_physical_to_logical",
    "to_numpy",
    "source_name",
    "rank_of",
]


def _parent(path) -> None:
    d = os.path.dirname(os.fspath(path))
    if d:
        os.makedirs(d, exist_ok=True)


def source_name(path) -> str:
    """How a file is named in messages (its path as given)."""
    return os.fspath(path) if not isinstance(path, str) else path


def field_error(source: str, field_name: str, expected: str, got: str) -> InvalidInputError:
    """``The 'f' field of FILE must be EXPECTED. Got GOT instead.`` (the library's wording,
    with the file in place of the function).

    >>> str(field_error("a.pt", "logical_count", "a 3-D array", "shape (2,)"))
    "The 'logical_count' field of a.pt must be a 3-D array. Got shape (2,) instead."
    """
    return InvalidInputError(
        f"The '{field_name}' field of {source} must be {expected}. Got {got} instead."
    )


@dataclass(frozen=True, eq=False, kw_only=True)
class EngineLog:
    """What one engine recorded: logical expert loads per recorded batch, and the placement.

    Every reader of :mod:`straggler.runtime.engines` returns one. Physical-slot counts
    have already been folded back to logical experts through the map in force when they
    were recorded (:func:`fold_physical_counts`).

    Attributes
    ----------
    engine : str
        ``"sglang"``, ``"vllm"``, ``"trtllm"`` or ``"eplb"``.
    kind : str
        The file kind read, e.g. ``"sglang_stat"``, ``"sglang_per_pass"``,
        ``"sglang_per_token"``, ``"sglang_init_mapping"``, ``"sglang_init_count"``,
        ``"vllm_state"``, ``"vllm_maps"``,
        ``"trtllm_statistics"``, ``"trtllm_config"``, ``"eplb_maps"``.
    sources : tuple of str
        The files read.
    n_experts : int
        Logical experts per layer.
    counts : ndarray of int64, shape (n_batches, n_layers, n_experts), or None
        Tokens routed to each logical expert in each recorded batch (forward pass,
        iteration, window step). None for files that hold a placement only.
    physical_to_logical : ndarray of int64, shape (n_layers, P), or None
        The placement the file records (the last one in force), ``-1`` for an empty slot.
    layer_ids : ndarray of int64, shape (n_layers,)
        The engine's index of each MoE layer (TensorRT-LLM's DeepSeek layers start at 3).
    batch_ids : ndarray of int64, shape (n_batches,), or None
        Forward-pass ids, iterations or window positions of the batches.
    n_ranks : int or None
        EP ranks that recorded (the number of rank files, where the format has them).
    top_k : int or None
        Experts per token, where the file says.
    extras : dict
        Format-specific details (utilisation rates, TensorRT-LLM's ``num_slots``, ...).
    """

    engine: str
    kind: str
    sources: tuple
    n_experts: int
    counts: np.ndarray | None = None
    physical_to_logical: np.ndarray | None = None
    layer_ids: np.ndarray | None = None
    batch_ids: np.ndarray | None = None
    n_ranks: int | None = None
    top_k: int | None = None
    extras: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("counts", "physical_to_logical", "layer_ids", "batch_ids"):
            v = getattr(self, name)
            if v is not None:
                v = np.array(v, dtype=np.int64, copy=True)
                v.setflags(write=False)
                object.__setattr__(self, name, v)
        if self.layer_ids is None:
            L = (
                self.counts.shape[1]
                if self.counts is not None
                else self.physical_to_logical.shape[0]
            )
            ids = np.arange(L, dtype=np.int64)
            ids.setflags(write=False)
            object.__setattr__(self, "layer_ids", ids)
        object.__setattr__(self, "sources", tuple(self.sources))

    @property
    def n_layers(self) -> int:
        """MoE layers recorded."""
        return int(self.layer_ids.size)

    @property
    def n_batches(self) -> int:
        """Recorded batches (0 for a placement-only file)."""
        return 0 if self.counts is None else int(self.counts.shape[0])

    @property
    def has_loads(self) -> bool:
        """Whether the file recorded loads (not a placement alone)."""
        return self.counts is not None and self.counts.shape[0] > 0

    @property
    def loads(self) -> np.ndarray | None:
        """Total tokens per logical expert over the batches, ``(n_layers, n_experts)``."""
        return None if self.counts is None else self.counts.sum(axis=0)

    def summary(self) -> str:
        """One line: engine, kind, shape, files."""
        what = (
            f"{self.n_batches} batches x {self.n_layers} layers x {self.n_experts} experts"
            if self.counts is not None
            else f"placement of {self.n_layers} layers x {self.n_experts} experts"
        )
        slots = (
            ""
            if self.physical_to_logical is None
            else f", {self.physical_to_logical.shape[1]} slots"
        )
        ranks = "" if self.n_ranks is None else f", {self.n_ranks} ranks"
        n = len(self.sources)
        files = self.sources[0] if n == 1 else f"{n} files"
        return f"{self.engine} ({self.kind}): {what}{slots}{ranks} from {files}"


# --- loaders -------------------------------------------------------------------------------


def _torch(purpose: str):
    try:
        import torch
    except ImportError:
        raise BackendUnavailableError(
            f"{purpose} needs torch, which is not installed: pip install 'straggler[runtime]' "
            "(or the CPU build: pip install torch --index-url https://download.pytorch.org/whl/cpu)."
        ) from None
    return torch


def to_numpy(x):
    """torch tensors (any device) to numpy, recursively through dicts, lists and tuples."""
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    if isinstance(x, dict):
        return {k: to_numpy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_numpy(v) for v in x)
    return x


def load_pt(path):
    """``torch.load(path, weights_only=True, map_location="cpu")`` with tensors as numpy.

    ``map_location="cpu"``: SGLang saves some tensors straight from the GPU. Any failure
    (not a torch file, truncated, a disallowed pickle global) is one InvalidInputError.
    """
    torch = _torch(f"Reading {source_name(path)}")
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise InvalidInputError(f"No such file: {source_name(path)}.") from None
    except Exception as exc:  # noqa: BLE001 - torch's failure modes are open-ended
        raise InvalidInputError(
            f"{source_name(path)} is not a readable torch file "
            f"(torch.load(weights_only=True) failed: {type(exc).__name__}: {str(exc)[:200]})."
        ) from None
    return to_numpy(obj)


def save_pt(obj, path) -> None:
    """``torch.save`` with numpy arrays (recursively) turned into tensors first."""
    torch = _torch(f"Writing {source_name(path)}")

    def conv(x):
        if isinstance(x, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(x))
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(conv(v) for v in x)
        return x

    _parent(path)
    torch.save(conv(obj), path)


def load_json(path_or_text, *, inline: bool = False):
    """JSON from a file (or, with ``inline=True``, from the text itself)."""
    where = "the inline JSON" if inline else source_name(path_or_text)
    try:
        if inline:
            return json.loads(path_or_text)
        with open(path_or_text, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise InvalidInputError(f"No such file: {where}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise InvalidInputError(f"{where} is not valid JSON: {str(exc)[:200]}.") from None


def save_json(obj, path) -> None:
    """JSON with numpy arrays as nested lists."""

    def conv(x):
        if isinstance(x, np.ndarray):
            return x.tolist()
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, dict):
            return {str(k): conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        return x

    _parent(path)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(conv(obj), f)


def _safetensors(purpose: str):
    try:
        import safetensors.numpy as stn
    except ImportError:
        raise BackendUnavailableError(
            f"{purpose} needs safetensors, which is not installed: "
            "pip install 'straggler[runtime]' (or pip install safetensors)."
        ) from None
    return stn


def load_safetensors(path) -> dict:
    """A safetensors file as ``{name: ndarray}`` (no torch needed)."""
    stn = _safetensors(f"Reading {source_name(path)}")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise InvalidInputError(f"No such file: {source_name(path)}.") from None
    try:
        return dict(stn.load(data))
    except Exception as exc:  # noqa: BLE001 - SafetensorError and friends
        raise InvalidInputError(
            f"{source_name(path)} is not a readable safetensors file "
            f"({type(exc).__name__}: {str(exc)[:200]})."
        ) from None


def save_safetensors(tensors: dict, path) -> None:
    """``{name: ndarray}`` as a safetensors file (the bytes ``safetensors.torch`` writes)."""
    stn = _safetensors(f"Writing {source_name(path)}")
    _parent(path)
    stn.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path)


def load_by_extension(path, unknown: str):
    """A ``.pt``, ``.json`` or ``.safetensors`` file read by its extension; any other path
    raises ``InvalidInputError(unknown)``."""
    p = os.fspath(path)
    if p.endswith(".pt"):
        return load_pt(p)
    if p.endswith(".json"):
        return load_json(p)
    if p.endswith(".safetensors"):
        return load_safetensors(p)
    raise InvalidInputError(unknown)


# --- fields --------------------------------------------------------------------------------


def get_field(obj, key: str, source: str, expected: str = "present"):
    """``obj[key]`` of a loaded dict, or an error naming the file and the missing field."""
    if not isinstance(obj, dict):
        raise InvalidInputError(
            f"{source} must hold a dict with the field '{key}'. Got {type(obj).__name__} instead."
        )
    if key not in obj:
        raise field_error(source, key, expected, f"a dict with keys {sorted(map(str, obj))[:12]}")
    return obj[key]


def field_array(
    value,
    source: str,
    name: str,
    *,
    ndim,
    kind="int",
    lo=None,
    hi=None,
    shape=None,
    expected: str,
):
    """``value`` as an int64/float64 array (:func:`~straggler.formulations.validation.
    check_array`), or an error naming the file, the field and the expected shape; ``shape``
    entries that are not None must match."""
    try:
        a = check_array(value, name, source, kind=kind, ndim=ndim, lo=lo, hi=hi, expected=expected)
    except InvalidInputError as exc:
        raise InvalidInputError(str(exc).replace(" parameter of ", " field of ", 1)) from None
    if shape is not None and (
        len(shape) != a.ndim or any(s is not None and s != d for s, d in zip(shape, a.shape))
    ):
        raise field_error(source, name, expected, f"shape {a.shape}")
    return a


def field_int(value, source: str, name: str, *, lo=None) -> int:
    """An integer field (a Python int, a 0-D or one-element integer array, or an integral
    float)."""
    a = None
    if not isinstance(value, (bool, np.bool_)):
        try:
            a = np.asarray(value)
        except Exception:  # noqa: BLE001 - anything numpy cannot take is simply not an int
            a = None
    # a scalar, or a one-element array (safetensors stores scalars with shape [1])
    ok = a is not None and a.size == 1 and a.ndim <= 1 and a.dtype.kind in "iuf"
    if ok:
        a = a.reshape(())
    if ok and a.dtype.kind == "f":
        ok = bool(np.isfinite(a)) and float(a) == int(a)
    if ok:
        v = int(a)
        if lo is None or v >= lo:
            return v
    want = "an integer" + ("" if lo is None else f" >= {lo}")
    raise field_error(source, name, want, repr(value)[:80])


def check_physical_to_logical(value, source: str, name: str, *, n_experts: int | None = None):
    """A ``physical_to_logical [L, P]`` map: integers in ``[-1, E)`` (``-1``: empty slot)."""
    hi = None if n_experts is None else n_experts - 1
    m = field_array(
        value,
        source,
        name,
        ndim=2,
        lo=-1,
        hi=hi,
        expected="an integer array of shape (n_layers, n_physical_slots) with entries in "
        + ("[-1, n_experts)" if hi is None else f"[-1, {hi}]"),
    )
    if m.shape[0] == 0 or m.shape[1] == 0:
        raise field_error(
            source, name, "a non-empty (n_layers, n_physical_slots) map", "an empty one"
        )
    return m


def fold_physical_counts(
    physical_counts,
    physical_to_logical,
    n_experts: int,
    *,
    source: str = "the counts",
    name: str = "counts",
) -> np.ndarray:
    """Fold per-slot counts ``[..., L, P]`` into per-expert counts ``[..., L, E]``.

    ``logical[..., l, e] = sum_{p : map[l, p] = e} physical[..., l, p]`` (SGLang's
    ``_convert_global_physical_count_to_logical_count``, vLLM's ``scatter_add_`` over
    ``physical_to_logical_map``). A count on an empty slot (``-1``) is an error: no expert
    could have received it.

    Examples
    --------
    >>> fold_physical_counts([[5, 1, 2, 0]], [[0, 1, 0, -1]], 2).tolist()
    [[7, 1]]
    """
    c = np.asarray(physical_counts, dtype=np.int64)
    m = np.asarray(physical_to_logical, dtype=np.int64)
    L, P = m.shape
    if c.shape[-2:] != (L, P):
        raise field_error(
            source,
            name,
            f"counts of shape (..., {L}, {P}) matching the map in force",
            f"shape {c.shape}",
        )
    empty = m < 0
    if empty.any() and np.any(c[..., empty] != 0):
        raise field_error(source, name, "zero on every empty slot (map entry -1)", "tokens on one")
    out = np.zeros(c.shape[:-1] + (n_experts,), dtype=np.int64)
    lead = c.reshape(-1, L, P)
    flat = out.reshape(-1, L, n_experts)
    for layer in range(L):
        ok = ~empty[layer]
        np.add.at(flat[:, layer, :], (slice(None), m[layer, ok]), lead[:, layer, ok])
    return out


_RANK_RE = re.compile(r"rank[_-]?(\d+)")


def rank_of(path) -> int | None:
    """The rank in a file name (``rank3``, ``rank_3``, ``..._3.pt`` is not a rank name)."""
    found = _RANK_RE.findall(os.path.basename(os.fspath(path)))
    return int(found[-1]) if found else None
