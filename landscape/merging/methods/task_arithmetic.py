"""Task arithmetic (Ilharco et al. 2023): the base plus the scaled sum of the task vectors.

``tau_i = theta_i - theta_base`` is model ``i``'s task vector; adding task vectors is
``theta = theta_base + lambda sum_i w_i tau_i`` (Ilharco et al. 2023, Sec. 2 and 3, "Learning via
addition"; ``w_i = 1`` unless ``weights=`` gives per-task coefficients).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...infra.options import Options, option
from ..registry import METHODS, MergeMethod, per_model, task_vectors

#: Largest |lambda| accepted: a larger scaling extrapolates far past every model.
MAX_SCALE = 1e3


def scale_option(source: str) -> Any:
    """Declare the ``scale`` (lambda) field of a task-vector method.

    Parameters
    ----------
    source
        Where its default comes from.

    Returns
    -------
    dataclasses.Field
    """
    return option(1.0, ge=-MAX_SCALE, le=MAX_SCALE, source=source,
                  help="lambda: the merged task vector is scaled by it before it is added to the base")


@dataclass(frozen=True)
class TaskArithmeticOptions(Options):
    """Options of task arithmetic.

    Attributes
    ----------
    scale
        lambda, the scaling of the summed task vectors.
    """

    scale: float = scale_option("Ilharco et al. 2023, Sec. 2 (chosen on held-out data there); 1: the plain sum")


def add_task_vectors(taus: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``sum_i w_i tau_i`` (``w_i = 1`` when ``weights`` is None).

    Parameters
    ----------
    taus
        ``(n, *shape)`` task vectors.
    weights
        ``(n,)`` per-task coefficients, or None.

    Returns
    -------
    torch.Tensor
        ``(*shape)``.
    """
    return (taus * per_model(weights, taus)).sum(0)


def task_arithmetic_rule(thetas: torch.Tensor, base: torch.Tensor | None, weights: torch.Tensor | None,
                         options: Any, generator: torch.Generator) -> torch.Tensor:
    """``theta_base + lambda sum_i w_i (theta_i - theta_base)`` (Ilharco et al. 2023, Sec. 2).

    Parameters
    ----------
    thetas
        ``(n, *shape)``: one tensor of every model.
    base
        The base model's tensor.
    weights
        ``(n,)`` per-task coefficients, or None (all 1).
    options
        :class:`TaskArithmeticOptions`.
    generator
        Unused.

    Returns
    -------
    torch.Tensor
        The merged tensor.
    """
    return base + options.scale * add_task_vectors(task_vectors(thetas, base), weights)


METHODS.add("task_arithmetic", MergeMethod(TaskArithmeticOptions, task_arithmetic_rule, needs_base=True,
                                           source="Ilharco et al. 2023, task vectors (Sec. 2)",
                                           weights="per-task coefficients w_i of sum_i w_i tau_i (default 1)"))
