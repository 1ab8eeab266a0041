"""FLOCO's claim (Sec. 4): personalised (local) accuracy above FedAvg's global model on each client's local test split.

    python benchmarks/floco_local.py --seeds 0 1 2
    python benchmarks/floco_local.py --seeds 0 1 2 --clients 10 --alpha 0.3 --set momentum=0.9

Every run of a seed uses the same partition and the same local test splits
(``local_test_fraction`` 0.2, FLOCO's default, given to FedAvg too). FLOCO's and FLOCO+'s
``local_accuracy`` is each client's model at its simplex point on its split; FedAvg's is its
final global model on the same splits. Both are unweighted means over clients. Printed: per
seed, then mean +- standard deviation over seeds and the mean paired difference.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

import fl


def fedavg_local_accuracy(run: fl.Run) -> float:
    """Unweighted mean over clients of the final global model's accuracy on each local split."""
    module = run.module()
    module.load_state_dict(run.global_state())
    module.eval()
    accs = []
    with torch.no_grad():
        for data in run.client_test_datasets().values():
            x, y = data.tensors
            accs.append(float((module(x).argmax(1) == y).double().mean()))
    return sum(accs) / len(accs)


def main() -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=JSON", help="extra fl.run settings")
    args = parser.parse_args()
    extra = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    torch.set_num_threads(1)
    rows: dict[str, list[float]] = {"fedavg": [], "floco": [], "floco+": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            common = dict(dataset="digits", clients=args.clients, rounds=args.rounds, alpha=args.alpha, seed=seed,
                          local_test_fraction=0.2, save_clients="none", progress=False, **extra)
            avg = fl.run("fedavg", out=Path(tmp) / f"fedavg-{seed}", **common)
            rows["fedavg"].append(fedavg_local_accuracy(avg))
            for name in ("floco", "floco+"):
                run = fl.run(name, out=Path(tmp) / f"{name}-{seed}", **common)
                rows[name].append(float(run.metrics[-1]["local_accuracy"]))
            print(f"seed {seed}: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in rows.items()), flush=True)
    print(f"\nsetting: {args.clients} clients, Dirichlet {args.alpha}, {args.rounds} rounds, extra {extra or 'none'}")
    print("| method | local accuracy (mean +- sd over seeds) | paired difference vs FedAvg |")
    print("|---|---|---|")
    for name, values in rows.items():
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        diff = [a - b for a, b in zip(values, rows["fedavg"])]
        dsd = statistics.stdev(diff) if len(diff) > 1 else 0.0
        print(f"| {name} | {statistics.mean(values):.4f} +- {sd:.4f} | "
              f"{statistics.mean(diff):+.4f} +- {dsd:.4f} |")


if __name__ == "__main__":
    main()
