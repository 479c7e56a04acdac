"""The routing load sweep: one simulated run per cell (trace, cluster size, load, policy).

:func:`load_sweep_cell` is the cell function that :func:`straggler.sim.sweep` calls (a
module-level function, importable by name in worker processes); :data:`SWEEP_TRACES` names the
traces shipped with the package (or read from ``$STRAGGLER_TRACES``,
:func:`~straggler.sim.workloads.traces.find_trace`) and the generated workload. Used by
``benchmarks/routing_load_sweep.py`` and the ``straggler-simulate`` command.

Prefill capacity in a sweep (``prefill="sized"``, the benchmark's setting): enough prefill
instances for twice the trace's decode capacity at that ``G``, ``ceil(2 * rate * (base +
mean prompt / tokens_per_s))`` at the simulator's default instance speed, so that decode, not
prefill, is the bottleneck up to ``load = 2`` (Azure code's 28-token outputs need about three
times the default ``ceil(G/2)`` instances); ``prefill="default"`` keeps the simulator's
default.
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np

from ...formulations.validation import check_choice, check_int, check_real, check_type
from ..engine.simulator import DEFAULT_PREFILL, decode_capacity, simulate
from ..workloads.traces import Trace, find_trace, generate_trace, load_trace, traces_dir

__all__ = [
    "SWEEP_TRACES",
    "SWEEP_METRICS",
    "load_sweep_cell",
    "sweep_trace",
    "sized_prefill_instances",
    "traces_dir",
]

#: Sweep trace name -> (file in the traces folder or None for the generator, load_trace rate).
SWEEP_TRACES = {
    "azure_conv": ("AzureLLMInferenceTrace_conv.csv", None),
    "azure_code": ("AzureLLMInferenceTrace_code.csv", None),
    "mooncake_conv": ("conversation_trace.jsonl", None),
    "mooncake_synth": ("synthetic_trace.jsonl", None),
    "sharegpt": ("sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 10.0),
    "arxiv": ("arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", 10.0),
    "generated": (None, None),
}

#: The SimReport fields a cell returns.
SWEEP_METRICS = (
    "mean_imbalance",
    "window_mean_imbalance",
    "balance_ratio",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "queue_p99_ms",
    "max_pool_wait_s",
    "throughput_tps",
    "window_throughput_tps",
    "slot_utilisation",
    "n_preempted",
    "n_unfinished",
    "sched_us_p99",
    "offered_load",
    "wall_s",
)


@functools.lru_cache(maxsize=16)
def sweep_trace(name: str, n_requests: int = 0, directory: str | None = None) -> Trace:
    """The trace ``name`` of :data:`SWEEP_TRACES`, its first ``n_requests`` (0: all), cached
    per process, from ``directory`` or else :func:`~straggler.sim.workloads.traces.traces_dir`
    (the package's copy unless ``$STRAGGLER_TRACES`` is set). Length-only traces get Poisson
    arrivals at 10 requests/s (the load knob rescales them anyway); ``generated`` is one hour
    of the ``bursty`` generator (seed 0)."""
    check_choice(name, "trace", "sweep_trace", list(SWEEP_TRACES))
    fname, rate = SWEEP_TRACES[name]
    if fname is None:
        tr = generate_trace("bursty")
    else:
        path = find_trace(fname, directory or None, name=name)
        tr = load_trace(path, rate=rate) if rate is not None else load_trace(path)
    n = check_int(n_requests, "n_requests", "sweep_trace", lo=0)
    if n and n < len(tr):
        tr = tr.subset(np.arange(n))
    return Trace(
        arrival_s=tr.arrival_s,
        prompt_len=tr.prompt_len,
        output_len=tr.output_len,
        prefix_hash=tr.prefix_hash,
        name=name,
        meta=tr.meta,
    )


def sized_prefill_instances(trace: Trace, n_replicas: int, *, max_slots=16, kv_capacity=500_000):
    """Prefill instances for twice ``trace``'s decode capacity at ``n_replicas`` (module
    docstring), at the simulator's default instance speed.

    Examples
    --------
    >>> tr = Trace(arrival_s=[0, 1], prompt_len=[1000, 1000], output_len=[100, 100])
    >>> sized_prefill_instances(tr, 8)
    3
    """
    cap = decode_capacity(
        trace, n_replicas=n_replicas, max_slots=max_slots, kv_capacity=kv_capacity
    )
    tokens_per_s, base = DEFAULT_PREFILL
    per_request = base + float(trace.prompt_len.mean()) / tokens_per_s
    return max(1, math.ceil(2.0 * cap["rate_per_s"] * per_request))


def load_sweep_cell(
    trace: str,
    n_replicas: int,
    load: float,
    policy: str,
    n_requests: int = 8000,
    prefill: str = "sized",
    seed: int = 0,
    directory: str = "",
    options: str = "",
    first: int = 0,
    load_basis: str = "binding",
) -> dict:
    """One sweep cell: ``simulate`` ``n_requests`` of ``trace`` (from request ``first``) at
    ``load`` (a multiple of the capacity ``load_basis`` names, as ``simulate`` takes it: the
    binding stage's by default) on ``n_replicas`` replicas under ``policy`` (defaults
    otherwise; BR-H with the survival predictor; ``options``: the policy's options as a JSON
    object, for ablations);
    returns :data:`SWEEP_METRICS`, the prefill instances used, and which stage binds: the
    cell's ``binding_stage`` (``"prefill"`` labels a prefill-bound cell), its offered prefill
    load and the measured prefill and decode utilisation (see :class:`SimReport`)."""
    f = "load_sweep_cell"
    opts = json.loads(options) if options else {}
    check_type(opts, "options", f, dict, "a JSON object of policy options")
    G = check_int(n_replicas, "n_replicas", f, lo=1)
    load = check_real(load, "load", f, lo=0, lo_open=True)
    check_choice(prefill, "prefill", f, ["sized", "default"])
    tr = sweep_trace(trace, n_requests + first if n_requests else 0, directory or None)
    if first:
        tr = tr.subset(np.arange(first, len(tr))).rebase()
    inst = sized_prefill_instances(tr, G) if prefill == "sized" else None
    r = simulate(
        tr, policy, n_replicas=G, load=load, load_basis=load_basis, prefill_instances=inst,
        seed=seed, **opts,
    )  # fmt: skip
    out = {k: getattr(r, k) for k in SWEEP_METRICS}
    out["prefill_instances"] = int(r.config["prefill_instances"])
    out["binding_stage"] = r.binding_stage
    for k in ("offered_prefill_load", "prefill_utilisation", "decode_utilisation"):
        out[k] = getattr(r, k)
    return {k: (float(v) if isinstance(v, float) else v) for k, v in out.items()}
