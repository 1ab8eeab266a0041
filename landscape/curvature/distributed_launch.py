"""Start worker processes that share one distributed curvature operator, and collect rank 0's result.

:func:`distributed_curvature` starts ``workers`` processes (``torch.multiprocessing``'s spawn
context), joins them in a process group (gloo on the CPU; NCCL with one GPU each when the
evaluator is on a GPU and there are enough) over a file store in a private temporary folder, and
runs ``compute(op)`` on every rank with the :class:`~.distributed.DistributedOperator` of
:func:`~.distributed.distributed_operator`, whose products are
``H v = (1/N) sum_r sum_{i in shard r} H_i v``. :func:`distributed_hessian_eigenvalues` is
:func:`~.functions.hessian_eigenvalues` run that way.

A worker that raises, or dies, or an overrun ``timeout`` (start-up included; every collective
waits at most as long) raises :class:`~landscape.infra.errors.DistributedError` in one line, and
every worker is stopped (terminated, then killed) before the call returns or raises, so none is
left behind.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import pickle
import queue
import tempfile
import time
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ..evaluation.protocol import PointEvaluator
from ..evaluation.sharded import EvaluatorSpec
from ..infra.errors import ConfigError, DistributedError
from ..results.curvature import Eigenvalues
from ..space.params import ModelLike, vector_digest
from .at_point import KindOptions, flat_point, operator_options, with_bn_mode
from .budget import MAX_ITERATIONS, check_count
from .distributed import DistributedOperator, batch_block, check_kind, distributed_operator
from .functions import eigen_result, spec_of
from .registry import EIGEN_SOLVERS
from .second_order import ATTENTION_KERNEL

__all__ = ["BACKENDS", "DEFAULT_TIMEOUT", "distributed_curvature", "distributed_hessian_eigenvalues"]

#: ``backend=`` values; ``"auto"``: NCCL when the evaluator is on a GPU and there is one per worker, else gloo.
BACKENDS = ("auto", "gloo", "nccl")
#: Default wall-clock limit (seconds) of a launched computation, start-up included, and of each collective.
DEFAULT_TIMEOUT = 3600.0


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every launched worker needs (pickled once per worker)."""

    spec: EvaluatorSpec
    point: torch.Tensor
    options: dict
    compute: Callable[[DistributedOperator], Any]
    backend: str
    threads: int
    timeout: float


def _worker(rank: int, world: int, job: _Job, store: str, results: Any) -> None:
    """One rank: join the group, build the distributed operator, run ``compute``; rank 0 sends its result."""
    try:
        torch.set_num_threads(job.threads)
        device = None
        if job.backend == "nccl":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        dist.init_process_group(job.backend, store=dist.FileStore(store, world), rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=job.timeout))
        try:
            evaluator = job.spec.build(device)
            out = job.compute(distributed_operator(job.point, evaluator, point_ready=True, **job.options))
        finally:
            dist.destroy_process_group()
        if rank == 0:
            results.put(("ok", rank, pickle.dumps(out)))
    except BaseException as exc:  # reported to the caller in one line; the exit code marks the failure
        first = (str(exc).strip().splitlines() or [""])[0]
        results.put(("error", rank, f"{type(exc).__name__}: {first}"))
        results.close()
        results.join_thread()  # the message is in the pipe before the process ends
        os._exit(1)


