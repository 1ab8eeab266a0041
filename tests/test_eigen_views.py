"""Eigen-direction views (``eigen_line``, ``eigen_plane``) and curvature per block (``curvature_by_block``).

The reference is independent of the curvature package: the dense Hessian, gradient and loss of a
tiny float64 network from ``torch.autograd.functional`` on its flattened parameters, and numpy's
``eigh`` / ``eigvalsh`` / ``trace`` on it and on its diagonal blocks.
"""
from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call

import landscape
from landscape.cache.store import Cache
from landscape.curvature import registry
from landscape.curvature.hessian import HessianOperator
from landscape.results.curvature_views import BlockCurvature

from fault_counts import tally

#: the eigen-solver's tolerance in these tests (residual <= TOL |theta|, Bauer-Fike)
TOL = 1e-10
SOLVER = dict(tol=TOL, max_iter=200)


class Tiny(nn.Module):
    """4 -> 5 (tanh) -> 3: 43 parameters in four tensors, a non-convex loss."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 5)
        self.fc2 = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


class Dense:
    """Loss, gradient and Hessian of the tiny network's mean cross-entropy over flat parameters."""

    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model, self.x, self.y = model, x, y
        self.state = {k: v.detach() for k, v in model.state_dict().items()}
        self.names = [k for k, _ in model.named_parameters()]
        self.sizes = [self.state[k].numel() for k in self.names]
        self.flat = torch.cat([self.state[k].reshape(-1) for k in self.names])
        self.hessian = torch.autograd.functional.hessian(self.loss, self.flat).numpy()
        self.gradient = torch.autograd.functional.jacobian(self.loss, self.flat).numpy()
        self.values, self.vectors = np.linalg.eigh(self.hessian)  # ascending

    def loss(self, flat: torch.Tensor) -> torch.Tensor:
        parts = {k: p.reshape(self.state[k].shape) for k, p in zip(self.names, torch.split(flat, self.sizes))}
        return nn.functional.cross_entropy(functional_call(self.model, {**self.state, **parts}, (self.x,)), self.y)

    def block(self, names: list[str]) -> np.ndarray:
        """Indices of the named tensors in the flat vector."""
        offsets = np.cumsum([0] + self.sizes)
        return np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i, n in enumerate(self.names) if n in names])


def refuse(*args, **kwargs):
    """Stands in for a computation that must not run (the result is cached or given)."""
    raise AssertionError("computed although the result was cached or given")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = Tiny().double()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=g)
    ev = landscape.Evaluator(model, (x, y), dtype=torch.float64, device="cpu")
    dense = Dense(model, x, y)
    assert ev.space.names == dense.names  # the flat layouts agree (no buffers)
    return model, ev, dense


# ------------------------------------------------------------------------------- eigen line
def test_eigen_line_direction_is_the_top_eigenvector_up_to_sign(tiny):
    model, ev, dense = tiny
    line = landscape.eigen_line(model, ev, span=0.1, resolution=21, **SOLVER)
    top = dense.vectors[:, -1]
    assert abs(float(line.direction @ top)) == pytest.approx(1.0, abs=1e-9)
    assert np.linalg.norm(line.direction) == pytest.approx(1.0, abs=1e-12)
    assert line.direction[np.argmax(np.abs(line.direction))] > 0  # the sign is fixed, not the solver's
    assert line.eigenvalue == pytest.approx(dense.values[-1], rel=1e-8)
    assert line.curvature == pytest.approx(dense.values[-1], rel=1e-8)  # d^T H d of the unit eigenvector
    assert line.spec["kind"] == "eigen_line" and line.spec["directions"] == "hessian"
    assert line.spec["normalization"] == "none"


