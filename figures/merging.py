"""Merges on the landscape: the paths from a merge to the models it combines, and merges on a plane.

Drawn from :class:`landscape.results.MergeResult` (its ``paths``: the straight line from the merge,
alpha = 0, to each model, alpha = 1, with FedGuCci Eq. 3/4 barriers) and from a
:class:`landscape.results.PlaneResult` that places the merges among the models, e.g.
``landscape.plane(base, a, b, ev, extra={"ties": ties.state_dict(), ...})``: merges are drawn as
plus signs (role ``"merge"``), the base as a diamond (``"anchor"``), the other models as circles.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import plotly.graph_objects as go
from matplotlib.figure import Figure

from landscape.infra.errors import ConfigError
from landscape.results import MergeResult, PathResult, PlaneResult

from .paths import METRICS, path_figure, path_plotly
from .planes import plane_figure, plane_plotly
from .registry import FIGURES, FigureKind

#: One merge, or name -> merge.
MergesLike = MergeResult | Mapping[str, MergeResult]
#: What the figures call the two ends of a path from a merge.
ENDS = ("merge", "model")


def merge_paths(merges: MergesLike) -> dict[str, PathResult]:
    """The measured paths from each merge to each of its models, named ``"<merge>: merge → <model>"``.

    Parameters
    ----------
    merges
        One :class:`MergeResult` (named by its method) or name -> result.

    Returns
    -------
    dict[str, PathResult]

    Raises
    ------
    ConfigError
        A merge was made without an evaluator (it has no paths).
    """
    named = {merges.method: merges} if isinstance(merges, MergeResult) else dict(merges)
    out = {}
    for name, result in named.items():
        if not result.paths:
            raise ConfigError(f"merge {name!r} has no measured paths: merge with evaluator= to draw them")
        out.update({f"{name}: merge → {label}": result.path(i) for i, label in enumerate(result.labels)})
    return out


def merge_figure(merges: MergesLike, *, metrics: Sequence[str] = METRICS, title: str | None = None,
                 width: float = 7.0, height: float = 3.0) -> Figure:
    """Matplotlib: loss and accuracy along the line from each merge to each of its models, barriers marked.

    Parameters
    ----------
    merges
        One :class:`MergeResult` or name -> result, measured with an evaluator.
    metrics, title, width, height
        As :func:`figures.paths.path_figure`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    return path_figure(merge_paths(merges), metrics=metrics, endpoint_labels=ENDS, width=width, height=height,
                       title=title or "From the merge to each model")


def merge_plotly(merges: MergesLike, *, metrics: Sequence[str] = METRICS, title: str | None = None) -> go.Figure:
    """Plotly: the paths of :func:`merge_figure`.

    Parameters
    ----------
    merges
        One :class:`MergeResult` or name -> result, measured with an evaluator.
    metrics, title
        As :func:`figures.paths.path_plotly`.

    Returns
    -------
    plotly.graph_objects.Figure
    """
    return path_plotly(merge_paths(merges), metrics=metrics, endpoint_labels=ENDS,
                       title=title or "From the merge to each model")


def merge_roles(plane: PlaneResult, merges: Sequence[str], base: str | None = None) -> dict[str, str]:
    """Roles of the models of ``plane``: ``merge`` for ``merges``, ``anchor`` for ``base``, ``model`` otherwise.

    Parameters
    ----------
    plane
        A plane whose ``models`` include the merges.
    merges
        Labels of the merged points in ``plane.models``.
    base
        Label of the base model, if any.

    Returns
    -------
    dict[str, str]

    Raises
    ------
    ConfigError
        A label is not a model of the plane.
    """
    labels = [str(k) for k in plane.models]
    missing = [m for m in [*merges, *([base] if base is not None else [])] if m not in labels]
    if missing:
        raise ConfigError(f"{missing[0]!r} is not a model of the plane (its models: {', '.join(labels)}); place the "
                          "merges with landscape.plane(..., extra={name: result.state_dict()})")
    return {label: "merge" if label in merges else "anchor" if label == base else "model" for label in labels}


def merge_plane_figure(plane: PlaneResult, merges: Sequence[str], *, base: str | None = None,
                       metric: str = "loss", title: str | None = None, **options: Any) -> Figure:
    """Matplotlib: the plane's contours with the merges marked among the models (and the base).

    Parameters
    ----------
    plane
        E.g. ``landscape.plane(base, a, b, ev, labels=("base", "a", "b"), extra={"ties": ...})``.
    merges
        Labels of the merged points in ``plane.models``.
    base
        Label of the base model, drawn as an anchor.
    metric, title
        As :func:`figures.planes.plane_figure` (default title: the metric and the merges).
    **options
        Further options of :func:`figures.planes.plane_figure` (``log_scale``, ``levels``, ``clip``, ...).

    Returns
    -------
    matplotlib.figure.Figure
    """
    return plane_figure(plane, metric=metric, roles=merge_roles(plane, merges, base),
                        title=title or f"{metric}: merges ({', '.join(merges)}) among the models", **options)


def merge_plane_plotly(plane: PlaneResult, merges: Sequence[str], *, base: str | None = None,
                       metric: str = "loss", title: str | None = None, **options: Any) -> go.Figure:
    """Plotly: the plane of :func:`merge_plane_figure`.

    Parameters
    ----------
    plane, merges, base, metric, title
        As :func:`merge_plane_figure`.
    **options
        Further options of :func:`figures.planes.plane_plotly`.

    Returns
    -------
    plotly.graph_objects.Figure
    """
    return plane_plotly(plane, metric=metric, roles=merge_roles(plane, merges, base),
                        title=title or f"{metric}: merges ({', '.join(merges)}) among the models", **options)


FIGURES.add("merge", FigureKind((MergeResult,), merge_figure, merge_plotly))
