"""2-D planes: filled contours and 3-D surfaces of a metric, with the models placed in the plane.

Drawn from :class:`landscape.results.PlaneResult` (grid point (x, y) is origin + x u + y v
with u, v orthonormal, so both axes are in parameter-norm units and are drawn to equal
scale). As in Garipov et al. (2018) and FedGuCci Fig. 3 / IMA Fig. 1, levels may be
log-spaced and values clipped. Models come from ``PlaneResult.models`` (label -> (x, y));
their marker follows their role (client, global, anchor, ima, average, model), given
explicitly or inferred from the label prefix. Non-finite grid values (overflow) are
masked: drawn in grey and counted in the title. A ``trajectory`` (points of the plane, e.g.
an FL run's global models projected with ``PlaneResult.coordinates``) is drawn as a line with
markers, on the surface or at the heights given. When a diagnostic of
``PlaneResult.diagnostics`` fires (flat, saturated, centre not the minimum), the figure says so
in a caption line.
"""
from __future__ import annotations

import html
import textwrap
from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import NullFormatter

from landscape.infra.errors import ConfigError
from landscape.results import PlaneResult

from .plane_models import LabelSpot, by_size, merged_labels, model_points, placed_labels, value_at
from .registry import FIGURES, FigureKind
from .style import (
    MASKED_COLOR,
    PLOTLY_SEQUENTIAL,
    ROLES,
    SEQUENTIAL_CMAP,
    bn_note,
    fmt,
    masked_note,
    new_figure,
    style_context,
    style_plotly,
)

PLANE_METRICS = ("loss", "accuracy", "error")
KINDS = ("contour", "surface")
COLORBAR_PX = 110  # width of a plotly contour's colour bar and its labels
#: Colour of a trajectory's line and markers (the global model's colour: FL trajectories are of it).
TRAJECTORY_COLOR = ROLES["global"].color
#: A trajectory: ``(x, y)`` or ``(x, y, z)`` points in order, or label -> point.
Trajectory = Sequence[Sequence[float]] | Mapping[str, Sequence[float]]


def plane_values(plane: PlaneResult, metric: str = "loss", clip: float | None = None) -> np.ndarray:
    """The metric on the grid, shape (len(y), len(x)); non-finite -> NaN; clipped above at ``clip``.

    ``error`` is the test error in percent, 100 (1 - accuracy), as in IMA Fig. 1.
    """
    if metric not in PLANE_METRICS:
        raise ConfigError(f"metric {metric!r}: choose from {PLANE_METRICS}")
    raw = plane.loss if metric == "loss" else plane.accuracy
    values = np.array(raw, dtype=np.float64)
    if metric == "error":
        values = 100.0 * (1.0 - values)
    values[~np.isfinite(values)] = np.nan
    if clip is not None:
        values = np.minimum(values, clip)
    return values


def diagnostics_note(plane: PlaneResult) -> str:
    """The plane's fired diagnostics as one caption line, empty when none fired (the title counts non-finite points).

    Parameters
    ----------
    plane
        The plane.

    Returns
    -------
    str
        The notes of ``plane.diagnostics`` joined with "; ".
    """
    messages = plane.diagnostics.messages
    messages.pop("nonfinite", None)
    return "; ".join(messages.values())


