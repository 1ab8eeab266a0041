"""Hessian-vector products, Krylov solvers, trace estimators and the curvature API.

References are independent: numpy ``eigvalsh`` on explicit matrices, and
``torch.func.hessian`` of a hand-written loss of a tiny network.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.func import functional_call, hessian

from landscape.cache.store import Cache
from landscape.curvature.along import curvature_along_path, curvature_plane
from landscape.curvature.density import broadened_density, slq
from landscape.curvature.functions import hessian_density, hessian_eigen, hessian_eigenvalues, hessian_trace
from landscape.curvature.hessian import HessianOperator
from landscape.curvature.lanczos import lanczos_top
from landscape.curvature.operators import CurvatureOperator, MatrixOperator
from landscape.curvature.power import power_iteration
from landscape.curvature.trace import hutchinson, hutchpp
from landscape.evaluation.evaluator import Evaluator
from landscape.infra.errors import ConfigError
from landscape.results import PlaneResult
from landscape.results.curvature import HessianEigen, SpectralDensity, TraceEstimate

from conftest import FLOAT64_UNIT_ROUNDOFF, float32_tolerance


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def symmetric(eigs: np.ndarray, seed: int = 0) -> torch.Tensor:
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((len(eigs), len(eigs))))
    return torch.tensor((q * eigs) @ q.T)


# ----------------------------------------------------------------- explicit matrices
def test_lanczos_top_k_algebraic_matches_eigvalsh():
    rng = np.random.default_rng(1)
    eigs = np.concatenate([[9.0, 7.0, 6.5, -12.0], rng.uniform(-2, 2, 116)])  # |-12| dominates
    a = symmetric(eigs)
    res = lanczos_top(MatrixOperator(a), 3, tol=1e-8, max_iter=120, generator=gen(),
                      return_vectors=True)
    # Lanczos tolerance: residuals <= 1e-8 |theta| bound each value's distance to an eigenvalue (Bauer-Fike);
    # rtol 1e-7 is loose on purpose
    np.testing.assert_allclose(res.values, [9.0, 7.0, 6.5], rtol=1e-7)
    assert res.converged and res.matvecs < 120
    for value, vec, r in zip(res.values, res.vectors, res.residuals):
        true_residual = float(torch.linalg.vector_norm(a @ vec - value * vec))
        # reported residual is the actual one; a factor 10 and 1e-12 on purpose: the recurrence and a fresh
        # product round differently
        assert true_residual <= 10 * r + 1e-12


def test_lanczos_residual_bounds_eigenvalue_error_at_loose_tolerance():
    eigs = np.linspace(0.0, 10.0, 200) ** 2 / 10
    a = symmetric(eigs, seed=3)
    res = lanczos_top(MatrixOperator(a), 4, tol=1e-2, max_iter=200, generator=gen(2))
    exact = np.sort(eigs)[::-1][:4]
    assert np.all(np.abs(res.values - exact) <= res.residuals + 1e-12)
    assert np.all(np.abs(res.values - exact) <= 1e-2 * np.abs(exact))  # the Lanczos tolerance itself


def test_lanczos_finds_repeated_eigenvalues():
    eigs = np.concatenate([[5.0, 5.0, 5.0], np.linspace(-1, 1, 57)])
    a = symmetric(eigs, seed=4)
    res = lanczos_top(MatrixOperator(a), 4, tol=1e-9, max_iter=60, generator=gen())
    # Lanczos tolerance: residuals <= 1e-9 |theta| bound each value's distance to an eigenvalue; 1e-8 on purpose
    np.testing.assert_allclose(res.values, [5.0, 5.0, 5.0, 1.0], atol=1e-8)


def test_power_iteration_agrees_with_eigvalsh_on_psd_matrix():
    eigs = np.concatenate([[10.0, 6.0, 3.0], np.linspace(0, 1, 47)])
    a = symmetric(eigs, seed=5)
    res = power_iteration(MatrixOperator(a), 3, tol=1e-10, max_iter=2000, generator=gen())
    # power-iteration tolerance (residual <= 1e-10 |theta|) after deflating the earlier pairs, each known only to
    # its own tolerance: rtol 1e-6 is loose on purpose
    np.testing.assert_allclose(res.values, [10.0, 6.0, 3.0], rtol=1e-6)


def test_slq_with_full_krylov_space_reproduces_moments_exactly():
    eigs = np.random.default_rng(6).normal(size=40)
    a = symmetric(eigs, seed=6)
    nodes, weights = slq(MatrixOperator(a), 40, runs=3, generator=gen(7))
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-10)
    np.testing.assert_allclose(np.sort(nodes[0]), np.sort(eigs), atol=1e-8)
    # quadrature with a unit Rademacher probe z: sum w theta^p = z^T A^p z
    g = gen(7)
    from landscape.curvature.lanczos import rademacher_vector
    z = rademacher_vector(40, g, dtype=torch.float64)
    z = z / z.norm()
    for p in (1, 2, 3):
        exact = float(z @ torch.linalg.matrix_power(a, p) @ z)
        assert abs(float(np.sum(weights[0] * nodes[0] ** p)) - exact) < 1e-8


def test_broadened_density_integrates_to_one_and_keeps_the_mean():
    nodes = np.array([[-1.0, 0.0, 0.5, 30.0]])
    weights = np.array([[0.1, 0.6, 0.2, 0.1]])
    grid, density, sigma = broadened_density(nodes, weights, sigma=0.05)
    # the trapezoidal rule on a finite grid (to 6 sigma beyond the extreme nodes), not rounding, limits these
    # integrals: 1e-6 allows for its discretisation and the cut tails on purpose
    assert abs(np.trapezoid(density, grid) - 1.0) < 1e-6
    assert abs(np.trapezoid(grid * density, grid) - float(np.sum(nodes * weights))) < 1e-6
    with pytest.raises(ConfigError):
        broadened_density(nodes, weights, sigma=1e-9)


def test_hutchinson_is_exact_on_a_diagonal_matrix():
    d = torch.arange(1.0, 31.0, dtype=torch.float64)
    est = hutchinson(MatrixOperator(torch.diag(d)), tol=1e-3, max_iter=50, generator=gen())
    # Rademacher z: z^T D z = sum_i d_i z_i^2 sums small integers, exact in float64, so every sample is the trace
    assert est.value == float(d.sum())
    assert est.stderr == 0.0 and est.matvecs == 10 and est.converged


def test_hutchpp_exact_when_sketch_spans_and_unbiased_within_stderr():
    eigs = np.concatenate([[50.0, 30.0, 20.0], np.random.default_rng(8).uniform(-1, 1, 27)])
    a = symmetric(eigs, seed=8)
    full = hutchpp(MatrixOperator(a), tol=1e-3, max_iter=90, generator=gen())
    assert full.value == pytest.approx(eigs.sum(), rel=1e-10) and full.stderr == 0.0
    estimates, stderrs = [], []
    for seed in range(12):
        est = hutchpp(MatrixOperator(a), tol=0.0, max_iter=24, generator=gen(seed))
        assert est.matvecs == 24 and est.samples.size == 24 - 2 * 8
        estimates.append(est.value)
        stderrs.append(est.stderr)
        assert abs(est.value - eigs.sum()) < 5 * est.stderr + 1e-9
    # the mean of independent estimates agrees with the trace within its own standard error
    spread = np.std(estimates, ddof=1) / np.sqrt(len(estimates))
    assert abs(np.mean(estimates) - eigs.sum()) < 4 * spread + 1e-9
    # deflating the three big eigenvalues beats plain Hutchinson's variance at equal budget
    plain = [hutchinson(MatrixOperator(a), tol=0.0, max_iter=24, generator=gen(s)).value
             for s in range(12)]
    assert np.std(estimates) < np.std(plain)


# ------------------------------------------------------------------- a tiny network
class TinyNet(nn.Module):
    def __init__(self, bn: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6) if bn else nn.Identity()
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn(self.fc1(x))))


def make_problem(seed: int = 0, n: int = 37, bn: bool = False, batch_size: int = 64):
    model = TinyNet(bn).double()
    g = gen(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / (p.shape[-1] ** 0.5))
        if bn:
            model.bn.running_mean.uniform_(-0.5, 0.5, generator=g)
            model.bn.running_var.uniform_(0.5, 2.0, generator=g)
    x = torch.randn(n, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (n,), generator=g)
    ev = Evaluator(model, (x, y), dtype=torch.float64, batch_size=batch_size, device="cpu")
    return model, x, y, ev


def exact_hessian(model: nn.Module, x: torch.Tensor, y: torch.Tensor, names=None) -> np.ndarray:
    """Independent reference: torch.func.hessian of the mean cross-entropy over all data."""
    model = model.eval()
    params = {k: v.detach() for k, v in model.named_parameters()}
    names = names or list(params)
    sizes = [params[k].numel() for k in names]

    def loss(flat):
        parts = dict(zip(names, (p.reshape(params[k].shape) for k, p in zip(names, torch.split(flat, sizes)))))
        return nn.functional.cross_entropy(functional_call(model, {**params, **parts}, (x,)), y)

    flat = torch.cat([params[k].reshape(-1) for k in names])
    return hessian(loss)(flat).numpy()


@pytest.fixture(scope="module")
def problem():
    model, x, y, ev = make_problem()
    return model, ev, exact_hessian(model, x, y)


def test_hvp_matches_exact_hessian_in_every_mode(problem):
    model, _, h = problem
    _, _, _, ev = make_problem(batch_size=16)  # batches of 16 + 16 + 5: weighted by size
    for mode in ("forward-over-reverse", "reverse-over-reverse", "retained"):
        op = HessianOperator(ev, model, hvp=mode)
        dense = op.dense().numpy()
        np.testing.assert_allclose(dense, h, atol=1e-12)
        assert op.matvecs == h.shape[0]
    xs = torch.cat([x for x, _ in ev.batches])
    ys = torch.cat([y for _, y in ev.batches])
    with torch.no_grad():
        mean_loss = float(nn.functional.cross_entropy(model.eval()(xs), ys))
    # float64 on both sides: the forward's dot products (fan-ins 4 and 6), the log-softmax over 3 classes, the sums
    # of the non-negative per-sample losses in 3 batches or in one, and a division
    tol = float32_tolerance(4 + 6 + 3 + len(ys) + len(ev.batches) + 1, unit=FLOAT64_UNIT_ROUNDOFF)
    assert HessianOperator(ev, model).loss() == pytest.approx(mean_loss, rel=tol, abs=0)


def test_hvp_on_parameter_subset_and_batchnorm_buffers_fixed():
    model, x, y, ev = make_problem(seed=1, bn=True, batch_size=16)
    op = HessianOperator(ev, model, params=["fc2.*"])
    assert op.dim == 6 * 3 + 3
    h = exact_hessian(model, x, y, names=["fc2.weight", "fc2.bias"])
    np.testing.assert_allclose(op.dense().numpy(), h, atol=1e-12)
    full = HessianOperator(ev, model)  # BN affine parameters included, running stats fixed (eval)
    np.testing.assert_allclose(full.dense().numpy(), exact_hessian(model, x, y), atol=1e-12)


def test_nondeterministic_model_is_refused():
    class Noisy(TinyNet):
        def forward(self, x):
            return super().forward(x) + 0.1 * torch.rand_like(x[:, :3])

    model = Noisy().double()  # its forward draws from the global RNG on purpose
    g = gen(3)
    ev = Evaluator(model, (torch.randn(8, 4, generator=g, dtype=torch.float64), torch.zeros(8, dtype=torch.long)),
                   dtype=torch.float64, device="cpu")
    with pytest.raises(ConfigError, match="different outputs"):
        hessian_eigenvalues(model, ev)


def test_hessian_eigenvalues_lanczos_and_power(problem):
    model, ev, h = problem
    exact = np.linalg.eigvalsh(h)[::-1]
    top = hessian_eigenvalues(model, ev, k=3, tol=1e-6)
    assert top.shape == (3,)
    # the solvers' tolerances, not rounding, limit these: residuals <= tol |theta| bound the eigenvalue errors,
    # and the checks below are looser than each tol on purpose
    np.testing.assert_allclose(top, exact[:3], rtol=1e-5)
    values, vectors = hessian_eigenvalues(model, ev, k=2, tol=1e-8, return_eigenvectors=True)
    np.testing.assert_allclose(h @ vectors.T, vectors.T * values, atol=1e-6)
    res = hessian_eigen(model, ev, k=1, tol=1e-9, max_iter=3000, method="power")
    dominant = exact[np.argmax(np.abs(exact))]
    assert res.values[0] == pytest.approx(dominant, rel=1e-4)
    assert isinstance(res, HessianEigen) and res.matvecs > 1


def test_hessian_trace_methods_agree_with_exact_trace(problem):
    model, ev, h = problem
    trace = float(np.trace(h))
    for method in ("hutchinson", "hutch++"):
        est = hessian_trace(model, ev, tol=1e-2, max_iter=60, seed=3, method=method)
        assert isinstance(est, TraceEstimate) and est.method == method
        # stochastic estimators: within 5 of their own standard errors
        assert abs(est.value - trace) < 5 * est.stderr + 1e-12, (method, est.value, trace, est.stderr)
        assert est.matvecs <= 60
    sub = HessianOperator(ev, model, params="fc2.*").dense().numpy()
    exact = hessian_trace(model, ev, max_iter=3 * sub.shape[0], method="hutch++", params="fc2.*")
    assert exact.value == pytest.approx(float(np.trace(sub)), rel=1e-10) and exact.stderr == 0.0


def test_hessian_density_integrates_to_one_and_its_mean_is_trace_over_n(problem):
    model, ev, h = problem
    n = h.shape[0]
    runs = 12
    dens = hessian_density(model, ev, iterations=6, runs=runs, seed=1)
    assert isinstance(dens, SpectralDensity) and dens.nodes.shape == (runs, 6)
    # trapezoidal integrals of the broadened density on a finite grid: 1e-6 allows for the discretisation and the
    # cut tails on purpose
    assert abs(np.trapezoid(dens.density, dens.grid) - 1.0) < 1e-6
    assert np.trapezoid(dens.grid * dens.density, dens.grid) == pytest.approx(dens.mean, abs=1e-6)
    # the first moment is exact after one Lanczos step: each run's quadrature mean is z^T H z / n for a
    # Rademacher z: variance 2 sum_{i!=j} H_ij^2 / n^2
    sd = np.sqrt(2 * (np.sum(h ** 2) - np.sum(np.diag(h) ** 2))) / n / np.sqrt(runs)
    assert abs(dens.mean - np.trace(h) / n) < 4 * sd
    # with a full Krylov space a run recovers the whole spectrum
    full = hessian_density(model, ev, iterations=n, runs=1, seed=1)
    np.testing.assert_allclose(np.sort(full.nodes[0]), np.linalg.eigvalsh(h), atol=1e-8)
    assert abs(full.integral - 1.0) < 1e-6


def test_results_round_trip_and_cache_avoids_recomputation(tmp_path, monkeypatch):
    model, x, y, _ = make_problem(seed=2)
    ev = Evaluator(model, (x, y), dtype=torch.float64, device="cpu", cache=str(tmp_path / "c.h5"))
    first = [hessian_eigen(model, ev, k=2), hessian_trace(model, ev, max_iter=20),
             hessian_density(model, ev, iterations=10, runs=2)]
    def boom(*args, **kwargs):
        raise AssertionError("recomputed although cached")

    monkeypatch.setattr(CurvatureOperator, "__init__", boom)
    second = [hessian_eigen(model, ev, k=2), hessian_trace(model, ev, max_iter=20),
              hessian_density(model, ev, iterations=10, runs=2)]
    for a, b in zip(first, second):
        assert a == b
    assert len(Cache(tmp_path / "c.h5").keys()["results"]) == 3
    exact = TraceEstimate(value=2.0, stderr=0.0, samples=np.zeros(0), method="hutch++", matvecs=6, dim=3,
                          converged=True, exact=2.0)  # Hutch++ on a spanned space: no samples
    Cache(tmp_path / "c.h5").save_result("exact", exact)
    assert Cache(tmp_path / "c.h5").load_result("exact") == exact
    with pytest.raises(AssertionError, match="recomputed"):
        hessian_eigen(model, ev, k=2, seed=1)  # a different seed is a different result


def test_curvature_along_path_and_on_plane_match_pointwise_values():
    model_a, x, y, ev = make_problem(seed=3)
    model_b, _, _, _ = make_problem(seed=4)
    profile = curvature_along_path(model_a, model_b, ev, alphas=[0.0, 0.25, 1.0], k=2, tol=1e-8)
    assert profile.eigenvalues.shape == (3, 2)
    va, vb = ev.vector(model_a), ev.vector(model_b)
    # the same point ((1 - alpha) a + alpha b, the same float64 operations) through the same seeded Lanczos
    np.testing.assert_array_equal(profile.eigenvalues[1], hessian_eigenvalues(0.75 * va + 0.25 * vb, ev, k=2, tol=1e-8))
    # Lanczos tolerance (residual <= 1e-8 |theta|) against eigvalsh: rtol 1e-6 is loose on purpose
    np.testing.assert_allclose(profile.top[0], np.linalg.eigvalsh(exact_hessian(model_a, x, y))[-1], rtol=1e-6)
    origin = ev.vector(model_a).numpy()
    u = np.zeros_like(origin)
    u[0] = 1.0
    v = np.zeros_like(origin)
    v[-1] = 1.0
    xs, ys = np.array([0.0, 0.5, 1.0]), np.array([0.0, 1.0, 2.0])
    plane = PlaneResult(x=xs, y=ys, loss=np.zeros((3, 3)), accuracy=np.zeros((3, 3)), origin=origin, u=u, v=v,
                        param_mask=ev.space.param_mask.numpy())
    curv = curvature_plane(plane, ev, k=1, tol=1e-8, stride=2)  # grid x in {0, 1}, y in {0, 2}
    assert curv.top.shape == (2, 2) and list(curv.x) == [0.0, 1.0] and list(curv.y) == [0.0, 2.0]
    # the same point, but Lanczos runs for k = 1 and k = 2 stop at different residuals (<= 1e-8 |theta|): on purpose
    assert curv.top[0, 0] == pytest.approx(profile.top[0], rel=1e-6)
    point = torch.as_tensor(origin + 1.0 * u + 2.0 * v)
    assert curv.top[1, 1] == hessian_eigenvalues(point, ev, tol=1e-8)[0]  # the same point and seeded Lanczos


def test_invalid_arguments_raise_config_errors(problem):
    model, ev, _ = problem
    with pytest.raises(ConfigError):
        hessian_eigenvalues(model, ev, k=0)
    with pytest.raises(ConfigError):
        hessian_eigenvalues(model, ev, k=5, max_iter=3)
    with pytest.raises(ConfigError):
        hessian_eigenvalues(model, ev, method="arnoldi")
    with pytest.raises(ConfigError):
        hessian_trace(model, ev, method="xtrace")
    with pytest.raises(ConfigError):
        hessian_eigenvalues(model, ev, params=["nothing.*"])


def test_path_curvature_follows_the_evaluators_batchnorm_mode():
    model_a, x, y, _ = make_problem(seed=5, bn=True)
    model_b, _, _, _ = make_problem(seed=6, bn=True)
    ev = Evaluator(model_a, (x, y), dtype=torch.float64, device="cpu", bn="keep")
    va, vb = ev.vector(model_a), ev.vector(model_b)
    buffers = ~ev.space.param_mask
    mixed = vb.clone()
    mixed[buffers] = va[buffers]  # "keep": b's weights with a's running statistics
    profile = curvature_along_path(model_a, model_b, ev, alphas=[1.0], tol=1e-8)
    # alpha = 1 gives b's vector exactly (0 * a + b), the same point through the same seeded Lanczos
    assert profile.top[0] == hessian_eigenvalues(mixed, ev, tol=1e-8)[0]
    assert abs(profile.top[0] - hessian_eigenvalues(vb, ev, tol=1e-8)[0]) > 1e-6


def test_products_leave_nothing_behind(problem):
    """Memory is flat over iterations: no graph or tensor survives a product."""
    import gc

    model, ev, _ = problem
    op = HessianOperator(ev, model)
    v = torch.ones(op.dim, dtype=torch.float64)

    def live_tensors() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))

    op.matvec(v)
    before = live_tensors()
    for _ in range(15):
        op.matvec(v)
    assert live_tensors() == before
    assert all(p.grad is None for p in model.parameters())


def test_trace_summary_names_the_hutchpp_sketched_part():
    from landscape import TraceEstimate

    common = dict(value=7.0, stderr=0.1, samples=np.ones(3), matvecs=30, dim=100, converged=True)
    plus = TraceEstimate(method="hutch++", exact=6.1, **common)
    assert plus.summary()["sketched_part"] == "6.1" and "exact" not in repr(plus)
    assert "sketched_part" not in repr(TraceEstimate(method="hutchinson", **common))
