"""examples/notebooks/landscape_tour.ipynb runs top to bottom in a real Jupyter kernel (nbclient + ipykernel).

Checks that no cell errored and that the outputs a reader looks for are there: the run's summary,
the results' short reprs and HTML summaries, the verdict tables, a matplotlib image and an
interactive plotly plane. The numbers printed by the notebook are compared with the same
quantities recomputed here from the run folder it wrote.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the test extra installs nbformat/nbclient/ipykernel")
nbclient = pytest.importorskip("nbclient", reason="the test extra installs nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "notebooks" / "landscape_tour.ipynb"


@pytest.fixture(scope="module")
def executed() -> "nbformat.NotebookNode":
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    return nb


def outputs(nb, source_start: str) -> list[dict]:
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(source_start)]
    assert len(cells) == 1, source_start
    return cells[0].outputs


def stdout_of(nb, source_start: str) -> str:
    return "".join(o.get("text", "") for o in outputs(nb, source_start)
                   if o.output_type == "stream" and o.get("name") == "stdout")


def data_of(nb, source_start: str, mime: str) -> str:
    found = [o["data"][mime] for o in outputs(nb, source_start) if mime in o.get("data", {})]
    assert found, f"no {mime} output from the cell starting {source_start!r}"
    return found[0] if isinstance(found[0], str) else str(found[0])


def test_no_cell_errored(executed) -> None:
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert all(c.execution_count for c in executed.cells if c.cell_type == "code")


def test_key_outputs_exist(executed) -> None:
    stream = stdout_of(executed, "out = Path")
    assert "Run(" in stream and "fedavg on digits" in stream and "test accuracy per round" in stream
    assert data_of(executed, "path = ", "text/plain").startswith("PathResult(loss_barrier=")
    assert data_of(executed, "path = ", "text/html")
    assert data_of(executed, "figures.path_figure", "image/png")
    assert data_of(executed, "grid = ", "text/plain").startswith("PlaneResult(")
    plotly_json = data_of(executed, "figures.plane_plotly", "application/vnd.plotly.v1+json")
    assert "contour" in plotly_json
    assert data_of(executed, "group = ", "text/plain").startswith("GroupResult(loss_barrier=")
    for cell in ("transitive = ", "basin = "):
        html = data_of(executed, cell, "text/html")
        assert re.search(r"reproduced|not reproduced|not testable|inconclusive", html)
    assert data_of(executed, "verdict_figure", "image/png")


def test_printed_accuracies_match_the_run_folder(executed) -> None:
    import ast

    import fl

    stream = stdout_of(executed, "out = Path")
    printed = ast.literal_eval(stream.split("test accuracy per round:")[1].strip())
    folder = re.search(r"Run\('([^']+)'", stream).group(1)
    stored = [round(m["test_accuracy"], 3) for m in fl.load_run(folder).metrics]
    assert printed == stored and len(stored) == 4  # rounds 0..3


def test_no_warning_reaches_the_reader(executed) -> None:
    """Nothing on stderr: no TqdmWarning about a missing notebook widget, no other warning."""
    stderr = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.outputs
                     if o.output_type == "stream" and o.get("name") == "stderr")
    assert "Warning" not in stderr, stderr[:500]


def test_verdicts_on_short_runs_carry_the_caveat() -> None:
    """A verdict on the tour's 3-round models is preceded by the warning that they are not converged."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    run_cell = next(c.source for c in nb.cells if c.source.startswith("out = Path"))
    rounds = int(re.search(r"rounds=(\d+)", run_cell).group(1))
    claims = next(c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## 5. Claims"))
    assert f"trained for {rounds} rounds only" in claims and "`docs/claims.md`" in claims
