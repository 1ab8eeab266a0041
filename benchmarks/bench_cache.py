"""Cache cost against the number of stored entries.

For each size N the cache holds N point sets of a 51x51 plane (2,601 points: loss,
accuracy, done) plus what the timed operations added; the table gives the median wall time
over ``--repeats`` of:

* ``write result``: ``save_result`` of a new 51x51 :class:`PlaneResult` (a new key each repeat);
* ``read result``: ``load_result`` of it (a fresh :class:`Cache` object each time);
* ``write points``: ``add_points(..., force=True)`` of all 2,601 points of a new point set;
* ``read points``: ``points()`` of a stored point set (a fresh :class:`Cache` object).

The target: each operation within 2x between 10 and 1000 stored entries. The cache is filled
through ``add_points`` without ``force`` and one ``flush``, the public API, so the same script
also times other versions of the cache (put their ``landscape`` first on ``PYTHONPATH``).

    .venv/bin/python benchmarks/bench_cache.py                 # sizes 10, 100, 1000 (about a minute)
    .venv/bin/python benchmarks/bench_cache.py --sizes 10 100 --repeats 3
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from landscape import Cache
from landscape.results import PlaneResult


def plane_result(resolution: int, seed: int) -> PlaneResult:
    """A ``resolution`` x ``resolution`` plane result with random metrics (seeded)."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(-1.0, 1.0, resolution)
    shape = (resolution, resolution)
    return PlaneResult(x=grid, y=grid, loss=rng.random(shape), accuracy=rng.random(shape),
                       origin=rng.normal(size=64), u=rng.normal(size=64), v=rng.normal(size=64),
                       param_mask=np.ones(64, bool), models={"a": [0.0, 0.0]}, spec={"seed": seed})


def fill(path: Path, start: int, stop: int, n: int, rng: np.random.Generator) -> None:
    """Add point sets ``fill<start>`` ... ``fill<stop - 1>`` of ``n`` computed points, in one flush."""
    cache = Cache(path, flush_interval=float("inf"))
    idx = np.arange(n)
    for i in range(start, stop):
        cache.add_points(f"fill{i}", n, idx, rng.random(n), rng.random(n))
    cache.flush()


def timed(fn: Callable[[int], object], repeats: int) -> float:
    """Median seconds of ``fn(repeat index)`` over ``repeats`` calls."""
    seconds = []
    for r in range(repeats):
        start = time.perf_counter()
        fn(r)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def measure(path: Path, size: int, resolution: int, repeats: int, rng: np.random.Generator) -> dict[str, float]:
    """Median times of the four operations with ``size`` point sets stored."""
    n = resolution * resolution
    result = plane_result(resolution, size)
    idx = np.arange(n)
    values = rng.random(n)

    def write_result(r: int) -> None:
        Cache(path).save_result(f"result{size}-{r}", result)

    def read_result(r: int) -> None:
        assert Cache(path).load_result(f"result{size}-{r}") == result

    def write_points(r: int) -> None:
        Cache(path).add_points(f"points{size}-{r}", n, idx, values, values, force=True)

    def read_points(r: int) -> None:
        assert Cache(path).points(f"fill{r % size}", n)[2].all()

    return {"write result": timed(write_result, repeats), "read result": timed(read_result, repeats),
            "write points": timed(write_points, repeats), "read points": timed(read_points, repeats)}


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--resolution", type=int, default=51)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the table as JSON")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="bench_cache_"))
    path = folder / "bench.h5"
    rows: dict[int, dict[str, float]] = {}
    try:
        stored = 0
        for size in sorted(args.sizes):
            fill(path, stored, size, args.resolution ** 2, rng)
            stored = size
            rows[size] = measure(path, size, args.resolution, args.repeats, rng)
            disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
            print(f"... {size} point sets stored ({disk / 1e6:.1f} MB on disk)", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    ops = list(next(iter(rows.values())))
    print(f"\n{args.resolution}x{args.resolution} plane, median ms over {args.repeats} repeats")
    print(f"{'stored':>8} " + " ".join(f"{op:>13}" for op in ops))
    for size, row in rows.items():
        print(f"{size:>8} " + " ".join(f"{row[op] * 1e3:>13.1f}" for op in ops))
    low, high = min(rows), max(rows)
    ratios = {op: rows[high][op] / rows[low][op] for op in ops}
    print(f"{f'{high}/{low}':>8} " + " ".join(f"{ratios[op]:>12.2f}x" for op in ops))
    print("target (within 2x): " + ("met" if max(ratios.values()) <= 2.0 else "NOT met"))


if __name__ == "__main__":
    main()
