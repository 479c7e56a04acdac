"""``straggler-simulate``: every routing policy on one trace in the lock-step simulator.

``straggler-simulate TRACE [--load X] [--replicas G] [--policies a,b:version,...]
[--dispatch pool|queue] [--prefix-cache] [--ctx-cost S] [--plot PNG]``

``straggler-simulate TRACE --moe PRESET --ep G [--layers K] [--nodes N] [--routings ...]
[--dispatches ...] [--placements ...] [--table-period S] [--full]`` prices every step with the
deployment step model (DP attention + EP MoE, :mod:`straggler.sim.engine.deployment`) and prints
the levers table (:func:`~straggler.sim.experiments.levers.levers`): routing x dispatch x placement,
each cell relative to JSQ + EPLB's even split; ``--plot`` then draws the step decomposition.
Without ``--full`` it runs a small grid (:data:`LEVERS_QUICK_GRID`) on the first
:data:`LEVERS_QUICK_REQUESTS` requests; it prints the cell count and an estimate first.

``straggler-simulate TRACE --moe PRESET --ep G --rebalance never,auto,vllm,sglang,every:N
[--rebalance-mode sync|async|batched] [--drift X | --expert-loads REC1,REC2,... [--drift-every
S]] [--fail RANK:DOWN[:UP]] [--json OUT] [--plot PNG]`` compares rebalance policies in one run
(:func:`~straggler.sim.experiments.rebalance.rebalance_loop`): throughput, TPOT p50/p99, vLLM's
balancedness, rearrangements, expert copies, bytes moved and the time they stalled or delayed
the steps; ``--plot`` draws throughput over time with every rearrangement marked.
``--expert-loads`` plays recordings (any format
:func:`~straggler.runtime.engines.read_engine_log` reads, or ``popularity:FILE``: a per-layer
expert popularity summed over a workload, :func:`~straggler.sim.workloads.drift.read_popularity`,
e.g. Mixtral's per-MMLU-subject recordings; their experts must be the preset's) one after
another, each for ``--drift-every`` seconds (default: an equal share of the trace's simulated
time), the batches of each resampled step by step (a popularity file is one batch: each step
routes its tokens from it).

``TRACE`` is a trace file (Azure CSV, Mooncake JSONL, BurstGPT, a length-only CSV: see
:func:`~straggler.sim.workloads.traces.load_trace`), a name of
:data:`~straggler.sim.experiments.load_sweep.SWEEP_TRACES` (the traces shipped with the
package, or the same files in the folder ``$STRAGGLER_TRACES`` names), or a generator preset
(:data:`~straggler.sim.workloads.traces.WORKLOAD_PRESETS`). Each policy is simulated with the same
settings; the table gives the whole-run metrics with their ratio to JSQ's (units in the
header), a progress bar runs over the policies (tqdm when installed, else a line on stderr),
and a one-line notice says when the kernels are compiled (the first run with a cold cache).

Run ``straggler-simulate --help`` for the flags.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import sys
import time

from ...formulations._io import OneLineParser, atomic_open, check_output_file, name_list
from ...formulations.errors import BackendUnavailableError, InvalidInputError, StragglerError
from ...sim.engine.deployment import DISPATCHES, MODEL_PRESETS, PLACEMENTS
from ...sim.engine.simulator import LOAD_BASES, engine_cache_is_warm, simulate, warm_engine
from ...sim.experiments.load_sweep import SWEEP_TRACES, sweep_trace
from ...sim.workloads.prefix import load_prefix_blocks
from ...sim.workloads.traces import WORKLOAD_PRESETS, Trace, generate_trace, load_trace
from ...solvers.placement.rebalance.transfer import LINK_PRESETS, REBALANCE_MODES
from ...solvers.routing.registry import DEFAULT_POLICY, get_routing_policy, routing_policies

__all__ = [
    "main",
    "format_reports",
    "resolve_trace",
    "CMD_MAX_REPLICAS",
    "CMD_MAX_SLOTS",
    "CMD_MAX_SLOTS_TOTAL",
]

#: Bounds of ``--replicas``, ``--max-slots`` and their product: the simulator keeps state per
#: slot of every replica, so an absurd value would run for minutes before anything is shown.
CMD_MAX_REPLICAS = 4096
CMD_MAX_SLOTS = 65536
CMD_MAX_SLOTS_TOTAL = 2**22

#: Table columns: (header, SimReport field, scale, format, ratio to JSQ's).
COLUMNS = (
    ("mean imbalance (tok)", "mean_imbalance", 1.0, "{:,.0f}", True),
    ("TPOT p95 (ms)", "tpot_p95_ms", 1.0, "{:.1f}", True),
    ("TTFT p99 (s)", "ttft_p99_ms", 1e-3, "{:.2f}", True),
    ("throughput (tok/s)", "throughput_tps", 1.0, "{:,.0f}", True),
    ("preempted", "n_preempted", 1.0, "{:d}", False),
    ("unfinished", "n_unfinished", 1.0, "{:d}", False),
    ("max pool wait (s)", "max_pool_wait_s", 1.0, "{:.1f}", False),
)


def resolve_trace(spec: str, *, rate: float | None, n_requests: int) -> Trace:
    """The trace named by ``spec``: a file, a sweep trace name, or a generator preset."""
    path = pathlib.Path(spec)
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise InvalidInputError(f"--rate must be a positive number of requests/s; got {rate}.")
    if path.is_dir():
        raise InvalidInputError(f"TRACE {spec!r} is a folder; expected a trace file or a name.")
    if path.exists():
        try:
            tr = load_trace(path, rate=rate) if rate is not None else load_trace(path)
        except InvalidInputError as e:
            if rate is None and "'rate' parameter" in str(e):
                raise InvalidInputError(
                    f"TRACE {spec!r} is a length-only trace (no arrival times): give --rate, "
                    "its requests per second."
                ) from None
            raise
    elif spec in SWEEP_TRACES:
        tr = sweep_trace(spec)
    elif spec in WORKLOAD_PRESETS:
        tr = generate_trace(spec)
    else:
        raise InvalidInputError(
            f"{spec!r} is neither a file, a shipped trace "
            f"({', '.join(SWEEP_TRACES)}) nor a generator preset ({', '.join(WORKLOAD_PRESETS)})."
        )
    if n_requests and n_requests < len(tr):
        tr = tr.subset(list(range(n_requests)))
    return tr


def _parser() -> OneLineParser:
    p = OneLineParser(
        prog="straggler-simulate",
        description="Replay a trace on lock-step decode replicas under every routing policy.",
    )
    p.add_argument("trace", help="a trace file, a shipped trace name or a generator preset")
    p.add_argument(
        "--load",
        type=float,
        default=None,
        help="offered load as a multiple of the capacity of the stage that binds, decode or "
        "prefill (--load-basis; default: the trace as recorded)",
    )
    p.add_argument(
        "--load-basis",
        choices=LOAD_BASES,
        default="binding",
        help="the capacity --load is a multiple of: the smaller of the decode cluster's and "
        "the prefill instances' (binding, the default), or the one named",
    )
    p.add_argument("--replicas", type=int, default=8, help="decode replicas G (default 8)")
    p.add_argument(
        "--policies",
        type=name_list,
        default=None,
        help=f"comma-separated policies, NAME or NAME:VERSION for a baseline's upstream "
        f"version (e.g. vllm:legacy; default: all, {DEFAULT_POLICY} and jsq first)",
    )
    p.add_argument(
        "--dispatch",
        choices=("pool", "queue"),
        default="pool",
        help="pool: one central pool, a request goes only to a free slot (default); queue: "
        "routed on arrival to each engine's own queue (vLLM, SGLang)",
    )
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="a Mooncake trace file: track each replica's prefix cache from its hash_ids "
        "(dynamo reads it; the table adds the hit rate)",
    )
    p.add_argument("--requests", type=int, default=0, help="use the first N requests (0: all)")
    p.add_argument("--max-slots", type=int, default=16, help="slots per replica (default 16)")
    p.add_argument("--kv-capacity", type=int, default=500_000, help="KV tokens per replica")
    p.add_argument(
        "--prefill-instances", type=int, default=None, help="default ceil(G/2); 0: unlimited"
    )
    p.add_argument(
        "--rate", type=float, default=None, help="requests/s for a length-only trace file"
    )
    p.add_argument(
        "--ctx-cost",
        type=float,
        default=0.0,
        help="seconds per prompt token of a context phase inside the decode step (aggregated "
        "serving; default 0: prefill elsewhere)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random policies")
    p.add_argument("--plot", default=None, help="write a PNG of the imbalance over time")
    p.add_argument("--json", default=None, help="write the metrics of every run as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("deployment (DP attention + EP MoE): the levers table")
    g.add_argument(
        "--moe", default=None, help=f"model preset ({', '.join(MODEL_PRESETS)}): levers table"
    )
    g.add_argument("--ep", type=int, default=None, help="EP = DP width G (default --replicas)")
    g.add_argument("--nodes", type=int, default=None, help="nodes of the EP group (default 1)")
    g.add_argument(
        "--layers",
        type=int,
        default=None,
        help=f"MoE layers simulated, scaled to depth (default {LEVERS_LAYERS})",
    )
    g.add_argument(
        "--table-period",
        type=float,
        default=None,
        help=f"simulated s between table refreshes (default {LEVERS_TABLE_PERIOD_S})",
    )
    g.add_argument("--routings", type=name_list, default=None, help="routing policies (default "
                   "jsq,brs; --full: jsq,brs,br0,trtllm_balance)")  # fmt: skip
    g.add_argument("--dispatches", type=name_list, default=None, help="dispatches (default "
                   "even,tempo; --full: even,token_lp,tempo)")  # fmt: skip
    g.add_argument("--placements", type=name_list, default=None,
                   help="placements (default eplb,place_experts)")  # fmt: skip
    g.add_argument(
        "--full",
        action="store_true",
        help=f"the whole grid on every request (default: a small grid on the first "
        f"{LEVERS_QUICK_REQUESTS:,} requests, about a minute on 2 cores)",
    )
    r = p.add_argument_group("rebalance in the loop (with --moe): the rebalance table")
    r.add_argument(
        "--rebalance", type=name_list, default=None,
        help="comma-separated rebalance policies: never, auto[:PERIOD], vllm[:STEP_INTERVAL], "
        "sglang[:ITERATIONS], every:N",
    )  # fmt: skip
    r.add_argument("--rebalance-mode", choices=REBALANCE_MODES, default=None,
                   help="how copies run: sync (stall), async, batched (default sync)")  # fmt: skip
    r.add_argument("--links", choices=sorted(LINK_PRESETS), default=None,
                   help="link bandwidth preset (default h100: 450/50 GB/s)")  # fmt: skip
    r.add_argument("--intra-gbps", type=float, default=None, help="GB/s per GPU within a node")
    r.add_argument("--inter-gbps", type=float, default=None, help="GB/s per GPU across nodes")
    r.add_argument(
        "--drift",
        type=float,
        default=None,
        help="synthetic drift: std of each expert's log-popularity step (default 0)",
    )
    r.add_argument("--drift-steps", type=int, default=None,
                   help="steps between synthetic drift steps (default 1000)")  # fmt: skip
    r.add_argument("--expert-loads", type=name_list, default=None,
                   help="comma-separated engine recordings played in turn (popularity:FILE: "
                   "a per-layer expert popularity JSON)")  # fmt: skip
    r.add_argument(
        "--drift-every",
        type=float,
        default=None,
        help="seconds each recording routes (default: equal shares of the run)",
    )
    r.add_argument("--fail", default=None,
                   help="RANK:DOWN_STEP[:UP_STEP]: a rank lost after DOWN_STEP steps (back "
                   "after UP_STEP)")  # fmt: skip
    r.add_argument("--max-steps", type=int, default=None, help="stop after N steps")
    r.add_argument("--saturated", action="store_true",
                   help="keep every slot busy (offered load 1.5x unless --load)")  # fmt: skip
    return p


#: The levers table's quick grid (without ``--full``): each lever alone and together.
LEVERS_QUICK_GRID = (("jsq", "brs"), ("even", "tempo"), ("eplb", "place_experts"))
#: Requests the levers table simulates without ``--full`` or ``--requests``.
LEVERS_QUICK_REQUESTS = 3000
#: ``--layers`` and ``--table-period`` when not given.
LEVERS_LAYERS = 4
LEVERS_TABLE_PERIOD_S = 0.2
#: Largest ``--drift`` (the deployment model's bound on the log-popularity step).
MAX_DRIFT = 10.0


#: ``--expert-loads`` prefix of a per-layer popularity file (not an engine format).
POPULARITY_PREFIX = "popularity:"

#: Flags that only mean something with ``--rebalance``.
_REBALANCE_ONLY = (
    "rebalance_mode", "links", "intra_gbps", "inter_gbps", "drift", "drift_steps",
    "expert_loads", "drift_every", "fail", "max_steps", "saturated",
)  # fmt: skip


def _recorded_routing(paths: list, preset, layers: int | None):
    """``--expert-loads``: one :class:`~straggler.sim.engine.deployment.RoutingModel` per
    recording (its all-zero layers, the dense ones SGLang records, left out); a
    ``popularity:FILE`` is one batch of :func:`~straggler.sim.workloads.drift.read_popularity`."""
    from ...sim.engine.deployment import RoutingModel
    from ...sim.workloads.drift import read_popularity
    from ..engines import read_engine_log

    models = []
    for path in paths:
        if path.startswith(POPULARITY_PREFIX):
            counts = read_popularity(path[len(POPULARITY_PREFIX) :])[None]
        else:
            try:
                log = read_engine_log(path)
            except InvalidInputError as exc:
                if "'expert_popularity'" not in str(exc):
                    raise
                raise InvalidInputError(
                    f"{exc} A per-layer popularity file is read as {POPULARITY_PREFIX}{path}."
                ) from None
            if log.counts is None:
                raise InvalidInputError(f"--expert-loads: {path} holds a placement, no loads.")
            counts = log.counts
        counts = counts[:, counts.sum(axis=(0, 2)) > 0]
        if counts.shape[2] != preset.n_experts:
            raise InvalidInputError(
                f"--expert-loads: {path} records {counts.shape[2]} experts; --moe "
                f"{preset.name} has {preset.n_experts}."
            )
        k = None if layers is None else min(layers, counts.shape[1])
        models.append(RoutingModel.recorded(counts, top_k=preset.top_k, layers=k))
    return models


def _fail_events(spec: str, G: int) -> tuple:
    """``--fail RANK:DOWN[:UP]`` as rank events."""
    parts = spec.split(":")
    try:
        nums = [int(x) for x in parts]
    except ValueError:
        nums = []
    if (
        len(nums) not in (2, 3)
        or nums[0] < 0
        or nums[0] >= G
        or min(nums[1:]) < 1
        or (len(nums) == 3 and nums[2] <= nums[1])
    ):
        raise InvalidInputError(
            f"--fail must be RANK:DOWN_STEP[:UP_STEP] with 0 <= RANK < {G} and 1 <= DOWN_STEP "
            f"< UP_STEP; got {spec!r}"
        )
    events = [(nums[1], nums[0], False)]
    if len(nums) == 3:
        events.append((nums[2], nums[0], True))
    return tuple(events)


def _rebalance_main(args, trace) -> int:
    """``--moe ... --rebalance ...``: the rebalance table on ``trace``."""
    import dataclasses

    from ...sim.engine.config import SimConfig
    from ...sim.engine.deployment import DeploymentConfig, RoutingSequence
    from ...sim.engine.simulator import engine_inputs
    from ...sim.experiments.rebalance import rebalance_loop
    from ...solvers.placement.rebalance.registry import parse_rebalance_policies
    from ...solvers.placement.rebalance.transfer import MoveCost

    _check_trace(args, trace)
    G = args.ep if args.ep is not None else args.replicas
    policies = parse_rebalance_policies(",".join(args.rebalance), "--rebalance")
    dep = DeploymentConfig(
        preset=args.moe, n_gpus=G, n_nodes=args.nodes, layers=args.layers,
        dispatch_period_s=args.table_period, seed=args.seed,
        drift=args.drift or 0.0, drift_steps=args.drift_steps or 1000,
    )  # fmt: skip
    if args.expert_loads is not None:
        if args.drift is not None or args.drift_steps is not None:
            raise InvalidInputError("--expert-loads replays recorded drift: leave out --drift")
        models = _recorded_routing(args.expert_loads, dep.preset, args.layers)
        every = args.drift_every
        kw = dict(
            n_replicas=G, max_slots=args.max_slots, kv_capacity=args.kv_capacity, load=args.load,
            load_basis=args.load_basis, prefill_instances=args.prefill_instances,
            saturated=args.saturated,
        )  # fmt: skip
        if every is None:  # equal shares of the trace's simulated arrival window
            probe = dataclasses.replace(dep, routing=models[0])
            tr = engine_inputs(trace, SimConfig.from_settings("jsq", deployment=probe, **kw)).trace
            span = float(tr.arrival_s[-1] - tr.arrival_s[0])
            every = span / len(models) if span > 0 else 1.0
        dep = dataclasses.replace(dep, routing=RoutingSequence(models, every_s=every))
    elif args.drift_every is not None:
        raise InvalidInputError("--drift-every needs --expert-loads")
    move = MoveCost(
        expert_bytes=dep.preset.expert_bytes, links=args.links or "h100",
        intra_gbps=args.intra_gbps, inter_gbps=args.inter_gbps,
        mode=args.rebalance_mode or "sync",
    )  # fmt: skip
    if args.fail is not None:
        dep = dataclasses.replace(dep, rebalance=policies[0], move=move,
                                  rank_events=_fail_events(args.fail, G))  # fmt: skip
    warm = engine_cache_is_warm()
    if not warm:
        print("compiling kernels (first run only) ...", end="", file=sys.stderr, flush=True)
        seconds, _ = warm_engine()
        print(f" {seconds:.1f} s", file=sys.stderr)
    table = rebalance_loop(
        trace, dep, policies, move=move, progress=not args.no_progress,
        max_slots=args.max_slots, kv_capacity=args.kv_capacity, load=args.load,
        load_basis=args.load_basis, prefill_instances=args.prefill_instances,
        admission=args.dispatch, ctx_cost=args.ctx_cost, seed=args.seed,
        max_steps=args.max_steps, saturated=args.saturated,
    )  # fmt: skip
    print(f"{trace.name}: {len(trace):,} requests, {args.max_slots} slots per rank; {table.note}")
    print(table.format())
    if args.json:
        out = {
            "note": table.note,
            "rows": table.rows,
            "rearrangements": {k: list(r.rebalances) for k, r in table.reports.items()},
        }
        with atomic_open(args.json, "w") as f:
            f.write(json.dumps(out, indent=1, default=float))
        print(f"wrote {args.json}")
    if args.plot:
        table.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0


def _levers_main(args, trace) -> int:
    """``--moe``: the levers table on ``trace``."""
    from ...sim.engine.deployment import DeploymentConfig
    from ...sim.experiments.levers import LEVER_DISPATCHES, LEVER_PLACEMENTS, ROUTINGS, levers

    grid = (ROUTINGS, LEVER_DISPATCHES, LEVER_PLACEMENTS) if args.full else LEVERS_QUICK_GRID
    quick, n_all = not args.full and not args.requests, len(trace)
    if quick and n_all > LEVERS_QUICK_REQUESTS:
        trace = trace.subset(list(range(LEVERS_QUICK_REQUESTS)))
    _check_trace(args, trace)
    if quick and n_all > LEVERS_QUICK_REQUESTS:
        print(
            f"levers: the first {LEVERS_QUICK_REQUESTS:,} of {n_all:,} requests and a "
            "small grid (--full: every request and the whole grid; --requests N: N requests)",
            file=sys.stderr,
        )

    G = args.ep if args.ep is not None else args.replicas
    dep = DeploymentConfig(  # every value checked by _check_levers
        preset=args.moe, n_gpus=G, n_nodes=args.nodes, layers=args.layers,
        dispatch_period_s=args.table_period, seed=args.seed,
    )  # fmt: skip
    warm = engine_cache_is_warm()
    if not warm:
        print("compiling kernels (first run only) ...", end="", file=sys.stderr, flush=True)
        seconds, _ = warm_engine()
        print(f" {seconds:.1f} s", file=sys.stderr)
    table = levers(
        trace, dep,
        routings=grid[0] if args.routings is None else args.routings,
        dispatches=grid[1] if args.dispatches is None else args.dispatches,
        placements=grid[2] if args.placements is None else args.placements,
        progress=not args.no_progress,
        max_slots=args.max_slots, kv_capacity=args.kv_capacity, load=args.load,
        load_basis=args.load_basis, prefill_instances=args.prefill_instances,
        admission=args.dispatch,
        ctx_cost=args.ctx_cost, seed=args.seed,
    )  # fmt: skip
    print(f"{trace.name}: {len(trace):,} requests, {args.max_slots} slots per rank")
    print(table.format())
    if args.json:
        with atomic_open(args.json, "w") as f:
            f.write(json.dumps(table.rows, indent=1))
        print(f"wrote {args.json}")
    if args.plot:
        from ...sim.experiments.levers import plot_step_decomposition

        plot_step_decomposition(table, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _progress(total: int, enabled: bool):
    """A tqdm bar on stderr when tqdm is installed, else a plain line per finished run."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc="simulating", unit="run", file=sys.stderr)
    except ImportError:
        return None


