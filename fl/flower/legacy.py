"""Record a federation run with Flower's legacy strategy API (``flwr.server.strategy``).

:class:`RecordingStrategy` delegates every call to the wrapped ``flwr.server.strategy.Strategy``
and, after each ``aggregate_fit``, writes the aggregated global model (and, when asked, the
client models of the round) with a :class:`~fl.flower.recorder.FlowerRecorder`. Clients report
their partition id as the fit metric ``"partition_id"`` (Flower's node ids are not client
indices). Every fit result is checked before the wrapped strategy aggregates it, as
:class:`~fl.flower.messages.RecordedStrategy` checks Message-API replies
(:func:`fl.flower.replies.screen`): the model's number of arrays, their shapes and dtypes, finite
values, an integer partition id in range held by no other client, a positive integer
``num_examples`` and plain finite metrics that are not the server's fields; the recorder's
``bad_clients`` decides whether a refused client stops the run or is left out. Flower is
replacing this API by the Message API; use :class:`~fl.flower.messages.RecordedStrategy` for
``flwr.serverapp`` strategies.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.common import FitRes, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from torch import Tensor

from ..update_checks import MAX_SAMPLES, check_integer, enforce_policy, metrics_problem
from .messages import write_flower_json
from .recorder import FlowerRecorder
from .replies import Refused, screen

Result = tuple[ClientProxy, FitRes]

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
        self.sent: dict[str, Tensor] = {}
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
        """The wrapped strategy's training instructions (the model sent is kept to check the results)."""
        self.sent = self._state(parameters_to_ndarrays(parameters))
        return self.strategy.configure_fit(server_round, parameters, client_manager)

    def aggregate_fit(self, server_round: int, results: list[Result],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Any]]:
        """Check the fit results, aggregate the kept ones with the wrapped strategy, record the round.

        Raises
        ------
        ClientRefused
            For a refused client when the recorder's ``bad_clients`` is ``"stop"``.
        FederationError
            When every result is refused.
        """
        kept, models, refused = self.screen(results)
        enforce_policy(str(self.recorder.config.get("bad_clients", "stop")), server_round, refused,
                       len(kept) + len(refused))
        parameters, metrics = self.strategy.aggregate_fit(server_round, kept, failures)
        if parameters is not None:
            numeric = {k: v for k, v in _mean_fit_metrics(kept).items() if k != PARTITION_KEY}
            self.recorder.record(server_round, parameters_to_ndarrays(parameters),
                                 models if self.recorder.saves_clients(server_round) or
                                 self.recorder.tracks(server_round) else {}, numeric, dropped=refused)
        return parameters, metrics

    def screen(self, results: list[Result]) -> tuple[list[Result], dict[int, dict[str, Tensor]], dict[str, str]]:
        """The fit results that may be aggregated, their models, and the refused clients.

        Parameters
        ----------
        results : list[tuple[ClientProxy, FitRes]]
            The fit results of a round (after :meth:`configure_fit` of that round).

        Returns
        -------
        tuple[list, dict[int, dict[str, Tensor]], dict[str, str]]
            As for :func:`fl.flower.replies.screen` (a client without a trusted partition id is
            ``"with proxy <cid>"``).
        """
        clients = int(self.recorder.config["clients"])

        def identify(result: Result) -> tuple[int, int]:
            metrics = dict(result[1].metrics)
            if PARTITION_KEY not in metrics:
                raise ValueError(f"its fit metrics lack {PARTITION_KEY!r}: return {{'{PARTITION_KEY}': <partition "
                                 "index>}} from NumPyClient.fit")
            k = check_integer(metrics.pop(PARTITION_KEY), "the partition id", 0, clients - 1)
            problem = metrics_problem(metrics)
            try:
                if problem is not None:
                    raise ValueError(problem)
                return k, check_integer(result[1].num_examples, "num_examples", 1, MAX_SAMPLES)
            except ValueError as exc:
                raise Refused(k, str(exc)) from None

        def load(result: Result) -> dict[str, Tensor]:
            arrays = parameters_to_ndarrays(result[1].parameters)
            if len(arrays) != len(self.sent):
                raise ValueError(f"it sends {len(arrays)} arrays; the model has {len(self.sent)} tensors")
            return self._state(arrays)

        return screen(results, self.sent, identify, load, lambda result: f"with proxy {result[0].cid}")

    def _state(self, arrays: list[np.ndarray]) -> dict[str, Tensor]:
        """The run model's names to the arrays as tensors, dtypes kept (ValueError: not numeric arrays)."""
        try:
            return {key: torch.from_numpy(np.ascontiguousarray(a)) for key, a in zip(self.recorder.keys, arrays)}
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"its arrays cannot be read as tensors ({type(exc).__name__})") from None

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
