"""Inverse-curvature products (conjugate gradients) and diagonal estimates on any curvature operator."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import landscape
from landscape.curvature.inverse import as_inverse
from landscape.curvature.linear import MatrixOperator
from landscape.infra.errors import ConfigError, CurvatureError


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    x = torch.randn(12, 3, dtype=torch.float64)
    y = torch.randn(12, 2, dtype=torch.float64)
    ev = landscape.Evaluator(model, (x, y), loss="mse", dtype=torch.float64, progress=False)
    return model, ev


def spd(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(n, n, generator=g, dtype=torch.float64)
    return m @ m.T + 0.1 * torch.eye(n, dtype=torch.float64)


def test_cg_on_the_ggn_matches_a_dense_solve(mlp):
    model, ev = mlp
    op = landscape.curvature_operator(model, ev, kind="ggn")
    dense = op.dense()
    b = torch.randn(op.size, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    damping = 1e-2
    res = landscape.inverse_product(op, b, damping=damping, tol=1e-10)
    expected = torch.linalg.solve(dense + damping * torch.eye(op.size, dtype=torch.float64), b)
    assert res.converged and res.relative_residual <= 1e-10
    assert res.matvecs == res.iterations == len(res.residuals) - 1
    np.testing.assert_allclose(res.x, expected.numpy(), rtol=1e-6, atol=1e-8)


def test_cg_on_a_damped_hessian_matches_a_dense_solve(mlp):
    model, ev = mlp
    op = landscape.curvature_operator(model, ev, kind="hessian")
    dense = op.dense()
    eig = torch.linalg.eigvalsh(dense)
    damping = float(-eig[0]) + 0.5 if eig[0] < 0 else 0.5
    b = torch.randn(op.size, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    res = landscape.inverse_product(op, b, damping=damping, tol=1e-10)
    expected = torch.linalg.solve(dense + damping * torch.eye(op.size, dtype=torch.float64), b)
    assert res.converged
    np.testing.assert_allclose(res.x, expected.numpy(), rtol=1e-6, atol=1e-8)
    true_residual = np.linalg.norm(b.numpy() - (dense.numpy() + damping * np.eye(op.size)) @ res.x)
    assert true_residual <= 1e-8 * float(b.norm())


def test_cg_converges_within_n_iterations_on_an_spd_matrix():
    n = 12
    a = spd(n, 3)
    b = torch.randn(n, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    res = landscape.inverse_product(MatrixOperator(a), b, tol=1e-8)
    assert res.converged and res.iterations <= n
    np.testing.assert_allclose(res.x, torch.linalg.solve(a, b).numpy(), rtol=1e-6)
    assert torch.equal(b, torch.randn(n, generator=torch.Generator().manual_seed(4), dtype=torch.float64))


def test_cg_with_k_distinct_eigenvalues_ends_in_k_iterations():
    q, _ = torch.linalg.qr(torch.randn(20, 20, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    a = q @ torch.diag(torch.tensor([5.0] * 10 + [1.0] * 7 + [2.0] * 3, dtype=torch.float64)) @ q.T
    res = landscape.inverse_product(MatrixOperator(a), torch.ones(20, dtype=torch.float64), tol=1e-10)
    assert res.converged and res.iterations == 3


def test_non_positive_curvature_on_an_indefinite_hessian_is_refused(mlp):
    model, ev = mlp
    op = landscape.curvature_operator(model, ev, kind="hessian")
    eig, vec = torch.linalg.eigh(op.dense())
    assert eig[0] < 0, "the fixture's Hessian should be indefinite"
    with pytest.raises(CurvatureError, match=r"non-positive curvature.*add damping.*ggn"):
        landscape.inverse_product(op, vec[:, 0], damping=0.0)


def test_bad_arguments_are_refused_in_one_line():
    op = MatrixOperator(spd(3, 0))
    for kwargs, pattern in [({"damping": -1.0}, "damping"), ({"tol": 0.0}, "tol"), ({"max_iter": 0}, "max_iter")]:
        with pytest.raises(ConfigError, match=pattern):
            landscape.inverse_product(op, torch.ones(3), **kwargs)
    with pytest.raises(ConfigError, match=r"size \(3,\), got shape \(4,\)"):
        landscape.inverse_product(op, torch.ones(4))


def test_zero_rhs_and_the_scipy_inverse():
    a = spd(5, 6)
    op = MatrixOperator(a)
    zero = landscape.inverse_product(op, np.zeros(5))
    assert zero.converged and zero.iterations == 0 and not zero.x.any()
    inv = as_inverse(op, 0.3, tol=1e-10)
    v = np.arange(5.0)
    np.testing.assert_allclose((a.numpy() + 0.3 * np.eye(5)) @ (inv @ v), v, atol=1e-8)


@pytest.mark.parametrize("kind", ["ggn", "hessian", "empirical_fisher"])
def test_exact_diagonal_equals_the_dense_diagonal(mlp, kind):
    model, ev = mlp
    op = landscape.curvature_operator(model, ev, kind=kind)
    est = landscape.curvature_diagonal(op, method="exact")
    np.testing.assert_allclose(est.values, torch.diagonal(op.dense()).numpy(), rtol=1e-12, atol=1e-14)
    assert est.matvecs == op.size and not est.stderr.any()


def test_hutchinson_diagonal_is_within_its_standard_errors_and_seeded(mlp):
    model, ev = mlp
    op = landscape.curvature_operator(model, ev, kind="ggn")
    exact = torch.diagonal(op.dense()).numpy()
    est = landscape.curvature_diagonal(op, samples=300, seed=0)
    assert est.matvecs == 300 and est.values.shape == exact.shape
    assert np.all(np.abs(est.values - exact) <= 4 * est.stderr + 1e-12)
    again = landscape.curvature_diagonal(op, samples=300, seed=0)
    np.testing.assert_array_equal(again.values, est.values)
    other = landscape.curvature_diagonal(op, samples=300, seed=1)
    assert not np.array_equal(other.values, est.values)


def test_hutchinson_diagonal_is_unbiased_over_seeds():
    a = spd(6, 7)
    op = MatrixOperator(a)
    means = np.stack([landscape.curvature_diagonal(op, samples=10, seed=s).values for s in range(200)])
    spread = means.std(axis=0, ddof=1) / np.sqrt(len(means))
    assert np.all(np.abs(means.mean(axis=0) - torch.diagonal(a).numpy()) <= 4 * spread)


def test_diagonal_refusals():
    op = MatrixOperator(spd(4, 0))
    with pytest.raises(ConfigError, match="use method='hutchinson'"):
        landscape.curvature_diagonal(op, method="exact", max_exact=3)
    with pytest.raises(ConfigError, match="did you mean 'exact'"):
        landscape.curvature_diagonal(op, method="exakt")
    with pytest.raises(ConfigError, match="samples"):
        landscape.curvature_diagonal(op, samples=1)
