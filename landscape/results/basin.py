"""The result of a basin analysis (:func:`landscape.geometry.basin.basin`).

sublevel-set components of a plane's or a path's grid and where a set of models sits in them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..infra.errors import ConfigError
from .base import Result, register


@register
@dataclass(frozen=True, eq=False)
class BasinResult(Result):
    """Sublevel-set components of a grid and where a set of models sits in them.

    ``components``: integer labels of the grid (0 = above the level, 1..n = components),
    shaped like the grid's loss. ``names``/``coords``/``cells``/``model_component``: the models,
    their grid coordinates (x, y) (y = 0 on a path), their nearest grid index and component.
    ``bottom``: grid coordinates of the grid argmin; ``refined_bottom``/``refined_loss``: after
    the quadratic refinement (equal to the grid values when refinement is off or not possible).
    ``distance``/``loss_gap``: per model, to the (refined) bottom. ``cell_diagonal``: the
    length of one grid-cell diagonal, the resolution limit of ``off_bottom``.

    Attributes
    ----------
    level
        The sublevel ``c`` of the set ``{P : L(w_P) <= c}``.
    components
        Integer component labels shaped like the grid's loss (0 = above the level).
    names
        Names of the models, in order.
    coords
        ``(n, 2)`` grid coordinates (x, y) of the models (y = 0 on a path).
    cells
        Index of each model's nearest grid point.
    model_component
        Component label of each model's nearest grid point (0 = above the level).
    model_loss
        Loss of each model (exact when given, otherwise that of its nearest grid point).
    bottom
        Grid coordinates (x, y) of the grid argmin (inside the common component when there is
        one).
    bottom_loss
        Grid loss at ``bottom``.
    refined_bottom
        Coordinates of the bottom after the local quadratic fit.
    refined_loss
        Loss of the fitted quadratic at ``refined_bottom``.
    distance
        Per model, Euclidean distance in grid coordinates to ``refined_bottom``.
    loss_gap
        Per model, ``model_loss - refined_loss``.
    cell_diagonal
        Length of one grid-cell diagonal (one step on a path).
    """

    level: float
    components: np.ndarray
    names: list
    coords: np.ndarray
    cells: np.ndarray
    model_component: np.ndarray
    model_loss: np.ndarray
    bottom: np.ndarray
    bottom_loss: float
    refined_bottom: np.ndarray
    refined_loss: float
    distance: np.ndarray
    loss_gap: np.ndarray
    cell_diagonal: float
    array_fields: ClassVar[tuple[str, ...]] = ("components", "coords", "cells", "model_component",
                                               "model_loss", "bottom", "refined_bottom", "distance",
                                               "loss_gap")

    @property
    def common(self) -> bool:
        """True when every model lies in one sublevel component (the common basin)."""
        comp = np.asarray(self.model_component)
        return bool(comp.size > 0 and comp[0] > 0 and (comp == comp[0]).all())

    @property
    def num_components(self) -> int:
        """Number of connected components of the sublevel set."""
        return int(np.asarray(self.components).max(initial=0))

    @property
    def basin_size(self) -> int:
        """Grid points in the models' component (0 when the models are split)."""
        if not self.common:
            return 0
        return int((np.asarray(self.components) == int(self.model_component[0])).sum())

    @property
    def off_bottom(self) -> dict[str, bool]:
        """Per model: farther from the bottom than one grid-cell diagonal."""
        return {n: bool(d > self.cell_diagonal) for n, d in zip(self.names, self.distance)}

    def model(self, name: str) -> dict[str, Any]:
        """Everything known about one model: coordinates, component, distance, loss gap.

        Parameters
        ----------
        name
            One of :attr:`names`.

        Returns
        -------
        dict
            ``coords``, ``component``, ``loss``, ``distance``, ``loss_gap`` and ``off_bottom``
            as plain Python values.

        Raises
        ------
        ConfigError
            If no model has that name.
        """
        if name not in self.names:
            raise ConfigError(f"no model {name!r} in the basin analysis; models are {list(self.names)}")
        i = list(self.names).index(name)
        return {"coords": [float(c) for c in self.coords[i]], "component": int(self.model_component[i]),
                "loss": float(self.model_loss[i]), "distance": float(self.distance[i]),
                "loss_gap": float(self.loss_gap[i]), "off_bottom": bool(self.distance[i] > self.cell_diagonal)}