def test_eigen_line_loss_matches_the_quadratic_model_to_second_order(tiny):
    model, ev, dense = tiny
    line = landscape.eigen_line(model, ev, span=0.2, resolution=41, **SOLVER)
    d = torch.from_numpy(line.direction)
    # the loss the evaluator measured is the dense loss at w + t d
    direct = [float(dense.loss(dense.flat + float(t) * d)) for t in line.t]
    np.testing.assert_allclose(line.loss, direct, rtol=1e-12)
    # the prediction is L(w) + t g.d + t^2 lambda / 2 from the dense gradient and eigenvalue
    expected = float(dense.loss(dense.flat)) + line.t * float(dense.gradient @ line.direction) \
        + 0.5 * dense.values[-1] * line.t ** 2
    np.testing.assert_allclose(line.predicted, expected, rtol=1e-9, atol=1e-12)
    # the remainder is third order: halving t divides it by about 8
    centre = len(line.t) // 2
    assert line.t[centre] == 0.0 and line.gap[centre] == pytest.approx(0.0, abs=1e-12)
    for step in (4, 8):
        far, near = line.gap[centre + 2 * step], line.gap[centre + step]
        assert abs(far / near) == pytest.approx(8.0, rel=0.15)
    assert np.max(np.abs(line.gap[centre - 4:centre + 5])) < 1e-3 * np.max(np.abs(line.predicted - line.base_loss))


def test_filter_normalising_the_eigenvector_makes_a_non_eigenvector_direction(tiny):
    model, ev, dense = tiny
    line = landscape.eigen_line(model, ev, normalization="filter", span=0.1, resolution=5, **SOLVER)
    d, h = line.direction, dense.hessian
    w = dense.flat.numpy()
    for name, shape in (("fc1.weight", (5, 4)), ("fc2.weight", (3, 5))):
        idx = dense.block([name])
        np.testing.assert_allclose(np.linalg.norm(d[idx].reshape(shape), axis=1),
                                   np.linalg.norm(w[idx].reshape(shape), axis=1), rtol=1e-12)
    assert line.curvature == pytest.approx(float(d @ h @ d), rel=1e-9)
    rayleigh = float(d @ h @ d) / float(d @ d)
    assert np.linalg.norm(h @ d - rayleigh * d) > 0.1 * abs(rayleigh) * np.linalg.norm(d)  # not an eigenvector
    assert line.spec["normalization"] == "filter"


def test_a_given_eigen_is_used_and_not_recomputed(tiny, monkeypatch):
    model, ev, dense = tiny
    eig = landscape.hessian_eigen(model, ev, k=2, return_eigenvectors=True, **SOLVER)
    monkeypatch.setattr(registry.EIGEN_SOLVERS, "get", lambda name: refuse)
    swapped = dataclasses.replace(eig, values=eig.values[::-1].copy(), vectors=eig.vectors[::-1].copy())
    line = landscape.eigen_line(model, ev, eigen=swapped, span=0.1, resolution=5)
    assert abs(float(line.direction @ dense.vectors[:, -2])) == pytest.approx(1.0, abs=1e-9)
    assert line.curvature == pytest.approx(dense.values[-2], rel=1e-8)


def test_the_cached_eigenpairs_are_reused_and_normalisations_are_told_apart(tiny, tmp_path, monkeypatch):
    model, _, _ = tiny
    x, y = tiny[2].x, tiny[2].y
    ev = landscape.Evaluator(model, (x, y), dtype=torch.float64, device="cpu", cache=Cache(tmp_path / "cache"))
    first = landscape.eigen_line(model, ev, span=0.5, resolution=5, **SOLVER)
    filtered = landscape.eigen_line(model, ev, normalization="filter", span=0.5, resolution=5, **SOLVER)
    monkeypatch.setattr(registry.EIGEN_SOLVERS, "get", lambda name: refuse)
    again = landscape.eigen_line(model, ev, span=0.5, resolution=5, **SOLVER)  # eigenpairs from the cache
    np.testing.assert_array_equal(again.loss, first.loss)
    assert not np.allclose(filtered.loss, first.loss)
    assert (first.spec["normalization"], filtered.spec["normalization"]) == ("none", "filter")


# ------------------------------------------------------------------------------ eigen plane
def test_eigen_plane_axes_are_orthonormal_top_two_eigenvectors(tiny):
    model, ev, dense = tiny
    plane = landscape.eigen_plane(model, ev, span=0.3, resolution=5, **SOLVER)
    u, v = plane.u, plane.v
    assert u @ u == pytest.approx(1.0, abs=1e-12) and v @ v == pytest.approx(1.0, abs=1e-12)
    assert u @ v == pytest.approx(0.0, abs=1e-9)
    assert abs(float(u @ dense.vectors[:, -1])) == pytest.approx(1.0, abs=1e-9)
    assert abs(float(v @ dense.vectors[:, -2])) == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(plane.spec["eigenvalues"], dense.values[::-1][:2], rtol=1e-8)
    assert plane.spec["kind"] == "eigen_plane" and plane.models == {"center": [0.0, 0.0]}
    # a grid point is the dense loss at w + x u + y v
    iy, ix = 1, 4
    point = dense.flat + plane.x[ix] * torch.from_numpy(u) + plane.y[iy] * torch.from_numpy(v)
    assert plane.loss[iy, ix] == pytest.approx(float(dense.loss(point)), rel=1e-12)


