"""The README's main job: train FL runs, analyse them, write ``report/index.html``.

Runs FedAvg, FedGuCci and IMA on MNIST-1D (default; ``--dataset digits`` also works) with
the optimiser of the ``fedgucci-mnist1d`` recipe (10 clients, Dirichlet 0.5, 3 local epochs,
SGD lr 0.04 with momentum 0.9), then computes, for the final round: test curves,
connectivity of the client models (pairwise and group barriers on three choices of
evaluation data), the transitivity claim of FedGuCci Sec. 3 (central training), the plane
through three client models with the global model placed in it and the shared-basin claim
(IMA Sec. 4), Hessian spectra of the global models, and the bias-variance-covariance
decomposition of FedAvg's global model (IMA Theorem 1). Everything is cached under
``<out>``: FL runs in ``runs/``, central models in ``central/``, landscape points in
``cache/``; a second invocation re-reads instead of recomputing.

    python examples/demo.py --out report
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

import fl
import landscape
from figures import (barrier_matrix_figure, fl_curves_figure, fl_curves_plotly, path_figure, path_plotly,
                     plane_figure, plane_plotly, spectral_density_figure)
from figures.report import Report
from fl.datasets import load_dataset
from fl.recipes import RECIPES

from _common import EVAL_SETS, group_barriers, pairwise_barriers, tensors
from transitivity import Trainer  # examples/transitivity.py: central training with the connectivity loss

RECIPE = "fedgucci-mnist1d"
MODELS = {"mnist1d": "mnist1d_mlp", "digits": "mlp"}
SIGNS = ("Sign conventions: a pairwise barrier (Eq. 3 loss, Eq. 4 accuracy) is a supremum over the "
         "interpolation grid including the endpoints, where the excess is 0, so it is never negative; 0 "
         "means no barrier anywhere on the line. The group barrier (Eq. 10, 1 - A(centroid) / mean_k "
         "A(w_k)) is a ratio at the centroid only; it is negative when the centroid is more accurate than "
         "its members on average, as for non-IID client models evaluated on the global test set.")


def log(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def train(out: Path, dataset: str, rounds: int, seed: int) -> dict[str, fl.Run]:
    """FedAvg, FedGuCci (the recipe's beta and anchors) and IMA (from round 0.75 R) with the
    optimiser, clients and partition of the fedgucci-mnist1d recipe on ``dataset``."""
    recipe = dict(RECIPES[RECIPE].settings)
    fedgucci = {k: recipe.pop(k) for k in ("beta", "anchors")}
    recipe.pop("algorithm")
    recipe.update(dataset=dataset, model=MODELS[dataset], rounds=rounds)
    options = {"fedavg": {}, "fedgucci": fedgucci, "ima": {"start_round": max(1, math.ceil(0.75 * rounds))}}
    runs = {}
    for name, extra in options.items():
        log(f"training {name} ({recipe['clients']} clients, {rounds} rounds, Dirichlet {recipe['alpha']})")
        runs[name] = fl.run(name, **recipe, **extra, seed=seed, out=out / "runs" / f"{name}-{dataset}-r{rounds}-seed{seed}",
                            save_clients="last",
                            progress=False)
    return runs


def connectivity_text(pair: dict[str, dict[str, float]], group: dict[str, dict[str, float]], tol: float) -> str:
    """Plain statement of which evaluation data, if any, separate FedGuCci from FedAvg."""
    separated = []
    for e in EVAL_SETS:
        for what, values in (("pairwise", pair), ("group", group)):
            d = values["fedgucci"][e] - values["fedavg"][e]
            if abs(d) > tol:
                separated.append(f"the {what} barrier on the {e} is {'lower' if d < 0 else 'higher'} for FedGuCci "
                                 f"({d:+.3f})")
    verdict = ("These barriers do not distinguish FedGuCci from FedAvg on any of the three evaluation sets "
               f"(every difference is within {tol})." if not separated else
               f"Differences larger than {tol}: " + "; ".join(separated) + "; all others are within it.")
    return verdict + " This is one seed; docs/claims.md has the same measurement over seeds."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="report", help="output folder (default: report)")
    parser.add_argument("--dataset", default="mnist1d", choices=sorted(MODELS),
                        help="embedded data set (on digits, client models are already connected)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--resolution", type=int, default=21, help="plane grid points per axis")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--central-epochs", type=int, default=10,
                        help="epochs of central training in the transitivity check")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 is fastest for these tiny models")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    runs = train(out, args.dataset, args.rounds, args.seed)
    reference = runs["fedavg"]
    cfg = reference.config
    ev = landscape.Evaluator(reference.module(), tensors(reference.test_dataset()), cache=out / "cache")

    rep = Report(f"Loss landscape of federated models on {args.dataset}",
                 subtitle=f"{cfg['clients']} clients, Dirichlet({cfg['alpha']}) label skew, {args.rounds} rounds, "
                          f"{cfg['local_epochs']} local epochs, {cfg['model']}; seed {args.seed}")

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
        rows.append({"algorithm": name, "clients": len(ids),
                     "mean client acc": float(group.member_accuracy.mean()),
                     "fused acc": group.fused_accuracy, "group acc barrier": group.accuracy_barrier,
                     "group loss barrier": group.loss_barrier})
        paths[f"{name}: client {ids[0]} - client {ids[1]}"] = landscape.interpolate(
            clients[ids[0]], clients[ids[1]], ev, alphas=21)
        rep.add_image(barrier_matrix_figure(matrix, metric="accuracy"),
                      caption=f"{name}: pairwise accuracy barriers among five client models (global test set).")
    rep.add_table(rows)
    pair = {n: pairwise_barriers(runs[n], cache=out / "cache") for n in ("fedavg", "fedgucci")}
    grp = {n: group_barriers(runs[n], cache=out / "cache") for n in ("fedavg", "fedgucci")}
    rep.add_text("Which evaluation data? Non-IID client models are individually weak on the global test set, "
                 "so barriers measured there can hide connectivity. Below, the same client models on three "
                 "choices of data: the global test set, the union of the clients' training data, and each "
                 "client's own training data (for a pair, the union of the two clients' data).")
    rep.add_table([{"evaluation data": e, **{f"{n} mean pairwise acc barrier": pair[n][e] for n in pair},
                    **{f"{n} group acc barrier": grp[n][e] for n in grp}} for e in EVAL_SETS])
    rep.add_text(connectivity_text(pair, grp, tol=0.005))
    rep.add_text(SIGNS)
    rep.add_image(path_figure(paths), caption="Interpolation between two client models.")
    rep.add_plotly(path_plotly(paths))

    # --------------------------------------------------------- transitivity
    log("transitivity of linear mode connectivity (FedGuCci Sec. 3, central training)")
    rep.section("Transitivity: two models tied to one anchor (FedGuCci Sec. 3)",
                f"Central training on the {args.dataset} training set: an anchor, then two models from different "
                "initialisations, once with plain cross-entropy and once with the connectivity loss to the "
                "anchor (Eq. 7, beta 1, alpha ~ U[0, 1] per mini-batch). The claim: both models connected to "
                "the anchor are then connected to each other.")
    data = load_dataset(args.dataset)
    trainer = Trainer(data.train_x, data.train_y, data.input_shape, epochs=args.central_epochs, lr=0.05,
                      batch_size=32, seed=args.seed, model=MODELS[args.dataset])
    anchor = trainer.cached(out / "central", "anchor")
    vanilla = [trainer.cached(out / "central", k) for k in ("w1", "w2")]
    tied = [trainer.cached(out / "central", k, "trained-anchor-beta1", anchor=anchor, beta=1.0) for k in ("w1", "w2")]
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


if __name__ == "__main__":
    sys.exit(main())
