"""Operational basin analysis on a plane or a path (IMA paper, Sec. 3.2 and Fig. 1; docs/methods/ima.md).

The paper speaks of a "common basin" holding client and global models, of clients on the
"basin wall" and of the global model "deviating from the basin bottom" without defining
them. The operational definitions used here:

* **basin** at level ``c``: the connected component of the sublevel set
  ``{P : L(w_P) <= c}`` of the grid, with 4-neighbour connectivity (2 neighbours on a
  path), found by flood fill. Each model is represented by its nearest grid point; the
  default level is the highest grid loss among those points ("c = the maximum loss among
  the plotted models", measured on the grid), so every model's point is in the set.
* **common basin**: all models of interest lie in one component.
* **bottom** ``P*``: the grid argmin inside that component (over the whole grid when the
  models are split), optionally refined by a local quadratic fit of its 3x3 (3-point)
  neighbourhood.
* **deviation** of a model: its distance to ``P*`` in grid coordinates (parameter-norm
  units for :func:`landscape.plane`, alpha units on a path) and its loss gap ``L(m) - L(P*)``;
  a model is *off the bottom* when it is farther from ``P*`` than one grid-cell diagonal, the
  smallest distance the grid can resolve.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from scipy import ndimage

from ..infra.errors import ConfigError
from ..results import PathResult, PlaneResult
from ..results.basin import BasinResult

ALGORITHM_VERSION = "basin-1"


def sublevel_components(values: np.ndarray, level: float) -> np.ndarray:
    """Flood-fill labels of ``{values <= level}`` over 4-neighbours (2 on a 1-D grid).

    Parameters
    ----------
    values
        A 1-D (path) or 2-D (plane) grid of losses.
    level
        The sublevel ``c``.

    Returns
    -------
    numpy.ndarray
        Integer labels shaped like ``values``: 0 outside the set (including NaN and inf),
        1..n for the n connected components, numbered in raster order.

    Raises
    ------
    ConfigError
        If ``values`` is neither 1-D nor 2-D.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim not in (1, 2):
        raise ConfigError(f"basins are found on 1-D or 2-D grids, got shape {values.shape}")
    inside = np.isfinite(values) & (values <= level)
    structure = ndimage.generate_binary_structure(values.ndim, 1)  # face neighbours only
    labels, _ = ndimage.label(inside, structure=structure)
    return labels.astype(np.int64)


