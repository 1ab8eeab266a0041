"""fl.partition: invariants of every partitioner, skew statistics, and clear errors."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl.partition import METHODS, PartitionError, partition, partition_report, train_val_split
from landscape import ConfigError


def _labels(n_per_class: int = 100, num_classes: int = 10, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(num_classes), n_per_class))


def _check_disjoint(parts: list[np.ndarray], n: int) -> np.ndarray:
    """Every part is sorted int64 in range; no index is used twice. Returns all used indices."""
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)
    used = np.concatenate(parts)
    assert used.size == 0 or (used.min() >= 0 and used.max() < n)
    assert len(np.unique(used)) == len(used)
    return used


def _tv_to_uniform(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> float:
    """Mean total-variation distance between each client's label distribution and the global one."""
    counts = partition_report(labels, parts, num_classes).astype(float)
    counts = counts[counts.sum(axis=1) > 0]  # clients without data have no label distribution
    local = counts / counts.sum(axis=1, keepdims=True)
    glob = np.bincount(labels, minlength=num_classes) / len(labels)
    return float(0.5 * np.abs(local - glob).sum(axis=1).mean())


@pytest.mark.parametrize("method", ["iid", "dirichlet", "inner_dirichlet", "shards"])
def test_all_samples_used_once_for_full_methods(method):
    labels = _labels()
    parts = partition(labels, 10, method, alpha=0.5, seed=3)
    used = _check_disjoint(parts, len(labels))
    assert len(used) == len(labels)  # these methods hand out every sample
    report = partition_report(labels, parts, 10)
    assert report.shape == (10, 10)
    np.testing.assert_array_equal(report.sum(axis=0), np.bincount(labels))
    np.testing.assert_array_equal(report.sum(axis=1), [len(p) for p in parts])


@pytest.mark.parametrize("method", METHODS)
def test_deterministic_for_a_seed_and_seed_dependent(method):
    labels = _labels()
    a = partition(labels, 8, method, seed=11)
    b = partition(labels, 8, method, seed=11)
    c = partition(labels, 8, method, seed=12)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_global_numpy_rng_untouched():
    state = np.random.get_state()[1].copy()
    partition(_labels(), 5, "dirichlet", seed=0)
    partition(_labels(), 5, "inner_dirichlet", seed=0)
    assert np.array_equal(np.random.get_state()[1], state)


def test_iid_sizes_and_balance():
    labels = _labels(n_per_class=101)  # 1010 samples over 7 clients
    parts = partition(labels, 7, "iid", seed=0)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 1010
    custom = partition(labels, 3, "iid", client_sizes=[10, 0, 500], min_size=0, seed=0)
    assert [len(p) for p in custom] == [10, 0, 500]


def test_dirichlet_alpha_controls_skew():
    labels = _labels(n_per_class=300)
    iidish = np.mean([_tv_to_uniform(labels, partition(labels, 10, alpha=1000.0, seed=s), 10) for s in range(3)])
    skewed = np.mean([_tv_to_uniform(labels, partition(labels, 10, alpha=0.05, seed=s, min_size=0), 10)
                      for s in range(3)])
    uniform = np.mean([_tv_to_uniform(labels, partition(labels, 10, "iid", seed=s), 10) for s in range(3)])
    assert iidish < 0.05 and uniform < 0.1  # near the global label distribution (sampling noise)
    assert skewed > 0.6  # most of each client's mass sits on few classes


def test_dirichlet_min_size_redraw_and_error():
    labels = _labels(n_per_class=20)
    parts = partition(labels, 20, alpha=0.1, min_size=2, max_redraws=1000, seed=0)
    assert min(len(p) for p in parts) >= 2
    with pytest.raises(PartitionError, match="min_size=9.*raise alpha"):
        partition(labels, 20, alpha=0.01, min_size=9, max_redraws=3, seed=0)
    with pytest.raises(PartitionError, match="needs more than"):
        partition(labels, 50, min_size=5)


