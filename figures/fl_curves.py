"""Federated-training curves: test loss and accuracy per round, one line per algorithm.

Input: algorithm name -> per-round metric dicts (``{"round", "test_loss", "test_accuracy",
optionally "local_accuracy"}``, as ``fl.Run.metrics``) or an object with a ``metrics``
attribute of that form (an ``fl.Run``). Local (personalised) accuracy, when present, is
drawn dashed in the accuracy panel.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure
from plotly.subplots import make_subplots

from landscape.infra.errors import ConfigError

from .style import color, fmt, new_figure, style_context, style_plotly

Runs = Mapping[str, Sequence[Mapping[str, Any]] | Any]
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (("test loss", ("test_loss",)),
                                                     ("accuracy", ("test_accuracy", "local_accuracy")))
_DASHED = {"local_accuracy"}  # drawn dashed next to the solid test curves


def metric_series(records: Sequence[Mapping[str, Any]] | Any, key: str) -> tuple[np.ndarray, np.ndarray]:
    """``(rounds, values)`` of one metric over the records that have it (non-finite -> NaN)."""
    records = getattr(records, "metrics", records)
    rounds, values = [], []
    for i, rec in enumerate(records):
        if "round" not in rec:
            raise ConfigError(f"metric record {i} has no 'round' key: {sorted(rec)}")
        if key in rec and rec[key] is not None:
            rounds.append(rec["round"])
            values.append(float(rec[key]))
    vals = np.array(values, dtype=np.float64)
    vals[~np.isfinite(vals)] = np.nan
    return np.array(rounds), vals


def _series(runs: Runs):
    for i, (name, records) in enumerate(runs.items()):
        for title_idx, (_, keys) in enumerate(PANELS):
            for key in keys:
                rounds, values = metric_series(records, key)
                if rounds.size:
                    label = name if key != "local_accuracy" else f"{name} (local)"
                    yield i, name, title_idx, key, label, rounds, values


def fl_curves_figure(runs: Runs, *, title: str | None = None, width: float = 7.0, height: float = 3.0) -> Figure:
    """Matplotlib: test loss (left) and test / local accuracy (right) against the round."""
    if not runs:
        raise ConfigError("no runs to plot: pass a mapping algorithm name -> metrics")
    with style_context():
        fig = new_figure(width, height)
        axes = fig.subplots(1, len(PANELS), squeeze=False)[0]
        for i, _name, panel, key, label, rounds, values in _series(runs):
            axes[panel].plot(rounds, values, color=color(i), linestyle="--" if key in _DASHED else "-", label=label)
        for ax, (ylabel, _) in zip(axes, PANELS):
            ax.set_xlabel("round")
            ax.set_ylabel(ylabel)
            if ax.lines:
                ax.legend()
        fig.suptitle(title or "Federated training")
    return fig


def fl_curves_plotly(runs: Runs, *, title: str | None = None) -> go.Figure:
    """Plotly: the same panels; hover shows algorithm, round and value."""
    if not runs:
        raise ConfigError("no runs to plot: pass a mapping algorithm name -> metrics")
    fig = make_subplots(rows=1, cols=len(PANELS), subplot_titles=[p[0] for p in PANELS])
    listed: set[str] = set()  # each curve label once in the legend, though drawn in several panels
    for i, name, panel, key, label, rounds, values in _series(runs):
        text = [f"{label}<br>round={r}<br>{key}={fmt(v, 6)}" for r, v in zip(rounds, values)]
        fig.add_trace(go.Scatter(x=rounds, y=values, mode="lines+markers", name=label, legendgroup=name,
                                 showlegend=label not in listed,
                                 line={"color": color(i), "dash": "dash" if key in _DASHED else "solid"},
                                 marker={"size": 4}, text=text,
                                 hovertemplate="%{text}<extra></extra>"), row=1, col=panel + 1)
        listed.add(label)
    for c, (ylabel, _) in enumerate(PANELS, start=1):
        fig.update_xaxes(title_text="round", row=1, col=c)
        fig.update_yaxes(title_text=ylabel, row=1, col=c)
    return style_plotly(fig, title or "Federated training")
