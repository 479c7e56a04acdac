"""DP decode routing: :func:`route_batch` (BalanceRoute BR-0 / BR-H and the deployed baselines).

One tick of the router: the pool's ready requests are assigned to ``G`` lock-step decode
replicas. ``route_batch`` validates once (:func:`_route_batch_iv`, shapes and types in Python,
values in the kernel's jitted pass), resolves the policy's options through the registry
(:mod:`straggler.solvers.routing.registry`, which also documents the kernel interface shared by
every policy and the simulator), and calls the policy's Numba kernel.
"""

from __future__ import annotations

import numbers

import numpy as np
from numba import typeof

from ...formulations.errors import param_error
from ...formulations.results import RoutingResult, Status
from ...formulations.routing import ClusterState
from ...formulations.validation import (
    check_array,
    check_int,
    check_real,
    check_rng,
    check_type,
    describe,
    rng_seed,
)
from ._balanceroute import project_loads_kernel
from ._core import (
    BAD_INPUT,
    MAX_ROUTED_TOKENS,
    PoolState,
    ReplicaState,
    RouterCarry,
    policy_address,
    route_batch_kernel,
)
from .registry import DEFAULT_POLICY, default_s_greedy, get_routing_policy, resolve_options

__all__ = [
    "route_batch",
    "default_s_greedy",
    "project_loads",
    "presence_from_prediction",
    "new_request_presence",
]

_FUNC = "route_batch"


_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)


def _arr(x, name, kind, ndim, length=None, what=""):
    """``x`` as an aligned, C-contiguous, writeable float64/int64 array with ``ndim``
    dimensions (and ``length`` rows): the one array type per kernel argument (:func:`_entry`).
    Types and shapes are checked here, values in the kernel's jitted pass."""
    dtype = _F64 if kind == "real" else _I64
    # the fast path (nothing to convert); `is` on the dtype: any other spelling of it (a
    # byte-swapped one included) takes the general path, which converts it
    if type(x) is np.ndarray and x.dtype is dtype and x.ndim in ndim and x.flags.carray:
        a = x
    else:
        a = check_array(x, name, _FUNC, kind=kind, ndim=ndim, values=False)
        if not a.flags.carray:
            a = a.copy()
    if length is not None and a.shape[0] != length:
        raise param_error(name, _FUNC, f"an array of length {length} ({what})", f"shape {a.shape}")
    return a


def _per_replica(x, name, kind, G, default):
    if x is None:
        return default
    if isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_)) and kind == "real":
        return np.full(G, float(x))
    return _arr(x, name, kind, (1,), G, "one entry per replica, G = loads.shape[0]")


#: Default arrays by length, shared between calls: the kernels never write to their inputs and
#: these never leave this module (a tick with every default allocates nothing here).
_DEFAULTS: dict = {}


def _defaults(G: int, n: int):
    """``(zeros int (G,), zeros (G,), inf (G,), zeros int (n,), arange (n,), zeros (0, G))``."""
    hit = _DEFAULTS.get((G, n))
    if hit is None:
        if len(_DEFAULTS) >= 512:
            _DEFAULTS.clear()
        hit = _DEFAULTS[(G, n)] = (
            np.zeros(G, np.int64),
            np.zeros(G),
            np.full(G, np.inf),
            np.zeros(n, np.int64),
            np.arange(n, dtype=np.int64),
            np.zeros((0, G)),
        )
    return hit


class _Plan:
    """What ``route_batch`` keeps per policy: its compiled entry and kernel (:func:`_entry`), the
    resolved options of recent calls, ``(RouterOptions, RouterCarry, resolved)`` (immutable
    records, so one serves every call with the same options), keyed by ``(G, H)`` for the
    defaults and by ``(G, H, options)`` with the options' exact types and values (``1``,
    ``1.0`` and ``True`` differ)."""

    __slots__ = ("policy", "entry", "kernel", "options")

    def __init__(self, policy):
        self.policy = policy
        self.entry = None
        self.kernel = None
        self.options = {}


#: One :class:`_Plan` per policy object used so far (keyed by the object, kept alive here:
#: a policy registered later under a name once used gets a plan of its own).
_PLANS: dict = {}


