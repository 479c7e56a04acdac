"""TEMPO's phase diagram (§3.2, Fig. 6) and scale extrapolation (§3.3, Fig. 12), measured.

Parts (each a :func:`straggler.sim.experiments.phase_diagram.phase_diagram` sweep, resumable):

* ``dsv3``: DeepSeek-V3 shape (256 experts top-8, 8 groups), EP8, cost ``dsv3_a_offline``
  (Table 6), the §3.2 grid (B 16..2048, s 0..1.5, 1.25x and 1.5x); M = the exact activation
  balancer (optimal semi-matching).
* ``dsv3_greedy``: the same with M = METRO's deployed greedy (``activation="metro"``).
* ``qwen3``: Qwen3-30B shape (128 experts top-8), EP8, cost ``qwen3_30b_a_offline``.
* ``scale``: DSv3, 1.25x, s in {0, 1.2}, EP 8/16/32/64, compute-only vs comm-aware
  (:func:`~straggler.sim.experiments.phase_diagram.comm_aware`, k_r = 0.0037 us/token).

Goals checked and printed: B* inside the observed flip band (12/12 columns), tempo's gain
over the best fixed policy >= -0.3% everywhere and its maximum (paper: 8.5% DSv3, 10.2%
Qwen3), the mispricing asymmetry (METRO deep in compute vs token-LP in the memory regime).

Usage::

    python benchmarks/phase_diagram.py --quick          # a small grid, ~2 min
    python benchmarks/phase_diagram.py                  # everything (tens of minutes)
    python benchmarks/phase_diagram.py --parts dsv3,qwen3 --backend ray
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import tempfile
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.formulations import CostModel
from straggler.sim.experiments.phase_diagram import BATCH_SIZES, K_R, comm_aware, phase_diagram

RESULTS = results_dir()
PARTS = ("dsv3", "dsv3_greedy", "qwen3", "scale")
PAPER = {"dsv3": 0.085, "qwen3": 0.102}


def _diagram_json(pd) -> dict:
    return {
        "shape": pd.shape,
        "n_gpus": pd.n_gpus,
        "policies": list(pd.policies),
        "batch_sizes": list(pd.batch_sizes),
        "skews": list(pd.skews),
        "replications": list(pd.replications),
        "cost": {k: v for k, v in vars(pd.cost).items() if v is not None},
        "winner": pd.winner.tolist(),
        "letters": pd.letters().tolist(),
        "gain": pd.gain.round(6).tolist(),
        "makespan_us": {m: v.round(4).tolist() for m, v in pd.makespan.items()},
        "worst_cell_ratio": pd.worst_ratio.round(6).tolist(),
        "b_star": pd.b_star.round(3).tolist(),
        "b_star_loaded": pd.b_star_loaded.round(3).tolist(),
        "b_star_loaded_inside": pd.b_star_loaded_inside.tolist(),
        "band": np.where(np.isfinite(pd.band), pd.band, -1).tolist(),
        "b_star_inside": pd.b_star_inside.tolist(),
        "summary": pd.summary(),
    }


def _print_diagram(name, pd) -> None:
    s = pd.summary()
    for k, r in enumerate(pd.replications):
        print(f"\n== {name}: {pd.shape} EP{pd.n_gpus}, {r:g}x replication, M = {pd.policies[0]}")
        print("   cells: winner letter and tempo's gain over it")
        print(pd.format_table(k))
    print(
        f"-- {name}: B* inside band {s['b_star_inside']}/{s['columns']} (loaded-hot variant "
        f"{s['b_star_loaded_inside']}/{s['columns']}); tempo gain min "
        f"{100 * s['gain_min']:+.2f}% at {s['gain_min_at']}, max {100 * s['gain_max']:+.2f}% "
        f"at {s['gain_max_at']}; M worst {s['activation_worst']:.3f}x at "
        f"{s['activation_worst_at']}, L worst {s['token_lp_worst']:.3f}x at "
        f"{s['token_lp_worst_at']}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small grid, few batches")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {PARTS}")
    ap.add_argument("--batches", type=int, default=6, help="batches per cell")
    ap.add_argument("--layers", type=int, default=2, help="layers (placements) per batch")
    ap.add_argument("--backend", default="process", choices=("serial", "process", "ray"))
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--work", default=None, help="folder of the resumable sweep journals")
    ap.add_argument("--out", default=str(RESULTS / "phase_diagram.json"))
    ap.add_argument("--png", default=str(RESULTS / "phase_diagram.png"))
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    work = pathlib.Path(args.work or tempfile.mkdtemp(prefix="phase_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.quick:
        grid = dict(batch_sizes=(16, 128, 512, 2048), skews=(0.0, 1.2), replications=(1.25,))
        n_batches, n_layers = 2, 1
    else:
        grid = {}
        n_batches, n_layers = args.batches, args.layers
    common = dict(
        n_batches=n_batches,
        n_layers=n_layers,
        backend=args.backend,
        workers=args.workers,
    )
    tag = "quick" if args.quick else "full"
    out = {
        "benchmark": "phase_diagram",
        "machine": platform.platform(),
        "note": "shared 2-core machine; timings are wall clock of the whole sweep",
        "quick": args.quick,
        "n_batches": n_batches,
        "n_layers": n_layers,
        "parts": {},
    }
    figs = {}
    specs = {
        "dsv3": dict(shape="dsv3"),
        "dsv3_greedy": dict(shape="dsv3", activation="metro"),
        "qwen3": dict(shape="qwen3_30b"),
    }
    for name in parts:
        if name not in specs:
            continue
        t0 = time.perf_counter()
        pd = phase_diagram(
            n_gpus=8, **specs[name], **grid, **common, path=work / f"{name}_{tag}.csv"
        )
        res = _diagram_json(pd)
        res["wall_s"] = time.perf_counter() - t0
        if name in PAPER:
            res["paper_gain_max"] = PAPER[name]
        out["parts"][name] = res
        _print_diagram(name, pd)
        figs[name] = pd
    if "scale" in parts:
        out["parts"]["scale"] = _scale(args, work, tag, common)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out}")
    if figs:
        _png(figs, out["parts"].get("scale"), args.png)
        print(f"wrote {args.png}")
    return 0


def _scale(args, work, tag, common) -> dict:
    """Fig. 12: mean tempo gain over the best fixed policy across the B ladder, per EP."""
    eps = (8, 16) if args.quick else (8, 16, 32, 64)
    skews = (0.0, 1.2)
    Bs = (16, 128, 512, 2048) if args.quick else BATCH_SIZES
    base = CostModel.preset("dsv3_a_offline")
    models = {"compute_only": base, "comm_aware": comm_aware(base, K_R)}
    rows = []
    t0 = time.perf_counter()
    print("\n== scale extrapolation (Fig. 12): DSv3, 1.25x, mean / max tempo gain over B ladder")
    print(f"{'EP':>4} {'s':>4} {'model':>13} {'mean gain':>10} {'max gain':>9}  winners")
    for n_gpus in eps:
        for label, cost in models.items():
            pd = phase_diagram(
                "dsv3",
                n_gpus,
                batch_sizes=Bs,
                skews=skews,
                replications=(1.25,),
                cost=cost,
                **{**common, "n_batches": max(1, common["n_batches"] // 2), "n_layers": 1},
                path=work / f"scale_{n_gpus}_{label}_{tag}.csv",
                progress=True,
            )
            for j, s in enumerate(skews):
                g = pd.gain[:, j, 0]
                row = {
                    "n_gpus": n_gpus,
                    "skew": s,
                    "model": label,
                    "batch_sizes": list(Bs),
                    "gain": g.round(6).tolist(),
                    "mean_gain": float(g.mean()),
                    "max_gain": float(g.max()),
                    "letters": pd.letters()[:, j, 0].tolist(),
                    "b_star": float(pd.b_star[j, 0]),
                }
                rows.append(row)
                print(
                    f"{n_gpus:>4} {s:>4g} {label:>13} {100 * row['mean_gain']:>9.2f}% "
                    f"{100 * row['max_gain']:>8.2f}%  {''.join(row['letters'])}"
                )
    return {"k_r": K_R, "rows": rows, "wall_s": time.perf_counter() - t0}


def _png(figs, scale, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(figs) + (1 if scale else 0)
    fig = plt.figure(figsize=(9, 4.3 * n))
    sub = fig.subfigures(n, 1, squeeze=False)[:, 0]
    for sf, (name, pd) in zip(sub, figs.items()):
        axes = sf.subplots(1, len(pd.replications), squeeze=False)[0]
        pd.plot(axes=axes)
        sf.suptitle(f"{name}: letters = winning fixed policy, numbers = tempo gain (%)")
    if scale:
        ax = sub[-1].subplots()
        for s in sorted({r["skew"] for r in scale["rows"]}):
            for label, style in (("compute_only", "-o"), ("comm_aware", "--x")):
                pts = [(r["n_gpus"], r["mean_gain"]) for r in scale["rows"]
                       if r["skew"] == s and r["model"] == label]  # fmt: skip
                x, y = zip(*pts)
                ax.plot(x, 100 * np.array(y), style, label=f"s={s:g}, {label}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("EP degree")
        ax.set_ylabel("mean tempo gain over best fixed (%)")
        ax.set_title("Scale extrapolation (Fig. 12): DSv3, 1.25x")
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
