"""How each ATen operation moves hidden units from its inputs to its outputs.

A rule takes an ``torch.fx`` node and the environment (node -> list of :class:`Slot`, one per
axis, or a tuple of such lists for multi-output operations) and returns the node's value.
A slot of a parameter starts empty: the first operation that meets it gives it a layout
(new free units if it becomes an output axis, the other operand's layout if it is
contracted or added). Rules raise :class:`Unsupported` for what they cannot permute.
"""
from __future__ import annotations

from math import prod
from typing import Any, Callable

from .units import Layout, constrain_blocks, fix, fixed_layout, fresh_layout, is_fixed, unify


class Unsupported(Exception):
    """The operation does not commute with a permutation of the units it touches."""


class Slot:
    """The layout of one axis of one value (``None``: a parameter axis not met yet)."""

    __slots__ = ("layout",)

    def __init__(self, layout: Layout | None):
        self.layout = layout


def layout_of(slot: Slot, length: int) -> Layout:
    """The slot's layout, creating new free units for an empty parameter axis."""
    if slot.layout is None:
        slot.layout = fresh_layout(length)
    return slot.layout


def tie(a: Slot, b: Slot, length: int, why: str) -> None:
    """The two axes hold the same units position by position."""
    if a.layout is None and b.layout is None:
        a.layout = b.layout = fresh_layout(length)
    elif a.layout is None:
        a.layout = b.layout
    elif b.layout is None:
        b.layout = a.layout
    else:
        unify(a.layout, b.layout, why)


def pin(slots: list[Slot], why: str) -> None:
    """These axes never move."""
    for s in slots:
        if s.layout is None:
            s.layout = fixed_layout(1, why)  # an untouched parameter axis: nothing to pin
        else:
            fix(s.layout, why)


def _shape(node: Any) -> tuple[int, ...]:
    val = node.meta["val"]
    return tuple((val[0] if isinstance(val, (list, tuple)) else val).shape)


def _fixed(n: int, why: str = "") -> Slot:
    return Slot(fixed_layout(n, why))


# ------------------------------------------------------------------ elementwise
def elementwise(node: Any, env: dict) -> list[Slot]:
    """Broadcasting elementwise ops: axes of equal length (aligned from the right) are tied."""
    out = _shape(node)
    operands = [(env[a], _shape(a)) for a in node.args if a in env and isinstance(env[a], list)]
    result = []
    for k in range(len(out)):
        tied = [slots[len(s) - len(out) + k] for slots, s in operands
                if len(s) - len(out) + k >= 0 and s[len(s) - len(out) + k] == out[k] and out[k] > 1]
        if not tied:
            result.append(_fixed(out[k]))
            continue
        for other in tied[1:]:
            tie(tied[0], other, out[k], f"an elementwise {node.target}")
        layout_of(tied[0], out[k])
        result.append(Slot(tied[0].layout))
    return result


def channelwise(node: Any, env: dict) -> list[Slot]:
    """Pooling and resampling: batch and channel axes pass, the spatial axes mix."""
    src, out = env[node.args[0]], _shape(node)
    ins = _shape(node.args[0])
    if len(ins) < 3 or ins[:2] != out[:2]:
        raise Unsupported(f"{node.target} (graph node {node.name}) on a tensor of shape {ins}")
    pin(src[2:], f"spatial mixing in {node.target}")
    return [src[0], src[1]] + [_fixed(d) for d in out[2:]]


def channelwise_pair(node: Any, env: dict) -> tuple:
    """Pooling with indices: the values and the indices both keep :func:`channelwise`'s layout."""
    value = channelwise(node, env)
    return (value, [Slot(s.layout) for s in value])


def reduction(node: Any, env: dict) -> Any:
    """Sums, means, maxima over axes: reducing over units is permutation invariant (the
    reduced axes come from ``dim``; whether they are kept, from the output's rank)."""
    src, ins = env[node.args[0]], _shape(node.args[0])
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    dims = range(len(ins)) if dims is None or dims == [] else ([dims] if isinstance(dims, int) else dims)
    dims = {d % len(ins) for d in dims}
    keep = len(_shape(node)) == len(ins)
    if _op(node) in {"argmax", "argmin", "max", "min"}:  # indices of units move with them
        pin([src[d] for d in dims], f"indices returned by {node.target}")
    out = [(_fixed(1) if d in dims else src[d]) for d in range(len(ins)) if keep or d not in dims]
    return (out, [Slot(s.layout) for s in out]) if isinstance(node.meta["val"], tuple) else out


