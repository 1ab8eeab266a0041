"""A Flower federation with a hostile and a silent client trains on without them, within its timeout.

One real Flower simulation (Ray back end, 4 SuperNodes) of FedAvg through
:class:`fl.flower.AlgorithmStrategy` with ``bad_clients="drop"``: the node of partition 1 answers
every round with a model whose first tensor has the wrong shape, the node of partition 2 does not
answer within the round timeout. Every round is stored with both clients dropped and the reasons
recorded, the global models are the sample-weighted means of the two honest clients, and no process
of the simulation is left behind.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr", reason="Flower is not installed: pip install -c constraints.txt '.[flower]'")
psutil = pytest.importorskip("psutil")

import fl  # noqa: E402
from fl.flower import AlgorithmStrategy, partition_id, train_reply  # noqa: E402

CLIENTS, ROUNDS, ROUND_TIMEOUT, SILENCE = 4, 2, 8.0, 20.0
SETTINGS = {"fl.algorithm": "fedavg", "fl.dataset": "digits", "fl.clients": CLIENTS, "fl.rounds": ROUNDS,
            "fl.seed": 2, "fl.local-epochs": 1, "fl.save-clients": "all", "fl.bad-clients": "drop",
            "fl.round-timeout": ROUND_TIMEOUT}


def hostile_app():
    """The client app of ``fl``, except that partition 1 sends a (1,)-shaped tensor and partition 2 is silent."""
    from flwr.app import ArrayRecord
    from flwr.clientapp import ClientApp

    wrapped = ClientApp()
    wrapped.query()(lambda message, context: _query(message, context))

    @wrapped.train()
    def train(message, context):
        k = partition_id(context)
        if k == 2:
            time.sleep(SILENCE)
        reply = train_reply(message, context)
        if k == 1:
            state = reply.content["state"].to_torch_state_dict()
            first = next(iter(state))
            state[first] = torch.zeros(1)
            reply.content["state"] = ArrayRecord(state)
        return reply

    return wrapped


def _query(message, context):
    from flwr.app import Message, MetricRecord, RecordDict

    return Message(RecordDict({"partition": MetricRecord({"partition-id": partition_id(context)})}),
                   reply_to=message)


@pytest.fixture(scope="module")
def federation(tmp_path_factory) -> tuple[Path, float, list[int]]:
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    out = tmp_path_factory.mktemp("hostile") / "run"
    server = ServerApp()

    @server.main()
    def main(grid, context):
        AlgorithmStrategy.from_run_config({**context.run_config, **SETTINGS, "fl.run-dir": str(out)}).start(grid)

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    start = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        run_simulation(server_app=server, client_app=hostile_app(), num_supernodes=CLIENTS,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": 4, "include_dashboard": False}})
    took = time.monotonic() - start
    started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    _, left = psutil.wait_procs(started, timeout=60)  # Ray's workers exit after run_simulation returns
    return out, took, [p.pid for p in left]


def test_rounds_complete_with_both_clients_dropped_and_recorded(federation) -> None:
    out, took, left = federation
    print(f"simulation took {took:.1f} s")
    run = fl.load_run(out)
    assert run.complete and run.rounds == list(range(ROUNDS + 1))
    for record in run.metrics[1:]:
        assert record["clients"] == [0, 3] and record["dropped"] == [1, 2]
        assert "has shape (1,)" in record["dropped_reasons"][0]
        assert f"no reply within {ROUND_TIMEOUT:g} s" in record["dropped_reasons"][1]
        assert record["time"] < ROUND_TIMEOUT + 30  # the round waited for the timeout, not for the silent client
    assert not left, f"processes of the simulation still running: {left}"


def test_the_global_model_averages_the_honest_clients_only(federation) -> None:
    run = fl.load_run(federation[0])
    sizes = {k: len(d) for k, d in run.client_datasets().items()}
    for r in range(1, ROUNDS + 1):
        clients = run.client_states(r)
        assert sorted(clients) == [0, 3]  # the refused models were never stored
        total = sizes[0] + sizes[3]
        for key, value in run.global_state(r).items():
            mean = sum(sizes[k] / total * clients[k][key].double() for k in (0, 3))
            torch.testing.assert_close(value.double(), mean, rtol=1e-5, atol=1e-6)  # McMahan et al. Eq. 1
