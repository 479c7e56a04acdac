"""The fused dispatch-and-count kernel (Triton), its torch reference and a plain-Python reference.

All three implement one rule, stated once here (see :func:`straggler.runtime.dispatch_and_count`
for the public contract). For the entries of ``topk_ids`` in flat order (token by token, then
top-k slot by slot), with ``E`` experts and ``X`` columns per table row:

1. **Count.** An entry ``e`` is *valid* when ``0 <= e < E``, row ``e`` of ``log2phy`` lists
   at least one replica (an entry ``>= 0``) and its token row is below ``num_valid_tokens``
   (when given); any other entry (``-1`` is the engines' padding; rows past the valid
   tokens are CUDA-graph padding; an expert without a replica has nowhere to go) is never
   counted and maps to ``-1``, so the counts are exactly the tokens mapped to a slot.
   ``n[e]`` = valid entries of ``e``.
2. **Rank.** ``r`` = the number of earlier valid entries (in flat order) with the same ``e``:
   ``0, 1, ..., n[e] - 1``. Deterministic, independent of how the work is split.
3. **Weights.** Column ``j`` of row ``e`` weighs ``w[j] = float64(probs[e, j])`` when
   ``log2phy[e, j] >= 0`` and the value is finite and ``> 0``; else ``0``. If every weight is
   zero (a torn write), ``w[j] = 1`` for every listed column (``log2phy[e, j] >= 0``).
   ``C[j] = w[0] + ... + w[j]`` summed left to right in float64, ``S = C[X - 1]``.
4. **Offset.** ``k = ((seed_mix + e * WEYL) >> 16) & 0xFFFF`` in int64 arithmetic, with
   ``seed_mix = (seed & 0xFFFFFF) * SEED_MIX``; ``o = (k + 0.5) / 65536``, in ``(0, 1)``.
5. **Map.** With ``h = (r + o) * S`` (float64), the entry goes to column ``j*`` = the first
   ``j`` with ``n[e] * C[j] > h``, and to ``log2phy[e, j*]``. If no column qualifies (rounding
   at the very top of the row) it goes to the last column of positive weight; a row with no
   listed column sends it to ``-1``.

The replica of rank ``r`` is the one whose slice of ``[0, 1)`` (the cumulative shares)
contains ``(r + o) / n[e]``: systematic sampling with one stratum per token, so replica ``j``
receives ``ceil(n C[j] / S - o) - ceil(n C[j-1] / S - o)`` tokens, within 1 of
``n * w[j] / S`` (up to float64 rounding of the thresholds). The chosen column has positive
weight (``n C[j*] > h >= n C[j* - 1]`` forces ``C[j*] > C[j* - 1]``), so a listed replica
of probability zero is never chosen while a positive one exists. Every product and sum above
is one IEEE-754 float64 operation on exactly representable operands (``r + o`` is exact for
``r < 2**36``), evaluated in the same order in all three implementations, so their integer
outputs are identical.

Racing a publisher: each implementation reads a row of ``probs`` once per use (the torch
reference copies the table; the kernel loads an entry's row in one 2-D load, one read per
element, and never reads it again), so a row being rewritten is seen as one element-wise
mixture of the old and new rows: non-negative, zero on ``-1`` columns, hence a valid
distribution after renormalising, or all zero and so the uniform fallback. Two entries of
one expert may see two different mixtures during a copy; the split of that one batch is then
stale, never invalid.

Why the batch count ``n[e]`` and not the rank alone: a rule from the rank only would have to
stay within 1 of every prefix's quota; for two replicas that is Bresenham's line, but for
three or more the floor-difference closed forms are not monotone in the prefix, and the
rules known to achieve it (Tijdeman's sequences, the quota method of apportionment) are
sequential. So the map uses the batch's counts, a grid-wide dependency the Triton kernel
resolves without a barrier (see :func:`dispatch_triton`).
"""

from __future__ import annotations

import math
import os

import numpy as np

__all__ = [
    "WEYL",
    "SEED_MIX",
    "SEED_MASK",
    "dispatch_triton",
    "dispatch_torch",
    "dispatch_reference",
]

#: Multiplier of the per-expert offset (Knuth's 32-bit golden-ratio constant).
WEYL = 2654435761
#: Multiplier that spreads the seed before it is added (MurmurHash3's ``c1``).
SEED_MIX = 0xCC9E2D51
#: Bits of the seed that are used.
SEED_MASK = 0xFFFFFF

