"""K-FAC and EKFAC against the exact GGN, layer by layer, on a small trained CNN (docs/kfac.md).

Trains a small CNN (two 3x3 convolutions, a max-pool and a linear classifier, no BatchNorm) on
digits with plain SGD, then, on the first ``--samples`` test images, builds for each layer the
exact GGN block (``kind="ggn"`` restricted to the layer, as a dense matrix) and the K-FAC and
EKFAC blocks (``kind="kfac"``, ``kind="ekfac"``, ``fisher_type="type-2"``), and prints each
approximation's relative Frobenius error ``||C - B||_F / ||B||_F`` and top eigenvalue against the
exact block's. Draws the three spectra of each layer (``kfac_spectra.png``)::

    OMP_NUM_THREADS=1 nice .venv/bin/python scripts/kfac_blocks.py
    OMP_NUM_THREADS=1 nice .venv/bin/python scripts/kfac_blocks.py --doc   # rewrite docs/kfac.md's table and figure

``--doc`` (with the defaults only) stores the rows as ``docs/data/kfac_blocks.json``, copies the
figure to ``docs/figures/`` and rewrites the marked parts of docs/kfac.md (``examples/_docs.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

import landscape
from fl.datasets import load_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from _docs import conditions, doc_refusal, publish  # noqa: E402

SCRIPT = "scripts/kfac_blocks.py"
FIGURE = "kfac_spectra.png"
KINDS = ("ggn", "kfac", "ekfac")
#: the figure's lowest eigenvalue, relative to the exact block's largest
FLOOR = 1e-10


def small_cnn(num_classes: int) -> nn.Module:
    """Conv(1->8) + ReLU + max-pool, Conv(8->16) + ReLU, a linear classifier (8x8 inputs).

    Parameters
    ----------
    num_classes : int
        Output size.

    Returns
    -------
    nn.Module
    """
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(16 * 4 * 4, num_classes))


def train(x: torch.Tensor, y: torch.Tensor, epochs: int, num_classes: int, seed: int = 0) -> nn.Module:
    """SGD (lr 0.05, momentum 0.9, batch 32) from the initialisation of ``seed``.

    Parameters
    ----------
    x, y : torch.Tensor
        Training data.
    epochs : int
        Passes over the data.
    num_classes : int
        Output size.
    seed : int
        Seeds the initialisation and the batch order.

    Returns
    -------
    nn.Module
        In eval mode.
    """
    torch.manual_seed(seed)  # nn.Module initialisers draw from the global generator
    model = small_cnn(num_classes)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
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
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=256, help="test images the curvature is taken over")
    parser.add_argument("--out", default=None, help="folder of the figure (default: a temporary one)")
    parser.add_argument("--doc", action="store_true",
                        help="then store the rows as docs/data/kfac_blocks.json and rewrite docs/kfac.md's table "
                             "and figure from them (with the defaults only)")
    return parser


def page_parts(payload: Mapping[str, Any]) -> dict[str, str]:
    """The parts of docs/kfac.md that ``--doc`` writes: how it was made and the table.

    Parameters
    ----------
    payload : Mapping
        The stored results (``docs/data/kfac_blocks.json``): ``args``, ``rows`` (one per layer),
        ``accuracy``, ``seconds`` and ``environment``.

    Returns
    -------
    dict[str, str]
        ``{"table": Markdown, "figure": its caption}``.
    """
    a, rows = payload["args"], payload["rows"]
    lines = ["| layer | parameters | K-FAC error | EKFAC error | top eigenvalue: GGN | K-FAC | EKFAC |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| `{r['layer']}` | {r['size']} | {r['kfac error']:.3f} | {r['ekfac error']:.3f} | "
              f"{r['ggn top']:.4g} | {r['kfac top']:.4g} | {r['ekfac top']:.4g} |" for r in rows]
    made = (f"Made with `.venv/bin/python {SCRIPT} --doc` (its defaults: the CNN trained for {a['epochs']} epochs of "
            f"SGD on digits, test accuracy {payload['accuracy']:.3f}; curvature over the first {a['samples']} test "
            f"images): {conditions(payload)}. The error is `||C - B||_F / ||B||_F` against the layer's exact GGN "
            "block `B`.")
    worst = max(rows, key=lambda r: r["kfac error"])
    closer = sum(r["ekfac error"] <= r["kfac error"] for r in rows)
    caption = (f"The eigenvalues of each layer's block, descending (those below {FLOOR:g} times the exact block's "
               f"largest left out). EKFAC's error is at most K-FAC's in {closer} of {len(rows)} layers (it is the "
               f"best fit in K-FAC's eigenbasis); the largest K-FAC error, {worst['kfac error']:.3f}, is layer "
               f"`{worst['layer']}`'s, "
               f"whose top eigenvalue K-FAC puts at {worst['kfac top'] / worst['ggn top']:.2f} times the exact one.")
    return {"table": made + "\n\n" + "\n".join(lines) + "\n", "figure": caption}


def spectra_figure(rows: list[dict[str, Any]], spectra: list[dict[str, list[float]]], path: Path) -> None:
    """One panel per layer: the eigenvalues of the exact block, K-FAC and EKFAC, descending, log scale.

    Eigenvalues below :data:`FLOOR` times the exact block's largest (rounding noise) are left out.

    Parameters
    ----------
    rows : list of dict
        One per layer (its ``layer`` names the panel).
    spectra : list of dict
        Per layer, kind -> eigenvalues.
    path : Path
        The PNG written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(4 * len(rows), 3.2), constrained_layout=True)
    styles = {"ggn": ("exact GGN block", "k", "-"), "kfac": ("K-FAC", "C0", "--"), "ekfac": ("EKFAC", "C3", ":")}
    for ax, row, spectrum in zip(axes, rows, spectra):
        floor = FLOOR * max(spectrum["ggn"])
        for kind in KINDS:
            values = sorted((v for v in spectrum[kind] if v > floor), reverse=True)
            label, color, style = styles[kind]
            ax.semilogy(range(1, len(values) + 1), values, style, color=color, label=label)
        ax.set_title(f"layer {row['layer']} ({row['size']} parameters)")
        ax.set_xlabel("eigenvalue index")
    axes[0].set_ylabel("eigenvalue")
    axes[0].legend()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Measure, print and draw (with ``--doc``, store them and rewrite the page).

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
    model = train(data.train_x, data.train_y, args.epochs, data.num_classes)
    x, y = data.test_x[:args.samples], data.test_y[:args.samples]
    ev = landscape.Evaluator(model, (x, y), dtype=torch.float64, progress=False)
    accuracy = float(landscape.Evaluator(model, (data.test_x, data.test_y), progress=False).evaluate(model).accuracy[0])
    rows, spectra = [], []
    print(f"{'layer':>5} {'size':>5} {'K-FAC err':>10} {'EKFAC err':>10} {'GGN top':>9} {'K-FAC top':>10} "
          f"{'EKFAC top':>10}")
    for layer in ("0", "3", "6"):
        dense = {kind: landscape.curvature_operator(model, ev, kind=kind, params=[f"{layer}.*"]).dense()
                 for kind in KINDS}
        norm = float(torch.linalg.norm(dense["ggn"]))
        eig = {kind: torch.linalg.eigvalsh(m) for kind, m in dense.items()}
        row = {"layer": layer, "size": int(dense["ggn"].shape[0]),
               **{f"{kind} error": float(torch.linalg.norm(dense[kind] - dense["ggn"])) / norm
                  for kind in ("kfac", "ekfac")},
               **{f"{kind} top": float(eig[kind][-1]) for kind in KINDS}}
        rows.append(row)
        spectra.append({kind: e.tolist() for kind, e in eig.items()})
        print(f"{layer:>5} {row['size']:>5} {row['kfac error']:>10.3f} {row['ekfac error']:>10.3f} "
              f"{row['ggn top']:>9.4g} {row['kfac top']:>10.4g} {row['ekfac top']:>10.4g}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        out.mkdir(parents=True, exist_ok=True)
        spectra_figure(rows, spectra, out / FIGURE)
        print(f"wrote {out / FIGURE}", file=sys.stderr)
        if args.doc:
            payload = {"args": vars(args), "rows": rows, "accuracy": accuracy, "seconds": time.time() - started,
                       "environment": {"cpus": os.cpu_count(), "threads": torch.get_num_threads(),
                                       "load_average": load, "torch": torch.__version__}}
            (out / "tables.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
            for written in publish("kfac_blocks", out, page_parts, "kfac.md", figures=[FIGURE], script=SCRIPT):
                print(f"wrote {written}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
