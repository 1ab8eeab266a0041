"""1-D interpolation paths: loss and accuracy against alpha, endpoints and barriers marked.

Drawn from :class:`landscape.results.PathResult` (model at alpha is (1 - alpha) a + alpha b).
The barrier annotated is FedGuCci Eq. 3 (loss) / Eq. 4 (accuracy): the largest gap between
the curve and the straight line joining the endpoint values, at the alpha attaining it.
Several paths share the axes (e.g. vanilla vs connectivity-loss training).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure
from plotly.subplots import make_subplots

from landscape.infra.errors import ConfigError
from landscape.results import PathResult

from .style import bn_note, color, finite, fmt, masked_note, new_figure, style_context, style_plotly

PathsLike = PathResult | Mapping[str, PathResult] | Sequence[PathResult]
METRICS = ("loss", "accuracy")
LEGEND_ROW = 0.17  # inches of figure height per legend entry


def named_paths(paths: PathsLike) -> list[tuple[str, PathResult]]:
    """``[(name, path), ...]`` from one path, a name -> path mapping, or a sequence."""
    if isinstance(paths, PathResult):
        return [("path", paths)]
    if isinstance(paths, Mapping):
        return list(paths.items())
    return [(f"path {i}", p) for i, p in enumerate(paths)]


def endpoint_values(path: PathResult, metric: str) -> tuple[float, float] | None:
    """The metric at alpha = 0 and alpha = 1, or None when either is not on the grid."""
    values = getattr(path, metric)
    at = [np.flatnonzero(np.isclose(path.alphas, a, atol=1e-9)) for a in (0.0, 1.0)]
    if any(idx.size == 0 for idx in at):
        return None
    return float(values[at[0][0]]), float(values[at[1][0]])


def barrier_location(path: PathResult, metric: str) -> tuple[float, float] | None:
    """``(alpha*, barrier)``: where the Eq. 3/4 barrier curve peaks and the barrier value.

    None when alpha = 0 or 1 is missing from the grid or the curve is entirely NaN.
    """
    if endpoint_values(path, metric) is None:
        return None
    curve = path.loss_curve if metric == "loss" else path.accuracy_curve
    if np.isnan(curve).all():
        return None
    inside = path.alphas[(path.alphas >= -1e-9) & (path.alphas <= 1 + 1e-9)]
    i = int(np.argmax(np.where(np.isnan(curve), -np.inf, curve)))
    value = path.loss_barrier if metric == "loss" else path.accuracy_barrier
    return float(inside[i]), float(value)


def barrier_text(value: float, metric: str) -> str:
    """Loss barriers in loss units; accuracy barriers (a relative drop, Eq. 4) in percent."""
    return fmt(value, 3) if metric == "loss" or not np.isfinite(value) else f"{100 * value:.3g}%"


def _check_metrics(metrics: Sequence[str]) -> None:
    bad = [m for m in metrics if m not in METRICS]
    if bad or not metrics:
        raise ConfigError(f"metrics {list(metrics)}: choose from {METRICS}")


def path_figure(paths: PathsLike, *, metrics: Sequence[str] = METRICS,
                endpoint_labels: tuple[str, str] | None = ("A", "B"), title: str | None = None,
                width: float = 7.0, height: float = 3.0) -> Figure:
    """Matplotlib: one panel per metric, one line per path, endpoints and barrier marked.

    The dashed line joins the endpoint values (the baseline of FedGuCci Eq. 3/4); the arrow at
    alpha* spans the barrier gap (drawn only for a positive barrier). The endpoint names label
    alpha = 0 and alpha = 1 once, on the top axis; each panel's legend sits below it (never on
    the curves) and names every path with its barrier. With one path the barrier value is also
    written next to its arrow. Non-finite (overflowed) points are left out of the lines and
    counted in the title.

    Parameters
    ----------
    paths
        One :class:`PathResult`, a name -> path mapping, or a sequence of paths.
    metrics
        Panels to draw, from ``("loss", "accuracy")``.
    endpoint_labels
        Names of the models at alpha = 0 and alpha = 1 (None: no names).
    title, width, height
        Figure title (the BatchNorm mode of BN models is appended) and size in inches (the
        height grows by :data:`LEGEND_ROW` per path for the legends).

    Returns
    -------
    matplotlib.figure.Figure
    """
    _check_metrics(metrics)
    named = named_paths(paths)
    with style_context():
        fig = new_figure(width, height + LEGEND_ROW * len(named))  # room for the legends below the panels
        axes = fig.subplots(1, len(metrics), squeeze=False)[0]
        for ax, metric in zip(axes, metrics):
            for i, (name, path) in enumerate(named):
                _draw_path(ax, name, path, metric, color(i), annotate=len(named) == 1)
            ax.set_xlabel("α (interpolation coefficient)")
            ax.set_ylabel(metric)
            if endpoint_labels is not None:
                top = ax.secondary_xaxis("top")
                top.set_xticks([0.0, 1.0], list(endpoint_labels), fontweight="bold")
                top.tick_params(length=0)
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=7)
        masked = sum(int((~np.isfinite(getattr(p, m))).sum()) for _, p in named for m in metrics)
        fig.suptitle((title or "Linear interpolation") + bn_note([p for _, p in named]) + masked_note(masked))
    return fig


def _draw_path(ax, name: str, path: PathResult, metric: str, col: str, annotate: bool) -> None:
    values = finite(getattr(path, metric))
    loc = barrier_location(path, metric)
    label = name if loc is None else f"{name} (barrier {barrier_text(loc[1], metric)} at α={loc[0]:.2f})"
    ax.plot(path.alphas, values, color=col, marker="o", markersize=2.5, label=label)
    ends = endpoint_values(path, metric)
    if ends is None:
        return
    ax.plot([0.0, 1.0], ends, color=col, linestyle="--", linewidth=0.9, alpha=0.7)
    ax.scatter([0.0, 1.0], ends, s=45, color=col, edgecolors="black", zorder=5)
    if loc is None or not loc[1] > 0:  # a zero (or negative, Eq. 4 gain) barrier has no gap to mark
        return
    a_star, barrier = loc
    curve_value = float(np.interp(a_star, path.alphas, getattr(path, metric)))
    line_value = (1 - a_star) * ends[0] + a_star * ends[1]
    if np.isfinite(curve_value):
        ax.annotate("", xy=(a_star, curve_value), xytext=(a_star, line_value),
                    arrowprops={"arrowstyle": "<->", "color": col, "linewidth": 1.0})
    if annotate:
        left = a_star <= 0.5
        ax.annotate(f"{barrier_text(barrier, metric)} at α={a_star:.2f}",
                    (a_star, line_value if not np.isfinite(curve_value) else 0.5 * (curve_value + line_value)),
                    xytext=(5 if left else -5, 0), textcoords="offset points", color=col, fontsize=7,
                    va="center", ha="left" if left else "right")


def path_plotly(paths: PathsLike, *, metrics: Sequence[str] = METRICS,
                endpoint_labels: tuple[str, str] | None = ("A", "B"), title: str | None = None) -> go.Figure:
    """Plotly: the same panels; hover on any point shows alpha, loss and accuracy there."""
    _check_metrics(metrics)
    named = named_paths(paths)
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=list(metrics))
    for col_idx, metric in enumerate(metrics, start=1):
        for i, (name, path) in enumerate(named):
            col = color(i)
            text = [f"{name}<br>α={fmt(a)}<br>loss={fmt(lo, 6)}<br>accuracy={fmt(acc, 6)}"
                    for a, lo, acc in zip(path.alphas, path.loss, path.accuracy)]
            fig.add_trace(go.Scatter(x=path.alphas, y=finite(getattr(path, metric)), mode="lines+markers",
                                     name=name, legendgroup=name, showlegend=col_idx == 1,
                                     line={"color": col}, marker={"size": 5}, text=text,
                                     hovertemplate="%{text}<extra></extra>"), row=1, col=col_idx)
            ends = endpoint_values(path, metric)
            if ends is None:
                continue
            labelled = i == 0 and endpoint_labels is not None  # the endpoint names once per panel
            fig.add_trace(go.Scatter(x=[0.0, 1.0], y=list(ends),
                                     mode="lines+markers+text" if labelled else "lines+markers",
                                     line={"color": col, "dash": "dash", "width": 1},
                                     marker={"size": 10, "color": col, "line": {"color": "black", "width": 1}},
                                     text=list(endpoint_labels) if labelled else None, textposition="top center",
                                     name=f"{name} endpoints", legendgroup=name, showlegend=False,
                                     hovertemplate=f"{name} endpoint<br>α=%{{x}}<br>{metric}=%{{y:.6g}}"
                                                   "<extra></extra>"),
                          row=1, col=col_idx)
            loc = barrier_location(path, metric)
            if loc is not None and loc[1] > 0:
                a_star, barrier = loc
                curve_value = float(np.interp(a_star, path.alphas, getattr(path, metric)))
                line_value = (1 - a_star) * ends[0] + a_star * ends[1]
                fig.add_trace(go.Scatter(x=[a_star, a_star], y=finite([line_value, curve_value]), mode="lines",
                                         line={"color": col, "dash": "dot"}, legendgroup=name, showlegend=False,
                                         name=f"{name} barrier",
                                         hovertemplate=f"{name}: {metric} barrier {fmt(barrier, 6)} "
                                                       f"at α={fmt(a_star)}<extra></extra>"),
                              row=1, col=col_idx)
                fig.add_annotation(x=a_star, y=line_value,
                                   text=f"barrier {barrier_text(barrier, metric)} at α={a_star:.2f}",
                                   showarrow=True, arrowhead=2, ax=30, ay=-25, font={"color": col, "size": 11},
                                   row=1, col=col_idx)
        fig.update_xaxes(title_text="α", row=1, col=col_idx)
        fig.update_yaxes(title_text=metric, row=1, col=col_idx)
    masked = sum(int((~np.isfinite(getattr(p, m))).sum()) for _, p in named for m in metrics)
    return style_plotly(fig, (title or "Linear interpolation") + bn_note([p for _, p in named])
                        + masked_note(masked))
