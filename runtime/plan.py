"""``straggler-plan``: an engine's recorded expert loads in, a placement and dispatch tables out.

::

    straggler-plan LOGS --gpus 32 --nodes 4 --slots 288 [--cost PRESET | --calibration FILE]
                   [--format sglang|vllm|trtllm|eplb] [--out DIR] [--plot PNG]

1. **Read** ``LOGS`` (any format of :mod:`straggler.runtime.engines`, detected): logical
   expert loads per recorded batch and layer. ``--holdout F`` keeps the last fraction
   ``F`` of the batches out of the plan and scores on them (the public EPLB benchmark's
   "place on one window, score on the next"); by default the plan is scored in-sample.
2. **Place**: ``--placement eplb`` (default; DeepSeek EPLB, :func:`straggler.solvers.placement.eplb.
   rebalance_experts`, on the summed loads, ``--groups``/``--nodes`` for its hierarchical
   policy), ``place_experts`` (:func:`straggler.solvers.place_experts`: a placement chosen
   for tempo's dispatch on the planning batches, never two replicas on one GPU) or
   ``recorded`` (keep the placement the log was recorded under), or a TensorRT-LLM
   ``moe_load_balancer.yaml`` file: the placement slot-id statistics were recorded under,
   which folds them to experts and is kept.
3. **Dispatch**: tempo (:func:`straggler.solvers.solve_dispatch`) under the cost model
   (``--cost`` preset, or ``--calibration``: a :class:`~straggler.solvers.CalibrationResult`
   JSON or a raw ``G,N,t_us`` log, fitted here), on each layer's recorded batches. A
   table gives each (expert, replica) a probability, so it is one split for every batch;
   three candidates are scored, in expectation, on the batches the plan is built from, and
   the best kept per layer, ties to the first listed here (so EPLB's split stays unless a
   tempo table is strictly better): ``even``, EPLB's even split over the expert's slots;
   ``mean_batch``, tempo on the mean batch
   (counts averaged and rounded, a count below one raised to one); ``batch_average``,
   the token-weighted mean of tempo's per-batch splits, ``sum_b x_b[e, g] / sum_b n_b[e]``.
   On those batches the table is therefore never worse than EPLB's split. The tables are
   :meth:`~straggler.formulations.DispatchProblem.to_tables`'s layout (``[L, E, X]``,
   what the runtime's dispatch kernel reads). *In expectation*: each batch's tokens are
   split exactly by the probabilities and every replica with a positive probability
   counts as activated (a sampled dispatch may leave a low-probability replica idle).
4. **Report** per layer, mean modeled makespan (us) over the scored batches: EPLB's even
   split over replicas (what EPLB deploys), per-batch token LP (LPLB), per-batch tempo
   (an oracle that re-solves every batch), and the **table** (the written table applied
   to each batch in expectation: what a deployment of it would model); per-GPU token
   balance under the even split and under the table (:mod:`straggler.formulations.metrics`:
   mean/max, (max - mean)/mean, vLLM's and SGLang's balancedness, TensorRT-LLM's imbalance
   ratio); the worst layers.
5. **Write** (``--out DIR``) the placement in the ``--format`` engine's layout (default:
   the log's): ``sglang`` ``init_expert_location.json`` (``--init-expert-location``),
   ``vllm`` ``eplb_state.json`` (the ``EplbState`` maps), ``trtllm``
   ``moe_load_balancer.yaml``, ``eplb`` ``eplb_maps.json``; ``--torch`` adds ``.pt``
   twins for SGLang and vLLM. Always ``dispatch_tables.npz`` (``physical_to_logical``,
   ``logical_to_physical``, ``logical_count``, ``probabilities [L, E, X]``, ``layer_ids``,
   ``n_gpus``) and ``report.json``.

Every output is checked writable before any work, and written atomically: the files go to
a staging directory inside ``--out`` and are renamed into place only once all of them are
written, so a failed run leaves ``--out`` as it was.

Exit status: 0 on success, 2 (one line on stderr) on bad arguments, unreadable logs or
outputs that cannot be written.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np

from ..formulations._io import atomic_path
from ..formulations.cost import CostModel
from ..formulations.dispatch import DispatchProblem, evaluate, logical_to_physical
from ..formulations.errors import BackendUnavailableError, InvalidInputError
from ..formulations.metrics import (
    imbalance_ratio,
    mean_over_max,
    sglang_balancedness,
    trtllm_imbalance_ratio,
    vllm_balancedness,
)
from ..formulations.validation import (
    check_array,
    check_bool,
    check_choice,
    check_int,
    check_real,
    check_type,
)
from ..solvers.dispatch.solve import solve_dispatch
from ..solvers.placement.eplb import rebalance_experts
from ..solvers.placement.place import moved_replicas, place_experts
from .engines import EngineLog
from .engines.eplb import write_eplb_maps
from .engines.sglang import write_sglang_init_location
from .engines.trtllm import write_moe_load_balancer
from .engines.vllm import vllm_maps, write_vllm_state

__all__ = [
    "plan",
    "Plan",
    "DEFAULT_COST",
    "PLAN_PLACEMENTS",
    "format_report",
    "rebalance_verdict",
]

#: Cost preset when neither ``--cost`` nor ``--calibration`` is given (DeepSeek-V3 shape,
#: the EP32 / 288-slot example's model; TEMPO Table 6).
DEFAULT_COST = "dsv3_a_offline"
#: Largest EP degree ``plan`` takes (checked before any work).
MAX_PLAN_GPUS = 65536
#: Placements ``--placement`` offers.
PLAN_PLACEMENTS = ("eplb", "place_experts", "recorded")


class Plan(dict):
    """What :func:`plan` returns: a dict (JSON-ready except the arrays under ``"tables"``
    and ``"gpu_time"``)."""


def _progress(iterable, total, enabled: bool, desc: str):
    """tqdm over ``iterable`` when installed, else a plain counter on stderr."""
    if not enabled:
        yield from iterable
        return
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is not None:
        yield from tqdm(iterable, total=total, desc=desc, unit="layer", file=sys.stderr)
        return
    step = max(1, total // 10)
    for i, x in enumerate(iterable):
        if i % step == 0 or i == total - 1:
            print(f"{desc}: layer {i + 1}/{total}", file=sys.stderr, flush=True)
        yield x


def _split(n: int, holdout: float) -> tuple[np.ndarray, np.ndarray, bool]:
    """(fit batches, scored batches, held out?)."""
    if holdout <= 0 or n < 2:
        idx = np.arange(n)
        return idx, idx, False
    k = min(n - 1, max(1, math.ceil(holdout * n)))
    return np.arange(n - k), np.arange(n - k, n), True


def _subsample(idx: np.ndarray, m: int) -> np.ndarray:
    if idx.size <= m:
        return idx
    return idx[np.linspace(0, idx.size - 1, m).round().astype(int)]


def _table_split(shares, p2l_row, n_gpus: int) -> np.ndarray:
    """Per-GPU split ``q[e, g]`` a table built from ``shares [E, G]`` gives: proportional to
    the shares, uniform over the expert's slots where it has none (as ``to_tables``)."""
    per = p2l_row.size // n_gpus
    E = shares.shape[0]
    slots = np.zeros((E, n_gpus))
    ok = p2l_row >= 0
    np.add.at(slots, (p2l_row[ok], np.flatnonzero(ok) // per), 1.0)
    tot = shares.sum(axis=1, keepdims=True)
    k = slots.sum(axis=1, keepdims=True)
    uniform = np.divide(slots, k, out=np.zeros_like(slots), where=k > 0)
    return np.where(tot > 0, shares / np.where(tot > 0, tot, 1.0), uniform)


def _expected(problem, shares, p2l_row, n_gpus: int) -> np.ndarray:
    """Expected shares of every batch of ``problem`` under the table built from ``shares``."""
    return problem.counts[:, :, None] * _table_split(shares, p2l_row, n_gpus)[None]


def _table_shares(prob, l2p, count, per: int, n_gpus: int) -> np.ndarray:
    """Per-GPU split ``q[l, e, g]`` of the written probability table."""
    L, E, X = prob.shape
    q = np.zeros((L, E, n_gpus))
    for j in range(X):
        valid = j < count
        g = np.where(valid, l2p[:, :, j] // per, 0)
        np.add.at(
            q, (np.arange(L)[:, None], np.arange(E)[None, :], g), np.where(valid, prob[:, :, j], 0)
        )
    return q


def _plan_iv(log, n_gpus, n_slots, n_nodes, n_groups, cost, placement, distinct, holdout,
             max_batches, progress, seed) -> None:  # fmt: skip
    func = "plan"
    check_type(log, "log", func, EngineLog, "an EngineLog (from read_engine_log)")
    if not log.has_loads:
        raise InvalidInputError(
            f"The 'log' parameter of plan must hold recorded loads. Got {log.summary()} (a "
            "placement only) instead."
        )
    n_gpus = check_int(n_gpus, "n_gpus", func, lo=1, hi=MAX_PLAN_GPUS)
    n_nodes = check_int(n_nodes, "n_nodes", func, lo=1)
    if n_gpus % n_nodes:
        raise InvalidInputError(
            f"The 'n_nodes' parameter of plan must divide n_gpus={n_gpus}. Got {n_nodes} instead."
        )
    if n_slots is not None:
        # more slots than every expert on every GPU would only hold copies on one GPU; the
        # bound also keeps an absurd value from running for minutes
        check_int(n_slots, "n_slots", func, lo=1, hi=n_gpus * log.n_experts)
    check_int(n_groups, "n_groups", func, lo=1)
    check_type(cost, "cost", func, CostModel, "a CostModel")
    check_choice(placement, "placement", func, PLAN_PLACEMENTS)
    check_bool(distinct, "distinct", func)
    check_real(holdout, "holdout", func, lo=0, hi=1, hi_open=True)
    check_int(max_batches, "max_batches", func, lo=1)
    check_bool(progress, "progress", func)
    check_int(seed, "seed", func, lo=0)


def plan(
    log,
    *,
    n_gpus: int,
    n_slots: int | None = None,
    n_nodes: int = 1,
    n_groups: int = 1,
    cost: CostModel,
    placement: str = "eplb",
    distinct: bool = False,
    holdout: float = 0.0,
    max_batches: int = 32,
    progress: bool = False,
    seed: int = 0,
    previous=None,
    max_moves: int | None = None,
) -> Plan:
    """Placement, tables and report for an :class:`~straggler.runtime.engines.EngineLog`
    (the work of ``straggler-plan``, without the files; see the module docstring).

    Returns
    -------
    Plan
        ``layers`` (one dict per layer), ``summary``, ``tables`` (arrays), ``gpu_time``
        (mean modeled time per layer and GPU, ``even`` and ``table``), ``placement``
        (``physical_to_logical``, and ``log2phy``/``logcnt`` for EPLB), ``meta``; with
        ``previous``, ``rebalance`` (:func:`rebalance_verdict`).

    Other parameters
    ----------------
    previous : array_like of int, shape (n_layers, P), optional
        The placement in force (``physical_to_logical``). With ``placement="place_experts"``
        the plan starts from it (:func:`straggler.solvers.place_experts`, ``previous=``);
        with any placement the report says whether to rebalance.
    max_moves : int, optional
        Replicas moved per layer at most (``placement="place_experts"`` and ``previous``).

    Raises
    ------
    InvalidInputError
        A log without loads, bad sizes (``n_gpus`` not dividing the slots, ``n_nodes`` not
        dividing ``n_gpus``, fewer slots than experts), an unknown placement, a recorded
        placement the log does not have or of another size.
    """
    _plan_iv(log, n_gpus, n_slots, n_nodes, n_groups, cost, placement, distinct, holdout,
             max_batches, progress, seed)  # fmt: skip
    if max_moves is not None and (previous is None or placement != "place_experts"):
        raise InvalidInputError(
            "The 'max_moves' parameter of plan needs previous (the placement in force) and "
            f"placement='place_experts'. Got placement={placement!r} and "
            f"previous={'None' if previous is None else 'a placement'} instead."
        )
    counts = log.counts
    B, L, E = counts.shape
    fit_idx, score_idx, held = _split(B, holdout)
    fit_idx = _subsample(fit_idx, max_batches)
    score_idx = _subsample(score_idx, max_batches)
    loads = counts[fit_idx].sum(axis=0)
    extra_maps = {}
    if placement == "recorded":
        if log.physical_to_logical is None:
            raise InvalidInputError(
                f"The 'placement' parameter of plan can be 'recorded' only for a log that "
                f"records its placement. Got {log.summary()} instead (use 'eplb')."
            )
        p2l = np.asarray(log.physical_to_logical)
        if n_slots is not None and n_slots != p2l.shape[1]:
            raise InvalidInputError(
                f"The 'n_slots' parameter of plan must equal the recorded placement's "
                f"{p2l.shape[1]} slots. Got {n_slots} instead."
            )
    elif placement == "place_experts":
        # placement that knows tempo dispatches (straggler.solvers.place_experts), built on
        # the same planning batches as EPLB's loads; it never puts two replicas on one GPU
        P = n_slots if n_slots is not None else (E if previous is None else np.shape(previous)[1])
        p2l, log2phy, logcnt = place_experts(
            counts[fit_idx], P, n_groups, n_nodes, n_gpus, cost=cost, previous=previous,
            max_moves=max_moves,
        )  # fmt: skip
        extra_maps = {"log2phy": log2phy, "logcnt": logcnt}
    else:
        P = n_slots if n_slots is not None else E
        p2l, log2phy, logcnt = rebalance_experts(
            loads, P, n_groups, n_nodes, n_gpus, distinct=distinct
        )
        extra_maps = {"log2phy": log2phy, "logcnt": logcnt}
    P = p2l.shape[1]
    if P % n_gpus:
        raise InvalidInputError(
            f"The 'n_gpus' parameter of plan must divide the {P} slots. Got {n_gpus} instead."
        )
    gpu_node = np.arange(n_gpus) // (n_gpus // n_nodes)
    chosen_x = np.zeros((L, E, n_gpus))
    choices = []
    cand_scores = []
    # (the tempo seconds spent in plain-Python references, which answer while the kernels are
    # not compiled, at a fraction of their speed: the report says so)
    runtime = {"tempo": 0.0, "token_lp": 0.0, "tempo_reference": 0.0}
    stacks = []
    for l in _progress(range(L), L, progress, "tempo"):
        fit_p = DispatchProblem.from_placement(
            counts[fit_idx, l], p2l[l], n_gpus, gpu_node=gpu_node
        )
        res = solve_dispatch(fit_p, cost, method="tempo", rng=seed)
        mean = counts[fit_idx, l].mean(axis=0)
        mean = np.where((mean > 0) & (mean < 1), 1.0, np.rint(mean))
        mean_p = DispatchProblem(counts=mean, replicas=fit_p.replicas[0], gpu_node=gpu_node)
        res_mean = solve_dispatch(mean_p, cost, method="tempo", rng=seed)
        runtime["tempo"] += res.runtime_s + res_mean.runtime_s
        runtime["tempo_reference"] += res.reference_s + res_mean.reference_s
        # Candidate tables, scored in expectation on the batches they were built from.
        cands = {
            "even": np.zeros((E, n_gpus)),
            "mean_batch": res_mean.shares,
            "batch_average": res.shares.sum(axis=0),
        }
        scores = {
            k: float(np.mean(evaluate(fit_p, cost, _expected(fit_p, x, p2l[l], n_gpus)).makespan))
            for k, x in cands.items()
        }
        best = min(scores, key=lambda k: (scores[k], list(cands).index(k)))
        cand_scores.append(scores)
        choices.append(best)
        chosen_x[l] = cands[best]
        score_p = DispatchProblem.from_placement(
            counts[score_idx, l], p2l[l], n_gpus, gpu_node=gpu_node
        )
        tempo_score = res if not held else solve_dispatch(score_p, cost, method="tempo", rng=seed)
        if held:
            runtime["tempo"] += tempo_score.runtime_s
            runtime["tempo_reference"] += tempo_score.reference_s
        even = solve_dispatch(score_p, cost, method="uniform")
        lp = solve_dispatch(score_p, cost, method="token_lp")
        runtime["token_lp"] += lp.runtime_s
        stacks.append((score_p, even, lp, tempo_score))
    per = P // n_gpus
    total = counts[fit_idx].sum(axis=0)
    tab_p = DispatchProblem.from_placement(total, p2l, n_gpus, gpu_node=gpu_node)
    l2p, cnt, prob = tab_p.to_tables(chosen_x, p2l)
    q = _table_shares(prob, l2p, cnt, per, n_gpus)
    rows = []
    gpu_even = np.zeros((L, n_gpus))
    gpu_table = np.zeros((L, n_gpus))
    tok_even = np.zeros((score_idx.size, L, n_gpus))
    tok_table = np.zeros((score_idx.size, L, n_gpus))
    for l, (score_p, even, lp, tempo_score) in enumerate(stacks):
        ev_tab = evaluate(score_p, cost, score_p.counts[:, :, None] * q[l][None])
        ev_even = evaluate(score_p, cost, even.shares)
        tok_even[:, l] = ev_even.N
        tok_table[:, l] = ev_tab.N
        gpu_even[l] = ev_even.times.mean(axis=0)
        gpu_table[l] = ev_tab.times.mean(axis=0)
        m_even = float(np.mean(even.makespan))
        m_tab = float(np.mean(ev_tab.makespan))
        rows.append(
            {
                "layer": int(log.layer_ids[l]),
                "eplb_even_us": m_even,
                "token_lp_us": float(np.mean(lp.makespan)),
                "tempo_us": float(np.mean(tempo_score.makespan)),
                "table_us": m_tab,
                "table_choice": choices[l],
                "candidates_fit_us": cand_scores[l],
                "lower_bound_us": float(np.mean(tempo_score.lower_bound)),
                "gain": 1 - m_tab / m_even if m_even > 0 else 0.0,
                "tokens_mean_over_max_even": float(mean_over_max(ev_even.N).mean()),
                "tokens_mean_over_max_table": float(mean_over_max(ev_tab.N).mean()),
                "tokens_imbalance_even": float(imbalance_ratio(ev_even.N).mean()),
                "tokens_imbalance_table": float(imbalance_ratio(ev_tab.N).mean()),
                "time_mean_over_max_even": float(mean_over_max(ev_even.times).mean()),
                "time_mean_over_max_table": float(mean_over_max(ev_tab.times).mean()),
            }
        )
    sums = {
        k: float(sum(r[k] for r in rows))
        for k in ("eplb_even_us", "token_lp_us", "tempo_us", "table_us", "lower_bound_us")
    }

    def balance(tok):
        with np.errstate(invalid="ignore"):
            trt = trtllm_imbalance_ratio(tok)
        return {
            "vllm_balancedness": float(vllm_balancedness(tok).mean()),
            "sglang_balancedness": float(sglang_balancedness(tok).mean()),
            "trtllm_imbalance_ratio": float(np.nanmean(trt)) if np.isfinite(trt).any() else 0.0,
            "mean_over_max": float(mean_over_max(tok).mean()),
        }

    summary = {
        **{f"total_{k}": v for k, v in sums.items()},
        "table_vs_even": sums["table_us"] / sums["eplb_even_us"] if sums["eplb_even_us"] else 1.0,
        "tempo_vs_even": sums["tempo_us"] / sums["eplb_even_us"] if sums["eplb_even_us"] else 1.0,
        "token_lp_vs_even": sums["token_lp_us"] / sums["eplb_even_us"]
        if sums["eplb_even_us"]
        else 1.0,
        "tokens_even": balance(tok_even),
        "tokens_table": balance(tok_table),
        "solve_s": runtime,
        "table_choices": {k: choices.count(k) for k in ("even", "mean_batch", "batch_average")},
    }
    meta = {
        "engine": log.engine,
        "kind": log.kind,
        "sources": list(log.sources),
        "n_batches": int(B),
        "fit_batches": fit_idx.tolist(),
        "scored_batches": score_idx.tolist(),
        "held_out": held,
        "n_layers": int(L),
        "n_experts": int(E),
        "n_gpus": int(n_gpus),
        "n_nodes": int(n_nodes),
        "n_slots": int(P),
        "placement": placement,
        "cost": {k: v for k, v in vars(cost).items() if v is not None},
    }
    verdict = {}
    if previous is not None:
        verdict["rebalance"] = rebalance_verdict(
            counts[score_idx], previous, p2l, n_gpus, cost, held=held, seed=seed,
            max_moves=max_moves, after_us=sums["tempo_us"], gpu_node=gpu_node,
        )  # fmt: skip
    return Plan(
        **verdict,
        layers=rows,
        summary=summary,
        tables={
            "physical_to_logical": p2l,
            "logical_to_physical": l2p,
            "logical_count": cnt,
            "probabilities": prob,
            "layer_ids": np.asarray(log.layer_ids),
            "n_gpus": np.int64(n_gpus),
        },
        gpu_time={"even": gpu_even, "table": gpu_table},
        placement={"physical_to_logical": p2l, **extra_maps},
        loads=loads,
        meta=meta,
    )


def rebalance_verdict(batches, previous, physical_to_logical, n_gpus, cost, *, held, seed=0,
                      max_moves=None, after_us=None, gpu_node=None) -> dict:  # fmt: skip
    """Rebalance or not: tempo's mean time per step (summed over layers) on ``batches`` under
    the placement in force and under the new one, against the replicas the change moves
    (:func:`straggler.solvers.placement.place.moved_replicas`). ``after_us`` reuses the new
    placement's figure when already computed. Returns the figures and the report ``line``;
    ``rebalance`` is True when the new placement is faster and moves something."""
    prev = check_array(
        previous, "previous", "plan", ndim=2, kind="int", lo=0,
        shape=physical_to_logical.shape,
    )  # fmt: skip
    before, after = 0.0, 0.0
    for l in range(prev.shape[0]):
        maps = [prev[l]] + ([] if after_us is not None else [physical_to_logical[l]])
        for i, m in enumerate(maps):
            p = DispatchProblem.from_placement(batches[:, l], m, n_gpus, gpu_node=gpu_node)
            t = float(np.mean(solve_dispatch(p, cost, method="tempo", rng=seed).makespan))
            before, after = (before + t, after) if i == 0 else (before, after + t)
    after = after if after_us is None else float(after_us)
    moves = int(moved_replicas(prev, physical_to_logical).sum())
    gain = before - after
    yes = gain > 0 and moves > 0
    where = "held-out" if held else "planning (in-sample)"
    cap = "" if max_moves is None else f", at most {max_moves}"
    line = (
        f"rebalance: {'yes' if yes else 'no, keep the placement in force'}: tempo "
        f"{before:.1f} -> {after:.1f} us per step on the {where} batches ({-gain:+.1f} us, "
        f"{-100 * gain / before if before else 0.0:+.2f}%) for {moves} replicas moved "
        f"({moves / prev.shape[0]:.1f} per layer{cap})"
        + (f", {gain / moves:.3f} us per step per moved replica" if yes else "")
    )
    return {"rebalance": yes, "before_us": before, "after_us": after, "gain_us": gain,
            "moved_replicas": moves, "held_out": held, "line": line}  # fmt: skip


def format_report(result: Plan, *, worst: int = 5, cost_note: str = "") -> str:
    """The per-layer table, the balance metrics and the worst layers, as text."""
    m = result["meta"]
    s = result["summary"]
    out = [
        f"{m['engine']} ({m['kind']}): {m['n_batches']} batches x {m['n_layers']} layers x "
        f"{m['n_experts']} experts; placement {m['placement']} on {m['n_gpus']} GPUs "
        f"({m['n_nodes']} node(s), {m['n_slots']} slots); "
        + (
            f"planned on {len(m['fit_batches'])} batches, scored on {len(m['scored_batches'])} "
            "held-out batches"
            if m["held_out"]
            else f"planned and scored on {len(m['fit_batches'])} batches (in-sample; "
            "--holdout F scores on unseen ones)"
        ),
        f"cost: {cost_note or m['cost']}",
        "modeled MoE time per layer, mean over batches (us); tok m/M = GPU token mean/max",
    ]
    head = [
        "layer",
        "even_us",
        "token_lp_us",
        "tempo_us",
        "table_us",
        "bound_us",
        "table_gain",
        "tok_m/M_even",
        "tok_m/M_table",
        "table_from",
    ]
    cells = []
    for r in result["layers"]:
        cells.append(
            [
                str(r["layer"]),
                f"{r['eplb_even_us']:.1f}",
                f"{r['token_lp_us']:.1f}",
                f"{r['tempo_us']:.1f}",
                f"{r['table_us']:.1f}",
                f"{r['lower_bound_us']:.1f}",
                f"{100 * r['gain']:+.1f}%",
                f"{r['tokens_mean_over_max_even']:.3f}",
                f"{r['tokens_mean_over_max_table']:.3f}",
                r["table_choice"],
            ]
        )
    cells.append(
        [
            "total",
            f"{s['total_eplb_even_us']:.1f}",
            f"{s['total_token_lp_us']:.1f}",
            f"{s['total_tempo_us']:.1f}",
            f"{s['total_table_us']:.1f}",
            f"{s['total_lower_bound_us']:.1f}",
            f"{100 * (1 - s['table_vs_even']):+.1f}%",
            f"{s['tokens_even']['mean_over_max']:.3f}",
            f"{s['tokens_table']['mean_over_max']:.3f}",
            "",
        ]
    )
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    out.append("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    out.append("  ".join("-" * w for w in widths))
    for c in cells:
        out.append("  ".join(x.rjust(w) for x, w in zip(c, widths)))
    te, tt = s["tokens_even"], s["tokens_table"]
    out.append("")
    out.append("token balance across GPUs (engine metrics)   EPLB even split   tempo table")
    for key, label in (
        ("vllm_balancedness", "vLLM balancedness (sum mean / sum max)"),
        ("sglang_balancedness", "SGLang balancedness (layer mean of mean/max)"),
        ("trtllm_imbalance_ratio", "TensorRT-LLM imbalance ratio (max/mean - 1)"),
    ):
        out.append(f"  {label:44s} {te[key]:15.3f}   {tt[key]:11.3f}")
    out.append(
        f"modeled time vs EPLB even split: token LP {s['token_lp_vs_even']:.3f}x, tempo per batch "
        f"{s['tempo_vs_even']:.3f}x, tempo table {s['table_vs_even']:.3f}x"
    )
    ranked = sorted(result["layers"], key=lambda r: -r["eplb_even_us"])[:worst]
    out.append(
        f"worst {len(ranked)} layers under the even split: "
        + ", ".join(
            f"{r['layer']} ({r['eplb_even_us']:.1f} -> {r['table_us']:.1f} us)" for r in ranked
        )
    )
    solve = s["solve_s"]
    out.append(
        f"solve time: tempo {1e3 * solve['tempo']:.1f} ms, token LP (HiGHS) "
        f"{1e3 * solve['token_lp']:.1f} ms, all layers (machine-dependent)"
    )
    ref = solve.get("tempo_reference", 0.0)
    if ref > 0:
        out.append(
            f"  ({1e3 * ref:.1f} ms of tempo's ran as its plain-Python reference: its kernels "
            "were not compiled yet; run straggler-warmup once (about 30 s) for kernel times)"
        )
    if "rebalance" in result:
        out.append(result["rebalance"]["line"])
    return "\n".join(out)


def _sglang_rows(p2l, layer_ids, n_experts: int) -> np.ndarray:
    """SGLang's map has one row per model layer (index = layer id): rows of layers the log
    did not record (dense layers, e.g. DeepSeek's 0-2 in a TensorRT-LLM log) get SGLang's
    trivial placement, slot ``p`` holding expert ``p % E``."""
    ids = np.asarray(layer_ids)
    if np.array_equal(ids, np.arange(ids.size)):
        return p2l
    full = np.tile(np.arange(p2l.shape[1]) % n_experts, (int(ids.max()) + 1, 1))
    full[ids] = p2l
    return full


def _write_outputs(result: Plan, out_dir: str, fmt: str, torch_twins: bool) -> list[str]:
    """Write every output into a staging directory inside ``out_dir``, then rename each into
    ``out_dir``; on any failure the staging directory is removed and ``out_dir`` is left as
    it was."""
    created = not os.path.isdir(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".straggler-plan-", dir=out_dir)
    done = False
    try:
        staged = _write_staged(result, stage, fmt, torch_twins)
        final = []
        for f in staged:
            dest = os.path.join(out_dir, os.path.basename(f))
            if os.path.isdir(dest):
                raise InvalidInputError(f"Cannot write {dest}: it is a directory.")
            final.append(dest)
        for f, dest in zip(staged, final):
            os.replace(f, dest)
        done = True
        return final
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if created and not done:
            shutil.rmtree(out_dir, ignore_errors=True)  # it did not exist before


def _write_staged(result: Plan, out_dir: str, fmt: str, torch_twins: bool) -> list[str]:
    p2l = result["placement"]["physical_to_logical"]
    E = result["meta"]["n_experts"]
    files = []
    if fmt == "sglang":
        full = _sglang_rows(p2l, result["tables"]["layer_ids"], E)
        files.append(
            write_sglang_init_location(
                os.path.join(out_dir, "init_expert_location.json"), physical_to_logical=full
            )
        )
        if torch_twins:
            files.append(
                write_sglang_init_location(
                    os.path.join(out_dir, "init_expert_location.pt"), physical_to_logical=full
                )
            )
    elif fmt == "vllm":
        maps = vllm_maps(p2l, E, width=None)  # compact: vLLM rebuilds its 1024-wide map
        files.append(write_vllm_state(os.path.join(out_dir, "eplb_state.json"), maps))
        if torch_twins:
            files.append(write_vllm_state(os.path.join(out_dir, "eplb_state.pt"), maps))
    elif fmt == "trtllm":
        files.append(
            write_moe_load_balancer(
                os.path.join(out_dir, "moe_load_balancer.yaml"),
                p2l,
                layer_ids=result["tables"]["layer_ids"],
            )
        )
    else:
        if "log2phy" in result["placement"]:
            log2phy, logcnt = result["placement"]["log2phy"], result["placement"]["logcnt"]
        else:
            log2phy, logcnt = logical_to_physical(p2l, E)
        weight = result["loads"]
        files.append(
            write_eplb_maps(
                os.path.join(out_dir, "eplb_maps.json"), p2l, log2phy, logcnt, weight=weight
            )
        )
    tables = os.path.join(out_dir, "dispatch_tables.npz")
    np.savez(tables, **result["tables"])  # out_dir is the staging directory
    files.append(tables)
    report = os.path.join(out_dir, "report.json")
    with open(report, "w") as f:
        keys = ("meta", "summary", "layers", "rebalance")
        json.dump({k: result[k] for k in keys if k in result}, f, indent=1)
    files.append(report)
    return files


def plot_heatmap(result: Plan, path: str) -> None:
    """Layer x GPU heatmap of mean modeled time, EPLB's even split beside the tempo table."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BackendUnavailableError(
            "--plot needs matplotlib: pip install 'straggler[plot]'."
        ) from None
    even, table = result["gpu_time"]["even"], result["gpu_time"]["table"]
    vmax = max(float(even.max()), float(table.max()), 1e-9)
    fig, axes = plt.subplots(
        1,
        2,
        figsize=(11, max(3.0, 0.12 * even.shape[0] + 1.5)),
        sharey=True,
        constrained_layout=True,
    )
    s = result["summary"]
    for ax, data, title in (
        (axes[0], even, f"EPLB even split ({s['total_eplb_even_us']:.0f} us)"),
        (axes[1], table, f"tempo table ({s['total_table_us']:.0f} us)"),
    ):
        im = ax.imshow(
            data, aspect="auto", cmap="viridis", vmin=0, vmax=vmax, interpolation="nearest"
        )
        ax.set_title(title)
        ax.set_xlabel("GPU")
    L, G = even.shape
    ids = np.asarray(result["tables"]["layer_ids"])
    ys = np.arange(0, L, max(1, L // 16))
    xs = np.arange(0, G, max(1, G // 16))
    for ax in axes:
        ax.set_xticks(xs)
    axes[0].set_yticks(ys, [str(int(ids[y])) for y in ys])
    axes[0].set_ylabel("MoE layer")
    fig.colorbar(im, ax=axes, label="mean modeled time per GPU (us)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format=os.path.splitext(path)[1][1:] or "png")
    plt.close(fig)
