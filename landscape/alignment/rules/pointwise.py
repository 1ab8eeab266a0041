"""Rules for operations that keep every axis: activations, arithmetic, softmax, dropout, factories."""
from __future__ import annotations

from typing import Any

from .slots import Rule, Slot, fixed_slot, fixed_value_like, layout_of, shape_of, tie


def _elementwise(node: Any, env: dict) -> list[Slot]:
    """Broadcasting elementwise ops: axes of equal length (aligned from the right) are tied."""
    out = shape_of(node)
    operands = [(env[a], shape_of(a)) for a in node.args if a in env and isinstance(env[a], list)]
    result = []
    for k in range(len(out)):
        tied = [slots[len(s) - len(out) + k] for slots, s in operands
                if len(s) - len(out) + k >= 0 and s[len(s) - len(out) + k] == out[k] and out[k] > 1]
        if not tied:
            result.append(fixed_slot(out[k]))
            continue
        for other in tied[1:]:
            tie(tied[0], other, out[k], f"an elementwise {node.target}")
        layout_of(tied[0], out[k])
        result.append(Slot(tied[0].layout))
    return result


def _same(node: Any, env: dict) -> list[Slot]:
    """Softmax-like ops along one axis are equivariant: the layout passes unchanged."""
    return list(env[node.args[0]])


def _dropout_pair(node: Any, env: dict) -> tuple:
    """``native_dropout``: the output and its mask keep the input's layout."""
    out = list(env[node.args[0]])
    return (out, [Slot(s.layout) for s in out])


def _getitem(node: Any, env: dict) -> Any:
    """One output of a multi-output operation."""
    return env[node.args[0]][node.args[1]]


def _factory(node: Any, env: dict) -> Any:
    """Tensor factories (``zeros``, ``arange``, ``randn``, ...): every axis is fixed."""
    return fixed_value_like(node.meta.get("val"))


#: The rules of this module by ATen operation name.
RULES: dict[str, Rule] = {"getitem": _getitem, "native_dropout": _dropout_pair}
RULES.update(dict.fromkeys(
    ("relu relu_ leaky_relu leaky_relu_ gelu silu silu_ sigmoid tanh hardtanh hardtanh_ elu elu_ "
     "hardswish hardsigmoid mish softplus clone detach alias dropout _to_copy lift_fresh_copy contiguous "
     "neg abs exp sqrt rsqrt pow mul mul_ add add_ sub sub_ div div_ maximum minimum where clamp "
     "clamp_min clamp_max square erf log log1p reciprocal sin cos masked_fill").split(), _elementwise))
RULES.update(dict.fromkeys("_softmax softmax _log_softmax log_softmax".split(), _same))
RULES.update(dict.fromkeys(
    "empty zeros ones full arange scalar_tensor empty_like zeros_like ones_like full_like rand randn".split(),
    _factory))