def test_eigen_views_refuse_bad_options_in_one_line(tiny):
    model, ev, _ = tiny
    eig1 = landscape.hessian_eigen(model, ev, k=1, return_eigenvectors=True, **SOLVER)
    other = {k: v + 0.01 for k, v in model.state_dict().items()}
    cases = [
        (lambda: landscape.eigen_line(model, ev, normalization="unit"), "normalization must be one of"),
        (lambda: landscape.eigen_line(model, ev, span=0.0), "span must be a positive finite number"),
        (lambda: landscape.eigen_line(model, ev, span=float("nan")), "span must be a positive finite number"),
        (lambda: landscape.eigen_line(model, ev, resolution=1), "resolution must be at least 2"),
        (lambda: landscape.eigen_line(model, ev, eigen=dataclasses.replace(eig1, vectors=None)),
         "return_eigenvectors=True"),
        (lambda: landscape.eigen_plane(model, ev, eigen=eig1), "1 eigenpair.*compute it with k=2"),
        (lambda: landscape.eigen_line(other, ev, eigen=eig1), "another model"),
        (lambda: landscape.eigen_line(model, ev, eigen=eig1, params=["fc2.*"]), "eigen was computed for params=None"),
    ]
    for call, message in cases:
        with pytest.raises(landscape.ConfigError, match=message) as info:
            call()
        assert "\n" not in str(info.value)
    tally("bad inputs rejected", len(cases))


# --------------------------------------------------------------------------- per-block curvature
def test_block_eigenvalues_and_traces_equal_the_dense_diagonal_blocks(tiny):
    model, ev, dense = tiny
    table = landscape.curvature_by_block(model, ev, top_k=2, **SOLVER)
    assert table.labels == ["fc1", "fc2"] and table.sizes.tolist() == [25, 18]
    for i, module in enumerate(("fc1", "fc2")):
        idx = dense.block([f"{module}.weight", f"{module}.bias"])
        block = dense.hessian[np.ix_(idx, idx)]
        np.testing.assert_allclose(table.eigenvalues[i], np.linalg.eigvalsh(block)[::-1][:2], rtol=1e-8)
        # Hutch++'s sketch (100 // 3 = 33 vectors) spans each block: the trace is exact, stderr 0
        assert table.trace[i] == pytest.approx(np.trace(block), rel=1e-10)
        assert table.trace_stderr[i] == 0.0
    assert table.eigen_converged.all() and table.trace_converged.all()
    # the blocks partition the parameters: their traces add up to the full trace
    assert table.trace.sum() == pytest.approx(np.trace(dense.hessian), rel=1e-10)


def test_blocks_by_patterns_and_labels_are_the_dense_blocks_of_those_parameters(tiny):
    model, ev, dense = tiny
    table = landscape.curvature_by_block(model, ev, blocks={"weights": "*.weight", "biases": ["fc1.bias", "fc2.bias"]},
                                         top_k=9, trace=False, **SOLVER)
    assert table.labels == ["weights", "biases"] and table.sizes.tolist() == [35, 8]
    assert table.trace is None and "trace" not in table.rows()[0]
    for i, names in enumerate((["fc1.weight", "fc2.weight"], ["fc1.bias", "fc2.bias"])):
        idx = dense.block(names)
        top = np.linalg.eigvalsh(dense.hessian[np.ix_(idx, idx)])[::-1]
        k = min(9, len(idx))
        np.testing.assert_allclose(table.eigenvalues[i, :k], top[:k], rtol=1e-7, atol=1e-9 * abs(top[0]))
    assert np.isnan(table.eigenvalues[1, 8])  # the bias block has only 8 parameters
    listed = landscape.curvature_by_block(model, ev, blocks=["fc2.*"], trace=False, **SOLVER)
    idx = dense.block(["fc2.weight", "fc2.bias"])
    assert listed.labels == ["fc2.*"]
    assert listed.eigenvalues[0, 0] == pytest.approx(np.linalg.eigvalsh(dense.hessian[np.ix_(idx, idx)])[-1], rel=1e-8)


