"""Weight matching of state_dicts, registered for the layers below this one.

:class:`WeightAligner` traces an architecture's permutation groups once and then aligns any
number of its state_dicts to references by weight matching (Git Re-Basin, Ainsworth et al. 2023,
Algorithm 1), attention blocks included where :func:`~.graph.discover` finds them. Importing this
package registers it as ``"weight"`` in :data:`landscape.infra.state_aligners.STATE_ALIGNERS`, the
registry through which the FL engine (``fl.algorithms.aligned``) reaches it without importing this
layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from torch import Tensor, nn

from ..infra.state_aligners import STATE_ALIGNERS
from .align import example_input
from .graph import PermutationSpec, discover
from .permute import permute_state, with_aliases
from .weight_matching import weight_matching


@dataclass(frozen=True)
class WeightAligner:
    """Aligns state_dicts of one architecture by weight matching.

    Attributes
    ----------
    spec : PermutationSpec
        The architecture's permutation groups.
    template : nn.Module
        The architecture (gives the parameter names and the tied tensors).
    max_sweeps : int
        Bound on weight matching's sweeps.
    """

    spec: PermutationSpec
    template: nn.Module
    max_sweeps: int = 100

    @classmethod
    def for_template(cls, template: nn.Module, *, input_shape: Sequence[int] | None = None,
                     max_sweeps: int = 100) -> "WeightAligner":
        """Trace ``template`` (strictly: every hidden unit must be permutable) and keep its groups.

        Parameters
        ----------
        template : nn.Module
            The architecture (not modified).
        input_shape : Sequence[int], optional
            One input's shape without the batch axis (default: guessed, :func:`~.align.example_input`).
        max_sweeps : int
            Bound on weight matching's sweeps.

        Returns
        -------
        WeightAligner

        Raises
        ------
        PermutationError
            If the model cannot be traced or has an operation that does not commute with a
            permutation of its units.
        """
        spec = discover(template, example_input(template, input_shape=input_shape), strict=True)
        return cls(spec, template, int(max_sweeps))

    def __call__(self, state: Mapping[str, Tensor], reference: Mapping[str, Tensor], *, seed: int = 0
                 ) -> dict[str, Tensor]:
        """``state`` permuted to maximise ``sum_l <W_l^ref, P_l W_l P_{l-1}^T>`` (Git Re-Basin Alg. 1).

        Parameters
        ----------
        state, reference : Mapping[str, Tensor]
            Full state_dicts of the architecture; only the parameters vote, buffers (running
            statistics) move with their units.
        seed : int
            Order of the coordinate-descent sweeps.

        Returns
        -------
        dict[str, Tensor]
            The permuted copy (Eq. 1), tied tensors kept equal.
        """
        params = [n for n, _ in self.template.named_parameters()]
        perms, _info = weight_matching(self.spec, {n: reference[n] for n in params}, {n: state[n] for n in params},
                                       max_sweeps=self.max_sweeps, seed=seed)
        return with_aliases(self.template, permute_state(state, self.spec, perms))


STATE_ALIGNERS.add("weight", WeightAligner.for_template)

__all__ = ["WeightAligner"]
