"""Writing figures to files: plotly to standalone HTML with plotly.js inline, matplotlib to PNG/PDF/SVG.

The machines this runs on have no internet, so HTML never references a CDN: the whole
plotly.js bundle is embedded (about 5 MB per page; a report embeds it once per page).
"""
from __future__ import annotations

import io
import os
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline
from matplotlib.figure import Figure

from landscape.infra.errors import ConfigError
from landscape.infra.files import write_atomic, write_text

from .style import style_context

MATPLOTLIB_FORMATS = (".png", ".pdf", ".svg")


def plotly_bundle() -> str:
    """A ``<script>`` element holding the full plotly.js library inline."""
    return f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'


def plotly_div(fig: go.Figure) -> str:
    """The ``<div>`` + plotting script of a figure, without plotly.js (the page includes it once)."""
    return pio.to_html(fig, full_html=False, include_plotlyjs=False,
                       config={"displaylogo": False, "responsive": True})


def to_standalone_html(fig: go.Figure) -> str:
    """A complete HTML page showing ``fig``, with plotly.js inline (works offline)."""
    return pio.to_html(fig, full_html=True, include_plotlyjs=True, include_mathjax=False,
                       config={"displaylogo": False, "responsive": True})


def save(fig: Figure | go.Figure, path: str | os.PathLike) -> Path:
    """Write a figure: matplotlib as ``.png``/``.pdf``/``.svg``, plotly as ``.html``.

    The figure is rendered in memory, then written with
    :func:`landscape.infra.files.write_atomic`: never half-written, never through a link,
    and a full or read-only folder gives one :class:`FileWriteError` naming the path.

    Parameters
    ----------
    fig:
        A matplotlib or plotly figure.
    path:
        The file to write; its suffix picks the format.

    Returns
    -------
    Path
        ``path``.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if isinstance(fig, go.Figure):
        if suffix not in (".html", ".htm"):
            raise ConfigError(f"{path}: plotly figures are saved as .html (no image export "
                              "dependency); use a matplotlib figure for PNG/PDF/SVG")
        return write_text(path, to_standalone_html(fig))
    if isinstance(fig, Figure):
        if suffix not in MATPLOTLIB_FORMATS:
            raise ConfigError(f"{path}: matplotlib figures are saved as one of {MATPLOTLIB_FORMATS}")
        buffer = io.BytesIO()
        with style_context():
            fig.savefig(buffer, format=suffix[1:])
        return write_atomic(path, buffer.getbuffer())
    raise ConfigError(f"cannot save a {type(fig).__name__}; expected a matplotlib Figure or "
                      "a plotly Figure")
