"""Test accuracy of every FL algorithm with the engine's DEFAULT settings.

    python benchmarks/default_accuracy.py                 # all algorithms, seed 0
    python benchmarks/default_accuracy.py --seeds 0 1 2 --algorithms fedavg lss

For each algorithm it runs, with no option other than the ones below,
``fl.run(algo, dataset="digits", clients=5, rounds=R, partition="dirichlet", alpha=0.5, seed=s)``
for R = 4 and R = 20 (two separate runs: FLOCO's tau and IMA's start round depend on R) and
prints a table: final test accuracy after 4 and after 20 rounds, and the seconds both runs took.
Targets: >= 0.6 after 4 rounds and >= 0.85 after 20 rounds for every algorithm.
``--set key=value`` (JSON value) overrides an engine option for every run, to measure candidates.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

import fl

ALGORITHMS = ("fedavg", "fedprox", "fedgucci", "fedgucci+", "floco", "floco+", "lss", "ima")


def final_accuracy(algorithm: str, rounds: int, seed: int, out: Path, overrides: dict) -> float:
    """Test accuracy of the global model after ``rounds`` rounds of a default run."""
    run = fl.run(algorithm, dataset="digits", clients=5, rounds=rounds, partition="dirichlet", alpha=0.5,
                 seed=seed, out=out, progress=False, save_clients="none", **overrides)
    return float(run.metrics[-1]["test_accuracy"])


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=JSON")
    args = parser.parse_args()
    overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.algorithms:
            acc4, acc20 = [], []
            start = time.perf_counter()
            for seed in args.seeds:
                acc4.append(final_accuracy(name, 4, seed, Path(tmp) / f"{name}-4-{seed}", overrides))
                acc20.append(final_accuracy(name, 20, seed, Path(tmp) / f"{name}-20-{seed}", overrides))
            seconds = (time.perf_counter() - start) / len(args.seeds)
            rows.append((name, acc4, acc20, seconds))
            print(f"{name}: {acc4} {acc20} {seconds:.1f} s", flush=True)
    print(f"\nseeds {args.seeds}; overrides {overrides or 'none'}; mean (min) over seeds")
    print("| algorithm | acc @ 4 rounds | acc @ 20 rounds | seconds (both runs, per seed) |")
    print("|---|---|---|---|")
    for name, acc4, acc20, seconds in rows:
        print(f"| {name} | {statistics.mean(acc4):.4f} ({min(acc4):.4f}) | "
              f"{statistics.mean(acc20):.4f} ({min(acc20):.4f}) | {seconds:.1f} |")


if __name__ == "__main__":
    main()
