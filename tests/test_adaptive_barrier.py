"""Adaptive barrier search (``alphas="adaptive"``).

Exact cases with the peak between grid points, agreement with a 201-point grid on trained models,
batching, determinism, cache, bad options.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from landscape import (
    BarrierMatrix,
    ConfigError,
    Evaluator,
    NonFiniteLossWarning,
    PathResult,
    barrier_matrix,
    interpolate,
)
from landscape.cache.store import Cache, make_key
from landscape.geometry.adaptive import COARSE, adaptive_search, interval_bounds, roughness, stencil
from landscape.results.barriers import accuracy_barrier_curve

from conftest import make_mlp
from fault_counts import tally

#: The cubic excess a + a^2 - 2 a^3 (zero at both ends) peaks at (2 + sqrt 28) / 12, between k/8 and (k+1)/8.
CUBIC_PEAK = (2 + np.sqrt(28)) / 12
CUBIC_MAX = CUBIC_PEAK + CUBIC_PEAK ** 2 - 2 * CUBIC_PEAK ** 3


def _scalar_path(loss_of_alpha) -> tuple[Evaluator, dict, dict]:
    """A one-weight linear model on input 1: its output at alpha is alpha, so the loss is loss_of_alpha(alpha)."""
    x, y = torch.ones(4, 1, dtype=torch.float64), torch.zeros(4, 1, dtype=torch.float64)
    ev = Evaluator(nn.Linear(1, 1, bias=False), (x, y), loss=lambda out, _t: loss_of_alpha(out[:, 0]),
                   dtype=torch.float64)
    return ev, {"weight": torch.zeros(1, 1)}, {"weight": torch.ones(1, 1)}


def _cubic(a: torch.Tensor) -> torch.Tensor:
    return a + a ** 2 - 2 * a ** 3


def _bump(a: torch.Tensor) -> torch.Tensor:
    return torch.exp(-0.5 * ((a - 0.29) / 0.05) ** 2)


def test_cubic_excess_peak_between_grid_points_found_within_tol():
    ev, a, b = _scalar_path(_cubic)
    tol = 1e-5
    path = interpolate(a, b, ev, alphas="adaptive", tol=tol)
    coarse = interpolate(a, b, ev, alphas=COARSE)
    assert CUBIC_MAX - coarse.loss_barrier > 50 * tol  # the coarse grid misses the peak (by 8e-4)
    assert 0 <= CUBIC_MAX - path.loss_barrier <= tol
    assert path.search["converged"] and path.search["stopped"] == "tolerance"
    assert CUBIC_MAX <= path.loss_barrier + path.search["loss_gap"] <= path.loss_barrier + tol  # the bound holds
    assert path.search["evaluations"] == len(path.alphas) <= 30
    peak = path.alphas[np.argmax(path.loss_curve)]
    assert abs(peak - CUBIC_PEAK) < 0.02


def test_narrow_bump_missed_by_the_grid_is_located():
    """exp(-(alpha - 0.29)^2 / (2 * 0.05^2)): the coarse grid sees 0.73 of its height."""
    ev, a, b = _scalar_path(_bump)
    tol = 1e-3
    path = interpolate(a, b, ev, alphas="adaptive", tol=tol)
    chord_at_peak = 0.71 * float(_bump(torch.tensor(0.0, dtype=torch.float64)))  # L(0) is 5e-8, L(1) 1e-44
    true_max = 1.0 - chord_at_peak
    assert 0 <= true_max - path.loss_barrier <= tol
    assert true_max - interpolate(a, b, ev, alphas=COARSE).loss_barrier > 0.2
    assert path.search["evaluations"] < 30
    assert abs(path.alphas[np.argmax(path.loss_curve)] - 0.29) < 0.01


def test_alphas_are_sorted_deterministic_and_dyadic():
    ev, a, b = _scalar_path(_bump)
    first = interpolate(a, b, ev, alphas="adaptive", tol=1e-4)
    second = interpolate(a, b, ev, alphas="adaptive", tol=1e-4)
    assert np.array_equal(first.alphas, second.alphas) and np.array_equal(first.loss, second.loss)
    assert (np.diff(first.alphas) > 0).all() and first.alphas[0] == 0.0 and first.alphas[-1] == 1.0
    assert np.array_equal(first.alphas * 2 ** 20, np.round(first.alphas * 2 ** 20))  # k / 2^m: exact in floating point
    assert np.diff(first.alphas).min() >= first.search["min_width"]


def test_refinement_rounds_are_batched():
    ev, a, b = _scalar_path(_bump)
    calls: list[int] = []
    evaluate_points = ev.evaluate_points

    def counting(points, **kwargs):
        calls.append(len(points))
        return evaluate_points(points, **kwargs)

    ev.evaluate_points = counting
    path = interpolate(a, b, ev, alphas="adaptive", tol=1e-4)
    assert len(calls) == path.search["rounds"] and calls[0] == COARSE
    assert sum(calls) == path.search["evaluations"] and max(calls[1:]) > 1  # several points per round
    assert path.evaluations == sum(calls)  # the API contract's name for the count


def test_budget_and_alpha_floor_stop_the_search_and_say_so():
    ev, a, b = _scalar_path(_bump)
    floor = interpolate(a, b, ev, alphas="adaptive", tol=1e-9)
    assert floor.search["stopped"] == "min_width" and not floor.search["converged"]
    assert floor.search["loss_gap"] > 1e-9
    calls: list[int] = []

    def evaluate(alphas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        calls.append(len(alphas))
        return np.sin(40 * alphas), np.ones_like(alphas)

    alphas, _, _, record = adaptive_search(evaluate, 1e-9, max_evaluations=20)
    assert len(alphas) == record["evaluations"] == 20 == sum(calls)
    assert record["stopped"] == "max_evaluations" and not record["converged"]


def test_interval_bound_is_exact_for_a_concave_parabola():
    """For c = 1 - 3 (x - 0.3)^2 the divided differences give |c''| = 6 and the bound, with safety 1, is the max."""
    x = np.array([0.0, 0.5, 1.0])
    bounds = interval_bounds(x, 1 - 3 * (x - 0.3) ** 2, safety=1.0)
    np.testing.assert_allclose(bounds, [1.0, 1 - 3 * 0.2 ** 2], rtol=0, atol=1e-12)


def _noisy_accuracy(seed: int, sigma: float = 0.05, fine: int = 2 ** 14):
    """Accuracy = a smooth dip peaking (as a barrier) at alpha = 0.4 plus a random-walk bridge.

    The bridge is seeded, of scale sigma, defined on a 2^14-point grid (each alpha reads its nearest point): a step
    function like a real accuracy.
    """
    rng = np.random.default_rng(seed)
    walk = np.r_[0.0, np.cumsum(rng.normal(0.0, sigma / np.sqrt(fine), fine))]
    walk -= np.linspace(0.0, 1.0, fine + 1) * walk[-1]

    def evaluate(alphas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        trend = 0.9 - 0.4 * np.exp(-0.5 * ((alphas - 0.4) / 0.15) ** 2)
        return 1.9 - trend, trend + walk[np.rint(alphas * fine).astype(int)]

    return evaluate


@pytest.mark.parametrize("tol", [1e-2, 5e-3])
def test_random_walk_accuracy_agrees_with_a_201_point_grid(tol):
    """The 201-point grid's maximum picks up the walk's excursions.

    The roughness allowance makes the search sample densely enough near the top to come within tol of it.
    """
    grid = np.linspace(0.0, 1.0, 201)
    for seed in range(8):
        evaluate = _noisy_accuracy(seed)
        alphas, _, accuracy, record = adaptive_search(evaluate, tol)
        on_grid = accuracy_barrier_curve(grid, evaluate(grid)[1]).max()
        assert abs(accuracy_barrier_curve(alphas, accuracy).max() - on_grid) <= tol
        assert record["evaluations"] <= 60
        assert 0.5 < record["accuracy_roughness"] / (0.05 / 0.9) < 2  # the curve is 1 - A / 0.9


def test_roughness_is_zero_for_a_quadratic_and_scales_with_a_walk():
    alphas = np.linspace(0.0, 1.0, 9)
    curve = 1 - 3 * (alphas - 0.3) ** 2
    points = stencil(alphas, curve)
    assert points.shape == (3, 4) and np.isin(alphas[[1, 2, 3]], points).all()  # at the three highest points
    merged = np.union1d(alphas, points.ravel())
    assert roughness(merged, 1 - 3 * (merged - 0.3) ** 2, points) == pytest.approx(0.0, abs=1e-6)
    quiet = roughness(merged, np.zeros_like(merged) + np.isin(merged, points[:, 1]) * 1e-3, points)
    loud = roughness(merged, np.zeros_like(merged) + np.isin(merged, points[:, 1]) * 2e-3, points)
    assert loud == pytest.approx(2 * quiet) and quiet == pytest.approx(3e-3 / np.sqrt(6 * 2 ** -8))


def test_agrees_with_a_201_point_grid_on_trained_models(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y), batch_size=128)
    tol = 1e-2  # 300 samples: the accuracy moves in steps of 1/300
    for i, j in ((0, 1), (0, 2), (1, 2)):
        grid = interpolate(trained_mlps[i], trained_mlps[j], ev, alphas=201)
        path = interpolate(trained_mlps[i], trained_mlps[j], ev, alphas="adaptive", tol=tol)
        assert grid.loss_barrier > 0.5  # a real barrier
        assert abs(path.loss_barrier - grid.loss_barrier) <= tol
        assert abs(path.accuracy_barrier - grid.accuracy_barrier) <= tol
        assert path.search["evaluations"] < 40 < 201


def test_barrier_matrix_adaptive_matches_the_paths(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y), batch_size=128)
    matrix = barrier_matrix(trained_mlps, ev, alphas="adaptive", tol=1e-2)
    pairs = [interpolate(trained_mlps[i], trained_mlps[j], ev, alphas="adaptive", tol=1e-2)
             for i, j in ((0, 1), (0, 2), (1, 2))]
    assert matrix.loss_barrier[0, 1] == pairs[0].loss_barrier and matrix.accuracy_barrier[1, 2] == \
        pairs[2].accuracy_barrier
    assert matrix.search["pair_evaluations"] == [p.search["evaluations"] for p in pairs]
    assert matrix.search["evaluations"] == sum(p.search["evaluations"] for p in pairs)
    assert matrix.spec["alphas"] == "adaptive" and matrix.spec["tol"] == 1e-2
    assert "evaluations=" in repr(matrix) and "search" not in repr(barrier_matrix(trained_mlps, ev, alphas=3))


def test_result_round_trips_the_cache_and_the_key_includes_the_tolerance(tmp_path):
    ev, a, b = _scalar_path(_cubic)
    path = interpolate(a, b, ev, alphas="adaptive", tol=1e-4)
    assert path.spec["alphas"] == "adaptive" and path.spec["tol"] == 1e-4
    assert make_key(dict(path.spec)) != make_key(dict(interpolate(a, b, ev, alphas="adaptive", tol=1e-3).spec))
    cache = Cache(tmp_path / "cache")
    cache.save_result("adaptive", path)
    back = Cache(tmp_path / "cache").load_result("adaptive")
    assert isinstance(back, PathResult) and back == path
    assert back.search["evaluations"] == len(back.alphas) and back.loss_barrier == path.loss_barrier
    assert "evaluations=" in repr(path) and "search" not in repr(interpolate(a, b, ev, alphas=3))


def test_points_are_read_back_from_the_evaluators_cache(tmp_path):
    x, y = torch.ones(4, 1, dtype=torch.float64), torch.zeros(4, 1, dtype=torch.float64)
    make = lambda: Evaluator(nn.Linear(1, 1, bias=False), (x, y), loss=lambda out, _t: _bump(out[:, 0]),  # noqa: E731
                             dtype=torch.float64, cache=tmp_path / "cache")
    a, b = {"weight": torch.zeros(1, 1)}, {"weight": torch.ones(1, 1)}
    first_ev, second_ev = make(), make()
    first = interpolate(a, b, first_ev, alphas="adaptive", tol=1e-4)
    second = interpolate(a, b, second_ev, alphas="adaptive", tol=1e-4)
    assert first_ev.points_evaluated == len(first.alphas) and second_ev.points_evaluated == 0
    assert np.array_equal(first.alphas, second.alphas) and np.array_equal(first.loss, second.loss)


def test_overflowed_loss_stops_the_search_with_a_nan_gap():
    ev, a, b = _scalar_path(lambda t: torch.where(t > 0.6, torch.inf, t))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = interpolate(a, b, ev, alphas="adaptive")
    assert any(issubclass(w.category, NonFiniteLossWarning) for w in caught)
    assert len(path.alphas) == COARSE and path.search["stopped"] == "nonfinite"
    assert np.isnan(path.search["loss_gap"]) and not path.search["converged"]


@pytest.mark.parametrize("alphas, tol, message", [
    ("adaptiv", None, "alphas='adaptiv' is not a grid"),
    ("Adaptive", 1e-3, "alphas='Adaptive' is not a grid"),
    ("adaptive", 0, "tol=0: the adaptive barrier search needs a finite tolerance above 0"),
    ("adaptive", -1e-3, "tol=-0.001: the adaptive barrier search needs a finite tolerance above 0"),
    ("adaptive", float("nan"), "tol=nan: the adaptive barrier search needs"),
    ("adaptive", float("inf"), "tol=inf: the adaptive barrier search needs"),
    ("adaptive", "1e-3", "tol='1e-3': the adaptive barrier search needs"),
    ("adaptive", True, "tol=True: the adaptive barrier search needs"),
    (21, 1e-3, "tol=0.001 applies only to alphas='adaptive'"),
])
@pytest.mark.parametrize("function", ["interpolate", "barrier_matrix"])
def test_bad_options_raise_one_line_config_errors(alphas, tol, message, function):
    ev, a, b = _scalar_path(_cubic)
    calls: list[int] = []
    ev.evaluate_points = lambda points, **kw: calls.append(len(points))  # nothing may be evaluated
    with pytest.raises(ConfigError) as err:
        if function == "interpolate":
            interpolate(a, b, ev, alphas=alphas, tol=tol)
        else:
            barrier_matrix([a, b], ev, alphas=alphas, tol=tol)
    assert message in str(err.value) and "\n" not in str(err.value) and not calls
    tally("bad inputs rejected")


def test_adaptive_search_refuses_a_coarse_grid_below_three_points():
    with pytest.raises(ConfigError, match="coarse >= 3 points"):
        adaptive_search(lambda x: (x, x), 1e-3, coarse=2)
    with pytest.raises(ConfigError, match=f"max_evaluations >= coarse .*max_evaluations={COARSE - 1}"):
        adaptive_search(lambda x: (x, x), 1e-3, max_evaluations=COARSE - 1)
    tally("bad inputs rejected", 2)


def test_barrier_matrix_result_type_is_unchanged_for_grids(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y), batch_size=128)
    matrix = barrier_matrix(trained_mlps[:2], ev, alphas=5)
    assert isinstance(matrix, BarrierMatrix) and matrix.search == {}
    assert matrix.spec["alphas"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    path = interpolate(trained_mlps[0], trained_mlps[1], ev, alphas=5)
    assert matrix.loss_barrier[0, 1] == path.loss_barrier


def test_aligned_path_searches_both_paths_adaptively(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y), batch_size=128)
    a, b = trained_mlps[:2]
    aligned = interpolate(a, b, ev, alphas="adaptive", tol=1e-2, align="weight")
    before = interpolate(a, b, ev, alphas="adaptive", tol=1e-2)
    assert aligned.spec["unaligned"] == {"loss_barrier": before.loss_barrier,
                                         "accuracy_barrier": before.accuracy_barrier}
    assert aligned.search["converged"] and aligned.loss_barrier < before.loss_barrier / 2  # permutation symmetry


def test_a_tolerance_below_the_accuracys_step_is_named_when_the_search_stops_on_alpha(digits, trained_mlps):
    x, y = digits
    ev = Evaluator(make_mlp(0), (x, y), batch_size=128)
    step = 1 / len(y)
    with pytest.warns(UserWarning, match=rf"steps of 1/{len(y)} = .*pass tol >= "):
        fine = interpolate(trained_mlps[0], trained_mlps[1], ev, alphas="adaptive", tol=step / 4)
    assert fine.search["stopped"] == "min_width" and fine.search["accuracy_gap"] > fine.search["tol"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        coarse = interpolate(trained_mlps[0], trained_mlps[1], ev, alphas="adaptive", tol=3 * step)
    assert coarse.search["converged"]
