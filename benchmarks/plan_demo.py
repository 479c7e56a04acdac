"""straggler-plan on recorded dumps: the README's "From your engine's logs" figures.

Writes the test suite's demo recording (``straggler.proofs.engine_strategies.DEMO``: 16
decode passes, 64 experts top-8, 4 MoE layers, 8 GPUs, 80 slots, Zipf skew 0.85) as
SGLang per-pass recorder dumps, vLLM ``EplbState`` files and TensorRT-LLM statistics
under ``DIR``, runs ``straggler-plan`` on each (EPLB placement built on the first 8
passes, scored on the 8 held-out ones, ``dsv3_a_offline`` cost), and then a DeepSeek-V3
sized case (256 experts top-8, 16 MoE layers, EP32 on 4 nodes, 288 slots, 64 tokens per
GPU, 32 iterations as TensorRT-LLM statistics), where the activation floor binds on
every GPU. Prints each report; JSON to ``straggler-results/plan_demo.json``.

Usage::

    python benchmarks/plan_demo.py /tmp/straggler-dumps
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import platform
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.proofs.engine_strategies import write_demo_dumps
from straggler.runtime.commands.plan import main as plan_main
from straggler.runtime.engines import write_trtllm_statistics
from straggler.sim.workloads.batches import sample_counts, zipf_popularity


def run(args: list[str]) -> tuple[int, str, dict]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = plan_main([*args, "--no-progress"])
    out = buf.getvalue()
    report = {}
    if "--out" in args:
        d = args[args.index("--out") + 1]
        report = json.loads(pathlib.Path(d, "report.json").read_text())
    return rc, out, report


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="where to write the dumps and the plans")
    ap.add_argument("--json", default=str(results_dir() / "plan_demo.json"))
    args = ap.parse_args(argv)
    root = pathlib.Path(args.dir)
    dumps = write_demo_dumps(root)
    results = {}
    for engine in ("sglang", "vllm", "trtllm"):
        cmd = [dumps[engine], "--gpus", "8", "--slots", "80", "--holdout", "0.5",
               "--out", str(root / f"plan-{engine}")]  # fmt: skip
        rc, out, report = run(cmd)
        print(f"$ straggler-plan {' '.join(os.path.relpath(c) if os.sep in c else c for c in cmd)}")
        print(out)
        results[engine] = {"command": cmd, "rc": rc, "summary": report.get("summary")}

    gen = np.random.default_rng(0)
    L, E = 16, 256
    pop = zipf_popularity(E, 0.85, n_layers=L, rng=gen)
    counts = np.stack(
        [sample_counts(pop, n_tokens=64 * 32, top_k=8, kappa=2000, rng=gen) for _ in range(32)]
    )
    d = root / "trtllm-dsv3"
    write_trtllm_statistics(d, counts[None], layer_ids=range(3, 3 + L),
                            iter_ids=range(100, 132), top_k=8)  # fmt: skip
    cmd = [str(d), "--gpus", "32", "--nodes", "4", "--slots", "288", "--groups", "8",
           "--holdout", "0.5", "--out", str(root / "plan-dsv3")]  # fmt: skip
    rc, out, report = run(cmd)
    print(f"$ straggler-plan {' '.join(cmd)}")
    print(out)
    results["dsv3_ep32"] = {"command": cmd, "rc": rc, "summary": report.get("summary")}
    path = pathlib.Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(
        {"machine": platform.platform(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
         "results": results}, indent=1,
    ))  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
