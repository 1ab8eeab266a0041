"""Message-API Flower runs: a recorded ``flwr.serverapp`` FedAvg, and the papers' algorithms on Flower.

Each module fixture runs one real Flower simulation (Ray back end, one virtual SuperNode per
client). The ``ServerApp`` builds its recorder or strategy inside ``main`` from the run
configuration, as ``flwr run`` requires. ``run_simulation`` passes no run configuration of its
own, so the tests hand ``main`` the configuration a ``pyproject.toml`` table would give.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr", reason="Flower is not installed: pip install -c constraints.txt '.[flower]'")

import fl  # noqa: E402
import landscape  # noqa: E402
import landscape.alignment  # noqa: E402, F401 - the server process registers the aligner fedavg_aligned uses
from fl.flower import AlgorithmStrategy, FlowerRecorder, RecordedStrategy, client_app, partition_metrics  # noqa: E402

CLIENTS, ROUNDS = 3, 2
BACKEND = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
           "init_args": {"num_cpus": 2, "include_dashboard": False}}
#: the same float32 operations in another order (Ray workers may use other thread counts) differ
#: by about 1e-7 relative; two rounds of a few dozen SGD steps amplify that to well below 1e-5
EQUAL_ATOL, EQUAL_RTOL = 1e-5, 1e-4


def simulate(server_main, client) -> None:
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    server = ServerApp()
    server.main()(server_main)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # run_simulation: `flwr run` needs an app folder
        run_simulation(server_app=server, client_app=client, num_supernodes=CLIENTS, backend_config=BACKEND)


def user_client_app():
    """A user's own ClientApp: one epoch of SGD on its partition, read from the recorded folder."""
    from flwr.app import ArrayRecord, Message, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg, context):
        torch.set_num_threads(1)
        k = int(context.node_config["partition-id"])
        run = fl.load_run(Path(context.run_config.get("fl.run-dir", "") or RUN_DIRS["fedavg"]))
        module, data = run.module(), run.client_datasets()[k]
        module.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(1000 * int(msg.content["config"]["server-round"]) + k)
        total = 0.0
        module.train()
        for x, y in torch.utils.data.DataLoader(data, batch_size=32, shuffle=True, generator=gen):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(module(x), y)
            loss.backward()
            opt.step()
            total += float(loss) * len(y)
        content = RecordDict({"arrays": ArrayRecord(module.state_dict()),
                              "metrics": partition_metrics(context, len(data), train_loss=total / len(data))})
        return Message(content, reply_to=msg)

    return app


