"""What a rearrangement costs: the weight copies a new placement needs, and their time.

A rearrangement from the placement in force (``old``, a ``physical_to_logical`` map) to a new
one copies, on every rank, each expert the rank holds after it and did not hold before: one
*copy* of one expert's weights (``expert_bytes``: a routed expert's three matrices, ``3 *
hidden * moe_intermediate`` parameters at the weights' dtype). An expert a rank keeps, in
whatever slot, needs no network transfer (vLLM's ``migration_scheduler.py``: "Existing local
copies need no transfer, even if their physical row changes").

**Which rank sends which copy** is vLLM 0.32's rule (``vllm/distributed/eplb/
migration_scheduler.py``, ``schedule_migration_batches``): for each expert in increasing
order, the ranks that gain it (in rank order) are dealt out to the ranks that held it (in
rank order), ``len(receivers) // len(senders)`` consecutive receivers to each sender and one
more to each of the first ``len(receivers) % len(senders)`` senders; the copies between one
ordered pair of ranks form one *flow*. An expert no active rank held (its ranks lost) is read
from host memory (a flow from ``HOST``).

**Rounds** (vLLM PR #52641, ``enable_migration_batching``): flows in their order of creation,
each into the first round in which neither of its ranks takes part yet (a first-fit edge
colouring: every rank talks to at most one peer per round).

**Time** (seconds; one MoE layer; a fluid model of full-duplex links, no per-message
latency): a flow between two ranks of one node moves at ``intra_gbps``, across nodes at
``inter_gbps``, from host memory at ``host_gbps`` (GB/s, 1e9 bytes per second, per GPU and
direction). All flows at once (``seconds``): each rank's time is, on each link class, the
larger of what it sends and what it receives over that class's bandwidth, the slowest class
setting the rank's time, and the layer's copies take the slowest rank's time. In rounds
(``batched_seconds``): the sum over rounds of the round's slowest flow. ``peers``: the most
distinct ranks one rank exchanges copies with, all flows at once (what per-flow fair
sharing of its link gives the copies against one more flow, the step's all-to-all:
:class:`MoveCost`).

References
----------
vLLM 0.32 ``vllm/distributed/eplb/migration_scheduler.py`` and ``rebalance_execute.py``;
vLLM PR #52641 ("[EPLB] Add contention-aware expert migration batching"); vLLM PR #43219
(asynchronous EPLB, the synchronous rearrangement's stall).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ....formulations.errors import param_error
from ....formulations.validation import check_array, check_choice, check_int, check_real

__all__ = [
    "HOST",
    "REBALANCE_MODES",
    "LINK_PRESETS",
    "DTYPE_BYTES",
    "MoveCost",
    "MigrationFlow",
    "LayerTransfer",
    "migration_batches",
    "layer_transfer",
    "expert_bytes",
]

#: The sender of a copy no active rank holds: host memory.
HOST = -1

#: How a rearrangement's copies run beside serving: ``"sync"``, every rank stops until the
#: copies land (vLLM ``use_async=False``, SGLang's ``EPLBManager.rebalance``); ``"async"``,
#: the copies run beside the steps, one layer's copies per step at most, each layer's new
#: placement taking effect when its copies land (vLLM's default since PR #43219);
#: ``"batched"``, asynchronous with vLLM PR #52641's rounds (each rank talks to at most one
#: peer at a time).
REBALANCE_MODES = ("sync", "async", "batched")

#: Link bandwidths per GPU and direction, GB/s: ``(intra-node, inter-node)``. ``"h100"``:
#: NVLink 4 (900 GB/s bidirectional, H100 SXM datasheet) and one 400 Gb/s ConnectX-7 NIC per
#: GPU (50 GB/s); ``"h800"``: the H800's NVLink (400 GB/s bidirectional) and the same NIC
#: (DeepSeek-V3 technical report, §3.1: 400 Gb/s InfiniBand per GPU); ``"gb200_nvl72"``:
#: NVLink 5 (1.8 TB/s bidirectional), every GPU of the 72-GPU NVLink domain one "node" away
#: at the same bandwidth.
LINK_PRESETS = {"h100": (450.0, 50.0), "h800": (200.0, 50.0), "gb200_nvl72": (900.0, 900.0)}

#: Bytes per parameter of the weight dtypes a model preset names.
DTYPE_BYTES = {"fp8": 1.0, "bf16": 2.0, "fp16": 2.0, "fp32": 4.0}


def expert_bytes(hidden: int, moe_intermediate: int, dtype: str) -> float:
    """Bytes of one routed expert's weights: gate, up and down projections, ``3 * hidden *
    moe_intermediate`` parameters at ``dtype`` (block-quantization scales left out: under
    0.1% for 128 x 128 fp8 blocks).

    Examples
    --------
    >>> expert_bytes(7168, 2048, "fp8") / 1e6            # DeepSeek-V3
    44.040192
    """
    func = "expert_bytes"
    h = check_int(hidden, "hidden", func, lo=1)
    i = check_int(moe_intermediate, "moe_intermediate", func, lo=1)
    d = check_choice(dtype, "dtype", func, sorted(DTYPE_BYTES))
    return 3.0 * h * i * DTYPE_BYTES[d]


@dataclass(frozen=True, kw_only=True)
class MoveCost:
    """The price of a rearrangement's weight copies.

    Parameters
    ----------
    expert_bytes : float
        Bytes of one expert's weights in one layer (:func:`expert_bytes`).
    links : str, default "h100"
        A key of :data:`LINK_PRESETS`, the default of the two bandwidths below.
    intra_gbps, inter_gbps : float, optional
        GB/s per GPU and direction within a node and across nodes (default: the preset's).
    host_gbps : float, default 50
        GB/s from host memory (a copy whose expert no active rank holds; PCIe 5 x16, 64 GB/s
        nominal per direction).
    mode : {"sync", "async", "batched"}, default "sync"
        :data:`REBALANCE_MODES`.

    Notes
    -----
    How the simulator charges a rearrangement's layers (one MoE layer's copies priced by
    :func:`layer_transfer`; ``T`` its ``seconds``, or ``batched_seconds`` in rounds):

    * ``"sync"``: every rank stalls for ``T`` per layer, layer after layer (vLLM's
      ``rearrange_expert_weights_inplace`` loops over the layers), plus the planning when it
      runs on the critical path.
    * ``"async"`` / ``"batched"``: one layer's copies at a time, one layer per step at most
      (vLLM's async worker hands the main thread one layer per forward pass). The copies share
      the busiest rank's link with the step's all-to-all (``M`` seconds of a step of ``S``):
      they use the link while it is idle (``S - M``), and during the all-to-all per-flow fair
      sharing gives the copies ``k / (k + 1)`` of it (``k = peers``; ``1`` in rounds), so the
      all-to-all takes ``(k + 1) M``: a step that still has ``R`` seconds of copies when its
      idle time is used up is delayed by ``min(k M, R - (S - M))``, work-conserving: each
      second of copies beyond the idle link delays the step by one second, up to ``k M``.
      Rounds lower the worst delay (``M`` instead of ``k M``) and copy longer; what PR
      #52641 measured beyond that (NIC incast, +1.6 to +3.6% throughput) a fluid model does
      not see.

    Examples
    --------
    >>> m = MoveCost(expert_bytes=44e6)
    >>> m.intra_gbps, m.inter_gbps, m.mode
    (450.0, 50.0, 'sync')
    """

    expert_bytes: float
    links: str = "h100"
    intra_gbps: float | None = None
    inter_gbps: float | None = None
    host_gbps: float = 50.0
    mode: str = "sync"

    def __post_init__(self) -> None:
        func = "MoveCost"
        b = check_real(self.expert_bytes, "expert_bytes", func, lo=0, lo_open=True)
        object.__setattr__(self, "expert_bytes", b)
        links = check_choice(self.links, "links", func, sorted(LINK_PRESETS))
        object.__setattr__(self, "links", links)
        intra, inter = LINK_PRESETS[links]
        for name, default in (("intra_gbps", intra), ("inter_gbps", inter)):
            v = getattr(self, name)
            v = default if v is None else check_real(v, name, func, lo=0, lo_open=True)
            object.__setattr__(self, name, float(v))
        h = check_real(self.host_gbps, "host_gbps", func, lo=0, lo_open=True)
        object.__setattr__(self, "host_gbps", h)
        object.__setattr__(self, "mode", check_choice(self.mode, "mode", func, REBALANCE_MODES))


class MigrationFlow(NamedTuple):
    """The copies from one rank (or :data:`HOST`) to another in one layer, experts increasing."""

    src: int
    dst: int
    experts: tuple


class LayerTransfer(NamedTuple):
    """One layer's copies (:func:`layer_transfer`): ``copies`` experts copied to a rank that did
    not hold them, ``bytes`` their size, ``seconds`` all at once, ``batched_seconds`` in
    vLLM's rounds, ``rounds``, ``peers`` (the most ranks one rank exchanges copies with)."""

    copies: int
    bytes: float
    seconds: float
    batched_seconds: float
    rounds: int
    peers: int


def _row_iv(row, name, func, width=None):
    r = check_array(row, name, func, ndim=1, kind="int", lo=-1)
    if width is not None and r.shape[0] != width:
        raise param_error(name, func, f"a row of {width} slots like 'old'", f"{r.shape[0]} slots")
    return r


def migration_batches(old, new, n_gpus: int, active=None) -> list[list[MigrationFlow]]:
    """The copies of one layer as flows in rounds: vLLM 0.32's ``schedule_migration_batches``
    (module notes), with ranks not in ``active`` neither sending nor receiving.

    Parameters
    ----------
    old, new : array_like of int, shape (P,)
        The slot maps before and after (``-1``: an empty slot); slot ``p`` on rank
        ``p // (P / n_gpus)``.
    n_gpus : int
        Ranks; divides ``P``.
    active : array_like of bool, shape (n_gpus,), optional
        Ranks that hold weights now (default all); an inactive rank's old experts are gone,
        and an expert no active rank held is sent by :data:`HOST`.

    Returns
    -------
    list of list of MigrationFlow
        The rounds; in each, no rank appears in two flows.

    Examples
    --------
    >>> migration_batches([0, 1, 2, 3], [0, 2, 1, 3], 2)  # a swap: two rounds
    [[MigrationFlow(src=0, dst=1, experts=(1,))], [MigrationFlow(src=1, dst=0, experts=(2,))]]
    >>> migration_batches([0, 1, 2, 3], [0, 2, 1, 3], 2, active=[True, False])[0]
    [MigrationFlow(src=-1, dst=0, experts=(2,))]
    """
    func = "migration_batches"
    o = _row_iv(old, "old", func)
    n = _row_iv(new, "new", func, o.shape[0])
    G = check_int(n_gpus, "n_gpus", func, lo=1)
    if o.shape[0] % G:
        raise param_error("n_gpus", func, f"a divisor of the {o.shape[0]} slots", repr(n_gpus))
    act = np.ones(G, dtype=bool)
    if active is not None:
        act = check_array(active, "active", func, ndim=1, kind="bool", shape=(G,)).astype(bool)
    return _batches(o, n, G, act)


def _batches(old: np.ndarray, new: np.ndarray, G: int, active: np.ndarray):
    per = old.shape[0] // G
    old_by = old.reshape(G, per)
    new_by = new.reshape(G, per)
    held = []
    receivers: dict[int, list[int]] = {}
    for r in range(G):
        had = set(old_by[r].tolist()) if active[r] else set()
        had.discard(-1)
        held.append(had)
        if not active[r]:
            continue
        gets = set(new_by[r].tolist())
        gets.discard(-1)
        for e in sorted(gets - had):
            receivers.setdefault(e, []).append(r)
    senders: dict[int, list[int]] = {}
    for r in range(G):
        for e in sorted(held[r] & receivers.keys()):
            senders.setdefault(e, []).append(r)
    pairs: dict[tuple[int, int], list[int]] = {}
    for e in sorted(receivers):
        recv = receivers[e]
        send = senders.get(e, [HOST])
        q, rem = divmod(len(recv), len(send))
        start_rem = len(send) * q
        for i, s in enumerate(send):
            for d in recv[i * q : (i + 1) * q]:
                pairs.setdefault((s, d), []).append(e)
            if i < rem:
                pairs.setdefault((s, recv[start_rem + i]), []).append(e)
    rounds: list[list[MigrationFlow]] = []
    used: list[set] = []
    for (s, d), experts in pairs.items():
        ends = {d} if s == HOST else {s, d}
        for k, u in enumerate(used):
            if not ends & u:
                rounds[k].append(MigrationFlow(s, d, tuple(experts)))
                u |= ends
                break
        else:
            rounds.append([MigrationFlow(s, d, tuple(experts))])
            used.append(set(ends))
    return rounds


def layer_transfer(old, new, n_gpus: int, move: MoveCost, *, node=None, active=None):
    """Copies, bytes and time of one layer's rearrangement from ``old`` to ``new``.

    Parameters
    ----------
    old, new, n_gpus, active
        As for :func:`migration_batches`.
    move : MoveCost
        Expert size and bandwidths.
    node : array_like of int, shape (n_gpus,), optional
        Node of each rank (default: all on one node).

    Returns
    -------
    LayerTransfer

    Examples
    --------
    >>> m = MoveCost(expert_bytes=1e9, intra_gbps=100.0, inter_gbps=10.0)
    >>> t = layer_transfer([0, 1, 2, 3], [0, 2, 1, 3], 2, m, node=[0, 1])
    >>> t.copies, t.bytes, t.seconds, t.batched_seconds, t.peers
    (2, 2000000000.0, 0.1, 0.2, 1)
    """
    func = "layer_transfer"
    o = _row_iv(old, "old", func)
    n = _row_iv(new, "new", func, o.shape[0])
    G = check_int(n_gpus, "n_gpus", func, lo=1)
    if o.shape[0] % G:
        raise param_error("n_gpus", func, f"a divisor of the {o.shape[0]} slots", repr(n_gpus))
    if not isinstance(move, MoveCost):
        raise param_error("move", func, "a MoveCost", type(move).__name__)
    nd = np.zeros(G, dtype=np.int64)
    if node is not None:
        nd = check_array(node, "node", func, ndim=1, kind="int", shape=(G,), lo=0)
    act = np.ones(G, dtype=bool)
    if active is not None:
        act = check_array(active, "active", func, ndim=1, kind="bool", shape=(G,)).astype(bool)
    return _transfer(_batches(o, n, G, act), G, nd, move)


def _transfer(rounds, G: int, node: np.ndarray, move: MoveCost) -> LayerTransfer:
    """The :class:`LayerTransfer` of a layer's rounds (module notes, "Time")."""
    gb = 1e9
    # per rank, per link class (0 intra, 1 inter, 2 host): bytes sent and received
    sent = np.zeros((G, 3))
    recv = np.zeros((G, 3))
    peers = [set() for _ in range(G)]
    copies = 0
    batched = 0.0
    for flows in rounds:
        slowest = 0.0
        for s, d, experts in flows:
            b = len(experts) * move.expert_bytes
            copies += len(experts)
            if s == HOST:
                cls, bw = 2, move.host_gbps
            elif node[s] == node[d]:
                cls, bw = 0, move.intra_gbps
            else:
                cls, bw = 1, move.inter_gbps
            recv[d, cls] += b
            if s != HOST:
                sent[s, cls] += b
                peers[s].add(d)
                peers[d].add(s)
            slowest = max(slowest, b / (bw * gb))
        batched += slowest
    bw = np.array([move.intra_gbps, move.inter_gbps, move.host_gbps]) * gb
    per_rank = (np.maximum(sent, recv) / bw).max(axis=1) if G else np.zeros(0)
    return LayerTransfer(
        copies=copies,
        bytes=copies * move.expert_bytes,
        seconds=float(per_rank.max()) if copies else 0.0,
        batched_seconds=batched,
        rounds=len(rounds),
        peers=max((len(p) for p in peers), default=0),
    )
