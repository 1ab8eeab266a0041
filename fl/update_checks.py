"""What the server accepts from a client: every update is checked before it touches the server's state.

In a federation the clients are other parties. A reply that does not fit the round is refused
with one line naming the round, the client and what was wrong (:class:`ClientRefused`), before
anything is aggregated or written:

* the trained state has exactly the broadcast model's names (the frozen ones may be left out),
  each tensor with the broadcast tensor's shape (no broadcasting) and dtype (no silent casts of
  int, bool or complex tensors), dense, and finite;
* a persisted client state (Ditto's personal model) holds tensors of the types above, keeps the
  names, shapes and dtypes of the one the server holds for that client, and is finite;
* all tensors of a reply together are at most ``max_bytes`` (default: :func:`reply_limit`);
* the sample count is an integer in ``1 .. 2**53`` (``0`` only for a client the server's
  partition gives no samples);
* metrics are at most :data:`MAX_METRICS` finite numbers under plain names, none of them a
  field the server writes itself (:func:`is_server_field`): a client cannot set the round's
  test accuracy.

What the server does with a refused client is the run's ``bad_clients`` policy: ``"stop"``
raises the refusal; ``"drop"`` aggregates the others and records the refused clients with
their reasons in the round's record (``dropped``, ``dropped_reasons``).

Examples
--------
>>> import torch
>>> sent = {"w": torch.zeros(2, 2)}
>>> check_update(ClientUpdate({"w": torch.ones(2, 2)}, 5), sent, client=3, round=1)
>>> check_update(ClientUpdate({"w": torch.ones(1, 2)}, 5), sent, client=3, round=1)
Traceback (most recent call last):
...
fl.update_checks.ClientRefused: round 1: the update of client 3 is refused: 'w' has shape (1, 2), the model's is (2, 2)
"""
from __future__ import annotations

import math
import re
from typing import Any, Collection, Mapping

import torch

from landscape.infra.errors import ConfigError

from .algorithms.contexts import ClientUpdate

#: what the server does with a client whose reply is refused (the run setting ``bad_clients``)
BAD_CLIENT_POLICIES = ("stop", "drop")
#: fields of a round's record that only the server writes
SERVER_FIELDS = frozenset({"round", "test_loss", "test_accuracy", "lr", "clients", "time", "dropped",
                           "dropped_reasons", "local_loss", "local_accuracy"})
#: the most metrics one reply may carry
MAX_METRICS = 64
#: the largest sample count a reply may claim (integers are exact in float64 up to here)
MAX_SAMPLES = 2 ** 53
_METRIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")


class FederationError(ConfigError):
    """A federation cannot train the run: a client failed or was refused, or partitions are missing."""


class ClientRefused(FederationError):
    """A client's reply was refused; nothing of it reached the server's state.

    Parameters
    ----------
    round : int
        The round.
    client : int or str
        The client (its partition id, or how it is known when its id is not trusted).
    reason : str
        What was wrong, one line.
    """

    def __init__(self, round: int, client: int | str, reason: str):
        self.round, self.client, self.reason = round, client, reason
        super().__init__(f"round {round}: the update of client {client} is refused: {reason}")


def is_server_field(name: str) -> bool:
    """Whether a metric name is the server's own (a round field, or any test metric).

    Parameters
    ----------
    name : str
        A metric name.

    Returns
    -------
    bool
        True for :data:`SERVER_FIELDS` and for names containing ``"test"``.

    Examples
    --------
    >>> is_server_field("test_accuracy"), is_server_field("fma_test_loss"), is_server_field("train_loss")
    (True, True, False)
    """
    return name in SERVER_FIELDS or "test" in name


def state_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """The bytes of a state's tensors.

    Parameters
    ----------
    state : Mapping[str, Tensor]
        A state.

    Returns
    -------
    int
        ``sum(t.numel() * t.element_size())``.
    """
    return sum(t.numel() * t.element_size() for t in state.values() if isinstance(t, torch.Tensor))


def reply_limit(sent: Mapping[str, torch.Tensor]) -> int:
    """The default size limit of one reply: twice the broadcast model plus 1 MiB.

    A reply holds the trained model and, for personalised algorithms, a persisted state of at
    most the model's size; the MiB covers small states of models with few parameters.

    Parameters
    ----------
    sent : Mapping[str, Tensor]
        The broadcast model.

    Returns
    -------
    int
        The limit in bytes.
    """
    return 2 * state_bytes(sent) + 2 ** 20


