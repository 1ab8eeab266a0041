"""Learned Bezier curves, polygonal chains and simplexes between models."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import landscape
from fl.datasets import load_dataset
from fl.models import MLP
from landscape.connectivity.curves import curve, curve_plane
from landscape.connectivity.simplex import simplex
from landscape.results.connectivity import CurveResult, SimplexResult
from landscape.results.curve_shapes import coefficients

from conftest import FLOAT64_UNIT_ROUNDOFF, float32_tolerance, train_digits_mlp


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    data = load_dataset("digits")
    a, b = train_digits_mlp(data, 0, width=16), train_digits_mlp(data, 1, width=16)
    ev = landscape.Evaluator(a, (data.test_x, data.test_y), device="cpu")
    return data, a, b, ev


#: Terms summed by the evaluator for the zoo MLP (fan-ins 64, 16, 16) and the 360 test digits in float32.
FORWARD_AND_SUM = 64 + 16 + 16 + 360


def test_curve_coefficients_match_garipov_formulas() -> None:
    t = np.array([0.0, 0.25, 0.5, 0.8, 1.0])
    bez = coefficients("bezier", t, 3)
    assert np.allclose(bez, np.stack([(1 - t) ** 2, 2 * t * (1 - t), t ** 2], axis=1))
    chain = coefficients("polychain", t, 3)
    first = t <= 0.5  # 2(t theta + (0.5 - t) a), then 2((t - 0.5) b + (1 - t) theta)
    expected = np.where(first[:, None], np.stack([2 * (0.5 - t), 2 * t, 0 * t], 1),
                        np.stack([0 * t, 2 * (1 - t), 2 * (t - 0.5)], 1))
    assert np.allclose(chain, expected)
    for kind in ("bezier", "polychain"):  # knots evenly spaced on a line reproduce the line
        c = coefficients(kind, t, 5)
        assert np.allclose(c.sum(1), 1.0) and np.allclose(c @ (np.arange(5) / 4), t)


def test_curves_keep_endpoints_and_beat_the_line(pair) -> None:
    data, a, b, ev = pair
    va, vb = ev.vector(a).numpy(), ev.vector(b).numpy()
    for kind in ("bezier", "polychain"):
        result = curve(a, b, ev, kind=kind, train_data=(data.train_x, data.train_y), epochs=8, seed=0)
        assert np.array_equal(result.knots[0], va) and np.array_equal(result.knots[-1], vb)
        assert np.array_equal(result.point(0.0), va) and np.array_equal(result.point(1.0), vb)
        # the curve's endpoints come from a matrix product with the knots, the line's from a + alpha (b - a) with
        # the input-layer shortcut (2 terms); then the MLP's dot products and the float32 loss sum
        tol = float32_tolerance(3 + 2 + FORWARD_AND_SUM)
        assert result.loss[0] == pytest.approx(result.line_loss[0], rel=tol) and result.loss[-1] == pytest.approx(
            result.line_loss[-1], rel=tol)
        assert result.loss.max() < result.line_loss.max(), kind
        assert result.loss_barrier < result.line_loss_barrier
        assert len(result.history) == 8 and result.bends.shape == (1, va.size)
        text = repr(result)  # a summary: barriers and array shapes, never array contents
        assert len(text) < 400 and "loss_barrier=" in text and "knots=array(3, " in text
        assert "line_loss_barrier" in result._repr_html_() and "<table>" in result._repr_html_()
    # the curve's point at t is what the evaluator sees there
    mid = ev.evaluate(torch.from_numpy(result.point(0.5)))
    # one point's vector from a one-row product with the 3 knots, the curve's from a 21-row one (other rounding)
    assert float(mid.loss[0]) == pytest.approx(float(result.loss[10]), rel=float32_tolerance(3 + FORWARD_AND_SUM))


def test_untrained_curve_is_the_line(pair) -> None:
    data, a, b, ev = pair
    result = curve(a, b, ev, kind="bezier", train_data=(data.train_x, data.train_y), epochs=0, points=11)
    # the curve's points combine 3 knots, the line's points 2 terms with the input-layer shortcut
    assert np.allclose(result.loss, result.line_loss, rtol=float32_tolerance(3 + 2 + FORWARD_AND_SUM), atol=0)


def test_curve_plane_places_endpoints_and_bend(pair) -> None:
    data, a, b, ev = pair
    result = curve(a, b, ev, train_data=(data.train_x, data.train_y), epochs=2)
    grid = curve_plane(result, ev, resolution=5)
    assert grid.models["a"] == [0.0, 0.0]
    dist = float(np.linalg.norm(result.knots[-1] - result.knots[0]))
    # float64 norms over the 1,482 parameters, summed in other orders
    assert grid.models["b"][0] == pytest.approx(dist, rel=float32_tolerance(1482, unit=FLOAT64_UNIT_ROUNDOFF))
    # a quadratic Bezier curve lies in the plane through its knots
    assert grid.project(result.point(0.3))[2] < 1e-6 * dist


def test_results_round_trip_through_the_cache(pair, tmp_path) -> None:
    data, a, b, ev = pair
    result = curve(a, b, ev, train_data=(data.train_x, data.train_y), epochs=1, points=5)
    cache = landscape.Cache(tmp_path / "r.h5")
    cache.save_result("curve", result)
    back = cache.load_result("curve")
    assert isinstance(back, CurveResult) and back == result and back.loss_barrier == result.loss_barrier


def test_simplex_connects_two_models(pair) -> None:
    data, a, b, ev = pair
    result = simplex([a, b], ev, train_data=(data.train_x, data.train_y), extra=1, epochs=8, samples=16)
    assert isinstance(result, SimplexResult)
    assert np.array_equal(result.vertices[0], ev.vector(a).numpy())
    assert np.array_equal(result.vertices[1], ev.vector(b).numpy())
    assert result.coords.shape == (3 + 2 + 16, 3) and np.allclose(result.coords.sum(1), 1.0)
    assert (result.coords[:, 0] * result.coords[:, 1] == 0).all()  # no point on the a-b edge
    line = landscape.interpolate(a, b, ev, alphas=11)
    assert result.loss_barrier < line.loss_barrier
    # barrier as an independent computation at the worst point
    worst = int(np.argmax(result.loss - result.coords @ result.vertex_loss))
    point = torch.from_numpy(result.coords[worst] @ result.vertices)
    loss = float(ev.evaluate(point).loss[0])
    # the point's vector from a one-row product with the 3 vertices against the simplex's own; the barrier is a
    # difference of losses, so its tolerance is absolute at the loss's size
    assert result.loss_barrier == pytest.approx(loss - result.coords[worst] @ result.vertex_loss, rel=0,
                                                abs=float32_tolerance(3 + FORWARD_AND_SUM) * loss)
    assert "vertices=array(3, " in repr(result) and len(repr(result)) < 400


def test_connected_by_curve_verdict(pair) -> None:
    from landscape.claims.connectivity import connected_by_curve

    data, a, b, ev = pair
    verdict = connected_by_curve(a, b, ev, train_data=(data.train_x, data.train_y), threshold=0.05, metric="accuracy",
                                 epochs=8, points=11)
    curve_result = verdict.results["curve"]
    assert verdict.numbers["curve_accuracy_barrier"] == curve_result.accuracy_barrier
    assert verdict.numbers["line_accuracy_barrier"] > 0.3  # the straight line crosses a barrier
    assert verdict.holds == (curve_result.accuracy_barrier <= 0.05)
    assert "straight line" in verdict.reason


def test_connectivity_figures_render_from_real_results(pair, tmp_path) -> None:
    import figures
    from figures.connectivity import (
        alignment_figure,
        alignment_plotly,
        curve_figure,
        curve_plane_figure,
        curve_plane_plotly,
        curve_plotly,
        curve_trace,
    )
    from landscape.claims.connectivity import connected_modulo_permutation

    data, a, b, ev = pair
    verdict = connected_modulo_permutation(a, b, ev, data=(data.train_x, data.train_y), alphas=11)
    fig = alignment_figure(verdict)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert any(label.startswith("aligned + REPAIR") for label in labels) and any(
        label.startswith("before") for label in labels)
    assert {t.name for t in alignment_plotly(verdict).data} >= {"before", "aligned", "aligned + REPAIR"}
    result = curve(a, b, ev, train_data=(data.train_x, data.train_y), epochs=4, points=11)
    fig = curve_figure(result)
    assert fig.axes[0].get_xlabel().startswith("t") and len(fig.axes) == 2
    curve_line = fig.axes[0].get_lines()[0]
    assert np.array_equal(curve_line.get_ydata(), result.loss)  # drawn as computed
    assert {t.name for t in curve_plotly(result).data} >= {"bezier curve", "straight line"}
    grid = curve_plane(result, ev, resolution=7)
    trace = curve_trace(grid, result, points=5)
    # the origin projects to exactly 0; b by float64 dot products over the 1,482 parameters against its stored place
    at_b = float32_tolerance(1482, unit=FLOAT64_UNIT_ROUNDOFF) * grid.models["b"][0]
    assert np.array_equal(trace[0], [0.0, 0.0]) and np.allclose(trace[-1], grid.models["b"], rtol=0, atol=at_b)
    fig = curve_plane_figure(grid, result)
    drawn = [line for line in fig.axes[0].get_lines() if line.get_label() == "bezier curve"]
    assert drawn and np.array_equal(drawn[0].get_xdata()[[0, -1]], trace[[0, -1], 0])  # drawn as computed
    assert "bezier curve" in {t.name for t in curve_plane_plotly(grid, result).data}
    out = figures.save(fig, tmp_path / "plane.png")
    assert (tmp_path / "plane.png").stat().st_size > 1000, out


def test_command_entry_points_write_and_summarise(pair, tmp_path) -> None:
    from landscape_cli.connectivity_commands import align_file, curve_summary

    data, a, b, ev = pair
    info = align_file(b, a, tmp_path / "b_aligned.safetensors", template=a)
    aligned = landscape.load_state_dict(info["out"])
    copy_ = MLP((1, 8, 8), 10, hidden=(16, 16))
    copy_.load_state_dict(aligned)
    with torch.no_grad():
        # permuted hidden units sum the two 16-unit layers' dot products in another order
        tol = float32_tolerance(16 + 16)
        assert torch.allclose(copy_(data.test_x), b(data.test_x), rtol=tol, atol=tol * b(data.test_x).abs().max())
    assert info["units"] == 32 and 0 < info["units_moved"] <= 32 and info["objective"] >= info["objective_before"]
    summary = curve_summary(a, b, ev, train_data=(data.train_x, data.train_y), epochs=1, points=5,
                            cache=tmp_path / "c.h5")
    stored = landscape.Cache(tmp_path / "c.h5").load_result(summary["key"])
    assert stored.loss_barrier == summary["loss_barrier"] and len(summary["history"]) == 1


@pytest.mark.parametrize("name", ["mnist1d_mlp", "mnist1d_cnn", "fedgucci_cnn", "floco_cnn", "ima_cnn",
                                  "resnet20_bn", "resnet20_gn"])
def test_curves_and_simplexes_train_on_zoo_models(name: str) -> None:
    """The curve and simplex machinery runs on the zoo's architectures (no curve version of any of them).

    Endpoints stay exact, every point is finite, training moves the bend. (ima_digit_cnn and
    resnet18_gn work the same but take 6 s and 70 s on a CPU core.)
    """
    from fl.models import build_model

    shape = (1, 40) if name.startswith("mnist1d") else (1, 8, 8)
    a, b = (build_model(name, num_classes=10, input_shape=shape, seed=s) for s in (0, 1))
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, *shape, generator=gen), torch.randint(0, 10, (32,), generator=gen)
    ev = landscape.Evaluator(a, (x, y), device="cpu", bn="recompute" if name.endswith("_bn") else "interpolate",
                             bn_data=(x, y) if name.endswith("_bn") else None)
    result = curve(a, b, ev, train_data=(x, y), epochs=1, batch_size=16, points=3)
    assert np.array_equal(result.knots[0], ev.vector(a).numpy()) and np.isfinite(result.loss).all()
    assert not np.allclose(result.knots[1], 0.5 * (result.knots[0] + result.knots[2]))
    complex_ = simplex([a, b], ev, train_data=(x, y), epochs=1, batch_size=16, samples=2)
    assert np.array_equal(complex_.vertices[1], ev.vector(b).numpy()) and np.isfinite(complex_.loss).all()


def test_bad_arguments_give_specific_errors(pair) -> None:
    from landscape.alignment.align import align

    data, a, b, ev = pair
    train = (data.train_x, data.train_y)
    with pytest.raises(landscape.ConfigError, match="kind must be one of"):
        curve(a, b, ev, kind="spline", train_data=train)
    with pytest.raises(landscape.ConfigError, match="bends >= 1"):
        curve(a, b, ev, train_data=train, bends=0)
    with pytest.raises(landscape.ConfigError, match="lr > 0"):
        curve(a, b, ev, train_data=train, lr=0.0)
    with pytest.raises(landscape.DataError, match="inputs but"):
        curve(a, b, ev, train_data=(data.train_x, data.train_y[:5]))
    with pytest.raises(landscape.ConfigError, match="unknown alignment method 'optimal transport'; available: "
                                                     "activation, weight"):
        align(b, to=a, method="optimal transport")
    with pytest.raises(landscape.ConfigError, match="pass data="):
        align(b, to=a, method="activation")
    with pytest.raises(landscape.ConfigError, match="template="):
        align(b.state_dict(), to=a.state_dict())
    with pytest.raises(landscape.ConfigError, match="at least one fixed"):
        simplex([], ev, train_data=train)


def test_public_names_are_exported_from_landscape() -> None:
    from landscape.connectivity import align, align_group, repaired_interpolate

    assert landscape.curve is curve and landscape.simplex is simplex and landscape.align is align
    assert landscape.align_group is align_group and landscape.repaired_interpolate is repaired_interpolate
    assert landscape.CurveResult is CurveResult and landscape.SimplexResult is SimplexResult
    assert issubclass(landscape.PermutationError, landscape.ConfigError)


def test_a_cached_curve_reads_back_in_a_fresh_process(tmp_path):
    """The cache finds result types of modules the reading process has not imported yet."""
    import subprocess
    import sys
    import textwrap

    write = textwrap.dedent(f"""
        import torch, landscape
        from torch import nn
        torch.manual_seed(0)
        x = torch.randn(64, 4); y = (x[:, 0] > 0).long()
        a, b = (nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)) for _ in range(2))
        from landscape_cli.connectivity_commands import curve_summary
        s = curve_summary(a, b, landscape.Evaluator(a, (x, y), device="cpu"), train_data=(x, y), epochs=1,
                          cache={str(tmp_path / "c")!r}, key="k1")
        print(s["key"])
    """)
    read = textwrap.dedent(f"""
        import sys, landscape
        r = landscape.Cache({str(tmp_path / "c")!r}).load_result("k1")
        assert "landscape.connectivity" not in sys.modules or type(r).__name__ == "CurveResult"
        print(type(r).__name__, len(r.t))
    """)
    for code, expected in ((write, "k1"), (read, "CurveResult 21")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == expected, out.stderr[-2000:]
