"""Optimal semi-matching (TEMPO Lemma 2): kernel and plain-Python reference.

Problem: every live expert goes to exactly one GPU of its replica set; minimize the largest
number of experts on one GPU (``min max_g G_g``).

Algorithm (both implementations, identical tie-breaking):

1. Greedy start. Visit live experts by increasing index; put each on the replica GPU with
   the fewest experts so far, ties to the lowest GPU index.
2. Augmenting paths (Harvey et al. 2006, restricted to the bottleneck). Let ``L`` be the
   largest load. Breadth-first search over GPUs starting from every GPU of load ``L`` (in
   increasing GPU index): from GPU ``u`` visit its experts by increasing index, and from
   each expert its replica GPUs by increasing index; the first unvisited GPU ``v`` with
   load ``<= L - 2`` ends the search, and every expert on the path moves one step along it
   (the root loses one expert, ``v`` gains one, the others are unchanged). Repeat until a
   search finds no such GPU.
3. Witness. The GPUs visited by the last (failed) search form a set ``Y`` whose experts
   have all their replicas inside ``Y`` and whose loads are ``>= L - 1`` with at least one
   equal to ``L``; hence ``|E(Y)| > (L - 1)|Y|`` and every semi-matching has a GPU with
   ``>= ceil(|E(Y)| / |Y|) = L`` experts (``E(Y)``: live experts whose replicas all lie in
   ``Y``). ``Y`` is returned as a certificate of optimality (proofs/THEOREMS.md, Lemma 2).
"""

from __future__ import annotations

from collections import deque

import numpy as np
from numba import njit

from .._numba.jit import NJIT, cache_depends_on
from . import _csr
from ._csr import replica_lists

__all__ = ["semi_matching_kernel", "semi_matching_reference"]


@njit(**NJIT)
def semi_matching_kernel(replicas, live):
    """Optimal semi-matching; returns ``(assignment (E,), value, witness (g,) bool)``."""
    E, g = replicas.shape
    # replica lists (increasing), so a search walks replicas, not the whole mask
    e_ptr, e_gpus, g_ptr, g_exps = replica_lists(replicas)
    assign = np.full(E, -1, np.int64)
    load = np.zeros(g, np.int64)
    # Stage 1: greedy start (fewest experts, lowest GPU index).
    for e in range(E):
        if not live[e]:
            continue
        best = -1
        for j in range(e_ptr[e], e_ptr[e + 1]):
            h = e_gpus[j]
            if best < 0 or load[h] < load[best]:
                best = h
        assign[e] = best
        load[best] += 1
    # Stage 2: augmenting paths from the bottleneck GPUs.
    visited = np.zeros(g, np.bool_)
    par_e = np.full(g, -1, np.int64)
    par_g = np.full(g, -1, np.int64)
    queue = np.empty(g, np.int64)
    top = 0
    while True:
        top = 0
        for h in range(g):
            if load[h] > top:
                top = load[h]
        for h in range(g):
            visited[h] = False
            par_e[h] = -1
            par_g[h] = -1
        head = 0
        tail = 0
        for h in range(g):
            if load[h] == top:
                visited[h] = True
                queue[tail] = h
                tail += 1
        target = -1
        while head < tail and target < 0:
            u = queue[head]
            head += 1
            for i in range(g_ptr[u], g_ptr[u + 1]):  # the experts on u, increasing
                e = g_exps[i]
                if assign[e] != u:
                    continue
                for j in range(e_ptr[e], e_ptr[e + 1]):
                    v = e_gpus[j]
                    if not visited[v]:
                        visited[v] = True
                        par_e[v] = e
                        par_g[v] = u
                        if load[v] <= top - 2:
                            target = v
                            break
                        queue[tail] = v
                        tail += 1
                if target >= 0:
                    break
        if target < 0:
            break
        v = target
        load[v] += 1
        while par_e[v] >= 0:
            e = par_e[v]
            assign[e] = v
            v = par_g[v]
        load[v] -= 1
    return assign, top, visited.copy()


def semi_matching_reference(replicas, live):
    """Plain-Python reference of :func:`semi_matching_kernel` (same rules, no shared code).

    Written from the description in the module docstring with lists, dicts and a deque.
    """
    n_experts = len(replicas)
    n_gpus = len(replicas[0]) if n_experts else 0
    cand = [[h for h in range(n_gpus) if bool(replicas[e][h])] for e in range(n_experts)]
    owner: dict[int, int] = {}
    on_gpu: list[list[int]] = [[] for _ in range(n_gpus)]
    for e in range(n_experts):
        if bool(live[e]):
            h = min(cand[e], key=lambda k: (len(on_gpu[k]), k))
            owner[e] = h
            on_gpu[h].append(e)
    while True:
        loads = [len(x) for x in on_gpu]
        top = max(loads, default=0)
        roots = [h for h in range(n_gpus) if loads[h] == top]
        parent: dict[int, tuple[int, int] | None] = {h: None for h in roots}
        todo = deque(roots)
        found = None
        while todo and found is None:
            u = todo.popleft()
            for e in sorted(on_gpu[u]):
                for v in cand[e]:
                    if v in parent:
                        continue
                    parent[v] = (e, u)
                    if loads[v] <= top - 2:
                        found = v
                        break
                    todo.append(v)
                if found is not None:
                    break
        if found is None:
            witness = np.array([h in parent for h in range(n_gpus)], dtype=bool)
            assignment = np.array([owner.get(e, -1) for e in range(n_experts)], dtype=np.int64)
            return assignment, top, witness
        v = found
        while parent[v] is not None:
            e, u = parent[v]
            on_gpu[u].remove(e)
            on_gpu[v].append(e)
            owner[e] = v
            v = u


cache_depends_on(semi_matching_kernel, _csr)
