"""FedGuCci Sec. 3 on MNIST-1D (or digits): transitivity of linear mode connectivity (central training).

Protocol (FedGuCci Sec. 3.1, docs/methods/fedgucci.md): an anchor is trained with plain cross-entropy;
then a pool of models, each from its OWN random initialisation, is trained twice with the
same initialisation and data order: vanilla (cross-entropy) and with the connectivity
loss to the fixed anchor (Eq. 8: ``CE(w) + beta * CE(alpha w + (1 - alpha) w_anc)``,
``alpha ~ U[0, 1]`` drawn per mini-batch, the one-sample Monte-Carlo estimate of Eq. 7).
The models never see each other. Outputs:

* Table 1: Ind. Acc. ``(A(w1) + A(w2)) / 2``, Fused Acc. ``A((w1 + w2) / 2)``, Acc. Barrier
  (Eq. 4, max over 21 alphas), loss barrier (Eq. 3), mean +- std over disjoint pairs of the
  pool, and the relative barrier reduction.
* Figure 2: accuracy and loss along w1-anchor, w2-anchor and w1-w2, vanilla vs connectivity.
* Figure 3: test loss on the plane through three models of each pool (Garipov
  construction, w1 at the origin), their centroid placed in it; basin analysis.
* Figure 4: group barrier (Eq. 10, uniform centroid) against the group size K.
* Weak anchors (ICLR Table 7 / KDD Table 9): the same two-model protocol with an untrained
  (random-init) anchor and a briefly trained ("semi-trained") anchor.

Training is :class:`fl.central.Trainer`'s. Converged: every model trains 20 epochs with the
learning rate cosine-annealed to 0 (as the claims run's central step,
``paper_claims.transitivity``), and the first table records :func:`fl.convergence.assess` of
vanilla model 0's per-epoch test accuracy. Measured for seeds 0-4 in the claims run: plateaus
0.927-0.942, the slope below 0.1 points per epoch on four seeds (seed 2: +0.15); training for 40
epochs changes it by -0.5 to +2.3 points. A constant learning rate (the former default, 10
epochs) left the models 3-9 points short of a run twice as long.

    python examples/transitivity.py                    # MNIST-1D: several minutes on one idle CPU core
    python examples/transitivity.py --dataset digits   # digits: models are connected even without the loss
    python examples/transitivity.py --quick      # seconds; smoke test
"""
from __future__ import annotations

import argparse
import sys
from typing import Mapping

import numpy as np
import torch

import landscape
from figures import group_size_figure, group_size_plotly, path_figure, path_plotly, plane_figure, plane_plotly
from fl.central import SCHEDULES, Trainer
from fl.datasets import load_dataset
from fl.models import default_model

from _common import Example, accuracy_tracker, average, connecting_level, mean_std, report_epochs

State = Mapping[str, torch.Tensor]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add this example's options to ``parser``."""
    parser.add_argument("--dataset", default="mnist1d", choices=("mnist1d", "digits"),
                        help="embedded data set (on digits, models from different inits are already connected)")
    parser.add_argument("--model", default=None, help="zoo model (default: the data set's default model)")
    parser.add_argument("--epochs", type=int, default=20, help="training epochs of every model")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (momentum 0.9)")
    parser.add_argument("--schedule", choices=SCHEDULES, default="cosine",
                        help="learning-rate schedule: cosine annealing to 0 over the epochs, or constant")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--beta", type=float, default=1.0, help="weight of the connectivity loss (Eq. 8)")
    parser.add_argument("--pool", type=int, default=8, help="models per training mode (largest group size K)")
    parser.add_argument("--trials", type=int, default=3, help="disjoint model pairs behind Table 1")
    parser.add_argument("--semi-steps", type=int, default=20,
                        help="SGD steps of the semi-trained anchor (the paper trains it for 1 epoch of CIFAR-10)")
    parser.add_argument("--resolution", type=int, default=21, help="plane grid points per axis")
    parser.add_argument("--alphas", type=int, default=21, help="interpolation points of a path")
    parser.add_argument("--draws", type=int, default=5, help="random subsets per group size K")


