"""Figures of mode connectivity beyond the straight line.

* :func:`alignment_figure` / :func:`alignment_plotly` -- interpolation paths before and after
  permutation alignment (and REPAIR), from the paths of a "connected modulo permutation"
  verdict or any name -> PathResult mapping.
* :func:`curve_figure` / :func:`curve_plotly` -- loss and accuracy along a learned curve and
  along the straight line between the same endpoints (Garipov et al. 2018, Figure 2).
* :func:`curve_plane_figure` / :func:`curve_plane_plotly` -- the loss on the plane through the
  endpoints and the bend, with the curve and the line drawn in it (Garipov et al. Figure 1).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure

from landscape.results import CurveResult

from .paths import METRICS, path_figure, path_plotly
from .planes import plane_figure, plane_plotly
from .registry import FIGURES, FigureKind
from .style import color

if TYPE_CHECKING:  # result classes, duck-typed at run time
    from landscape import PathResult, PlaneResult

T_LABEL = "t (curve parameter)"


def _alignment_paths(source: Any) -> Mapping[str, "PathResult"]:
    paths = getattr(source, "results", {}).get("paths") if hasattr(source, "results") else source
    if not isinstance(paths, Mapping) or not paths:
        raise TypeError("pass a connected_modulo_permutation verdict or a mapping name -> PathResult")
    return paths


def alignment_figure(source: Any, *, metrics: Sequence[str] = METRICS, title: str | None = None) -> Figure:
    """Matplotlib: the a-b path before alignment, after it, and after alignment plus REPAIR."""
    return path_figure(dict(_alignment_paths(source)), metrics=metrics,
                       title=title or "Linear interpolation before and after permutation alignment")


def alignment_plotly(source: Any, *, metrics: Sequence[str] = METRICS, title: str | None = None) -> go.Figure:
    """Plotly version of :func:`alignment_figure`."""
    return path_plotly(dict(_alignment_paths(source)), metrics=metrics,
                       title=title or "Linear interpolation before and after permutation alignment")


def _curve_and_line(result: Any) -> dict[str, "PathResult"]:
    return {f"{result.curve_kind} curve": result.path, "straight line": result.line}


def curve_figure(result: Any, *, metrics: Sequence[str] = METRICS, title: str | None = None) -> Figure:
    """Matplotlib: loss/accuracy against ``t`` on the learned curve and on the line, barriers marked."""
    fig = path_figure(_curve_and_line(result), metrics=metrics,
                      title=title or f"Learned {result.curve_kind} curve vs straight line")
    for ax in fig.axes:
        ax.set_xlabel(T_LABEL)
    return fig


def curve_plotly(result: Any, *, metrics: Sequence[str] = METRICS, title: str | None = None) -> go.Figure:
    """Plotly version of :func:`curve_figure`."""
    fig = path_plotly(_curve_and_line(result), metrics=metrics,
                      title=title or f"Learned {result.curve_kind} curve vs straight line")
    fig.update_xaxes(title_text=T_LABEL)
    return fig


def curve_trace(plane: "PlaneResult", result: Any, points: int = 101) -> np.ndarray:
    """(points, 2) plane coordinates of the curve ``phi(t)`` for ``t`` evenly spaced on [0, 1]."""
    return np.array([plane.coordinates(result.point(t)) for t in np.linspace(0.0, 1.0, points)])


def curve_plane_figure(plane: "PlaneResult", result: Any, *, metric: str = "loss", log_scale: bool = True,
                       clip: float | None = None, title: str | None = None) -> Figure:
    """Matplotlib: contours of the plane through a, b and the bend, with the curve and the line."""
    fig = plane_figure(plane, metric=metric, log_scale=log_scale, clip=clip,
                       title=title or f"Plane through the endpoints and the bend ({metric})")
    ax = fig.axes[0]
    xy = curve_trace(plane, result)
    ends = xy[[0, -1]]
    ax.plot(xy[:, 0], xy[:, 1], color=color(0), linewidth=1.8, label=f"{result.curve_kind} curve", zorder=4)
    ax.plot(ends[:, 0], ends[:, 1], color=color(1), linewidth=1.2, linestyle="--", label="straight line", zorder=4)
    ax.legend(loc="upper right", fontsize=7, frameon=True)
    return fig


def curve_plane_plotly(plane: "PlaneResult", result: Any, *, metric: str = "loss", log_scale: bool = True,
                       title: str | None = None) -> go.Figure:
    """Plotly version of :func:`curve_plane_figure`."""
    fig = plane_plotly(plane, metric=metric, log_scale=log_scale,
                       title=title or f"Plane through the endpoints and the bend ({metric})")
    xy = curve_trace(plane, result)
    fig.add_trace(go.Scatter(x=xy[:, 0], y=xy[:, 1], mode="lines", name=f"{result.curve_kind} curve",
                             line={"color": color(0), "width": 3}))
    fig.add_trace(go.Scatter(x=xy[[0, -1], 0], y=xy[[0, -1], 1], mode="lines", name="straight line",
                             line={"color": color(1), "dash": "dash"}))
    return fig


__all__ = ["alignment_figure", "alignment_plotly", "curve_figure", "curve_plane_figure", "curve_plane_plotly",
           "curve_plotly", "curve_trace"]


FIGURES.add("curve", FigureKind((CurveResult,), curve_figure, curve_plotly))
