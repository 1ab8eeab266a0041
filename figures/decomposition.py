"""IMA loss decomposition (Theorem 1, docs/methods/ima.md) against rounds.

Input: ``[(round, decomposition), ...]`` where each decomposition has the attributes of
:class:`landscape.curvature_results.Decomposition` (bias, train_bias, heter_bias, cross,
variance, covariance, wens_loss, fma_loss, gap, locality). Three panels, as in IMA Figs.
2-3: the global model's losses (FMA, weighted ensemble, their gap), the bias / variance /
covariance terms (bias = train_bias + heter_bias + cross), and locality
||w_k - w_FMA|| (max and mean over clients). Also IMA Fig. 4: error of the average of m
random client models against m. One round's terms per model (e.g. per algorithm) as bars:
:func:`decomposition_bars_figure`.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure
from plotly.subplots import make_subplots

from landscape.infra.errors import ConfigError
from landscape.results import AveragingCurve, Decomposition

from .registry import FIGURES, FigureKind
from .style import color, fmt, new_figure, style_context, style_plotly

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loss of the global model", ("fma_loss", "wens_loss", "gap")),
    ("decomposition terms", ("bias", "train_bias", "heter_bias", "cross", "variance", "covariance")),
    ("locality ‖w_k − w_FMA‖", ("locality_max", "locality_mean")),
)
LABELS = {"fma_loss": "FMA loss", "wens_loss": "WENS loss", "gap": "gap (FMA − WENS)", "bias": "bias",
          "train_bias": "train bias", "heter_bias": "heterogeneity bias", "cross": "cross",
          "variance": "variance", "covariance": "covariance", "locality_max": "max over clients",
          "locality_mean": "mean over clients"}


def decomposition_table(terms: Sequence[tuple[int, Any]]) -> dict[str, np.ndarray]:
    """Per-round arrays of every plotted term, sorted by round (``"round"`` included)."""
    if not terms:
        raise ConfigError("no decompositions to plot: pass [(round, decomposition), ...]")
    rows = sorted(terms, key=lambda t: t[0])
    table: dict[str, list[float]] = {"round": [r for r, _ in rows]}
    for _, d in rows:
        for key in LABELS:
            if key.startswith("locality_"):
                loc = np.asarray(d.locality, dtype=np.float64)
                value = loc.max() if key == "locality_max" else loc.mean()
            else:
                value = getattr(d, key)
            table.setdefault(key, []).append(float(value))
    return {k: np.array(v, dtype=np.float64) for k, v in table.items()}


def decomposition_figure(terms: Sequence[tuple[int, Any]], *, title: str | None = None, width: float = 10.0,
                         height: float = 3.0) -> Figure:
    """Matplotlib: the three panels against the round."""
    table = decomposition_table(terms)
    with style_context():
        fig = new_figure(width, height)
        axes = fig.subplots(1, len(PANELS), squeeze=False)[0]
        for ax, (panel_title, keys) in zip(axes, PANELS):
            for i, key in enumerate(keys):
                ax.plot(table["round"], table[key], marker="o", markersize=2.5, color=color(i), label=LABELS[key])
            ax.set_title(panel_title)
            ax.set_xlabel("round")
            ax.legend(fontsize=7)
        fig.suptitle(title or "Loss decomposition of the global model (IMA Theorem 1)")
    return fig


def decomposition_plotly(terms: Sequence[tuple[int, Any]], *, title: str | None = None) -> go.Figure:
    """Plotly: the same panels; hover at a round lists every term there."""
    table = decomposition_table(terms)
    text = ["<br>".join([f"round={int(r)}"] + [f"{LABELS[k]}={fmt(table[k][i], 6)}" for k in LABELS])
            for i, r in enumerate(table["round"])]
    fig = make_subplots(rows=1, cols=len(PANELS), subplot_titles=[p[0] for p in PANELS])
    for c, (_, keys) in enumerate(PANELS, start=1):
        for i, key in enumerate(keys):
            fig.add_trace(go.Scatter(x=table["round"], y=table[key], mode="lines+markers", name=LABELS[key],
                                     line={"color": color(i)}, marker={"size": 4}, text=text,
                                     hovertemplate=f"<b>{LABELS[key]}</b><br>%{{text}}<extra></extra>"),
                          row=1, col=c)
        fig.update_xaxes(title_text="round", row=1, col=c)
    return style_plotly(fig, title or "Loss decomposition of the global model (IMA Theorem 1)")


def _by_model(decompositions: Any) -> tuple[list[str], dict[str, np.ndarray]]:
    """Model names and, per plotted term, its value for each model (the order of the names)."""
    named = list(decompositions.items()) if isinstance(decompositions, Mapping) else [("", decompositions)]
    if not named:
        raise ConfigError("no decompositions to plot: pass a Decomposition or a mapping name -> Decomposition")
    table = decomposition_table([(i, d) for i, (_, d) in enumerate(named)])
    return [str(name) for name, _ in named], table


def _bar_ranges(table: dict[str, np.ndarray]) -> list[list[float]]:
    """Per panel of :data:`PANELS`, an axis range from 0 to the values with room for the value labels.

    The panels of losses share one range (same units, zero at the same place); locality has its own.
    """
    def span(keys: Sequence[str]) -> list[float]:
        values = np.array([table[k] for k in keys])
        lo, hi = min(0.0, float(np.nanmin(values))), max(0.0, float(np.nanmax(values)))
        room = 0.3 * ((hi - lo) or 1.0)
        return [lo - room if lo < 0 else 0.0, hi + room if hi > 0 else 0.0]

    losses = span([k for _, keys in PANELS if not keys[0].startswith("locality") for k in keys])
    return [span(keys) if keys[0].startswith("locality") else losses for _, keys in PANELS]


def decomposition_bars_figure(decompositions: Any, *, title: str | None = None, width: float = 6.4,
                              height: float | None = None) -> Figure:
    """Matplotlib: the terms of one round's decomposition as bars, one colour per model.

    The panels of :func:`decomposition_figure` (the losses, the IMA Theorem 1 terms, locality),
    each term a row of horizontal bars with its value written beside it, so that terms far
    smaller than the loss (variance, covariance) are still read.

    Parameters
    ----------
    decompositions
        A :class:`~landscape.results.decomposition.Decomposition` or a mapping name -> one
        (e.g. per algorithm).
    title
        Figure title (default names Theorem 1).
    width, height
        Inches (the default height grows with the number of models).

    Returns
    -------
    matplotlib.figure.Figure
    """
    names, table = _by_model(decompositions)
    rows = [len(keys) for _, keys in PANELS]
    with style_context({"axes.grid": False}):
        fig = new_figure(width, height or 1.2 + 0.22 * len(names) * sum(rows))
        axes = fig.subplots(len(PANELS), 1, height_ratios=rows)
        bar = 0.8 / len(names)
        for ax, (panel_title, keys), x_range in zip(axes, PANELS, _bar_ranges(table)):
            y = np.arange(len(keys))
            for i, name in enumerate(names):
                values = np.array([table[k][i] for k in keys])
                bars = ax.barh(y - 0.4 + (i + 0.5) * bar, values, height=bar, color=color(i), label=name or None)
                ax.bar_label(bars, [fmt(v, 3) for v in values], padding=2, fontsize=7)
            ax.set_yticks(y, [LABELS[k] for k in keys])
            ax.invert_yaxis()
            ax.axvline(0.0, color="0.4", linewidth=0.6)
            ax.set_xlim(x_range)
            ax.set_title(panel_title, loc="left")
        if any(names):
            fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=min(len(names), 4))
        fig.suptitle(title or "Loss decomposition (IMA Theorem 1)")
    return fig


def decomposition_bars_plotly(decompositions: Any, *, title: str | None = None) -> go.Figure:
    """Plotly: the same bars; hover gives the model, the term and its value."""
    names, table = _by_model(decompositions)
    rows = [len(keys) for _, keys in PANELS]
    fig = make_subplots(rows=len(PANELS), cols=1, subplot_titles=[p[0] for p in PANELS], row_heights=rows,
                        vertical_spacing=0.3 / len(PANELS))
    for r, ((_, keys), x_range) in enumerate(zip(PANELS, _bar_ranges(table)), start=1):
        for i, name in enumerate(names):
            values = [table[k][i] for k in keys]
            fig.add_trace(go.Bar(x=values, y=[LABELS[k] for k in keys], orientation="h", name=name or "value",
                                 legendgroup=name, showlegend=r == 1, marker={"color": color(i)},
                                 text=[fmt(v, 3) for v in values], textposition="outside", cliponaxis=False,
                                 hovertemplate=f"{name + ': ' if name else ''}%{{y}} = %{{x:.6g}}<extra></extra>"),
                          row=r, col=1)
        fig.update_xaxes(range=x_range, zeroline=True, row=r, col=1)
        fig.update_yaxes(autorange="reversed", row=r, col=1)
    return style_plotly(fig, title or "Loss decomposition (IMA Theorem 1)", barmode="group",
                        height=160 + 16 * (len(names) + 1) * sum(rows), legend={"orientation": "h", "y": -0.08})


def _averaging(curves: Any, metric: str) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    if metric not in ("error", "loss"):
        raise ConfigError(f"metric {metric!r}: choose 'error' or 'loss'")
    named = list(curves.items()) if isinstance(curves, Mapping) else [("", curves)]
    return [(name, np.asarray(c.sizes), np.asarray(getattr(c, f"{metric}_mean")),
             np.asarray(getattr(c, f"{metric}_std"))) for name, c in named]


def averaging_figure(curves: Any, *, metric: str = "error", title: str | None = None, width: float = 4.6,
                     height: float = 3.2) -> Figure:
    """Matplotlib: test error (or loss) of the weight average of m random client models against m.

    IMA Fig. 4: mean ± std over the random subsets; a mapping draws one line per entry (e.g. per
    round). Input: ``AveragingCurve``-like objects (``sizes``, ``{metric}_mean``,
    ``{metric}_std``).
    """
    rows = _averaging(curves, metric)
    with style_context():
        fig = new_figure(width, height)
        ax = fig.add_subplot()
        for i, (name, sizes, mean, std) in enumerate(rows):
            ax.plot(sizes, mean, marker="o", color=color(i), label=name or None)
            ax.fill_between(sizes, mean - std, mean + std, color=color(i), alpha=0.2, linewidth=0)
        ax.set_xlabel("number of averaged client models m")
        ax.set_ylabel(f"test {metric} of the average")
        if any(name for name, *_ in rows):
            ax.legend()
        fig.suptitle(title or f"Test {metric} vs number of averaged models")
    return fig


def averaging_plotly(curves: Any, *, metric: str = "error", title: str | None = None) -> go.Figure:
    """Plotly: the same with error bars; hover gives m, mean and std."""
    fig = go.Figure()
    for i, (name, sizes, mean, std) in enumerate(_averaging(curves, metric)):
        text = [f"{name + '<br>' if name else ''}m={int(m)}<br>{metric} mean={fmt(v, 6)}<br>std={fmt(s, 4)}"
                for m, v, s in zip(sizes, mean, std)]
        fig.add_trace(go.Scatter(x=sizes, y=mean, error_y={"type": "data", "array": std, "visible": True},
                                 mode="lines+markers", name=name or metric, line={"color": color(i)}, text=text,
                                 hovertemplate="%{text}<extra></extra>"))
    return style_plotly(fig, title or f"Test {metric} vs number of averaged models",
                        xaxis_title="number of averaged client models m", yaxis_title=f"test {metric}")


FIGURES.add("averaging", FigureKind((AveragingCurve,), averaging_figure, averaging_plotly))
FIGURES.add("decomposition", FigureKind((Decomposition,), decomposition_bars_figure, decomposition_bars_plotly))
