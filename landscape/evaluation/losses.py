"""Losses by name: a batch's summed loss and the number of targets that count.

A :class:`Loss` returns, for one batch, its summed loss and its count (samples, or non-ignored
tokens for a language model); the evaluator divides the sum over all batches by the total
count once, so a mean is over the whole data set, never a mean of batch means. The built-in
losses live in the :data:`LOSSES` registry:

* ``"cross_entropy"``, ``"nll"`` (outputs are log-probabilities), ``"mse"`` (integer targets
  one-hot encoded, summed over output dimensions): one target per sample;
* ``"causal_lm"``: token cross-entropy of ``(N, T, V)`` logits against ``(N, T)`` labels
  shifted by one position (the logits at position ``t`` predict the label at ``t + 1``, as
  Hugging Face causal language models do), labels ``-100`` ignored;
* ``"masked_lm"`` and ``"token"``: the same without the shift (masked language models, token
  classification).

A user callable ``(outputs, targets) -> per-sample losses`` is still accepted (one target per
sample); a new named loss is one ``LOSSES.add(name, Loss(...))``. Accuracy-like metrics are in
:mod:`.metrics`.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..infra.errors import ConfigError
from ..infra.registry import Registry

#: Label of a token that does not count (padding, prompt), as in Hugging Face.
IGNORE_INDEX = -100
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Loss:
    """A loss of model outputs against targets: summed per batch, with the number of targets that count.

    Attributes
    ----------
    name : str
        The name it is registered under (recorded in results and cache keys).
    fn : callable
        ``(outputs, targets) -> losses``, one per target of the aligned outputs (see
        :meth:`align`); for token losses ignored targets must give 0.
    summed_fn : callable, optional
        ``(outputs, targets) -> float64 scalar``: the summed loss computed in one kernel
        (default: ``fn`` summed in float64).
    shift : int, optional
        ``None`` for one target per sample; for token losses the number of positions the
        targets are shifted by against the outputs (1 for causal language models, 0 otherwise).
    """

    name: str
    fn: LossFn
    summed_fn: LossFn | None = None
    shift: int | None = None

    @property
    def tokens(self) -> bool:
        """True for a token loss (``(N, T, V)`` outputs against ``(N, T)`` labels)."""
        return self.shift is not None

    def align(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs and targets paired one to one: for token losses shifted and flattened.

        Parameters
        ----------
        outputs : torch.Tensor
            The model's outputs on a batch.
        targets : torch.Tensor
            The batch's targets.

        Returns
        -------
        tuple of torch.Tensor
            ``(outputs, targets)`` unchanged for sample losses; ``(M, V)`` logits and ``(M,)``
            labels for token losses, ``M = N (T - shift)``.
        """
        if self.shift is None:
            return outputs, targets
        if self.shift:
            outputs, targets = outputs[:, :-self.shift], targets[:, self.shift:]
        return outputs.reshape(-1, outputs.shape[-1]), targets.reshape(-1)

    def per_sample(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Loss of each sample (for token losses the sum over its counted tokens).

        Parameters
        ----------
        outputs, targets : torch.Tensor
            A batch of outputs and its targets.

        Returns
        -------
        torch.Tensor
            Shape ``(batch,)``.
        """
        values = self.fn(*self.align(outputs, targets))
        return values.view(len(targets), -1).sum(1) if self.tokens else values

    def summed(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The batch's summed loss of aligned outputs and targets (see :meth:`align`), in float64.

        Parameters
        ----------
        outputs, targets : torch.Tensor
            Aligned outputs and targets.

        Returns
        -------
        torch.Tensor
            A float64 scalar.
        """
        if self.summed_fn is not None:
            return self.summed_fn(outputs, targets)
        return self.fn(outputs, targets).sum(dtype=torch.float64)

    def count(self, targets: torch.Tensor) -> int:
        """Number of targets of a batch that count: its samples, or its non-ignored (shifted) tokens.

        Parameters
        ----------
        targets : torch.Tensor
            The batch's targets.

        Returns
        -------
        int
        """
        if self.shift is None:
            return len(targets)
        return int((targets[:, self.shift:] != IGNORE_INDEX).sum())

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The batch's summed loss (float64 scalar) and its count."""
        return self.summed(*self.align(outputs, targets)), self.count(targets)


def _cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out, y, reduction="none", ignore_index=IGNORE_INDEX)


