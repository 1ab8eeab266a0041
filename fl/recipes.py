"""Recipes: the settings of a paper's experiment, each value with its source.

``fl.run(recipe=NAME, ...)`` applies ``RECIPES[NAME].settings`` first; arguments passed
explicitly override them. The run's ``config.json`` records the recipe name and the resolved
values. A recipe is a setting any algorithm can run in: ``fl.run("fedavg", recipe=NAME)``
keeps the data, model, optimiser and partition and drops the options of the recipe's own
algorithm, recorded in ``config.json`` as ``recipe_dropped``.

Two kinds of recipe exist for each paper (FedGuCci, FLOCO, IMA, LSS):

* ``<paper>-<dataset>``: the paper's own experiment (its data set, model and rounds), with
  every value traced to a section or table of the paper or to the authors' code;
* ``<paper>-mnist1d``: the same experiment scaled to the embedded MNIST-1D data (4000
  training signals), so that it runs in seconds to minutes on one CPU core. The paper's
  optimiser settings (learning rate, momentum, weight decay, batch size, local epochs,
  partition parameter, algorithm options) are kept; what had to change is written in
  ``sources`` (``"ours: ..."``) and ``notes``.

Scaling rules of the MNIST-1D recipes (the same for every paper):

* clients: the papers' 50-100 clients would hold 40-80 signals each, so fewer clients
  (numbers below); the partition method and its parameter are the paper's;
* rounds: cut to a tenth to a fifth of the paper's; every round-indexed setting (IMA's start
  round, FLOCO's tau) keeps its fraction of the run;
* per-round learning-rate decay ``gamma``: rescaled so the learning rate falls by the same
  factor over the shortened run as over the paper's, ``1 - (1 - gamma)^(T_paper / T)``;
* model: the MNIST-1D paper's MLP (``mnist1d_mlp``, 15k parameters), about five times
  cheaper per sample than its CNN on one CPU core.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Recipe:
    """The settings of one experiment of a paper.

    Parameters
    ----------
    name : str
        Key of the recipe in :data:`RECIPES`.
    paper : str
        The paper whose experiment this is.
    settings : Mapping[str, Any]
        ``fl.run`` keyword arguments (``algorithm`` and algorithm options included).
    sources : Mapping[str, str]
        Setting -> where its value comes from (a section of the paper, the official code, or
        "ours: ..." for values chosen here).
    notes : str
        Free text: deviations from the paper and why.
    """

    name: str
    paper: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    notes: str = ""


def scaled_decay(gamma: float, paper_rounds: int, rounds: int) -> float:
    """Per-round decay that shrinks the learning rate over ``rounds`` rounds by the factor that
    ``gamma`` gives over ``paper_rounds``: ``1 - (1 - gamma)^(paper_rounds / rounds)``.

    Parameters
    ----------
    gamma : float
        The paper's per-round decay (``lr_r = lr (1 - gamma)^(r - 1)``).
    paper_rounds, rounds : int
        Rounds of the paper's run and of the scaled run.

    Returns
    -------
    float
        The scaled per-round decay, rounded to 4 decimals.
    """
    return round(1.0 - (1.0 - gamma) ** (paper_rounds / rounds), 4)


FEDGUCCI = "FedGuCci: Improving Group Connectivity for Generalization of Federated Deep Learning (KDD 2025)"
FLOCO = "FLOCO: Federated Learning over Connected Modes (NeurIPS 2024)"
IMA = "IMA: Understanding and Improving Model Averaging in Federated Learning on Heterogeneous Data"
LSS = "LSS: Local Superior Soups (NeurIPS 2024)"

_FEDGUCCI_DIR = "FedGuCci Sec. 5.1 (Dirichlet label skew per class, as the official code)"
_IMA_DIR = "IMA Sec. 7.1.1 (Dirichlet label skew of FedLab / NIID-Bench)"
_MNIST1D = {"dataset": "mnist1d", "model": "mnist1d_mlp"}
_MNIST1D_SOURCES = {"dataset": "ours: embedded MNIST-1D instead of the paper's image data",
                    "model": "ours: the MNIST-1D paper's MLP (width 100)"}

_RECIPES = [
    # ------------------------------------------------------------------ FedGuCci
    Recipe(
        "fedgucci-cifar10", FEDGUCCI,
        {"algorithm": "fedgucci", "dataset": "cifar10", "model": "fedgucci_cnn", "clients": 50, "rounds": 150,
         "participation": 1.0, "local_epochs": 3, "batch_size": 64, "lr": 0.04, "momentum": 0.9,
         "weight_decay": 5e-4, "lr_decay": 0.01, "partition": "dirichlet", "alpha": 0.5, "beta": 0.1, "anchors": 1},
        {"dataset": "FedGuCci Table 2", "partition": _FEDGUCCI_DIR, "model": "FedGuCci App. A.5, Table 2 (SimpleCNN)", "clients": "FedGuCci App. A.5 (M = 50)",
         "rounds": "FedGuCci App. A.5 (T = 150 for CIFAR-10)", "participation": "FedGuCci App. A.5 (full)",
         "local_epochs": "FedGuCci App. A.5 (E = 3)", "batch_size": "FedGuCci App. A.5",
         "lr": "FedGuCci App. A.5 (0.04, SGD)", "momentum": "official code (0.9)", "weight_decay": "official code",
         "lr_decay": "official code (lr x 0.99 per round)", "alpha": "FedGuCci Table 2 (Dir 0.5)",
         "beta": "official code (the paper gives none)", "anchors": "official code (N = 1; the paper gives none)"},
        "Table 2's CIFAR-10 column as the paper and its code run it; hours on a GPU."),
    Recipe(
        "fedgucci-mnist1d", FEDGUCCI,
        {"algorithm": "fedgucci", **_MNIST1D, "clients": 10, "rounds": 30, "participation": 1.0, "local_epochs": 3,
         "batch_size": 64, "lr": 0.04, "momentum": 0.9, "weight_decay": 5e-4, "lr_decay": scaled_decay(0.01, 150, 30),
         "partition": "dirichlet", "alpha": 0.5, "beta": 0.1, "anchors": 1},
        {**_MNIST1D_SOURCES, "clients": "ours: 10 (the paper's 50 would hold 80 signals each)",
         "rounds": "ours: scaled from 150 (CIFAR-10) to 30", "participation": "FedGuCci App. A.5 (full)",
         "local_epochs": "FedGuCci App. A.5 (E = 3)", "batch_size": "FedGuCci App. A.5", "lr": "FedGuCci App. A.5",
         "momentum": "official code", "weight_decay": "official code",
         "lr_decay": "ours: official code's 0.01 over 150 rounds rescaled to 30 rounds",
         "partition": _FEDGUCCI_DIR, "alpha": "FedGuCci Table 2 (Dir 0.5)", "beta": "official code",
         "anchors": "official code"},
        "fedgucci-cifar10 on MNIST-1D: 10 clients, 30 rounds, decay rescaled; optimiser and FedGuCci options "
        "unchanged. FedAvg is the same recipe with algorithm='fedavg'."),
    # --------------------------------------------------------------------- FLOCO
    Recipe(
        "floco-cifar10", FLOCO,
        {"algorithm": "floco", "dataset": "cifar10", "model": "floco_cnn", "clients": 100, "rounds": 500,
         "participation": 0.3, "local_epochs": 5, "batch_size": 50, "lr": 0.02, "momentum": 0.5,
         "weight_decay": 1e-5, "partition": "fold", "partition_options": {"folds": 5, "primary_fraction": 0.8},
         "local_test_fraction": 0.2, "vertices": 7, "tau": 100, "rho": 0.1},
        {"dataset": "FLOCO Sec. 4.1", "partition_options": "FLOCO Sec. 4.1 (5 groups, 80%)",
         "model": "FLOCO Sec. 4.1 (SimpleCNN of SuPerFed)", "clients": "FLOCO App. B, Table 6 (K = 100)",
         "rounds": "FLOCO App. B, Table 6 (T = 500)", "participation": "FLOCO Table 6 (30 of 100 per round)",
         "local_epochs": "FLOCO Table 6 (E = 5)", "batch_size": "FLOCO Table 6", "lr": "FLOCO Table 6",
         "momentum": "FLOCO Table 6", "weight_decay": "FLOCO Table 6",
         "partition": "FLOCO Sec. 4.1 (5-Fold, 80% from the group's primary classes)",
         "local_test_fraction": "FLOCO Flower baseline (80/20 local split; the paper gives none)",
         "vertices": "FLOCO App. D (M = 6 is the simplex dimension: 7 vertices)",
         "tau": "FLOCO App. D (tau = 100)", "rho": "FLOCO App. D (rho = 0.1)"},
        "FLOCO's CIFAR-10 5-Fold experiment (Table 1) with the SimpleCNN."),
    Recipe(
        "floco-mnist1d", FLOCO,
        {"algorithm": "floco", **_MNIST1D, "clients": 20, "rounds": 50, "participation": 0.3, "local_epochs": 5,
         "batch_size": 50, "lr": 0.02, "momentum": 0.5, "weight_decay": 1e-5, "partition": "fold",
         "partition_options": {"folds": 5, "primary_fraction": 0.8}, "local_test_fraction": 0.2,
         "vertices": 7, "tau": 10, "rho": 0.1},
        {**_MNIST1D_SOURCES, "clients": "ours: 20 (200 signals each; the paper's 100 would hold 40)",
         "rounds": "ours: scaled from 500 to 50", "participation": "FLOCO Table 6 (30%)",
         "local_epochs": "FLOCO Table 6", "batch_size": "FLOCO Table 6", "lr": "FLOCO Table 6",
         "momentum": "FLOCO Table 6", "weight_decay": "FLOCO Table 6", "partition": "FLOCO Sec. 4.1 (5-Fold)",
         "partition_options": "FLOCO Sec. 4.1 (5 groups, 80%)",
         "local_test_fraction": "FLOCO Flower baseline", "vertices": "FLOCO App. D (M = 6: 7 vertices)",
         "tau": "ours: the paper's 100 of 500 rounds -> 10 of 50",
         "rho": "FLOCO App. D"},
        "floco-cifar10 on MNIST-1D: 20 clients in 5 folds, 50 rounds, tau at the same fraction of the run."),
    # ----------------------------------------------------------------------- IMA
    Recipe(
        "ima-cifar10", IMA,
        {"algorithm": "ima", "dataset": "cifar10", "model": "ima_cnn", "clients": 100, "rounds": 400,
         "participation": 0.1, "local_epochs": 5, "batch_size": 50, "lr": 0.01, "momentum": 0.9, "lr_decay": 0.01,
         "partition": "dirichlet", "alpha": 0.1, "window": 5, "start_round": 300, "decay": 0.03},
        {"dataset": "IMA Table 7", "partition": _IMA_DIR, "model": "IMA Sec. 7.1.2, Table 4 (CNN)", "clients": "IMA Sec. 7.1.3 (100)",
         "rounds": "IMA Table 7 (R = 400)", "participation": "IMA Sec. 7.1.3 (0.1)",
         "local_epochs": "IMA Sec. 7.1.3 (5)", "batch_size": "IMA Sec. 7.1.3 (50)",
         "lr": "IMA Sec. 7.1.3 (SGD 0.01)", "momentum": "IMA Sec. 7.1.3 (0.9)", "lr_decay": "IMA Table 7 (0.01)",
         "alpha": "IMA Table 2 (CIFAR-10, Dir 0.1)", "window": "IMA Table 7 (P = 5)",
         "start_round": "IMA Table 7 (t_s = 300 = 0.75 R)", "decay": "IMA Table 7 (IMA lr decay 0.03)"},
        "IMA Table 1/7, CIFAR-10 CNN, cross-device."),
    Recipe(
        "ima-mnist1d", IMA,
        {"algorithm": "ima", **_MNIST1D, "clients": 40, "rounds": 40, "participation": 0.25, "local_epochs": 5,
         "batch_size": 50, "lr": 0.01, "momentum": 0.9, "lr_decay": scaled_decay(0.01, 400, 40),
         "partition": "dirichlet", "alpha": 0.1, "window": 5, "start_round": 30,
         "decay": scaled_decay(0.03, 400, 40)},
        {**_MNIST1D_SOURCES, "clients": "ours: 40 (100 signals each)",
         "rounds": "ours: scaled from 400 to 40", "participation": "ours: 10 clients per round as in the paper "
         "(0.1 of 100), here 0.25 of 40", "local_epochs": "IMA Sec. 7.1.3", "batch_size": "IMA Sec. 7.1.3",
         "lr": "IMA Sec. 7.1.3", "momentum": "IMA Sec. 7.1.3",
         "lr_decay": "ours: IMA Table 7's 0.01 over 400 rounds rescaled to 40",
         "partition": _IMA_DIR, "alpha": "IMA Table 2 (Dir 0.1)", "window": "IMA Table 7 (P = 5)",
         "start_round": "ours: 0.75 R as in IMA Table 7", "decay": "ours: IMA's 0.03 rescaled like lr_decay"},
        "Cross-device IMA on MNIST-1D: 10 of 40 clients per round, 40 rounds, IMA from round 30."),
    Recipe(
        "ima-mnist1d-full", IMA,
        {"algorithm": "ima", **_MNIST1D, "clients": 10, "rounds": 40, "participation": 1.0, "local_epochs": 5,
         "batch_size": 50, "lr": 0.01, "momentum": 0.9, "lr_decay": scaled_decay(0.01, 400, 40),
         "partition": "dirichlet", "alpha": 0.1, "window": 5, "start_round": 30,
         "decay": scaled_decay(0.03, 400, 40)},
        {**_MNIST1D_SOURCES, "clients": "IMA Table 6 cross-silo (10 clients)",
         "rounds": "ours: scaled from 400 to 40", "participation": "IMA Table 6 cross-silo (full)",
         "local_epochs": "IMA Sec. 7.1.3", "batch_size": "IMA Sec. 7.1.3", "lr": "IMA Sec. 7.1.3",
         "momentum": "IMA Sec. 7.1.3", "lr_decay": "ours: IMA Table 7's 0.01 over 400 rounds rescaled to 40",
         "partition": _IMA_DIR, "alpha": "IMA Table 2 (Dir 0.1)", "window": "IMA Table 7 (P = 5)",
         "start_round": "ours: 0.75 R as in IMA Table 7", "decay": "ours: IMA's 0.03 rescaled like lr_decay"},
        "Cross-silo IMA on MNIST-1D (10 clients, full participation), otherwise as ima-mnist1d."),
    # ----------------------------------------------------------------------- LSS
    Recipe(
        "lss-cifar10", LSS,
        {"algorithm": "lss", "dataset": "cifar10", "model": "resnet18_gn", "clients": 5, "rounds": 3,
         "participation": 1.0, "local_epochs": 8, "batch_size": 64, "lr": 5e-4, "weight_decay": 5e-4,
         "partition": "dirichlet", "alpha": 1.0, "optimizer": "adam", "members": 4, "affinity": 3.0,
         "diversity": 3.0, "distance": "l2"},
        {"dataset": "LSS Table 1", "partition": "LSS Sec. 4.1 (Dirichlet label shift)",
         "model": "ours: ResNet-18 with GroupNorm (the paper fine-tunes an ImageNet-pretrained timm ResNet-18)",
         "clients": "LSS Sec. 4.1 (5 clients)", "rounds": "LSS Table 1 (R = 3)",
         "participation": "LSS Sec. 3.1 (cross-silo, all clients)", "local_epochs": "LSS App. E.1 (8 epochs per model)",
         "batch_size": "LSS App. E.1 (64)", "lr": "LSS App. E.1 (Adam 5e-4)", "weight_decay": "LSS App. E.1",
         "alpha": "LSS Sec. 4.1 (Dir 1.0)", "optimizer": "LSS App. E.1 (Adam)", "members": "LSS App. C (N = 4)",
         "affinity": "LSS App. E.1 (lambda_a = 3)", "diversity": "LSS App. E.1 (lambda_d = 3)",
         "distance": "LSS Eq. 3-4 as printed (unsquared L2)"},
        "The paper's literal setting. Its lambda = 3 with unsquared distances is meant for a pretrained model; on "
        "a randomly initialised one the regularisers dominate (see fl.algorithms.lss)."),
    Recipe(
        "lss-mnist1d", LSS,
        {"algorithm": "lss", **_MNIST1D, "clients": 5, "rounds": 3, "participation": 1.0, "local_epochs": 8,
         "batch_size": 64, "lr": 5e-4, "weight_decay": 5e-4, "partition": "dirichlet", "alpha": 1.0,
         "optimizer": "adam", "members": 4},
        {**_MNIST1D_SOURCES, "clients": "LSS Sec. 4.1", "rounds": "LSS Table 1 (R = 3)",
         "participation": "LSS Sec. 3.1", "local_epochs": "LSS App. E.1", "batch_size": "LSS App. E.1",
         "lr": "LSS App. E.1 (Adam 5e-4)", "weight_decay": "LSS App. E.1", "alpha": "LSS Sec. 4.1 (Dir 1.0)",
         "partition": "LSS Sec. 4.1 (Dirichlet label shift)", "optimizer": "LSS App. E.1",
         "members": "LSS App. C (N = 4)"},
        "lss-cifar10 on MNIST-1D from a random initialisation; nothing needed scaling (3 rounds of 5 clients). "
        "The regulariser form and coefficients are the algorithm's defaults (a formulation that trains from "
        "scratch), not the paper's lambda = 3 on unsquared distances."),
]

#: name -> recipe
RECIPES: Mapping[str, Recipe] = {r.name: r for r in _RECIPES}
