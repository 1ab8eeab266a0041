"""Barriers between independently trained BatchNorm CNNs under each BatchNorm mode (docs/batchnorm.md).

Trains pairs of a small BatchNorm CNN on digits from different seeds (plain SGD training, full
data, no FL), then measures the linear-path loss and accuracy barriers (FedGuCci Eq. 3/4) on the
test split with ``bn="interpolate"``, ``"keep"`` and ``"recompute"`` (training data as
``bn_data``). Prints one row per pair and mode, then mean and standard deviation over pairs::

    OMP_NUM_THREADS=1 nice .venv/bin/python scripts/batchnorm_modes.py
    OMP_NUM_THREADS=1 nice .venv/bin/python scripts/batchnorm_modes.py --doc   # rewrite docs/batchnorm.md's table

``--doc`` (with the defaults only) stores the rows as ``docs/data/batchnorm_modes.json`` and rewrites
the marked part of docs/batchnorm.md from it (``examples/_docs.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

import landscape
from fl.datasets import load_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from _common import mean_std  # noqa: E402
from _docs import conditions, doc_refusal, publish  # noqa: E402

MODES = ("interpolate", "keep", "recompute")
#: the page's name for each mode's row
LABELS = {"interpolate": "`interpolate`", "keep": "`keep`", "recompute": "`recompute` (`bn_data` = training data)"}
SCRIPT = "scripts/batchnorm_modes.py"


def bn_cnn(num_classes: int) -> nn.Module:
    """Two 3x3 conv + BatchNorm + ReLU blocks, a max-pool and a linear classifier (8x8 inputs).

    Parameters
    ----------
    num_classes : int
        Output size.

    Returns
    -------
    nn.Module
    """
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, num_classes))


def train(seed: int, x: torch.Tensor, y: torch.Tensor, epochs: int, num_classes: int) -> nn.Module:
    """Train one model with SGD (lr 0.05, momentum 0.9, batch 32) from the initialisation of ``seed``.

    Parameters
    ----------
    seed : int
        Seeds the initialisation and the batch order (its own generator).
    x, y : torch.Tensor
        Training data.
    epochs : int
        Passes over the data.
    num_classes : int
        Output size.

    Returns
    -------
    nn.Module
        In eval mode.
    """
    torch.manual_seed(seed)  # nn.Module initialisers draw from the global generator
    model = bn_cnn(num_classes)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 32):
            idx = order[i:i + 32]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    return model.eval()


def build_parser() -> argparse.ArgumentParser:
    """The script's options.

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="independent pairs (seeds 2i, 2i+1)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--alphas", type=int, default=21)
    parser.add_argument("--doc", action="store_true",
                        help="then store the rows as docs/data/batchnorm_modes.json and rewrite docs/batchnorm.md's "
                             "table from them (with the defaults only)")
    return parser


