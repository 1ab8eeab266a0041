"""Lanczos for the largest eigenpairs of a symmetric operator, with thick restarts.

The solver sees only a :class:`~landscape.curvature.linear.SymmetricOperator`, so it is tested
on explicit matrices and used on Hessians alike.

* :class:`KrylovBasis` -- an orthonormal basis ``V`` (rows) and the projected matrix
  ``H = V A V^T``, extended one product at a time with full re-orthogonalisation (classical
  Gram-Schmidt applied twice, Giraud et al. 2005). With this bookkeeping
  ``A V^T = V^T H + w e_m^T`` holds for a Lanczos basis and after every thick restart, so
  ``|beta_m s_{m,i}|`` is the exact residual norm ``||A x_i - theta_i x_i||`` of each Ritz pair.
* :func:`lanczos_top` -- the ``k`` largest (algebraic) eigenpairs. The basis holds at most
  ``basis_size`` vectors; when it is full and the top ``k`` pairs have not converged, it is
  *thick-restarted* (Wu & Simon 2000): the best Ritz vectors are kept, the residual direction
  appended, and the iteration goes on, so memory stays bounded while ``max_iter`` products are
  spent. Clustered top eigenvalues need many products but no more memory.
  Converged when each top pair has ``||A x - theta x|| <= tol * max(|theta|, 1e-6 max|theta|)``,
  which bounds the absolute eigenvalue error (Bauer-Fike for symmetric matrices).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..infra.errors import ConfigError
from .budget import check_solver_memory, lanczos_bytes
from .linear import SymmetricOperator
from .registry import eigen_solver

_BREAKDOWN = 1e-10  # relative size of a residual treated as an exact invariant subspace


def gaussian_vector(dim: int, generator: torch.Generator, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A standard normal vector drawn on the CPU from ``generator`` (device-independent).

    Parameters
    ----------
    dim
        Length.
    generator
        The seeded generator.
    device, dtype
        Of the returned vector.

    Returns
    -------
    torch.Tensor
    """
    return torch.randn(dim, generator=generator, dtype=torch.float64).to(device, dtype)


