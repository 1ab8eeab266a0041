"""The diagonal of a curvature matrix: Hutchinson's stochastic estimate, or exact for small operators.

Hutchinson's diagonal estimator (Bekas, Kokiopoulou & Saad 2007, eq. 2 with Rademacher probes):

``diag(C) ~ (1/m) sum_k z_k * (C z_k)``,

``*`` the entrywise product and ``z_k`` independent vectors of +-1 entries. Entry ``i`` of one
sample is ``C_ii + sum_{j != i} C_ij z_i z_j``, so each sample is unbiased; its variance is
``sum_{j != i} C_ij^2``, and the per-entry standard error is the sample standard deviation over
``sqrt(m)``. The exact diagonal takes ``(C e_i)_i``, one product per parameter. Both see only the
operator interface (:class:`~landscape.curvature.linear.SymmetricOperator`), so every curvature
kind works.

Examples
--------
A diagonal matrix is recovered exactly by either method (every off-diagonal term vanishes):

>>> import torch
>>> from landscape.curvature.linear import MatrixOperator
>>> d = MatrixOperator(torch.diag(torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)))
>>> curvature_diagonal(d, samples=4).values, curvature_diagonal(d, method="exact").values
(array([3., 1., 2.]), array([3., 1., 2.]))

With off-diagonal entries the estimate is noisy, and its standard errors say how much:

>>> a = MatrixOperator(torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64))
>>> est = curvature_diagonal(a, samples=400, seed=0)
>>> bool(all(abs(est.values - 2.0) <= 4 * est.stderr)), est.matvecs
(True, 400)
"""
from __future__ import annotations

import numpy as np
import torch

from ..infra.errors import ConfigError
from ..infra.values import did_you_mean
from ..results.curvature import DiagonalEstimate
from .lanczos import rademacher_vector
from .linear import SymmetricOperator

#: the ``method=`` values of :func:`curvature_diagonal`
METHODS = ("hutchinson", "exact")


def curvature_diagonal(op: SymmetricOperator, *, method: str = "hutchinson", samples: int = 100, seed: int = 0,
                       max_exact: int = 5000) -> DiagonalEstimate:
    """``diag(C)``: Hutchinson's estimate (Bekas et al. 2007) with standard errors, or exact.

    Parameters
    ----------
    op
        The operator ``C`` (any curvature kind, or a :class:`~.linear.MatrixOperator`).
    method
        ``"hutchinson"`` (``samples`` products) or ``"exact"`` (``op.size`` products).
    samples
        Rademacher probes of ``"hutchinson"`` (at least 2, for the standard errors).
    seed
        Seed of the probes.
    max_exact
        Largest ``op.size`` that ``"exact"`` accepts.

    Returns
    -------
    DiagonalEstimate
        ``.values`` and ``.stderr`` (float64, ``op.size`` entries each; ``stderr`` is 0 for ``"exact"``).

    Raises
    ------
    ConfigError
        An unknown ``method``, ``samples < 2`` for Hutchinson, or ``"exact"`` on an operator larger than
        ``max_exact``.
    """
    if method not in METHODS:
        raise ConfigError(f"method must be one of {', '.join(METHODS)}, got {method!r}"
                          f"{did_you_mean(str(method), METHODS)}")
    if method == "exact":
        return _exact(op, max_exact)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 2:
        raise ConfigError(f"samples must be an integer >= 2 (for the standard errors), got {samples!r}")
    generator = torch.Generator().manual_seed(seed)
    start = op.matvecs
    mean = torch.zeros(op.size, dtype=torch.float64, device=op.device)
    squares = torch.zeros_like(mean)  # Welford's running sum of squared deviations
    for k in range(1, samples + 1):
        z = rademacher_vector(op.size, generator, op.device, op.dtype)
        sample = z.double() * op.matvec(z).double()
        delta = sample - mean
        mean += delta / k
        squares += delta * (sample - mean)
    stderr = torch.sqrt(squares / (samples - 1) / samples)
    return DiagonalEstimate(values=mean.cpu().numpy(), stderr=stderr.cpu().numpy(), method="hutchinson",
                            samples=samples, matvecs=op.matvecs - start, dim=op.size)


def _exact(op: SymmetricOperator, max_exact: int) -> DiagonalEstimate:
    """``(C e_i)_i`` for every ``i``."""
    n = op.size
    if n > max_exact:
        raise ConfigError(f"the exact diagonal takes one product per parameter and is limited to "
                          f"max_exact={max_exact:,}, the operator has {n:,}; use method='hutchinson'")
    start = op.matvecs
    values = np.empty(n, dtype=np.float64)
    e = torch.zeros(n, dtype=op.dtype, device=op.device)
    for i in range(n):
        e[i] = 1
        values[i] = float(op.matvec(e)[i])
        e[i] = 0
    return DiagonalEstimate(values=values, stderr=np.zeros(n), method="exact", samples=n,
                            matvecs=op.matvecs - start, dim=n)

