"""Split a labelled training set over FL clients (label-skew partitioners).

Several different algorithms are called "Dirichlet" in the FL literature; each method
here says which paper or framework it reproduces. All randomness comes from
``numpy.random.default_rng(seed)``; the global RNG is never touched.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from landscape.infra.errors import ConfigError

METHODS = ("iid", "dirichlet", "inner_dirichlet", "shards", "mcmahan_shards", "fold")


class PartitionError(ConfigError):
    """The requested partition cannot be built (a constraint cannot be met)."""


def partition(labels: np.ndarray, num_clients: int, method: str = "dirichlet", *,
              alpha: float = 0.5, classes_per_client: int = 2, min_size: int = 1,
              max_redraws: int = 100, balance: bool = False,
              client_sizes: Sequence[int] | None = None, folds: int = 5,
              primary_fraction: float = 0.8, seed: int = 0) -> list[np.ndarray]:
    """Split sample indices ``0..len(labels)-1`` over ``num_clients`` clients.

    The ``method`` values:

    - ``"iid"``: uniform random split into near-equal parts (or ``client_sizes``).
    - ``"dirichlet"``: per-class label skew of Yurochkin et al. / NIID-Bench, as in FedLab's
      ``hetero_dir_partition`` (used by IMA) and FedGuCci. For every class c draw
      ``p_c ~ Dir(alpha * 1_K)`` over clients and cut the class's shuffled samples at
      ``floor(cumsum(p_c) * n_c)``. Redraw everything while some client has fewer than
      ``min_size`` samples, at most ``max_redraws`` times (then ``PartitionError``; FedLab
      uses ``min_size = num_classes`` and loops forever). ``balance=True`` zeroes ``p_c``
      for clients that already hold ``>= N/K`` samples (FedLab/NIID-Bench/PFLlib).
      FedGuCci's code has no redraw loop (``min_size=0``) and rounds ``p_c * n_c`` per
      client, giving the remainder to the last client; the two cuts differ by at most one
      sample per client and class.
    - ``"inner_dirichlet"``: fixed client sizes (``client_sizes``, default equal), each
      client's class prior ``q_k ~ Dir(alpha * 1_C)``; samples are handed out one at a
      time, clients taking turns in a random order of their slots, each sample's class
      drawn from ``q_k`` restricted to classes that still have samples. FedLab
      ``client_inner_dirichlet_partition`` (IMA's CIFAR-100), Flower
      ``InnerDirichletPartitioner`` (FLOCO's Flower baseline).
    - ``"shards"``: pathological label-quantity skew, exactly ``classes_per_client`` distinct
      classes per client (NIID-Bench ``#C``; the intent of McMahan et al.'s 2-shard split).
      Classes are dealt so each is held by as equal a number of clients as possible, and a
      class's samples are split evenly among its holders.
    - ``"mcmahan_shards"``: McMahan et al. (2017) literally, as FedLab ``shards`` (IMA's
      ``#C=2``): sort by label, cut into ``K * classes_per_client`` equal shards, deal
      ``classes_per_client`` random shards per client. A client may get fewer classes.
    - ``"fold"``: FLOCO's 5-Fold split (Sec. 4.1, after Huang et al. 2021): the classes are
      cut into ``folds`` consecutive groups (``array_split`` of the sorted class ids), client
      ``i`` belongs to group ``i mod folds``, and each client draws ``round(q * n_k)`` samples
      evenly from its group's "primary" classes and the rest evenly from all other classes,
      without replacement (``q = primary_fraction``, 0.8 in the paper). Client sizes are
      ``client_sizes`` or, by default, equal and as large as the class counts allow (about
      ``N/K`` for balanced classes).

    Returns one sorted int64 index array per client; no index appears twice.
    """
    labels = _check_labels(labels)
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise PartitionError(f"num_clients must be a positive integer, got {num_clients!r}.")
    if method not in METHODS:
        raise PartitionError(f"unknown partition method {method!r}; choose one of {', '.join(METHODS)}.")
    if min_size < 0:
        raise PartitionError(f"min_size must be >= 0, got {min_size}.")
    if num_clients * min_size > len(labels):
        raise PartitionError(f"{num_clients} clients x min_size {min_size} needs more than the "
                             f"{len(labels)} samples available; lower num_clients or min_size.")
    if client_sizes is not None and method not in ("iid", "inner_dirichlet", "fold"):
        raise PartitionError(f"client_sizes is only used by 'iid', 'inner_dirichlet' and 'fold', not {method!r}.")
    if balance and method != "dirichlet":
        raise PartitionError(f"balance=True only applies to method 'dirichlet', not {method!r}.")
    if method in ("dirichlet", "inner_dirichlet") and not alpha > 0:
        raise PartitionError(f"Dirichlet concentration alpha must be > 0, got {alpha}.")
    rng = np.random.default_rng(seed)
    if method == "iid":
        parts = _iid(len(labels), _sizes(len(labels), num_clients, client_sizes), rng)
    elif method == "dirichlet":
        parts = _dirichlet(labels, num_clients, alpha, min_size, max_redraws, balance, rng)
    elif method == "inner_dirichlet":
        parts = _inner_dirichlet(labels, _sizes(len(labels), num_clients, client_sizes), alpha, rng)
    elif method == "fold":
        parts = _fold(labels, num_clients, folds, primary_fraction, client_sizes, rng)
    elif method == "shards":
        parts = _class_shards(labels, num_clients, classes_per_client, rng)
    else:
        parts = _mcmahan_shards(labels, num_clients, classes_per_client, rng)
    parts = [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    smallest = min(len(p) for p in parts)
    if smallest < min_size:
        raise PartitionError(f"method {method!r} gave a client only {smallest} samples, fewer than "
                             f"min_size={min_size}; use fewer clients, a larger alpha or a smaller min_size.")
    return parts


def train_val_split(parts: list[np.ndarray], val_fraction: float, seed: int = 0
                    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Split each client's indices into (train, validation) parts.

    Each client keeps ``floor(val_fraction * n_k)`` random samples for validation
    (FedGuCci: 0.3, FLOCO: 0.2, LSS: 0.25). Returns sorted index arrays.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise PartitionError(f"val_fraction must be in [0, 1), got {val_fraction}.")
    rng = np.random.default_rng(seed)
    train, val = [], []
    for part in parts:
        shuffled = rng.permutation(np.asarray(part, dtype=np.int64))
        n_val = int(np.floor(val_fraction * len(shuffled)))
        val.append(np.sort(shuffled[:n_val]))
        train.append(np.sort(shuffled[n_val:]))
    return train, val


def partition_report(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """Class counts per client, shape ``(num_clients, num_classes)``."""
    labels = _check_labels(labels)
    if labels.size and labels.max() >= num_classes:
        raise PartitionError(f"labels go up to {labels.max()} but num_classes is {num_classes}.")
    return np.stack([np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=num_classes)
                     for p in parts]).astype(np.int64)


def _check_labels(labels: np.ndarray) -> np.ndarray:
    arr = np.asarray(labels)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise PartitionError(f"labels must be a 1-D integer array, got shape {arr.shape} dtype {arr.dtype}.")
    if arr.size and arr.min() < 0:
        raise PartitionError("labels must be non-negative class indices.")
    return arr.astype(np.int64, copy=False)


def _sizes(n: int, num_clients: int, client_sizes: Sequence[int] | None) -> np.ndarray:
    """Requested client sizes; default: ``n`` split as evenly as possible."""
    if client_sizes is None:
        return np.array([len(c) for c in np.array_split(np.arange(n), num_clients)], dtype=np.int64)
    sizes = np.asarray(client_sizes, dtype=np.int64)
    if sizes.shape != (num_clients,) or (sizes < 0).any():
        raise PartitionError(f"client_sizes must be {num_clients} non-negative integers, got {list(client_sizes)}.")
    if sizes.sum() > n:
        raise PartitionError(f"client_sizes sum to {sizes.sum()} but only {n} samples exist.")
    return sizes


def _iid(n: int, sizes: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    order = rng.permutation(n)
    return np.split(order[:sizes.sum()], np.cumsum(sizes)[:-1])


def _dirichlet(labels: np.ndarray, k: int, alpha: float, min_size: int, max_redraws: int,
               balance: bool, rng: np.random.Generator) -> list[np.ndarray]:
    n = len(labels)
    classes = np.unique(labels)
    for _ in range(max(1, max_redraws)):
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        counts = np.zeros(k, dtype=np.int64)
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(k, alpha))
            if balance:  # some client is always below N/K while samples remain
                open_ = counts < n / k
                p = p * open_
                # tiny alpha can put all mass (to float precision) on full clients: share evenly then
                p = p / p.sum() if p.sum() > 0 else open_ / open_.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
                counts[client] += len(chunk)
        if counts.min() >= min_size:
            return [np.concatenate(p) for p in parts]
    raise PartitionError(f"Dirichlet(alpha={alpha}) left a client with fewer than min_size={min_size} "
                         f"samples in each of {max(1, max_redraws)} draws; raise alpha or max_redraws, "
                         "lower min_size or num_clients, or use method='inner_dirichlet' (fixed sizes).")


def _inner_dirichlet(labels: np.ndarray, sizes: np.ndarray, alpha: float,
                     rng: np.random.Generator) -> list[np.ndarray]:
    """Sequential semantics, evaluated in blocks.

    One sample per turn, class ~ the client's prior restricted to classes with samples
    left. Between two class exhaustions the restricted priors are fixed, so a whole block
    of turns is drawn at once (at most one block per class).
    """
    classes = np.unique(labels)
    pools = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    remaining = np.array([len(p) for p in pools], dtype=np.int64)
    pool_start = np.concatenate([[0], np.cumsum(remaining)[:-1]])
    pool = np.concatenate(pools)
    priors = rng.dirichlet(np.full(len(classes), alpha), size=len(sizes))
    # clients take turns in a random interleaving of their slots (FedLab: a random unfilled client per step)
    turns = rng.permutation(np.repeat(np.arange(len(sizes)), sizes))
    draws = rng.random(len(turns))
    sample = np.empty(len(turns), np.int64)
    pos = 0
    while pos < len(turns):
        open_ = remaining > 0
        q = priors * open_
        empty = q.sum(axis=1) <= 0  # a prior with no mass left on open classes: uniform over them
        q[empty] = open_
        cdf = np.cumsum(q / q.sum(axis=1, keepdims=True), axis=1)
        block = turns[pos:]
        # inverse-CDF sampling for all turns at once: row k of the flat table is cdf[k] + k
        flat = (cdf + np.arange(len(sizes))[:, None]).ravel()
        found = np.searchsorted(flat, block + draws[pos:], side="right") - block * len(classes)
        drawn = np.minimum(found, len(classes) - 1)
        # rank of each turn among the turns drawing the same class; the turn taking a class's
        # last sample ends the block (later turns draw from renormalised priors)
        order = np.argsort(drawn, kind="stable")
        rank = np.empty(len(drawn), np.int64)
        rank[order] = np.arange(len(drawn)) - np.searchsorted(drawn[order], drawn[order])
        last = np.flatnonzero(rank >= remaining[drawn] - 1)
        stop = last[0] + 1 if len(last) else len(drawn)
        c, r = drawn[:stop], rank[:stop]
        sample[pos:pos + stop] = pool[pool_start[c] + remaining[c] - 1 - r]  # popped from the end
        remaining -= np.bincount(c, minlength=len(classes))
        pos += stop
    return [sample[turns == client] for client in range(len(sizes))]


def _class_shards(labels: np.ndarray, k: int, per_client: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    classes = np.unique(labels)
    if not 1 <= per_client <= len(classes):
        raise PartitionError(f"classes_per_client={per_client} must be between 1 and the "
                             f"{len(classes)} classes present in the labels.")
    holders: list[list[int]] = [[] for _ in classes]
    usage = np.zeros(len(classes), dtype=np.int64)
    for client in range(k):
        # least-used classes first, ties broken at random: usage differs by at most one
        order = np.lexsort((rng.random(len(classes)), usage))[:per_client]
        for c in order:
            holders[c].append(client)
        usage[order] += 1
    parts: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c, clients in zip(classes, holders):
        if not clients:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        if len(idx) < len(clients):
            raise PartitionError(f"class {c} has {len(idx)} samples but {len(clients)} clients must hold it; "
                                 "use fewer clients or fewer classes_per_client.")
        for client, chunk in zip(clients, np.array_split(idx, len(clients))):
            parts[client].append(chunk)
    return [np.concatenate(p) for p in parts]


def _mcmahan_shards(labels: np.ndarray, k: int, per_client: int,
                    rng: np.random.Generator) -> list[np.ndarray]:
    num_shards = k * per_client
    if num_shards > len(labels) or per_client < 1:
        raise PartitionError(f"{k} clients x {per_client} shards needs at least {num_shards} samples "
                             f"(got {len(labels)}) and classes_per_client >= 1.")
    order = np.argsort(labels, kind="stable")
    size = len(labels) // num_shards  # the remainder (< num_shards samples) is left out, as in FedLab
    shards = order[:num_shards * size].reshape(num_shards, size)
    dealt = rng.permutation(num_shards).reshape(k, per_client)
    return [shards[row].ravel() for row in dealt]


def _fold(labels: np.ndarray, k: int, folds: int, q: float, client_sizes: Sequence[int] | None,
          rng: np.random.Generator) -> list[np.ndarray]:
    """FLOCO's 5-Fold split; see :func:`partition`."""
    classes = np.unique(labels)
    if not (isinstance(folds, (int, np.integer)) and 1 <= folds <= len(classes)):
        raise PartitionError(f"folds must be an integer between 1 and the {len(classes)} classes, got {folds!r}.")
    if not 0.0 <= q <= 1.0:
        raise PartitionError(f"primary_fraction must be in [0, 1], got {q}.")
    groups = np.array_split(np.arange(len(classes)), folds)
    supply = np.array([np.sum(labels == c) for c in classes], dtype=np.int64)
    if client_sizes is None:
        size = len(labels) // k
        while size > 0 and (_fold_quotas(np.full(k, size), groups, len(classes), q).sum(axis=0) > supply).any():
            size -= 1
        sizes = np.full(k, size, dtype=np.int64)
    else:
        sizes = _sizes(len(labels), k, client_sizes)
    quotas = _fold_quotas(sizes, groups, len(classes), q)
    short = np.flatnonzero(quotas.sum(axis=0) > supply)
    if len(short):
        raise PartitionError(f"the fold split needs {quotas.sum(axis=0)[short[0]]} samples of class "
                             f"{classes[short[0]]} but only {supply[short[0]]} exist; use smaller client_sizes.")
    parts: list[list[np.ndarray]] = [[] for _ in range(k)]
    for j, c in enumerate(classes):
        pool = rng.permutation(np.flatnonzero(labels == c))
        for client, chunk in enumerate(np.split(pool[:quotas[:, j].sum()], np.cumsum(quotas[:, j])[:-1])):
            parts[client].append(chunk)
    return [np.concatenate(p) for p in parts]


def _fold_quotas(sizes: np.ndarray, groups: list[np.ndarray], num_classes: int, q: float) -> np.ndarray:
    """Samples per (client, class index).

    ``round(q n)`` spread evenly over the client's primary classes, the rest evenly over the
    others. All primary shares are set first; a share's remainder goes to the classes drawn
    least so far (ties: lowest index), so the totals per class stay as even as possible.
    """
    quotas = np.zeros((len(sizes), num_classes), dtype=np.int64)
    for primary_pass in (True, False):
        for i, n in enumerate(sizes):
            primary = groups[i % len(groups)]
            others = np.setdiff1d(np.arange(num_classes), primary)
            n_primary = int(round(q * n)) if len(others) else int(n)
            members, total = (primary, n_primary) if primary_pass else (others, int(n) - n_primary)
            if len(members) == 0:
                continue
            share = np.full(len(members), total // len(members))
            least_drawn = np.argsort(quotas[:, members].sum(axis=0), kind="stable")
            share[least_drawn[: total % len(members)]] += 1
            quotas[i, members] = share
    return quotas
