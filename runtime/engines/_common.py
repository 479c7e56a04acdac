"""What every engine reader shares: the :class:`EngineLog` it returns, the file loaders
(torch, safetensors and JSON, each failure turned into one clear error), field checks that
name the file, the field and the expected shape, and the fold of physical-slot counts back
to logical experts."""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import dataclass, field

import numpy as np

from ...formulations._io import atomic_open, atomic_path, file_problem, write_error
from ...formulations.errors import BackendUnavailableError, InvalidInputError, param_error
from ...formulations.validation import MAX_EXACT_INT, check_array, check_int

__all__ = [
    "EngineLog",
    "field_error",
    "field_array",
    "field_int",
    "get_field",
    "load_pt",
    "check_zip_members",
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
    "exact_ints",
    "checked_sum",
    "check_count_total",
    "check_path",
    "read_error",
    "require_file",
    "Writing",
    "at_record",
    "check_every_expert_placed",
]


def source_name(path) -> str:
    """How a file is named in messages (its path as given)."""
    return os.fspath(path) if not isinstance(path, str) else path


def check_path(path, name: str, func: str) -> str:
    """``path`` as a string: a ``str`` or ``os.PathLike``, else an error naming the
    parameter."""
    if isinstance(path, (bytes, bool)) or not isinstance(path, (str, os.PathLike)):
        raise InvalidInputError(
            f"The '{name}' parameter of {func} must be a path (str or os.PathLike). Got "
            f"{type(path).__name__} {repr(path)[:60]} instead."
        )
    p = os.fspath(path)
    if not p or "\0" in p:
        raise InvalidInputError(
            f"The '{name}' parameter of {func} must be a non-empty path. Got {p[:60]!r} instead."
        )
    return p


def read_error(path, exc: OSError) -> InvalidInputError:
    """One clear error for a file that cannot be opened (missing, a directory, a symlink
    loop, no permission, ...)."""
    src = source_name(path)
    if isinstance(exc, FileNotFoundError):
        return InvalidInputError(f"No such file: {src}.")
    if isinstance(exc, IsADirectoryError) or os.path.isdir(src):
        return InvalidInputError(f"{src} is a directory, not a file.")
    reason = exc.strerror or type(exc).__name__
    return InvalidInputError(f"Cannot read {src}: {reason}.")


def require_file(path) -> str:
    """``path`` when it is a regular file (following symbolic links); otherwise one clear
    error. A FIFO or a device would block or never end, a directory cannot be read."""
    src = source_name(path)
    why = file_problem(src)
    if why == "does not exist":
        raise InvalidInputError(f"No such file: {src}.")
    if why is not None:
        raise InvalidInputError(f"{src} {why}.")
    return src


def exact_ints(value, name: str, func: str, dtype=np.int64, *, ndim=None, lo=0) -> np.ndarray:
    """``value`` as an array of ``dtype`` when every entry is an integer that ``dtype``
    stores exactly, else an error naming the parameter (never a silent cast: ``2**32``
    does not become 0 in int32, nor ``2.9`` become 2).

    >>> exact_ints([[1, 2.0]], "counts", "f", np.int32).dtype
    dtype('int32')
    >>> exact_ints([2**31], "counts", "f", np.int32)
    Traceback (most recent call last):
    ...
    straggler.formulations.errors.InvalidInputError: ... Got value 2147483648 at index 0 instead.
    """
    info = np.iinfo(dtype)
    hi = int(info.max)
    a = check_array(
        value,
        name,
        func,
        kind="int",
        ndim=range(0, 33) if ndim is None else ndim,
        lo=lo,
        hi=hi,
        expected=f"an array of integers in [{lo if lo is not None else info.min}, {hi}] "
        f"({np.dtype(dtype).name}, what the file stores)",
    )
    return a.astype(dtype)


