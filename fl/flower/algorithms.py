"""The papers' algorithms on a Flower federation: :class:`AlgorithmStrategy` and its client app.

:class:`AlgorithmStrategy` is a Message-API strategy (``flwr.serverapp.strategy.Strategy``)
that runs any algorithm of ``fl.algorithms`` (``fedavg``, ``fedprox``, ``fedgucci``,
``fedgucci+``, ``floco``, ``floco+``, ``lss``, ``ima``, ``ditto``, ...) with ``fl``'s own round
loop pieces: each round, :meth:`fl.engine.Engine.plan_round` samples the clients and runs the
algorithm's server step before training (FedGuCci's anchor pool, FLOCO's projection, which
trains clients through the federation too), the clients run the algorithm's
``client_update`` in their ``ClientApp`` (:func:`client_app`), and
:meth:`fl.engine.Engine.finish_round` aggregates, evaluates and stores the round. So there is
one implementation of each algorithm, the run folder is the one ``fl.run`` writes
(:func:`fl.load_run`, ``landscape report --run``, claims, resume), and with the same seed,
partition and settings a Flower run gives ``fl.run``'s global models up to float rounding.

Clients are addressed by partition id (``node_config["partition-id"]``, asked once with a
``"query"`` message), never by Flower's node ids; the federation needs one SuperNode per
client of the configuration. A client builds its data from the configuration sent with each
message (the dataset and the seeded partition), so it needs no access to the server's folder;
pass ``load_data`` to :func:`client_app` to train on data held by the node instead.
"""
from __future__ import annotations

import json
import time
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import Tensor, nn

from landscape import ConfigError
from landscape.infra.devices import resolve_device

from ..api import open_run
from ..datasets import load_dataset
from ..engine import Engine, RoundPlan
from ..federation import Federation
from ..resolve import make_algorithm
from ..rounds import TrainRequest, client_context
from ..rundir import split_clients
from ..template import build_template
from .messages import PARTITION_ID, partition_id, write_flower_json
from .payload import FederationError, config_json, read_request, read_updates, train_messages, update_reply
from .recorder import settings_from_run_config

LoadData = Callable[[Context], tuple[Tensor, Tensor]]


