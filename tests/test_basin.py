"""Basin analysis (landscape.basin) on synthetic grids whose basins are known analytically."""
from collections import deque

import numpy as np
import pytest

from landscape.cache.store import Cache
from landscape.geometry.basin import BasinResult, basin, sublevel_components
from landscape.infra.errors import ConfigError
from landscape.results import PathResult, PlaneResult


def synthetic_plane(fn, models, n=41, lim=2.0):
    x = np.linspace(-lim, lim, n)
    y = np.linspace(-lim, lim, n)
    gx, gy = np.meshgrid(x, y)
    loss = fn(gx, gy)
    return PlaneResult(x=x, y=y, loss=loss, accuracy=np.exp(-loss), origin=np.zeros(2), u=np.array([1.0, 0.0]),
                       v=np.array([0.0, 1.0]), param_mask=np.ones(2, dtype=bool),
                       models={k: list(v) for k, v in models.items()}, layout=[["w", 0, 2]])


def double_well(x, y):
    return (x ** 2 - 1) ** 2 + y ** 2  # minima at (+-1, 0), saddle of height 1 at (0, 0)


def bowl(x, y):
    return (x - 0.3) ** 2 + 2 * (y + 0.2) ** 2 + 0.5 * (x - 0.3) * (y + 0.2)


def bfs_components(inside):
    """Independent flood fill: list of sets of cells, 4-neighbour connectivity."""
    seen, comps = np.zeros_like(inside, dtype=bool), []
    for start in zip(*np.nonzero(inside)):
        if seen[start]:
            continue
        comp, queue = set(), deque([start])
        seen[start] = True
        while queue:
            i, j = queue.popleft()
            comp.add((i, j))
            for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                a, b = i + di, j + dj
                if 0 <= a < inside.shape[0] and 0 <= b < inside.shape[1] and inside[a, b] and not seen[a, b]:
                    seen[a, b] = True
                    queue.append((a, b))
        comps.append(frozenset(comp))
    return set(comps)


@pytest.mark.parametrize("seed", range(5))
def test_flood_fill_matches_independent_bfs(seed):
    values = np.random.default_rng(seed).random((13, 17))
    labels = sublevel_components(values, 0.45)
    ours = {frozenset(zip(*np.nonzero(labels == k))) for k in range(1, labels.max() + 1)}
    assert ours == bfs_components(values <= 0.45)
    assert ((labels > 0) == (values <= 0.45)).all()


def test_flood_fill_uses_four_neighbours_and_excludes_nan():
    values = np.array([[0.0, 1.0], [1.0, 0.0]])  # diagonal cells touch only at a corner
    assert sublevel_components(values, 0.5).max() == 2
    values[1, 1] = np.nan
    labels = sublevel_components(values, 2.0)
    assert labels[1, 1] == 0 and labels.max() == 1


def test_two_separate_basins_then_one_above_the_saddle():
    plane = synthetic_plane(double_well, {"left": (-1.02, 0.03), "right": (0.98, -0.05)})
    low = basin(plane)
    assert not low.common
    assert low.model_component[0] != low.model_component[1] and (low.model_component > 0).all()
    assert low.num_components == 2
    assert low.level < 0.05
    high = basin(plane, level=1.2)  # above the saddle (height 1): one basin holds both minima
    assert high.common and high.num_components == 1
    # the bottom is one of the two true minima, to grid/refinement precision
    assert min(np.linalg.norm(high.refined_bottom - m) for m in ([1, 0], [-1, 0])) < 0.02


def test_one_basin_bottom_is_refined_to_the_analytic_minimum():
    models = {"a": (1.0, 1.0), "b": (-1.2, 0.6), "c": (0.1, -1.3)}
    plane = synthetic_plane(bowl, models, n=21)
    res = basin(plane, model_loss={k: bowl(*v) for k, v in models.items()})
    assert res.common and res.num_components == 1
    # a quadratic is fitted exactly by the 3x3 quadratic refinement
    np.testing.assert_allclose(res.refined_bottom, [0.3, -0.2], atol=1e-9)
    assert abs(res.refined_loss) < 1e-12
    grid_loss = bowl(*res.bottom)
    assert res.bottom_loss == pytest.approx(grid_loss) and grid_loss >= res.refined_loss
    for name, (x, y) in models.items():
        info = res.model(name)
        assert info["distance"] == pytest.approx(np.hypot(x - 0.3, y + 0.2))
        assert info["loss_gap"] == pytest.approx(bowl(x, y))
        assert info["off_bottom"]
    # the level is the highest loss among the models' nearest grid points
    assert res.level == pytest.approx(max(plane.loss[tuple(c)] for c in res.cells))


def test_model_at_the_bottom_is_not_off_bottom_and_refine_off_keeps_grid_argmin():
    plane = synthetic_plane(bowl, {"a": (1.5, 1.5), "centre": (0.32, -0.18)}, n=21)
    res = basin(plane, refine=False)
    assert not res.off_bottom["centre"] and res.off_bottom["a"]
    np.testing.assert_array_equal(res.refined_bottom, res.bottom)
    i = np.unravel_index(np.argmin(plane.loss), plane.loss.shape)
    assert tuple(res.bottom) == (plane.x[i[1]], plane.y[i[0]])


def test_bottom_is_searched_inside_the_common_basin():
    # deep minimum far from the models, shallow one around them: the bottom is the shallow one
    fn = lambda x, y: np.minimum((x + 1) ** 2 + y ** 2 + 0.5, 3 * ((x - 1.5) ** 2 + y ** 2))  # noqa: E731
    plane = synthetic_plane(fn, {"p": (-1.3, 0.2), "q": (-0.7, -0.2)})
    res = basin(plane)
    assert res.common
    assert res.refined_bottom[0] == pytest.approx(-1.0, abs=0.05)
    assert fn(*res.bottom) > plane.loss.min()


def test_path_basin_with_parabola_refinement():
    alphas = np.linspace(-0.5, 1.5, 21)
    loss = 2.0 * (alphas - 0.37) ** 2 + 0.1
    path = PathResult(alphas=alphas, loss=loss, accuracy=1 - loss / 10)
    res = basin(path)
    assert res.common and res.names == ["a", "b"]
    assert res.refined_bottom[0] == pytest.approx(0.37, abs=1e-9)
    assert res.refined_loss == pytest.approx(0.1)
    np.testing.assert_allclose(res.distance, [0.37, 0.63])
    # a barrier between the endpoints splits them
    bumpy = PathResult(alphas=alphas, loss=np.where(np.abs(alphas - 0.5) < 0.1, 5.0, 0.0),
                       accuracy=np.ones_like(alphas))
    assert not basin(bumpy).common


def test_errors_and_cache_round_trip(tmp_path):
    plane = synthetic_plane(bowl, {"a": (1.0, 1.0), "far": (5.0, 0.0)}, n=11)
    with pytest.raises(ConfigError, match="outside the grid"):
        basin(plane)
    with pytest.raises(ConfigError, match="not placed"):
        basin(plane, models=["zzz"])
    res = basin(plane, models={"a": (1.0, 1.0), "b": (-1.0, 0.0)})
    cache = Cache(tmp_path / "c.h5")
    cache.save_result("k", res)
    back = cache.load_result("k")
    assert isinstance(back, BasinResult) and back == res and back.common == res.common
