"""Barriers of groups of models: group barrier against group size K, pairwise barrier matrices.

Group barrier (FedGuCci Definition 3.6, Eq. 9/10; Fig. 4): for each K, several draws of K
models give :class:`landscape.results.GroupResult` objects; the figure shows mean ± std over
draws per series (e.g. vanilla vs connectivity-loss training). Pairwise barriers come from
:class:`landscape.results.BarrierMatrix` (entry (i, j) is the barrier of the i-j path).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure

from landscape.infra.errors import ConfigError
from landscape.results import BarrierMatrix, GroupResult
from landscape.results.barriers import DEFAULT_THRESHOLD

from .registry import FIGURES, FigureKind
from .style import (
    MASKED_COLOR,
    MATRIX_CMAP,
    PLOTLY_MATRIX,
    color,
    finite,
    fmt,
    masked_cmap,
    masked_note,
    new_figure,
    style_context,
    style_plotly,
)

GroupSeries = Mapping[str, Mapping[int, Sequence[GroupResult | float]]]
BARRIER_METRICS = ("loss", "accuracy")


@dataclass(frozen=True)
class SizeSummary:
    """Per-K statistics of one series: K values, mean, sample std (0 for one draw), draws, masked."""

    sizes: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    draws: np.ndarray
    masked: int


def _check_metric(metric: str) -> None:
    if metric not in BARRIER_METRICS:
        raise ConfigError(f"metric {metric!r}: choose from {BARRIER_METRICS}")


def summarize_sizes(series: Mapping[int, Sequence[GroupResult | float]], metric: str = "accuracy") -> SizeSummary:
    """Mean and sample standard deviation of the group barrier over draws, for each K.

    Entries are GroupResult objects (their ``{metric}_barrier`` is used) or plain numbers;
    non-finite barriers are left out and counted in ``masked``.
    """
    _check_metric(metric)
    sizes, means, stds, draws, masked = [], [], [], [], 0
    for k in sorted(series):
        vals = np.array([getattr(r, f"{metric}_barrier") if isinstance(r, GroupResult) else float(r)
                         for r in series[k]], dtype=np.float64)
        ok = vals[np.isfinite(vals)]
        masked += int(vals.size - ok.size)
        sizes.append(k)
        means.append(ok.mean() if ok.size else np.nan)
        stds.append(ok.std(ddof=1) if ok.size > 1 else 0.0)
        draws.append(ok.size)
    return SizeSummary(np.array(sizes), np.array(means), np.array(stds), np.array(draws), masked)


def _ylabel(metric: str) -> str:
    return "accuracy barrier (Eq. 10, relative)" if metric == "accuracy" else "loss barrier (Eq. 9)"


def group_size_figure(groups: GroupSeries, *, metric: str = "accuracy", title: str | None = None,
                      width: float = 4.6, height: float = 3.2) -> Figure:
    """Matplotlib: group barrier against K, one line per series with a ± std band."""
    stats = {name: summarize_sizes(s, metric) for name, s in groups.items()}
    with style_context():
        fig = new_figure(width, height)
        ax = fig.add_subplot()
        for i, (name, st) in enumerate(stats.items()):
            ax.plot(st.sizes, st.mean, marker="o", color=color(i), label=name)
            ax.fill_between(st.sizes, st.mean - st.std, st.mean + st.std, color=color(i), alpha=0.2, linewidth=0)
        ax.set_xticks(sorted({int(k) for st in stats.values() for k in st.sizes}))
        ax.set_xlabel("group size K")
        ax.set_ylabel(_ylabel(metric))
        ax.legend()
        fig.suptitle((title or "Group barrier vs K (mean ± std over draws)")
                     + masked_note(sum(st.masked for st in stats.values()), "barriers"))
    return fig


def group_size_plotly(groups: GroupSeries, *, metric: str = "accuracy", title: str | None = None) -> go.Figure:
    """Plotly: the same with error bars; hover gives K, mean, std and the number of draws."""
    stats = {name: summarize_sizes(s, metric) for name, s in groups.items()}
    fig = go.Figure()
    for i, (name, st) in enumerate(stats.items()):
        text = [f"{name}<br>K={k}<br>mean={fmt(m, 6)}<br>std={fmt(s, 4)}<br>draws={n}"
                for k, m, s, n in zip(st.sizes, st.mean, st.std, st.draws)]
        fig.add_trace(go.Scatter(x=st.sizes, y=st.mean, error_y={"type": "data", "array": st.std, "visible": True},
                                 mode="lines+markers", name=name, line={"color": color(i)}, text=text,
                                 hovertemplate="%{text}<extra></extra>"))
    masked = sum(st.masked for st in stats.values())
    return style_plotly(fig, (title or "Group barrier vs K (mean ± std over draws)") + masked_note(masked, "barriers"),
                        xaxis_title="group size K", yaxis_title=_ylabel(metric))


def _matrix(matrix: BarrierMatrix, metric: str) -> tuple[np.ndarray, list[str]]:
    _check_metric(metric)
    values = finite(matrix.loss_barrier if metric == "loss" else matrix.accuracy_barrier)
    n = values.shape[0]
    labels = [str(label) for label in matrix.labels] if len(matrix.labels) == n else [f"model {i}" for i in range(n)]
    return values, labels


def barrier_scale(values: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> tuple[float, float]:
    """Fixed colour range ``(vmin, vmax)`` of a barrier heatmap: 0 up to the threshold or beyond.

    Parameters
    ----------
    values
        Barriers (FedGuCci Eq. 3 / Eq. 4); NaN entries are ignored.
    threshold
        The barrier that counts as a wall (the claims' default threshold): barriers far below it
        stay dark instead of being stretched over the whole colour map.

    Returns
    -------
    tuple of float
        ``vmin = min(0, smallest value)`` (negative barriers are gains), ``vmax = max(threshold,
        largest value)``.
    """
    finite_values = values[np.isfinite(values)]
    lo = min(0.0, float(finite_values.min())) if finite_values.size else 0.0
    hi = max(threshold, float(finite_values.max())) if finite_values.size else threshold
    return lo, hi


def barrier_matrix_figure(matrix: BarrierMatrix, *, metric: str = "loss", annotate: bool | None = None,
                          threshold: float = DEFAULT_THRESHOLD, title: str | None = None,
                          size: float = 4.4) -> Figure:
    """Matplotlib heatmap of pairwise barriers; cells hold the values (when n <= 12 by default).

    The colour scale is fixed by :func:`barrier_scale` (0 to ``max(threshold, largest
    barrier)``), so a negligible barrier is never drawn as a bright cell. Non-finite entries
    (overflowed paths; a diagonal left as NaN) are drawn in grey.

    Parameters
    ----------
    matrix
        Pairwise barriers from :func:`landscape.barrier_matrix`.
    metric
        ``"loss"`` (Eq. 3) or ``"accuracy"`` (Eq. 4).
    annotate
        Write the values in the cells (default: when there are at most 12 models).
    threshold
        Upper end of the colour scale unless a barrier exceeds it.
    title, size
        Figure title and height in inches.

    Returns
    -------
    matplotlib.figure.Figure
    """
    values, labels = _matrix(matrix, metric)
    raw = np.asarray(matrix.loss_barrier if metric == "loss" else matrix.accuracy_barrier, dtype=np.float64)
    n = len(labels)
    vmin, vmax = barrier_scale(values, threshold)
    with style_context({"axes.grid": False}):
        fig = new_figure(size + 0.8, size)
        ax = fig.add_subplot()
        im = ax.imshow(np.ma.masked_invalid(values), cmap=masked_cmap(MATRIX_CMAP), origin="upper",
                       vmin=vmin, vmax=vmax)
        fig.colorbar(im, ax=ax, label=f"{metric} barrier", shrink=0.85)
        ax.set_xticks(range(n), labels, rotation=45, ha="right")
        ax.set_yticks(range(n), labels)
        if annotate if annotate is not None else n <= 12:
            for i in range(n):
                for j in range(n):
                    dark = np.isfinite(values[i, j]) and im.norm(values[i, j]) < 0.5
                    ax.text(j, i, fmt(raw[i, j], 2), ha="center", va="center", fontsize=7,
                            color="white" if dark else "black")
        masked = int(np.isnan(values).sum())
        fig.suptitle((title or f"Pairwise {metric} barriers") + masked_note(masked, "entries"))
    return fig


def matrix_size(n: int, cell: int = 56) -> dict[str, object]:
    """Plotly ``width``, ``height`` and ``margin`` of an n x n heatmap: square cells, no empty bands.

    Parameters
    ----------
    n
        Models (rows and columns).
    cell
        Side of one cell in pixels (the matrix side stays within 200-720 pixels).

    Returns
    -------
    dict
        Layout entries: the square plotting area plus room for the title, the tick labels and
        the colour bar.
    """
    side = int(np.clip(n * cell, 200, 720))
    margin = {"l": 90, "r": 140, "t": 60, "b": 100}
    return {"width": side + margin["l"] + margin["r"], "height": side + margin["t"] + margin["b"],
            "margin": margin, "autosize": False}


def barrier_matrix_plotly(matrix: BarrierMatrix, *, metric: str = "loss", threshold: float = DEFAULT_THRESHOLD,
                          annotate: bool | None = None, title: str | None = None) -> go.Figure:
    """Plotly heatmap on the fixed :func:`barrier_scale`, sized to the matrix by :func:`matrix_size`.

    Cells hold the values (when n <= 12 by default: accuracy barriers in percent, Eq. 4); hover
    gives the pair and both its barriers.
    """
    values, labels = _matrix(matrix, metric)
    n = len(labels)
    loss, acc = np.asarray(matrix.loss_barrier, float), np.asarray(matrix.accuracy_barrier, float)
    text = [[f"{labels[i]} – {labels[j]}<br>loss barrier={fmt(loss[i, j], 6)}<br>accuracy barrier={fmt(acc[i, j], 6)}"
             for j in range(n)] for i in range(n)]
    vmin, vmax = barrier_scale(values, threshold)
    cells = {"texttemplate": "%{z:.2%}" if metric == "accuracy" else "%{z:.2g}", "textfont": {"size": 11}} \
        if (annotate if annotate is not None else n <= 12) else {}
    fig = go.Figure(go.Heatmap(z=values, x=labels, y=labels, colorscale=PLOTLY_MATRIX, text=text, zmin=vmin, zmax=vmax,
                               hovertemplate="%{text}<extra></extra>", **cells,
                               colorbar={"title": {"text": f"{metric} barrier", "side": "right"},
                                         "tickformat": ".1%" if metric == "accuracy" else None}))
    masked = int(np.isnan(values).sum())
    return style_plotly(fig, (title or f"Pairwise {metric} barriers") + masked_note(masked, "entries"),
                        xaxis={"constrain": "domain", "automargin": True, "tickangle": -45},
                        yaxis={"autorange": "reversed", "scaleanchor": "x", "constrain": "domain", "automargin": True},
                        plot_bgcolor=MASKED_COLOR, **matrix_size(n))


FIGURES.add("barrier_matrix", FigureKind((BarrierMatrix,), barrier_matrix_figure, barrier_matrix_plotly))