def test_dirichlet_balance_caps_clients_near_n_over_k():
    labels = _labels(n_per_class=200)
    n, k = len(labels), 10
    free = partition(labels, k, alpha=0.1, min_size=0, seed=4)
    capped = partition(labels, k, alpha=0.1, min_size=0, balance=True, seed=4)
    # a client stops receiving once it holds >= N/K, so it exceeds N/K by at most one class's share
    assert max(len(p) for p in capped) < n / k + 200
    assert max(len(p) for p in capped) < max(len(p) for p in free)


def test_dirichlet_balance_with_tiny_alpha_stays_finite():
    """Dir(1e-3) puts all float mass on one client; if that client is full, nothing is lost."""
    labels = _labels(n_per_class=50)
    for seed in range(30):
        parts = partition(labels, 10, alpha=1e-3, balance=True, min_size=0, seed=seed)
        assert sum(len(p) for p in parts) == len(labels)
        _check_disjoint(parts, len(labels))


def _inner_dirichlet_one_at_a_time(labels, sizes, alpha, seed):
    """Reference: the same random draws, consumed one sample at a time as FedLab does."""
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in classes]
    priors = rng.dirichlet(np.full(len(classes), alpha), size=len(sizes))
    turns = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    draws = rng.random(len(turns))
    parts = [[] for _ in sizes]
    for client, u in zip(turns, draws):
        q = np.array([priors[client, c] if pools[c] else 0.0 for c in range(len(classes))])
        if q.sum() <= 0:
            q = np.array([1.0 if pools[c] else 0.0 for c in range(len(classes))])
        cdf = np.cumsum(q / q.sum())
        c = min(int(np.sum(cdf <= u)), len(classes) - 1)
        parts[client].append(pools[c].pop())
    return [np.sort(np.array(p, dtype=np.int64)) for p in parts]


@pytest.mark.parametrize("alpha, sizes", [(0.1, [150, 150, 150, 150]), (1.0, [300, 10, 200, 90]),
                                          (0.05, [100] * 6)])
def test_inner_dirichlet_matches_sequential_reference(alpha, sizes):
    labels = np.repeat(np.arange(6), [200, 150, 100, 60, 50, 40])  # classes run out at different times
    ours = partition(labels, len(sizes), "inner_dirichlet", client_sizes=sizes, alpha=alpha, seed=7)
    ref = _inner_dirichlet_one_at_a_time(labels, np.array(sizes), alpha, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(ours, ref))


def test_inner_dirichlet_fixed_sizes():
    labels = _labels()
    parts = partition(labels, 4, "inner_dirichlet", client_sizes=[100, 200, 300, 50], alpha=0.3, seed=1)
    assert [len(p) for p in parts] == [100, 200, 300, 50]
    _check_disjoint(parts, len(labels))
    labels = _labels(n_per_class=400)  # 400 samples per client: multinomial noise in TV is about 0.06
    skew = _tv_to_uniform(labels, partition(labels, 10, "inner_dirichlet", alpha=0.05, seed=0), 10)
    flat = _tv_to_uniform(labels, partition(labels, 10, "inner_dirichlet", alpha=1000.0, seed=0), 10)
    assert flat < 0.1 < 0.4 < skew
    with pytest.raises(PartitionError, match="sum to 5000"):
        partition(labels, 2, "inner_dirichlet", client_sizes=[2500, 2500])


@pytest.mark.parametrize("k, c", [(10, 2), (7, 3), (25, 1), (4, 10)])
def test_shards_give_exactly_c_classes(k, c):
    labels = _labels()
    parts = partition(labels, k, "shards", classes_per_client=c, seed=5)
    report = partition_report(labels, parts, 10)
    assert np.all((report > 0).sum(axis=1) == c)
    holders = (report > 0).sum(axis=0)
    assert holders.max() - holders.min() <= 1  # classes are dealt evenly
    for cls in range(10):  # a class's samples are split evenly among its holders
        held = report[:, cls][report[:, cls] > 0]
        assert held.size == 0 or held.max() - held.min() <= 1