def checked_sum(a, axis, source: str, name: str) -> np.ndarray:
    """``a.sum(axis)`` of non-negative int64 counts, or an error naming the file and the
    field when a total would exceed ``2**53`` (where int64 sums may overflow and float64
    solvers stop being exact)."""
    a = np.asarray(a, dtype=np.int64)
    total = a.astype(np.float64).sum(axis=axis)
    if np.size(total) and float(np.max(total)) > MAX_EXACT_INT:
        raise field_error(
            source,
            name,
            f"counts whose totals are at most 2**53 = {MAX_EXACT_INT}",
            f"a total of {float(np.max(total)):.4g} tokens",
        )
    return a.sum(axis=axis)


def check_count_total(a, source: str, name: str) -> np.ndarray:
    """``a`` unchanged when the sum of all its entries stays below ``2**53`` (so every
    partial sum a reader or a solver takes of it is exact), else an error naming the file
    and the field."""
    checked_sum(np.asarray(a).reshape(-1), None, source, name)
    return a


class Writing(str):
    """The ``source`` a writer passes to its reader's checks, so that a writer refuses
    exactly what its reader would refuse, by running the very same checks on what it is
    about to write: errors then name the writer and the parameter a field came from
    (``params``: field name -> parameter name) instead of a file and its field.

    >>> str(field_error(Writing("write_x", {"map": "placement"}), "map", "ids >= 0", "-1"))
    "The 'placement' parameter of write_x must be ids >= 0. Got -1 instead (its reader refuses it)."
    """

    params: dict
    default: str | None

    def __new__(cls, func: str, params: dict | None = None, default: str | None = None):
        self = super().__new__(cls, func)
        self.params = dict(params or {})
        self.default = default
        return self

    def name(self, field_name: str) -> str:
        """The writer's parameter behind ``field_name`` (``default``, else the field name
        itself, if none is listed)."""
        return self.params.get(field_name, self.default or field_name)


def at_record(source, i: int):
    """``source`` narrowed to record ``i`` of a file (a :class:`Writing` stays one)."""
    if isinstance(source, Writing):
        return Writing(f"{source} (record {i})", source.params, source.default)
    return f"{source} (record {i})"


def field_error(source: str, field_name: str, expected: str, got: str) -> InvalidInputError:
    """``The 'f' field of FILE must be EXPECTED. Got GOT instead.`` (the library's wording,
    with the file in place of the function; a :class:`Writing` source gives the writer's
    ``The 'param' parameter of FUNC ...``).

    >>> str(field_error("a.pt", "logical_count", "a 3-D array", "shape (2,)"))
    "The 'logical_count' field of a.pt must be a 3-D array. Got shape (2,) instead."
    """
    if isinstance(source, Writing):
        return InvalidInputError(
            f"The '{source.name(field_name)}' parameter of {source} must be {expected}. Got "
            f"{got} instead (its reader refuses it)."
        )
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
        func = "EngineLog"
        for name in ("engine", "kind"):
            if not isinstance(getattr(self, name), str):
                raise InvalidInputError(
                    f"The '{name}' parameter of {func} must be a string. Got "
                    f"{getattr(self, name)!r} instead."
                )
        E = check_int(self.n_experts, "n_experts", func, lo=1)
        object.__setattr__(self, "n_experts", E)
        if self.counts is None and self.physical_to_logical is None:
            raise InvalidInputError(
                f"{func} needs 'counts' or 'physical_to_logical' (or both). Got neither."
            )
        arrays = {
            "counts": dict(
                ndim=3,
                lo=0,
                expected=f"an (n_batches, n_layers, {E}) array of non-negative integers",
            ),
            "physical_to_logical": dict(
                ndim=2,
                lo=-1,
                hi=E - 1,
                expected=f"an (n_layers, P) array of expert ids in [-1, {E - 1}]",
            ),
            "layer_ids": dict(ndim=1, expected="a 1-D array of integers (one per layer)"),
            "batch_ids": dict(ndim=1, expected="a 1-D array of integers (one per batch)"),
        }
        for name, kw in arrays.items():
            v = getattr(self, name)
            if v is not None:
                v = check_array(v, name, func, kind="int", copy=True, readonly=True, **kw)
                object.__setattr__(self, name, v)
        c, m = self.counts, self.physical_to_logical
        if c is not None:
            if c.shape[2] != E:
                raise param_error("counts", func, f"{E} columns (n_experts)", f"shape {c.shape}")
            check_count_total(c, func, "counts")
        L = c.shape[1] if c is not None else m.shape[0]
        if m is not None and m.shape[0] != L:
            raise param_error(
                "physical_to_logical", func, f"{L} rows (the layers of counts)", f"shape {m.shape}"
            )
        if self.layer_ids is None:
            ids = np.arange(L, dtype=np.int64)
            ids.setflags(write=False)
            object.__setattr__(self, "layer_ids", ids)
        elif self.layer_ids.size != L or np.unique(self.layer_ids).size != L:
            raise param_error(
                "layer_ids", func, f"{L} distinct layer ids", f"{self.layer_ids.tolist()[:8]}"
            )
        if self.batch_ids is not None and (c is None or self.batch_ids.size != c.shape[0]):
            raise param_error(
                "batch_ids",
                func,
                "one id per batch of counts",
                f"{self.batch_ids.size} ids for {0 if c is None else c.shape[0]} batches",
            )
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


