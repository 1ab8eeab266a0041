"""Permutation groups, functional identity after permutation, weight/activation matching, REPAIR."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torchvision
from torch import nn

import landscape
from fl.datasets import load_dataset
from fl.models import build_model
from landscape.alignment.align import align, align_group, match
from landscape.alignment.graph import PermutationError, discover
from landscape.alignment.permute import apply_permutation, invert, permute_state, random_permutations
from landscape.connectivity.repair import channel_stats, repair_model, repair_points, repaired_interpolate

from conftest import float32_tolerance, forward_terms, train_digits_mlp

ZOO = ["mlp", "fedgucci_cnn", "floco_cnn", "ima_cnn", "ima_digit_cnn", "resnet20_bn", "resnet20_gn", "resnet18_gn"]


def _randomise_norms(model: nn.Module, seed: int) -> nn.Module:
    """Non-trivial BatchNorm statistics and affine parameters, so that a wrong permutation shows."""
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=gen) - 0.5)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
        if isinstance(m, (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm)) and m.weight is not None:
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=gen) - 0.5)
    return model.eval()


def _check_identity(model: nn.Module, x: torch.Tensor, strict: bool = True) -> None:
    spec = discover(model, x[:2], strict=strict)
    assert spec.groups, "no permutable units found"
    perms = random_permutations(spec, seed=1)
    permuted = apply_permutation(model, spec, perms)
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, permuted.state_dict()[k])]
    assert moved, "the permutation changed no tensor"
    with torch.no_grad():
        ref, out = model(x), permuted(x)
    # the permuted network sums every layer and normalisation statistic in another order; its chain runs to 1e5
    # terms, so the probabilistic bound
    tol = float32_tolerance(forward_terms(model, x[0, 0].numel() if x.ndim > 2 else 1), probabilistic=True)
    assert torch.allclose(out, ref, rtol=tol, atol=tol * float(ref.abs().max())), float((out - ref).abs().max())
    back = permute_state(permuted.state_dict(), spec, invert(perms))
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("name", ZOO + ["mnist1d_mlp", "mnist1d_cnn", "mnist1d_lenet"])
def test_permutation_keeps_outputs_zoo(name: str) -> None:
    shape = (1, 40) if name.startswith("mnist1d") else (1, 8, 8)
    model = _randomise_norms(build_model(name, num_classes=5, input_shape=shape, seed=0), 0)
    _check_identity(model, torch.randn(6, *shape, generator=torch.Generator().manual_seed(2)))


def test_permutation_keeps_outputs_torchvision_resnet18() -> None:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = _randomise_norms(torchvision.models.resnet18(num_classes=4), 0)
    spec = discover(model, torch.zeros(2, 3, 32, 32))
    assert len(spec.groups) == 12  # 4 residual streams + 8 block-internal groups
    _check_identity(model, torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(2)))


def test_groups_of_resnet20_residual_streams_and_groupnorm_blocks() -> None:
    bn = discover(build_model("resnet20_bn", num_classes=10, input_shape=(3, 32, 32)), torch.zeros(2, 3, 32, 32))
    # 9 block-internal groups (16/32/64 x 3), the first stream (16), and the zero channels that the
    # option-A shortcuts pad in front of and behind the stream (8 + 8, then 16 + 16)
    assert sorted(g.size for g in bn.groups) == sorted([16] * 4 + [32] * 3 + [64] * 3 + [8, 8, 16, 16])
    # GroupNorm(2): the first stream's 16 units move within blocks of 8; where the option-A padding puts
    # them across the two groups of a 32-channel GroupNorm they still do, and nothing is pinned
    gn20 = discover(build_model("resnet20_gn", num_classes=10, input_shape=(3, 32, 32)), torch.zeros(2, 3, 32, 32))
    assert sorted(g.size for g in gn20.groups) == sorted(g.size for g in bn.groups)
    stream = max(gn20.groups, key=lambda g: len(g.members))  # the first residual stream: 40 tensors
    assert (stream.size, stream.block) == (16, 8)
    assert all(g.block == 0 or g.size % g.block == 0 for g in gn20.groups)
    gn = discover(build_model("resnet18_gn", num_classes=10, input_shape=(3, 32, 32)), torch.zeros(2, 3, 32, 32))
    assert {g.size: g.block for g in gn.groups if g.size in (64, 512)} == {64: 32, 512: 256}  # GroupNorm(2)


class _SliceUnits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))[:, :3])


class _Rolled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)
        self.head = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc2(torch.roll(torch.relu(self.fc1(x)), 1, dims=1)))


class _Exotic(nn.Module):
    """Reductions with and without keepdim, a broadcast product, stacking and summing, LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.ln, self.fc = nn.Conv2d(3, 8, 3), nn.LayerNorm(8), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        h = (h * (h.var(dim=(2, 3), keepdim=True) + h.amax(dim=(2, 3), keepdim=True))).mean(dim=(2, 3))
        h = torch.cat([h[:, None], 2 * h[:, None]], 1).sum(1)
        return self.fc(self.ln(h)).log_softmax(-1)


