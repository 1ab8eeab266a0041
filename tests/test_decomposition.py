"""IMA Theorem 1 decomposition, averaging curves and CKA against independent numpy code."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from landscape.cache.store import Cache
from landscape.decomposition.ima import decompose, decompose_run, round_clients
from landscape.decomposition.similarity import averaging_curve, cka_matrix, linear_cka
from landscape.evaluation.evaluator import Evaluator
from landscape.infra.errors import ConfigError, DataError
from landscape.results import Decomposition

from conftest import float32_tolerance

C, F = 4, 3  # classes, features


def linear_state(rng: np.random.Generator, scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {"weight": torch.tensor(rng.normal(scale=scale, size=(C, F))),
            "bias": torch.tensor(rng.normal(scale=scale, size=C))}


def client_setup(realizations: int, seed: int = 0):
    """Three clients; client 2 also holds sample 0 of client 0 (an overlap)."""
    rng = np.random.default_rng(seed)
    xs = [rng.normal(size=(n, F)) for n in (5, 7, 4)]
    ys = [rng.integers(0, C, size=n) for n in (5, 7, 4)]
    xs[2] = np.vstack([xs[2], xs[0][:1]])
    ys[2] = np.concatenate([ys[2], ys[0][:1]])
    data = [(torch.tensor(x), torch.tensor(y)) for x, y in zip(xs, ys)]
    base = [linear_state(rng) for _ in range(3)]
    models = [[{k: v + torch.tensor(rng.normal(scale=0.3, size=v.shape)) for k, v in b.items()}
               for _ in range(realizations)] for b in base]
    return xs, ys, data, models


def evaluator_for(x=None, y=None, **kwargs) -> Evaluator:
    if x is None:
        g = torch.Generator().manual_seed(9)
        x, y = torch.randn(30, F, generator=g, dtype=torch.float64), torch.randint(0, C, (30,), generator=g)
    return Evaluator(nn.Linear(F, C).double(), (x, y), dtype=torch.float64, device="cpu", **kwargs)


def numpy_probs(state: dict[str, torch.Tensor], x: np.ndarray) -> np.ndarray:
    logits = x @ state["weight"].numpy().T + state["bias"].numpy()
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def numpy_decomposition(xs, ys, models, weights=None) -> dict[str, float]:
    """Straight transcription of Theorem 1 (docs/methods/ima.md) with explicit loops."""
    samples = {}
    for k, (x, y) in enumerate(zip(xs, ys)):
        for xi, yi in zip(x, y):
            samples.setdefault((xi.tobytes(), int(yi)), (xi, int(yi), set()))[2].add(k)
    sizes = np.array([len(y) for y in ys], dtype=float)
    p = sizes / sizes.sum() if weights is None else np.asarray(weights) / np.sum(weights)
    K, S = len(models), len(models[0])
    out = dict.fromkeys(["bias", "train_bias", "heter_bias", "cross", "variance", "covariance", "wens", "fma"], 0.0)
    fma_states = [{name: sum(p[k] * models[k][s][name] for k in range(K)) for name in ("weight", "bias")}
                  for s in range(S)]
    for xi, yi, owners in samples.values():
        target = np.eye(C)[yi]
        f = np.array([[numpy_probs(models[k][s], xi[None])[0] for s in range(S)] for k in range(K)])
        mu = f.mean(1)
        tb = sum(p[k] * (target - mu[k]) for k in range(K) if k in owners)
        hb = sum(p[k] * (target - mu[k]) for k in range(K) if k not in owners)
        tb = tb if isinstance(tb, np.ndarray) else np.zeros(C)
        hb = hb if isinstance(hb, np.ndarray) else np.zeros(C)
        out["bias"] += np.sum((tb + hb) ** 2)
        out["train_bias"] += np.sum(tb ** 2)
        out["heter_bias"] += np.sum(hb ** 2)
        out["cross"] += 2 * tb @ hb
        for k in range(K):
            out["variance"] += p[k] ** 2 * np.mean([np.sum((f[k, s] - mu[k]) ** 2) for s in range(S)])
            for j in range(K):
                if j != k:
                    out["covariance"] += p[k] * p[j] * np.mean([(f[k, s] - mu[k]) @ (f[j, s] - mu[j])
                                                                for s in range(S)])
        out["wens"] += np.mean([np.sum((target - sum(p[k] * f[k, s] for k in range(K))) ** 2) for s in range(S)])
        out["fma"] += np.mean([np.sum((target - numpy_probs(fma_states[s], xi[None])[0]) ** 2) for s in range(S)])
    n = len(samples)
    out = {k: v / n for k, v in out.items()}
    out["n"] = n
    out["locality"] = np.array([np.mean([np.sqrt(sum(float(((models[k][s][name] - fma_states[s][name]) ** 2).sum())
                                                     for name in ("weight", "bias"))) for s in range(S)])
                                for k in range(K)])
    return out


@pytest.mark.parametrize("weights", [None, [1.0, 2.0, 1.0]])
def test_decomposition_matches_independent_numpy_and_identities(weights):
    xs, ys, data, models = client_setup(realizations=3)
    ev = evaluator_for()
    dec = decompose(models, data, ev, weights=weights)
    ref = numpy_decomposition(xs, ys, models, weights)
    assert isinstance(dec, Decomposition) and dec.realizations == 3
    assert dec.num_samples == ref["n"] == 16  # 17 samples given, one shared by clients 0 and 2
    for name in ("bias", "train_bias", "heter_bias", "cross", "variance", "covariance"):
        assert getattr(dec, name) == pytest.approx(ref[name], rel=1e-10, abs=1e-14), name
    assert dec.wens_loss == pytest.approx(ref["wens"], rel=1e-10)
    assert dec.fma_loss == pytest.approx(ref["fma"], rel=1e-10)
    np.testing.assert_allclose(dec.locality, ref["locality"], rtol=1e-10)
    assert dec.wens_loss == pytest.approx(dec.bias + dec.variance + dec.covariance, rel=1e-12)
    assert dec.bias == pytest.approx(dec.train_bias + dec.heter_bias + dec.cross, rel=1e-12)
    assert dec.gap == pytest.approx(dec.fma_loss - dec.wens_loss, abs=1e-15)
    assert dec.variance > 0 and dec.covariance != 0
    np.testing.assert_allclose(dec.client_sizes, [5, 7, 5])


def test_single_realization_has_no_variance_or_covariance():
    xs, ys, data, models = client_setup(realizations=1)
    ev = evaluator_for()
    flat = [m[0] for m in models]  # plain model-likes, not lists
    with pytest.warns(UserWarning, match="one realization per client"):
        dec = decompose(flat, data, ev)
    assert not dec.variance_estimated and "variance_estimated=False" in repr(dec)
    assert dec.variance == 0.0 and dec.covariance == pytest.approx(0.0, abs=1e-15)
    assert dec.wens_loss == pytest.approx(dec.bias, rel=1e-12)
    ref = numpy_decomposition(xs, ys, models)
    assert dec.heter_bias == pytest.approx(ref["heter_bias"], rel=1e-10)


def test_identical_clients_on_identical_data_have_zero_gap_and_locality():
    rng = np.random.default_rng(4)
    state = linear_state(rng)
    x, y = torch.tensor(rng.normal(size=(6, F))), torch.tensor(rng.integers(0, C, size=6))
    dec = decompose([state, state], [(x, y), (x, y)], evaluator_for())
    np.testing.assert_allclose(dec.locality, 0.0, atol=1e-12)
    assert dec.gap == pytest.approx(0.0, abs=1e-12) and dec.heter_bias == 0.0 and dec.cross == 0.0
    # no sample lies outside a client's data: b_HB is exactly 0, so b is b_TB and both sums are the same
    assert dec.train_bias == dec.bias and np.isnan(dec.client_heter_bias).all()


def test_decomposition_round_trips_through_the_cache(tmp_path):
    _, _, data, models = client_setup(realizations=2)
    dec = decompose(models, data, evaluator_for())
    cache = Cache(tmp_path / "d.h5")
    cache.save_result("k", dec)
    assert cache.load_result("k") == dec


def test_decomposition_input_errors():
    _, _, data, models = client_setup(realizations=2)
    ev = evaluator_for()
    with pytest.raises(ConfigError, match="realizations"):
        decompose([models[0], models[1][:1], models[2]], data, ev)
    with pytest.raises(ConfigError, match="data"):
        decompose(models, data[:2], ev)
    with pytest.raises(ConfigError, match="weights"):
        decompose(models, data, ev, weights=[1.0, -1.0, 1.0])
    soft = [(x, torch.zeros(len(x), C, dtype=torch.float64)) for x, _ in data]
    with pytest.raises(DataError, match="integer class labels"):
        decompose(models, soft, ev)


def test_averaging_curve_enumerates_subsets_and_matches_direct_evaluation():
    rng = np.random.default_rng(5)
    states = [linear_state(rng) for _ in range(4)]
    ev = evaluator_for()
    curve = averaging_curve(states, ev, subsets=4, seed=1)
    assert list(curve.sizes) == [1, 2, 3, 4] and curve.loss.shape == (4, 4)
    single = ev.evaluate(states)
    np.testing.assert_allclose(np.sort(curve.loss[0]), np.sort(single.loss), rtol=1e-12)  # C(4,1) = 4: all
    assert np.isnan(curve.loss[3, 1:]).all()  # one subset of size 4
    mean_state = {k: sum(s[k] for s in states) / 4 for k in states[0]}
    assert curve.loss[3, 0] == pytest.approx(float(ev.evaluate([mean_state]).loss[0]), rel=1e-12)
    assert curve.error_mean[3] == pytest.approx(1 - float(ev.evaluate([mean_state]).accuracy[0]))
    # C(4,2) = 6 > 4 subsets: a seeded random choice of 4 distinct pairs, reproducible
    again = averaging_curve(states, ev, subsets=4, seed=1)
    np.testing.assert_array_equal(curve.loss, again.loss)
    weighted = averaging_curve(states, ev, weights=[1, 0, 0, 3], sizes=[4])
    fused = {k: (states[0][k] + 3 * states[3][k]) / 4 for k in states[0]}
    assert weighted.loss[0, 0] == pytest.approx(float(ev.evaluate([fused]).loss[0]), rel=1e-12)


def test_linear_cka_matches_hsic_formula_and_invariances():
    rng = np.random.default_rng(6)
    a, b = rng.normal(size=(40, 5)), rng.normal(size=(40, 3))
    h = np.eye(40) - 1.0 / 40
    ka, kb = h @ a @ a.T @ h, h @ b @ b.T @ h
    hsic = np.trace(ka @ kb) / np.sqrt(np.trace(ka @ ka) * np.trace(kb @ kb))
    assert linear_cka(a, b) == pytest.approx(hsic, rel=1e-10)
    q, _ = np.linalg.qr(rng.normal(size=(5, 5)))
    assert linear_cka(a, 3.0 * a @ q + 2.0) == pytest.approx(1.0, rel=1e-12)
    ev = evaluator_for()
    states = [linear_state(rng) for _ in range(3)]
    cka = cka_matrix(states + [states[0]], ev, outputs="logits")
    assert cka.matrix.shape == (4, 4) and cka.matrix[0, 3] == pytest.approx(1.0)
    np.testing.assert_allclose(cka.matrix, cka.matrix.T)
    logits = [np.concatenate([ev.batches[0][0].numpy() @ s["weight"].numpy().T + s["bias"].numpy()]) for s in states]
    assert cka.matrix[0, 1] == pytest.approx(linear_cka(logits[0], logits[1]), rel=1e-10)
    expected_mean = np.mean([cka.matrix[i, j] for i, j in itertools.combinations(range(4), 2)])
    assert cka.mean_offdiagonal == pytest.approx(expected_mean)


class FakeRun:
    """Duck-typed stand-in for fl's Run: the only methods the analysis uses."""

    def __init__(self, models, data):
        self._models, self._data = models, data

    def module(self):
        return nn.Linear(F, C).double()

    def client_states(self, round=-1):
        return {10 + k: m for k, m in enumerate(self._models)} if round == 1 else {}

    def client_datasets(self):
        return {10 + k: torch.utils.data.TensorDataset(*d) for k, d in enumerate(self._data)}

    def test_dataset(self):
        return torch.utils.data.TensorDataset(*self._data[0])