class AlgorithmStrategy(Strategy):
    """Run an ``fl`` algorithm on a Flower federation and store it as ``fl.run`` does.

    Parameters
    ----------
    algorithm : str
        A registered algorithm (``fl-run --list-algorithms``).
    out : str or os.PathLike
        The run folder (resumed from its last complete round when it holds this run).
    recipe, model
        As for :func:`fl.run`.
    **settings : Any
        :func:`fl.run`'s settings (``dataset``, ``clients``, ``rounds``, ``seed``, options).
    """

    def __init__(self, algorithm: str = "fedavg", *, out: Any, recipe: str | None = None,
                 model: str | nn.Module | None = None, **settings: Any):
        self.args = dict(algorithm=algorithm, recipe=recipe, model=model, out=out, **settings)
        self.engine: Engine | None = None
        self.plan: RoundPlan | None = None
        self.nodes: dict[int, int] = {}
        self.grid: Grid | None = None
        self.offset, self.timeout = 0, 3600.0

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], *, model: str | nn.Module | None = None
                        ) -> "AlgorithmStrategy":
        """The strategy that ``[tool.flwr.app.config.fl]`` describes (``fl.algorithm``, ``fl.run-dir``, ...).

        Parameters
        ----------
        run_config : Mapping[str, Any]
            ``context.run_config`` inside the ``ServerApp``'s ``main``.
        model : str or nn.Module, optional
            As for :func:`fl.run`.

        Returns
        -------
        AlgorithmStrategy
            The configured strategy.

        Raises
        ------
        ConfigError
            When ``fl.run-dir`` is missing.
        """
        out, settings = settings_from_run_config(run_config)
        return cls(settings.pop("algorithm", "fedavg"), out=out, model=model, **settings)

    def summary(self) -> None:
        """Log nothing beyond Flower's own start message (the configuration is in config.json)."""

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Open (or resume) the run folder, find the clients' nodes and train the remaining rounds.

        Parameters
        ----------
        grid : Grid
            The ``ServerApp``'s grid.
        initial_arrays : ArrayRecord, optional
            Not accepted: the initial model is the configuration's (``model``, ``init``).
        num_rounds : int, optional
            Must equal the configuration's ``rounds`` when given.
        timeout : float
            Seconds to wait for the nodes and for each round's replies.
        train_config, evaluate_config, evaluate_fn
            As for ``flwr.serverapp.strategy.Strategy.start``.

        Returns
        -------
        Result
            Flower's result (its arrays: the last global model, training architecture).

        Raises
        ------
        ConfigError
            For ``initial_arrays``, a ``num_rounds`` other than the configuration's, or the
            errors of :func:`fl.run`.
        FederationError
            When the federation lacks a partition, or a client fails.
        """
        if initial_arrays is not None:
            raise ConfigError("AlgorithmStrategy takes its initial model from the run configuration "
                              "(model=, init=); do not pass initial_arrays")
        self.grid, self.timeout = grid, float(timeout)
        with open_run(**self.args) as opened:
            rounds = int(opened.config["rounds"])
            if num_rounds is not None and int(num_rounds) != rounds:
                raise ConfigError(f"num_rounds={num_rounds} but the run has rounds={rounds}; give both the same")
            write_flower_json(opened.store.path, type(self).__name__)
            if opened.data is None:  # finished: nothing to train
                return Result()
            self.engine = Engine(opened.config, opened.store, opened.algorithm, opened.template, opened.data,
                                 opened.device, progress=False, remote=self.train_remote)
            self.nodes = find_partitions(grid, int(opened.config["clients"]), self.timeout)
            self.offset = self.engine.begin()
            arrays = ArrayRecord(dict(self.engine.global_state))
            return super().start(grid, arrays, rounds - self.offset, timeout, train_config, evaluate_config,
                                 evaluate_fn)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Plan the round (sampling, the algorithm's server step) and message its clients."""
        engine = self._engine()
        self.plan = engine.plan_round(self.offset + server_round)
        request = TrainRequest(self.plan.round, self.plan.clients, "client", self.plan.sent, self.plan.server_state,
                               {k: engine.client_states.get(k, {}) for k in self.plan.clients})
        return train_messages(request, engine.config, self.nodes)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate with the algorithm, evaluate and store the round (``Engine.finish_round``)."""
        engine, plan = self._engine(), self.plan
        if plan is None or plan.round != self.offset + server_round:
            raise ConfigError(f"aggregate_train({server_round}) without configure_train of that round")
        record = engine.finish_round(plan, read_updates(replies, plan.round, plan.clients))
        numbers = {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return ArrayRecord(dict(engine.global_state)), MetricRecord(numbers)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """No federated evaluation: the server evaluates each global model on the test split."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate (see :meth:`configure_evaluate`)."""
        return None

    def train_remote(self, request: TrainRequest) -> dict:
        """Train ``request``'s clients on the federation (the engine's ``remote``).

        Parameters
        ----------
        request : TrainRequest
            The clients and what they receive.

        Returns
        -------
        dict[int, ClientUpdate]
            Their updates.
        """
        engine = self._engine()
        replies = self._grid().send_and_receive(train_messages(request, engine.config, self.nodes),
                                                timeout=self.timeout)
        return read_updates(replies, request.round, request.clients)

    def _engine(self) -> Engine:
        if self.engine is None:
            raise ConfigError("AlgorithmStrategy.start has not opened the run")
        return self.engine

    def _grid(self) -> Grid:
        if self.grid is None:
            raise ConfigError("AlgorithmStrategy.start has not been given a grid")
        return self.grid


