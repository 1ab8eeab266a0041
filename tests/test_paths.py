"""Interpolation paths and barriers (FedGuCci Eq. 3/4): closed-form cases, invariants, variants."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from landscape import ConfigError, Evaluator, PathResult, barrier_matrix, interpolate
from landscape.results.barriers import accuracy_barrier_curve, code_accuracy_barrier, loss_barrier_curve

from conftest import MLP_FAN_INS, float32_tolerance, make_linear, make_mlp


def _regression(seed: int = 0, n: int = 37):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=gen), torch.randn(n, 2, generator=gen)


def _residual_coefficients(a, b, x, y):
    """L(alpha) = A alpha^2 + B alpha + C for the MSE of a linear model along the path."""
    with torch.no_grad():
        ra, rb = (a(x) - y).double(), (b(x) - y).double()
    d = rb - ra
    return ((d ** 2).sum(1).mean().item(), 2 * (ra * d).sum(1).mean().item(), (ra ** 2).sum(1).mean().item())


def test_linear_regression_mse_curve_is_the_closed_form_quadratic():
    x, y = _regression()
    a, b = make_linear(1), make_linear(2)
    alphas = np.linspace(-0.5, 1.5, 9)
    path = interpolate(a, b, Evaluator(make_linear(0), (x, y), loss="mse", batch_size=10), alphas=alphas)
    qa, qb, qc = _residual_coefficients(a, b, x, y)
    # float32: the point's weights (2 terms), a residual (3 products, the bias, the target; doubled by the
    # square), its sum over 2 outputs and over a batch of 10 samples
    tol = float32_tolerance(2 + 2 * 5 + 2 + 10)
    np.testing.assert_allclose(path.loss, qa * alphas ** 2 + qb * alphas + qc, rtol=tol, atol=0)
    # convex in alpha: the curve above the chord is -A alpha (1 - alpha) on [0, 1]; barrier 0
    inside = alphas[(alphas >= 0) & (alphas <= 1)]
    scale = tol * np.abs(path.loss).max()  # the curve and barrier are differences of losses
    np.testing.assert_allclose(path.loss_curve, -qa * inside * (1 - inside), rtol=0, atol=scale)
    assert path.loss_barrier == pytest.approx(0.0, abs=scale)
    assert np.isnan(path.accuracy).all()  # regression targets have no accuracy


def test_concave_loss_has_closed_form_barrier_a_over_4():
    """With the per-sample loss -|f(x) - y|^2 the curve is +A alpha (1 - alpha): barrier A / 4."""
    x, y = _regression(1)
    a, b = make_linear(3), make_linear(4)

    def negative_mse(out: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return -((out - t) ** 2).sum(1)

    path = interpolate(a, b, Evaluator(make_linear(0), (x, y), loss=negative_mse), alphas=11)
    qa, _, _ = _residual_coefficients(a, b, x, y)
    # as above, with one batch of all 37 samples; the curve and barrier are differences of losses
    scale = float32_tolerance(2 + 2 * 5 + 2 + 37) * np.abs(path.loss).max()
    np.testing.assert_allclose(path.loss_curve, qa * path.alphas * (1 - path.alphas), rtol=0, atol=scale)
    assert path.loss_barrier == pytest.approx(qa / 4, rel=0, abs=scale)
    assert path.loss_barrier_midpoint == pytest.approx(qa / 4, rel=0, abs=scale)


def test_path_endpoints_equal_the_models_own_metrics(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y), batch_size=128)
    a, b = trained_mlps[:2]
    path = interpolate(a, b, ev, alphas=6)
    own = ev.evaluate([a, b])
    # the path's endpoint b is a + 1 (b - a) (2 terms), then the MLP's dot products and the float32 loss sum over
    # a batch of 128 round otherwise
    tol = float32_tolerance(2 + MLP_FAN_INS + 128)
    np.testing.assert_allclose(path.loss[[0, -1]], own.loss, rtol=tol, atol=0)
    np.testing.assert_allclose(path.accuracy[[0, -1]], own.accuracy, atol=1e-12)
    assert 0.0 <= path.accuracy_barrier <= 1.0
    assert path.loss_barrier >= 0.0
    # the paper's midpoint columns (FedGuCci Table 1, docs/barriers.md) by hand
    mid = ev.evaluate([{k: 0.5 * (a.state_dict()[k] + b.state_dict()[k]) for k in a.state_dict()}])
    i = int(np.flatnonzero(np.isclose(path.alphas, 0.4))[0])
    ind_acc = own.accuracy.mean()
    with pytest.raises(ValueError, match="not on the path grid"):
        path.loss_barrier_midpoint  # 0.5 is not on a 6-point grid
    path11 = interpolate(a, b, ev, alphas=11)
    assert path11.accuracy_barrier_midpoint == pytest.approx(1 - mid.accuracy[0] / ind_acc, abs=1e-12)
    # the 11-point grid takes the input-layer shortcut (a sum of 2 outputs); the state dicts' float32 average
    assert path11.loss_barrier_midpoint == pytest.approx(mid.loss[0] - own.loss.mean(), rel=0,
                                                         abs=float32_tolerance(2 + 2 + MLP_FAN_INS + 128) * mid.loss[0])
    # alpha 0.4 on both grids; only the 11-point grid takes the input-layer shortcut (>= 4 (k + 1) points)
    assert path.loss[i] == pytest.approx(path11.loss[4], rel=float32_tolerance(2 + MLP_FAN_INS + 128), abs=0)


def test_identical_models_have_zero_barriers(digits, trained_mlps):
    x, y = digits
    a = trained_mlps[0]
    path = interpolate(a, a.state_dict(), Evaluator(make_mlp(0), (x, y)), alphas=5)
    assert np.ptp(path.loss) == 0.0 and np.ptp(path.accuracy) == 0.0
    assert path.loss_barrier == 0.0 and path.accuracy_barrier == 0.0 and path.accuracy_barrier_code == 0.0


def test_barrier_definitions_on_hand_made_curves():
    alphas = np.array([0.0, 0.25, 0.5, 0.75, 1.0])
    acc = np.array([0.9, 0.5, 0.45, 0.58, 0.6])
    loss = np.array([1.0, 2.0, 1.5, 3.0, 2.0])
    path = PathResult(alphas=alphas, loss=loss, accuracy=acc)
    line_acc = 0.9 + alphas * (0.6 - 0.9)
    line_loss = 1.0 + alphas
    assert path.loss_barrier == pytest.approx(max(loss - line_loss))  # 3.0 - 1.75 at 0.75
    assert path.loss_barrier == pytest.approx(1.25)
    ratio = 1 - acc / line_acc
    assert path.accuracy_barrier == pytest.approx(ratio.max())
    assert path.accuracy_barrier_midpoint == pytest.approx(1 - 0.45 / 0.75)
    # code variant: the gap's argmax (alpha 0.25: gap 0.325) differs from the ratio's argmax
    gap = line_acc - acc
    assert np.argmax(gap) != np.argmax(ratio)
    assert path.accuracy_barrier_code == pytest.approx(gap[1] / line_acc[1])
    assert path.accuracy_barrier_code < path.accuracy_barrier


def test_barriers_ignore_points_outside_unit_interval_and_need_endpoints():
    path = PathResult(alphas=np.array([-0.5, 0.0, 0.5, 1.0, 1.5]), loss=np.array([9.0, 1.0, 1.0, 1.0, 9.0]),
                      accuracy=np.array([0.0, 1.0, 1.0, 1.0, 0.0]))
    assert path.loss_barrier == 0.0 and path.accuracy_barrier == 0.0
    with pytest.raises(ValueError, match="alpha = 0 and alpha = 1"):
        PathResult(alphas=np.array([0.0, 0.5]), loss=np.zeros(2), accuracy=np.ones(2)).loss_barrier


def test_nonfinite_points_are_reported():
    path = PathResult(alphas=np.linspace(0, 1, 3), loss=np.array([1.0, np.inf, 1.0]), accuracy=np.array([1, 0.5, 1]))
    assert path.loss_barrier == np.inf and path.nonfinite == 1
    nan = PathResult(alphas=np.linspace(0, 1, 3), loss=np.array([1.0, np.nan, 1.0]), accuracy=np.ones(3))
    assert np.isnan(nan.loss_barrier)


unit = st.floats(0.0, 1.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 12).flatmap(lambda n: st.tuples(arrays(np.float64, n, elements=unit),
                                                      arrays(np.float64, n, elements=st.floats(-1e3, 1e3)))))
def test_barrier_invariants(curves):
    acc, loss = curves
    alphas = np.linspace(0.0, 1.0, len(acc))
    lc, ac = loss_barrier_curve(alphas, loss), accuracy_barrier_curve(alphas, acc)
    assert lc[0] == 0.0 and abs(lc[-1]) <= 1e-9 * max(1.0, abs(loss).max())
    assert ac[0] == 0.0 and abs(ac[-1]) <= 1e-12
    path = PathResult(alphas=alphas, loss=loss, accuracy=acc)
    assert 0.0 <= path.accuracy_barrier <= 1.0
    assert 0.0 <= path.accuracy_barrier_code <= 1.0
    assert path.loss_barrier >= -1e-9 * max(1.0, abs(loss).max())
    assert code_accuracy_barrier(alphas, acc) <= path.accuracy_barrier + 1e-12


def test_barrier_matrix_matches_pairwise_paths(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y))
    mat = barrier_matrix(trained_mlps, ev, alphas=5, labels=["a", "b", "c"])
    assert np.array_equal(mat.loss_barrier, mat.loss_barrier.T) and np.all(np.diag(mat.loss_barrier) == 0)
    path = interpolate(trained_mlps[0], trained_mlps[2], ev, alphas=5)
    assert mat.loss_barrier[0, 2] == path.loss_barrier  # the same path by the same code
    assert mat.accuracy_barrier[2, 0] == path.accuracy_barrier
    assert mat.labels == ["a", "b", "c"]
    with pytest.raises(ConfigError):
        barrier_matrix(trained_mlps[:1], ev)


def test_alpha_grid_errors(digits):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y))
    with pytest.raises(ConfigError, match="at least 2"):
        interpolate(make_mlp(1), make_mlp(2), ev, alphas=1)
    with pytest.raises(ConfigError, match="finite"):
        interpolate(make_mlp(1), make_mlp(2), ev, alphas=[0.0, np.nan])
