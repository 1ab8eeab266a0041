"""Rules for the operations that create hidden units: matrix products, convolutions, embeddings.

The contracted axes of both operands are tied; the output axis is the weight's output axis,
so the hidden units of a Linear/Conv layer are created by its weight.
"""
from __future__ import annotations

from typing import Any

from .slots import Rule, Slot, Unsupported, fixed_slot, layout_of, op_name, pin, shape_of, tie


def _mm(node: Any, env: dict) -> list[Slot]:
    """``mm``/``addmm``/``bmm``/``baddbmm``: contracted axes tied; the output axis is the second operand's."""
    a, b = node.args[-2], node.args[-1]
    with_bias = op_name(node.target) in {"addmm", "baddbmm"}
    if with_bias:
        a, b = node.args[1], node.args[2]
    sa, sb, ka = env[a], env[b], shape_of(a)
    tie(sa[-1], sb[-2], ka[-1], f"a contraction ({node.name})")
    out = list(sa[:-1]) + [sb[-1]]
    layout_of(sb[-1], shape_of(b)[-1])
    if len(ka) == 3:
        tie(sa[0], sb[0], ka[0], f"a batched contraction ({node.name})")
    if with_bias:
        return _add_bias(node, env, node.args[0], out)
    return out


def _add_bias(node: Any, env: dict, bias: Any, out: list[Slot]) -> list[Slot]:
    """Tie the bias's axes to the output axes they broadcast along."""
    if bias not in env:
        return out
    bs, shape, full = env[bias], shape_of(bias), shape_of(node)
    for k in range(len(shape)):
        axis = len(full) - len(shape) + k
        if shape[k] == full[axis] and shape[k] > 1:
            tie(out[axis], bs[k], shape[k], f"a bias ({node.name})")
    return out


def _convolution(node: Any, env: dict) -> list[Slot]:
    """Convolution: input channels tied to the kernel's input axis; output channels are the kernel's."""
    x, w, b = node.args[0], node.args[1], node.args[2]
    transposed, groups = node.args[6], node.args[8]
    sx, sw, xs, ws, out = env[x], env[w], shape_of(x), shape_of(w), shape_of(node)
    out_axis, in_axis = (1, 0) if transposed else (0, 1)
    pin(sw[2:], "a convolution kernel's spatial axes")
    if groups == 1:
        tie(sx[1], sw[in_axis], xs[1], f"a convolution ({node.name})")
        channels = sw[out_axis]
        layout_of(channels, ws[out_axis])
    elif groups == xs[1] == out[1] and ws[1] == 1:  # depthwise: output channel c reads input channel c
        pin([sw[1]], "a depthwise kernel")
        tie(sx[1], sw[0], xs[1], f"a depthwise convolution ({node.name})")
        channels = sw[0]
    else:
        raise Unsupported(f"a grouped convolution with groups={groups} ({node.name})")
    result = [sx[0], Slot(channels.layout)] + [fixed_slot(d) for d in out[2:]]
    pin(sx[2:], "convolution spatial axes")
    if b is not None:
        tie(result[1], env[b][0], out[1], f"a convolution bias ({node.name})")
    return result


def _embedding(node: Any, env: dict) -> list[Slot]:
    """``embedding``: the weight's rows (token ids) are pinned; its feature axis is the output's last."""
    w, idx = env[node.args[0]], node.args[1]
    layout_of(w[1], shape_of(node.args[0])[1])
    pin([w[0]], "embedding rows (token ids)")
    return [fixed_slot(d) for d in shape_of(idx)] + [Slot(w[1].layout)]


#: The rules of this module by ATen operation name.
RULES: dict[str, Rule] = {"mm": _mm, "addmm": _mm, "bmm": _mm, "baddbmm": _mm, "convolution": _convolution,
                          "embedding": _embedding}
