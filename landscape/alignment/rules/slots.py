"""Slots: the layout of one axis of one traced value, and the helpers every rule uses.

A slot of a parameter starts empty: the first operation that meets it gives it a layout
(new free units if it becomes an output axis, the other operand's layout if it is
contracted or added). Rules raise :class:`Unsupported` for what they cannot permute.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

from ..units import Layout, fix, fixed_layout, fresh_layout, unify

#: A rule: ``rule(node, env)`` takes a ``torch.fx`` node and the environment (node -> list of
#: :class:`Slot`, one per axis, or a tuple of such lists for multi-output operations) and
#: returns the node's value in the same form.
Rule = Callable[[Any, dict], Any]


class Unsupported(Exception):
    """The operation does not commute with a permutation of the units it touches."""


class Slot:
    """The layout of one axis of one value.

    Parameters
    ----------
    layout : Layout or None
        The axis's layout; ``None`` for a parameter axis that no operation has met yet.
    """

    __slots__ = ("layout",)

    def __init__(self, layout: Layout | None):
        self.layout = layout


def layout_of(slot: Slot, length: int) -> Layout:
    """The slot's layout, creating new free units for an empty parameter axis.

    Parameters
    ----------
    slot : Slot
        The axis.
    length : int
        Its length (the number of new units if it is empty).

    Returns
    -------
    Layout
        The slot's layout, now set.
    """
    if slot.layout is None:
        slot.layout = fresh_layout(length)
    return slot.layout


def tie(a: Slot, b: Slot, length: int, why: str) -> None:
    """Make two axes hold the same units position by position.

    Parameters
    ----------
    a, b : Slot
        The axes (either may be empty, then it takes the other's layout).
    length : int
        Their common length.
    why : str
        The operation that ties them (reported if their layouts cannot be unified).
    """
    if a.layout is None and b.layout is None:
        a.layout = b.layout = fresh_layout(length)
    elif a.layout is None:
        a.layout = b.layout
    elif b.layout is None:
        b.layout = a.layout
    else:
        unify(a.layout, b.layout, why)


def pin(slots: list[Slot], why: str) -> None:
    """Fix these axes: their units never move.

    Parameters
    ----------
    slots : list of Slot
        The axes.
    why : str
        Why they are pinned (reported in ``PermutationSpec.pinned``).
    """
    for s in slots:
        if s.layout is None:
            s.layout = fixed_layout(1, why)  # an untouched parameter axis: nothing to pin
        else:
            fix(s.layout, why)


def fixed_slot(length: int, why: str = "") -> Slot:
    """A new axis of ``length`` positions that never move.

    Parameters
    ----------
    length : int
        Length of the axis.
    why : str
        Why it is fixed.

    Returns
    -------
    Slot
    """
    return Slot(fixed_layout(length, why))


def fixed_value_like(val: Any, why: str = "") -> Any:
    """The value of an operation whose every axis is fixed, shaped like ``val``.

    Parameters
    ----------
    val : Any
        The traced value (``node.meta["val"]``): a tensor, a sequence of values, or anything else.
    why : str
        Why its axes are fixed.

    Returns
    -------
    list of Slot, tuple or None
        One fixed slot per axis of a tensor; a tuple of such values for a sequence; ``None``
        for a value without axes.
    """
    if hasattr(val, "shape"):
        return [fixed_slot(d, why) for d in val.shape]
    if isinstance(val, (list, tuple)):
        return tuple(fixed_value_like(v, why) for v in val)
    return None


def shape_of(node: Any) -> tuple[int, ...]:
    """Shape of a traced node's value (of its first output for a multi-output operation).

    Parameters
    ----------
    node : torch.fx.Node
        A node traced with fake tensors.

    Returns
    -------
    tuple of int
    """
    val = node.meta["val"]
    return tuple((val[0] if isinstance(val, (list, tuple)) else val).shape)


def op_name(target: Any) -> str:
    """The name a rule is registered under: ``"mm"`` for ``aten.mm.default``.

    Parameters
    ----------
    target : Any
        A node's target (an ATen overload, or ``operator.getitem``).

    Returns
    -------
    str
    """
    if target is operator.getitem:
        return "getitem"
    text = str(target)
    return text.split(".")[1] if text.startswith("aten.") else text