def _tensor_numpy(x):
    if getattr(x, "is_nested", False):
        raise InvalidInputError(
            "A nested (ragged) tensor was found where a dense tensor was expected: the "
            "engines save dense tensors."
        )
    if getattr(getattr(x, "device", None), "type", None) == "meta":
        raise InvalidInputError(
            f"A tensor on the 'meta' device (shape {tuple(x.shape)}) holds no data."
        )
    if getattr(x, "is_sparse", False) or str(getattr(x, "layout", "")) != "torch.strided":
        raise InvalidInputError(
            f"A {x.layout} tensor (shape {tuple(x.shape)}) was found where a dense tensor was "
            "expected: the engines save dense tensors (convert it with .to_dense())."
        )
    try:
        x = x.detach().cpu()
    except Exception as exc:  # noqa: BLE001 - torch's tensor kinds are open-ended
        raise InvalidInputError(
            f"A {type(x).__name__} of dtype {x.dtype} cannot be read as numbers: {str(exc)[:120]}."
        ) from None
    name = str(x.dtype)
    if "bfloat16" in name or "float8" in name or "float16" in name:
        x = x.float()  # numpy has no bfloat16 / float8; float32 holds every value exactly
    try:
        return x.numpy()
    except Exception as exc:  # noqa: BLE001 - torch's tensor kinds are open-ended
        raise InvalidInputError(
            f"A tensor of dtype {x.dtype} (shape {tuple(x.shape)}) cannot be read as numbers: "
            f"{str(exc)[:120]}."
        ) from None


