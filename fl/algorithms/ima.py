"""IMA, iterative moving averaging (Zhou et al., TMC 2024, Sec. 6, Eq. 5, Algorithm 1).

IMA wraps any algorithm (the *base*; FedAvg for ``algorithm="ima"``). Every round the
base's server output ``w^(t)`` is pushed into a window of the last ``window`` (P) outputs.
From round ``start_round`` on, once the window is full, the server broadcasts (and stores
as the round's global model) the uniform, non-recursive window mean
``w_IMA^(t) = 1/P sum_{i<P} w^(t-i)`` (Eq. 5); before that it broadcasts ``w^(t)``. So
at round ``start_round`` the clients still receive the plain model but already train with
the mild-exploration learning rate (§3.2, as in the official code), and the first IMA model
is broadcast in round ``start_round + 1``.

Rounds here are 1-based (round r is the paper's t = r - 1). ``start_round`` defaults to
``floor(0.75 * rounds) + 1``, i.e. the paper's t_s = 0.75 R.

Stored per round (``Run.algorithm_state(r)``): ``ima.window.{i}.{name}`` for i = 0..n-1
(oldest first, the newest is the plain aggregate of round r's client models) and
``ima.rounds`` (the rounds of the window entries). ``Run.global_state(r)`` is the IMA model
when IMA is active, else the plain aggregate.

Mild client exploration (§3.3), ``schedule`` for rounds r >= start_round, with s the start
round and ``base_lr(r)`` the base algorithm's schedule (``lr * (1 - lr_decay)^(r-1)``):

* ``"exp"`` (paper default): ``base_lr(s) * (1 - decay)^(r - s)``, decay 0.03;
* ``"const"``: ``const_lr`` (5e-5);
* ``"cyclic"``: SWA cycle of ``cycle`` rounds from ``cycle_max`` to ``const_lr``,
  ``lr = (1 - tau) cycle_max + tau const_lr``, ``tau = (((r - s) mod cycle) + 1) / cycle``;
  ``cycle_max`` 1e-2 as in the paper, or ``None`` for the code's choice ``base_lr(s)``;
* ``"epoch"``: base lr, local epochs ``max(1, E - floor((r - s) / cycle))``;
* ``"none"``: base lr (IMA averaging only, "NA decay").
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Literal, Mapping

import torch

from landscape.infra.options import Options, option

from .base import Algorithm, ClientUpdate, EvalContext, State, weighted_average
from .wrapper import Wrapper

PREFIX = "ima."
SCHEDULES = ("exp", "const", "cyclic", "epoch", "none")


@dataclasses.dataclass(frozen=True)
class IMAOptions(Options):
    """Options of IMA (Zhou et al., TMC 2024)."""

    window: int = option(5, ge=1, le=10_000, help="window size P of the moving average", source="IMA Eq. 5")
    start_round: int | None = option(None, ge=1, help="first round of IMA (default floor(0.75 T) + 1)",
                                     source="IMA Sec. 6: t_s = 0.75 R")
    schedule: Literal[SCHEDULES] = option("exp", help="mild client exploration schedule",  # type: ignore[valid-type]
                                          source="IMA Sec. 3.3")
    decay: float = option(0.03, ge=0, lt=1, help="per-round lr decay of schedule 'exp'", source="IMA Sec. 3.3")
    const_lr: float = option(5e-5, gt=0, le=100, help="lr of schedule 'const', floor of 'cyclic'",
                             source="IMA Sec. 3.3")
    cycle: int = option(20, ge=1, le=1_000_000, help="rounds per cycle of 'cyclic' and 'epoch'",
                        source="IMA Sec. 3.3")
    cycle_max: float | None = option(1e-2, gt=0, le=100, help="top lr of 'cyclic' (None: the base lr at "
                                                              "start_round, official code)", source="IMA Sec. 3.3")

    def resolved(self, config: Mapping[str, Any]) -> "IMAOptions":
        """``start_round`` defaults to ``floor(0.75 * rounds) + 1`` (the paper's t_s = 0.75 R).

        Parameters
        ----------
        config : Mapping[str, Any]
            The run configuration (``rounds``).

        Returns
        -------
        IMAOptions
            The options with ``start_round`` set.
        """
        if self.start_round is not None:
            return self
        return dataclasses.replace(self, start_round=math.floor(0.75 * int(config["rounds"])) + 1)


class IMA(Wrapper):
    """IMA composed around a base algorithm (default FedAvg).

    Window mean of the base's server outputs (Eq. 5) and mild client exploration (Sec.
    3.3).
    """

    name = "ima"
    Options = IMAOptions
    prefix = PREFIX

    def __init__(self, options: Mapping[str, Any], config: Mapping[str, Any], base: Algorithm | None = None):
        super().__init__(options, config, base)
        self.window = int(self.opts.window)
        self.start = int(self.opts.start_round)

    # -- schedules (Sec. 3.3) ---------------------------------------------------------
    def lr(self, round: int) -> float:
        """The base's lr before ``start_round``, then the exploration schedule.

        Parameters and return value: see :meth:`Algorithm.lr`.
        """
        s, sched = self.start, self.opts.schedule
        if round < s or sched in ("none", "epoch"):
            return self.base.lr(round)
        if sched == "exp":
            return self.base.lr(s) * (1.0 - float(self.opts.decay)) ** (round - s)
        if sched == "const":
            return float(self.opts.const_lr)
        hi = self.base.lr(s) if self.opts.cycle_max is None else float(self.opts.cycle_max)
        cycle = self.opts.cycle
        tau = (((round - s) % cycle) + 1) / cycle
        return (1 - tau) * hi + tau * float(self.opts.const_lr)

    def local_epochs(self, round: int) -> int:
        """The base's epochs; schedule ``"epoch"`` removes one every ``cycle`` rounds.

        Parameters and return value: see :meth:`Algorithm.local_epochs`.
        """
        epochs = self.base.local_epochs(round)
        if self.opts.schedule == "epoch" and round >= self.start:
            return max(1, epochs - (round - self.start) // self.opts.cycle)
        return epochs

    def init_server_state(self, global_state: State) -> State:
        """The base's initial state plus an empty window (``ima.rounds``).

        Parameters and return value: see :meth:`Algorithm.init_server_state`.
        """
        return {**self.base.init_server_state(global_state), PREFIX + "rounds": torch.zeros(0, dtype=torch.int64)}

    def branch_base(self) -> tuple[Algorithm, int]:
        """The base, through round ``start_round - 1``: before IMA starts, it is the base (Algorithm 1).

        Parameters and return value: see :meth:`Algorithm.branch_base`.
        """
        return self.base, self.start - 1

    def branch_state(self, round: int, source_state: State, global_state: Callable[[int], State]) -> State:
        """The base's state plus the window: the base's global models of the last ``window`` rounds.

        Before ``start_round`` the stored global model is the plain aggregate the window holds.

        Parameters and return value: see :meth:`Algorithm.branch_state`.
        """
        rounds = list(range(max(1, round - self.window + 1), round + 1))
        own: State = {PREFIX + "rounds": torch.tensor(rounds, dtype=torch.int64)}
        for i, r in enumerate(rounds):
            own.update({f"{PREFIX}window.{i}.{k}": v for k, v in global_state(r).items()})
        return {**self.base.branch_state(round, self.inner(source_state), global_state), **own}

    def local_metrics(self, ctx: EvalContext) -> dict[str, float]:
        """The base's metrics plus, once IMA is active, the plain aggregate's test loss and accuracy.

        Named ``fma_test_loss`` and ``fma_test_accuracy``.

        Parameters and return value: see :meth:`Algorithm.local_metrics`.
        """
        metrics = dict(super().local_metrics(ctx))
        if ctx.round >= self.start:
            newest = _window(self.own(ctx.server_state))[-1]
            loss, acc = ctx.evaluate(newest, *ctx.test_data)
            metrics.update({"fma_test_loss": loss, "fma_test_accuracy": acc})
        return metrics

    # -- the IMA server step (Eq. 5) ----------------------------------------------------
    def aggregate(self, global_state: State, updates: Mapping[int, ClientUpdate],
                  server_state: State, round: int) -> tuple[State, State]:
        """Push the base's aggregate into the window.

        Broadcast the window mean once IMA is active and the window is full (Eq. 5), else
        the plain aggregate.

        Parameters and return value: see :meth:`Algorithm.aggregate`.
        """
        plain, base_state = self.base.aggregate(global_state, updates, self.inner(server_state), round)
        window = _window(self.own(server_state)) + [plain]
        rounds = server_state[PREFIX + "rounds"].tolist() + [round]
        window, rounds = window[-self.window:], rounds[-self.window:]
        sent = plain
        if round >= self.start and len(window) == self.window:
            sent = weighted_average(window, [1.0] * len(window), like=plain)
        own: State = {PREFIX + "rounds": torch.tensor(rounds, dtype=torch.int64)}
        for i, st in enumerate(window):
            own.update({f"{PREFIX}window.{i}.{k}": v for k, v in st.items()})
        return sent, {**base_state, **own}


def _window(own: State) -> list[State]:
    """The window's states, oldest first, from the ``ima.window.{i}.{name}`` keys."""
    n = len(own[PREFIX + "rounds"])
    out: list[State] = [{} for _ in range(n)]
    head = PREFIX + "window."
    for key, value in own.items():
        if key.startswith(head):
            i, name = key[len(head):].split(".", 1)
            out[int(i)][name] = value
    return out