def basin(result: PlaneResult | PathResult, *, models: Mapping[str, Any] | Sequence[str] | None = None,
          model_loss: Mapping[str, float] | None = None, level: float | None = None,
          refine: bool = True) -> BasinResult:
    """Basin analysis of a plane or a path (the operational definitions of the module docstring).

    The IMA paper (Sec. 3.2, Fig. 1) speaks of a common basin and of the global model
    deviating from its bottom without defining them; ``docs/methods/ima.md`` describes the
    definitions used here.

    Parameters
    ----------
    result
        A :class:`PlaneResult` or a :class:`PathResult`.
    models
        Names from ``result.models`` (plane), a mapping name -> coordinates (``(x, y)`` on a
        plane, ``alpha`` on a path), or None for every model placed in the plane (the
        endpoints ``a`` at alpha 0 and ``b`` at alpha 1 on a path).
    model_loss
        Exact losses of the models (by name) for the loss gaps; by default the loss of their
        nearest grid point.
    level
        The sublevel ``c``; default the highest grid loss at the models' points.
    refine
        Locate the bottom with a local quadratic fit of its 3x3 (3-point) neighbourhood.

    Returns
    -------
    BasinResult
        The components, each model's component, distance and loss gap to the bottom, and
        whether they share one basin (``common``).

    Raises
    ------
    ConfigError
        If the result is neither a plane nor a path, there are no models, a model lies outside
        the grid or is not placed in the plane, a coordinate has the wrong shape, a model's
        grid loss is not finite (with no explicit ``level``), or the grid has no finite loss.
    """
    grid, axes = _grid_of(result)
    coords = _model_coords(result, models)
    if not coords:
        raise ConfigError("no models to place: pass models={name: coordinates}")
    names = list(coords)
    xy = np.array([coords[n] for n in names], dtype=np.float64)
    cells = np.array([_nearest_cell(axes, p) for p in xy], dtype=np.int64)
    cell_loss = np.array([grid[tuple(c)] for c in cells], dtype=np.float64)
    if level is None:
        if not np.isfinite(cell_loss).all():
            raise ConfigError("a model's nearest grid point has a non-finite loss; pass an explicit level")
        level = float(cell_loss.max())
    components = sublevel_components(grid, level)
    model_comp = np.array([components[tuple(c)] for c in cells], dtype=np.int64)
    common = model_comp.size > 0 and model_comp[0] > 0 and (model_comp == model_comp[0]).all()
    search = np.where(components == model_comp[0], grid, np.inf) if common else grid
    search = np.where(np.isfinite(search), search, np.inf)
    if not np.isfinite(search).any():
        raise ConfigError("the grid has no finite loss value: no basin bottom")
    flat = int(np.argmin(search))
    idx = np.unravel_index(flat, grid.shape)
    bottom = np.array(_coords_of(axes, idx))
    bottom_loss = float(grid[idx])
    refined, refined_loss = (_refine(grid, axes, idx) if refine else (bottom, bottom_loss))
    losses = np.array([float(model_loss[n]) if model_loss and n in model_loss else cell_loss[i]
                       for i, n in enumerate(names)])
    distance = np.linalg.norm(xy - refined[None, :], axis=1)
    steps = [float(np.abs(np.diff(a)).max()) if len(a) > 1 else 0.0 for a in axes]
    return BasinResult(
        level=float(level), components=components, names=names, coords=xy, cells=cells,
        model_component=model_comp, model_loss=losses, bottom=bottom, bottom_loss=bottom_loss,
        refined_bottom=refined, refined_loss=float(refined_loss), distance=distance,
        loss_gap=losses - refined_loss, cell_diagonal=float(np.hypot(*steps) if len(steps) == 2 else steps[0]),
        spec={"kind": "basin", "version": ALGORITHM_VERSION, "refine": refine, "source": dict(result.spec)})


# ----------------------------------------------------------------------------- helpers
def _grid_of(result: PlaneResult | PathResult) -> tuple[np.ndarray, list[np.ndarray]]:
    """Loss grid and its axes: (len(y), len(x)) with axes [y, x] for a plane; [alphas] for a path."""
    if isinstance(result, PlaneResult):
        return np.asarray(result.loss, dtype=np.float64), [np.asarray(result.y), np.asarray(result.x)]
    if isinstance(result, PathResult):
        order = np.argsort(result.alphas)
        return np.asarray(result.loss, dtype=np.float64)[order], [np.asarray(result.alphas)[order]]
    raise ConfigError(f"basin analysis needs a PlaneResult or a PathResult, got {type(result).__name__}")


def _model_coords(result: PlaneResult | PathResult, models: Any) -> dict[str, tuple[float, float]]:
    """Model name -> (x, y); on a path x = alpha and y = 0."""
    is_plane = isinstance(result, PlaneResult)
    if models is None:
        models = dict(result.models) if is_plane else {"a": 0.0, "b": 1.0}
    elif not isinstance(models, Mapping):
        if not is_plane:
            raise ConfigError("on a path, pass models as a mapping name -> alpha")
        missing = [m for m in models if m not in result.models]
        if missing:
            raise ConfigError(f"models {missing} are not placed in the plane; placed: {list(result.models)}. "
                              "Use plane.with_models(name=model) first")
        models = {m: result.models[m] for m in models}
    out = {}
    for name, c in models.items():
        c = np.atleast_1d(np.asarray(c, dtype=np.float64))
        if is_plane and c.shape != (2,):
            raise ConfigError(f"model {name!r}: plane coordinates must be (x, y), got {c.tolist()}")
        if not is_plane and c.shape != (1,):
            raise ConfigError(f"model {name!r}: a path coordinate is one alpha, got {c.tolist()}")
        out[str(name)] = (float(c[0]), float(c[1]) if is_plane else 0.0)
    return out


