"""The alignment methods, by name: how the permutations of a model's units are found.

A method is a :class:`Matcher` registered in :data:`MATCHERS`; :func:`landscape.alignment.align.match`
looks it up by name, so a new method is one module of this package that registers one
(``"weight"``: Git Re-Basin Algorithm 1 in :mod:`.weight_matching`; ``"activation"``: Git
Re-Basin section 3.1 in :mod:`.activation_matching`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..infra.registry import Registry
from .graph import PermutationSpec

#: ``run(spec, reference, model, data=..., samples=..., seed=..., max_sweeps=...) -> (perms, info)``:
#: one permutation tensor per group of ``spec`` (``model``'s units to ``reference``'s) and a dict
#: of numbers describing the search.
MatchFunction = Callable[..., tuple[list[torch.Tensor], dict[str, Any]]]


@dataclass(frozen=True)
class Matcher:
    """An alignment method.

    Attributes
    ----------
    run : MatchFunction
        Finds the permutations (see :data:`MatchFunction`).
    needs_data : bool
        The method compares activations, so ``match`` refuses a call without ``data``.
    """

    run: MatchFunction
    needs_data: bool = False

    def __call__(self, spec: PermutationSpec, reference: nn.Module, model: nn.Module, **options: Any
                 ) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """Run the method (see :data:`MatchFunction`).

        Parameters
        ----------
        spec : PermutationSpec
            The permutation groups of the architecture.
        reference, model : nn.Module
            The model aligned to, and the model whose units are permuted.
        **options
            ``data``, ``samples``, ``seed``, ``max_sweeps``.

        Returns
        -------
        tuple
            The permutations and the search's numbers.
        """
        return self.run(spec, reference, model, **options)


#: Every alignment method by name; discovery imports every module of this package.
MATCHERS: Registry[Matcher] = Registry("alignment method", package=__package__)
