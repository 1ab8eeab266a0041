"""Landscape tracking on Flower: AlgorithmStrategy records fl.run's table, RecordedStrategy tracks any strategy.

Needs the ``flower`` extra. Flower trains the same models as ``fl.run`` to float32 reordering
(``tests/test_flower_messages.py``), so the tables agree to a tolerance; a recorded strategy's
measures equal the core's functions on its stored checkpoints.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr", reason="Flower is not installed: pip install -c constraints.txt '.[flower]'")

import fl  # noqa: E402
import landscape  # noqa: E402
from fl.datasets import load_dataset  # noqa: E402
from fl.flower import AlgorithmStrategy, FlowerRecorder, RecordedStrategy, client_app  # noqa: E402

from test_flower_messages import CLIENTS, RUN_DIRS, simulate, user_client_app  # noqa: E402

TRACK = fl.Track(every=1, samples=64, points=3, iterations=4, probes=2, steps=2)
SETTINGS = dict(dataset="digits", clients=CLIENTS, rounds=2, seed=3, local_epochs=1, save_clients="all")


def test_algorithm_strategy_records_the_table_of_fl_run(tmp_path: Path) -> None:
    out = tmp_path / "flower"
    simulate(lambda grid, context: AlgorithmStrategy("fedavg", out=out, track=TRACK, **SETTINGS).start(grid),
             client_app())
    torch.set_num_threads(1)
    engine = fl.run("fedavg", out=tmp_path / "engine", progress=False, track=TRACK, **SETTINGS).track()
    flower = fl.load_run(out).track()
    assert flower["round"].tolist() == engine["round"].tolist() == [0, 1, 2]
    assert np.array_equal(flower.samples, engine.samples)
    for name in [*flower.columns[1:], "client_barrier"]:
        if name != "time":
            np.testing.assert_allclose(flower[name], engine[name], rtol=1e-3, atol=1e-4, err_msg=name)


def test_recorded_strategy_tracks_any_flower_strategy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.serverapp.strategy import FedAvg

    out = tmp_path / "recorded"
    monkeypatch.setitem(RUN_DIRS, "fedavg", out)  # where the user's clients read their data
    run_config = {"fl.run-dir": str(out), "fl.dataset": "digits", "fl.clients": CLIENTS, "fl.rounds": 2,
                  "fl.seed": 0, "fl.save-clients": "last", "fl.track": '{"every": 2, "samples": 64, "points": 3, '
                  '"iterations": 4, "probes": 2, "steps": 2}'}

    def main(grid, context):
        recorder = FlowerRecorder.from_run_config({**context.run_config, **run_config})
        RecordedStrategy(FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=CLIENTS,
                                min_available_nodes=CLIENTS), recorder).start(grid, num_rounds=2)

    simulate(main, user_client_app())
    run = fl.load_run(out)
    table = run.track()
    assert table["round"].tolist() == [0, 2] and run.metrics[2]["clients"] == list(range(CLIENTS))
    bundle = load_dataset("digits")
    ev = landscape.Evaluator(run.module(), (bundle.train_x[table.samples], bundle.train_y[table.samples]),
                             device="cpu", progress=False, strategy="loop")
    for k, state in run.client_states(2).items():
        path = landscape.interpolate(state, run.global_state(2), ev, alphas=3)
        assert table.client_barrier[1, k] == path.loss_barrier
    assert table["group_barrier"][1] == landscape.group_barrier(list(run.client_states(2).values()), ev).loss_barrier
