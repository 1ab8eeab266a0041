"""Rules for operations that move values between axes: reshapes, transposes, slices, padding, ``cat``.

A reshape may merge axes or split one, as long as the hidden units stay contiguous in an
``(outer, units, inner)`` view of the axis (a flattened ``(C, H, W)`` feature map keeps its
channels); padding and concatenation add or join runs of units along one axis.
"""
from __future__ import annotations

from math import prod
from typing import Any

from ..units import Layout, fixed_reason, fresh_layout, is_fixed
from .slots import Rule, Slot, Unsupported, fixed_slot, layout_of, op_name, pin, shape_of, tie


def _reshape(node: Any, env: dict) -> list[Slot]:
    """``view``/``reshape``: merged axes keep their units in an (outer, units, inner) view."""
    src, ins, out = env[node.args[0]], shape_of(node.args[0]), shape_of(node)
    items = [(s, d) for s, d in zip(src, ins) if d != 1]
    pin([s for s, d in zip(src, ins) if d == 1 and s.layout is None], "a size-1 axis")
    result: list[Slot] = []
    i = 0
    j = 0
    while j < len(out):
        if out[j] == 1:
            result.append(fixed_slot(1))
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
    """Slots of ``group_out``, axes of the same total length as the (slot, length) pairs of ``group_in``."""
    if len(group_in) == 1 and len(group_out) == 1:
        return [group_in[0][0]]
    why = (f"a reshape that splits or interleaves hidden units across axes ({node.target}, graph node {node.name}; "
           "multi-head attention is permuted by heads when its projections are found by "
           "landscape.alignment.attention.find_attention)")
    carrying = [k for k, (s, d) in enumerate(group_in) if s.layout is not None and not is_fixed(s.layout)]
    if not carrying:  # positions that never move (batch, spatial, data axes; unmet parameter axes)
        held = next((fixed_reason(s.layout) for s, _ in group_in if s.layout is not None and fixed_reason(s.layout)),
                    "")
        pin([s for s, _ in group_in], why)
        return [fixed_slot(d, held) for d in group_out]
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
                    return ([fixed_slot(d) for d in group_out[:k]]
                            + [Slot(Layout(outer_k, lay.runs, lay.inner // after))]
                            + [fixed_slot(d) for d in group_out[k + 1:]])
    raise Unsupported(why)


def _transpose(node: Any, env: dict) -> list[Slot]:
    """``t``/``transpose``/``permute``: the axes' slots are reordered as the axes are."""
    src = env[node.args[0]]
    op = op_name(node.target)
    if op in {"t", "numpy_T"}:
        return list(reversed(src)) if len(src) == 2 else list(src)
    if op == "permute":
        return [src[d % len(src)] for d in node.args[1]]
    a, b = node.args[1] % len(src), node.args[2] % len(src)
    out = list(src)
    out[a], out[b] = src[b], src[a]
    return out


def _expand(node: Any, env: dict) -> list[Slot]:
    """``expand``: axes of unchanged length keep their slots; new or broadcast axes are fixed."""
    src, ins, out = env[node.args[0]], shape_of(node.args[0]), shape_of(node)
    lead = len(out) - len(ins)
    return [(src[k - lead] if k >= lead and ins[k - lead] == out[k] else fixed_slot(out[k])) for k in range(len(out))]


def _slice(node: Any, env: dict) -> list[Slot]:
    """``slice``: a sliced axis is fixed; slicing hidden units raises :class:`Unsupported`."""
    src, ins, out = env[node.args[0]], shape_of(node.args[0]), shape_of(node)
    dim = (node.args[1] if len(node.args) > 1 else 0) % len(ins)
    result = list(src)
    if ins[dim] != out[dim]:
        if src[dim].layout is not None and not is_fixed(src[dim].layout):
            raise Unsupported(f"a slice of hidden units on axis {dim} ({node.target}, graph node {node.name})")
        result[dim] = fixed_slot(out[dim])
    return result


def _select(node: Any, env: dict) -> list[Slot]:
    """``select``: one position of an axis (a class token); selecting a hidden unit raises :class:`Unsupported`."""
    src, ins = env[node.args[0]], shape_of(node.args[0])
    dim = node.args[1] % len(ins)
    if src[dim].layout is not None and not is_fixed(src[dim].layout):
        raise Unsupported(f"a selection of one hidden unit on axis {dim} ({node.target}, graph node {node.name})")
    pin([src[dim]], f"a selection along axis {dim} ({node.name})")
    return [s for k, s in enumerate(src) if k != dim]


def _pad(node: Any, env: dict) -> list[Slot]:
    """``constant_pad_nd``: padded positions along a unit axis are new (zero) units."""
    src, ins = env[node.args[0]], shape_of(node.args[0])
    amounts = list(node.args[1])
    result = list(src)
    for k in range(len(amounts) // 2):
        dim = len(ins) - 1 - k
        lo, hi = amounts[2 * k], amounts[2 * k + 1]
        if lo == 0 and hi == 0:
            continue
        lay = src[dim].layout
        if lay is None or is_fixed(lay):
            result[dim] = fixed_slot(ins[dim] + lo + hi)
            continue
        if lo < 0 or hi < 0 or lay.outer != 1 or lay.inner != 1:
            raise Unsupported(f"padding that crops or interleaves hidden units ({node.target}, graph node {node.name})")
        runs = ((fresh_layout(lo).runs if lo else ()) + lay.runs + (fresh_layout(hi).runs if hi else ()))
        result[dim] = Slot(Layout(1, runs, 1))
    return result


def _cat(node: Any, env: dict) -> list[Slot]:
    """``cat``: other axes are tied across the parts; along ``dim`` the parts' runs are concatenated."""
    parts = [(env[a], shape_of(a)) for a in node.args[0] if shape_of(a) != (0,)]  # cat skips empty 1-D tensors
    out = shape_of(node)
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
            result.append(fixed_slot(out[k]))
        elif any(lay.outer != 1 or lay.inner != 1 for lay in lays):
            raise Unsupported(f"a concatenation of flattened hidden units ({node.name})")
        else:
            result.append(Slot(Layout(1, tuple(r for lay in lays for r in lay.runs), 1)))
    return result


#: The rules of this module by ATen operation name.
RULES: dict[str, Rule] = dict.fromkeys(
    "view _unsafe_view reshape flatten unflatten squeeze unsqueeze".split(), _reshape)
RULES.update(dict.fromkeys("t numpy_T transpose permute".split(), _transpose))
RULES.update({"expand": _expand, "slice": _slice, "select": _select, "constant_pad_nd": _pad, "cat": _cat})
