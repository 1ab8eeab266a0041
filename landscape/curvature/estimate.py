"""Dry runs of the curvature computations (top eigenvalues, trace, spectral density).

A dry run of :func:`~landscape.hessian_eigen`, :func:`~landscape.hessian_trace` or
:func:`~landscape.hessian_density` looks the result's cache key up (read only), builds the
curvature operator at the point (cheap: the parameters are selected, no product is formed) and
times a product after a warm-up (:func:`~landscape.infra.estimate.time_once`). The number
of products comes from the solver's budget (:class:`ProductPlan`): exact for the density
(``min(iterations, dim) x runs``), an upper bound for the eigen-solvers and trace estimators,
which stop early when they converge. Memory: the parameters and data (as the evaluator holds
them), one batch's activations for a second-order product, and the solver's vectors
(:func:`~.budget.lanczos_bytes`, :func:`~.budget.sketch_bytes`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..evaluation.dry_run import evaluation_memory
from ..infra.estimate import CacheLookup, JobEstimate, Work, plural, time_once
from .budget import lanczos_bytes, sketch_bytes
from .operators import CurvatureOperator

#: The unit of work of curvature computations.
PRODUCT = "Hessian-vector product"


@dataclass(frozen=True)
class ProductPlan:
    """How many products a curvature computation asks for, and its solver's memory.

    Attributes
    ----------
    products : callable
        ``dim -> products`` (the operator's dimension caps Lanczos steps).
    solver_bytes : callable
        ``(dim, dtype) -> bytes`` of the vectors the solver holds at once.
    exact : bool
        Whether ``products`` is the exact count (False: an upper bound, reached without convergence).
    """

    products: Callable[[int], int]
    solver_bytes: Callable[[int, torch.dtype], int]
    exact: bool = False

    def estimate(self, job: str, op: CurvatureOperator, evaluator: Any, stored: bool, key: str) -> JobEstimate:
        """The estimate of running the computation on ``op``.

        Parameters
        ----------
        job : str
            The function's name (``"hessian_eigen"``).
        op : CurvatureOperator
            The operator at the point (its products are timed).
        evaluator : Evaluator
            Whose data and module the products run over.
        stored : bool
            Whether the result is in the cache (then nothing is left to compute).
        key : str
            The result's cache key.

        Returns
        -------
        JobEstimate
        """
        count = int(self.products(op.dim))
        probe = torch.ones(op.dim, device=op.device, dtype=op.dtype)
        seconds = 0.0 if stored else time_once(lambda: op.matvec(probe), op.device)
        memory = {**evaluation_memory(evaluator, 0, second_order=True),
                  "solver vectors": int(self.solver_bytes(op.dim, op.dtype))}
        cache = (CacheLookup(f"{job} result", int(stored), 1, key),) if evaluator.cache is not None else ()
        notes = () if self.exact else (f"{count:,} products is the budget: the solver stops earlier when it converges",)
        batches = len(evaluator.batches)
        work = Work(PRODUCT, count, 0 if stored else count, seconds,
                    f"each over {batches} {plural('batch', batches)}, {op.dim:,} parameters")
        return JobEstimate(job, (work,), memory, cache, notes)


def eigen_plan(method: str, k: int, max_iter: int) -> ProductPlan:
    """The products and memory of :func:`~landscape.hessian_eigen`'s solver.

    Parameters
    ----------
    method : str
        ``"lanczos"`` (at most ``max_iter`` products, capped at the dimension; a basis of
        ``min(dim, max_iter, max(3k + 20, 60))`` vectors) or another solver (power iteration: at
        most ``k x max_iter`` products, ``k + 2`` vectors).
    k, max_iter : int
        As for :func:`~landscape.hessian_eigen`.

    Returns
    -------
    ProductPlan
    """
    if method == "lanczos":
        return ProductPlan(lambda dim: min(max_iter, dim),
                           lambda dim, dtype: lanczos_bytes(min(dim, max_iter, max(3 * k + 20, 60)), dim, dtype))
    return ProductPlan(lambda dim: k * max_iter, lambda dim, dtype: (k + 2) * dim * dtype.itemsize)


def trace_plan(method: str, max_iter: int) -> ProductPlan:
    """The products and memory of :func:`~landscape.hessian_trace`'s estimator.

    Parameters
    ----------
    method : str
        ``"hutch++"`` (a sketch of ``max_iter // 3`` vectors) or another estimator (two vectors).
    max_iter : int
        The budget of products (an upper bound).

    Returns
    -------
    ProductPlan
    """
    if method == "hutch++":
        return ProductPlan(lambda dim: max_iter, lambda dim, dtype: sketch_bytes(max(1, max_iter // 3), dim, dtype))
    return ProductPlan(lambda dim: max_iter, lambda dim, dtype: 2 * dim * dtype.itemsize)


def density_plan(iterations: int, runs: int) -> ProductPlan:
    """The products and memory of :func:`~landscape.hessian_density`: ``min(iterations, dim) x runs``, exactly.

    Parameters
    ----------
    iterations, runs : int
        As for :func:`~landscape.hessian_density`.

    Returns
    -------
    ProductPlan
        A Lanczos basis of ``min(iterations, dim)`` vectors.
    """
    return ProductPlan(lambda dim: min(iterations, dim) * runs,
                       lambda dim, dtype: lanczos_bytes(min(iterations, dim), dim, dtype), exact=True)
