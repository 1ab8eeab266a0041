"""Rules for operations that mix positions along some axes: pooling, resampling and reductions."""
from __future__ import annotations

from typing import Any

from .slots import Rule, Slot, Unsupported, fixed_slot, op_name, pin, shape_of


def _channelwise(node: Any, env: dict) -> list[Slot]:
    """Pooling and resampling: batch and channel axes pass, the spatial axes mix."""
    src, out = env[node.args[0]], shape_of(node)
    ins = shape_of(node.args[0])
    if len(ins) < 3 or ins[:2] != out[:2]:
        raise Unsupported(f"{node.target} (graph node {node.name}) on a tensor of shape {ins}")
    pin(src[2:], f"spatial mixing in {node.target}")
    return [src[0], src[1]] + [fixed_slot(d) for d in out[2:]]


def _channelwise_pair(node: Any, env: dict) -> tuple:
    """Pooling with indices: the values and the indices both keep :func:`_channelwise`'s layout."""
    value = _channelwise(node, env)
    return (value, [Slot(s.layout) for s in value])


def _reduction(node: Any, env: dict) -> Any:
    """Sums, means, maxima over axes: reducing over units is permutation invariant.

    The reduced axes come from ``dim``; whether they are kept, from the output's rank.
    """
    src, ins = env[node.args[0]], shape_of(node.args[0])
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    dims = range(len(ins)) if dims is None or dims == [] else ([dims] if isinstance(dims, int) else dims)
    dims = {d % len(ins) for d in dims}
    keep = len(shape_of(node)) == len(ins)
    if op_name(node.target) in {"argmax", "argmin", "max", "min"}:  # indices of units move with them
        pin([src[d] for d in dims], f"indices returned by {node.target}")
    out = [(fixed_slot(1) if d in dims else src[d]) for d in range(len(ins)) if keep or d not in dims]
    return (out, [Slot(s.layout) for s in out]) if isinstance(node.meta["val"], tuple) else out


#: The rules of this module by ATen operation name.
RULES: dict[str, Rule] = dict.fromkeys(
    ("max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d "
     "adaptive_avg_pool2d _adaptive_avg_pool2d _adaptive_avg_pool3d upsample_nearest1d upsample_nearest2d "
     "upsample_bilinear2d upsample_bicubic2d upsample_linear1d").split(), _channelwise)
RULES.update(dict.fromkeys(
    "max_pool2d_with_indices max_pool3d_with_indices max_pool1d_with_indices adaptive_max_pool2d".split(),
    _channelwise_pair))
RULES.update(dict.fromkeys("mean sum amax amin var std logsumexp argmax argmin max min".split(), _reduction))
