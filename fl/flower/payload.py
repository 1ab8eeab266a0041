r"""What an ``fl`` algorithm's server and clients exchange over Flower's Message API.

A training message carries one :class:`~fl.rounds.TrainRequest` for one client: the model it
receives (``ArrayRecord`` ``"global"``), the algorithm's server state (``"server"``: FedGuCci's
anchors, IMA's window, ...), the client's persisted state (``"client"``: Ditto's personal
model) and a ``ConfigRecord`` ``"fl"`` with the round, the generator tag, the partition id and
the run configuration as JSON, so a client needs no access to the server's run folder. The
reply carries the :class:`~fl.algorithms.base.ClientUpdate`: the trained state, the client's
new persisted state (when it has one) and a ``MetricRecord`` with ``"num-examples"``,
``"partition-id"`` and the client's metrics. Tensors travel as ``ArrayRecord``\ s, which keep
dtype and bits, so the exchange itself changes no number.
"""
from __future__ import annotations

import json
from typing import Any, Collection, Iterable, Mapping

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from landscape import ConfigError

from ..algorithms.base import ClientUpdate, State
from ..rounds import TrainRequest
from .messages import NUM_EXAMPLES, PARTITION_ID

#: the ConfigRecord holding round, tag, partition id and configuration
FL_RECORD = "fl"


class FederationError(ConfigError):
    """A Flower federation cannot train the run: a client failed, or partitions are missing."""


def config_json(config: Mapping[str, Any]) -> str:
    """A run configuration as the canonical JSON that travels with each message (and keys client caches).

    Parameters
    ----------
    config : Mapping[str, Any]
        A run configuration.

    Returns
    -------
    str
        ``json.dumps(config, sort_keys=True)``.
    """
    return json.dumps(dict(config), sort_keys=True)


def _tensors(record: ArrayRecord) -> State:
    return dict(record.to_torch_state_dict())


def train_messages(request: TrainRequest, config: Mapping[str, Any], nodes: Mapping[int, int]) -> list[Message]:
    """One training message per client of ``request``.

    Parameters
    ----------
    request : TrainRequest
        What the clients receive.
    config : Mapping[str, Any]
        The run configuration (sent as JSON).
    nodes : Mapping[int, int]
        Partition id -> Flower node id.

    Returns
    -------
    list[Message]
        Messages of type ``"train"``.
    """
    text = config_json(config)
    shared = {"global": ArrayRecord(dict(request.sent)), "server": ArrayRecord(dict(request.server_state))}
    out = []
    for k in request.clients:
        content = RecordDict({**shared, "client": ArrayRecord(dict(request.client_states.get(k, {}))),
                              FL_RECORD: ConfigRecord({"round": request.round, "tag": request.tag,
                                                       PARTITION_ID: int(k), "config": text})})
        out.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=int(nodes[k])))
    return out


def read_request(message: Message) -> tuple[TrainRequest, dict[str, Any], int]:
    """The request, run configuration and partition id of a training message.

    Parameters
    ----------
    message : Message
        A message of :func:`train_messages`.

    Returns
    -------
    tuple[TrainRequest, dict[str, Any], int]
        The request (for this one client), the configuration and the partition id.

    Raises
    ------
    ConfigError
        When the message was not made by :func:`train_messages`.
    """
    records = message.content.config_records
    if FL_RECORD not in records:
        raise ConfigError("this training message was not sent by fl.flower.AlgorithmStrategy (no 'fl' record)")
    head = records[FL_RECORD]
    k = int(head[PARTITION_ID])
    arrays = message.content.array_records
    request = TrainRequest(int(head["round"]), [k], str(head["tag"]), _tensors(arrays["global"]),
                           _tensors(arrays["server"]), {k: _tensors(arrays["client"])})
    return request, json.loads(str(head["config"])), k


def update_reply(message: Message, client: int, update: ClientUpdate, drop: Collection[str] = ()) -> Message:
    """The reply carrying ``update``.

    Parameters
    ----------
    message : Message
        The training message answered.
    client : int
        The partition id.
    update : ClientUpdate
        The client's update.
    drop : Collection[str]
        Entries not sent (the run's frozen parameters: the server has them).

    Returns
    -------
    Message
        The reply.
    """
    metrics = MetricRecord({PARTITION_ID: int(client), NUM_EXAMPLES: int(update.num_samples),
                            **{k: float(v) for k, v in update.metrics.items()}})
    content = RecordDict({"state": ArrayRecord(uploaded_state(update.state, drop)), "metrics": metrics,
                          FL_RECORD: ConfigRecord({"client-state": update.client_state is not None})})
    if update.client_state is not None:
        content["client"] = ArrayRecord(dict(update.client_state))
    return Message(content, reply_to=message)


def uploaded_state(state: Mapping[str, Any], drop: Collection[str]) -> dict[str, Any]:
    """The part of a trained state a client sends: everything but ``drop`` (the frozen parameters).

    Parameters
    ----------
    state : Mapping[str, Tensor]
        The client's trained state.
    drop : Collection[str]
        Names the server already holds.

    Returns
    -------
    dict[str, Tensor]
        The other entries, in order.
    """
    return {n: t for n, t in state.items() if n not in drop}


def read_updates(replies: Iterable[Message], round: int, expected: Iterable[int]) -> dict[int, ClientUpdate]:
    """The client updates in the replies of one training call.

    Parameters
    ----------
    replies : Iterable[Message]
        Replies of :func:`update_reply`.
    round : int
        The round (for messages).
    expected : Iterable[int]
        The partition ids that were sent messages.

    Returns
    -------
    dict[int, ClientUpdate]
        Partition id -> update.

    Raises
    ------
    FederationError
        When a client replied with an error or did not reply.
    """
    out: dict[int, ClientUpdate] = {}
    for msg in replies:
        if msg.has_error():
            raise FederationError(f"round {round}: a client failed: {msg.error.reason.strip().splitlines()[-1]}")
        metrics = dict(msg.content.metric_records["metrics"])
        k = int(metrics.pop(PARTITION_ID))
        n = int(metrics.pop(NUM_EXAMPLES))
        client_state = (_tensors(msg.content.array_records["client"])
                        if bool(msg.content.config_records[FL_RECORD]["client-state"]) else None)
        out[k] = ClientUpdate(_tensors(msg.content.array_records["state"]), n, client_state,
                              {key: float(v) for key, v in metrics.items()})
    missing = sorted(set(expected) - set(out))
    if missing:
        raise FederationError(f"round {round}: no reply from partitions {missing} (timed out or disconnected)")
    return out
