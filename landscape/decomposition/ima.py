"""The IMA paper's decomposition of a federated global model's loss (Theorem 1; ``docs/methods/ima.md``).

Outputs are softmax probabilities, targets one-hot, errors squared L2 norms. ``D`` is the
union of the clients' data (samples identified by content, so a sample held by several
clients counts once and is "seen" by each of them). With ``S`` realizations per client
(paired by index ``s`` across clients), for every ``(x, y)`` in ``D``::

    mu_k  = mean_s f_{w_k^s}(x),     r_k = y - mu_k
    bTB   = sum_k p_k 1[x in D_k] r_k,   bHB = sum_k p_k 1[x not in D_k] r_k,   b = bTB + bHB
    Var_k = mean_s |f_{w_k^s} - mu_k|^2,  Cov_kk' = mean_s <f_{w_k^s} - mu_k, f_{w_k'^s} - mu_k'>

and every reported term is the mean over ``D`` of: ``|b|^2`` (bias), ``|bTB|^2``
(train_bias), ``|bHB|^2`` (heter_bias), ``2<bTB, bHB>`` (cross), ``sum_k p_k^2 Var_k``
(variance), ``sum_{k != k'} p_k p_k' Cov_kk'`` (covariance), ``mean_s |y - sum_k p_k
f_{w_k^s}|^2`` (wens_loss) and ``mean_s |y - f_{sum_k p_k w_k^s}|^2`` (fma_loss). Then
``wens_loss == bias + variance + covariance`` and ``bias == train_bias + heter_bias + cross``
hold exactly.

With a token loss (``causal_lm``, ``masked_lm``, ``token``) the samples of ``D`` are the counted
tokens: the softmax over the vocabulary at each position against its (for ``causal_lm``,
next-token) label, labels -100 skipped; a token belongs to the clients holding its sequence,
and the default weights are proportional to the clients' counted tokens.
"""
from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ..evaluation.data import prepare_data
from ..evaluation.losses import IGNORE_INDEX
from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError, DataError
from ..results import Decomposition
from ..space.params import ModelLike

CHUNK = 2048  # samples per forward pass


