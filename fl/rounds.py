"""The pieces of one round that the engine and a remote client share.

The server's plan of a round (:class:`RoundPlan`), what a client receives to train
(:class:`TrainRequest`) and the :class:`~fl.algorithms.base.LocalContext` built from it
(:func:`client_context`), and the round's mean client metrics (:func:`client_metrics`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import nn

from .algorithms.base import Algorithm, ClientUpdate, LocalContext, State, make_generator
from .federation import Federation


@dataclass(frozen=True)
class RoundPlan:
    """A round between :meth:`Engine.plan_round` and :meth:`Engine.finish_round`.

    Parameters
    ----------
    round : int
        The round.
    clients : list[int]
        The clients whose updates the round aggregates, in aggregation order.
    sent : State
        The model broadcast to them.
    server_state : State
        The server state after ``begin_round``.
    start : float
        ``time.perf_counter()`` when the round began.
    """

    round: int
    clients: list[int]
    sent: State
    server_state: State
    start: float


@dataclass(frozen=True)
class TrainRequest:
    """What clients need from the server to train in one round (one call of ``Engine.train``).

    Parameters
    ----------
    round : int
        The round.
    clients : list[int]
        The clients to train.
    tag : str
        Their generators' tag: ``(seed, tag, round, client)``.
    sent, server_state : State
        The model they receive and the algorithm's server state.
    client_states : dict[int, State]
        Each client's persisted state (``{}`` the first time).
    """

    round: int
    clients: list[int]
    tag: str
    sent: State
    server_state: State
    client_states: dict[int, State]


def client_context(config: Mapping[str, Any], algorithm: Algorithm, module: nn.Module, data: Federation,
                   device: torch.device, request: TrainRequest, client: int) -> LocalContext:
    """The :class:`LocalContext` of ``client`` for ``request`` (the server's and a remote client's).

    Parameters
    ----------
    config : Mapping[str, Any]
        The run configuration.
    algorithm : Algorithm
        The run's algorithm.
    module : nn.Module
        The training-architecture module.
    data : Federation
        The run's data (a remote client needs only its own partition filled in).
    device : torch.device
        Where training runs.
    request : TrainRequest
        The round's request.
    client : int
        The client.

    Returns
    -------
    LocalContext
        Its generator is that of ``(seed, request.tag, request.round, client)``.
    """
    idx = data.client_train[client]
    r = request.round
    return LocalContext(
        round=r, client=client, global_state=request.sent, server_state=request.server_state,
        client_state=request.client_states.get(client, {}), x=data.train_x[idx], y=data.train_y[idx],
        generator=make_generator(int(config["seed"]), request.tag, r, client), lr=algorithm.lr(r),
        local_epochs=algorithm.local_epochs(r), batch_size=int(config["batch_size"]),
        momentum=float(config["momentum"]), weight_decay=float(config["weight_decay"]), module=module,
        options=algorithm.opts, config=config, device=device, num_classes=data.num_classes)


def client_metrics(updates: Mapping[int, ClientUpdate]) -> dict[str, float]:
    """Sample-weighted means of the numeric metrics every client of a round reported.

    Parameters
    ----------
    updates : Mapping[int, ClientUpdate]
        Client id -> update (its ``metrics`` and ``num_samples``).

    Returns
    -------
    dict[str, float]
        Metric -> mean weighted by the clients' sample counts, for the metrics all of them report.
    """
    if not updates:
        return {}
    keys = set.intersection(*(set(u.metrics) for u in updates.values()))
    total = sum(u.num_samples for u in updates.values()) or 1
    return {key: sum(float(u.metrics[key]) * u.num_samples for u in updates.values()) / total
            for key in sorted(keys)}
