"""Defaults that train.

With no recipe and no option, every algorithm reaches 0.6 test accuracy on digits after 4
rounds (5 clients, Dirichlet 0.5, seed 0). The 20-round target (0.85) is measured by
``benchmarks/default_accuracy.py``.
"""
from __future__ import annotations

import pytest

import fl
from fl.config import RunConfig

ALGORITHMS = ("fedavg", "fedprox", "fedgucci", "fedgucci+", "floco", "floco+", "lss", "ima")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_defaults_reach_the_four_round_target(tmp_path, algorithm) -> None:
    run = fl.run(algorithm, dataset="digits", clients=5, rounds=4, partition="dirichlet", alpha=0.5, seed=0,
                 out=tmp_path / algorithm, save_clients="none", progress=False)
    assert run.config["momentum"] == RunConfig().momentum  # nothing but the defaults
    accuracy = [m["test_accuracy"] for m in run.metrics]
    assert accuracy[0] < 0.2 and accuracy[-1] >= 0.6, accuracy
