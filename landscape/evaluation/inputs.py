"""Batches as they come: the one adapter from a batch to ``(model inputs, targets)``.

A batch is a pair or longer tuple/list ``(inputs, targets, ...)``, a dict such as
``{"input_ids", "attention_mask", "labels"}`` (the ``labels`` entry, or ``label``, is the
targets, the other entries are the model's keyword arguments; where an ``attention_mask`` has
the labels' shape, masked positions get the ignored label ``-100``), or anything a user's
``batch_fn(batch) -> (model_inputs, targets)`` maps. Model inputs are a tensor (one positional
argument), a tuple of tensors (positional arguments) or a dict of tensors (keyword arguments).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Union

import torch
from torch import nn
from torch.func import functional_call

from ..infra.errors import DataError
from .losses import IGNORE_INDEX

ModelInputs = Union[torch.Tensor, tuple, dict]
BatchFn = Callable[[Any], tuple[Any, torch.Tensor]]
LABEL_KEYS = ("labels", "label")


def to_pair(batch: Any, batch_fn: BatchFn | None = None) -> tuple[ModelInputs, torch.Tensor]:
    """``(model inputs, targets)`` of one batch, detached and on the CPU.

    Parameters
    ----------
    batch
        A tuple/list ``(inputs, targets, ...)`` or a dict with a ``labels`` entry (see the
        module docstring); anything else needs ``batch_fn``.
    batch_fn
        The user's ``batch -> (model_inputs, targets)``, applied first when given.

    Returns
    -------
    tuple
        The model inputs (tensor, tuple or dict of tensors) and the targets tensor.

    Raises
    ------
    DataError
        A batch of another form, a ``batch_fn`` that fails or returns something else, or inputs
        and targets that are not tensors.
    """
    if batch_fn is not None:
        try:
            batch = batch_fn(batch)
        except Exception as exc:  # any error of the user's function
            raise DataError(f"batch_fn failed on a batch: {type(exc).__name__}: {exc}") from None
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise DataError(f"batch_fn must return a pair (model_inputs, targets), got {type(batch).__name__}")
    if isinstance(batch, Mapping):
        inputs, targets = _from_dict(batch)
    elif isinstance(batch, (tuple, list)) and len(batch) >= 2:
        inputs, targets = batch[0], batch[1]
    else:
        raise DataError(f"each batch must be an (inputs, targets) pair or a dict with 'labels', got "
                        f"{type(batch).__name__}; pass batch_fn=<batch -> (model_inputs, targets)> for other forms")
    if isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(targets, torch.Tensor) or not _all_tensors(inputs):
        raise DataError("inputs and targets must be tensors (the inputs may also be a tuple or dict of "
                        f"tensors), got {type(inputs).__name__} and {type(targets).__name__}")
    return map_tensors(inputs, lambda t: t.detach().cpu()), targets.detach().cpu()


def _from_dict(batch: Mapping) -> tuple[dict, torch.Tensor]:
    key = next((k for k in LABEL_KEYS if k in batch), None)
    if key is None:
        raise DataError(f"a dict batch needs a 'labels' entry (its keys: {', '.join(map(str, batch))}); pass "
                        "batch_fn=<batch -> (model_inputs, targets)> to say where the targets are")
    inputs = {k: v for k, v in batch.items() if k != key}
    labels, mask = batch[key], inputs.get("attention_mask")
    if isinstance(labels, torch.Tensor) and isinstance(mask, torch.Tensor) and mask.shape == labels.shape:
        labels = labels.masked_fill(mask == 0, IGNORE_INDEX)
    return inputs, labels


def _all_tensors(inputs: Any) -> bool:
    parts = inputs.values() if isinstance(inputs, dict) else inputs if isinstance(inputs, tuple) else (inputs,)
    return all(isinstance(t, torch.Tensor) for t in parts)


def map_tensors(inputs: ModelInputs, fn: Callable[[torch.Tensor], torch.Tensor]) -> ModelInputs:
    """``fn`` applied to every tensor of the model inputs, keeping their structure.

    Parameters
    ----------
    inputs
        A tensor, a tuple or a dict of tensors.
    fn
        ``tensor -> tensor``.

    Returns
    -------
    ModelInputs
        The same structure.
    """
    if isinstance(inputs, dict):
        return {k: fn(v) for k, v in inputs.items()}
    if isinstance(inputs, tuple):
        return tuple(fn(v) for v in inputs)
    return fn(inputs)


def tensors(inputs: ModelInputs) -> list[tuple[str, torch.Tensor]]:
    """The named tensors of the model inputs (name ``""`` for a single tensor, the position or key else).

    Parameters
    ----------
    inputs
        A tensor, a tuple or a dict of tensors.

    Returns
    -------
    list of (str, torch.Tensor)
    """
    if isinstance(inputs, dict):
        return list(inputs.items())
    if isinstance(inputs, tuple):
        return [(str(i), t) for i, t in enumerate(inputs)]
    return [("", inputs)]


def input_length(inputs: ModelInputs) -> int:
    """Number of samples of the model inputs (the first axis of their first tensor).

    Parameters
    ----------
    inputs
        A tensor, a tuple or a dict of tensors.

    Returns
    -------
    int
    """
    return len(tensors(inputs)[0][1])


def leading(inputs: ModelInputs, n: int) -> ModelInputs:
    """The first ``n`` samples of the model inputs.

    Parameters
    ----------
    inputs
        A tensor, a tuple or a dict of tensors.
    n
        How many samples.

    Returns
    -------
    ModelInputs
    """
    return map_tensors(inputs, lambda t: t[:n])


def describe(inputs: ModelInputs) -> str:
    """The per-sample shapes of the model inputs, for messages.

    Parameters
    ----------
    inputs
        A tensor, a tuple or a dict of tensors.

    Returns
    -------
    str
        e.g. ``"shape (1, 28, 28)"`` or ``"input_ids (32,), attention_mask (32,)"``.
    """
    if isinstance(inputs, torch.Tensor):
        return f"shape {tuple(inputs.shape[1:])}"
    return ", ".join(f"{name} {tuple(t.shape[1:])}" for name, t in tensors(inputs))


def flat_hint(forward: Callable[[torch.Tensor], Any], inputs: ModelInputs) -> str:
    """A hint for a model that refused multi-axis inputs but accepts them flattened, else ``""``.

    Parameters
    ----------
    forward
        The model's forward on a batch of inputs.
    inputs
        The batch the model refused.

    Returns
    -------
    str
        e.g. ``"; it accepts them flattened to shape (64,): pass inputs.reshape(len(inputs), -1)
        (on the command line: --flatten)"``.
    """
    if not isinstance(inputs, torch.Tensor) or inputs.ndim <= 2:
        return ""
    flat = inputs.reshape(len(inputs), -1)
    try:
        with torch.no_grad():
            forward(flat)
    except Exception:  # the flat form does not fit either: no hint
        return ""
    return (f"; it accepts them flattened to shape ({flat.shape[1]},): pass inputs.reshape(len(inputs), -1) "
            "(on the command line: --flatten)")


def call_model(module: nn.Module, inputs: ModelInputs) -> Any:
    """``module`` applied to the model inputs (a dict as keyword arguments, a tuple as positional ones).

    Parameters
    ----------
    module
        The model.
    inputs
        A tensor, a tuple or a dict of tensors.

    Returns
    -------
    Any
        What the model's forward returns.
    """
    if isinstance(inputs, dict):
        return module(**inputs)
    return module(*inputs) if isinstance(inputs, tuple) else module(inputs)


def functional_forward(module: nn.Module, params: Mapping[str, torch.Tensor], inputs: ModelInputs) -> Any:
    """``torch.func.functional_call`` of ``module`` with ``params`` on the model inputs (tied weights kept).

    Parameters
    ----------
    module
        The model.
    params
        Tensors keyed like its state_dict.
    inputs
        A tensor, a tuple or a dict of tensors.

    Returns
    -------
    Any
        What the model's forward returns.
    """
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else (
        inputs if isinstance(inputs, tuple) else (inputs,), None)
    return functional_call(module, params, args, kwargs, tie_weights=True)


def output_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of a model's output (nested in tuples, lists or dicts); caches and other objects dropped.

    Parameters
    ----------
    out : Any
        What the model returned (a tensor, a tuple, a Hugging Face output object, ...).

    Returns
    -------
    list[torch.Tensor]
        Its tensors in order: those the trace fixes as the model output.
    """
    if isinstance(out, torch.Tensor):
        return [out]
    items = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else ()
    return [t for item in items for t in output_tensors(item)]
