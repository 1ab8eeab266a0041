"""Worst-case sharpness (``landscape.sharpness``) against closed forms and brute force.

Quadratic losses are real least-squares problems (a bias-free ``nn.Linear`` with the mean squared
error, float64), built so that ``L(w0 + e) - L(w0) = g^T e + e^T H e / 2`` exactly for a chosen
Hessian ``H``, gradient ``g`` and centre ``w0``. References: the trust-region (secular) equation
for L2 balls, the box's corners for L-infinity (a convex function's maximum over a box is at a
corner), the change of variables ``u = T^-1 e`` for adaptive sharpness, and a grid search over a
2-parameter subset of a trained network.
"""
from __future__ import annotations

import doctest
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from torch import nn

import landscape
import landscape.curvature.sharpness as sharpness_module
from figures import sharpness_figure, sharpness_plotly
from landscape import ConfigError, Evaluator, SharpnessResult, sharpness
from landscape.cache.store import Cache
from landscape.curvature.operators import CurvatureOperator

from conftest import make_bn_cnn, make_mlp, seeded_init_, train
from fault_counts import tally

ROOT = Path(__file__).resolve().parents[1]


def rotation(n: int, seed: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    return q


def quadratic(hessian: np.ndarray, centre: np.ndarray, gradient: np.ndarray, **options) -> tuple[nn.Module, Evaluator]:
    """Least squares ``L(w) = ||X w - y||^2 / n`` with ``2 X^T X / n = H`` and ``grad L(w0) = g``."""
    n = len(centre)
    vals, vecs = np.linalg.eigh(hessian)
    x = np.sqrt(n / 2) * (vecs * np.sqrt(vals)) @ vecs.T
    y = np.linalg.solve(x.T, n * (hessian @ centre - gradient) / 2)
    model = nn.Linear(n, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor(centre)[None])
    ev = Evaluator(model, (torch.tensor(x), torch.tensor(y)[:, None]), loss="mse", dtype=torch.float64,
                   device="cpu", progress=False, **options)
    return model, ev


def trust_region_max(hessian: np.ndarray, gradient: np.ndarray, rho: float) -> float:
    """``max_{||e|| <= rho} g^T e + e^T H e / 2`` for PSD ``H``.

    ``e = (mu I - H)^-1 g`` with ``mu > lambda_1`` solving the secular equation ``||e(mu)|| = rho`` (the easy
    case: ``g`` not orthogonal to the top eigenvector).
    """
    lam, q = np.linalg.eigh(hessian)
    gq = q.T @ gradient
    assert abs(gq[-1]) > 1e-3 * np.linalg.norm(gq)

    def secular(mu: float) -> float:
        return float(np.sum(gq ** 2 / (mu - lam) ** 2)) - rho ** 2

    gap = abs(gq[-1]) / rho  # at mu = lambda_1 + gap the top term alone is rho^2: secular >= 0
    mu = brentq(secular, lam[-1] + 0.999 * gap, lam[-1] + np.linalg.norm(gq) / rho + 1.0, xtol=1e-15, rtol=1e-15)
    e = q @ (gq / (mu - lam))
    return float(gradient @ e + e @ hessian @ e / 2)


HESSIAN = (rotation(5, 0) * np.array([5.0, 2.0, 1.0, 0.5, 0.1])) @ rotation(5, 0).T
CENTRE = np.array([0.8, -1.2, 0.5, 2.0, -0.3])


# ---------------------------------------------------------------------------- closed forms
def test_l2_sharpness_at_a_minimum_is_half_rho_squared_lambda_max():
    model, ev = quadratic(HESSIAN, CENTRE, np.zeros(5))
    rho = 0.3
    res = sharpness(model, ev, rho=rho, kind="l2", steps=40, return_perturbation=True)
    exact = rho ** 2 * 5.0 / 2
    # the ascent converges geometrically to the top eigenvector (40 steps: far below 1e-8 in the value)
    assert res.value == pytest.approx(exact, rel=1e-8) and res.value <= exact * (1 + 1e-12)
    assert res.sharpness == res.value  # the API contract's name
    assert res.second_order == pytest.approx(exact, rel=1e-10)  # a full Krylov space: Lanczos is exact
    assert res.lambda_converged and res.lambda_max == pytest.approx(5.0, rel=1e-10)
    assert res.perturbation_norm == pytest.approx(rho, rel=1e-12) and res.perturbation_l2 == pytest.approx(rho)
    top = rotation(5, 0)[:, 0]
    assert abs(res.perturbation @ top) == pytest.approx(rho, rel=1e-6)
    assert res.gradient_norm < 1e-12 and res.base_loss >= 0
    assert res.trajectory.shape == (3, 41) and res.step_lengths.shape == (3, 40)
    assert 1 + 3 <= res.passes <= 1 + 3 * 41  # the centre, each start, each step that moved


def test_l2_sharpness_off_a_minimum_solves_the_trust_region_problem():
    g = np.array([0.3, -0.2, 0.5, 0.1, -0.4])
    model, ev = quadratic(HESSIAN, CENTRE, g)
    for rho in (0.05, 0.5, 2.0):
        exact = trust_region_max(HESSIAN, g, rho)
        res = sharpness(model, ev, rho=rho, kind="l2", steps=60, restarts=4)
        assert res.value == pytest.approx(exact, rel=1e-7), rho
        assert res.value <= exact + 1e-12
        assert res.first_order == pytest.approx(rho * np.linalg.norm(g), rel=1e-10)
        # the second-order model is the loss itself: the bound holds and is tight only at small rho
        assert res.value <= res.quadratic_bound + 1e-12


def test_linf_sharpness_of_a_diagonal_quadratic_is_the_best_corner():
    a = np.array([3.0, 1.0, 0.5, 0.2])
    g = np.array([0.5, -0.8, 0.01, -0.02])  # |g_i| < a_i rho for the last two: their wrong corners are local maxima
    model, ev = quadratic(np.diag(a), np.array([0.5, -1.0, 1.5, 0.7]), g)
    rho = 0.2
    res = sharpness(model, ev, rho=rho, kind="linf", restarts=6, return_perturbation=True)
    assert res.value == pytest.approx(np.sum(np.abs(g) * rho + a * rho ** 2 / 2), rel=1e-12)
    np.testing.assert_array_equal(res.perturbation, rho * np.sign(g))
    assert res.perturbation_norm == pytest.approx(rho) and np.isnan(res.lambda_max) and np.isnan(res.second_order)
    assert res.first_order == pytest.approx(rho * np.abs(g).sum(), rel=1e-12)


def test_linf_sharpness_of_a_full_quadratic_is_the_best_of_the_box_corners():
    g = np.array([0.3, -0.2, 0.5, 0.1, -0.4])
    model, ev = quadratic(HESSIAN, CENTRE, g)
    rho = 0.4
    corners = rho * np.array(list(itertools.product((-1.0, 1.0), repeat=5)))
    exact = max(float(c @ g + c @ HESSIAN @ c / 2) for c in corners)
    res = sharpness(model, ev, rho=rho, kind="linf", restarts=8)
    assert res.value == pytest.approx(exact, rel=1e-12)


def test_adaptive_sharpness_is_the_plain_one_in_scaled_coordinates():
    a = np.array([3.0, 1.0, 0.5, 0.2])
    g = np.array([0.5, -0.8, 0.3, -0.6])
    centre = np.array([0.5, -1.0, 1.5, 0.7])
    model, ev = quadratic(np.diag(a), centre, g)
    rho, eta = 0.3, 0.01
    c = np.abs(centre) + eta
    res = sharpness(model, ev, rho=rho, kind="adaptive", eta=eta, steps=60, restarts=4, return_perturbation=True)
    assert res.value == pytest.approx(trust_region_max(np.diag(a * c ** 2), c * g, rho), rel=1e-7)
    assert res.lambda_max == pytest.approx(np.max(a * c ** 2), rel=1e-10)
    assert res.perturbation_norm == pytest.approx(rho) and np.linalg.norm(res.perturbation / c) == pytest.approx(rho)
    assert res.name == "adaptive l2" and res.eta == eta
    same = sharpness(model, ev, rho=rho, kind="l2", adaptive=True, eta=eta, steps=60, restarts=4,
                     return_perturbation=True)
    assert same == res  # kind="adaptive" is adaptive L2
    box = sharpness(model, ev, rho=rho, kind="linf", adaptive=True, eta=eta)
    assert box.value == pytest.approx(np.sum(np.abs(g) * c * rho + a * (c * rho) ** 2 / 2), rel=1e-12)
    assert box.name == "adaptive linf"


def test_adaptive_sharpness_is_invariant_to_rescaling_relu_layers(digits):
    """Kwon et al.'s point: w1 -> s w1, w2 -> w2 / s computes the same function; only adaptive sharpness agrees."""
    x, y = digits
    model = train(make_mlp(3).double(), x.double(), y, steps=30)
    scaled = make_mlp(3).double()
    scaled.load_state_dict(model.state_dict())
    with torch.no_grad():
        scaled[1].weight.mul_(4.0)
        scaled[1].bias.mul_(4.0)
        scaled[3].weight.div_(4.0)
    ev = Evaluator(model, (x.double(), y), dtype=torch.float64, device="cpu", progress=False)
    kw = dict(rho=0.05, steps=10, restarts=2, bound=False)
    adaptive = [sharpness(m, ev, kind="adaptive", **kw) for m in (model, scaled)]
    assert adaptive[1].base_loss == pytest.approx(adaptive[0].base_loss, rel=1e-12)
    np.testing.assert_allclose(adaptive[1].trajectory, adaptive[0].trajectory, rtol=1e-8, atol=1e-12)
    plain = [sharpness(m, ev, kind="l2", **kw).value for m in (model, scaled)]
    assert abs(plain[1] - plain[0]) > 0.2 * plain[0]


# ---------------------------------------------------------------------------- a trained network
@pytest.fixture(scope="module")
def two_unit_net(digits):
    """A 64-2-10 tanh network trained on digits: ``1.bias`` holds 2 scalars, both of which matter."""
    x, y = digits
    model = seeded_init_(nn.Sequential(nn.Flatten(), nn.Linear(64, 2), nn.Tanh(), nn.Linear(2, 10)), 1).double()
    train(model, x.double(), y, steps=100)
    ev = Evaluator(model, (x.double(), y), dtype=torch.float64, device="cpu", progress=False)
    return model, ev, x.double(), y


def bias_losses(model: nn.Module, x: torch.Tensor, y: torch.Tensor, e: np.ndarray) -> np.ndarray:
    """Mean cross-entropy with ``1.bias`` moved by each row of ``e``, by hand (independent of the evaluator)."""
    w1, b1, w2, b2 = (p.detach() for p in (model[1].weight, model[1].bias, model[3].weight, model[3].bias))
    out = []
    for chunk in torch.tensor(e).split(1000):
        logits = torch.tanh((x @ w1.T)[None] + (b1 + chunk)[:, None, :]) @ w2.T + b2
        ce = nn.functional.cross_entropy(logits.reshape(-1, 10), y.repeat(len(chunk)), reduction="none")
        out.append(ce.reshape(len(chunk), -1).mean(1))
    return torch.cat(out).numpy()


def grid_maximum(model: nn.Module, x: torch.Tensor, y: torch.Tensor, norm: str, rho: float,
                 scale: np.ndarray) -> float:
    """Brute force ``max L(w + T u) - L(w)`` over ``||u||_p <= rho`` on ``1.bias``.

    A grid of the ball (polar for L2, the circle included; Cartesian for the box, its edges included),
    then a grid 40 times finer around the best point (and the arc of the circle through it).
    """
    def gain(u: np.ndarray) -> np.ndarray:
        return bias_losses(model, x, y, u * scale) - bias_losses(model, x, y, np.zeros((1, 2)))[0]

    if norm == "l2":
        r, t = np.meshgrid(np.linspace(0, rho, 21), np.linspace(0, 2 * np.pi, 361)[:-1])
        coarse = np.stack([r.ravel() * np.cos(t.ravel()), r.ravel() * np.sin(t.ravel())], axis=1)
        step = 2 * np.pi * rho / 360
    else:
        s = np.linspace(-rho, rho, 81)
        coarse = np.stack(np.meshgrid(s, s), -1).reshape(-1, 2)
        step = s[1] - s[0]
    values = gain(coarse)
    centre = coarse[int(np.argmax(values))]
    offsets = np.linspace(-step, step, 81)
    fine = centre + np.stack(np.meshgrid(offsets, offsets), -1).reshape(-1, 2)
    if norm == "l2":
        fine = fine[np.linalg.norm(fine, axis=1) <= rho]
        angle = np.arctan2(centre[1], centre[0]) + np.linspace(-step / rho, step / rho, 401)
        fine = np.concatenate([fine, rho * np.stack([np.cos(angle), np.sin(angle)], 1)])
    else:
        fine = np.clip(fine, -rho, rho)
    return max(float(values.max()), float(gain(fine).max()))


@pytest.mark.parametrize("kind, adaptive, rho", [("l2", False, 0.5), ("linf", False, 0.3), ("l2", True, 0.3),
                                                 ("linf", True, 0.2)])
def test_trained_network_sharpness_matches_a_grid_search_over_two_parameters(two_unit_net, kind, adaptive, rho):
    model, ev, x, y = two_unit_net
    res = sharpness(model, ev, rho=rho, kind=kind, adaptive=adaptive, params="1.bias", steps=30, restarts=4,
                    return_perturbation=True)
    bias = model[1].bias.detach().numpy()
    scale = np.abs(bias) if adaptive else np.ones(2)
    best = grid_maximum(model, x, y, kind, rho, scale)
    assert res.dim == 2 and res.perturbation.shape == (2,)
    assert best > 1e-3  # a real loss increase, not a flat spot
    # the fine grid (spacing rho / 1600 in the box, which holds the corners and edges; arcs of rho pi / 36000 on the
    # circle) is within O(spacing^2) of the maximum of this smooth loss: far below 1e-6 relative
    assert res.value == pytest.approx(best, rel=1e-6)
    # the reported perturbation attains the reported value under the evaluator's own loss
    point = ev.vector(model)
    point[ev.space.select("1.bias")] += torch.tensor(res.perturbation)
    assert float(ev.evaluate(point[None]).loss[0]) - res.base_loss == pytest.approx(res.value, rel=1e-10)


def test_lambda_max_is_the_hessian_eigenvalue_of_the_curvature_code(two_unit_net):
    model, ev, _, _ = two_unit_net
    res = sharpness(model, ev, rho=0.01, kind="l2", steps=5, restarts=1, seed=3)
    top = landscape.hessian_eigenvalues(model, ev, seed=3)
    assert res.lambda_max == pytest.approx(float(top[0]), rel=1e-10) and res.matvecs == top.matvecs
    assert res.second_order == pytest.approx(0.5 * 0.01 ** 2 * float(top[0]), rel=1e-10)


# ---------------------------------------------------------------------------- determinism, BatchNorm, cache
def test_same_seed_same_result_and_another_seed_other_starts(two_unit_net):
    model, ev, _, _ = two_unit_net
    kw = dict(rho=0.2, kind="linf", steps=8, restarts=3, bound=False)
    first, again = sharpness(model, ev, seed=5, **kw), sharpness(model, ev, seed=5, **kw)
    assert first == again
    np.testing.assert_array_equal(first.trajectory, again.trajectory)
    other = sharpness(model, ev, seed=6, **kw)
    assert not np.array_equal(other.trajectory[:, 0], first.trajectory[:, 0])


def test_batchnorm_uses_the_evaluators_statistics_and_updates_nothing(digits_images):
    x, y = digits_images
    model = make_bn_cnn(2).double()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    results = {}
    for bn in ("interpolate", "keep", "recompute"):
        ev = Evaluator(model, (x.double(), y), bn=bn, bn_data=(x.double()[:100], y[:100]), dtype=torch.float64,
                       device="cpu", progress=False)
        buffers = {k: v.clone() for k, v in ev.module.state_dict().items()}
        res = results[bn] = sharpness(model, ev, rho=0.05, steps=4, restarts=2, bound=False)
        assert res.base_loss == pytest.approx(float(ev.evaluate(model).loss[0]), rel=1e-12), bn
        assert all(torch.equal(v, ev.module.state_dict()[k]) for k, v in buffers.items()), bn
        assert res.spec["evaluator"]["bn"] == bn and "bn=" + bn in repr(res)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    # at one point interpolate and keep use the point's own statistics: the same measurement
    np.testing.assert_array_equal(results["interpolate"].trajectory, results["keep"].trajectory)
    assert results["recompute"].base_loss != results["keep"].base_loss  # re-estimated statistics


def test_result_is_cached_and_round_trips(tmp_path, monkeypatch):
    model, ev = quadratic(HESSIAN, CENTRE, np.zeros(5), cache=str(tmp_path / "c.h5"))
    first = [sharpness(model, ev, rho=0.1, kind=k, steps=5, return_perturbation=True) for k in ("l2", "linf")]

    def boom(*args, **kwargs):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(CurvatureOperator, "__init__", boom)
    second = [sharpness(model, ev, rho=0.1, kind=k, steps=5, return_perturbation=True) for k in ("l2", "linf")]
    assert first == second and isinstance(second[1], SharpnessResult) and np.isnan(second[1].lambda_max)
    assert len(Cache(tmp_path / "c.h5").keys()["results"]) == 2
    with pytest.raises(AssertionError, match="recomputed"):
        sharpness(model, ev, rho=0.2, kind="l2", steps=5)  # another radius is another result
    text = repr(first[0])
    assert text.startswith("SharpnessResult(value=") and "name=l2" in text and "trajectory=array(3, 6)" in text


# ---------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, message", [
    (dict(rho=0.0), "positive finite rho, got 0.0"), (dict(rho=-0.1), "positive finite rho"),
    (dict(rho=float("nan")), "positive finite rho"), (dict(rho=float("inf")), "positive finite rho"),
    (dict(rho="0.1"), "positive finite rho, got '0.1'"),
    (dict(rho=0.1, kind="l1"), "unknown sharpness kind 'l1'; use one of l2, linf, adaptive"),
    (dict(rho=0.1, kind="adaptive", adaptive=False), "kind='adaptive' is adaptive L2"),
    (dict(rho=0.1, eta=-0.01), "non-negative finite eta"), (dict(rho=0.1, step_size=0), "positive finite step_size"),
    (dict(rho=0.1, steps=0), r"steps must be an integer in \[1, 100,000\], got 0"),
    (dict(rho=0.1, restarts=2.5), "restarts must be an integer"),
    (dict(rho=0.1, bound_max_iter=0), "bound_max_iter must lie in"), (dict(rho=0.1, bound_tol=-1), "bound_tol"),
    (dict(rho=0.1, params="nothing.*"), "no trainable parameter matches"),
])
def test_bad_input_raises_a_one_line_config_error(kwargs, message):
    model, ev = quadratic(np.eye(2), np.ones(2), np.zeros(2))
    with pytest.raises(ConfigError, match=message) as info:
        sharpness(model, ev, **kwargs)
    assert "\n" not in str(info.value)
    tally("bad inputs rejected")