def to_numpy(x):
    """torch tensors (any device) to numpy, recursively through dicts, lists and tuples.

    bfloat16, float16 and float8 tensors become float32 (exact); sparse or other
    non-strided tensors are refused."""
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        return _tensor_numpy(x)
    if isinstance(x, dict):
        return {k: to_numpy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(to_numpy(v) for v in x)
    return x


def check_zip_members(path, what: str) -> None:
    """Refuse a zip archive (a torch file, an ``.npz``) whose members do not match their
    CRC-32 checksums: a flipped bit or a torn write. The readers built on zip do not look
    (``torch.load`` reads a damaged payload as data); this reads every member once.
    Files that are not zip archives are left to their reader."""
    src = source_name(path)
    try:
        if not zipfile.is_zipfile(src):
            return
        with zipfile.ZipFile(src) as z:
            bad = z.testzip() or _zip_record_damage(src, z)
    except OSError as exc:
        raise read_error(src, exc) from None
    except Exception as exc:  # noqa: BLE001 - BadZipFile, zlib.error, EOFError, ...
        raise InvalidInputError(
            f"{src} is a damaged {what} ({type(exc).__name__}: {str(exc)[:120]})."
        ) from None
    if bad is not None:
        raise InvalidInputError(
            f"{src} is a damaged {what}: the CRC-32 checksum of its member {bad!r} does not "
            "match its bytes (a flipped bit or a partial write)."
        )


def _zip_record_damage(src: str, z: zipfile.ZipFile) -> str | None:
    """The first member whose central-directory record is damaged where the CRC does not
    reach, else None: a 32-bit size or offset that disagrees with its ZIP64 extra field
    (zipfile reads the extra field, torch's miniz the 32-bit value where it is not
    ``0xFFFFFFFF``), or a file flagged as a folder (MS-DOS attribute ``0x10``, which
    miniz then reads as empty). Either way torch would read bytes other than the ones
    whose checksum was checked."""
    with open(src, "rb") as f:
        f.seek(z.start_dir)
        for info in z.infolist():
            if info.external_attr & 0x10 and not info.filename.endswith("/"):
                return info.filename
            rec = f.read(zipfile.sizeCentralDir)
            if len(rec) < zipfile.sizeCentralDir:
                return info.filename
            fields = zipfile.struct.unpack(zipfile.structCentralDir, rec)
            csize, usize, offset = fields[10], fields[11], fields[18]
            for raw, parsed in (
                (csize, info.compress_size),
                (usize, info.file_size),
                (offset, info.header_offset),
            ):
                if raw != 0xFFFFFFFF and raw != parsed:
                    return info.filename
            f.seek(fields[12] + fields[13] + fields[14], os.SEEK_CUR)
    return None


def load_pt(path):
    """``torch.load(path, weights_only=True, map_location="cpu")`` with tensors as numpy.

    ``map_location="cpu"``: SGLang saves some tensors straight from the GPU. Any failure
    (not a torch file, truncated, a disallowed pickle global) is one InvalidInputError. The
    archive's checksums are checked first (:func:`check_zip_members`): ``torch.load``
    itself reads a flipped bit in a tensor as data. (A torch file in the legacy, non-zip
    format carries no checksum.)
    """
    torch = _torch(f"Reading {source_name(path)}")
    require_file(path)
    check_zip_members(path, "torch file")
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
    except OSError as exc:
        raise read_error(path, exc) from None
    except Exception as exc:  # noqa: BLE001 - torch's failure modes are open-ended
        raise InvalidInputError(
            f"{source_name(path)} is not a readable torch file "
            f"(torch.load(weights_only=True) failed: {type(exc).__name__}: {str(exc)[:200]})."
        ) from None
    try:
        return to_numpy(obj)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{source_name(path)}: {exc}") from None


def save_pt(obj, path) -> None:
    """``torch.save`` with numpy arrays (recursively) turned into tensors first (atomic:
    a temporary file renamed over ``path``)."""
    torch = _torch(f"Writing {source_name(path)}")

    def conv(x):
        if isinstance(x, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(x))
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(conv(v) for v in x)
        return x

    data = conv(obj)
    with atomic_path(path) as tmp:
        try:
            torch.save(data, tmp)
        except OSError:
            raise  # atomic_path names the file
        except Exception as exc:  # noqa: BLE001 - torch reports a failed write as RuntimeError
            raise write_error(path, exc) from None


def load_json(path_or_text, *, inline: bool = False):
    """JSON from a file (or, with ``inline=True``, from the text itself)."""
    where = "the inline JSON" if inline else source_name(path_or_text)
    try:
        if inline:
            return json.loads(path_or_text)
        require_file(path_or_text)
        with open(path_or_text, encoding="utf-8") as f:
            return json.load(f)
    except OSError as exc:
        raise read_error(path_or_text, exc) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as exc:
        raise InvalidInputError(f"{where} is not valid JSON: {str(exc)[:200]}.") from None


def save_json(obj, path) -> None:
    """JSON with numpy arrays as nested lists (atomic; NaN and infinities refused, since
    JSON cannot store them)."""

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

    try:
        text = json.dumps(conv(obj), allow_nan=False)
    except ValueError:
        raise InvalidInputError(
            f"Cannot write {source_name(path)}: JSON cannot store NaN or infinite values."
        ) from None
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


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
    """A safetensors file as ``{name: ndarray}`` (no torch needed).

    safetensors checks that its header is valid JSON and that the tensors it lists cover
    the data exactly (a truncated or extended file is refused); it has no checksum, so a
    flipped bit inside a tensor's bytes cannot be detected."""
    stn = _safetensors(f"Reading {source_name(path)}")
    require_file(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise read_error(path, exc) from None
    try:
        return dict(stn.load(data))
    except Exception as exc:  # noqa: BLE001 - SafetensorError and friends
        raise InvalidInputError(
            f"{source_name(path)} is not a readable safetensors file "
            f"({type(exc).__name__}: {str(exc)[:200]})."
        ) from None


def save_safetensors(tensors: dict, path) -> None:
    """``{name: ndarray}`` as a safetensors file (the bytes ``safetensors.torch`` writes;
    atomic)."""
    stn = _safetensors(f"Writing {source_name(path)}")
    data = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        try:
            stn.save_file(data, tmp)
        except OSError:
            raise  # atomic_path names the file
        except Exception as exc:  # noqa: BLE001 - SafetensorError on a failed write
            raise write_error(path, exc) from None


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
    if isinstance(source, Writing):
        a = check_array(
            value, source.name(name), source, kind=kind, ndim=ndim, lo=lo, hi=hi, expected=expected
        )
    else:
        try:
            a = check_array(
                value, name, source, kind=kind, ndim=ndim, lo=lo, hi=hi, expected=expected
            )
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


def check_every_expert_placed(m, n_experts: int, source: str, name: str, layer_ids=None):
    """``m`` unchanged when every expert ``0..n_experts-1`` has a slot in every row of the
    ``(n_layers, P)`` map ``m``, else an error naming the first expert without one.

    The engines route every logical expert to one of its slots: SGLang draws among an
    expert's slots (``compute_logical_to_rank_dispatch_physical_map`` divides by their
    number, ``expert_location.py``), vLLM indexes ``logical_to_physical_map`` by
    ``hash % logical_replica_count`` (``fused_moe/router/base_router.py``, an expert with
    none gets slot ``-1``: its tokens are lost), TensorRT-LLM and DeepSeek EPLB give every
    expert at least one replica. A map leaving an expert out is not a placement any of
    them serves.
    """
    m = np.asarray(m)
    L = m.shape[0]
    key = np.where(m >= 0, np.arange(L)[:, None] * n_experts + m, L * n_experts)
    count = np.bincount(key.ravel(), minlength=L * n_experts + 1)[: L * n_experts]
    missing = np.flatnonzero(count == 0)
    if missing.size:
        layer, e = divmod(int(missing[0]), n_experts)
        layer = layer if layer_ids is None else int(layer_ids[layer])
        raise field_error(
            source,
            name,
            f"a placement giving every expert 0..{n_experts - 1} a slot in every layer (the "
            "engines route each expert to one of its slots)",
            f"no slot for expert {e} in layer {layer}",
        )
    return m


def fold_physical_counts(
    physical_counts,
    physical_to_logical,
    n_experts: int,
    *,
    source: str = "fold_physical_counts",
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
    if isinstance(n_experts, (bool, np.bool_)) or not isinstance(n_experts, (int, np.integer)):
        raise InvalidInputError(
            "The 'n_experts' parameter of fold_physical_counts must be an integer >= 1. Got "
            f"{n_experts!r} instead."
        )
    n_experts = int(n_experts)
    if n_experts < 1:
        raise InvalidInputError(
            "The 'n_experts' parameter of fold_physical_counts must be an integer >= 1. Got "
            f"{n_experts} instead."
        )
    m = check_physical_to_logical(physical_to_logical, source, "physical_to_logical")
    L, P = m.shape
    if m.max() >= n_experts:
        raise field_error(
            source,
            "physical_to_logical",
            f"expert ids below n_experts={n_experts}",
            f"id {int(m.max())}",
        )
    c = field_array(
        physical_counts,
        source,
        name,
        ndim=range(2, 33),
        lo=0,
        expected=f"a non-negative integer array of shape (..., {L}, {P})",
    )
    check_count_total(c, source, name)
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


_RANK_RE = re.compile(r"rank[_-]?([0-9]+)", re.ASCII)


def rank_of(path) -> int | None:
    """The rank in a file name (``rank3``, ``rank_3``, ``..._3.pt`` is not a rank name)."""
    found = _RANK_RE.findall(os.path.basename(os.fspath(path)))
    return int(found[-1]) if found else None
