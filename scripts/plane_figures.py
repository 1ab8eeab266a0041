"""The figures of docs/planes.md: a random plane with ``span="auto"`` and a FedAvg trajectory on planes.

Trains FedAvg on digits (seeded), then draws, from its global models of every round:

* ``plane_auto.png``: the random filter-normalised plane around the last global model with
  ``span="auto"``, as a 3-D surface with the global models projected onto it (their heights are
  their own evaluated losses: random directions are nearly orthogonal to the training trajectory,
  so the rounds project near the centre and sit above the surface, off the plane);
* ``plane_trajectory.png``: the plane of the trajectory's top two principal directions
  (``pca_plane``), with the same global models drawn on its surface.

Prints the chosen span and the rule's outcome::

    .venv/bin/python scripts/plane_figures.py --out docs/figures
"""
from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import torch

import fl
import landscape
from figures import save
from figures.planes import plane_figure


def main() -> None:
    """Train the run, compute both planes and write the two PNG files."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/figures", help="folder of the PNG files")
    parser.add_argument("--rounds", type=int, default=10, help="FedAvg rounds")
    parser.add_argument("--resolution", type=int, default=21, help="grid points per axis")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        run = fl.run("fedavg", dataset="digits", clients=4, rounds=args.rounds, seed=0, out=Path(tmp) / "run",
                     progress=False)
        test = run.test_dataset()
        evaluator = landscape.Evaluator(run.module(), test.tensors, progress=False)
        models = {f"round {r}": run.global_state(r) for r in run.rounds}
        losses = evaluator.evaluate(list(models.values())).loss
        auto = landscape.random_plane(models[f"round {run.rounds[-1]}"], evaluator, resolution=args.resolution,
                                      span="auto", seed=0)
        rule = auto.spec["span_rule"]
        print(f"span={auto.spec['span']:.4g} ({rule['outcome']}; centre loss {rule['centre_loss']:.4g}, "
              f"target {rule['target_loss']:.4g}); diagnostics: {auto.diagnostics.notes or 'none'}")
        on_auto = {k: (*auto.coordinates(m), z) for (k, m), z in zip(models.items(), losses)}
        save(plane_figure(auto, kind="surface", log_scale=True, trajectory=on_auto, trajectory_label="global model",
                          title=f"Random plane, span='auto' = {auto.spec['span']:.3g}", width=6.0, height=4.8),
             Path(args.out) / "plane_auto.png")
        pca = landscape.pca_plane(list(models.values()), evaluator, resolution=args.resolution)
        on_pca = {k: (*pca.coordinates(m), z) for (k, m), z in zip(models.items(), losses)}
        pca = dataclasses.replace(pca, models={})  # the trajectory draws the steps
        save(plane_figure(pca, kind="surface", log_scale=True, trajectory=on_pca, trajectory_label="global model",
                          title="PCA plane of the FedAvg trajectory", width=6.0, height=4.8),
             Path(args.out) / "plane_trajectory.png")


if __name__ == "__main__":
    main()
