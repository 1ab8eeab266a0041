"""TIES-Merging (Yadav et al. 2023): trim, elect sign, disjoint merge of the task vectors.

Algorithm 1 of the paper, with ``tau_i = theta_i - theta_base``:

1. **Trim**: keep the ``k`` entries of largest magnitude of each task vector and zero the rest,
   ``k = floor(density * numel)`` per tensor (as peft's ``merge_utils`` and mergekit; the official
   code ranks the entries of the whole model at once);
2. **Elect**: ``gamma = sign(sum_i tau_hat_i)``, the sign of the total mass, entry by entry (a
   total of exactly zero elects ``+``, as peft does);
3. **Disjoint merge**: ``tau_m = sum_{i in A} w_i tau_hat_i / |A|`` over the models ``A`` whose
   trimmed entry has the elected sign (an entry no model keeps stays 0; ``w_i = 1`` unless
   ``weights=`` gives per-task coefficients, applied after the election as peft does);
4. ``theta = theta_base + lambda tau_m``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...infra.options import Options, option
from ..registry import METHODS, MergeMethod, per_model, task_vectors
from .task_arithmetic import scale_option


@dataclass(frozen=True)
class TiesOptions(Options):
    """Options of TIES-Merging.

    Attributes
    ----------
    density
        Fraction of each task vector's entries kept in the trim step (per tensor).
    scale
        lambda, the scaling of the merged task vector.
    """

    density: float = option(0.2, gt=0, le=1, source="Yadav et al. 2023: top-k with k = 20%, their default",
                            help="fraction of each task vector's entries kept (largest magnitudes, per tensor)")
    scale: float = scale_option("Yadav et al. 2023, Algorithm 1 step 5 (lambda = 1 without validation data)")


def trim(taus: torch.Tensor, density: float) -> torch.Tensor:
    """Each task vector with all but its ``floor(density * numel)`` largest-magnitude entries zeroed.

    Parameters
    ----------
    taus
        ``(n, *shape)`` task vectors (one tensor of each model).
    density
        Fraction kept, in (0, 1].

    Returns
    -------
    torch.Tensor
        ``(n, *shape)``, the trimmed task vectors (TIES Algorithm 1, step 1).
    """
    flat = taus.reshape(taus.shape[0], -1)
    k = int(density * flat.shape[1])
    if k >= flat.shape[1]:
        return taus
    keep = torch.zeros_like(flat, dtype=torch.bool)
    keep.scatter_(1, flat.abs().topk(k, dim=1).indices, True)
    return (flat * keep).reshape(taus.shape)


def elect_signs(taus: torch.Tensor) -> torch.Tensor:
    """``sign(sum_i tau_i)`` entry by entry, a zero total counted as ``+1`` (TIES Algorithm 1, step 2).

    Parameters
    ----------
    taus
        ``(n, *shape)`` (trimmed) task vectors.

    Returns
    -------
    torch.Tensor
        ``(*shape)`` of ``+1`` and ``-1`` in ``taus``' dtype.
    """
    return torch.where(taus.sum(0) >= 0, 1.0, -1.0).to(taus.dtype)


def disjoint_mean(taus: torch.Tensor, signs: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Mean over the models whose entry has the elected sign (TIES Algorithm 1, step 3).

    Parameters
    ----------
    taus
        ``(n, *shape)`` (trimmed) task vectors.
    signs
        ``(*shape)`` elected signs.
    weights
        ``(n,)`` per-task coefficients applied to the agreeing entries, or None (all 1).

    Returns
    -------
    torch.Tensor
        ``sum_{i in A} w_i tau_i / max(|A|, 1)`` with ``A`` the models agreeing at that entry (a
        zero entry never agrees).
    """
    agree = torch.sign(taus) == signs
    total = (taus * per_model(weights, taus) * agree).sum(0)
    return total / agree.sum(0).clamp(min=1).to(taus.dtype)


def ties_rule(thetas: torch.Tensor, base: torch.Tensor | None, weights: torch.Tensor | None, options: Any,
              generator: torch.Generator) -> torch.Tensor:
    """``theta_base + lambda tau_m``: trim, elect, disjoint merge (TIES Algorithm 1).

    Parameters
    ----------
    thetas
        ``(n, *shape)``: one tensor of every model.
    base
        The base model's tensor.
    weights
        ``(n,)`` per-task coefficients, or None.
    options
        :class:`TiesOptions`.
    generator
        Unused.

    Returns
    -------
    torch.Tensor
        The merged tensor.
    """
    trimmed = trim(task_vectors(thetas, base), options.density)
    return base + options.scale * disjoint_mean(trimmed, elect_signs(trimmed), weights)


METHODS.add("ties", MergeMethod(TiesOptions, ties_rule, needs_base=True,
                                source="Yadav et al. 2023, TIES-Merging (Algorithm 1)",
                                weights="per-task coefficients w_i applied after the sign election (default 1)"))
