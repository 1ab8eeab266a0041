"""End to end: the demo (smallest settings) writes report/index.html, and headless Chromium renders it.

Checks that every figure is on the page exactly once (interactive, none repeated as a static
image), that the decomposition estimates variance from several realisations without the
one-realisation warning, that the page has no console errors, that every plotly figure was
drawn (an SVG in each plot div after scripts ran), and that the screenshot is not blank. Then
reads the drawn page back: no two labels of a figure overlap (their boxes as Chromium laid them
out), the heatmaps are as large as their cells and no larger, the log axis of the spectral density
spans the densities drawn, and the sharpness is shown.
"""
from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


#: The demo's figures, by caption: each must be on the page once.
FIGURES = ("Test loss and accuracy of the global model.",
           "fedavg: pairwise accuracy barriers among five client models (global test set).",
           "fedgucci: pairwise accuracy barriers among five client models (global test set).",
           "Interpolation between two client models.", "Interpolation between the two trained models.",
           "fedavg: test loss on the plane of three client models.",
           "ima: test loss on the plane of three client models.", "Hessian eigenvalue density.",
           "L2 sharpness (rho 0.1): loss increase after each ascent step of each restart, the best so far (thick), "
           "the sharpness (dashed) and rho^2 lambda_max / 2 (dotted).",
           "Decomposition terms of the last round: WENS loss = bias + variance + covariance, bias = train bias + "
           "heterogeneity bias + cross; locality is the distance of the client models from their average.")
#: A heatmap cell's side in pixels (figures.groups.matrix_size) and the demo's five client models per matrix.
CELL, MATRIX = 56, 5


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("report")
    # the smallest report with every section: digits (the embedded data), two FL rounds (a
    # convergence slope needs two), a 5x5 plane
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--out", str(out),
                           "--dataset", "digits", "--rounds", "2", "--resolution", "5", "--central-epochs", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    page = out / "index.html"
    assert page.exists()
    return page, proc


@pytest.fixture(scope="module")
def report(demo_run) -> Path:
    return demo_run[0]


def test_report_has_every_section(report: Path) -> None:
    text = report.read_text()
    headings = re.findall(r"<h2[^>]*>([^<]*)", text)
    for heading in ("Training", "Connectivity", "Transitivity", "basin", "Sharpness", "decomposition"):
        assert any(heading.lower() in h.lower() for h in headings), (heading, headings)
    assert not re.search(r"<script[^>]*\bsrc=", text)  # everything inline: works offline


def test_report_shows_each_figure_once_interactive(report: Path) -> None:
    text = report.read_text()
    body = text[text.index("<body>"):]  # plotly.js, inline in the head, is not searched
    blocks = re.findall(r"<figure>(.*?)</figure>", body, flags=re.S)
    captions = [re.search(r"<figcaption>(.*?)</figcaption>", b, flags=re.S) for b in blocks]
    assert sorted(c.group(1) for c in captions if c) == sorted(FIGURES)  # every figure, none twice
    for block in blocks:  # one interactive figure per block, no static copy beside it
        assert block.count('class="plotly-graph-div"') == 1 and "<img" not in block
    assert "<img" not in body and body.count('class="plotly-graph-div"') == len(FIGURES)


def test_report_records_convergence_and_a_decomposition_with_variance(demo_run) -> None:
    page, proc = demo_run
    text = page.read_text()
    assert "one realization" not in proc.stderr + proc.stdout
    assert "<th>converged</th>" in text
    assert re.search(r'<td class="text">(?:NO|yes)</td>', text)
    assert "<th>term</th><th>fedavg</th><th>ima</th>" in text  # both decomposed runs, side by side
    rows = re.findall(r'<tr><td class="text">(\w+)</td><td>([^<]+)</td><td>([^<]+)</td></tr>', text)
    for column in (1, 2):
        terms = {row[0]: float(row[column]) for row in rows}
        assert terms["variance"] > 0.0 and terms["covariance"] != 0.0
        assert terms["wens_loss"] == pytest.approx(terms["bias"] + terms["variance"] + terms["covariance"],
                                                   abs=2e-4)  # 4 digits shown


def plotly_figures(page: str) -> list[tuple[list[dict], dict]]:
    """``(data, layout)`` of every ``Plotly.newPlot`` call of the page, typed arrays decoded, in page order."""
    decoder, figures = json.JSONDecoder(), []
    for match in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', page):
        data, end = decoder.raw_decode(page, match.end())
        layout, _ = decoder.raw_decode(page, re.compile(r",\s*").match(page, end).end())
        figures.append(([{k: typed(v) for k, v in trace.items()} for trace in data], layout))
    return figures