def find_partitions(grid: Grid, clients: int, timeout: float) -> dict[int, int]:
    """Partition id -> node id of the federation, asked with one ``"query"`` message per node.

    Parameters
    ----------
    grid : Grid
        The ``ServerApp``'s grid.
    clients : int
        The configuration's number of clients (partitions ``0 .. clients-1``).
    timeout : float
        Seconds to wait for enough nodes to connect and to answer.

    Returns
    -------
    dict[int, int]
        One node per partition.

    Raises
    ------
    FederationError
        When fewer nodes connect, a partition id is missing, out of range or held twice.
    """
    deadline = time.monotonic() + timeout
    while len(list(grid.get_node_ids())) < clients and time.monotonic() < deadline:
        time.sleep(0.5)
    node_ids = sorted(grid.get_node_ids())
    if len(node_ids) < clients:
        raise FederationError(f"the run has {clients} clients but only {len(node_ids)} SuperNodes connected")
    query = [Message(content=RecordDict({"ask": ConfigRecord({"what": PARTITION_ID})}),
                     message_type=MessageType.QUERY, dst_node_id=n) for n in node_ids]
    found: dict[int, int] = {}
    for reply in grid.send_and_receive(query, timeout=timeout):
        if reply.has_error():
            raise FederationError(f"a node did not answer the partition query: {reply.error.reason.strip()[:200]}")
        k = int(reply.content.metric_records["partition"][PARTITION_ID])
        if k in found or not 0 <= k < clients:
            raise FederationError(f"partition id {k} is {'held twice' if k in found else 'out of range'}; the run "
                                  f"needs one SuperNode for each of partitions 0..{clients - 1}")
        found[k] = reply.metadata.src_node_id
    missing = sorted(set(range(clients)) - set(found))
    if missing:
        raise FederationError(f"no SuperNode holds partitions {missing}; the run needs partitions 0..{clients - 1}")
    return found


@lru_cache(maxsize=2)
def _client_side(text: str, model: nn.Module | None) -> tuple[Any, nn.Module, Federation, torch.device]:
    config = json.loads(text)
    algorithm = make_algorithm(config)
    device = resolve_device(config["device"])
    module = algorithm.build_module(build_template(config, model)).to(device)
    bundle = load_dataset(config["dataset"], root=config["data_root"], download=config["download"])
    train_parts, test_parts = split_clients(config, bundle.train_y.numpy())
    return algorithm, module, Federation.build(bundle, train_parts, test_parts, device), device


def _own_data(x: Tensor, y: Tensor, client: int, clients: int, num_classes: int, device: torch.device
              ) -> Federation:
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    parts = [torch.arange(len(y), device=device) if k == client else empty for k in range(clients)]
    return Federation(x.to(device), y.to(device), x[:0].to(device), y[:0].to(device), parts,
                      [empty] * clients, num_classes)


def client_app(*, model: nn.Module | None = None, load_data: LoadData | None = None) -> ClientApp:
    """The ``ClientApp`` of :class:`AlgorithmStrategy`: it runs the algorithm's client update.

    Parameters
    ----------
    model : nn.Module, optional
        The architecture, for runs of a custom model (zoo models are rebuilt from the
        configuration).
    load_data : callable, optional
        ``load_data(context) -> (x, y)``: the node's own training data. Default: the node's
        partition (``node_config["partition-id"]``) of the configuration's dataset.

    Returns
    -------
    ClientApp
        Answers ``"query"`` (its partition id) and ``"train"`` messages.
    """
    app = ClientApp()

    @app.query()
    def query(message: Message, context: Context) -> Message:
        metrics = MetricRecord({PARTITION_ID: partition_id(context)})
        return Message(RecordDict({"partition": metrics}), reply_to=message)

    @app.train()
    def train(message: Message, context: Context) -> Message:
        request, config, k = read_request(message)
        if k != partition_id(context):
            raise FederationError(f"a message for partition {k} reached the node of partition {partition_id(context)}")
        algorithm, module, data, device = _client_side(config_json(config), model)
        if load_data is not None:
            x, y = load_data(context)
            data = _own_data(x, y, k, int(config["clients"]), data.num_classes, device)
        request = TrainRequest(request.round, [k], request.tag, _on(request.sent, device),
                               _on(request.server_state, device), {k: _on(request.client_states[k], device)})
        update = algorithm.client_update(client_context(config, algorithm, module, data, device, request, k))
        return update_reply(message, k, update, drop=algorithm.frozen)  # a LoRA client sends its adapter

    return app


def _on(state: Mapping[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device) for k, v in state.items()}



__all__ = ["AlgorithmStrategy", "FederationError", "client_app", "find_partitions"]
