"""FedGuCci / FedGuCci+ (fl/algorithms/fedgucci.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

import fl
from fl.algorithms.base import split_state
from fl.algorithms.fedgucci import anchor_pool, calibrated_cross_entropy, connectivity_loss, interpolate, sam_gradients
from landscape.infra.errors import ConfigError

from conftest import float32_tolerance, forward_terms

RUN = dict(dataset="digits", clients=4, rounds=3, local_epochs=2, lr=0.1, seed=0, progress=False,
           save_clients="none")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedgucci")
    return {
        "fedavg": fl.api.run("fedavg", out=root / "fedavg", **RUN),
        "beta0": fl.api.run("fedgucci", out=root / "beta0", beta=0.0, **RUN),
        "fedgucci": fl.api.run("fedgucci", out=root / "fedgucci", anchors=2, beta=0.5, **RUN),
        "fedgucci+": fl.api.run("fedgucci+", out=root / "plus", anchors=2, **RUN),
    }


def test_beta_zero_is_fedavg_bit_for_bit(runs) -> None:
    for r in range(RUN["rounds"] + 1):
        a, b = runs["fedavg"].global_state(r), runs["beta0"].global_state(r)
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)
    # beta > 0 does change the result
    g1, g0 = runs["fedgucci"].global_state(), runs["fedavg"].global_state()
    assert any(not torch.equal(g1[k], g0[k]) for k in g0)


def test_anchor_pool_holds_last_n_global_models(runs) -> None:
    run = runs["fedgucci"]
    for r in range(1, RUN["rounds"] + 1):
        state = run.algorithm_state(r)
        pool, rounds = anchor_pool(state)
        assert rounds == list(range(max(0, r - 2), r))  # models broadcast in rounds r-1 and r
        for anchor, j in zip(pool, rounds):
            stored = run.global_state(j)
            assert anchor.keys() == stored.keys()
            assert all(torch.equal(anchor[k].cpu(), stored[k]) for k in stored)


def test_algorithms_train_above_chance(runs) -> None:
    for key in ("fedgucci", "fedgucci+"):
        acc = [m["test_accuracy"] for m in runs[key].metrics]
        assert acc[-1] > 0.3 > acc[0], (key, acc)  # chance is 0.1


def test_first_full_batch_step_equals_fedavg_with_scaled_lr(tmp_path) -> None:
    """Round 1, one anchor (= the received w), fixed alpha, one full-batch step.

    The interpolated point is w itself, so Eq. 12's gradient is (1 + beta * alpha) * grad
    L(w).
    """
    common = dict(dataset="digits", clients=2, rounds=1, batch_size=5000, local_epochs=1, momentum=0.0, seed=3,
                  progress=False, save_clients="none")
    gucci = fl.api.run("fedgucci", out=tmp_path / "g", lr=0.1, beta=1.0, anchors=1, alpha_sampler="fixed",
                       fixed_alpha=0.5, **common)
    avg = fl.api.run("fedavg", out=tmp_path / "a", lr=0.15, **common)
    a, b = gucci.global_state(1), avg.global_state(1)
    assert any(not torch.equal(a[k], gucci.global_state(0)[k]) for k in a)
    # one full-batch gradient, summed once (and scaled) or twice (and added): the forward's dot products and the
    # float32 sum over a client's samples, at the size of the weights
    samples = max(len(d) for d in gucci.client_datasets().values())
    tol = float32_tolerance(forward_terms(gucci.module()) + samples)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=tol, atol=tol * float(b[k].abs().max()))


@pytest.mark.parametrize("update", ["joint", "sequential"])
def test_fedgucci_plus_sam_steps_match_a_hand_computation(tmp_path, update) -> None:
    """FedGuCci+, one client, one anchor (the received w0), alpha 0.5, one full batch, plain SGD.

    The paper reading takes one SAM step on CE_tau(w) + beta CE_tau(w/2 + w0/2); the official
    code's takes a SAM step on CE_tau(w), then one on beta CE_tau(w/2 + w0/2) (N + 1 steps).
    """
    lr, beta, rho, tau = 0.1, 1.0, 0.05, 0.1
    run = fl.api.run("fedgucci+", out=tmp_path / update, dataset="digits", clients=1, rounds=1,
                     batch_size=5000, local_epochs=1, lr=lr, momentum=0.0, seed=1, progress=False, beta=beta, anchors=1,
                     alpha_sampler="fixed", fixed_alpha=0.5, update=update, calibration=tau, sam_rho=rho)
    module = run.module()
    x, y = run.client_datasets()[0].tensors
    offset = tau * torch.bincount(y, minlength=10).double().pow(-0.25)
    w0 = {k: v.double() for k, v in run.global_state(0).items()}

    def ce(w: dict) -> torch.Tensor:
        logits = functional_call(module.double(), w, (x.double(),))
        return F.cross_entropy(logits - offset, y)

    def conn(w: dict) -> torch.Tensor:
        return beta * ce({k: 0.5 * w[k] + 0.5 * w0[k] for k in w})

    def sam(w: dict, f) -> dict:
        names = list(w)
        g = torch.autograd.grad(f({k: w[k].requires_grad_(True) for k in names}), [w[k] for k in names])
        norm = torch.sqrt(sum((t ** 2).sum() for t in g))
        shifted = {k: (w[k] + rho * t / norm).detach().requires_grad_(True) for k, t in zip(names, g)}
        g2 = torch.autograd.grad(f(shifted), [shifted[k] for k in names])
        return {k: (w[k] - lr * t).detach() for k, t in zip(names, g2)}

    start = {k: v.clone() for k, v in w0.items()}
    if update == "joint":
        expected = sam(start, lambda w: ce(w) + conn(w))
    else:
        expected = sam(sam(start, ce), conn)
    got = run.global_state(1)
    # float32 against float64: two gradients per SAM step (the forward's dot products and the sum over the
    # samples each), the gradient's norm over every parameter, up to 2 SAM steps
    params = sum(t.numel() for t in expected.values())
    tol = float32_tolerance(2 * (2 * (forward_terms(module) + len(y)) + params), sides=1)
    for k in expected:
        torch.testing.assert_close(got[k].double(), expected[k], rtol=tol, atol=tol * float(expected[k].abs().max()))


def _mlp() -> nn.Module:
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


def test_connectivity_gradient_is_alpha_times_gradient_at_interpolated_point() -> None:
    model = _mlp()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(16, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (16,), generator=gen)
    params, buffers = split_state(model, model.state_dict())
    anchor = {n: p.detach() + torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in params.items()}
    alpha = 0.3
    loss = connectivity_loss(model, params, anchor, buffers, x, y, torch.tensor([alpha], dtype=torch.float64))
    grads = torch.autograd.grad(loss, list(params.values()))
    # independent computation: gradient of L at theta = alpha w + (1 - alpha) w_anc
    theta = {n: (alpha * p + (1 - alpha) * anchor[n]).detach().requires_grad_(True) for n, p in params.items()}
    at_theta = torch.autograd.grad(F.cross_entropy(functional_call(model, theta, (x,)), y), list(theta.values()))
    for g, h in zip(grads, at_theta):
        torch.testing.assert_close(g, alpha * h, rtol=1e-10, atol=1e-12)
    # finite difference along a random direction
    direction = {n: torch.randn(p.shape, generator=gen, dtype=torch.float64) for n, p in params.items()}
    eps = 1e-6

    def value(sign: float) -> float:
        shifted = {n: (p + sign * eps * direction[n]).detach() for n, p in params.items()}
        alphas = torch.tensor([alpha], dtype=torch.float64)
        return float(connectivity_loss(model, shifted, anchor, buffers, x, y, alphas))

    fd = (value(1) - value(-1)) / (2 * eps)
    analytic = sum(float((g * direction[n]).sum()) for g, n in zip(grads, params))
    assert fd == pytest.approx(analytic, rel=1e-6)
    # the anchor is fixed: no gradient reaches it even when its tensors require one
    live = {n: a.clone().requires_grad_(True) for n, a in anchor.items()}
    theta = interpolate(params, live, alpha)
    sum(t.sum() for t in theta.values()).backward()
    assert all(a.grad is None for a in live.values())


def test_calibrated_cross_entropy_formula_and_masking() -> None:
    labels = torch.tensor([0, 0, 0, 0, 1, 2, 2])  # class 3 absent
    loss_fn = calibrated_cross_entropy(labels, 4, tau=0.1)
    logits = torch.tensor([[0.5, -0.2, 0.1, 2.0], [0.0, 1.0, -1.0, 0.3]], requires_grad=True)
    y = torch.tensor([0, 2])
    counts = torch.tensor([4.0, 1.0, 2.0])
    shifted = logits[:, :3] - 0.1 * counts ** -0.25
    expected = -(torch.log_softmax(shifted, dim=1)[torch.arange(2), y]).mean()
    got = loss_fn(logits, y)
    torch.testing.assert_close(got, expected)
    got.backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[:, 3] == 0).all()
    assert calibrated_cross_entropy(labels, 4, tau=0.0) is F.cross_entropy


def test_sam_gradient_on_quadratic_matches_closed_form() -> None:
    """f(w) = w^T A w / 2: the SAM gradient is A (w + rho A w / |A w|); w is back in place."""
    a = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    w0 = torch.tensor([0.7, -1.2], dtype=torch.float64)
    params = {"w": w0.clone().requires_grad_(True)}
    value, grads = sam_gradients(params, lambda: 0.5 * params["w"] @ a @ params["w"], rho=0.05)
    g = a @ w0
    torch.testing.assert_close(grads["w"], a @ (w0 + 0.05 * g / g.norm()))
    assert torch.equal(params["w"].detach(), w0)
    assert float(value) == pytest.approx(float(0.5 * w0 @ a @ w0))
    assert torch.equal(sam_gradients(params, lambda: 0.5 * params["w"] @ a @ params["w"], rho=0.0)[1]["w"], g)


def test_invalid_options_raise() -> None:
    for bad in ({"beta": -1}, {"anchors": 0}, {"alpha_sampler": "grid"}, {"update": "alternate"},
                {"fixed_alpha": 1.5}):
        with pytest.raises(ConfigError):
            fl.api.build_config("fedgucci", dataset="digits", model=None, clients=2, rounds=1,
                                participation=1.0, local_epochs=1, batch_size=8, lr=0.1,
                                partition="dirichlet", alpha=0.5, seed=0, device="cpu", options=bad)
