"""Spectral density of a symmetric operator by stochastic Lanczos quadrature.

Stochastic Lanczos quadrature (Lin, Saad & Yang 2016; Ghorbani et al. 2019): for a Rademacher
probe ``z`` (normalised), the Ritz values of the Krylov space started at ``z`` are quadrature
nodes and the squared first components of the Ritz vectors their weights, so that
``z^T g(A) z ~= sum_j w_j g(theta_j)``. Averaged over probes this estimates ``tr g(A) / n``.
The density is drawn as a mixture of Gaussians at the nodes (:func:`broadened_density`).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..infra.errors import ConfigError
from .budget import MAX_ITERATIONS, MAX_RUNS, check_count, check_solver_memory, lanczos_bytes
from .lanczos import KrylovBasis, rademacher_vector
from .linear import SymmetricOperator


def slq(op: SymmetricOperator, steps: int, runs: int, *, generator: torch.Generator
        ) -> tuple[np.ndarray, np.ndarray]:
    """Stochastic Lanczos quadrature nodes and weights.

    Parameters
    ----------
    op
        The operator.
    steps
        Lanczos steps per probe (capped at the operator's size).
    runs
        Number of Rademacher probes.
    generator
        Seeded generator of the probes.

    Returns
    -------
    tuple of numpy.ndarray
        ``nodes`` and ``weights``, each ``(runs, m)`` with ``m = min(steps, size)``; each row
        of ``weights`` sums to one.

    Raises
    ------
    ConfigError
        ``steps`` or ``runs`` outside the limits of :mod:`.budget`, or a Lanczos basis larger than
        the memory available on the operator's device.
    """
    check_count(steps, "iterations", MAX_ITERATIONS)
    check_count(runs, "runs", MAX_RUNS)
    m = min(steps, op.size)
    check_solver_memory(lanczos_bytes(m, op.size, op.dtype),
                        f"iterations={steps:,} (a Lanczos basis of {m:,} vectors of {op.size:,} parameters)",
                        op.device, "choose fewer iterations")
    nodes, weights = [], []
    for _ in range(runs):
        basis = KrylovBasis(op, rademacher_vector(op.size, generator, op.device, op.dtype), m, generator)
        while basis.rows < m:
            basis.extend()
        theta, s, _ = basis.ritz()
        nodes.append(theta)
        weights.append(s[0, :] ** 2)
    return np.stack(nodes), np.stack(weights)


def broadened_density(nodes: np.ndarray, weights: np.ndarray, *, sigma: float | None = None,
                      grid_size: int = 2001, max_grid: int = 200_001
                      ) -> tuple[np.ndarray, np.ndarray, float]:
    """``mean_r sum_j w_rj N(t; node_rj, sigma^2)`` on a grid.

    Parameters
    ----------
    nodes, weights
        SLQ output, ``(runs, m)`` each.
    sigma
        Gaussian width (default 0.5% of the spread of the nodes).
    grid_size
        Least number of grid points; the grid reaches 6 sigma beyond the extreme nodes with at
        least 4 points per sigma, so the density integrates to one.
    max_grid
        Refuse a grid larger than this (a sigma too small for the spread).

    Returns
    -------
    tuple
        ``(grid, density, sigma)``.
    """
    lo, hi = float(nodes.min()), float(nodes.max())
    spread = hi - lo
    if sigma is None:
        sigma = 0.005 * spread if spread > 0 else 0.01 * max(abs(hi), 1e-12)
    pad = 6.0 * sigma
    needed = int(math.ceil((spread + 2 * pad) / (sigma / 4.0))) + 1
    size = max(grid_size, needed)
    if size > max_grid:
        raise ConfigError(f"sigma={sigma:.3g} is too small for the spectrum's spread {spread:.3g}: the grid "
                          f"would need {size} points; pass a larger sigma")
    grid = np.linspace(lo - pad, hi + pad, size)
    density = np.zeros_like(grid)
    norm = 1.0 / (sigma * math.sqrt(2 * math.pi) * nodes.shape[0])
    for node, weight in zip(nodes.reshape(-1), weights.reshape(-1)):
        if weight > 0:
            density += weight * norm * np.exp(-0.5 * ((grid - node) / sigma) ** 2)
    return grid, density, float(sigma)
