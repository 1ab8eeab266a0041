"""What the rest of the package may use of an evaluator: :class:`PointEvaluator`.

The analysis functions (paths, planes, groups, curvature, decomposition, curves, claims) see an
evaluator only through this protocol; the strategies, chunking, scoring plans, sharding and
BatchNorm bookkeeping behind :class:`~landscape.evaluation.evaluator.Evaluator` stay inside
:mod:`landscape.evaluation`. The members, by what they are for:

* the model: ``module`` (the architecture), ``space`` (models as flat vectors), ``device``,
  ``dtype``, :meth:`vector` (any model-like as a flat vector) and :meth:`forward` (the logits
  at a set of tensors);
* the data: ``batches`` (on the device), ``batch_fn`` (how other data become batches) and
  ``num_targets`` (the loss's divisor);
* the loss: ``loss`` (the resolved loss: per-sample values and the count of targets) and
  ``loss_name`` (its identity, which selects the analytic Gauss-Newton factors);
* scoring: :meth:`evaluate` (models), :meth:`evaluate_points` (point sets, cached),
  :meth:`fingerprint` (what determines a value), ``strategy`` and ``cache``;
* BatchNorm: ``bn`` (the mode), :meth:`apply_bn_mode` (a point's buffers under that mode) and
  :meth:`warn_interpolated_batchnorm`;
* memory: :meth:`activation_bytes` (for the budget of second-order work).
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from ..results.geometry import Metrics
from ..space.params import ModelLike, ParameterSpace
from ..space.points import PointSet
from .inputs import BatchFn, ModelInputs


class PointEvaluator(Protocol):
    """Loss and accuracy of points in one model's parameter space on fixed data.

    Attributes
    ----------
    module : torch.nn.Module
        The architecture (a private copy in eval mode on ``device``).
    space : ParameterSpace
        The model's parameters (and float buffers) as flat vectors.
    device : torch.device
    dtype : torch.dtype
    batches : list
        ``(inputs, targets)`` pairs on the device.
    batch_fn : callable or None
        ``batch -> (inputs, targets)`` for batches of other forms.
    num_targets : int
        Targets the loss counts over all of the data.
    loss : Any
        The resolved loss: ``loss.per_sample(outputs, targets)`` and ``loss.count(targets)``.
    loss_name : str
        The loss's identity (``"cross_entropy"``, ``"mse"``, ...).
    bn : str
        The BatchNorm mode (``"interpolate"``, ``"recompute"``, ``"reset"``, ...).
    strategy : str or None
        The point strategy in use (``"loop"`` or ``"vmap"``; None until chosen).
    cache : Any
        The result cache, or None.
    """

    module: nn.Module
    space: ParameterSpace
    device: torch.device
    dtype: torch.dtype
    batches: list[tuple[ModelInputs, torch.Tensor]]
    batch_fn: BatchFn | None
    num_targets: int
    loss_name: str
    bn: str
    cache: Any

    @property
    def loss(self) -> Any:
        """The resolved loss (``per_sample`` and ``count``)."""

    @property
    def strategy(self) -> str | None:
        """The point strategy in use."""

    def vector(self, model: ModelLike) -> torch.Tensor:
        """A model-like as a flat vector of :attr:`space` on the device.

        Parameters
        ----------
        model : ModelLike
            A module, state dict, checkpoint path or flat vector.

        Returns
        -------
        torch.Tensor
        """

    def forward(self, params: dict[str, torch.Tensor], x: ModelInputs, *, module: nn.Module | None = None
                ) -> torch.Tensor:
        """The logits at ``params`` on inputs ``x``.

        Parameters
        ----------
        params : dict[str, torch.Tensor]
            Tensors keyed like the architecture's state dict.
        x : ModelInputs
            A batch of inputs on the device.
        module : torch.nn.Module, optional
            Another copy of the architecture to run (e.g. in train mode).

        Returns
        -------
        torch.Tensor
        """

    def evaluate(self, models: Sequence[ModelLike] | ModelLike | torch.Tensor) -> Metrics:
        """Loss and accuracy of models.

        Parameters
        ----------
        models : model-likes or a ``(P, D)`` tensor
            The models.

        Returns
        -------
        Metrics
        """

    def evaluate_points(self, points: PointSet, *, reference: torch.Tensor | None = None, label: str = "points",
                        input_shortcut: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Loss and accuracy of every point of a point set.

        Parameters
        ----------
        points : PointSet
            The points.
        reference : torch.Tensor, optional
            The vector BatchNorm modes take buffers from.
        label : str
            The progress bar's label.
        input_shortcut : bool, optional
            Whether the exact input-layer shortcut may be used.

        Returns
        -------
        tuple of numpy.ndarray
            Loss and accuracy per point.
        """

    def fingerprint(self) -> dict[str, Any]:
        """Everything about the evaluator that determines a value.

        Returns
        -------
        dict
        """

    def apply_bn_mode(self, vecs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """Points with their BatchNorm buffers set by the mode.

        Parameters
        ----------
        vecs : torch.Tensor
            ``(P, D)`` points.
        reference : torch.Tensor
            The vector whose buffers the ``"reference"`` modes keep.

        Returns
        -------
        torch.Tensor
        """

    def warn_interpolated_batchnorm(self) -> None:
        """Warn once when interpolated BatchNorm statistics are evaluated."""

    def activation_bytes(self) -> int:
        """Bytes of the activations of one forward pass over the largest batch.

        Returns
        -------
        int
        """
