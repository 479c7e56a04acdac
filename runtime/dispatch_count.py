"""``dispatch_and_count``: map each token's logical expert to a physical replica and count the
tokens per expert, in one pass (TEMPO §4.4, "in-graph: one fused kernel, total").

The replica choice is stratified, not sampled: the ``r``-th token of expert ``e`` in the batch
(flat order over ``[n_tok, K]``) goes to the replica whose slice of the cumulative shares
contains ``(r + o_e) / n_e``, so each replica receives its share of the batch's ``n_e`` tokens
to within one token, with no random state. The exact rule, its arithmetic and why it needs
the batch counts are in :mod:`straggler.runtime._dispatch_kernels`.
"""

from __future__ import annotations

import importlib.util
import sys

import numpy as np

from ..formulations.errors import BackendUnavailableError, InvalidInputError, param_error
from ..formulations.validation import check_array, check_bool, check_choice, check_int, describe

__all__ = ["dispatch_and_count", "BACKENDS", "torch_available", "triton_available"]

#: Implementations ``dispatch_and_count`` can run: the fused Triton kernel, the pure torch
#: reference and the plain-Python reference (numpy arrays).
BACKENDS = ("auto", "triton", "torch", "reference")

_FUNC = "dispatch_and_count"
_MAX_ENTRIES = 2**31 - 1


def torch_available() -> bool:
    """Whether torch can be imported (the ``runtime`` extra)."""
    return importlib.util.find_spec("torch") is not None


def triton_available() -> bool:
    """Whether triton can be imported (the ``runtime`` extra, Linux)."""
    return importlib.util.find_spec("triton") is not None


def _require_torch():
    if not torch_available():
        raise BackendUnavailableError(
            "dispatch_and_count needs torch for tensors; install the 'runtime' extra: "
            "pip install 'straggler[runtime]'."
        )
    import torch

    return torch


