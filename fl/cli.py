"""``fl-run``: start (or resume) an FL run from the command line.

Example: ``fl-run --algorithm fedprox --rounds 20 --option mu=0.01 --out runs/prox``.
Every ``fl.run`` argument has a flag; algorithm and engine options go through
``--option key=value`` (values are parsed as JSON when possible: ``ima={"window":3}``).
Errors print one line and exit with status 2; rerunning an interrupted command resumes it.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from landscape.infra.errors import LandscapeError


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fl-run", description=(
        "Train a federated-learning run and store its checkpoints and metrics "
        "(rerun the same command to resume an interrupted run)."))
    p.add_argument("--algorithm", default="fedavg",
                   help="fedavg | fedprox | ima | fedgucci | fedgucci+ | floco | floco+ | lss")
    p.add_argument("--dataset", default="digits", help="digits (embedded) or a torchvision dataset")
    p.add_argument("--model", default=None, help="zoo model name (default: the dataset's default)")
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--participation", type=float, default=1.0)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--partition", default="dirichlet")
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="run directory (default ./runs/<name>)")
    p.add_argument("--device", default="auto")
    p.add_argument("--option", "-o", action="append", type=_parse_option, default=[],
                   metavar="KEY=VALUE", help="algorithm or engine option, repeatable (e.g. mu=0.01)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("--list-algorithms", action="store_true", help="print the available algorithms and exit")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.list_algorithms:
            from .algorithms import registry

            for name, cls in sorted(registry().items()):
                opts = ", ".join(f"{k}={v!r}" for k, v in cls.options.items()) or "no options"
                print(f"{name}: {opts}")
            return 0
        from .api import run

        options = dict(args.option)
        if args.no_progress:
            options["progress"] = False
        result = run(args.algorithm, dataset=args.dataset, model=args.model, clients=args.clients,
                     rounds=args.rounds, participation=args.participation,
                     local_epochs=args.local_epochs, batch_size=args.batch_size, lr=args.lr,
                     partition=args.partition, alpha=args.alpha, seed=args.seed, out=args.out,
                     device=args.device, **options)
    except (LandscapeError, OSError) as exc:
        print(f"fl-run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fl-run: interrupted; rerun the same command to resume from the last complete round",
              file=sys.stderr)
        return 130
    last = result.metrics[-1]
    print(f"{result.path}: round {last['round']}, test accuracy {last['test_accuracy']:.4f}, "
          f"test loss {last['test_loss']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
