"""FLOCO+ (Grinwald, Wiesner & Nakajima, "Federated Learning over Connected Modes", NeurIPS 2024, App. C).

FLOCO (:mod:`fl.algorithms.floco`) plus Ditto-style personal models (see
:mod:`fl.algorithms.ditto`): every participating client also keeps a personal model (full
training state, its client state on the server) trained after the global update for
``personal_epochs`` epochs (default the run's local epochs, ``E_Ditto = E``) with the same
alpha sampling and the proximal term ``lambda/2 |v - w_received|^2`` over all trainable
tensors (``lam`` 1.0, the authors' code; the paper gives none), used at ``alpha_k``. A
client's checkpoint is its personal model.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from torch import Tensor

from .base import ClientUpdate, EvalContext, LocalContext, State, make_generator
from .ditto import DittoOptions
from .floco import PREFIX, Floco, FlocoOptions


@dataclasses.dataclass(frozen=True)
class FlocoPlusOptions(DittoOptions, FlocoOptions):
    """Options of FLOCO+ (App. C).

    FLOCO's plus Ditto's personal-model options (``lam``: the official code's 1.0, the paper
    gives none; ``personal_epochs``: the run's local epochs).
    """


class FlocoPlus(Floco):
    """FLOCO+ (App. C): FLOCO plus Ditto-style personal models kept on the server."""

    name = "floco+"
    Options = FlocoPlusOptions

    def client_update(self, ctx: LocalContext) -> ClientUpdate:
        """The FLOCO update, then ``personal_epochs`` from the client's personal model.

        The personal epochs minimise ``F_k(v_alpha) + lam/2 |v - w_received|^2``.
        """
        alpha_gen = make_generator(self.seed, "floco-alpha", ctx.round, ctx.client)
        result = self.simplex_sgd(ctx, alpha_gen, state=self.received(ctx))
        start = _personal(ctx.client_state) or self.received(ctx)
        personal = self.simplex_sgd(ctx, alpha_gen, state=start,
                                    proximal=(ctx.global_state, float(self.opts.lam)),
                                    epochs=int(self.opts.personal_epochs))
        return ClientUpdate(result.state, len(ctx.y), {**personal.state, **self.kept_buffers(result.state)},
                            {"train_loss": result.loss, "personal_loss": personal.loss})

    def client_model(self, upload: State, client_state: State | None) -> State:
        """FLOCO+ exports the client's personal model (its upload until it has one)."""
        return _personal(client_state or {}) or upload

    def personal_state(self, ctx: EvalContext, client: int) -> State:
        """The client's personal model (the global one until it has trained)."""
        return _personal(ctx.client_states.get(client, {})) or ctx.global_state


def _personal(client_state: Mapping[str, Tensor]) -> State:
    """A FLOCO+ personal model: the client-state entries that are not FLOCO's own keys."""
    return {n: t for n, t in client_state.items() if not n.startswith(PREFIX)}