def test_shards_errors():
    labels = _labels()
    with pytest.raises(PartitionError, match="classes_per_client=11"):
        partition(labels, 5, "shards", classes_per_client=11)
    with pytest.raises(PartitionError, match="class .* has 3 samples but 4 clients"):
        partition(np.repeat(np.arange(2), 3), 8, "shards", classes_per_client=1, min_size=0)


def test_mcmahan_shards_structure():
    labels = _labels()  # 1000 samples: 20 shards of 50, each inside one class
    parts = partition(labels, 10, "mcmahan_shards", classes_per_client=2, seed=0)
    assert all(len(p) == 100 for p in parts)
    report = partition_report(labels, parts, 10)
    assert np.all((report > 0).sum(axis=1) <= 2) and np.all(report % 50 == 0)


def test_bad_arguments_are_config_errors():
    labels = _labels()
    assert issubclass(PartitionError, ConfigError)
    for kwargs in ({"method": "zipf"}, {"alpha": 0.0}, {"client_sizes": [1] * 5},
                   {"method": "shards", "balance": True},
                   {"num_clients": 0}, {"min_size": -1}):
        args = {"num_clients": 5, **kwargs}
        with pytest.raises(PartitionError):
            partition(labels, **args)
    with pytest.raises(PartitionError, match="1-D integer"):
        partition(labels.astype(float), 5)


def test_train_val_split():
    labels = _labels()
    parts = partition(labels, 5, "iid", seed=0)
    train, val = train_val_split(parts, 0.3, seed=2)
    for p, t, v in zip(parts, train, val):
        assert len(v) == int(0.3 * len(p)) and len(t) + len(v) == len(p)
        assert np.array_equal(np.sort(np.concatenate([t, v])), p)
        assert np.all(np.diff(t) > 0) and np.all(np.diff(v) > 0)
    again = train_val_split(parts, 0.3, seed=2)
    assert all(np.array_equal(a, b) for a, b in zip(val, again[1]))
    with pytest.raises(PartitionError, match="val_fraction"):
        train_val_split(parts, 1.0)


@settings(max_examples=40, deadline=None)
@given(labels=st.lists(st.integers(0, 5), min_size=1, max_size=300),
       k=st.integers(1, 12), method=st.sampled_from([m for m in METHODS if m != "fold"]), alpha=st.floats(0.05, 100.0),
       c=st.integers(1, 3), balance=st.booleans(), seed=st.integers(0, 2**31))
