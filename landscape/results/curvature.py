"""Result dataclasses of the curvature analyses.

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

    Attributes
    ----------
    values, residuals : np.ndarray
        ``(k,)``: the eigenvalues ``theta`` (descending) and ``||H x - theta x||``.
    matvecs : int
        Hessian-vector products used.
    converged : bool
        Whether every residual met the solver's tolerance.
    method : str
        The solver's registered name (``"lanczos"``, ``"power"``, ...).
    dim : int
        Dimension of the operator (number of selected parameters).
    vectors : np.ndarray or None
        ``(k, dim)`` eigenvectors, or None when not requested.
    restarts : int
        Thick restarts performed (Lanczos only).
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('values', 'converged', 'matvecs', 'restarts')

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
        """The eigenvalues of ``result`` as an array that keeps ``result``."""
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

    Attributes
    ----------
    value, stderr : float
        The estimate of ``tr H`` and its standard error (sample standard deviation over ``sqrt(len(samples))``).
    samples : np.ndarray
        The Hutchinson samples ``z^T H z`` (of the deflated remainder for Hutch++).
    method : str
        ``"hutchinson"`` or ``"hutch++"``.
    matvecs, dim : int
        Hessian-vector products used, and the operator's dimension.
    converged : bool
        Whether the relative standard error met the requested tolerance.
    exact : float
        Hutch++ only: ``tr(Q^T H Q)`` on the sketched subspace (0 for Hutchinson).
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('value', 'stderr', 'relative_stderr', 'converged', 'matvecs')

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
        """``|stderr / value|`` (inf for a zero estimate)."""
        return abs(self.stderr / self.value) if self.value != 0 else float("inf")

    def summary(self) -> dict[str, str]:
        """The numbers of :meth:`Result.summary`, with Hutch++'s sketched part named for what it is.

        ``exact`` is the trace on the sketched subspace only, not ``tr H``: it is shown as
        ``sketched_part`` for Hutch++ and left out for Hutchinson (where it is 0).

        Returns
        -------
        dict
            name -> formatted value.
        """
        out = super().summary()
        sketched = out.pop("exact")
        if self.method == "hutch++":
            out["sketched_part"] = sketched
        return out


@register
@dataclass(frozen=True, eq=False)
class SpectralDensity(Result):
    """Eigenvalue density of a Hessian by stochastic Lanczos quadrature.

    ``density`` is ``(1/runs) sum_r sum_j weights[r, j] N(grid; nodes[r, j], sigma^2)`` on
    ``grid``; it integrates to one. ``nodes``/``weights`` (shape ``(runs, m)``) are the raw
    quadrature.

    Attributes
    ----------
    grid, density : np.ndarray
        The eigenvalue grid and the smoothed density on it.
    nodes, weights : np.ndarray
        ``(runs, m)``: Gauss quadrature nodes (Ritz values) and weights of each SLQ run.
    sigma : float
        Width of the Gaussian kernel.
    dim, matvecs : int
        The operator's dimension and the Hessian-vector products used.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('trace', 'mean', 'sigma', 'matvecs')

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
    """Top Hessian eigenvalues along ``(1 - alpha) a + alpha b``: ``eigenvalues[i, j]``.

    Attributes
    ----------
    alphas : np.ndarray
        ``(n,)``: the interpolation coefficients.
    eigenvalues, residuals : np.ndarray
        ``(n, k)``: the ``j``-th largest eigenvalue at ``alphas[i]`` and its residual norm.
    matvecs : np.ndarray
        ``(n,)``: Hessian-vector products used at each point.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('max_top',)

    alphas: np.ndarray
    eigenvalues: np.ndarray
    residuals: np.ndarray
    matvecs: np.ndarray
    array_fields: ClassVar[tuple[str, ...]] = ("alphas", "eigenvalues", "residuals", "matvecs")

    @property
    def top(self) -> np.ndarray:
        """Largest eigenvalue at each alpha."""
        return self.eigenvalues[:, 0]

    @property
    def max_top(self) -> float:
        """Largest top eigenvalue along the path."""
        return float(np.nanmax(self.top))


@register
@dataclass(frozen=True, eq=False)
class CurvaturePlane(Result):
    """Top Hessian eigenvalues on a plane grid: ``eigenvalues[iy, ix, j]``.

    The grid is the one of the :class:`~landscape.results.PlaneResult` it was computed on
    (possibly every ``stride``-th point), so it overlays that plane's loss surface.

    Attributes
    ----------
    x, y : np.ndarray
        The grid's coordinates.
    eigenvalues, residuals : np.ndarray
        ``(len(y), len(x), k)``: eigenvalues at each grid point and their residual norms.
    matvecs : np.ndarray
        ``(len(y), len(x))``: Hessian-vector products used at each point.
    models : dict
        Label -> ``[x, y]`` of the models placed in the plane (copied from the plane).
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('max_top',)

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

    @property
    def max_top(self) -> float:
        """Largest top eigenvalue on the grid."""
        return float(np.nanmax(self.top))


