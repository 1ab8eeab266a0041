"""Planes: the automatic span, the diagnostics of a grid, the VTK export and the trajectory overlay.

* ``span="auto"`` on a least-squares model, whose loss along any direction from its minimum is the
  quadratic ``L0 + k t**2`` in closed form: the chosen span is the rule's analytic answer;
* the diagnostics (flat, saturated, non-finite share, centre not the minimum) on constructed grids
  and on a trained model's plane, and computed for a result read back from its cache record;
* the VTK legacy file read back by a reader written here from the format's specification;
* a real FL run's global models drawn on the plane's surface (plotly and matplotlib);
* bad spans, paths and trajectories refused with one line; a symbolic link never written through.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pytest
import torch
from torch import nn

import fl
from figures.planes import diagnostics_note, plane_figure, plane_plotly
from figures.report import Report
from landscape import ConfigError, Evaluator, PlaneDiagnostics, pca_plane, random_plane
from landscape.geometry.span import PROBE_DISTANCES, RISE_FACTOR, RISE_MIN, choose_span
from landscape.infra.errors import FileWriteError
from landscape.results import PlaneResult
from landscape.results.plane_diagnostics import CENTRE_TOLERANCE, FLAT_RELATIVE, SATURATED_FACTOR

from conftest import float32_tolerance
from fault_counts import tally

SAMPLES = 64


# ---------------------------------------------------------------- fixtures

def least_squares(noise: float, signal: float = 1.0) -> tuple[nn.Module, torch.Tensor, torch.Tensor, float]:
    """A bias-free linear model at the minimum of its mean squared error, its data and the minimum ``L0``.

    The targets are ``signal * X a`` plus ``noise`` times a residual orthogonal to the columns of
    ``X``, so the least-squares weights are ``signal * a`` and ``L0`` is the residual's mean square.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 2, generator=gen, dtype=torch.float64)
    r = torch.randn(SAMPLES, 1, generator=gen, dtype=torch.float64)
    r = r - x @ torch.linalg.lstsq(x, r).solution
    y = signal * x @ torch.tensor([[1.5], [-0.7]], dtype=torch.float64) + noise * r / r.norm() * SAMPLES ** 0.5
    x, y = x.float(), y.float()
    w = torch.linalg.lstsq(x.double(), y.double()).solution.T
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(w.float())
    w32 = model.weight.detach().double()
    centre_loss = float(((x.double() @ w32.T - y.double()) ** 2).mean())
    return model, x, y, centre_loss


def grid_plane(loss: np.ndarray, *, kind: str = "random_plane", accuracy: np.ndarray | None = None,
               half_width: float = 1.0) -> PlaneResult:
    """A plane result holding a constructed grid on ``[-half_width, half_width]**2``."""
    n = loss.shape[0]
    axis = np.linspace(-half_width, half_width, n)
    return PlaneResult(x=axis, y=axis.copy(), loss=loss, accuracy=accuracy if accuracy is not None else
                       np.full(loss.shape, 0.9), origin=np.zeros(2), u=np.array([1.0, 0.0]), v=np.array([0.0, 1.0]),
                       param_mask=np.ones(2), models={"center": [0.0, 0.0]}, spec={"kind": kind})


def bowl(n: int = 11, centre: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    axis = np.linspace(-1.0, 1.0, n)
    gx, gy = np.meshgrid(axis, axis)
    return 0.5 + (gx - centre[0]) ** 2 + (gy - centre[1]) ** 2


@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory) -> fl.Run:
    torch.set_num_threads(1)
    return fl.run("fedavg", dataset="digits", clients=4, rounds=2, out=tmp_path_factory.mktemp("run") / "fedavg",
                  progress=False, save_clients="all", seed=3)


@pytest.fixture(scope="module")
def run_plane(fedavg_run) -> tuple[PlaneResult, Evaluator]:
    test = fedavg_run.test_dataset()
    evaluator = Evaluator(fedavg_run.module(), (test.tensors[0][:200], test.tensors[1][:200]))
    globals_ = [fedavg_run.global_state(r) for r in fedavg_run.rounds]
    return pca_plane(globals_, evaluator, resolution=9), evaluator


# ---------------------------------------------------------------- span="auto"

