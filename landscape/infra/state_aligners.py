"""Permutation aligners of model states, by method: how code below the alignment layer reaches it.

:mod:`landscape.alignment` sits above the evaluator, and ``fl`` uses only ``landscape.infra`` and
``landscape.space`` (``tests/test_layering.py``; the aligned FL algorithm imports the alignment
package inside one function, its one exception). Code below the alignment layer asks this registry:
importing :mod:`landscape.alignment` (any of its modules) registers its data-free methods here
(``"weight"``: weight matching, Git Re-Basin, Ainsworth et al. 2023, Algorithm 1). A process that
never imported it finds the registry empty, and :func:`state_aligner` says what to import.

A factory takes the architecture once (tracing its permutation groups, which is where a model
that cannot be aligned is refused) and returns a :class:`StateAligner`, called once per model.
"""
from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sequence

from torch import Tensor, nn

from .errors import ConfigError
from .registry import Registry


class StateAligner(Protocol):
    """Permutes the hidden units of a state_dict to match a reference (the same function)."""

    def __call__(self, state: Mapping[str, Tensor], reference: Mapping[str, Tensor], *, seed: int = 0
                 ) -> dict[str, Tensor]:
        """``state`` with its units permuted towards ``reference`` (Git Re-Basin Eq. 1).

        Parameters
        ----------
        state, reference : Mapping[str, Tensor]
            Full state_dicts of the factory's architecture.
        seed : int
            Seed of the search (weight matching: the order of its sweeps).

        Returns
        -------
        dict[str, Tensor]
            New tensors on ``state``'s devices; the model computes what ``state``'s computes.
        """


#: ``factory(template, *, input_shape, max_sweeps) -> StateAligner`` by method name.
STATE_ALIGNERS: Registry[Callable[..., StateAligner]] = Registry("state alignment method")


def state_aligner(method: str, template: nn.Module, *, input_shape: Sequence[int] | None = None,
                  max_sweeps: int = 100) -> StateAligner:
    """The aligner of ``method`` for ``template``'s architecture.

    Parameters
    ----------
    method : str
        A registered method (``"weight"`` once :mod:`landscape.alignment` is imported).
    template : nn.Module
        The architecture (not modified).
    input_shape : Sequence[int], optional
        One input's shape, without the batch axis, to trace the model with (default: guessed
        from its first layer).
    max_sweeps : int
        Bound on the search's sweeps (weight matching's coordinate descent).

    Returns
    -------
    StateAligner
        Aligns states of ``template``'s architecture.

    Raises
    ------
    ConfigError
        When no method is registered in this process (import :mod:`landscape.alignment`), for
        an unknown method, or (``PermutationError``) an architecture whose units cannot be permuted.
    """
    if not STATE_ALIGNERS.names():
        raise ConfigError("permutation alignment is not loaded in this process: import landscape.alignment first")
    return STATE_ALIGNERS.get(method)(template, input_shape=input_shape, max_sweeps=max_sweeps)


__all__ = ["STATE_ALIGNERS", "StateAligner", "state_aligner"]
