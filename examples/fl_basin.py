"""IMA Sec. 4 on MNIST-1D (or digits): client models and the global model in one basin; FMA vs IMA.

An FL run (FedAvg, non-IID: ``#C = 2`` class shards per client by default, or Dirichlet)
stores every round's client and global models. For an early, a middle and the final round
(IMA Fig. 1 and Sec. 4, claims C1-C3 of docs/methods/ima.md):

* the plane through three client models of that round (Garipov construction, test loss),
  with the real global model projected onto it (off-plane distance reported) and the
  plain average of the three clients (the paper's white cross, which lies in the plane);
* basin analysis: the sublevel set ``{L <= max client loss}`` flood-filled on the grid;
  "common basin" when the three clients, the average and the global model share one
  component; the grid minimum ("bottom"), the global model's distance and loss gap to it;
  linear-path loss barriers between every client and the global model;
* the plane through three consecutive global models (IMA Fig. 1, column 4; claim C3) and
  their mean.

Then an ``"ima"`` run (same seed and partition; its rounds before IMA starts are FedAvg's,
copied from the FedAvg run by :func:`fl.branch`) gives the final FMA model (the plain
aggregate of the last round's clients, from the IMA window) and the IMA model; the loss
along ``(1 - beta) FMA + beta IMA`` for beta in [-0.5, 1.5] (IMA Fig. 5(c), claim C14).

Converged: the first table records :func:`fl.convergence.assess` of both runs. Measured once
(seed 0, the defaults: 200 rounds, lr decay 0.01 per round as in the IMA paper): both slopes are
below 0.1 points per round and the plateaus are within 0.01 of a 400-round run's (FedAvg 0.607 /
0.616, IMA 0.599 / 0.607). With a constant learning rate FedAvg was still rising at 120 rounds
(0.559 against 0.617 at 240).

    python examples/fl_basin.py                      # MNIST-1D
    python examples/fl_basin.py --dataset digits
    python examples/fl_basin.py --partition dirichlet --alpha 0.1
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import fl
import landscape
from figures import fl_curves_figure, fl_curves_plotly, path_figure, path_plotly, plane_figure, plane_plotly

from _common import Example, average, report_convergence, run_fl, test_evaluator


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this example's options to ``parser``."""
    parser.add_argument("--dataset", default="mnist1d", choices=("mnist1d", "digits"),
                        help="embedded data set; the MNIST-1D paper's MLP on mnist1d, the digits MLP on digits")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--lr-decay", type=float, default=0.01,
                        help="per-round lr decay gamma: lr (1 - gamma)^(r - 1) (the IMA paper's 0.01)")
    parser.add_argument("--momentum", type=float, default=0.9, help="client SGD momentum (the IMA paper uses 0.9)")
    parser.add_argument("--partition", choices=("shards", "dirichlet"), default="shards",
                        help="shards: #C=2 classes per client (the paper's setting); dirichlet: Dir(alpha)")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    parser.add_argument("--resolution", type=int, default=21, help="plane grid points per axis")
    parser.add_argument("--ima-window", type=int, default=5, help="IMA window P")
    parser.add_argument("--ima-start", type=int, default=None,
                        help="IMA start round (default: the paper's 0.75 R, i.e. floor(0.75 rounds) + 1)")
    parser.add_argument("--plane-clients", type=int, nargs=3, default=(0, 1, 2),
                        help="positions (in the round's client list) of the three clients spanning the plane")


