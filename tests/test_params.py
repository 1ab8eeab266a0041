"""ParameterSpace: flat-vector layout, round trips, geometry over parameters only."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from landscape import ArchitectureMismatchError, ConfigError, NonFiniteWeightsError, ParameterSpace
from landscape.space.params import vector_digest

from conftest import make_bn_cnn, make_mlp


def _net(hidden: int, bn: bool, seed: int) -> nn.Module:
    layers = [nn.Linear(5, hidden)] + ([nn.BatchNorm1d(hidden)] if bn else []) + [nn.ReLU(), nn.Linear(hidden, 3)]
    model = nn.Sequential(*layers)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in model.state_dict().values():
            if torch.is_floating_point(t):
                t.copy_(torch.randn(t.shape, generator=gen))
    return model


@settings(max_examples=30, deadline=None)
@given(hidden=st.integers(1, 9), bn=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_flatten_unflatten_state_dict_round_trip(hidden, bn, seed):
    model = _net(hidden, bn, seed)
    space = ParameterSpace(model)
    vec = space.to_vector(model)
    assert vec.shape == (space.size,) and space.size == sum(
        t.numel() for t in model.state_dict().values() if torch.is_floating_point(t))
    state = space.state_dict(vec)
    fresh = _net(hidden, bn, seed + 1)
    fresh.load_state_dict(state)  # complete and loadable (num_batches_tracked kept from the template)
    assert torch.equal(space.to_vector(fresh), vec)
    for name, t in model.state_dict().items():
        assert torch.equal(state[name], t), name
    views = space.unflatten(torch.stack([vec, 2 * vec]))  # leading batch dimension
    for name, t in model.state_dict().items():
        if torch.is_floating_point(t):
            assert torch.equal(views[name][1], 2 * t)


def test_param_mask_and_geometry_exclude_buffers():
    model = make_bn_cnn(0)
    space = ParameterSpace(model)
    state = model.state_dict()
    n_params = sum(p.numel() for p in model.parameters())
    assert int(space.param_mask.sum()) == n_params and space.has_buffers
    assert {e.name for e in space.entries if e.kind == "buffer"} == {
        k for k in state if "running" in k}
    assert "1.num_batches_tracked" in space.fixed and "1.num_batches_tracked" not in space.names
    a = space.to_vector(model, dtype=torch.float64)
    b = space.to_vector(make_bn_cnn(1), dtype=torch.float64)
    pa = torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])
    pb = torch.cat([p.detach().double().reshape(-1) for p in make_bn_cnn(1).parameters()])
    assert space.dot(a, b).item() == pytest.approx((pa @ pb).item(), rel=1e-12)
    assert space.norm(a - b).item() == pytest.approx((pa - pb).norm().item(), rel=1e-12)
    b2 = b.clone()
    b2[~space.param_mask] += 100.0  # buffers do not enter distances
    assert space.norm(a - b2).item() == pytest.approx(space.norm(a - b).item(), rel=1e-12)


def test_layout_digest_and_select():
    assert ParameterSpace(make_mlp(0)).layout_digest() == ParameterSpace(make_mlp(5)).layout_digest()
    assert ParameterSpace(make_mlp(0)).layout_digest() != ParameterSpace(make_mlp(0, hidden=17)).layout_digest()
    space = ParameterSpace(make_bn_cnn(0))
    mask = space.select("*.weight")
    expected = sum(e.numel for e in space.entries if e.kind == "parameter" and e.name.endswith(".weight"))
    assert int(mask.sum()) == expected and not (mask & ~space.param_mask).any()
    assert torch.equal(space.select(None), space.param_mask)
    with pytest.raises(ConfigError, match="no trainable parameter matches"):
        space.select("running_*")


def test_tied_weights_are_stored_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(4, 4, bias=False)
            self.dec = nn.Linear(4, 4, bias=False)
            self.dec.weight = self.enc.weight

        def forward(self, x):
            return self.dec(self.enc(x))

    model = Tied()
    space = ParameterSpace(model)
    assert space.size == 16 and space.aliases == {"dec.weight": "enc.weight"}
    state = space.state_dict(space.to_vector(model))
    assert torch.equal(state["dec.weight"], state["enc.weight"])
    Tied().load_state_dict(state)
    space.to_vector({"enc.weight": torch.zeros(4, 4)})  # the alias is optional


def test_mismatches_are_reported_precisely():
    space = ParameterSpace(make_mlp(0))
    state = make_mlp(0).state_dict()
    del state["1.bias"]
    state["extra.weight"] = torch.zeros(2)
    state["3.weight"] = torch.zeros(10, 15)
    with pytest.raises(ArchitectureMismatchError) as info:
        space.to_vector(state)
    err = info.value
    assert err.missing == ["1.bias"] and err.unexpected == ["extra.weight"]
    assert err.wrong_shape == [("3.weight", (10, 16), (10, 15))]
    assert "1.bias" in str(err) and "extra.weight" in str(err) and "(10, 16)" in str(err)


def test_nonfinite_values_and_vector_shapes():
    space = ParameterSpace(make_mlp(0))
    state = make_mlp(0).state_dict()
    state["3.weight"][0, 0] = float("inf")
    with pytest.raises(NonFiniteWeightsError, match=r"\[3\.weight\]") as info:
        space.to_vector(state)
    assert info.value.names == ["3.weight"]
    assert torch.isinf(space.to_vector(state, check_finite=False)).sum() == 1
    with pytest.raises(ConfigError, match="flat vector must have shape"):
        space.to_vector(torch.zeros(space.size + 1))
    with pytest.raises(ConfigError):
        ParameterSpace(nn.ReLU())


def test_vector_digest_depends_on_values_dtype_and_shape():
    v = torch.arange(6, dtype=torch.float32)
    assert vector_digest(v) == vector_digest(v.clone())
    assert vector_digest(v) != vector_digest(v.double())
    assert vector_digest(v) != vector_digest(v.reshape(2, 3))
    w = v.clone()
    w[3] = 3.0000002
    assert vector_digest(v) != vector_digest(w)
