"""The curvature package's design.

Solvers see only the operator interface, the registry finds methods by name, thick-restart
Lanczos converges in bounded memory, BatchNorm modes and frozen parameters are honoured at a
single point, and non-convergence is reported. The operator kinds (Hessian, GGN, empirical and
Monte-Carlo Fisher) equal independent dense references, are told apart by the cache, and
refuse bad kinds, options and losses in one line.

References are independent: numpy ``eigvalsh`` and scipy ``eigsh`` on explicit matrices,
``torch.func.hessian`` of a hand-written loss, explicit Jacobians with closed-form output Hessians,
and per-sample gradients taken one sample at a time.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.sparse.linalg import eigsh
from torch import nn
from torch.func import functional_call, hessian

import landscape
from landscape import ConfigError
from landscape.curvature import registry
from landscape.curvature.lanczos import lanczos_top
from landscape.curvature.operators import MatrixOperator, SymmetricOperator
from landscape.results.curvature import TraceEstimate

from fault_counts import tally


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
        registry.TRACE_ESTIMATORS.remove("exact-diagonal")


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


# ------------------------------------------------------------------ curvature operator kinds
# Independent references on a 2-layer tanh MLP (3 -> 2 -> 3, 17 parameters) in float64: the Hessian
# by torch.autograd.functional.hessian of a hand-written mean loss, the GGN from explicit Jacobians
# (torch.autograd.functional.jacobian) and the closed-form output Hessians, the empirical Fisher from
# per-sample gradients taken one sample at a time in a Python loop.
class TinyMLP(nn.Module):
    def __init__(self, hidden: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(3, 2) if hidden else nn.Identity()
        self.fc2 = nn.Linear(2 if hidden else 3, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)) if isinstance(self.fc1, nn.Linear) else x)


class Branchy(TinyMLP):
    """The same MLP with a data-dependent branch, which torch.func.vmap cannot batch."""

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        if bool((x.abs() < 1e6).all()):
            h = h * 1.0
        return self.fc2(h)


class Noisy(TinyMLP):
    def forward(self, x):
        return super().forward(x) + 1e-3 * torch.randn(x.shape[0], 3, dtype=x.dtype)


LOSSES = {
    "cross_entropy": lambda f, y: -torch.log_softmax(f, -1).gather(1, y[:, None])[:, 0],
    "mse": lambda f, y: ((f - y) ** 2).sum(-1),
    "nll": lambda f, y: -f.gather(1, y[:, None])[:, 0],
}


def _kind_problem(loss: str = "cross_entropy", n: int = 10, seed: int = 0, module: type = TinyMLP, **kw):
    torch.manual_seed(seed)
    model = module(**kw).double()
    g = gen(seed + 1)
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = torch.randn(n, 3, generator=g, dtype=torch.float64) if loss == "mse" else torch.randint(0, 3, (n,), generator=g)
    ev = landscape.Evaluator(model, (x, y), loss=loss, dtype=torch.float64, device="cpu", batch_size=4,
                             progress=False)
    return model, x, y, ev


def _references(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss: str) -> dict[str, torch.Tensor]:
    """Dense Hessian, GGN and empirical Fisher of the mean loss, and the Jacobians/output Hessians."""
    from torch.autograd.functional import hessian as dense_hessian
    from torch.autograd.functional import jacobian

    state = {k: v.detach() for k, v in model.state_dict().items()}
    names = [k for k, _ in model.named_parameters()]
    sizes = [state[k].numel() for k in names]
    theta = torch.cat([state[k].reshape(-1) for k in names])

    def outputs(flat, xb):
        parts = {k: p.reshape(state[k].shape) for k, p in zip(names, torch.split(flat, sizes))}
        return functional_call(model.eval(), {**state, **parts}, (xb,))

    per_sample = LOSSES[loss]
    n = len(x)
    h = dense_hessian(lambda t: per_sample(outputs(t, x), y).mean(), theta)
    jac = jacobian(lambda t: outputs(t, x), theta)  # (n, classes, P)
    f = outputs(theta, x).detach()
    if loss == "cross_entropy":
        p = torch.softmax(f, -1)
        out_h = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    else:
        out_h = 2.0 * torch.eye(3, dtype=torch.float64).expand(n, 3, 3)
    ggn = torch.einsum("ncp,ncd,ndq->pq", jac, out_h, jac) / n
    ef = torch.zeros(len(theta), len(theta), dtype=torch.float64)
    for i in range(n):
        t = theta.clone().requires_grad_(True)
        (gi,) = torch.autograd.grad(per_sample(outputs(t, x[i:i + 1]), y[i:i + 1]).sum(), t)
        ef += torch.outer(gi, gi) / n
    return {"hessian": h, "ggn": ggn, "empirical_fisher": ef, "jacobian": jac, "outputs": f, "output_hessian": out_h}


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
@pytest.mark.parametrize("kind", ["hessian", "ggn", "empirical_fisher"])
def test_dense_and_matvec_equal_the_independent_references(kind, loss):
    model, x, y, ev = _kind_problem(loss)
    expected = _references(model, x, y, loss)[kind]
    op = landscape.curvature_operator(model, ev, kind=kind)
    assert op.kind == kind and op.size == 17 and op.names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    np.testing.assert_allclose(op.dense().numpy(), expected.numpy(), rtol=1e-10, atol=1e-13)
    v = torch.randn(17, generator=gen(3), dtype=torch.float64)
    np.testing.assert_allclose(op.matvec(v).numpy(), (expected @ v).numpy(), rtol=1e-10, atol=1e-13)
    assert op.matvecs == 18  # 17 for dense(), one for matvec


def test_batchnorm_is_held_fixed_in_eval_mode_for_every_kind():
    model, _, _ = _tiny_problem(bn=True)
    with torch.no_grad():  # statistics that matter
        model.bn.running_mean.copy_(torch.linspace(-1, 1, 5))
        model.bn.running_var.copy_(torch.linspace(0.5, 2, 5))
    x, y = _data(12, seed=4)
    ev = landscape.Evaluator(model, (x, y), dtype=torch.float64, device="cpu", batch_size=5, progress=False)
    from torch.autograd.functional import jacobian

    state = {k: v.detach() for k, v in model.state_dict().items()}
    names = [k for k, _ in model.named_parameters()]
    sizes = [state[k].numel() for k in names]
    theta = torch.cat([state[k].reshape(-1) for k in names])

    def outputs(flat):
        parts = {k: p.reshape(state[k].shape) for k, p in zip(names, torch.split(flat, sizes))}
        return functional_call(model.eval(), {**state, **parts}, (x,))

    jac = jacobian(outputs, theta)
    p = torch.softmax(outputs(theta), -1)
    ggn = torch.einsum("ncp,ncd,ndq->pq", jac, torch.diag_embed(p) - p[:, :, None] * p[:, None, :], jac) / len(x)
    grads = torch.einsum("ncp,nc->np", jac, p - nn.functional.one_hot(y, 3).double())  # d CE / d theta per sample
    ef = grads.T @ grads / len(x)
    op = landscape.curvature_operator(model, ev, kind="ggn")
    assert "bn.weight" in op.names and "bn.running_mean" not in op.names
    np.testing.assert_allclose(op.dense().numpy(), ggn.numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(landscape.curvature_operator(model, ev, kind="empirical_fisher").dense().numpy(),
                               ef.numpy(), rtol=1e-10, atol=1e-13)
    assert torch.equal(model.bn.running_mean, torch.linspace(-1, 1, 5).double())  # nothing written back


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_ggn_equals_the_hessian_for_a_linear_model(loss):
    # f linear in theta: H = G + sum_k (dl/df_k) d^2 f_k / d theta^2 and the second term vanishes exactly
    model, x, y, ev = _kind_problem(loss, hidden=False)
    ggn = landscape.curvature_operator(model, ev, kind="ggn").dense()
    hess = landscape.curvature_operator(model, ev).dense()
    assert ggn.shape == (12, 12)
    np.testing.assert_allclose(ggn.numpy(), hess.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ggn.numpy(), _references(model, x, y, loss)["hessian"].numpy(), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_ggn_and_fishers_are_positive_semidefinite_where_the_hessian_is_not(loss):
    model, x, y, ev = _kind_problem(loss, seed=2)
    spectra = {kind: np.linalg.eigvalsh(landscape.curvature_operator(model, ev, kind=kind, **opts).dense().numpy())
               for kind, opts in (("hessian", {}), ("ggn", {}), ("empirical_fisher", {}),
                                  ("fisher", {"mc_samples": 3}))}
    assert spectra["hessian"][0] < -1e-3 * spectra["hessian"][-1]  # this tanh network has negative curvature
    for kind in ("ggn", "empirical_fisher", "fisher"):
        assert spectra[kind][0] >= -1e-12 * spectra[kind][-1], kind


def _expected_squared_error(refs: dict[str, torch.Tensor], loss: str) -> float:
    """E ||F_hat_1 - G||_F^2 of a one-label Monte-Carlo Fisher, exactly: (1/N^2) sum_n E||J^T (s s^T - H) J||^2.

    Cross-entropy: the expectation over y ~ Categorical(p) is a sum over the classes. MSE: with
    s = sqrt(2) eps and A = J^T J, E||J^T (s s^T - 2 I) J||_F^2 = 4 ((tr A)^2 + ||A||_F^2) (Isserlis).
    """
    jac, f, out_h = refs["jacobian"], refs["outputs"], refs["output_hessian"]
    n, total = len(jac), 0.0
    for i in range(n):
        j = jac[i]
        if loss == "cross_entropy":
            p = torch.softmax(f[i], -1)
            for c in range(3):
                s = p - nn.functional.one_hot(torch.tensor(c), 3).double()
                total += float(p[c]) * float(torch.linalg.matrix_norm(j.T @ (torch.outer(s, s) - out_h[i]) @ j) ** 2)
        else:
            a = j.T @ j
            total += 4.0 * (float(torch.trace(a)) ** 2 + float(torch.linalg.matrix_norm(a)) ** 2)
    return total / n ** 2


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_monte_carlo_fisher_converges_to_the_ggn(loss):
    # F_hat_M = (1/N) sum_n (1/M) sum_m J^T s s^T J is unbiased for G (E[s s^T] = H_n for both losses), its
    # N M terms independent, so E||F_hat_M - G||_F^2 = V / M with V computed exactly above. Tolerance, fixed
    # before measuring: ||F_hat_M - G||_F <= 10 sqrt(V / M). By Markov's inequality on the squared error a
    # random seed breaks one such check with probability at most 1%; the seeds are fixed, so the test is
    # deterministic. The bound shrinks sqrt(1000)-fold from M = 1 to M = 1000 (the most mc_samples accepted),
    # where the root-mean-square error sqrt(V / M) itself (exact, not measured) is under 5% of ||G||.
    model, x, y, ev = _kind_problem(loss)
    refs = _references(model, x, y, loss)
    ggn = refs["ggn"].numpy()
    v = _expected_squared_error(refs, loss)
    errors = {}
    for m in (1, 30, 1000):
        fisher = landscape.curvature_operator(model, ev, kind="fisher", mc_samples=m, seed=m).dense().numpy()
        errors[m] = float(np.linalg.norm(fisher - ggn))
        assert errors[m] <= 10 * np.sqrt(v / m), (m, errors[m], np.sqrt(v / m))
    assert np.sqrt(v / 1000) < 0.05 * np.linalg.norm(ggn)
    assert errors[1] > 0  # a Monte-Carlo estimate, not the GGN itself


def test_fisher_labels_are_seeded():
    model, _, _, ev = _kind_problem()
    a = landscape.curvature_operator(model, ev, kind="fisher", mc_samples=2, seed=5)
    b = landscape.curvature_operator(model, ev, kind="fisher", mc_samples=2, seed=5)
    c = landscape.curvature_operator(model, ev, kind="fisher", mc_samples=2, seed=6)
    assert all(torch.equal(p, q) for p, q in zip(a.draws, b.draws)) and a.draws[0].shape == (2, 4)
    assert torch.equal(a.dense(), b.dense()) and not torch.equal(a.dense(), c.dense())


@pytest.mark.parametrize("per_sample", ["vmap", "jvp-vjp"])
def test_empirical_fisher_modes_agree_with_the_per_sample_loop(per_sample):
    from landscape.curvature.empirical_fisher import EmpiricalFisherOperator

    model, x, y, ev = _kind_problem("mse")
    op = EmpiricalFisherOperator(ev, model, per_sample=per_sample)
    assert op.mode == per_sample
    np.testing.assert_allclose(op.dense().numpy(), _references(model, x, y, "mse")["empirical_fisher"].numpy(),
                               rtol=1e-10, atol=1e-13)


def test_empirical_fisher_falls_back_to_batched_products_where_vmap_fails():
    from landscape.curvature.empirical_fisher import EmpiricalFisherOperator

    model, x, y, ev = _kind_problem(module=Branchy)
    op = landscape.curvature_operator(model, ev, kind="empirical_fisher")
    assert op.mode == "jvp-vjp"
    reference = _references(model, x, y, "cross_entropy")["empirical_fisher"]
    np.testing.assert_allclose(op.dense().numpy(), reference.numpy(), rtol=1e-10, atol=1e-13)
    with pytest.raises(RuntimeError, match="data-dependent control flow"):
        EmpiricalFisherOperator(ev, model, per_sample="vmap").matvec(torch.ones(17, dtype=torch.float64))
    assert landscape.curvature_operator(_kind_problem()[0], _kind_problem()[3], kind="empirical_fisher").mode == "vmap"


def test_empirical_fisher_takes_any_loss_and_ggn_refuses_unknown_output_hessians():
    model, x, y, ev = _kind_problem("nll")
    ef = landscape.curvature_operator(model, ev, kind="empirical_fisher").dense()
    np.testing.assert_allclose(ef.numpy(), _references(model, x, y, "nll")["empirical_fisher"].numpy(),
                               rtol=1e-10, atol=1e-13)
    custom = landscape.Evaluator(model, (x, y), loss=LOSSES["cross_entropy"], dtype=torch.float64, progress=False)
    cases = 0
    for evaluator, name in ((ev, "'nll'"), (custom, "'test_curvature_operators.<lambda>:")):
        for kind in ("ggn", "fisher"):
            for call in (lambda: landscape.curvature_operator(model, evaluator, kind=kind),
                         lambda: landscape.hessian_eigen(model, evaluator, kind=kind)):
                with pytest.raises(ConfigError) as err:
                    call()
                text = str(err.value)
                assert text.startswith(f"kind='{kind}' needs a loss whose output Hessian is known ('cross_entropy', "
                                       "'mse', 'causal_lm', 'masked_lm', 'token'), but the evaluator's loss is "
                                       f"{name}") and "\n" not in text
                assert "use kind='hessian' or kind='empirical_fisher'" in text
                cases += 1
    tally("bad inputs rejected", cases)


@pytest.mark.parametrize("kind", ["hessian", "ggn", "empirical_fisher", "fisher"])
def test_scipy_view_matches_matvec(kind):
    model, _, _, ev = _kind_problem("mse")
    op = landscape.curvature_operator(model, ev, kind=kind, **({"mc_samples": 2} if kind == "fisher" else {}))
    x = np.random.default_rng(0).standard_normal(17)
    view = op.to_scipy()
    assert view.shape == (17, 17) and view.dtype == np.float64
    np.testing.assert_allclose(view @ x, op.matvec(torch.from_numpy(x)).numpy(), rtol=1e-13, atol=1e-15)
    top = eigsh(view, k=2, which="LA", return_eigenvectors=False, tol=1e-12)
    np.testing.assert_allclose(np.sort(top), np.linalg.eigvalsh(op.dense().numpy())[-2:], rtol=1e-8)


def test_solvers_take_an_operator_directly():
    model, x, y, ev = _kind_problem()
    ggn = _references(model, x, y, "cross_entropy")["ggn"].numpy()
    op = landscape.curvature_operator(model, ev, kind="ggn")
    top = landscape.curvature.lanczos_top(op, 2, tol=1e-10, max_iter=17, generator=gen())
    np.testing.assert_allclose(top.values, np.linalg.eigvalsh(ggn)[::-1][:2], rtol=1e-8)
    exact = landscape.curvature.hutchpp(op, max_iter=51, generator=gen())  # a sketch of 17 spans the space
    assert exact.stderr == 0.0 and exact.value == pytest.approx(np.trace(ggn), rel=1e-10)
    nodes, _ = landscape.curvature.slq(op, 17, 1, generator=gen())
    np.testing.assert_allclose(np.sort(nodes[0]), np.linalg.eigvalsh(ggn), atol=1e-9 * np.abs(ggn).max())


def test_entry_points_route_kind_to_the_operator():
    model, x, y, ev = _kind_problem()
    refs = _references(model, x, y, "cross_entropy")
    values = landscape.hessian_eigenvalues(model, ev, k=2, tol=1e-10, max_iter=17, kind="ggn")
    np.testing.assert_allclose(values, np.linalg.eigvalsh(refs["ggn"].numpy())[::-1][:2], rtol=1e-8)
    assert values.result.spec["operator"] == "ggn"
    trace = landscape.hessian_trace(model, ev, max_iter=51, kind="empirical_fisher")
    assert trace.value == pytest.approx(float(torch.trace(refs["empirical_fisher"])), rel=1e-10)
    dens = landscape.hessian_density(model, ev, iterations=17, kind="fisher", mc_samples=2, seed=1)
    fisher = landscape.curvature_operator(model, ev, kind="fisher", mc_samples=2, seed=1).dense().numpy()
    np.testing.assert_allclose(np.sort(dens.nodes[0]), np.linalg.eigvalsh(fisher), atol=1e-9 * np.abs(fisher).max())
    assert dens.spec["operator"] == "fisher" and dens.spec["mc_samples"] == 2


def test_cache_key_separates_the_kinds(tmp_path, monkeypatch):
    from landscape.cache.store import Cache
    from landscape.curvature.operators import CurvatureOperator

    model, x, y, _ = _kind_problem()
    ev = landscape.Evaluator(model, (x, y), dtype=torch.float64, device="cpu", batch_size=4, progress=False,
                             cache=Cache(tmp_path / "cache"))
    refs = _references(model, x, y, "cross_entropy")
    solver = dict(k=1, tol=1e-10, max_iter=17)
    ggn = landscape.hessian_eigen(model, ev, kind="ggn", **solver)  # first, so a shared key would return it below
    hess = landscape.hessian_eigen(model, ev, **solver)
    top_g, top_h = np.linalg.eigvalsh(refs["ggn"].numpy())[-1], np.linalg.eigvalsh(refs["hessian"].numpy())[-1]
    assert abs(top_g - top_h) > 1e-4 * abs(top_h)  # the two answers differ here
    assert ggn.values[0] == pytest.approx(top_g, rel=1e-8) and hess.values[0] == pytest.approx(top_h, rel=1e-8)
    assert (ggn.spec["operator"], hess.spec["operator"]) == ("ggn", "hessian")
    assert len(Cache(tmp_path / "cache").keys()["results"]) == 2

    def boom(*args, **kwargs):
        raise AssertionError("computed although cached")

    monkeypatch.setattr(CurvatureOperator, "__init__", boom)
    assert landscape.hessian_eigen(model, ev, **solver) == hess
    assert landscape.hessian_eigen(model, ev, kind="ggn", **solver) == ggn
    with pytest.raises(AssertionError, match="computed although cached"):
        landscape.hessian_eigen(model, ev, kind="empirical_fisher", **solver)


def test_bad_kind_and_options_are_refused_in_one_line():
    model, _, _, ev = _kind_problem()
    listing = "available: ekfac, empirical_fisher, fisher, ggn, hessian, kfac"
    calls = (lambda **o: landscape.curvature_operator(model, ev, **o),
             lambda **o: landscape.hessian_eigen(model, ev, **o),
             lambda **o: landscape.hessian_trace(model, ev, **o),
             lambda **o: landscape.hessian_density(model, ev, **o))
    cases = [({"kind": "gnn"}, rf"^unknown curvature kind 'gnn' \(did you mean 'ggn'\?\); {listing}$"),
             ({"kind": "Hessian"}, rf"^unknown curvature kind 'Hessian' \(did you mean 'hessian'\?\); {listing}$"),
             ({"kind": "newton"}, rf"^unknown curvature kind 'newton'; {listing}$"),
             ({"kind": ["ggn"]},
              r"^kind must be a string, one of ekfac, empirical_fisher, fisher, ggn, hessian, kfac; got \[.ggn.\]$"),
             ({"kind": "ggn", "hvp": "retained"}, r"^curvature kind 'ggn' has no option 'hvp'; it takes none$"),
             ({"kind": "hessian", "mc_samples": 4},
              r"^curvature kind 'hessian' has no option 'mc_samples'; its options: hvp$"),
             ({"kind": "fisher", "mc_samples": 0},
              r"^curvature kind 'fisher' option mc_samples must be >= 1 and <= 1000, got 0$"),
             ({"kind": "fisher", "mc_samples": 2.5}, r"^curvature kind 'fisher' option mc_samples must be an integer"),
             ({"kind": "empirical_fisher", "kind_options": {"per_sampl": "vmap"}},
              r"^curvature kind 'empirical_fisher' has no option 'per_sampl' \(did you mean 'per_sample'\?\); "
              r"its options: per_sample$"),
             ({"kind": "empirical_fisher", "kind_options": {"per_sample": "fast"}},
              r"^curvature kind 'empirical_fisher' option per_sample must be one of 'auto', 'vmap', 'jvp-vjp'"),
             ({"kind": "fisher", "kind_options": [("mc_samples", 2)]},
              r"^kind_options must be a mapping of the 'fisher' kind's options, got list$"),
             ({"kind": "fisher", "mc_samples": 2, "kind_options": {"mc_samples": 3}},
              r"^mc_samples=2 disagrees with kind_options\['mc_samples'\]=3; give it once$")]
    for options, message in cases:
        for call in calls:
            with pytest.raises(ConfigError, match=message) as err:
                call(**options)
            assert "\n" not in str(err.value)
    tally("bad inputs rejected", len(cases) * len(calls))


def test_randomness_in_the_forward_is_refused_for_every_kind():
    model, _, _, ev = _kind_problem(module=Noisy)
    for kind in ("hessian", "ggn", "empirical_fisher", "fisher"):
        with pytest.raises(ConfigError, match="different outputs for the same input and weights"):
            landscape.curvature_operator(model, ev, kind=kind)
    tally("bad inputs rejected", 4)


def test_registered_kinds_name_themselves():
    from landscape.curvature.registry import OPERATOR_KINDS

    assert OPERATOR_KINDS.names() == ("ekfac", "empirical_fisher", "fisher", "ggn", "hessian", "kfac")
    assert all(cls.kind == name for name, cls in OPERATOR_KINDS.entries().items())


@pytest.mark.filterwarnings("ignore:hessian_(eigen|trace).*did not reach")  # a short budget, on purpose
def test_cli_curvature_commands_take_kind(tmp_path, capsys):
    import json

    from fl.datasets import load_dataset
    from fl.models import build_model
    from landscape_cli.main import main

    model = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=0)
    path = landscape.save_state_dict(model.state_dict(), tmp_path / "m.pt")
    bundle = load_dataset("digits")
    ev = landscape.Evaluator(model, (bundle.test_x, bundle.test_y), progress=False)
    base = ["--module", "mlp", "--checkpoints", str(path), "--data", "digits", "--out", str(tmp_path / "o"),
            "--json", "--no-figures", "--no-cache", "--quiet", "--seed", "3"]
    assert main(["hessian", *base, "--kind", "ggn", "--k", "2", "--max-iter", "12"]) == 0
    eig = landscape.hessian_eigen(model, ev, k=2, max_iter=12, seed=3, kind="ggn")
    np.testing.assert_allclose(json.loads(capsys.readouterr()[0])["numbers"]["m"]["eigenvalues"], eig.values, rtol=1e-6)
    assert main(["trace", *base, "--kind", "fisher", "--mc-samples", "2", "--max-iter", "12"]) == 0
    tr = landscape.hessian_trace(model, ev, max_iter=12, seed=3, kind="fisher", mc_samples=2)
    assert json.loads(capsys.readouterr()[0])["numbers"]["m"]["trace"] == pytest.approx(tr.value, rel=1e-6)
    assert main(["trace", *base, "--kind", "empirical_fisher", "--kind-option", "per_sample=jvp-vjp",
                 "--max-iter", "12"]) == 0
    tr = landscape.hessian_trace(model, ev, max_iter=12, seed=3, kind="empirical_fisher",
                                 kind_options={"per_sample": "jvp-vjp"})
    assert tr.spec["kind_options"] == {"per_sample": "jvp-vjp"}  # a non-default option enters the key
    assert json.loads(capsys.readouterr()[0])["numbers"]["m"]["trace"] == pytest.approx(tr.value, rel=1e-6)
    assert main(["density", *base, "--kind", "gnn"]) == 2
    assert "invalid choice: 'gnn'" in capsys.readouterr()[1]
    assert main(["trace", *base, "--kind", "ggn", "--hvp", "retained"]) == 2
    err = capsys.readouterr()[1].strip()
    assert err == "landscape: error: curvature kind 'ggn' has no option 'hvp'; it takes none"
    assert main(["hessian", *base, "--kind", "fisher", "--kind-option", "mc_sample=2"]) == 2
    err = capsys.readouterr()[1].strip()
    assert err == ("landscape: error: curvature kind 'fisher' has no option 'mc_sample' (did you mean 'mc_samples'?); "
                   "its options: mc_samples")
    tally("bad inputs rejected", 3)