#: Added with ``--prefix-cache``.
COLUMNS_CACHE = (("prefix hits", "prefix_hit_rate", 1.0, "{:.3f}", False),)


def format_reports(reports: dict, baseline: str = "jsq", extra=()) -> str:
    """The comparison table: one row per policy, each metric with its ratio to ``baseline``'s.

    Examples
    --------
    >>> from straggler.sim.workloads.traces import Trace
    >>> tr = Trace(arrival_s=[0, 0], prompt_len=[5, 5], output_len=[2, 2])
    >>> reps = {p: simulate(tr, p, n_replicas=2, max_slots=2) for p in ("jsq", "br0")}
    >>> print(format_reports(reps).splitlines()[0].split("|")[0].strip())
    policy
    """
    base = reports.get(baseline)
    columns = COLUMNS + tuple(extra)
    width = max([14] + [len(p) + 2 for p in reports])
    head = f"{'policy':{width}s}"
    for name, _, _, _, ratio in columns:
        head += f" | {name}" + (f" {'x ' + baseline:>6s}" if ratio and base else "")
    lines = [head, "-" * len(head)]
    for pol, r in reports.items():
        line = f"{pol + (' *' if pol == DEFAULT_POLICY else ''):{width}s}"
        for name, field, scale, fmt, ratio in columns:
            v = getattr(r, field)
            shown = v * scale if isinstance(v, float) else v
            text = "nan" if isinstance(v, float) and math.isnan(v) else fmt.format(shown)
            line += f" | {text:>{len(name)}s}"
            if ratio and base:
                b = getattr(base, field)
                line += f" {v / b if b else float('nan'):>6.2f}"
        lines.append(line)
    return "\n".join(lines)


