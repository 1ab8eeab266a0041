"""Multi-head attention: its permutation groups, declared from the module structure.

The traced graph cannot see why the reshape ``(batch, seq, heads * head_dim) -> (batch, seq,
heads, head_dim)`` is safe to permute, so attention blocks are found by their modules instead:
a module with a number of heads (``num_attention_heads``, ``num_heads``, ``n_head``, ...) and
query, key and value projections (separate ``q_proj``/``k_proj``/``v_proj``, ``query``/
``key``/``value``, or one fused ``[q | k | v]`` projection such as GPT-2's ``c_attn``, timm's
``qkv`` or ``nn.MultiheadAttention``'s ``in_proj_weight``) and an output projection (``o_proj``,
``out_proj``, ``c_proj``, ``dense``, or ``output.dense`` beside it). Projections are
``nn.Linear`` or Hugging Face ``Conv1D`` layers (weights stored transposed).

Each block gives three groups (Verma & Elbayad 2024; Imfeld et al. 2024):

* its **heads**, permuted as units: the rows of q, k and v grouped by head, and o's input
  columns grouped by head, all by the same permutation;
* the **query/key dimensions** within a head: the rows of q and of k by one permutation (they
  are contracted together in ``q k^T``), the same in every head;
* the **value/output dimensions** within a head: the rows of v and o's input columns by another.

The two within-head permutations are shared by the heads, so they commute with the head
permutation.

Grouped-query attention (LLaMA, Mistral: ``kv_heads`` key/value heads, each shared by
``heads / kv_heads`` query heads): the units of the head group are the key/value heads, each
carrying its query heads (their rows of q and columns of o) along. Rotary position embeddings
(found as a module whose class name contains ``Rotary``) rotate pairs of query/key dimensions
by position-dependent angles that differ from pair to pair, so a permutation of those
dimensions would change the model: with rotary embeddings the query/key group is left out.
Heads (whole units) and value/output dimensions commute with the rotation and stay.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

from torch import nn

from .spec import Group, Member, PermutationError

_QUERY = ("q_proj", "query", "q", "q_lin", "wq")
_KEY = ("k_proj", "key", "k", "k_lin", "wk")
_VALUE = ("v_proj", "value", "v", "v_lin", "wv")
_FUSED = ("c_attn", "qkv", "qkv_proj", "Wqkv", "in_proj")
_OUTPUT = ("o_proj", "out_proj", "c_proj", "out_lin", "wo", "proj", "dense")
_HEADS = ("num_attention_heads", "num_heads", "n_head", "n_heads", "nhead")


@dataclass(frozen=True)
class Span:
    """Where one projection's units sit in one tensor: positions ``start:start + width`` of ``axis``.

    Attributes
    ----------
    name : str
        State-dict name of the tensor.
    axis : int
        The axis holding the units.
    start : int
        First position of the projection's units along the axis.
    length : int
        Length of the axis.
    """

    name: str
    axis: int
    start: int
    length: int


@dataclass(frozen=True)
class AttentionBlock:
    """One multi-head attention block: its heads and where q, k, v and o's units sit.

    Attributes
    ----------
    name : str
        Module name of the block.
    heads, head_dim : int
        Number of (query) heads and dimensions per head.
    query, key, value : tuple[Span, ...]
        The output units of the projections (weight and bias).
    output : tuple[Span, ...]
        The input units of the output projection (its weight).
    kv_heads : int
        Number of key/value heads (``heads`` unless grouped-query attention).
    rotary : bool
        Query and key carry rotary position embeddings (their dimensions are not permuted).
    """

    name: str
    heads: int
    head_dim: int
    query: tuple[Span, ...]
    key: tuple[Span, ...]
    value: tuple[Span, ...]
    output: tuple[Span, ...]
    kv_heads: int = 0
    rotary: bool = False

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.heads // (self.kv_heads or self.heads)

    @property
    def spans(self) -> tuple[Span, ...]:
        """Every span of the block."""
        return self.query + self.key + self.value + self.output


def _is_projection(module: nn.Module | None) -> bool:
    """An ``nn.Linear`` or a Hugging Face ``Conv1D`` (a 2-D ``weight`` stored as (in, out))."""
    if isinstance(module, nn.Linear):
        return True
    return type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None \
        and module.weight.ndim == 2


def _out_axis(module: nn.Module) -> int:
    """Axis of the weight holding a projection's outputs (``Conv1D`` stores its weight transposed)."""
    return 0 if isinstance(module, nn.Linear) else 1


