"""FLOCO's endpoint initialisation (``endpoint_init``).

Independent Xavier-normal endpoints as in the official code (default), or the template's
classifier plus zero-mean noise (``"centred"``).
"""
from __future__ import annotations

import math

import pytest
import torch

import fl
from fl.resolve import build_config
from landscape.infra.errors import ConfigError

from conftest import float32_tolerance, make_mlp

IN, OUT, V = 256, 10, 6  # classifier 256 -> 10 (D = 2560 weights), 6 endpoints (15 pairs)
D = IN * OUT


def _build(seed: int, init: str | None, vertices: int = V, template_seed: int = 0):
    """(endpoints, template classifier weight, algorithm, module) of a FLOCO model of an MLP."""
    options = {} if init is None else {"endpoint_init": init}
    _, alg = build_config("floco", seed=seed, vertices=vertices, **options)
    template = make_mlp(template_seed, hidden=IN)
    module = alg.build_module(template)
    return module.get_submodule("3").endpoints.detach(), template[3].weight.detach(), alg, module


def _pairwise(endpoints: torch.Tensor) -> torch.Tensor:
    flat = endpoints.flatten(1).double()
    i, j = torch.triu_indices(len(flat), len(flat), 1)
    return (flat[i] - flat[j]).norm(dim=1)


def test_independent_endpoints_are_as_far_apart_as_independent_inits() -> None:
    endpoints, weight, alg, _ = _build(seed=3, init=None)
    assert alg.opts.endpoint_init == "independent"  # the default is the official code's
    # Xavier normal: every entry N(0, s^2), s^2 = 2 / (in + out). One init has E|W|^2 = D s^2, so
    # |W| ~ sqrt(D) s; two independent ones differ by N(0, 2 s^2) per entry: |W_i - W_j| ~ sqrt(2 D) s.
    # Both are chi-distributed with D = 2560 degrees of freedom: relative std 1/sqrt(2D) = 1.4%, so the
    # factor 1.1 (7 standard deviations) holds for every seed.
    s = math.sqrt(2.0 / (IN + OUT))
    norms = endpoints.flatten(1).double().norm(dim=1)
    assert torch.all((norms / (math.sqrt(D) * s) - 1).abs() < 0.1), norms
    ratio = _pairwise(endpoints) / (math.sqrt(2) * math.sqrt(D) * s)
    assert torch.all((ratio - 1).abs() < 0.1), ratio
    flat = endpoints.flatten(1).double()
    cos = (flat @ flat.T) / (norms[:, None] * norms[None, :])
    off = cos[~torch.eye(V, dtype=torch.bool)]
    assert off.abs().max() < 0.1, off  # nearly orthogonal: cosine ~ N(0, 1/D), std 0.02
    # the entries are centred Gaussian of variance s^2 (mean within 5 standard errors)
    assert abs(float(endpoints.double().mean())) < 5 * s / math.sqrt(V * D)
    assert float(endpoints.double().var()) == pytest.approx(s * s, rel=0.05)
    # nothing of the template's classifier is in them: another template gives the same endpoints
    assert torch.equal(_build(seed=3, init=None, template_seed=9)[0], endpoints)
    assert not torch.allclose(endpoints.mean(0), weight, atol=1e-3)


def test_each_independent_endpoint_has_its_own_stream() -> None:
    """Endpoint m depends on (seed, m) only, as the official code seeds endpoint m with seed + m."""
    six, three = _build(seed=5, init="independent")[0], _build(seed=5, init="independent", vertices=3)[0]
    assert torch.equal(six[:3], three)


def test_centred_endpoints_have_the_template_classifier_as_centre() -> None:
    endpoints, weight, alg, module = _build(seed=3, init="centred")
    # W + d_m - mean_j d_j averages to W exactly in real arithmetic; in float32 each endpoint is one
    # rounded sum of 3 terms and the mean adds V more, so the centre is W up to that rounding.
    tol = float32_tolerance(V + 3) * float(endpoints.abs().max())
    torch.testing.assert_close(endpoints.mean(0), weight, rtol=0, atol=tol)
    exported = alg.export_state(module.state_dict(), {})  # the plain model at the simplex centre
    torch.testing.assert_close(exported["3.weight"], weight, rtol=0, atol=tol)
    template = make_mlp(0, hidden=IN).state_dict()
    assert all(torch.equal(exported[k], t) for k, t in template.items() if k != "3.weight")
    # the noise is nn.Linear's scale: d_m ~ U(-b, b), b = 1/sqrt(in), variance b^2/3, so
    # E|e_i - e_j|^2 = 2 D b^2 / 3 for the centred endpoints e_m = W + d_m - mean d
    expected = math.sqrt(2 * D / (3 * IN))
    ratio = _pairwise(endpoints) / expected
    assert torch.all((ratio - 1).abs() < 0.1), ratio
    # ... much closer together than the independent endpoints of the same classifier
    independent = _pairwise(_build(seed=3, init="independent")[0])
    assert float(_pairwise(endpoints).max()) < 0.5 * float(independent.min())


@pytest.mark.parametrize("init", ["independent", "centred"])
def test_same_seed_same_endpoints_other_seed_other_endpoints(init: str) -> None:
    a, b, c = (_build(seed=s, init=init)[0] for s in (11, 11, 12))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # different seeds differ as two draws do, not by a rounding: by more than a quarter of a pair's distance
    assert float((a - c).flatten(1).norm(dim=1).min()) > 0.25 * float(_pairwise(a).min())


def test_run_records_the_init_and_stores_its_endpoints(tmp_path) -> None:
    settings = dict(dataset="digits", clients=2, rounds=0, seed=4, progress=False)
    run = fl.run("floco", out=tmp_path / "default", vertices=3, **settings)
    centred = fl.run("floco", out=tmp_path / "centred", vertices=3, endpoint_init="centred", **settings)
    fedavg = fl.run("fedavg", out=tmp_path / "fedavg", **settings)
    assert run.config["options"]["endpoint_init"] == "independent"
    assert centred.config["options"]["endpoint_init"] == "centred"
    # the stored round-0 endpoints are the ones build_module draws from the run seed
    _, alg = build_config("floco", vertices=3, **{k: v for k, v in settings.items() if k != "progress"})
    stored = run.algorithm_state(0)["floco.endpoints"]
    assert stored.shape == (3, *fedavg.global_state(0)["classifier.weight"].shape)
    fedavg_module = fedavg.module()
    fedavg_module.load_state_dict(fedavg.global_state(0))
    expected = alg.build_module(fedavg_module).get_submodule(alg.classifier).endpoints.detach()
    assert torch.equal(stored, expected)
    # only the centred scheme starts from FedAvg's initial classifier
    start, weight = centred.training_state(0)["classifier.endpoints"], fedavg.global_state(0)["classifier.weight"]
    tol = float32_tolerance(3 + 3) * float(start.abs().max())
    torch.testing.assert_close(centred.global_state(0)["classifier.weight"], weight, rtol=0, atol=tol)
    assert not torch.allclose(run.global_state(0)["classifier.weight"], weight, atol=10 * tol)
    with pytest.raises(ConfigError, match="endpoint_init must be one of 'independent', 'centred', got 'centered'"):
        fl.run("floco", out=tmp_path / "bad", endpoint_init="centered", vertices=3, **settings)