def test_property_disjoint_and_counts(labels, k, method, alpha, c, balance, seed):
    labels = np.asarray(labels, dtype=np.int64)
    try:
        parts = partition(labels, k, method, alpha=alpha, classes_per_client=c, min_size=0,
                          balance=balance and method == "dirichlet", seed=seed)
    except PartitionError as err:  # only the shard methods have constraints that min_size=0 does not lift
        n_classes = len(np.unique(labels))
        short = re.search(r"has (\d+) samples but (\d+) clients", str(err))
        assert (method == "shards" and (c > n_classes or short is not None
                                        and int(short[1]) < int(short[2]) <= -(-k * c // n_classes))
                or method == "mcmahan_shards" and k * c > len(labels)), str(err)
        return
    assert len(parts) == k
    used = _check_disjoint(parts, len(labels))
    report = partition_report(labels, parts, 6)
    np.testing.assert_array_equal(report.sum(axis=1), [len(p) for p in parts])
    if method == "shards":  # every sample of every class some client holds (all classes if k*c >= #classes)
        held = np.flatnonzero(report.sum(axis=0) > 0)
        assert len(used) == np.isin(labels, held).sum()
        assert k * c < len(np.unique(labels)) or len(used) == len(labels)
    elif method != "mcmahan_shards":
        assert len(used) == len(labels)
    else:
        assert len(used) == k * c * (len(labels) // (k * c))
    if method == "shards":
        assert np.all((report > 0).sum(axis=1) == c)
    again = partition(labels, k, method, alpha=alpha, classes_per_client=c, min_size=0,
                      balance=balance and method == "dirichlet", seed=seed)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5), alpha=st.floats(0.05, 10.0),
       seed=st.integers(0, 1000))
def test_property_inner_dirichlet_respects_sizes(sizes, alpha, seed):
    labels = _labels(n_per_class=40, num_classes=5, seed=seed)  # 200 >= 5 clients x 40
    parts = partition(labels, len(sizes), "inner_dirichlet", client_sizes=sizes, alpha=alpha,
                      min_size=0, seed=seed)
    assert [len(p) for p in parts] == sizes
    _check_disjoint(parts, len(labels))
    ref = _inner_dirichlet_one_at_a_time(labels, np.array(sizes, dtype=np.int64), alpha, seed)
    assert all(np.array_equal(a, b) for a, b in zip(parts, ref))


def test_fold_split_matches_floco_definition():
    labels = _labels(n_per_class=100)  # 1000 samples, 10 balanced classes
    parts = partition(labels, 10, "fold", seed=4)
    _check_disjoint(parts, len(labels))
    report = partition_report(labels, parts, 10)
    n = len(parts[0])
    assert [len(p) for p in parts] == [n] * 10 and 95 <= n <= 100  # about N/K, the largest size that fits
    with pytest.raises(PartitionError, match="only 100 exist"):
        partition(labels, 10, "fold", client_sizes=[n + 1] * 10)
    assert (report.sum(axis=0) <= np.bincount(labels)).all()
    for i, row in enumerate(report):
        primary = [2 * (i % 5), 2 * (i % 5) + 1]  # array_split of 10 classes into 5 folds
        assert row[primary].sum() == round(0.8 * n) and abs(row[primary[0]] - row[primary[1]]) <= 1
        rest = [row[c] for c in range(10) if c not in primary]
        assert sum(rest) == n - round(0.8 * n) and max(rest) - min(rest) <= 1


def test_fold_split_unbalanced_classes_options_and_errors():
    labels = np.concatenate([np.repeat(np.arange(10), 50), np.zeros(30, np.int64)])  # class 0 has 80
    parts = partition(labels, 6, "fold", folds=2, primary_fraction=0.5, seed=1)
    report = partition_report(labels, parts, 10)
    sizes = {len(p) for p in parts}
    assert len(sizes) == 1 and (report.sum(axis=0) <= np.bincount(labels)).all()
    n = sizes.pop()
    # the largest equal size whose quotas fit: classes 1..9 hold 50 each
    assert all(row[:5].sum() == round(0.5 * n) for row in report[0::2])
    assert all(row[5:].sum() == round(0.5 * n) for row in report[1::2])
    with pytest.raises(PartitionError, match="only 50 exist"):
        partition(labels, 6, "fold", folds=2, primary_fraction=0.5, client_sizes=[n + 1] * 6)
    with pytest.raises(PartitionError, match="folds must be"):
        partition(labels, 6, "fold", folds=11)
    with pytest.raises(PartitionError, match="primary_fraction"):
        partition(labels, 6, "fold", primary_fraction=1.5)


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 15), folds=st.integers(1, 6), q=st.floats(0.0, 1.0), seed=st.integers(0, 1000))
def test_property_fold_quotas(k, folds, q, seed):
    labels = _labels(n_per_class=30, num_classes=6, seed=seed)
    parts = partition(labels, k, "fold", folds=folds, primary_fraction=q, min_size=0, seed=seed)
    _check_disjoint(parts, len(labels))
    report = partition_report(labels, parts, 6)
    groups = np.array_split(np.arange(6), folds)
    for i, row in enumerate(report):
        primary = groups[i % folds]
        n = row.sum()
        assert row[primary].sum() == (round(q * n) if folds > 1 else n)
        assert row[primary].max() - row[primary].min() <= 1  # spread evenly