def check_integer(value: Any, what: str, low: int, high: int) -> int:
    """An integer in ``low .. high`` as sent by a client (no bools, fractions or strings).

    Parameters
    ----------
    value : Any
        The value received (an ``int``, or a ``float`` with an integral value as Flower's
        ``MetricRecord`` may carry).
    what : str
        Its name, for the message.
    low, high : int
        The bounds, inclusive.

    Returns
    -------
    int
        The integer.

    Raises
    ------
    ValueError
        With a one-line reason.

    Examples
    --------
    >>> check_integer(3, "partition id", 0, 9), check_integer(2.0, "partition id", 0, 9)
    (3, 2)
    >>> check_integer(1.9, "partition id", 0, 9)
    Traceback (most recent call last):
    ...
    ValueError: partition id 1.9 is not an integer in 0..9
    """
    ok = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value, ok = int(value), True
    if not ok or not low <= value <= high:
        shown = repr(value) if not isinstance(value, int) or abs(value) < 10 ** 30 else f"{str(value)[:12]}..."
        raise ValueError(f"{what} {shown} is not an integer in {low}..{high}")
    return int(value)


def _tensor_problem(name: str, value: Any, like: torch.Tensor | None, finite: bool) -> str | None:
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
        return f"{name!r} is not a dense tensor ({type(value).__name__})"
    if like is not None and tuple(value.shape) != tuple(like.shape):
        return f"{name!r} has shape {tuple(value.shape)}, the model's is {tuple(like.shape)}"
    if like is not None and value.dtype != like.dtype:
        return f"{name!r} has dtype {str(value.dtype).removeprefix('torch.')}, the model's is " \
               f"{str(like.dtype).removeprefix('torch.')}"
    if like is None and (value.is_complex() or value.dtype == torch.bool):
        return f"{name!r} has dtype {str(value.dtype).removeprefix('torch.')}; states hold real numbers"
    if finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        return f"{name!r} holds non-finite values (NaN or infinity)"
    return None


def _names_problem(got: Collection[str], required: Collection[str], allowed: Collection[str]) -> str | None:
    extra = sorted(set(got) - set(allowed))
    missing = sorted(set(required) - set(got))
    if extra:
        return f"it sends {len(extra)} tensor(s) the model does not have ({', '.join(map(repr, extra[:3]))})"
    if missing:
        return f"it lacks {len(missing)} tensor(s) of the model ({', '.join(map(repr, missing[:3]))})"
    return None


def update_problem(update: ClientUpdate, sent: Mapping[str, torch.Tensor], *, frozen: Collection[str] = (),
                   client_state: Mapping[str, torch.Tensor] | None = None, samples: int | None = None,
                   max_bytes: int | None = None, finite: bool = True) -> str | None:
    """What is wrong with a client's update, or None (see the module docstring for the rules).

    Parameters
    ----------
    update : ClientUpdate
        The client's update.
    sent : Mapping[str, Tensor]
        The model the client received this round.
    frozen : Collection[str]
        Entries the client may leave out (the server has them).
    client_state : Mapping[str, Tensor], optional
        The persisted state the server holds for this client (its names, shapes and dtypes are
        kept); None when it has none yet.
    samples : int, optional
        The client's number of samples in the server's partition (0 allows a count of 0).
    max_bytes : int, optional
        The size limit of the reply's tensors (default: :func:`reply_limit`).
    finite : bool
        Refuse non-finite tensors and metrics (False for the engine's own back ends, where a
        non-finite model is the run diverging, reported as such when the round is stored).

    Returns
    -------
    str or None
        One line saying what is wrong.
    """
    state, persisted = update.state, update.client_state
    if not isinstance(state, Mapping) or (persisted is not None and not isinstance(persisted, Mapping)):
        return "its state is not a mapping of names to tensors"
    limit = reply_limit(sent) if max_bytes is None else max_bytes
    size = state_bytes(state) + (state_bytes(persisted) if persisted is not None else 0)
    if size > limit:
        return f"its tensors take {size:,} bytes, more than the limit of {limit:,} bytes for this model"
    problem = _names_problem(state, [n for n in sent if n not in frozen], sent)
    for name, value in state.items():
        problem = problem or _tensor_problem(name, value, sent[name], finite)
    if persisted is not None:
        if client_state:
            problem = problem or _names_problem(persisted, client_state, client_state)
        for name, value in persisted.items():
            problem = problem or _tensor_problem(f"client state {name}", value,
                                                 client_state.get(name) if client_state else None, finite)
    if problem is not None:
        return problem
    try:
        check_integer(update.num_samples, "the sample count", 0 if samples == 0 else 1,
                      0 if samples == 0 else MAX_SAMPLES)
    except ValueError as exc:
        return str(exc)
    return metrics_problem(update.metrics, finite=finite)


