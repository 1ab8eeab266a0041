"""Adaptive barrier search (``alphas="adaptive"``) against a 201-point grid on MNIST-1D model pairs.

Trains ``--models`` MLPs from different seeds (``bench_alignment.train``), then, for every pair,
computes the loss and accuracy barriers (FedGuCci Eq. 3/4) on the test set with the fixed grid
and with the adaptive search, and prints side by side: the barriers and their differences
(which must be within ``--tol``; the script exits 1 otherwise), the points evaluated and the
median wall time. Run (one core, low priority; about 2 minutes):

    nice -n 5 .venv/bin/python benchmarks/bench_adaptive_barrier.py --figure docs/figures/adaptive_barrier.png

``--figure`` also draws the first pair's paths (both methods, the adaptive search's evaluated
alphas marked under the curves) with :func:`figures.paths.path_figure`.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import torch

import landscape
from fl.datasets import load_dataset
from fl.models import build_model

from _timing import format_table, machine_load, side_by_side
from bench_alignment import train


def draw(grid: landscape.PathResult, adaptive: landscape.PathResult, path: Path) -> None:
    """The two paths of one pair on shared axes, with a tick under the curves at each evaluated alpha."""
    from figures.paths import path_figure

    n = adaptive.search["evaluations"]
    fig = path_figure({f"{len(grid.alphas)}-point grid": grid, f"adaptive, tol={adaptive.search['tol']:g} "
                       f"({n} points)": adaptive},
                      title="Adaptive barrier search vs a fixed grid (MNIST-1D MLPs)", height=3.2)
    for ax in fig.axes[:2]:
        ax.plot(adaptive.alphas, np.zeros_like(adaptive.alphas), "|", color="black", markersize=8,
                transform=ax.get_xaxis_transform(), clip_on=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=4, help="models trained from seeds 0..n-1 (all pairs compared)")
    parser.add_argument("--width", type=int, default=128, help="hidden width of mnist1d_mlp")
    parser.add_argument("--epochs", type=int, default=8, help="training epochs per model")
    parser.add_argument("--tol", type=float, default=5e-3, help="tolerance of the adaptive search (both barriers)")
    parser.add_argument("--grid", type=int, default=201, help="points of the reference grid")
    parser.add_argument("--repeats", type=int, default=2, help="timed calls of each method per pair (median)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--figure", type=Path, help="PNG of the first pair's paths")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(machine_load())
    data = load_dataset("mnist1d")
    start = time.perf_counter()
    models = [train(build_model(f"mnist1d_mlp_w{args.width}", num_classes=10, input_shape=data.input_shape,
                                seed=s), data, seed=s, epochs=args.epochs) for s in range(args.models)]
    trained = time.perf_counter() - start
    ev = landscape.Evaluator(models[0], (data.test_x, data.test_y), device="cpu")
    ends = ev.evaluate(models)
    print(f"{args.models} mnist1d_mlp_w{args.width} models, {args.epochs} epochs each ({trained:.0f} s); test "
          f"accuracy {', '.join(f'{a:.3f}' for a in ends.accuracy)} on {len(data.test_y)} samples; "
          f"tol={args.tol:g}; median of {args.repeats}")
    rows, within, first = [], True, None
    for i, j in itertools.combinations(range(args.models), 2):
        timed = side_by_side({"grid": lambda: landscape.interpolate(models[i], models[j], ev, alphas=args.grid),
                              "adaptive": lambda: landscape.interpolate(models[i], models[j], ev, alphas="adaptive",
                                                                        tol=args.tol)},
                             repeats=args.repeats, warmup=0)
        grid, adaptive = timed["grid"].result, timed["adaptive"].result
        first = first or (grid, adaptive)
        d_loss = abs(adaptive.loss_barrier - grid.loss_barrier)
        d_acc = abs(adaptive.accuracy_barrier - grid.accuracy_barrier)
        within &= d_loss <= args.tol and d_acc <= args.tol
        rows.append([f"{i}-{j}", grid.loss_barrier, adaptive.loss_barrier, f"{d_loss:.1e}", grid.accuracy_barrier,
                     adaptive.accuracy_barrier, f"{d_acc:.1e}", len(grid.alphas), adaptive.search["evaluations"],
                     adaptive.search["rounds"], timed["grid"].median, timed["adaptive"].median,
                     timed["grid"].median / timed["adaptive"].median,
                     f"{adaptive.search['loss_gap']:.1e}/{adaptive.search['accuracy_gap']:.1e}",
                     adaptive.search["stopped"]])
    print(format_table(["pair", "loss B grid", "loss B adapt", "|d loss|", "acc B grid", "acc B adapt", "|d acc|",
                        "evals grid", "evals adapt", "rounds", "s grid", "s adapt", "speed-up", "gap loss/acc",
                        "stopped"], rows))
    total = [sum(r[k] for r in rows) for k in (7, 8, 10, 11)]
    print(f"all pairs: {total[0]} vs {total[1]} points ({total[0] / total[1]:.1f}x fewer), {total[2]:.2f} s vs "
          f"{total[3]:.2f} s ({total[2] / total[3]:.1f}x); every difference within tol: {within}")
    if args.figure is not None and first is not None:
        draw(*first, args.figure)
        print(f"wrote {args.figure}", file=sys.stderr)
    if not within:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
