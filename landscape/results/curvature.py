"""Result dataclasses of the curvature and loss-decomposition analyses.

All subclass :class:`landscape.results.Result` and are registered, so they round-trip
through the HDF5 cache (arrays as datasets, the rest as JSON attributes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .base import Result, register


@register
@dataclass(frozen=True, eq=False)
class HessianEigen(Result):
    """Top eigenvalues of a Hessian (descending) and how they were obtained.

    ``residuals``: residual norms ``||H x - theta x||`` (bounds on the absolute eigenvalue
    errors), for Lanczos and power iteration alike.
    ``vectors``: eigenvectors as rows (over the selected parameters) when requested.
    """

    values: np.ndarray
    residuals: np.ndarray
    matvecs: int
    converged: bool
    method: str
    dim: int
    vectors: np.ndarray | None = None
    restarts: int = 0
    array_fields: ClassVar[tuple[str, ...]] = ("values", "residuals", "vectors")


class Eigenvalues(np.ndarray):
    """The top Hessian eigenvalues (descending) as a plain array that remembers how it was obtained.

    Returned by :func:`landscape.hessian_eigenvalues`: it behaves as the ``np.ndarray`` of the API
    contract, and ``.converged``, ``.residuals``, ``.matvecs`` and ``.result`` (the full
    :class:`HessianEigen`) tell whether the solver met its tolerance.
    """

    result: "HessianEigen | None"

    def __new__(cls, result: HessianEigen) -> "Eigenvalues":
        obj = np.asarray(result.values, dtype=np.float64).view(cls)
        obj.result = result
        return obj

    def __array_finalize__(self, obj: object) -> None:
        self.result = getattr(obj, "result", None)

    @property
    def converged(self) -> bool | None:
        """Whether every eigenvalue met the solver's tolerance (None for derived arrays)."""
        return None if self.result is None else bool(self.result.converged)

    @property
    def residuals(self) -> np.ndarray | None:
        """``||H x - theta x||`` of each eigenpair."""
        return None if self.result is None else self.result.residuals

    @property
    def matvecs(self) -> int | None:
        """Hessian-vector products used."""
        return None if self.result is None else self.result.matvecs


@register
@dataclass(frozen=True, eq=False)
class TraceEstimate(Result):
    """Stochastic estimate of ``tr H`` with its standard error.

    Hutchinson: ``value = mean(samples)`` with ``samples = z^T H z``. Hutch++ (Meyer et al.
    2021): ``value = exact + mean(samples)``, ``exact = tr(Q^T H Q)`` on a sketched subspace
    and ``samples`` the Hutchinson samples of the deflated remainder.
    """

    value: float
    stderr: float
    samples: np.ndarray
    method: str
    matvecs: int
    dim: int
    converged: bool
    exact: float = 0.0
    array_fields: ClassVar[tuple[str, ...]] = ("samples",)

    @property
    def relative_stderr(self) -> float:
        return abs(self.stderr / self.value) if self.value != 0 else float("inf")


@register
@dataclass(frozen=True, eq=False)
class SpectralDensity(Result):
    """Eigenvalue density of a Hessian by stochastic Lanczos quadrature.

    ``density`` is ``(1/runs) sum_r sum_j weights[r, j] N(grid; nodes[r, j], sigma^2)`` on
    ``grid``; it integrates to one. ``nodes``/``weights`` (shape ``(runs, m)``) are the raw
    quadrature.
    """

    grid: np.ndarray
    density: np.ndarray
    nodes: np.ndarray
    weights: np.ndarray
    sigma: float
    dim: int
    matvecs: int
    array_fields: ClassVar[tuple[str, ...]] = ("grid", "density", "nodes", "weights")

    @property
    def mean(self) -> float:
        """SLQ estimate of the mean eigenvalue ``tr H / dim``."""
        return float(np.mean(np.sum(self.weights * self.nodes, axis=1)))

    @property
    def trace(self) -> float:
        """SLQ estimate of ``tr H``."""
        return self.mean * self.dim

    @property
    def integral(self) -> float:
        """Trapezoidal integral of the density over the grid (one up to discretisation)."""
        return float(np.trapezoid(self.density, self.grid))


