"""Bad Flower set-ups get one clear line, before anything is trained or written.

The grid and the replies are stand-ins with the attributes ``fl.flower`` reads (Flower's own
``Message`` can only be built inside a running app).
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install -c constraints.txt '.[flower]'")

from flwr.app import Context, RecordDict  # noqa: E402

import fl  # noqa: E402
from fl.flower import (  # noqa: E402
    AlgorithmStrategy,
    FederationError,
    FlowerRecorder,
    RecordedStrategy,
    client_models,
    find_partitions,
    partition_id,
    partition_metrics,
    settings_from_run_config,
)
from fl.flower.payload import read_updates  # noqa: E402
from fl.flower.replies import screen_replies  # noqa: E402
from landscape import ConfigError  # noqa: E402

from fault_counts import tally  # noqa: E402


def reply(node: int, metrics: dict | None = None, error: str | None = None) -> SimpleNamespace:
    """A stand-in reply from ``node`` with a MetricRecord (or an error)."""
    records = {"partition": metrics} if metrics is not None else {}
    return SimpleNamespace(has_error=lambda: error is not None, error=SimpleNamespace(reason=error or ""),
                           content=SimpleNamespace(metric_records=records, array_records={}),
                           metadata=SimpleNamespace(src_node_id=node))


class Grid:
    """A stand-in grid whose nodes answer the partition query with the given ids."""

    def __init__(self, partitions: list[int]):
        self.partitions = partitions

    def get_node_ids(self) -> list[int]:
        return [100 + i for i in range(len(self.partitions))]

    def send_and_receive(self, messages, timeout):
        return [reply(100 + i, {"partition-id": k}) for i, k in enumerate(self.partitions)]


@pytest.fixture(autouse=True)
def no_message_construction(monkeypatch):
    """find_partitions builds query messages; outside a running app they are plain namespaces."""
    import fl.flower.nodes as nodes

    monkeypatch.setattr(nodes, "Message", lambda **kw: SimpleNamespace(**kw))


def test_the_federation_must_hold_each_partition_once() -> None:
    assert find_partitions(Grid([2, 0, 1]), 3, timeout=1) == {0: 101, 1: 102, 2: 100}
    with pytest.raises(FederationError, match=r"after 0.1 s only 2 of the 3 SuperNodes .* options.num-supernodes = 3"):
        find_partitions(Grid([0, 1]), 3, timeout=0.1)
    with pytest.raises(FederationError, match=r"partition id 1 is held twice \(nodes 101 and 102\)"):
        find_partitions(Grid([0, 1, 1]), 3, timeout=1)
    for bad in (7, -3, 1.9, True, "1", 10 ** 30):
        with pytest.raises(FederationError, match=r"node 102's partition id .* is not an integer in 0\.\.2"):
            find_partitions(Grid([0, 1, bad]), 3, timeout=1)
    silent = Grid([0, 1, 2])
    silent.send_and_receive = lambda messages, timeout: [reply(100, {"partition-id": 0}),
                                                         reply(101, {"partition-id": 1})]  # one timed out
    with pytest.raises(FederationError, match=r"nodes \[102\] did not answer the partition query within 1 s"):
        find_partitions(silent, 3, timeout=1)
    mute = Grid([0, 1, 2])
    mute.send_and_receive = lambda messages, timeout: [reply(100 + i, {}) for i in range(3)]  # no partition record
    with pytest.raises(FederationError, match="node 100 answered the partition query without a 'partition-id'"):
        find_partitions(mute, 3, timeout=1)
    tally("bad inputs rejected", 11)


def test_replies_without_partition_ids_or_with_errors_are_named() -> None:
    with pytest.raises(ConfigError, match="lacks 'partition-id'.*partition_metrics"):
        client_models([reply(5, {"num-examples": 3})])
    updates, refused = read_updates([reply(5, error="Traceback ...\nValueError: boom")], {0: 5}, 3, 60)
    assert not updates and refused == {0: "its ClientApp failed: ValueError: boom"}
    updates, refused = read_updates([], {0: 5, 1: 6}, 3, 60)
    assert refused == {k: "no reply within 60 s (the round timeout, fl.round-timeout)" for k in (0, 1)}
    tally("bad inputs rejected", 3)


def test_run_configuration_and_node_configuration_mistakes() -> None:
    with pytest.raises(ConfigError, match="no fl.run-dir"):
        settings_from_run_config({"fl.dataset": "digits"})
    context = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ConfigError, match="no 'partition-id' in its node config"):
        partition_metrics(context, 10)
    for bad in (1.9, True, "1", -3, 10 ** 30):
        context = Context(run_id=1, node_id=2, node_config={"partition-id": bad}, state=RecordDict(), run_config={})
        with pytest.raises(ConfigError, match=r"this SuperNode's partition-id .* is not an integer in 0\.\."):
            partition_id(context)
    context = Context(run_id=1, node_id=2, node_config={"partition-id": 2.0}, state=RecordDict(), run_config={})
    assert partition_id(context) == 2  # a TOML float with an integral value is that integer
    tally("bad inputs rejected", 7)


def test_start_refuses_rounds_and_initial_models_that_contradict_the_run(tmp_path) -> None:
    from flwr.serverapp.strategy import FedAvg

    recorder = FlowerRecorder(tmp_path / "recorded", dataset="digits", clients=2, rounds=3)
    with pytest.raises(ConfigError, match="num_rounds=5 but the recorder's run has rounds=3"):
        RecordedStrategy(FedAvg(), recorder).start(Grid([0, 1]), num_rounds=5)
    assert not list((tmp_path / "recorded").glob("global/*"))  # nothing recorded
    strategy = AlgorithmStrategy("fedavg", out=tmp_path / "alg", dataset="digits", clients=2, rounds=3)
    with pytest.raises(ConfigError, match="takes its initial model from the run configuration"):
        strategy.start(Grid([0, 1]), initial_arrays=object())
    with pytest.raises(ConfigError, match="num_rounds=5 but the run has rounds=3"):
        strategy.start(Grid([0, 1]), num_rounds=5)
    assert not (tmp_path / "alg" / "global").exists()
    tally("bad inputs rejected", 3)


def train_reply(node: int, state: dict, metrics: dict, arrays: int = 1) -> SimpleNamespace:
    """A stand-in training reply of a user's ClientApp: one ArrayRecord and one MetricRecord."""
    import torch  # noqa: F401
    from flwr.app import ArrayRecord, MetricRecord

    records = {f"arrays{i}": ArrayRecord(state) for i in range(arrays)}
    content = RecordDict({**records, "metrics": MetricRecord(metrics)})
    return SimpleNamespace(has_error=lambda: False, error=None, content=content,
                           metadata=SimpleNamespace(src_node_id=node))