def _plan(pol) -> _Plan:
    hit = _PLANS.get(id(pol))
    if hit is None or hit.policy is not pol:
        hit = _PLANS[id(pol)] = _Plan(pol)
    return hit


def _options(plan, options, G, H):
    """``(RouterOptions, RouterCarry, resolved)`` of ``options`` for ``plan``'s policy."""
    cache = plan.options
    if not options:
        key = (G, H)
    else:
        try:
            key = (G, H, tuple((k, type(v), v) for k, v in sorted(options.items())))
            hash(key)
        except TypeError:  # an unhashable option (an array): resolved afresh
            return resolve_options(plan.policy, options, G, H, _FUNC)
    hit = cache.get(key)
    if hit is None:
        hit = resolve_options(plan.policy, options, G, H, _FUNC)
        if len(cache) >= 256:
            cache.clear()
        cache[key] = hit
    return hit


def _carry(c) -> RouterCarry:
    """A policy's memory passed back in (``extras["carry"]`` of the previous tick), with its
    fields' types as the kernels read them."""
    check_type(c, "carry", _FUNC, RouterCarry, 'a RouterCarry (extras["carry"] of a result)')
    counts = [check_int(v, "carry", _FUNC, lo=0, hi=2**52) for v in c[:4]]
    return RouterCarry(*counts, bool(c.brs_backlog))


def _state_arrays(state, L, G, n):
    """The per-replica and per-request arrays of ``route_batch`` (its keyword arguments
    ``n_running`` to ``pool_cached``, in that order), defaults filled in."""
    zi, zf, inf, wait, key, cached = _defaults(G, n)
    n_running, n_waiting, prompt_tokens, waiting_tokens, kv_usage, kv_capacity = state[:6]
    pool_wait, pool_key, pool_cached = state[6:]
    n_run = _per_replica(n_running, "n_running", "int", G, zi)
    n_wait = _per_replica(n_waiting, "n_waiting", "int", G, zi)
    prompt = _per_replica(prompt_tokens, "prompt_tokens", "real", G, zf)
    wtok = _per_replica(waiting_tokens, "waiting_tokens", "real", G, zf)
    cap = _per_replica(kv_capacity, "kv_capacity", "real", G, inf)
    if kv_capacity is not None:
        # checked here, not in the kernel's pass: the default kv_usage is derived from it,
        # and a NaN there would be reported as the caller's kv_usage
        bad = ~(cap > 0)  # NaN, zero or negative
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise param_error(
                "kv_capacity",
                _FUNC,
                _EXPECTED["kv_capacity"],
                f"value {cap[i].item()!r} at index {i}",
            )
    usage = zf
    if kv_usage is not None:
        usage = _per_replica(kv_usage, "kv_usage", "real", G, None)
    elif kv_capacity is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            usage = np.where(np.isinf(cap) | (cap <= 0), 0.0, L[:, 0] / cap)
    per_req = "one entry per pool request"
    if pool_wait is not None:
        wait = _arr(pool_wait, "pool_wait", "int", (1,), n, per_req)
    if pool_key is not None:
        key = _arr(pool_key, "pool_key", "int", (1,), n, per_req)
    if pool_cached is not None:
        cached = _arr(pool_cached, "pool_cached", "real", (2,))
        if cached.shape != (n, G):
            raise param_error(
                "pool_cached",
                _FUNC,
                f"an array of shape (n_pool, G) = ({n}, {G})",
                f"shape {cached.shape}",
            )
    return n_run, n_wait, prompt, wtok, usage, cap, wait, key, cached


