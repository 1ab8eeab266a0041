"""Uniform and weighted model soups: the (weighted) mean of the models' weights.

``theta = sum_i mu_i theta_i`` with ``mu_i = 1 / n`` (the uniform soup of Wortsman et al. 2022),
or ``mu_i = w_i / sum_j w_j`` for ``weights=w`` (non-negative, not all zero).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...infra.options import Options
from ..registry import METHODS, MergeMethod


@dataclass(frozen=True)
class MeanOptions(Options):
    """The mean has no options of its own (``weights=`` of :func:`landscape.merge` weights it)."""


def mean_rule(thetas: torch.Tensor, base: torch.Tensor | None, weights: torch.Tensor | None, options: Any,
              generator: torch.Generator) -> torch.Tensor:
    """``sum_i mu_i theta_i``, ``mu`` uniform or ``weights`` normalised to sum to one.

    Parameters
    ----------
    thetas
        ``(n, *shape)``: one tensor of every model.
    base, options, generator
        Unused.
    weights
        ``(n,)`` non-negative weights, or None for the uniform mean.

    Returns
    -------
    torch.Tensor
        The merged tensor.
    """
    if weights is None:
        return thetas.mean(0)
    mu = (weights / weights.sum()).to(thetas.device, thetas.dtype)
    return torch.tensordot(mu, thetas, dims=1)


METHODS.add("mean", MergeMethod(MeanOptions, mean_rule, source="Wortsman et al. 2022, uniform soup",
                                weights="non-negative weights of a weighted mean (normalised to sum to one)",
                                nonnegative_weights=True))