# ------------------------------------------------------------------ decomposition
def decompose(client_models: Sequence[ModelLike | Sequence[ModelLike]], client_data: Sequence[Any],
              evaluator: PointEvaluator, *, weights: Sequence[float] | None = None) -> Decomposition:
    """IMA Theorem 1 terms for client models ``client_models[k]`` trained on ``client_data[k]``.

    ``client_models[k]`` is a model-like or a list of realizations (the same number for every
    client; realization ``s`` of each client is paired). ``weights`` default to client sizes
    ``|D_k|``; they are normalised. The FMA model of realization ``s`` is ``sum_k p_k w_k^s``
    over the whole state (BatchNorm buffers averaged, as FedAvg does). ``evaluator`` supplies
    the architecture, device and dtype; its own data are not used. The estimators of every
    term are in the module docstring and ``docs/methods/ima.md``.

    Parameters
    ----------
    client_models
        Per client k, a model-like (``nn.Module``, state_dict, checkpoint path or flat vector)
        or a list of S realizations of it (S the same for every client).
    client_data
        Per client k, its data ``D_k`` in any form the evaluator accepts (tensors ``(x, y)``,
        a dataset, a data loader) with integer class labels.
    evaluator
        A :class:`~landscape.Evaluator` of the clients' architecture.
    weights
        Client weights ``p_k`` (normalised; default proportional to ``|D_k|``).

    Returns
    -------
    Decomposition
        The mean over ``D`` of bias, train_bias, heter_bias, cross, variance, covariance,
        wens_loss and fma_loss (IMA Theorem 1: ``wens_loss = bias + variance + covariance``),
        the FMA-WENS gap, each client's distance to the FMA model (``locality``) and its bias
        on its own and on the other clients' data.

    Raises
    ------
    ConfigError
        If there are no client models, the numbers of realizations differ, the numbers of
        clients with models and with data differ, or the weights are invalid.
    DataError
        If a client's targets are not integer class labels (or its data cannot be read).

    Warns
    -----
    UserWarning
        With one realization per client (variance and covariance are then 0 by construction).
    """
    vectors = _realizations(client_models, evaluator)  # (K, S, D) float64 CPU
    k_clients, s_real = vectors.shape[:2]
    if len(client_data) != k_clients:
        raise ConfigError(f"{k_clients} clients have models but {len(client_data)} have data")
    loss = evaluator.loss
    x, y, member, sizes = _union(client_data, evaluator, loss)
    p = client_weights(weights, sizes)
    fma = torch.einsum("k,ksd->sd", torch.as_tensor(p), vectors)  # (S, D)
    locality = np.array([np.mean([float(evaluator.space.norm(vectors[k, s] - fma[s])) for s in range(s_real)])
                         for k in range(k_clients)])

    dev, dtype = evaluator.device, evaluator.dtype
    models = evaluator.space.unflatten(vectors.reshape(k_clients * s_real, -1).to(dev, dtype))
    fma_params = evaluator.space.unflatten(fma.to(dev, dtype))
    pk = torch.as_tensor(p, device=dev, dtype=torch.float64)
    member_dev = torch.as_tensor(member, device=dev, dtype=torch.float64)  # (n, K)
    totals = dict.fromkeys(("bias", "train_bias", "heter_bias", "cross", "variance", "covariance",
                            "wens_loss", "fma_loss", "output_gap"), 0.0)
    rows, count_in = 0, torch.zeros(k_clients, dtype=torch.float64, device=dev)  # |D|, |D_k|
    own_sq = torch.zeros(k_clients, dtype=torch.float64, device=dev)    # sum over D_k of |r_k|^2
    other_sq = torch.zeros(k_clients, dtype=torch.float64, device=dev)  # sum over D \ D_k
    with torch.no_grad():
        for start in range(0, len(y), CHUNK):
            xb, yb = x[start:start + CHUNK].to(dev), y[start:start + CHUNK].to(dev)
            owner, labels = _counted(loss, yb)  # the rows of D in this chunk: their sample, their label
            mb = member_dev[start:start + CHUNK][owner]
            probs = torch.stack([_softmax(evaluator, {n: t[i] for n, t in models.items()}, xb, yb, loss)
                                 for i in range(k_clients * s_real)])
            probs = probs.reshape(k_clients, s_real, *probs.shape[1:])  # (K, S, B, C)
            target = nn.functional.one_hot(labels, probs.shape[-1]).to(torch.float64)
            mu = probs.mean(1)  # (K, B, C)
            r = target - mu
            w_in = (pk * mb).T[..., None]  # (K, B, 1)
            w_out = (pk * (1 - mb)).T[..., None]
            b_tb, b_hb = (w_in * r).sum(0), (w_out * r).sum(0)
            b = b_tb + b_hb
            delta = probs - mu[:, None]  # (K, S, B, C)
            var_k = (delta ** 2).sum(-1).mean(1)  # (K, B)
            weighted_var = (pk[:, None] ** 2 * var_k).sum(0)
            pooled = torch.einsum("k,ksbc->sbc", pk, delta)
            wens = torch.einsum("k,ksbc->sbc", pk, probs)  # (S, B, C)
            f_fma = torch.stack([_softmax(evaluator, {n: t[s] for n, t in fma_params.items()}, xb, yb, loss)
                                 for s in range(s_real)])
            sums = {
                "bias": (b ** 2).sum(), "train_bias": (b_tb ** 2).sum(), "heter_bias": (b_hb ** 2).sum(),
                "cross": 2 * (b_tb * b_hb).sum(), "variance": weighted_var.sum(),
                "covariance": ((pooled ** 2).sum(-1).mean(0) - weighted_var).sum(),
                "wens_loss": ((target - wens) ** 2).sum(-1).mean(0).sum(),
                "fma_loss": ((target - f_fma) ** 2).sum(-1).mean(0).sum(),
                "output_gap": torch.linalg.vector_norm(f_fma - wens, dim=-1).mean(0).sum(),
            }
            for name, value in sums.items():
                totals[name] += float(value)
            r_sq = (r ** 2).sum(-1)  # (K, B)
            own_sq += (r_sq * mb.T).sum(1)
            other_sq += (r_sq * (1 - mb.T)).sum(1)
            rows += len(labels)
            count_in += mb.sum(0)
    n = rows
    means = {name: value / n for name, value in totals.items()}
    count_in = count_in.cpu().numpy()
    count_out = n - count_in
    with np.errstate(invalid="ignore", divide="ignore"):
        tb = own_sq.cpu().numpy() / count_in
        hb = np.where(count_out > 0, other_sq.cpu().numpy() / count_out, np.nan)
    if s_real == 1:
        warnings.warn("decompose: one realization per client, so variance and covariance are 0 by construction "
                      "and wens_loss equals bias; pass several realizations per client (e.g. the client models "
                      "of runs with different seeds) to estimate them", stacklevel=2)
    return Decomposition(
        **means, gap=means["fma_loss"] - means["wens_loss"], locality=locality, weights=p,
        client_sizes=sizes, client_train_bias=tb, client_heter_bias=hb, num_samples=n,
        realizations=s_real, spec={"evaluator": evaluator.fingerprint(), "weights": p.tolist()})


