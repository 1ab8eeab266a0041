"""Dry runs against the real jobs: the estimated time beside the time the job takes (within 2x?).

Seven jobs: on the digits CNN (scikit-learn's 1,797 images, :mod:`_workloads`) a plane, top
eigenvalues (Lanczos held to its budget by ``tol=0``), a spectral density, a group barrier, a learned
curve and a short FL run; and ten rounds of the FedGuCci MNIST-1D recipe. Each runs first with
``dry_run=True`` (its own cost is the "dry run" column), then for real without a cache; the table
gives the estimate, the actual time and their ratio. Times depend on the machine and its load: run
it twice on a shared machine.

    OMP_NUM_THREADS=1 nice .venv/bin/python benchmarks/bench_dry_run.py
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fl  # noqa: E402
import landscape  # noqa: E402

from _timing import format_table, machine_load  # noqa: E402
from _workloads import digits, small_cnn  # noqa: E402


def jobs(args: argparse.Namespace, folder: Path) -> dict[str, Callable[..., Any]]:
    """Job name -> ``f(dry_run)`` running the job (or its dry run)."""
    x, y = digits()
    data = (x, y)
    models = [small_cnn(seed) for seed in range(4)]

    def evaluator() -> landscape.Evaluator:
        return landscape.Evaluator(models[0], data, batch_size=args.batch_size, progress=False, device=args.device)

    fl_out = folder / "run"
    return {
        f"plane {args.resolution}x{args.resolution}": lambda dry_run: landscape.plane(
            *models[:3], evaluator(), resolution=args.resolution, dry_run=dry_run),
        "top-3 eigenvalues (60 HVPs)": lambda dry_run: landscape.hessian_eigenvalues(
            models[0], evaluator(), k=3, tol=0.0, max_iter=60, dry_run=dry_run),
        "density (40 steps x 2 runs)": lambda dry_run: landscape.hessian_density(
            models[0], evaluator(), iterations=40, runs=2, dry_run=dry_run),
        "group barrier (4 models)": lambda dry_run: landscape.group_barrier(models, evaluator(), dry_run=dry_run),
        "curve (2 epochs, 21 points)": lambda dry_run: landscape.curve(
            models[0], models[1], evaluator(), train_data=data, epochs=2, points=21, dry_run=dry_run),
        "fl.run (10 clients, 3 rounds)": lambda dry_run: fl.run(
            "fedavg", dataset="digits", clients=10, rounds=3, local_epochs=1, out=fl_out,
            device=args.device, progress=False, dry_run=dry_run),
        "fl.run (fedgucci-mnist1d, 10 rounds)": lambda dry_run: fl.run(
            recipe="fedgucci-mnist1d", rounds=10, out=folder / "recipe", save_clients="none", device=args.device,
            progress=False, dry_run=dry_run),
    }


def main() -> None:
    """Print the estimate, the actual time and their ratio for each job."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=21)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--figure", type=Path, default=None,
                        help="also draw the estimates against the actual times (PNG) here")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows, points = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name, job in jobs(args, Path(tmp)).items():
            start = time.perf_counter()
            estimate = job(True)
            dry = time.perf_counter() - start
            start = time.perf_counter()
            job(False)
            actual = time.perf_counter() - start
            points.append((name, actual, estimate.seconds))
            rows.append([name, f"{estimate.seconds:.2f}", f"{actual:.2f}", f"{estimate.seconds / actual:.2f}",
                         f"{dry:.2f}"])
    print(f"dry runs against real jobs on {args.device}; load {machine_load()}; torch threads "
          f"{torch.get_num_threads()}")
    print(format_table(["job", "estimate (s)", "actual (s)", "estimate / actual", "dry run (s)"], rows))
    if args.figure is not None:
        draw(points, args.figure, f"{args.device}, 1-minute load {os.getloadavg()[0]:.1f}, "
                                  f"{torch.get_num_threads()} torch thread(s)")


def draw(points: list[tuple[str, float, float]], path: Path, note: str) -> None:
    """Estimated against actual seconds per job, log-log, with the diagonal and the band of a factor 2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [v for _, a, e in points for v in (a, e)]
    low, high = min(values) / 3, max(values) * 3
    fig, ax = plt.subplots(figsize=(5.2, 4.4), layout="constrained")
    ax.fill_between([low, high], [low / 2, high / 2], [low * 2, high * 2], color="0.9", label="within 2x")
    ax.plot([low, high], [low, high], color="0.4", linewidth=1, label="estimate = actual")
    for i, (name, actual, estimate) in enumerate(points):
        ax.scatter([actual], [estimate], color=f"C{i}", zorder=3, label=name)
    ax.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), xlabel="actual time (s)",
           ylabel="dry run's estimate (s)", title=f"dry runs against the real jobs\n({note})")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper left")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)


if __name__ == "__main__":
    main()