def page_parts(payload: Mapping[str, Any]) -> dict[str, str]:
    """The part of docs/batchnorm.md that ``--doc`` writes: how it was made, the table, what it shows.

    Parameters
    ----------
    payload : Mapping
        The stored results (``docs/data/batchnorm_modes.json``): ``args``, ``rows`` (one per pair
        and mode), ``seconds`` and ``environment``.

    Returns
    -------
    dict[str, str]
        ``{"table": Markdown}``.
    """
    a, rows = payload["args"], payload["rows"]
    by_mode = {m: [r for r in rows if r["mode"] == m] for m in MODES}
    accuracies = [r[k] for r in by_mode["interpolate"] for k in ("acc A", "acc B")]
    lines = ["| mode | loss barrier (Eq. 3) | accuracy barrier (Eq. 4) |", "|---|---|---|"]
    for mode in MODES:
        cells = [mean_std([r[k] for r in by_mode[mode]]) for k in ("loss barrier", "accuracy barrier")]
        lines.append(f"| {LABELS[mode]} | " + " | ".join(f"{m:.3f} +- {s:.3f}" for m, s in cells) + " |")
    ratios = [mean_std([r[k] for r in by_mode["interpolate"]])[0] / mean_std([r[k] for r in by_mode["recompute"]])[0]
              for k in ("loss barrier", "accuracy barrier")]
    drops = [100 * (i["acc B"] - k["acc B"]) for i, k in zip(by_mode["interpolate"], by_mode["keep"])]
    made = (f"Made with `.venv/bin/python {SCRIPT} --doc` (its defaults: {a['pairs']} pairs, seeds "
            f"0-{2 * a['pairs'] - 1}, {a['epochs']} epochs of SGD, {a['alphas']} points on the test split): "
            f"{conditions(payload)}. The models' test accuracy was {min(accuracies):.3f}-{max(accuracies):.3f}.")
    shown = (f"(mean +- standard deviation over {a['pairs']} pairs.) Under `recompute` the loss barrier is "
             f"{ratios[0]:.1f} times and the accuracy barrier {ratios[1]:.1f} times lower than under `interpolate`. "
             f"Under `keep` the end model `b` evaluated with `a`'s statistics lost {min(drops):.1f} to "
             f"{max(drops):.1f} points of test accuracy at the endpoint itself.")
    return {"table": made + "\n\n" + "\n".join(lines) + "\n\n" + shown}


def main(argv: list[str] | None = None) -> int:
    """Measure and print the barriers (with ``--doc``, store them and rewrite the page).

    Parameters
    ----------
    argv : list[str], optional
        Command-line arguments.

    Returns
    -------
    int
        0, or 2 when ``--doc`` is given with other options than the defaults.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    refusal = doc_refusal(args, parser)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    started, load = time.time(), os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    torch.set_num_threads(1)
    data = load_dataset("digits")
    test, trainset = (data.test_x, data.test_y), (data.train_x, data.train_y)
    rows: list[dict[str, Any]] = []
    print(f"{'pair':>4} {'mode':>11} {'loss barrier':>13} {'acc barrier':>12} {'acc A':>6} {'acc B':>6}")
    for pair in range(args.pairs):
        a, b = (train(2 * pair + k, data.train_x, data.train_y, args.epochs, data.num_classes) for k in (0, 1))
        for mode in MODES:
            ev = landscape.Evaluator(bn_cnn(data.num_classes), test, bn=mode,
                                     bn_data=trainset if mode == "recompute" else None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", landscape.BatchNormWarning)
                path = landscape.interpolate(a, b, ev, alphas=args.alphas)
            rows.append({"pair": pair, "mode": mode, "loss barrier": path.loss_barrier,
                         "accuracy barrier": path.accuracy_barrier, "acc A": float(path.accuracy[0]),
                         "acc B": float(path.accuracy[-1])})
            print(f"{pair:>4} {mode:>11} {path.loss_barrier:>13.3f} {path.accuracy_barrier:>12.3f} "
                  f"{path.accuracy[0]:>6.3f} {path.accuracy[-1]:>6.3f}")
    print(f"mean +- std over {args.pairs} pairs ({args.epochs} epochs, {args.alphas} alphas, test split):")
    for mode in MODES:
        (lm, ls), (am, as_) = (mean_std([r[k] for r in rows if r["mode"] == mode])
                               for k in ("loss barrier", "accuracy barrier"))
        print(f"{mode:>11}: loss barrier {lm:.3f} +- {ls:.3f}, accuracy barrier {am:.3f} +- {as_:.3f}")
    if args.doc:
        payload = {"args": vars(args), "rows": rows, "seconds": time.time() - started,
                   "environment": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                                   "load_average": load, "torch": torch.__version__}}
        with tempfile.TemporaryDirectory() as out:
            (Path(out) / "tables.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
            for written in publish("batchnorm_modes", Path(out), page_parts, "batchnorm.md", script=SCRIPT):
                print(f"wrote {written}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
