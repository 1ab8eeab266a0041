"""FLOCO on digits: client points on the solution simplex and the loss over the simplex.

A FLOCO run with 3 endpoints (a 2-simplex of classifiers, drawn as a triangle;
FLOCO Figure 1, docs/methods/floco.md) assigns every client a point ``alpha_k`` at
round ``tau`` and trains it on the subregion ``|alpha - alpha_k|_1 <= rho``. From the last
round's endpoints (``Run.algorithm_state``) the classifier at any barycentric point is
``sum_m alpha_m W_m`` (Eq. 6); this example evaluates a barycentric lattice:

* the global test loss over the simplex (Fig. 1 bottom left) with the client points;
* for two clients, the loss on their local test split over the simplex (Fig. 1 bottom
  middle/right): where is it lowest, and how far is that from ``alpha_k``;
* local vs global accuracy (Table 1's two metrics): FLOCO's centre on the global test set
  and each client's point on its local test split, against a FedAvg run on the same
  partition (its global model on both).

Converged: the first table records :func:`fl.convergence.assess` of both runs. Measured once
(seed 0, the defaults): at 160 rounds both slopes are below 0.1 points per round and the plateaus
are within 0.01 of a 320-round run's (FLOCO 0.964 / 0.970, FedAvg 0.967 / 0.969).

    python examples/floco_simplex.py
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

import landscape
from figures import fl_curves_figure, fl_curves_plotly, simplex_figure, simplex_plotly
from fl.models import classifier_name

from _common import Example, report_convergence, run_fl, tensors, test_evaluator


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this example's options to ``parser``."""
    parser.add_argument("--rounds", type=int, default=160)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--alpha", type=float, default=0.3, help="Dirichlet concentration of the label skew")
    parser.add_argument("--rho", type=float, default=0.1, help="subregion radius (L1)")
    parser.add_argument("--tau", type=int, default=None, help="round of the subregion assignment (default 0.2 R)")
    parser.add_argument("--lattice", type=int, default=20, help="barycentric lattice resolution r")
    parser.add_argument("--show-clients", type=int, default=2, help="clients whose local landscape is drawn")


def lattice(resolution: int, endpoints: int = 3) -> np.ndarray:
    """All barycentric points with coordinates ``n_i / resolution`` (``sum n_i = resolution``)."""
    def compositions(total: int, parts: int):
        if parts == 1:
            yield (total,)
            return
        for first in range(total, -1, -1):
            for rest in compositions(total - first, parts - 1):
                yield (first, *rest)
    return np.array(list(compositions(resolution, endpoints)), dtype=np.float64) / resolution


def simplex_states(base: dict, endpoints: torch.Tensor, points: np.ndarray, weight_key: str) -> list[dict]:
    """Models at barycentric ``points``: ``base`` with ``weight_key`` = sum_m alpha_m W_m (Eq. 6)."""
    weights = torch.einsum("pm,moi->poi", torch.as_tensor(points, dtype=endpoints.dtype), endpoints)
    return [{**base, weight_key: w} for w in weights]


