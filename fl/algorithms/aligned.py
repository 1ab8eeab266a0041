"""FedAvg of permutation-aligned clients: FedMA's matched averaging (Wang et al. 2020) restricted to permutations.

Two networks that differ only by a permutation of their hidden units compute the same function,
but their average does not. FedMA (Wang et al., ICLR 2020, section 2) therefore matches the
clients' units before averaging them. Here the matching is a permutation of a fixed-width model
(no growing of layers), found by weight matching (Git Re-Basin, Ainsworth et al. 2023, Alg. 1)
on the architecture's traced permutation groups, attention heads included:

* ``r^(0)``: the reference, the model sent this round (``reference="global"``) or the state of
  the participant with the most samples, lowest id first (``"largest"``; the anchor model of OT
  fusion, Singh & Jaggi 2020), for clients that did not start from a common model;
* pass ``p = 1..P``: ``pi_k^(p) = argmax_pi sum_l <r^(p-1)_l, P_l W_{k,l} P_{l-1}^T>``, client
  ``k``'s units permuted towards the reference (Git Re-Basin Alg. 1 and Eq. 1), then
  ``r^(p) = combine({pi_k^(p)(w_k)})``, by default FedAvg's ``sum_k n_k / n * pi_k^(p)(w_k)``
  (McMahan et al. 2017); every ``aggregator`` and ``clip_norm`` of the run apply to the aligned
  states. A pass that finds the previous pass's alignment again ends the loop;
* the new global model is ``r^(P)``. With ``P = 1`` and ``reference="global"`` that is
  ``sum_k n_k / n * pi_k(w_k)`` with every client aligned to the global model.

Weight matching of client ``k`` in pass ``p`` of round ``r`` is seeded with
``derive_seed(seed, "fedavg_aligned", r, k, p)`` (:mod:`fl.algorithms.seeds`), so runs repeat
bit for bit. Clients train as in FedAvg (the vectorised back end runs them).

The permutation groups come from ``landscape.alignment``, above the layers ``fl`` uses
(``landscape.infra`` and ``landscape.space``): this module imports it inside the function that
builds the aligner, the one such import in ``fl`` (``import fl`` stays light), and reaches it
through :mod:`landscape.infra.state_aligners`, where the import registers weight matching. The
groups are traced before round 1
(and again when a run resumes), so a model whose units cannot be permuted, or one with frozen
parameters (a permutation would move them), is refused with one line before any training.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch
from torch import nn

from landscape.infra.errors import ConfigError
from landscape.infra.options import Options, option
from landscape.infra.state_aligners import StateAligner, state_aligner

from .base import Algorithm, ClientUpdate, RoundContext, State
from .seeds import derive_seed

REFERENCES = ("global", "largest")


@dataclasses.dataclass(frozen=True)
class AlignedOptions(Options):
    """Options of aligned averaging (FedMA's matched averaging, permutations only)."""

    alignment: str = option("weight", help="how each client's permutation is found: a state alignment method "
                                           "that landscape.alignment registers ('weight': weight matching)",
                            source="Git Re-Basin (Ainsworth et al. 2023), Alg. 1")
    max_sweeps: int = option(100, ge=1, le=10_000, help="bound on the coordinate-descent sweeps of weight matching",
                             source="Git Re-Basin Alg. 1 (until no sweep improves); landscape.align's bound")
    passes: int = option(1, ge=1, le=100, help="alternations of matching and averaging: pass p aligns the "
                                               "clients to pass p-1's average",
                         source="FedMA (Wang et al. 2020) alternates matching and averaging; ours: 1")
    reference: str = option("global", choices=REFERENCES,
                            help="what pass 1 aligns to: the model sent this round, or the participant with the "
                                 "most samples (clients that started from their own models)",
                            source="global: FedMA's matching to the global model; largest: OT fusion's anchor "
                                   "(Singh & Jaggi 2020)")


class FedAvgAligned(Algorithm):
    """FedAvg whose server aligns every client to a reference before averaging (see the module doc)."""

    name = "fedavg_aligned"
    Options = AlignedOptions
    vectorizable = True

    def __init__(self, options: Mapping[str, Any], config: Mapping[str, Any]):
        super().__init__(options, config)
        self.template: nn.Module | None = None
        self._aligner: StateAligner | None = None

    def build_module(self, template: nn.Module) -> nn.Module:
        """The template itself, kept as the architecture the aligner traces.

        Parameters
        ----------
        template : nn.Module
            The run's architecture.

        Returns
        -------
        nn.Module
            ``template``.
        """
        self.template = template
        return template

    def init_server_state(self, global_state: State) -> State:
        """Trace the permutation groups before round 0 is stored (a model that cannot be aligned stops here).

        Parameters
        ----------
        global_state : State
            The initial model.

        Returns
        -------
        State
            Empty: the alignment keeps no state between rounds.
        """
        self.aligner()
        return {}

    def begin_round(self, ctx: RoundContext) -> State:
        """Trace the permutation groups before the first round a process trains (a resumed run).

        Parameters
        ----------
        ctx : RoundContext
            The round's context.

        Returns
        -------
        State
            The server state, unchanged.
        """
        self.aligner()
        return ctx.server_state

    def aligner(self) -> StateAligner:
        """The aligner of this run's architecture, traced on first use.

        Returns
        -------
        StateAligner
            Permutes a state towards a reference.

        Raises
        ------
        ConfigError
            When the run has frozen parameters, the method is unknown or the architecture cannot be
            permuted (one line naming the cause).
        """
        if self._aligner is not None:
            return self._aligner
        if self.frozen:
            raise ConfigError(f"{self.label} cannot align a model with frozen parameters ({sorted(self.frozen)[0]}, "
                              "...): a permutation would move them; train every parameter or use fedavg")
        if self.template is None:
            raise ConfigError(f"{self.label} has no architecture to align: call build_module(template) first")
        # The one import of the analysis core in fl, inside a function so that `import fl` stays light:
        # it registers weight matching in landscape.infra.state_aligners (tests/test_layering.py allows it).
        import landscape.alignment  # noqa: F401

        shape = self.config.get("input_shape")
        try:
            self._aligner = state_aligner(self.opts.alignment, self.template, max_sweeps=int(self.opts.max_sweeps),
                                          input_shape=None if shape is None else [int(d) for d in shape])
        except ConfigError as err:
            raise ConfigError(f"{self.label} (model {type(self.template).__name__}): {err}") from err
        return self._aligner

    def aggregate(self, global_state: State, updates: Mapping[int, ClientUpdate],
                  server_state: State, round: int) -> tuple[State, State]:
        """The aligned average of the round's updates (see the module doc).

        Parameters
        ----------
        global_state : State
            The model broadcast this round.
        updates : Mapping[int, ClientUpdate]
            Client id -> update.
        server_state : State
            The server state (unchanged).
        round : int
            Training round (part of the matching seeds).

        Returns
        -------
        tuple[State, State]
            ``r^(P)`` and the server state.
        """
        return self.aligned_average(global_state, updates, round), server_state

    def aligned_average(self, global_state: State, updates: Mapping[int, ClientUpdate], round: int) -> State:
        """``r^(P)``: the passes of matching and averaging of the module doc.

        Parameters
        ----------
        global_state : State
            The model broadcast this round (the reference ``"global"``, and the key order,
            device, frozen values and clipping centre of :meth:`combine`).
        updates : Mapping[int, ClientUpdate]
            Client id -> update.
        round : int
            Training round (part of the matching seeds).

        Returns
        -------
        State
            The aggregate; :meth:`combine` of the unaligned updates when they hold no samples.
        """
        ids = sorted(updates)
        if sum(updates[k].num_samples for k in ids) == 0:
            return self.combine(global_state, updates)
        align = self.aligner()
        if self.opts.reference == "global":
            reference = global_state
        else:
            reference = updates[max(ids, key=lambda k: (updates[k].num_samples, -k))].state
        previous: dict[int, ClientUpdate] = {}
        for p in range(1, int(self.opts.passes) + 1):
            aligned = {k: dataclasses.replace(updates[k], state=align(
                updates[k].state, reference, seed=derive_seed(self.seed, self.name, round, k, p))) for k in ids}
            if previous and all(_same(aligned[k].state, previous[k].state) for k in ids):
                break
            previous = aligned
            reference = self.combine(global_state, aligned)
        return reference


def _same(a: State, b: State) -> bool:
    """Whether two states hold equal tensors under every name."""
    return all(torch.equal(a[n], b[n]) for n in a)


__all__ = ["AlignedOptions", "FedAvgAligned"]
