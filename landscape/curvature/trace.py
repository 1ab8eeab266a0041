"""Stochastic trace estimators of a symmetric operator (registered in :mod:`.registry`).

A new estimator is a function here (or in a new module of this package), decorated with
``@trace_estimator("name")``, taking ``(op, *, tol, max_iter, generator, min_samples)``.

* Hutchinson (1989): ``tr A = E[z^T A z]`` for Rademacher ``z``; the estimate is the sample
  mean, its standard error ``std / sqrt(m)``.
* Hutch++ (Meyer, Musco, Musco & Woodruff 2021, Alg. 1): ``tr A = tr(Q^T A Q) +
  tr((I - QQ^T) A (I - QQ^T))`` with ``Q`` an orthonormal basis of ``A S`` for a Rademacher
  sketch ``S``; the first term is exact, the second is estimated by Hutchinson on projected
  probes. The top of the spectrum, which dominates Hutchinson's variance, is removed.

Both stop once ``stderr <= tol * |estimate|`` (after ``min_samples`` samples) or when the
budget of ``max_iter`` matvecs is spent.

Examples
--------
A 50 x 50 operator whose trace (1548) is dominated by two large eigenvalues: Hutchinson's
variance is ``2 ||A||_F^2`` off the diagonal, so 60 probes leave it hundreds off; Hutch++
removes the top of the spectrum with a 10-vector sketch (its exact part, 1508 of the 1548) and
estimates only the flat remainder, to within one unit after 30 products in all.

>>> import torch
>>> from landscape.curvature.linear import MatrixOperator
>>> g = torch.Generator().manual_seed(0)
>>> q, _ = torch.linalg.qr(torch.randn(50, 50, generator=g, dtype=torch.float64))
>>> a = MatrixOperator(q @ torch.diag(torch.tensor([1000.0, 500.0] + [1.0] * 48, dtype=torch.float64)) @ q.T)
>>> plain = hutchinson(a, tol=1e-3, max_iter=60, generator=torch.Generator().manual_seed(1))
>>> plain.matvecs, abs(plain.value - 1548) > 100, plain.stderr > 100
(60, True, True)
>>> plus = hutchpp(a, tol=1e-3, max_iter=60, generator=torch.Generator().manual_seed(1), sketch=10)
>>> plus.matvecs, round(plus.exact), abs(plus.value - 1548) < 1, plus.stderr < 1
(30, 1508, True, True)
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..infra.errors import ConfigError
from ..results.curvature import TraceEstimate
from .budget import check_solver_memory, sketch_bytes
from .lanczos import rademacher_vector
from .linear import SymmetricOperator
from .registry import trace_estimator


@trace_estimator("hutchinson")
def hutchinson(op: SymmetricOperator, *, tol: float = 1e-3, max_iter: int = 100,
               generator: torch.Generator, min_samples: int = 10) -> TraceEstimate:
    """Hutchinson's estimator with Rademacher probes and a relative-stderr stopping rule.

    Parameters
    ----------
    op
        The operator.
    tol
        Stop once ``stderr <= tol |estimate|`` (after ``min_samples`` samples).
    max_iter
        Budget of products.
    generator
        Seeded generator of the probes.
    min_samples
        Least number of samples before the stopping rule applies.

    Returns
    -------
    TraceEstimate
    """
    _check_budget(max_iter, 1)
    dim = op.size
    samples = _sample_quadratic_forms(op, max_iter, tol, 0.0, min_samples, generator, project=None)
    value, stderr = _mean_stderr(samples)
    converged = stderr <= tol * abs(value)
    return TraceEstimate(value=value, stderr=stderr, samples=samples, method="hutchinson",
                         matvecs=len(samples), dim=dim, converged=bool(converged))


@trace_estimator("hutch++")
def hutchpp(op: SymmetricOperator, *, tol: float = 1e-3, max_iter: int = 100,
            generator: torch.Generator, sketch: int | None = None,
            min_samples: int = 10) -> TraceEstimate:
    """Hutch++ (Meyer et al. 2021, Alg. 1) with a sketch of ``sketch`` vectors.

    Costs ``2 * sketch`` products for the exact part, then at most ``max_iter - 2 * sketch``
    Hutchinson samples of the deflated remainder. If the sketch spans the whole space the
    trace is exact (``stderr == 0``).

    Parameters
    ----------
    op
        The operator.
    tol, max_iter, generator, min_samples
        As for :func:`hutchinson`.
    sketch
        Sketch size (default ``max_iter // 3``).

    Returns
    -------
    TraceEstimate

    Raises
    ------
    ConfigError
        A budget too small for the sketch, or a sketch larger than the memory available on the
        operator's device.
    """
    _check_budget(max_iter, 3)
    dim, device, dtype, matvec = op.size, op.device, op.dtype, op.matvec
    s = min(dim, sketch if sketch is not None else max(1, max_iter // 3))
    if s < 1 or 2 * s > max_iter:
        raise ConfigError(f"the Hutch++ sketch ({s} vectors) needs 2x{s} matvecs, more than max_iter={max_iter}")
    check_solver_memory(sketch_bytes(s, dim, dtype),
                        f"max_iter={max_iter:,} (a Hutch++ sketch of {s:,} vectors of {dim:,} parameters)",
                        device, "choose a smaller max_iter (the sketch is max_iter // 3 vectors) or "
                                "method='hutchinson'")
    probes = torch.stack([rademacher_vector(dim, generator, device, dtype) for _ in range(s)])
    images = torch.stack([matvec(p) for p in probes])
    q, _ = torch.linalg.qr(images.T.double())
    q = q.to(dtype)
    exact = float(sum(torch.dot(u, matvec(u)).double() for u in q.T))
    used = 2 * s
    if s == dim:
        return TraceEstimate(value=exact, stderr=0.0, samples=np.zeros(0), method="hutch++",
                             matvecs=used, dim=dim, converged=True, exact=exact)

    def project(z: torch.Tensor) -> torch.Tensor:
        return z - q @ (q.T @ z)

    samples = _sample_quadratic_forms(op, max_iter - used, tol, exact, min_samples, generator,
                                      project=project)
    mean, stderr = _mean_stderr(samples)
    value = exact + mean
    return TraceEstimate(value=value, stderr=stderr, samples=samples, method="hutch++",
                         matvecs=used + len(samples), dim=dim,
                         converged=bool(stderr <= tol * abs(value)), exact=exact)


def _sample_quadratic_forms(op: SymmetricOperator, budget: int, tol: float, offset: float,
                            min_samples: int, generator: torch.Generator, project) -> np.ndarray:
    """``z^T A z`` for Rademacher (optionally projected) ``z`` until ``stderr <= tol |offset + mean|``."""
    samples: list[float] = []
    for _ in range(budget):
        z = rademacher_vector(op.size, generator, op.device, op.dtype)
        if project is not None:
            z = project(z)
        samples.append(float(torch.dot(z.double(), op.matvec(z).double())))
        if len(samples) >= min(min_samples, budget) and len(samples) > 1:
            mean, stderr = _mean_stderr(np.asarray(samples))
            if stderr <= tol * abs(offset + mean):
                break
    return np.asarray(samples, dtype=np.float64)


def _mean_stderr(samples: np.ndarray) -> tuple[float, float]:
    if samples.size == 0:
        return 0.0, float("nan")
    mean = float(samples.mean())
    stderr = float(samples.std(ddof=1) / math.sqrt(samples.size)) if samples.size > 1 else float("nan")
    return mean, stderr


def _check_budget(max_iter: int, least: int) -> None:
    if max_iter < least:
        raise ConfigError(f"max_iter must be >= {least} for this trace estimator, got {max_iter}")
