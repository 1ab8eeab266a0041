"""Speed-up of plane evaluation with worker processes (landscape.distributed).

A ``resolution`` x ``resolution`` random plane around a small CNN on the 1,797 digits
(1x8x8 images), evaluated by one process and through the sharding layer with ``n_jobs``
workers on each back end. Every back end must reproduce the single-process losses; the
table reports the wall time of a cold call (worker start-up included) and of a warm one
(workers already running), the speed-up of the warm call over one process, and the largest
difference from the single-process losses.

    .venv/bin/python benchmarks/bench_distributed.py --resolution 21 --n-jobs 2
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import time
from contextlib import ExitStack

import numpy as np
import torch
from torch import nn

from landscape import Evaluator, random_plane
from landscape.evaluation.sharded import evaluate_points_distributed

from _workloads import digits, small_cnn


def timed_plane(model: nn.Module, data, resolution: int, backend: str | None, n_jobs: int, repeats: int
                ) -> tuple[float, float, np.ndarray]:
    """Time the plane on one back end: (cold seconds, best warm seconds of ``repeats``, losses).

    Back end None: one process, no sharding layer.
    """
    times = []
    with ExitStack() as stack:
        for call in range(1 + repeats):
            start = time.perf_counter()
            if backend == "dask" and call == 0:  # one cluster for both calls, started in the cold one
                from distributed import Client, LocalCluster

                threads = str(max(1, (os.cpu_count() or 1) // n_jobs))
                cluster = stack.enter_context(LocalCluster(n_workers=n_jobs, threads_per_worker=1,
                                                           dashboard_address=None,
                                                           env={"OMP_NUM_THREADS": threads}))
                stack.enter_context(Client(cluster))
            ev = Evaluator(model, data, progress=False)
            if backend is not None:
                ev.evaluate_points = functools.partial(evaluate_points_distributed, ev, backend=backend,
                                                       n_jobs=n_jobs)
            result = random_plane(model, ev, resolution=resolution, seed=0)
            times.append(time.perf_counter() - start)
    return times[0], min(times[1:]), result.loss


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=21)
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--backends", default="local,loky,ray,dask",
                        help="comma-separated back ends to compare with one process")
    parser.add_argument("--repeats", type=int, default=2, help="warm calls per back end (best is kept)")
    parser.add_argument("--json", help="also write the rows to this JSON file")
    args = parser.parse_args()

    model, data = small_cnn(0), digits()
    cold, warm, reference = timed_plane(model, data, args.resolution, None, 1, args.repeats)
    rows = [{"backend": f"one process, {torch.get_num_threads()} threads", "n_jobs": 1,
             "cold_s": cold, "warm_s": warm, "speedup": 1.0, "max_abs_diff": 0.0}]
    threads = torch.get_num_threads()
    if threads > 1:  # the per-worker setting of the pools below
        torch.set_num_threads(1)
        cold, warm, loss = timed_plane(model, data, args.resolution, None, 1, args.repeats)
        torch.set_num_threads(threads)
        rows.append({"backend": "one process, 1 thread", "n_jobs": 1, "cold_s": cold, "warm_s": warm,
                     "speedup": rows[0]["warm_s"] / warm, "max_abs_diff": float(np.abs(loss - reference).max())})
    for name in filter(None, args.backends.split(",")):
        try:
            cold, warm, loss = timed_plane(model, data, args.resolution, name, args.n_jobs, args.repeats)
        except Exception as exc:  # a back end that is not installed is reported, not fatal
            print(f"{name}: skipped ({type(exc).__name__}: {exc})")
            continue
        rows.append({"backend": name, "n_jobs": 1 if name == "local" else args.n_jobs, "cold_s": cold,
                     "warm_s": warm, "speedup": rows[0]["warm_s"] / warm,
                     "max_abs_diff": float(np.abs(loss - reference).max())})
    best = min(r["warm_s"] for r in rows if r["backend"].startswith("one process"))
    points = args.resolution ** 2
    print(f"\n{args.resolution}x{args.resolution} plane ({points} points), small CNN "
          f"({sum(p.numel() for p in model.parameters())} parameters), {len(data[1])} digits\n")
    print("| back end | workers | cold (s) | warm (s) | speed-up vs first row | vs best single process "
          "| max abs loss diff |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        r["speedup_vs_best"] = best / r["warm_s"]
        print(f"| {r['backend']} | {r['n_jobs']} | {r['cold_s']:.2f} | {r['warm_s']:.2f} | "
              f"{r['speedup']:.2f}x | {r['speedup_vs_best']:.2f}x | {r['max_abs_diff']:.1e} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
