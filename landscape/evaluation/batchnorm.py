"""BatchNorm modes: what running statistics a point in parameter space is evaluated with.

Three modes (``EvaluatorOptions.bn``), recorded in every result and cache key:

* ``interpolate`` -- buffers are part of the flat vector and move with the parameters, exactly
  as when FedAvg averages a state_dict. Interpolated statistics generally do not match the
  interpolated network's activations, which inflates barriers between independently trained
  BatchNorm models (Jordan et al. 2022, "REPAIR").
* ``keep`` -- the reference model's buffers everywhere (path start, plane origin, first member).
* ``recompute`` -- at each point the statistics are reset, re-estimated as a cumulative
  average over ``bn_batches`` batches of ``bn_data`` in train mode, then the model is evaluated
  in eval mode (the "BN reset" used in mode-connectivity work).

Models without BatchNorm behave the same in every mode. When to use which: ``docs/batchnorm.md``.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..space.params import ParameterSpace
from .data import DeviceData
from .inputs import functional_forward


class BatchNormModes:
    """Applies one BatchNorm mode to chunks of flat vectors.

    Parameters
    ----------
    module
        The evaluator's private template copy (eval mode, on the evaluation device).
    space
        Its parameter space.
    mode
        ``"interpolate"``, ``"keep"`` or ``"recompute"``.
    data
        Batches used by ``recompute``.
    batches
        How many of them (``None``: all).
    fixed
        Tensors of the module outside the flat vector (integer buffers), on the device.
    """

    def __init__(self, module: nn.Module, space: ParameterSpace, mode: str, data: DeviceData,
                 batches: int | None, fixed: dict[str, torch.Tensor]):
        self.space = space
        self.mode = mode
        self.data = data
        self.batches = batches
        self.fixed = fixed
        self.layers = [name for name, m in module.named_modules()
                       if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self.train_module = self._train_copy(module) if mode == "recompute" and self.layers else None

    @property
    def active(self) -> bool:
        """True when this mode changes anything (the model has buffers and the mode is not ``interpolate``)."""
        return self.space.has_buffers and self.mode != "interpolate"

    def apply(self, vecs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """Flat vectors with their buffers set according to the mode.

        Parameters
        ----------
        vecs
            ``(P, D)`` flat vectors on the evaluation device.
        reference
            ``(D,)`` the reference point whose buffers ``keep`` uses.

        Returns
        -------
        torch.Tensor
            ``vecs`` itself under ``interpolate`` (or without buffers), else a modified copy.
        """
        if not self.active:
            return vecs
        buffers = ~self.space.param_mask.to(vecs.device)
        vecs = vecs.clone()
        vecs[:, buffers] = reference[buffers]
        if self.train_module is not None:
            for i in range(len(vecs)):
                vecs[i] = self.recompute(vecs[i])
        return vecs

    def recompute(self, vec: torch.Tensor) -> torch.Tensor:
        """Re-estimate the BatchNorm running statistics at ``vec`` (reset, cumulative average, eval).

        Parameters
        ----------
        vec
            ``(D,)`` flat vector on the evaluation device.

        Returns
        -------
        torch.Tensor
            The same point with its running means and variances re-estimated.
        """
        state = {k: v.clone() for k, v in self.space.unflatten(vec).items()}
        state.update({k: v.clone() for k, v in self.fixed.items()})
        for layer in self.layers:
            state[f"{layer}.running_mean"].zero_()
            state[f"{layer}.running_var"].fill_(1.0)
            if f"{layer}.num_batches_tracked" in state:
                state[f"{layer}.num_batches_tracked"].zero_()
        batches = self.data.batches if self.batches is None else self.data.batches[:self.batches]
        with torch.no_grad():
            for x, _ in batches:
                functional_forward(self.train_module, state, x)
        return self.space.flatten(state, dtype=vec.dtype, check_finite=False).to(vec.device)

    @staticmethod
    def _train_copy(module: nn.Module) -> nn.Module:
        copy_ = copy.deepcopy(module).eval()
        for m in copy_.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.train()
                m.momentum = None  # cumulative average over the given batches
        return copy_
