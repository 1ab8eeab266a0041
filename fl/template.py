"""The run's template module.

Built from the configuration (zoo name or the user's module), checked against the data
before any file is written, and digested (to tell two custom models of one class apart).
"""
from __future__ import annotations

import copy
import hashlib
from typing import Any, Mapping

import torch
from torch import nn

from landscape.infra.errors import ConfigError, DataError


def build_template(config: Mapping[str, Any], model: Any = None) -> nn.Module:
    """The plain architecture of a run with its initial weights.

    Parameters
    ----------
    config : Mapping[str, Any]
        A stored configuration (``model``, ``num_classes``, ``input_shape``, ``seed``).
    model : nn.Module or callable, optional
        The user's module, required when ``config["model"]`` is ``"custom:..."``.

    Returns
    -------
    nn.Module
        A new module (deterministic initialisation from the run seed for zoo models).

    Raises
    ------
    ConfigError
        For a custom-model run opened without its module.
    """
    from .models import build_model

    custom = str(config["model"]).startswith("custom:")
    if custom and model is None:
        raise ConfigError(f"this run was trained with a custom model ({config['model']}); "
                          "pass that nn.Module as model=")
    return build_model(model if custom else config["model"], num_classes=int(config["num_classes"]),
                       input_shape=tuple(config["input_shape"]), seed=int(config["seed"]))


def check_model_fits(template: nn.Module, bundle: Any) -> None:
    """Raise ``DataError`` when the model cannot classify the data (before any file is written).

    Parameters
    ----------
    template : nn.Module
        The run's module (copied; never modified).
    bundle : DataBundle
        The dataset (``train_x``, ``num_classes``, ``name``).

    Raises
    ------
    DataError
        When the forward pass fails on two training inputs, or gives fewer logits than classes.
    """
    x = bundle.train_x[:2]
    try:
        with torch.no_grad():
            out = copy.deepcopy(template).eval()(x)
        out = out["logits"] if isinstance(out, dict) and "logits" in out else out  # Hugging Face ModelOutput
    except Exception as exc:  # any shape error of the user's model
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise DataError(f"the model cannot be applied to {bundle.name} inputs of shape "
                        f"{tuple(x.shape[1:])}: {type(exc).__name__}: {first}") from None
    if not isinstance(out, torch.Tensor) or out.ndim != 2 or out.shape[1] < bundle.num_classes:
        shape = tuple(out.shape[1:]) if isinstance(out, torch.Tensor) else type(out).__name__
        raise DataError(f"the model outputs {shape} per sample but {bundle.name} has {bundle.num_classes} "
                        f"classes: it needs a tensor of at least {bundle.num_classes} logits")


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 (16 hex digits) of a state_dict's names and raw bytes.

    Parameters
    ----------
    state : Mapping[str, torch.Tensor]
        The state.

    Returns
    -------
    str
        The digest.
    """
    h = hashlib.sha256()
    for name, t in state.items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
