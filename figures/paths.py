"""1-D interpolation paths: loss and accuracy against alpha, endpoints and barriers marked.

Drawn from :class:`landscape.results.PathResult` (model at alpha is (1 - alpha) a + alpha b).
The barrier annotated is FedGuCci Eq. 3 (loss) / Eq. 4 (accuracy): the largest gap between
the curve and the straight line joining the endpoint values, at the alpha attaining it.
Several paths share the axes (e.g. vanilla vs connectivity-loss training).
"""
from __future__ import annotations

import itertools
from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure
from plotly.subplots import make_subplots

from landscape.infra.errors import ConfigError
from landscape.results import PathResult

from .registry import FIGURES, FigureKind
from .style import bn_note, color, finite, fmt, masked_note, new_figure, style_context, style_plotly

PathsLike = PathResult | Mapping[str, PathResult] | Sequence[PathResult]
METRICS = ("loss", "accuracy")
LEGEND_ROW = 0.17  # inches of figure height per legend entry
LABEL_ROW = 0.12  # height of one barrier label's row above a plotly panel's data, a fraction of the data's span
LABEL_CHAR = 0.02  # estimated width of one character of a plotly barrier label, a fraction of the panel's x range
LABEL_ORDERS_UP_TO = 5  # label_rows tries every order of the rows up to this many labels (120 orders)


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


def label_band(values: Sequence[np.ndarray], count: int) -> tuple[list[float], list[float]]:
    """A y range with a band above the data holding ``count`` labels, and the labels' heights.

    Parameters
    ----------
    values
        Everything drawn on the panel (non-finite entries ignored).
    count
        Labels to place; each gets its own row of the band, :data:`LABEL_ROW` of the data's
        span high, so no two labels overlap whatever their alphas.

    Returns
    -------
    tuple of list of float
        ``[bottom, top]`` of the axis and the height of each label, the lowest first.
    """
    drawn = np.concatenate([np.ravel(finite(v)) for v in values])
    drawn = drawn[np.isfinite(drawn)]
    lo, hi = (float(drawn.min()), float(drawn.max())) if drawn.size else (0.0, 1.0)
    span = hi - lo or max(abs(hi), 1.0)
    pad = 0.05 * span
    rows = [hi + pad + (i + 0.5) * LABEL_ROW * span for i in range(count)]
    return [lo - pad, hi + 2 * pad + count * LABEL_ROW * span], rows


def _stack(labels: Sequence[tuple[float, str]], order: Sequence[int], x_range: tuple[float, float]
           ) -> tuple[int, list[tuple[int, str]]]:
    """Rows from the top in ``order``, each text on the first side its alpha allows; and how many found none."""
    mid, span = 0.5 * (x_range[0] + x_range[1]), x_range[1] - x_range[0]
    arrows: list[float] = []
    out: list[tuple[int, str]] = [(0, "left")] * len(labels)
    crossed = 0
    for rank, i in enumerate(order):
        a, text = labels[i]
        width = LABEL_CHAR * len(text) * span
        sides = ("left", "right") if a <= mid else ("right", "left")
        free = [side for side in sides
                if x_range[0] <= (a if side == "left" else a - width)
                and (a + width if side == "left" else a) <= x_range[1]
                and not any((a < x < a + width) if side == "left" else (a - width < x < a) for x in arrows)]
        crossed += not free
        out[i] = (len(labels) - 1 - rank, (free or sides)[0])
        arrows.append(a)
    return crossed, out


