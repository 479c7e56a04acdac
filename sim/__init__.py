"""Workloads, trace loaders, the lock-step decode simulator and experiments."""

from .engine.config import SimConfig
from .engine.deployment import MODEL_PRESETS, DeploymentConfig, ModelPreset, StepModel
from .engine.simulator import (
    ADMISSION_MODES,
    DEFAULT_PREFILL,
    DEFAULT_STEP_TIME,
    PREDICTORS,
    SimReport,
    bootstrap_rooms,
    decode_capacity,
    engine_inputs,
    offered_load,
    prefill_capacity,
    simulate,
)
from .experiments.levers import LeversTable, levers
from .experiments.phase_diagram import PhaseDiagram, phase_diagram
from .experiments.rebalance import RebalanceFrontier, rebalance_frontier, tempo_makespan
from .experiments.sweep import SweepTable, sweep
from .workloads.batches import (
    SHAPES,
    SKEWS,
    eplb_placement,
    make_decode_problem,
    sample_counts,
    zipf_popularity,
)
from .workloads.drift import drifting_windows
from .workloads.prefix import PrefixBlocks, load_prefix_blocks
from .workloads.traces import (
    WORKLOAD_PRESETS,
    LengthModel,
    Trace,
    fit_length_model,
    generate_arrivals,
    generate_trace,
    load_trace,
    saturate_trace,
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
    "ADMISSION_MODES",
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
