"""What a permutation specification is: groups of hidden units and where they sit in each tensor.

:func:`~.graph.discover` finds the groups of a model from its traced graph, and
:mod:`.attention` adds those of multi-head attention; :mod:`.permute` applies permutations
of them and :mod:`.weight_matching` / :mod:`.activation_matching` find them.

Reference: Ainsworth, Hayase & Srinivasa (2023), Git Re-Basin, Appendix A (permutation
specifications).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..infra.errors import ConfigError


class PermutationError(ConfigError):
    """The model contains an operation through which hidden units cannot be permuted safely."""


@dataclass(frozen=True)
class Member:
    """Where a group's units sit in one tensor.

    Along ``axis`` viewed as (outer, units, inner), positions ``start:start + size`` of the
    units dimension.

    Attributes
    ----------
    name : str
        State-dict name of the tensor.
    axis : int
        Axis of the tensor carrying the units.
    outer, units, inner : int
        The axis viewed as (outer, units, inner) sizes; the group's units lie along ``units``.
    start, size : int
        The group's units are positions ``start:start + size`` of ``units``.
    """

    name: str
    axis: int
    outer: int
    units: int
    start: int
    size: int
    inner: int


@dataclass(frozen=True)
class Group:
    """Hidden units permuted together.

    ``block``: permutations stay within contiguous blocks of that many units (GroupNorm
    groups); 0 means free. ``probes`` are the activations (graph node name and unit view) that
    activation matching correlates: the last few nonlinearity outputs and residual sums
    carrying the units (else the last value carrying them).

    Attributes
    ----------
    size : int
        Number of units.
    block : int
        Block size of allowed permutations (0: free).
    members : tuple[Member, ...]
        Every tensor position the units occupy.
    probes : tuple[tuple[str, Member], ...]
        Activation nodes (graph node name, unit view) for activation matching.
    """

    size: int
    block: int
    members: tuple[Member, ...]
    probes: tuple[tuple[str, Member], ...]


@dataclass(frozen=True)
class FixedUnits:
    """Units of one tensor axis that no permutation of the spec moves, and why (as the trace found).

    Attributes
    ----------
    name : str
        State-dict name of the tensor.
    axis : int
        The axis.
    why : str
        What fixed them: the model's input or output, an operation that does not commute with a
        permutation, a constant they meet, or that the traced forward pass never reached the tensor.
    hidden : bool
        Whether they are two or more units a layer created (hidden units that could not be
        permuted), not positions of the data, of a constant or of an axis that holds no units.
    """

    name: str
    axis: int
    why: str
    hidden: bool


@dataclass(frozen=True)
class PermutationSpec:
    """The permutation groups of a model, and the units left fixed with the reasons.

    Attributes
    ----------
    groups : tuple[Group, ...]
        The permutation groups (Git Re-Basin Appendix A).
    pinned : tuple[str, ...]
        Distinct reasons why some units were left in place (``strict=False``).
    input_shape : tuple[int, ...]
        Shape of the traced input, without the batch axis.
    fixed : tuple[FixedUnits, ...]
        The tensor axes (or parts of them) that no group permutes, with the reasons; empty for a
        spec not found by the trace.
    """

    groups: tuple[Group, ...]
    pinned: tuple[str, ...]
    input_shape: tuple[int, ...]
    fixed: tuple[FixedUnits, ...] = ()

    def __repr__(self) -> str:
        sizes = [g.size for g in self.groups]
        return (f"PermutationSpec({len(self.groups)} groups, {sum(sizes)} units, "
                f"sizes {sizes[:8]}{'...' if len(sizes) > 8 else ''}; {len(self.pinned)} pinned reasons)")

