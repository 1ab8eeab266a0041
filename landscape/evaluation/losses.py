"""Losses and correct-prediction counts of one batch, and the identity of a loss for cache keys.

Losses are summed over samples (the evaluator divides by the sample count once, never
averaging batch means). Accuracy is the fraction of samples whose ``argmax`` output equals the
integer target (the first maximal class wins ties).
"""
from __future__ import annotations

import hashlib
from typing import Callable

import torch
from torch import nn

from ..infra.errors import ConfigError

#: Built-in per-sample losses, by name.
LOSSES = ("cross_entropy", "mse", "nll")
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def per_sample_loss_fn(loss: str | LossFn) -> LossFn:
    """Per-sample loss function for a name in :data:`LOSSES` or a user callable.

    Parameters
    ----------
    loss
        ``"cross_entropy"``, ``"nll"`` (outputs are log-probabilities), ``"mse"`` (integer
        targets are one-hot encoded; summed over output dimensions), or a callable
        ``(outputs, targets) -> per-sample losses``.

    Returns
    -------
    callable
        ``(outputs, targets) -> tensor of shape (batch,)``.

    Raises
    ------
    ConfigError
        If ``loss`` is neither a known name nor callable.
    """
    if callable(loss):
        return loss
    if loss == "cross_entropy":
        return lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    if loss == "nll":
        return lambda out, y: nn.functional.nll_loss(out, y, reduction="none")
    if loss == "mse":
        def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            if not torch.is_floating_point(y):
                y = nn.functional.one_hot(y, out.shape[-1]).to(out.dtype)
            return ((out - y) ** 2).reshape(out.shape[0], -1).sum(-1)
        return mse
    raise ConfigError(f"unknown loss {loss!r}: use one of {', '.join(LOSSES)} or a callable "
                      "(outputs, targets) -> per-sample losses")


def loss_identity(loss: str | LossFn) -> str:
    """Name of a loss for fingerprints: a callable's name plus a digest of its code and settings.

    Two different lambdas share a name, so the digest covers the bytecode, constants and
    plain-valued closure variables of functions (also inside ``functools.partial``, with its
    arguments) and the plain-valued attributes of callable objects such as
    ``nn.CrossEntropyLoss(reduction="none")``. Values read from globals are not covered.

    Parameters
    ----------
    loss
        A loss name or callable, as accepted by :func:`per_sample_loss_fn`.

    Returns
    -------
    str
        The name itself for built-in losses, else ``"module.qualname:digest"``.
    """
    plain = (bool, int, float, str, tuple, type(None))
    if isinstance(loss, str):
        return loss
    target = getattr(loss, "func", loss)
    name = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__qualname__)}"
    h = hashlib.sha256()
    code = getattr(target, "__code__", None)
    if code is not None:
        h.update(code.co_code)
        h.update(repr(code.co_consts).encode())
        cells = [c.cell_contents for c in getattr(target, "__closure__", None) or ()]
        h.update(repr([v for v in cells if isinstance(v, plain)]).encode())
    settings = {k: v for k, v in vars(loss).items() if isinstance(v, plain)
                } if hasattr(loss, "__dict__") and code is None else {}
    h.update(repr((getattr(loss, "args", ()), getattr(loss, "keywords", {}), sorted(settings.items()))).encode())
    return f"{name}:{h.hexdigest()[:12]}"


def correct_count(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Number of samples whose ``argmax`` equals the integer target, as a float64 scalar.

    Parameters
    ----------
    logits
        Outputs of shape ``(batch, classes)``.
    y
        Targets; floating-point targets (regression) have no accuracy.

    Returns
    -------
    torch.Tensor
        The count, or NaN when accuracy is undefined for these targets.
    """
    if torch.is_floating_point(y) or logits.ndim < 2:
        return torch.full((), float("nan"), dtype=torch.float64, device=logits.device)
    return (logits.argmax(-1) == y).sum().double()  # integer count, then one cast (cheaper on CPU)


def summed_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum of per-sample cross-entropies of one batch, as float64.

    Reduced inside the kernel in the evaluation dtype (ATen's pairwise summation), then cast:
    on CPU about a third cheaper than per-sample losses summed in float64, the same value to
    float rounding.

    Parameters
    ----------
    logits, y
        Outputs ``(batch, classes)`` and integer targets ``(batch,)``.

    Returns
    -------
    torch.Tensor
        A float64 scalar.
    """
    return nn.functional.cross_entropy(logits, y, reduction="sum").double()