def test_hutchinson_block_trace_reports_its_standard_error(tiny):
    model, ev, dense = tiny
    table = landscape.curvature_by_block(model, ev, blocks=["fc1.*"], trace_method="hutchinson", trace_tol=0.05,
                                         trace_max_iter=400, **SOLVER)
    idx = dense.block(["fc1.weight", "fc1.bias"])
    exact = np.trace(dense.hessian[np.ix_(idx, idx)])
    assert table.trace_converged[0] and 0 < table.trace_stderr[0] <= 0.05 * abs(table.trace[0])
    assert abs(table.trace[0] - exact) < 5 * table.trace_stderr[0]


def test_frozen_modules_are_left_out_of_the_module_blocks(tiny):
    _, _, dense = tiny
    torch.manual_seed(0)
    model = Tiny().double()
    model.fc1.requires_grad_(False)
    ev = landscape.Evaluator(model, (dense.x, dense.y), dtype=torch.float64, device="cpu")
    assert landscape.curvature_by_block(model, ev, trace=False, **SOLVER).labels == ["fc2"]
    both = landscape.curvature_by_block(model, ev, trace=False, include_frozen=True, **SOLVER)
    assert both.labels == ["fc1", "fc2"]


class Gained(nn.Module):
    """A scalar gain owned by the root module in front of a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.tensor(1.5, dtype=torch.float64))
        self.fc = nn.Linear(4, 3).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.gain * x)


def test_parameters_of_the_root_module_form_their_own_block(tiny):
    _, _, data = tiny
    torch.manual_seed(1)
    model = Gained()
    ev = landscape.Evaluator(model, (data.x, data.y), dtype=torch.float64, device="cpu")
    dense = Dense(model, data.x, data.y)
    table = landscape.curvature_by_block(model, ev, top_k=2, **SOLVER)
    assert table.labels == ["(root)", "fc"] and table.sizes.tolist() == [1, 15]
    assert table.eigenvalues[0, 0] == pytest.approx(dense.hessian[0, 0], rel=1e-10)
    assert np.isnan(table.eigenvalues[0, 1]) and table.trace[0] == pytest.approx(dense.hessian[0, 0], rel=1e-10)
    idx = dense.block(["fc.weight", "fc.bias"])
    np.testing.assert_allclose(table.eigenvalues[1], np.linalg.eigvalsh(dense.hessian[np.ix_(idx, idx)])[::-1][:2],
                               rtol=1e-8)


def test_block_table_prints_aligned_renders_html_and_converts(tiny, monkeypatch):
    model, ev, _ = tiny
    table = landscape.curvature_by_block(model, ev, top_k=2, **SOLVER)
    lines = str(table).splitlines()
    assert lines[1].split() == ["block", "parameters", "lambda_1", "lambda_2", "trace", "trace_stderr", "converged"]
    assert len({len(line) for line in lines[1:]}) == 1  # every row as wide as the header: aligned
    assert lines[3].startswith("fc1 ") and lines[4].startswith("fc2 ")
    assert f"{table.eigenvalues[0, 0]:.4g}" in lines[3]
    html = table._repr_html_()
    assert html.count("<tr>") == 3 and "<th>lambda_2</th>" in html and ">fc2</td>" in html
    rows = table.rows()
    assert [r["block"] for r in rows] == ["fc1", "fc2"] and rows[1]["parameters"] == 18
    assert rows[0]["lambda_1"] == table.eigenvalues[0, 0] and rows[0]["converged"] is True
    assert BlockCurvature.from_record(*table.to_record()) == table
    monkeypatch.setitem(sys.modules, "pandas", None)  # pandas is optional: its absence is explained
    with pytest.raises(landscape.ConfigError, match="to_pandas needs pandas.*rows()"):
        table.to_pandas()


def test_block_table_round_trips_through_the_cache(tiny, tmp_path):
    model, ev, _ = tiny
    table = landscape.curvature_by_block(model, ev, trace=False, **SOLVER)
    cache = Cache(tmp_path / "cache")
    cache.save_result("blocks", table)
    assert cache.load_result("blocks") == table


def test_block_curvature_reads_each_block_from_the_cache(tiny, tmp_path, monkeypatch):
    model, _, dense = tiny
    ev = landscape.Evaluator(model, (dense.x, dense.y), dtype=torch.float64, device="cpu",
                             cache=Cache(tmp_path / "cache"))
    first = landscape.curvature_by_block(model, ev, **SOLVER)
    monkeypatch.setattr(HessianOperator, "__init__", refuse)
    assert landscape.curvature_by_block(model, ev, **SOLVER) == first


def test_unconverged_blocks_are_named_in_one_warning(tiny):
    model, ev, _ = tiny
    with pytest.warns(UserWarning, match=r"curvature_by_block: .*eigenvalues of \['fc1', 'fc2'\]") as record:
        table = landscape.curvature_by_block(model, ev, top_k=3, tol=1e-14, max_iter=3, trace=False)
    assert len(record) == 1 and not table.eigen_converged.any()
    assert "no" in str(table).splitlines()[3].split()[-1]


def test_bad_blocks_and_top_k_raise_config_error_in_one_line(tiny):
    model, ev, _ = tiny
    cases = [
        (dict(blocks=["fc1.*", "nope*"]), r"block 'nope\*': no trainable parameter matches \['nope\*'\]"),
        (dict(blocks={"head": "classifier.*"}), r"block 'head': no trainable parameter matches"),
        (dict(top_k=0), "top_k must be an integer >= 1"),
        (dict(top_k=1.5), "top_k must be an integer >= 1"),
        (dict(blocks="fc1.*"), r"a single pattern goes in a list: \['fc1.\*'\]"),
        (dict(blocks=[]), "blocks is empty"),
        (dict(blocks={"b": []}), "block 'b': patterns must be non-empty strings"),
        (dict(blocks=3), "blocks must be 'modules', a list of patterns or a mapping, got int"),
    ]
    for options, message in cases:
        with pytest.raises(landscape.ConfigError, match=message) as info:
            landscape.curvature_by_block(model, ev, **options)
        assert "\n" not in str(info.value)
    tally("bad inputs rejected", len(cases))


# ------------------------------------------------------------------------------- figure, example
def test_eigen_line_figures_draw_the_loss_and_its_quadratic_model(tiny, tmp_path):
    import figures

    model, ev, _ = tiny
    line = landscape.eigen_line(model, ev, span=0.5, resolution=9, **SOLVER)
    fig = figures.eigen_line_figure({"tiny": line})
    drawn = fig.axes[0].get_lines()
    np.testing.assert_array_equal(drawn[0].get_ydata(), line.loss)
    np.testing.assert_array_equal(drawn[1].get_ydata(), line.predicted)
    assert drawn[1].get_linestyle() == "--" and f"λ={line.eigenvalue:.4g}" in drawn[1].get_label()
    interactive = figures.eigen_line_plotly(line)
    assert [t.line.dash for t in interactive.data] == [None, "dash"]
    np.testing.assert_array_equal(interactive.data[1].y, line.predicted)
    png = figures.save(fig, tmp_path / "line.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(landscape.ConfigError, match="missing .*'predicted'"):
        figures.eigen_line_figure(landscape.interpolate(model, model, ev, alphas=3))


def test_the_example_runs_quick_and_reports_the_eigenvalue_as_the_slice_curvature(tmp_path):
    import json
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "examples" / "curvature_views.py"), "--quick", "--out",
                           str(tmp_path)], cwd=root, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = json.loads((tmp_path / "tables.json").read_text())["tables"]
    unit, filtered = tables["Top eigen-directions"]
    assert unit["d^T H d"] == pytest.approx(unit["lambda"], rel=1e-6) and unit["norm of d"] == pytest.approx(1.0)
    assert filtered["Rayleigh quotient"] < filtered["lambda"]  # no longer the top eigenvector
    blocks = tables["Hessian curvature by block (mnist1d_mlp)"]
    assert [row["block"] for row in blocks] == ["linear1", "linear2", "classifier"]
    assert "Hessian curvature by block" in proc.stdout
    for stem in ("eigen_line", "eigen_plane"):
        assert (tmp_path / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
