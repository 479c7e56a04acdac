"""The routing table with stale loads: 10 and 100 steps old, with and without optimistic updates.

A thin wrapper: ``python benchmarks/staleness_table.py`` is ``python
benchmarks/routing_table.py --stale`` (Azure conversation, G = 8, saturated; rows Random ...
BR-H (oracle); stale = 0 as the reference). Writes ``straggler-results/routing_staleness.json``.
"""

from __future__ import annotations

import pathlib
import runpy
import sys

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "--stale", *sys.argv[1:]]
    runpy.run_path(str(pathlib.Path(__file__).with_name("routing_table.py")), run_name="__main__")