def pair_row(label: str, paths: list[landscape.PathResult], ev: landscape.Evaluator,
             pairs: list[tuple[State, State]], anchor: State | None, baseline: float | None) -> dict:
    """One row of Table 1 / the weak-anchor table from the w1-w2 paths of several pairs."""
    ind = [0.5 * (p.accuracy[0] + p.accuracy[-1]) for p in paths]
    fused = [float(p.accuracy[np.argmin(np.abs(p.alphas - 0.5))]) for p in paths]
    acc_b = [p.accuracy_barrier for p in paths]
    loss_b = [p.loss_barrier for p in paths]
    row = {"training": label}
    row["Ind. Acc. (%)"], row["Ind. Acc. std"] = (100 * v for v in mean_std(ind))
    if anchor is not None:
        mids = [average([w, anchor]) for pair in pairs for w in pair]
        row["A(w_anc) (%)"] = 100 * float(ev.evaluate([anchor]).accuracy[0])
        row["A((w_anc+w)/2) (%)"] = 100 * float(np.mean(ev.evaluate(mids).accuracy))
    else:
        row["A(w_anc) (%)"] = row["A((w_anc+w)/2) (%)"] = None
    row["Fused Acc. (%)"], row["Fused Acc. std"] = (100 * v for v in mean_std(fused))
    row["Acc. Barrier"], row["Acc. Barrier std"] = mean_std(acc_b)
    row["Loss Barrier"] = float(np.mean(loss_b))
    row["reduction (%)"] = None if baseline is None else 100 * (baseline - row["Acc. Barrier"]) / baseline
    return row