@register
@dataclass(frozen=True, eq=False)
class CurvatureProfile(Result):
    """Top Hessian eigenvalues along ``(1 - alpha) a + alpha b``: ``eigenvalues[i, j]``."""

    alphas: np.ndarray
    eigenvalues: np.ndarray
    residuals: np.ndarray
    matvecs: np.ndarray
    array_fields: ClassVar[tuple[str, ...]] = ("alphas", "eigenvalues", "residuals", "matvecs")

    @property
    def top(self) -> np.ndarray:
        """Largest eigenvalue at each alpha."""
        return self.eigenvalues[:, 0]


@register
@dataclass(frozen=True, eq=False)
class CurvaturePlane(Result):
    """Top Hessian eigenvalues on a plane grid: ``eigenvalues[iy, ix, j]``.

    The grid is the one of the :class:`~landscape.results.PlaneResult` it was computed on
    (possibly every ``stride``-th point), so it overlays that plane's loss surface.
    """

    x: np.ndarray
    y: np.ndarray
    eigenvalues: np.ndarray
    residuals: np.ndarray
    matvecs: np.ndarray
    models: dict = field(default_factory=dict)
    array_fields: ClassVar[tuple[str, ...]] = ("x", "y", "eigenvalues", "residuals", "matvecs")

    @property
    def top(self) -> np.ndarray:
        """Largest eigenvalue at each grid point, shape ``(len(y), len(x))``."""
        return self.eigenvalues[..., 0]


@register
@dataclass(frozen=True, eq=False)
class Decomposition(Result):
    """IMA paper Theorem 1 terms (reference/ima.md section 2.7), all means over D.

    Identities (exact): ``wens_loss == bias + variance + covariance`` and
    ``bias == train_bias + heter_bias + cross``. ``locality[k] = ||w_k - w_FMA||_2`` over
    trainable parameters (mean over realizations). ``client_train_bias[k]`` /
    ``client_heter_bias[k]`` are the per-client diagnostics ``tb_k`` (mean ``||y - mu_k||^2``
    on D_k) and ``hb_k`` (on D minus D_k, NaN when empty).
    """

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
    def max_locality(self) -> float:
        """``Delta = max_k ||w_k - w_FMA||``."""
        return float(np.max(self.locality))


@register
@dataclass(frozen=True, eq=False)
class AveragingCurve(Result):
    """Loss and error of weight averages of ``m`` random client models (IMA Fig. 4).

    ``loss[i, s]`` / ``error[i, s]``: ``s``-th random subset of size ``sizes[i]`` (NaN where
    fewer distinct subsets exist).
    """

    sizes: np.ndarray
    loss: np.ndarray
    error: np.ndarray
    array_fields: ClassVar[tuple[str, ...]] = ("sizes", "loss", "error")

    @property
    def loss_mean(self) -> np.ndarray:
        return np.nanmean(self.loss, axis=1)

    @property
    def loss_std(self) -> np.ndarray:
        return np.nanstd(self.loss, axis=1)

    @property
    def error_mean(self) -> np.ndarray:
        return np.nanmean(self.error, axis=1)

    @property
    def error_std(self) -> np.ndarray:
        return np.nanstd(self.error, axis=1)


@register
@dataclass(frozen=True, eq=False)
class CKAMatrix(Result):
    """Linear CKA (Kornblith et al. 2019) between models' outputs on a probe set."""

    matrix: np.ndarray
    labels: list = field(default_factory=list)
    array_fields: ClassVar[tuple[str, ...]] = ("matrix",)

    @property
    def mean_offdiagonal(self) -> float:
        """Mean CKA over pairs ``k < k'``."""
        n = self.matrix.shape[0]
        iu = np.triu_indices(n, k=1)
        return float(np.mean(self.matrix[iu])) if n > 1 else float("nan")
