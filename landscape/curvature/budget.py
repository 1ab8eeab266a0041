"""Limits of the curvature computations.

How many products one call may ask for, and the memory of the vectors a solver holds at once.

* :data:`MAX_ITERATIONS` bounds ``max_iter`` of :func:`~landscape.hessian_eigen` and
  :func:`~landscape.hessian_trace` and ``iterations`` of :func:`~landscape.hessian_density`;
  :data:`MAX_RUNS` bounds the density's probes. Each Hessian-vector product is a pass over all of
  the evaluator's data, so these are hours of work on the smallest models.
* The memory a solver holds grows with the iteration count on large models: a Lanczos basis of
  ``m`` vectors of the operator's size, the dense projected matrix (``m x m`` float64, with its
  eigen-decomposition) and the Hutch++ sketch. :func:`check_solver_memory` refuses a request
  whose estimate exceeds the memory available on the operator's device (the host's
  ``MemAvailable``, or the free memory of a CUDA device) before anything is allocated, with
  the estimate and the limit in the message.
"""
from __future__ import annotations

import torch

from ..infra import host_memory
from ..infra.errors import ConfigError

#: Most Hessian-vector products per call (``max_iter``), and most Lanczos steps per probe of the
#: density (``iterations``).
MAX_ITERATIONS = 100_000
#: Most Rademacher probes of the density (``runs``).
MAX_RUNS = 1_000
#: Copies of the projected ``m x m`` matrix alive while its eigen-decomposition runs (the matrix,
#: LAPACK's working copy and the eigenvectors).
PROJECTED_COPIES = 3


def check_count(value: int, name: str, limit: int) -> None:
    """Refuse an iteration or probe count outside ``[1, limit]``.

    Parameters
    ----------
    value : int
        The count asked for.
    name : str
        The argument, for the message (``"max_iter"``, ``"iterations"``, ``"runs"``).
    limit : int
        The largest accepted value (:data:`MAX_ITERATIONS` or :data:`MAX_RUNS`).

    Raises
    ------
    ConfigError
        Naming the argument, the value and the limit.
    """
    if not 1 <= value <= limit:
        raise ConfigError(f"{name} must lie in [1, {limit:,}], got {value:,}; each step is a Hessian-vector "
                          "product over all of the evaluator's data")


def lanczos_bytes(steps: int, size: int, dtype: torch.dtype) -> int:
    """Memory of a Lanczos basis of ``steps`` vectors and of its projected matrix.

    Parameters
    ----------
    steps : int
        Basis vectors held at once (capped at ``size`` by the solvers).
    size : int
        The operator's dimension (number of parameters).
    dtype : torch.dtype
        Of the basis vectors.

    Returns
    -------
    int
        ``(steps + 1) * size * itemsize`` for the basis plus
        ``PROJECTED_COPIES * steps**2 * 8`` for the projected matrix and its eigenvectors.
    """
    return (steps + 1) * size * dtype.itemsize + PROJECTED_COPIES * steps * steps * 8


def sketch_bytes(vectors: int, size: int, dtype: torch.dtype) -> int:
    """Memory of a Hutch++ sketch: probes and their images, and their float64 QR factor.

    Parameters
    ----------
    vectors : int
        Sketch size.
    size : int
        The operator's dimension.
    dtype : torch.dtype
        Of the probes.

    Returns
    -------
    int
        ``vectors * size * (3 * itemsize + 2 * 8)``.
    """
    return vectors * size * (3 * dtype.itemsize + 16)


def check_solver_memory(needed: int, what: str, device: torch.device | str, advice: str) -> None:
    """Refuse a solver whose estimated memory exceeds what its device has available.

    Parameters
    ----------
    needed : int
        Estimated bytes (:func:`lanczos_bytes`, :func:`sketch_bytes`).
    what : str
        What needs them, naming the argument, e.g. ``"iterations=5000 (a Lanczos basis of ...)"``.
    device : torch.device or str
        Where the vectors live: CUDA devices are checked against their free memory, anything
        else against the host's available memory (nothing is refused when unknown).
    advice : str
        What to do instead.

    Raises
    ------
    ConfigError
        ``"<what> needs about X of memory, but only Y are available; <advice>"``.
    """
    device = torch.device(device)
    available = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    host_memory.check_fits(needed, what, available=available, advice=advice)

