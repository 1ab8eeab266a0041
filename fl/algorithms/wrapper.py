"""Composition: an algorithm wrapped around a base algorithm (IMA around FedAvg, FedProx, ...).

A :class:`Wrapper` owns the server-state keys that start with its ``prefix``; the base sees
only its own keys. Every hook delegates to the base unless the wrapper overrides it, so a
wrapper states only what it changes (IMA: the learning-rate schedule and the server step).
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

from torch import Tensor, nn

from .base import Algorithm, ClientUpdate, EvalContext, LocalContext, RoundContext, State
from .registry import get


class Wrapper(Algorithm):
    """An algorithm composed around ``base``.

    Class attributes
    ----------------
    prefix : str
        Server-state keys of the wrapper start with it (e.g. ``"ima."``).
    default_base : str
        Registered name of the base used when none is given (``fl.run("ima")``).

    Parameters
    ----------
    options : Mapping[str, Any]
        The wrapper's resolved options.
    config : Mapping[str, Any]
        The run configuration.
    base : Algorithm, optional
        The wrapped algorithm (default: ``default_base`` with its default options).
    """

    prefix: ClassVar[str] = ""
    default_base: ClassVar[str] = "fedavg"
    wraps = True

    def __init__(self, options: Mapping[str, Any], config: Mapping[str, Any], base: Algorithm | None = None):
        super().__init__(options, config)
        if base is None:
            cls = get(self.default_base)
            base = cls(cls.resolve_options({}, config), config)
        self.base = base
        self.personalised = base.personalised
        self.vectorizable = base.vectorizable

    @property
    def label(self) -> str:
        """``"<wrapper> on <base>"``."""
        return f"{self.name} on {self.base.label}"

    # -- server-state split ---------------------------------------------------------
    def own(self, state: State) -> State:
        """The wrapper's entries of a server state.

        Parameters
        ----------
        state : State
            A server state.

        Returns
        -------
        State
            Entries whose key starts with ``prefix``.
        """
        return {k: v for k, v in state.items() if k.startswith(self.prefix)}

    def inner(self, state: State) -> State:
        """The base's entries of a server state.

        Parameters
        ----------
        state : State
            A server state.

        Returns
        -------
        State
            Entries whose key does not start with ``prefix``.
        """
        return {k: v for k, v in state.items() if not k.startswith(self.prefix)}

    # -- delegation -------------------------------------------------------------------
    def build_module(self, template: nn.Module) -> nn.Module:
        """The base's training module (see :meth:`Algorithm.build_module`)."""
        return self.base.build_module(template)

    def export_state(self, state: State, server_state: State, client: int | None = None,
                     client_state: State | None = None) -> State:
        """The base's export with the base's server state (see :meth:`Algorithm.export_state`)."""
        return self.base.export_state(state, self.inner(server_state), client, client_state)

    def init_server_state(self, global_state: State) -> State:
        """The base's initial server state (the wrapper adds its own entries by overriding).

        Parameters and return value: see :meth:`Algorithm.init_server_state`.
        """
        return self.base.init_server_state(global_state)

    def lr(self, round: int) -> float:
        """The base's learning rate (see :meth:`Algorithm.lr`)."""
        return self.base.lr(round)

    def local_epochs(self, round: int) -> int:
        """The base's local epochs (see :meth:`Algorithm.local_epochs`)."""
        return self.base.local_epochs(round)

    def participants(self, round: int, sampled: list[int]) -> list[int]:
        """The base's participants (see :meth:`Algorithm.participants`)."""
        return self.base.participants(round, sampled)

    def begin_round(self, ctx: RoundContext) -> State:
        """The base's round start on its own server state; the wrapper's entries are kept.

        Parameters and return value: see :meth:`Algorithm.begin_round`.
        """
        inner = dataclasses.replace(ctx, server_state=self.inner(ctx.server_state))
        return {**self.base.begin_round(inner), **self.own(ctx.server_state)}

    def client_update(self, ctx: LocalContext) -> ClientUpdate:
        """The base's client update, seeing only the base's server state.

        Parameters and return value: see :meth:`Algorithm.client_update`.
        """
        return self.base.client_update(dataclasses.replace(ctx, server_state=self.inner(ctx.server_state)))

    def extra_loss(self, ctx: LocalContext, params: State, x: Tensor, y: Tensor,
                   logits: Tensor) -> Tensor | None:
        """The base's extra loss (used by the vectorised back end).

        Parameters and return value: see :meth:`Algorithm.extra_loss`.
        """
        return self.base.extra_loss(dataclasses.replace(ctx, server_state=self.inner(ctx.server_state)),
                                    params, x, y, logits)

    def aggregate(self, global_state: State, updates: Mapping[int, ClientUpdate],
                  server_state: State, round: int) -> tuple[State, State]:
        """The base's server step; the wrapper's entries are kept.

        Parameters and return value: see :meth:`Algorithm.aggregate`.
        """
        new, base_state = self.base.aggregate(global_state, updates, self.inner(server_state), round)
        return new, {**base_state, **self.own(server_state)}

    def local_metrics(self, ctx: EvalContext) -> dict[str, float]:
        """The base's personalised metrics, computed on the base's server state.

        Parameters and return value: see :meth:`Algorithm.local_metrics`.
        """
        return self.base.local_metrics(dataclasses.replace(ctx, server_state=self.inner(ctx.server_state)))