RUN_DIRS: dict[str, Path] = {}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A flwr.serverapp FedAvg run (3 SuperNodes, 2 rounds) recorded by RecordedStrategy."""
    from flwr.serverapp.strategy import FedAvg

    out = tmp_path_factory.mktemp("flower-msg") / "run"
    RUN_DIRS["fedavg"] = out
    run_config = {"fl.run-dir": str(out), "fl.dataset": "digits", "fl.clients": CLIENTS, "fl.rounds": ROUNDS,
                  "fl.seed": 0, "fl.save-clients": "all", "fraction-train": 1.0}

    def main(grid, context):
        recorder = FlowerRecorder.from_run_config({**context.run_config, **run_config})
        strategy = RecordedStrategy(FedAvg(fraction_train=float(run_config["fraction-train"]),
                                           fraction_evaluate=0.0, min_train_nodes=CLIENTS,
                                           min_available_nodes=CLIENTS), recorder)
        strategy.start(grid, num_rounds=ROUNDS)

    simulate(main, user_client_app())
    return out


def test_recorded_message_api_run_opens(recorded: Path) -> None:
    run = fl.load_run(recorded)
    assert run.complete and run.rounds == list(range(ROUNDS + 1))
    assert [m["round"] for m in run.metrics] == list(range(ROUNDS + 1))
    assert run.metrics[-1]["test_accuracy"] > run.metrics[0]["test_accuracy"]
    assert "train_loss" in run.metrics[1]
    assert (recorded / "flower.json").read_text().count("FedAvg") == 1


def test_recorded_global_is_the_weighted_average_of_recorded_clients(recorded: Path) -> None:
    run = fl.load_run(recorded)
    sizes = {k: len(d) for k, d in run.client_datasets().items()}
    total = sum(sizes.values())
    for r in range(1, ROUNDS + 1):
        clients = run.client_states(r)
        assert sorted(clients) == list(range(CLIENTS))  # partition ids, not node ids
        for key, value in run.global_state(r).items():
            mean = sum(sizes[k] / total * clients[k][key].double() for k in clients)
            torch.testing.assert_close(value.double(), mean, rtol=1e-5, atol=1e-6)  # McMahan et al. Eq. 1


def test_report_and_claims_on_the_recorded_run(recorded: Path, tmp_path: Path, capsys) -> None:
    from landscape_cli.main import main

    run = fl.load_run(recorded)
    ev = landscape.Evaluator(run.module(), run.test_dataset())
    verdict = landscape.claims.shared_basin(run.client_states(), run.global_state(), ev, resolution=5, alphas=3)
    assert verdict.status.decided and set(verdict.numbers)
    code = main(["report", "--run", str(recorded), "--out", str(tmp_path / "report"), "--resolution", "5",
                 "--alphas", "5", "--no-cache", "--quiet"])
    assert code == 0, capsys.readouterr().err[-2000:]
    assert "Shared basin" in (tmp_path / "report" / "index.html").read_text()


#: name -> settings; the algorithm is the name unless the settings give one (a robust aggregator on
#: Flower: the strategy runs the engine's round, so its aggregation is fl.run's)
ALGORITHMS = {"fedavg": {}, "fedgucci": {"beta": 0.5}, "ima": {"window": 2, "start_round": 2},
              "fedprox": {"mu": 0.01}, "floco": {"tau": 1, "vertices": 3}, "lss": {"members": 2},
              "ditto": {}, "fedavg-median": {"algorithm": "fedavg", "aggregator": "median", "clip_norm": 5.0},
              "fedavg_aligned": {"passes": 2}}
SETTINGS = dict(dataset="digits", clients=CLIENTS, rounds=ROUNDS, seed=3, local_epochs=1, save_clients="all")


@pytest.fixture(scope="module")
def on_flower(tmp_path_factory) -> dict[str, Path]:
    """Each algorithm of ALGORITHMS trained by AlgorithmStrategy, all in one Flower simulation."""
    root = tmp_path_factory.mktemp("flower-alg")
    outs = {name: root / name for name in ALGORITHMS}

    def main(grid, context):
        for name, options in ALGORITHMS.items():
            config = {"fl.algorithm": name, "fl.run-dir": str(outs[name]),
                      **{f"fl.{k.replace('_', '-')}": v for k, v in {**SETTINGS, **options}.items()}}
            AlgorithmStrategy.from_run_config({**context.run_config, **config}).start(grid)

    simulate(main, client_app())
    return outs


@pytest.fixture(scope="module")
def on_engine(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine-alg")
    torch.set_num_threads(1)
    return {name: fl.run(**{"algorithm": name, **options}, out=root / name, progress=False, **SETTINGS).path
            for name, options in ALGORITHMS.items()}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_flower_run_equals_fl_run(name: str, on_flower, on_engine) -> None:
    flower, engine = fl.load_run(on_flower[name]), fl.load_run(on_engine[name])
    assert flower.config == engine.config  # the same run, stored in the same format
    assert flower.rounds == engine.rounds == list(range(ROUNDS + 1))
    worst = 0.0
    for r in flower.rounds:
        a, b = flower.global_state(r), engine.global_state(r)
        for key in a:
            torch.testing.assert_close(a[key], b[key], atol=EQUAL_ATOL, rtol=EQUAL_RTOL)
            worst = max(worst, float((a[key].double() - b[key].double()).abs().max()))
        if r:
            assert sorted(flower.client_states(r)) == sorted(engine.client_states(r))
    print(f"{name}: largest |flower - fl.run| over every global tensor and round: {worst:.2e}")
    m_f, m_e = flower.metrics[-1], engine.metrics[-1]
    assert np.isclose(m_f["test_accuracy"], m_e["test_accuracy"], atol=2 / 360)  # at most a couple of test digits


def test_ima_on_flower_broadcasts_the_window_mean(on_flower) -> None:
    run = fl.load_run(on_flower["ima"])
    window = run.algorithm_state(ROUNDS)
    rounds = window["ima.rounds"].tolist()
    assert len(rounds) == 2
    for key, value in run.global_state(ROUNDS).items():
        if value.is_floating_point():
            mean = sum(window[f"ima.window.{i}.{key}"].double() for i in range(2)) / 2  # IMA Eq. 5
            torch.testing.assert_close(value.double(), mean, rtol=1e-6, atol=1e-7)


def test_fedgucci_on_flower_keeps_its_anchor(on_flower) -> None:
    run = fl.load_run(on_flower["fedgucci"])
    state = run.algorithm_state(ROUNDS)
    assert state["fedgucci.anchor_rounds"].tolist() == [ROUNDS - 1]  # Eq. 11 with N = 1
    anchor = {k[len("fedgucci.anchor.0."):]: v for k, v in state.items() if k.startswith("fedgucci.anchor.0.")}
    for key, value in run.global_state(ROUNDS - 1).items():
        torch.testing.assert_close(anchor[key], value)


def test_floco_projects_through_the_federation(on_flower) -> None:
    state = fl.load_run(on_flower["floco"]).algorithm_state(1)
    assert state["floco.points"].shape[0] == CLIENTS  # subregions from probes trained on the SuperNodes


@pytest.mark.parametrize("name", ["fedavg", "fedgucci", "ima"])
def test_claims_run_on_the_flower_algorithm_runs(name: str, on_flower) -> None:
    run = fl.load_run(on_flower[name])
    ev = landscape.Evaluator(run.module(), run.test_dataset())
    verdict = landscape.claims.shared_basin(run.client_states(), run.global_state(), ev, resolution=5, alphas=3)
    assert set(verdict.numbers)
