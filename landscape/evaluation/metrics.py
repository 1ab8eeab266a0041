"""Metrics reported next to the loss, by name: accuracy, token accuracy, top-k accuracy, perplexity.

A :class:`Metric` either sums a per-target score over a batch of aligned outputs and targets
(:meth:`~landscape.evaluation.losses.Loss.align`: for a token loss the shifted, flattened
tokens) that the evaluator divides by the loss's count, or is derived from the mean loss once
it is known (perplexity, ``exp`` of the mean token loss). Targets ``-100`` never match an output
class, so ignored tokens never count as hits. The
registry :data:`METRICS` holds ``"accuracy"`` (the default), ``"token_accuracy"`` (the same
count, named for token losses), ``"top5_accuracy"`` (any ``"top<k>_accuracy"`` is made on
first use) and ``"perplexity"``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..infra.registry import Registry

Score = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_TOP_K = re.compile(r"top([1-9][0-9]*)_accuracy")


@dataclass(frozen=True)
class Metric:
    """A metric of a point: a per-target score averaged like the loss, or a function of the mean loss.

    Attributes
    ----------
    name : str
        The name it is registered under (recorded in results and cache keys).
    score : callable, optional
        ``(outputs, targets) -> float64 scalar``: the batch's summed score of aligned outputs
        and targets (NaN where the metric is undefined, e.g. regression targets).
    from_loss : callable, optional
        ``mean loss -> value`` for metrics derived from the loss (then ``score`` is unused).
    """

    name: str
    score: Score | None = None
    from_loss: Callable[[np.ndarray], np.ndarray] | None = None

    def batch(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The batch's summed score (zero for a metric derived from the loss).

        Parameters
        ----------
        outputs, targets : torch.Tensor
            Aligned outputs and targets.

        Returns
        -------
        torch.Tensor
            A float64 scalar on the outputs' device.
        """
        if self.score is None:
            return torch.zeros((), dtype=torch.float64, device=outputs.device)
        return self.score(outputs, targets)

    def finish(self, loss: np.ndarray, value: np.ndarray) -> np.ndarray:
        """The metric's values from the mean loss and the mean score of each point.

        Parameters
        ----------
        loss, value : numpy.ndarray
            Mean loss and mean score per point.

        Returns
        -------
        numpy.ndarray
        """
        return value if self.from_loss is None else self.from_loss(loss)


def correct_count(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Number of counted targets whose ``argmax`` output equals the integer target, as a float64 scalar.

    Parameters
    ----------
    logits
        Outputs of shape ``(batch, classes)``.
    y
        Targets (``-100`` does not count); floating-point targets (regression) have no accuracy.

    Returns
    -------
    torch.Tensor
        The count, or NaN when accuracy is undefined for these targets.
    """
    if torch.is_floating_point(y) or logits.ndim < 2:
        return torch.full((), float("nan"), dtype=torch.float64, device=logits.device)
    return (logits.argmax(-1) == y).sum().double()  # integer count, then one cast (cheaper on CPU)


def top_k_accuracy(k: int) -> Metric:
    """The metric counting targets among the ``k`` largest outputs.

    Parameters
    ----------
    k : int
        How many of the largest outputs count as a hit.

    Returns
    -------
    Metric
        Named ``"top<k>_accuracy"``.
    """
    def hits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if torch.is_floating_point(y) or logits.ndim < 2:
            return torch.full((), float("nan"), dtype=torch.float64, device=logits.device)
        top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
        return (top == y.unsqueeze(-1)).any(-1).sum().double()

    return Metric(f"top{k}_accuracy", hits)


#: name -> :class:`Metric`; ``METRICS.add(name, Metric(name, ...))`` adds one.
METRICS: Registry[Metric] = Registry("metric")
METRICS.add("accuracy", Metric("accuracy", correct_count))
METRICS.add("token_accuracy", Metric("token_accuracy", correct_count))
METRICS.add("top5_accuracy", top_k_accuracy(5))
METRICS.add("perplexity", Metric("perplexity", from_loss=np.exp))


def resolve_metric(name: str) -> Metric:
    """The metric registered as ``name`` (a ``"top<k>_accuracy"`` is registered on first use).

    Parameters
    ----------
    name : str
        A name of :data:`METRICS`, or ``"top<k>_accuracy"`` for a positive integer ``k``.

    Returns
    -------
    Metric

    Raises
    ------
    ConfigError
        An unknown name (with the closest known one).
    """
    found = _TOP_K.fullmatch(name) if isinstance(name, str) else None
    if found is not None and name not in METRICS:
        METRICS.add(name, top_k_accuracy(int(found.group(1))))
    return METRICS.get(name)


__all__ = ["METRICS", "Metric", "correct_count", "resolve_metric", "top_k_accuracy"]
