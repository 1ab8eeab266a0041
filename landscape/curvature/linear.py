"""The interface every curvature solver sees.

A symmetric linear operator, its SciPy view, and an explicit matrix as one.

Solvers (:mod:`.lanczos`, :mod:`.power`, :mod:`.trace`, :mod:`.density`) take any object with
``size``, ``dtype``, ``device``, ``matvecs``, ``matvec`` and ``to_scipy``
(:class:`SymmetricOperator`): a curvature operator of an evaluator's loss
(:mod:`.operators`, :mod:`.gauss_newton`) or an explicit matrix (:class:`MatrixOperator`, for
tests and small problems) alike.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from ..infra.errors import ConfigError


@runtime_checkable
class SymmetricOperator(Protocol):
    """What a curvature solver needs of a symmetric operator ``A``.

    Attributes
    ----------
    size
        The dimension ``n`` (``A`` is ``n x n``).
    dtype, device
        Of the vectors ``matvec`` takes and returns.
    matvecs
        Products computed so far.
    """

    size: int
    dtype: torch.dtype
    device: torch.device
    matvecs: int

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """``A v`` for a vector of length ``size``.

        Parameters
        ----------
        v : torch.Tensor
            A vector of length ``size`` (moved to the operator's device and dtype).

        Returns
        -------
        torch.Tensor
            ``A v``, on the operator's device.
        """

    def to_scipy(self) -> Any:
        """A ``scipy.sparse.linalg.LinearOperator`` view (float64).

        Returns
        -------
        scipy.sparse.linalg.LinearOperator
        """


def scipy_view(op: SymmetricOperator) -> Any:
    """A ``scipy.sparse.linalg.LinearOperator`` (float64 in and out) of a symmetric operator.

    Parameters
    ----------
    op
        The operator.

    Returns
    -------
    scipy.sparse.linalg.LinearOperator
    """
    from scipy.sparse.linalg import LinearOperator

    def mv(x: np.ndarray) -> np.ndarray:
        v = torch.as_tensor(np.asarray(x, dtype=np.float64).reshape(-1))
        return op.matvec(v.to(op.device, op.dtype)).double().cpu().numpy()

    return LinearOperator((op.size, op.size), matvec=mv, rmatvec=mv, dtype=np.float64)


class MatrixOperator:
    """An explicit symmetric matrix as a :class:`SymmetricOperator`.

    Parameters
    ----------
    matrix
        A symmetric ``(n, n)`` tensor (not checked for symmetry).

    Raises
    ------
    ConfigError
        ``matrix`` is not square.
    """

    def __init__(self, matrix: torch.Tensor):
        if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
            raise ConfigError(f"a matrix operator needs a square matrix, got shape {tuple(matrix.shape)}")
        self.matrix = matrix
        self.size = int(matrix.shape[0])
        self.dtype = matrix.dtype
        self.device = matrix.device
        self.matvecs = 0

    def matvec(self, v: torch.Tensor) -> torch.Tensor:
        """``A v`` (one product, counted in ``matvecs``).

        Parameters
        ----------
        v : torch.Tensor
            A vector of length ``size`` (moved to the operator's device and dtype).

        Returns
        -------
        torch.Tensor
            ``A v``, on the operator's device.
        """
        self.matvecs += 1
        return self.matrix @ v.to(self.device, self.dtype)

    __call__ = matvec

    def to_scipy(self) -> Any:
        """A ``scipy.sparse.linalg.LinearOperator`` view (float64).

        Returns
        -------
        scipy.sparse.linalg.LinearOperator
            See :func:`scipy_view`.
        """
        return scipy_view(self)