def stage_rounds(rounds: int) -> list[int]:
    """Early, middle and final training rounds (distinct, sorted)."""
    return sorted({max(1, rounds // 10), max(1, rounds // 2), rounds})


def analyse_round(ex: Example, run, r: int, ev: landscape.Evaluator, positions: list[int],
                  resolution: int) -> tuple[dict, list[dict]]:
    """Plane, basin and client-global barriers of round ``r``; summary row and per-model rows."""
    clients = run.client_states(r)
    ids = sorted(clients)
    trio = [ids[p] for p in positions]
    names = [f"client {k}" for k in trio]
    glob = run.global_state(r)
    avg3 = average([clients[k] for k in trio])
    grid = landscape.plane(*(clients[k] for k in trio), ev, resolution=resolution, labels=names,
                           extra={"global": glob, "average (3 clients)": avg3})
    models = {**{n: clients[k] for n, k in zip(names, trio)}, "global": glob, "average (3 clients)": avg3}
    metrics = ev.evaluate(list(models.values()))
    exact = dict(zip(models, map(float, metrics.loss)))
    level = landscape.basin(grid, models=names, refine=False).level  # c = highest client loss on the grid
    found = landscape.basin(grid, models=list(models), model_loss=exact, level=level)
    paths = {k: landscape.interpolate(clients[k], glob, ev, alphas=11) for k in ids}
    barriers = np.array([p.loss_barrier for p in paths.values()])
    client_losses = ev.evaluate([clients[k] for k in ids]).loss
    g = found.model("global")
    summary = {"round": r, "common basin": found.common, "components": found.num_components,
               "level": found.level, "bottom loss": found.refined_loss, "global loss": exact["global"],
               "avg3 loss": exact["average (3 clients)"], "min client loss": float(client_losses.min()),
               "global < every client": bool(exact["global"] < client_losses.min()),
               "global dist to bottom": g["distance"], "global loss gap": g["loss_gap"],
               "cell diagonal": found.cell_diagonal, "global off bottom": g["off_bottom"],
               "global off-plane dist": grid.project(glob)[2],
               "max client-global barrier": float(barriers.max()),
               "mean client-global barrier": float(barriers.mean())}
    per_model = [{"round": r, "model": n, "x": float(found.coords[i][0]), "y": float(found.coords[i][1]),
                  "test loss": exact[n], "test acc (%)": 100 * float(metrics.accuracy[i]),
                  "dist to bottom": float(found.distance[i]), "loss gap": float(found.loss_gap[i]),
                  "in basin": bool(found.model_component[i] == found.model_component[0] > 0)}
                 for i, n in enumerate(found.names)]
    title = f"Round {r}: test loss on the plane of three client models"
    ex.save(f"plane_clients_round{r:03d}", plane_figure(grid, metric="loss", log_scale=True, title=title),
            plane_plotly(grid, metric="loss", log_scale=True, title=title))
    if r == run.rounds[-1]:
        title = f"Round {r}: test accuracy on the plane of three client models"
        ex.save(f"plane_clients_round{r:03d}_accuracy", plane_figure(grid, metric="accuracy", title=title),
                plane_plotly(grid, metric="accuracy", title=title))
    return summary, per_model


def main(argv: list[str] | None = None) -> int:
    """Run the example; the exit status."""
    ex = Example("fl_basin", __doc__.splitlines()[0], argv, add_arguments)
    a = ex.args
    if ex.quick:
        a.rounds, a.clients, a.local_epochs, a.resolution, a.ima_window, a.ima_start = 4, 4, 1, 5, 2, 2
    common = dict(dataset=a.dataset, model="mnist1d_mlp" if a.dataset == "mnist1d" else "mlp",
                  clients=a.clients, rounds=a.rounds, local_epochs=a.local_epochs, lr=a.lr, lr_decay=a.lr_decay,
                  momentum=a.momentum, partition=a.partition, alpha=a.alpha)
    fedavg = run_fl(ex, "fedavg", "fedavg", **common)
    ex.log("FL run ima: FedAvg's rounds before IMA starts copied from the FedAvg run (fl.branch)")
    ima = fl.branch(fedavg, "ima", window=a.ima_window, start_round=a.ima_start, seed=ex.seed,
                    out=ex.out / "runs" / "ima", progress=False, **common)
    ev = test_evaluator(fedavg)
    runs = {"fedavg": fedavg, "ima": ima}
    report_convergence(ex, runs)
    ex.table("Training (global test metrics)",
             [{"algorithm": k, "final test acc (%)": 100 * r.metrics[-1]["test_accuracy"],
               "final test loss": r.metrics[-1]["test_loss"],
               "mean acc last 5 rounds (%)": 100 * float(np.mean([m["test_accuracy"] for m in r.metrics[-5:]]))}
              for k, r in runs.items()])
    curves = {k: r.metrics for k, r in runs.items()}
    ex.save("fl_curves", fl_curves_figure(curves), fl_curves_plotly(curves))

    # ------------------------------------------------ clients and global in one basin
    summaries, per_model = [], []
    for r in stage_rounds(a.rounds):
        ex.log(f"round {r}: plane through three client models ({a.resolution}x{a.resolution})")
        s, m = analyse_round(ex, fedavg, r, ev, list(a.plane_clients), a.resolution)
        summaries.append(s)
        per_model += m
    ex.table(f"Basin analysis of FedAvg client models ({a.partition}, {a.clients} clients)", summaries,
             note="Basin: component of {L <= level} (level = highest loss of the three plane clients on the "
                  "grid) holding them; bottom = grid minimum in it (quadratic refinement); distances in "
                  "parameter-norm units, between the models' projections onto the plane (the global model "
                  "averages all clients, so it lies off the plane: see its off-plane distance; its loss is its "
                  "own, not the plane's); 'off bottom' = farther than one grid-cell diagonal; barriers: Eq. 3 "
                  "(loss) on 11 alphas between each client of the round and the global model.")
    ex.table("Models in the planes", per_model)

    # ------------------------------------------------ consecutive global models (C3)
    last = a.rounds
    trio = [last - 2, last - 1, last] if last >= 3 else [0, 1, 2][: last + 1]
    if len(trio) == 3:
        ex.log("plane through three consecutive global models")
        globs = [fedavg.global_state(r) for r in trio]
        mean = average(globs)
        names = [f"global r{r}" for r in trio]
        grid = landscape.plane(*globs, ev, resolution=a.resolution, labels=names, extra={"average": mean})
        exact = dict(zip(names + ["average"], map(float, ev.evaluate(globs + [mean]).loss)))
        found = landscape.basin(grid, models=names + ["average"], model_loss=exact)
        ex.table("Three consecutive global models and their mean (IMA Fig. 1 col. 4, claim C3)",
                 [{"model": n, "test loss": exact[n], "dist to bottom": float(d), "loss gap": float(gap)}
                  for n, d, gap in zip(found.names, found.distance, found.loss_gap)],
                 note=f"bottom loss {found.refined_loss:.4g}; common basin: {found.common}")
        title = f"Global models of rounds {trio[0]}-{trio[-1]}: test loss"
        ex.save("plane_global_models", plane_figure(grid, metric="loss", log_scale=True, title=title),
                plane_plotly(grid, metric="loss", log_scale=True, title=title))

    # ------------------------------------------------------------- FMA vs IMA (C14)
    ex.log("FMA vs IMA interpolation")
    window = ima.algorithm_state(-1)
    newest = max(int(k.split(".")[2]) for k in window if k.startswith("ima.window."))
    prefix = f"ima.window.{newest}."
    fma = {k[len(prefix):]: v for k, v in window.items() if k.startswith(prefix)}
    ima_model = ima.global_state(-1)
    betas = np.round(np.linspace(-0.5, 1.5, 41), 10)
    line = landscape.interpolate(fma, ima_model, ev, alphas=betas)
    on_line = landscape.basin(line, models={"FMA": 0.0, "IMA": 1.0})
    i0, i1 = (int(np.argmin(np.abs(betas - b))) for b in (0.0, 1.0))
    ex.table("FMA vs IMA on the line (1 - beta) FMA + beta IMA (final round of the IMA run)",
             [{"beta*": float(on_line.refined_bottom[0]), "loss at beta*": on_line.refined_loss,
               "beta* at grid edge": bool(on_line.refined_bottom[0] in (betas[0], betas[-1])),
               "FMA loss (beta=0)": float(line.loss[i0]), "IMA loss (beta=1)": float(line.loss[i1]),
               "FMA acc (%)": 100 * float(line.accuracy[i0]), "IMA acc (%)": 100 * float(line.accuracy[i1]),
               "best grid acc (%)": 100 * float(line.accuracy.max())}],
             note="beta* = minimum of the test loss on the line (quadratic refinement of the grid argmin).")
    ex.save("fma_ima_line", path_figure({"FMA -> IMA": line}, endpoint_labels=("FMA", "IMA"),
                                        title="Final FMA and IMA models"),
            path_plotly({"FMA -> IMA": line}, endpoint_labels=("FMA", "IMA"), title="Final FMA and IMA models"))
    return ex.finish()


if __name__ == "__main__":
    sys.exit(main())
