"""A small self-contained HTML report: title, sections, text, tables, PNG images, plotly figures.

The page works offline: images are embedded as base64 PNG and plotly.js is inlined once
per page (only when the page has a plotly figure). A page shows each result as one figure,
never a static and an interactive copy of it: the demo adds the interactive ones (every
``figures.*_plotly``), the CLI's report the static ones (no plotly.js on its page). Used by
the demo and the CLI::

    rep = Report("FedAvg on digits")
    rep.section("Interpolation", "Loss between two clients.")
    rep.add_plotly(path_plotly(result), caption="Client 0 - client 1.")
    rep.add_table([{"pair": "c0-c1", "barrier": 0.12}])
    rep.write("report/index.html")
"""
from __future__ import annotations

import base64
import html
import io
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

import plotly.graph_objects as go
from matplotlib.figure import Figure

from landscape.infra.files import write_text

from .html import plotly_bundle, plotly_div
from .style import style_context

_CSS = """
body { font-family: Arial, Helvetica, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
h1 { border-bottom: 2px solid #0072B2; padding-bottom: .2em; }
h2 { margin-top: 2em; color: #0072B2; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: .3em .6em; text-align: right; }
th { background: #f2f2f2; }
td.text { text-align: left; }
figure { margin: 1.2em 0; }
figure img { max-width: 100%; }
figcaption { font-size: 0.9em; color: #555; }
.meta { color: #777; font-size: 0.85em; }
"""


@dataclass
class _Section:
    title: str | None
    blocks: list[str] = field(default_factory=list)


class Report:
    """Builder of one HTML page; every ``add_*`` appends to the current section and returns ``self``."""

    def __init__(self, title: str, *, subtitle: str | None = None):
        self.title = title
        self.subtitle = subtitle
        self._sections: list[_Section] = [_Section(None)]
        self._has_plotly = False

    def section(self, title: str, text: str | None = None) -> "Report":
        """Start a new section (an ``<h2>``) with optional introductory text."""
        self._sections.append(_Section(title))
        return self.add_text(text) if text else self

    def add_text(self, text: str) -> "Report":
        """Paragraphs of plain text (HTML-escaped; blank lines separate paragraphs)."""
        for para in (p.strip() for p in text.split("\n\n")):
            if para:
                self._add(f"<p>{html.escape(para)}</p>")
        return self

    def add_table(self, rows: Sequence[Mapping[str, Any]], *, columns: Sequence[str] | None = None,
                  caption: str | None = None, digits: int = 4) -> "Report":
        """A table from a list of dicts; columns default to the union of keys in first-seen order.

        Floats are shown with ``digits`` significant digits; missing cells are empty.
        """
        if columns is None:
            columns = list(dict.fromkeys(k for row in rows for k in row))
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
        body = []
        for row in rows:
            cells = []
            for c in columns:
                value = row.get(c)
                cls = ' class="text"' if isinstance(value, str) else ""
                cells.append(f"<td{cls}>{html.escape(_format(value, digits))}</td>")
            body.append(f"<tr>{''.join(cells)}</tr>")
        cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
        self._add(f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
        return self

    def add_image(self, image: Figure | bytes, *, caption: str | None = None, alt: str | None = None,
                  dpi: int = 150) -> "Report":
        """A matplotlib figure (rendered to PNG) or PNG bytes, embedded as base64."""
        if isinstance(image, Figure):
            buf = io.BytesIO()
            with style_context():
                image.savefig(buf, format="png", dpi=dpi)
            image = buf.getvalue()
        data = base64.b64encode(image).decode("ascii")
        alt_text = html.escape(alt or caption or "figure")
        self._add(f'<figure><img alt="{alt_text}" src="data:image/png;base64,{data}">'
                  f"{_caption(caption)}</figure>")
        return self

    def add_plotly(self, fig: go.Figure, *, caption: str | None = None) -> "Report":
        """An interactive plotly figure (the page includes plotly.js once, inline)."""
        self._has_plotly = True
        self._add(f"<figure>{plotly_div(fig)}{_caption(caption)}</figure>")
        return self

    def add_html(self, fragment: str) -> "Report":
        """A raw, trusted HTML fragment (e.g. a list of links)."""
        self._add(fragment)
        return self

    def to_html(self) -> str:
        """The complete page."""
        parts = [f"<h1>{html.escape(self.title)}</h1>"]
        if self.subtitle:
            parts.append(f"<p>{html.escape(self.subtitle)}</p>")
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        parts.append(f'<p class="meta">Generated {stamp}.</p>')
        for sec in self._sections:
            if sec.title is None and not sec.blocks:
                continue
            inner = "".join(sec.blocks)
            heading = f"<h2>{html.escape(sec.title)}</h2>" if sec.title else ""
            parts.append(f"<section>{heading}{inner}</section>")
        script = plotly_bundle() if self._has_plotly else ""
        return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                f"<title>{html.escape(self.title)}</title>\n<style>{_CSS}</style>\n{script}\n</head>\n"
                f"<body>\n{''.join(parts)}\n</body>\n</html>\n")

    def write(self, path: str | os.PathLike) -> Path:
        """Write the page with :func:`landscape.infra.files.write_text`.

        Never half-written and never through a link: a page or folder that is a symbolic
        link, a full disk or a read-only folder gives one :class:`FileWriteError`.

        Parameters
        ----------
        path:
            The HTML file to write.

        Returns
        -------
        Path
            ``path``.
        """
        return write_text(path, self.to_html())

    def _add(self, block: str) -> None:
        self._sections[-1].blocks.append(block)


def _caption(caption: str | None) -> str:
    return f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""


def _format(value: Any, digits: int) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) or (hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0
                                    and value.dtype.kind == "f"):
        value = float(value)
        return str(value) if not math.isfinite(value) else f"{value:.{digits}g}"
    return str(value)
