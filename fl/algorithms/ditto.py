"""Ditto (Li, Hu, Beirami & Smith, "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021).

Objective (Ditto Eq. 2): a global model ``w* = argmin_w G(F_1(w), ..., F_K(w))`` (here
FedAvg's sample-weighted mean) and, for every client ``k``, a personal model
``v_k = argmin_v h_k(v; w*) = F_k(v) + lambda/2 ||v - w*||^2``; ``lambda`` (``lam``) sets how
far a personal model may leave the global one (``lam = 0``: purely local training; ``lam ->
infinity``: ``v_k = w*``).

Algorithm 1, as run here in round ``t`` for each participating client ``k``:

* the global part is FedAvg's, step for step: local SGD from the received ``w^t`` with the run's
  epochs, batches, momentum and weight decay, then the server's sample-weighted average. With the
  same seed and settings, a Ditto run's global models are bit-identical to a FedAvg run's.
* the personal part: ``personal_epochs`` epochs (default the run's ``local_epochs``, FLOCO's
  ``E_Ditto = E``) of SGD on ``F_k(v) + lam/2 ||v - w^t||^2`` from the client's personal model
  ``v_k`` (the received ``w^t`` the first time it participates). The proximal norm runs over the
  trainable tensors; BatchNorm buffers of ``v_k`` follow its own forward passes. The personal steps
  see the same mini-batches as the global steps (the official code takes one step of each on
  every batch); they use the run's learning rate, momentum and weight decay, with fresh momentum
  every round. Clients that do not participate keep ``v_k`` unchanged.

``lam`` defaults to 1.0: the value of the Ditto authors' shipped scripts (``--lam=1`` in
litian96/ditto's ``run_*_ditto_lam1.sh``; its per-client tuning picks from ``{0.1, 1, 2}``) and
the default of the Ditto baseline in FLOCO's official repository (FL-bench ``--lamda 1``), the
implementation FLOCO compares against. The FLOCO paper itself gives no lambda.

Evaluation: ``local_accuracy`` (and ``local_loss``) is the unweighted mean over clients of each
personal model's accuracy on the client's local test split (``local_test_fraction``, 0.2 by
default as for FLOCO, whose metric of the same name it matches); a client that has never
participated has no personal model yet and is evaluated with the current global model.

What a run stores: the global model every round (FedAvg's); each participating client's
checkpoint (``Run.client_states(r)``) is its personal model ``v_k`` after round ``r``; the
personal models of all clients that have one are the per-client state kept on the server
(``client_state/``, plain state_dict names), so a resumed run continues them and equals an
uninterrupted one.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from landscape.infra.options import Options, option

from .base import Algorithm, ClientUpdate, EvalContext, LocalContext, State, local_sgd


@dataclasses.dataclass(frozen=True)
class DittoOptions(Options):
    """Options of Ditto (Li et al., ICML 2021)."""

    lam: float = option(1.0, ge=0, le=1e4, help="proximal weight lambda of the personal models",
                        source="Ditto Eq. 2; 1.0: Ditto's scripts (--lam=1) and FLOCO's official repo")
    personal_epochs: int | None = option(None, ge=1, le=10_000, help="epochs of the personal update "
                                         "(default: the run's local epochs)", source="Ditto: E_Ditto = E")

    def resolved(self, config: Mapping[str, Any]) -> "DittoOptions":
        """The other bases' derived defaults, then ``personal_epochs``.

        A subclass may combine these options with another algorithm's; ``personal_epochs``
        becomes the run's local epochs when it is None (``E_Ditto = E``, FLOCO App. B).

        Parameters
        ----------
        config : Mapping[str, Any]
            The run configuration.

        Returns
        -------
        DittoOptions
            The options with the derived defaults set.
        """
        options = super().resolved(config)
        if options.personal_epochs is not None:
            return options
        return dataclasses.replace(options, personal_epochs=int(config["local_epochs"]))


class Ditto(Algorithm):
    """Ditto: FedAvg's global model plus a personal model per client (Algorithm 1)."""

    name = "ditto"
    Options = DittoOptions
    engine_defaults = {"local_test_fraction": 0.2}
    personalised = True

    def client_update(self, ctx: LocalContext) -> ClientUpdate:
        """FedAvg's local update (uploaded), then the personal update of ``v_k``.

        The personal update runs on the same mini-batches with the proximal term to the
        received model.

        Parameters
        ----------
        ctx : LocalContext
            The client's context (``client_state``: its personal model, ``{}`` at first).

        Returns
        -------
        ClientUpdate
            The FedAvg upload, with the new personal model as the client state.
        """
        batches = torch.Generator()
        batches.set_state(ctx.generator.get_state())  # before FedAvg's update draws from it
        upload = super().client_update(ctx)
        lam = float(self.opts.lam)
        personal = local_sgd(dataclasses.replace(ctx, generator=batches), state=ctx.client_state or ctx.global_state,
                             proximal=(ctx.global_state, lam) if lam else None,
                             epochs=int(self.opts.personal_epochs))
        return ClientUpdate(upload.state, upload.num_samples, personal.state,
                            {**upload.metrics, "personal_loss": personal.loss})

    def export_state(self, state: State, server_state: State, client: int | None = None,
                     client_state: State | None = None) -> State:
        """The global model; for a client, its personal model (its upload until it has one).

        Parameters
        ----------
        state : State
            The global model or the client's upload.
        server_state : State
            The server state (unused: Ditto keeps none).
        client : int, optional
            The client (None: the global model).
        client_state : State, optional
            The client's personal model.

        Returns
        -------
        State
            The state stored as the checkpoint.
        """
        return dict(client_state) if client is not None and client_state else state

    def local_metrics(self, ctx: EvalContext) -> dict[str, float]:
        """Unweighted means over clients of each personal model's loss and accuracy.

        Each on its client's local test split (the global model for clients without one).

        Parameters
        ----------
        ctx : EvalContext
            The evaluation context.

        Returns
        -------
        dict[str, float]
            ``local_loss`` and ``local_accuracy`` (none without local test splits).
        """
        if not ctx.client_data:
            return {}
        results = [ctx.evaluate(ctx.client_states.get(k) or ctx.global_state, x, y)
                   for k, (x, y) in sorted(ctx.client_data.items())]
        return {"local_loss": sum(r[0] for r in results) / len(results),
                "local_accuracy": sum(r[1] for r in results) / len(results)}
