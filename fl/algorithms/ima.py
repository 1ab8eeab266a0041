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

import math
from typing import Any, Mapping

import torch

from landscape.infra.errors import ConfigError

from .base import (Algorithm, ClientUpdate, EvalContext, LocalContext, RoundContext, State,
                   weighted_average)
from .fedavg import FedAvg

PREFIX = "ima."
SCHEDULES = ("exp", "const", "cyclic", "epoch", "none")


class IMA(Algorithm):
    """IMA on top of a base algorithm (default FedAvg)."""

    name = "ima"
    options = {"window": 5, "start_round": None, "schedule": "exp", "decay": 0.03,
               "const_lr": 5e-5, "cycle": 20, "cycle_max": 1e-2}

    def __init__(self, options: Mapping[str, Any], config: Mapping[str, Any],
                 base: Algorithm | None = None):
        super().__init__(options, config)
        self.base = base if base is not None else FedAvg({}, config)
        self.personalised = self.base.personalised
        self.window = int(self.opts["window"])
        self.start = int(self.opts["start_round"])

    @classmethod
    def resolve_options(cls, given: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        opts = super().resolve_options(given, config)
        if opts["start_round"] is None:
            opts["start_round"] = math.floor(0.75 * int(config["rounds"])) + 1
        for key in ("window", "start_round", "cycle"):
            if not isinstance(opts[key], int) or isinstance(opts[key], bool) or opts[key] < 1:
                raise ConfigError(f"IMA option {key} must be a positive integer, got {opts[key]!r}")
        if opts["schedule"] not in SCHEDULES:
            raise ConfigError(f"IMA option schedule must be one of {SCHEDULES}, got {opts['schedule']!r}")
        if not 0 <= float(opts["decay"]) < 1:
            raise ConfigError(f"IMA option decay must be in [0, 1), got {opts['decay']!r}")
        if not float(opts["const_lr"]) > 0:
            raise ConfigError(f"IMA option const_lr must be positive, got {opts['const_lr']!r}")
        if opts["cycle_max"] is not None and not float(opts["cycle_max"]) > 0:
            raise ConfigError(f"IMA option cycle_max must be positive or None, got {opts['cycle_max']!r}")
        return opts

    # -- schedules (§3.3) ---------------------------------------------------------
    def lr(self, round: int) -> float:
        s, sched = self.start, self.opts["schedule"]
        if round < s or sched in ("none", "epoch"):
            return self.base.lr(round)
        if sched == "exp":
            return self.base.lr(s) * (1.0 - float(self.opts["decay"])) ** (round - s)
        if sched == "const":
            return float(self.opts["const_lr"])
        hi = self.base.lr(s) if self.opts["cycle_max"] is None else float(self.opts["cycle_max"])
        cycle = self.opts["cycle"]
        tau = (((round - s) % cycle) + 1) / cycle
        return (1 - tau) * hi + tau * float(self.opts["const_lr"])

    def local_epochs(self, round: int) -> int:
        epochs = self.base.local_epochs(round)
        if self.opts["schedule"] == "epoch" and round >= self.start:
            return max(1, epochs - (round - self.start) // self.opts["cycle"])
        return epochs

    # -- delegation to the base, with the IMA keys split off the server state ------
    def build_module(self, template: torch.nn.Module) -> torch.nn.Module:
        return self.base.build_module(template)

    def export_state(self, state: State, server_state: State, client: int | None = None,
                     client_state: State | None = None) -> State:
        return self.base.export_state(state, _base(server_state), client, client_state)

    def init_server_state(self, global_state: State) -> State:
        return {**self.base.init_server_state(global_state),
                PREFIX + "rounds": torch.zeros(0, dtype=torch.int64)}

    def participants(self, round: int, sampled: list[int]) -> list[int]:
        return self.base.participants(round, sampled)

    def begin_round(self, ctx: RoundContext) -> State:
        inner = RoundContext(ctx.round, ctx.global_state, _base(ctx.server_state), ctx.sampled,
                             ctx.num_clients, ctx.train)
        return {**self.base.begin_round(inner), **_own(ctx.server_state)}

    def client_update(self, ctx: LocalContext) -> ClientUpdate:
        ctx.server_state = _base(ctx.server_state)
        return self.base.client_update(ctx)

    def local_metrics(self, ctx: EvalContext) -> dict[str, float]:
        own = _own(ctx.server_state)
        ctx.server_state = _base(ctx.server_state)
        metrics = dict(self.base.local_metrics(ctx))
        if ctx.round >= self.start:
            newest = _window(own)[-1]
            loss, acc = ctx.evaluate(newest, *ctx.test_data)
            metrics.update({"fma_test_loss": loss, "fma_test_accuracy": acc})
        return metrics

    # -- the IMA server step (Eq. 5) ---------------------------------------------
    def aggregate(self, global_state: State, updates: Mapping[int, ClientUpdate],
                  server_state: State, round: int) -> tuple[State, State]:
        plain, base_state = self.base.aggregate(global_state, updates, _base(server_state), round)
        window = _window(_own(server_state)) + [plain]
        rounds = server_state[PREFIX + "rounds"].tolist() + [round]
        window, rounds = window[-self.window:], rounds[-self.window:]
        sent = plain
        if round >= self.start and len(window) == self.window:
            sent = weighted_average(window, [1.0] * len(window), like=plain)
        own: State = {PREFIX + "rounds": torch.tensor(rounds, dtype=torch.int64)}
        for i, st in enumerate(window):
            own.update({f"{PREFIX}window.{i}.{k}": v for k, v in st.items()})
        return sent, {**base_state, **own}


def _base(state: State) -> State:
    return {k: v for k, v in state.items() if not k.startswith(PREFIX)}


def _own(state: State) -> State:
    return {k: v for k, v in state.items() if k.startswith(PREFIX)}


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
