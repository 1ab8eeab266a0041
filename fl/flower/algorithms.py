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
from functools import lru_cache
from logging import WARNING
from typing import Any, Callable, Iterable, Mapping

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import Tensor, nn

from landscape.infra.devices import resolve_device
from landscape.infra.errors import ConfigError

from ..api import open_run
from ..datasets import load_dataset
from ..engine import Engine, RoundPlan
from ..federation import Federation
from ..resolve import make_algorithm
from ..rounds import TrainRequest, client_context
from ..rundir import split_clients
from ..template import build_template
from ..update_checks import ClientRefused, FederationError
from .messages import PARTITION_ID, partition_id, write_flower_json
from .nodes import find_partitions, seconds
from .payload import config_json, read_request, read_updates, train_messages, update_reply
from .recorder import settings_from_run_config

LoadData = Callable[[Context], tuple[Tensor, Tensor]]
#: seconds the server waits for each round's replies (run configuration ``fl.round-timeout``)
ROUND_TIMEOUT = 600.0
#: seconds the server waits for the SuperNodes to connect and name their partitions (``fl.connect-timeout``)
CONNECT_TIMEOUT = 120.0


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
    round_timeout : float
        Seconds to wait for each round's replies; a client that has not replied by then is
        refused for the round (``bad_clients`` decides whether the run stops or goes on without it).
    connect_timeout : float
        Seconds to wait for one SuperNode per client to connect and name its partition.
    **settings : Any
        :func:`fl.run`'s settings (``dataset``, ``clients``, ``rounds``, ``seed``, ``bad_clients``,
        options).
    """

    def __init__(self, algorithm: str = "fedavg", *, out: Any, recipe: str | None = None,
                 model: str | nn.Module | None = None, round_timeout: float = ROUND_TIMEOUT,
                 connect_timeout: float = CONNECT_TIMEOUT, **settings: Any):
        self.args = dict(algorithm=algorithm, recipe=recipe, model=model, out=out, **settings)
        self.engine: Engine | None = None
        self.plan: RoundPlan | None = None
        self.nodes: dict[int, int] = {}
        self.grid: Grid | None = None
        self.offset = 0
        self.timeout, self.connect_timeout = seconds(round_timeout, "round_timeout"), \
            seconds(connect_timeout, "connect_timeout")

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], *, model: str | nn.Module | None = None
                        ) -> "AlgorithmStrategy":
        """The strategy that ``[tool.flwr.app.config.fl]`` describes (``fl.algorithm``, ``fl.run-dir``, ...).

        ``fl.round-timeout`` and ``fl.connect-timeout`` set the two timeouts (seconds); every
        other ``fl.*`` key is a setting of :func:`fl.run`.

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
        timeouts = {key: settings.pop(key) for key in ("round_timeout", "connect_timeout") if key in settings}
        return cls(settings.pop("algorithm", "fedavg"), out=out, model=model, **timeouts, **settings)

    def summary(self) -> None:
        """Log nothing beyond Flower's own start message (the configuration is in config.json)."""

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
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
        timeout : float, optional
            Seconds to wait for each round's replies (default: the strategy's ``round_timeout``).
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
        self.grid = grid
        if timeout is not None:
            self.timeout = seconds(timeout, "timeout")
        with open_run(**self.args) as opened:
            rounds = int(opened.config["rounds"])
            if num_rounds is not None and int(num_rounds) != rounds:
                raise ConfigError(f"num_rounds={num_rounds} but the run has rounds={rounds}; give both the same")
            write_flower_json(opened.store.path, type(self).__name__)
            if opened.data is None:  # finished: nothing to train
                return Result()
            self.engine = Engine(opened.config, opened.store, opened.algorithm, opened.template, opened.data,
                                 opened.device, progress=False, remote=self.train_remote)
            self.nodes = find_partitions(grid, int(opened.config["clients"]), self.connect_timeout)
            self.offset = self.engine.begin()
            arrays = ArrayRecord(dict(self.engine.global_state))
            return super().start(grid, arrays, rounds - self.offset, self.timeout, train_config, evaluate_config,
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
        updates, refused = read_updates(replies, {k: self.nodes[k] for k in plan.clients},
                                        int(engine.config["clients"]), self.timeout)
        record = engine.finish_round(plan, updates, refused)
        for reason in record.get("dropped_reasons", []):
            log(WARNING, "round %s: dropped %s", plan.round, reason)
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

        Raises
        ------
        ClientRefused
            When a client is refused (whatever ``bad_clients`` says: the algorithm's server step
            needs every client it trains).
        """
        engine = self._engine()
        replies = self._grid().send_and_receive(train_messages(request, engine.config, self.nodes),
                                                timeout=self.timeout)
        updates, refused = read_updates(replies, {k: self.nodes[k] for k in request.clients},
                                        int(engine.config["clients"]), self.timeout)
        refused = engine.refusals(request.sent, updates, refused)
        if refused:  # the algorithm's server step needs every client it trains
            k = min(refused)
            raise ClientRefused(request.round, k, f"{refused[k]} (in the algorithm's server step, which needs "
                                                  "every client it trains)")
        return updates

    def _engine(self) -> Engine:
        if self.engine is None:
            raise ConfigError("AlgorithmStrategy.start has not opened the run")
        return self.engine

    def _grid(self) -> Grid:
        if self.grid is None:
            raise ConfigError("AlgorithmStrategy.start has not been given a grid")
        return self.grid


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
        return train_reply(message, context, model=model, load_data=load_data)

    return app


def train_reply(message: Message, context: Context, *, model: nn.Module | None = None,
                load_data: LoadData | None = None) -> Message:
    """Answer one training message of :class:`AlgorithmStrategy`: the algorithm's client update.

    What :func:`client_app`'s ``train`` does; call it from a ``ClientApp`` of your own that does
    more around the training.

    Parameters
    ----------
    message : Message
        The training message.
    context : Context
        The ``ClientApp``'s context (``node_config["partition-id"]`` names the client).
    model, load_data
        As for :func:`client_app`.

    Returns
    -------
    Message
        The reply with the client's update (a LoRA client sends only its adapter).

    Raises
    ------
    FederationError
        When the message is for another partition than the node's.
    """
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
    return update_reply(message, k, update, drop=algorithm.frozen)


def _on(state: Mapping[str, Tensor], device: torch.device) -> dict[str, Tensor]:
    return {k: v.to(device) for k, v in state.items()}



__all__ = ["AlgorithmStrategy", "CONNECT_TIMEOUT", "FederationError", "ROUND_TIMEOUT", "client_app", "find_partitions",
           "train_reply"]