def test_a_recorded_strategy_checks_every_reply_before_the_wrapped_strategy_sees_it(tmp_path) -> None:
    import torch
    from flwr.serverapp.strategy import FedAvg

    from fl.flower import ClientRefused

    recorder = FlowerRecorder(tmp_path / "run", dataset="digits", clients=3, rounds=2, bad_clients="drop")
    sent = recorder.initial_state()
    strategy = RecordedStrategy(FedAvg(), recorder)
    strategy.sent = sent
    recorder.record(0, sent)
    honest = {k: train_reply(100 + k, {n: t + 0.01 * (k + 1) for n, t in sent.items()},
                             {"partition-id": k, "num-examples": 10 * (k + 1), "train_loss": 0.5}) for k in range(3)}
    first = next(iter(sent))
    hostile = {
        "shape": ({first: torch.zeros(1)}, {}, "has shape (1,)"),
        "bool": ({first: torch.ones_like(sent[first], dtype=torch.bool)}, {}, "has dtype bool"),
        "extra": ({"spy": torch.zeros(3)}, {}, "does not have ('spy')"),
        "zero examples": ({}, {"num-examples": 0}, "num-examples 0 is not an integer in 1.."),
        "float examples": ({}, {"num-examples": 2.5}, "num-examples 2.5"),
        "fractional id": ({}, {"partition-id": 1.9}, "the partition id 1.9"),
        "id out of range": ({}, {"partition-id": 7}, "the partition id 7 is not an integer in 0..2"),
        "huge id": ({}, {"partition-id": 10 ** 30}, "the partition id 100000000000..."),
        "server field": ({}, {"test_accuracy": 1.0}, "metric 'test_accuracy' is a field the server writes"),
        "round": ({}, {"round": 77.0}, "metric 'round' is a field the server writes"),
    }
    for name, (state_change, metric_change, reason) in hostile.items():
        bad = train_reply(101, {**{n: t + 0.02 for n, t in sent.items()}, **state_change},
                          {"partition-id": 1, "num-examples": 20, "train_loss": 0.5, **metric_change})
        kept, models, refused = screen_replies([honest[0], bad, honest[2]], sent, 3)
        assert [m.metadata.src_node_id for m in kept] == [100, 102] and sorted(models) == [0, 2], name
        (why,) = refused.values()
        assert reason in why, (name, why)
    duplicate = train_reply(101, dict(sent), {"partition-id": 0, "num-examples": 5, "train_loss": 0.5})
    assert screen_replies([honest[0], duplicate], sent, 3)[2] == {
        "0": "2 replies claim partition 0; every SuperNode needs its own partition-id"}
    two = train_reply(101, dict(sent), {"partition-id": 1, "num-examples": 5}, arrays=2)
    assert "holds 2 ArrayRecords" in screen_replies([two], sent, 3)[2]["1"]
    no_metrics = SimpleNamespace(has_error=lambda: False, content=RecordDict({}),
                                 metadata=SimpleNamespace(src_node_id=9))
    assert screen_replies([no_metrics], sent, 3)[2] == {"on node 9": "the reply holds 0 MetricRecords; it must hold "
                                                                     "one, with 'partition-id' and 'num-examples'"}
    # drop: the round aggregates the honest clients and records the refused one
    bad = train_reply(101, {**sent, first: torch.zeros(1)}, {"partition-id": 1, "num-examples": 20, "train_loss": 0.5})
    strategy.aggregate_train(1, [honest[0], bad, honest[2]])
    run_metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert run_metrics[1]["dropped"] == [1] and "has shape (1,)" in run_metrics[1]["dropped_reasons"][0]
    for key, value in fl.load_run(tmp_path / "run").global_state(1).items():
        mean = (10 * (sent[key] + 0.01) + 30 * (sent[key] + 0.03)) / 40  # FedAvg of clients 0 and 2
        torch.testing.assert_close(value, mean.to(value.dtype))
    # stop: the refusal names the client and the round, and nothing of the round is written
    recorder.config["bad_clients"] = "stop"
    with pytest.raises(ClientRefused, match=r"round 2: the update of client 1 is refused: .*has shape \(1,\)"):
        strategy.aggregate_train(2, [honest[0], bad, honest[2]])
    assert not recorder.store.global_path(2).exists()
    tally("bad inputs rejected", len(hostile) + 4)


