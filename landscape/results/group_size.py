"""The group barrier against the group size K (FedGuCci Figure 4).

Computed by :func:`landscape.geometry.groups.group_barrier_by_size`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .base import Result, register


@register
@dataclass(frozen=True, eq=False)
class GroupSizeResult(Result):
    """Group barriers of random subsets of size K (FedGuCci Figure 4): (len(sizes), draws).

    Attributes
    ----------
    sizes
        The group sizes K, ``(len(sizes),)``.
    loss_barrier
        Uniform group loss barrier (FedGuCci Eq. 9) of each draw, ``(len(sizes), draws)``.
    accuracy_barrier
        Uniform group accuracy barrier (FedGuCci Eq. 10) of each draw, ``(len(sizes), draws)``.
    """

    sizes: np.ndarray
    loss_barrier: np.ndarray
    accuracy_barrier: np.ndarray
    array_fields: ClassVar[tuple[str, ...]] = ("sizes", "loss_barrier", "accuracy_barrier")