def _route_batch_iv(prefill_lengths, loads, free_slots, policy, state, carry, options, rng):
    """Everything ``route_batch`` checks before its kernel runs, once; returns the policy's
    plan and the kernel's arguments, the last two the arrays it fills (``state``: the keyword
    arguments ``n_running`` to ``pool_cached`` of ``route_batch``, in that order, or None when
    none is given).

    Types and shapes are checked here (arrays already of the right dtype pass untouched);
    values (signs, NaN, infinities, magnitudes, the free slots' sum) in the kernel's jitted
    pass, whose failure :func:`_raise_bad` reports."""
    pol = get_routing_policy(DEFAULT_POLICY if policy is None else policy, _FUNC)
    plan = _plan(pol)
    s = _arr(prefill_lengths, "prefill_lengths", "real", (1,))
    L = _arr(loads, "loads", "real", (1, 2))
    if L.ndim == 1:
        L = L.reshape(-1, 1)
    G, H1 = L.shape
    n = s.shape[0]
    if G == 0 or H1 == 0:
        raise param_error(
            "loads", _FUNC, "a non-empty (G,) or (G, H+1) array", f"shape {np.shape(loads)}"
        )
    free = _arr(free_slots, "free_slots", "int", (1,), G, "loads.shape[0]")
    if state is None:
        zi, zf, inf, wait, key, cached = _defaults(G, n)
        n_run, n_wait, prompt, wtok, usage, cap = zi, zi, zf, zf, zf, inf
    else:
        n_run, n_wait, prompt, wtok, usage, cap, wait, key, cached = _state_arrays(state, L, G, n)
    opts, carry0, resolved = _options(plan, options, G, H1 - 1)
    if carry is not None:
        carry0 = _carry(carry)
        if options and "cursor" in options:
            carry0 = carry0._replace(cursor=resolved["cursor"])
    seed = 0
    if pol.seeded:
        seed = rng_seed(rng, _FUNC)
    elif rng is not None and type(rng) is not np.random.Generator:
        check_rng(rng, _FUNC)  # an unused rng is still a valid one
    args = (
        s,
        wait,
        key,
        cached,
        L,
        free,
        n_run,
        n_wait,
        prompt,
        wtok,
        usage,
        cap,
        opts,
        carry0,
        seed,
        np.empty(n, np.int64),  # the assignment and the loads after the tick, filled by
        np.empty(G),  # the kernel
    )
    return plan, args, resolved


_EXPECTED = {
    "prefill_lengths": f"an array of numbers in [0, {MAX_ROUTED_TOKENS:.0f}] (token counts)",
    "loads": f"an array of numbers in [0, {MAX_ROUTED_TOKENS:.0f}] (token counts)",
    "free_slots": "an array of non-negative integers summing to at most 2**63 - 1",
    "n_running": "an array of non-negative integers",
    "n_waiting": "an array of non-negative integers",
    "prompt_tokens": f"an array of numbers in [0, {MAX_ROUTED_TOKENS:.0f}] (token counts)",
    "waiting_tokens": f"an array of numbers in [0, {MAX_ROUTED_TOKENS:.0f}] (token counts)",
    "kv_usage": "an array of finite numbers >= 0",
    "kv_capacity": "an array of numbers > 0 (inf: unbounded)",
    "pool_wait": "an array of non-negative integers",
    "pool_cached": f"an array of numbers in [0, {MAX_ROUTED_TOKENS:.0f}] (token counts)",
    "pool_key": "an array of non-negative integers",
}
_ARG_OF = {
    "prefill_lengths": 0,
    "pool_wait": 1,
    "pool_key": 2,
    "pool_cached": 3,
    "loads": 4,
    "free_slots": 5,
    "n_running": 6,
    "n_waiting": 7,
    "prompt_tokens": 8,
    "waiting_tokens": 9,
    "kv_usage": 10,
    "kv_capacity": 11,
}


def _entry(plan, args):
    """``route_batch_kernel`` compiled for the types of ``args`` (or loaded from the disk cache),
    and the address of ``plan``'s policy kernel compiled for the types that kernel passes it
    (:func:`~straggler.solvers.routing._core.policy_address`). The arguments are normalized by
    :func:`_route_batch_iv` (aligned C-contiguous writeable float64/int64 arrays, the
    registry's records), so ``route_batch_kernel`` compiles once for every policy and a
    policy's first call compiles that policy's kernel alone, the version ``simulate`` calls."""
    if plan.entry is None:
        pool, reps = PoolState(*args[:4]), ReplicaState(*args[4:12])
        kinds = (typeof(pool), typeof(reps), typeof(args[12]), typeof(args[13]), typeof(args[14]))
        plan.kernel = policy_address(plan.policy.kernel, plan.policy.name, kinds, _FUNC)
        if hasattr(route_batch_kernel, "compile"):
            sig = (typeof(plan.kernel), *(typeof(a) for a in args))
            plan.entry = route_batch_kernel.compile(sig)
        else:  # NUMBA_DISABLE_JIT=1
            plan.entry = route_batch_kernel
    return plan.entry


