"""``TablePublisher``: the live replica-probability table, published without double buffering.

TEMPO §4.4, "consistency without double buffering": the dispatch kernel reads one
``[L, E, X]`` probability table that lives on the device for the engine's whole life (its
address is what a CUDA graph captures). New tables are staged in pinned host memory and
published with one host-to-device copy while the engine keeps dispatching. What makes the
race harmless:

* every row the publisher ever writes is a valid distribution over the listed replicas, and
  every ``-1`` column is zero in every table, so an element-wise mixture of two tables (what a
  read racing the copy sees) is non-negative and zero off the replicas;
* :func:`~straggler.runtime.dispatch_and_count` renormalises each row at use and falls back
  to uniform over the listed replicas when a mixture sums to zero;
* rows of experts idle in the solved window are left as they are (the staging buffer keeps
  the last published values, so the copy rewrites them with identical bytes).

A torn update therefore costs one batch a stale or uniform split; it can never route a token
to a replica that lacks its expert, nor divide by zero.
"""

from __future__ import annotations

import threading

import numpy as np

from ..formulations.errors import InvalidInputError, param_error
from ..formulations.validation import check_array, check_int
from .dispatch_count import _is_tensor, _require_torch
from .engines._common import to_numpy

__all__ = ["TablePublisher", "uniform_table", "normalize_table"]


def _log2phy_iv(log2phy, func: str) -> np.ndarray:
    return check_array(
        _host(log2phy, "log2phy", func),
        "log2phy",
        func,
        kind="int",
        ndim=range(1, 4),
        lo=-1,
        expected="an integer array (..., X) with entries >= -1 (-1: padding)",
    )


def uniform_table(log2phy) -> np.ndarray:
    """The uniform split over each expert's listed replicas (``-1`` columns zero), float32.

    Examples
    --------
    >>> uniform_table(np.array([[[0, 2], [1, -1]]])).tolist()
    [[[0.5, 0.5], [1.0, 0.0]]]
    """
    listed = _log2phy_iv(log2phy, "uniform_table") >= 0
    k = listed.sum(axis=-1, keepdims=True)
    return np.where(listed, 1.0 / np.maximum(k, 1), 0.0).astype(np.float32)


def normalize_table(probs, log2phy) -> np.ndarray:
    """Rows made valid for publication: ``-1`` columns zeroed, each row divided by its sum,
    a row without positive weight replaced by the uniform split (float64).

    Examples
    --------
    >>> normalize_table([[[2.0, 6.0], [0.0, 5.0]]], [[[0, 2], [1, -1]]]).tolist()
    [[[0.25, 0.75], [1.0, 0.0]]]
    """
    l2p = _log2phy_iv(log2phy, "normalize_table")
    probs = check_array(
        _host(probs, "probs", "normalize_table"),
        "probs",
        "normalize_table",
        kind="real",
        ndim=l2p.ndim,
        shape=l2p.shape,
        lo=0,
        expected=f"an array of finite numbers >= 0 of log2phy's shape {l2p.shape}",
    )
    p = np.where(l2p >= 0, probs, 0.0)
    # Scale each row by its largest entry first: a row of huge finite weights (two 1e308)
    # would otherwise sum to infinity and normalise to zeros.
    top = p.max(axis=-1, keepdims=True)
    p = p / np.where(top > 0, top, 1.0)
    s = p.sum(axis=-1, keepdims=True)
    uniform = uniform_table(l2p).astype(np.float64)
    return np.where(s > 0, p / np.where(s > 0, s, 1.0), uniform)


def _host(x, name: str, func: str):
    """A torch tensor as a numpy array (any device; bfloat16 and other float kinds numpy
    lacks become float32, exactly), or ``x`` unchanged; a tensor without numbers to read (on
    the ``meta`` device, sparse, nested) is an error naming the parameter."""
    if not _is_tensor(x):
        return x
    try:
        return to_numpy(x)
    except InvalidInputError as exc:
        raise InvalidInputError(
            f"The '{name}' parameter of {func} must be a dense tensor holding data. {exc}"
        ) from None


