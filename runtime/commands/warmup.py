"""``straggler-warmup``: compile every Numba kernel once (:func:`straggler.runtime.warmup.warmup`).

Run ``straggler-warmup --help`` for the flags. (The child processes of ``warmup(jobs=N)``
start through an entry of their own, ``straggler.runtime.warmup._child_entry``, not through
this command.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ...formulations._io import OneLineParser, name_list
from ...solvers.dispatch.registry import dispatch_methods
from ...solvers.routing.registry import routing_policies
from ..warmup import MAX_JOBS, warmup

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="straggler-warmup",
        description=(
            "Compile every Numba kernel of straggler (or load it from numba's disk cache) and "
            "report how long it took, so that a serving worker or a benchmark starts warm."
        ),
    )
    p.add_argument("--no-dispatch", action="store_true", help="skip solve_dispatch")
    p.add_argument("--no-routing", action="store_true", help="skip route_batch")
    p.add_argument("--no-simulator", action="store_true", help="skip simulate")
    p.add_argument(
        "--methods", type=name_list, default=None, help="comma-separated dispatch methods"
    )
    p.add_argument(
        "--policies", type=name_list, default=None, help="comma-separated routing policies"
    )
    p.add_argument(
        "--jobs",
        default="1",
        help=f"processes compiling side by side on a cold cache (this one and jobs-1 "
        f"children): an integer >= 1 or 'auto' (the CPU count, at most {MAX_JOBS}); default 1",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _jobs_arg(text: str) -> int:
    """``--jobs``: ``"auto"`` or an integer (its range checked by :func:`main`)."""
    if text == "auto":
        return max(1, min(os.cpu_count() or 1, MAX_JOBS))
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"--jobs must be an integer >= 1 or 'auto'; got {text!r}") from None


def main(argv=None) -> int:
    """Console entry point ``straggler-warmup``; returns the exit status (2 on bad flags)."""
    parser = _parser()
    args = parser.parse_args(argv)
    for flag, names, known in (
        ("--methods", args.methods, dispatch_methods()),
        ("--policies", args.policies, routing_policies()),
    ):
        unknown = [n for n in names or () if n not in known]
        if unknown:
            parser.error(f"{flag} names {unknown[0]!r}; expected names among {sorted(known)}")
    try:
        jobs = _jobs_arg(args.jobs)
        if jobs < 1:
            raise ValueError(f"--jobs must be an integer >= 1 or 'auto'; got {args.jobs!r}")
    except ValueError as exc:
        parser.error(str(exc))
    try:
        rep = warmup(
            dispatch=not args.no_dispatch,
            routing=not args.no_routing,
            simulator=not args.no_simulator,
            methods=args.methods,
            policies=args.policies,
            progress=not args.json,
            jobs=jobs,
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(rep.as_dict(), indent=2) if args.json else rep.table())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