def _outputs(prefix: str, module: nn.Module, start: int = 0) -> tuple[Span, ...]:
    """Spans of a projection's output units starting at ``start`` (weight and bias)."""
    axis = _out_axis(module)
    spans = [Span(f"{prefix}weight", axis, start, module.weight.shape[axis])]
    if getattr(module, "bias", None) is not None:
        spans.append(Span(f"{prefix}bias", 0, start, module.bias.shape[0]))
    return tuple(spans)


def _child(module: nn.Module, names: tuple[str, ...]) -> tuple[str, nn.Module] | None:
    """The first projection child of ``module`` among ``names``, with its name."""
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module) and _is_projection(child):
            return name, child
    return None


def _heads(module: nn.Module) -> int | None:
    """The module's number of (query) heads, declared by itself or by its Hugging Face ``config``."""
    for owner in (module, getattr(module, "config", None)):
        for attr in _HEADS:
            value = getattr(owner, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _block(name: str, module: nn.Module, parent: nn.Module | None) -> AttentionBlock | None:
    """The attention block of ``module`` (named ``name``), or None if it is not one."""
    heads = _heads(module)
    if heads is None:
        return None
    prefix = f"{name}." if name else ""
    if isinstance(module, nn.MultiheadAttention) and module.in_proj_weight is not None:
        width = kv_width = module.embed_dim
        proj = [Span(f"{prefix}in_proj_weight", 0, i * width, 3 * width) for i in range(3)]
        if module.in_proj_bias is not None:
            proj = [(w, Span(f"{prefix}in_proj_bias", 0, w.start, 3 * width)) for w in proj]
        else:
            proj = [(w,) for w in proj]
        o_name, o = "out_proj", module.out_proj
        q, k, v = (tuple(p) for p in proj)
    else:
        fused = _child(module, _FUSED)
        parts = [_child(module, names) for names in (_QUERY, _KEY, _VALUE)]
        if fused is not None:
            f_name, f = fused
            width = kv_width = f.weight.shape[_out_axis(f)] // 3
            q, k, v = (_outputs(f"{prefix}{f_name}.", f, i * width) for i in range(3))
        elif all(parts):
            q, k, v = (_outputs(f"{prefix}{n}.", m) for n, m in parts)
            width, kv_width, v_width = (m.weight.shape[_out_axis(m)] for _, m in parts)
            if kv_width != v_width or width % kv_width:
                raise PermutationError(f"attention block {name!r} has projections of widths {width}, {kv_width} "
                                       f"and {v_width}: not multi-head or grouped-query attention")
        else:
            return None
        found = _child(module, _OUTPUT)
        if found is None and parent is not None and isinstance(getattr(parent, "output", None), nn.Module):
            found = _child(parent.output, ("dense",))
            prefix = f"{name.rsplit('.', 1)[0]}.output." if "." in name else "output."
        if found is None:
            return None
        o_name, o = found
    if width % heads:
        raise PermutationError(f"attention block {name!r}: width {width} is not a multiple of its {heads} heads")
    o_axis = 1 - _out_axis(o)
    if o.weight.shape[o_axis] != width:
        return None
    output = (Span(f"{prefix}{o_name}.weight", o_axis, 0, width),)
    head_dim = width // heads
    kv_heads = kv_width // head_dim
    if kv_width % head_dim or heads % kv_heads:
        raise PermutationError(f"attention block {name!r}: {heads} query heads do not share {kv_heads} key/value "
                               "heads evenly")
    return AttentionBlock(name, heads, head_dim, q, k, v, output, kv_heads)


def find_attention(model: nn.Module) -> list[AttentionBlock]:
    """The multi-head attention blocks of ``model``, found by module structure.

    Parameters
    ----------
    model : torch.nn.Module
        Any model.

    Returns
    -------
    list[AttentionBlock]
        Every module with a number of heads, query/key/value projections (separate or fused) and
        an output projection of matching width; empty if there is none.

    Raises
    ------
    PermutationError
        If a block's projections have widths that are neither multi-head nor grouped-query
        attention, or its width is not a multiple of its number of heads.
    """
    modules = dict(model.named_modules())
    rotary = any("rotary" in type(m).__name__.lower() for m in modules.values())
    blocks = []
    for name, module in modules.items():
        parent = modules.get(name.rsplit(".", 1)[0] if "." in name else "") if name else None
        block = _block(name, module, parent)
        if block is not None:
            blocks.append(replace(block, rotary=rotary))
    return blocks


def _head_member(span: Span, block: AttentionBlock) -> Member:
    """The span's key/value heads as units, each with its query heads (or head dimensions) inside."""
    d = block.head_dim * (block.group_size if _is_query_side(span, block) else 1)
    return Member(span.name, span.axis, 1, span.length // d, span.start // d, block.kv_heads or block.heads, d)


def _is_query_side(span: Span, block: AttentionBlock) -> bool:
    """A span of the query projection or of the output projection's input (one column per query dimension)."""
    return span in block.query or span in block.output


def _dim_members(span: Span, block: AttentionBlock) -> list[Member]:
    """The span's within-head dimensions, one member per head (or one for a whole axis)."""
    d = block.head_dim
    heads = block.heads if _is_query_side(span, block) else block.kv_heads or block.heads
    if span.start == 0 and span.length == heads * d:
        return [Member(span.name, span.axis, heads, d, 0, d, 1)]
    return [Member(span.name, span.axis, 1, span.length, span.start + h * d, d, 1) for h in range(heads)]


def _probes(spans: tuple[Span, ...], members: Callable[[Span], list[Member]],
            outputs: Mapping[str, tuple[str, tuple[int, ...]]]) -> tuple[tuple[str, Member], ...]:
    """The members of the projections' weights, moved to the last axis of their output activations."""
    found = []
    for span in spans:
        node, shape = outputs.get(span.name, ("", ()))
        if shape and shape[-1] == span.length:
            found += [(node, replace(m, name=node, axis=len(shape) - 1)) for m in members(span)]
    return tuple(found)


def attention_groups(blocks: list[AttentionBlock], outputs: Mapping[str, tuple[str, tuple[int, ...]]] | None = None
                     ) -> list[Group]:
    """The permutation groups of attention blocks: heads, query/key and value/output dimensions.

    Parameters
    ----------
    blocks : list[AttentionBlock]
        Blocks from :func:`find_attention`.
    outputs : Mapping[str, tuple[str, tuple[int, ...]]], optional
        Weight name -> (graph node name, shape) of the projection's output activation, whose last
        axis holds its units: the probes of activation matching (none without it).

    Returns
    -------
    list[Group]
        Per block: heads (key/value heads with their query heads); query/key dimensions (not
        with rotary embeddings); value/output dimensions.
    """
    outputs = outputs or {}
    groups = []
    for b in blocks:
        qkv = tuple(s for s in b.query + b.key + b.value if s.name.endswith("weight"))
        qk = tuple(s for s in b.query + b.key if s.name.endswith("weight"))
        v = tuple(s for s in b.value if s.name.endswith("weight"))

        def heads(span: Span, block: AttentionBlock = b) -> list[Member]:
            return [_head_member(span, block)]

        def dims(span: Span, block: AttentionBlock = b) -> list[Member]:
            return _dim_members(span, block)

        groups.append(Group(b.kv_heads or b.heads, 0, tuple(_head_member(s, b) for s in b.spans),
                            _probes(qkv, heads, outputs)))
        if not b.rotary:
            groups.append(Group(b.head_dim, 0, tuple(m for s in b.query + b.key for m in dims(s)),
                                _probes(qk, dims, outputs)))
        groups.append(Group(b.head_dim, 0, tuple(m for s in b.value + b.output for m in dims(s)),
                            _probes(v, dims, outputs)))
    return groups