def _counted(loss: Any, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of ``D`` in a batch: for each, the index of its sample and its label.

    Samples for a sample loss; the counted tokens (aligned as the loss aligns them, labels -100
    dropped) for a token loss.
    """
    owner = torch.arange(len(y), device=y.device).reshape(-1, *[1] * (y.ndim - 1)).expand(y.shape)
    owner, labels = loss.align(owner.unsqueeze(-1), y)
    keep = labels != IGNORE_INDEX
    return owner.reshape(-1)[keep], labels[keep]


def _softmax(evaluator: PointEvaluator, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
             loss: Any) -> torch.Tensor:
    """Softmax outputs of the rows of ``D`` (:func:`_counted`) in a batch."""
    out, labels = loss.align(evaluator.forward(params, x), y)
    return torch.softmax(out[labels != IGNORE_INDEX].to(torch.float64), dim=-1)


def _is_single(model: Any) -> bool:
    return isinstance(model, (nn.Module, Mapping, str, torch.Tensor)) or hasattr(model, "__fspath__")


def _realizations(client_models: Sequence[Any], evaluator: PointEvaluator) -> torch.Tensor:
    """Flat vectors ``(K, S, D)``: each client's model-like or list of realizations."""
    if len(client_models) == 0:
        raise ConfigError("no client models given")
    per_client = [[m] if _is_single(m) else list(m) for m in client_models]
    counts = {len(r) for r in per_client}
    if len(counts) != 1 or 0 in counts:
        raise ConfigError(f"every client needs the same (non-zero) number of realizations; got "
                          f"{[len(r) for r in per_client]}")
    return torch.stack([torch.stack([evaluator.vector(m) for m in r]) for r in per_client])


def _union(client_data: Sequence[Any], evaluator: PointEvaluator, loss: Any
           ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """Unique samples of all clients (by content), client membership (n, K) and client sizes.

    A client's size is its number of samples, or of counted tokens for a token loss.
    """
    index: dict[bytes, int] = {}
    xs, ys, members = [], [], []
    sizes = []
    for k, data in enumerate(client_data):
        prepared = prepare_data(data, torch.device("cpu"), evaluator.dtype)
        count = 0
        for xb, yb in prepared.batches:
            if torch.is_floating_point(yb) or yb.ndim != (2 if loss.tokens else 1):
                raise DataError("the decomposition needs integer class labels (they become one-hot targets), one "
                                "per sample, or one per position with a token loss (loss='causal_lm'); client "
                                f"{k} has targets of dtype {yb.dtype} and shape {tuple(yb.shape)}")
            for xi, yi in zip(xb, yb):
                key = hashlib.sha1(xi.contiguous().numpy().tobytes()
                                   + yi.to(torch.int64).contiguous().numpy().tobytes()).digest()
                pos = index.setdefault(key, len(xs))
                if pos == len(xs):
                    xs.append(xi)
                    ys.append(yi)
                    members.append(set())
                members[pos].add(k)
                count += loss.count(yi.unsqueeze(0))
        sizes.append(count)
    member = np.zeros((len(xs), len(client_data)), dtype=bool)
    for i, owners in enumerate(members):
        member[i, sorted(owners)] = True
    return torch.stack(xs), torch.stack(ys), member, np.asarray(sizes, dtype=np.float64)


def client_weights(weights: Sequence[float] | None, sizes: np.ndarray) -> np.ndarray:
    """Normalised client weights ``p_k`` (default: proportional to ``sizes``).

    Parameters
    ----------
    weights
        Non-negative weights with a positive sum, or None.
    sizes
        Client data sizes ``|D_k|``.

    Returns
    -------
    numpy.ndarray
        Weights summing to one.

    Raises
    ------
    ConfigError
        If the weights are not one finite, non-negative number per client with a positive sum.
    """
    p = np.asarray(sizes if weights is None else weights, dtype=np.float64)
    if p.shape != sizes.shape or np.any(p < 0) or not np.isfinite(p).all() or p.sum() <= 0:
        raise ConfigError(f"weights must be {len(sizes)} non-negative numbers with a positive sum, got {weights}")
    return p / p.sum()


# ------------------------------------------------------------------ FL runs
def round_clients(run: Any, round: int = -1) -> tuple[list[Any], list[Mapping[str, torch.Tensor]], list[Any]]:
    """``(client_ids, client_states, client_datasets)`` of the clients trained in ``round`` of an FL run.

    The run is anything with ``client_states(round)`` and ``client_datasets()``.

    Parameters
    ----------
    run
        An FL run (e.g. ``fl.load_run(folder)``): ``client_states(round)`` gives client id ->
        state_dict, ``client_datasets()`` client id -> dataset.
    round
        The round (negative counts from the end; ``-1`` is the last).

    Returns
    -------
    tuple of list
        The sorted client ids, their state_dicts and their datasets, in the same order.

    Raises
    ------
    ConfigError
        If the run stored no client models for the round, or lacks a client's dataset.
    """
    states = run.client_states(round)
    if not states:
        raise ConfigError(f"the run stored no client models for round {round}; rerun it with client "
                          "checkpoints enabled")
    datasets = run.client_datasets()
    missing = [cid for cid in states if cid not in datasets]
    if missing:
        raise ConfigError(f"the run has no datasets for clients {missing}")
    ids = sorted(states)
    return ids, [states[i] for i in ids], [datasets[i] for i in ids]


def decompose_run(run: Any, round: int = -1, evaluator: PointEvaluator | None = None, *,
                  weights: Sequence[float] | None = None) -> Decomposition:
    """:func:`decompose` for the clients of one round of an FL run (single realization each).

    Without an evaluator one is built from ``run.module()`` and ``run.test_dataset()``.

    Parameters
    ----------
    run
        An FL run (see :func:`round_clients`).
    round
        The round whose client models are decomposed (``-1``: the last).
    evaluator
        Supplies architecture, device and dtype (default: built from the run).
    weights
        Client weights ``p_k`` (default proportional to the clients' data sizes).

    Returns
    -------
    Decomposition
        The IMA Theorem 1 terms (see :func:`decompose`).

    Raises
    ------
    ConfigError
        See :func:`round_clients` and :func:`decompose`.
    """
    if evaluator is None:
        from ..evaluation.evaluator import Evaluator

        evaluator = Evaluator(run.module(), run.test_dataset())
    _, states, datasets = round_clients(run, round)
    return decompose(states, datasets, evaluator, weights=weights)
