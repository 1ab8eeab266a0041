"""Planes: geometry of the plane through three models, projections, random planes.

Random planes are filter-normalised; also orthogonalisation and PCA planes.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from landscape import ConfigError, Evaluator, ParameterSpace, pca_plane, plane, random_plane
from landscape.geometry.planes import random_direction

from conftest import FLOAT64_UNIT_ROUNDOFF, float32_tolerance, make_bn_cnn, make_mlp


def _flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])


@pytest.fixture
def small_eval(digits):
    x, y = digits
    return Evaluator(make_mlp(0, hidden=6), (x[:60], y[:60]))


def test_plane_geometry_against_hand_computation(small_eval):
    a, b, c = (make_mlp(s, hidden=6) for s in (1, 2, 3))
    res = plane(a, b, c, small_eval, resolution=5, margin=0.2)
    pa, pb, pc = _flat_params(a), _flat_params(b), _flat_params(c)
    nb = (pb - pa).norm().item()
    u = (pb - pa) / nb
    w = (pc - pa) - ((pc - pa) @ u) * u
    expected = {"a": (0.0, 0.0), "b": (nb, 0.0), "c": (((pc - pa) @ u).item(), w.norm().item())}
    for label, xy in expected.items():
        np.testing.assert_allclose(res.models[label], xy, rtol=1e-9, atol=1e-9)
        model = {"a": a, "b": b, "c": c}[label]
        np.testing.assert_allclose(res.coordinates(model), xy, rtol=1e-9, atol=1e-9)
        assert res.project(model)[2] == pytest.approx(0.0, abs=1e-9)
    # orthonormal basis over parameters
    m = res.param_mask.astype(bool)
    gram = np.array([[res.u[m] @ res.u[m], res.u[m] @ res.v[m]], [res.v[m] @ res.u[m], res.v[m] @ res.v[m]]])
    np.testing.assert_allclose(gram, np.eye(2), atol=1e-12)
    # grid: bounding box of the three models widened by 20% of its width (height) per side
    xs = [xy[0] for xy in expected.values()]
    ys = [xy[1] for xy in expected.values()]
    wx, wy = max(xs) - min(xs), max(ys) - min(ys)
    np.testing.assert_allclose([res.x[0], res.x[-1]], [min(xs) - 0.2 * wx, max(xs) + 0.2 * wx], rtol=1e-12)
    np.testing.assert_allclose([res.y[0], res.y[-1]], [min(ys) - 0.2 * wy, max(ys) + 0.2 * wy], rtol=1e-12)
    assert res.loss.shape == (5, 5) and res.accuracy.shape == (5, 5)
    # the centroid lies in the plane at the mean of the coordinates
    centroid = {k: (a.state_dict()[k] + b.state_dict()[k] + c.state_dict()[k]) / 3 for k in a.state_dict()}
    x, y, resid = res.project(centroid)
    # float32 rounding of the centroid (a sum of 3 state dicts and a division) moves it by at most this distance
    moved = float32_tolerance(3, sides=1) * (pa.abs() + pb.abs() + pc.abs()).norm().item() / 3
    np.testing.assert_allclose([x, y], np.mean(list(expected.values()), axis=0), rtol=0, atol=moved)
    assert resid == pytest.approx(0.0, abs=moved)


def test_grid_values_are_losses_of_the_grid_models(small_eval):
    a, b, c = (make_mlp(s, hidden=6) for s in (1, 2, 3))
    res = plane(a, b, c, small_eval, resolution=4)
    i, j = 1, 2  # row = y index, column = x index
    point = res.origin + res.x[j] * res.u + res.y[i] * res.v
    state = {name: torch.from_numpy(point[off:off + n]).float().reshape(a.state_dict()[name].shape)
             for name, off, n in res.layout}
    metrics = small_eval.evaluate([state])
    # the grid takes the input-layer shortcut (a sum of 3 outputs) against the textbook forward: fan-ins 64 and 6,
    # the float32 loss sum over 60 samples
    assert res.loss[i, j] == pytest.approx(metrics.loss[0], rel=float32_tolerance(3 + 64 + 6 + 60), abs=0)
    assert res.accuracy[i, j] == pytest.approx(metrics.accuracy[0], abs=1e-12)


def test_off_plane_model_coordinates_and_residual(small_eval):
    a, b, c, d = (make_mlp(s, hidden=6) for s in (1, 2, 3, 4))
    res = plane(a, b, c, small_eval, resolution=3, extra={"d": d})
    pa, pd = _flat_params(a), _flat_params(d)
    u = torch.from_numpy(res.u[res.param_mask])
    v = torch.from_numpy(res.v[res.param_mask])
    x, y = ((pd - pa) @ u).item(), ((pd - pa) @ v).item()
    residual = ((pd - pa) - x * u - y * v).norm().item()
    px, py, pres = res.project(d)
    np.testing.assert_allclose([px, py, pres], [x, y, residual], rtol=1e-9)
    assert residual > 0.1
    np.testing.assert_allclose(res.models["d"], [x, y], rtol=1e-9)
    assert res.x[0] <= min(0.0, x) and res.x[-1] >= x  # the grid covers the extra model too


def test_plane_with_batchnorm_buffers_moves_buffers_barycentrically(digits_images):
    x, y = digits_images
    ev = Evaluator(make_bn_cnn(0), (x[:40], y[:40]))
    a, b, c = (make_bn_cnn(s) for s in (1, 2, 3))
    res = plane(a, b, c, ev, resolution=3)
    space = ev.space
    xb, yc = res.models["b"][0], res.models["c"][1]
    xc = res.models["c"][0]
    va, vb, vc = (space.to_vector(m, dtype=torch.float64).numpy() for m in (a, b, c))
    # b = a + xb u and c = a + xc u + yc v hold for every entry, buffers included (float64 dot products over the
    # entries give the coordinates)
    scale = float32_tolerance(va.size, unit=FLOAT64_UNIT_ROUNDOFF) * np.abs(np.stack([va, vb, vc])).max()
    np.testing.assert_allclose(va + xb * res.u, vb, rtol=0, atol=scale * (1 + abs(xb)))
    np.testing.assert_allclose(va + xc * res.u + yc * res.v, vc, rtol=0, atol=scale * (1 + abs(xc) + abs(yc)))
    assert not res.param_mask.all()


def test_plane_errors(small_eval):
    a, b = make_mlp(1, hidden=6), make_mlp(2, hidden=6)
    with pytest.raises(ConfigError, match="identical"):
        plane(a, a, b, small_eval)
    mid = {k: 0.5 * (a.state_dict()[k] + b.state_dict()[k]) for k in a.state_dict()}
    with pytest.raises(ConfigError, match="collinear"):
        plane(a, b, mid, small_eval)
    with pytest.raises(ConfigError, match="resolution"):
        plane(a, b, make_mlp(3, hidden=6), small_eval, resolution=1)


def test_random_direction_filter_normalisation(digits_images):
    model = make_bn_cnn(5)
    space = ParameterSpace(model)
    center = space.to_vector(model, dtype=torch.float64)
    d = random_direction(space, center, torch.Generator().manual_seed(0))
    state = space.unflatten(d)
    ref = model.state_dict()
    for e in space.entries:
        if e.kind == "buffer" or len(e.shape) == 1:
            assert torch.all(state[e.name] == 0), e.name  # biases, BN scales and buffers get no direction
        else:
            dn = state[e.name].reshape(e.shape[0], -1).norm(dim=1)
            wn = ref[e.name].double().reshape(e.shape[0], -1).norm(dim=1)
            torch.testing.assert_close(dn, wn, rtol=1e-9, atol=0)
    d_all = random_direction(space, center, torch.Generator().manual_seed(0), ignore_bias_and_norm=False)
    bias = space.unflatten(d_all)["0.bias"]
    assert bias.norm().item() == pytest.approx(ref["0.bias"].double().norm().item(), rel=1e-9)
    layer = random_direction(space, center, torch.Generator().manual_seed(0), normalization="layer")
    # a float32 norm of the 80 weights (a sum of squares and a square root) against a float64 one
    assert space.unflatten(layer)["5.weight"].norm().item() == pytest.approx(ref["5.weight"].norm().item(),
                                                                             rel=float32_tolerance(80 + 1, sides=1))


def test_random_plane_is_seeded_and_orthogonalised(small_eval):
    center = make_mlp(7, hidden=6)
    r1 = random_plane(center, small_eval, resolution=3, seed=4, orthogonalize=True,
                      extra={"other": make_mlp(8, hidden=6)})
    r2 = random_plane(center, small_eval, resolution=3, seed=4, orthogonalize=True)
    r3 = random_plane(center, small_eval, resolution=3, seed=5)
    np.testing.assert_array_equal(r1.u, r2.u)
    np.testing.assert_array_equal(r1.loss, r2.loss)
    assert not np.array_equal(r1.u, r3.u)
    m = r1.param_mask.astype(bool)
    assert abs(r1.u[m] @ r1.v[m]) < 1e-9 * np.linalg.norm(r1.u[m]) * np.linalg.norm(r1.v[m])
    un = random_plane(center, small_eval, resolution=3, seed=4)
    assert np.linalg.norm(r1.v[m]) == pytest.approx(np.linalg.norm(un.v[m]), rel=1e-9)  # norm kept
    np.testing.assert_array_equal(r1.x, np.linspace(-1, 1, 3))
    assert r1.models["center"] == [0.0, 0.0]
    # the centre point of the grid is the centre model
    assert r1.loss[1, 1] == small_eval.evaluate([center]).loss[0]  # the origin itself, by the same forward
    assert "other" in r1.models and r1.project(make_mlp(8, hidden=6))[2] > 0


def test_pca_plane_recovers_a_known_subspace(small_eval):
    space = small_eval.space
    gen = torch.Generator().manual_seed(0)
    base = small_eval.vector(make_mlp(9, hidden=6))
    basis = torch.linalg.qr(torch.randn(space.size, 2, generator=gen, dtype=torch.float64))[0].T
    coeffs = torch.tensor([[3.0, 0.5], [2.0, -0.4], [1.2, 0.3], [0.5, -0.2], [0.0, 0.0]], dtype=torch.float64)
    trajectory = [base + c @ basis for c in coeffs]
    res = pca_plane(trajectory, small_eval, resolution=3)
    found = np.stack([res.u, res.v])
    # the found basis spans the same subspace: projecting the true basis onto it loses nothing
    true = basis.numpy()
    np.testing.assert_allclose(true @ found.T @ found, true, atol=1e-9)
    np.testing.assert_allclose(found @ found.T, np.eye(2), atol=1e-9)
    for i, c in enumerate(coeffs):
        x, y, resid = res.project(trajectory[i].numpy())
        assert resid == pytest.approx(0.0, abs=1e-9)
        assert np.hypot(x, y) == pytest.approx(c.norm().item(), rel=1e-9)
        np.testing.assert_allclose(res.models[f"step {i}"], [x, y], atol=1e-9)
    assert res.spec["explained_variance"][0] > res.spec["explained_variance"][1] > 0
    with pytest.raises(ConfigError, match="at least three"):
        pca_plane(trajectory[:2], small_eval)


def test_grids_that_cannot_fit_in_memory_are_refused_before_allocating():
    from torch import nn

    from landscape import ConfigError, Evaluator, interpolate, plane

    models = [nn.Linear(3, 2) for _ in range(3)]
    ev = Evaluator(models[0], (torch.randn(5, 3), torch.zeros(5, dtype=torch.long)), device="cpu")
    with pytest.raises(ConfigError, match=r"resolution=100,001 .* needs about .*GiB.*choose a smaller resolution"):
        plane(*models, ev, resolution=100_001)
    with pytest.raises(ConfigError, match=r"alphas=1,000,000,000,000 points needs about"):
        interpolate(models[0], models[1], ev, alphas=10**12)
