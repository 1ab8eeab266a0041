"""Barriers between independently trained BatchNorm CNNs under each BatchNorm mode (docs/batchnorm.md).

Trains pairs of a small BatchNorm CNN on digits from different seeds (plain SGD training, full
data, no FL), then measures the linear-path loss and accuracy barriers (FedGuCci Eq. 3/4) on the
test split with ``bn="interpolate"``, ``"keep"`` and ``"recompute"`` (training data as
``bn_data``). Prints one row per pair and mode, then mean and standard deviation over pairs::

    .venv/bin/python scripts/batchnorm_modes.py --pairs 3 --epochs 20
"""
from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch
from torch import nn

import landscape
from fl.datasets import load_dataset

MODES = ("interpolate", "keep", "recompute")


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


def main(argv: list[str] | None = None) -> int:
    """Measure and print the barriers.

    Parameters
    ----------
    argv : list[str], optional
        Command-line arguments.

    Returns
    -------
    int
        0.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="independent pairs (seeds 2i, 2i+1)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--alphas", type=int, default=21)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = load_dataset("digits")
    test, trainset = (data.test_x, data.test_y), (data.train_x, data.train_y)
    rows: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    print(f"{'pair':>4} {'mode':>11} {'loss barrier':>13} {'acc barrier':>12} {'acc A':>6} {'acc B':>6}")
    for pair in range(args.pairs):
        a, b = (train(2 * pair + k, data.train_x, data.train_y, args.epochs, data.num_classes) for k in (0, 1))
        for mode in MODES:
            ev = landscape.Evaluator(bn_cnn(data.num_classes), test, bn=mode,
                                     bn_data=trainset if mode == "recompute" else None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", landscape.BatchNormWarning)
                path = landscape.interpolate(a, b, ev, alphas=args.alphas)
            rows[mode].append((path.loss_barrier, path.accuracy_barrier))
            print(f"{pair:>4} {mode:>11} {path.loss_barrier:>13.3f} {path.accuracy_barrier:>12.3f} "
                  f"{path.accuracy[0]:>6.3f} {path.accuracy[-1]:>6.3f}")
    print(f"mean +- std over {args.pairs} pairs ({args.epochs} epochs, {args.alphas} alphas, test split):")
    for mode in MODES:
        values = np.array(rows[mode])
        ddof = 1 if len(values) > 1 else 0
        print(f"{mode:>11}: loss barrier {values[:, 0].mean():.3f} +- {values[:, 0].std(ddof=ddof):.3f}, "
              f"accuracy barrier {values[:, 1].mean():.3f} +- {values[:, 1].std(ddof=ddof):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
