"""Landscape measures over training rounds (``fl.Run.track()``), seeds drawn as bands.

Drawn from :class:`landscape.results.tracking.TrackTable`: one panel per measure recorded (mean
client-to-global barrier, group barrier, top Hessian eigenvalue, Hessian trace, sharpness, update
distance and cosine), one colour per label (an algorithm), a line at the mean over the label's
seeds and a band from their minimum to their maximum at each tracked round. A panel is left out
when no table holds a value of it.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from plotly.subplots import make_subplots

from landscape.infra.errors import ConfigError
from landscape.results.tracking import TrackTable

from .registry import FIGURES, FigureKind
from .style import color, fmt, new_figure, style_context, style_plotly

Tables = TrackTable | Sequence[TrackTable] | Mapping[str, TrackTable | Sequence[TrackTable]]
#: column -> panel title, in panel order.
PANELS = {"mean_client_barrier": "client-global loss barrier (mean)", "group_barrier": "group loss barrier",
          "top_eigenvalue": "top Hessian eigenvalue", "trace": "Hessian trace", "sharpness": "L2 sharpness",
          "update_distance": "update distance to mean", "update_cosine": "update cosine (mean pair)"}


def labelled(tables: Tables) -> dict[str, list[TrackTable]]:
    """``{label: [tables of its seeds]}`` from one table, a list of seeds, or a mapping.

    Parameters
    ----------
    tables
        A :class:`TrackTable`; a sequence of them (seeds of one run); or label -> table or
        sequence of tables.

    Returns
    -------
    dict[str, list[TrackTable]]
        Unnamed tables are labelled by their algorithm.

    Raises
    ------
    ConfigError
        When an item is not a :class:`TrackTable`, or there is none.
    """
    if isinstance(tables, TrackTable):
        tables = [tables]
    if not isinstance(tables, Mapping):
        tables = {str(tables[0].spec.get("algorithm", "run")) if tables else "run": list(tables)}
    out = {str(k): [v] if isinstance(v, TrackTable) else list(v) for k, v in tables.items()}
    bad = [k for k, v in out.items() if not v or not all(isinstance(t, TrackTable) for t in v)]
    if bad or not out:
        raise ConfigError(f"tracking figures draw TrackTable objects (fl.Run.track()); got {bad or 'nothing'} "
                          "without one")
    return out


def seed_band(tables: Sequence[TrackTable], column: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(rounds, mean, low, high)`` of ``column`` over the seeds: the union of their rounds, NaN-aware.

    Parameters
    ----------
    tables
        The seeds' tables.
    column
        A column of :attr:`TrackTable.columns`.

    Returns
    -------
    tuple of np.ndarray
        The rounds and, per round, the mean, minimum and maximum over the seeds that hold a value.
    """
    rounds = np.unique(np.concatenate([t["round"] for t in tables]))
    values = np.full((len(tables), rounds.size), np.nan)
    for i, t in enumerate(tables):
        values[i, np.searchsorted(rounds, t["round"])] = t[column]
    held = np.isfinite(values).any(axis=0)
    mean, low, high = (np.full(rounds.size, np.nan) for _ in range(3))
    mean[held], low[held], high[held] = (f(values[:, held], axis=0) for f in (np.nanmean, np.nanmin, np.nanmax))
    return rounds, mean, low, high


def _layout(tables: Tables, columns: int) -> tuple[dict[str, list[TrackTable]], list[str], int, int]:
    """The labelled runs, the measures any of them holds (one panel each), and the grid's rows and columns."""
    runs = labelled(tables)
    panels = [c for c in PANELS if any(np.isfinite(t[c]).any() for ts in runs.values() for t in ts)]
    cols = max(1, min(columns, len(panels)))
    return runs, panels, max(1, -(-len(panels) // cols)), cols


def tracking_figure(tables: Tables, *, title: str | None = None, columns: int = 4, width: float = 9.0,
                    panel_height: float = 2.2) -> Figure:
    """Matplotlib: one panel per tracked measure against the round, seeds as min-max bands.

    Parameters
    ----------
    tables
        See :func:`labelled`.
    title
        Figure title (default: "Landscape during training").
    columns
        Panels per row.
    width, panel_height
        Figure width and the height of a row of panels, in inches.

    Returns
    -------
    matplotlib.figure.Figure
        The figure.
    """
    runs, panels, rows, cols = _layout(tables, columns)
    every_round = np.concatenate([t["round"] for ts in runs.values() for t in ts])
    with style_context():
        fig = new_figure(width, panel_height * rows + 0.6)
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True).reshape(-1)
        for ax, column in zip(axes, panels):
            for i, (label, seeds) in enumerate(runs.items()):
                rounds, mean, low, high = seed_band(seeds, column)
                ax.plot(rounds, mean, color=color(i), marker="o", markersize=2.5,
                        label=f"{label} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
                if len(seeds) > 1:
                    ax.fill_between(rounds, low, high, color=color(i), alpha=0.25, linewidth=0)
            ax.set_title(PANELS[column], fontsize=8)
            ax.set_xlabel("round")
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
            ax.xaxis.set_tick_params(labelbottom=True)
            if every_round.size:
                ax.set_xlim(every_round.min(), every_round.max())
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        if panels:
            axes[0].legend(fontsize=7)
        fig.suptitle(title or "Landscape during training")
    return fig


def tracking_plotly(tables: Tables, *, title: str | None = None, columns: int = 4) -> go.Figure:
    """Plotly: the same panels; hover shows label, round, mean and the seeds' range.

    Parameters
    ----------
    tables
        See :func:`labelled`.
    title
        Figure title.
    columns
        Panels per row.

    Returns
    -------
    plotly.graph_objects.Figure
        The figure.
    """
    runs, panels, rows, cols = _layout(tables, columns)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[PANELS[c] for c in panels])
    for p, column in enumerate(panels):
        row, col = p // cols + 1, p % cols + 1
        for i, (label, seeds) in enumerate(runs.items()):
            rounds, mean, low, high = seed_band(seeds, column)
            if len(seeds) > 1:
                fig.add_trace(go.Scatter(x=np.concatenate([rounds, rounds[::-1]]),
                                         y=np.concatenate([high, low[::-1]]), fill="toself", fillcolor=color(i),
                                         opacity=0.25, line={"width": 0}, hoverinfo="skip", showlegend=False,
                                         legendgroup=label), row=row, col=col)
            text = [f"{label}<br>round={r}<br>{column}={fmt(m, 5)}<br>seeds: {fmt(lo, 4)}..{fmt(hi, 4)}"
                    for r, m, lo, hi in zip(rounds, mean, low, high)]
            fig.add_trace(go.Scatter(x=rounds, y=mean, mode="lines+markers", name=label, legendgroup=label,
                                     showlegend=p == 0, line={"color": color(i)}, marker={"size": 4}, text=text,
                                     hovertemplate="%{text}<extra></extra>"), row=row, col=col)
        fig.update_xaxes(title_text="round", row=row, col=col)
    return style_plotly(fig, title or "Landscape during training")


FIGURES.add("track", FigureKind((TrackTable,), tracking_figure, tracking_plotly))
