"""Parameter subsets (``params=``) of paths, planes and group barriers, against hand computations.

Only the selected parameters move; the rest stays at the reference model. Each test rebuilds the
points by hand (copying the reference, writing the subset's values) and evaluates them with a
plain forward pass.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import landscape
from landscape import ConfigError, Evaluator
from landscape.space.params import ParameterSpace
from landscape.space.points import PointSet
from landscape.space.subsets import Subspace


class Net(nn.Module):
    """64-16-10 MLP with named layers."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _pair(seed: int = 0) -> tuple[Net, Net]:
    """Two nets equal outside fc2."""
    torch.manual_seed(seed)
    a = Net()
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.fc2.weight.normal_(generator=torch.Generator().manual_seed(seed + 1))
        b.fc2.bias.uniform_(-1, 1, generator=torch.Generator().manual_seed(seed + 2))
    return a, b


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(nn.functional.cross_entropy(model(x).double(), y))


def _with(model: nn.Module, values: dict[str, torch.Tensor]) -> nn.Module:
    """A copy of ``model`` with the named parameters replaced."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in out.named_parameters():
            if name in values:
                p.copy_(values[name].reshape(p.shape))
    return out


def test_path_over_fc2_is_the_hand_interpolation_of_fc2(digits):
    x, y = digits
    a, b = _pair()
    ev = Evaluator(a, (x, y), progress=False)
    alphas = np.linspace(-0.25, 1.25, 7)
    path = landscape.interpolate(a, b, ev, alphas=alphas, params=["fc2.*"])
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    hand = [_loss(_with(a, {n: (1 - t) * pa[n] + t * pb[n] for n in ("fc2.weight", "fc2.bias")}), x, y)
            for t in alphas]
    np.testing.assert_allclose(path.loss, hand, atol=1e-6, rtol=0)
    assert path.spec["params"]["size"] == 16 * 10 + 10
    assert path.spec["params"]["params"] == ["fc2.*"]


def test_models_differing_outside_the_subset_are_refused(digits):
    x, y = digits
    a, b = _pair()
    with torch.no_grad():
        b.fc1.bias.add_(1.0)
    ev = Evaluator(a, (x, y), progress=False)
    with pytest.raises(ConfigError, match=r"model b differs .* outside params=\['fc2\.\*'\] .*fc1\.bias"):
        landscape.interpolate(a, b, ev, alphas=3, params="fc2.*")
    with pytest.raises(ConfigError, match=r"member 1 differs .*fc1\.bias"):
        landscape.group_barrier([a, b], ev, params="fc2.*")
    with pytest.raises(ConfigError, match="no trainable parameter matches"):
        landscape.interpolate(a, b, ev, alphas=3, params="head.*")


def test_random_plane_over_a_subset_is_the_hand_evaluated_grid(digits):
    x, y = digits
    a, _ = _pair()
    ev = Evaluator(a, (x, y), progress=False)
    plane = landscape.random_plane(a, ev, resolution=3, span=0.5, params="fc2.*", seed=3)
    assert plane.u.shape == plane.v.shape == (170,)
    assert [name for name, _, _ in plane.layout] == ["fc2.weight", "fc2.bias"]
    # filter normalisation per selected tensor: each row of the weight's direction has the row's norm
    w = a.fc2.weight.detach().double()
    u_w = torch.from_numpy(plane.u[:160]).reshape(10, 16)
    np.testing.assert_allclose(u_w.norm(dim=1), w.norm(dim=1), rtol=1e-10)
    assert not plane.u[160:].any()  # biases ignored (Li et al. 2018)
    base = torch.cat([a.fc2.weight.detach().reshape(-1), a.fc2.bias.detach()]).double()
    for i, cy in enumerate(plane.y):
        for j, cx in enumerate(plane.x):
            vec = base + cx * torch.from_numpy(plane.u) + cy * torch.from_numpy(plane.v)
            hand = _loss(_with(a, {"fc2.weight": vec[:160].float(), "fc2.bias": vec[160:].float()}), x, y)
            assert plane.loss[i, j] == pytest.approx(hand, abs=1e-6)


def test_plane_through_three_models_over_a_subset(digits):
    x, y = digits
    a, b = _pair(0)
    c = copy.deepcopy(a)
    with torch.no_grad():
        c.fc2.weight.uniform_(-1, 1, generator=torch.Generator().manual_seed(9))
    ev = Evaluator(a, (x, y), progress=False)
    plane = landscape.plane(a, b, c, ev, resolution=3, params="fc2.*")
    sub = Subspace(ev.space, "fc2.*")
    vb = sub.restrict(ev.vector(b))
    assert plane.coordinates(b) == pytest.approx(tuple(plane.models["b"]), abs=1e-9)
    assert plane.models["b"][0] == pytest.approx(float((vb - sub.restrict(ev.vector(a))).norm()))
    vec = torch.from_numpy(plane.origin + plane.x[2] * plane.u + plane.y[0] * plane.v)
    hand = _loss(_with(a, {"fc2.weight": vec[:160].float(), "fc2.bias": vec[160:].float()}), x, y)
    assert plane.loss[0, 2] == pytest.approx(hand, abs=1e-6)


def test_group_barrier_over_a_subset_fuses_only_the_subset(digits):
    x, y = digits
    a, b = _pair()
    ev = Evaluator(a, (x, y), progress=False)
    group = landscape.group_barrier([a, b], ev, weights=[0.25, 0.75], params="fc2.*")
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    fused = _with(a, {n: 0.25 * pa[n] + 0.75 * pb[n] for n in ("fc2.weight", "fc2.bias")})
    assert group.fused_loss == pytest.approx(_loss(fused, x, y), abs=1e-6)
    assert list(group.member_loss) == pytest.approx([_loss(a, x, y), _loss(b, x, y)], abs=1e-6)
    assert group.spec["params"]["tensors"] == 2


def test_subset_points_move_only_the_subset_and_have_their_own_cache_keys(digits, tmp_path):
    x, y = digits
    a, b = _pair()
    with torch.no_grad():
        b.fc2.bias.copy_(a.fc2.bias)  # a and b differ in fc2.weight only: every subset below is valid
    ev = Evaluator(a, (x, y), progress=False, cache=tmp_path / "cache")
    paths = {str(p): landscape.interpolate(a, b, ev, alphas=3, params=p)
             for p in (None, "fc2.*", "fc2.weight")}
    np.testing.assert_allclose(paths["fc2.*"].loss, paths["None"].loss, atol=1e-6)  # the same points...
    assert len(list((tmp_path / "cache").rglob("points-*.h5"))) == 3  # ...under three keys
    assert paths["fc2.*"].spec["params"]["digest"] != paths["fc2.weight"].spec["params"]["digest"]
    done = ev.points_evaluated
    landscape.interpolate(a, b, ev, alphas=3, params="fc2.*")
    assert ev.points_evaluated == done  # read back from its own entry
    space = ParameterSpace(a)
    sub = Subspace(space, "fc2.weight")
    base = space.to_vector(a, dtype=torch.float64)
    points = PointSet(base, torch.ones(1, sub.size, dtype=torch.float64), torch.tensor([[2.0]]), sub.index)
    vec = points.chunk(0, 1, torch.device("cpu"), torch.float64)[0]
    outside = torch.ones(space.size, dtype=torch.bool)
    outside[sub.index] = False
    assert torch.equal(vec[outside], base[outside]) and torch.equal(vec[sub.index], base[sub.index] + 2.0)


@pytest.mark.parametrize("bn, strategy", [("interpolate", "loop"), ("keep", "loop"), ("keep", "vmap")])
def test_subset_points_are_never_built_full_size_and_equal_the_full_vectors(digits, monkeypatch, bn, strategy):
    """Only a subset point's entries are built.

    The loop writes them into one base (the numbers are those of the full vectors, bit for bit); vmap
    stacks the subset's tensors only (equal to float32 rounding).
    """
    x, y = digits
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))
    with torch.no_grad():
        model(x[:256].float())  # running statistics away from their initial values
    model.eval()
    space = ParameterSpace(model)
    sub = Subspace(space, "3.*")
    base = space.to_vector(model, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    dirs = torch.randn(2, sub.size, generator=gen)
    coeffs = torch.tensor([[a, b] for a in (-1.0, 0.0, 0.5) for b in (-0.5, 1.0)], dtype=torch.float64)
    points = PointSet(base, dirs, coeffs, sub.index)
    full = points.chunk(0, len(points), torch.device("cpu"), torch.float32)
    ref_loss, ref_acc = Evaluator(model, (x, y), progress=False, bn=bn).evaluate_points(PointSet.explicit(full),
                                                                                         reference=base)
    ev = Evaluator(model, (x, y), progress=False, bn=bn, strategy=strategy)
    monkeypatch.setattr(PointSet, "chunk", lambda *a, **k: pytest.fail("a subset point was built full size"))
    loss, acc = ev.evaluate_points(points, reference=base)
    if strategy == "loop":
        np.testing.assert_array_equal(loss, ref_loss)
        np.testing.assert_array_equal(acc, ref_acc)
    else:  # other batched kernels: float32 rounding of the loss, the same predictions
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
        np.testing.assert_array_equal(acc, ref_acc)
    assert np.ptp(loss) > 0.1  # the points differ
    assert torch.equal(points.moving(0, len(points), torch.device("cpu"), torch.float32), full[:, sub.index])


def _lora_vit():
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=64, num_labels=10)
    model = transformers.ViTForImageClassification(config)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # a "fine-tuned" adapter: lora_B is zero at initialisation
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    return lora.eval()


def test_trainable_on_a_lora_vit_moves_only_the_adapter():
    from fl.datasets import load_dataset

    torch.set_num_threads(1)
    data = load_dataset("digits")
    x, y = data.test_x[:64].reshape(-1, 1, 8, 8), data.test_y[:64]
    lora = _lora_vit()
    other = copy.deepcopy(lora)
    with torch.no_grad():
        for name, p in other.named_parameters():
            if p.requires_grad:
                p.add_(0.05)
    trainable = {n: p for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    adapter_size = sum(p.numel() for p in trainable.values())
    ev = Evaluator(lora, (x, y), output="logits", progress=False)
    plane = landscape.random_plane(lora, ev, resolution=3, span=1.0, params="trainable")
    assert plane.u.shape == (adapter_size,) and plane.spec["params"]["size"] == adapter_size
    assert [n for n, _, _ in plane.layout] == list(trainable)
    vec = torch.from_numpy(plane.origin + plane.x[0] * plane.u + plane.y[2] * plane.v).float()
    values = {n: vec[off:off + numel] for n, off, numel in plane.layout}
    with torch.no_grad():
        logits = _with(lora, values)(pixel_values=x).logits
    hand = float(nn.functional.cross_entropy(logits.double(), y))
    assert plane.loss[2, 0] == pytest.approx(hand, rel=1e-5)
    path = landscape.interpolate(lora, other, ev, alphas=[0.5], params="trainable")
    mid = _with(lora, {n: 0.5 * (p + dict(other.named_parameters())[n]) for n, p in trainable.items()})
    with torch.no_grad():
        hand_mid = float(nn.functional.cross_entropy(mid(pixel_values=x).logits.double(), y))
    assert path.loss[0] == pytest.approx(hand_mid, rel=1e-5)


def test_barrier_matrix_over_a_subset_is_made_of_the_subset_paths(digits):
    x, y = digits
    a, b = _pair(0)
    c = _with(a, {"fc2.bias": torch.linspace(-1, 1, 10)})
    ev = Evaluator(a, (x, y), progress=False)
    matrix = landscape.barrier_matrix([a, b, c], ev, alphas=5, params="fc2.*")
    for i, j, (p, q) in [(0, 1, (a, b)), (0, 2, (a, c)), (1, 2, (b, c))]:
        path = landscape.interpolate(p, q, ev, alphas=5, params="fc2.*")
        assert matrix.loss_barrier[i, j] == matrix.loss_barrier[j, i] == path.loss_barrier
    assert matrix.spec["params"]["params"] == ["fc2.*"]
    with torch.no_grad():
        c.fc1.weight.mul_(2.0)
    with pytest.raises(ConfigError, match=r"differs .* outside params=\['fc2\.\*'\] .*fc1\.weight"):
        landscape.barrier_matrix([a, b, c], ev, alphas=5, params="fc2.*")


def test_curve_over_a_subset_trains_only_the_subset(digits):
    x, y = digits
    a, b = _pair(0)
    ev = Evaluator(a, (x, y), progress=False)
    result = landscape.curve(a, b, ev, train_data=(x, y), epochs=2, lr=0.05, batch_size=64, points=5,
                             params="fc2.*")
    space = ParameterSpace(a)
    sub = Subspace(space, "fc2.*")
    assert result.knots.shape == (3, sub.size)  # the knots live in the subset
    va, vb = (space.to_vector(m, dtype=torch.float64) for m in (a, b))
    np.testing.assert_array_equal(result.knots[0], va[sub.index].numpy())
    np.testing.assert_array_equal(result.knots[2], vb[sub.index].numpy())
    line_mid = 0.5 * (result.knots[0] + result.knots[2])
    assert not np.allclose(result.knots[1], line_mid)  # the bend trained
    assert result.spec["params"]["params"] == ["fc2.*"]
    for i, t in enumerate(result.t):  # the measured curve: a outside fc2, the Bezier point on it
        values = {n: v.float() for n, v in sub.unflatten(torch.from_numpy(result.point(float(t)))).items()}
        assert result.loss[i] == pytest.approx(_loss(_with(a, values), x, y), rel=1e-5)
    plane = landscape.connectivity.curve_plane(result, ev, resolution=3, reference=a)
    assert plane.spec["params"]["params"] == ["fc2.*"] and plane.u.shape == (sub.size,)
    with pytest.raises(ConfigError, match="pass reference=<model a>"):
        landscape.connectivity.curve_plane(result, ev, resolution=3)
    with torch.no_grad():
        b.fc1.bias.add_(1.0)
    with pytest.raises(ConfigError, match=r"model b differs .*fc1\.bias"):
        landscape.curve(a, b, ev, train_data=(x, y), epochs=1, params="fc2.*")


def test_curvature_on_a_subset_plane_is_the_subset_hessian_block(digits):
    """Each grid point's top eigenvalue equals that of the dense Hessian of fc2 (the plane's subset) there."""
    x, y = digits
    x, y = x[:300], y[:300]
    a, _ = _pair(4)
    ev = Evaluator(a, (x, y), progress=False, dtype=torch.float64)
    plane = landscape.random_plane(a, ev, resolution=3, params="fc2.*", span=0.5)
    got = landscape.curvature_plane(plane, ev, reference=a, k=1, tol=1e-10, max_iter=200)
    space = ParameterSpace(a)
    sub = Subspace(space, "fc2.*")
    va = space.to_vector(a, dtype=torch.float64)
    hidden = torch.relu(a.double().fc1(x.double())).detach()

    def loss(w: torch.Tensor) -> torch.Tensor:  # fc2 is the last layer: the loss of its flat entries
        values = sub.unflatten(w)
        return nn.functional.cross_entropy(hidden @ values["fc2.weight"].T + values["fc2.bias"], y)

    origin, u, v = (torch.as_tensor(t) for t in (plane.origin, plane.u, plane.v))
    for i, yy in enumerate(got.y):
        for j, xx in enumerate(got.x):
            w = origin + float(xx) * u + float(yy) * v
            dense = torch.autograd.functional.hessian(loss, w.double())
            assert got.eigenvalues[i, j, 0] == pytest.approx(float(torch.linalg.eigvalsh(dense)[-1]), rel=1e-6)
    assert got.spec["params"] == ["fc2.*"]
    with pytest.raises(ConfigError, match="pass reference="):
        landscape.curvature_plane(plane, ev, k=1)
    assert torch.equal(sub.embed(sub.restrict(va), va), va)
