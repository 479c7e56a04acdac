"""DP decode routing: :func:`route_batch` (BalanceRoute BR-0 / BR-H and the deployed baselines).

One tick of the router: the pool's ready requests are assigned to ``G`` lock-step decode
replicas. ``route_batch`` validates once (one vectorized function), packs the scalar options
into a ``params`` vector and calls one Numba kernel from :data:`ROUTING_KERNELS`.

For a jitted caller (the simulator's step loop) every kernel shares one signature::

    kernel(prefill, loads, free_slots, n_running, n_waiting, params, seed) -> assignment

with ``prefill`` float64 (n,), ``loads`` float64 (G, H+1) C-contiguous (column 0 = current
loads), ``free_slots``/``n_running``/``n_waiting`` int64 (G,), ``params`` from
:func:`make_params` (float64, indices ``P_*`` below), ``seed`` int64 >= 0; ``assignment`` is a
fresh int64 (n,) array, -1 for a request that stays in the pool. Kernels assume valid input
(see :func:`validate_routing_input`) and never mutate their arguments. :data:`POLICY_IDS` gives
each policy a stable integer for ``if``-dispatch inside a jitted loop.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..formulations.errors import InvalidOptionError, param_error
from ._routing_kernels import (
    N_PARAMS,
    P_ALPHA,
    P_BETA,
    P_CURSOR,
    P_GAMMA,
    P_OPTIMISTIC,
    P_R_MAX,
    P_S_GREEDY,
    POLICY_NAMES,
    br0_kernel,
    brh_kernel,
    check_inputs_kernel,
    jsq_kernel,
    jsq_requests_kernel,
    p2c_kernel,
    project_loads_kernel,
    random_kernel,
    round_robin_kernel,
    route_batch_kernel,
    route_tick_kernel,
    trtllm_kernel,
    vllm_kernel,
)

__all__ = [
    "route_batch",
    "RoutingDecision",
    "ROUTING_KERNELS",
    "POLICY_IDS",
    "POLICIES",
    "route_tick_kernel",
    "make_params",
    "default_s_greedy",
    "validate_routing_input",
    "project_loads",
    "presence_from_prediction",
    "new_request_presence",
    "N_PARAMS",
    "P_R_MAX",
    "P_S_GREEDY",
    "P_ALPHA",
    "P_BETA",
    "P_GAMMA",
    "P_OPTIMISTIC",
    "P_CURSOR",
]

#: Policy name -> Numba kernel with the common signature (see the module docstring).
ROUTING_KERNELS: dict = {
    "br0": br0_kernel,
    "brh": brh_kernel,
    "round_robin": round_robin_kernel,
    "random": random_kernel,
    "jsq": jsq_kernel,
    "jsq_requests": jsq_requests_kernel,
    "vllm": vllm_kernel,
    "p2c": p2c_kernel,
    "trtllm": trtllm_kernel,
}
#: Stable integer id of each policy: ``route_tick_kernel(POLICY_IDS[name], *kernel_args)``
#: calls that policy's kernel from inside jitted code.
POLICY_IDS = {name: k for k, name in enumerate(POLICY_NAMES)}
POLICIES = POLICY_NAMES

_EXTRA = frozenset({"n_running", "n_waiting", "optimistic", "cursor", "new_presence"})
_BIG = 1e300  # alpha and beta must be finite
_FUNC = "route_batch"


def default_s_greedy(n_replicas: int, r_max: int) -> int:
    """``S_greedy = G * R_max`` (the paper gives no value).

    Below it each replica has on average at most ``R_max`` free slots, so one Stage-2 pop per
    replica (a subset of at most ``R_max`` requests) can use every slot; this is where slots
    are scarce and each one should be chosen by subset search. Above it, margins are filled
    greedily (Stage 1) at O(G + log n) per placement.

    Examples
    --------
    >>> default_s_greedy(16, 4)
    64
    """
    return int(n_replicas) * int(r_max)


def make_params(
    *,
    r_max: int = 4,
    s_greedy: float = 0.0,
    alpha: float = 1.0,
    beta: float = 1.0,
    gamma: float = 1.0,
    optimistic: bool = True,
    cursor: int = 0,
    new_presence=None,
) -> np.ndarray:
    """The ``params`` vector of the kernels (no validation: use :func:`route_batch` for that).

    ``new_presence`` (BR-H, optional): the ``H+1`` presence weights ``pi_h`` appended after
    the ``N_PARAMS`` scalars (see :func:`new_request_presence`).

    Examples
    --------
    >>> make_params(r_max=4, s_greedy=32, beta=8).tolist()
    [4.0, 32.0, 1.0, 8.0, 1.0, 1.0, 0.0]
    >>> make_params(new_presence=[1.0, 0.5]).size
    9
    """
    w = () if new_presence is None else np.asarray(new_presence, dtype=np.float64).ravel()
    p = np.empty(N_PARAMS + len(w))
    p[N_PARAMS:] = w
    p[P_R_MAX] = r_max
    p[P_S_GREEDY] = s_greedy
    p[P_ALPHA] = alpha
    p[P_BETA] = beta
    p[P_GAMMA] = gamma
    p[P_OPTIMISTIC] = 1.0 if optimistic else 0.0
    p[P_CURSOR] = cursor
    return p


@dataclass(frozen=True, eq=False, kw_only=True)
class RoutingDecision:
    """What :func:`route_batch` returns.

    Attributes
    ----------
    assignment : ndarray of int64, shape (n_pool,)
        Replica of each pool request, ``-1`` when it stays in the pool.
    imbalance_before, imbalance_after : float
        ``G*max L - sum L`` on current loads (column 0) before and after adding the placed
        prefill lengths.
    n_placed : int
    policy : str
    stage : int
        BR-0/BR-H: 1 when the tick started in Stage 1 (``S_tot > S_greedy``), else 2; 0 for
        the baselines.
    runtime_s : float
        Wall time of the whole call (validation included).
    extras : dict
        ``next_cursor`` for round-robin, ``s_greedy`` for BR-0/BR-H.
    """

    assignment: np.ndarray
    imbalance_before: float
    imbalance_after: float
    n_placed: int
    policy: str
    stage: int
    runtime_s: float
    extras: dict = field(default_factory=dict)


def _as(x, name, dtype, ndim):
    """``x`` as an array of ``dtype`` (no copy when it already is one) with ``ndim`` in ndim."""
    if isinstance(x, np.ndarray) and x.dtype == dtype:
        a = x
    else:
        try:
            a = np.asarray(x)
            if (
                dtype == np.int64
                and a.size
                and (
                    a.dtype.kind not in "iuf" or (a.dtype.kind == "f" and np.any(a != np.floor(a)))
                )
            ):
                raise TypeError
            a = a.astype(dtype)
        except (TypeError, ValueError):
            kind = "integers" if dtype == np.int64 else "numbers"
            raise param_error(name, _FUNC, f"an array of {kind}", repr(x)) from None
    if a.ndim not in ndim:
        raise param_error(
            name,
            _FUNC,
            f"an array with {' or '.join(map(str, ndim))} dimension(s)",
            f"shape {a.shape}",
        )
    return a


def _counts(x, name, G):
    if x is None:
        return np.zeros(G, np.int64)
    a = _as(x, name, np.int64, (1,))
    if a.shape[0] != G or (G and a.min() < 0):
        raise param_error(name, _FUNC, f"a 1-D array of G = {G} non-negative integers", f"{a!r}")
    return a


def _raise_bad(code: int) -> None:
    if code:
        name, expected = _BAD[code]
        raise param_error(name, _FUNC, expected, "NaN, infinite or negative values")


_BAD = {
    1: ("prefill_lengths", "an array of finite non-negative numbers"),
    2: ("loads", "an array of finite non-negative numbers"),
    3: ("free_slots", "an array of non-negative integers"),
}


def validate_routing_input(prefill_lengths, loads, free_slots, policy, options, *, values=True):
    """Validate every argument of :func:`route_batch` once; return normalized arrays.

    Returns ``(prefill float64 (n,), loads float64 (G, H+1) C-contiguous, free int64 (G,),
    n_running int64 (G,), n_waiting int64 (G,))``. Shapes and dtypes are checked here, values
    (NaN, infinite, negative) in one jitted pass. Raises :class:`InvalidInputError` (or
    :class:`InvalidOptionError` for an unknown policy or option) naming the parameter.
    """
    if policy not in ROUTING_KERNELS:
        raise param_error(
            "policy", _FUNC, f"one of {sorted(ROUTING_KERNELS)}", repr(policy), InvalidOptionError
        )
    if options and not _EXTRA.issuperset(options):
        raise InvalidOptionError(
            f"route_batch got unknown option(s) {sorted(set(options) - _EXTRA)}; expected some "
            f"of {sorted(_EXTRA)}."
        )
    s = _as(prefill_lengths, "prefill_lengths", np.float64, (1,))
    L = _as(loads, "loads", np.float64, (1, 2))
    if L.ndim == 1:
        L = L.reshape(-1, 1)
    elif not L.flags.c_contiguous:
        L = np.ascontiguousarray(L)
    G = L.shape[0]
    if G == 0 or L.shape[1] == 0:
        raise param_error(
            "loads", _FUNC, "a non-empty (G,) or (G, H+1) array", f"shape {np.shape(loads)}"
        )
    free = _as(free_slots, "free_slots", np.int64, (1,))
    if free.shape[0] != G:
        raise param_error(
            "free_slots",
            _FUNC,
            f"a 1-D array of length G = {G} (loads.shape[0])",
            f"shape {free.shape}",
        )
    if values:
        _raise_bad(check_inputs_kernel(s, L, free))
    if options:
        n_run = _counts(options.get("n_running"), "n_running", G)
        n_wait = _counts(options.get("n_waiting"), "n_waiting", G)
    else:
        n_run = n_wait = np.zeros(G, np.int64)
    return s, L, free, n_run, n_wait


def _scalar(value, name, lo, hi, *, integer=False, lo_open=False):
    bad = isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
    if not bad:
        v = float(value)
        bad = not (v > lo if lo_open else v >= lo) or not v <= hi or (integer and v != int(v))
    if bad:
        kind = "an integer" if integer else "a number"
        lb = f"({lo}" if lo_open else f"[{lo}"
        raise param_error(name, _FUNC, f"{kind} in {lb}, {hi}]", repr(value))
    return float(value)


def route_batch(
    prefill_lengths,
    loads,
    free_slots,
    *,
    policy: str = "br0",
    r_max: int = 4,
    s_greedy: float | None = None,
    alpha: float = 1.0,
    beta: float | None = None,
    gamma: float = 1.0,
    rng=None,
    **params,
) -> RoutingDecision:
    r"""Route one tick of ready requests to ``G`` lock-step decode replicas.

    BR-0 (``policy="br0"``), BalanceRoute 关键设计 2, on current loads ``L = loads[:, 0]``,
    ``M = max L``, margins ``m_g = M - L_g``, F-score ``F_g(Q) = D(Q) - G*(D(Q) - m_g)_+``.
    Until the pool is empty or no free slot is left, repeat:

    1. Pop the replica ``g`` with a free slot that is largest in ``(cap_g, m_g)``
       (lexicographic; ties to the lowest index). The priority queue is an O(G) scan over
       the live keys: each placement can raise ``M`` and so moves every margin.
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
    now is still resident then (``d_h = gamma^h * pi_h``; :func:`new_request_presence`), and
    ``project_loads(..., refill=...)`` lets a slot freed within the horizon hold a new request
    instead of staying empty (the study behind them: ``benchmarks/routing_table.py``).

    Baselines (all place in pool order, only on replicas with a free slot): ``round_robin``
    (cyclic from ``cursor``), ``random`` (uniform, seeded), ``jsq`` (SGLang ``total_tokens``:
    fewest tokens, then fewest requests, ties to the lowest index), ``jsq_requests`` (fewest
    running + waiting requests, lowest index), ``vllm`` (lowest ``4*waiting + running``, lowest
    index; update ``waiting += 1``), ``p2c`` (two distinct random replicas, fewer tokens wins,
    ties to the first draw), ``trtllm`` (longest prompt first, ties to the lower index;
    min-heap on ``(tokens, requests, rank)`` with per-rank cap
    ``max(ceil((sum active + n_new)/G), max active)``, ``n_new = min(n_pool, S_tot)``).

    Parameters
    ----------
    prefill_lengths : array, shape (n_pool,)
        Prefill (prompt) lengths ``s_i >= 0`` of the pool, oldest first.
    loads : array, shape (G,) or (G, H+1)
        Current loads (resident KV tokens) or projected loads (column 0 = current). Policies
        other than ``brh`` read column 0 only.
    free_slots : array of int, shape (G,)
        Free request slots per replica.
    policy : str
        One of :data:`POLICIES`.
    r_max : int
        ``R_max``, Stage-2 candidates, 1..16 (default 4, the paper's example).
    s_greedy : float, optional
        Stage-1 threshold; default :func:`default_s_greedy` ``= G * r_max``.
    alpha, beta, gamma : float
        BR-H weights; ``beta`` defaults to ``G``; ``gamma`` in (0, 1].
    rng : None, int or numpy Generator
        Seed of ``random`` and ``p2c`` (a Generator is drawn from once).
    **params
        ``n_running``, ``n_waiting`` (int (G,), default zeros): request counts per replica
        (JSQ tie-break, ``jsq_requests``, ``vllm``, ``trtllm``); ``optimistic`` (bool, default
        True); ``cursor`` (int, round-robin start, default 0); ``new_presence`` (BR-H: array of
        ``H+1`` weights in [0, 1], default none).

    Returns
    -------
    RoutingDecision

    Raises
    ------
    InvalidInputError
        Negative, NaN or infinite lengths or loads, shape mismatches, negative free slots or
        counts, out-of-range options (the message names the parameter).
    InvalidOptionError
        Unknown policy or keyword option.

    Notes
    -----
    Cost per tick, ``P`` placements (``P2`` in Stage 2): BR-0 ``O(n + P*(G + R_max log n)
    + P2*2^R_max)`` (the pool is radix-sorted once; the ranking merges two walks from the
    margin, Theorem R2, over a bitset of live positions; a Stage-1 pop is one binary search
    and a few bitset look-ups, ``n <= 4096`` needing one summary word); BR-H
    ``O(P*(G*H + e*H))`` with ``e`` the requests evaluated by its two walks from the peak of the
    concave score (all of them in the worst case); baselines ``O(n*G)`` (trtllm adds
    ``O(n log n)``). The kernels equal their plain-Python references (which rank the whole
    pool on every pop) decision for decision.

    Deviations from the paper: it states neither ``S_greedy`` nor the candidate order nor the
    tie-breaks; the choices above are ours. The replica key ``(cap_g, m_g)`` is read as
    lexicographic (free slots first), as the paper writes the tuple.

    References
    ----------
    BalanceRoute (arXiv 2605.06113) 关键设计 1-3; ANCHORS.md "DP routers".

    Examples
    --------
    >>> d = route_batch([6, 2, 3], [10, 4, 7], [1, 2, 1])
    >>> d.assignment.tolist(), d.imbalance_before, d.imbalance_after, d.stage
    ([1, 0, 2], 9.0, 4.0, 2)
    >>> d = route_batch([6, 2, 3], [10, 4, 7], [1, 2, 1], policy="jsq")
    >>> d.assignment.tolist(), d.imbalance_after
    ([1, 2, 0], 7.0)
    >>> d = route_batch([5, 5], [0, 0, 0], [1, 1, 1], policy="round_robin", cursor=2)
    >>> d.assignment.tolist(), d.extras["next_cursor"]
    ([2, 0], 1)
    """
    t0 = time.perf_counter()
    s, L, free, n_run, n_wait = validate_routing_input(
        prefill_lengths, loads, free_slots, policy, params, values=False
    )
    G = L.shape[0]
    p, s_greedy, cursor = _options(G, r_max, s_greedy, alpha, beta, gamma, params)
    if params and params.get("new_presence") is not None:
        w = _as(params["new_presence"], "new_presence", np.float64, (1,))
        if w.shape[0] != L.shape[1] or not np.all((w >= 0.0) & (w <= 1.0)):
            raise param_error(
                "new_presence",
                _FUNC,
                f"H+1 = {L.shape[1]} numbers in [0, 1] (one per column of loads)",
                repr(params["new_presence"]),
            )
        p = np.concatenate([p, w])
    seed = _seed(rng) if policy in ("random", "p2c") else 0
    # value checks, the kernel and the summary in one jitted call
    code, out, before, after, placed, s_tot = route_batch_kernel(
        POLICY_IDS[policy], s, L, free, n_run, n_wait, p, seed
    )
    if code:
        _raise_bad(code)
    extras = {}
    stage = 0
    if policy in ("br0", "brh"):
        stage = 1 if s_tot > s_greedy else 2
        extras["s_greedy"] = s_greedy
    elif policy == "round_robin":
        used = out[out >= 0]
        extras["next_cursor"] = int((used[-1] + 1) % G) if used.size else cursor % G
    return RoutingDecision(
        assignment=out,
        imbalance_before=float(before),
        imbalance_after=float(after),
        n_placed=int(placed),
        policy=policy,
        stage=stage,
        runtime_s=time.perf_counter() - t0,
        extras=extras,
    )


#: Validated ``(params, s_greedy, cursor)`` of recent option values, keyed by their exact
#: types and values (``1``, ``1.0`` and ``True`` are different keys); the kernels never write
#: to ``params``, so one vector serves every call with the same options.
_OPTIONS_CACHE: dict = {}


def _options(G, r_max, s_greedy, alpha, beta, gamma, options):
    """Validate the scalar options of :func:`route_batch`; return ``(params, s_greedy, cursor)``."""
    optimistic = options.get("optimistic", True) if options else True
    cursor = options.get("cursor", 0) if options else 0
    key = (G, r_max, s_greedy, alpha, beta, gamma, optimistic, cursor)
    key = (key, tuple(map(type, key)))
    try:
        hit = _OPTIONS_CACHE.get(key)
    except TypeError:  # an unhashable option: validated (and rejected) below
        key = hit = None
    if hit is not None:
        return hit
    r_max = int(_scalar(r_max, "r_max", 1, 16, integer=True))
    if s_greedy is None:
        s_greedy = default_s_greedy(G, r_max)
    s_greedy = _scalar(s_greedy, "s_greedy", 0.0, math.inf)
    alpha = _scalar(alpha, "alpha", 0.0, _BIG, lo_open=True)
    beta = float(G) if beta is None else _scalar(beta, "beta", 0.0, _BIG)
    gamma = _scalar(gamma, "gamma", 0.0, 1.0, lo_open=True)
    if not isinstance(optimistic, (bool, np.bool_)):
        raise param_error("optimistic", _FUNC, "a bool", repr(optimistic))
    cursor = int(_scalar(cursor, "cursor", 0, 2**62, integer=True))
    p = make_params(
        r_max=r_max,
        s_greedy=s_greedy,
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        optimistic=bool(optimistic),
        cursor=cursor,
    )
    hit = (p, s_greedy, cursor)
    if key is not None:
        if len(_OPTIONS_CACHE) >= 256:
            _OPTIONS_CACHE.clear()
        _OPTIONS_CACHE[key] = hit
    return hit


def _seed(rng) -> int:
    if rng is None:
        return int(np.random.default_rng().integers(2**62))
    if isinstance(rng, np.random.Generator):
        return int(rng.integers(2**62))
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool) and rng >= 0:
        return int(rng)
    raise param_error("rng", _FUNC, "None, a non-negative int seed or a numpy Generator", repr(rng))


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
    while it is (expected to be) resident, with ``c_i`` from :func:`presence_from_prediction`
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
    predictor : object with ``predict(prompt, decoded, horizon, *, prefix=None, output=None)
        -> (p_fin, mu_rem)`` (see :mod:`straggler.solvers.predictors`).
    horizon : int
        ``H >= 0``.
    refill : float >= 0 or "pool"

    Examples
    --------
    >>> from straggler.formulations import ClusterState
    >>> from straggler.solvers.predictors import OraclePredictor
    >>> st = ClusterState(free_slots=[1, 1], running_replica=[0, 1], running_prompt=[4, 2],
    ...                   running_decoded=[0, 0], running_output=[2, 5], pool_prefill=[3, 7])
    >>> project_loads(st, OraclePredictor(), 3).tolist()
    [[4.0, 5.0, 0.0, 0.0], [2.0, 3.0, 4.0, 5.0]]
    >>> project_loads(st, OraclePredictor(), 3, refill="pool").tolist()
    [[4.0, 5.0, 5.0, 5.0], [2.0, 3.0, 4.0, 5.0]]
    """
    if not isinstance(horizon, (int, np.integer)) or isinstance(horizon, bool) or horizon < 0:
        raise param_error("horizon", "project_loads", "an integer >= 0", repr(horizon))
    H = int(horizon)
    if isinstance(refill, str) and refill == "pool":
        pool = np.asarray(state.pool_prefill, dtype=np.float64)
        refill = float(pool.mean()) if pool.size else 0.0
    elif (
        isinstance(refill, bool)
        or not isinstance(refill, (int, float, np.integer, np.floating))
        or not 0.0 <= refill < math.inf
    ):
        raise param_error("refill", "project_loads", 'a finite number >= 0 or "pool"', repr(refill))
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


def new_request_presence(output_lengths, horizon: int) -> np.ndarray:
    """``pi_h = P(output > h)``, ``h = 0..H``: the chance that a request placed now is still
    resident ``h`` steps later (it leaves after ``output`` decode steps), from a sample of
    output lengths (the empirical survival at age 0). For ``route_batch(..., new_presence=)``.

    Examples
    --------
    >>> new_request_presence([1, 2, 2, 4], 3).tolist()
    [1.0, 0.75, 0.25, 0.25]
    """
    o = np.sort(np.asarray(output_lengths, dtype=np.float64).ravel())
    if o.size == 0 or not np.all(np.isfinite(o)) or o[0] < 1:
        raise param_error(
            "output_lengths",
            "new_request_presence",
            "a non-empty array of numbers >= 1",
            repr(output_lengths),
        )
    if not isinstance(horizon, (int, np.integer)) or isinstance(horizon, bool) or horizon < 0:
        raise param_error("horizon", "new_request_presence", "an integer >= 0", repr(horizon))
    h = np.arange(int(horizon) + 1, dtype=np.float64)
    return (o.size - np.searchsorted(o, h, side="right")) / o.size