def same(node: Any, env: dict) -> list[Slot]:
    """Softmax-like ops along one axis are equivariant: the layout passes unchanged."""
    return list(env[node.args[0]])


# ---------------------------------------------------------------------- shapes
def reshape(node: Any, env: dict) -> list[Slot]:
    """``view``/``reshape``: merged axes keep their units in an (outer, units, inner) view."""
    src, ins, out = env[node.args[0]], _shape(node.args[0]), _shape(node)
    items = [(s, d) for s, d in zip(src, ins) if d != 1]
    pin([s for s, d in zip(src, ins) if d == 1 and s.layout is None], "a size-1 axis")
    result: list[Slot] = []
    i = 0
    j = 0
    while j < len(out):
        if out[j] == 1:
            result.append(_fixed(1))
            j += 1
            continue
        group_in, group_out = [items[i]], [out[j]]
        i, j = i + 1, j + 1
        while prod(d for _, d in group_in) != prod(group_out):
            if prod(d for _, d in group_in) < prod(group_out):
                group_in.append(items[i])
                i += 1
            else:
                group_out.append(out[j])
                j += 1
        result += _regroup(group_in, group_out, node)
    return result


def _regroup(group_in: list[tuple[Slot, int]], group_out: list[int], node: Any) -> list[Slot]:
    if len(group_in) == 1 and len(group_out) == 1:
        return [group_in[0][0]]
    why = f"a reshape that splits or interleaves hidden units across axes ({node.target}, graph node {node.name})"
    carrying = [k for k, (s, d) in enumerate(group_in) if s.layout is not None and not is_fixed(s.layout)]
    if not carrying:  # positions that never move (batch, spatial, data axes; unmet parameter axes)
        pin([s for s, _ in group_in], why)
        return [_fixed(d) for d in group_out]
    if len(group_out) == 1:  # merge: one axis may carry units, the others become outer/inner
        if len(carrying) > 1:
            raise Unsupported(why)
        k = carrying[0]
        lay = group_in[k][0].layout
        outer = prod(d for _, d in group_in[:k]) * lay.outer
        inner = lay.inner * prod(d for _, d in group_in[k + 1:])
        pin([s for s, _ in group_in[:k] + group_in[k + 1:]], why)
        return [Slot(Layout(outer, lay.runs, inner))]
    if len(group_in) == 1:  # split one axis into several
        slot, _ = group_in[0]
        lay = slot.layout
        block = lay.units * lay.inner
        for k in range(len(group_out)):
            after = prod(group_out[k + 1:])
            if lay.inner % after == 0 and prod(group_out[k:]) % block == 0:
                outer_k = prod(group_out[k:]) // block
                if outer_k * lay.units * (lay.inner // after) == group_out[k]:
                    return ([_fixed(d) for d in group_out[:k]]
                            + [Slot(Layout(outer_k, lay.runs, lay.inner // after))]
                            + [_fixed(d) for d in group_out[k + 1:]])
    raise Unsupported(why)


def transpose(node: Any, env: dict) -> list[Slot]:
    """``t``/``transpose``/``permute``: the axes' slots are reordered as the axes are."""
    src = env[node.args[0]]
    op = _op(node)
    if op in {"t", "numpy_T"}:
        return list(reversed(src)) if len(src) == 2 else list(src)
    if op == "permute":
        return [src[d % len(src)] for d in node.args[1]]
    a, b = node.args[1] % len(src), node.args[2] % len(src)
    out = list(src)
    out[a], out[b] = src[b], src[a]
    return out


def expand(node: Any, env: dict) -> list[Slot]:
    """``expand``: axes of unchanged length keep their slots; new or broadcast axes are fixed."""
    src, ins, out = env[node.args[0]], _shape(node.args[0]), _shape(node)
    lead = len(out) - len(ins)
    return [(src[k - lead] if k >= lead and ins[k - lead] == out[k] else _fixed(out[k])) for k in range(len(out))]


def slice_(node: Any, env: dict) -> list[Slot]:
    """``slice``: a sliced axis is fixed; slicing hidden units raises :class:`Unsupported`."""
    src, ins, out = env[node.args[0]], _shape(node.args[0]), _shape(node)
    dim = (node.args[1] if len(node.args) > 1 else 0) % len(ins)
    result = list(src)
    if ins[dim] != out[dim]:
        if src[dim].layout is not None and not is_fixed(src[dim].layout):
            raise Unsupported(f"a slice of hidden units on axis {dim} ({node.target}, graph node {node.name})")
        result[dim] = _fixed(out[dim])
    return result


def pad(node: Any, env: dict) -> list[Slot]:
    """``constant_pad_nd``: padded positions along a unit axis are new (zero) units."""
    src, ins = env[node.args[0]], _shape(node.args[0])
    amounts = list(node.args[1])
    result = list(src)
    for k in range(len(amounts) // 2):
        dim = len(ins) - 1 - k
        lo, hi = amounts[2 * k], amounts[2 * k + 1]
        if lo == 0 and hi == 0:
            continue
        lay = src[dim].layout
        if lay is None or is_fixed(lay):
            result[dim] = _fixed(ins[dim] + lo + hi)
            continue
        if lo < 0 or hi < 0 or lay.outer != 1 or lay.inner != 1:
            raise Unsupported(f"padding that crops or interleaves hidden units ({node.target}, graph node {node.name})")
        runs = ((fresh_layout(lo).runs if lo else ()) + lay.runs + (fresh_layout(hi).runs if hi else ()))
        result[dim] = Slot(Layout(1, runs, 1))
    return result


def cat(node: Any, env: dict) -> list[Slot]:
    """``cat``: other axes are tied across the parts; along ``dim`` the parts' runs are concatenated."""
    parts = [(env[a], _shape(a)) for a in node.args[0]]
    out = _shape(node)
    dim = (node.args[1] if len(node.args) > 1 else 0) % len(out)
    result = []
    for k in range(len(out)):
        if k != dim:
            for slots, s in parts[1:]:
                tie(parts[0][0][k], slots[k], out[k], f"a concatenation ({node.name})")
            result.append(Slot(layout_of(parts[0][0][k], out[k])))
            continue
        lays = [layout_of(slots[k], s[k]) for slots, s in parts]
        if all(is_fixed(lay) for lay in lays):
            result.append(_fixed(out[k]))
        elif any(lay.outer != 1 or lay.inner != 1 for lay in lays):
            raise Unsupported(f"a concatenation of flattened hidden units ({node.name})")
        else:
            result.append(Slot(Layout(1, tuple(r for lay in lays for r in lay.runs), 1)))
    return result


# ---------------------------------------------------------------- contractions
def mm(node: Any, env: dict) -> list[Slot]:
    """``mm``/``addmm``/``bmm``/``baddbmm``: contracted axes tied; the output axis is the second operand's."""
    a, b = node.args[-2], node.args[-1]
    if _op(node) in {"addmm", "baddbmm"}:
        a, b = node.args[1], node.args[2]
    sa, sb, ka = env[a], env[b], _shape(a)
    tie(sa[-1], sb[-2], ka[-1], f"a contraction ({node.name})")
    out = list(sa[:-1]) + [sb[-1]]
    layout_of(sb[-1], _shape(b)[-1])
    if len(ka) == 3:
        tie(sa[0], sb[0], ka[0], f"a batched contraction ({node.name})")
    if _op(node) in {"addmm", "baddbmm"}:
        return _add_bias(node, env, node.args[0], out)
    return out


def _add_bias(node: Any, env: dict, bias: Any, out: list[Slot]) -> list[Slot]:
    if bias not in env:
        return out
    bs, shape, full = env[bias], _shape(bias), _shape(node)
    for k in range(len(shape)):
        axis = len(full) - len(shape) + k
        if shape[k] == full[axis] and shape[k] > 1:
            tie(out[axis], bs[k], shape[k], f"a bias ({node.name})")
    return out


def convolution(node: Any, env: dict) -> list[Slot]:
    """Convolution: input channels tied to the kernel's input axis; output channels are the kernel's."""
    x, w, b = node.args[0], node.args[1], node.args[2]
    transposed, groups = node.args[6], node.args[8]
    sx, sw, xs, ws, out = env[x], env[w], _shape(x), _shape(w), _shape(node)
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
    result = [sx[0], Slot(channels.layout)] + [_fixed(d) for d in out[2:]]
    pin(sx[2:], "convolution spatial axes")
    if b is not None:
        tie(result[1], env[b][0], out[1], f"a convolution bias ({node.name})")
    return result


def batch_norm(node: Any, env: dict) -> tuple:
    """BatchNorm: affine parameters and running statistics tied to the channels; saved statistics fixed."""
    x = env[node.args[0]]
    channels = _shape(node.args[0])[1]
    for p in node.args[1:5]:
        if p is not None and p in env and isinstance(env[p], list):
            tie(x[1], env[p][0], channels, f"a batch norm ({node.name})")
    out = list(x)
    return (out,) + tuple(_fixed_value_like(v) for v in node.meta["val"][1:])


def group_norm(node: Any, env: dict) -> tuple:
    """GroupNorm: affine parameters tied to the channels, which move only within their groups."""
    x = env[node.args[0]]
    channels, groups = node.args[4], node.args[6]
    for p in node.args[1:3]:
        if p is not None:
            tie(x[1], env[p][0], channels, f"a group norm ({node.name})")
    if 1 < groups < channels:
        constrain_blocks(layout_of(x[1], channels), channels // groups, f"a GroupNorm ({node.name})")
    return (list(x),) + tuple(_fixed_value_like(v) for v in node.meta["val"][1:])


def layer_norm(node: Any, env: dict) -> tuple:
    """LayerNorm: affine parameters tied to the normalised trailing axes."""
    x, shape = env[node.args[0]], _shape(node.args[0])
    k = len(node.args[1])
    for p in node.args[2:4]:
        if p is not None:
            for i in range(k):
                tie(x[len(shape) - k + i], env[p][i], shape[len(shape) - k + i], f"a layer norm ({node.name})")
    return (list(x),) + tuple(_fixed_value_like(v) for v in node.meta["val"][1:])


def embedding(node: Any, env: dict) -> list[Slot]:
    """``embedding``: the weight's rows (token ids) are pinned; its feature axis is the output's last."""
    w, idx = env[node.args[0]], node.args[1]
    layout_of(w[1], _shape(node.args[0])[1])
    pin([w[0]], "embedding rows (token ids)")
    return [_fixed(d) for d in _shape(idx)] + [Slot(w[1].layout)]


def getitem(node: Any, env: dict) -> Any:
    """One output of a multi-output operation."""
    return env[node.args[0]][node.args[1]]


def factory(node: Any, env: dict) -> Any:
    """Tensor factories (``zeros``, ``arange``, ``randn``, ...): every axis is fixed."""
    return _fixed_value_like(node.meta.get("val"))


def _fixed_value_like(val: Any) -> Any:
    if hasattr(val, "shape"):
        return [_fixed(d) for d in val.shape]
    if isinstance(val, (list, tuple)):
        return tuple(_fixed_value_like(v) for v in val)
    return None


def _op(node: Any) -> str:
    text = str(node.target)
    return text.split(".")[1] if text.startswith("aten.") else text


def dropout_pair(node: Any, env: dict) -> tuple:
    """``native_dropout``: the output and its mask keep the input's layout."""
    out = list(env[node.args[0]])
    return (out, [Slot(s.layout) for s in out])


RULES: dict[str, Callable[[Any, dict], Any]] = {"getitem": getitem}
for _name in ("relu relu_ leaky_relu leaky_relu_ gelu silu silu_ sigmoid tanh hardtanh hardtanh_ elu elu_ "
              "hardswish hardsigmoid mish softplus clone detach alias dropout _to_copy lift_fresh_copy contiguous "
              "neg abs exp sqrt rsqrt pow mul mul_ add add_ sub sub_ div div_ maximum minimum where clamp "
              "clamp_min clamp_max square erf log log1p reciprocal sin cos masked_fill").split():
    RULES[_name] = elementwise
for _name in ("max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d "
              "adaptive_avg_pool2d _adaptive_avg_pool2d _adaptive_avg_pool3d upsample_nearest1d upsample_nearest2d "
              "upsample_bilinear2d upsample_bicubic2d upsample_linear1d").split():
    RULES[_name] = channelwise
for _name in "max_pool2d_with_indices max_pool3d_with_indices max_pool1d_with_indices adaptive_max_pool2d".split():
    RULES[_name] = channelwise_pair
for _name in "mean sum amax amin var std logsumexp argmax argmin max min".split():
    RULES[_name] = reduction
for _name in "_softmax softmax _log_softmax log_softmax".split():
    RULES[_name] = same
for _name in "view _unsafe_view reshape flatten unflatten squeeze unsqueeze".split():
    RULES[_name] = reshape
for _name in "t numpy_T transpose permute".split():
    RULES[_name] = transpose
for _name in "empty zeros ones full arange scalar_tensor empty_like zeros_like ones_like full_like rand randn".split():
    RULES[_name] = factory
RULES.update({"expand": expand, "slice": slice_, "constant_pad_nd": pad, "cat": cat, "mm": mm, "addmm": mm,
              "bmm": mm, "baddbmm": mm, "convolution": convolution, "native_batch_norm": batch_norm,
              "_native_batch_norm_legit_no_training": batch_norm, "_native_batch_norm_legit": batch_norm,
              "native_group_norm": group_norm, "native_layer_norm": layer_norm, "embedding": embedding,
              "native_dropout": dropout_pair})
