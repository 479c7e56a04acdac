"""Dispatch at wide EP: solve time and quality per method across EP widths and expert counts.

Layers: decode batches of a Zipf popularity (skew 0.85) for DeepSeek-V3 (256 experts, top-8)
and a 384-expert top-8 model (Kimi-K2's shape), ``--tokens`` tokens per GPU, placed by
DeepSeek's EPLB (no two replicas of an expert on one GPU) from a window of 16 earlier
batches, at EP 8, 16, 32 (4 nodes), 64, 72 (one NVL72 domain), 128 and 256, with about
``1.125x`` slots at EP <= 72 and ``1.5-2x`` beyond (at least one slot per GPU); ``--layers``
layers per cell (``benchmarks/expert_loads.py`` builds them), each under every cost preset
of ``--costs``. The default: one layer per cell under two presets (a few minutes with the
optima cached); ``--full``: three layers per cell.

Methods: ``tempo`` (repair off: the serving path), ``tempo_no_restarts`` (also without
stage 4b, the ruin-and-recreate restarts), ``token_lp`` (HiGHS), and the engines' baselines
``static`` (SGLang's static dispatch), ``metro``, ``llep``, ``lplb``, ``round_robin``; per
layer the proven optimum (``milp`` at zero gap, ``--time-limit`` seconds, warm-started with
tempo; a layer it does not prove is left out of the ratios),
cached as ``benchmarks/tempo_quality.py`` caches it (the committed
``benchmarks/results/tempo_quality_oracle.json`` read, new optima written to ``--cache``).

For each method and cell: the whole ``solve_dispatch`` call's wall time (validation,
scoring and certification included; the methods timed alternately, ``--repeat`` calls each,
the least kept, then the median over the cell's layers), tempo's call over the token LP's
(the median of the per-layer ratios), the makespan over the optimum (mean and max), and the
largest gap ``1 - lower_bound / OPT`` of tempo's certified bound (repair off).
Writes ``wide_ep.json`` (with the command, commit and machine) and ``wide_ep.png`` (both
against the EP width, one panel each; 256 experts solid, 384 dashed) under ``--out``, and
prints the table.

Usage::

    nice -n 10 python benchmarks/wide_ep.py [--full] [--out DIR]
    python benchmarks/wide_ep.py --widths 32,256 --methods tempo,token_lp
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np
from _results import add_out_argument, out_file, results_dir, run_info  # (this folder)
from expert_loads import WIDE_SHAPES, WINDOW, _layer, _slots, routed_batch
from straggler.formulations import CostModel
from straggler.sim.workloads.batches import zipf_popularity
from straggler.solvers import solve_dispatch
from tempo_quality import _key, _oracle, load_oracle

METHODS = ("tempo", "tempo_no_restarts", "token_lp", "static", "metro", "llep", "lplb",
           "round_robin")  # fmt: skip
#: Each label's method and options (tempo without its repair: the serving configuration;
#: ``tempo_no_restarts`` also without its stage-4b restarts).
OPTIONS = {
    "tempo": ("tempo", {"repair_budget_s": 0.0}),
    "tempo_no_restarts": ("tempo", {"repair_budget_s": 0.0, "restarts": False}),
}


def _call(problem, cost, label):
    method, kw = OPTIONS.get(label, (label, {}))
    return solve_dispatch(problem, cost, method=method, **kw)


#: EP widths and their nodes (8 GPUs a node; EP72 is one NVL72 domain).
WIDTHS = {8: 1, 16: 2, 32: 4, 64: 8, 72: 1, 128: 16, 256: 32}


def replication(g: int) -> float:
    """Slots over experts: about one extra slot per GPU at EP <= 72, more beyond."""
    return 1.125 if g <= 72 else (1.5 if g <= 128 else 2.0)


def layers(shape: str, g: int, n: int, tokens: int, seed: int):
    """``n`` decode layers of ``shape`` at EP ``g`` (module notes)."""
    E, k, groups = WIDE_SHAPES[shape]
    for i in range(n):
        rng = np.random.default_rng([seed, g, E, i])
        pop = zipf_popularity(E, 0.85, rng=rng)[0]
        batches = [routed_batch(pop, tokens * g, k, rng) for _ in range(WINDOW + 1)]
        yield _layer(batches, _slots(E, g, replication(g)), g, WIDTHS[g], groups, "eplb")


def _timed(problem, cost, methods, repeat):
    """Each method's result and the least wall time of ``repeat`` whole calls, the methods
    called alternately."""
    best = dict.fromkeys(methods, np.inf)
    res = {}
    for _ in range(repeat):
        for m in methods:
            t0 = time.perf_counter()
            res[m] = _call(problem, cost, m)
            best[m] = min(best[m], time.perf_counter() - t0)
    return res, best


def _plot(cells, methods, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_q) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = dict(zip(methods, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for shape, style in zip(WIDE_SHAPES, ("-", "--")):
        sub = [c for c in cells if c["shape"] == shape]
        xs = [c["g"] for c in sub]
        for m in methods:
            ax_t.plot(xs, [c["methods"][m]["call_us_median"] / 1e3 for c in sub], style,
                      marker="o", ms=3, color=colors[m],
                      label=m if shape == "dsv3" else None)  # fmt: skip
            q = [c["methods"][m]["ratio_mean"] for c in sub]
            ax_q.plot(xs, [np.nan if r is None else r for r in q], style, marker="o",
                      ms=3, color=colors[m])  # fmt: skip
    for ax in (ax_t, ax_q):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(WIDTHS))
        ax.set_xticklabels([str(g) for g in sorted(WIDTHS)], rotation=90)
        ax.set_xlabel("EP width (GPUs)")
        ax.grid(alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("solve_dispatch call (ms, median)")
    ax_q.set_ylabel("makespan / optimum (mean)")
    ax_q.set_yscale("log")
    ax_t.legend(fontsize=7, ncol=2)
    fig.suptitle("Dispatch at wide EP: 256 experts (solid), 384 experts (dashed)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    print(f"wrote {path}")


def _cell(shape, g, methods, costs, n_layers, args, cache, cache_path):
    """One (shape, EP width) cell: every method on each layer and preset (module notes)."""
    per = {m: {"call_s": [], "ratio": []} for m in methods}
    speed = []
    rows = []
    gaps = []
    proved = n = 0
    slots = 0
    for prob in layers(shape, g, n_layers, args.tokens, args.seed):
        slots = int(prob.replicas.sum())
        for cname in costs:
            cost = CostModel.preset(cname)
            for m in methods:  # compile and warm before timing
                _call(prob, cost, m)
            res, best = _timed(prob, cost, methods, args.repeat)
            key = _key(prob, cname)
            if key not in cache:
                cache[key] = _oracle(prob, cost, args.time_limit)
                cache_path.parent.mkdir(parents=True, exist_ok=True)
                cache_path.write_text(json.dumps(cache))
            n += 1
            for m in methods:
                per[m]["call_s"].append(best[m])
            if "tempo" in best and "token_lp" in best:
                speed.append(best["tempo"] / best["token_lp"])
            rows.append(dict(cost=cname, opt=cache[key]["opt"], status=cache[key]["status"],
                             call_us={m: best[m] * 1e6 for m in methods},
                             makespan={m: float(res[m].makespan) for m in methods},
                             lower_bound={m: float(res[m].lower_bound)
                                          for m in methods}))  # fmt: skip
            if cache[key]["status"] == "OPTIMAL":
                proved += 1
                if "tempo" in res:
                    gaps.append(1.0 - float(res["tempo"].lower_bound) / cache[key]["opt"])
                for m in methods:
                    per[m]["ratio"].append(float(res[m].makespan) / cache[key]["opt"])
    cell = dict(shape=shape, E=WIDE_SHAPES[shape][0], g=g, slots=slots, layers=n,
                proved=proved, speed_ratio_median=float(np.median(speed)) if speed else None,
                bound_gap_max=max(gaps, default=None), methods={}, rows=rows)  # fmt: skip
    for m in methods:
        r = per[m]["ratio"]
        cell["methods"][m] = dict(
            call_us_median=float(np.median(per[m]["call_s"]) * 1e6),
            call_us_max=float(np.max(per[m]["call_s"]) * 1e6),
            ratio_mean=float(np.mean(r)) if r else None,
            ratio_max=float(np.max(r)) if r else None,
        )
    return cell


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    ap.add_argument("--shapes", default=",".join(WIDE_SHAPES))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--costs", default="dsv3_a_offline,dsv3_b_tile")
    ap.add_argument("--full", action="store_true", help="three layers per cell")
    ap.add_argument("--layers", type=int, default=None, help="layers per cell (default 1)")
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens per GPU")
    ap.add_argument("--repeat", type=int, default=3, help="timed calls per method and layer")
    ap.add_argument("--time-limit", type=float, default=60.0, help="MILP seconds per layer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--cache",
        default=None,
        help="oracle cache to write (default tempo_quality_oracle.json in the results folder)",
    )
    add_out_argument(ap, "wide_ep.json and wide_ep.png")
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    costs = [c for c in args.costs.split(",") if c]
    widths = [int(g) for g in args.widths.split(",") if g]
    unknown = sorted(set(widths) - set(WIDTHS))
    if unknown:
        ap.error(f"--widths: each of {sorted(WIDTHS)}; got {unknown}")
    n_layers = args.layers or (3 if args.full else 1)
    cache_path = pathlib.Path(args.cache or results_dir() / "tempo_quality_oracle.json")
    cache = load_oracle(cache_path)
    t_start = time.time()
    cells = []
    head = f"{'shape':>7} {'EP':>4} {'slots':>5} {'tempo/LP':>8} {'LB gap':>7} " + " ".join(
        f"{m:>16}" for m in methods
    )
    print(
        "tempo/LP: median of tempo's call over the token LP's; LB gap: largest 1 - tempo's "
        "certified bound / OPT; per method: median call ms / mean makespan over the optimum"
    )
    print(head)
    for shape in [s for s in args.shapes.split(",") if s]:
        for g in widths:
            cell = _cell(shape, g, methods, costs, n_layers, args, cache, cache_path)
            cells.append(cell)
            sr, gap = cell["speed_ratio_median"], cell["bound_gap_max"]
            print(f"{shape:>7} {g:4d} {cell['slots']:5d} "
                  f"{'-' if sr is None else f'{sr:.4f}':>8} "
                  f"{'-' if gap is None else f'{gap:.2%}':>7} " + " ".join(
                f"{cell['methods'][m]['call_us_median'] / 1e3:8.3f}/"
                f"{cell['methods'][m]['ratio_mean'] or float('nan'):7.4f}" for m in methods
            ), flush=True)  # fmt: skip
    json_path = out_file(args.out, "wide_ep.json")
    json_path.write_text(json.dumps(dict(run=run_info(), args=vars(args), layers=n_layers,
                                         wall_s=time.time() - t_start, cells=cells),
                                    indent=1))  # fmt: skip
    print(f"wrote {json_path}")
    try:
        import matplotlib  # noqa: F401 - optional dependency
    except ImportError:
        print("matplotlib is not installed: no plot")
    else:
        _plot(cells, methods, out_file(args.out, "wide_ep.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