def test_permutation_through_reductions_broadcasts_and_layernorm() -> None:
    model = _randomise_norms(_Exotic(), 0)
    spec = discover(model, torch.zeros(2, 3, 6, 6))
    assert [g.size for g in spec.groups] == [8]
    assert {m.name for m in spec.groups[0].members} == {"conv.weight", "conv.bias", "ln.weight", "ln.bias",
                                                         "fc.weight"}
    _check_identity(model, torch.randn(4, 3, 6, 6, generator=torch.Generator().manual_seed(1)))


class _Heads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)).view(-1, 2, 4).sum(1))  # units split into two "heads"


def test_refuses_operations_that_do_not_commute_with_permutations() -> None:
    with pytest.raises(PermutationError, match="splits or interleaves hidden units"):
        discover(_Heads(), torch.zeros(2, 4))
    with pytest.raises(PermutationError, match="slice of hidden units"):
        discover(_SliceUnits(), torch.zeros(2, 4))
    with pytest.raises(PermutationError, match="aten.roll"):
        discover(_Rolled(), torch.zeros(2, 4))
    assert issubclass(PermutationError, landscape.ConfigError)
    spec = discover(_Rolled(), torch.zeros(2, 4), strict=False)
    assert any("aten.roll" in r for r in spec.pinned)
    assert [g.size for g in spec.groups] == [2]  # fc1's units are pinned, fc2's still permute
    _check_identity(_Rolled().eval(), torch.randn(5, 4), strict=False)


@pytest.fixture(scope="module")
def trained_pair():
    torch.set_num_threads(1)
    data = load_dataset("digits")
    return data, train_digits_mlp(data, 0, width=128), train_digits_mlp(data, 1, width=128)


def test_aligning_a_permuted_copy_recovers_the_original() -> None:
    for name in ("mlp", "resnet20_bn", "resnet20_gn"):
        a = build_model(name, num_classes=10, input_shape=(1, 8, 8), seed=0)
        spec = discover(a, torch.zeros(2, 1, 8, 8))
        shuffled = apply_permutation(a, spec, random_permutations(spec, seed=5))
        recovered = align(shuffled, to=a, spec=spec)
        assert all(torch.equal(recovered.state_dict()[k], v) for k, v in a.state_dict().items()), name


def test_checkpoint_paths_align_with_the_evaluator_as_architecture(tmp_path) -> None:
    a = build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=0)
    spec = discover(a, torch.zeros(2, 1, 8, 8))
    shuffled = apply_permutation(a, spec, random_permutations(spec, seed=5))
    landscape.save_state_dict(a, tmp_path / "m0.pt")
    landscape.save_state_dict(shuffled, tmp_path / "m1.pt")
    data = (torch.randn(64, 1, 8, 8), torch.randint(10, (64,)))
    ev = landscape.Evaluator(build_model("mlp", num_classes=10, input_shape=(1, 8, 8), seed=3), data,
                             progress=False)
    with pytest.raises(landscape.ConfigError, match="pass template=.* or data=<an Evaluator"):
        align(tmp_path / "m1.pt", to=tmp_path / "m0.pt")
    recovered = align(tmp_path / "m1.pt", to=tmp_path / "m0.pt", data=ev)
    assert all(torch.equal(recovered.state_dict()[k], v) for k, v in a.state_dict().items())
    by_paths = align(tmp_path / "m1.pt", to=tmp_path / "m0.pt", data=ev, method="activation")
    by_modules = align(shuffled, to=a, data=data, method="activation")
    assert all(torch.equal(by_paths.state_dict()[k], v) for k, v in by_modules.state_dict().items())