def _is_tensor(x) -> bool:
    """Whether ``x`` is a torch tensor, without importing torch (a tensor implies it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _dispatch_and_count_iv(topk_ids, log2phy, probs, seed, backend, counter, nvalid, check):
    seed = check_int(seed, "seed", _FUNC, lo=0)
    backend = check_choice(backend, "backend", _FUNC, BACKENDS)
    check = check_bool(check, "check", _FUNC)
    tensors = [_is_tensor(x) for x in (topk_ids, log2phy, probs)]
    if any(tensors) and not all(tensors):
        names = ("topk_ids", "log2phy", "probs")
        kinds = ", ".join(
            f"{n}: {'tensor' if t else type(x).__name__}"
            for n, t, x in zip(names, tensors, (topk_ids, log2phy, probs))
        )
        raise InvalidInputError(
            f"The 'topk_ids', 'log2phy' and 'probs' parameters of {_FUNC} must be all torch "
            f"tensors or all numpy arrays. Got {kinds} instead."
        )
    if all(tensors):
        return _tensor_iv(topk_ids, log2phy, probs, seed, backend, counter, nvalid, check)
    return _numpy_iv(topk_ids, log2phy, probs, seed, backend, counter, nvalid, check)


def _numpy_iv(topk_ids, log2phy, probs, seed, backend, counter, nvalid, check):
    if backend not in ("auto", "reference"):
        raise param_error(
            "backend",
            _FUNC,
            "'auto' or 'reference' for numpy inputs ('torch' and 'triton' need torch tensors)",
            repr(backend),
        )
    l2p = check_array(log2phy, "log2phy", _FUNC, kind="int", ndim=2, lo=-1, values=check)
    E, X = l2p.shape
    if E < 1 or X < 1:
        raise param_error(
            "log2phy", _FUNC, "an (n_experts >= 1, X >= 1) array", f"shape {l2p.shape}"
        )
    pr = check_array(
        probs,
        "probs",
        _FUNC,
        kind="real",
        ndim=2,
        shape=(E, X),
        lo=0,
        values=check,
        expected=f"an array of shape ({E}, {X}) (as log2phy) of finite numbers >= 0",
    )
    ids = check_array(
        topk_ids,
        "topk_ids",
        _FUNC,
        kind="int",
        ndim=(1, 2),
        lo=-1,
        hi=E - 1,
        values=check,
        expected=f"a 1-D or 2-D array of expert ids in [-1, {E - 1}] (-1: padding)",
    )
    if ids.size > _MAX_ENTRIES:
        raise param_error("topk_ids", _FUNC, f"at most {_MAX_ENTRIES} entries", f"{ids.size}")
    if counter is not None:
        if not (
            isinstance(counter, np.ndarray)
            and counter.shape == (E,)
            and counter.dtype in (np.int32, np.int64)
            and counter.flags.writeable
        ):
            raise param_error(
                "counter",
                _FUNC,
                f"a writeable int32 or int64 numpy array of shape ({E},)",
                describe(counter),
            )
    if nvalid is not None:
        nvalid = check_int(nvalid, "num_valid_tokens", _FUNC, lo=0)
    if check:
        rows = ids if nvalid is None else ids[:nvalid]
        _check_orphans(np.bincount(rows[rows >= 0], minlength=E) > 0, (l2p >= 0).any(axis=1))
    return "reference", ids, l2p, pr, seed, counter, nvalid


def _check_orphans(used, listed) -> None:
    orphan = np.flatnonzero(np.asarray(used) & ~np.asarray(listed))
    if orphan.size:
        raise InvalidInputError(
            f"The 'log2phy' parameter of {_FUNC} must list at least one replica (a slot >= 0) "
            f"for every expert in topk_ids. Got expert {int(orphan[0])} with tokens and no "
            "replica instead."
        )


def _tensor_iv(topk_ids, log2phy, probs, seed, backend, counter, nvalid, check):
    torch = _require_torch()
    ints = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
    if topk_ids.dtype not in ints or topk_ids.dim() not in (1, 2):
        raise param_error(
            "topk_ids",
            _FUNC,
            "a 1-D or 2-D integer tensor",
            f"a {topk_ids.dim()}-D tensor of dtype {topk_ids.dtype}",
        )
    if log2phy.dtype not in ints or log2phy.dim() != 2 or min(log2phy.shape) < 1:
        raise param_error(
            "log2phy",
            _FUNC,
            "an (n_experts >= 1, X >= 1) integer tensor",
            f"shape {tuple(log2phy.shape)} and dtype {log2phy.dtype}",
        )
    if not probs.is_floating_point() or tuple(probs.shape) != tuple(log2phy.shape):
        raise param_error(
            "probs",
            _FUNC,
            f"a floating tensor of shape {tuple(log2phy.shape)}",
            f"shape {tuple(probs.shape)} and dtype {probs.dtype}",
        )
    dev = topk_ids.device
    if log2phy.device != dev or probs.device != dev:
        raise param_error(
            "log2phy",
            _FUNC,
            f"on the device of topk_ids ({dev}), as probs",
            f"log2phy on {log2phy.device}, probs on {probs.device}",
        )
    if topk_ids.numel() > _MAX_ENTRIES:
        raise param_error(
            "topk_ids", _FUNC, f"at most {_MAX_ENTRIES} entries", f"{topk_ids.numel()}"
        )
    E = log2phy.shape[0]
    if counter is not None:
        ok = (
            _is_tensor(counter)
            and counter.dtype in (torch.int32, torch.int64)
            and tuple(counter.shape) == (E,)
            and counter.device == dev
            and counter.is_contiguous()
        )
        if not ok:
            raise param_error(
                "counter",
                _FUNC,
                f"a contiguous int32 or int64 tensor of shape ({E},) on {dev}",
                describe(counter),
            )
    if nvalid is not None:
        if _is_tensor(nvalid):
            if nvalid.numel() != 1 or nvalid.dtype not in ints or nvalid.device != dev:
                raise param_error(
                    "num_valid_tokens",
                    _FUNC,
                    f"an int >= 0 or a one-element integer tensor on {dev}",
                    describe(nvalid),
                )
        else:
            nvalid = torch.tensor(
                [check_int(nvalid, "num_valid_tokens", _FUNC, lo=0)], dtype=torch.int64, device=dev
            )
        if check and int(nvalid.reshape(()).item()) < 0:
            raise param_error(
                "num_valid_tokens", _FUNC, "an integer >= 0", f"{int(nvalid.reshape(()).item())}"
            )
    if check:
        flat = topk_ids.reshape(-1).to(torch.int64)
        if bool(((flat < -1) | (flat >= E)).any()):
            bad = flat[(flat < -1) | (flat >= E)][0].item()
            raise param_error(
                "topk_ids", _FUNC, f"expert ids in [-1, {E - 1}] (-1: padding)", f"value {bad}"
            )
        if bool((log2phy < -1).any()):
            raise param_error(
                "log2phy", _FUNC, "slots >= 0, or -1 for padding", f"value {log2phy.min().item()}"
            )
        if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()):
            raise param_error("probs", _FUNC, "finite and >= 0", "NaN, infinite or negative values")
        if nvalid is not None:
            row_len = topk_ids.shape[-1] if topk_ids.dim() == 2 else 1
            flat = flat[: int(nvalid.reshape(()).item()) * row_len]
        valid = flat[flat >= 0]
        used = (
            torch.zeros(E, dtype=torch.int64, device=dev).scatter_add_(
                0, valid, torch.ones_like(valid)
            )
            > 0
        )
        _check_orphans(used.cpu().numpy(), (log2phy >= 0).any(dim=1).cpu().numpy())
    if backend == "auto":
        backend = "triton" if dev.type == "cuda" and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise BackendUnavailableError(
                "dispatch_and_count(backend='triton') needs triton; install the 'runtime' "
                "extra on Linux: pip install 'straggler[runtime]'."
            )
        from ._dispatch_kernels import _interpreting

        if dev.type != "cuda" and not _interpreting():
            raise param_error(
                "backend",
                _FUNC,
                "'triton' only for CUDA tensors (or CPU tensors with TRITON_INTERPRET=1)",
                f"'triton' with tensors on {dev}",
            )
    return (
        backend,
        topk_ids.contiguous(),
        log2phy.contiguous(),
        probs.contiguous(),
        seed,
        counter,
        nvalid,
    )


def dispatch_and_count(
    topk_ids,
    log2phy,
    probs,
    *,
    seed=0,
    backend="auto",
    counter=None,
    num_valid_tokens=None,
    check=True,
):
    """Map logical expert ids to physical replicas (stratified) and count tokens per expert.

    Parameters
    ----------
    topk_ids : torch.Tensor or array_like of int, shape (n_tok, K) or (n,)
        Logical expert of each routed token slot; ``-1`` (the engines' padding) is never
        counted and maps to ``-1``.
    log2phy : torch.Tensor or array_like of int, shape (n_experts, X)
        Physical slot of each replica of each expert, ``-1`` padded (one layer of the
        ``logical_to_physical_map [L, E, X]`` layout).
    probs : torch.Tensor or array_like of float, shape (n_experts, X)
        Replica probabilities in the columns of ``log2phy`` (one layer of the live table).
        Rows are renormalised at use; a row with no positive weight on a listed column
        (a torn write) falls back to uniform over the listed replicas.
    seed : int >= 0, default 0
        Rotates each expert's stratification offset ``o_e`` (bits 0-23 are used): which
        ranks land on which replica, and so which replica takes a rounding extra. Same seed,
        same output; an engine may pass a step counter to decorrelate steps.
    backend : {"auto", "triton", "torch", "reference"}, default "auto"
        ``"triton"``: the fused kernel (CUDA tensors, or CPU tensors under
        ``TRITON_INTERPRET=1``); ``"torch"``: the pure torch reference (any device);
        ``"reference"``: plain Python on numpy arrays. ``"auto"``: triton on CUDA when
        installed, torch otherwise, the reference for numpy inputs. All give identical
        integer outputs.
    counter : torch.Tensor or numpy.ndarray of int32/int64, shape (n_experts,), optional
        A persistent cumulative counter incremented in place by ``counts`` in the same pass
        (TEMPO's cumulative counting: the window is recovered by differencing, see
        :func:`~straggler.runtime.window_delta`); int32 counters wrap modulo ``2**32``.
    num_valid_tokens : int or torch.Tensor, optional
        Token rows from this one on are padding (SGLang's ``num_token_non_padded``, a
        one-element device tensor under CUDA graphs, read in-kernel): never counted, mapped
        to ``-1``. Counting them would fabricate a phantom hot expert (TEMPO §4.4).
    check : bool, default True
        Check values (ids in range, no orphan expert, finite non-negative probs). On CUDA this
        synchronises the device: pass ``False`` on the hot path, where out-of-range ids and
        entries of an expert without a replica are treated as padding (mapped to ``-1``,
        not counted) and negative or non-finite probabilities as zero.

    Returns
    -------
    physical_ids : same type as ``topk_ids``, same shape
        Physical slot of each entry (``topk_ids``' dtype for tensors, int64 for arrays).
    counts : int64, shape (n_experts,)
        Valid entries per logical expert: exactly the entries mapped to a slot.

    Raises
    ------
    InvalidInputError
        Wrong shapes, dtypes, devices or (with ``check``) values.
    BackendUnavailableError
        ``backend="triton"`` without triton.

    Notes
    -----
    Per expert, replica ``j`` receives ``ceil(n C_j / S - o) - ceil(n C_{j-1} / S - o)`` of
    the expert's ``n`` tokens (cumulative weights ``C``, row sum ``S``), which differs from
    ``n * p_j / S`` by less than 1; a replica listed with probability zero receives nothing
    while a positive one exists; no token reaches a ``-1`` slot. The Triton kernel is one
    launch: count, rank and map in three phases over dynamically claimed tiles
    (``straggler.runtime._dispatch_kernels.dispatch_triton``). Rank order is the flat
    order of ``topk_ids``, so the output never depends on how the work is split.

    References
    ----------
    TEMPO §4.4 (fused dispatch + count, torn rows fall back to uniform).

    Examples
    --------
    Expert 0 has replicas in slots 0 and 2 with shares 3/4 and 1/4; expert 1 has one replica
    in slot 1. Four tokens of expert 0 split 3 to 1:

    >>> ids = np.array([[0, 1], [0, -1], [0, 1], [0, -1]])
    >>> l2p = np.array([[0, 2], [1, -1]])
    >>> p = np.array([[0.75, 0.25], [1.0, 0.0]])
    >>> phys, counts = dispatch_and_count(ids, l2p, p)
    >>> phys.tolist(), counts.tolist()
    ([[0, 1], [0, -1], [0, 1], [2, -1]], [4, 2])

    A torn row (all zero) falls back to uniform over the listed replicas:

    >>> phys, _ = dispatch_and_count(ids, l2p, np.array([[0.0, 0.0], [1.0, 0.0]]))
    >>> sorted(phys[:, 0].tolist())
    [0, 0, 2, 2]
    """
    backend, ids, l2p, pr, seed, counter, nvalid = _dispatch_and_count_iv(
        topk_ids, log2phy, probs, seed, backend, counter, num_valid_tokens, check
    )
    from . import _dispatch_kernels as k

    if backend == "reference":
        return k.dispatch_reference(ids, l2p, pr, seed, counter, nvalid)
    if backend == "torch":
        return k.dispatch_torch(ids, l2p, pr, seed, counter, nvalid)
    return k.dispatch_triton(ids, l2p, pr, seed, counter, nvalid)
