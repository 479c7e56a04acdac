"""Search for counterexamples to TEMPO's restricted-replication conjecture.

Conjecture (TEMPO Appendix A.4, Remark): under restricted replicas the "fewest-experts
replica, token tie-break" variant A3' of round robin satisfies ``M(A3') <= OPT + delta``,
``delta`` the additive term of Theorem 2. Every instance is scored against the exact
optimum (MILP at ``mip_rel_gap = 0``). Searches:

* hypothesis, steered by ``target(M(A3') - OPT - delta)``, on arbitrary and on
  slot-balanced (EPLB-like) replica masks, then asked to falsify (it shrinks what it finds);
* seeded random search on the same two families;
* controls under full replication: A3 (Theorem 2, must never be violated) and A3'.

Writes ``straggler-results/conjecture_search.json`` and prints a table.

Usage: ``python benchmarks/conjecture_search.py [--examples 1000] [--random 2000] [--seed 0]``
"""

from __future__ import annotations

import argparse
import json
import time

from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.proofs.conjecture import (
    COUNTEREXAMPLE,
    check_conjecture,
    random_search,
    targeted_search,
)

OUT = results_dir() / "conjecture_search.json"


def _instance(entry):
    if entry is None:
        return None
    chk, p, cost = entry
    return {
        "counts": p.counts.tolist(),
        "replicas": p.replicas.astype(int).tolist(),
        "cost": {k: getattr(cost, k) for k in ("a", "b", "b2", "tile", "c", "beta", "c2", "gamma")},
        "makespan": chk.makespan,
        "opt": chk.opt,
        "delta": chk.term,
        "excess": chk.excess,
        "ratio": chk.ratio,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=1000, help="hypothesis examples per search")
    ap.add_argument("--random", type=int, default=2000, help="random instances per family")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    runs = []
    searches = [
        ("hypothesis", "restricted, arbitrary masks", "fewest", dict(slot_balanced=False)),
        ("hypothesis", "restricted, slot-balanced", "fewest", dict(slot_balanced=True)),
        ("hypothesis", "full replication (Theorem 2)", "a3", dict(full=True)),
        ("hypothesis", "full replication, variant", "fewest", dict(full=True)),
    ]
    for kind, family, rule, kw in searches:
        t0 = time.perf_counter()
        r = targeted_search(args.examples, seed=args.seed, rule=rule, max_experts=10, **kw)
        runs.append(
            dict(
                search=kind,
                family=family,
                rule=rule,
                n=r["examples"],
                violations=r["violations"],
                unproved=r["unproved"],
                max_excess=r["max_excess"],
                worst=_instance(r["worst"]),
                counterexample=_instance(r["counterexample"]),
                seconds=time.perf_counter() - t0,
            )
        )
    for family, rule, kw in [
        ("restricted, arbitrary masks", "fewest", dict(balanced_slots=False)),
        ("restricted, slot-balanced", "fewest", dict(balanced_slots=True)),
        ("full replication (Theorem 2)", "a3", dict(full=True)),
        ("full replication, variant", "fewest", dict(full=True)),
    ]:
        t0 = time.perf_counter()
        r = random_search(args.random, seed=args.seed, rule=rule, **kw)
        runs.append(
            dict(
                search="random",
                family=family,
                rule=rule,
                n=r["n"],
                violations=r["violations"],
                unproved=r["unproved"],
                max_excess=r["max_excess"],
                worst=_instance(r["worst"]),
                counterexample=_instance(r["first_counterexample"]),
                seconds=time.perf_counter() - t0,
            )
        )
    hand = check_conjecture(**COUNTEREXAMPLE)
    report = {
        "conjecture": "M(A3') <= OPT + delta under restricted replicas",
        "args": vars(args),
        "runs": runs,
        "hand_built_counterexample": _instance(
            (hand, COUNTEREXAMPLE["problem"], COUNTEREXAMPLE["cost"])
        ),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=1))

    print(
        f"{'search':<11}{'family':<31}{'rule':<8}{'n':>6}{'viol.':>7}{'unpr.':>7}"
        f"{'worst ratio':>13}{'max excess':>12}{'s':>7}"
    )
    for r in runs:
        w = r["worst"]["ratio"] if r["worst"] else float("nan")
        x = r["max_excess"]
        print(
            f"{r['search']:<11}{r['family']:<31}{r['rule']:<8}{r['n']:>6}"
            f"{r['violations']:>7}{r['unproved']:>7}{w:>13.4f}{x:>12.3f}{r['seconds']:>7.1f}"
        )
    for r in runs:
        if r["counterexample"]:
            print(f"\ncounterexample ({r['search']}, {r['family']}):")
            print(json.dumps(r["counterexample"]))
    print(f"\nwrote {OUT}")
    return report


if __name__ == "__main__":
    main()