triton = None  # set by _triton_kernel(): the kernel's globals resolve at JIT time
tl = None
_KERNELS: dict = {}


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _dispatch_count_kernel(
    ids_ptr,
    l2p_ptr,
    prob_ptr,
    out_ptr,
    counts_ptr,
    counter_ptr,
    hist_ptr,
    sync_ptr,
    nvalid_ptr,
    n_entries,
    row_len,
    n_experts,
    n_tiles,
    seed_mix,
    X: tl.constexpr,
    X_PAD: tl.constexpr,
    E_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
    SUB: tl.constexpr,
    HAS_COUNTER: tl.constexpr,
    HAS_NVALID: tl.constexpr,
):
    # sync_ptr: [0] phase-A tile ticket, [1] phase-A tiles done, [2] counts ready, [3] phase-C
    # ticket. Tiles are claimed dynamically, so every claimed tile belongs to a running
    # program that never waits in phase A; the only wait (for [2]) is on the last of them.
    # Entries of tokens past num_valid_tokens (CUDA-graph padding rows, whose routing is
    # degenerate) are padding: counted, they would fabricate a phantom hot expert.
    limit = n_entries
    if HAS_NVALID:
        limit = tl.minimum(tl.load(nvalid_ptr).to(tl.int64) * row_len, n_entries)
    ar_e = tl.arange(0, E_PAD)
    ar_s = tl.arange(0, SUB)
    lower = ar_s[None, :] < ar_s[:, None]
    # Phase A (count, rank within the tile): tile histogram to hist[t], local rank to out.
    t = tl.atomic_add(sync_ptr + 0, 1, sem="relaxed")
    while t < n_tiles:
        acc = tl.zeros([E_PAD], dtype=tl.int32)
        for s in range(0, BLOCK // SUB):
            offs = t * BLOCK + s * SUB + ar_s
            m = offs < n_entries
            e64 = tl.load(ids_ptr + offs, mask=m, other=-1).to(tl.int64)
            valid = m & (offs < limit) & (e64 >= 0) & (e64 < n_experts)
            cols_a = tl.arange(0, X_PAD)
            listed_a = tl.load(
                l2p_ptr + tl.where(valid, e64, 0)[:, None] * X + cols_a[None, :],
                mask=valid[:, None] & (cols_a[None, :] < X),
                other=-1,
            ).to(tl.int64)
            valid = valid & (tl.max(listed_a, axis=1) >= 0)  # an expert with a replica
            e = tl.where(valid, e64, -1).to(tl.int32)
            onehot = e[:, None] == ar_e[None, :]
            before = tl.sum(tl.where(onehot, acc[None, :], 0), axis=1)
            within = tl.sum(((e[:, None] == e[None, :]) & lower).to(tl.int32), axis=1)
            tl.store(out_ptr + offs, (before + within).to(out_ptr.dtype.element_ty), mask=m)
            acc += tl.sum(onehot.to(tl.int32), axis=0)
        tl.store(hist_ptr + t * E_PAD + ar_e, acc)
        tl.debug_barrier()
        done = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel")
        if done == n_tiles - 1:
            # Phase B, by the last tile to finish: exclusive prefix over tiles, totals.
            run = tl.zeros([E_PAD], dtype=tl.int32)
            for tt in range(0, n_tiles):
                h = tl.load(hist_ptr + tt * E_PAD + ar_e, cache_modifier=".cg")
                tl.store(hist_ptr + tt * E_PAD + ar_e, run)
                run += h
            live = ar_e < n_experts
            tl.store(counts_ptr + ar_e, run.to(tl.int64), mask=live)
            if HAS_COUNTER:
                tl.atomic_add(counter_ptr + ar_e, run.to(counter_ptr.dtype.element_ty), mask=live)
            tl.debug_barrier()
            tl.atomic_xchg(sync_ptr + 2, 1, sem="release")
        t = tl.atomic_add(sync_ptr + 0, 1, sem="relaxed")
    ready = tl.atomic_add(sync_ptr + 2, 0, sem="acquire")
    while ready == 0:
        ready = tl.atomic_add(sync_ptr + 2, 0, sem="acquire")
    # Phase C (map): rank = tile prefix + local rank; stratified column through the row.
    ar_b = tl.arange(0, BLOCK)
    t = tl.atomic_add(sync_ptr + 3, 1, sem="relaxed")
    while t < n_tiles:
        offs = t * BLOCK + ar_b
        m = offs < n_entries
        e64 = tl.load(ids_ptr + offs, mask=m, other=-1).to(tl.int64)
        valid = m & (offs < limit) & (e64 >= 0) & (e64 < n_experts)
        es = tl.where(valid, e64, 0)
        local = tl.load(out_ptr + offs, mask=valid, other=0, cache_modifier=".cg").to(tl.int64)
        pref = tl.load(hist_ptr + t * E_PAD + es, mask=valid, other=0, cache_modifier=".cg")
        n = tl.load(counts_ptr + es, mask=valid, other=1, cache_modifier=".cg")
        rank = (local + pref.to(tl.int64)).to(tl.float64)
        k = ((seed_mix + es * 2654435761) >> 16) & 65535
        o = (k.to(tl.float64) + 0.5) / 65536.0
        # The row is read once (one 2-D load): a publisher may be copying a new table over
        # it, and two reads could see two different rows. Columns are then taken out one by
        # one (a sum of one value and zeros, exact) and summed left to right.
        cols = tl.arange(0, X_PAD)
        rmask = valid[:, None] & (cols[None, :] < X)
        row = es[:, None] * X + cols[None, :]
        slot2 = tl.load(l2p_ptr + row, mask=rmask, other=-1).to(tl.int64)
        p2 = tl.load(prob_ptr + row, mask=rmask, other=0.0).to(tl.float64)
        listed2 = slot2 >= 0
        placed = tl.max(slot2, axis=1) >= 0  # as in phase A: an orphan expert is padding
        w2 = tl.where(listed2 & (p2 > 0) & (p2 - p2 == 0), p2, 0.0)
        s_w = tl.zeros([BLOCK], dtype=tl.float64)
        s_u = tl.zeros([BLOCK], dtype=tl.float64)
        for j in tl.static_range(X):
            s_w += tl.sum(tl.where(cols[None, :] == j, w2, 0.0), axis=1)
            s_u += tl.sum(tl.where((cols[None, :] == j) & listed2, 1.0, 0.0), axis=1)
        torn = s_w == 0
        w2 = tl.where(torn[:, None], tl.where(listed2, 1.0, 0.0), w2)
        h = (rank + o) * tl.where(torn, s_u, s_w)
        nf = n.to(tl.float64)
        c = tl.zeros([BLOCK], dtype=tl.float64)
        found = offs < 0
        chosen = tl.full([BLOCK], -1, tl.int64)
        last = tl.full([BLOCK], -1, tl.int64)
        for j in tl.static_range(X):
            w = tl.sum(tl.where(cols[None, :] == j, w2, 0.0), axis=1)
            slot = tl.sum(tl.where(cols[None, :] == j, slot2, 0), axis=1)
            c += w
            take = (nf * c > h) & (found == 0)
            chosen = tl.where(take, slot, chosen)
            found = found | take
            last = tl.where(w > 0, slot, last)
        phys = tl.where(found, chosen, last)
        phys = tl.where(valid & placed, phys, -1)
        tl.store(out_ptr + offs, phys.to(out_ptr.dtype.element_ty), mask=m)
        t = tl.atomic_add(sync_ptr + 3, 1, sem="relaxed")


def _triton_kernel():
    """The Triton kernel, jitted on first use (interpreted when ``TRITON_INTERPRET=1``)."""
    global triton, tl
    mode = _interpreting()
    kernel = _KERNELS.get(mode)
    if kernel is None:
        import triton as _triton
        import triton.language as _tl

        triton, tl = _triton, _tl
        kernel = _KERNELS[mode] = triton.jit(_dispatch_count_kernel)
    return kernel


def _seed_mix(seed: int) -> int:
    return (int(seed) & SEED_MASK) * SEED_MIX


def dispatch_triton(
    topk_ids,
    log2phy,
    probs,
    seed: int = 0,
    counter=None,
    num_valid_tokens=None,
    *,
    block=None,
    n_programs=None,
):
    """One launch of the fused kernel (validated, contiguous inputs on one device).

    The kernel runs in three phases inside one launch, with programs claiming tiles of
    ``block`` entries from atomic tickets. (A) count and rank within each tile (one-hot
    histograms over sub-blocks, an all-pairs comparison inside a sub-block), tile histogram
    to a scratch row; (B) the program that finishes the last tile turns the scratch into
    per-tile exclusive prefixes and the batch counts, adds them to ``counter`` and raises a
    flag; (C) every program, once the flag is up, maps the tiles it claims. No program ever
    waits for one that has not started: every claimed tile is being processed by a running
    program that does not wait in phase A, so the wait in (B) cannot deadlock on a busy GPU
    (no co-residency assumption), and the interpreter (programs run one after another) runs
    the same code. Scratch (``sync``, ``hist``) is allocated per call.
    """
    import torch

    kernel = _triton_kernel()
    E, X = log2phy.shape
    flat = topk_ids.reshape(-1)
    n = flat.numel()
    out = torch.empty_like(flat)
    counts = torch.zeros(E, dtype=torch.int64, device=flat.device)
    if n == 0:
        return out.view(topk_ids.shape), counts
    e_pad = max(16, 1 << (E - 1).bit_length())
    if block is None:
        block = 1024 if flat.is_cuda else 256
    sub = max(8, min(64, 8192 // e_pad, block))
    n_tiles = math.ceil(n / block)
    if n_programs is None:
        if flat.is_cuda:
            sms = torch.cuda.get_device_properties(flat.device).multi_processor_count
            n_programs = min(n_tiles, sms)
        else:
            n_programs = min(n_tiles, 2)
    hist = torch.empty((n_tiles, e_pad), dtype=torch.int32, device=flat.device)
    sync = torch.zeros(4, dtype=torch.int32, device=flat.device)
    kernel[(n_programs,)](
        flat,
        log2phy,
        probs,
        out,
        counts,
        counts if counter is None else counter,
        hist,
        sync,
        sync if num_valid_tokens is None else num_valid_tokens,
        n,
        topk_ids.shape[-1] if topk_ids.dim() == 2 else 1,
        E,
        n_tiles,
        _seed_mix(seed),
        X=X,
        X_PAD=max(2, 1 << (X - 1).bit_length()),
        E_PAD=e_pad,
        BLOCK=block,
        SUB=sub,
        HAS_COUNTER=counter is not None,
        HAS_NVALID=num_valid_tokens is not None,
    )
    return out.view(topk_ids.shape), counts


def dispatch_torch(topk_ids, log2phy, probs, seed: int = 0, counter=None, num_valid_tokens=None):
    """Pure torch reference of the rule above (CPU or CUDA; no host synchronisation).

    Per expert, the ranks sent to column ``j`` form one run: the rule's test
    ``n C[j] > (r + o) S`` holds for a prefix ``r < R[j]`` of the ranks (the right side grows
    with ``r``, the left with ``j``), so rank order is a run of ``R[0]`` entries on column 0,
    ``R[1] - R[0]`` on column 1, ..., and ``n - R[X - 1]`` on the last positive column.
    ``R`` is found per expert and column (a float64 estimate corrected against the exact
    test, which it misses by at most one rank either way), the runs are laid out with
    ``repeat_interleave`` over the entries in stable-sorted (expert, flat position) order
    and scattered back. Row sums go column by column (never ``torch.cumsum``, whose
    association order differs between devices). ``O(n log n + E X)``.
    """
    import torch

    E, X = log2phy.shape
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    valid = (flat >= 0) & (flat < E)
    placed = (log2phy >= 0).any(dim=1)  # experts with a replica; an orphan's entries are padding
    valid = valid & placed[torch.where(valid, flat, torch.zeros_like(flat))]
    if num_valid_tokens is not None:
        row_len = topk_ids.shape[-1] if topk_ids.dim() == 2 else 1
        limit = num_valid_tokens.reshape(()).to(torch.int64) * row_len
        valid = valid & (torch.arange(n, device=dev) < limit)
    es = torch.where(valid, flat, torch.zeros_like(flat))
    counts = torch.zeros(E, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, es, valid.to(torch.int64))
    if counter is not None:
        counter.add_(counts.to(counter.dtype))
    # Row weights per expert, with the uniform fallback of torn rows.
    slot = log2phy.to(torch.int64)
    p = probs.to(torch.float64, copy=True)  # one read of the live table
    listed = slot >= 0
    w = torch.where(listed & (p > 0) & torch.isfinite(p), p, torch.zeros_like(p))
    s_w = torch.zeros(E, dtype=torch.float64, device=dev)
    s_u = torch.zeros(E, dtype=torch.float64, device=dev)
    for j in range(X):
        s_w = s_w + w[:, j]
        s_u = s_u + listed[:, j].to(torch.float64)
    torn = s_w == 0
    w = torch.where(torn[:, None], listed.to(torch.float64), w)
    cum = torch.empty((E, X), dtype=torch.float64, device=dev)
    c = torch.zeros(E, dtype=torch.float64, device=dev)
    for j in range(X):
        c = c + w[:, j]
        cum[:, j] = c
    total = torch.where(torn, s_u, s_w)[:, None]
    e_ar = torch.arange(E, dtype=torch.int64, device=dev)
    k = ((_seed_mix(seed) + e_ar * WEYL) >> 16) & 0xFFFF
    off = ((k.to(torch.float64) + 0.5) / 65536.0)[:, None]
    # R[e, j] = #{r < n[e] : n C[j] > (r + o) S}, exactly.
    ncol = counts[:, None]
    thr = ncol.to(torch.float64) * cum

    def holds(r):
        return thr > (r.to(torch.float64) + off) * total

    safe = torch.where(total > 0, total, torch.ones_like(total))
    R = torch.ceil(thr / safe - off).clamp(min=0).to(torch.int64)
    R = torch.minimum(R, ncol)
    for _ in range(3):
        R = R + (holds(R) & (R < ncol)).to(torch.int64)
    for _ in range(3):
        R = R - ((R > 0) & ~holds(R - 1)).to(torch.int64)
    # Runs in rank order: columns 0..X-1, then the rounding tail on the last positive column.
    lengths = torch.cat([R[:, :1], R[:, 1:] - R[:, :-1], ncol - R[:, -1:]], dim=1)
    pos = torch.where(w > 0, torch.arange(X, device=dev), torch.full_like(slot, -1))
    last_col = pos.max(dim=1).values
    slot_pad = torch.cat([slot, torch.full((E, 1), -1, dtype=torch.int64, device=dev)], dim=1)
    codes = torch.cat(
        [slot, slot_pad[e_ar, torch.where(last_col >= 0, last_col, X)][:, None]], dim=1
    )
    n_valid = counts.sum().reshape(1)
    runs = torch.repeat_interleave(
        torch.cat([codes.reshape(-1), torch.full((1,), -1, dtype=torch.int64, device=dev)]),
        torch.cat([lengths.reshape(-1), n - n_valid]),
        output_size=n,
    )
    # int32 keys: torch's stable CPU sort of int64 keys is ~1000x slower (torch 2.13)
    key = torch.where(valid, flat, torch.full_like(flat, E)).to(torch.int32)
    order = torch.sort(key, stable=True).indices
    phys = torch.empty(n, dtype=torch.int64, device=dev)
    phys[order] = runs
    return phys.to(topk_ids.dtype).view(topk_ids.shape), counts


def dispatch_reference(
    topk_ids, log2phy, probs, seed: int = 0, counter=None, num_valid_tokens=None
):
    """Plain-Python reference, entry by entry, written from the rule above (numpy in/out).

    ``counter`` (an integer numpy array of shape ``(E,)``) is incremented in place;
    ``num_valid_tokens`` (an int) marks the token rows from it on as padding.
    """
    ids = np.asarray(topk_ids)
    l2p = np.asarray(log2phy)
    pr = np.asarray(probs)
    E, X = l2p.shape
    flat = [int(v) for v in ids.reshape(-1)]
    if num_valid_tokens is not None:
        row_len = ids.shape[-1] if ids.ndim == 2 else 1
        for i in range(int(num_valid_tokens) * row_len, len(flat)):
            flat[i] = -1  # rows past the valid tokens are padding
    for i, e in enumerate(flat):
        if 0 <= e < E and all(int(v) < 0 for v in l2p[e]):
            flat[i] = -1  # an expert without a replica has nowhere to go: padding
    counts = [0] * E
    for e in flat:
        if 0 <= e < E:
            counts[e] += 1
    if counter is not None:
        for e in range(E):
            counter[e] += counts[e]
    rows = []
    for e in range(E):
        slots = [int(v) for v in l2p[e]]
        w = []
        for j in range(X):
            v = float(pr[e, j])
            w.append(v if slots[j] >= 0 and v > 0 and math.isfinite(v) else 0.0)
        total = 0.0
        for v in w:
            total = total + v
        if total == 0:
            w = [1.0 if s >= 0 else 0.0 for s in slots]
            total = 0.0
            for v in w:
                total = total + v
        cum, c = [], 0.0
        for v in w:
            c = c + v
            cum.append(c)
        last = -1
        for j in range(X):
            if w[j] > 0:
                last = slots[j]
        k = ((((int(seed) & 0xFFFFFF) * 0xCC9E2D51) + e * 2654435761) >> 16) & 0xFFFF
        rows.append((slots, cum, total, last, (k + 0.5) / 65536.0))
    seen = [0] * E
    out = []
    for e in flat:
        if not 0 <= e < E:
            out.append(-1)
            continue
        r = seen[e]
        seen[e] += 1
        slots, cum, total, last, off = rows[e]
        h = (float(r) + off) * total
        n = float(counts[e])
        phys = last
        for j in range(X):
            if n * cum[j] > h:
                phys = slots[j]
                break
        out.append(phys)
    physical = np.array(out, dtype=ids.dtype).reshape(ids.shape)
    return physical, np.array(counts, dtype=np.int64)
