"""Property-based tests (hypothesis) not covered elsewhere.

parameter-space round trips with tied weights, integer buffers, wrapper prefixes and key
order; the partition + local-test split as fl.run uses it; barrier invariances (affine loss
terms, scaling, reversal, permutation); cache-key stability (pinned values, sensitivity) and
result round trips with non-finite values.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch import nn

from fl.partition import METHODS, PartitionError, partition, partition_report, train_val_split
from landscape import Cache, ParameterSpace
from landscape.cache.store import make_key
from landscape.results import GroupResult, Metrics, PathResult
from landscape.results.barriers import (
    accuracy_barrier_curve,
    barrier_from_curve,
    group_accuracy_barrier,
    group_loss_barrier,
    loss_barrier_curve,
    normalise_weights,
)
from landscape.space.checkpoints import save_state_dict
from landscape.space.points import PointSet

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# ------------------------------------------------------------------ parameter space
class TiedNet(nn.Module):
    """Embedding and output layer share one weight (as in language models); BN adds buffers."""

    def __init__(self, vocab: int, dim: int, bn: bool):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.norm = nn.BatchNorm1d(dim) if bn else nn.Identity()
        self.out = nn.Linear(dim, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.embed(x)))


def _randomise(module: nn.Module, seed: int) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in module.state_dict().values():
            if torch.is_floating_point(t):
                t.copy_(torch.randn(t.shape, generator=gen, dtype=t.dtype))
            else:
                t.fill_(int(torch.randint(0, 100, (), generator=gen)))
    return module


@SETTINGS
@given(vocab=st.integers(2, 7), dim=st.integers(1, 5), bn=st.booleans(), seed=st.integers(0, 2**31 - 1),
       order=st.randoms(use_true_random=False))
def test_vector_round_trip_with_tied_weights_buffers_prefix_and_any_key_order(vocab, dim, bn, seed, order):
    model = _randomise(TiedNet(vocab, dim, bn), seed)
    space = ParameterSpace(TiedNet(vocab, dim, bn))
    vec = space.to_vector(model)
    tied = model.embed.weight.numel()
    assert space.size == sum(t.numel() for t in model.state_dict().values() if torch.is_floating_point(t)) - tied
    assert int(space.param_mask.sum()) == sum(p.numel() for p in model.parameters())  # parameters() dedups ties
    items = list(model.state_dict().items())
    order.shuffle(items)
    assert torch.equal(space.to_vector(dict(items)), vec)  # key order does not matter
    assert torch.equal(space.to_vector({f"module.{k}": v for k, v in items}), vec)  # DataParallel prefix
    state = space.state_dict(vec)
    fresh = TiedNet(vocab, dim, bn)
    fresh.load_state_dict(state)
    assert fresh.out.weight is fresh.embed.weight and torch.equal(fresh.out.weight, model.embed.weight)
    assert torch.equal(space.to_vector(fresh), vec)
    wide = space.to_vector(model, dtype=torch.float64)  # float32 -> float64 -> float32 is exact
    assert torch.equal(wide.float(), vec)


@SETTINGS
@given(hidden=st.integers(1, 6), seed=st.integers(0, 2**31 - 1), suffix=st.sampled_from([".pt", ".safetensors"]),
       scale=st.floats(-1e30, 1e30, allow_nan=False, allow_subnormal=False))
def test_any_finite_vector_survives_a_checkpoint_file_bit_for_bit(tmp_path_factory, hidden, seed, suffix, scale):
    space = ParameterSpace(nn.Sequential(nn.Linear(3, hidden), nn.BatchNorm1d(hidden), nn.Linear(hidden, 2)))
    gen = torch.Generator().manual_seed(seed)
    vec = (torch.randn(space.size, generator=gen, dtype=torch.float64) * scale).float()
    path = save_state_dict(space.state_dict(vec), tmp_path_factory.mktemp("ckpt") / f"m{suffix}")
    assert torch.equal(space.to_vector(path), vec)


# ------------------------------------------------------------------------ partitions
@SETTINGS
@given(labels=st.lists(st.integers(0, 4), min_size=20, max_size=200), k=st.integers(1, 6),
       method=st.sampled_from(METHODS), fraction=st.floats(0.0, 0.9), seed=st.integers(0, 2**31))
def test_partition_then_local_split_assigns_each_sample_at_most_once(labels, k, method, fraction, seed):
    labels = np.asarray(labels, dtype=np.int64)
    try:
        parts = partition(labels, k, method, alpha=0.3, classes_per_client=2, min_size=0, seed=seed)
    except PartitionError:
        return  # impossible shard constraints are covered in test_partition.py
    train, val = train_val_split(parts, fraction, seed=seed)
    everything = np.concatenate(train + val)
    assert len(np.unique(everything)) == len(everything)  # at most once, over clients and splits
    assert set(everything.tolist()) == set(np.concatenate(parts).tolist())
    counts = np.bincount(labels, minlength=5)
    whole = partition_report(labels, parts, 5)
    split = partition_report(labels, train, 5) + partition_report(labels, val, 5)
    np.testing.assert_array_equal(split, whole)  # class counts add up per client
    assert (whole.sum(axis=0) <= counts).all()
    if method not in ("shards", "mcmahan_shards", "fold"):  # these draw fixed-size parts, not every sample
        np.testing.assert_array_equal(whole.sum(axis=0), counts)
    for p, v in zip(parts, val):
        assert len(v) == int(np.floor(fraction * len(p)))


# -------------------------------------------------------------------------- barriers
finite = st.floats(-1e3, 1e3, allow_nan=False)
unit = st.integers(0, 1000).map(lambda k: k / 1000)  # accuracies are fractions of a test set


@settings(max_examples=150, deadline=None)
@given(loss=st.integers(2, 10).flatmap(lambda n: arrays(np.float64, n, elements=finite)),
       c0=finite, c1=finite, scale=st.floats(0.01, 100.0))
def test_loss_barrier_ignores_affine_terms_scales_and_is_symmetric(loss, c0, c1, scale):
    alphas = np.linspace(0.0, 1.0, len(loss))
    curve = loss_barrier_curve(alphas, loss)
    tol = 1e-9 * (1 + abs(loss).max() + abs(c0) + abs(c1))
    np.testing.assert_allclose(loss_barrier_curve(alphas, loss + c0 + c1 * alphas), curve, atol=tol)
    np.testing.assert_allclose(loss_barrier_curve(alphas, scale * loss), scale * curve, atol=scale * tol)
    reversed_path = PathResult(alphas=alphas, loss=loss[::-1].copy(), accuracy=np.ones(len(loss)))
    forward = PathResult(alphas=alphas, loss=loss, accuracy=np.ones(len(loss)))
    assert abs(reversed_path.loss_barrier - forward.loss_barrier) <= tol


@settings(max_examples=150, deadline=None)
@given(acc=st.integers(2, 10).flatmap(lambda n: arrays(np.float64, n, elements=unit)), scale=st.floats(0.01, 1.0))
def test_accuracy_barrier_is_scale_free_and_symmetric(acc, scale):
    alphas = np.linspace(0.0, 1.0, len(acc))
    curve = accuracy_barrier_curve(alphas, acc)
    np.testing.assert_allclose(accuracy_barrier_curve(alphas, scale * acc), curve, atol=1e-9)
    np.testing.assert_allclose(accuracy_barrier_curve(alphas, acc[::-1].copy())[::-1], curve, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(members=st.integers(2, 8).flatmap(lambda n: st.tuples(arrays(np.float64, n, elements=finite),
                                                     arrays(np.float64, n, elements=unit),
                                                     arrays(np.float64, n, elements=st.floats(0.01, 10.0)))),
       fused=finite, fused_acc=unit, perm_seed=st.integers(0, 1000))
def test_group_barrier_is_permutation_invariant_and_zero_for_equal_members(members, fused, fused_acc, perm_seed):
    loss, acc, raw = members
    w = normalise_weights(raw, len(raw))
    perm = np.random.default_rng(perm_seed).permutation(len(raw))
    lb = group_loss_barrier(fused, loss, w)
    permuted = group_loss_barrier(fused, loss[perm], normalise_weights(raw[perm], len(raw)))
    assert abs(permuted - lb) <= 1e-9 * (1 + abs(loss).max() + abs(fused))
    assert group_accuracy_barrier(fused_acc, acc[perm], w[perm]) == pytest.approx(
        group_accuracy_barrier(fused_acc, acc, w), abs=1e-12)
    same = GroupResult(weights=w, member_loss=np.full(len(w), fused), member_accuracy=np.full(len(w), fused_acc),
                       fused_loss=fused, fused_accuracy=fused_acc)
    assert abs(same.loss_barrier) <= 1e-9 * (1 + abs(fused)) and abs(same.accuracy_barrier) <= 1e-12


@settings(max_examples=100, deadline=None)
@given(loss=arrays(np.float64, st.integers(3, 9), elements=finite), bad=st.sampled_from([np.inf, -np.inf, np.nan]),
       where=st.integers(0, 100))
def test_a_nonfinite_point_never_yields_a_finite_wrong_barrier(loss, bad, where):
    alphas = np.linspace(0.0, 1.0, len(loss))
    loss = loss.copy()
    loss[where % len(loss)] = bad
    barrier = barrier_from_curve(loss_barrier_curve(alphas, loss))
    assert not np.isfinite(barrier) or (bad == -np.inf and where % len(loss) not in (0, len(loss) - 1))
    assert PathResult(alphas=alphas, loss=loss, accuracy=np.ones(len(loss))).nonfinite == 1


# ------------------------------------------------------------------------ cache keys
def test_cache_keys_are_pinned():
    """Keys address existing cache files: changing make_key orphans every user's cache."""
    assert make_key({"a": 1}) == "f9d86028c6e0d64e225186f96acb69338b2c5976"
    assert make_key({"points": "abc", "bn": "keep", "dtype": "torch.float32",
                     "nested": {"x": [1.5, None, True]}}) == "3671abb76292043cedf40bf15cc1e6828320da5f"