def main(argv: list[str] | None = None) -> int:
    """Run the example; the exit status."""
    ex = Example("floco_simplex", __doc__.splitlines()[0], argv, add_arguments)
    a = ex.args
    if ex.quick:
        a.rounds, a.clients, a.local_epochs, a.lattice = 3, 4, 1, 4
    common = dict(clients=a.clients, rounds=a.rounds, local_epochs=a.local_epochs, lr=a.lr,
                  partition="dirichlet", alpha=a.alpha, local_test_fraction=0.2)
    floco = run_fl(ex, "floco", "floco", vertices=3, rho=a.rho, tau=a.tau, **common)
    fedavg = run_fl(ex, "fedavg", "fedavg", **common)
    report_convergence(ex, {"floco": floco, "fedavg": fedavg})
    ev = test_evaluator(floco)
    state = floco.algorithm_state(-1)
    if "floco.points" not in state:
        raise SystemExit("the FLOCO run has no client points yet: use more rounds than tau")
    endpoints = state["floco.endpoints"].double()
    points = state["floco.points"].double().numpy()
    base = {k: v for k, v in floco.global_state(-1).items()}
    key = f"{classifier_name(floco.module())}.weight"
    grid = lattice(a.lattice)
    states = simplex_states(base, endpoints, grid, key)

    ex.log(f"global test loss at {len(grid)} barycentric points")
    on_grid = ev.evaluate(states)
    vertices = [int(np.flatnonzero(np.isclose(grid, np.eye(3)[i]).all(axis=1))[0]) for i in range(3)]
    centre = ev.evaluate(simplex_states(base, endpoints, np.full((1, 3), 1 / 3), key))
    ex.table("Global test loss over the simplex",
             [{"grid points": len(grid), "mean loss": float(on_grid.loss.mean()), "min loss": float(on_grid.loss.min()),
               "max loss": float(on_grid.loss.max()), "centre loss": float(centre.loss[0]),
               "mean vertex loss": float(on_grid.loss[vertices].mean()),
               "centre acc (%)": 100 * float(centre.accuracy[0]),
               "min grid acc (%)": 100 * float(on_grid.accuracy.min())}])
    labels = [str(k) for k in range(len(points))]
    title = "FLOCO: global test loss over the simplex, client points"
    ex.save("simplex_global_loss",
            simplex_figure(points, labels=labels, grid=grid, grid_values=on_grid.loss, title=title),
            simplex_plotly(points, labels=labels, grid=grid, grid_values=on_grid.loss, title=title))

    # ---------------------------------------------------------- clients' own landscapes
    local = floco.client_test_datasets()
    rows = []
    for k in sorted(local):
        data = tensors(local[k])
        if len(data[1]) == 0:
            continue
        cev = landscape.Evaluator(floco.module(), data, progress=False)
        at_point = cev.evaluate(simplex_states(base, endpoints, points[k:k + 1], key))
        at_centre = cev.evaluate(simplex_states(base, endpoints, np.full((1, 3), 1 / 3), key))
        row = {"client": k, "alpha_k": " ".join(f"{v:.2f}" for v in points[k]),
               "local test size": len(data[1]), "local acc at alpha_k (%)": 100 * float(at_point.accuracy[0]),
               "local acc at centre (%)": 100 * float(at_centre.accuracy[0]),
               "local loss at alpha_k": float(at_point.loss[0]), "local loss at centre": float(at_centre.loss[0])}
        if k < a.show_clients:
            values = cev.evaluate(states).loss
            best = int(np.argmin(values))
            row["L1(argmin, alpha_k)"] = float(np.abs(grid[best] - points[k]).sum())
            title = f"FLOCO: client {k}'s local test loss over the simplex"
            ex.save(f"simplex_client{k}_loss",
                    simplex_figure(points[k:k + 1], labels=[f"client {k}"], grid=grid, grid_values=values, title=title),
                    simplex_plotly(points[k:k + 1], labels=[f"client {k}"], grid=grid, grid_values=values, title=title))
        else:
            row["L1(argmin, alpha_k)"] = None
        rows.append(row)
    ex.table("Clients: their simplex point and local test split", rows,
             note="L1(argmin, alpha_k): distance from the client's grid minimum of its local loss to its point.")

    # --------------------------------------------------------- local vs global accuracy
    fed_global = fedavg.global_state(-1)
    fed_local = [float(landscape.Evaluator(fedavg.module(), tensors(local[k]), progress=False)
                       .evaluate([fed_global]).accuracy[0]) for k in sorted(local) if len(local[k]) > 0]
    ex.table("Local vs global accuracy (final round)",
             [{"algorithm": "FLOCO", "global acc (%)": 100 * floco.metrics[-1]["test_accuracy"],
               "local acc (%)": 100 * floco.metrics[-1]["local_accuracy"]},
              {"algorithm": "FedAvg", "global acc (%)": 100 * fedavg.metrics[-1]["test_accuracy"],
               "local acc (%)": 100 * float(np.mean(fed_local))}],
             note="global: the global model (FLOCO: simplex centre) on the global test set; local: each "
                  "client's model (FLOCO: at alpha_k; FedAvg: the global model) on its local test split, "
                  "mean over clients.")
    curves = {"floco": floco.metrics, "fedavg": fedavg.metrics}
    ex.save("fl_curves", fl_curves_figure(curves), fl_curves_plotly(curves))
    return ex.finish()


if __name__ == "__main__":
    sys.exit(main())