class TablePublisher:
    """The live ``(log2phy, probs)`` tables of an engine, ``[L, E, X]`` each, on its device.

    Parameters
    ----------
    log2phy : array_like or torch.Tensor of int, shape (n_layers, n_experts, X)
        Physical slots of each expert's replicas, ``-1`` padded (EPLB's
        ``logical_to_physical_map``; the columns of every table published here).
    probs : array_like, shape (n_layers, n_experts, X), optional
        The first table (normalised as :meth:`publish` does). Default: uniform over each
        expert's replicas.
    device : str or torch.device, optional
        Where the live tables live. Default: the current CUDA device when there is one,
        else the CPU.

    Attributes
    ----------
    log2phy : torch.Tensor, int64, (n_layers, n_experts, X)
    probs : torch.Tensor, float32, (n_layers, n_experts, X)
        The live table. Its storage never changes (a captured graph may hold its address);
        :meth:`publish` overwrites it in place.
    version : int
        Number of tables published so far (0 for the initial one).

    Notes
    -----
    When the device is CUDA the staging buffer is pinned and the copy is issued on a side
    stream, so the engine's stream never waits for it; the next :meth:`publish` waits (on the
    publisher's thread) until the previous copy has read the staging buffer. Publishers are
    serialised among themselves by a lock; readers are never locked out.

    Examples
    --------
    >>> pub = TablePublisher(np.array([[[0, 2], [1, -1]]]), device="cpu")  # doctest: +SKIP
    >>> pub.probs[0].tolist()  # doctest: +SKIP
    [[0.5, 0.5], [1.0, 0.0]]
    >>> pub.publish([[[3.0, 1.0], [9.0, 9.0]]])  # doctest: +SKIP
    1
    >>> pub.probs[0].tolist()  # doctest: +SKIP
    [[0.75, 0.25], [1.0, 0.0]]
    >>> pub.publish([[[0.0, 1.0], [1.0, 0.0]]], rows=[[False, True]])  # doctest: +SKIP
    2
    >>> pub.probs[0, 0].tolist()  # doctest: +SKIP
    [0.75, 0.25]

    (The examples need torch; ``tests/test_runtime_publisher.py`` runs them.)
    """

    def __init__(self, log2phy, probs=None, *, device=None):
        torch = _require_torch()
        func = "TablePublisher"
        l2p = check_array(
            _host(log2phy, "log2phy", func),
            "log2phy",
            func,
            kind="int",
            ndim=3,
            lo=-1,
            expected="an (n_layers, n_experts, X) integer array with entries >= -1 (-1: padding)",
        )
        if min(l2p.shape) < 1:
            raise param_error(
                "log2phy", func, "an (n_layers, n_experts, X >= 1) array", f"shape {l2p.shape}"
            )
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise param_error("device", func, "a torch device", repr(device)) from None
        if device.type == "cuda":
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if n == 0 or (device.index is not None and device.index >= n):
                raise param_error(
                    "device",
                    func,
                    f"an available device (CUDA devices here: {n})",
                    repr(str(device)),
                )
        elif device.type == "meta":
            raise param_error(
                "device", func, "a device that holds data (not 'meta')", repr(str(device))
            )
        elif device.type != "cpu":
            try:
                torch.empty(1, device=device)
            except (RuntimeError, ValueError, TypeError, AssertionError):
                raise param_error(
                    "device", func, "an available torch device", repr(str(device))
                ) from None
        self._torch = torch
        self._l2p = l2p
        self._listed = l2p >= 0
        self._lock = threading.Lock()
        self.device = device
        self.log2phy = torch.as_tensor(l2p, device=device)
        cuda = device.type == "cuda"
        self._staged = torch.empty(l2p.shape, dtype=torch.float32, pin_memory=cuda)
        self._host_view = self._staged.numpy()
        self._stream = torch.cuda.Stream(device) if cuda else None
        self._event = None
        first = uniform_table(l2p) if probs is None else self._valid(probs, "probs", func)
        self._host_view[...] = first
        self.probs = torch.empty(l2p.shape, dtype=torch.float32, device=device)
        self.probs.copy_(self._staged)
        self.version = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(n_layers, n_experts, X)``."""
        return tuple(self._listed.shape)

    def layer(self, l: int):
        """``(log2phy[l], probs[l])``: the live views :func:`dispatch_and_count` reads."""
        l = check_int(l, "l", "TablePublisher.layer", lo=0, hi=self.shape[0] - 1)
        return self.log2phy[l], self.probs[l]

    def _valid(self, probs, name, func) -> np.ndarray:
        p = check_array(
            _host(probs, name, func),
            name,
            func,
            kind="real",
            ndim=3,
            shape=self._listed.shape,
            lo=0,
            expected=f"an array of shape {self._listed.shape} of finite numbers >= 0",
        )
        return self._normalized(p, self._l2p)

    @staticmethod
    def _normalized(p, l2p) -> np.ndarray:
        """Rows normalised as float32, each a distribution over its listed columns (rows
        that float32 rounding would leave without weight become uniform)."""
        out = normalize_table(p, l2p).astype(np.float32)
        dead = out.sum(axis=-1) <= 0
        if dead.any():
            out[dead] = uniform_table(l2p)[dead]
        return out

    def publish(self, probs, *, rows=None) -> int:
        """Publish a new table with one copy into the live tensor; returns the new version.

        Parameters
        ----------
        probs : array_like or torch.Tensor, shape (n_layers, n_experts, X)
            Non-negative finite weights in the columns of ``log2phy`` (rows are
            normalised; weight on ``-1`` columns is dropped; a row without weight becomes
            uniform). The solver worker's tables come this way.
        rows : array_like of bool, shape (n_layers, n_experts), optional
            Rows to update (default all): pass the experts active in the solved window, so
            idle experts keep their rows.
        """
        func = "TablePublisher.publish"
        new = self._valid(probs, "probs", func)
        if rows is None:
            mask = np.ones(self._listed.shape[:2], dtype=bool)
        else:
            mask = check_array(
                _host(rows, "rows", func),
                "rows",
                func,
                kind="bool",
                ndim=2,
                shape=self._listed.shape[:2],
            )
        with self._lock:
            if self._event is not None:
                self._event.synchronize()  # the previous copy has read the staging buffer
            self._host_view[mask] = new[mask]
            if self._stream is not None:
                torch = self._torch
                with torch.cuda.stream(self._stream):
                    self.probs.copy_(self._staged, non_blocking=True)
                    self._event = torch.cuda.Event()
                    self._event.record(self._stream)
            else:
                self.probs.copy_(self._staged)
            self.version += 1
            return self.version

    def reset(self, log2phy, probs=None) -> None:
        """Replace the placement after an EPLB rebalance (TEMPO App. D, patch point 5).

        The shape must stay the same (captured graphs hold the tensors); the tables are
        rewritten in place. Not safe against a concurrent dispatch: call it where the engine
        rearranges expert weights, which already quiesces the layers.
        """
        func = "TablePublisher.reset"
        l2p = check_array(
            _host(log2phy, "log2phy", func),
            "log2phy",
            func,
            kind="int",
            ndim=3,
            shape=self._listed.shape,
            lo=-1,
        )
        # Everything is checked before anything changes: a bad table leaves the old state.
        if probs is None:
            first = uniform_table(l2p)
        else:
            p = check_array(
                _host(probs, "probs", func),
                "probs",
                func,
                kind="real",
                ndim=3,
                shape=self._listed.shape,
                lo=0,
                expected=f"an array of shape {self._listed.shape} of finite numbers >= 0",
            )
            first = self._normalized(p, l2p)
        with self._lock:
            if self._event is not None:
                self._event.synchronize()
            self._l2p = l2p
            self._listed = l2p >= 0
            self.log2phy.copy_(self._torch.as_tensor(l2p))
            self._host_view[...] = first
            self.probs.copy_(self._staged)
            self.version += 1

    def snapshot(self) -> np.ndarray:
        """A host copy of the live table (float32), for monitoring and tests."""
        return self.probs.detach().cpu().numpy().copy()

    def __repr__(self) -> str:
        L, E, X = self.shape
        return (
            f"TablePublisher(n_layers={L}, n_experts={E}, X={X}, device={self.device}, "
            f"version={self.version})"
        )