@pytest.mark.parametrize("noise", [0.1, 1.5])  # L0 ~ 0.01 (target L0 + RISE_MIN) and L0 ~ 2 (target 10 L0)
def test_auto_span_is_the_rules_analytic_answer_on_a_quadratic_bowl(noise):
    model, x, y, centre_loss = least_squares(noise)
    evaluator = Evaluator(model, (x, y), loss="mse")
    plane = random_plane(model, evaluator, resolution=5, span="auto", seed=1)
    rule = plane.spec["span_rule"]
    # along t d from the minimum the loss is L0 + k t**2 with k = |X d|**2 / n; the rise of the rule is
    # the larger k of the two directions (+t and -t rise alike)
    k = max(float(((x.double() @ torch.from_numpy(d)) ** 2).mean()) for d in (plane.u, plane.v))
    target = max(RISE_FACTOR * centre_loss, centre_loss + RISE_MIN)
    expected = math.sqrt((target - centre_loss) / k)
    assert PROBE_DISTANCES[0] < expected < PROBE_DISTANCES[-1] and expected not in PROBE_DISTANCES
    # float32 losses of SAMPLES squared residuals (2-term dot products): each within tol of its size
    tol = float32_tolerance(SAMPLES + 4)
    assert rule["centre_loss"] == pytest.approx(centre_loss, rel=tol)
    np.testing.assert_allclose(rule["rise"], [k * t ** 2 for t in PROBE_DISTANCES], rtol=0,
                               atol=tol * (centre_loss + k * PROBE_DISTANCES[-1] ** 2))
    assert rule["outcome"] == "interpolated"
    # a power-law rise is interpolated exactly; only the rounding of the two probes around it remains
    assert plane.spec["span"] == pytest.approx(expected, rel=4 * tol * (target + centre_loss) / (target - centre_loss))
    np.testing.assert_array_equal(plane.x, np.linspace(-plane.spec["span"], plane.spec["span"], 5))
    assert not plane.diagnostics.fired


def test_auto_span_is_capped_on_a_nearly_flat_bowl_whose_plane_is_then_flat():
    model, x, y, centre_loss = least_squares(1.0, signal=1e-4)  # k ~ 1e-8 L0: the loss hardly moves
    plane = random_plane(model, Evaluator(model, (x, y), loss="mse"), resolution=5, span="auto")
    assert (plane.spec["span"], plane.spec["span_rule"]["outcome"]) == (PROBE_DISTANCES[-1], "capped")
    assert plane.diagnostics.flat and plane.diagnostics.relative_range < FLAT_RELATIVE
    assert diagnostics_note(plane).startswith("flat: the loss varies by")


def test_the_rules_edge_cases():
    d = np.array(PROBE_DISTANCES)
    assert choose_span(d, np.full(len(d), 5.0), 1.0) == (d[0], "floored")
    assert choose_span(d, np.full(len(d), 0.5), 1.0) == (d[-1], "capped")
    overflow = np.where(d < 1.0, 0.1, np.inf)  # the first probe past the target overflowed
    assert choose_span(d, overflow, 1.0) == (0.5, "overflow")
    dip = np.where(d < 0.5, -0.2, 3.0)  # the loss falls first (not at a minimum): linear in (t, rise)
    span, outcome = choose_span(d, dip, 1.0)
    assert outcome == "interpolated" and span == pytest.approx(0.25 + 1.2 / 3.2 * 0.25, rel=1e-15)


# ---------------------------------------------------------------- diagnostics

def test_a_flat_grid_fires_flat_and_nothing_else():
    loss = 0.7 + 1e-5 * bowl()
    diag = grid_plane(loss).diagnostics
    assert diag.flat and not (diag.saturated or diag.centre_not_minimum) and diag.nonfinite_share == 0
    assert list(diag.messages) == ["flat"]


def test_non_finite_losses_are_counted():
    loss = bowl(5)
    loss[0, :3], loss[4, 3:] = np.nan, np.inf
    plane = grid_plane(loss)
    diag = plane.diagnostics
    assert diag.nonfinite_share == 5 / 25 and diag.saturated_share == 5 / 25 and not diag.saturated
    assert diag.messages["nonfinite"] == "non-finite: 20.0% of the grid's losses are NaN or inf"
    assert diagnostics_note(plane) == ""  # the title already counts the masked points


def test_a_minimum_off_the_centre_fires_and_names_where():
    plane = grid_plane(bowl(centre=(0.6, -0.4)))
    diag = plane.diagnostics
    assert diag.centre_not_minimum and diag.lowest == pytest.approx((0.6, -0.4, 0.5))
    assert diag.centre_loss == pytest.approx(0.5 + 0.36 + 0.16)
    assert diag.messages["centre"] == "centre not the minimum: loss 0.5 at (0.6, -0.4) against 1.02 at the centre"
    # within the tolerance, and for a plane through three models (whose origin is just one of them), no note
    near = grid_plane(bowl() - (CENTRE_TOLERANCE / 2) * 0.5 * (np.arange(121).reshape(11, 11) == 61))
    assert not near.diagnostics.centre_not_minimum
    assert not grid_plane(bowl(centre=(0.6, -0.4)), kind="plane").diagnostics.centre_not_minimum


