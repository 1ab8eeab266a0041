"""Where one tensor of a model lies in the flat vector of its parameter space.

>>> import torch
>>> spec = TensorSpec("fc.weight", (2, 3), "parameter", offset=1, numel=6)
>>> spec.view(torch.arange(8.0))
tensor([[1., 2., 3.],
        [4., 5., 6.]])
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorSpec:
    """One entry of the flat vector.

    Attributes
    ----------
    name, shape, kind
        The tensor's ``state_dict`` name, its shape, and ``"parameter"`` or ``"buffer"``.
    offset, numel
        Index of its first element in the flat vector, and its number of elements.
    """

    name: str
    shape: tuple[int, ...]
    kind: str  # "parameter" or "buffer"
    offset: int
    numel: int

    def view(self, vec: torch.Tensor) -> torch.Tensor:
        """The view of the tensor in flat vector(s) ``vec``.

        Parameters
        ----------
        vec : torch.Tensor
            Flat vector(s) of the space; leading (batch) dimensions are kept.

        Returns
        -------
        torch.Tensor
            ``vec[..., offset:offset + numel]`` shaped ``(*leading, *shape)`` (no copy).
        """
        return vec[..., self.offset:self.offset + self.numel].reshape((*vec.shape[:-1], *self.shape))
