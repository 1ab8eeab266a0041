"""End to end: the demo (smallest settings) writes report/index.html, and headless Chromium renders it.

Checks that the page has no console errors, that every plotly figure was drawn (an SVG in
each plot div after scripts ran), and that the screenshot is not blank.
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


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    # the smallest report with every section: digits (the embedded data), one FL round, a 5x5 plane
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--out", str(out),
                           "--dataset", "digits", "--rounds", "1", "--resolution", "5", "--central-epochs", "1"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    page = out / "index.html"
    assert page.exists()
    return page


def test_report_has_every_section(report: Path) -> None:
    text = report.read_text()
    headings = re.findall(r"<h2[^>]*>([^<]*)", text)
    for heading in ("Training", "Connectivity", "Transitivity", "basin", "Sharpness", "decomposition"):
        assert any(heading.lower() in h.lower() for h in headings), (heading, headings)
    assert not re.search(r"<script[^>]*\bsrc=", text)  # everything inline: works offline
    assert text.count("<img") >= 5


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
