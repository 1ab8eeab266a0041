"""What a Flower server reads from its clients' replies, checked before it is used.

Clients are other parties. A training reply is read only as far as it has the expected form,
and its contents are checked against the round's model (:mod:`fl.update_checks`); anything
else refuses that client with one line saying why, never a raw ``KeyError`` from a missing
record or Flower's ``InconsistentMessageReplies`` from a reply unlike the others.
:func:`screen_replies` does this for the replies a wrapped Flower strategy aggregates
(:class:`~fl.flower.messages.RecordedStrategy`); :mod:`fl.flower.payload` reads the replies of
:func:`~fl.flower.algorithms.client_app`.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, TypeVar

from flwr.app import Message
from torch import Tensor

from ..algorithms.contexts import ClientUpdate
from ..update_checks import MAX_SAMPLES, check_integer, metrics_problem, update_problem

#: the reply metric naming the client: its ``node_config["partition-id"]``
PARTITION_ID = "partition-id"
#: the reply metric Flower's strategies weight the average by
NUM_EXAMPLES = "num-examples"
R = TypeVar("R")


class Refused(ValueError):
    """A reply refused after its partition id was read: the refusal names that client.

    Parameters
    ----------
    client : int
        The partition id the reply named.
    reason : str
        Why it is refused, one line.
    """

    def __init__(self, client: int, reason: str):
        self.client = client
        super().__init__(reason)


def reply_metrics(content: Any, node_partition: int | None, clients: int, min_examples: int = 0) -> dict[str, Any]:
    """The metrics of a training reply, checked: its one ``MetricRecord`` with partition id and sample count.

    Parameters
    ----------
    content : RecordDict
        The reply's content.
    node_partition : int, optional
        The partition of the node the reply came from (the reply must name it); None when the
        node's partition is not known (a recorded strategy's own sampling).
    clients : int
        The run's number of clients (partition ids lie in ``0 .. clients-1``).
    min_examples : int
        The smallest ``"num-examples"`` accepted.

    Returns
    -------
    dict[str, Any]
        ``{"partition-id": k, "num-examples": n, **other metrics}`` with ``k`` and ``n`` integers.

    Raises
    ------
    ValueError
        With a one-line reason the client is refused for (a :class:`Refused` naming the
        partition once its id has been read).
    """
    records = content.metric_records
    if len(records) != 1:
        raise ValueError(f"the reply holds {len(records)} MetricRecords; it must hold one, with "
                         f"{PARTITION_ID!r} and {NUM_EXAMPLES!r}")
    metrics = dict(next(iter(records.values())))
    for key in (PARTITION_ID, NUM_EXAMPLES):
        if key not in metrics:
            raise ValueError(f"the reply's MetricRecord lacks {key!r}")
    k = check_integer(metrics.pop(PARTITION_ID), "the partition id", 0, clients - 1)
    if node_partition is not None and k != node_partition:
        raise ValueError(f"it replied as partition {k} from the node of partition {node_partition}")
    try:
        n = check_integer(metrics.pop(NUM_EXAMPLES), NUM_EXAMPLES, min_examples, MAX_SAMPLES)
    except ValueError as exc:
        raise Refused(k, str(exc)) from None
    problem = metrics_problem(metrics)
    if problem is not None:
        raise Refused(k, problem)
    return {PARTITION_ID: k, NUM_EXAMPLES: n, **{name: float(v) for name, v in metrics.items()}}


def read_state(record: Any) -> dict[str, Tensor]:
    """The tensors of an ``ArrayRecord``.

    Parameters
    ----------
    record : ArrayRecord
        A record of a reply.

    Returns
    -------
    dict[str, Tensor]
        Name -> tensor (dtype and bits as sent).

    Raises
    ------
    ValueError
        When the record cannot be read as tensors.
    """
    try:
        return dict(record.to_torch_state_dict())
    except Exception as exc:  # noqa: BLE001  # whatever a record holds, the client is refused, not the server
        raise ValueError(f"an ArrayRecord cannot be read as tensors ({type(exc).__name__})") from None


def failure(msg: Message) -> str:
    """The one-line reason of a reply that carries an error.

    Parameters
    ----------
    msg : Message
        A reply with ``has_error()``.

    Returns
    -------
    str
        ``"its ClientApp failed: <last line of the reason>"``.
    """
    reason = (str(msg.error.reason).strip().splitlines() or ["no reason given"])[-1][:300]
    return f"its ClientApp failed: {reason}"


def screen_replies(replies: Iterable[Message], sent: Mapping[str, Tensor], clients: int
                   ) -> tuple[list[Message], dict[int, dict[str, Tensor]], dict[str, str]]:
    """The replies of a training round that may be aggregated, their models, and the refused clients.

    A reply is kept when it carries no error, exactly one ``ArrayRecord`` whose tensors fit
    ``sent`` (:func:`fl.update_checks.update_problem`) and exactly one ``MetricRecord`` with an
    integer ``"partition-id"`` in ``0 .. clients-1`` held by no other reply, a positive integer
    ``"num-examples"`` and plain finite metrics that are not the server's fields.

    Parameters
    ----------
    replies : Iterable[Message]
        The replies of one training round.
    sent : Mapping[str, Tensor]
        The model the round sent.
    clients : int
        The run's number of clients.

    Returns
    -------
    tuple[list[Message], dict[int, dict[str, Tensor]], dict[str, str]]
        The kept replies (in order), partition id -> model of each, and client -> why refused
        (a client is its partition id, or ``"on node N"`` when the reply names none that can be
        trusted).
    """
    def identify(msg: Message) -> tuple[int, int]:
        if msg.has_error():
            raise ValueError(failure(msg))
        metrics = reply_metrics(msg.content, None, clients, min_examples=1)
        return metrics[PARTITION_ID], metrics[NUM_EXAMPLES]

    def load(msg: Message) -> dict[str, Tensor]:
        if len(msg.content.array_records) != 1:
            raise ValueError(f"the reply holds {len(msg.content.array_records)} ArrayRecords; it must hold one, "
                             "the trained model")
        return read_state(next(iter(msg.content.array_records.values())))

    return screen(replies, sent, identify, load, lambda msg: f"on node {msg.metadata.src_node_id}")


def screen(replies: Iterable[R], sent: Mapping[str, Tensor], identify: Callable[[R], tuple[int, int]],
           load: Callable[[R], dict[str, Tensor]], where: Callable[[R], str]
           ) -> tuple[list[R], dict[int, dict[str, Tensor]], dict[str, str]]:
    """Keep the replies whose client, sample count and model pass the checks; refuse the rest.

    Parameters
    ----------
    replies : Iterable
        A round's replies, in any form.
    sent : Mapping[str, Tensor]
        The model the round sent.
    identify : callable
        ``reply -> (partition id, sample count)``, checked; ``ValueError`` refuses the reply (under
        ``where``'s label, or the partition's for a :class:`Refused`).
    load : callable
        ``reply -> state``; ``ValueError`` refuses the reply.
    where : callable
        ``reply -> label`` naming a client whose reply names no partition id that can be trusted.

    Returns
    -------
    tuple[list, dict[int, dict[str, Tensor]], dict[str, str]]
        As for :func:`screen_replies`; a partition id claimed by two replies refuses both.
    """
    read: list[tuple[R, int, dict[str, Tensor]]] = []
    refused: dict[str, str] = {}
    for reply in replies:
        label = where(reply)
        try:
            k, n = identify(reply)
            label = str(k)
            state = load(reply)
            problem = update_problem(ClientUpdate(state, n), sent)
            if problem is not None:
                raise ValueError(problem)
            read.append((reply, k, state))
        except Refused as exc:
            refused[str(exc.client)] = str(exc)
        except ValueError as exc:
            refused[label] = str(exc)
    ids = [k for _, k, _ in read]
    for k in {k for k in ids if ids.count(k) > 1}:
        refused[str(k)] = f"{ids.count(k)} replies claim partition {k}; every SuperNode needs its own partition-id"
    kept = [(reply, k, state) for reply, k, state in read if str(k) not in refused]
    return [reply for reply, _, _ in kept], {k: state for _, k, state in kept}, refused


__all__ = ["NUM_EXAMPLES", "PARTITION_ID", "Refused", "failure", "read_state", "reply_metrics", "screen",
           "screen_replies"]