def metrics_problem(metrics: Any, *, finite: bool = True) -> str | None:
    """What is wrong with a client's metrics, or None.

    Parameters
    ----------
    metrics : Any
        The metrics received: at most :data:`MAX_METRICS` plain names (a letter, then letters,
        digits, ``_ . -``; at most 64 characters) to finite numbers, none a server field.
    finite : bool
        Refuse non-finite values.

    Returns
    -------
    str or None
        One line saying what is wrong.

    Examples
    --------
    >>> metrics_problem({"train_loss": 0.3}) is None
    True
    >>> metrics_problem({"test_accuracy": 1.0})
    "metric 'test_accuracy' is a field the server writes; a client cannot report it"
    """
    if not isinstance(metrics, Mapping):
        return "its metrics are not a mapping of names to numbers"
    if len(metrics) > MAX_METRICS:
        return f"it reports {len(metrics)} metrics, more than {MAX_METRICS}"
    for name, value in metrics.items():
        if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name):
            return f"metric name {str(name)[:40]!r} is not a plain name (a letter, then letters, digits, _ . -)"
        if is_server_field(name):
            return f"metric {name!r} is a field the server writes; a client cannot report it"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"metric {name!r} is not a number ({type(value).__name__})"
        if finite and not math.isfinite(value):
            return f"metric {name!r} is not finite ({value})"
    return None


def check_update(update: ClientUpdate, sent: Mapping[str, torch.Tensor], *, client: int, round: int,
                 **rules: Any) -> None:
    """Refuse a client's update that :func:`update_problem` finds wrong.

    Parameters
    ----------
    update : ClientUpdate
        The client's update.
    sent : Mapping[str, Tensor]
        The model the client received this round.
    client : int
        The client's partition id.
    round : int
        The round.
    **rules : Any
        :func:`update_problem`'s keyword arguments.

    Raises
    ------
    ClientRefused
        Naming the round, the client and the problem.
    """
    problem = update_problem(update, sent, **rules)
    if problem is not None:
        raise ClientRefused(round, client, problem)


def enforce_policy(policy: str, round: int, refused: Mapping[Any, str], received: int) -> None:
    """Apply the ``bad_clients`` policy to a round's refused clients.

    Parameters
    ----------
    policy : str
        ``"stop"`` (any refusal stops the run) or ``"drop"`` (the round goes on without them).
    round : int
        The round.
    refused : Mapping
        Client -> why it is refused (a client is its partition id, or how it is known when its
        reply names none that can be trusted).
    received : int
        How many clients the round heard from or waited for, the refused ones included.

    Raises
    ------
    ClientRefused
        For the first refused client (by partition id) under ``"stop"``; the message counts the others.
    FederationError
        When every client of the round is refused, whatever the policy.

    Examples
    --------
    >>> enforce_policy("drop", 3, {2: "no reply"}, received=4)
    >>> enforce_policy("stop", 3, {2: "no reply", 0: "bad shape"}, received=4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fl.update_checks.ClientRefused: round 3: the update of client 0 is refused: bad shape (and 1 more...
    """
    if not refused or (policy == "drop" and len(refused) < received):
        return
    order = sorted(refused, key=lambda c: (0, int(c), "") if str(c).isdigit() else (1, 0, str(c)))
    first = order[0]
    more = f" (and {len(order) - 1} more client(s): {order[1:6]})" if len(order) > 1 else ""
    if len(refused) >= received:
        raise FederationError(f"round {round}: every client was refused; client {first}: {refused[first]}{more}")
    raise ClientRefused(round, first, f"{refused[first]}{more}; set bad_clients='drop' to train on without it")


__all__ = ["BAD_CLIENT_POLICIES", "ClientRefused", "FederationError", "MAX_METRICS", "MAX_SAMPLES",
           "SERVER_FIELDS", "check_integer", "check_update", "enforce_policy", "is_server_field", "metrics_problem",
           "reply_limit", "state_bytes", "update_problem"]
