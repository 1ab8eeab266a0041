"""fl.run against a Flower simulation of the same FedAvg run, and the cost of recording a Flower run.

Three measurements, one process, side by side:

1. ``fl.run("fedavg", ...)``: the embedded engine, sequential back end, one thread.
2. The same run on Flower: ``fl.flower.AlgorithmStrategy`` with ``fl.flower.client_app`` in a
   Message-API simulation (Ray back end, one virtual SuperNode per client, ``--workers``
   client processes at a time, one thread each). The run folders of 1 and 2 hold the same
   global models (tests/test_flower_messages.py), so this is the price of Flower's transport.
3. Flower's own ``flwr.serverapp.strategy.FedAvg`` with a plain ``ClientApp`` (one epoch of
   SGD), once bare and once wrapped in ``fl.flower.RecordedStrategy`` (every global model
   evaluated and stored, client models stored on every round): the overhead of recording.

Rounds per second count the training rounds only (``strategy.start``), after a one-round
warm-up in the same simulation (Ray's workers start and import torch on the first round);
Ray's start-up is printed on its own. Bare and recorded runs alternate twice; the fastest of
each is kept.

    .venv/bin/python benchmarks/bench_flower.py [--clients 5] [--rounds 10] [--dataset mnist1d]
"""
from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import torch

#: bare and recorded runs alternate this many times; the fastest of each is kept
REPEATS = 2


def parse() -> argparse.Namespace:
    """The command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist1d")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2, help="Ray CPUs (client processes at a time)")
    return parser.parse_args()


def plain_client_app(run_dir: Path):
    """A user's ClientApp: one epoch of SGD (lr 0.1, batch 32) on its partition of the recorded folder."""
    from flwr.app import ArrayRecord, Message, RecordDict
    from flwr.clientapp import ClientApp

    import fl
    from fl.flower import partition_metrics

    app = ClientApp()

    @app.train()
    def train(msg, context):
        torch.set_num_threads(1)
        k = int(context.node_config["partition-id"])
        run = fl.load_run(run_dir)
        module, data = run.module(), run.client_datasets()[k]
        module.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(int(msg.content["config"]["server-round"]) * 1000 + k)
        module.train()
        for x, y in torch.utils.data.DataLoader(data, batch_size=32, shuffle=True, generator=gen):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(module(x), y).backward()
            opt.step()
        content = RecordDict({"arrays": ArrayRecord(module.state_dict()),
                              "metrics": partition_metrics(context, len(data))})
        return Message(content, reply_to=msg)

    return app


def simulate(main, client, args: argparse.Namespace) -> float:
    """Run one simulation; returns its wall time (Ray start-up included)."""
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    server = ServerApp()
    server.main()(main)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        run_simulation(server_app=server, client_app=client, num_supernodes=args.clients,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": args.workers, "include_dashboard": False}})
    return time.perf_counter() - start


def main() -> None:
    """Run the benchmark and print its table."""
    args = parse()
    torch.set_num_threads(1)
    import fl
    from fl.flower import AlgorithmStrategy, FlowerRecorder, RecordedStrategy, client_app

    settings = dict(dataset=args.dataset, clients=args.clients, rounds=args.rounds, seed=0, local_epochs=1)
    root = Path(tempfile.mkdtemp(prefix="bench-flower-"))
    start = time.perf_counter()
    fl.run("fedavg", out=root / "engine", progress=False, **settings)
    engine_s = time.perf_counter() - start

    spans: dict[str, float] = {}

    def algorithm_main(grid, context):
        AlgorithmStrategy("fedavg", out=root / "warm-up", **{**settings, "rounds": 1}).start(grid)
        t = time.perf_counter()
        AlgorithmStrategy("fedavg", out=root / "flower", **settings).start(grid)
        spans["flower"] = time.perf_counter() - t

    flower_wall = simulate(algorithm_main, client_app(), args)

    from flwr.serverapp.strategy import FedAvg

    recorders = [FlowerRecorder(root / f"recorded-{i}", save_clients="all", **settings) for i in range(REPEATS)]

    def fedavg() -> FedAvg:
        return FedAvg(fraction_evaluate=0.0, min_train_nodes=args.clients, min_available_nodes=args.clients)

    def pair_main(grid, context):
        from flwr.app import ArrayRecord

        initial = ArrayRecord(recorders[0].initial_state())
        fedavg().start(grid, initial, num_rounds=1)  # warm-up: Ray workers start, clients import torch
        for recorder in recorders:  # alternate, keep the fastest of each
            t = time.perf_counter()
            fedavg().start(grid, initial, num_rounds=args.rounds)
            spans["bare"] = min(spans.get("bare", float("inf")), time.perf_counter() - t)
            t = time.perf_counter()
            RecordedStrategy(fedavg(), recorder).start(grid, num_rounds=args.rounds)
            spans["recorded"] = min(spans.get("recorded", float("inf")), time.perf_counter() - t)

    simulate(pair_main, plain_client_app(recorders[0].path), args)

    rounds = args.rounds
    print(f"FedAvg, {args.dataset}, {args.clients} clients, {rounds} rounds, 1 local epoch; "
          f"Flower: {args.workers} client processes, torch threads 1")
    print(f"{'run':44s} {'rounds/s':>9s} {'s/round':>8s} {'ratio':>7s}")
    rows = [("fl.run (sequential engine)", engine_s), ("Flower simulation, AlgorithmStrategy", spans["flower"])]
    for name, seconds in rows:
        print(f"{name:44s} {rounds / seconds:9.2f} {seconds / rounds:8.3f} {seconds / engine_s:7.2f}")
    print(f"  (Flower's wall time with Ray start-up: {flower_wall:.1f} s)")
    bare, recorded = spans["bare"], spans["recorded"]
    print(f"{'Flower FedAvg, bare':44s} {rounds / bare:9.2f} {bare / rounds:8.3f} {'1.00':>7s}")
    print(f"{'Flower FedAvg, RecordedStrategy':44s} {rounds / recorded:9.2f} {recorded / rounds:8.3f} "
          f"{recorded / bare:7.2f}")
    print(f"recording overhead: {100 * (recorded - bare) / bare:+.0f}% "
          f"({(recorded - bare) / rounds * 1000:.0f} ms per round: evaluation, {args.clients + 1} checkpoints, "
          "manifest)")


if __name__ == "__main__":
    main()
