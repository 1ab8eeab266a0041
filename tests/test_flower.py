"""A short Flower simulation (3 clients, 2 rounds, digits) recorded by fl.flower and reopened by fl.load_run.

Needs the ``flower`` extra, which ``make install`` puts in the main environment.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr", reason="Flower is not installed: pip install -c constraints.txt '.[flower]'")

import fl  # noqa: E402
import landscape  # noqa: E402
from fl.flower import PARTITION_KEY, FlowerRecorder, RecordingStrategy  # noqa: E402
from landscape.claims.verdict import STATUSES  # noqa: E402

CLIENTS, ROUNDS = 3, 2


def client_app(run_dir: Path) -> "flwr.client.ClientApp":
    """Clients train one epoch of SGD on their partition, read from the run folder."""
    from flwr.client import ClientApp, NumPyClient

    class DigitsClient(NumPyClient):
        def __init__(self, k: int):
            self.k = k
            run = fl.load_run(run_dir)
            self.module, self.data = run.module(), run.client_datasets()[k]

        def fit(self, parameters, config):
            torch.set_num_threads(1)
            state = dict(zip(self.module.state_dict(), (torch.as_tensor(p) for p in parameters)))
            self.module.load_state_dict(state)
            opt = torch.optim.SGD(self.module.parameters(), lr=0.1)
            gen = torch.Generator().manual_seed(1000 * int(config.get("round", 0)) + self.k)
            loader = torch.utils.data.DataLoader(self.data, batch_size=32, shuffle=True, generator=gen)
            total = 0.0
            self.module.train()
            for x, y in loader:
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(self.module(x), y)
                loss.backward()
                opt.step()
                total += float(loss) * len(y)
            arrays = [t.detach().numpy() for t in self.module.state_dict().values()]
            return arrays, len(self.data), {PARTITION_KEY: self.k, "train_loss": total / len(self.data)}

    def client_fn(context):
        return DigitsClient(int(context.node_config["partition-id"])).to_client()

    return ClientApp(client_fn=client_fn)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    out = tmp_path_factory.mktemp("flower") / "run"
    recorder = FlowerRecorder(out, dataset="digits", clients=CLIENTS, rounds=ROUNDS, seed=0, save_clients="all")
    strategy = RecordingStrategy(FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=CLIENTS,
                                        min_available_clients=CLIENTS), recorder)

    def server_fn(context):
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=ROUNDS))

    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=client_app(out), num_supernodes=CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})
    return out


def test_flower_run_opens_with_load_run(recorded: Path) -> None:
    run = fl.load_run(recorded)
    assert run.complete and run.rounds == list(range(ROUNDS + 1))
    assert [m["round"] for m in run.metrics] == list(range(ROUNDS + 1))
    assert all(np.isfinite(m["test_loss"]) and 0 <= m["test_accuracy"] <= 1 for m in run.metrics)
    assert run.metrics[-1]["test_accuracy"] > run.metrics[0]["test_accuracy"]  # two rounds of training helped
    assert "train_loss" in run.metrics[1]


def test_global_model_is_the_weighted_average_of_the_recorded_clients(recorded: Path) -> None:
    run = fl.load_run(recorded)
    sizes = {k: len(d) for k, d in run.client_datasets().items()}
    for r in (1, ROUNDS):
        clients = run.client_states(r)
        assert sorted(clients) == list(range(CLIENTS))
        total = sum(sizes.values())
        for key, value in run.global_state(r).items():
            mean = sum(sizes[k] / total * clients[k][key].double() for k in clients)
            torch.testing.assert_close(value.double(), mean, rtol=1e-5, atol=1e-6)  # FedAvg (McMahan et al. Eq. 1)


def test_claims_run_on_the_flower_run(recorded: Path) -> None:
    run = fl.load_run(recorded)
    ev = landscape.Evaluator(run.module(), run.test_dataset())
    verdict = landscape.claims.shared_basin(run.client_states(), run.global_state(), ev, resolution=5, alphas=3)
    assert verdict.status in STATUSES
    assert set(verdict.numbers)  # computed from the recorded models


def test_recorder_refuses_a_recorded_folder(recorded: Path) -> None:
    with pytest.raises(landscape.ConfigError, match="already holds"):
        FlowerRecorder(recorded, dataset="digits", clients=CLIENTS, rounds=ROUNDS, seed=0, save_clients="all")


def test_landscape_report_on_the_flower_run(recorded: Path, tmp_path: Path, capsys) -> None:
    from landscape_cli.main import main

    code = main(["report", "--run", str(recorded), "--out", str(tmp_path / "report"), "--resolution", "5",
                 "--alphas", "5", "--no-cache", "--quiet"])
    assert code == 0, capsys.readouterr().err[-2000:]
    page = (tmp_path / "report" / "index.html").read_text()
    assert "Shared basin" in page and "Group barrier" in page
