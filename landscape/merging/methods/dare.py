"""DARE (Yu et al. 2024): drop task-vector entries at random, rescale the rest, then merge.

Each entry of each task vector ``tau_i = theta_i - theta_base`` is dropped with probability ``p``
and the survivors are rescaled by ``1 / (1 - p)``: ``tau_hat = (1 - m) * tau / (1 - p)`` with
``m ~ Bernoulli(p)`` (Yu et al. 2024, Sec. 3, "DARE"), so ``E[tau_hat] = tau``. The rescaled
task vectors are then merged by task arithmetic (``combine="task_arithmetic"``:
``theta_base + lambda sum_i w_i tau_hat_i``) or by TIES's sign election and disjoint mean
(``combine="ties"``, in place of its magnitude trim, as peft's ``dare_ties`` and mergekit do).

The masks are drawn on the CPU from one ``torch.Generator`` seeded with ``seed``, tensor by
tensor in the order of their names and model by model, so the masks of a seed do not depend on
the device the models are on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from ...infra.options import Options, option, seed_option
from ..registry import METHODS, MergeMethod, task_vectors
from .task_arithmetic import add_task_vectors, scale_option
from .ties import disjoint_mean, elect_signs


@dataclass(frozen=True)
class DareOptions(Options):
    """Options of DARE.

    Attributes
    ----------
    p
        Drop probability of each task-vector entry.
    combine
        How the rescaled task vectors are merged.
    scale
        lambda, the scaling of the merged task vector.
    seed
        Seed of the drop masks.
    """

    p: float = option(0.5, ge=0, lt=1, help="drop probability of each task-vector entry (survivors x 1/(1-p))",
                      source="ours: Yu et al. 2024 use up to 0.9 on billion-parameter language models")
    combine: Literal["task_arithmetic", "ties"] = option(
        "task_arithmetic", help="merge the rescaled task vectors by task arithmetic or by TIES's sign election",
        source="Yu et al. 2024, Sec. 3")
    scale: float = scale_option("Yu et al. 2024 (the lambda of the method DARE is combined with)")
    seed: int = seed_option("seed of the drop masks")


def drop_and_rescale(taus: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """``(1 - m) * tau / (1 - p)`` with ``m ~ Bernoulli(p)`` drawn from ``generator`` (on the CPU).

    Parameters
    ----------
    taus
        ``(n, *shape)`` task vectors.
    p
        Drop probability in [0, 1).
    generator
        A CPU ``torch.Generator``.

    Returns
    -------
    torch.Tensor
        ``(n, *shape)``, unbiased: its expectation over the masks is ``taus``.
    """
    keep = torch.rand(taus.shape, generator=generator, dtype=torch.float64) >= p
    return taus * keep.to(taus.device) / (1.0 - p)


def dare_rule(thetas: torch.Tensor, base: torch.Tensor | None, weights: torch.Tensor | None, options: Any,
              generator: torch.Generator) -> torch.Tensor:
    """``theta_base + lambda merge(tau_hat)``: DARE's rescaled task vectors, combined (Yu et al. 2024).

    Parameters
    ----------
    thetas
        ``(n, *shape)``: one tensor of every model.
    base
        The base model's tensor.
    weights
        ``(n,)`` per-task coefficients, or None.
    options
        :class:`DareOptions`.
    generator
        The merge's generator (seeded with ``options.seed``).

    Returns
    -------
    torch.Tensor
        The merged tensor.
    """
    taus = drop_and_rescale(task_vectors(thetas, base), options.p, generator)
    merged = disjoint_mean(taus, elect_signs(taus), weights) if options.combine == "ties" \
        else add_task_vectors(taus, weights)
    return base + options.scale * merged


METHODS.add("dare", MergeMethod(DareOptions, dare_rule, needs_base=True,
                                source="Yu et al. 2024, DARE (Sec. 3)",
                                weights="per-task coefficients w_i, as in the method it is combined with"))
