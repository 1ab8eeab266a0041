"""FLOCO / FLOCO+ and the simplex geometry they rely on (fl/algorithms/simplex.py, floco.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.stats import kstest

import fl
from fl.algorithms.floco import SimplexLinear
from fl.algorithms.simplex import (
    assign_points,
    pca_scores,
    project_to_simplex,
    riesz_energy,
    sample_subregion,
    sample_uniform_simplex,
    simplex_centre,
)
from landscape.infra.errors import ConfigError

from conftest import float32_tolerance

# ----------------------------------------------------------------------------- simplex geometry

def _qp_projection(v: np.ndarray, z: float) -> np.ndarray:
    """Brute-force projection: solve min |b - v|^2 s.t. b >= 0, sum b = z with SLSQP."""
    n = v.size
    res = minimize(lambda b: float(((b - v) ** 2).sum()), np.full(n, z / n), jac=lambda b: 2 * (b - v),
                   bounds=[(0, None)] * n, constraints=[{"type": "eq", "fun": lambda b: b.sum() - z}],
                   method="SLSQP", options={"ftol": 1e-14, "maxiter": 500})
    return res.x


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_projection_matches_quadratic_program(n: int) -> None:
    rng = np.random.default_rng(n)
    for trial in range(10):
        v = rng.normal(scale=1.5, size=n)
        z = float(rng.uniform(0.2, 2.0))
        got = project_to_simplex(torch.tensor(v), z).numpy()
        np.testing.assert_allclose(got, _qp_projection(v, z), atol=1e-6)
        assert got.min() >= 0 and got.sum() == pytest.approx(z, abs=1e-12)


def test_projection_is_idempotent_on_simplex_points_and_batched() -> None:
    g = torch.Generator().manual_seed(0)
    pts = sample_uniform_simplex(4, 50, g).double()
    pts = pts / pts.sum(1, keepdim=True)  # exact in float64
    torch.testing.assert_close(project_to_simplex(pts), pts, atol=1e-12, rtol=0)
    batch = torch.randn(3, 7, 4, generator=g, dtype=torch.float64)
    rows = torch.stack([project_to_simplex(r) for r in batch.reshape(-1, 4)]).reshape(3, 7, 4)
    torch.testing.assert_close(project_to_simplex(batch), rows)
    with pytest.raises(ConfigError):
        project_to_simplex(batch, z=0.0)


def test_uniform_simplex_moments() -> None:
    """Dirichlet(1_n): mean 1/n, variance (n-1)/(n^2 (n+1)); Dirichlet(a): (n-1)/(n^2 (n a + 1))."""
    g = torch.Generator().manual_seed(1)
    n = 4
    for conc in (1.0, 2.5):
        x = sample_uniform_simplex(n, 200_000, g, concentration=conc).double()
        assert (x >= 0).all() and torch.allclose(x.sum(1), torch.ones(len(x), dtype=x.dtype), atol=1e-6)
        torch.testing.assert_close(x.mean(0), torch.full((n,), 1 / n, dtype=x.dtype), atol=3e-3, rtol=0)
        expected_var = (n - 1) / (n * n * (n * conc + 1))
        torch.testing.assert_close(x.var(0), torch.full((n,), expected_var, dtype=x.dtype),
                                   atol=2e-3 * expected_var * 10, rtol=0)


def test_exact_subregion_points_lie_in_simplex_and_ball() -> None:
    g = torch.Generator().manual_seed(2)
    for n in (3, 6, 10):
        centres = [simplex_centre(n, torch.float64), torch.eye(n, dtype=torch.float64)[n - 1],
                   project_to_simplex(torch.randn(n, generator=g, dtype=torch.float64))]
        for c in centres:
            x = sample_subregion(c, 0.2, 300, g).double()
            assert (x >= 0).all()
            assert torch.allclose(x.sum(1), torch.ones(300, dtype=x.dtype), atol=1e-6)
            assert ((x - c).abs().sum(1) <= 0.2 + 1e-6).all()


def test_exact_subregion_is_uniform_in_interior() -> None:
    """Uniform on an (n-1)-dim L1 ball: P(|d|_1 <= r) = (r/rho)^(n-1)."""
    g = torch.Generator().manual_seed(3)
    n, rho = 4, 0.3
    d = (sample_subregion(simplex_centre(n, torch.float64), rho, 4000, g).double()
         - simplex_centre(n, torch.float64)).abs().sum(1).numpy()
    assert kstest(d, lambda r: np.clip(r / rho, 0, 1) ** (n - 1)).pvalue > 1e-3


def test_exact_subregion_matches_rejection_sampler_at_boundary() -> None:
    """Near a face the region is cut by the simplex: compare with brute-force rejection."""
    g = torch.Generator().manual_seed(4)
    c = torch.tensor([0.7, 0.25, 0.05], dtype=torch.float64)
    rho = 0.4
    ours = sample_subregion(c, rho, 20000, g).double()
    # brute force: uniform in the box [c - rho, c + rho] for the first two coordinates
    box = (torch.rand(400_000, 2, generator=g, dtype=torch.float64) * 2 - 1) * rho + c[:2]
    full = torch.cat([box, 1 - box.sum(1, keepdim=True)], dim=1)
    keep = (full >= 0).all(1) & ((full - c).abs().sum(1) <= rho)
    ref = full[keep]
    torch.testing.assert_close(ours.mean(0), ref.mean(0), atol=4e-3, rtol=0)
    torch.testing.assert_close(ours.std(0), ref.std(0), atol=4e-3, rtol=0)
    for k in range(3):
        assert kstest(ours[:, k].numpy(), ref[:, k].numpy()).pvalue > 1e-3


def test_reference_subregion_sampler_radius_is_uniform() -> None:
    g = torch.Generator().manual_seed(5)
    c = simplex_centre(5, torch.float64)
    x = sample_subregion(c, 0.1, 3000, g, method="reference").double()
    r = (x - c).abs().sum(1).numpy()
    assert r.max() <= 0.1 + 1e-6
    assert kstest(r / 0.1, "uniform").pvalue > 1e-3
    with pytest.raises(ConfigError):
        sample_subregion(c, 0.1, 3, g, method="nope")
    with pytest.raises(ConfigError):
        sample_subregion(c, -0.1, 3, g)


# ----------------------------------------------------------------------------- FLOCO algorithm
RUN = dict(dataset="digits", clients=4, rounds=3, local_epochs=2, lr=0.1, seed=0, progress=False)
TAU = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("floco")
    return {
        "fedavg": fl.api.run("fedavg", out=root / "fedavg", save_clients="none", **RUN),
        "floco": fl.api.run("floco", out=root / "floco", vertices=3, tau=TAU, **RUN),
        "floco+": fl.api.run("floco+", out=root / "plus", vertices=3, tau=TAU, **RUN),
    }


def _accuracy(module: torch.nn.Module, state: dict, x: torch.Tensor, y: torch.Tensor) -> float:
    module.load_state_dict(state)
    module.eval()
    with torch.no_grad():
        return float((module(x).argmax(1) == y).double().mean())


def test_global_model_is_simplex_centre_and_starts_like_fedavg(runs) -> None:
    run = runs["floco"]
    for r in range(RUN["rounds"] + 1):
        train, plain = run.training_state(r), run.global_state(r)
        endpoints = train["classifier.endpoints"]
        assert endpoints.shape[0] == 3
        # the centre as the engine computes it against torch's mean of the 3 endpoints (3 terms, other order)
        tol = float32_tolerance(3)
        torch.testing.assert_close(plain["classifier.weight"], endpoints.mean(0), rtol=0,
                                   atol=tol * float(endpoints.abs().max()))
        assert torch.equal(plain["classifier.bias"], train["classifier.bias"])
        torch.testing.assert_close(run.algorithm_state(r)["floco.endpoints"], endpoints, rtol=0, atol=0)
    initial, fedavg_initial = run.global_state(0), runs["fedavg"].global_state(0)
    for k in fedavg_initial:  # one seeded initialisation; FLOCO's classifier is the centre of its endpoints
        if k != "classifier.weight":  # independent endpoints by default (tests/test_floco_init.py)
            torch.testing.assert_close(initial[k], fedavg_initial[k], rtol=0, atol=0)
    # the stored plain checkpoint is what the engine evaluated
    test = run.test_dataset()
    acc = _accuracy(run.module(), run.global_state(), test.tensors[0], test.tensors[1])
    assert acc == pytest.approx(run.metrics[-1]["test_accuracy"], abs=1e-12)
    # before tau the stored client models sit at the centre, so they average to the global model
    clients = run.client_states(TAU - 1)
    n = {k: len(d) for k, d in run.client_datasets().items()}
    mean = sum(n[k] * clients[k]["classifier.weight"].double() for k in clients) / sum(n.values())
    tol = float32_tolerance(len(clients) + 1)  # the server's sample-weighted sum over the clients, then a division
    torch.testing.assert_close(mean.float(), run.global_state(TAU - 1)["classifier.weight"], rtol=0,
                               atol=tol * max(float(c["classifier.weight"].abs().max()) for c in clients.values()))


def test_client_checkpoints_are_personalised_models_at_their_points(runs) -> None:
    """From tau on, client k's checkpoint is its model at alpha_k.

    The shared layers are its trained upload (their sample-weighted mean is the global
    model's, FedAvg Eq. 4), the classifier is not the centre's; for FLOCO+ it is the
    personal model at alpha_k.
    """
    run = runs["floco"]
    points = run.algorithm_state(TAU)["floco.points"]
    clients = run.client_states()
    n = {k: len(d) for k, d in run.client_datasets().items()}
    g = run.global_state()
    shared = [k for k in g if not k.startswith("classifier.")]
    tol = float32_tolerance(len(clients) + 1)  # the server's sample-weighted sum over the clients, then a division
    for key in shared:
        mean = sum(n[k] * clients[k][key].double() for k in clients) / sum(n.values())
        torch.testing.assert_close(mean.float(), g[key], rtol=0,
                                   atol=tol * max(float(c[key].abs().max()) for c in clients.values()))
    centre_mean = sum(n[k] * clients[k]["classifier.weight"].double() for k in clients) / sum(n.values())
    assert not torch.allclose(centre_mean.float(), g["classifier.weight"], atol=1e-4)
    plus = runs["floco+"]
    personal = plus.store.read_client_states(RUN["rounds"])
    for k, stored in plus.client_states().items():
        weight = torch.einsum("m,moi->oi", points[k], personal[k]["classifier.endpoints"])
        torch.testing.assert_close(stored["classifier.weight"], weight, rtol=0, atol=0)  # the same einsum
        for key in shared:
            assert torch.equal(stored[key], personal[k][key])


def test_vertices_is_the_papers_m_plus_one_and_endpoints_is_refused(tmp_path) -> None:
    from fl.algorithms.floco import FlocoOptions

    assert FlocoOptions().vertices == 7  # the paper's M = 6
    with pytest.raises(ConfigError, match="endpoints"):
        fl.api.run("floco", out=tmp_path / "x", endpoints=6, **{**RUN, "rounds": 1})


def test_literal_eq11_aggregation_damps_the_step_under_partial_participation(tmp_path) -> None:
    """theta_new = theta + sum_{k in S} N_k / N (theta_k - theta), N over all clients.

    Checked on the shared layers of the stored client uploads (before tau they are the plain
    uploads).
    """
    args = {**RUN, "rounds": 1, "participation": 0.5, "tau": 5, "vertices": 3}
    run = fl.api.run("floco", out=tmp_path / "lit", aggregation="literal", **args)
    default = fl.api.run("floco", out=tmp_path / "par", **args)
    n = {k: len(d) for k, d in run.client_datasets().items()}
    total = sum(n.values())
    g0, g1 = run.global_state(0), run.global_state(1)
    clients = run.client_states(1)
    assert len(clients) == 2
    for key in g0:
        if key.startswith("classifier."):
            continue
        expected = g0[key].double() + sum(n[k] / total * (clients[k][key].double() - g0[key].double())
                                          for k in clients)
        # the server's float32 update: a difference, a weight and a sum per client, added to the global weight;
        # the bound is at the size of the weights involved
        tol = float32_tolerance(3 * len(clients) + 1)
        size = max(float(t.abs().max()) for t in [g0[key]] + [clients[k][key] for k in clients])
        torch.testing.assert_close(g1[key].double(), expected, rtol=0, atol=tol * size)
    participants = sum(n[k] for k in clients)
    for key in g0:
        if not key.startswith("classifier."):
            mean = sum(n[k] / participants * clients[k][key].double() for k in clients)
            tol = float32_tolerance(len(clients) + 1)  # the server's sample-weighted float32 sum over the clients
            torch.testing.assert_close(default.global_state(1)[key].double(), mean, rtol=0,
                                       atol=tol * max(float(clients[k][key].abs().max()) for k in clients))


class _BNNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.flatten = torch.nn.Flatten()
        self.hidden = torch.nn.Linear(64, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.classifier = torch.nn.Linear(16, 10)
        with torch.no_grad():
            for layer in (self.hidden, self.classifier):
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) / layer.in_features ** 0.5)
                layer.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.relu(self.bn(self.hidden(self.flatten(x)))))


def test_local_buffers_stay_with_their_client(tmp_path) -> None:
    """local_buffers=True.

    A client's BatchNorm counter after round 2 is its own steps of both rounds (its buffers
    were never replaced by the average); without it, the average of round 1's counters plus
    its round-2 steps.
    """
    args = {**RUN, "rounds": 2, "vertices": 3, "tau": 5, "batch_size": 32, "local_epochs": 1}
    local = fl.api.run("floco", out=tmp_path / "local", model=_BNNet(), local_buffers=True, **args)
    shared = fl.api.run("floco", out=tmp_path / "shared", model=_BNNet(), **args)
    steps = {k: math.ceil(len(d) / 32) for k, d in local.client_datasets().items()}
    key = "bn.num_batches_tracked"
    for k, s in steps.items():
        assert int(local.client_states(2)[k][key]) == 2 * s
    assert int(shared.client_states(2)[0][key]) != 2 * steps[0]
    # the global model keeps the participants' mean buffers for its own evaluation
    mean = sum(len(d) * local.client_states(2)[k]["bn.running_mean"].double()
               for k, d in local.client_datasets().items()) / sum(len(d) for d in local.client_datasets().values())
    tol = float32_tolerance(len(local.client_datasets()) + 1)  # the server's sample-weighted float32 sum
    size = max(float(c["bn.running_mean"].abs().max()) for c in local.client_states(2).values())
    torch.testing.assert_close(local.global_state(2)["bn.running_mean"].double(), mean, rtol=0, atol=tol * size)


def test_subregions_assigned_at_tau_and_local_accuracy_at_client_points(runs) -> None:
    for key in ("floco", "floco+"):
        run = runs[key]
        assert "floco.points" not in run.algorithm_state(TAU - 1)
        points = run.algorithm_state(TAU)["floco.points"].double()
        assert points.shape == (4, 3) and (points >= 0).all()
        torch.testing.assert_close(points.sum(1), torch.ones(4, dtype=torch.float64), atol=1e-6, rtol=0)
        torch.testing.assert_close(run.algorithm_state()["floco.points"], points.float())
        # recompute the local accuracy: each client's (personal) model at alpha_k on its split
        if key == "floco":
            states = {k: run.training_state() for k in range(4)}
        else:
            states = run.store.read_client_states(RUN["rounds"])
        module = run.module()
        accs = []
        for k, data in run.client_test_datasets().items():
            s = states[k]
            plain = {n: t for n, t in s.items() if not n.startswith("classifier.")}
            plain["classifier.weight"] = torch.einsum("m,moi->oi", points[k].float(), s["classifier.endpoints"])
            plain["classifier.bias"] = s["classifier.bias"]
            accs.append(_accuracy(module, plain, *data.tensors))
        assert sum(accs) / 4 == pytest.approx(run.metrics[-1]["local_accuracy"], abs=1e-9)


def test_floco_plus_keeps_personal_models_and_global_training_equals_floco(runs) -> None:
    plus, base = runs["floco+"], runs["floco"]
    personal = plus.store.read_client_states(RUN["rounds"])
    assert sorted(personal) == [0, 1, 2, 3]
    g = plus.training_state()
    assert any(not torch.equal(personal[0][k], g[k]) for k in g)
    # the global part of FLOCO+ is FLOCO: same seeds give the same global models
    for k, t in base.training_state().items():
        assert torch.equal(t, g[k])


def test_floco_trains_above_chance(runs) -> None:
    for key in ("floco", "floco+"):
        acc = [m["test_accuracy"] for m in runs[key].metrics]
        assert acc[-1] > 0.2 > acc[0], (key, acc)  # chance is 0.1
        assert runs[key].metrics[-1]["local_accuracy"] > 0.2


def test_simplex_linear_endpoint_gradient_is_alpha_scaled() -> None:
    """dL/dW_m = alpha_m dL/dW at W = sum_m alpha_m W_m (FLOCO Eq. 10)."""
    gen = torch.Generator().manual_seed(0)
    layer = SimplexLinear(5, 3, 4).double()
    with torch.no_grad():
        layer.endpoints.copy_(torch.randn(4, 3, 5, generator=gen, dtype=torch.float64))
    alpha = sample_uniform_simplex(4, 1, gen)[0].double()
    layer.alpha.copy_(alpha)
    x = torch.randn(8, 5, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (8,), generator=gen)
    torch.nn.functional.cross_entropy(layer(x), y).backward()
    w = torch.einsum("m,moi->oi", alpha, layer.endpoints.detach()).requires_grad_(True)
    torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, w, layer.bias.detach()), y).backward()
    torch.testing.assert_close(layer.endpoints.grad, alpha[:, None, None] * w.grad[None])


def test_pca_scores_match_sklearn_up_to_sign() -> None:
    from sklearn.decomposition import PCA

    gen = torch.Generator().manual_seed(1)
    signals = torch.randn(9, 40, generator=gen, dtype=torch.float64)
    ours = pca_scores(signals, 4).numpy()
    ref = PCA(n_components=4, svd_solver="full").fit_transform(signals.numpy())
    for j in range(4):
        assert min(np.abs(ours[:, j] - ref[:, j]).max(), np.abs(ours[:, j] + ref[:, j]).max()) < 1e-9
    padded = pca_scores(signals[:3], 5)  # 3 clients: at most 3 components, the rest zero
    assert padded.shape == (3, 5) and (padded[:, 3:] == 0).all()


def test_assign_points_matches_brute_force_grid_search() -> None:
    from scipy.spatial.distance import pdist

    gen = torch.Generator().manual_seed(2)
    kappa = torch.randn(6, 3, generator=gen, dtype=torch.float64) * 0.5
    grid = torch.linspace(1e-4, 1, 50, dtype=torch.float64)
    points, z, energy, _ = assign_points(kappa, grid)
    brute = []
    for zi in grid.tolist():
        beta = np.stack([_qp_projection(k, zi) for k in kappa.numpy()]) / zi
        d = np.maximum(pdist(beta), 1e-4)
        brute.append(np.log(np.mean(d ** -2.0)))
    np.testing.assert_allclose(energy.numpy(), brute, rtol=1e-4, atol=1e-4)
    assert z == pytest.approx(float(grid[int(np.argmin(brute))]))
    torch.testing.assert_close(points.sum(1), torch.ones(6, dtype=torch.float64))
    assert riesz_energy(points) == pytest.approx(min(brute), abs=1e-4)
