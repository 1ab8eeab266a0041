"""Record a Message-API run (``flwr.serverapp`` strategies) in the run-folder format.

:class:`RecordedStrategy` wraps any ``flwr.serverapp.strategy.Strategy`` (FedAvg, FedProx,
FedAdam, ...). It records the initial model as round 0 when :meth:`RecordedStrategy.start`
begins and, after each ``aggregate_train`` of the wrapped strategy, the aggregated global
model with its test metrics and, on the rounds ``save_clients`` names, the client models
under their partition ids. A client reports its partition id in the ``MetricRecord`` of its
training reply, ``"partition-id": context.node_config["partition-id"]`` (Flower's node ids
are not client indices); :func:`partition_metrics` builds that record.

Inside ``main(grid, context)``::

    recorder = FlowerRecorder.from_run_config(context.run_config)
    strategy = RecordedStrategy(FedAvg(fraction_evaluate=0.0), recorder)
    strategy.start(grid, ArrayRecord(recorder.initial_state()), num_rounds=recorder.rounds)
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import flwr
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import Result, Strategy

from landscape.infra.errors import ConfigError
from landscape.infra.files import write_atomic

from ..update_checks import MAX_SAMPLES, FederationError, check_integer, enforce_policy
from .recorder import FlowerRecorder
from .replies import NUM_EXAMPLES, PARTITION_ID, screen_replies


def partition_id(context: Context) -> int:
    """The partition id of a SuperNode: ``context.node_config["partition-id"]``.

    Parameters
    ----------
    context : Context
        A ``ClientApp``'s context.

    Returns
    -------
    int
        The index into the run's partition.

    Raises
    ------
    ConfigError
        When the node has no ``partition-id`` in its configuration, or one that is not a
        non-negative integer (``1.9``, ``True``, ``"1"`` and ``-3`` are refused, not coerced).
    """
    if PARTITION_ID not in context.node_config:
        raise ConfigError(f"this SuperNode has no {PARTITION_ID!r} in its node config; start it with "
                          f"--node-config \"{PARTITION_ID}=<index>\"")
    try:
        return check_integer(context.node_config[PARTITION_ID], f"this SuperNode's {PARTITION_ID}", 0, MAX_SAMPLES)
    except ValueError as exc:
        raise ConfigError(f"{exc}; start it with --node-config \"{PARTITION_ID}=<index>\"") from None


def partition_metrics(context: Context, num_examples: int, **metrics: float) -> MetricRecord:
    """The ``MetricRecord`` of a training reply that a recorded run needs.

    Parameters
    ----------
    context : Context
        The ``ClientApp``'s context (``node_config["partition-id"]`` names the client).
    num_examples : int
        The client's number of training examples (the aggregation weight).
    **metrics : float
        Further numeric metrics (``train_loss``), stored as the example-weighted mean.

    Returns
    -------
    MetricRecord
        ``{"partition-id": k, "num-examples": n, **metrics}``.

    Raises
    ------
    ConfigError
        When the node has no ``partition-id`` in its configuration.
    """
    return MetricRecord({PARTITION_ID: partition_id(context), NUM_EXAMPLES: int(num_examples),
                         **{k: float(v) for k, v in metrics.items()}})


def write_flower_json(folder: Path, strategy: str) -> None:
    """Record the Flower strategy's class name and Flower's version in ``folder/flower.json``.

    Parameters
    ----------
    folder : Path
        The run folder.
    strategy : str
        The class name of the strategy that decides.
    """
    write_atomic(folder / "flower.json", json.dumps({"strategy": strategy, "flwr": flwr.__version__},
                                                    indent=2).encode())


class RecordedStrategy(Strategy):
    """A Message-API strategy that delegates to ``strategy`` and records every round.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.Strategy
        The strategy that decides (e.g. ``flwr.serverapp.strategy.FedAvg``). Its own ``start``
        is not used: the recording loop is Flower's ``Strategy.start`` calling the wrapped
        strategy's ``configure_*`` and ``aggregate_*``.
    recorder : FlowerRecorder
        The run folder.
    """

    def __init__(self, strategy: Strategy, recorder: FlowerRecorder):
        self.strategy, self.recorder = strategy, recorder
        self.sent: dict[str, Any] = {}
        write_flower_json(recorder.path, type(strategy).__name__)

    def __repr__(self) -> str:
        return f"RecordedStrategy({self.strategy!r} -> {str(self.recorder.path)!r})"

    def summary(self) -> None:
        """Log the wrapped strategy's summary."""
        self.strategy.summary()

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Record round 0, then run Flower's round loop for the recorder's rounds.

        Parameters
        ----------
        grid : Grid
            The ``ServerApp``'s grid.
        initial_arrays : ArrayRecord, optional
            The initial model (default: the recorder's).
        num_rounds : int, optional
            Must equal the recorder's ``rounds`` when given.
        timeout, train_config, evaluate_config, evaluate_fn
            As for ``flwr.serverapp.strategy.Strategy.start``.

        Returns
        -------
        Result
            Flower's result of the run.

        Raises
        ------
        ConfigError
            When ``num_rounds`` differs from the recorder's rounds.
        """
        if num_rounds is not None and int(num_rounds) != self.recorder.rounds:
            raise ConfigError(f"num_rounds={num_rounds} but the recorder's run has rounds={self.recorder.rounds}; "
                              "give both the same number")
        arrays = initial_arrays if initial_arrays is not None else ArrayRecord(self.recorder.initial_state())
        self.recorder.record(0, arrays.to_torch_state_dict())
        return super().start(grid, arrays, self.recorder.rounds, timeout, train_config, evaluate_config,
                             evaluate_fn)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The wrapped strategy's training messages (the model sent is kept to check the replies)."""
        self.sent = dict(arrays.to_torch_state_dict())
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check the replies, aggregate the kept ones with the wrapped strategy, record the round.

        Every reply is checked (:func:`fl.flower.replies.screen_replies`) before the wrapped
        strategy sees it. A refused client stops the run, or with the recorder's
        ``bad_clients="drop"`` is left out and recorded in the round's record.

        Raises
        ------
        ClientRefused
            For a refused client when ``bad_clients`` is ``"stop"``.
        FederationError
            When every reply is refused, or the wrapped strategy cannot aggregate the kept ones.
        """
        recorder = self.recorder
        kept, models, refused = screen_replies(replies, self.sent, int(recorder.config["clients"]))
        enforce_policy(str(recorder.config.get("bad_clients", "stop")), server_round, refused,
                       len(kept) + len(refused))
        try:
            arrays, metrics = self.strategy.aggregate_train(server_round, kept)
        except InconsistentMessageReplies as exc:
            raise FederationError(f"round {server_round}: {type(self.strategy).__name__} cannot aggregate the "
                                  f"replies: {str(exc).strip()[:300]}") from None
        if arrays is not None:
            numeric = {k: float(v) for k, v in (metrics or {}).items()
                       if k not in (PARTITION_ID, NUM_EXAMPLES) and isinstance(v, (int, float))}
            recorder.record(server_round, arrays.to_torch_state_dict(),
                            models if recorder.saves_clients(server_round) or recorder.tracks(server_round) else {},
                            numeric, dropped=refused)
        return arrays, metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """The wrapped strategy's evaluation messages."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The wrapped strategy's aggregated evaluation metrics."""
        return self.strategy.aggregate_evaluate(server_round, replies)


def client_models(replies: Iterable[Message]) -> dict[int, Mapping[str, Any]]:
    """Partition id -> the model state of every successful training reply.

    Parameters
    ----------
    replies : Iterable[Message]
        Replies of a training round; each carries one ``ArrayRecord`` and a ``MetricRecord``
        with ``"partition-id"``.

    Returns
    -------
    dict[int, Mapping[str, Any]]
        The clients' state dicts.

    Raises
    ------
    ConfigError
        When a reply lacks the partition id, names one that is not a non-negative integer, or
        carries two ids of one partition.
    """
    out: dict[int, Mapping[str, Any]] = {}
    for msg in replies:
        if msg.has_error():
            continue
        ids = [m[PARTITION_ID] for m in msg.content.metric_records.values() if PARTITION_ID in m]
        if not ids:
            raise ConfigError(f"a client's training reply lacks {PARTITION_ID!r}: reply with "
                              "fl.flower.partition_metrics(context, num_examples, ...) as its MetricRecord")
        try:
            ids[0] = check_integer(ids[0], "the partition id", 0, MAX_SAMPLES)
        except ValueError as exc:
            raise ConfigError(f"a client's training reply names {exc}") from None
        if ids[0] in out:
            raise ConfigError(f"two replies came from partition {ids[0]}: give every SuperNode its own "
                              f"{PARTITION_ID}")
        (record,) = msg.content.array_records.values()
        out[ids[0]] = record.to_torch_state_dict()
    return out
