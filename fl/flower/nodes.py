"""The SuperNodes of a federation: which node holds which partition, and how long to wait for them.

A run needs one SuperNode per client. :func:`find_partitions` waits for them to connect (saying
how many have) and asks each for its partition id, and says what to set when the federation
does not fit the run: ``options.num-supernodes`` of a simulation, or the SuperNodes of a
deployment.
"""
from __future__ import annotations

import time
from logging import INFO
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from landscape.infra.errors import ConfigError

from ..update_checks import FederationError, check_integer
from .replies import PARTITION_ID


def seconds(value: Any, name: str) -> float:
    """A timeout in seconds, checked.

    Parameters
    ----------
    value : Any
        The value given.
    name : str
        The setting, for the message.

    Returns
    -------
    float
        The seconds.

    Raises
    ------
    ConfigError
        Unless it is a positive finite number.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < float(value) < float("inf"):
        raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def find_partitions(grid: Grid, clients: int, timeout: float) -> dict[int, int]:
    """Partition id -> node id of the federation, asked with one ``"query"`` message per node.

    Waits up to ``timeout`` seconds for ``clients`` SuperNodes to connect (saying how many have,
    every 10 seconds), then asks each for its partition id.

    Parameters
    ----------
    grid : Grid
        The ``ServerApp``'s grid.
    clients : int
        The configuration's number of clients (partitions ``0 .. clients-1``).
    timeout : float
        Seconds to wait for enough nodes to connect, and then for their answers.

    Returns
    -------
    dict[int, int]
        One node per partition.

    Raises
    ------
    FederationError
        When fewer nodes connect, a node does not answer or answers with a partition id that is
        not an integer in range or is held twice, or a partition is missing; the message says
        what to set.
    """
    how = (f"a simulation needs flwr run <app> --federation-config \"num-supernodes={clients}\" (or "
           f"options.num-supernodes = {clients} in the [superlink.<name>] section of Flower's config.toml); "
           f"a deployment needs one SuperNode per partition (--node-config \"partition-id=K\", "
           f"K in 0..{clients - 1})")
    deadline, said = time.monotonic() + timeout, time.monotonic()
    while len(list(grid.get_node_ids())) < clients and time.monotonic() < deadline:
        if time.monotonic() - said >= 10:
            log(INFO, "waiting for SuperNodes: %s of the %s the run needs have connected",
                len(list(grid.get_node_ids())), clients)
            said = time.monotonic()
        time.sleep(0.5)
    node_ids = sorted(grid.get_node_ids())
    if len(node_ids) < clients:
        raise FederationError(f"after {timeout:g} s only {len(node_ids)} of the {clients} SuperNodes the run needs "
                              f"have connected: {how} (or raise fl.connect-timeout)")
    query = [Message(content=RecordDict({"ask": ConfigRecord({"what": PARTITION_ID})}),
                     message_type=MessageType.QUERY, dst_node_id=n) for n in node_ids]
    found: dict[int, int] = {}
    answered: set[int] = set()
    for reply in grid.send_and_receive(query, timeout=timeout):
        node = reply.metadata.src_node_id
        answered.add(node)
        if reply.has_error():
            raise FederationError(f"node {node} did not answer the partition query: "
                                  f"{str(reply.error.reason).strip()[:200]}")
        try:
            record = reply.content.metric_records["partition"]
            k = check_integer(record[PARTITION_ID], f"node {node}'s partition id", 0, clients - 1)
        except KeyError:
            raise FederationError(f"node {node} answered the partition query without a {PARTITION_ID!r}; "
                                  "run fl.flower.client_app on every SuperNode") from None
        except ValueError as exc:
            raise FederationError(f"{exc}: {how}") from None
        if k in found:
            raise FederationError(f"partition id {k} is held twice (nodes {found[k]} and {node}): {how}")
        found[k] = node
    silent = sorted(set(node_ids) - answered)
    if silent:
        raise FederationError(f"nodes {silent[:10]} did not answer the partition query within {timeout:g} s "
                              "(slow or disconnected SuperNodes; raise fl.connect-timeout)")
    missing = sorted(set(range(clients)) - set(found))
    if missing:
        raise FederationError(f"no SuperNode holds partitions {missing[:10]}: {how}")
    return found


__all__ = ["find_partitions", "seconds"]
