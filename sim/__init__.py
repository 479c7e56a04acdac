"""Workloads, trace loaders, the lock-step decode simulator and experiments."""

from .workload import (
    SHAPES,
    SKEWS,
    eplb_placement,
    make_decode_problem,
    sample_counts,
    zipf_popularity,
)

__all__: list[str] = [
    "SHAPES",
    "SKEWS",
    "eplb_placement",
    "make_decode_problem",
    "sample_counts",
    "zipf_popularity",
]
