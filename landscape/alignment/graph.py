"""Discover a model's permutation groups from its traced graph.

The model is traced with ``torch.fx`` (``make_fx``, ATen level, fake tensors of the given
input shape), so Python control flow on shapes is resolved and every operation is one of a
finite vocabulary. Each axis of every value carries a :class:`~.units.Layout`: data inputs
and model outputs are fixed, a contraction (``mm``/``addmm``/``convolution``) ties the
contracted axes of both operands and its output axis is the weight's output axis, so the
hidden units of a Linear/Conv layer are created by its weight and everything that meets them
(biases, normalisation parameters and running statistics, the next layer's input axis,
residual additions, flatten boundaries, channel padding and concatenation) is tied to them.
What cannot commute with a permutation raises :class:`PermutationError` naming the
operation (``strict=True``) or pins the units it touches (``strict=False``); an operation
without a rule that no hidden units reach (mask and position computations) is a constant.
Multi-head attention blocks (:mod:`.attention`) are declared by module structure: the trace
pins their projections' unit axes and their head and within-head groups are added.

Reference: Ainsworth, Hayase & Srinivasa (2023), Git Re-Basin, section 3 (permutation
symmetry of hidden units) and Appendix A (permutation specifications).
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch import nn
from torch.func import functional_call
from torch.fx.experimental.proxy_tensor import make_fx

from ..evaluation.inputs import output_tensors
from .attention import AttentionBlock, attention_groups, find_attention
from .rules import RULES
from .rules.slots import Slot, Unsupported, fixed_value_like, op_name, pin, shape_of
from .spec import FixedUnits, Group, Member, PermutationError, PermutationSpec
from .units import find, fixed_layout, fixed_reason, leaf_runs

#: Why the units of the model's outputs are fixed (they are the outputs).
MODEL_OUTPUT = "the model output"


def unique_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state_dict without aliases of tied tensors (first name kept).

    Parameters
    ----------
    module : torch.nn.Module
        The model.

    Returns
    -------
    dict[str, torch.Tensor]
        Name -> detached tensor, one entry per distinct tensor.
    """
    seen: set[int] = set()
    out = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out[name] = tensor.detach()
    return out


