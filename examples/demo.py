"""The README's main job: train FL runs on digits, analyse them, write ``report/index.html``.

Runs FedAvg, FedGuCci and IMA on the embedded digits data (10 clients, Dirichlet 0.5), then
computes, for the final round: test curves, connectivity of the client models (group
barrier, pairwise barrier matrix, paths), the transitivity claim of FedGuCci Sec. 3 (central
training), the plane through three client models with the global model placed in it and the
shared-basin claim (IMA Sec. 4), Hessian spectra of the global models, and the
bias-variance-covariance decomposition of FedAvg's global model (IMA Theorem 1).
Everything is cached in ``<out>/cache.h5``: a second run re-reads instead of recomputing.

    python examples/demo.py --out report
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import fl
import landscape
from figures import (barrier_matrix_figure, fl_curves_figure, fl_curves_plotly, path_figure, path_plotly,
                     plane_figure, plane_plotly, spectral_density_figure)
from figures.report import Report
from fl.datasets import load_dataset
from transitivity import Trainer  # examples/transitivity.py: central training with the connectivity loss

ALGORITHMS = {
    "fedavg": {},
    "fedgucci": {"beta": 1.0},
    "ima": {},
}


def log(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def train(out: Path, rounds: int, clients: int, seed: int) -> dict[str, fl.Run]:
    runs = {}
    for name, options in ALGORITHMS.items():
        log(f"training {name} ({clients} clients, {rounds} rounds, Dirichlet 0.5)")
        runs[name] = fl.run(name, dataset="digits", clients=clients, rounds=rounds, seed=seed,
                            out=out / "runs" / name, lr=0.05, momentum=0.9, local_epochs=2,
                            save_clients="last", **options)
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="report", help="output folder (default: report)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--resolution", type=int, default=21, help="plane grid points per axis")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--central-epochs", type=int, default=10,
                        help="epochs of central training in the transitivity check")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    runs = train(out, args.rounds, args.clients, args.seed)
    reference = runs["fedavg"]
    test_x, test_y = _tensors(reference.test_dataset())
    ev = landscape.Evaluator(reference.module(), (test_x, test_y), cache=out / "cache.h5")

    rep = Report("Loss landscape of federated models on digits",
                 subtitle=f"{args.clients} clients, Dirichlet(0.5) label skew, {args.rounds} rounds, "
                          f"MLP; seed {args.seed}")

    # -------------------------------------------------------------- training
    log("training curves")
    rep.section("Training", "Global-model test accuracy per round (FL engine, `fl.run`).")
    rep.add_table([{"algorithm": k, "final test accuracy": r.metrics[-1]["test_accuracy"],
                    "final test loss": r.metrics[-1]["test_loss"]} for k, r in runs.items()])
    curves = {k: r.metrics for k, r in runs.items()}
    rep.add_image(fl_curves_figure(curves), caption="Test loss and accuracy of the global model.")
    rep.add_plotly(fl_curves_plotly(curves))

    # ---------------------------------------------------------- connectivity
    log("client connectivity: group barriers, barrier matrices, paths")
    rep.section("Connectivity of the final client models",
                "FedGuCci's claim: tying clients to anchors (past global models) makes the client "
                "models more linearly connected. Group barrier = FedGuCci Def. 3.6 (uniform centroid); "
                "path barrier = Eq. 3/4, max over 11 interpolation points.")
    rows, paths = [], {}
    for name in ("fedavg", "fedgucci"):
        clients = runs[name].client_states(-1)
        ids = sorted(clients)
        group = landscape.group_barrier([clients[i] for i in ids], ev)
        matrix = landscape.barrier_matrix([clients[i] for i in ids[:5]], ev, alphas=11,
                                          labels=[f"client {i}" for i in ids[:5]])
        upper = matrix.accuracy_barrier[np.triu_indices(len(matrix.labels), 1)]
        rows.append({"algorithm": name, "clients": len(ids),
                     "mean client acc": float(group.member_accuracy.mean()),
                     "fused acc": group.fused_accuracy, "group acc barrier": group.accuracy_barrier,
                     "group loss barrier": group.loss_barrier,
                     "mean pairwise acc barrier": float(upper.mean())})
        rep_matrix = matrix
        paths[f"{name}: client {ids[0]} - client {ids[1]}"] = landscape.interpolate(
            clients[ids[0]], clients[ids[1]], ev, alphas=21)
        rep.add_image(barrier_matrix_figure(rep_matrix, metric="accuracy"),
                      caption=f"{name}: pairwise accuracy barriers among five client models.")
    rep.add_table(rows)
    rep.add_image(path_figure(paths), caption="Interpolation between two client models.")
    rep.add_plotly(path_plotly(paths))

    # --------------------------------------------------------- transitivity
    log("transitivity of linear mode connectivity (FedGuCci Sec. 3, central training)")
    rep.section("Transitivity: two models tied to one anchor (FedGuCci Sec. 3)",
                "Central training on the digits training set: an anchor, then two models from different "
                "initialisations, once with plain cross-entropy and once with the connectivity loss to the "
                "anchor (Eq. 7, beta 1, alpha ~ U[0, 1] per mini-batch). The claim: both models connected to "
                "the anchor are then connected to each other.")
    data = load_dataset("digits")
    trainer = Trainer(data.train_x, data.train_y, data.input_shape, epochs=args.central_epochs, lr=0.05,
                      batch_size=32, seed=args.seed)
    anchor = trainer.train("anchor")
    vanilla = [trainer.train(k) for k in ("w1", "w2")]
    tied = [trainer.train(k, anchor=anchor, beta=1.0) for k in ("w1", "w2")]
    verdict = landscape.claims.transitivity(tied[0], tied[1], anchor, ev, baseline=tuple(vanilla))
    rep.add_html(verdict._repr_html_())
    pair_paths = {"vanilla: w1 - w2": landscape.interpolate(vanilla[0], vanilla[1], ev),
                  "connectivity: w1 - w2": landscape.interpolate(tied[0], tied[1], ev)}
    rep.add_image(path_figure(pair_paths), caption="Interpolation between the two trained models.")

    # ---------------------------------------------------------------- basin
    log(f"plane through three client models ({args.resolution}x{args.resolution})")
    rep.section("Client models and the global model in one basin (IMA Sec. 4)",
                "Plane through three client models of the last round (Garipov construction); the "
                "global model and the clients' average are projected onto it.")
    basin_rows = []
    for name in ("fedavg", "ima"):
        run = runs[name]
        clients = run.client_states(-1)
        ids = sorted(clients)[:3]
        glob = run.global_state(-1)
        mean3 = {k: sum(clients[i][k] for i in ids) / 3 for k in clients[ids[0]]}
        result = landscape.plane(*(clients[i] for i in ids), ev, resolution=args.resolution,
                                 labels=[f"client {i}" for i in ids], extra={"global": glob, "average": mean3})
        gx, gy, residual = result.project(glob)
        metrics = ev.evaluate([glob] + [clients[i] for i in ids])
        iy, ix = np.unravel_index(np.nanargmin(result.loss), result.loss.shape)
        basin_rows.append({"algorithm": name, "global loss": float(metrics.loss[0]),
                           "client loss (mean of 3)": float(metrics.loss[1:].mean()),
                           "grid minimum loss": float(np.nanmin(result.loss)),
                           "global off-plane distance": residual,
                           "distance global - grid minimum": float(np.hypot(gx - result.x[ix], gy - result.y[iy]))})
        rep.add_image(plane_figure(result, metric="loss", log_scale=True),
                      caption=f"{name}: test loss on the plane of three client models.")
        rep.add_plotly(plane_plotly(result, metric="loss"))
    rep.add_table(basin_rows)
    clients = runs["fedavg"].client_states(-1)
    basin_verdict = landscape.claims.shared_basin([clients[i] for i in sorted(clients)],
                                                  runs["fedavg"].global_state(-1), ev,
                                                  resolution=args.resolution)
    rep.add_html(basin_verdict._repr_html_())

    # ------------------------------------------------------------ curvature
    log("Hessian spectra of the global models")
    rep.section("Sharpness of the global models",
                "Top Hessian eigenvalues (Lanczos, exact Hessian-vector products over the test set) "
                "and the spectral density (stochastic Lanczos quadrature).")
    curv_rows, densities = [], {}
    for name, run in runs.items():
        glob = run.global_state(-1)
        eig = landscape.hessian_eigenvalues(glob, ev, k=3, seed=args.seed)
        trace = landscape.hessian_trace(glob, ev, seed=args.seed)
        curv_rows.append({"algorithm": name, "lambda_1": float(eig[0]), "lambda_2": float(eig[1]),
                          "lambda_3": float(eig[2]), "trace": trace.value, "trace stderr": trace.stderr})
        densities[name] = landscape.hessian_density(glob, ev, iterations=60, seed=args.seed)
    rep.add_table(curv_rows)
    rep.add_image(spectral_density_figure(densities), caption="Hessian eigenvalue density.")

    # -------------------------------------------------------- decomposition
    log("loss decomposition of FedAvg's global model (IMA Theorem 1)")
    rep.section("Bias-variance-covariance decomposition (IMA Theorem 1)",
                "Squared error of softmax outputs against one-hot labels on the union of the client "
                "training sets; one realisation per client, so variance and covariance are 0.")
    run = runs["fedavg"]
    clients = run.client_states(-1)
    datasets = run.client_datasets()
    ids = sorted(clients)
    dec = landscape.decompose([clients[i] for i in ids], [datasets[i] for i in ids], ev)
    rep.add_table([{"term": t, "value": float(getattr(dec, t))} for t in
                   ("wens_loss", "bias", "train_bias", "heter_bias", "cross", "variance", "covariance",
                    "fma_loss", "gap")])

    rep.section("About this run")
    rep.add_text(f"Total time {time.time() - started:.0f} s; evaluation strategy "
                 f"{ev.strategy} ({ev.strategy_reason}); {ev.points_evaluated} landscape points computed "
                 "in this invocation (cached points are re-read).")
    path = rep.write(out / "index.html")
    log(f"wrote {path} in {time.time() - started:.0f} s")
    return 0


def _tensors(dataset) -> tuple:
    import torch

    xs, ys = zip(*(dataset[i] for i in range(len(dataset))))
    return torch.stack(xs), torch.as_tensor(ys)


if __name__ == "__main__":
    sys.exit(main())
