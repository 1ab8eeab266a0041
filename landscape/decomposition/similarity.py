"""What averaging does to client models: error versus the number averaged, and representation similarity.

* :func:`averaging_curve` -- loss and error of weight averages of ``m`` random client models
  against ``m`` (IMA paper Fig. 4).
* :func:`linear_cka`, :func:`cka_matrix` -- linear centred kernel alignment (Kornblith et al.
  2019) between models' outputs on a probe set.
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np
import torch

from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..results import AveragingCurve, CKAMatrix
from ..space.params import ModelLike
from .ima import client_weights


def averaging_curve(client_models: Sequence[ModelLike], evaluator: PointEvaluator, *,
                    weights: Sequence[float] | None = None, sizes: Sequence[int] | None = None,
                    subsets: int = 10, seed: int = 0) -> AveragingCurve:
    """Loss and error of weight averages of ``m`` client models, for ``m`` in ``sizes`` (IMA paper Fig. 4).

    Error is 1 - accuracy, both on the evaluator's data; ``sizes`` defaults to ``1..K``.
    Each size takes up to ``subsets`` random subsets (all subsets when there are at most
    that many). A subset ``T`` is averaged with weights ``weights[k] / sum_T weights``
    (uniform by default).

    Parameters
    ----------
    client_models
        The K client models (model-likes or flat vectors).
    evaluator
        Evaluates the averaged models on its data.
    weights
        Non-negative client weights (e.g. data sizes); default uniform.
    sizes
        Numbers ``m`` of models averaged, each in [1, K] (default ``1..K``).
    subsets
        Number of random subsets per size (all ``C(K, m)`` when there are at most that many).
    seed
        Seed of the subset draws.

    Returns
    -------
    AveragingCurve
        ``(len(sizes), subsets)`` loss and error arrays (NaN where a size has fewer subsets).

    Raises
    ------
    ConfigError
        If a size lies outside [1, K] or the weights are invalid.
    """
    vectors = torch.stack([evaluator.vector(m) for m in client_models])
    k_clients = len(vectors)
    w = np.ones(k_clients) if weights is None else client_weights(weights, np.ones(k_clients))
    sizes = np.arange(1, k_clients + 1) if sizes is None else np.asarray(sizes, dtype=int)
    if np.any(sizes < 1) or np.any(sizes > k_clients):
        raise ConfigError(f"subset sizes must lie in [1, {k_clients}], got {sizes.tolist()}")
    rng = np.random.default_rng(seed)
    loss = np.full((len(sizes), subsets), np.nan)
    error = np.full((len(sizes), subsets), np.nan)
    for i, m in enumerate(sizes):
        chosen = _subsets(k_clients, int(m), subsets, rng)
        coeffs = np.zeros((len(chosen), k_clients))
        for j, subset in enumerate(chosen):
            coeffs[j, list(subset)] = w[list(subset)] / w[list(subset)].sum()
        metrics = evaluator.evaluate(torch.as_tensor(coeffs) @ vectors)
        loss[i, :len(chosen)] = metrics.loss
        error[i, :len(chosen)] = 1.0 - np.asarray(metrics.accuracy)
    return AveragingCurve(sizes=sizes, loss=loss, error=error,
                          spec={"evaluator": evaluator.fingerprint(), "seed": seed, "subsets": subsets,
                                "weights": w.tolist()})


def _subsets(n: int, m: int, count: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    if math.comb(n, m) <= count:
        return list(itertools.combinations(range(n), m))
    seen: set[tuple[int, ...]] = set()
    while len(seen) < count:
        seen.add(tuple(sorted(rng.choice(n, size=m, replace=False).tolist())))
    return sorted(seen)


# ------------------------------------------------------------------------ CKA
def linear_cka(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """Linear CKA ``|A~^T B~|_F^2 / (|A~^T A~|_F |B~^T B~|_F)`` of column-centred (n, d) features.

    Kornblith et al. (2019), Eq. for linear CKA; 1 for features equal up to an orthogonal
    transform and isotropic scaling.

    Parameters
    ----------
    a, b
        Features of the same n samples, ``(n, ...)`` (flattened to ``(n, d)``).

    Returns
    -------
    float
        The similarity in [0, 1]; NaN when a feature matrix is constant.

    Raises
    ------
    ConfigError
        If the numbers of rows differ.
    """
    a = torch.as_tensor(a, dtype=torch.float64).reshape(len(a), -1)
    b = torch.as_tensor(b, dtype=torch.float64).reshape(len(b), -1)
    if len(a) != len(b):
        raise ConfigError(f"CKA needs features of the same samples; got {len(a)} and {len(b)} rows")
    a = a - a.mean(0)
    b = b - b.mean(0)
    denom = torch.linalg.matrix_norm(a.T @ a) * torch.linalg.matrix_norm(b.T @ b)
    return float(torch.linalg.matrix_norm(a.T @ b) ** 2 / denom) if denom > 0 else float("nan")


def cka_matrix(models: Sequence[ModelLike], evaluator: PointEvaluator, *, outputs: str = "softmax",
               labels: Sequence[str] | None = None) -> CKAMatrix:
    """Pairwise linear CKA of the models' outputs on the evaluator's data.

    Outputs are ``"softmax"`` or ``"logits"``; CKA is the IMA paper's proxy for the
    covariance term (Fig. 4).

    Parameters
    ----------
    models
        Model-likes or flat vectors of the evaluator's space.
    evaluator
        Its data are the probe set; its device and dtype run the forward passes.
    outputs
        Compare ``"softmax"`` probabilities or raw ``"logits"``.
    labels
        One name per model (default ``"0"``, ``"1"``, ...).

    Returns
    -------
    CKAMatrix
        The symmetric ``(n, n)`` matrix (ones on the diagonal) and the labels.

    Raises
    ------
    ConfigError
        If ``outputs`` is neither ``"softmax"`` nor ``"logits"``.
    """
    if outputs not in ("softmax", "logits"):
        raise ConfigError(f"outputs must be 'softmax' or 'logits', got {outputs!r}")
    feats = []
    with torch.no_grad():
        for m in models:
            params = evaluator.space.unflatten(evaluator.vector(m).to(evaluator.device, evaluator.dtype))
            out = torch.cat([evaluator.forward(params, x).to(torch.float64) for x, _ in evaluator.batches])
            feats.append(torch.softmax(out, -1) if outputs == "softmax" else out)
    n = len(feats)
    matrix = np.ones((n, n))
    for i, j in itertools.combinations(range(n), 2):
        matrix[i, j] = matrix[j, i] = linear_cka(feats[i], feats[j])
    return CKAMatrix(matrix=matrix, labels=list(labels) if labels is not None else [str(i) for i in range(n)],
                     spec={"evaluator": evaluator.fingerprint(), "outputs": outputs})


