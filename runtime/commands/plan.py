"""``straggler-plan``: an engine's recorded expert loads in, a placement and dispatch tables out.

The command around :func:`straggler.runtime.plan.plan` (see that module for what is planned,
scored and written). Run ``straggler-plan --help`` for the flags.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np

from ...formulations._io import OneLineParser, check_output_dir, check_output_file
from ...formulations.cost import PRESETS, CostModel
from ...formulations.errors import BackendUnavailableError, InvalidInputError, StragglerError
from ...solvers.dispatch._backend import needs_compile
from ...solvers.dispatch.calibration import CalibrationResult, fit_cost_model, read_calibration_log
from ..engines import ENGINES, read_engine_log
from ..engines.samples import SAMPLE_PREFIX, SAMPLES, sample_recording
from ..plan import (
    DEFAULT_COST,
    MAX_PLAN_GPUS,
    PLAN_PLACEMENTS,
    _write_outputs,
    format_report,
    plan,
    plot_heatmap,
)

__all__ = ["main"]


def _first_run_notice(notify) -> None:
    """Say on one line, on a first run (a dispatch kernel neither compiled nor in numba's
    disk cache), that the kernels' plain-Python references serve first: nothing is
    compiled up front, and a plan that outruns the references' budget compiles the
    kernels once, then runs them (``straggler.solvers.dispatch._backend``)."""
    if needs_compile():
        notify(
            "tempo's kernels are not compiled yet: their plain-Python references run first "
            "(same results); a long plan compiles them once (straggler-warmup does it ahead)"
        )


def _cost_from(args) -> tuple[CostModel, str]:
    if args.calibration:
        path = args.calibration
        if path.endswith(".json"):
            fit = CalibrationResult.load(path)
            return fit.cost, f"calibration {path} (rel RMS {100 * fit.rel_rms:.1f}%)"
        log = read_calibration_log(path)
        fit = fit_cost_model(log["G"], log["N"], log["t"], T=log["T"], bootstrap=0, rng=0)
        return (
            fit.cost,
            f"fitted from {path} ({fit.n_samples} samples, rel RMS {100 * fit.rel_rms:.1f}%)",
        )
    name = args.cost or DEFAULT_COST
    return CostModel.preset(name), f"preset {name}"


def _parser() -> OneLineParser:
    p = OneLineParser(
        prog="straggler-plan",
        description="Read an engine's recorded expert loads, place experts (EPLB), solve tempo "
        "on the recorded batches, write the placement and dispatch tables in an engine's layout.",
    )
    p.add_argument(
        "logs",
        help="file or directory an engine wrote (format detected), inline JSON, or a shipped "
        f"sample recording: {', '.join(SAMPLE_PREFIX + e for e in SAMPLES)}",
    )
    p.add_argument("--gpus", type=int, required=True, help="EP degree of the deployment")
    p.add_argument("--nodes", type=int, default=1, help="nodes (EPLB's hierarchical policy)")
    p.add_argument(
        "--slots",
        type=int,
        default=None,
        help="physical expert slots (default: the recorded placement's, else one per expert)",
    )
    p.add_argument(
        "--groups",
        type=int,
        default=1,
        help="expert groups for EPLB (DeepSeek-V3: 8; default 1: EPLB's global policy)",
    )
    p.add_argument("--distinct", action="store_true", help="EPLB without two replicas on one GPU")
    p.add_argument(
        "--placement",
        default="eplb",
        metavar="{eplb,place_experts,recorded,FILE}",
        help="eplb (rebuild), place_experts (placement for tempo), recorded (keep the log's), "
        "or a TensorRT-LLM moe_load_balancer.yaml the statistics were recorded under (slot "
        "ids folded through it; kept as the placement)",
    )
    cost = p.add_mutually_exclusive_group()
    cost.add_argument(
        "--cost",
        choices=sorted(PRESETS),
        default=None,
        help=f"cost preset (default {DEFAULT_COST})",
    )
    cost.add_argument(
        "--calibration",
        default=None,
        help="a fit (CalibrationResult .json) or a G,N,t_us CSV log to fit",
    )
    p.add_argument(
        "--format",
        choices=ENGINES,
        default=None,
        help="layout of the written placement (default: the log's engine)",
    )
    p.add_argument("--input-format", choices=ENGINES, default=None, help="skip detection")
    p.add_argument(
        "--out", default=None, help="directory to write the placement, tables and report"
    )
    p.add_argument("--torch", action="store_true", help="also write .pt files (SGLang, vLLM)")
    p.add_argument(
        "--holdout",
        type=float,
        default=0.0,
        help="fraction of the last batches kept out of the plan and scored on (default 0)",
    )
    p.add_argument(
        "--max-batches",
        type=int,
        default=32,
        help="at most this many batches solved per layer, evenly spaced (default 32)",
    )
    p.add_argument("--worst", type=int, default=5, help="worst layers listed (default 5)")
    p.add_argument("--plot", default=None, help="PNG: layer x GPU modeled-time heatmap")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--previous",
        default=None,
        help="the placement in force (a file any engine wrote, read like LOGS): report whether "
        "to rebalance; with --placement place_experts, plan from it",
    )
    p.add_argument(
        "--max-moves",
        type=int,
        default=None,
        help="replicas moved per layer at most (needs --previous; implies place_experts)",
    )
    return p


def _recording(spec: str) -> str:
    """The path a recording argument names: ``sample:ENGINE`` is the shipped sample."""
    if spec.startswith(SAMPLE_PREFIX):
        return str(sample_recording(spec[len(SAMPLE_PREFIX) :]))
    return spec


def _read_previous(path: str) -> np.ndarray:
    """The ``physical_to_logical`` map of the placement file ``--previous`` names."""
    log = read_engine_log(_recording(path))
    if log.physical_to_logical is None:
        raise InvalidInputError(
            f"The --previous file must hold a placement (physical_to_logical). Got "
            f"{log.summary()} instead."
        )
    return np.asarray(log.physical_to_logical)


def _check_against_log(args, log, previous) -> None:
    """The flags that depend on the recording (its experts, its recorded placement),
    checked once it is read and before any planning, each error naming its flag."""
    E = log.n_experts
    if args.groups > E or E % args.groups:
        raise InvalidInputError(
            f"--groups must divide the recording's {E} experts; got {args.groups}"
        )
    if args.placement not in PLAN_PLACEMENTS or args.placement == "recorded":
        return  # the recorded placement's slots (plan checks --slots against them)
    if args.slots is not None:
        P, what = args.slots, "--slots"
        if not E <= P <= args.gpus * E:
            raise InvalidInputError(
                f"--slots must be in [{E}, {args.gpus * E}] (at least one slot per expert of "
                f"the recording, at most every expert on every GPU); got {P}"
            )
    elif previous is not None and args.placement == "place_experts":
        P, what = int(np.shape(previous)[1]), "the --previous placement's slots"
    else:
        P, what = E, "the slots (--slots, default the recording's experts)"
    if P % args.gpus:
        raise InvalidInputError(f"--gpus {args.gpus} must divide {what}, {P}")


def main(argv=None) -> int:
    """Console entry point ``straggler-plan``; returns the exit status (0 ok, 2 bad input)."""
    parser = _parser()
    args = parser.parse_args(argv)
    for name in ("gpus", "nodes", "groups", "max_batches"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.gpus > MAX_PLAN_GPUS:
        parser.error(f"--gpus must be at most {MAX_PLAN_GPUS}; got {args.gpus}")
    if args.slots is not None and args.slots < 1:
        parser.error("--slots must be at least 1")
    if args.gpus % args.nodes:
        parser.error(f"--gpus {args.gpus} is not a multiple of --nodes {args.nodes}")
    if not (0 <= args.holdout < 1):
        parser.error("--holdout must be in [0, 1)")
    if args.max_moves is not None:
        if args.previous is None or args.max_moves < 0:
            parser.error("--max-moves needs --previous and a count of at least 0")
        if args.placement == "recorded":
            parser.error("--max-moves plans from --previous: not with --placement recorded")
        args.placement = "place_experts"
    if args.worst < 0:
        parser.error("--worst must be at least 0")
    if args.seed < 0:
        parser.error("--seed must be at least 0")
    try:  # outputs checked before any work
        if args.out:
            check_output_dir(args.out, "--out")
        if args.torch and importlib.util.find_spec("torch") is None:
            raise BackendUnavailableError(
                "--torch writes .pt files and needs torch: pip install 'straggler[runtime]'."
            )
        if args.plot:
            check_output_file(args.plot, "--plot")
            if importlib.util.find_spec("matplotlib") is None:
                raise BackendUnavailableError(
                    "--plot needs matplotlib: pip install 'straggler[plot]'."
                )
    except (InvalidInputError, BackendUnavailableError) as exc:
        print(f"straggler-plan: error: {exc}", file=sys.stderr)
        return 2

    def notify(msg):
        print(msg, file=sys.stderr, flush=True)

    try:
        cost, cost_note = _cost_from(args)
        placement, placement_file = args.placement, None
        # a file: the placement the statistics were recorded under
        if placement not in PLAN_PLACEMENTS:
            placement, placement_file = "recorded", args.placement
        log = read_engine_log(
            _recording(args.logs), format=args.input_format, placement=placement_file
        )
        if not log.has_loads:
            raise StragglerError(
                f"{log.summary()}: a placement only. straggler-plan needs recorded loads "
                "(an SGLang recorder dump, vLLM load windows, TensorRT-LLM statistics, or "
                "EPLB maps with their weight)."
            )
        previous = _read_previous(args.previous) if args.previous else None
        _check_against_log(args, log, previous)
        _first_run_notice(notify)
        result = plan(
            log,
            n_gpus=args.gpus,
            n_slots=args.slots,
            n_nodes=args.nodes,
            n_groups=args.groups,
            cost=cost,
            placement=placement,
            distinct=args.distinct,
            holdout=args.holdout,
            max_batches=args.max_batches,
            progress=not args.no_progress,
            seed=args.seed,
            previous=previous,
            max_moves=args.max_moves,
        )
    except (StragglerError, ValueError, OSError) as exc:
        print(f"straggler-plan: error: {exc}", file=sys.stderr)
        return 2
    written = []
    try:
        if args.out:
            written = _write_outputs(result, args.out, args.format or log.engine, args.torch)
        if args.plot:
            plot_heatmap(result, args.plot)
            written.append(args.plot)
    except (StragglerError, ValueError, OSError) as exc:
        print(f"straggler-plan: error: writing the outputs failed: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(
            json.dumps(
                {k: result[k] for k in ("meta", "summary", "layers", "rebalance") if k in result}
                | {"written": written},
                indent=1,
            )
        )
    else:
        print(format_report(result, worst=args.worst, cost_note=cost_note))
        for f in written:
            print(f"wrote {f}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