def test_decompose_run_uses_the_round_clients_and_datasets():
    _, _, data, models = client_setup(realizations=1)
    run = FakeRun([m[0] for m in models], data)
    ids, states, datasets = round_clients(run, 1)
    assert ids == [10, 11, 12] and len(datasets[1]) == 7
    ev = evaluator_for(*data[0])
    assert decompose_run(run, 1, ev) == decompose([m[0] for m in models], data, ev)
    dec = decompose_run(run, 1)  # builds its own evaluator from run.module() and run.test_dataset()
    # that evaluator is float32: a logit (F products and the bias, inputs and weights cast) is off by at most
    # gamma_(F+3) times the sum of its terms' sizes, a probability vector by twice the largest such error in
    # 1-norm, and so is b (weights summing to 1); the mean of |b|^2 then by 2 * that * sqrt(bias), to first order
    ref = decompose([m[0] for m in models], data, ev).bias
    x = torch.cat([d[0] for d in data])
    size = max(float((x.abs() @ m[0]["weight"].abs().T + m[0]["bias"].abs()).max()) for m in models)
    eps = 2 * float32_tolerance(F + 3, sides=1) * size
    assert dec.bias == pytest.approx(ref, rel=0, abs=2 * eps * math.sqrt(ref))
    with pytest.raises(ConfigError, match="no client models"):
        decompose_run(run, 0, ev)


