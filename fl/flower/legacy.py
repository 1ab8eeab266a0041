"""Record a federation run with Flower's legacy strategy API (``flwr.server.strategy``).

:class:`RecordingStrategy` delegates every call to the wrapped ``flwr.server.strategy.Strategy``
and, after each ``aggregate_fit``, writes the aggregated global model (and, when asked, the
client models of the round) with a :class:`~fl.flower.recorder.FlowerRecorder`. Clients report
their partition id as the fit metric ``"partition_id"`` (Flower's node ids are not client
indices). Flower is replacing this API by the Message API; use
:class:`~fl.flower.messages.RecordedStrategy` for ``flwr.serverapp`` strategies.
"""
from __future__ import annotations

from typing import Any

from flwr.common import FitRes, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from landscape import ConfigError

from .messages import write_flower_json
from .recorder import FlowerRecorder

#: fit metric naming the client (the index into the recorded partition)
PARTITION_KEY = "partition_id"


class RecordingStrategy(Strategy):
    """A Flower strategy that delegates to ``strategy`` and records every round with ``recorder``.

    Parameters
    ----------
    strategy : flwr.server.strategy.Strategy
        The strategy that decides (e.g. ``flwr.server.strategy.FedAvg``).
    recorder : FlowerRecorder
        The run folder.
    """

    def __init__(self, strategy: Strategy, recorder: FlowerRecorder):
        super().__init__()
        self.strategy, self.recorder = strategy, recorder
        write_flower_json(recorder.path, type(strategy).__name__)

    def __repr__(self) -> str:
        return f"RecordingStrategy({self.strategy!r} -> {str(self.recorder.path)!r})"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """The wrapped strategy's initial parameters, else the run's initial model; recorded as round 0."""
        parameters = (self.strategy.initialize_parameters(client_manager)
                      or ndarrays_to_parameters(self.recorder.initial_arrays()))
        self.recorder.record(0, parameters_to_ndarrays(parameters))
        return parameters

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
        """The wrapped strategy's training instructions."""
        return self.strategy.configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Any]]:
        """Aggregate with the wrapped strategy, then record the global (and client) models."""
        parameters, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        if parameters is not None:
            clients = {}
            if self.recorder.saves_clients(server_round):
                for _, res in results:
                    if PARTITION_KEY not in res.metrics:
                        raise ConfigError(f"a client's fit metrics lack {PARTITION_KEY!r}: return "
                                          f"{{'{PARTITION_KEY}': <partition index>}} from NumPyClient.fit")
                    clients[int(res.metrics[PARTITION_KEY])] = parameters_to_ndarrays(res.parameters)
            numeric = {k: v for k, v in _mean_fit_metrics(results).items() if k != PARTITION_KEY}
            self.recorder.record(server_round, parameters_to_ndarrays(parameters), clients, numeric)
        return parameters, metrics

    def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
        """The wrapped strategy's evaluation instructions."""
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round: int, results: list[Any], failures: list[Any]):
        """The wrapped strategy's aggregate of the evaluation results."""
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(self, server_round: int, parameters: Parameters):
        """The wrapped strategy's server-side evaluation."""
        return self.strategy.evaluate(server_round, parameters)


def _mean_fit_metrics(results: list[tuple[ClientProxy, FitRes]]) -> dict[str, float]:
    """Example-weighted means of the numeric fit metrics every client reported."""
    if not results:
        return {}
    keys = set.intersection(*(set(res.metrics) for _, res in results))
    total = sum(res.num_examples for _, res in results) or 1
    return {k: sum(float(res.metrics[k]) * res.num_examples for _, res in results) / total for k in sorted(keys)
            if all(isinstance(res.metrics[k], (int, float)) and not isinstance(res.metrics[k], bool)
                   for _, res in results)}
