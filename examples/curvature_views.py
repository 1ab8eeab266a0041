"""Curvature views of a small MNIST-1D model.

The loss along its top Hessian eigenvectors and the curvature of each layer.

Trains the MNIST-1D paper's MLP (``mnist1d_mlp``, width 32 here) centrally with SGD, then, on a
fixed subset of its training data:

* the 1-D slice ``w + t d`` along the top Hessian eigenvector ``d`` (unit norm, so ``t`` is in
  parameter-norm units), beside the quadratic model ``L(w) + t g.d + t^2 lambda / 2``
  (``landscape.eigen_line``); the two must touch to second order at ``t = 0``;
* the plane of the top two eigenvectors (``landscape.eigen_plane``);
* the top eigenvalues and trace of each layer's diagonal Hessian block
  (``landscape.curvature_by_block``), printed as a table.

Converged: the first table records :func:`fl.convergence.assess` of the per-epoch test accuracy.
Measured once (seed 0): after the default 60 epochs the slope over the last 6 epochs is below 0.1
points per epoch and the plateau (0.552) is within 0.001 of a 120-epoch run's; after 30 epochs
the accuracy was already there but the slope still read +0.13 points per epoch.

    python examples/curvature_views.py                 # the tables and figure of docs/curvature-views.md
    python examples/curvature_views.py --quick         # a smoke test, seconds
    python examples/curvature_views.py --doc           # rewrite that page's numbers and figure from this run
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

import numpy as np
import torch
from torch import nn

import landscape
from figures import eigen_line_figure, eigen_line_plotly, plane_figure, plane_plotly
from fl.datasets import load_dataset
from fl.models import build_model

from _common import Example, accuracy_tracker, report_epochs
from _docs import add_doc_option, conditions, doc_refusal, markdown_table, publish

DIRECTIONS, BLOCKS = "Top eigen-directions", "Hessian curvature by block (mnist1d_mlp)"
#: the slice's lowest grid point (a column of the directions table that the page quotes in its text)
ARGMIN = "t of the slice's minimum"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this example's options to ``parser``."""
    parser.add_argument("--width", type=int, default=32, help="hidden units of the MLP")
    parser.add_argument("--epochs", type=int, default=60, help="epochs of central SGD")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--hessian-samples", type=int, default=1000,
                        help="training samples the Hessian and the slices are computed on")
    parser.add_argument("--span", type=float, default=1.0,
                        help="half-width of the slice and the plane, in parameter-norm units")
    add_doc_option(parser, "curvature-views.md")