def test_a_plateau_of_huge_losses_or_a_collapsed_accuracy_fires_saturated():
    loss = np.full((11, 11), 0.1 * SATURATED_FACTOR * 2 + 10.0)
    loss[4:7, 4:7] = 0.1  # the basin: 9 cells of 121
    diag = grid_plane(loss).diagnostics
    assert diag.saturated and not diag.accuracy_collapsed and diag.saturated_share == pytest.approx(112 / 121)
    accuracy = np.full((11, 11), 0.1)
    accuracy[5, 5] = 0.97
    collapsed = grid_plane(bowl(), accuracy=accuracy).diagnostics
    assert collapsed.saturated and collapsed.accuracy_collapsed and collapsed.saturated_share == 0
    assert collapsed.messages["saturated"].startswith("saturated: the accuracy off the centre has collapsed")


def test_a_trained_models_plane_fires_none_also_when_read_back_from_its_record(digits, trained_mlps):
    model = trained_mlps[0]
    plane = random_plane(model, Evaluator(model, digits), resolution=11, span="auto", seed=2)
    diag = plane.diagnostics
    assert isinstance(diag, PlaneDiagnostics) and not diag.fired and diag.notes == [], diag
    assert plane.spec["span_rule"]["outcome"] == "interpolated"
    arrays, attrs = plane.to_record()
    assert "diagnostics" not in arrays and "diagnostics" not in attrs  # the cache format is unchanged
    assert PlaneResult.from_record(arrays, attrs).diagnostics == diag
    assert plane_figure(plane).get_supxlabel() == ""


# ---------------------------------------------------------------- VTK

def read_vtk(path) -> dict:
    """A reader of the legacy ASCII structured grids written here, from the VTK file-format specification."""
    lines = open(path, encoding="ascii").read().splitlines()
    assert lines[0] == "# vtk DataFile Version 3.0" and len(lines[1]) <= 256
    assert lines[2] == "ASCII" and lines[3] == "DATASET STRUCTURED_GRID"
    tokens = " ".join(lines[4:]).split()
    assert tokens[0] == "DIMENSIONS"
    dims = tuple(int(t) for t in tokens[1:4])
    assert tokens[4] == "POINTS" and tokens[6] in ("float", "double")
    n = int(tokens[5])
    assert n == dims[0] * dims[1] * dims[2]
    points = np.array(tokens[7:7 + 3 * n], dtype=np.float64).reshape(n, 3)
    pos = 7 + 3 * n
    assert tokens[pos:pos + 2] == ["POINT_DATA", str(n)]
    pos += 2
    scalars = {}
    while pos < len(tokens):
        assert tokens[pos] == "SCALARS" and tokens[pos + 3] == "1" and tokens[pos + 4:pos + 6] == ["LOOKUP_TABLE",
                                                                                                   "default"]
        scalars[tokens[pos + 1]] = np.array(tokens[pos + 6:pos + 6 + n], dtype=np.float64)
        pos += 6 + n
    return {"dims": dims, "points": points, "scalars": scalars}


def test_vtk_round_trip_with_non_finite_losses(run_plane, tmp_path):
    plane, _ = run_plane
    loss = plane.loss.copy()
    loss[0, 0], loss[2, 3] = np.nan, np.inf
    plane = dataclasses.replace(plane, loss=loss)
    data = read_vtk(plane.to_vtk(tmp_path / "plane.vtk"))
    ny, nx = loss.shape
    assert data["dims"] == (nx, ny, 1)
    gx, gy = np.meshgrid(plane.x, plane.y)
    finite = np.isfinite(loss)
    filled = np.where(finite, loss, loss[finite].max())  # the documented replacement
    np.testing.assert_array_equal(data["points"], np.stack([gx.ravel(), gy.ravel(), filled.ravel()], axis=1))
    np.testing.assert_array_equal(data["scalars"]["loss"], filled.ravel())
    np.testing.assert_array_equal(data["scalars"]["accuracy"], plane.accuracy.ravel())
    np.testing.assert_array_equal(data["scalars"]["finite"], finite.ravel().astype(float))
    flat = read_vtk(plane.to_vtk(tmp_path / "flat.vtk", flat=True))
    np.testing.assert_array_equal(flat["points"][:, 2], 0.0)
    assert sorted(os.listdir(tmp_path)) == ["flat.vtk", "plane.vtk"]