def _nearest_cell(axes: list[np.ndarray], point: np.ndarray) -> tuple[int, ...]:
    """Grid index nearest to (x, y) or (alpha,); a model outside the grid is an error."""
    coords = [point[1], point[0]] if len(axes) == 2 else [point[0]]  # axes are [y, x]
    idx = []
    for axis, c, name in zip(axes, coords, ("y", "x") if len(axes) == 2 else ("alpha",)):
        lo, hi = float(axis.min()), float(axis.max())
        step = float(np.abs(np.diff(axis)).max()) if len(axis) > 1 else 0.0
        if c < lo - 0.5 * step or c > hi + 0.5 * step:
            raise ConfigError(f"a model at {name} = {c:.4g} lies outside the grid [{lo:.4g}, {hi:.4g}]; "
                              "widen the grid (margin/span) or pass it as extra= when building the plane")
        idx.append(int(np.argmin(np.abs(axis - c))))
    return tuple(idx)


def _coords_of(axes: list[np.ndarray], idx: tuple[int, ...]) -> tuple[float, float]:
    if len(axes) == 2:
        return float(axes[1][idx[1]]), float(axes[0][idx[0]])
    return float(axes[0][idx[0]]), 0.0


def _refine(grid: np.ndarray, axes: list[np.ndarray], idx: tuple[int, ...]) -> tuple[np.ndarray, float]:
    """Minimum of the quadratic fitted to the argmin's neighbourhood (3 points per axis).

    Falls back to the grid point when the argmin is on the border, a neighbour is not finite,
    the fit is not convex, or its minimum leaves the neighbourhood.
    """
    grid_point = np.array(_coords_of(axes, idx)), float(grid[idx])
    if any(i == 0 or i == len(a) - 1 for i, a in zip(idx, axes)):
        return grid_point
    window = tuple(slice(i - 1, i + 2) for i in idx)
    vals = grid[window]
    if not np.isfinite(vals).all():
        return grid_point
    local = [a[i - 1:i + 2] - a[i] for a, i in zip(axes, idx)]
    if len(axes) == 1:
        t = local[0]
        design = np.stack([np.ones(3), t, t ** 2], axis=1)
        c0, c1, c2 = np.linalg.solve(design, vals)
        if c2 <= 0:
            return grid_point
        t_star = -c1 / (2 * c2)
        if abs(t_star) > max(abs(t[0]), abs(t[2])):
            return grid_point
        return np.array([axes[0][idx[0]] + t_star, 0.0]), float(c0 + c1 * t_star + c2 * t_star ** 2)
    dy, dx = np.meshgrid(local[0], local[1], indexing="ij")
    x, y, z = dx.ravel(), dy.ravel(), vals.ravel()
    design = np.stack([np.ones_like(x), x, y, x * x, x * y, y * y], axis=1)
    c, *_ = np.linalg.lstsq(design, z, rcond=None)
    hess = np.array([[2 * c[3], c[4]], [c[4], 2 * c[5]]])
    if np.linalg.eigvalsh(hess).min() <= 0:
        return grid_point
    sx, sy = np.linalg.solve(hess, -c[1:3])
    if abs(sx) > np.abs(local[1]).max() or abs(sy) > np.abs(local[0]).max():
        return grid_point
    value = c[0] + c[1] * sx + c[2] * sy + c[3] * sx * sx + c[4] * sx * sy + c[5] * sy * sy
    return np.array([axes[1][idx[1]] + sx, axes[0][idx[0]] + sy]), float(value)