def rademacher_vector(dim: int, generator: torch.Generator, device: torch.device | str = "cpu",
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A vector of independent +-1 entries drawn on the CPU from ``generator``.

    Parameters
    ----------
    dim
        Length.
    generator
        The seeded generator.
    device, dtype
        Of the returned vector.

    Returns
    -------
    torch.Tensor
    """
    bits = torch.randint(0, 2, (dim,), generator=generator, dtype=torch.int8)
    return (bits.to(torch.float64) * 2 - 1).to(device, dtype)


@dataclass(frozen=True)
class Eigenpairs:
    """Output of an eigen-solver.

    Attributes
    ----------
    values
        Eigenvalue estimates, descending.
    residuals
        ``||A x - theta x||`` of each pair (bounds its absolute error).
    matvecs
        Products used.
    converged
        Whether every pair met the tolerance.
    vectors
        Eigenvectors as rows, when asked for.
    restarts
        Thick restarts performed (Lanczos only).
    """

    values: np.ndarray
    residuals: np.ndarray
    matvecs: int
    converged: bool
    vectors: torch.Tensor | None = None
    restarts: int = 0


class KrylovBasis:
    """Orthonormal basis rows ``V`` and projected matrix ``H = V A V^T`` of a symmetric operator.

    Parameters
    ----------
    op
        The operator.
    start
        The first basis vector (normalised here).
    capacity
        Most basis vectors held at once.
    generator
        For fresh directions after a breakdown.
    """

    def __init__(self, op: SymmetricOperator, start: torch.Tensor, capacity: int, generator: torch.Generator):
        norm = torch.linalg.vector_norm(start)
        if not torch.isfinite(norm) or norm == 0:
            raise ConfigError("the Lanczos start vector must be finite and non-zero")
        self.op = op
        self.generator = generator
        self.capacity = capacity
        self.vectors = torch.zeros(capacity + 1, op.size, dtype=start.dtype, device=start.device)
        self.vectors[0] = start / norm
        self.h = np.zeros((capacity, capacity))
        self.rows = 0           # basis vectors whose product has been taken
        self.beta = 0.0         # norm of the residual direction after the last product
        self.scale = 0.0        # running estimate of ||A||, for the breakdown test

    def extend(self) -> None:
        """One product ``A v`` of the newest basis vector, orthogonalised against the basis."""
        j = self.rows
        w = self.op.matvec(self.vectors[j])
        if not torch.isfinite(w).all():
            raise ConfigError("the operator returned NaN or inf; the model's loss is not finite here")
        basis = self.vectors[:j + 1]
        coeff = basis @ w
        w = w - basis.T @ coeff
        again = basis @ w  # CGS2: twice is enough
        w = w - basis.T @ again
        h = (coeff + again).double().cpu().numpy()
        self.h[:j + 1, j] = h
        self.h[j, :j + 1] = h
        beta = float(torch.linalg.vector_norm(w))
        self.scale = max(self.scale, float(np.abs(h).sum()) + beta)
        self.rows = j + 1
        if self.rows == self.op.size:  # the basis spans the whole space: H is exact
            self.beta = 0.0
            return
        if beta <= _BREAKDOWN * max(self.scale, 1e-300):
            self.beta = 0.0
            w = self._fresh_direction()
        else:
            self.beta = beta
            w = w / beta
        self.vectors[self.rows] = w

    def _fresh_direction(self) -> torch.Tensor:
        basis = self.vectors[:self.rows]
        for _ in range(5):
            w = gaussian_vector(self.op.size, self.generator, basis.device, basis.dtype)
            for _ in range(2):
                w = w - basis.T @ (basis @ w)
            norm = torch.linalg.vector_norm(w)
            if norm > 1e-6 * np.sqrt(self.op.size):
                return w / norm
        raise ConfigError("could not extend the Lanczos basis (operator dimension too small?)")

    def ritz(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ritz values (ascending), eigenvectors of ``H`` (columns), residual norms.

        Returns
        -------
        tuple of numpy.ndarray
            ``theta``, ``s`` and ``|beta s_{m,i}|``.
        """
        m = self.rows
        theta, s = np.linalg.eigh(self.h[:m, :m])
        return theta, s, np.abs(self.beta * s[-1, :])

    def ritz_vectors(self, s: np.ndarray) -> torch.Tensor:
        """Ritz vectors ``V^T s`` as rows, for eigenvectors ``s`` (columns) of ``H``.

        Parameters
        ----------
        s : np.ndarray
            ``(rows, r)``: eigenvectors of the projected matrix ``H`` (as from :meth:`ritz`).

        Returns
        -------
        torch.Tensor
            ``(r, size)``: the Ritz vectors, on the basis's device and dtype.
        """
        coeff = torch.as_tensor(s, dtype=self.vectors.dtype, device=self.vectors.device)
        return coeff.T @ self.vectors[:self.rows]

    def thick_restart(self, keep: int) -> None:
        """Keep the ``keep`` largest Ritz pairs and the residual direction (Wu & Simon 2000).

        Parameters
        ----------
        keep
            Ritz vectors kept (``1 <= keep < rows``).
        """
        theta, s, _ = self.ritz()
        order = np.argsort(theta)[::-1][:keep]
        kept = self.ritz_vectors(s[:, order])
        residual = self.vectors[self.rows].clone()
        self.vectors.zero_()
        self.vectors[:keep] = kept
        self.vectors[keep] = residual
        self.h[:] = 0.0
        self.h[np.arange(keep), np.arange(keep)] = theta[order]
        couplings = self.beta * s[-1, order]
        self.h[:keep, keep] = couplings  # rewritten by the next product, which computes them anew
        self.h[keep, :keep] = couplings
        self.rows = keep


@eigen_solver("lanczos")
def lanczos_top(op: SymmetricOperator, k: int = 1, *, tol: float = 1e-3, max_iter: int = 100,
                generator: torch.Generator, return_vectors: bool = False,
                basis_size: int | None = None) -> Eigenpairs:
    """The ``k`` largest algebraic eigenpairs of a symmetric operator by thick-restart Lanczos.

    Parameters
    ----------
    op
        The operator.
    k
        Number of eigenpairs.
    tol
        Relative residual tolerance (see the module docstring).
    max_iter
        Budget of products (matvecs), restarts included.
    generator
        Seeded generator for the start vector (and fresh directions after a breakdown).
    return_vectors
        Also return the eigenvectors.
    basis_size
        Most basis vectors held at once (memory: ``basis_size`` vectors of the operator's size).
        Default ``min(max_iter, max(3k + 20, 60))``; when ``max_iter`` fits, no restart happens.

    Returns
    -------
    Eigenpairs

    Raises
    ------
    ConfigError
        ``k`` or ``basis_size`` out of range, or a basis larger than the memory available on the
        operator's device.
    """
    check_k(k, op.size)
    if max_iter < k:
        raise ConfigError(f"max_iter={max_iter} is smaller than k={k}: Lanczos needs at least k steps")
    capacity = min(op.size, max_iter, basis_size or max(3 * k + 20, 60))
    if capacity < k + 2 and capacity < min(op.size, max_iter):
        raise ConfigError(f"basis_size={basis_size} must be at least k + 2 = {k + 2}")
    check_solver_memory(lanczos_bytes(capacity, op.size, op.dtype),
                        f"k={k:,} (a Lanczos basis of {capacity:,} vectors of {op.size:,} parameters)",
                        op.device, "ask for fewer eigenvalues or a smaller basis_size")
    basis = KrylovBasis(op, gaussian_vector(op.size, generator, op.device, op.dtype), capacity, generator)
    used, restarts, converged = 0, 0, False
    while used < max_iter:
        basis.extend()
        used += 1
        if basis.rows >= k:
            theta, _, residual = basis.ritz()
            scale = np.maximum(np.abs(theta[-k:]), 1e-6 * np.abs(theta).max())
            if np.all(residual[-k:] <= tol * scale) or basis.rows == op.size:
                converged = True
                break
        if basis.rows == capacity and used < max_iter:
            basis.thick_restart(min(capacity - 1, k + max(1, (capacity - k) // 2)))
            restarts += 1
    theta, s, residual = basis.ritz()
    order = np.arange(len(theta) - 1, len(theta) - 1 - k, -1)
    vectors = basis.ritz_vectors(s[:, order]) if return_vectors else None
    return Eigenpairs(theta[order].copy(), residual[order].copy(), used, converged, vectors, restarts)


def check_k(k: int, dim: int) -> None:
    """Refuse a number of eigenpairs outside ``[1, dim]``.

    Parameters
    ----------
    k : int
        The number of eigenpairs asked for.
    dim : int
        The operator's dimension.

    Raises
    ------
    ConfigError
        ``k < 1`` or ``k > dim``.
    """
    if not 1 <= k <= dim:
        raise ConfigError(f"k must lie in [1, {dim}] (the number of parameters), got {k}")