def main(argv: list[str] | None = None) -> int:
    """Run the example; the exit status."""
    ex = Example("transitivity", __doc__.splitlines()[0], argv, add_arguments)
    a = ex.args
    if ex.quick:
        a.epochs, a.pool, a.trials, a.resolution, a.alphas, a.draws, a.semi_steps = 2, 3, 1, 5, 5, 2, 4
    if a.pool < max(3, 2 * a.trials):
        raise SystemExit(f"--pool must be at least max(3, 2 * --trials) = {max(3, 2 * a.trials)}")
    data = load_dataset(a.dataset)
    trainer = Trainer(data.train_x, data.train_y, data.input_shape, a.epochs, a.lr, a.batch_size, ex.seed,
                      model=a.model or default_model(a.dataset), schedule=a.schedule)
    ev = landscape.Evaluator(trainer.init("template"), (data.test_x, data.test_y), progress=False)

    ex.log(f"training the anchor and {a.pool} models per mode ({a.epochs} epochs, {a.schedule} lr, beta {a.beta})")
    anchor = trainer.train("anchor")
    keys = [f"model {i}" for i in range(a.pool)]
    records, track = accuracy_tracker(trainer.init("template"), data.test_x, data.test_y)
    first = trainer.train(keys[0], on_epoch=lambda epoch, module: track(epoch, float("nan"), module.state_dict()))
    report_epochs(ex, f"{trainer.model}, vanilla model 0", records)
    pools = {"vanilla": [first] + [trainer.train(k) for k in keys[1:]],
             "connectivity": [trainer.train(k, anchor=anchor, beta=a.beta) for k in keys]}
    pairs = [(2 * t, 2 * t + 1) for t in range(a.trials)]

    # ------------------------------------------------------------------ Table 1
    ex.log("Table 1: paths between the pairs")
    paths = {mode: [landscape.interpolate(pool[i], pool[j], ev, alphas=a.alphas) for i, j in pairs]
             for mode, pool in pools.items()}
    vanilla = pair_row("vanilla CE", paths["vanilla"], ev, [], None, None)
    rows = [vanilla, pair_row("w/ connectivity loss", paths["connectivity"], ev,
                              [(pools["connectivity"][i], pools["connectivity"][j]) for i, j in pairs],
                              anchor, vanilla["Acc. Barrier"])]
    table1 = [{k: v for k, v in r.items() if not k.startswith("A(")} for r in rows]
    ex.table(f"Table 1 ({a.dataset}, {trainer.model}, {a.trials} pairs from different inits): two models, with and "
             "without the connectivity loss", table1,
             note=f"Anchor test accuracy {100 * float(ev.evaluate([anchor]).accuracy[0]):.1f}%. Barriers: "
                  "Eq. 4 (accuracy, relative) and Eq. 3 (loss), max over the alpha grid; "
                  "reduction = (B_vanilla - B_conn) / B_vanilla.")

    # ----------------------------------------------------------------- Figure 2
    ex.log("Figure 2: interpolation paths")
    w1, w2 = pairs[0]
    to_anchor = {f"{mode}: w{i + 1} - anchor": landscape.interpolate(pools[mode][m], anchor, ev, alphas=a.alphas)
                 for mode in pools for i, m in enumerate((w1, w2))}
    between = {f"{mode}: w1 - w2": paths[mode][0] for mode in pools}
    ex.save("fig2a_model_anchor_paths",
            path_figure(to_anchor, endpoint_labels=("w", "anchor"), title="Trained model to anchor"),
            path_plotly(to_anchor, title="Trained model to anchor"))
    ex.save("fig2b_model_model_paths",
            path_figure(between, endpoint_labels=("w1", "w2"), title="Between two trained models"),
            path_plotly(between, title="Between two trained models"))
    ex.table("Figure 2: barriers along the paths",
             [{"path": name, "acc barrier": p.accuracy_barrier, "loss barrier": p.loss_barrier,
               "acc at midpoint (%)": 100 * float(p.accuracy[np.argmin(np.abs(p.alphas - 0.5))])}
              for name, p in {**to_anchor, **between}.items()])

    # ----------------------------------------------------------------- Figure 3
    ex.log(f"Figure 3: planes through three models ({a.resolution}x{a.resolution})")
    plane_rows = []
    for mode, pool in pools.items():
        trio = pool[:3]
        centroid = average(trio)
        grid = landscape.plane(*trio, ev, resolution=a.resolution, labels=("w1", "w2", "w3"),
                               extra={"average": centroid})
        found = landscape.basin(grid, models=["w1", "w2", "w3"])
        group = landscape.group_barrier(trio, ev)
        joined = connecting_level(grid.loss, found.cells)
        plane_rows.append({"training": mode, "mean member loss": float(group.member_loss.mean()),
                           "centroid loss": group.fused_loss, "group loss barrier": group.loss_barrier,
                           "group acc barrier": group.accuracy_barrier, "common basin": found.common,
                           "sublevel components": found.num_components, "level": found.level,
                           "connecting level": joined, "excess over level": joined - found.level,
                           "anchor off-plane distance": grid.project(anchor)[2]})
        title = f"{mode}: test loss on the plane of three models"
        ex.save(f"fig3_plane_{mode}", plane_figure(grid, metric="loss", log_scale=True, title=title),
                plane_plotly(grid, metric="loss", log_scale=True, title=title))
    ex.table("Figure 3: three models trained against one anchor", plane_rows,
             note="common basin: w1, w2, w3 lie in one connected component of {L <= level}, level = the "
                  "highest grid loss at the three models; connecting level: the lowest level at which they "
                  "do (minimax loss of a grid path joining them).")

    # ----------------------------------------------------------------- Figure 4
    ex.log("Figure 4: group barrier against K")
    sizes = list(range(2, a.pool + 1))
    by_size = {mode: landscape.group_barrier_by_size(pool, ev, sizes=sizes, draws=a.draws, seed=ex.seed)
               for mode, pool in pools.items()}
    series = {mode: {int(k): list(row) for k, row in zip(r.sizes, r.accuracy_barrier)} for mode, r in by_size.items()}
    ex.save("fig4_group_barrier_vs_k", group_size_figure(series, title="Group accuracy barrier vs K"),
            group_size_plotly(series, title="Group accuracy barrier vs K"))
    ex.table("Figure 4: group accuracy barrier (Eq. 10) vs K, mean over random subsets",
             [{"K": k, **{f"{mode} mean": float(np.mean(series[mode][k])) for mode in pools},
               **{f"{mode} std": mean_std(series[mode][k])[1] for mode in pools}} for k in sizes])

    # ------------------------------------------------------------- weak anchors
    ex.log("weak anchors: random-init and semi-trained")
    weak = {"random-init anchor": {k: v.clone() for k, v in trainer.init("random anchor").state_dict().items()},
            "semi-trained anchor": trainer.train("semi anchor", steps=a.semi_steps)}
    weak_rows = [vanilla, rows[1] | {"training": "trained anchor"}]
    for label, weak_anchor in weak.items():
        trained = {i: trainer.train(keys[i], anchor=weak_anchor, beta=a.beta) for pair in pairs for i in pair}
        weak_pairs = [(trained[i], trained[j]) for i, j in pairs]
        weak_paths = [landscape.interpolate(p, q, ev, alphas=a.alphas) for p, q in weak_pairs]
        weak_rows.append(pair_row(label, weak_paths, ev, weak_pairs, weak_anchor, vanilla["Acc. Barrier"]))
    columns = ("training", "Ind. Acc. (%)", "A(w_anc) (%)", "A((w_anc+w)/2) (%)", "Fused Acc. (%)",
               "Acc. Barrier", "Acc. Barrier std", "reduction (%)")
    ex.table("Weak anchors (ICLR Table 7 / KDD Table 9 columns)", [{c: r[c] for c in columns} for r in weak_rows],
             note="A((w_anc+w)/2): midpoint of each trained model and the anchor, mean over both models of "
                  "every pair. Semi-trained anchor: " f"{a.semi_steps} SGD steps.")
    return ex.finish()


if __name__ == "__main__":
    sys.exit(main())