def _check_args(args) -> None:
    """Every option's range, before any work (one line and exit 2 otherwise)."""
    bounds = (
        ("replicas", 1, CMD_MAX_REPLICAS),
        ("ep", 1, CMD_MAX_REPLICAS),
        ("max_slots", 1, CMD_MAX_SLOTS),
        ("kv_capacity", 1, 2**40),
        ("requests", 0, None),
        ("prefill_instances", 0, CMD_MAX_REPLICAS),
        ("seed", 0, 2**63 - 1),
    )
    for name, lo, hi in bounds:
        v = getattr(args, name)
        if v is not None and (v < lo or (hi is not None and v > hi)):
            flag = "--" + name.replace("_", "-")
            raise InvalidInputError(
                f"{flag} must be in [{lo}, {hi if hi is not None else 'inf'}]; got {v}"
            )
    if args.replicas * args.max_slots > CMD_MAX_SLOTS_TOTAL:
        raise InvalidInputError(
            f"--replicas x --max-slots must be at most {CMD_MAX_SLOTS_TOTAL:,}; got "
            f"{args.replicas * args.max_slots:,}"
        )
    for name, lo_open in (("load", True), ("rate", True), ("ctx_cost", False)):
        v = getattr(args, name)
        if v is not None and (not math.isfinite(v) or v < 0 or (lo_open and v == 0)):
            flag = "--" + name.replace("_", "-")
            raise InvalidInputError(
                f"{flag} must be a finite number {'> 0' if lo_open else '>= 0'}; got {v}"
            )
    for name, lo, hi in (("nodes", 1, CMD_MAX_REPLICAS), ("layers", 1, 4096)):
        v = getattr(args, name)
        if v is not None and not lo <= v <= hi:
            raise InvalidInputError(f"--{name} must be in [{lo}, {hi}]; got {v}")
    if args.load_basis == "prefill" and args.prefill_instances == 0:
        raise InvalidInputError(
            "--load-basis prefill needs prefill capacity to measure against: not with "
            "--prefill-instances 0 (unlimited prefill)"
        )
    if args.rate is not None and not pathlib.Path(args.trace).is_file():
        raise InvalidInputError(
            f"--rate sets the arrivals of a length-only trace file; {args.trace!r} is not a "
            "file (a shipped trace or a generator preset has its own arrivals)"
        )
    if args.table_period is not None and not (
        math.isfinite(args.table_period) and args.table_period >= 0
    ):
        raise InvalidInputError(
            f"--table-period must be a finite number >= 0; got {args.table_period}"
        )

    if args.rebalance is not None:
        if args.moe is None:
            raise InvalidInputError("--rebalance needs --moe PRESET (the deployment step model)")
    else:
        given = [n for n in _REBALANCE_ONLY if getattr(args, n) not in (None, False)]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise InvalidInputError(f"{flag} needs --rebalance")
    for name, lo_open in (("drift", False), ("drift_every", True), ("intra_gbps", True),
                          ("inter_gbps", True)):  # fmt: skip
        v = getattr(args, name)
        if v is not None and (not math.isfinite(v) or v < 0 or (lo_open and v == 0)):
            flag = "--" + name.replace("_", "-")
            raise InvalidInputError(
                f"{flag} must be a finite number {'> 0' if lo_open else '>= 0'}; got {v}"
            )
    if args.drift is not None and args.drift > MAX_DRIFT:
        raise InvalidInputError(f"--drift must be at most {MAX_DRIFT:g}; got {args.drift}")
    for name in ("drift_steps", "max_steps"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise InvalidInputError(f"--{name.replace('_', '-')} must be at least 1; got {v}")


def _check_names(names, flag: str, known) -> None:
    """Each name of a list flag one of ``known``; the flag named otherwise."""
    for n in names or ():
        if n not in known:
            raise InvalidInputError(f"{flag} names {n!r}; expected names among {sorted(known)}")


def _check_policies(policies) -> None:
    """``--policies``: each NAME a routing policy, each NAME:VERSION one of its versions."""
    for spec in policies or ():
        name, colon, version = spec.partition(":")
        _check_names([name], "--policies", routing_policies())
        versions = get_routing_policy(name, "straggler-simulate").versions
        if colon and version not in versions:
            raise InvalidInputError(
                f"--policies names {spec!r}; {name} has "
                + (f"the versions {list(versions)}" if versions else "no versions")
            )


def _check_levers(args) -> None:
    """The deployment flags (``--moe``'s group) against the preset, each error naming its
    flag, so that the deployment model and the levers table built from them refuse nothing;
    without ``--moe`` they are refused, as the flags of the policy table are with it."""
    group = ("ep", "nodes", "layers", "table_period", "routings", "dispatches", "placements")
    if args.moe is None:
        given = [n for n in (*group, "full") if getattr(args, n) not in (None, False)]
        if given:
            raise InvalidInputError(
                f"--{given[0].replace('_', '-')} is a flag of the levers table; give --moe too"
            )
        return
    for name in ("policies", "prefix_cache"):
        if getattr(args, name) not in (None, False):
            raise InvalidInputError(
                f"--{name.replace('_', '-')} is a flag of the policy table, not of --moe's "
                "levers table (--routings names its routing policies)"
            )
    _check_names([args.moe], "--moe", MODEL_PRESETS)
    G = args.ep if args.ep is not None else args.replicas
    preset = MODEL_PRESETS[args.moe]
    if args.nodes is not None and (args.nodes > G or G % args.nodes):
        raise InvalidInputError(f"--nodes must be a divisor of the EP width {G}; got {args.nodes}")
    if args.layers is not None and args.layers > preset.n_moe_layers:
        raise InvalidInputError(
            f"--layers must be at most {args.moe}'s {preset.n_moe_layers} MoE layers; "
            f"got {args.layers}"
        )
    _check_names(args.routings, "--routings", routing_policies())
    _check_names(args.dispatches, "--dispatches", DISPATCHES)
    _check_names(args.placements, "--placements", PLACEMENTS)
    if args.rebalance is not None:
        from ...solvers.placement.rebalance.registry import parse_rebalance_policies

        parse_rebalance_policies(",".join(args.rebalance), "--rebalance")
    # the defaults, now that a flag given without --moe can be told from one left out
    args.nodes = 1 if args.nodes is None else args.nodes
    args.layers = LEVERS_LAYERS if args.layers is None else args.layers
    if args.table_period is None:
        args.table_period = LEVERS_TABLE_PERIOD_S


def _check_trace(args, trace) -> None:
    """The flags that depend on the trace, once it is read and before any work."""
    longest = int((trace.prompt_len + trace.output_len).max()) if len(trace) else 0
    if longest > args.kv_capacity:
        raise InvalidInputError(
            f"--kv-capacity must hold the longest request of the trace (prompt + output: "
            f"{longest:,} tokens, as vLLM's max_model_len must fit the KV cache); got "
            f"{args.kv_capacity:,}"
        )


def _check_outputs(args) -> None:
    """``--json`` and ``--plot`` writable (and matplotlib there for a plot), before any work."""
    if args.json:
        check_output_file(args.json, "--json")
    if args.plot:
        check_output_file(args.plot, "--plot")
        if importlib.util.find_spec("matplotlib") is None:
            raise BackendUnavailableError("--plot needs matplotlib: pip install 'straggler[plot]'.")


def main(argv=None) -> int:
    """Console entry point ``straggler-simulate``; returns the exit status (0 ok, 2 bad
    arguments or input, one line on stderr)."""
    args = _parser().parse_args(argv)
    if args.moe is not None:
        try:
            _check_args(args)
            _check_levers(args)
            _check_outputs(args)
            trace = resolve_trace(args.trace, rate=args.rate, n_requests=args.requests)
            if args.rebalance is not None:
                return _rebalance_main(args, trace)
            return _levers_main(args, trace)
        except (StragglerError, ValueError, OSError) as e:
            print(f"straggler-simulate: error: {e}", file=sys.stderr)
            return 2
    try:
        _check_args(args)
        _check_levers(args)
        _check_policies(args.policies)
        _check_outputs(args)
        if args.policies is not None:
            policies = args.policies
        else:
            rest = [p for p in routing_policies() if p not in (DEFAULT_POLICY, "jsq")]
            policies = [DEFAULT_POLICY, "jsq", *rest]
        trace = resolve_trace(args.trace, rate=args.rate, n_requests=args.requests)
        _check_trace(args, trace)
        blocks = None
        if args.prefix_cache:
            if not pathlib.Path(args.trace).is_file():
                raise InvalidInputError("--prefix-cache needs a Mooncake trace file")
            blocks = load_prefix_blocks(args.trace)
            if len(blocks) > len(trace):  # --requests kept the first N
                blocks = blocks.subset([i < len(trace) for i in range(len(blocks))])
        names = sorted({p.partition(":")[0] for p in policies})
        warm = engine_cache_is_warm(names)
        if not warm:
            print("compiling kernels (first run only) ...", end="", file=sys.stderr, flush=True)
        seconds, compiled = warm_engine(names)
        if not warm:
            print(f" {seconds:.1f} s", file=sys.stderr)
        elif compiled:
            print(f"compiling kernels (first run only) ... {seconds:.1f} s", file=sys.stderr)
        bar = _progress(len(policies), not args.no_progress)
        reports = {}
        t0 = time.perf_counter()
        for k, spec in enumerate(policies):
            pol, _, version = spec.partition(":")
            reports[spec] = simulate(
                trace,
                pol,
                **({"version": version} if version else {}),
                admission=args.dispatch,
                prefix_blocks=blocks,
                ctx_cost=args.ctx_cost,
                n_replicas=args.replicas,
                max_slots=args.max_slots,
                kv_capacity=args.kv_capacity,
                load=args.load,
                load_basis=args.load_basis,
                prefill_instances=args.prefill_instances,
                seed=args.seed,
            )
            if bar is not None:
                bar.update(1)
            elif not args.no_progress:
                print(
                    f"simulating: {k + 1}/{len(policies)} runs ({pol}, "
                    f"{time.perf_counter() - t0:.1f} s)",
                    file=sys.stderr,
                )
        if bar is not None:
            bar.close()
    except (StragglerError, ValueError, OSError) as e:
        print(f"straggler-simulate: error: {e}", file=sys.stderr)
        return 2
    first = next(iter(reports.values()))
    load = f"{first.offered_load:.2f}x" + (" (as recorded)" if args.load is None else "")
    print(
        f"{trace.name}: {len(trace):,} requests, G = {args.replicas}, {args.max_slots} slots, "
        f"offered load {load} of the {_basis(args.load_basis, first)} capacity, "
        f"{args.dispatch} dispatch; whole-run metrics (* = default policy)"
    )
    print(format_reports(reports, extra=COLUMNS_CACHE if blocks is not None else ()))
    try:
        if args.json:
            out = {pol: r.summary() for pol, r in reports.items()}
            with atomic_open(args.json, "w") as f:
                f.write(json.dumps(out, indent=1))
            print(f"wrote {args.json}")
        if args.plot:
            from ...sim.experiments.plots import plot_imbalance

            plot_imbalance(
                reports, args.plot, window_only=False, title=f"{trace.name}, load {load}"
            )
            print(f"wrote {args.plot}")
    except (StragglerError, ValueError, OSError) as e:
        print(f"straggler-simulate: error: writing the outputs failed: {e}", file=sys.stderr)
        return 2
    return 0


def _basis(basis: str, report) -> str:
    """The capacity the offered load is stated against, in words."""
    if basis == "binding":
        return f"binding ({report.binding_stage})"
    return basis


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
