"""Curvature figures.

Hessian eigenvalue density, top eigenvalues along an interpolation path, and the loss along the
top Hessian eigenvector beside its quadratic model.

Duck-typed on the result classes of :mod:`landscape.curvature_results`: a spectral density
has ``.grid`` and ``.density`` (stochastic Lanczos quadrature, Ghorbani et al. 2019 /
PyHessian's ``density()``); a curvature profile has ``.alphas`` and ``.eigenvalues`` of
shape ``(len(alphas), k)``, descending along the second axis; an eigen line has ``.t``,
``.loss``, ``.predicted`` (its quadratic model), ``.eigenvalue`` and ``.curvature``.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import plotly.graph_objects as go
from matplotlib.figure import Figure

from landscape.infra.errors import ConfigError
from landscape.results import CurvatureProfile, EigenLine, SpectralDensity

from .registry import FIGURES, FigureKind
from .style import color, finite, fmt, masked_note, new_figure, style_context, style_plotly

LOG_FLOOR = 1e-7  # log-y density plots show down to this fraction of the highest peak


def _named(items: Any, attrs: tuple[str, ...]) -> list[tuple[str, Any]]:
    named = list(items.items()) if isinstance(items, Mapping) else [("", items)]
    for name, obj in named:
        missing = [a for a in attrs if not hasattr(obj, a)]
        if missing:
            raise ConfigError(f"{name or type(obj).__name__}: expected an object with attributes {attrs}, "
                              f"missing {missing}")
    return named


def density_limits(densities: list[np.ndarray]) -> tuple[float, float]:
    """``(bottom, top)`` of a log-y axis showing every density, both ends from the data.

    Parameters
    ----------
    densities
        The densities drawn on one axis (non-finite entries ignored).

    Returns
    -------
    tuple of float
        ``bottom``: the smallest positive value drawn, but at least :data:`LOG_FLOOR` times the
        highest peak (the Gaussian tails of stochastic Lanczos quadrature fall to 1e-300 and
        below); ``top``: twice the highest peak, and at least ten times ``bottom``.
    """
    values = np.concatenate([np.ravel(d) for d in densities]) if densities else np.empty(0)
    positive = values[np.isfinite(values) & (values > 0)]
    if not positive.size:
        return LOG_FLOOR, 10 * LOG_FLOOR
    peak = float(positive.max())
    bottom = max(float(positive.min()), peak * LOG_FLOOR)
    return bottom, max(2.0 * peak, 10.0 * bottom)


def spectral_density_figure(densities: Any, *, log_y: bool = True, title: str | None = None,
                            width: float = 4.8, height: float = 3.2) -> Figure:
    """Matplotlib: density against eigenvalue, one line per density (a mapping draws several)."""
    named = _named(densities, ("grid", "density"))
    with style_context():
        fig = new_figure(width, height)
        ax = fig.add_subplot()
        drawn = [finite(d.density) for _, d in named]
        for i, ((name, d), dens) in enumerate(zip(named, drawn)):
            ax.plot(d.grid, dens, color=color(i), label=name or None)
        if log_y:
            ax.set_yscale("log")
            ax.set_ylim(*density_limits(drawn))
        ax.set_xlabel("eigenvalue")
        ax.set_ylabel("density")
        if any(n for n, _ in named):
            ax.legend()
        fig.suptitle(title or "Hessian eigenvalue density (SLQ)")
    return fig


def spectral_density_plotly(densities: Any, *, log_y: bool = True, title: str | None = None) -> go.Figure:
    """Plotly: the same; hover shows eigenvalue and density."""
    named = _named(densities, ("grid", "density"))
    fig = go.Figure()
    drawn = [finite(d.density) for _, d in named]
    for i, ((name, d), dens) in enumerate(zip(named, drawn)):
        text = [f"{name + '<br>' if name else ''}λ={fmt(g, 6)}<br>density={fmt(v, 4)}" for g, v in zip(d.grid, dens)]
        fig.add_trace(go.Scatter(x=d.grid, y=dens, mode="lines", name=name or "density", line={"color": color(i)},
                                 text=text, hovertemplate="%{text}<extra></extra>"))
    yaxis: dict[str, Any] = {"title": {"text": "density"}}
    if log_y:
        yaxis.update(type="log", range=[float(np.log10(v)) for v in density_limits(drawn)])
    return style_plotly(fig, title or "Hessian eigenvalue density (SLQ)", xaxis_title="eigenvalue", yaxis=yaxis)


def _eigen_table(profile: Any) -> np.ndarray:
    values = finite(profile.eigenvalues)
    return values[:, None] if values.ndim == 1 else values


def curvature_path_figure(profiles: Any, *, title: str | None = None, width: float = 4.8,
                          height: float = 3.2) -> Figure:
    """Matplotlib: top eigenvalue (solid) and further eigenvalues (thin) against alpha."""
    named = _named(profiles, ("alphas", "eigenvalues"))
    masked = 0
    with style_context():
        fig = new_figure(width, height)
        ax = fig.add_subplot()
        for i, (name, prof) in enumerate(named):
            values = _eigen_table(prof)
            masked += int(np.isnan(values).sum())
            for j in range(values.shape[1]):
                ax.plot(prof.alphas, values[:, j], color=color(i), marker="o" if j == 0 else None,
                        markersize=3, linewidth=1.6 if j == 0 else 0.7, alpha=1.0 if j == 0 else 0.6,
                        label=(name or "λ_max") if j == 0 else None)
        ax.set_xlabel("α (interpolation coefficient)")
        ax.set_ylabel("Hessian eigenvalue")
        ax.legend()
        fig.suptitle((title or "Top Hessian eigenvalues along the path") + masked_note(masked, "eigenvalues"))
    return fig


def curvature_path_plotly(profiles: Any, *, title: str | None = None) -> go.Figure:
    """Plotly: the same; hover shows alpha and every eigenvalue there."""
    named = _named(profiles, ("alphas", "eigenvalues"))
    fig = go.Figure()
    masked = 0
    for i, (name, prof) in enumerate(named):
        values = _eigen_table(prof)
        masked += int(np.isnan(values).sum())
        text = [f"{name + '<br>' if name else ''}α={fmt(a)}<br>" + "<br>".join(f"λ{j + 1}={fmt(v, 6)}"
                                                                             for j, v in enumerate(row))
                for a, row in zip(prof.alphas, values)]
        for j in range(values.shape[1]):
            fig.add_trace(go.Scatter(x=prof.alphas, y=values[:, j], mode="lines+markers" if j == 0 else "lines",
                                     name=f"{name or 'path'} λ{j + 1}", legendgroup=name,
                                     line={"color": color(i), "width": 2.5 if j == 0 else 1},
                                     opacity=1 if j == 0 else 0.6,
                                     text=text, hovertemplate="%{text}<extra></extra>"))
    return style_plotly(fig, (title or "Top Hessian eigenvalues along the path") + masked_note(masked, "eigenvalues"),
                        xaxis_title="α", yaxis_title="Hessian eigenvalue")


def _eigen_label(name: str, line: Any) -> str:
    prefix = f"{name}: " if name else ""
    if abs(line.curvature - line.eigenvalue) <= 1e-6 * max(abs(line.eigenvalue), 1e-12):
        return f"{prefix}quadratic model, λ={fmt(line.eigenvalue)}"
    return f"{prefix}quadratic model, dᵀHd={fmt(line.curvature)} (λ={fmt(line.eigenvalue)})"


def eigen_line_figure(lines: Any, *, title: str | None = None, width: float = 4.8, height: float = 3.2) -> Figure:
    """Matplotlib: loss along the top Hessian eigenvector (solid) and its quadratic model (dashed).

    ``lines`` is an :class:`~landscape.results.curvature_views.EigenLine` (``.t``, ``.loss``,
    ``.predicted``, ``.eigenvalue``, ``.curvature``) or a mapping name -> line; the quadratic model
    is ``L(w) + t g.d + t^2 d^T H d / 2``, so the two curves touch to second order at ``t = 0``.
    """
    named = _named(lines, ("t", "loss", "predicted", "eigenvalue", "curvature"))
    masked = 0
    with style_context():
        fig = new_figure(width, height)
        ax = fig.add_subplot()
        for i, (name, line) in enumerate(named):
            loss = finite(line.loss)
            masked += int(np.isnan(loss).sum())
            ax.plot(line.t, loss, color=color(i), marker="o", markersize=3, label=f"{name}: loss" if name else "loss")
            ax.plot(line.t, line.predicted, color=color(i), linestyle="--", linewidth=1.2,
                    label=_eigen_label(name, line))
        ax.axvline(0.0, color="0.6", linewidth=0.6)
        ax.set_xlabel("t (along the top Hessian eigenvector)")
        ax.set_ylabel("loss")
        ax.legend()
        fig.suptitle((title or "Loss along the top Hessian eigenvector") + masked_note(masked, "losses"))
    return fig


def eigen_line_plotly(lines: Any, *, title: str | None = None) -> go.Figure:
    """Plotly: the same; hover shows t, the loss and the quadratic model's value."""
    named = _named(lines, ("t", "loss", "predicted", "eigenvalue", "curvature"))
    fig = go.Figure()
    masked = 0
    for i, (name, line) in enumerate(named):
        loss = finite(line.loss)
        masked += int(np.isnan(loss).sum())
        text = [f"{name + '<br>' if name else ''}t={fmt(t)}<br>loss={fmt(v, 6)}<br>quadratic={fmt(p, 6)}"
                for t, v, p in zip(line.t, loss, line.predicted)]
        fig.add_trace(go.Scatter(x=line.t, y=loss, mode="lines+markers", name=f"{name}: loss" if name else "loss",
                                 line={"color": color(i)}, text=text, hovertemplate="%{text}<extra></extra>"))
        fig.add_trace(go.Scatter(x=line.t, y=line.predicted, mode="lines", name=_eigen_label(name, line),
                                 line={"color": color(i), "dash": "dash"}, text=text,
                                 hovertemplate="%{text}<extra></extra>"))
    return style_plotly(fig, (title or "Loss along the top Hessian eigenvector") + masked_note(masked, "losses"),
                        xaxis_title="t (along the top Hessian eigenvector)", yaxis_title="loss")


FIGURES.add("curvature_path", FigureKind((CurvatureProfile,), curvature_path_figure, curvature_path_plotly))
FIGURES.add("eigen_line", FigureKind((EigenLine,), eigen_line_figure, eigen_line_plotly))
FIGURES.add("spectral_density", FigureKind((SpectralDensity,), spectral_density_figure, spectral_density_plotly))
