"""Hypothesis strategies for the routing problem (small sizes first; zeros, ties, G = 1).

``routing_instances()`` draws one routing tick as a dict: ``pool`` (a ``PoolState``),
``reps`` (a ``ReplicaState`` with loads ``(G, H+1)``), ``options`` (a value drawn for each
option of the library's policies, by name; None: the default), ``counters`` and ``flags``
(values for a policy's memory) and ``seed``; :func:`kernel_args` turns it into the arguments
of the common kernel signature (:mod:`straggler.solvers.routing._core`) for one policy.
Values are small integers so that every float sum is exact and ties are frequent.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

__all__ = ["routing_instances", "kernel_args", "best_tick_imbalance"]


@st.composite
def routing_instances(
    draw,
    *,
    max_replicas: int = 5,
    max_pool: int = 9,
    max_horizon: int = 0,
    max_len: int = 40,
    max_slots: int = 4,
    max_r: int = 4,
    fractional: bool = False,
):
    """A random routing tick (see the module docstring; :func:`kernel_args` for a policy).

    ``fractional=True`` adds quarter-token fractions to the loads (as projected loads have).
    Every field of the replica and pool states is drawn (counts, prompt tokens, KV usage and
    capacity, waits, keys, and a prefix-cache matrix half of the time), and so are the
    options and a policy's memory; the version is the current one (the tests set each
    version in turn).
    """
    from straggler.solvers.routing._core import PoolState, ReplicaState

    G = draw(st.integers(1, max_replicas))
    n = draw(st.integers(0, max_pool))
    H = draw(st.integers(0, max_horizon))
    lens = st.integers(0, max_len)

    def ints(lo, hi, size):
        return np.array(draw(st.lists(st.integers(lo, hi), min_size=size, max_size=size)))

    prefill = np.array(draw(st.lists(lens, min_size=n, max_size=n)), dtype=np.float64)
    loads = ints(0, 3 * max_len, G * (H + 1)).astype(np.float64).reshape(G, H + 1)
    if fractional:
        loads = loads + ints(0, 3, G * (H + 1)).astype(np.float64).reshape(G, H + 1) / 4
    cap = ints(1, 8 * max_len, G).astype(np.float64)
    if draw(st.booleans()):
        cap[:] = np.inf  # unbounded KV (the default of route_batch)
    reps = ReplicaState(
        loads=loads,
        free_slots=ints(0, max_slots, G).astype(np.int64),
        n_running=ints(0, 6, G).astype(np.int64),
        n_waiting=ints(0, 3, G).astype(np.int64),
        prompt_tokens=ints(0, 3 * max_len, G).astype(np.float64),
        waiting_tokens=ints(0, max_len, G).astype(np.float64),
        kv_usage=loads[:, 0] / cap,
        kv_capacity=cap,
    )
    cached = np.zeros((0, G))
    if draw(st.booleans()):
        cached = ints(0, max_len, n * G).astype(np.float64).reshape(n, G)
    pool = PoolState(
        prefill=prefill,
        wait=ints(0, 5, n).astype(np.int64),
        key=np.arange(n, dtype=np.int64) * 7 + draw(st.integers(0, 100)),
        cached=cached,
    )

    # every option drawn from the values users get (None: the registry's default) and a few
    # others that move the decisions
    def opt(*values):
        return draw(st.sampled_from((None, *values)))

    r_max = draw(st.integers(1, max_r))
    options = dict(
        r_max=r_max,
        s_greedy=opt(0, 2, 4, 8, 1000),
        alpha=opt(0.5, 2.0),
        beta=opt(0.0, 1.0, 2.0 * G),
        gamma=opt(0.5, 0.9),
        optimistic=opt(False),
        age_window=opt(0, 1, 3, 32),
        window=opt(0, 1, 2),
        patience=opt(0, 2),
        age_fraction=opt(1.0, 0.5, 0.0),
        safe=opt(False),
        kv_weight=opt(0.0, 1.0),
        throughput=opt(7.0),
        block_size=opt(1, 4),
        overlap_weight=opt(0.0, 2.0),
        timeout_iters=opt(0, 1, 2),
        batching_wait_iters=opt(0, 1),
    )
    # a policy's memory: its k-th int field takes counters[k] (a cursor, a start index, a
    # hold-back counter), its k-th bool field flags[k] (a backlog)
    counters = draw(st.lists(st.integers(0, max(G, 3)), min_size=4, max_size=4))
    flags = draw(st.lists(st.booleans(), min_size=4, max_size=4))
    return dict(
        pool=pool,
        reps=reps,
        options=options,
        counters=counters,
        flags=flags,
        seed=draw(st.integers(0, 2**40)),
    )


def kernel_args(inst: dict, policy, **options) -> tuple:
    """The positional arguments of the common kernel signature for ``policy`` (a name or a
    ``RoutingPolicy``), in order: its options from ``inst``'s drawn values of the options it
    accepts, ``options`` (a ``version`` by name among them) taking precedence; its memory from
    ``inst``'s counters and flags."""
    import numpy as np
    from straggler.solvers.routing._core import carry_kinds
    from straggler.solvers.routing.registry import get_routing_policy, router_options

    pol = policy if not isinstance(policy, str) else get_routing_policy(policy)
    reps = inst["reps"]
    G, H = reps.loads.shape[0], reps.loads.shape[1] - 1
    drawn = {k: v for k, v in inst["options"].items() if k in pol.options and v is not None}
    opts, _ = router_options(pol, G, H, **{**drawn, **options})
    kinds = carry_kinds(pol.carry)
    carry = np.array(
        [inst["flags"][k] if kind is bool else inst["counters"][k] for k, kind in enumerate(kinds)],
        dtype=np.int64,
    )
    return (inst["pool"], reps, opts, carry, inst["seed"])


def best_tick_imbalance(prefill, loads, free_slots) -> float:
    """Brute force: the smallest imbalance ``G*max L - sum L`` after any tick that places
    ``min(n, S_tot)`` requests (each on a replica with a free slot), over every assignment.

    Exponential (``(G+1)^n``); for small instances only.

    Examples
    --------
    >>> best_tick_imbalance([3.0, 2.0], [5.0, 0.0], [1, 1])  # 3 -> replica 1, 2 -> replica 0
    4.0
    """
    import itertools

    s = [float(x) for x in prefill]
    L0 = [float(x) for x in loads]
    cap = [int(c) for c in free_slots]
    G, n = len(L0), len(s)
    k = min(n, sum(cap))
    best = float("inf")
    for a in itertools.product(range(-1, G), repeat=n):
        if sum(1 for g in a if g >= 0) != k:
            continue
        if any(sum(1 for g in a if g == j) > cap[j] for j in range(G)):
            continue
        L = list(L0)
        for i, g in enumerate(a):
            if g >= 0:
                L[g] += s[i]
        best = min(best, G * max(L) - sum(L))
    return best