@settings(max_examples=60, deadline=None)
@given(d=st.integers(1, 6), p=st.integers(1, 5), seed=st.integers(0, 2**31 - 1), flip=st.integers(0, 10**6))
def test_point_keys_are_stable_and_see_every_one_ulp_change(d, p, seed, flip):
    gen = torch.Generator().manual_seed(seed)
    origin = torch.randn(d, generator=gen, dtype=torch.float64)
    dirs = torch.randn(2, d, generator=gen, dtype=torch.float64)
    coeffs = torch.randn(p, 2, generator=gen, dtype=torch.float64)
    points = PointSet(origin, dirs, coeffs)
    assert PointSet(origin.clone(), dirs.clone(), coeffs.clone()).digest() == points.digest()
    tensors = [origin, dirs, coeffs]
    which = tensors[flip % 3].clone().reshape(-1)
    i = flip % which.numel()
    which[i] = torch.nextafter(which[i], torch.tensor(np.inf, dtype=torch.float64))
    changed = [t if k != flip % 3 else which.reshape(t.shape) for k, t in enumerate(tensors)]
    assert PointSet(*changed).digest() != points.digest()


results = st.sampled_from([Metrics, PathResult])
special = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cls=results, values=arrays(np.float64, st.integers(1, 6), elements=special),
       spec=st.dictionaries(st.text(max_size=5), special | st.text(max_size=5) | st.integers(), max_size=4))
def test_results_with_nonfinite_values_round_trip_through_the_cache(tmp_path_factory, cls, values, spec):
    fields = {"loss": values, "accuracy": values[::-1].copy()}
    if cls is PathResult:
        fields["alphas"] = np.linspace(0.0, 1.0, len(values))
    result = cls(**fields, spec=spec)
    path = tmp_path_factory.mktemp("cache") / "c.h5"
    Cache(path).save_result("r", result)
    back = Cache(path).load_result("r")
    assert back == result and type(back) is cls
    for name, arr in fields.items():
        np.testing.assert_array_equal(getattr(back, name), arr)  # NaN and +-inf kept, bit-exact values
    assert make_key(back.spec) == make_key(result.spec)
