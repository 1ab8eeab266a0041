"""FL rounds per second: the sequential and the vectorised client back end (fl.vectorized).

Part 1, local training of one round, for each ``--cases`` entry ``model:input:samples``
(default the digits MLP and the FedGuCci CNN): ``clients`` clients on synthetic inputs of
that shape, client sizes drawn from a seeded Dirichlet-like spread around ``samples`` (so step
counts and last batches differ), trained by ``alg.client_update`` one client at a time and by
``fl.vectorized.train_clients`` at once; interleaved repeats, medians, the largest weight
difference, and the back end ``backend="auto"`` takes (``fl.vectorized.choose_backend``).
Each table's title gives the round's step counts: ``sum S_k`` sequential steps against the
largest client's ``max S_k`` stacked steps, whose ratio bounds the vectorised speed-up at
equal step cost; and the measured cost of one stacked step of every client against one
plain step of one client (32 samples), the other factor of that bound.

Part 2, whole rounds of ``fl.run`` on the embedded digits (sampling, training, FedAvg,
test evaluation, storage with ``save_clients="none"``), from the per-round times the run
records.

    .venv/bin/python benchmarks/bench_fl.py                       # CPU defaults (small)
    .venv/bin/python benchmarks/bench_fl.py --device cuda --cases fedgucci_cnn:3x32x32:500  # GPU target
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import numpy as np
import torch

import fl
from fl.algorithms.base import LocalContext, make_generator
from fl.api import build_config
from fl.models import build_model
from fl.vectorized import choose_backend, train_clients
from landscape.infra.devices import resolve_device

try:
    from _timing import format_table, machine_load, side_by_side
except ImportError:  # imported as benchmarks.bench_fl
    from benchmarks._timing import format_table, machine_load, side_by_side


def client_sizes(clients: int, mean: int, seed: int) -> list[int]:
    """Sizes around ``mean`` (Dirichlet(1) shares of ``clients * mean``, at least 1)."""
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(np.ones(clients))
    return [max(1, int(round(s * clients * mean))) for s in shares]


def contexts(model: str, shape: tuple[int, ...], samples: int, args: argparse.Namespace,
             device: torch.device) -> tuple[object, torch.nn.Module, list[int], object]:
    """The FedAvg algorithm, the model, the client sizes and a factory of their local contexts."""
    module = build_model(model, num_classes=10, input_shape=shape, seed=0).to(device)
    alg = build_config("fedavg", dataset="digits", model=None, clients=args.clients, rounds=1,
                       participation=1.0, local_epochs=args.epochs, batch_size=args.batch_size, lr=0.05,
                       partition="iid", alpha=0.5, seed=0, device=str(device), options={})[1]
    gen = torch.Generator().manual_seed(0)
    start = {k: v.detach().clone() for k, v in module.state_dict().items()}
    sizes = client_sizes(args.clients, samples, 0)
    data = [(torch.randn(n, *shape, generator=gen).to(device), torch.randint(0, 10, (n,), generator=gen).to(device))
            for n in sizes]

    def make() -> list[LocalContext]:  # fresh generators: every call sees the same batches
        return [LocalContext(round=1, client=k, global_state=start, server_state={}, client_state={},
                             x=x, y=y, generator=make_generator(0, "client", 1, k), lr=0.05,
                             local_epochs=args.epochs, batch_size=args.batch_size, momentum=0.0,
                             weight_decay=0.0, module=module, options={}, config={}, device=device,
                             num_classes=10)
                for k, (x, y) in enumerate(data)]

    return alg, module, sizes, make


def step_costs(alg: object, make: object, args: argparse.Namespace, device: torch.device) -> tuple[float, float]:
    """Seconds of one plain step of one client and of one stacked step of every client.

    Every client is cut to one mini-batch of ``batch_size`` samples (one local step), so the
    sequential back end times ``K`` plain steps and the vectorised one a single stacked step.
    """
    def one_batch() -> list[LocalContext]:
        cut = []
        for c in make():
            reps = -(-args.batch_size // len(c.y))
            x, y = c.x.repeat(reps, *([1] * (c.x.dim() - 1)))[:args.batch_size], c.y.repeat(reps)[:args.batch_size]
            cut.append(dataclasses.replace(c, x=x, y=y, local_epochs=1))
        return cut

    t = side_by_side({"plain": lambda: [alg.client_update(c) for c in one_batch()],
                      "stacked": lambda: train_clients(alg, one_batch())}, repeats=max(3, args.repeats), device=device)
    return t["plain"].median / args.clients, t["stacked"].median


def local_training_table(case: str, args: argparse.Namespace, device: torch.device) -> str:
    """Table: one round of local training, sequential against vectorised, for one ``model:input:samples`` case."""
    model, shape_text, samples = case.split(":")
    shape = tuple(int(d) for d in shape_text.split("x"))
    alg, module, sizes, make = contexts(model, shape, int(samples), args, device)
    timings = side_by_side({
        "sequential": lambda: {c.client: alg.client_update(c) for c in make()},
        "vectorized": lambda: train_clients(alg, make()),
    }, repeats=args.repeats, device=device)
    seq, vec = timings["sequential"], timings["vectorized"]
    diff = max(float((seq.result[k].state[n] - vec.result[k].state[n]).abs().max())
               for k in seq.result for n in seq.result[k].state)
    auto, _ = choose_backend(alg, module, device)
    rows = [[name, t.median, 1.0 / t.median, seq.median / t.median, diff if name == "vectorized" else 0.0,
             "auto" if name == auto else ""]
            for name, t in timings.items()]
    steps = [args.epochs * -(-n // args.batch_size) for n in sizes]
    plain, stacked = step_costs(alg, make, args, device)
    title = (f"local training of one round: {args.clients} clients of {model} on {shape_text} inputs, "
             f"{sum(sizes)} samples (client sizes {min(sizes)}..{max(sizes)}), batch {args.batch_size}, "
             f"{args.epochs} epoch(s), device {device}, median of {args.repeats}\n"
             f"steps: {sum(steps)} sequential, {max(steps)} stacked (bound {sum(steps) / max(steps):.1f}x at equal "
             f"step cost); one step: plain {plain * 1e3:.3g} ms, stacked {args.clients} clients "
             f"{stacked * 1e3:.3g} ms ({stacked / plain:.2f}x)")
    return title + "\n" + format_table(["backend", "s/round", "rounds/s", "speed-up", "max |dw|", "auto"], rows)


def full_run_table(args: argparse.Namespace, device: torch.device) -> str:
    """Table: a whole ``fl.run`` on each back end."""
    rows = []
    base = None
    for backend in ("sequential", "vectorized"):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            run = fl.run("fedavg", dataset="digits", clients=args.run_clients, rounds=args.run_rounds,
                         out=out, device=str(device), backend=backend, save_clients="none", progress=False)
            wall = time.perf_counter() - start
            per_round = [m["time"] for m in run.metrics if m["round"] > 0]
            final = run.metrics[-1]["test_loss"]
        seconds = float(np.median(per_round))
        base = base or seconds
        rows.append([backend, seconds, 1.0 / seconds, base / seconds, wall, final])
    title = (f"fl.run fedavg on digits (mlp): {args.run_clients} clients, {args.run_rounds} rounds, "
             f"device {device}, median round time")
    return title + "\n" + format_table(["backend", "s/round", "rounds/s", "speed-up", "wall s", "final loss"], rows)


def main() -> None:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--cases", default="mlp:64:100,fedgucci_cnn:3x32x32:8",
                        help="comma-separated model:input:samples (input CxHxW; samples: mean per client)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--run-clients", type=int, default=20)
    parser.add_argument("--run-rounds", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    print(machine_load())
    for case in args.cases.split(","):
        print(local_training_table(case, args, device))
        print()
    print(full_run_table(args, device))


if __name__ == "__main__":
    main()
