"""End to end: the demo (smallest settings) writes report/index.html, and headless Chromium renders it.

Checks that every figure is on the page exactly once (interactive, none repeated as a static
image), that the decomposition estimates variance from several realisations without the
one-realisation warning, that the page has no console errors, that every plotly figure was
drawn (an SVG in each plot div after scripts ran), and that the screenshot is not blank.
"""
from __future__ import annotations

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
           "ima: test loss on the plane of three client models.", "Hessian eigenvalue density.")


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
    terms = dict(re.findall(r'<tr><td class="text">(\w+)</td><td>([^<]+)</td></tr>', text))
    assert float(terms["variance"]) > 0.0 and float(terms["covariance"]) != 0.0
    assert float(terms["wens_loss"]) == pytest.approx(
        float(terms["bias"]) + float(terms["variance"]) + float(terms["covariance"]), abs=2e-4)  # 4 digits shown


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_report_renders_in_chromium(report: Path, tmp_path: Path) -> None:
    profile = tmp_path / "profile"
    dom = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
                          "--v=0", "--virtual-time-budget=10000", "--dump-dom", report.as_uri()],
                         capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
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
