"""Every FL algorithm of the engine on one digits partition: accuracy, connectivity, flatness.

All algorithms train from the same initial model on the same partition (Dirichlet 0.5 by
default) with the same local budget. For each one the table gives the final and best
global test accuracy, the personalised (local) accuracy where the algorithm has one
(FLOCO), the group barrier of the last round's client models around their uniform
average (FedGuCci Definition 3.6, Eq. 9/10, on the global test set; the property
FedGuCci aims at), the top Hessian eigenvalue of the global model on the test set
(flatness, the property LSS and FedGuCci+'s SAM aim at) and the training time.
Figures: the test curves and the client group barrier against the group size K.

Converged: the first table records :func:`fl.convergence.assess` of every run. Measured once
(seed 0, the defaults): at 80 rounds every algorithm's test accuracy has a slope below 0.1
points per round over the last 8 rounds and its plateau is within 0.01 of the plateau of a
160-round run (FedAvg 0.965 / 0.966, FedProx 0.965 / 0.966, FedGuCci 0.967 / 0.967, FedGuCci+
0.969 / 0.974, FLOCO 0.948 / 0.956, LSS 0.966 / 0.967, IMA 0.967 / 0.966). At the former
default of 20 rounds they were 0.025-0.07 below it.

    python examples/compare_algorithms.py
    python examples/compare_algorithms.py --algorithms fedavg fedgucci ima
"""
from __future__ import annotations

import argparse
import sys
import time

import landscape
from figures import fl_curves_figure, fl_curves_plotly, group_size_figure, group_size_plotly

from _common import Example, report_convergence, run_fl, test_evaluator

#: Options of each algorithm in this comparison (the engine's defaults otherwise).
ALGORITHMS: dict[str, dict] = {
    "fedavg": {},
    "fedprox": {"mu": 0.01},
    "fedgucci": {"beta": 1.0},
    "fedgucci+": {"beta": 1.0},
    "floco": {"vertices": 3},
    "lss": {"members": 3, "affinity": 0.1, "diversity": 0.1},  # see lss_flatness.py on the coefficients
    "ima": {},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this example's options to ``parser``."""
    parser.add_argument("--algorithms", nargs="+", choices=sorted(ALGORITHMS), default=list(ALGORITHMS))
    parser.add_argument("--rounds", type=int, default=80)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9, help="client SGD momentum")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration")
    parser.add_argument("--draws", type=int, default=3, help="random client subsets per group size K")
    parser.add_argument("--max-iter", type=int, default=100, help="Lanczos steps for the top eigenvalue")


def main(argv: list[str] | None = None) -> int:
    """Run the example; the exit status."""
    ex = Example("compare_algorithms", __doc__.splitlines()[0], argv, add_arguments)
    a = ex.args
    if ex.quick:
        a.rounds, a.clients, a.draws, a.max_iter = 2, 3, 2, 15
        a.algorithms = [n for n in a.algorithms if n in ("fedavg", "fedgucci", "ima")]
    common = dict(clients=a.clients, rounds=a.rounds, local_epochs=a.local_epochs, lr=a.lr, momentum=a.momentum,
                  partition="dirichlet", alpha=a.alpha)
    runs, seconds = {}, {}
    for name in a.algorithms:
        started = time.time()
        runs[name] = run_fl(ex, name, name.replace("+", "plus"), **ALGORITHMS[name], **common)
        seconds[name] = time.time() - started
    report_convergence(ex, runs)
    ev = test_evaluator(runs[a.algorithms[0]])

    rows, by_size = [], {}
    for name, run in runs.items():
        ex.log(f"{name}: client group barriers and top Hessian eigenvalue")
        clients = run.client_states(-1)
        models = [clients[k] for k in sorted(clients)]
        group = landscape.group_barrier(models, ev)
        sizes = landscape.group_barrier_by_size(models, ev, draws=a.draws, seed=ex.seed)
        by_size[name] = {int(k): list(row) for k, row in zip(sizes.sizes, sizes.accuracy_barrier)}
        top = landscape.hessian_eigenvalues(run.global_state(-1), ev, k=1, seed=ex.seed, max_iter=a.max_iter)
        accs = [m["test_accuracy"] for m in run.metrics]
        local = run.metrics[-1].get("local_accuracy")
        rows.append({"algorithm": name, "final acc (%)": 100 * accs[-1], "best acc (%)": 100 * max(accs),
                     "final test loss": run.metrics[-1]["test_loss"],
                     "local acc (%)": None if local is None else 100 * local,
                     "mean client acc (%)": 100 * float(group.member_accuracy.mean()),
                     "client group acc barrier": group.accuracy_barrier,
                     "client group loss barrier": group.loss_barrier, "lambda_max (test)": float(top[0]),
                     "train time (s)": seconds[name]})
    ex.table(f"All algorithms on digits (Dirichlet {a.alpha}, {a.clients} clients, {a.rounds} rounds)", rows,
             note="client group barriers: the last round's client models around their uniform average "
                  "(Eq. 9/10, global test set); lambda_max: top Hessian eigenvalue of the global model's "
                  "test loss; train time: wall clock of fl.run (about 1 s when a finished run in --out is reopened).")
    curves = {k: r.metrics for k, r in runs.items()}
    ex.save("fl_curves", fl_curves_figure(curves), fl_curves_plotly(curves))
    ex.save("client_group_barrier_vs_k", group_size_figure(by_size, title="Client group accuracy barrier vs K"),
            group_size_plotly(by_size, title="Client group accuracy barrier vs K"))
    best = max(rows, key=lambda r: r["final acc (%)"])
    ex.log(f"best final accuracy: {best['algorithm']} ({best['final acc (%)']:.1f}%); "
           f"lowest group barrier: {min(rows, key=lambda r: r['client group acc barrier'])['algorithm']}; "
           f"flattest: {min(rows, key=lambda r: r['lambda_max (test)'])['algorithm']}")
    return ex.finish()


if __name__ == "__main__":
    sys.exit(main())