def test_alignment_lowers_the_barrier_of_independently_trained_mlps(trained_pair) -> None:
    data, a, b = trained_pair
    ev = landscape.Evaluator(a, (data.test_x, data.test_y), device="cpu")
    before = landscape.interpolate(a, b, ev, alphas=11)
    found = match(b, to=a)
    weight = found.apply(b)
    activation = align(b, to=a, data=(data.train_x, data.train_y), method="activation")
    tol = float32_tolerance(forward_terms(b))  # the permuted hidden layers' dot products in another order
    for aligned in (weight, activation):
        with torch.no_grad():
            ref = b(data.test_x)
            assert torch.allclose(aligned(data.test_x), ref, rtol=tol, atol=tol * float(ref.abs().max()))
        after = landscape.interpolate(a, aligned, ev, alphas=11)
        assert after.loss_barrier < 0.5 * before.loss_barrier, (before.loss_barrier, after.loss_barrier)
    assert found.info["objective"] > found.info["objective_before"]


def test_merge_many_brings_a_group_closer(trained_pair) -> None:
    data, a, b = trained_pair
    c = apply_permutation(a, discover(a, data.test_x[:2]), random_permutations(discover(a, data.test_x[:2]), 9))
    group = [copy.deepcopy(a), b, c]
    aligned = align_group(group)

    def dist(m: nn.Module, n: nn.Module) -> float:
        return sum(float((m.state_dict()[k] - n.state_dict()[k]).norm() ** 2) for k in m.state_dict())

    # c is a permuted copy of a: MergeMany must undo the permutation between them
    assert dist(aligned[0], aligned[2]) < 1e-8
    assert dist(aligned[0], aligned[1]) < dist(a, b)
    tol = float32_tolerance(forward_terms(a))  # the permuted hidden layers' dot products in another order
    with torch.no_grad():
        for orig, new in zip(group, aligned):
            ref = orig(data.test_x)
            assert torch.allclose(new(data.test_x), ref, rtol=tol, atol=tol * float(ref.abs().max()))


def test_repair_gives_the_midpoint_the_interpolated_statistics() -> None:
    data = load_dataset("digits")
    a, b = train_digits_mlp(data, 0, width=16), train_digits_mlp(data, 1, width=16)
    b = align(b, to=a)
    x = data.train_x[:512]
    names = [n for n in repair_points(a) if n != "classifier"]
    assert names == ["features.1", "features.3"]
    ends = [channel_stats(m, names, x) for m in (a, b)]
    mid = copy.deepcopy(a)
    mid.load_state_dict({k: 0.5 * (v + b.state_dict()[k]) for k, v in a.state_dict().items()})
    targets = {n: tuple(0.5 * (ends[0][n][k] + ends[1][n][k]) for k in range(2)) for n in names}
    collapsed = channel_stats(mid, names, x)
    repaired = channel_stats(repair_model(mid, targets, x), names, x)
    # the statistics are measured twice over the 512 inputs (to rescale, then to check), through the layers'
    # fan-ins 64 and 16, and the rescaling adds 2 operations; a variance also sums squares
    tol = float32_tolerance(64 + 16 + 2 + 2 * 512)
    for n in names:
        mean, var = targets[n]
        assert torch.allclose(repaired[n][0], mean, rtol=tol, atol=tol * float(mean.abs().max()))
        assert torch.allclose(repaired[n][1], var, rtol=2 * tol, atol=0)
    # variance collapse (Jordan et al. section 3): the plain midpoint's first layer is narrower
    assert float(collapsed["features.1"][1].mean()) < float(targets["features.1"][1].mean())
    ev = landscape.Evaluator(a, (data.test_x, data.test_y), device="cpu")
    plain = landscape.interpolate(a, b, ev, alphas=11)
    fixed = repaired_interpolate(a, b, ev, data=(data.train_x, data.train_y), alphas=11)
    assert fixed.spec["repair"]["layers"] == names
    assert fixed.loss_barrier < plain.loss_barrier


