"""The landscape during federated training: FedAvg and FedGuCci on MNIST-1D, tracked with ``fl.Track``.

Trains FedAvg and FedGuCci in the ``fedgucci-mnist1d`` recipe (10 clients, Dirichlet(0.5), the
MNIST-1D CNN) with ``track=fl.Track(every=...)`` for three seeds each, then reads the measures back
with ``Run.track()``: each client's barrier to the global model and the clients' group barrier
(FedGuCci Eq. 3 and 9), the global model's top Hessian eigenvalue, Hessian trace and L2 sharpness,
and the spread of the client updates, on a fixed set of training samples. Prints the last tracked
round of each run, the cost of tracking against the run's training time, and draws the measures
over the rounds with the seeds as bands (``figures.tracking_figure``). The first table is each
run's ``fl.convergence``, which says whether the runs still learn at the last round: the
trajectory, not the end point, is what this example shows.

Defaults: the recipe's 150 rounds, the default cadence (``every=10``), seeds 0 to 2.

    python examples/tracking.py              # the table and figure of docs/tracking.md
    python examples/tracking.py --quick      # a smoke test, seconds
    python examples/tracking.py --doc        # rewrite docs/tracking.md's table and figure from this run
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import fl
from figures import tracking_figure, tracking_plotly

from _common import Example, report_convergence
from _docs import add_doc_option, conditions, doc_refusal, markdown_table, publish

TITLE = "Last tracked round (mean over seeds)"
COST = "Cost of tracking"
ALGORITHMS = ("fedavg", "fedgucci")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this example's options to ``parser``."""
    parser.add_argument("--recipe", default="fedgucci-mnist1d", help="fl.RECIPES key (FedAvg runs it too)")
    parser.add_argument("--rounds", type=int, default=150, help="FL rounds (the recipe's 150)")
    parser.add_argument("--seeds", type=int, default=3, help="run seeds per algorithm (the figure's bands)")
    parser.add_argument("--every", type=int, default=10, help="fl.Track(every=...), the default cadence")
    add_doc_option(parser, "tracking.md")


def page_parts(payload: dict) -> dict[str, str]:
    """The parts of docs/tracking.md that ``--doc`` writes: how it was made, and the two tables.

    Parameters
    ----------
    payload : dict
        The example's ``tables.json`` (as stored in ``docs/data/tracking.json``).

    Returns
    -------
    dict[str, str]
        ``{"table": Markdown}``.
    """
    a = payload["args"]
    made = (f"Made with `.venv/bin/python examples/tracking.py --doc` (its defaults: recipe `{a['recipe']}` for "
            f"{a['rounds']} rounds, `fl.Track(every={a['every']})`, seeds 0 to {a['seeds'] - 1}): "
            f"{conditions(payload)}.")
    return {"table": "\n\n".join([made, markdown_table(payload["tables"][TITLE]),
                                  markdown_table(payload["tables"][COST])])}


def main(argv: list[str] | None = None) -> int:
    """Run the example; the exit status."""
    ex = Example("tracking", __doc__.splitlines()[0], argv, add_arguments)
    a = ex.args
    refusal = doc_refusal(a, ex.parser)
    if refusal:
        ex.log(refusal)
        return 2
    rounds, every = (2, 1) if ex.quick else (a.rounds, a.every)
    track = fl.Track(every=every, **({"samples": 64, "iterations": 5, "probes": 3} if ex.quick else {}))
    quick = {"clients": 4, "local_epochs": 1} if ex.quick else {}
    tables: dict[str, list] = {}
    rows, cost, trained = [], [], {}
    for name in ALGORITHMS:
        runs = []
        for seed in range(ex.seed, ex.seed + a.seeds):
            ex.log(f"{name}, seed {seed}: {rounds} rounds, tracked every {every} (a finished run is reopened)")
            runs.append(fl.run(name, recipe=a.recipe, rounds=rounds, seed=seed, track=track, save_clients="none",
                               progress=False, out=ex.out / "runs" / f"{name}-r{rounds}-every{every}-seed{seed}",
                               **quick))
        trained.update({f"{name} seed {seed}": r for seed, r in zip(range(ex.seed, ex.seed + a.seeds), runs)})
        tables[name] = [r.track() for r in runs]
        last = {c: float(np.mean([t[c][-1] for t in tables[name]])) for c in tables[name][0].columns[1:]}
        rows.append({"algorithm": name, "round": int(tables[name][0]["round"][-1]),
                     "test acc": float(np.mean([r.metrics[-1]["test_accuracy"] for r in runs])),
                     **{k: v for k, v in last.items() if k not in ("time", "trace_stderr", "max_client_barrier")}})
        train = float(np.mean([sum(m["time"] for m in r.metrics) for r in runs]))
        measured = float(np.mean([np.nansum(t["time"]) for t in tables[name]]))
        cost.append({"algorithm": name, "tracked rounds": len(tables[name][0]), "training s": train,
                     "tracking s": measured, "added (%)": 100 * measured / train})
    report_convergence(ex, trained)
    ex.table(TITLE, rows, note="client barriers: mean over the round's clients; update cosine: mean over pairs.")
    ex.table(COST, cost, note="training s: the rounds' recorded times (without tracking); tracking s: the time "
                              "spent measuring, the first tracked round included (it loads the analysis core)")
    ex.save("tracking", tracking_figure(tables, title=f"{a.recipe}: {rounds} rounds, {a.seeds} seeds"),
            tracking_plotly(tables))
    status = ex.finish()
    if a.doc:
        for path in publish("tracking", ex.out, page_parts, "tracking.md", figures=["tracking.png"]):
            ex.log(f"wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