def page_parts(payload: dict) -> dict[str, str]:
    """The parts of docs/curvature-views.md that ``--doc`` writes, from the stored ``tables.json``.

    Parameters
    ----------
    payload : dict
        The example's ``tables.json`` (as stored in ``docs/data/curvature_views.json``).

    Returns
    -------
    dict[str, str]
        ``directions`` (the table of the two directions), ``figure`` (the figure's caption with its
        numbers and how it was made), ``blocks`` (the per-block table).
    """
    a, tables = payload["args"], payload["tables"]
    training = next(rows for title, rows in tables.items() if title.startswith("Training"))[0]
    unit = tables[DIRECTIONS][0]
    columns = {k: k for k in unit if k != ARGMIN}
    figure = (
        f"The MNIST-1D paper's MLP (`mnist1d_mlp`, width {a['width']}, "
        f"{sum(r['parameters'] for r in tables[BLOCKS]):,} parameters), trained centrally with SGD for "
        f"{a['epochs']} epochs ({100 * training['final test acc']:.1f}% test accuracy), the Hessian and the slice on "
        f"{a['hessian_samples']:,} training samples (float64). The loss (solid) and the quadratic model (dashed, "
        f"`lambda_1 = {unit['lambda']:.4g}`) touch to second order at `t = 0`. The slope along the eigenvector is "
        f"`g.d = {unit['slope g.d']:.2g}`: the quadratic model's minimum lies at "
        f"`-g.d / lambda_1 = {-unit['slope g.d'] / unit['lambda']:.2g}`, the slice's lowest grid point at "
        f"`t = {unit[ARGMIN]:.2g}`. Made with `.venv/bin/python examples/curvature_views.py --doc` (its defaults, "
        f"seed {payload['seed']}; it also writes the interactive HTML, the eigenvector plane and the tables): "
        f"{conditions(payload)}.")
    return {"directions": markdown_table(tables[DIRECTIONS], columns), "figure": figure,
            "blocks": markdown_table(tables[BLOCKS])}


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, seed: int,
          on_epoch: Callable[[int, float, dict[str, torch.Tensor]], None]) -> nn.Module:
    """Plain minibatch SGD (batch 64, momentum 0.9) with its own seeded generator.

    ``on_epoch(epoch, mean loss, state)`` after every epoch.
    """
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    for epoch in range(1, epochs + 1):
        total = 0.0
        for idx in torch.randperm(len(x), generator=gen).split(64):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        on_epoch(epoch, total / len(x), model.state_dict())
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    """Run the example; the exit status."""
    ex = Example("curvature_views", __doc__.splitlines()[0], argv, add_arguments)
    a = ex.args
    refusal = doc_refusal(a, ex.parser)
    if refusal:
        ex.log(refusal)
        return 2
    epochs, samples, resolution = (2, 200, 11) if ex.quick else (a.epochs, a.hessian_samples, 41)
    data = load_dataset("mnist1d")
    model = build_model(f"mnist1d_mlp_w{a.width}", num_classes=10, input_shape=data.input_shape, seed=ex.seed)
    ex.log(f"training {sum(p.numel() for p in model.parameters())} parameters for {epochs} epochs")
    records, on_epoch = accuracy_tracker(model, data.test_x, data.test_y)
    train(model, data.train_x, data.train_y, epochs, a.lr, ex.seed, on_epoch)
    report_epochs(ex, f"mnist1d_mlp_w{a.width}", records)
    subset = (data.train_x[:samples], data.train_y[:samples])
    ev = landscape.Evaluator(model, subset, device="cpu", dtype=torch.float64)
    test = landscape.Evaluator(model, (data.test_x, data.test_y), device="cpu").evaluate(model)
    ex.log(f"test accuracy {100 * float(test.accuracy[0]):.1f}%; top Hessian eigenpairs")
    eigen = landscape.hessian_eigen(model, ev, k=2, return_eigenvectors=True, max_iter=300, seed=ex.seed)
    line = landscape.eigen_line(model, ev, eigen=eigen, span=a.span, resolution=resolution)
    filtered = landscape.eigen_line(model, ev, eigen=eigen, normalization="filter", span=a.span,
                                    resolution=resolution)
    plane = landscape.eigen_plane(model, ev, eigen=eigen, span=a.span, resolution=resolution)
    blocks = landscape.curvature_by_block(model, ev, top_k=2, max_iter=300, seed=ex.seed)
    ex.table(DIRECTIONS, [
        {"direction": name, "lambda": r.eigenvalue, "norm of d": float(np.linalg.norm(r.direction)),
         "d^T H d": r.curvature, "Rayleigh quotient": r.curvature / float(r.direction @ r.direction),
         "slope g.d": r.slope, "L(w)": r.base_loss,
         "max abs(loss - quadratic), t within span/4": float(np.abs(r.gap[np.abs(r.t) <= a.span / 4]).max()),
         ARGMIN: float(r.t[int(np.nanargmin(r.loss))])}
        for name, r in (("unit eigenvector", line), ("filter-normalised", filtered))])
    ex.table(BLOCKS, blocks.rows())
    print(blocks)
    title = f"MNIST-1D MLP (width {a.width}), {samples} training samples"
    ex.save("eigen_line", eigen_line_figure(line, title=title), eigen_line_plotly(line, title=title))
    ex.save("eigen_plane", plane_figure(plane, title=f"{title}: top-2 eigenvector plane"),
            plane_plotly(plane, title=f"{title}: top-2 eigenvector plane"))
    status = ex.finish()
    if a.doc:
        for path in publish("curvature_views", ex.out, page_parts, "curvature-views.md", figures=["eigen_line.png"]):
            ex.log(f"wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