def _raise_bad(code: int, index: int, arrays) -> None:
    name = BAD_INPUT[code]
    a = arrays[_ARG_OF[name]]
    flat = a.ravel()
    if name == "free_slots" and flat[index] >= 0:
        got = f"free slots whose sum exceeds 2**63 - 1 (at index {index})"
    else:
        pos = index if a.ndim == 1 else tuple(int(i) for i in np.unravel_index(index, a.shape))
        got = f"value {flat[index].item()!r} at index {pos}"
    raise param_error(name, _FUNC, _EXPECTED[name], got)


def route_batch(
    prefill_lengths,
    loads,
    free_slots,
    *,
    policy: str | None = None,
    n_running=None,
    n_waiting=None,
    prompt_tokens=None,
    waiting_tokens=None,
    kv_usage=None,
    kv_capacity=None,
    pool_wait=None,
    pool_key=None,
    pool_cached=None,
    carry=None,
    rng=None,
    **options,
) -> RoutingResult:
    r"""Route one tick of ready requests to ``G`` lock-step decode replicas.

    BR-S (``policy="brs"``, the default, :data:`~straggler.solvers.DEFAULT_POLICY`; not in the
    paper): JSQ's decision while there is no backlog. A backlog starts at the tick where some
    visible request has waited ``patience`` ticks (default 128: longer than the bursts below
    saturation, see ``benchmarks/routing_load_sweep.py``) and lasts, through
    ``RouterCarry.brs_backlog`` (pass ``extras["carry"]`` back), until a tick whose visible pool
    fits in the free slots (that tick is still routed as a backlog one). In a backlog: when
    every visible request has a slot, longest first onto JSQ's replica; when slots are
    scarce, the replica with the largest margin takes, from an age window, the request with
    the best F-score against its margin per free slot;
    the window holds the requests that entered the pool at most ``min(age_window,
    age_fraction * w*)`` ticks after the oldest waiting one (``w*``; defaults ``ceil(4096/G)``
    and 0.1), cut to the ``window * S_tot`` oldest (default 8 per free slot). Safety net
    (``safe=True``): JSQ's own decision is kept whenever it leaves no larger imbalance. So one
    tick never leaves a larger imbalance than JSQ's (THEOREMS.md R7), and no request is placed
    while one that entered the pool more than ``age_window`` ticks before it waits (R8: the
    pool-wait bound; ``pool_wait`` gives the ticks waited). It reads KV room
    (``kv_capacity``) and places nothing that would not fit. The measured behaviour across
    loads: ``benchmarks/routing_load_sweep.py``.

    BR-0 (``policy="br0"``), BalanceRoute 关键设计 2, on current loads ``L = loads[:, 0]``,
    ``M = max L``, margins ``m_g = M - L_g``, F-score ``F_g(Q) = D(Q) - G*(D(Q) - m_g)_+``.
    Until the pool is empty or no free slot is left, repeat:

    1. Pop the replica ``g`` with a free slot that is largest in ``(cap_g, m_g)``
       (lexicographic; ties to the lowest index). Each placement can raise ``M`` and so
       moves every margin, but not their order: the replicas with the most free slots are
       sorted by load once, and a pop reads the first of them (and any with an equal margin).
    2. Rank the pool by the single score ``F_g({i})``, descending, ties to the lower pool
       index (older request first).
    3. **Stage 1**, while the total free slots ``S_tot > S_greedy``: place the top-ranked
       request on ``g``.
       **Stage 2**, otherwise: candidates are the top ``R_max`` of the ranking; search every
       subset ``Q`` with ``1 <= |Q| <= min(cap_g, R_max)`` for the largest ``F_g(Q)``; subsets
       are visited by size, then in lexicographic order of candidate ranks, and the first
       maximum is kept (so ties go to fewer requests, then to better-ranked ones). If the best
       score is ``<= 0`` the starvation guard places the top-ranked request alone.
    4. Optimistic update (``optimistic=True``, default): ``L_g += D(Q)``, ``M = max(M, L_g)``,
       all margins recomputed from the new ``M``; ``cap_g -= |Q|``.

    Every pop places at least one request, so a tick places ``min(n_pool, S_tot)`` requests.

    BR-H (``policy="brh"``), 关键设计 3: ``loads`` is ``(G, H+1)`` projected loads (see
    :func:`project_loads`), margin vectors ``m_{g,h} = max_g' L_{g',h} - L_{g,h}``, discount
    ``d = (1, gamma, ..., gamma^H)``, score ``F_g(Q) = alpha*(1'd)*D - beta*((D*1 - m_g)_+)'d``
    (``beta`` defaults to ``G``). Same two stages; the replica key is ``(cap_g, d'm_g)`` and the
    update adds ``D(Q)`` to every column of ``g``. With ``H = 0, alpha = 1, beta = G`` it makes
    exactly BR-0's decisions (Theorem R3). Two options beyond the paper, both off by default:
    ``new_presence=pi`` weighs column ``h`` by the probability ``pi_h`` that a request placed
    now is still resident then (``d_h = gamma^h * pi_h``; ``new_request_presence``), and
    ``project_loads(..., refill=...)`` lets a slot freed within the horizon hold a new request
    instead of staying empty (the study behind them: ``benchmarks/routing_table.py``).

    Baselines (all place in pool order, only on replicas with a free slot; each names its
    upstream file and change in the registry and in ``straggler.baselines.routing.routers``, and
    the
    versioned ones take ``version=``, the current upstream behaviour by default):
    ``round_robin`` (cyclic from ``cursor``), ``random`` (uniform, seeded), ``jsq`` (SGLang
    ``total_tokens``: fewest ``loads + waiting_tokens``, then fewest running + waiting
    requests, lowest index; after a pick ``+prompt, +1`` or, ``version="plus_one"``, ``+1``),
    ``jsq_requests`` (SGLang ``total_requests``), ``vllm`` (vLLM's DP load balancer: first
    strict minimum of ``max(inflight, waiting + running) + 6*waiting*max(0, kv_usage - 0.5)``
    from a start index that rotates after every pick, kept in ``carry``; ``"rotate_4w"`` and
    ``"legacy"`` score ``4*waiting + running``, the latter from a fixed start), ``p2c`` (the
    SGLang gateway's power of two on its version's metric, ties to the first draw),
    ``trtllm`` (TensorRT-LLM attention-DP: longest prompt first, ties to the lower index;
    min-heap on ``(prompt tokens, requests, rank)`` where the tokens are the active requests'
    original prompt lengths, per-rank cap ``max(ceil((sum active + n_new)/G), max active)``,
    ``n_new = min(n_pool, S_tot)``), ``trtllm_balance`` (the same, held back by
    ``enable_balance``'s ``timeout_iters`` and ``batching_wait_iters``, counters in
    ``carry``), ``follow_bootstrap_room`` (replica ``pool_key % G``: SGLang's PD rule),
    ``dynamo`` (Dynamo's KV router: lowest ``overlap_weight * new prefill blocks + decode
    blocks``, the prefix in ``pool_cached`` credited, ties random).
    The registry (:func:`~straggler.solvers.routing.registry.routing_policies`) lists every
    policy with its rule and source.

    Parameters
    ----------
    prefill_lengths : array, shape (n_pool,)
        Prefill (prompt) lengths ``s_i >= 0`` of the pool, oldest first.
    loads : array, shape (G,) or (G, H+1)
        Current loads (resident KV tokens) or projected loads (column 0 = current). Policies
        other than ``brh`` read column 0 only.
    free_slots : array of int, shape (G,)
        Free request slots per replica.
    policy : str, optional
        A registered policy (default :data:`~straggler.solvers.DEFAULT_POLICY`).
    n_running, n_waiting : array of int, shape (G,), optional
        Running requests and requests queued inside each replica's engine (default zeros):
        the JSQ tie-break, ``jsq_requests``, ``vllm``, ``trtllm``.
    prompt_tokens : array, shape (G,), optional
        Sum of each replica's running requests' original prompt lengths (TensorRT-LLM's
        metric; default zeros).
    waiting_tokens : array, shape (G,), optional
        Prompt tokens of the ``n_waiting`` requests (default zeros).
    kv_usage : array, shape (G,), optional
        Fraction of each replica's KV capacity in use (default ``loads[:, 0] / kv_capacity``,
        0 when the capacity is unbounded).
    kv_capacity : number or array, shape (G,), optional
        KV capacity in tokens (default ``inf``).
    pool_wait : array of int, shape (n_pool,), optional
        Routing ticks each pool request has already waited (default zeros).
    pool_key : array of int, shape (n_pool,), optional
        A stable id ``>= 0`` per pool request (default ``0..n_pool-1``); SGLang's bootstrap
        room for ``follow_bootstrap_room``.
    pool_cached : array, shape (n_pool, G), optional
        Prompt tokens of request ``i`` already in replica ``g``'s prefix cache.
    carry : RouterCarry, optional
        The policy's memory: ``extras["carry"]`` of the previous tick's result.
    rng : None, int or numpy Generator
        Seed of ``random``, ``p2c`` and ``dynamo``'s ties (a Generator is drawn from once).
    **options
        The policy's options (``straggler.solvers.routing.registry.OPTIONS``):
        ``r_max`` (``R_max``, Stage-2 candidates, 1..16, default 4, the paper's example),
        ``s_greedy`` (Stage-1 threshold, default
        ``straggler.solvers.routing.registry.default_s_greedy`` ``= G * r_max``), ``alpha``,
        ``beta``, ``gamma`` (BR-H weights; ``beta`` defaults to ``G``; ``gamma`` in
        (0, 1]), ``optimistic`` (bool, default True), ``cursor`` (round-robin start, default
        0), ``new_presence`` (BR-H: ``H+1`` weights in [0, 1]), ``version`` (a baseline's
        upstream version), ``kv_weight``, ``throughput`` (``p2c``), ``block_size``,
        ``overlap_weight`` (``dynamo``), ``timeout_iters``, ``batching_wait_iters``
        (``trtllm_balance``). A policy refuses an option it does not read.

    Returns
    -------
    RoutingResult
        ``runtime_s``: the policy's kernel and the tick summary, timed inside the jitted call
        (validation and JIT compilation excluded).

    Raises
    ------
    InvalidInputError
        Negative, NaN, infinite or too large (above ``2**53``) lengths or loads, free slots
        summing past ``2**63 - 1``, strings, booleans or complex numbers where numbers are
        expected, shape mismatches, out-of-range options (the message names the parameter).
    InvalidOptionError
        Unknown policy, or an option the policy does not accept.

    Notes
    -----
    Cost per tick, ``P`` placements (``P2`` in Stage 2): BR-0 ``O(n + P*(G + R_max log n)
    + P2*2^R_max)`` (the pool is radix-sorted once; the ranking merges two walks from the
    margin, Theorem R2, over a bitset of live positions; a Stage-1 pop is one binary search
    and a few bitset look-ups, ``n <= 4096`` needing one summary word; the replica of a pop
    costs ``O(1)`` amortized when all replicas start with the same free slots and distinct
    loads: one insertion sort of the ``G`` replicas per ``G`` pops, ``O(G)`` a pop at worst,
    as in ties); BR-H
    ``O(P*(G*H + e*H))`` with ``e`` the requests evaluated by its two walks from the peak of the
    concave score (all of them in the worst case); baselines ``O(n*G)`` (trtllm adds
    ``O(n log n)``). The kernels equal their plain-Python references (which rank the whole
    pool on every pop) decision for decision.

    Deviations from the paper: it states neither ``S_greedy`` nor the candidate order nor the
    tie-breaks; the choices above are ours. The replica key ``(cap_g, m_g)`` is read as
    lexicographic (free slots first), as the paper writes the tuple.

    References
    ----------
    BalanceRoute (arXiv 2605.06113) 关键设计 1-3; the upstream routers: the module docstrings of
    ``straggler.baselines.routing.sglang``, ``.vllm``, ``.trtllm`` and ``.dynamo``.

    Examples
    --------
    >>> d = route_batch([6, 2, 3], [10, 4, 7], [1, 2, 1], policy="br0")
    >>> d.assignment.tolist(), d.imbalance_before, d.imbalance, d.stage
    ([1, 0, 2], 9.0, 4.0, 2)
    >>> d = route_batch([6, 2, 3], [10, 4, 7], [0, 1, 1], pool_wait=[140, 140, 139])
    >>> d.policy, d.assignment.tolist(), d.imbalance  # a backlog: margins 6 and 3 filled
    ('brs', [1, -1, 2], 0.0)
    >>> route_batch([6, 2, 3], [10, 4, 7], [0, 1, 1], policy="jsq").imbalance
    1.0
    >>> d = route_batch([6, 2, 3], [10, 4, 7], [1, 2, 1], policy="jsq")
    >>> d.assignment.tolist(), d.imbalance, d.loads.tolist()
    ([1, 2, 0], 7.0, [13.0, 10.0, 9.0])
    >>> d = route_batch([5, 5], [0, 0, 0], [1, 1, 1], policy="round_robin", cursor=2)
    >>> d.assignment.tolist(), d.extras["next_cursor"]
    ([2, 0], 1)
    """
    state = None  # every per-replica and per-request default
    if not (
        n_running is None
        and n_waiting is None
        and prompt_tokens is None
        and waiting_tokens is None
        and kv_usage is None
        and kv_capacity is None
        and pool_wait is None
        and pool_key is None
        and pool_cached is None
    ):
        state = (
            n_running,
            n_waiting,
            prompt_tokens,
            waiting_tokens,
            kv_usage,
            kv_capacity,
            pool_wait,
            pool_key,
            pool_cached,
        )
    plan, args, resolved = _route_batch_iv(
        prefill_lengths, loads, free_slots, policy, state, carry, options, rng
    )
    pol = plan.policy
    f = plan.entry or _entry(plan, args)
    code, index, c0, c1, c2, c3, c4, before, after, placed, s_tot, ns = f(plan.kernel, *args)
    if code:
        _raise_bad(code, index, args)
    out, loads_after = args[15:]
    new_carry = args[13]  # the carry passed in, when the policy left it as it was
    if (c0, c1, c2, c3, c4) != new_carry:
        new_carry = RouterCarry(c0, c1, c2, c3, c4)
    # the kernel returns Python floats and ints (numba boxes float64 and int64 as such)
    extras = {"carry": new_carry}
    stage = 0
    if pol.staged:
        stage = 1 if s_tot > resolved["s_greedy"] else 2
        extras["s_greedy"] = resolved["s_greedy"]
    if "cursor" in pol.options:
        extras["next_cursor"] = new_carry.cursor
    return RoutingResult(
        assignment=out,
        imbalance=after,
        imbalance_before=before,
        loads=loads_after,
        n_placed=placed,
        status=Status.HEURISTIC,
        policy=pol.name,
        stage=stage,
        runtime_s=ns * 1e-9,
        extras=extras,
    )


