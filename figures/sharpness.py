"""Sharpness figures: the projected-gradient ascent of :func:`landscape.sharpness`, one panel per result.

Drawn from :class:`landscape.results.SharpnessResult`: the loss increase ``L(w + e_t) - L(w)``
after each ascent step of every restart (thin lines), the best so far of the restart that found
the sharpness (thick), the sharpness itself (dashed) and, for the L2 kinds, the second-order
estimate ``rho^2 lambda_max / 2`` (dotted), both also in the panel's title. Each result has its
own panel, as the radii of different kinds differ; results of one ball (e.g. several models at the
same kind and radius) share the y axis, so their sharpness compares by eye.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure
from plotly.subplots import make_subplots

from landscape.infra.errors import ConfigError
from landscape.results import SharpnessResult

from .registry import FIGURES, FigureKind
from .style import bn_note, color, fmt, new_figure, style_context, style_plotly

SharpnessLike = SharpnessResult | Mapping[str, SharpnessResult] | Sequence[SharpnessResult]


def named_results(results: SharpnessLike) -> list[tuple[str, SharpnessResult]]:
    """``[(title, result), ...]`` from one result, a title -> result mapping, or a sequence.

    Parameters
    ----------
    results
        What the figure functions accept.

    Returns
    -------
    list of (str, SharpnessResult)
        Untitled results are titled by their kind (``"adaptive l2"``, ...).

    Raises
    ------
    ConfigError
        An item is not a :class:`SharpnessResult`, or there is none.
    """
    if isinstance(results, SharpnessResult):
        named = [(results.name, results)]
    elif isinstance(results, Mapping):
        named = list(results.items())
    else:
        named = [(getattr(r, "name", str(i)), r) for i, r in enumerate(results)]
    bad = [str(title) for title, r in named if not isinstance(r, SharpnessResult)]
    if bad or not named:
        raise ConfigError(f"sharpness figures draw SharpnessResult objects (landscape.sharpness); "
                          f"got {bad or 'nothing'}")
    return [(str(title), r) for title, r in named]


def _panel_title(title: str, result: SharpnessResult, newline: str = "\n") -> str:
    """Kind and radius, then the sharpness and (L2) the second-order estimate."""
    values = f"S = {fmt(result.value, 3)}"
    if np.isfinite(result.second_order):
        values += f", ρ²λ_max/2 = {fmt(result.second_order, 3)}"
    return f"{title}, ρ = {fmt(result.rho, 3)}{newline}{values}"


def _restart_color(r: int) -> str:
    """The Okabe-Ito colours, except the vermillion of the second-order line."""
    return color((0, 1, 2, 4, 5, 6)[r % 6])


def _best_restart(result: SharpnessResult) -> int:
    return int(np.argmax(result.restart_values))


def _one_ball(named: list[tuple[str, SharpnessResult]]) -> bool:
    """Whether every result measures the same ball (kind and radius): then the panels share the y axis."""
    return len({(r.name, r.rho) for _, r in named}) == 1


def sharpness_figure(results: SharpnessLike, *, title: str | None = None, width: float | None = None,
                     height: float = 3.0) -> Figure:
    """Matplotlib: the ascent trajectories, one panel per result.

    Parameters
    ----------
    results
        A :class:`SharpnessResult`, a mapping title -> result, or a sequence of results.
    title
        Figure title (default names the method).
    width
        Inches (default 3.2 per panel).
    height
        Inches.

    Returns
    -------
    matplotlib.figure.Figure
    """
    named = named_results(results)
    with style_context():
        fig = new_figure(width or 3.2 * len(named), height)
        axes = fig.subplots(1, len(named), squeeze=False, sharey=_one_ball(named))[0]
        for ax, (name, res) in zip(axes, named):
            steps = np.arange(res.steps + 1)
            for r, traj in enumerate(res.trajectory):
                ax.plot(steps, traj, color=_restart_color(r), linewidth=0.8, alpha=0.7, label=f"restart {r + 1}")
            ax.plot(steps, res.running_max[_best_restart(res)], color="black", linewidth=1.8, label="best so far")
            ax.axhline(res.value, color="black", linestyle="--", linewidth=0.8, label="sharpness S")
            if np.isfinite(res.second_order):
                ax.axhline(res.second_order, color=color(3), linestyle=":", linewidth=1.4,
                           label="ρ²λ_max/2 (second order)")
            ax.set_title(_panel_title(name, res))
            ax.set_xlabel("ascent step")
        axes[0].set_ylabel("loss increase L(w+e) − L(w)")
        handles = {}
        for ax in axes:  # one legend for every panel: the union of their entries
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(len(handles), 8))
        fig.suptitle((title or "Worst-case sharpness: projected gradient ascent") + bn_note([r for _, r in named]))
    return fig


def sharpness_plotly(results: SharpnessLike, *, title: str | None = None) -> go.Figure:
    """Plotly: the same panels; hover gives the step, the loss increase and the step length.

    Parameters
    ----------
    results
        A :class:`SharpnessResult`, a mapping title -> result, or a sequence of results.
    title
        Figure title (default names the method).

    Returns
    -------
    plotly.graph_objects.Figure
    """
    named = named_results(results)
    fig = make_subplots(rows=1, cols=len(named), shared_yaxes=_one_ball(named),
                        subplot_titles=[_panel_title(n, r, "<br>") for n, r in named])
    for col, (name, res) in enumerate(named, start=1):
        steps = np.arange(res.steps + 1)
        lengths = np.concatenate([[np.nan], np.zeros(res.steps)])
        for r, traj in enumerate(res.trajectory):
            lengths[1:] = res.step_lengths[r]
            text = [f"{name}, restart {r + 1}<br>step {s}<br>increase {fmt(v, 5)}<br>step length {fmt(a, 3)}"
                    for s, v, a in zip(steps, traj, lengths)]
            fig.add_trace(go.Scatter(x=steps, y=traj, mode="lines", name=f"restart {r + 1}", legendgroup=f"r{r}",
                                     showlegend=col == 1, line={"color": _restart_color(r), "width": 1}, opacity=0.7,
                                     text=text, hovertemplate="%{text}<extra></extra>"), row=1, col=col)
        fig.add_trace(go.Scatter(x=steps, y=res.running_max[_best_restart(res)], mode="lines", name="best so far",
                                 legendgroup="best", showlegend=col == 1, line={"color": "black", "width": 2.5}),
                      row=1, col=col)
        fig.add_hline(y=res.value, line={"color": "black", "dash": "dash", "width": 1}, row=1, col=col)
        if np.isfinite(res.second_order):
            fig.add_hline(y=res.second_order, line={"color": color(3), "dash": "dot", "width": 1.5}, row=1, col=col)
        fig.update_xaxes(title_text="ascent step", row=1, col=col)
    fig.update_yaxes(title_text="loss increase L(w+e) − L(w)", row=1, col=1)
    return style_plotly(fig, (title or "Worst-case sharpness: projected gradient ascent")
                        + bn_note([r for _, r in named]))


FIGURES.add("sharpness", FigureKind((SharpnessResult,), sharpness_figure, sharpness_plotly))
