"""Inverse-curvature products ``(C + damping I)^{-1} b`` by conjugate gradients.

Conjugate gradients (Hestenes & Stiefel 1952, the algorithm of their section 3) solve
``A x = b`` for a symmetric positive definite ``A = C + damping I`` with one product ``C p`` per
iteration, seeing only the operator interface
(:class:`~landscape.curvature.linear.SymmetricOperator`): every curvature kind works, and an
explicit matrix too. From ``x_0 = 0``, ``r_0 = p_0 = b``:

``alpha_k = r_k^T r_k / p_k^T A p_k``, ``x_{k+1} = x_k + alpha_k p_k``,
``r_{k+1} = r_k - alpha_k A p_k``, ``beta_k = r_{k+1}^T r_{k+1} / r_k^T r_k``,
``p_{k+1} = r_{k+1} + beta_k p_k``.

The iterates and scalars are kept in float64 whatever the operator's dtype (each product is taken
in the operator's dtype); the iteration stops once ``||r_k|| <= tol ||b||``. In exact arithmetic
it ends within ``n`` iterations (``n`` the size). CG needs ``p^T A p > 0``: a Hessian away from a
minimum is indefinite, and a direction of non-positive curvature stops it with a
:class:`~landscape.infra.errors.CurvatureError` (add damping, or use the positive semi-definite GGN).

Examples
--------
A 3 x 3 positive definite matrix: CG ends in at most 3 iterations at the solution.

>>> import torch
>>> from landscape.curvature.linear import MatrixOperator
>>> a = torch.tensor([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
>>> b = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
>>> res = inverse_product(MatrixOperator(a), b, tol=1e-12)
>>> res.converged, res.iterations <= 3, torch.allclose(torch.from_numpy(res.x), torch.linalg.solve(a, b))
(True, True, True)

Damping shifts every eigenvalue; the damped solve is ``(A + 0.5 I)^{-1} b``:

>>> damped = inverse_product(MatrixOperator(a), b, damping=0.5, tol=1e-12)
>>> torch.allclose(torch.from_numpy(damped.x), torch.linalg.solve(a + 0.5 * torch.eye(3, dtype=a.dtype), b))
True

An indefinite matrix meets a direction of negative curvature:

>>> inverse_product(MatrixOperator(torch.diag(torch.tensor([1.0, -1.0]))), torch.tensor([0.0, 1.0]))
Traceback (most recent call last):
...
landscape.infra.errors.CurvatureError: conjugate gradients met non-positive curvature ... = -1 at iteration 1 ...
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..infra.errors import ConfigError, CurvatureError
from ..results.curvature import InverseProduct
from .linear import SymmetricOperator


def inverse_product(op: SymmetricOperator, b: torch.Tensor | np.ndarray, *, damping: float = 0.0,
                    tol: float = 1e-6, max_iter: int | None = None) -> InverseProduct:
    """``x = (C + damping I)^{-1} b`` by conjugate gradients (Hestenes & Stiefel 1952).

    Parameters
    ----------
    op
        The operator ``C`` (any curvature kind, or a :class:`~.linear.MatrixOperator`).
    b
        A vector of ``op.size`` entries (torch or numpy).
    damping
        ``>= 0``, added to every eigenvalue of ``C``.
    tol
        Stop once ``||b - (C + damping I) x|| <= tol ||b||`` (the recursively updated residual).
    max_iter
        Most iterations (products), default ``2 * op.size`` (``op.size`` suffices in exact arithmetic).

    Returns
    -------
    InverseProduct
        ``.x`` (float64), ``.iterations``, ``.residual_norm``, ``.relative_residual``, ``.converged``.

    Raises
    ------
    ConfigError
        A negative or non-finite ``damping``, ``tol`` not in ``(0, 1)``, ``max_iter < 1``, or ``b`` not a
        finite vector of ``op.size`` entries.
    CurvatureError
        An iteration met ``p^T (C + damping I) p <= 0``: ``C + damping I`` is not positive definite.
    """
    n = op.size
    rhs = _checked_rhs(b, n)
    if not (math.isfinite(damping) and damping >= 0):
        raise ConfigError(f"damping must be a finite number >= 0, got {damping!r}")
    if not 0 < tol < 1:
        raise ConfigError(f"tol must be in (0, 1), got {tol!r}")
    limit = 2 * n if max_iter is None else max_iter
    if limit < 1:
        raise ConfigError(f"max_iter must be >= 1, got {max_iter!r}")
    start = op.matvecs
    x = torch.zeros(n, dtype=torch.float64, device=op.device)
    r = rhs.to(op.device).clone()  # b itself stays as given
    p = r.clone()
    rr = float(torch.dot(r, r))
    b_norm = math.sqrt(rr)
    history = [1.0 if b_norm > 0 else 0.0]
    iterations = 0
    while b_norm > 0 and history[-1] > tol and iterations < limit:
        ap = op.matvec(p.to(op.dtype)).to(torch.float64) + damping * p
        iterations += 1
        curvature = float(torch.dot(p, ap))
        if not curvature > 0:
            raise CurvatureError(f"conjugate gradients met non-positive curvature p^T (C + damping I) p = "
                                 f"{curvature:.4g} at iteration {iterations} (damping={damping:g}): C is not "
                                 "positive definite; add damping (above minus its smallest eigenvalue) or use "
                                 'kind="ggn"')
        alpha = rr / curvature
        x += alpha * p
        r -= alpha * ap
        rr_next = float(torch.dot(r, r))
        history.append(math.sqrt(rr_next) / b_norm)
        p = r + (rr_next / rr) * p
        rr = rr_next
    return InverseProduct(x=x.cpu().numpy(), residuals=np.asarray(history), iterations=iterations,
                          residual_norm=math.sqrt(rr), converged=bool(history[-1] <= tol), damping=float(damping),
                          tol=float(tol), matvecs=op.matvecs - start, dim=n)


def as_inverse(op: SymmetricOperator, damping: float = 0.0, *, tol: float = 1e-6,
               max_iter: int | None = None) -> Any:
    """``(C + damping I)^{-1}`` as a ``scipy.sparse.linalg.LinearOperator`` (float64; CG for each product).

    Parameters
    ----------
    op
        The operator ``C``.
    damping, tol, max_iter
        As for :func:`inverse_product`.

    Returns
    -------
    scipy.sparse.linalg.LinearOperator
        Its ``matvec`` raises :class:`~landscape.infra.errors.CurvatureError` when CG does not reach ``tol``.
    """
    from scipy.sparse.linalg import LinearOperator

    def solve(v: np.ndarray) -> np.ndarray:
        res = inverse_product(op, np.asarray(v, dtype=np.float64).reshape(-1), damping=damping, tol=tol,
                              max_iter=max_iter)
        if not res.converged:
            raise CurvatureError(f"conjugate gradients reached a relative residual of {res.relative_residual:.3g}, "
                                 f"not tol={tol:g}, in {res.iterations} iterations; raise max_iter or damping")
        return res.x

    return LinearOperator((op.size, op.size), matvec=solve, rmatvec=solve, dtype=np.float64)


def _checked_rhs(b: torch.Tensor | np.ndarray, n: int) -> torch.Tensor:
    """``b`` as a float64 CPU vector of ``n`` finite entries."""
    rhs = torch.as_tensor(b).detach().to("cpu", torch.float64)
    if rhs.shape != (n,):
        raise ConfigError(f"b must be a vector of the operator's size ({n},), got shape {tuple(rhs.shape)}")
    if not bool(torch.isfinite(rhs).all()):
        raise ConfigError("b has non-finite entries")
    return rhs
