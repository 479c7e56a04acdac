"""Hypothesis strategies for the routing problem (small sizes first; zeros, ties, G = 1).

``routing_instances()`` draws the arguments of the common kernel signature of
:mod:`straggler.solvers.routing` as a dict: ``prefill``, ``loads`` (G, H+1), ``free_slots``,
``n_running``, ``n_waiting``, ``params`` (via ``make_params``), ``seed``. Values are small
integers so that every float sum is exact and ties are frequent.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

__all__ = ["routing_instances", "kernel_args"]


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
    """A random routing tick (dict of the kernel arguments).

    ``fractional=True`` adds quarter-token fractions to the loads (as projected loads have).
    """
    from straggler.solvers.routing import make_params

    G = draw(st.integers(1, max_replicas))
    n = draw(st.integers(0, max_pool))
    H = draw(st.integers(0, max_horizon))
    lens = st.integers(0, max_len)
    prefill = np.array(draw(st.lists(lens, min_size=n, max_size=n)), dtype=np.float64)
    loads = np.array(
        draw(st.lists(st.integers(0, 3 * max_len), min_size=G * (H + 1), max_size=G * (H + 1))),
        dtype=np.float64,
    ).reshape(G, H + 1)
    if fractional:
        q = draw(st.lists(st.integers(0, 3), min_size=G * (H + 1), max_size=G * (H + 1)))
        loads = loads + np.array(q, dtype=np.float64).reshape(G, H + 1) / 4
    free = np.array(draw(st.lists(st.integers(0, max_slots), min_size=G, max_size=G)), np.int64)
    n_running = np.array(draw(st.lists(st.integers(0, 6), min_size=G, max_size=G)), np.int64)
    n_waiting = np.array(draw(st.lists(st.integers(0, 3), min_size=G, max_size=G)), np.int64)
    r_max = draw(st.integers(1, max_r))
    params = make_params(
        r_max=r_max,
        s_greedy=draw(st.sampled_from([0, 2, 4, 8, G * r_max, 1000])),
        alpha=draw(st.sampled_from([1.0, 0.5, 2.0])),
        beta=draw(st.sampled_from([float(G), 0.0, 1.0, 2.0 * G])),
        gamma=draw(st.sampled_from([1.0, 0.5, 0.9])),
        optimistic=draw(st.booleans()),
        cursor=draw(st.integers(0, G)),
    )
    return dict(
        prefill=prefill,
        loads=loads,
        free_slots=free,
        n_running=n_running,
        n_waiting=n_waiting,
        params=params,
        seed=draw(st.integers(0, 2**40)),
    )


def kernel_args(inst: dict) -> tuple:
    """The positional arguments of the common kernel signature, in order."""
    return (
        inst["prefill"],
        inst["loads"],
        inst["free_slots"],
        inst["n_running"],
        inst["n_waiting"],
        inst["params"],
        inst["seed"],
    )
