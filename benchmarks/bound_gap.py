"""The certified bound against the proven optimum, with and without B9, and B9's own cost.

For every layer of the chosen families of ``benchmarks/tempo_quality.py`` whose MILP optimum
is cached as proved (``benchmarks/results/tempo_quality_oracle.json``; no MILP runs here),
``solve_dispatch(..., method="tempo", repair_budget_s=0)`` gives the makespan ``M`` and the
bound (B1-B9); B1-B8 alone is B1-B7 (``layer_bound``) raised by B8 tried at ``M``
(``forced_bound_kernel``, as tempo tries it at the makespan reached). Where B1-B8 leave ``M``
unproved (above ``B * (1 + OPTIMALITY_RTOL)``), B9 runs: its call
(``counting_bound_kernel`` at ``(B1-B8, M)``) is timed, the least of ``--repeat`` calls.
Prints per family the layers whose bound is more than 0.5% below the optimum, the largest
gap, each with B1-B8 and with B1-B9, and the layers above 0.5% with B9; writes
``bound_gap.json``.

Command (the 12 families of docs/performance/dispatch_wide_ep.md, about 3 minutes)::

    python benchmarks/bound_gap.py --families small,decode,wide,prefill,heldout,decode16,\\
heldout16,heldout16b,real,real_heldout,wide_ep,wide_ep_heldout
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import tempo_quality as tq  # (this folder)
from _results import add_out_argument, out_file, run_info  # (this folder)
from straggler.formulations import CostModel
from straggler.solvers import semi_matching, solve_dispatch, solve_token_lp
from straggler.solvers.dispatch._bounds import FORCED_STEPS, forced_bound_kernel
from straggler.solvers.dispatch._counting import COUNTING_STEPS, counting_bound_kernel
from straggler.solvers.dispatch.bounds import layer_bound
from straggler.solvers.dispatch.method import OPTIMALITY_RTOL

FAMILIES = "small,decode,heldout,decode16,heldout16,heldout16b"


def _layer(prob, cname, opt, repeat):
    cost = CostModel.preset(cname)
    c = cost.as_array()
    counts = np.ascontiguousarray(prob.counts, dtype=np.int64)
    R = np.ascontiguousarray(prob.replicas)
    res = solve_dispatch(prob, cost, method="tempo", repair_budget_s=0.0)
    m = float(res.makespan)
    sm = semi_matching(R, counts > 0)[1]
    b7 = layer_bound(counts, R, cost, c, sm, solve_token_lp(prob)[1])
    b8 = float(forced_bound_kernel(counts, R, c, b7, m, FORCED_STEPS)) if m > b7 else b7
    ran = bool(m > b8 * (1 + OPTIMALITY_RTOL) + 1e-12)
    row = dict(opt=opt, makespan=m, bound_b1_b8=b8, bound=float(res.lower_bound),
               status=res.status.name, b9_ran=ran)  # fmt: skip
    if row["b9_ran"]:
        counting_bound_kernel(counts, R, c, b8, m, COUNTING_STEPS)  # (compiled before timing)
        best = np.inf
        for _ in range(repeat):
            t0 = time.perf_counter()
            counting_bound_kernel(counts, R, c, b8, m, COUNTING_STEPS)
            best = min(best, time.perf_counter() - t0)
        row["b9_us"] = best * 1e6
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=FAMILIES)
    ap.add_argument("--repeat", type=int, default=5, help="timed calls of B9 per layer")
    add_out_argument(ap, "bound_gap.json")
    args = ap.parse_args(argv)
    cache = tq.load_oracle()
    rows = []
    print(f"{'family':>16} {'proved':>6} {'>0.5% B1-B8':>11} {'max':>7} {'>0.5% B1-B9':>11} "
          f"{'max':>7} {'B9 ran':>6} {'B9 us med':>9} {'B9 us max':>9}")  # fmt: skip
    for fam in args.families.split(","):
        fam_rows = []
        for params, prob, cname in tq.instances(fam, False, 1):
            o = cache.get(tq._key(prob, cname))
            if o is None or o["status"] != "OPTIMAL" or not o["opt"] > 0:
                continue
            row = dict(
                family=fam, cost=cname, **params, **_layer(prob, cname, o["opt"], args.repeat)
            )
            fam_rows.append(row)
        gap8 = [(r["opt"] - r["bound_b1_b8"]) / r["opt"] for r in fam_rows]
        gap9 = [(r["opt"] - r["bound"]) / r["opt"] for r in fam_rows]
        t9 = [r["b9_us"] for r in fam_rows if r["b9_ran"]]
        print(f"{fam:>16} {len(fam_rows):6d} {sum(g > 0.005 for g in gap8):11d} "
              f"{100 * max(gap8, default=0):6.2f}% {sum(g > 0.005 for g in gap9):11d} "
              f"{100 * max(gap9, default=0):6.2f}% {len(t9):6d} "
              f"{np.median(t9) if t9 else float('nan'):9.1f} {max(t9, default=float('nan')):9.1f}",
              flush=True)  # fmt: skip
        rows += fam_rows
    t9 = [r["b9_us"] for r in rows if r["b9_ran"]]
    if t9:
        print(f"B9 ran on {len(t9)} of {len(rows)} layers: median {np.median(t9):.1f} us, "
              f"max {max(t9):.1f} us a call")  # fmt: skip
    print("layers with the bound (B1-B9) more than 0.5% below the optimum:")
    for r in rows:
        if (r["opt"] - r["bound"]) / r["opt"] > 0.005:
            print(f"  {r['family']} {r['i']} {r['cost']}: OPT {r['opt']:.6g}, "
                  f"bound {r['bound']:.6g} (B1-B8 {r['bound_b1_b8']:.6g}), "
                  f"tempo {r['makespan']:.6g}")  # fmt: skip
    path = out_file(args.out, "bound_gap.json")
    path.write_text(json.dumps(dict(run=run_info(), args=vars(args), rows=rows)))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