def presence_from_prediction(p_fin, mu_rem, horizon: int) -> np.ndarray:
    """Expected presence ``c_i`` (steps, on horizon offsets ``h = 0..H``) with the gate.

    ``r_i`` = tokens still to decode (``>= 1``); request ``i`` is resident at offset ``h`` iff
    ``h < r_i``. With ``p_fin = P(r_i <= H)`` and ``mu_rem = E[r_i | r_i <= H]`` the expected
    number of resident offsets is ``c_i = (1 - p_fin)*(H+1) + p_fin*mu_rem`` (the paper's
    ``(1-p)*H + p*mu`` counted on our ``H+1`` offsets, ``h = 0`` being now). Confidence gate:
    ``p_fin < 0.5 -> c_i = H+1`` (resident for the whole horizon).

    Examples
    --------
    >>> presence_from_prediction([0.2, 1.0, 0.5], [3.0, 2.0, 4.0], 10).tolist()
    [11.0, 2.0, 7.5]
    """
    p = np.asarray(p_fin, dtype=np.float64)
    mu = np.clip(np.asarray(mu_rem, dtype=np.float64), 1.0, float(max(horizon, 1)))
    c = (1.0 - p) * (horizon + 1) + p * mu
    return np.where(p < 0.5, float(horizon + 1), c)