def test_vtk_writer_refuses_a_symlinked_target_or_folder(run_plane, tmp_path):
    plane, _ = run_plane
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "plane.vtk").symlink_to(victim)
    with pytest.raises(FileWriteError, match="link"):
        plane.to_vtk(tmp_path / "plane.vtk")
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "linked").symlink_to(real, target_is_directory=True)
    with pytest.raises(FileWriteError, match="link"):
        plane.to_vtk(tmp_path / "linked" / "plane.vtk")
    assert victim.read_text() == "keep me" and os.listdir(real) == []
    assert sorted(os.listdir(tmp_path)) == ["linked", "plane.vtk", "real", "victim.txt"]
    tally("hostile files refused", 2)


# ---------------------------------------------------------------- trajectory overlay

def test_plotly_surface_overlays_the_runs_global_models(fedavg_run, run_plane):
    plane, evaluator = run_plane
    models = [fedavg_run.global_state(r) for r in fedavg_run.rounds]
    losses = evaluator.evaluate(models).loss
    coords = [plane.coordinates(m) for m in models]
    trajectory = {f"round {r}": (*xy, z) for r, xy, z in zip(fedavg_run.rounds, coords, losses)}
    fig = plane_plotly(plane, kind="surface", trajectory=trajectory, trajectory_label="global model")
    [trace] = [t for t in fig.data if t.name == "global model"]
    assert trace.type == "scatter3d" and trace.mode == "lines+markers"
    np.testing.assert_array_equal(trace.x, [c[0] for c in coords])
    np.testing.assert_array_equal(trace.y, [c[1] for c in coords])
    np.testing.assert_array_equal(trace.z, losses)
    assert "round 2" in trace.hovertext[2]
    # without z the points sit on the surface: at a grid node, the grid's own loss
    nodes = [(plane.x[1], plane.y[2]), (plane.x[4], plane.y[4])]
    on_surface = plane_plotly(plane, kind="surface", trajectory=nodes).data[-1]
    np.testing.assert_allclose(on_surface.z, [plane.loss[2, 1], plane.loss[4, 4]], rtol=1e-12)
    line = plane_figure(plane, kind="surface", trajectory=trajectory).axes[0].lines[-1]
    np.testing.assert_array_equal(line.get_data_3d()[2], losses)


def test_a_fired_diagnostic_is_noted_in_both_figures():
    plane = grid_plane(bowl(centre=(0.6, -0.4)))
    note = diagnostics_note(plane)
    assert note.startswith("centre not the minimum")
    assert note.replace("\n", " ") == plane_figure(plane).get_supxlabel().replace("\n", " ")
    assert plane_plotly(plane).layout.title.text.endswith(f"<sup>{note}</sup>")
    assert note in Report("planes").add_plotly(plane_plotly(plane, kind="surface")).to_html()
    assert plane_figure(grid_plane(bowl())).get_supxlabel() == "" and diagnostics_note(grid_plane(bowl())) == ""


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("span, message", [
    ("autox", "span must be a positive number or 'auto', got 'autox'"),
    (0, "span must be > 0 (the grid's half-width in direction units), got 0; or pass span='auto'"),
    (-1.5, "span must be > 0"),
    (float("nan"), "span must be a positive finite number"),
    (True, "span must be a positive finite number"),
])
def test_bad_spans_are_refused_before_any_evaluation(span, message):
    model, x, y, _ = least_squares(0.1)
    evaluator = Evaluator(model, (x, y), loss="mse")
    with pytest.raises(ConfigError) as err:
        random_plane(model, evaluator, span=span)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert evaluator.points_evaluated == 0
    tally("bad inputs rejected")


def test_bad_vtk_paths_and_trajectories_are_refused(tmp_path):
    plane = grid_plane(bowl(5))
    with pytest.raises(ConfigError, match=r"plane\.vts: a VTK legacy file ends in \.vtk"):
        plane.to_vtk(tmp_path / "plane.vts")
    with pytest.raises(ConfigError, match="there is no surface to export"):
        grid_plane(np.full((3, 3), np.nan)).to_vtk(tmp_path / "nan.vtk")
    for bad in ([], [(0.1,)], [(0.0, float("nan"))], [(0, 0), (1, 2, 3, 4)], ["ab"]):
        with pytest.raises(ConfigError, match="trajectory must be a non-empty sequence of"):
            plane_plotly(plane, kind="surface", trajectory=bad)
    assert os.listdir(tmp_path) == []
    tally("bad inputs rejected", 7)
