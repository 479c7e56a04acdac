"""FlashLB: risk-aware replica placement with minimum-move updates, beside EPLB.

Upstream: sgl-project/sglang ``python/sglang/srt/eplb/eplb_algorithms/flash_lb.py``
(``--eplb-algorithm flash_lb``; vLLM ships a relative in
``vllm/distributed/eplb/policy/flashlb.py``). Where EPLB packs the *mean* load, FlashLB
packs a *risk*: over a window of ``T`` recorded batches it estimates every expert's mean
``mu``, variance and covariance, and

1. **replicas** (``_min_max_replica``): one per expert, then each extra slot to the expert
   with the largest ``(mu + z sigma) / count`` (``z = Phi^-1(0.75) = 0.674``, the upper
   quartile);
2. **packing** (``_lpt_deployment``): experts by descending ``mu / count``, each replica to
   the GPU with room whose **risk** after adding it, ``mu_g + z sqrt(var_g)`` (the GPU's
   summed unit loads and their variance, covariances included), is smallest;
3. **tree search** (``_flash_tree``, depth 3): experts sorted by ``mu + z sigma`` are cut
   into 3 intervals; for the first two, the number of extra replicas given to the interval
   is searched around the greedy's choice (``neighbor_search``, +-3), each candidate
   scored by packing it and measuring the window's mean peak-to-mean GPU load
   (``compute_score``);
4. **update** (``FlashLB.rebalance_experts`` and ``minimize_redeploy_with_inner_permutation``):
   given the previous placement, a layer is re-planned only when its average-to-peak ratio
   on the window fell below 0.95 of the last one recorded or below 0.8; the new placement's
   GPUs are matched to the old ones by a minimum-cost assignment (cost: slots that change,
   Hungarian method), experts kept on a GPU stay in their old slots, and only the layers
   that improve, best first (at most 16 per call), are updated.

:func:`flashlb_rebalance` returns the three maps :func:`~straggler.solvers.placement.eplb.
rebalance_experts` returns. Deviations, all at the level of rounding or of inputs upstream
cannot take: float64 statistics (upstream stores float32 and compiles with fastmath); stable
sorts where upstream's ``argsort`` is unstable (ties only); a GPU variance that rounds below
zero is read as zero (upstream's ``sqrt`` would give NaN); an empty last interval (fewer
than about three experts) gets no replica instead of the out-of-bounds write upstream's
Numba code would make; the window is taken as given (upstream keeps a ring buffer of the
last 1024 batches across calls and truncates loads to int32).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.stats import norm

from ...formulations.errors import InvalidInputError, param_error
from ...formulations.validation import check_array, check_int, check_real

__all__ = ["flashlb_rebalance", "FLASHLB_Z"]

#: ``Phi^-1(0.75)``: the z of upstream's ``z_upper_quartile=0.75``.
FLASHLB_Z = float(norm.ppf(0.75))


def _flashlb_statistics(window):
    """Mean, variance and covariance of a ``(T, E)`` window (``ddof = 1``, as upstream).

    Examples
    --------
    >>> mu, var, cov = _flashlb_statistics(np.array([[1.0, 4.0], [3.0, 0.0]]))
    >>> mu.tolist(), var.tolist(), cov.tolist()
    ([2.0, 2.0], [2.0, 8.0], [[2.0, -4.0], [-4.0, 8.0]])
    """
    x = np.asarray(window, dtype=float)
    t = x.shape[0]
    mu = x.mean(axis=0)
    xc = x - mu
    return mu, (xc**2).sum(axis=0) / (t - 1), (xc.T @ xc) / (t - 1)


def _min_max_replica(mu, var, n_extra: int, current, z: float = FLASHLB_Z):
    """``_min_max_replica``: ``n_extra`` more replicas, each to the first expert with the
    largest ``(mu + z sqrt(var)) / count``.

    Returns ``(counts, history)``; ``history[r]`` holds the counts after ``r`` additions.

    Examples
    --------
    >>> counts, hist = _min_max_replica(np.array([8.0, 3.0]), np.zeros(2), 2, np.ones(2, int))
    >>> counts.tolist(), hist.tolist()
    ([3, 1], [[1, 1], [2, 1], [3, 1]])
    """
    mu = np.asarray(mu, dtype=float)
    risk = mu + z * np.sqrt(np.asarray(var, dtype=float))
    counts = np.array(current, dtype=np.int64)
    history = np.empty((int(n_extra) + 1, mu.size), dtype=np.int64)
    history[0] = counts
    for r in range(int(n_extra)):
        unit = risk / counts
        best = int(np.argmax(unit))  # the first maximum, as upstream's strict '>'
        counts[best] += 1
        history[r + 1] = counts
    return counts, history


def _lpt_deployment(mu, var, cov, replicas, n_gpus: int, z: float = FLASHLB_Z) -> np.ndarray:
    """``_lpt_deployment`` from an empty placement: ``(n_gpus, slots_per_gpu)`` experts.

    Experts by descending ``mu / count`` (ties by index); each replica to the GPU with a
    free slot minimising ``mu_g + z sqrt(var_g)`` after it is added (first minimum), where
    adding expert ``e`` with ``r_e`` replicas to a GPU adds ``mu_e / r_e`` to ``mu_g`` and
    ``var_e / r_e^2 + sum_s 2 cov[e, s] / (r_e r_s)`` (over the slots ``s`` already there)
    to ``var_g``. Nothing stops two replicas of one expert landing on one GPU, but their
    covariance term (``2 var_e / r_e^2``) makes it risky.

    Examples
    --------
    >>> dep = _lpt_deployment(np.array([6.0, 2.0, 2.0]), np.zeros(3), np.zeros((3, 3)),
    ...                      np.array([2, 1, 1]), 2)
    >>> dep.tolist()
    [[0, 1], [0, 2]]
    """
    mu = np.asarray(mu, dtype=float)
    var = np.asarray(var, dtype=float)
    cov = np.asarray(cov, dtype=float)
    reps = np.asarray(replicas, dtype=np.int64)
    slots = int(reps.sum()) // n_gpus
    dep = np.full((n_gpus, slots), -1, dtype=np.int64)
    fill = np.zeros(n_gpus, dtype=np.int64)
    dev_mu = np.zeros(n_gpus)
    dev_var = np.zeros(n_gpus)
    for e in np.argsort(-(mu / reps), kind="stable"):
        r = reps[e]
        for _ in range(r):
            best, best_risk = -1, math.inf
            for g in range(n_gpus):
                if fill[g] >= slots:
                    continue
                on = dep[g, : fill[g]]
                new_var = dev_var[g] + var[e] / r**2 + (2 * cov[e, on] / r / reps[on]).sum()
                risk = dev_mu[g] + mu[e] / r + z * math.sqrt(max(new_var, 0.0))
                if risk < best_risk:
                    best, best_risk, best_var = g, risk, new_var
            dev_mu[best] += mu[e] / r
            dev_var[best] = best_var
            dep[best, fill[best]] = e
            fill[best] += 1
    return dep


def _placement_score(window, replicas, deployment) -> float:
    """``compute_score``: the window's mean of ``(peak * G + 0.01) / (total + 0.01)`` GPU
    load, each expert's load split evenly over its replicas (1.0 is perfect balance).

    Examples
    --------
    >>> _placement_score(np.array([[4.0, 2.0]]), np.array([1, 1]), np.array([[0], [1]]))
    1.33...
    """
    x = np.asarray(window, dtype=float)
    unit = x / np.asarray(replicas, dtype=float)
    loads = unit[:, np.asarray(deployment)].sum(axis=-1)  # (T, G)
    g = loads.shape[1]
    return float(np.mean((loads.max(axis=1) * g + 1e-2) / (loads.sum(axis=1) + 1e-2)))


def _neighbor_search(low, high, initial, max_range, score):
    """``neighbor_search``: ``initial``, then ``initial - r``, ``initial + r`` for ``r = 1..``."""
    max_range = min(max(initial - low, high - initial), max_range)
    best_x = initial
    best_score, best_dep = score(initial)
    for r in range(1, max_range + 1):
        for x in (initial - r, initial + r):
            if low <= x <= high:
                s, dep = score(x)
                if s < best_score:
                    best_x, best_score, best_dep = x, s, dep
    return best_x, best_score, best_dep


def _flash_tree(window, mu, var, cov, num_replicas: int, n_gpus: int, *, z=FLASHLB_Z, deep=3):
    """``_flash_tree``: the tree search over replica budgets per interval (module docstring).

    Returns ``(deployment (n_gpus, slots), replicas (E,), score)``.

    Examples
    --------
    >>> w = np.array([[9.0, 1.0, 1.0, 1.0], [7.0, 1.0, 2.0, 1.0]])
    >>> mu, var, cov = _flashlb_statistics(w)
    >>> dep, reps, score = _flash_tree(w, mu, var, cov, 6, 2)
    >>> reps.tolist(), dep.tolist(), round(score, 4)
    ([2, 2, 1, 1], [[0, 2, 1], [0, 3, 1]], 1.0454)
    """
    E = mu.shape[0]
    avail = num_replicas - E
    if deep <= 1:
        reps = _min_max_replica(mu, var, avail, np.ones(E, np.int64), z)[0]
        dep = _lpt_deployment(mu, var, cov, reps, n_gpus, z)
        return dep, reps, _placement_score(window, reps, dep)
    size = math.ceil(E / deep)
    order = np.argsort(-(mu + z * np.sqrt(var)), kind="stable")
    deployed = np.zeros(E, dtype=np.int64)
    for node in range(deep - 1):
        low, high = 0, avail
        sim_idx = order[node * size :]
        cur_idx = order[node * size : (node + 1) * size]
        rest_idx = order[(node + 1) * size :]
        sim = _min_max_replica(mu[sim_idx], var[sim_idx], high, np.ones(sim_idx.size, np.int64), z)
        cur_hist = _min_max_replica(
            mu[cur_idx], var[cur_idx], high, np.ones(cur_idx.size, np.int64), z
        )[1]
        initial = int((sim[0][:size] - 1).sum())
        if rest_idx.size:
            rest_hist = _min_max_replica(
                mu[rest_idx], var[rest_idx], high, np.ones(rest_idx.size, np.int64), z
            )[1]
        else:  # nothing after this interval: it takes every extra replica
            rest_hist = np.zeros((high + 1, 0), dtype=np.int64)
            low = initial = avail

        def score(
            mid,
            cur_idx=cur_idx,
            rest_idx=rest_idx,
            cur_hist=cur_hist,
            rest_hist=rest_hist,
            avail=avail,
        ):
            reps = deployed.copy()
            reps[cur_idx] = cur_hist[mid]
            if rest_idx.size:
                reps[rest_idx] = rest_hist[avail - mid]
            dep = _lpt_deployment(mu, var, cov, reps, n_gpus, z)
            return _placement_score(window, reps, dep), dep

        best, _, _ = _neighbor_search(low, high, initial, 3, score)
        deployed[cur_idx] = cur_hist[best]
        avail -= best
        if not avail or node == deep - 2:
            if rest_idx.size:
                deployed[rest_idx] = rest_hist[avail]
            break
    dep = _lpt_deployment(mu, var, cov, deployed, n_gpus, z)
    return dep, deployed, _placement_score(window, deployed, dep)


def _minimize_moves(previous, new) -> np.ndarray:
    """``minimize_redeploy_with_inner_permutation``: ``new``'s GPUs renumbered and its slots
    reordered to move as few expert weights as possible from ``previous``.

    The cost of giving GPU ``i`` the experts of new GPU ``j`` is the number of its slots
    that do not find their expert among ``i``'s old ones; GPUs are matched by a minimum-cost
    assignment (scipy's ``linear_sum_assignment``, as upstream); within a GPU, each old slot
    whose expert stays keeps it (the new row's last copy of it), and the other experts
    fill the free slots in their new order.

    Examples
    --------
    >>> _minimize_moves(np.array([[0, 1], [2, 3]]), np.array([[3, 4], [1, 0]])).tolist()
    [[0, 1], [4, 3]]
    """
    src = np.asarray(previous, dtype=np.int64)
    dst = np.asarray(new, dtype=np.int64)
    n, m = src.shape
    width = int(max(src.max(initial=0), dst.max(initial=0))) + 1
    sc = np.stack([np.bincount(row, minlength=width) for row in src])
    dc = np.stack([np.bincount(row, minlength=width) for row in dst])
    matches = np.minimum(sc[:, None, :], dc[None, :, :]).sum(axis=-1)
    rows, cols = linear_sum_assignment(m - matches)
    out = np.empty_like(dst)
    for i, j in zip(rows.tolist(), cols.tolist()):
        s_row, d_row = src[i], dst[j]
        where: dict[int, list[int]] = {}
        for pos, v in enumerate(d_row.tolist()):
            where.setdefault(v, []).append(pos)
        row = np.empty(m, dtype=np.int64)
        done = [False] * m
        used = set()
        for pos, v in enumerate(s_row.tolist()):
            if where.get(v):
                used.add(where[v].pop())
                row[pos] = v
                done[pos] = True
        rest = [int(d_row[p]) for p in range(m) if p not in used]
        k = 0
        for pos in range(m):
            if not done[pos]:
                row[pos] = rest[k]
                k += 1
        out[i] = row
    return out


def _flashlb_iv(loads, num_replicas, num_gpus, z, deep, previous, previous_ratio, max_layers):
    func = "flashlb_rebalance"
    x = check_array(loads, "loads", func, kind="real", ndim=(2, 3), lo=0)
    if x.ndim == 2:
        x = x[:, None, :]
    if x.shape[0] < 2 or x.shape[2] == 0:
        raise param_error(
            "loads",
            func,
            "a (T, n_layers, n_experts) or (T, n_experts) window with T >= 2 batches "
            "(the variance needs two; upstream divides by T - 1)",
            f"shape {np.asarray(loads).shape}",
        )
    T, L, E = x.shape
    P = check_int(num_replicas, "num_replicas", func, lo=E)
    G = check_int(num_gpus, "num_gpus", func, lo=1)
    if P % G:
        raise param_error("num_replicas", func, f"a multiple of num_gpus={G}", repr(P))
    z = check_real(z, "z", func)
    deep = check_int(deep, "deep", func, lo=1)
    max_layers = check_int(max_layers, "max_layers", func, lo=-1)
    if previous is not None:
        previous = check_array(
            previous, "previous", func, kind="int", ndim=2, lo=0, hi=E - 1, shape=(L, P)
        )
        for layer in range(L):
            if np.unique(previous[layer]).size != E:
                raise InvalidInputError(
                    f"The 'previous' parameter of {func} must hold every expert in every "
                    f"layer. Got layer {layer} without expert(s) "
                    f"{sorted(set(range(E)) - set(previous[layer].tolist()))[:5]} instead."
                )
    if previous_ratio is None:
        previous_ratio = np.zeros(L)
    else:
        previous_ratio = np.broadcast_to(
            check_array(previous_ratio, "previous_ratio", func, kind="real", ndim=(0, 1), lo=0),
            (L,),
        )
    return x, P, G, z, deep, previous, previous_ratio, max_layers


def flashlb_rebalance(
    loads,
    num_replicas: int,
    num_gpus: int,
    *,
    z: float = FLASHLB_Z,
    deep: int = 3,
    previous=None,
    previous_ratio=None,
    update_threshold_ratio: float = 0.95,
    update_threshold_value: float = 0.8,
    max_layers: int = 16,
):
    """FlashLB's placement (module docstring), in the maps ``rebalance_experts`` returns.

    Parameters
    ----------
    loads : array_like, shape (T, n_layers, n_experts) or (T, n_experts)
        Per-batch expert loads of the window (``T >= 2``).
    num_replicas : int
        Physical slots ``P``, a multiple of ``num_gpus``; slot ``p`` on GPU
        ``p // (P / num_gpus)``.
    num_gpus : int
    z : float, default ``Phi^-1(0.75)``
    deep : int, default 3
        Intervals of the tree search (``1``: the greedy alone).
    previous : array_like of int, shape (n_layers, P), optional
        The placement FlashLB deployed last (its ``physical_to_logical``). Without it every
        layer is planned afresh, as upstream's first call.
    previous_ratio : float or array_like, optional
        The average-to-peak ratio FlashLB recorded for ``previous`` (per layer); default 0,
        a fresh FlashLB's history.
    update_threshold_ratio, update_threshold_value : float, default 0.95 and 0.8
        A layer is re-planned when its ratio on the window is below ``ratio * previous`` or
        below ``value``.
    max_layers : int, default 16
        At most this many layers are updated per call, those that gain most
        (``update_layers_upper_bound``; ``-1``: no limit). Only with ``previous``.

    Returns
    -------
    physical_to_logical : ndarray of int64, shape (n_layers, P)
    logical_to_physical : ndarray of int64, shape (n_layers, n_experts, X)
        Slots in slot order, ``-1`` padded.
    logical_count : ndarray of int64, shape (n_layers, n_experts)

    Examples
    --------
    >>> w = np.array([[9, 1, 1, 1], [7, 1, 2, 1]])
    >>> p2l, l2p, cnt = flashlb_rebalance(w, 6, 2)
    >>> p2l.tolist(), cnt.tolist()
    ([[0, 2, 1, 0, 3, 1]], [[2, 2, 1, 1]])
    """
    x, P, G, z, deep, previous, prev_ratio, max_layers = _flashlb_iv(
        loads, num_replicas, num_gpus, z, deep, previous, previous_ratio, max_layers
    )
    T, L, E = x.shape
    slots = P // G
    out = np.empty((L, G, slots), dtype=np.int64)
    gain = np.zeros(L)
    for layer in range(L):
        window = x[:, layer, :]
        mu, var, cov = _flashlb_statistics(window)
        old = None
        if previous is not None:
            old = previous[layer].reshape(G, slots)
            old_reps = np.bincount(old.ravel(), minlength=E)
            current = 1.0 / _placement_score(window, old_reps, old)
            need = current < prev_ratio[layer] * float(update_threshold_ratio) or current < float(
                update_threshold_value
            )
            if not need:
                out[layer] = old
                continue
        dep, _, score = _flash_tree(window, mu, var, cov, P, G, z=z, deep=deep)
        if old is None:
            out[layer] = dep
            gain[layer] = 1.0 / score
        else:
            out[layer] = _minimize_moves(old, dep)
            gain[layer] = 1.0 / score - current
    if previous is not None:
        order = np.argsort(-gain, kind="stable")
        chosen = order[gain[order] > 0]
        if max_layers > 0:
            chosen = chosen[:max_layers]
        keep = np.setdiff1d(np.arange(L), chosen)
        out[keep] = previous[keep].reshape(-1, G, slots)
    p2l = out.reshape(L, P)
    cnt = np.stack([np.bincount(p2l[layer], minlength=E) for layer in range(L)])
    width = int(cnt.max())
    l2p = np.full((L, E, width), -1, dtype=np.int64)
    for layer in range(L):
        fill = np.zeros(E, dtype=np.int64)
        for p, e in enumerate(p2l[layer]):
            l2p[layer, e, fill[e]] = p
            fill[e] += 1
    return p2l, l2p, cnt