def project_loads(state, predictor, horizon: int, *, refill=0.0) -> np.ndarray:
    """Projected loads ``(G, H+1)`` of a :class:`~straggler.formulations.ClusterState`.

    ``L_{g,h} = sum_{i on g} w_ih * (prompt_i + decoded_i + h) + (1 - w_ih) * refill`` with
    ``w_ih = clip(c_i - h, 0, 1)``: each running request keeps growing by one token per step
    while it is (expected to be) resident, with ``c_i`` from ``presence_from_prediction``
    on the predictor's ``(p_fin, mu_rem)``. Column 0 equals the state's current loads when they
    are derived from the running requests (``w_i0 = 1``).

    ``refill`` (not in the paper, default 0 = the paper's projection): the tokens of the request
    that takes a slot once its request has left. With 0 a replica whose requests are about to
    finish looks empty over the horizon although its freed slots are refilled at the next ticks
    when the pool is not empty (a saturated cluster); ``refill="pool"`` uses the mean prefill
    length of ``state.pool_prefill`` (0 for an empty pool).

    Parameters
    ----------
    state : ClusterState
    predictor : object
        With ``predict(prompt, decoded, horizon, *, prefix=None, output=None) -> (p_fin,
        mu_rem)`` (see ``straggler.solvers.routing.predictors``).
    horizon : int
        ``H >= 0``.
    refill : float >= 0 or "pool"

    Examples
    --------
    >>> from straggler.formulations import ClusterState
    >>> from straggler.solvers.routing.predictors import OraclePredictor
    >>> st = ClusterState(free_slots=[1, 1], running_replica=[0, 1], running_prompt=[4, 2],
    ...                   running_decoded=[0, 0], running_output=[2, 5], pool_prefill=[3, 7])
    >>> project_loads(st, OraclePredictor(), 3).tolist()
    [[4.0, 5.0, 0.0, 0.0], [2.0, 3.0, 4.0, 5.0]]
    >>> project_loads(st, OraclePredictor(), 3, refill="pool").tolist()
    [[4.0, 5.0, 5.0, 5.0], [2.0, 3.0, 4.0, 5.0]]
    """
    H, refill = _project_loads_iv(state, predictor, horizon, refill)
    if state.running_replica.size == 0:
        return np.zeros((state.n_replicas, H + 1))
    p, mu = predictor.predict(
        state.running_prompt,
        state.running_decoded,
        H,
        prefix=state.running_prefix,
        output=state.running_output,
    )
    c = presence_from_prediction(p, mu, H)
    tokens = state.running_prompt + state.running_decoded
    return project_loads_kernel(
        state.running_replica, tokens, c, state.n_replicas, H, float(refill)
    )