@pytest.fixture(scope="module")
def float32_mlp(digits) -> tuple[nn.Module, Evaluator]:
    """The 64-16-10 MLP in float32 on 100 digits."""
    x, y = digits
    model = make_mlp(0)
    return model, Evaluator(model, (x[:100], y[:100]), device="cpu", progress=False)


@pytest.mark.parametrize("kind, words", [
    ("l2", "rho=1e+30 is too large for float32: the l2 ball's arithmetic overflows above rho=6.15e+18"),
    ("linf", "the loss at a point of the ball of rho=1e+30 is nan in float32: rho is too large for the "
             "model's float32 arithmetic"),
])
def test_a_rho_that_overflows_the_dtype_is_refused_not_measured_as_zero(float32_mlp, kind, words):
    """An overflow is never measured as 0 (rho=1e30 unchecked gives 0.0 with a perturbation of norm 0.0)."""
    model, ev = float32_mlp
    with pytest.raises(ConfigError, match=re.escape(words)) as info:
        sharpness(model, ev, rho=1e30, kind=kind, steps=3, restarts=1, bound=False)
    assert "\n" not in str(info.value) and str(info.value).endswith("or an Evaluator with dtype=torch.float64")
    tally("bad inputs rejected")


def test_a_large_rho_that_fits_the_dtype_is_measured(float32_mlp):
    model, ev = float32_mlp
    res = sharpness(model, ev, rho=1e8, steps=3, restarts=1, bound=False)
    assert np.isfinite(res.value) and res.value > 1e10 and np.isfinite(res.trajectory).all()
    assert res.perturbation_norm == pytest.approx(1e8, rel=1e-6)  # on the sphere, to float32 rounding