def test_batchnorm_reset_sets_running_statistics_to_the_batch_moments() -> None:
    model = _randomise_norms(build_model("resnet20_bn", num_classes=10, input_shape=(1, 8, 8), seed=0), 1)
    x = torch.randn(64, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    reset = repair_model(model, {}, x)
    seen = {}
    hook = reset.bn1.register_forward_hook(lambda m, i, o: seen.setdefault("in", i[0]))
    with torch.no_grad():
        reset(x)
    hook.remove()
    z = seen["in"].transpose(0, 1).reshape(16, -1)
    # BatchNorm's kernel and torch.mean sum the 64 x 8 x 8 values of a channel in other orders; the variance
    # then sums their squared deviations
    tol = float32_tolerance(z.shape[1])
    assert torch.allclose(reset.bn1.running_mean, z.mean(1), rtol=0, atol=tol * float(z.abs().mean(1).max()))
    assert torch.allclose(reset.bn1.running_var, z.var(1), rtol=float32_tolerance(2 * z.shape[1]), atol=0)
    assert not torch.allclose(model.bn1.running_mean, reset.bn1.running_mean)
    with pytest.raises(landscape.ConfigError, match="bn='interpolate'"):
        repaired_interpolate(model, model, landscape.Evaluator(model, (x, torch.zeros(64, dtype=torch.long)),
                                                               device="cpu", bn="keep"), data=(x, x))


def test_connected_modulo_permutation_verdict(trained_pair) -> None:
    from landscape.claims.connectivity import connected_modulo_permutation

    data, a, b = trained_pair
    ev = landscape.Evaluator(a, (data.test_x, data.test_y), device="cpu")
    verdict = connected_modulo_permutation(a, b, ev, data=(data.train_x, data.train_y), threshold=0.05,
                                           metric="loss", alphas=11)
    assert isinstance(verdict, landscape.Verdict) and verdict.holds
    before = landscape.interpolate(a, b, ev, alphas=11).loss_barrier
    assert verdict.numbers["loss_barrier[before]"] == before  # the same path by the same code
    assert verdict.numbers["loss_barrier[aligned]"] < before
    assert set(verdict.results["paths"]) == {"before", "aligned", "aligned + REPAIR"}
    from figures.verdicts import verdict_figure

    legend_texts = {t.get_text() for ax in verdict_figure(verdict).axes for leg in [ax.get_legend()] if leg
                    for t in leg.get_texts()}
    assert any("before" in t for t in legend_texts) and any("aligned" in t for t in legend_texts)
    strict = connected_modulo_permutation(a, b, ev, threshold=-1.0, metric="loss", alphas=11, repair=False)
    assert strict.status == "not reproduced" and "aligned" in strict.reason


def test_weight_matching_converges_when_a_group_sits_on_both_axes_of_a_weight() -> None:
    # mnist1d_mlp's residual ties linear1's and linear2's units: linear2's square weight holds the group
    # on both axes, where the assignment step is only a linearisation
    a = build_model("mnist1d_mlp_w64", num_classes=10, input_shape=(1, 40), seed=0)
    b = build_model("mnist1d_mlp_w64", num_classes=10, input_shape=(1, 40), seed=1)
    found = match(b, to=a)
    assert len(found.perms) == 1 and found.info["sweeps"] < 100
    assert found.info["objective"] > found.info["objective_before"]
    spec = found.spec
    shuffled = apply_permutation(a, spec, random_permutations(spec, seed=3))
    recovered = align(shuffled, to=a, spec=spec)
    assert all(torch.equal(recovered.state_dict()[k], v) for k, v in a.state_dict().items())


def test_group_connected_modulo_permutation_verdict(trained_pair) -> None:
    from landscape.claims.connectivity import group_connected_modulo_permutation

    data, a, b = trained_pair
    ev = landscape.Evaluator(a, (data.test_x, data.test_y), device="cpu")
    verdict = group_connected_modulo_permutation([a, b], ev, metric="loss", threshold=0.05)
    before = landscape.group_barrier([a, b], ev)
    assert verdict.numbers["loss_barrier[before]"] == before.loss_barrier  # the same group by the same code
    assert verdict.numbers["loss_barrier[aligned]"] < 0.5 * before.loss_barrier
    assert verdict.holds == (verdict.numbers["loss_barrier[aligned]"] <= 0.05)
    to_ref = group_connected_modulo_permutation([a, b], ev, to=a, metric="loss")
    assert to_ref.numbers["loss_barrier[aligned]"] < before.loss_barrier


def test_paths_and_group_barriers_modulo_permutation_report_before_and_after(trained_pair) -> None:
    data, a, b = trained_pair
    ev = landscape.Evaluator(a, (data.test_x, data.test_y), device="cpu")
    plain = landscape.interpolate(a, b, ev, alphas=11)
    aligned = landscape.interpolate(a, b, ev, alphas=11, align="weight")
    explicit = landscape.interpolate(a, align(b, to=a), ev, alphas=11)
    np.testing.assert_array_equal(aligned.loss, explicit.loss)  # the same as aligning by hand, bit for bit
    assert aligned.spec["unaligned"]["loss_barrier"] == plain.loss_barrier
    assert aligned.loss_barrier < 0.5 * plain.loss_barrier
    c = apply_permutation(a, discover(a, data.test_x[:2]), random_permutations(discover(a, data.test_x[:2]), 3))
    group = landscape.group_barrier([a, c], ev, align="weight")  # c is a permuted copy of a
    assert group.loss_barrier == 0.0  # aligned, c is a again: members and their average are one vector
    assert group.spec["unaligned"]["loss_barrier"] > 0.1