def _project_loads_iv(state, predictor, horizon, refill):
    """``project_loads``'s checks: the state's type, a predictor with ``predict``, ``H >= 0``
    and the refill value; returns ``(H, refill)``."""
    f = "project_loads"
    check_type(state, "state", f, ClusterState, "a ClusterState")
    if not callable(getattr(predictor, "predict", None)):
        raise param_error(
            "predictor", f, "an object with a predict method", f"{describe(predictor)}"
        )
    H = check_int(horizon, "horizon", f, lo=0)
    if isinstance(refill, str) and refill == "pool":
        pool = state.pool_prefill
        return H, float(pool.mean()) if pool.size else 0.0
    if isinstance(refill, str):
        raise param_error("refill", f, 'a finite number >= 0 or "pool"', describe(refill))
    return H, check_real(refill, "refill", f, lo=0)


def new_request_presence(output_lengths, horizon: int) -> np.ndarray:
    """``pi_h = P(output > h)``, ``h = 0..H``: the chance that a request placed now is still
    resident ``h`` steps later (it leaves after ``output`` decode steps), from a sample of
    output lengths (the empirical survival at age 0). For ``route_batch(..., new_presence=)``.

    Examples
    --------
    >>> new_request_presence([1, 2, 2, 4], 3).tolist()
    [1.0, 0.75, 0.25, 0.25]
    """
    f = "new_request_presence"
    o = np.sort(check_array(output_lengths, "output_lengths", f, kind="real", lo=1))
    if o.size == 0:
        raise param_error("output_lengths", f, "a non-empty array of numbers >= 1", "[]")
    h = np.arange(check_int(horizon, "horizon", f, lo=0) + 1, dtype=np.float64)
    return (o.size - np.searchsorted(o, h, side="right")) / o.size
