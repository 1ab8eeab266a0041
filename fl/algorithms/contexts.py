"""What the round loop hands to an algorithm's hooks and what a client sends back.

The hooks get a :class:`LocalContext`, :class:`RoundContext` or
:class:`EvalContext`; a client sends back a :class:`ClientUpdate`. See
:mod:`fl.algorithms.base` for the round structure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from landscape.infra.options import Options

State = dict[str, Tensor]


@dataclass
class LocalContext:
    """Everything a client update may use.

    Tensors of the state dicts are on ``device``; do not modify ``global_state`` or
    ``server_state`` in place.

    Parameters
    ----------
    round, client : int
        Training round (1-based) and client id.
    global_state : State
        The model the client received (training architecture).
    server_state : State
        The algorithm's server state (read-only here).
    client_state : State
        This client's persisted state (``{}`` the first time).
    x, y : Tensor
        The client's training inputs and labels, on ``device``.
    generator : torch.Generator
        CPU generator seeded from ``(run seed, "client", round, client)``.
    lr : float
        Learning rate of this round (``Algorithm.lr``).
    local_epochs, batch_size : int
        Local epochs of this round and the mini-batch size.
    momentum, weight_decay : float
        SGD settings of the run.
    module : nn.Module
        Training-architecture module on ``device``, for ``functional_call``.
    options : Options
        The algorithm's resolved options (typed: ``options.mu``).
    config : Mapping[str, Any]
        The full run configuration.
    device : torch.device
        Where the tensors live.
    num_classes : int
        Number of classes of the dataset.
    """

    round: int
    client: int
    global_state: State
    server_state: State
    client_state: State
    x: Tensor
    y: Tensor
    generator: torch.Generator
    lr: float
    local_epochs: int
    batch_size: int
    momentum: float
    weight_decay: float
    module: nn.Module
    options: Options
    config: Mapping[str, Any]
    device: torch.device
    num_classes: int


@dataclass
class ClientUpdate:
    """What a client sends back.

    Parameters
    ----------
    state : State
        The full trained state_dict (CPU or device).
    num_samples : int
        The client's number of training samples (FedAvg weight).
    client_state : State or None
        State kept on the server for this client until its next round; ``None`` keeps the
        persisted one.
    metrics : dict[str, float]
        Per-client numbers (``train_loss``, ...), averaged over clients by sample count.
    """

    state: State
    num_samples: int
    client_state: State | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RoundContext:
    """Passed to ``Algorithm.begin_round``.

    Parameters
    ----------
    round : int
        Training round (1-based).
    global_state, server_state : State
        The model broadcast this round and the algorithm's server state.
    sampled : list[int]
        The clients sampled this round.
    num_clients : int
        Number of clients of the run.
    train : Callable[[Sequence[int], str], dict[int, ClientUpdate]]
        ``train(clients, tag)`` runs ``client_update`` for those clients from
        ``global_state`` with generators seeded from ``(seed, tag, round, client)``; the
        client states it returns are not persisted.
    client_sizes : list[int]
        Training samples of every client of the run (client id -> count).
    """

    round: int
    global_state: State
    server_state: State
    sampled: list[int]
    num_clients: int
    train: Callable[[Sequence[int], str], dict[int, ClientUpdate]]
    client_sizes: list[int] = field(default_factory=list)


@dataclass
class EvalContext:
    """Passed to ``Algorithm.local_metrics`` after aggregation.

    Parameters
    ----------
    round : int
        Training round (1-based).
    global_state, server_state : State
        The new global model and server state.
    client_states : dict[int, State]
        Persisted per-client states.
    updates : dict[int, ClientUpdate]
        This round's client updates.
    client_data : dict[int, tuple[Tensor, Tensor]]
        Every client's local test split on the device (empty unless the run holds one out,
        option ``local_test_fraction``).
    test_data : tuple[Tensor, Tensor]
        The global test set on the device.
    evaluate : Callable[..., tuple[float, float]]
        ``evaluate(state, x, y, module=None)`` -> (mean loss, accuracy) of a
        training-architecture state (or of a state of ``module``).
    module : nn.Module
        The training module.
    device : torch.device
        Where the tensors live.
    """

    round: int
    global_state: State
    server_state: State
    client_states: dict[int, State]
    updates: dict[int, ClientUpdate]
    client_data: dict[int, tuple[Tensor, Tensor]]
    test_data: tuple[Tensor, Tensor]
    evaluate: Callable[..., tuple[float, float]]
    module: nn.Module
    device: torch.device