def test_theorem_1_identities_hold_on_every_round_of_a_real_fedavg_run(tmp_path):
    """IMA Theorem 1 on a stored FL run, every round.

    WEns loss = bias + variance + covariance and bias = TrainBias + HeterBias + cross (an
    algebraic identity, so a test, not a claim). All terms are float64 sums over the same
    float64 probabilities; each identity regroups about 4 terms of size <= 2 per sample over
    n samples, so its residual is below gamma_(4n) in float64 relative to the loss.
    """
    import fl

    run = fl.run("fedavg", dataset="digits", clients=4, rounds=3, alpha=0.5, seed=3, out=tmp_path / "run",
                 progress=False, device="cpu", save_clients="all")
    n = len(run.test_dataset()) + sum(len(d) for d in run.client_datasets().values())
    u = np.finfo(np.float64).eps / 2
    bound = 4 * n * u / (1 - 4 * n * u) * 2
    for rnd in run.rounds[1:]:
        with pytest.warns(UserWarning, match="one realization per client"):
            d = decompose_run(run, rnd)
        scale = max(abs(d.wens_loss), 1.0)
        assert abs(d.wens_loss - d.bias - d.variance - d.covariance) <= bound * scale, rnd
        assert abs(d.bias - d.train_bias - d.heter_bias - d.cross) <= bound * scale, rnd
        assert d.variance == 0.0 and d.covariance == 0.0  # one realisation per client: zero by construction
