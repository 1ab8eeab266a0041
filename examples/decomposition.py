"""IMA Sec. 5 on digits: the global model's loss decomposed over rounds (Theorem 1).

Two FedAvg runs on the paper's cross-silo setting (10 clients, full participation, #C = 2
class shards per client, SGD with momentum 0.9), one with a constant client learning rate
and one with round-exponential decay ``lr_r = lr (1 - gamma)^(r - 1)`` (docs/methods/ima.md,
IMA Sec. 5.3, Figs. 2-4). Every ``--decompose-every`` rounds (and the first and last), from that
round's client checkpoints and data:

* Theorem 1 terms over the union D of the client data (softmax outputs vs one-hot
  targets, squared L2): bias = TrainBias + HeterBias + cross, and variance and covariance
  over ``--realisations`` realisations per client (its stored model and retrainings from the
  same global model with other mini-batch orders, :func:`fl.realisations.realisations`), the
  FMA (weight-averaged) model's loss and its gap to the ensemble (Lemma 1's O(Delta^2)),
  and locality ``Delta_k = |w_k - w_FMA|`` (claims C5-C8);
* the test error of the weight average of m random client models against m at three
  rounds (Fig. 4, claim C9).

Converged: the first table records :func:`fl.convergence.assess` of both runs. Measured once
(seed 0, the defaults): at 120 rounds both slopes are below 0.1 points per round and the plateaus
are within 0.01 of a 240-round run's (constant lr 0.955 / 0.965, decay 0.914 / 0.914; the decay
arm's learning rate is near 0 by then).

    python examples/decomposition.py
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

import numpy as np
from scipy.stats import spearmanr

from figures import averaging_figure, averaging_plotly, decomposition_figure, decomposition_plotly
from fl.realisations import realisations
from landscape import averaging_curve, decompose

from _common import Example, report_convergence, run_fl, test_evaluator

TERMS = ("fma_loss", "wens_loss", "gap", "bias", "train_bias", "heter_bias", "cross", "variance", "covariance")


def at_least(low: int, why: str) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``low`` (``why`` says what needs it)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low} ({why}), got {value}")
        return value
    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this example's options to ``parser``."""
    parser.add_argument("--rounds", type=int, default=120)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--decay", type=float, default=0.05,
                        help="per-round lr decay gamma of the decay arm (the paper: 0.01 over 400 rounds)")
    parser.add_argument("--print-every", type=int, default=20, help="rounds between printed table rows")
    parser.add_argument("--decompose-every", type=at_least(1, "a step between rounds"), default=4,
                        help="rounds between decomposed rounds (the first and last are always decomposed)")
    parser.add_argument("--subsets", type=int, default=10, help="random subsets per m for the averaging curve")
    parser.add_argument("--realisations", type=at_least(2, "variance and covariance need two"), default=5,
                        help="realisations per client (the stored model and retrainings; at least 2 for a variance)")


def correlation(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman rank correlation, None with fewer than three points or a constant series."""
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(spearmanr(x, y).statistic)


def main(argv: list[str] | None = None) -> int:
    """Run the example; the exit status."""
    ex = Example("decomposition", __doc__.splitlines()[0], argv, add_arguments)
    a = ex.args
    if ex.quick:
        a.rounds, a.clients, a.local_epochs, a.print_every, a.subsets, a.realisations = 3, 4, 1, 1, 3, 2
        a.decompose_every = 1
    common = dict(clients=a.clients, rounds=a.rounds, local_epochs=a.local_epochs, lr=a.lr, momentum=a.momentum,
                  partition="shards")
    arms = {"no lr decay": run_fl(ex, "fedavg", "no_decay", **common),
            f"lr decay {a.decay:g}": run_fl(ex, "fedavg", "decay", lr_decay=a.decay, **common)}
    report_convergence(ex, arms)
    ev = test_evaluator(next(iter(arms.values())))
    rounds = sorted({*range(a.decompose_every, a.rounds + 1, a.decompose_every), 1, a.rounds})

    summary = []
    for arm, run in arms.items():
        ex.log(f"{arm}: decomposing {len(rounds)} rounds")
        decs = [(r, decompose(*realisations(run, a.realisations, ex.out / "realisations", round=r), ev))
                for r in rounds]
        error = np.array([1 - run.metrics[r]["test_accuracy"] for r in rounds])  # metrics[0] is round 0
        rows = []
        for (r, d), e in zip(decs, error):
            if r % a.print_every and r != rounds[-1]:
                continue
            rows.append({"round": r, "test error (%)": 100 * e, **{t: float(getattr(d, t)) for t in TERMS},
                         "max locality": d.max_locality, "mean locality": float(np.mean(d.locality))})
        ex.table(f"Theorem 1 terms over rounds, {arm}", rows,
                 note=f"Means over D of squared errors of softmax outputs; {a.realisations} realisations per "
                      "client (realisation s of every client paired); wens_loss = bias + variance + covariance, "
                      "bias = train_bias + heter_bias + cross.")
        slug = "no_decay" if arm == "no lr decay" else "decay"
        title = f"Loss decomposition of the global model, {arm}"
        ex.save(f"decomposition_{slug}", decomposition_figure(decs, title=title),
                decomposition_plotly(decs, title=title))
        bias = np.array([d.bias for _, d in decs])
        heter = np.array([d.heter_bias for _, d in decs])
        train = np.array([d.train_bias for _, d in decs])
        delta = np.array([d.max_locality for _, d in decs])
        gap = np.array([d.gap for _, d in decs])
        late = np.array(rounds) > a.rounds // 3
        ok = (gap != 0) & (delta > 0)
        slope = float(np.polyfit(np.log(delta[ok] ** 2), np.log(np.abs(gap[ok])), 1)[0]) if ok.sum() >= 3 else None
        summary.append({"arm": arm, "final test error (%)": 100 * error[-1],
                        "mean train_bias / bias": float(np.mean(train / bias)),
                        "mean heter_bias / bias": float(np.mean(heter / bias)),
                        "spearman(heter_bias, error) early": correlation(heter[~late], error[~late]),
                        "spearman(heter_bias, error) late": correlation(heter[late], error[late]),
                        "spearman(locality, error) late": correlation(delta[late], error[late]),
                        "final max locality": float(delta[-1]),
                        "log-log slope abs(gap) vs Delta^2": slope})
    ex.table("Claims C5-C8 per arm", summary,
             note=f"early = rounds <= {a.rounds // 3}, late = the rest; slope: least-squares fit of log|FMA - "
                  "WENS loss gap| on log(max locality^2) over rounds (Lemma 1: |gap| = O(Delta^2)).")

    # -------------------------------------------------- error vs number of averaged models
    run = arms["no lr decay"]
    at = sorted({max(1, a.rounds // 3), max(1, 2 * a.rounds // 3), a.rounds})
    curves = {}
    for r in at:
        clients = run.client_states(r)
        ids = sorted(clients)
        sizes = [len(d) for d in (run.client_datasets()[k] for k in ids)]
        curves[f"round {r}"] = averaging_curve([clients[k] for k in ids], ev, weights=sizes,
                                               subsets=a.subsets, seed=ex.seed)
    ex.table("Test error (%) of the average of m random client models (no lr decay; IMA Fig. 4)",
             [{"m": int(m), **{name: 100 * float(c.error_mean[i]) for name, c in curves.items()}}
              for i, m in enumerate(next(iter(curves.values())).sizes)])
    ex.save("error_vs_averaged_models", averaging_figure(curves), averaging_plotly(curves))
    return ex.finish()


if __name__ == "__main__":
    sys.exit(main())