def distributed_curvature(compute: Callable[[DistributedOperator], Any], model: ModelLike | torch.Tensor,
                          evaluator: PointEvaluator, *, workers: int = 2, kind: str = "hessian",
                          kind_options: KindOptions = None, params: Sequence[str] | str | None = None,
                          include_frozen: bool = False, hvp: str = "auto", backend: str = "auto", threads: int = 1,
                          timeout: float = DEFAULT_TIMEOUT) -> Any:
    """Run ``compute(op)`` on ``workers`` new processes sharing one distributed operator; rank 0's result.

    The calling process applies the evaluator's BatchNorm mode to the point once, then starts the
    workers (spawn); each rebuilds the evaluator, keeps its block of the batches and joins a process
    group over a file store in a private temporary folder (:func:`~.distributed.distributed_operator`). The
    products are ``H v = (1/N) sum_r sum_{i in shard r} H_i v`` (Pearlmutter 1994 per batch).

    Parameters
    ----------
    compute
        ``DistributedOperator -> result``, run on every rank (so every rank takes part in every
        product); picklable: a module-level function or a ``functools.partial`` of one.
    model
        A model-like or a flat vector of the evaluator's space.
    evaluator
        The :class:`~landscape.Evaluator` (at least ``workers`` batches; it is sent to the workers
        without its cache).
    workers
        Number of processes.
    kind, kind_options, params, include_frozen, hvp
        As for :func:`~.distributed.distributed_operator`.
    backend
        ``"gloo"`` (CPU), ``"nccl"`` (one GPU per worker) or ``"auto"`` (NCCL when the evaluator is
        on a GPU and there are at least ``workers`` GPUs, else gloo).
    threads
        Torch intra-op threads per worker.
    timeout
        Seconds the whole call may take (start-up included), and each collective may wait.

    Returns
    -------
    Any
        What ``compute`` returned on rank 0.

    Raises
    ------
    ConfigError
        A bad option, a ``compute`` that cannot be pickled, or as for :func:`~.distributed.distributed_operator`.
    DistributedError
        A worker raised (the message names the worker and its error), died, or the call overran
        ``timeout``; every worker is stopped before it is raised.
    """
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ConfigError(f"workers must be a positive integer, got {workers!r}")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ConfigError(f"threads must be a positive integer, got {threads!r}")
    if not timeout > 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {backend!r}")
    options = check_kind(kind, kind_options, hvp=hvp)
    batch_block(len(evaluator.batches), 0, workers)
    try:
        pickle.dumps(compute)
    except Exception as exc:
        raise ConfigError(f"compute cannot be sent to the workers ({type(exc).__name__}: {exc}); pass a "
                          "module-level function or a functools.partial of one") from None
    if backend == "auto":
        gpus = torch.cuda.device_count() if evaluator.device.type == "cuda" else 0
        backend = "nccl" if gpus >= workers and dist.is_nccl_available() else "gloo"
    point = flat_point(model, evaluator)
    point = with_bn_mode(point, point, evaluator)
    operator = dict(kind=kind, kind_options=options, params=params, include_frozen=include_frozen)
    job = _Job(EvaluatorSpec.describe(evaluator), point, operator, compute, backend, threads, float(timeout))
    with tempfile.TemporaryDirectory(prefix="landscape-dist-") as folder:
        return _launch(job, workers, os.path.join(folder, "store"))


def _launch(job: _Job, workers: int, store: str) -> Any:
    """Start the workers, wait for rank 0's result within the job's timeout, and stop every worker."""
    context = torch.multiprocessing.get_context("spawn")
    results = context.Queue()
    deadline = time.monotonic() + job.timeout
    procs: list = []
    try:
        for rank in range(workers):
            proc = context.Process(target=_worker, args=(rank, workers, job, store, results), daemon=True)
            proc.start()
            procs.append(proc)
        while True:
            try:
                status, rank, payload = results.get(timeout=0.2)
            except queue.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    try:
                        status, rank, payload = results.get(timeout=2.0)
                    except queue.Empty:
                        raise DistributedError(f"worker {dead[0][0]} of {workers} died (exit code {dead[0][1]}) "
                                               "without reporting an error; a negative code is the signal that "
                                               "killed it (-9: often out of memory)") from None
                elif time.monotonic() > deadline:
                    raise DistributedError(f"the {workers} workers did not finish within timeout={job.timeout:g} s; "
                                           "raise timeout= or look for a rank that stopped calling matvec")
                else:
                    continue
            if status == "error":
                raise DistributedError(_first_failure(procs, rank, payload))
            for proc in procs:
                proc.join(max(0.0, deadline - time.monotonic()))
            return pickle.loads(payload)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        results.close()
        results.join_thread()


