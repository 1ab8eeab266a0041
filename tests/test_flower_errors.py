"""Bad Flower set-ups get one clear line, before anything is trained or written.

The grid and the replies are stand-ins with the attributes ``fl.flower`` reads (Flower's own
``Message`` can only be built inside a running app).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("flwr", reason="Flower is not installed: pip install -c constraints.txt '.[flower]'")

from flwr.app import Context, RecordDict  # noqa: E402

from fl.flower import (  # noqa: E402
    AlgorithmStrategy,
    FederationError,
    FlowerRecorder,
    RecordedStrategy,
    client_models,
    find_partitions,
    partition_metrics,
    settings_from_run_config,
)
from fl.flower.payload import read_updates  # noqa: E402
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
    import fl.flower.algorithms as algorithms

    monkeypatch.setattr(algorithms, "Message", lambda **kw: SimpleNamespace(**kw))


def test_the_federation_must_hold_each_partition_once() -> None:
    assert find_partitions(Grid([2, 0, 1]), 3, timeout=1) == {0: 101, 1: 102, 2: 100}
    with pytest.raises(FederationError, match="only 2 SuperNodes connected"):
        find_partitions(Grid([0, 1]), 3, timeout=0.1)
    with pytest.raises(FederationError, match="partition id 1 is held twice"):
        find_partitions(Grid([0, 1, 1]), 3, timeout=1)
    with pytest.raises(FederationError, match="partition id 7 is out of range"):
        find_partitions(Grid([0, 1, 7]), 3, timeout=1)
    silent = Grid([0, 1, 2])
    silent.send_and_receive = lambda messages, timeout: [reply(100, {"partition-id": 0}),
                                                         reply(101, {"partition-id": 1})]  # one timed out
    with pytest.raises(FederationError, match=r"no SuperNode holds partitions \[2\]"):
        find_partitions(silent, 3, timeout=1)
    tally("bad inputs rejected", 4)


def test_replies_without_partition_ids_or_with_errors_are_named() -> None:
    with pytest.raises(ConfigError, match="lacks 'partition-id'.*partition_metrics"):
        client_models([reply(5, {"num-examples": 3})])
    with pytest.raises(FederationError, match="round 4: a client failed: ValueError: boom"):
        read_updates([reply(5, error="Traceback ...\nValueError: boom")], 4, [0])
    with pytest.raises(FederationError, match=r"round 2: no reply from partitions \[0, 1\]"):
        read_updates([], 2, [0, 1])
    tally("bad inputs rejected", 3)


def test_run_configuration_and_node_configuration_mistakes() -> None:
    with pytest.raises(ConfigError, match="no fl.run-dir"):
        settings_from_run_config({"fl.dataset": "digits"})
    context = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ConfigError, match="no 'partition-id' in its node config"):
        partition_metrics(context, 10)
    tally("bad inputs rejected", 2)


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
