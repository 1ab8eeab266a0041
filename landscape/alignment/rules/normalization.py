"""Rules for normalisation layers: their affine parameters and statistics follow the channels."""
from __future__ import annotations

from typing import Any

from ..units import constrain_blocks
from .slots import Rule, fixed_value_like, layout_of, shape_of, tie


def _batch_norm(node: Any, env: dict) -> tuple:
    """BatchNorm: affine parameters and running statistics tied to the channels; saved statistics fixed."""
    x = env[node.args[0]]
    channels = shape_of(node.args[0])[1]
    for p in node.args[1:5]:
        if p is not None and p in env and isinstance(env[p], list):
            tie(x[1], env[p][0], channels, f"a batch norm ({node.name})")
    return (list(x),) + tuple(fixed_value_like(v) for v in node.meta["val"][1:])


def _group_norm(node: Any, env: dict) -> tuple:
    """GroupNorm: affine parameters tied to the channels, which move only within their groups."""
    x = env[node.args[0]]
    channels, groups = node.args[4], node.args[6]
    for p in node.args[1:3]:
        if p is not None:
            tie(x[1], env[p][0], channels, f"a group norm ({node.name})")
    if 1 < groups < channels:
        constrain_blocks(layout_of(x[1], channels), channels // groups, f"a GroupNorm ({node.name})")
    return (list(x),) + tuple(fixed_value_like(v) for v in node.meta["val"][1:])


def _layer_norm(node: Any, env: dict) -> tuple:
    """LayerNorm: affine parameters tied to the normalised trailing axes."""
    x, shape = env[node.args[0]], shape_of(node.args[0])
    k = len(node.args[1])
    for p in node.args[2:4]:
        if p is not None:
            for i in range(k):
                tie(x[len(shape) - k + i], env[p][i], shape[len(shape) - k + i], f"a layer norm ({node.name})")
    return (list(x),) + tuple(fixed_value_like(v) for v in node.meta["val"][1:])


#: The rules of this module by ATen operation name.
RULES: dict[str, Rule] = {"native_batch_norm": _batch_norm, "_native_batch_norm_legit_no_training": _batch_norm,
                          "_native_batch_norm_legit": _batch_norm, "native_group_norm": _group_norm,
                          "native_layer_norm": _layer_norm}
