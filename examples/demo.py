"""The README's main job: train FL runs, analyse them, write ``report/index.html``.

Runs FedAvg, FedGuCci and IMA on MNIST-1D (default; ``--dataset digits`` also works) to
convergence, then computes, for the final round: test curves and each run's convergence,
connectivity of the client models (pairwise and group barriers on three choices of
evaluation data, FedGuCci against FedAvg decided by ``landscape.claims.statistics.decide``),
the transitivity claim of FedGuCci Sec. 3 (central training), the plane through three
client models with the global model placed in it and the shared-basin claim (IMA Sec. 4),
Hessian spectra and worst-case sharpness (``landscape.sharpness``) of the global models, and the
bias-variance-covariance decomposition (IMA Theorem 1) of FedAvg's and IMA's last-round client
models from several realisations per client. Everything is
cached under ``<out>``: FL runs in ``runs/``, central models in ``central/``, the
decomposition's retrained client models in ``realisations/``, landscape points in
``cache/``; a second invocation re-reads instead of recomputing.

The FL setting (:data:`SETTINGS`, :data:`FEDGUCCI`, :data:`ROUNDS`) is defined here, not
read from a recipe, so the demo stays what it is when the recipes change. It derives from
the ``fedgucci-mnist1d`` recipe as it stood with the MLP: 10 clients, full participation,
Dirichlet(0.5) label skew, 3 local epochs, batch 64, SGD lr 0.04 (FedGuCci App. A.5),
momentum 0.9, weight decay 5e-4, beta 0.1 and one anchor (official code). What differs:

* model: the MNIST-1D paper's MLP (``mnist1d_mlp``), not the CNN the recipe moves to. The
  demo must analyse converged models and finish in under 3 minutes on 2 shared cores. A
  100-round CNN run takes about 30 s on an idle machine (125 s measured on a loaded one),
  and FedGuCci's client update costs about 2.5 FedAvg ones, so three CNN runs alone would
  take the whole budget before any analysis. The MLP plateaus lower (near 0.58-0.59
  against the CNN's 0.81-0.86) but gets there within the budget.
* rounds and learning-rate decay: 70 rounds with ``lr_decay`` 0.0213 = 1 - (1 - 0.01)^(150/70),
  the official code's per-round decay 0.01 over FedGuCci's 150 rounds compressed into 70,
  so the learning rate falls by the same factor (to 0.22 of its start) and the runs settle.
  With 60 rounds IMA is still rising at the end (``fl.convergence``); 80 rounds converge
  as well but cost 15% more time.
* IMA starts at its default round, the paper's t_s = 0.75 R.

Converged: the report records :func:`fl.convergence.assess` for each run. Measured once
(seed 0, MNIST-1D) against the same setting run for 210 rounds: the global test accuracy
after 70 rounds and the plateau (mean of rounds 189-210) are FedAvg 0.583 / 0.581,
FedGuCci 0.585 / 0.592 and IMA 0.574 / 0.581, each within 0.01 of its plateau.

    python examples/demo.py --out report
    python examples/demo.py --out report --track 10   # also the landscape during training (fl.Track)
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fl
import landscape
from figures import (
    barrier_matrix_plotly,
    decomposition_bars_plotly,
    fl_curves_plotly,
    path_plotly,
    plane_plotly,
    sharpness_plotly,
    spectral_density_plotly,
    tracking_plotly,
)
from figures.report import Report
from fl.central import Trainer  # central training with the connectivity loss
from fl.datasets import load_dataset
from fl.realisations import realisations
from landscape.claims.outcome import Outcome
from landscape.claims.statistics import Interval, below_resolution, decide

from _common import EVAL_SETS, barrier_resolution, group_barriers, pairwise_barrier_values, tensors

#: Settings shared by the three runs (derived from ``fedgucci-mnist1d``; see the module docstring).
SETTINGS: dict[str, Any] = {"clients": 10, "participation": 1.0, "local_epochs": 3, "batch_size": 64,
                            "lr": 0.04, "momentum": 0.9, "weight_decay": 5e-4, "lr_decay": 0.0213,
                            "partition": "dirichlet", "alpha": 0.5}
#: FedGuCci's options (official code: beta 0.1, one anchor).
FEDGUCCI = {"beta": 0.1, "anchors": 1}
ROUNDS = 70
MODELS = {"mnist1d": "mnist1d_mlp", "digits": "mlp"}
#: Realisations per client in the decomposition: the stored client model and retrainings.
REALISATIONS = 5
#: Radii of the sharpness balls: L2 in weight units (about 0.7% of the global models' norm, 15), adaptive L2 a
#: fraction of each weight (docs/sharpness.md); 3 restarts of 20 ascent steps each, as the library's defaults.
SHARPNESS_RHO = {"l2": 0.1, "adaptive": 0.05}
#: Tolerance of the FedGuCci-FedAvg barrier comparison: one accuracy point (docs/claims.md, claim 1).
TOL = 0.01
SIGNS = ("Sign conventions: a pairwise barrier (Eq. 3 loss, Eq. 4 accuracy) is a supremum over the "
         "interpolation grid including the endpoints, where the excess is 0, so it is never negative; 0 "
         "means no barrier anywhere on the line. The group barrier (Eq. 10, 1 - A(centroid) / mean_k "
         "A(w_k)) is a ratio at the centroid only; it is negative when the centroid is more accurate than "
         "its members on average, as for non-IID client models evaluated on the global test set.")


def log(message: str) -> None:
    """Print ``message`` with the time of day."""
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_settings(out: Path, dataset: str, rounds: int, seed: int, track: int = 0) -> dict[str, dict[str, Any]]:
    """The ``fl.run`` arguments of FedAvg, FedGuCci and IMA in the setting :data:`SETTINGS`.

    IMA starts at its default round 0.75 R; each run has its own run folder under
    ``<out>/runs``. With ``track`` > 0, the runs record the landscape every ``track`` rounds
    (``fl.Track``'s other defaults) in folders of their own.
    """
    options = {"fedavg": {}, "fedgucci": FEDGUCCI, "ima": {}}
    tracked = {"track": fl.Track(every=track)} if track else {}
    return {name: {"algorithm": name, "dataset": dataset, "model": MODELS[dataset], "rounds": rounds, **SETTINGS,
                   **extra, "seed": seed, "save_clients": "last", "progress": False, **tracked,
                   "out": out / "runs" / f"{name}-{dataset}-r{rounds}-seed{seed}{f'-track{track}' if track else ''}"}
            for name, extra in options.items()}


def train(out: Path, dataset: str, rounds: int, seed: int, track: int = 0) -> dict[str, fl.Run]:
    """Train the three runs of :func:`run_settings` and log each run's convergence.

    A finished run in its folder is reopened.
    """
    runs = {}
    for name, kwargs in run_settings(out, dataset, rounds, seed, track).items():
        log(f"FL run {name} ({kwargs['clients']} clients, {rounds} rounds, Dirichlet {kwargs['alpha']}; "
            "a finished run is reopened)")
        runs[name] = fl.run(**kwargs)
        log(f"{name}: {runs[name].convergence()}")
    return runs


def convergence_rows(runs: dict[str, fl.Run]) -> list[dict[str, Any]]:
    """The training table: final accuracy and loss, and :func:`fl.convergence.assess` per run."""
    rows = []
    for name, run in runs.items():
        c = run.convergence()
        rows.append({"algorithm": name, "final test accuracy": run.metrics[-1]["test_accuracy"],
                     "final test loss": run.metrics[-1]["test_loss"], "converged": "yes" if c.converged else "NO",
                     "slope (acc. points / round)": 100 * c.slope,
                     f"plateau (mean of last {c.window} rounds)": c.plateau})
    return rows


def connectivity_verdicts(pairs: dict[str, dict[str, np.ndarray]], resolution: dict[str, float],
                          converged: bool) -> list[dict[str, Any]]:
    """FedGuCci's claim (Sec. 3.3) that its client models are more connected, per evaluation data.

    Decided by the rule of :mod:`landscape.claims.statistics`: the paired interval of the
    pairwise accuracy barriers (FedGuCci - FedAvg, paired by client pair) decided by ``decide``
    with ``claimed="less"`` and tolerance :data:`TOL`; ``not testable`` when both arms sit at or
    below ``resolution`` (``below_resolution``); no verdict unless both runs converged.
    """
    rows = []
    for e in EVAL_SETS:
        a, b = pairs["fedgucci"][e], pairs["fedavg"][e]
        interval = Interval.paired(a, b)
        verdict = (Outcome.NOT_CONVERGED if not converged
                   else Outcome.NOT_TESTABLE if below_resolution(a, b, resolution[e])
                   else decide(interval, "less", tol=TOL))
        rows.append({"evaluation data": e, "FedGuCci mean pairwise acc barrier": float(a.mean()),
                     "FedAvg mean pairwise acc barrier": float(b.mean()), "resolution": resolution[e],
                     "FedGuCci - FedAvg, 95% CI": str(interval), "pairs": interval.n, "verdict": verdict})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Train the runs, analyse them and write the report; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="report", help="output folder (default: report)")
    parser.add_argument("--dataset", default="mnist1d", choices=sorted(MODELS),
                        help="embedded data set (on digits, client models are already connected)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"FL rounds, at least 2 (default {ROUNDS})")
    parser.add_argument("--resolution", type=int, default=21, help="plane grid points per axis")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--central-epochs", type=int, default=10,
                        help="epochs of central training in the transitivity check")
    parser.add_argument("--track", type=int, default=0, metavar="EVERY",
                        help="record the landscape during training every EVERY rounds (fl.Track; 0: off)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 is fastest for these tiny models")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error(f"--rounds must be at least 2 (convergence is a slope over rounds), got {args.rounds}")
    torch.set_num_threads(max(1, args.threads))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    runs = train(out, args.dataset, args.rounds, args.seed, args.track)
    reference = runs["fedavg"]
    cfg = reference.config
    ev = landscape.Evaluator(reference.module(), tensors(reference.test_dataset()), cache=out / "cache")

    rep = Report(f"Loss landscape of federated models on {args.dataset}",
                 subtitle=f"{cfg['clients']} clients, Dirichlet({cfg['alpha']}) label skew, {args.rounds} rounds, "
                          f"{cfg['local_epochs']} local epochs, SGD lr {cfg['lr']} decayed by {cfg['lr_decay']} "
                          f"per round, {cfg['model']}; seed {args.seed}")

    # -------------------------------------------------------------- training
    log("training curves")
    rep.section("Training", "Global-model test accuracy per round (FL engine, `fl.run`). Converged: the "
                "least-squares slope of the test accuracy over the last 10% of rounds (at least 5) is below "
                "0.1 accuracy points per round (`fl.convergence`); the analyses below are of these models.")
    rep.add_table(convergence_rows(runs))
    rep.add_plotly(fl_curves_plotly({k: r.metrics for k, r in runs.items()}),
                   caption="Test loss and accuracy of the global model.")
    if args.track:
        rep.section("Landscape during training", "Measured while training (fl.Track, docs/tracking.md) on a fixed "
                    "set of training samples: client-to-global and group barriers, top Hessian eigenvalue, Hessian "
                    "trace, L2 sharpness and the spread of the client updates.")
        rep.add_plotly(tracking_plotly({k: r.track() for k, r in runs.items()}),
                       caption="Landscape measures of each run at its tracked rounds.")

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
        rep.add_plotly(barrier_matrix_plotly(matrix, metric="accuracy"),
                       caption=f"{name}: pairwise accuracy barriers among five client models (global test set).")
    rep.add_table(rows)
    pair = {n: pairwise_barrier_values(runs[n], cache=out / "cache") for n in ("fedavg", "fedgucci")}
    grp = {n: group_barriers(runs[n], cache=out / "cache") for n in ("fedavg", "fedgucci")}
    rep.add_text("Which evaluation data? Non-IID client models are individually weak on the global test set, "
                 "so barriers measured there can hide connectivity. Below, the same client models on three "
                 "choices of data: the global test set, the union of the clients' training data, and each "
                 "client's own training data (for a pair, the union of the two clients' data).")
    rep.add_table([{"evaluation data": e, **{f"{n} group acc barrier": grp[n][e] for n in grp}} for e in EVAL_SETS])
    rep.add_text(f"Verdict rule of landscape.claims.statistics (decide): claimed FedGuCci < FedAvg, tolerance {TOL} "
                 "(one accuracy point, as docs/claims.md); reproduced when the 95% t-interval of the paired "
                 "differences lies below 0 and its mean below -tolerance, not reproduced when it lies inside "
                 "[-tolerance, tolerance] or above 0, inconclusive otherwise; not testable when both means sit "
                 "at or below the resolution, one sample's share of the accuracy at the plateau (clients start "
                 "every round from the broadcast model, so converged client models sit close together). "
                 "The replicates are the client pairs "
                 "of the last round, paired by pair (the same two clients and data in both runs); they come "
                 "from one seed and share clients, so this interval is narrower than one over seeds, which "
                 "docs/claims.md gives. A group barrier is one number per run, so it is reported, not decided.")
    converged = all(runs[n].convergence().converged for n in ("fedavg", "fedgucci"))
    rep.add_table(connectivity_verdicts(pair, barrier_resolution(reference), converged))
    rep.add_text(SIGNS)
    rep.add_plotly(path_plotly(paths), caption="Interpolation between two client models.")

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
    rep.add_plotly(path_plotly(pair_paths), caption="Interpolation between the two trained models.")

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
        rep.add_plotly(plane_plotly(result, metric="loss", log_scale=True),
                       caption=f"{name}: test loss on the plane of three client models.")
    rep.add_table(basin_rows)
    clients = runs["fedavg"].client_states(-1)
    basin_verdict = landscape.claims.shared_basin([clients[i] for i in sorted(clients)],
                                                  runs["fedavg"].global_state(-1), ev,
                                                  resolution=args.resolution)
    rep.add_html(basin_verdict._repr_html_())

    # ------------------------------------------------------------ curvature
    log("Hessian spectra and sharpness of the global models")
    rep.section("Sharpness of the global models",
                "Top Hessian eigenvalues (Lanczos, exact Hessian-vector products over the test set), the "
                "spectral density (stochastic Lanczos quadrature) and the worst-case sharpness "
                "max_{||e|| <= rho} L(w + e) - L(w) of the test loss (landscape.sharpness: projected gradient "
                f"ascent, 3 restarts of 20 steps; L2 ball rho = {SHARPNESS_RHO['l2']} in weight units, adaptive L2 "
                f"ball rho = {SHARPNESS_RHO['adaptive']} of each weight). The ascent finds a lower bound on the "
                "maximum; rho^2 lambda_max / 2 is the second-order estimate at a critical point.")
    curv_rows, sharp_rows, densities, l2 = [], [], {}, {}
    for name, run in runs.items():
        glob = run.global_state(-1)
        eig = landscape.hessian_eigenvalues(glob, ev, k=3, seed=args.seed)
        trace = landscape.hessian_trace(glob, ev, seed=args.seed)
        curv_rows.append({"algorithm": name, "lambda_1": float(eig[0]), "lambda_2": float(eig[1]),
                          "lambda_3": float(eig[2]), "trace": trace.value, "trace stderr": trace.stderr})
        densities[name] = landscape.hessian_density(glob, ev, iterations=60, seed=args.seed)
        sharp = {kind: landscape.sharpness(glob, ev, rho=rho, kind=kind, seed=args.seed, bound=kind == "l2")
                 for kind, rho in SHARPNESS_RHO.items()}  # the second-order estimate shown for L2 only
        l2[name] = sharp["l2"]
        sharp_rows.append({"algorithm": name, "test loss L(w)": sharp["l2"].base_loss,
                           f"L2 sharpness (rho {SHARPNESS_RHO['l2']})": sharp["l2"].value,
                           "first order rho ||g||": sharp["l2"].first_order,
                           "rho^2 lambda_max / 2": sharp["l2"].second_order,
                           f"adaptive L2 sharpness (rho {SHARPNESS_RHO['adaptive']})": sharp["adaptive"].value,
                           "adaptive, relative to 1 + L(w) (%)": sharp["adaptive"].relative})
    rep.add_table(curv_rows)
    rep.add_plotly(spectral_density_plotly(densities), caption="Hessian eigenvalue density.")
    rep.add_table(sharp_rows)
    rep.add_plotly(sharpness_plotly(l2, title="L2 sharpness of the global models: projected gradient ascent"),
                   caption=f"L2 sharpness (rho {SHARPNESS_RHO['l2']}): loss increase after each ascent step of each "
                           "restart, the best so far (thick), the sharpness (dashed) and rho^2 lambda_max / 2 "
                           "(dotted).")

    # -------------------------------------------------------- decomposition
    decomposed = ("fedavg", "ima")
    log(f"loss decomposition of {' and '.join(decomposed)} (IMA Theorem 1, {REALISATIONS} realisations per client)")
    rep.section("Bias-variance-covariance decomposition (IMA Theorem 1)",
                "Squared error of softmax outputs against one-hot labels on the union of the client "
                f"training sets. {REALISATIONS} realisations per client: its stored model of the last round "
                f"and {REALISATIONS - 1} more local trainings from the same global model (round R - 1) with "
                "the run's client update and other mini-batch orders, realisation s of every client paired. "
                "Variance and covariance are therefore the spread that the order of the data alone gives "
                "the last round's local training. FMA is the weighted average of the last round's client "
                "models: FedAvg's global model; for IMA the round's plain aggregate, which enters the window "
                "IMA averages (its clients trained from the window average).")
    decs = {}
    for name in decomposed:
        models, datasets = realisations(runs[name], REALISATIONS, out / "realisations")
        decs[name] = landscape.decompose(models, datasets, ev)
    rep.add_table([{"term": t, **{name: float(getattr(d, t)) for name, d in decs.items()}} for t in
                   ("wens_loss", "bias", "train_bias", "heter_bias", "cross", "variance", "covariance",
                    "fma_loss", "gap")])
    rep.add_plotly(decomposition_bars_plotly(decs),
                   caption="Decomposition terms of the last round: WENS loss = bias + variance + covariance, "
                           "bias = train bias + heterogeneity bias + cross; locality is the distance of the "
                           "client models from their average.")

    rep.section("About this run")
    strategy = (f"evaluation strategy {ev.strategy} ({ev.strategy_reason})" if ev.strategy is not None else
                "no evaluation strategy chosen: every point came from the cache")
    rep.add_text(f"Total time {time.time() - started:.0f} s; {strategy}; {ev.points_evaluated} landscape points "
                 "computed in this invocation (cached points are re-read).")
    path = rep.write(out / "index.html")
    log(f"wrote {path} in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
