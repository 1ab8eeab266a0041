"""The logits of a model's output: a tensor, or a Hugging Face ``ModelOutput`` / dict with ``"logits"``.

``fl`` trains and evaluates classifiers whose forward returns logits of shape ``(N, C)``.
Hugging Face models (``ViTForImageClassification``, a ``peft`` wrapper of one) return a
``ModelOutput``, a dict whose ``"logits"`` entry holds them.

>>> import torch
>>> logits_of({"logits": torch.zeros(2, 3), "hidden_states": None}).shape
torch.Size([2, 3])
"""
from __future__ import annotations

from typing import Any, Mapping

from torch import Tensor

from landscape.infra.errors import DataError


def logits_of(output: Any) -> Tensor:
    """The logits tensor in a model's output.

    Parameters
    ----------
    output : Tensor or Mapping
        What the model's forward returned: the logits, or a ``ModelOutput``/dict holding them
        under ``"logits"``.

    Returns
    -------
    Tensor
        The logits.

    Raises
    ------
    DataError
        When the output is neither.
    """
    if isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping) and isinstance(output.get("logits"), Tensor):
        return output["logits"]
    what = f"a dict with keys {sorted(map(str, output))[:6]}" if isinstance(output, Mapping) else \
        f"a {type(output).__name__}"
    raise DataError(f"the model's forward returns {what}; fl trains models that return logits, or a "
                    "Hugging Face ModelOutput/dict with 'logits'")