def test_the_legacy_recording_strategy_checks_every_fit_result(tmp_path) -> None:
    import numpy as np
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.server.strategy import FedAvg as LegacyFedAvg

    from fl.flower import ClientRefused, RecordingStrategy

    recorder = FlowerRecorder(tmp_path / "run", dataset="digits", clients=3, rounds=2, bad_clients="drop")
    strategy = RecordingStrategy(LegacyFedAvg(), recorder)
    initial = strategy.initialize_parameters(client_manager=None)
    strategy.sent = recorder.initial_state()  # what configure_fit keeps of ``initial``
    assert [a.tolist() for a in recorder.initial_arrays()] == [t.tolist() for t in strategy.sent.values()]
    assert initial is not None
    arrays = recorder.initial_arrays()

    def result(k, change=None, n=10, metrics=None):
        sent = [a + 0.01 * (k + 1) for a in arrays] if change is None else change
        fit = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(sent), n, {"partition_id": k, **(metrics or {})})
        return SimpleNamespace(cid=str(100 + k)), fit

    hostile = {
        "shape": (dict(change=[np.zeros(1, dtype=np.float32), *arrays[1:]]), "has shape (1,)"),
        "bool": (dict(change=[arrays[0].astype(bool), *arrays[1:]]), "has dtype bool"),
        "too few arrays": (dict(change=arrays[:1]), f"it sends 1 arrays; the model has {len(arrays)} tensors"),
        "no examples": (dict(n=0), "num_examples 0 is not an integer in 1.."),
        "server field": (dict(metrics={"test_accuracy": 1.0}), "metric 'test_accuracy' is a field the server writes"),
    }
    for name, (change, reason) in hostile.items():
        kept, models, refused = strategy.screen([result(0), result(1, **change)])
        assert len(kept) == 1 and sorted(models) == [0] and reason in refused["1"], (name, refused)
    bad = result(1, change=[np.zeros(1, dtype=np.float32), *arrays[1:]])
    strategy.aggregate_fit(1, [result(0), bad, result(2)], [])
    record = fl.load_run(tmp_path / "run").metrics[1]
    assert record["dropped"] == [1] and "has shape (1,)" in record["dropped_reasons"][0]
    recorder.config["bad_clients"] = "stop"
    with pytest.raises(ClientRefused, match=r"round 2: the update of client 1 is refused: .*has shape \(1,\)"):
        strategy.aggregate_fit(2, [result(0), bad, result(2)], [])
    assert not recorder.store.global_path(2).exists()
    tally("bad inputs rejected", len(hostile) + 1)
