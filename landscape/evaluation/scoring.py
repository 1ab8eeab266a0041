"""Summed loss and correct count of a batch of model outputs, and selection of the logits.

A :class:`Scorer` turns a batch of outputs into ``(summed loss in float64, summed metric)``
(:mod:`.losses`, :mod:`.metrics`): cross-entropy is summed inside the kernel, other losses per
sample; on CPU the eager loop may score class-major logits with
:class:`~landscape.evaluation.class_major_scoring.ClassMetrics`.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from ..infra.errors import DataError
from .class_major_scoring import ClassMetrics
from .losses import Loss, resolve_loss
from .metrics import Metric, resolve_metric
from .options import OutputSelector


def select_output(out: Any, selector: OutputSelector) -> torch.Tensor:
    """The logits tensor of a model output.

    Parameters
    ----------
    out
        What the model's forward returned: a tensor, or a dict / tuple / list holding one.
    selector
        ``None`` (a tensor, or the ``logits`` entry of a dict such as a Hugging Face
        ``ModelOutput``), a key, an index, or a callable ``out -> tensor``.

    Returns
    -------
    torch.Tensor

    Raises
    ------
    DataError
        The output is not a tensor and no selector says where the logits are, or the
        selector does not fit the output.
    """
    if selector is None:
        if isinstance(out, torch.Tensor):
            return out
        if isinstance(out, Mapping) and isinstance(out.get("logits"), torch.Tensor):
            return out["logits"]
        what = (f"a dict with keys {sorted(map(str, out))[:8]}" if isinstance(out, dict)
                else f"a {type(out).__name__}")
        raise DataError(f"the model's forward returns {what}, not a tensor: pass output=<key, index "
                        "or callable> to the Evaluator (--output on the command line) to select the logits")
    try:
        chosen = selector(out) if callable(selector) else out[selector]
    except (KeyError, IndexError, TypeError) as exc:
        raise DataError(f"output={selector!r} does not select anything from the model's "
                        f"{type(out).__name__} output ({type(exc).__name__}: {exc})") from None
    if not isinstance(chosen, torch.Tensor):
        raise DataError(f"output={selector!r} selects a {type(chosen).__name__}, not a tensor of logits")
    return chosen


class Scorer:
    """``(summed loss, summed metric)`` of a batch, in float64 on the device.

    Parameters
    ----------
    loss, loss_name
        The loss (name, :class:`~landscape.evaluation.losses.Loss` or per-sample callable) and
        its identity (:func:`~landscape.evaluation.losses.loss_identity`).
    dtype
        Evaluation dtype: logits are cast to it before scoring.
    class_metrics
        The class-major scorer, when it applies (CPU, cross-entropy, accuracy, eager), else ``None``.
    metric
        The metric (name or :class:`~landscape.evaluation.metrics.Metric`; default accuracy).
    """

    def __init__(self, loss: str | Callable | Loss, loss_name: str, dtype: torch.dtype,
                 class_metrics: ClassMetrics | None = None, metric: str | Metric = "accuracy"):
        self.loss = resolve_loss(loss)
        self.loss_name = loss_name
        self.per_sample_loss = self.loss.per_sample
        self.metric = metric if isinstance(metric, Metric) else resolve_metric(metric)
        self.dtype = dtype
        self.class_metrics = class_metrics

    def __call__(self, logits: torch.Tensor, y: torch.Tensor, class_major: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Score one batch.

        Parameters
        ----------
        logits
            ``(batch, classes)`` outputs (any float dtype).
        y
            Targets.
        class_major
            True in the eager loop, where the logits may come class-major from the output layer.

        Returns
        -------
        tuple of torch.Tensor
            Summed loss (float64 scalar) and summed metric, e.g. the number correct (float64
            scalar, NaN without accuracy).
        """
        logits = logits.to(self.dtype)
        if class_major and self.class_metrics is not None:
            scored = self.class_metrics(logits, y)
            if scored is not None:
                return scored
        out, target = self.loss.align(logits, y)
        return self.loss.summed(out, target), self.metric.batch(out, target)


def scoring_plan(out: torch.Tensor, batches: Sequence[tuple[Any, torch.Tensor]], num_samples: int,
                 device: torch.device, loss_name: str, compile: bool | str, concat_bytes: int,
                 metric: str = "accuracy") -> tuple[torch.Tensor | None, ClassMetrics | None]:
    """How the loop scores a point: all batches at once, and class-major on CPU, when they fit.

    Parameters
    ----------
    out
        The model's logits on a couple of samples (for shapes and dtypes).
    batches
        The evaluation batches.
    num_samples
        Their total size.
    device, loss_name, compile
        Evaluation device, loss identity and ``torch.compile`` setting.
    concat_bytes
        Most bytes of one point's outputs over all batches that are scored in one call.
    metric
        The metric's name.

    Returns
    -------
    tuple
        The concatenated targets (or None: score batch by batch, always for batches of
        different per-sample shapes) and the class-major scorer (or None: CPU cross-entropy
        and accuracy on tensor inputs in eager mode only, bounded by ``concat_bytes``).
    """
    per_point = num_samples * out[0].numel() * out.element_size() if out.ndim else 0
    same_shapes = len({tuple(yb.shape[1:]) for _, yb in batches}) == 1
    targets = (torch.cat([yb for _, yb in batches])
               if len(batches) > 1 and same_shapes and 0 < per_point <= concat_bytes else None)
    y = batches[-1][1]
    if (device.type != "cpu" or loss_name != "cross_entropy" or metric != "accuracy" or out.ndim != 2
            or torch.is_floating_point(y) or not isinstance(batches[0][0], torch.Tensor)
            or compile is not False or per_point > concat_bytes):  # bounds its (C, N) label masks too
        return targets, None
    metrics = ClassMetrics(out.shape[1])
    metrics.prepare([yb for _, yb in batches] + ([targets] if targets is not None else []))
    return targets, metrics
