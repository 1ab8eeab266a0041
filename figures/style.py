"""Shared look of every figure: colour-blind-safe colours, publication rc defaults, roles.

Nothing here changes global matplotlib state. Figures are built as bare
:class:`matplotlib.figure.Figure` objects on an Agg canvas (no pyplot, no display) inside
:func:`style_context`, a :func:`matplotlib.rc_context` that restores every rcParam on exit.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Mapping

import matplotlib
import numpy as np
import plotly.graph_objects as go
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from landscape.infra.errors import ConfigError

# Okabe & Ito (2008), "Color Universal Design": distinguishable under all common colour-vision deficiencies.
OKABE_ITO: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7",
                              "#56B4E9", "#F0E442", "#000000")
SEQUENTIAL_CMAP = "viridis"  # loss / error surfaces (perceptually uniform, colour-blind safe)
MATRIX_CMAP = "cividis"      # heatmaps (optimised for deuteranopia and protanopia)
PLOTLY_SEQUENTIAL = "Viridis"
PLOTLY_MATRIX = "Cividis"
MASKED_COLOR = "#BBBBBB"     # where a metric overflowed (non-finite): drawn as masked

RC: dict[str, object] = {
    "text.usetex": False,
    "font.family": "sans-serif",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.6,
    "lines.markersize": 4,
    "legend.frameon": False,
    "axes.prop_cycle": matplotlib.cycler(color=list(OKABE_ITO)),
    "image.cmap": SEQUENTIAL_CMAP,
    "figure.dpi": 100,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "pdf.fonttype": 42,  # embed TrueType, editable text in PDF/SVG
    "svg.fonttype": "none",
}


@contextlib.contextmanager
def style_context(overrides: Mapping[str, object] | None = None) -> Iterator[None]:
    """The rcParams of :data:`RC` (plus ``overrides``) for the duration of the block only."""
    with matplotlib.rc_context({**RC, **(overrides or {})}):
        yield


def new_figure(width: float = 6.4, height: float = 3.2) -> Figure:
    """A pyplot-free Figure on an Agg canvas (call inside :func:`style_context`)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def masked_cmap(name: str) -> "matplotlib.colors.Colormap":
    """Colormap ``name`` drawing masked (non-finite) cells in :data:`MASKED_COLOR`."""
    return matplotlib.colormaps[name].with_extremes(bad=MASKED_COLOR)


def color(i: int) -> str:
    """The i-th colour of the Okabe-Ito cycle."""
    return OKABE_ITO[i % len(OKABE_ITO)]


@dataclass(frozen=True)
class Role:
    """How a model of a given role is drawn: matplotlib marker, plotly 2-D and 3-D symbols, colour."""

    name: str
    marker: str
    symbol: str
    symbol3d: str
    color: str
    size: float


ROLES: dict[str, Role] = {
    "client": Role("client", "^", "triangle-up", "circle", "#000000", 40),
    "global": Role("global", "*", "star", "diamond", "#D55E00", 150),
    "anchor": Role("anchor", "D", "diamond", "square-open", "#CC79A7", 45),
    "ima": Role("ima", "s", "square", "square", "#009E73", 45),
    "average": Role("average", "X", "x", "x", "#FFFFFF", 40),
    "model": Role("model", "o", "circle", "circle-open", "#0072B2", 40),
    "merge": Role("merge", "P", "cross", "cross", "#E69F00", 90),
}

# Label prefixes (lower case) that imply a role when no explicit mapping is given.
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("client", "client"), ("global", "global"), ("server", "global"), ("fma", "global"),
    ("anchor", "anchor"), ("ima", "ima"), ("window", "ima"), ("average", "average"),
    ("avg", "average"), ("mean", "average"), ("centroid", "average"), ("merge", "merge"),
)


def role_of(label: str, roles: Mapping[str, str] | None = None) -> Role:
    """Role of a labelled model: ``roles[label]`` if given, else inferred from the label prefix.

    Unknown labels and prefixes get the neutral ``"model"`` role.
    """
    if roles is not None and label in roles:
        name = roles[label]
        if name not in ROLES:
            raise ConfigError(f"unknown role {name!r} for model {label!r}; use one of {sorted(ROLES)}")
        return ROLES[name]
    lower = label.lower()
    for prefix, name in _PREFIXES:
        if lower.startswith(prefix):
            return ROLES[name]
    return ROLES["model"]


PLOTLY_LAYOUT: dict[str, object] = {
    "template": "simple_white",
    "colorway": list(OKABE_ITO),
    "font": {"family": "Arial, Helvetica, sans-serif", "size": 13},
    "hoverlabel": {"namelength": -1},
}


def finite(values: object) -> np.ndarray:
    """``values`` as float64 with every non-finite entry (overflow) replaced by NaN, i.e. masked."""
    arr = np.array(values, dtype=np.float64)
    arr[~np.isfinite(arr)] = np.nan
    return arr


def fmt(value: float, digits: int = 4) -> str:
    """A number for labels and hover text: ``digits`` significant digits, ``inf``/``nan`` as such."""
    value = float(value)
    return f"{value:.{digits}g}" if np.isfinite(value) else str(value)


def masked_note(count: int, what: str = "points") -> str:
    """Title suffix announcing masked non-finite values; empty when there are none."""
    return f" [{count} non-finite {what} masked]" if count else ""


def style_plotly(fig: go.Figure, title: str | None = None, **layout: object) -> go.Figure:
    """Apply the shared plotly look (Okabe-Ito colourway, white template) and a title."""
    fig.update_layout(**PLOTLY_LAYOUT, **({"title": title} if title else {}), **layout)
    return fig


def bn_note(results: object) -> str:
    """Title suffix naming the BatchNorm mode of results computed on models that have BatchNorm.

    Parameters
    ----------
    results
        One result or a list/tuple of results; each carries the evaluator's fingerprint in
        ``spec["evaluator"]`` (``"bn"``: the mode; ``"batchnorm_layers"``: how many BatchNorm
        layers the model has, when recorded).

    Returns
    -------
    str
        ``" (BN: mode, ...)"`` over the results whose model has BatchNorm layers (or whose
        fingerprint does not record the count); empty when no result qualifies.
    """
    items = results if isinstance(results, (list, tuple)) else [results]
    modes = set()
    for r in items:
        evaluator = getattr(r, "spec", {}).get("evaluator") or {}
        if "bn" in evaluator and evaluator.get("batchnorm_layers", 1):
            modes.add(str(evaluator["bn"]))
    return f" (BN: {', '.join(sorted(modes))})" if modes else ""