def test_a_loss_that_overflows_at_the_weights_themselves_is_a_weight_overflow(float32_mlp, digits):
    model, _ = float32_mlp
    huge = make_mlp(0)
    with torch.no_grad():
        for p in huge.parameters():
            p.mul_(1e30)
    ev = Evaluator(huge, (digits[0][:100], digits[1][:100]), device="cpu", progress=False)
    with pytest.raises(landscape.WeightOverflowError, match="the loss at the model's own weights is nan in "
                                                            "float32, before any perturbation"):
        sharpness(huge, ev, rho=0.1, steps=2, restarts=1, bound=False)
    tally("bad inputs rejected")


def test_docstring_example_runs():
    result = doctest.testmod(sharpness_module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------------- figure and example
def test_figure_draws_each_results_trajectories_in_its_own_panel(two_unit_net):
    model, ev, _, _ = two_unit_net
    results = {k: sharpness(model, ev, rho=0.2, kind=k, params="1.bias", steps=4, restarts=2) for k in ("l2", "linf")}
    fig = sharpness_figure(results)
    assert len(fig.axes) == 2
    for ax, (name, res) in zip(fig.axes, results.items()):
        drawn = [line.get_ydata() for line in ax.get_lines()]
        assert all(any(np.array_equal(y, traj) for y in drawn) for traj in res.trajectory)
        assert ax.get_title().startswith(f"{name}, ρ = 0.2\nS = {res.value:.3g}")
    assert ("ρ²λ_max/2" in fig.axes[0].get_title()) and ("ρ²λ_max/2" not in fig.axes[1].get_title())
    interactive = sharpness_plotly(results)
    assert [t.name for t in interactive.data].count("restart 2") == 2
    assert interactive.layout.yaxis2.matches is None  # two balls, two scales
    # one ball for several models (the demo's global models): one y scale, so the values compare
    models = {f"seed {s}": sharpness(model, ev, rho=0.2, params="1.bias", steps=4, restarts=2, seed=s) for s in (0, 1)}
    assert sharpness_plotly(models).layout.yaxis2.matches == "y"
    shared = sharpness_figure(models).axes
    assert shared[0].get_ylim() == shared[1].get_ylim()
    assert shared[0].get_ylim()[1] >= max(r.value for r in models.values())
    with pytest.raises(ConfigError, match="SharpnessResult"):
        sharpness_figure({"a path": object()})
    tally("bad inputs rejected")


def test_example_writes_its_table_and_figure_inside_its_folder(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "sharpness.py"), "--quick", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    tables = json.loads((out / "tables.json").read_text())["tables"]
    first, sharp = list(tables)[0], next(t for t in tables if t.startswith("Worst-case sharpness"))
    assert first.startswith("Training: convergence") and tables[first][0]["epochs"] == 2  # printed before the analysis
    assert [r["kind"] for r in tables[sharp]] == ["l2", "adaptive l2", "linf"]
    assert all(r["sharpness"] > 0 for r in tables[sharp])
    assert (out / "sharpness.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Plotly" in (out / "sharpness.html").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing written outside --out


