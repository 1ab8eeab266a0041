"""FLOCO solution simplex: client points and loss over the simplex (FLOCO Sec. 3, Eq. 6).

Points are barycentric coordinates alpha (rows of shape (n, M), each summing to one) on the
simplex spanned by M endpoints. With M = 3 endpoints the simplex is drawn as a triangle
(ternary plot: alpha -> alpha @ vertices of an equilateral triangle, an exact affine map).
Otherwise the coordinates are projected onto their first two principal components
(PCA of the barycentric coordinates, endpoints projected alongside), which is affine too,
so straight lines and convex hulls are preserved.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure
from matplotlib.tri import Triangulation

from landscape.infra.errors import ConfigError

from .style import (
    PLOTLY_SEQUENTIAL,
    ROLES,
    SEQUENTIAL_CMAP,
    finite,
    fmt,
    masked_note,
    new_figure,
    style_context,
    style_plotly,
)

TRIANGLE = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, np.sqrt(3.0) / 2.0]])
SUM_TOL = 1e-4


def check_barycentric(points: np.ndarray, name: str = "points") -> np.ndarray:
    """``points`` as a float (n, M) array whose rows sum to one (within 1e-4)."""
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] < 2:
        raise ConfigError(f"{name} must have shape (n, M) with M >= 2 endpoints, got {pts.shape}")
    bad = np.flatnonzero(np.abs(pts.sum(axis=1) - 1.0) > SUM_TOL)
    if bad.size:
        raise ConfigError(f"{name} rows {bad[:5].tolist()} do not sum to one (barycentric coordinates on the "
                          "simplex are expected; normalise them first)")
    return pts


def simplex_projection(points: np.ndarray, reference: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """2-D coordinates of barycentric ``points`` and of the M endpoints (vertices).

    M = 3: ternary (exact). Otherwise: PCA fitted on ``reference`` (default: the points
    together with the vertices), applied to both.
    """
    pts = check_barycentric(points)
    m = pts.shape[1]
    vertices = np.eye(m)
    if m == 3:
        return pts @ TRIANGLE, TRIANGLE.copy()
    fit = np.vstack([pts, vertices]) if reference is None else check_barycentric(reference, "reference")
    mean = fit.mean(axis=0)
    _, _, vt = np.linalg.svd(fit - mean, full_matrices=False)
    basis = vt[:2].T
    if basis.shape[1] < 2:  # M = 2: a segment, drawn on the x-axis
        basis = np.hstack([basis, np.zeros((m, 1))])
    return (pts - mean) @ basis, (vertices - mean) @ basis


def _outline(ax, vertices: np.ndarray, names: Sequence[str]) -> None:
    m = len(vertices)
    for i in range(m):  # edges of the (projected) simplex
        for j in range(i + 1, m):
            ax.plot(vertices[[i, j], 0], vertices[[i, j], 1], color="black" if m == 3 else "#999999",
                    linewidth=1.0 if m == 3 else 0.5)
    ax.scatter(vertices[:, 0], vertices[:, 1], marker="s", s=30, color="black", zorder=4)
    centre = vertices.mean(axis=0)
    for (x, y), name in zip(vertices, names):
        dx, dy = x - centre[0], y - centre[1]
        ax.annotate(name, (x, y), xytext=(8 * np.sign(dx), 8 * np.sign(dy) if dy else -10),
                    textcoords="offset points", ha="center", va="center", fontweight="bold")
    ax.set_aspect("equal")
    ax.set_axis_off()


def _names(m: int, endpoint_names: Sequence[str] | None) -> list[str]:
    if endpoint_names is None:
        return [f"θ{i + 1}" for i in range(m)]
    if len(endpoint_names) != m:
        raise ConfigError(f"{len(endpoint_names)} endpoint names for {m} endpoints")
    return list(endpoint_names)


def simplex_figure(points: np.ndarray, *, values: np.ndarray | None = None, labels: Sequence[str] | None = None,
                   endpoint_names: Sequence[str] | None = None, grid: np.ndarray | None = None,
                   grid_values: np.ndarray | None = None, metric: str = "loss", title: str | None = None,
                   size: float = 4.6) -> Figure:
    """Matplotlib: client points on the simplex, optionally over the loss on simplex grid points.

    ``values`` colours the points (e.g. each client's loss); ``grid``/``grid_values`` are
    barycentric grid points and the metric there, drawn as filled contours (M = 3) or
    coloured dots (projection). Non-finite grid values are masked. With a grid, clients are
    drawn white (the colour scale belongs to the grid).
    """
    pts = check_barycentric(points)
    xy, vertices = simplex_projection(pts, None if grid is None else np.vstack([pts, grid, np.eye(pts.shape[1])]))
    masked = 0
    with style_context({"axes.grid": False}):
        fig = new_figure(size + 0.8, size)
        ax = fig.add_subplot()
        if grid is not None:
            gv = finite(grid_values)
            masked = int(np.isnan(gv).sum())
            basis = None if pts.shape[1] == 3 else np.vstack([pts, grid, np.eye(pts.shape[1])])
            gxy, _ = simplex_projection(grid, basis)
            ok = np.isfinite(gv)
            if pts.shape[1] == 3 and ok.sum() >= 3:
                tri = Triangulation(gxy[ok, 0], gxy[ok, 1])
                mappable = ax.tricontourf(tri, gv[ok], levels=15, cmap=SEQUENTIAL_CMAP)
            else:
                mappable = ax.scatter(gxy[ok, 0], gxy[ok, 1], c=gv[ok], s=12, cmap=SEQUENTIAL_CMAP)
            fig.colorbar(mappable, ax=ax, label=metric, shrink=0.8)
        _outline(ax, vertices, _names(pts.shape[1], endpoint_names))
        style = ROLES["client"]
        if values is not None and grid is None:
            sc = ax.scatter(xy[:, 0], xy[:, 1], c=finite(values), cmap=SEQUENTIAL_CMAP, marker=style.marker,
                            s=style.size, edgecolors="black", zorder=5, label="clients")
            fig.colorbar(sc, ax=ax, label=metric, shrink=0.8)
        else:
            ax.scatter(xy[:, 0], xy[:, 1], marker=style.marker, s=style.size, c="white", edgecolors="black",
                       zorder=5, label="clients")
        for (x, y), label in zip(xy, labels or []):
            ax.annotate(label, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=7)
        how = "ternary" if pts.shape[1] == 3 else "PCA projection of barycentric coordinates"
        fig.suptitle((title or f"Solution simplex ({how})") + masked_note(masked, "grid points"))
    return fig


def simplex_plotly(points: np.ndarray, *, values: np.ndarray | None = None, labels: Sequence[str] | None = None,
                   endpoint_names: Sequence[str] | None = None, grid: np.ndarray | None = None,
                   grid_values: np.ndarray | None = None, metric: str = "loss", title: str | None = None) -> go.Figure:
    """Plotly: ternary axes for 3 endpoints, else the PCA projection; hover shows alpha and values."""
    pts = check_barycentric(points)
    m = pts.shape[1]
    names = _names(m, endpoint_names)
    labels = list(labels) if labels is not None else [f"client {i}" for i in range(len(pts))]
    ref = None if grid is None else np.vstack([pts, grid, np.eye(m)])
    fig = go.Figure()
    masked = 0

    def hover(rows: np.ndarray, vals: np.ndarray | None, head: Sequence[str]) -> list[str]:
        return [f"{h}<br>α=(" + ", ".join(fmt(a, 3) for a in row) + ")"
                + (f"<br>{metric}={fmt(vals[i], 6)}" if vals is not None else "")
                for i, (h, row) in enumerate(zip(head, rows))]

    def add(rows: np.ndarray, name: str, marker: dict, text: list[str], labels_shown: list[str] | None) -> None:
        mode = "markers+text" if labels_shown else "markers"
        common = dict(mode=mode, name=name, marker=marker, hovertext=text, text=labels_shown,
                      textposition="top center", hovertemplate="%{hovertext}<extra></extra>")
        if m == 3:
            fig.add_trace(go.Scatterternary(a=rows[:, 0], b=rows[:, 1], c=rows[:, 2], **common))
        else:
            xy, _ = simplex_projection(rows, ref if ref is not None else np.vstack([pts, np.eye(m)]))
            fig.add_trace(go.Scatter(x=xy[:, 0], y=xy[:, 1], **common))

    if grid is not None:
        grid = check_barycentric(grid, "grid")
        gv = finite(grid_values)
        masked = int(np.isnan(gv).sum())
        ok = np.isfinite(gv)
        add(grid[ok], metric, {"color": gv[ok], "colorscale": PLOTLY_SEQUENTIAL, "size": 7, "symbol": "hexagon",
                               "colorbar": {"title": {"text": metric}}},
            hover(grid[ok], gv[ok], ["grid point"] * int(ok.sum())), None)
    vals = None if values is None else finite(values)
    marker = {"symbol": "triangle-up", "size": 11, "line": {"color": "black", "width": 1}}
    marker.update({"color": vals, "colorscale": PLOTLY_SEQUENTIAL} if vals is not None and grid is None
                  else {"color": "white"})
    add(pts, "clients", marker, hover(pts, vals, labels), labels)
    if m != 3:
        add(np.eye(m), "endpoints", {"symbol": "square", "color": "black", "size": 9},
            hover(np.eye(m), None, names), names)
    layout: dict = {}
    if m == 3:
        layout["ternary"] = {"aaxis": {"title": {"text": names[0]}}, "baxis": {"title": {"text": names[1]}},
                             "caxis": {"title": {"text": names[2]}}}
    else:
        layout.update(xaxis={"title": {"text": "PC 1"}}, yaxis={"title": {"text": "PC 2"}, "scaleanchor": "x"})
    how = "ternary" if m == 3 else "PCA projection of barycentric coordinates"
    return style_plotly(fig, (title or f"Solution simplex ({how})") + masked_note(masked, "grid points"), **layout)
