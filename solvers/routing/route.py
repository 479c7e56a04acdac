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
from ._balanceroute import default_s_greedy, project_loads_kernel
from ._core import (
    BAD_INPUT,
    MAX_ROUTED_TOKENS,
    PoolState,
    ReplicaState,
    policy_address,
    route_batch_kernel,
)
from .policy import policy_carry, public_carry, resolve_options
from .registry import DEFAULT_POLICY, get_routing_policy

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
    resolved options of recent calls, ``(RouterOptions, carry, resolved, public carry)`` (never
    changed by a kernel, so one serves every call with the same options), keyed by ``(G, H)``
    for the defaults and by ``(G, H, options)`` with the options' exact types and values (``1``,
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


def _resolve(policy, options, G, H):
    opts, carry, resolved = resolve_options(policy, options, G, H, _FUNC)
    return opts, carry, resolved, public_carry(policy, carry)


def _options(plan, options, G, H):
    """``(RouterOptions, carry, resolved, public carry)`` of ``options`` for ``plan``'s
    policy."""
    cache = plan.options
    if not options:
        key = (G, H)
    else:
        try:
            key = (G, H, tuple((k, type(v), v) for k, v in sorted(options.items())))
            hash(key)
        except TypeError:  # an unhashable option (an array): resolved afresh
            return _resolve(plan.policy, options, G, H)
    hit = cache.get(key)
    if hit is None:
        hit = _resolve(plan.policy, options, G, H)
        if len(cache) >= 256:
            cache.clear()
        cache[key] = hit
    return hit


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
    plan, the kernel's arguments (the last two the arrays it fills), the resolved options and
    the memory passed in as its record (``state``: the keyword arguments ``n_running`` to
    ``pool_cached`` of ``route_batch``, in that order, or None when none is given).

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
    opts, carry0, resolved, public = _options(plan, options, G, H1 - 1)
    if carry is not None:  # the memory passed back in; an option that sets a field wins
        given = carry0
        carry0, public = policy_carry(pol, carry, _FUNC), carry
        for k, f in enumerate(pol.carry._fields):
            if options and f in options:
                carry0[k] = given[k]
                public = None
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
    return plan, args, resolved, public


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

    ``policy`` names the rule (default :data:`~straggler.solvers.DEFAULT_POLICY`, ``brs``).
    Every policy places requests only on replicas with a free slot (``free_slots``), takes the
    pool oldest first, and states its rule, tie-breaks, options, memory and cost in its own
    module, beside its kernel:

    * ``br0``, ``brh``, ``brs`` (BalanceRoute's F-score policies and this library's default):
      ``straggler.solvers.routing._balanceroute``;
    * ``round_robin``, ``jsq``, ``jsq_requests``, ``p2c``, ``follow_bootstrap_room`` (SGLang's
      DP controller and model gateway): ``straggler.baselines.routing.sglang``;
    * ``vllm`` (vLLM's DP load balancer): ``straggler.baselines.routing.vllm``;
    * ``trtllm``, ``trtllm_balance`` (TensorRT-LLM's attention-DP router):
      ``straggler.baselines.routing.trtllm``;
    * ``dynamo`` (Dynamo's KV router): ``straggler.baselines.routing.dynamo``;
    * ``random``: ``straggler.baselines.routing.random``.

    The registry lists every policy with a one-line summary and its source
    (:func:`~straggler.solvers.routing.registry.get_routing_policy`); the baselines' versions
    take ``version=``, the current upstream behaviour by default. A policy with memory (the
    round-robin cursor, vLLM's start index, TensorRT-LLM's hold-back counters, BR-S's
    backlog) returns it in ``extras["carry"]``; pass it back as ``carry=`` at the next tick.

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
    carry : NamedTuple, optional
        The policy's memory: ``extras["carry"]`` of the previous tick's result (an instance of
        the ``NamedTuple`` its module declares; default its first tick's).
    rng : None, int or numpy Generator
        Seed of ``random``, ``p2c`` and ``dynamo``'s ties (a Generator is drawn from once).
    **options
        The policy's options, declared in its module (e.g. ``r_max``, ``s_greedy`` of
        ``br0``; ``version`` of a versioned baseline; ``optimistic``, the local update after
        each placement, default True, for the policies that have one). A policy refuses an
        option it does not declare.

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
    Every kernel equals its plain-Python reference decision for decision; each policy's cost
    per tick is stated in its module (BR-0 ``O(n + P*(G + R_max log n) + P2*2^R_max)`` for
    ``P`` placements, baselines ``O(n*G)``).

    References
    ----------
    BalanceRoute (Tackling the Data-Parallel Load Balancing Bottleneck in LLM Serving, arXiv
    2605.06113), key designs 1-3; the upstream routers: the module docstrings listed above.

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
    plan, args, resolved, public = _route_batch_iv(
        prefill_lengths, loads, free_slots, policy, state, carry, options, rng
    )
    pol = plan.policy
    f = plan.entry or _entry(plan, args)
    code, index, before, after, placed, s_tot, ns, carry_out = f(plan.kernel, *args)
    if code:
        _raise_bad(code, index, args)
    out, loads_after = args[15:]
    # the kernel returns Python floats and ints (numba boxes float64 and int64 as such), and
    # the memory passed in itself when the policy left it unchanged
    if carry_out is not args[13] or public is None:
        public = public_carry(pol, carry_out)
    extras = {"carry": public}
    stage = 0
    if pol.staged:
        stage = 1 if s_tot > resolved["s_greedy"] else 2
        extras["s_greedy"] = resolved["s_greedy"]
    if "cursor" in pol.carry._fields:  # round_robin's
        extras["next_cursor"] = public.cursor
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
