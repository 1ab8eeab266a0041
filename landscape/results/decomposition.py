"""Results of the loss decomposition (IMA Theorem 1), the averaging curve and representation similarity."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .base import Result, register


@register
@dataclass(frozen=True, eq=False)
class Decomposition(Result):
    """IMA paper Theorem 1 terms (``docs/methods/ima.md``), all means over D.

    Identities (exact): ``wens_loss == bias + variance + covariance`` and
    ``bias == train_bias + heter_bias + cross``. ``locality[k] = ||w_k - w_FMA||_2`` over
    trainable parameters (mean over realizations). ``client_train_bias[k]`` /
    ``client_heter_bias[k]`` are the per-client diagnostics ``tb_k`` (mean ``||y - mu_k||^2``
    on D_k) and ``hb_k`` (on D minus D_k, NaN when empty).

    Attributes
    ----------
    bias : float
        ``|bTB + bHB|^2`` with ``bTB = sum_k p_k TrainBias_k``, ``bHB = sum_k p_k HeterBias_k``.
    train_bias, heter_bias : float
        ``|bTB|^2`` and ``|bHB|^2``.
    cross : float
        ``2 <bTB, bHB>`` (not separated in the paper).
    variance, covariance : float
        ``sum_k p_k^2 Var_k`` and ``sum_{k != k'} p_k p_k' Cov_kk'``.
    wens_loss, fma_loss : float
        Squared error of the output ensemble ``f_WENS`` and of the weight average ``w_FMA``.
    gap, output_gap : float
        ``fma_loss - wens_loss``, and the mean output distance ``|f_FMA - f_WENS|`` (Lemma 1's
        ``O(Delta^2)``).
    locality : np.ndarray
        ``(K,)``: ``||w_k - w_FMA||_2`` per client.
    weights, client_sizes : np.ndarray
        ``(K,)``: the weights ``p_k`` and the clients' sample counts ``|D_k|``.
    client_train_bias, client_heter_bias : np.ndarray
        ``(K,)``: ``tb_k`` and ``hb_k``.
    num_samples : int
        ``|D|``: the number of samples the means run over.
    realizations : int
        Models per client (Var and Cov are 0 when it is 1).
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('wens_loss', 'bias', 'variance', 'covariance', 'variance_estimated',
                                                  'fma_loss', 'gap', 'max_locality')

    bias: float
    train_bias: float
    heter_bias: float
    cross: float
    variance: float
    covariance: float
    wens_loss: float
    fma_loss: float
    gap: float
    output_gap: float
    locality: np.ndarray
    weights: np.ndarray
    client_sizes: np.ndarray
    client_train_bias: np.ndarray
    client_heter_bias: np.ndarray
    num_samples: int
    realizations: int
    array_fields: ClassVar[tuple[str, ...]] = ("locality", "weights", "client_sizes",
                                                "client_train_bias", "client_heter_bias")

    @property
    def variance_estimated(self) -> bool:
        """False with one realization per client: variance and covariance are then 0 by construction, not measured."""
        return self.realizations > 1

    @property
    def max_locality(self) -> float:
        """``Delta = max_k ||w_k - w_FMA||``."""
        return float(np.max(self.locality))


@register
@dataclass(frozen=True, eq=False)
class AveragingCurve(Result):
    """Loss and error of weight averages of ``m`` random client models (IMA Fig. 4).

    ``loss[i, s]`` / ``error[i, s]``: ``s``-th random subset of size ``sizes[i]`` (NaN where
    fewer distinct subsets exist).

    Attributes
    ----------
    sizes : np.ndarray
        ``(S,)``: the numbers ``m`` of models averaged.
    loss, error : np.ndarray
        ``(S, subsets)``: loss and error (1 - accuracy) of each subset's average.
    """

    sizes: np.ndarray
    loss: np.ndarray
    error: np.ndarray
    array_fields: ClassVar[tuple[str, ...]] = ("sizes", "loss", "error")

    @property
    def loss_mean(self) -> np.ndarray:
        """``(S,)``: mean loss over the subsets of each size (NaNs ignored)."""
        return np.nanmean(self.loss, axis=1)

    @property
    def loss_std(self) -> np.ndarray:
        """``(S,)``: standard deviation of the loss over the subsets of each size."""
        return np.nanstd(self.loss, axis=1)

    @property
    def error_mean(self) -> np.ndarray:
        """``(S,)``: mean error over the subsets of each size (NaNs ignored)."""
        return np.nanmean(self.error, axis=1)

    @property
    def error_std(self) -> np.ndarray:
        """``(S,)``: standard deviation of the error over the subsets of each size."""
        return np.nanstd(self.error, axis=1)


@register
@dataclass(frozen=True, eq=False)
class CKAMatrix(Result):
    """Linear CKA (Kornblith et al. 2019) between models' outputs on a probe set.

    Attributes
    ----------
    matrix : np.ndarray
        ``(M, M)``: symmetric, ones on the diagonal.
    labels : list
        The models' names, in matrix order.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('mean_offdiagonal',)

    matrix: np.ndarray
    labels: list = field(default_factory=list)
    array_fields: ClassVar[tuple[str, ...]] = ("matrix",)

    @property
    def mean_offdiagonal(self) -> float:
        """Mean CKA over pairs ``k < k'``."""
        n = self.matrix.shape[0]
        iu = np.triu_indices(n, k=1)
        return float(np.mean(self.matrix[iu])) if n > 1 else float("nan")