def trace(module: nn.Module, example: torch.Tensor) -> tuple[torch.fx.GraphModule, list[str]]:
    """ATen graph of ``module`` (eval mode) as a function of (its unique state tensors, input).

    Parameters
    ----------
    module : torch.nn.Module
        The model (copied; not modified).
    example : torch.Tensor
        Example input batch fixing the traced shapes.

    Returns
    -------
    (graph, names) : tuple[torch.fx.GraphModule, list[str]]
        The graph module and the state names in placeholder order.

    Raises
    ------
    PermutationError
        If the model cannot be traced on inputs of this shape.
    """
    template = copy.deepcopy(module).eval()
    state = unique_state(template)
    names = list(state)
    if state:
        example = example.to(next(iter(state.values())).device)
    # buffers outside the state_dict (a rotary embedding's inverse frequencies): traced as
    # inputs too, after the state, so that every tensor of the forward is a fake one
    hidden = {n: b.detach() for n, b in template.named_buffers() if n not in state}

    def forward(tensors: list[torch.Tensor], extra: list[torch.Tensor], x: torch.Tensor) -> list[torch.Tensor]:
        out = functional_call(template, {**dict(zip(names, tensors)), **dict(zip(hidden, extra))}, (x,),
                              tie_weights=True)
        return output_tensors(out)

    try:
        graph = make_fx(forward, tracing_mode="fake")(list(state.values()), list(hidden.values()), example)
    except Exception as exc:  # the user's model cannot be traced
        raise PermutationError(f"cannot trace {type(module).__name__} on inputs of shape {tuple(example.shape)}: "
                               f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    return graph, names


def discover(module: nn.Module, example: torch.Tensor, *, strict: bool = True) -> PermutationSpec:
    """Permutation groups of ``module`` traced on ``example`` inputs (a batch).

    Parameters
    ----------
    module : torch.nn.Module
        The model (not modified).
    example : torch.Tensor
        An input batch (only its shape and dtype are used).
    strict : bool
        Raise :class:`PermutationError` at the first operation that does not commute with a
        permutation of the units it touches; with ``False`` those units are left fixed and the
        reasons listed in ``PermutationSpec.pinned``.

    Returns
    -------
    PermutationSpec
        The traced groups, then three groups per attention block (heads, query/key and
        value/output dimensions; :func:`~.attention.attention_groups`).

    Raises
    ------
    PermutationError
        If the model cannot be traced, (``strict``) an operation does not commute with a
        permutation, or an attention block cannot be permuted (grouped-query attention).
    """
    graph, names = trace(module, example)
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    env: dict[Any, Any] = {}
    members: list[tuple[str, int, Slot]] = []
    reasons: list[str] = []
    data_nodes: set[Any] = {placeholders[-1]}
    for name, node in zip(names, placeholders):
        slots = [Slot(None) for _ in node.meta["val"].shape]
        members += [(name, axis, slot) for axis, slot in enumerate(slots)]
        env[node] = slots
    blocks = find_attention(module)
    _pin_attention(blocks, dict(zip(names, placeholders)), env)
    env[placeholders[-1]] = [Slot(fixed_layout(d, "the model input")) for d in placeholders[-1].meta["val"].shape]
    for node in placeholders[len(names):-1]:  # buffers outside the state_dict: constants of the model
        env[node] = fixed_value_like(node.meta.get("val"), "a buffer outside the state_dict")
    probes: list[tuple[Any, str]] = []
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            for slots in _tensors(env, node.args):
                pin(slots, MODEL_OUTPUT)
            continue
        if node.op == "get_attr":
            env[node] = fixed_value_like(node.meta.get("val"), "a constant")
            continue
        env[node] = _apply(node, env, strict, reasons)
        if any(a in data_nodes for a in node.all_input_nodes):
            data_nodes.add(node)
            probes.append((node, op_name(node.target)))
    spec = _collect(members, env, probes, reasons, tuple(example.shape[1:]))
    outputs = {name: _contraction_of(node) for name, node in zip(names, placeholders)}
    groups = attention_groups(blocks, {k: (n.name, shape_of(n)) for k, n in outputs.items() if n is not None})
    held = {(m.name, m.axis) for g in groups for m in g.members}  # the attention projections pinned above
    fixed = tuple(f for f in spec.fixed if (f.name, f.axis) not in held)
    return PermutationSpec(spec.groups + tuple(groups), spec.pinned, spec.input_shape, fixed)


_LAYOUT_OPS = {"t", "numpy_T", "transpose", "permute"}
_CONTRACTIONS = {"mm", "addmm"}


def _contraction_of(placeholder: Any) -> Any:
    """The matrix product a weight feeds as its right operand (through transposes), or None.

    Its output's last axis holds the projection's output units.
    """
    frontier = [(placeholder, user) for user in placeholder.users]
    while frontier:
        source, node = frontier.pop(0)
        op = op_name(node.target)
        if op in _CONTRACTIONS and node.args[-1] is source:
            return node
        if op in _LAYOUT_OPS:
            frontier += [(node, user) for user in node.users]
    return None


def _pin_attention(blocks: list[AttentionBlock], placeholders: dict[str, Any], env: dict) -> None:
    """Fix the axes of attention projections in the trace: their units are the attention groups'."""
    for block in blocks:
        for span in block.spans:
            if span.name in placeholders:
                env[placeholders[span.name]][span.axis].layout = fixed_layout(
                    span.length, f"multi-head attention {block.name} (permuted by heads)")


def _apply(node: Any, env: dict, strict: bool, reasons: list[str]) -> Any:
    name = op_name(node.target)
    rule: Callable | None = RULES.get(name)
    try:
        inputs = _tensors(env, [*node.args, *node.kwargs.values()])
        if rule is None and _all_fixed(inputs):  # no units reach it: it computes the same values
            held = next((fixed_reason(s.layout) for slots in inputs for s in slots if fixed_reason(s.layout)), "")
            return fixed_value_like(node.meta.get("val"), held)
        if rule is None:
            raise Unsupported(f"operation {node.target} (graph node {node.name}) has no permutation rule")
        return rule(node, env)
    except Unsupported as exc:
        if strict:
            raise PermutationError(f"cannot permute hidden units through {exc}; pass strict=False to leave "
                                   "the units it touches unpermuted") from None
        reasons.append(str(exc))
        for slots in _tensors(env, node.args):
            pin(slots, str(exc))
        return fixed_value_like(node.meta.get("val"), str(exc))


def _all_fixed(values: list[list[Slot]]) -> bool:
    """Whether no hidden units reach these values: every axis is known and its runs pinned or single units."""
    return all(s.layout is not None and all(find(leaf).fixed or find(leaf).size == 1 for leaf, _ in leaf_runs(s.layout))
               for slots in values for s in slots)


def _tensors(env: dict, args: Any) -> list[list[Slot]]:
    out: list[list[Slot]] = []
    for a in args if isinstance(args, (list, tuple)) else [args]:
        if isinstance(a, (list, tuple)):
            out += _tensors(env, a)
        elif a in env and isinstance(env[a], list):
            out.append(env[a])
        elif a in env and isinstance(env[a], tuple):
            out += [v for v in env[a] if isinstance(v, list)]
    return out


#: activations that activation matching correlates: nonlinearity outputs and residual sums
_PROBE_OPS = {"relu", "relu_", "leaky_relu", "leaky_relu_", "gelu", "silu", "silu_", "sigmoid", "tanh",
              "hardtanh", "hardtanh_", "elu", "elu_", "hardswish", "mish", "softplus", "add", "add_"}
#: the last this many of them (in graph order) are used per group
PROBES_PER_GROUP = 3


def _collect(members: list[tuple[str, int, Slot]], env: dict, probes: list[tuple[Any, str]],
             reasons: list[str], input_shape: tuple[int, ...]) -> PermutationSpec:
    by_root: dict[int, list[Member]] = {}
    roots: dict[int, Any] = {}
    fixed: list[FixedUnits] = []
    for name, axis, slot in members:
        if slot.layout is None:
            fixed.append(FixedUnits(name, axis, "the traced forward pass never reaches this axis", False))
            continue
        lay = slot.layout
        for leaf, offset in leaf_runs(lay):
            root = find(leaf)
            if root.fixed:
                why = root.why or "positions that never move"
                fixed.append(FixedUnits(name, axis, why, root.hidden and root.size > 1))
                continue
            roots.setdefault(id(root), root)
            by_root.setdefault(id(root), []).append(
                Member(name, axis, lay.outer, lay.units, offset, root.size, lay.inner))
    found: dict[int, list[tuple[bool, int, Member]]] = {}
    for rank, (node, op) in enumerate(probes):
        value = env.get(node)
        if not isinstance(value, list):
            continue
        for axis, slot in enumerate(value):
            if slot.layout is None:
                continue
            lay = slot.layout
            for leaf, offset in leaf_runs(lay):
                key = id(find(leaf))
                if key in by_root:
                    found.setdefault(key, []).append(
                        (op in _PROBE_OPS, rank, Member(node.name, axis, lay.outer, lay.units, offset,
                                                        find(leaf).size, lay.inner)))
    groups = []
    for key, mems in by_root.items():
        root = roots[key]
        ranked = sorted(found.get(key, []), key=lambda c: (c[0], c[1]), reverse=True)
        chosen = [c for c in ranked if c[0]][:PROBES_PER_GROUP] or ranked[:1]
        groups.append(Group(root.size, root.block if 0 < root.block < root.size else 0, tuple(mems),
                            tuple((m.name, m) for _, _, m in chosen)))
    pinned = tuple(dict.fromkeys(reasons))
    return PermutationSpec(tuple(groups), pinned, input_shape, tuple(dict.fromkeys(fixed)))
