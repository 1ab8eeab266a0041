"""Test-set evaluation of a state with a module (``torch.func.functional_call``).

The loss is the sum of per-sample cross-entropies divided by the number of samples (never
a mean of batch means); sums stay on the device and are synchronised once per call.
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from landscape.infra.errors import DataError

from .outputs import logits_of


@torch.no_grad()
def evaluate(module: nn.Module, state: Mapping[str, Tensor], x: Tensor, y: Tensor, *,
             batch_size: int = 1024) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``module`` with the tensors of ``state`` on (x, y).

    Parameters
    ----------
    module : nn.Module
        The architecture; put in eval mode (BatchNorm uses the running statistics in ``state``).
    state : Mapping[str, Tensor]
        Its tensors (moved to the device of ``x``).
    x, y : Tensor
        Inputs and labels, already on the module's device.
    batch_size : int
        Samples per forward pass.

    Returns
    -------
    tuple[float, float]
        (sum of per-sample cross-entropies / N, share of correct argmax predictions).

    Raises
    ------
    DataError
        For an empty dataset.
    """
    if len(y) == 0:
        raise DataError("cannot evaluate on an empty dataset")
    module.eval()
    device = x.device
    tensors = {k: v.to(device) for k, v in state.items()}
    loss = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, len(y), batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        logits = logits_of(functional_call(module, tensors, (xb,)))
        loss += F.cross_entropy(logits.float(), yb, reduction="sum").double()
        correct += (logits.argmax(1) == yb).sum()
    return float(loss) / len(y), float(correct) / len(y)