def _first_failure(procs: Sequence[Any], rank: int, payload: str) -> str:
    """The message for a worker's error: another worker killed by a signal is the cause, when there is one.

    A killed rank breaks its peers' collectives, so the first error to arrive is often a survivor's
    (a closed connection); the dead worker is named first.
    """
    time.sleep(0.2)  # the exit code of a killed peer is read by polling
    killed = [(r, p.exitcode) for r, p in enumerate(procs) if r != rank and p.exitcode is not None and p.exitcode < 0]
    if killed:
        r, code = killed[0]
        return (f"worker {r} of {len(procs)} was killed by signal {-code} (9: often out of memory); worker {rank} "
                f"then failed: {payload}")
    return f"worker {rank} of {len(procs)} failed: {payload}"


def distributed_hessian_eigenvalues(model: ModelLike | torch.Tensor, evaluator: PointEvaluator, *, workers: int = 2,
                                    k: int = 1, tol: float = 1e-3, max_iter: int = 100, seed: int = 0,
                                    method: str = "lanczos", params: Sequence[str] | str | None = None,
                                    hvp: str = "auto", include_frozen: bool = False, kind: str = "hessian",
                                    kind_options: KindOptions = None, backend: str = "auto", threads: int = 1,
                                    timeout: float = DEFAULT_TIMEOUT) -> Eigenvalues:
    """The ``k`` largest Hessian (GGN, empirical Fisher) eigenvalues with products split over ``workers`` processes.

    :func:`~landscape.curvature.functions.hessian_eigenvalues` computed through
    :func:`distributed_curvature`: the same solver, seed and start vectors, and products
    ``H v = (1/N) sum_r sum_{i in shard r} H_i v`` equal to one process's to float rounding, so the
    eigenvalues agree to the solver's tolerance. Not cached.

    Parameters
    ----------
    model, evaluator, k, tol, max_iter, seed, method, params, hvp, include_frozen, kind, kind_options
        As for :func:`~landscape.curvature.functions.hessian_eigen` (``kind="fisher"`` excepted).
    workers, backend, threads, timeout
        As for :func:`distributed_curvature`.

    Returns
    -------
    Eigenvalues
        Descending, carrying ``converged``, ``residuals``, ``matvecs`` and the result (its spec
        records ``workers``); a warning is issued when the solver did not converge.

    Raises
    ------
    ConfigError
        An invalid option.
    DistributedError
        As for :func:`distributed_curvature`.
    """
    check_count(max_iter, "max_iter", MAX_ITERATIONS)
    EIGEN_SOLVERS.get(method)
    compute = functools.partial(eigen_result, k=k, tol=tol, max_iter=max_iter, seed=seed, method=method,
                                return_vectors=False)
    operator, resolved = operator_options(kind, kind_options, include_frozen, hvp=hvp)
    options = dict(k=k, tol=tol, max_iter=max_iter, seed=seed, method=method, params=params, vectors=False,
                   **operator)
    result = distributed_curvature(compute, model, evaluator, workers=workers, kind=kind, kind_options=resolved,
                                   params=params, include_frozen=include_frozen, backend=backend, threads=threads,
                                   timeout=timeout)
    spec = {"kind": "hessian_eigen", "point": vector_digest(flat_point(model, evaluator)),
            **spec_of(evaluator, **options), "workers": workers, "attention_kernel": ATTENTION_KERNEL}
    result = dataclasses.replace(result, spec=spec)
    if not result.converged:
        warnings.warn(f"distributed_hessian_eigenvalues: {method} did not reach tol={tol} within "
                      f"max_iter={max_iter} products; raise max_iter or tol", stacklevel=2)
    return Eigenvalues(result)