def trajectory_points(plane: PlaneResult, trajectory: Trajectory, surface: np.ndarray, *, log_scale: bool = False,
                      clip: float | None = None) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Labels, ``x``, ``y``, drawn height and metric value of each point of a trajectory.

    Parameters
    ----------
    plane
        The plane the trajectory is drawn on.
    trajectory
        ``(x, y)`` or ``(x, y, z)`` points in order (``z``: the metric at that model, e.g. its
        evaluated loss), or label -> point. Without ``z`` a point sits on the surface (the grid
        interpolated at ``(x, y)``).
    surface
        The drawn grid (after ``clip`` and ``log_scale``).
    log_scale, clip
        As for the figure: applied to given ``z`` values.

    Returns
    -------
    tuple
        ``(labels, xs, ys, heights, values)``; a point off the grid is drawn at the surface's lowest
        height, its ``value`` NaN.

    Raises
    ------
    ConfigError
        If the trajectory is empty or not made of 2 or 3 numbers per point with finite ``x``, ``y``.
    """
    items = list(trajectory.items()) if isinstance(trajectory, Mapping) else \
        [(f"point {i}", p) for i, p in enumerate(trajectory)]
    try:
        pts = np.array([[float(c) for c in p] for _, p in items], dtype=np.float64)
    except (TypeError, ValueError):
        pts = np.empty((0, 0))
    if pts.ndim != 2 or len(pts) == 0 or pts.shape[1] not in (2, 3) or not np.isfinite(pts[:, :2]).all():
        raise ConfigError("trajectory must be a non-empty sequence of (x, y) or (x, y, z) points with finite x "
                          "and y, e.g. [plane.coordinates(model) for model in models]")
    xs, ys = pts[:, 0], pts[:, 1]
    if pts.shape[1] == 3:
        values = np.minimum(pts[:, 2], clip) if clip is not None else pts[:, 2]
        heights = _log10(values, "trajectory's z") if log_scale else values
    else:
        heights = np.array([value_at(plane, surface, x, y) for x, y in zip(xs, ys)])
        values = 10.0 ** heights if log_scale else heights
    heights = np.where(np.isfinite(heights), heights, np.nanmin(surface))
    return [str(label) for label, _ in items], xs, ys, heights, values


def _levels(values: np.ndarray, levels: int, log_scale: bool, metric: str) -> np.ndarray:
    lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
    if log_scale:
        if lo <= 0:
            raise ConfigError(f"log-scaled levels need positive values, but the {metric} reaches {lo:.4g}; "
                              "use log_scale=False")
        return np.geomspace(lo, hi if hi > lo else lo * 1.001, levels)
    return np.linspace(lo, hi if hi > lo else lo + 1e-12, levels)


def _title(plane: PlaneResult, metric: str, title: str | None, values: np.ndarray) -> str:
    return (title or f"Plane: {metric}") + bn_note(plane) + masked_note(int(np.isnan(values).sum()), "grid points")


def _path(plane: PlaneResult, trajectory: Trajectory | None, values: np.ndarray, metric: str, kind: str,
          log_scale: bool, clip: float | None) -> tuple | None:
    logged = log_scale and kind == "surface"
    return None if trajectory is None else trajectory_points(
        plane, trajectory, _log10(values, metric) if logged else values, log_scale=logged, clip=clip)


def plane_figure(plane: PlaneResult, *, metric: str = "loss", kind: str = "contour", log_scale: bool = False,
                 levels: int = 20, clip: float | None = None, roles: Mapping[str, str] | None = None,
                 title: str | None = None, width: float = 5.2, height: float = 4.4,
                 trajectory: Trajectory | None = None, trajectory_label: str = "trajectory") -> Figure:
    """Matplotlib: filled contours (``kind="contour"``) or a 3-D surface (``kind="surface"``).

    ``log_scale`` spaces levels geometrically (surface: plots log10 of the metric); ``clip``
    caps values from above before drawing (Garipov's plots clip the loss). ``trajectory``
    (see :func:`trajectory_points`) is drawn as a line with markers named ``trajectory_label``;
    fired diagnostics are noted in a caption line (:func:`diagnostics_note`).
    """
    if kind not in KINDS:
        raise ConfigError(f"kind {kind!r}: choose from {KINDS}")
    values = plane_values(plane, metric, clip)
    if np.isnan(values).all():
        raise ConfigError(f"every {metric} value of the plane is non-finite; nothing to draw")
    path = _path(plane, trajectory, values, metric, kind, log_scale, clip)
    with style_context({"axes.grid": False}):
        fig = new_figure(width, height)
        if kind == "contour":
            _draw_contour(fig, plane, values, metric, log_scale, levels, roles, path, trajectory_label)
        else:
            _draw_surface(fig, plane, values, metric, log_scale, roles, path, trajectory_label)
        fig.suptitle(_title(plane, metric, title, values))
        note = diagnostics_note(plane)
        if note:  # a caption line under everything (constrained layout makes room for it)
            fig.supxlabel("\n".join(textwrap.wrap(note, int(width * 15))), fontsize=7, color="#8B0000")
    return fig


def _draw_contour(fig: Figure, plane: PlaneResult, values: np.ndarray, metric: str, log_scale: bool,
                  levels: int, roles: Mapping[str, str] | None, path: tuple | None, path_label: str) -> None:
    ax = fig.add_subplot()
    masked = np.ma.masked_invalid(values)
    lv = _levels(values, levels, log_scale, metric)
    norm = LogNorm(lv[0], lv[-1]) if log_scale else None
    cs = ax.contourf(plane.x, plane.y, masked, levels=lv, cmap=SEQUENTIAL_CMAP, norm=norm, extend="neither")
    ax.contour(plane.x, plane.y, masked, levels=lv, colors="black", linewidths=0.3, alpha=0.5, norm=norm)
    cbar = fig.colorbar(cs, ax=ax, label=metric + (" (log scale)" if log_scale else ""), shrink=0.9,
                        ticks=lv[::max(len(lv) // 6, 1)], format="%.3g")
    cbar.ax.yaxis.set_minor_formatter(NullFormatter())
    handles = []
    if np.isnan(values).any():
        ax.set_facecolor(MASKED_COLOR)
        handles.append(Patch(facecolor=MASKED_COLOR, label=f"non-finite ({int(np.isnan(values).sum())} masked)"))
    grouped = model_points(plane, roles)
    # biggest markers first, so a small marker on the same spot stays visible on top
    for role, pts in by_size(grouped):
        style = ROLES[role]
        xs, ys = [p[1] for p in pts], [p[2] for p in pts]
        handles.append(ax.scatter(xs, ys, marker=style.marker, s=style.size, c=style.color, edgecolors="black",
                                  linewidths=0.8, zorder=6, label=role))
    if path is not None:
        handles += ax.plot(path[1], path[2], "-o", color=TRAJECTORY_COLOR, markersize=3, linewidth=1.2, zorder=7,
                           markeredgecolor="black", markeredgewidth=0.4, label=path_label)
    mid = 0.5 * (plane.x[0] + plane.x[-1])
    for text, x, y in merged_labels(plane, grouped):
        left = x <= mid
        ax.annotate(text, (x, y), xytext=(6 if left else -6, 6), textcoords="offset points", fontsize=7,
                    ha="left" if left else "right", zorder=5,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7})
    ax.set_xlim(plane.x[0], plane.x[-1])
    ax.set_ylim(plane.y[0], plane.y[-1])
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel("x (along u)")
    ax.set_ylabel("y (along v)")
    if handles:  # below the axes: never over the models or the contours
        ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=min(len(handles), 3),
                  fontsize=7, frameon=False)


def _draw_surface(fig: Figure, plane: PlaneResult, values: np.ndarray, metric: str, log_scale: bool,
                  roles: Mapping[str, str] | None, path: tuple | None, path_label: str) -> None:
    ax = fig.add_subplot(projection="3d", computed_zorder=False)
    z = _log10(values, metric) if log_scale else values
    xx, yy = np.meshgrid(plane.x, plane.y)
    surf = ax.plot_surface(xx, yy, np.ma.masked_invalid(z), cmap=SEQUENTIAL_CMAP, linewidth=0,
                           antialiased=True, alpha=0.9)
    fig.colorbar(surf, ax=ax, shrink=0.6, pad=0.12, label=_zlabel(metric, log_scale))
    for role, pts in model_points(plane, roles).items():
        style = ROLES[role]
        zs = [value_at(plane, z, x, y) for _, x, y in pts]
        zs = [v if np.isfinite(v) else float(np.nanmin(z)) for v in zs]
        ax.scatter([p[1] for p in pts], [p[2] for p in pts], zs, marker=style.marker, s=style.size,
                   c=style.color, edgecolors="black", depthshade=False, label=role, zorder=5)
        for (label, x, y), zv in zip(pts, zs):
            ax.text(x, y, zv, f" {label}", fontsize=7, zorder=6)
    if path is not None:
        ax.plot(path[1], path[2], path[3], "-o", color=TRAJECTORY_COLOR, markersize=3, linewidth=1.5, zorder=7,
                markeredgecolor="black", markeredgewidth=0.4, label=path_label)
        ax.legend(loc="upper left", fontsize=7, frameon=False)
    ax.set_xlabel("x (along u)")
    ax.set_ylabel("y (along v)")
    ax.set_zlabel(_zlabel(metric, log_scale), labelpad=8)


def _log10(values: np.ndarray, metric: str) -> np.ndarray:
    if np.nanmin(values) <= 0:
        raise ConfigError(f"a log scale needs positive values, but the {metric} reaches "
                          f"{np.nanmin(values):.4g}; use log_scale=False")
    return np.log10(values)


def _zlabel(metric: str, log_scale: bool) -> str:
    return f"log10 {metric}" if log_scale else metric


def contour_size(plane: PlaneResult, plot_width: int = 480) -> dict[str, object]:
    """Plotly ``width``, ``height`` and ``margin`` fitting an equal-scale plane without empty bands.

    Parameters
    ----------
    plane
        The plane; its x and y extents set the aspect ratio of the plotting area.
    plot_width
        Width of the plotting area in pixels (the height follows the aspect, within 200-720).

    Returns
    -------
    dict
        Layout entries: the plot area plus room for the title, axis titles, colour bar and legend.
    """
    aspect = (plane.y[-1] - plane.y[0]) / (plane.x[-1] - plane.x[0])
    plot_height = float(np.clip(plot_width * aspect, 200, 720))
    width, plot_height = int(min(plot_height / aspect, 1000)), int(plot_height)
    margin = {"l": 70, "r": 20, "t": 60, "b": 110}
    return {"width": width + margin["l"] + margin["r"] + COLORBAR_PX, "height": plot_height + margin["t"] + margin["b"],
            "margin": margin, "autosize": False}


def _plotly_labels(plane: PlaneResult, spots: list[tuple[str, float, float]]) -> list[LabelSpot]:
    """:func:`placed_labels` in the plotting area that :func:`contour_size` gives the plane."""
    layout = contour_size(plane)
    margin = layout["margin"]
    width = layout["width"] - margin["l"] - margin["r"] - COLORBAR_PX
    height = layout["height"] - margin["t"] - margin["b"]
    extent = (plane.x[-1] - plane.x[0], plane.y[-1] - plane.y[0])
    scale = min(width / extent[0], height / extent[1])
    return placed_labels(spots, scale, (extent[0] * scale, extent[1] * scale), (plane.x[0], plane.y[0]))


def _hover_grid(plane: PlaneResult) -> np.ndarray:
    """Hover strings of every grid point, shape (len(y), len(x)) (an object array: plotly keeps it 2-D)."""
    return np.array([[f"x={fmt(x)}<br>y={fmt(y)}<br>loss={fmt(plane.loss[i, j], 6)}"
                      f"<br>accuracy={fmt(plane.accuracy[i, j], 6)}" for j, x in enumerate(plane.x)]
                     for i, y in enumerate(plane.y)], dtype=object)


def plane_plotly(plane: PlaneResult, *, metric: str = "loss", kind: str = "contour", log_scale: bool = False,
                 levels: int = 20, clip: float | None = None, roles: Mapping[str, str] | None = None,
                 title: str | None = None, trajectory: Trajectory | None = None,
                 trajectory_label: str = "trajectory") -> go.Figure:
    """Plotly: interactive contour or rotatable surface; hover gives x, y, loss and accuracy.

    With ``log_scale`` the colour (and surface height) is log10 of the metric; hover still
    shows the raw values. Models hover with their label, coordinates and the metric
    interpolated from the grid. ``trajectory`` (see :func:`trajectory_points`) is one more
    trace named ``trajectory_label``: a 3-D line with markers on the surface (or at the given
    heights), or a line over the contours. Fired diagnostics are noted under the title.
    """
    if kind not in KINDS:
        raise ConfigError(f"kind {kind!r}: choose from {KINDS}")
    values = plane_values(plane, metric, clip)
    if np.isnan(values).all():
        raise ConfigError(f"every {metric} value of the plane is non-finite; nothing to draw")
    z = _log10(values, metric) if log_scale else values
    hover = dict(text=_hover_grid(plane), hovertemplate="%{text}<extra></extra>")
    colorbar = {"title": {"text": _zlabel(metric, log_scale)}}
    if kind == "contour":
        lo, hi = float(np.nanmin(z)), float(np.nanmax(z))
        fig = go.Figure(go.Contour(x=plane.x, y=plane.y, z=z, colorscale=PLOTLY_SEQUENTIAL, colorbar=colorbar,
                                   ncontours=levels, contours={"start": lo, "end": hi,
                                                               "size": (hi - lo) / max(levels - 1, 1) or None},
                                   name=metric, **hover))
    else:
        fig = go.Figure(go.Surface(x=plane.x, y=plane.y, z=z, colorscale=PLOTLY_SEQUENTIAL, colorbar=colorbar,
                                   name=metric, **hover))
    for role, pts in by_size(model_points(plane, roles)):
        style = ROLES[role]
        zs = [value_at(plane, z, x, y) for _, x, y in pts]
        raw = [value_at(plane, values, x, y) for _, x, y in pts]
        text = [f"{label} ({role})<br>x={fmt(x)}<br>y={fmt(y)}<br>{metric}≈{fmt(v, 6)} (grid interpolation)"
                for (label, x, y), v in zip(pts, raw)]
        marker = {"symbol": style.symbol if kind == "contour" else style.symbol3d, "size": 11, "color": style.color,
                  "line": {"color": "black", "width": 1}}
        common = dict(mode="markers", name=role, hovertext=text, hovertemplate="%{hovertext}<extra></extra>",
                      marker=marker)
        if kind == "contour":
            fig.add_trace(go.Scatter(x=[p[1] for p in pts], y=[p[2] for p in pts], **common))
        else:
            zs = [v if np.isfinite(v) else float(np.nanmin(z)) for v in zs]
            common.update(mode="markers+text", text=[p[0] for p in pts], textposition="top right")
            fig.add_trace(go.Scatter3d(x=[p[1] for p in pts], y=[p[2] for p in pts], z=zs, **common))
    if kind == "contour" and plane.models:  # one label per spot (coincident models share it), beside its marker
        for spot in _plotly_labels(plane, merged_labels(plane, model_points(plane, roles))):
            fig.add_annotation(x=spot.x, y=spot.y, text=spot.text, showarrow=False, xanchor=spot.xanchor,
                               yanchor="middle", xshift=spot.xshift, yshift=spot.yshift, font={"size": 12},
                               bgcolor="rgba(255, 255, 255, 0.7)", borderpad=1)
    if np.isnan(values).any():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", marker={"color": MASKED_COLOR, "size": 10},
                                 name=f"non-finite ({int(np.isnan(values).sum())} masked)")
                      if kind == "contour" else
                      go.Scatter3d(x=[None], y=[None], z=[None], mode="markers", marker={"color": MASKED_COLOR},
                                   name=f"non-finite ({int(np.isnan(values).sum())} masked)"))
    path = _path(plane, trajectory, values, metric, kind, log_scale, clip)
    if path is not None:
        labels, xs, ys, heights, raw = path
        text = [f"{label}<br>x={fmt(x)}<br>y={fmt(y)}<br>{metric}={fmt(v, 6)}"
                for label, x, y, v in zip(labels, xs, ys, raw)]
        common = dict(mode="lines+markers", name=trajectory_label, hovertext=text,
                      hovertemplate="%{hovertext}<extra></extra>", line={"color": TRAJECTORY_COLOR, "width": 4},
                      marker={"size": 4 if kind == "surface" else 7, "color": TRAJECTORY_COLOR,
                              "line": {"color": "black", "width": 1}})
        fig.add_trace(go.Scatter3d(x=xs, y=ys, z=heights, **common) if kind == "surface"
                      else go.Scatter(x=xs, y=ys, **common))
    layout: dict[str, object] = {"legend": {"orientation": "h", "y": -0.15}}
    note = diagnostics_note(plane)
    if kind == "contour":
        layout.update(contour_size(plane))
        if note:  # room for the note under the title
            layout["margin"] = {**layout["margin"], "t": layout["margin"]["t"] + 30}
            layout["height"] = layout["height"] + 30
        layout.update(xaxis={"title": {"text": "x (along u)"}, "range": [plane.x[0], plane.x[-1]],
                             "constrain": "domain"},
                      yaxis={"title": {"text": "y (along v)"}, "scaleanchor": "x", "scaleratio": 1,
                             "range": [plane.y[0], plane.y[-1]], "constrain": "domain"},
                      plot_bgcolor=MASKED_COLOR if np.isnan(values).any() else "white")
    else:
        layout["scene"] = {"xaxis_title": "x (along u)", "yaxis_title": "y (along v)",
                           "zaxis_title": _zlabel(metric, log_scale)}
    text = _title(plane, metric, title, values) + (f"<br><sup>{html.escape(note)}</sup>" if note else "")
    return style_plotly(fig, text, **layout)


FIGURES.add("plane", FigureKind((PlaneResult,), plane_figure, plane_plotly))
