"""Time per Hessian-vector product of one model with its data split over 1 and 2 worker processes.

An MLP of about 1.07M parameters (784-1024-256-10, ReLU) on 4,096 random samples in batches of
512, at its random initialisation. ``landscape.curvature.distributed_curvature`` starts the
workers (gloo on the CPU, one torch thread each); every rank times ``--products`` products after
one warm-up product (which also builds the retained graphs of the ``"auto"`` product mode), with
a barrier before each clock read, and rank 0's median is reported. The launches with 1 and 2
workers alternate ``--rounds`` times (order rotated each round), so a load change on a shared
machine hits both alike (the same products in this process, without workers, are timed in every
round as a reference); the table gives the median over the rounds, the ratio, and the largest
difference between the 1- and 2-worker products (relative to the largest entry). Start-up (spawning
the workers, importing torch, sending the model and data) is reported separately: it is paid once
per call, not per product.

    .venv/bin/python benchmarks/bench_distributed_hvp.py               # about 2 minutes on 2 cores
    .venv/bin/python benchmarks/bench_distributed_hvp.py --products 3 --rounds 1   # quick
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from landscape import Evaluator
from landscape.curvature import curvature_operator, distributed_curvature

from _timing import format_table, machine_load


def timed_products(op, vs: torch.Tensor) -> tuple[list[float], torch.Tensor]:
    """On every rank: one warm-up product, then the seconds of each product of ``vs`` (and the products)."""
    op.matvec(vs[0])
    seconds, out = [], []
    for v in vs:
        dist.barrier()
        start = time.perf_counter()
        out.append(op.matvec(v))
        dist.barrier()
        seconds.append(time.perf_counter() - start)
    return seconds, torch.stack(out)


def timed(fn, *args) -> float:
    """Seconds of one call of ``fn(*args)``."""
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    """Run the launches and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--products", type=int, default=5, help="timed products per launch")
    parser.add_argument("--rounds", type=int, default=2, help="launches per worker count (alternating)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 10))
    x, y = torch.randn(args.samples, 784, generator=g), torch.randint(0, 10, (args.samples,), generator=g)
    ev = Evaluator(model, (x, y), batch_size=args.batch_size, progress=False)
    dim = sum(p.numel() for p in model.parameters())
    vs = torch.randn(args.products, dim, generator=g)
    print(machine_load())
    print(f"MLP 784-1024-256-10: {dim:,} parameters; {args.samples} samples in {len(ev.batches)} batches")

    local = curvature_operator(model, ev)
    local.matvec(vs[0])  # warm-up (builds the retained graphs)
    in_process: list[float] = []
    per_product: dict[int, list[float]] = {1: [], 2: []}
    startup: dict[int, list[float]] = {1: [], 2: []}
    products: dict[int, torch.Tensor] = {}
    for r in range(args.rounds):
        in_process.append(statistics.median(timed(local.matvec, v) for v in vs))
        for workers in ((1, 2) if r % 2 == 0 else (2, 1)):
            start = time.perf_counter()
            seconds, out = distributed_curvature(functools.partial(timed_products, vs=vs), model, ev,
                                                 workers=workers, threads=1, timeout=1800)
            total = time.perf_counter() - start
            per_product[workers].append(statistics.median(seconds))
            startup[workers].append(total - sum(seconds) - seconds[0])  # the warm-up counted as one product
            products[workers] = out
            print(f"round {r + 1}, {workers} worker(s): {statistics.median(seconds):.3f} s per product")

    one, two = statistics.median(per_product[1]), statistics.median(per_product[2])
    diff = float((products[1] - products[2]).abs().max() / products[1].abs().max())
    alone = statistics.median(in_process)
    rows = [["none (this process)", alone, 0.0, one / alone, "-"],
            ["1", one, statistics.median(startup[1]), 1.0, 0.0],
            ["2", two, statistics.median(startup[2]), one / two, diff]]
    print(format_table(["workers", "s per HVP", "start-up s", "speed-up vs 1 worker", "max rel diff vs 1"], rows))


if __name__ == "__main__":
    main()
