"""Record a Flower federation in this toolkit's run-folder format (``pip install .[flower]``).

A Flower (https://flower.ai) user keeps their ``ServerApp``/``ClientApp`` and wraps their
strategy: :class:`RecordingStrategy` delegates every call to the wrapped
``flwr.server.strategy.Strategy`` and, after each ``aggregate_fit``, writes the aggregated
global model (and, when asked, the client models of the round) as ``fl.run`` does, so that
:func:`fl.load_run`, ``landscape report --run`` and ``landscape.claims`` work on the folder.

:class:`FlowerRecorder` creates the folder before the simulation starts: the configuration,
the client partition of one of ``fl``'s datasets (seeded by ``seed``) and the initial model
(round 0). Clients read their data from the folder (``fl.load_run(out).client_datasets()``),
so that the recorded partition is exactly the one trained on, and report their partition id
as the fit metric ``"partition_id"`` (the Flower node ids are not client indices).

Each stored round holds the global model, its test loss and accuracy on the dataset's test
split (``fl.evaluation.evaluate``), and the mean of the numeric fit metrics the clients
reported. ``algorithm`` names the ``fl`` algorithm whose aggregation the Flower strategy
performs (default ``"fedavg"``); the Flower strategy's class name and Flower's version are
written to ``flower.json``.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from landscape import ConfigError
from landscape.infra.files import write_atomic

from .datasets import load_dataset
from .evaluation import evaluate
from .initial import apply_init
from .manifest import record_round
from .resolve import build_config
from .rundir import prepare_dir, refuse_foreign, saves_clients, split_clients
from .store import RunStore, check_round_finite
from .template import build_template, check_model_fits

try:
    import flwr
    from flwr.common import FitRes, Parameters, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.client_manager import ClientManager
    from flwr.server.client_proxy import ClientProxy
    from flwr.server.strategy import Strategy
except ImportError as exc:  # the optional extra is missing
    raise ImportError("fl.flower needs Flower: pip install -c constraints.txt '.[flower]'") from exc

#: fit metric naming the client (the index into the recorded partition)
PARTITION_KEY = "partition_id"


class FlowerRecorder:
    """The run folder of a Flower federation over one of ``fl``'s datasets.

    Parameters
    ----------
    out : str or os.PathLike
        The run folder (created; an existing run folder of another configuration is refused).
    model : str or nn.Module, optional
        A zoo name (default: the dataset's model) or the module whose current weights are the
        initial model (pass it to :func:`fl.load_run` to reopen the run).
    algorithm : str
        The ``fl`` algorithm the strategy's aggregation corresponds to (``"fedavg"``).
    **settings : Any
        :class:`fl.RunConfig` fields: ``dataset``, ``clients``, ``rounds``, ``seed``,
        ``partition``, ``alpha``, ``save_clients`` ("all", "last", "none" or a list of rounds), ...

    Raises
    ------
    ConfigError
        For an unknown setting, or a folder that holds another run or a finished one.
    """

    def __init__(self, out: str | os.PathLike, *, model: str | nn.Module | None = None,
                 algorithm: str = "fedavg", **settings: Any):
        config, _ = build_config(algorithm, model=model, **settings)
        bundle = load_dataset(config["dataset"], root=config["data_root"], download=config["download"])
        config["num_classes"] = int(bundle.num_classes)
        config["input_shape"] = [int(d) for d in bundle.input_shape]
        self.module = build_template(config, model if isinstance(model, nn.Module) else None)
        check_model_fits(self.module, bundle)
        apply_init(self.module, config)
        self.config, self.store = config, RunStore(out)
        self.test_x, self.test_y = bundle.test_x, bundle.test_y
        refuse_foreign(self.store)  # before the lock file is created in it
        with self.store.lock():
            if prepare_dir(self.store, config):
                raise ConfigError(f"{self.store.path} already holds a recorded run; choose another folder")
            train_parts, test_parts = split_clients(config, bundle.train_y.numpy())
            self.store.write_config(config)
            self.store.write_partition(train_parts, test_parts)
        self.keys = list(self.module.state_dict())
        self.manifest: dict[str, Any] | None = None  # as last recorded (record_round's ``previous``)

    @property
    def path(self) -> Path:
        """The run folder."""
        return self.store.path

    def initial_parameters(self) -> Parameters:
        """The initial model as Flower parameters (tensors in ``state_dict`` order)."""
        return ndarrays_to_parameters([t.detach().cpu().numpy() for t in self.module.state_dict().values()])

    def state(self, arrays: list[np.ndarray]) -> dict[str, torch.Tensor]:
        """A state dict of the run's model from Flower's list of arrays (``state_dict`` order).

        Raises
        ------
        ConfigError
            When the number or shapes of the arrays do not match the model.
        """
        reference = self.module.state_dict()
        if len(arrays) != len(self.keys):
            raise ConfigError(f"Flower sent {len(arrays)} arrays; the run's model has {len(self.keys)} tensors "
                              "(send model.state_dict() values in order)")
        out = {}
        for key, arr in zip(self.keys, arrays):
            if tuple(arr.shape) != tuple(reference[key].shape):
                raise ConfigError(f"array for {key} has shape {tuple(arr.shape)}, the model's is "
                                  f"{tuple(reference[key].shape)}")
            out[key] = torch.as_tensor(np.array(arr)).to(reference[key].dtype)
        return out

    def saves_clients(self, round: int) -> bool:
        """Whether the client models of ``round`` are stored (the ``save_clients`` setting)."""
        return saves_clients(self.config, round)

    def record(self, round: int, global_arrays: list[np.ndarray],
               clients: Mapping[int, list[np.ndarray]] | None = None,
               fit_metrics: Mapping[str, float] | None = None) -> None:
        """Write round ``round``: client models (when stored), the global model, metrics, progress.

        Parameters
        ----------
        round : int
            0 for the initial model, then Flower's server round.
        global_arrays : list of np.ndarray
            The aggregated model.
        clients : Mapping[int, list of np.ndarray], optional
            Partition id -> the client's model trained in this round.
        fit_metrics : Mapping[str, float], optional
            Aggregated client metrics, stored in the round's record.
        """
        start = time.perf_counter()
        state = self.state(global_arrays)
        loss, accuracy = evaluate(self.module, state, self.test_x, self.test_y,
                                  batch_size=int(self.config["eval_batch_size"]))
        record = {"round": int(round), "test_loss": loss, "test_accuracy": accuracy,
                  **{k: float(v) for k, v in (fit_metrics or {}).items()}, "time": time.perf_counter() - start}
        check_round_finite(round, state, record)
        if clients and self.saves_clients(round):
            for k, arrays in clients.items():
                self.store.write_state(self.store.client_path(round, k), self.state(arrays))
        self.store.write_state(self.store.global_path(round), state)
        self.store.append_metrics(record)
        self.manifest = record_round(self.store, round, record, self.manifest)
        self.store.mark(round, complete=round == int(self.config["rounds"]))


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
        write_atomic(recorder.path / "flower.json", json.dumps(
            {"strategy": type(strategy).__name__, "flwr": flwr.__version__}, indent=2).encode())

    def __repr__(self) -> str:
        return f"RecordingStrategy({self.strategy!r} -> {str(self.recorder.path)!r})"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """The wrapped strategy's initial parameters, else the run's initial model; recorded as round 0."""
        parameters = self.strategy.initialize_parameters(client_manager) or self.recorder.initial_parameters()
        self.recorder.record(0, parameters_to_ndarrays(parameters))
        return parameters

    def configure_fit(self, server_round: int, parameters: Parameters, client_manager: ClientManager):
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
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(self, server_round: int, results: list[Any], failures: list[Any]):
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(self, server_round: int, parameters: Parameters):
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
