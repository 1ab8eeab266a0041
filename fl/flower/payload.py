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

from landscape.infra.errors import ConfigError

from ..algorithms.base import ClientUpdate
from ..rounds import TrainRequest
from .replies import NUM_EXAMPLES, PARTITION_ID, failure, read_state, reply_metrics

#: the ConfigRecord holding round, tag, partition id and configuration
FL_RECORD = "fl"


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
    request = TrainRequest(int(head["round"]), [k], str(head["tag"]), read_state(arrays["global"]),
                           read_state(arrays["server"]), {k: read_state(arrays["client"])})
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


def read_updates(replies: Iterable[Message], nodes: Mapping[int, int], clients: int, timeout: float
                 ) -> tuple[dict[int, ClientUpdate], dict[int, str]]:
    """The client updates in the replies of one training call, and the clients refused.

    A reply is read only as far as it has the form :func:`update_reply` gives it; whatever else
    arrives (a failed ``ClientApp``, a missing or oddly typed record, key or metric, a reply naming
    another partition than the node it came from, no reply at all) refuses that client with a
    one-line reason. The updates' contents are checked afterwards against the round's model
    (:func:`fl.update_checks.update_problem`, in :meth:`fl.engine.Engine.finish_round`).

    Parameters
    ----------
    replies : Iterable[Message]
        Replies of :func:`update_reply`.
    nodes : Mapping[int, int]
        Partition id -> node id of every client sent a message in this call.
    clients : int
        The run's number of clients.
    timeout : float
        The seconds the server waited (named when a client did not reply).

    Returns
    -------
    tuple[dict[int, ClientUpdate], dict[int, str]]
        Partition id -> update, and partition id -> why it is refused.
    """
    partition_of = {node: k for k, node in nodes.items()}
    out: dict[int, ClientUpdate] = {}
    refused: dict[int, str] = {}
    for msg in replies:
        k = partition_of.get(msg.metadata.src_node_id)
        if k is None or k in out or k in refused:
            continue  # not a reply to this call's messages (Flower matches replies to messages)
        try:
            out[k] = _read_update(msg, k, clients)
        except ValueError as exc:
            refused[k] = str(exc)
    for k in sorted(set(nodes) - set(out) - set(refused)):
        refused[k] = f"no reply within {timeout:g} s (the round timeout, fl.round-timeout)"
    return out, refused


def _read_update(msg: Message, k: int, clients: int) -> ClientUpdate:
    """The update in one reply from the node of partition ``k`` (ValueError: why it cannot be read)."""
    if msg.has_error():
        raise ValueError(failure(msg))
    content = msg.content
    metrics = reply_metrics(content, k, clients)
    arrays, configs = content.array_records, content.config_records
    if "state" not in arrays or FL_RECORD not in configs or "client-state" not in configs[FL_RECORD]:
        raise ValueError("the reply lacks the 'state' ArrayRecord or the 'fl' ConfigRecord that "
                         "fl.flower.client_app sends")
    has_client_state = configs[FL_RECORD]["client-state"]
    if not isinstance(has_client_state, bool) or (has_client_state and "client" not in arrays):
        raise ValueError("the reply's 'fl' record says a client state comes with it, but none does")
    n = metrics.pop(NUM_EXAMPLES)
    del metrics[PARTITION_ID]
    return ClientUpdate(read_state(arrays["state"]), n, read_state(arrays["client"]) if has_client_state else None,
                        metrics)
