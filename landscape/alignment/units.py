"""Runs of hidden units and how they are laid out along a tensor axis.

A :class:`Run` is a block of ``size`` hidden units that must be permuted together wherever
they appear. Runs are merged (union-find) when an operation ties two of them (a residual
addition, a contraction), split when one is tied to a concatenation of others (a channel
padding or ``cat``), and *fixed* (never permuted) when they reach something that does not
commute with a permutation (the model's inputs or outputs, an unsupported operation).
GroupNorm adds a *block* constraint: units may only move within contiguous blocks of the
normalisation groups.

A :class:`Layout` says where runs sit along one tensor axis: the axis is viewed as
``(outer, sum of run sizes, inner)`` in row-major order, so a flattened ``(C, H, W)``
feature map is ``Layout(1, [(channels, C)], H * W)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import gcd


class Run:
    """A block of hidden units (a union-find node).

    Parameters
    ----------
    size : int
        Number of units.
    fixed : bool
        Whether the units are pinned (never permuted).
    why : str
        Why they are pinned (reported in ``PermutationSpec.pinned``).
    hidden : bool, optional
        Whether a layer created the units (default: ``not fixed``), as opposed to positions of the
        data, of a constant or of an axis that is not one of units; kept by every run it is merged with.
    """

    __slots__ = ("size", "parent", "children", "fixed", "block", "why", "hidden")

    def __init__(self, size: int, fixed: bool = False, why: str = "", hidden: bool | None = None):
        self.size = size
        self.parent: Run | None = None
        self.children: tuple[Run, ...] = ()
        self.fixed = fixed
        self.block = 0  # 0: no block constraint; b: permute only within contiguous blocks of b units
        self.why = why
        self.hidden = not fixed if hidden is None else hidden


@dataclass(frozen=True)
class Layout:
    """Runs along an axis viewed as ``(outer, sum(sizes), inner)``.

    Attributes
    ----------
    outer, inner : int
        Sizes of the row-major factors before and after the units.
    runs : tuple[tuple[Run, int], ...]
        The runs in order, each with the number of units it spans.
    """

    outer: int
    runs: tuple[tuple[Run, int], ...]
    inner: int

    @property
    def units(self) -> int:
        """Number of units along the axis (the middle factor)."""
        return sum(n for _, n in self.runs)

    @property
    def length(self) -> int:
        """Length of the axis, ``outer * units * inner``."""
        return self.outer * self.units * self.inner


def find(run: Run) -> Run:
    """Representative of ``run``'s class (with path halving).

    Parameters
    ----------
    run : Run
        Any run.

    Returns
    -------
    Run
        The root of its union-find class.
    """
    while run.parent is not None:
        if run.parent.parent is not None:
            run.parent = run.parent.parent
        run = run.parent
    return run


def leaves(run: Run) -> list[Run]:
    """The unsplit representatives that make up ``run``, in order.

    Parameters
    ----------
    run : Run
        Any run.

    Returns
    -------
    list[Run]
        The roots of its pieces after every split, in unit order.
    """
    root = find(run)
    if not root.children:
        return [root]
    return [leaf for child in root.children for leaf in leaves(child)]


def fixed_layout(length: int, why: str = "") -> Layout:
    """An axis whose positions never move (data, spatial or batch axes).

    Parameters
    ----------
    length : int
        Length of the axis.
    why : str
        Why it is fixed.

    Returns
    -------
    Layout
        One fixed run over the whole axis.
    """
    return Layout(1, ((Run(length, fixed=True, why=why), length),), 1)


def fresh_layout(length: int) -> Layout:
    """An axis of ``length`` new free units (a layer's outputs).

    Parameters
    ----------
    length : int
        Number of units.

    Returns
    -------
    Layout
        One free run over the whole axis.
    """
    return Layout(1, ((Run(length), length),), 1)


def is_fixed(layout: Layout) -> bool:
    """Whether every unit of ``layout`` is pinned.

    Parameters
    ----------
    layout : Layout
        The axis to test.

    Returns
    -------
    bool
        True if every leaf run of the axis is fixed.
    """
    return all(find(leaf).fixed for run, _ in layout.runs for leaf in leaves(run))


def fix(layout: Layout, why: str) -> None:
    """Pin every unit of ``layout``: it is never permuted.

    Parameters
    ----------
    layout : Layout
        The axis to pin.
    why : str
        Reason recorded on runs not already fixed.
    """
    for run, _ in layout.runs:
        for leaf in leaves(run):
            if not leaf.fixed:
                leaf.fixed, leaf.why = True, why


def fixed_reason(layout: Layout) -> str:
    """Why the first pinned units of ``layout`` that have a recorded reason are pinned.

    Parameters
    ----------
    layout : Layout
        The axis.

    Returns
    -------
    str
        The reason, or "" when no pinned unit of the axis has one.
    """
    return next((find(leaf).why for leaf, _ in leaf_runs(layout) if find(leaf).fixed and find(leaf).why), "")


def leaf_runs(layout: Layout) -> list[tuple[Run, int]]:
    """``(leaf, offset in units)`` of every leaf along the axis.

    Parameters
    ----------
    layout : Layout
        The axis.

    Returns
    -------
    list[tuple[Run, int]]
        Each leaf run with its offset along the units dimension.
    """
    out, offset = [], 0
    for run, _ in layout.runs:
        for leaf in leaves(run):
            out.append((leaf, offset))
            offset += leaf.size
    return out


def _restrict(run: Run, block: int, why: str) -> None:
    """Add a block constraint (blocks aligned at the run's start; ``block`` divides its size).

    Blocks of one unit allow no permutation: the run is fixed.
    """
    block = gcd(run.block, block) if run.block else block
    if block == 1:
        run.fixed, run.why = True, run.fixed and run.why or why
    else:
        run.block = block


def _split(root: Run, at: int) -> None:
    head, tail = (Run(at, root.fixed, root.why, root.hidden), Run(root.size - at, root.fixed, root.why, root.hidden))
    if root.block:  # blocks of gcd(at, block) units lie inside the parent's blocks on both sides of the cut
        for child in (head, tail):
            _restrict(child, gcd(at, root.block), "a split inside a GroupNorm group")
    root.children = (head, tail)


def _union(a: Run, b: Run) -> None:
    a, b = find(a), find(b)
    if a is b:
        return
    b.parent = a
    a.hidden = a.hidden or b.hidden
    if b.fixed and not a.fixed:
        a.fixed, a.why = True, b.why
    if b.block:
        _restrict(a, b.block, "GroupNorm groups")


def unify(x: Layout, y: Layout, why: str) -> None:
    """Tie the units of two layouts of one axis position by position.

    Runs are split where their boundaries differ. Layouts with different ``outer``/``inner``
    views can only be tied when one of them is fixed (then both are fixed, with ``why``).

    Parameters
    ----------
    x, y : Layout
        Layouts of the same axis position (e.g. both operands of an addition).
    why : str
        Reason recorded if the units must be pinned.
    """
    if is_fixed(x) or is_fixed(y) or (x.outer, x.inner) != (y.outer, y.inner) or x.units != y.units:
        held = next((fixed_reason(lay) for lay in (x, y) if is_fixed(lay) and fixed_reason(lay)), "")
        why = f"{why}, with {held}" if held else why
        fix(x, why)
        fix(y, why)
        return
    xs, ys = [leaf for r, _ in x.runs for leaf in leaves(r)], [leaf for r, _ in y.runs for leaf in leaves(r)]
    i = j = 0
    while i < len(xs) and j < len(ys):
        a, b = find(xs[i]), find(ys[j])
        if a.children or b.children:  # split meanwhile (the same run on both sides)
            xs[i:i + 1], ys[j:j + 1] = leaves(a), leaves(b)
            continue
        if a.size > b.size:
            _split(a, b.size)
            xs[i:i + 1] = list(a.children)
            continue
        if b.size > a.size:
            _split(b, a.size)
            ys[j:j + 1] = list(b.children)
            continue
        _union(a, b)
        i, j = i + 1, j + 1


def constrain_blocks(layout: Layout, block: int, why: str) -> None:
    """Units of ``layout`` may only move within contiguous blocks of ``block`` units (GroupNorm).

    Parameters
    ----------
    layout : Layout
        The normalised axis (pinned instead if it has outer or inner factors).
    block : int
        Units per normalisation group.
    why : str
        Reason recorded if units end up pinned.
    """
    if layout.outer != 1 or layout.inner != 1:
        fix(layout, why)
        return
    for leaf, offset in leaf_runs(layout):
        root = find(leaf)  # blocks of gcd(offset, block, size) units lie inside the GroupNorm groups
        _restrict(root, gcd(gcd(offset, block), root.size), why)