def _nll(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.nll_loss(out, y, reduction="none")


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if not torch.is_floating_point(y):
        y = nn.functional.one_hot(y, out.shape[-1]).to(out.dtype)
    return ((out - y) ** 2).reshape(out.shape[0], -1).sum(-1)


def summed_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum of per-sample cross-entropies of one batch, as float64 (targets ``-100`` ignored).

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
    return nn.functional.cross_entropy(logits, y, reduction="sum", ignore_index=IGNORE_INDEX).double()


#: name -> :class:`Loss`; ``LOSSES.add(name, Loss(name, ...))`` adds one.
LOSSES: Registry[Loss] = Registry("loss")
for _loss in (Loss("cross_entropy", _cross_entropy, summed_cross_entropy), Loss("nll", _nll), Loss("mse", _mse),
              Loss("causal_lm", _cross_entropy, summed_cross_entropy, shift=1),
              Loss("masked_lm", _cross_entropy, summed_cross_entropy, shift=0),
              Loss("token", _cross_entropy, summed_cross_entropy, shift=0)):
    LOSSES.add(_loss.name, _loss)


def resolve_loss(loss: str | LossFn) -> Loss:
    """The :class:`Loss` for a registered name or a per-sample callable.

    Parameters
    ----------
    loss
        A name of :data:`LOSSES`, a :class:`Loss`, or a callable ``(outputs, targets) ->
        per-sample losses``.

    Returns
    -------
    Loss

    Raises
    ------
    ConfigError
        If ``loss`` is neither a registered name nor callable.
    """
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str):
        return LOSSES.get(loss)
    if callable(loss):
        return Loss(loss_identity(loss), loss)
    raise ConfigError(f"loss must be one of {', '.join(LOSSES)} or a callable (outputs, targets) -> per-sample "
                      f"losses, got {type(loss).__name__}")


def per_sample_loss_fn(loss: str | LossFn) -> LossFn:
    """Per-sample loss function for a name in :data:`LOSSES` or a user callable.

    Parameters
    ----------
    loss
        A registered name (see the module docstring) or a callable
        ``(outputs, targets) -> per-sample losses``.

    Returns
    -------
    callable
        ``(outputs, targets) -> tensor of shape (batch,)`` (for token losses each sample's
        summed token losses).

    Raises
    ------
    ConfigError
        If ``loss`` is neither a known name nor callable.
    """
    return resolve_loss(loss).per_sample


def loss_identity(loss: str | LossFn) -> str:
    """Name of a loss for fingerprints: a callable's name plus a digest of its code and settings.

    Two different lambdas share a name, so the digest covers the bytecode, constants and
    plain-valued closure variables of functions (also inside ``functools.partial``, with its
    arguments) and the plain-valued attributes of callable objects such as
    ``nn.CrossEntropyLoss(reduction="none")``. Values read from globals are not covered.

    Parameters
    ----------
    loss
        A loss name, :class:`Loss` or callable, as accepted by :func:`resolve_loss`.

    Returns
    -------
    str
        The name itself for registered losses, else ``"module.qualname:digest"``.
    """
    plain = (bool, int, float, str, tuple, type(None))
    if isinstance(loss, str):
        return loss
    if isinstance(loss, Loss):  # a registered loss by its name, another one also by its function
        return loss.name if LOSSES.find(loss.name) is loss else f"{loss.name}:{loss_identity(loss.fn)}"
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
