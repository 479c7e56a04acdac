"""Calibration recovery: fit_cost_model on synthetic logs of known models, over seeds.

For each true model and noise level, ``--seeds`` logs are drawn on TEMPO App. B's grid
(G in {1, 2, 4, 8, 12, 16, 24, 32, 40} x tokens per expert 1..4096 on a log2 ladder: 117
samples; tile counts ``T = G * ceil(n / 128)`` for the tile model), each time multiplied
by lognormal noise (sigma 3% and 8%, the range of Table 6's fit errors), and fitted by
``fit_cost_model`` (2 or 3 pieces, 200 bootstrap replicates, 95% percentile intervals).

Reported per parameter: the true value, the mean and standard deviation of the fits over
seeds, the **coverage** (share of seeds whose interval contains the truth; 0.95 is the
target) and the mean interval width. Held out: every fit is also scored against the true
model on 300 (G, tokens per expert) points drawn off the grid (G uniform in 1..40, tokens
per expert log-uniform in 1..4096), the relative RMS error of the fitted model there.

Models: ``h20`` (ANCHORS.md's H20 fit, a=19, b=7.1, c=40, beta=0.178), ``dsv3_offline``
(Table 6, a = c = 0: intercepts on the boundary of the non-negative fit), ``qwen3_tile``
(Table 7's Qwen3-235B tile fit without its traffic pair), ``three_piece`` (a 3-term model
whose two token lines cross at N = 312 inside the grid). The shipped serving 3-term
preset (``dsv2_lite_a_serving``) is left out on purpose: its compute line (c = 15.6,
beta = 0.0179) lies below its traffic line (c2 = 25, gamma = 0.10) at every N, so no
timing log can identify it.

Usage::

    python benchmarks/calibration_recovery.py            # 20 seeds (a few minutes)
    python benchmarks/calibration_recovery.py --seeds 4  # quick
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time

import numpy as np
from _results import results_dir  # benchmarks/_results.py (the scripts' folder)
from straggler.formulations import CostModel
from straggler.solvers import fit_cost_model

G_GRID = np.array([1, 2, 4, 8, 12, 16, 24, 32, 40])
TPE = 2 ** np.arange(13)

MODELS = {
    "h20": (CostModel(a=19.0, b=7.1, c=40.0, beta=0.178), 2, False),
    "dsv3_offline": (CostModel.preset("dsv3_a_offline"), 2, False),
    "qwen3_tile": (CostModel.preset("qwen3_235b_b_tile").replace(c2=None, gamma=None), 2, True),
    "three_piece": (CostModel(a=16.4, b=2.99, c=30.0, beta=0.02, c2=5.0, gamma=0.10), 3, False),
}


def grid(tiles: bool):
    G = np.repeat(G_GRID, TPE.size).astype(float)
    per = np.tile(TPE, G_GRID.size).astype(float)
    return G, G * per, (G * np.ceil(per / 128) if tiles else None)


def held_out(gen, tiles: bool, n=300):
    G = gen.integers(1, 41, n).astype(float)
    per = np.round(np.exp(gen.uniform(0, np.log(4096), n)))
    return G, G * per, (G * np.ceil(per / 128) if tiles else None)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--noise", type=float, nargs="+", default=[0.03, 0.08])
    ap.add_argument(
        "--out",
        default=str(results_dir() / "calibration_recovery.json"),
    )
    args = ap.parse_args(argv)
    rows = []
    t_start = time.perf_counter()
    head = (f"{'model':>13} {'noise':>5} {'param':>5} {'true':>9} {'fit mean':>9} {'fit sd':>8} "
            f"{'coverage':>8} {'width':>9}")  # fmt: skip
    print(head)
    for name, (true, pieces, tiles) in MODELS.items():
        G, N, T = grid(tiles)
        for noise in args.noise:
            fits, covered, widths, held, rms, secs = [], [], [], [], [], []
            for seed in range(args.seeds):
                gen = np.random.default_rng(1000 * seed + int(1000 * noise))
                t = true.time(G, N, T) * np.exp(gen.normal(0, noise, G.size))
                t0 = time.perf_counter()
                fit = fit_cost_model(
                    G, N, t, T=T, pieces=pieces, bootstrap=args.bootstrap, rng=seed
                )
                secs.append(time.perf_counter() - t0)
                names = list(fit.params)
                fits.append([fit.params[k] for k in names])
                covered.append(
                    [fit.intervals[k][0] <= getattr(true, k) <= fit.intervals[k][1] for k in names]
                )
                widths.append([fit.intervals[k][1] - fit.intervals[k][0] for k in names])
                Gh, Nh, Th = held_out(gen, tiles)
                ref = true.time(Gh, Nh, Th)
                held.append(float(np.sqrt(np.mean(((fit.cost.time(Gh, Nh, Th) - ref) / ref) ** 2))))
                rms.append(fit.rel_rms)
            fits, covered, widths = np.array(fits), np.array(covered), np.array(widths)
            params = {}
            for j, k in enumerate(names):
                params[k] = dict(
                    true=float(getattr(true, k)),
                    fit_mean=float(fits[:, j].mean()),
                    fit_sd=float(fits[:, j].std(ddof=1)) if args.seeds > 1 else 0.0,
                    coverage=float(covered[:, j].mean()),
                    width_mean=float(widths[:, j].mean()),
                )
                p = params[k]
                print(f"{name:>13} {noise:5.2f} {k:>5} {p['true']:9.4f} {p['fit_mean']:9.4f} "
                      f"{p['fit_sd']:8.4f} {p['coverage']:8.2f} "
                      f"{p['width_mean']:9.4f}")  # fmt: skip
            row = dict(
                model=name,
                noise=noise,
                pieces=pieces,
                tiles=tiles,
                n_samples=int(G.size),
                seeds=args.seeds,
                params=params,
                coverage_all=float(covered.mean()),
                rel_rms_fit_mean=float(np.mean(rms)),
                rel_rms_held_out_mean=float(np.mean(held)),
                rel_rms_held_out_max=float(np.max(held)),
                fit_seconds_median=float(np.median(secs)),
            )
            rows.append(row)
            print(f"{name:>13} {noise:5.2f}  all: coverage {row['coverage_all']:.2f}, fit error "
                  f"{100 * row['rel_rms_fit_mean']:.2f}%, held-out error vs truth "
                  f"{100 * row['rel_rms_held_out_mean']:.2f}% (max "
                  f"{100 * row['rel_rms_held_out_max']:.2f}%), "
                  f"{row['fit_seconds_median']:.2f} s per fit incl. bootstrap")  # fmt: skip
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            dict(
                args=vars(args),
                machine=platform.platform(),
                date=time.strftime("%Y-%m-%d %H:%M:%S"),
                wall_s=time.perf_counter() - t_start,
                rows=rows,
            ),
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
