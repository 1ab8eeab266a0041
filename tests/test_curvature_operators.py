"""The curvature package's design: solvers see only the operator interface, the registry finds
methods by name, thick-restart Lanczos converges in bounded memory, BatchNorm modes and frozen
parameters are honoured at a single point, and non-convergence is reported.

References are independent: numpy ``eigvalsh`` and scipy ``eigsh`` on explicit matrices, and
``torch.func.hessian`` of a hand-written loss.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.sparse.linalg import eigsh
from torch import nn
from torch.func import functional_call, hessian

import landscape
from landscape.curvature import registry
from landscape.curvature.lanczos import lanczos_top
from landscape.curvature.operators import MatrixOperator, SymmetricOperator
from landscape.results.curvature import TraceEstimate


def symmetric(eigs: np.ndarray, seed: int = 0) -> torch.Tensor:
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((len(eigs), len(eigs))))
    return torch.tensor((q * eigs) @ q.T)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_thick_restart_converges_on_clustered_top_eigenvalues_in_a_small_basis():
    # five top eigenvalues within 0.1% of each other over a wide bulk: a hard case for Krylov methods
    eigs = np.concatenate([10.0 - 0.002 * np.arange(5), np.linspace(-3, 8, 395)])
    a = symmetric(eigs, seed=11)
    res = lanczos_top(MatrixOperator(a), 5, tol=1e-8, max_iter=2000, generator=gen(), basis_size=30)
    assert res.converged and res.restarts > 0  # the basis of 30 vectors was restarted
    np.testing.assert_allclose(res.values, np.sort(eigs)[::-1][:5], atol=1e-7)
    # unrestarted with the same product budget cap of 30 it cannot converge
    short = lanczos_top(MatrixOperator(a), 5, tol=1e-8, max_iter=30, generator=gen())
    assert not short.converged and short.restarts == 0


def test_restarted_residuals_are_the_true_residuals():
    eigs = np.concatenate([[6.0, 5.9, 5.8], np.linspace(-1, 4, 197)])
    a = symmetric(eigs, seed=12)
    res = lanczos_top(MatrixOperator(a), 3, tol=1e-3, max_iter=400, generator=gen(1), basis_size=12,
                      return_vectors=True)
    assert res.restarts > 0
    for value, vec, r in zip(res.values, res.vectors, res.residuals):
        true = float(torch.linalg.vector_norm(a @ vec - value * vec))
        assert true == pytest.approx(r, rel=1e-5, abs=1e-10)


def test_matrix_operator_scipy_view_agrees_with_eigsh():
    eigs = np.linspace(-2, 7, 50)
    op = MatrixOperator(symmetric(eigs, seed=2))
    assert isinstance(op, SymmetricOperator)
    top = eigsh(op.to_scipy(), k=2, which="LA", return_eigenvectors=False)
    np.testing.assert_allclose(np.sort(top)[::-1], [7.0, np.sort(eigs)[-2]], rtol=1e-10)


def test_a_registered_trace_estimator_is_found_by_name():
    @registry.trace_estimator("exact-diagonal")
    def exact(op, *, tol, max_iter, generator, min_samples):
        eye = torch.eye(op.size, dtype=op.dtype)
        diag = [float(op.matvec(e)[i]) for i, e in enumerate(eye)]
        return TraceEstimate(value=sum(diag), stderr=0.0, samples=np.asarray(diag), method="exact-diagonal",
                             matvecs=op.size, dim=op.size, converged=True)

    try:
        model, ev, h = _tiny_problem()
        est = landscape.hessian_trace(model, ev, method="exact-diagonal")
        assert est.value == pytest.approx(np.trace(h), rel=1e-10)
        with pytest.raises(landscape.ConfigError, match="unknown trace estimator 'nope'.*exact-diagonal"):
            landscape.hessian_trace(model, ev, method="nope")
    finally:
        registry.TRACE_ESTIMATORS.pop("exact-diagonal")


class Tiny(nn.Module):
    def __init__(self, bn: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(4, 5)
        self.bn = nn.BatchNorm1d(5) if bn else nn.Identity()
        self.fc2 = nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.bn(self.fc1(x))))


def _data(n: int = 40, seed: int = 0):
    g = gen(seed)
    return torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def _tiny_problem(bn: bool = False, **options):
    torch.manual_seed(0)
    model = Tiny(bn).double()
    x, y = _data()
    ev = landscape.Evaluator(model, (x, y), dtype=torch.float64, device="cpu", **options)
    return model, ev, _exact(model, x, y)


def _exact(model: nn.Module, x: torch.Tensor, y: torch.Tensor, names=None, state=None) -> np.ndarray:
    state = {k: v.detach() for k, v in (state or model.state_dict()).items()}
    names = names or [k for k, _ in model.named_parameters()]
    sizes = [state[k].numel() for k in names]

    def loss(flat):
        parts = {k: p.reshape(state[k].shape) for k, p in zip(names, torch.split(flat, sizes))}
        return nn.functional.cross_entropy(functional_call(model.eval(), {**state, **parts}, (x,)), y)

    return hessian(loss)(torch.cat([state[k].reshape(-1) for k in names])).numpy()


def test_frozen_parameters_are_left_out_unless_asked_for():
    model, _, _ = _tiny_problem()
    for p in model.fc1.parameters():
        p.requires_grad_(False)
    x, y = _data()
    ev = landscape.Evaluator(model, (x, y), dtype=torch.float64, device="cpu")
    trainable = _exact(model, x, y, names=["fc2.weight", "fc2.bias"])
    everything = _exact(model, x, y)
    top = landscape.hessian_eigenvalues(model, ev, k=1, tol=1e-10, max_iter=30)
    assert top[0] == pytest.approx(np.linalg.eigvalsh(trainable)[-1], rel=1e-8)
    assert landscape.hessian_trace(model, ev, method="hutch++", max_iter=3 * 18).value == pytest.approx(
        np.trace(trainable), rel=1e-8)
    full = landscape.hessian_eigenvalues(model, ev, k=1, tol=1e-10, max_iter=60, include_frozen=True)
    assert full[0] == pytest.approx(np.linalg.eigvalsh(everything)[-1], rel=1e-8)


def test_recompute_mode_re_estimates_batchnorm_statistics_at_a_single_point():
    model, _, _ = _tiny_problem(bn=True)
    with torch.no_grad():  # statistics far from those of the data
        model.bn.running_mean.fill_(3.0)
        model.bn.running_var.fill_(9.0)
    x, y = _data()
    bn_x, _ = _data(64, seed=5)
    ev = landscape.Evaluator(model, (x, y), dtype=torch.float64, device="cpu", bn="recompute",
                             bn_data=(bn_x, torch.zeros(64, dtype=torch.long)))
    h = landscape.hessian_eigen(model, ev, k=1, tol=1e-10, max_iter=60)
    # reference: statistics of bn_x under the model, as train-mode BatchNorm with momentum=None computes them
    with torch.no_grad():
        act = model.fc1(bn_x)
    state = dict(model.state_dict())
    state["bn.running_mean"] = act.mean(0)
    state["bn.running_var"] = act.var(0, unbiased=True)
    expected = np.linalg.eigvalsh(_exact(model, x, y, state=state))[-1]
    stale = np.linalg.eigvalsh(_exact(model, x, y))[-1]
    assert h.values[0] == pytest.approx(expected, rel=1e-8)
    assert abs(expected - stale) > 1e-3 * abs(expected)  # the mode makes a difference here


def test_non_convergence_is_reported_and_carried_by_the_array():
    model, ev, _ = _tiny_problem()
    with pytest.warns(UserWarning, match="did not reach tol"):
        values = landscape.hessian_eigenvalues(model, ev, k=3, tol=1e-14, max_iter=3)
    assert isinstance(values, np.ndarray) and values.converged is False and values.matvecs == 3
    done = landscape.hessian_eigenvalues(model, ev, k=1, tol=1e-6, max_iter=38)
    assert done.converged is True and done.residuals[0] <= 1e-6 * abs(done[0])
