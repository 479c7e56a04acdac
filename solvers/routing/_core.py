"""The routing kernels' common ground: the state records, the option record and the
declarations a policy makes (its options and its memory), the input check, the tick summary and
the one call of a policy's kernel from jitted code.

Every policy's kernel has one signature, ``kernel(pool, reps, opts, carry, seed) ->
(assignment, carry_out)``: ``pool`` a :class:`PoolState` (the visible requests, oldest
first), ``reps`` a :class:`ReplicaState` (per replica), ``opts`` a :class:`RouterOptions`
(filled by the registry, :mod:`straggler.solvers.routing.registry`, from the options the
policy declares), ``carry`` an int64 array (the policy's memory from its previous tick, the
fields of its declared ``NamedTuple`` by slot), ``seed`` an int64 >= 0 (MINSTD, for the seeded
policies); ``assignment`` int64 ``(n,)``, fresh (-1: stays in the pool). Kernels never mutate
their inputs and place a request only on a replica with a free slot. With ``opts.optimistic``
each policy applies its upstream's local update after each placement.

A policy is one module's business: it declares its options (:class:`PolicyOption`) and its
memory (a ``NamedTuple`` class, :func:`check_carry_record`) beside its kernel and reads them by
the slots :func:`option_slots` and :func:`carry_slots` give (compile-time constants), updating
its memory through :func:`with_carry`; no kernel reads another policy's options or memory. The
policies live one family per module: :mod:`straggler.solvers.routing._balanceroute` (BR-0, BR-H,
BR-S) and the upstream routers in :mod:`straggler.baselines.routing` (``sglang``, ``vllm``,
``trtllm``, ``dynamo``, ``random``), each kernel with its plain-Python reference below it.

Jitted code calls a policy's kernel through :func:`call_policy`, by the address of its
compiled code (:func:`policy_address`): ``route_batch_kernel`` here and the simulator's step
loop compile once for every policy (every policy's records have the same types), and a policy
adds only its own kernel's compile, shared by both (each on numba's disk cache).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from numba import njit, types
from numba.extending import overload

from ...formulations.errors import InvalidInputError
from .._numba import address as _address
from .._numba import clock as _clock
from .._numba.address import address_call, wrapperless_address
from .._numba.clock import monotonic_ns
from .._numba.jit import NJIT, NJIT_INLINE, cache_depends_on

__all__ = [
    "ReplicaState",
    "PoolState",
    "RouterOptions",
    "PolicyOption",
    "OPTION_TARGETS",
    "NoCarry",
    "check_carry_record",
    "carry_kinds",
    "option_slots",
    "carry_slots",
    "with_carry",
    "MAX_ROUTED_TOKENS",
    "MINSTD_A",
    "MINSTD_M",
    "minstd_start",
    "minstd_next",
    "draw_eligible",
    "BAD_INPUT",
    "least_tokens_kernel",
    "least_tokens_reference",
    "tick_summary_kernel",
    "check_inputs_kernel",
    "call_policy",
    "policy_address",
    "route_batch_kernel",
]


class ReplicaState(NamedTuple):
    """What every kernel knows about each replica: arrays of length ``G``, except ``loads``
    ``(G, H+1)`` C-contiguous (column 0: resident KV tokens now; columns 1..H: projected loads
    ``h`` steps ahead, BR-H). ``n_waiting``: requests queued in the replica's own engine (0 in
    the simulator's pool mode); ``prompt_tokens``: the running requests' original prompt
    lengths summed (TensorRT-LLM's metric); ``waiting_tokens``: prompt tokens of the
    ``n_waiting`` requests (SGLang adds them); ``kv_usage``: fraction of the KV capacity in
    use (vLLM's score); ``kv_capacity``: tokens (``inf``: unbounded)."""

    loads: np.ndarray
    free_slots: np.ndarray
    n_running: np.ndarray
    n_waiting: np.ndarray
    prompt_tokens: np.ndarray
    waiting_tokens: np.ndarray
    kv_usage: np.ndarray
    kv_capacity: np.ndarray


class PoolState(NamedTuple):
    """What every kernel knows about each visible pool request, oldest first: ``prefill``
    float64 (tokens it brings: its prompt, or prompt + decoded after a preemption), ``wait``
    int64 (routing ticks spent in the pool), ``key`` int64 (a stable id: SGLang's bootstrap
    room), ``cached`` float64 ``(n, G)`` (prompt tokens already in replica ``g``'s prefix
    cache) or ``(0, G)`` when unknown."""

    prefill: np.ndarray
    wait: np.ndarray
    key: np.ndarray
    cached: np.ndarray


class RouterOptions(NamedTuple):
    """A policy's options as its kernel reads them, filled by the registry
    (:func:`~straggler.solvers.routing.registry.resolve_options`) from the options the policy
    declares (:class:`PolicyOption`, in its own module): the two every record has, then the
    policy's own by slot.

    ``optimistic``: the local update after each placement (default True; read by the policies
    that declare the option). ``version``: the index of the upstream version in
    ``RoutingPolicy.versions`` (0: the current one, or no versions). ``values`` float64: the
    policy's own scalar options, option ``k`` of :func:`option_slots` of its declaration at
    ``values[k]`` (integers and bools as exact floats). ``vector`` float64: its vector option
    (at most one per policy, e.g. BR-H's ``new_presence``), empty when not given.
    """

    optimistic: bool
    version: int
    values: np.ndarray
    vector: np.ndarray


#: Where a :class:`PolicyOption`'s value goes.
OPTION_TARGETS = ("values", "vector", "carry", "optimistic")


@dataclass(frozen=True)
class PolicyOption:
    """One keyword option of a routing policy, declared in the policy's own module (or, for
    ``optimistic``, shared by every policy that accepts it: the registry's ``OPTIMISTIC``).

    ``check(value, func)`` returns the normalized value or raises naming the option;
    ``default`` is a value or ``default(G, resolved)`` of the number of replicas and the
    options resolved before it (in the policy's declared order): the one place each default is
    written. ``to`` says where the value goes: ``"values"``, the policy's slot of
    ``RouterOptions.values`` (its position among the policy's scalar options,
    :func:`option_slots`); ``"vector"``, ``RouterOptions.vector``; ``"carry"``, the field of
    the same name of the policy's memory (:func:`check_carry_record`) at the first tick;
    ``"optimistic"``,
    ``RouterOptions.optimistic``. A value of ``None`` means "the default".
    """

    name: str
    check: Callable[[Any, str], Any]
    default: Any
    doc: str
    to: str = "values"


class NoCarry(NamedTuple):
    """The memory of a policy that keeps none (no field)."""


def check_carry_record(record, policy: str) -> None:
    """Refuse (``ValueError``) a policy's memory declaration that is not a ``NamedTuple``
    class of ``int`` and ``bool`` fields.

    A policy declares its memory from one tick to the next as such a class, in its own module
    (e.g. ``class VllmCarry(NamedTuple): start: int``): ``RoutingResult.extras["carry"]`` is
    an instance of it, and its kernel sees the same values as an int64 array, field ``k`` of
    :func:`carry_slots` at index ``k`` (bools as 0/1; zero at the first tick, or the value of
    the policy's option of the same name declared with ``to="carry"``). A kernel returns the
    array unchanged or a fresh copy with its own fields changed (:func:`with_carry`).
    """
    fields = getattr(record, "_fields", None)
    if not (isinstance(record, type) and issubclass(record, tuple) and fields is not None):
        raise ValueError(f"routing policy {policy!r}: carry must be a NamedTuple class")
    bad = [f for f, k in zip(fields, carry_kinds(record)) if k is None]
    if bad:
        raise ValueError(f"routing policy {policy!r}: carry fields {bad} must be int or bool")


def carry_kinds(record) -> tuple:
    """The type of each field of a policy's memory class ``record``: ``int`` or ``bool`` (None:
    another), read from its annotations (strings or forward references included)."""
    hints = getattr(record, "__annotations__", {})
    out = []
    for f in record._fields:
        k = hints.get(f)
        k = getattr(k, "__forward_arg__", k)
        out.append({int: int, bool: bool, "int": int, "bool": bool}.get(k))
    return tuple(out)


def option_slots(options) -> tuple:
    """The slots of a policy's scalar options in ``RouterOptions.values``: a named tuple of
    ints, one field per option of ``options`` (:class:`PolicyOption`) that goes to
    ``"values"``, in declared order. Kernels read ``opts.values[SLOTS.name]`` (a global
    tuple of ints is a compile-time constant in jitted code).

    Examples
    --------
    >>> a = PolicyOption("a", None, 1.0, "")
    >>> option_slots((a, PolicyOption("v", None, None, "", to="vector"), a))
    OptionSlots(a=0)
    """
    names = []
    for o in options:
        if o.to == "values" and o.name not in names:
            names.append(o.name)
    return collections.namedtuple("OptionSlots", names)(*range(len(names)))


def carry_slots(record) -> tuple:
    """The slots of a policy's memory fields (its ``NamedTuple`` class ``record``,
    :func:`check_carry_record`) in its carry array: a named tuple of ints, one field per field
    of ``record``, in order.

    Examples
    --------
    >>> class Memory(NamedTuple):
    ...     cursor: int
    ...     flag: bool
    >>> carry_slots(Memory)
    CarrySlots(cursor=0, flag=1)
    """
    names = list(record._fields)
    return collections.namedtuple("CarrySlots", names)(*range(len(names)))


@njit(**NJIT_INLINE)
def with_carry(carry, slot, value):
    """A policy's memory ``carry`` (int64 array) with ``value`` in ``slot``: ``carry`` itself
    when it holds that value already, else a fresh copy (a kernel never changes its inputs).
    The one way a kernel updates its memory."""
    if carry[slot] == value:
        return carry
    out = carry.copy()
    out[slot] = value
    return out


#: Largest token count (length, load) a kernel accepts: float64 holds every integer up to it
#: exactly, and ``G * (max load + sum of lengths)`` stays finite for any realistic ``G``.
MAX_ROUTED_TOKENS = float(2**53)

#: MINSTD (``x <- 48271*x mod (2^31-1)``; Park, Miller and Stockmeyer, "Technical
#: correspondence", CACM 36(7), 1993), the generator of the seeded policies: their kernels draw
#: through :func:`minstd_start`, :func:`minstd_next` and :func:`draw_eligible`, their
#: plain-Python references write the same steps out.
MINSTD_A = 48271
MINSTD_M = 2147483647


# --------------------------------------------------------------------------------------------
# The seeded policies' draws: MINSTD, and one draw among the replicas with a free slot
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def minstd_start(seed):
    """The MINSTD state of a kernel's ``seed`` (an integer ``>= 0``): ``seed mod (M - 1) + 1``,
    in ``[1, M)`` (never 0, the generator's fixed point)."""
    return seed % (MINSTD_M - 1) + 1


@njit(**NJIT)
def minstd_next(x):
    """One MINSTD step: ``MINSTD_A * x mod MINSTD_M`` (exact in int64: ``x < 2**31``)."""
    return (MINSTD_A * x) % MINSTD_M


@njit(**NJIT)
def draw_eligible(cap, elig, x, min_k):
    """The replicas with a free slot and one uniform draw among them.

    Writes the ``k`` replicas ``j`` with ``cap[j] > 0`` to ``elig[:k]`` in increasing order.
    When ``k >= min_k``: one MINSTD step of the state ``x`` and the draw ``a = x' mod k``;
    otherwise ``x`` is kept and ``a = 0``. Returns ``(k, x', a)``: replica ``elig[a]`` is the
    draw. ``random`` draws with ``min_k = 1``; ``p2c`` with ``min_k = 2`` (one eligible
    replica is taken without a draw), then draws its second choice with :func:`minstd_next`.

    Examples
    --------
    >>> elig = np.empty(3, np.int64)
    >>> k, x, a = draw_eligible(np.array([0, 2, 1]), elig, 1, 1)
    >>> k, x, a, elig[:k].tolist()
    (2, 48271, 1, [1, 2])
    """
    k = 0
    for j in range(cap.shape[0]):
        if cap[j] > 0:
            elig[k] = j
            k += 1
    if k < min_k:
        return k, x, 0
    x = minstd_next(x)
    return k, x, x % k


# --------------------------------------------------------------------------------------------
# Join the shortest queue by tokens: SGLang's total_tokens and BR-S's safety net
# --------------------------------------------------------------------------------------------


@njit(**NJIT)
def least_tokens_kernel(pool, reps, optimistic, add_tokens):
    """In pool order, each request to the replica with a free slot and the fewest ``loads +
    waiting_tokens``, then the fewest ``running + waiting`` requests, then the lowest index.
    ``optimistic``: after each pick ``requests += 1`` and, with ``add_tokens``, ``tokens +=
    s``. Returns the assignment."""
    prefill = pool.prefill
    loads = reps.loads
    free_slots = reps.free_slots
    n = prefill.shape[0]
    G = loads.shape[0]
    # element loops, not array expressions (numba compiles a broadcasting loop for each)
    tok = np.empty(G)
    req = np.empty(G, np.int64)
    for j in range(G):
        tok[j] = loads[j, 0] + reps.waiting_tokens[j]
        req[j] = reps.n_running[j] + reps.n_waiting[j]
    cap = free_slots.copy()
    out = np.full(n, -1, np.int64)
    for i in range(n):
        g = -1
        for j in range(G):
            if cap[j] <= 0:
                continue
            if g < 0 or tok[j] < tok[g] or (tok[j] == tok[g] and req[j] < req[g]):
                g = j
        if g < 0:
            break
        out[i] = g
        cap[g] -= 1
        if optimistic:
            req[g] += 1
            if add_tokens:
                tok[g] += prefill[i]
    return out


def least_tokens_reference(pool, reps, optimistic, add_tokens):
    """The same in plain Python (``min`` over the eligible replicas by a key tuple)."""
    prefill = pool.prefill
    tok = [float(row[0]) + float(w) for row, w in zip(reps.loads, reps.waiting_tokens)]
    req = [int(a) + int(b) for a, b in zip(reps.n_running, reps.n_waiting)]
    cap = [int(c) for c in reps.free_slots]
    out = [-1] * len(prefill)
    for i, s in enumerate(prefill):
        elig = [j for j in range(len(cap)) if cap[j] > 0]
        if not elig:
            break
        g = min(elig, key=lambda j: (tok[j], req[j], j))
        out[i] = g
        cap[g] -= 1
        if optimistic:
            req[g] += 1
            if add_tokens:
                tok[g] += float(s)
    return np.array(out, dtype=np.int64)


@njit(**NJIT_INLINE)
def tick_summary_kernel(loads, prefill, assignment):
    """``(I_before, I_after, loads_after, n_placed)`` on current loads ``loads[:, 0]``:
    ``loads_after`` adds each placed request's prefill to its replica (no reference needed: the
    tests compare it with :func:`straggler.formulations.routing.imbalance`)."""
    G = loads.shape[0]
    L = loads[:, 0].copy()
    before = G * _max(L) - _sum(L)
    placed = 0
    for i in range(assignment.shape[0]):
        if assignment[i] >= 0:
            L[assignment[i]] += prefill[i]
            placed += 1
    after = G * _max(L) - _sum(L)
    return before, after, L, placed


@njit(**NJIT_INLINE)
def _max(x):
    """``x.max()`` of a non-empty float64 vector without NaN (a loop: numba's ``max`` and
    ``sum`` are generic reductions, dearer to compile)."""
    m = x[0]
    for i in range(1, x.shape[0]):
        if x[i] > m:
            m = x[i]
    return m


@njit(**NJIT_INLINE)
def _sum(x):
    """``x.sum()`` of a float64 vector: numba's own order (left to right from 0.0)."""
    t = 0.0
    for i in range(x.shape[0]):
        t += x[i]
    return t


#: Codes of :func:`check_inputs_kernel`: the parameter of ``route_batch`` at fault.
BAD_INPUT = (
    "",
    "prefill_lengths",
    "loads",
    "free_slots",
    "n_running",
    "n_waiting",
    "prompt_tokens",
    "waiting_tokens",
    "kv_usage",
    "kv_capacity",
    "pool_wait",
    "pool_cached",
    "pool_key",
)


@njit(**NJIT)
def _bad_tokens(v):
    """Index of the first value of the float64 vector ``v`` outside ``[0,
    MAX_ROUTED_TOKENS]`` (NaN included), -1."""
    for i in range(v.shape[0]):
        if not (v[i] >= 0.0 and v[i] <= MAX_ROUTED_TOKENS):
            return i
    return -1


@njit(**NJIT)
def _bad_tokens_2d(a):
    """:func:`_bad_tokens` of a C-contiguous float64 matrix: the flat index of its first bad
    value, -1. Row by row (a row has the vectors' type, so one compiled ``_bad_tokens``
    serves both; ``a.ravel()`` would compile numba's reshape code)."""
    for r in range(a.shape[0]):
        i = _bad_tokens(a[r])
        if i >= 0:
            return r * a.shape[1] + i
    return -1


@njit(**NJIT)
def _bad_count(x):
    """Index of the first negative entry of an int64 vector, -1."""
    for i in range(x.shape[0]):
        if x[i] < 0:
            return i
    return -1


@njit(**NJIT_INLINE)
def check_inputs_kernel(pool, reps):
    """``(code, index)``: ``(0, -1)`` when every value is valid, else the first bad array (its
    code in :data:`BAD_INPUT`) and the flat index of its first bad value, in one pass.

    Token arrays (prefill, loads, prompt and waiting tokens, cached) must lie in
    ``[0, MAX_ROUTED_TOKENS]``; counts must be ``>= 0``; the free slots must also sum to at most
    ``2**63 - 1`` (index: where the running sum would overflow); ``kv_usage`` finite
    ``>= 0``; ``kv_capacity > 0`` (``inf`` allowed); request keys ``>= 0``.
    """
    i = _bad_tokens(pool.prefill)
    if i >= 0:
        return 1, i
    i = _bad_tokens_2d(reps.loads)
    if i >= 0:
        return 2, i
    total = 0
    free = reps.free_slots
    for g in range(free.shape[0]):
        if free[g] < 0 or free[g] > 9223372036854775807 - total:
            return 3, g
        total += free[g]
    i = _bad_count(reps.n_running)
    if i >= 0:
        return 4, i
    i = _bad_count(reps.n_waiting)
    if i >= 0:
        return 5, i
    i = _bad_tokens(reps.prompt_tokens)
    if i >= 0:
        return 6, i
    i = _bad_tokens(reps.waiting_tokens)
    if i >= 0:
        return 7, i
    u = reps.kv_usage
    for g in range(u.shape[0]):
        if not (u[g] >= 0.0 and u[g] < np.inf):
            return 8, g
    c = reps.kv_capacity
    for g in range(c.shape[0]):
        if not (c[g] > 0.0):
            return 9, g
    i = _bad_count(pool.wait)
    if i >= 0:
        return 10, i
    i = _bad_tokens_2d(pool.cached)
    if i >= 0:
        return 11, i
    i = _bad_count(pool.key)
    if i >= 0:
        return 12, i
    return 0, -1


#: The call of a policy's kernel by the address of its code: ``(int64[::1] assignment, carry)``
#: back, whatever the kernel (:func:`~straggler.solvers._numba.address.address_call`).
_CALL_POLICY = address_call(lambda argtypes: types.Tuple((types.int64[::1], argtypes[3])))


def call_policy(kernel, pool, reps, opts, carry, seed):
    """``kernel(pool, reps, opts, carry, seed)``: one call of a policy's kernel.

    In jitted code ``kernel`` is the address of the kernel's compiled code for exactly the
    argument types of the call (an int64, :func:`policy_address`), and the call is an
    indirect call of that code (:mod:`straggler.solvers._numba.address`): a jitted caller
    compiles once for every policy and never includes a policy's code. In Python (a
    ``py_func``, or ``NUMBA_DISABLE_JIT=1``) ``kernel`` is the kernel itself."""
    return kernel(pool, reps, opts, carry, seed)


@overload(call_policy)
def _call_policy_jit(kernel, pool, reps, opts, carry, seed):
    if not isinstance(kernel, types.Integer):
        return None

    def impl(kernel, pool, reps, opts, carry, seed):
        return _CALL_POLICY(kernel, pool, reps, opts, carry, seed)

    return impl


def policy_address(kernel, name: str, argtypes, func: str) -> int:
    """The address of the code of ``kernel`` (the ``@njit`` kernel of the policy ``name``)
    for the numba types ``argtypes`` ``(PoolState, ReplicaState, RouterOptions, int64[::1]
    carry, int64)``, compiled without a CPython wrapper or loaded from numba's disk cache
    (:func:`~straggler.solvers._numba.address.wrapperless_address`), for :func:`call_policy`
    in jitted code that passes exactly those types; with ``NUMBA_DISABLE_JIT=1``, the kernel
    itself.

    Raises :class:`~straggler.formulations.errors.InvalidInputError` (naming ``func``, the
    caller, and the policy) when ``kernel`` is not an ``@njit`` function or does not return
    ``(int64 C-contiguous array, int64 C-contiguous carry)``: the indirect call relies on
    both.
    """
    if not hasattr(route_batch_kernel, "compile"):  # NUMBA_DISABLE_JIT=1
        return kernel
    if not hasattr(kernel, "compile"):
        raise InvalidInputError(
            f"{func}: the kernel of routing policy {name!r} must be a numba.njit function "
            f"(jitted code calls it), got {type(kernel).__name__}"
        )
    argtypes = tuple(argtypes)
    address, returns = wrapperless_address(kernel, argtypes)
    want = types.Tuple((types.int64[::1], argtypes[3]))
    if returns != want:
        raise InvalidInputError(
            f"{func}: the kernel of routing policy {name!r} must return (assignment int64 "
            f"C-contiguous array, carry), i.e. {want}; it returns {returns}"
        )
    return address


@njit(**NJIT)
def route_batch_kernel(
    kernel,
    prefill,
    wait,
    key,
    cached,
    loads,
    free_slots,
    n_running,
    n_waiting,
    prompt_tokens,
    waiting_tokens,
    kv_usage,
    kv_capacity,
    opts,
    carry,
    seed,
    assignment,
    loads_after,
):
    """One call for ``route_batch``: value check, the policy's kernel (``kernel``: its
    address, :func:`policy_address`, for the argument types of this call; see
    :func:`call_policy`), the tick summary. Compiled once for every policy.

    Takes the fields of :class:`PoolState` and :class:`ReplicaState` as flat arrays (cheaper to
    pass from Python than two tuples), and fills ``assignment`` (int64 ``(n,)``) and
    ``loads_after`` (float64 ``(G,)``), fresh arrays of the caller (numba boxes an array it
    creates by unpickling ``numpy.ndarray`` each call, dearer than taking one in). Returns
    ``(code, index, I_before, I_after, n_placed, S_tot, ns, carry_out)``; ``(code, index)``
    as in :func:`check_inputs_kernel` (nothing is routed and nothing filled when ``code !=
    0``); ``S_tot`` = total free slots at the start of the tick; ``ns`` the kernel's and the
    summary's time; ``carry_out`` the policy's memory after the tick (the array passed in,
    the very object, when the policy left it unchanged: numba returns an argument's array as
    itself).
    """
    pool = PoolState(prefill, wait, key, cached)
    reps = ReplicaState(
        loads,
        free_slots,
        n_running,
        n_waiting,
        prompt_tokens,
        waiting_tokens,
        kv_usage,
        kv_capacity,
    )
    code, index = check_inputs_kernel(pool, reps)
    if code != 0:
        return code, index, 0.0, 0.0, 0, 0, 0, carry
    t0 = monotonic_ns()
    out, new_carry = call_policy(kernel, pool, reps, opts, carry, seed)
    before, after, L, placed = tick_summary_kernel(loads, prefill, out)
    ns = monotonic_ns() - t0
    # element loops, not slice assignments: those compile numba's shape-mismatch error path
    # (string formatting, about a second and a half of a cold compile)
    for i in range(out.shape[0]):
        assignment[i] = out[i]
    s_tot = 0
    for g in range(free_slots.shape[0]):
        loads_after[g] = L[g]
        s_tot += free_slots[g]
    return 0, -1, before, after, placed, s_tot, ns, new_carry


# the call of the policy's kernel is emitted by solvers/_numba/address.py, the clock read by
# solvers/_numba/clock.py
cache_depends_on(route_batch_kernel, _address, _clock)