def label_rows(labels: Sequence[tuple[float, str]], x_range: tuple[float, float]) -> list[tuple[int, str]]:
    """Row (0 lowest) and ``xanchor`` of each barrier label, so that no arrow from a higher row crosses a text.

    An arrow runs from its label straight down to its alpha, through every row below. Each
    text runs from its alpha towards the middle of the panel, or the other way when an arrow
    from above would cross it there or it would leave ``x_range``; the rows are ordered so
    that as few texts as possible are crossed (every order is tried for up to
    :data:`LABEL_ORDERS_UP_TO` labels; beyond, the alphas farthest from the middle go highest).
    Text widths are estimated (:data:`LABEL_CHAR` of the x range per character).

    Parameters
    ----------
    labels
        ``(alpha*, text)`` per label.
    x_range
        The panel's alpha range.

    Returns
    -------
    list of (int, str)
        ``(row, "left" | "right")`` per label, in the order of ``labels``.
    """
    mid = 0.5 * (x_range[0] + x_range[1])
    edges_first = sorted(range(len(labels)), key=lambda i: -abs(labels[i][0] - mid))
    orders = itertools.permutations(edges_first) if len(labels) <= LABEL_ORDERS_UP_TO else [edges_first]
    best = None
    for order in orders:
        crossed, layout = _stack(labels, order, x_range)
        if best is None or crossed < best[0]:
            best = (crossed, layout)
        if not crossed:
            break
    return best[1] if best else []


def _barrier_labels(fig: go.Figure, labels: list[tuple[float, float, str, str]], values: list[np.ndarray],
                    alphas: np.ndarray, panel: int) -> None:
    """Write each ``(alpha*, y, text, colour)`` label in a row above the data, its arrow down to (alpha*, y)."""
    if not labels:
        return
    y_range, heights = label_band(values, len(labels))
    layout = label_rows([(a, text) for a, _, text, _ in labels], (float(np.min(alphas)), float(np.max(alphas))))
    suffix = str(panel) if panel > 1 else ""
    for (a_star, y, text, col), (row, anchor) in zip(labels, layout):
        fig.add_annotation(x=a_star, y=y, ax=a_star, ay=heights[row], axref=f"x{suffix}", ayref=f"y{suffix}",
                           text=text, showarrow=True, arrowhead=2, arrowcolor=col, xanchor=anchor,
                           font={"color": col, "size": 11}, row=1, col=panel)
    fig.update_yaxes(range=y_range, row=1, col=panel)


def path_plotly(paths: PathsLike, *, metrics: Sequence[str] = METRICS,
                endpoint_labels: tuple[str, str] | None = ("A", "B"), title: str | None = None) -> go.Figure:
    """Plotly: the same panels; hover on any point shows alpha, loss and accuracy there.

    Each positive barrier is labelled in its own row of a band above the panel's data
    (:func:`label_band`), with an arrow down to the top of its gap, so the labels of several
    paths never overlap one another or the curves; :func:`label_rows` keeps the arrows off the
    labels below them. The endpoint names stand on the top edge of each panel at alpha = 0 and 1.
    """
    _check_metrics(metrics)
    named = named_paths(paths)
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=list(metrics))
    for col_idx, metric in enumerate(metrics, start=1):
        labels: list[tuple[float, float, str, str]] = []
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
            fig.add_trace(go.Scatter(x=[0.0, 1.0], y=list(ends), mode="lines+markers",
                                     line={"color": col, "dash": "dash", "width": 1},
                                     marker={"size": 10, "color": col, "line": {"color": "black", "width": 1}},
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
                top = line_value if not np.isfinite(curve_value) else max(line_value, curve_value)
                labels.append((a_star, top, f"barrier {barrier_text(barrier, metric)} at α={a_star:.2f}", col))
        _barrier_labels(fig, labels, [getattr(p, metric) for _, p in named],
                        np.concatenate([p.alphas for _, p in named]), col_idx)
        for alpha, label in zip((0.0, 1.0), endpoint_labels or ()):  # on the panel's top edge, off the markers
            fig.add_annotation(x=alpha, y=1.0, yref=f"y{col_idx if col_idx > 1 else ''} domain", yanchor="bottom",
                               text=f"<b>{label}</b>", showarrow=False, row=1, col=col_idx)
        fig.update_xaxes(title_text="α", row=1, col=col_idx)
        fig.update_yaxes(title_text=metric, row=1, col=col_idx)
    masked = sum(int((~np.isfinite(getattr(p, m))).sum()) for _, p in named for m in metrics)
    return style_plotly(fig, (title or "Linear interpolation") + bn_note([p for _, p in named])
                        + masked_note(masked))


FIGURES.add("path", FigureKind((PathResult,), path_figure, path_plotly))