@register
@dataclass(frozen=True, eq=False)
class InverseProduct(Result):
    """The solution ``x`` of ``(C + damping I) x = b`` by conjugate gradients, and how well it solves it.

    Attributes
    ----------
    x : np.ndarray
        ``(dim,)``: the last iterate (float64).
    residuals : np.ndarray
        ``(iterations + 1,)``: ``||r_k|| / ||b||`` after each iteration, ``r_k`` the recursively updated
        residual ``b - (C + damping I) x_k`` (the first entry is 1, or 0 for ``b = 0``).
    iterations : int
        CG iterations performed (one product each).
    residual_norm : float
        ``||r||`` of the last iterate.
    converged : bool
        Whether ``||r|| <= tol ||b||`` was reached.
    damping, tol : float
        The ``damping`` added to ``C`` and the relative tolerance asked for.
    matvecs, dim : int
        Products with ``C`` used, and the operator's dimension.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('relative_residual', 'converged', 'iterations', 'damping')

    x: np.ndarray
    residuals: np.ndarray
    iterations: int
    residual_norm: float
    converged: bool
    damping: float
    tol: float
    matvecs: int
    dim: int
    array_fields: ClassVar[tuple[str, ...]] = ("x", "residuals")

    @property
    def relative_residual(self) -> float:
        """``||r|| / ||b||`` of the last iterate (0 for ``b = 0``)."""
        return float(self.residuals[-1])


@register
@dataclass(frozen=True, eq=False)
class DiagonalEstimate(Result):
    """The diagonal of a curvature matrix ``C``, exact or estimated, with per-entry standard errors.

    Hutchinson (Bekas, Kokiopoulou & Saad 2007): ``values = mean_k z_k * (C z_k)`` over ``samples``
    Rademacher probes ``z_k``; ``stderr`` the sample standard deviation of each entry over
    ``sqrt(samples)``. Exact: ``values[i] = (C e_i)_i`` and ``stderr = 0``.

    Attributes
    ----------
    values, stderr : np.ndarray
        ``(dim,)``: the diagonal and the standard error of each entry.
    method : str
        ``"hutchinson"`` or ``"exact"``.
    samples, matvecs, dim : int
        Probes used (``dim`` for ``"exact"``), products with ``C``, and the operator's dimension.
    """

    summary_fields: ClassVar[tuple[str, ...]] = ('trace', 'max_stderr', 'method', 'matvecs')

    values: np.ndarray
    stderr: np.ndarray
    method: str
    samples: int
    matvecs: int
    dim: int
    array_fields: ClassVar[tuple[str, ...]] = ("values", "stderr")

    @property
    def trace(self) -> float:
        """``sum(values)``: the trace of ``C`` (Hutchinson's trace estimate for ``"hutchinson"``)."""
        return float(np.sum(self.values))

    @property
    def max_stderr(self) -> float:
        """The largest per-entry standard error."""
        return float(np.max(self.stderr)) if self.stderr.size else 0.0
