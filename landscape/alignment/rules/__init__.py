"""How each ATen operation moves hidden units from its inputs to its outputs.

A rule (:data:`.slots.Rule`) takes a ``torch.fx`` node and the environment (node -> list of
:class:`.slots.Slot`, one per axis, or a tuple of such lists for multi-output operations) and
returns the node's value. :data:`RULES` maps each supported ATen operation name to its rule,
gathered from one module per operator family:

* :mod:`.pointwise` -- activations, arithmetic, softmax, dropout, tensor factories;
* :mod:`.reductions` -- pooling, resampling, sums and maxima over axes;
* :mod:`.shapes` -- reshapes, transposes, slices, selections, padding, concatenation;
* :mod:`.contractions` -- matrix products, convolutions, embeddings;
* :mod:`.normalization` -- BatchNorm, GroupNorm, LayerNorm.
"""
from __future__ import annotations

from . import contractions, normalization, pointwise, reductions, shapes
from .slots import Rule

#: Every rule by ATen operation name (``"mm"`` for ``aten.mm.default``, see :func:`.slots.op_name`).
RULES: dict[str, Rule] = {**pointwise.RULES, **reductions.RULES, **shapes.RULES, **contractions.RULES,
                          **normalization.RULES}

__all__ = ["RULES"]
