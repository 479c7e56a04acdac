"""Workloads, trace loaders, the lock-step decode simulator and experiments."""

from .config import SimConfig
from .deployment import MODEL_PRESETS, DeploymentConfig, ModelPreset, StepModel
from .drift import drifting_windows
from .levers import LeversTable, levers
from .phase_diagram import PhaseDiagram, phase_diagram
from .prefix import PrefixBlocks, load_prefix_blocks
from .rebalance import RebalanceFrontier, rebalance_frontier, tempo_makespan
from .simulator import (
    DEFAULT_PREFILL,
    DEFAULT_STEP_TIME,
    DISPATCH_MODES,
    PREDICTORS,
    SimReport,
    bootstrap_rooms,
    decode_capacity,
    engine_inputs,
    offered_load,
    prefill_capacity,
    simulate,
)
from .sweep import SweepTable, sweep
from .traces import (
    WORKLOAD_PRESETS,
    LengthModel,
    Trace,
    fit_length_model,
    generate_arrivals,
    generate_trace,
    load_trace,
    saturate_trace,
)
from .warmup import WarmupReport, warmup
from .workload import (
    SHAPES,
    SKEWS,
    eplb_placement,
    make_decode_problem,
    sample_counts,
    zipf_popularity,
)

__all__: list[str] = [
    "SimConfig",
    "engine_inputs",
    "SHAPES",
    "SKEWS",
    "eplb_placement",
    "make_decode_problem",
    "sample_counts",
    "zipf_popularity",
    "drifting_windows",
    "rebalance_frontier",
    "RebalanceFrontier",
    "tempo_makespan",
    "simulate",
    "SimReport",
    "DEFAULT_STEP_TIME",
    "DEFAULT_PREFILL",
    "decode_capacity",
    "prefill_capacity",
    "offered_load",
    "PREDICTORS",
    "DISPATCH_MODES",
    "bootstrap_rooms",
    "PrefixBlocks",
    "load_prefix_blocks",
    "Trace",
    "LengthModel",
    "WORKLOAD_PRESETS",
    "load_trace",
    "generate_trace",
    "generate_arrivals",
    "fit_length_model",
    "saturate_trace",
    "warmup",
    "WarmupReport",
    "sweep",
    "SweepTable",
    "phase_diagram",
    "PhaseDiagram",
    "DeploymentConfig",
    "ModelPreset",
    "MODEL_PRESETS",
    "StepModel",
    "levers",
    "LeversTable",
]