def typed(value):
    """A plotly.js typed array (``{"dtype", "bdata"}``) as a numpy array; anything else unchanged."""
    if isinstance(value, dict) and set(value) >= {"dtype", "bdata"}:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = [int(n) for n in str(value.get("shape", len(array))).split(",")]  # "5, 5" for a matrix
        return array.reshape(shape)
    return value


def annotation_boxes(svg: str) -> list[tuple[str, float, float, float, float]]:
    """``(text, left, top, right, bottom)`` of every annotation Chromium drew in one figure's SVG."""
    found = re.findall(r'<g class="cursor-pointer" transform="translate\(([-\d.e]+),([-\d.e]+)\)">'
                       r'<rect class="bg" x="([-\d.e]+)" y="([-\d.e]+)" width="([\d.e]+)" height="([\d.e]+)"'
                       r'[^>]*></rect><text class="annotation-text"[^>]*data-unformatted="([^"]*)"', svg)
    return [(text, float(tx) + float(x), float(ty) + float(y), float(tx) + float(x) + float(w),
             float(ty) + float(y) + float(h)) for tx, ty, x, y, w, h, text in found]


@pytest.fixture(scope="module")
def rendered(report: Path, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    profile = tmp_path_factory.mktemp("chromium") / "profile"
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
                          "--v=0", "--window-size=1200,2400", "--virtual-time-budget=10000", "--dump-dom",
                          report.as_uri()],  # a window as wide as the page's 1100 px column and more
                         capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom, profile


def test_report_renders_in_chromium(report: Path, rendered, tmp_path: Path) -> None:
    dom, profile = rendered
    console_errors = [line for line in dom.stderr.splitlines()
                      if "CONSOLE" in line and re.search(r"error|uncaught", line, re.I)]
    assert not console_errors, console_errors
    plots = len(re.findall(r'<div[^>]*class="plotly-graph-div', dom.stdout))
    drawn = len(re.findall(r'<div[^>]*class="plotly-graph-div[^"]*js-plotly-plot', dom.stdout))
    assert plots >= 3 and drawn == plots, (plots, drawn)  # plotly.js ran and drew every figure
    assert dom.stdout.count('class="main-svg"') >= plots

    shot = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1200,2400",
                    "--virtual-time-budget=10000", f"--screenshot={shot}", report.as_uri()],
                   capture_output=True, text=True, timeout=180, check=True)
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.std() > 10.0  # not a blank page
    assert (pixels < 128).mean() > 0.01  # there is ink: text, lines, contours


def test_report_figures_read_as_drawn(report: Path, rendered) -> None:
    figures = plotly_figures(report.read_text())
    svgs = re.split(r'<div[^>]*class="plotly-graph-div', rendered[0].stdout)[1:]
    assert len(svgs) == len(figures) == len(FIGURES)
    titles = [layout.get("title", {}).get("text", "") for _, layout in figures]
    for title, svg in zip(titles, svgs):  # labels as laid out: no two overlap (a pixel of slack)
        boxes = annotation_boxes(svg)
        for i, (a, *box_a) in enumerate(boxes):
            for b, *box_b in boxes[i + 1:]:
                overlap = (min(box_a[2], box_b[2]) - max(box_a[0], box_b[0]),
                           min(box_a[3], box_b[3]) - max(box_a[1], box_b[1]))
                assert min(overlap) <= 1.0, f"{title}: label {a!r} overlaps {b!r}"
    heatmaps = [i for i, t in enumerate(titles) if t.startswith("Pairwise accuracy barriers")]
    assert len(heatmaps) == 2
    for i in heatmaps:  # the plot area is the 5 x 5 cells, the figure the cells and their labels
        area = re.search(r'<rect class="nsewdrag drag" data-subplot="xy" x="[\d.]+" y="[\d.]+" '
                         r'width="([\d.]+)" height="([\d.]+)"', svgs[i])
        assert (float(area[1]), float(area[2])) == pytest.approx((CELL * MATRIX, CELL * MATRIX), abs=1.0)
        layout = figures[i][1]
        assert layout["height"] == CELL * MATRIX + layout["margin"]["t"] + layout["margin"]["b"]
    data, layout = figures[titles.index("Hessian eigenvalue density (SLQ)")]
    peak = max(float(np.nanmax(np.asarray(trace["y"], dtype=float))) for trace in data)
    bottom, top = layout["yaxis"]["range"]
    assert layout["yaxis"]["type"] == "log"
    assert np.log10(peak) < top <= np.log10(peak) + 1  # the curves reach the top decade
    assert np.log10(peak) - 8 <= bottom < np.log10(peak)  # down to LOG_FLOOR of the peak, no further
    sharpness = report.read_text()
    assert re.search(r"<th>L2 sharpness \(rho 0\.1\)</th>", sharpness)  # the sharpness itself, in the table
    assert any(t.startswith("L2 sharpness of the global models") for t in titles)
