"""Evaluation sharded over workers: the missing points of a point set, or per-model analyses.

Built on :mod:`landscape.infra.parallel` (local processes, Ray, Dask). Each worker rebuilds the
evaluator once from a picklable :class:`EvaluatorSpec` (template, CPU batches, options, never
a cache); the calling process reads the cache, hands out runs of missing points, and stores
every finished shard itself, so an interrupted run resumes with the missing shards only.
Results equal the single-process ones up to round-off.
"""
from __future__ import annotations

import copy
import threading
import uuid
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..infra.errors import ConfigError
from ..infra.parallel import Backend, as_backend, current_device, iter_shards, run_shards, to_device, worker_device
from ..space.points import PointSet
from .inputs import map_tensors
from .options import EvaluatorOptions
from .point_filling import contiguous_run, fill_points

if TYPE_CHECKING:  # the evaluator imports this module for its back ends; the class travels in the spec
    from .evaluator import Evaluator

#: Shards per worker when no ``shard_size`` is given (evens out slow and fast workers).
SHARDS_PER_WORKER = 4


@dataclass(frozen=True)
class EvaluatorSpec:
    """Picklable description of an :class:`Evaluator` that a worker rebuilds once.

    Holds the template module (CPU copy), the evaluation batches (CPU tensors, batch
    boundaries kept) and the options; never a cache, so workers cannot write one.
    ``token`` identifies the spec in a worker's memory of rebuilt evaluators.

    Attributes
    ----------
    evaluator_class : type
        The class of the described evaluator (rebuilt as such).
    module : torch.nn.Module
        A CPU copy of the template.
    batches : tuple of (x, y) tensor pairs
        The evaluation batches, on the CPU.
    options : EvaluatorOptions
        The evaluator's options, with its resolved strategy, chunk size and device, and no
        back end or progress bar.
    bn_batches_data : tuple of (x, y) tensor pairs or None
        The data for re-estimating BatchNorm statistics, if it differs from ``batches``.
    token : str
        A random hex identifier, fresh for every :meth:`describe`.
    """

    evaluator_class: type
    module: torch.nn.Module
    batches: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    options: EvaluatorOptions
    bn_batches_data: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None
    token: str

    @staticmethod
    def from_evaluator(evaluator: Evaluator) -> "EvaluatorSpec":
        """The spec of ``evaluator``; the same object (and token) for every call on it.

        Parameters
        ----------
        evaluator
            The evaluator to describe.

        Returns
        -------
        EvaluatorSpec
        """
        if evaluator not in _SPECS:
            _SPECS[evaluator] = EvaluatorSpec.describe(evaluator)
        return _SPECS[evaluator]

    @staticmethod
    def describe(evaluator: Evaluator) -> "EvaluatorSpec":
        """A new spec of ``evaluator`` (with a fresh token).

        Parameters
        ----------
        evaluator
            The evaluator to describe.

        Returns
        -------
        EvaluatorSpec
        """
        def cpu(data) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
            return tuple((map_tensors(x, torch.Tensor.cpu), y.cpu()) for x, y in data.batches)

        options = evaluator.options.replace(
            strategy=evaluator.strategy or evaluator.requested_strategy, chunk_size=evaluator.chunk_size,
            device=str(evaluator.device), backend=None, n_jobs=None, progress=False, batch_size=None)
        bn_data = None if evaluator.bn_data is evaluator.data else cpu(evaluator.bn_data)
        module = copy.deepcopy(evaluator.module).cpu()
        return EvaluatorSpec(type(evaluator), module, cpu(evaluator.data), options, bn_data, uuid.uuid4().hex)

    def build(self, device: str | torch.device | None = None) -> Evaluator:
        """A fresh Evaluator (no cache, no progress bar) on ``device`` (default: the original's).

        Parameters
        ----------
        device
            Device of the rebuilt evaluator.

        Returns
        -------
        Evaluator
        """
        bn_data = None if self.bn_batches_data is None else DataLoader(list(self.bn_batches_data), batch_size=None)
        options = self.options if device is None else self.options.replace(device=str(device))
        with warnings.catch_warnings():  # the caller's evaluator already warned about its BatchNorm data
            warnings.simplefilter("ignore", UserWarning)
            return self.evaluator_class(self.module, DataLoader(list(self.batches), batch_size=None),
                                        bn_data=bn_data, cache=None, options=options)


_SPECS: "weakref.WeakKeyDictionary[Evaluator, EvaluatorSpec]" = weakref.WeakKeyDictionary()
_EVALUATORS: "OrderedDict[tuple[str, str, int], Evaluator]" = OrderedDict()
_EVALUATORS_LOCK = threading.Lock()
_MAX_EVALUATORS = 4


def worker_evaluator(spec: EvaluatorSpec) -> Evaluator:
    """The evaluator of ``spec`` on this worker's device, built on first use and kept.

    One per thread: an Evaluator sets its private module's weights in place, so threaded
    workers (Dask in-process, joblib threading) must not share one.

    Parameters
    ----------
    spec
        The evaluator description.

    Returns
    -------
    Evaluator
    """
    device = worker_device(spec.options.device)
    key = (spec.token, device, threading.get_ident())
    with _EVALUATORS_LOCK:
        if key not in _EVALUATORS:
            _EVALUATORS[key] = spec.build(device)
            while len(_EVALUATORS) > _MAX_EVALUATORS:
                _EVALUATORS.popitem(last=False)
        _EVALUATORS.move_to_end(key)
        return _EVALUATORS[key]


@dataclass(frozen=True)
class PointShard:
    """A run of consecutive points of a point set, with the evaluator that computes them.

    Attributes
    ----------
    spec : EvaluatorSpec
        The evaluator the worker rebuilds.
    points : PointSet
        Only the shard's points (with every direction when ``input_shortcut``, else only
        the directions they use).
    reference : torch.Tensor
        Reference point for ``bn="keep"`` (float64).
    start : int
        Index of the shard's first point in the whole point set.
    input_shortcut : bool
        Whether the input-layer shortcut computes the points: decided once for the whole
        point set, so every shard takes the code path the single process takes and the
        results are bit-identical.
    """

    spec: EvaluatorSpec
    points: PointSet        # only the points of the shard
    reference: torch.Tensor
    start: int              # index of the shard's first point in the whole point set
    input_shortcut: bool    # decided for the whole point set (see Runner.plans_shortcut)


@dataclass(frozen=True)
class ModelTask:
    """``fn(vector, evaluator, **kwargs)`` for one model, on the worker's rebuilt evaluator.

    Attributes
    ----------
    spec : EvaluatorSpec
        The evaluator the worker rebuilds.
    fn : Callable[..., Any]
        A module-level (picklable) function.
    vector : torch.Tensor
        The model as a flat vector of the evaluator's space.
    kwargs : Mapping[str, Any]
        Keyword arguments of ``fn``.
    """

    spec: EvaluatorSpec
    fn: Callable[..., Any]
    vector: torch.Tensor
    kwargs: Mapping[str, Any]


def run_model_task(task: ModelTask) -> Any:
    """Worker side of :func:`map_models`: the task's result (moved to the CPU).

    Parameters
    ----------
    task : ModelTask
        The model and function.

    Returns
    -------
    Any
        ``fn``'s result, its tensors moved to the CPU when the worker has a device.
    """
    result = task.fn(task.vector, worker_evaluator(task.spec), **task.kwargs)
    return result if current_device() is None else to_device(result, "cpu")


def map_models(fn: Callable[..., Any], models: Sequence[Any], evaluator: Evaluator, *,
               kwargs: Mapping[str, Any] | None = None, backend: Backend | str | None = None,
               **overrides: Any) -> list[Any]:
    """``[fn(model, evaluator, **kwargs) for model in models]`` with one model per shard.

    For per-model analyses such as curvature at many points:
    ``map_models(landscape.hessian_eigenvalues, checkpoints, ev, kwargs={"k": 2}, backend="loky")``.
    Models are turned into flat vectors here (checkpoint files are read by this process
    only); each worker rebuilds ``evaluator`` without its cache.

    Parameters
    ----------
    fn
        A module-level function accepting a flat float64 vector as the model.
    models
        Model-likes.
    evaluator
        The evaluator the workers rebuild.
    kwargs
        Keyword arguments of ``fn``.
    backend, **overrides
        The back end (see :func:`landscape.infra.parallel.as_backend`).

    Returns
    -------
    list
        ``fn``'s results in the order of ``models``.
    """
    spec = EvaluatorSpec.from_evaluator(evaluator)
    tasks = [ModelTask(spec, fn, evaluator.vector(m), dict(kwargs or {})) for m in models]
    return run_shards(run_model_task, tasks, backend, **overrides)


def evaluate_shard(shard: PointShard) -> tuple[np.ndarray, np.ndarray]:
    """Loss and accuracy of a shard's points (worker side).

    Parameters
    ----------
    shard : PointShard
        The points and the evaluator that computes them.

    Returns
    -------
    tuple of numpy.ndarray
        ``(loss, accuracy)`` of each point of the shard.
    """
    return worker_evaluator(shard.spec).evaluate_points(shard.points, reference=shard.reference,
                                                        input_shortcut=shard.input_shortcut)


def shard_ranges(todo: np.ndarray, size: int) -> list[tuple[int, int]]:
    """Split sorted indices into ``[start, stop)`` runs of consecutive indices, each <= ``size``.

    Parameters
    ----------
    todo
        Sorted indices of missing points.
    size
        Longest run.

    Returns
    -------
    list of tuple
    """
    ranges = []
    pos = 0
    while pos < todo.size:
        run = contiguous_run(todo, pos, size)
        ranges.append((int(todo[pos]), int(todo[pos]) + run))
        pos += run
    return ranges


def evaluate_points_distributed(evaluator: Evaluator, points: PointSet, *,
                                reference: torch.Tensor | None = None, label: str = "points",
                                backend: Backend | str | None = None, shard_size: int | None = None,
                                **overrides: Any) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Evaluator.evaluate_points` with the missing points computed by workers.

    The caller reads the cache, splits the missing points into shards (about
    ``SHARDS_PER_WORKER`` per worker unless ``shard_size`` is given), and writes every
    finished shard to the cache itself: workers never touch it.

    Parameters
    ----------
    evaluator
        The evaluator (its cache, if any, is written by this process only).
    points
        The point set.
    reference
        Reference point for ``bn="keep"``.
    label
        Progress-bar label.
    backend, **overrides
        The back end.
    shard_size
        Points per shard (default: about ``SHARDS_PER_WORKER`` shards per worker).

    Returns
    -------
    tuple of numpy.ndarray
        ``(loss, accuracy)`` per point.
    """
    backend = as_backend(backend, **overrides)
    if shard_size is not None and shard_size < 1:
        raise ConfigError(f"shard_size must be >= 1, got {shard_size}")
    ref = (reference if reference is not None else points.origin).to(torch.float64)

    def compute(todo: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        size = shard_size or max(1, -(-todo.size // (backend.workers * SHARDS_PER_WORKER)))
        spec = EvaluatorSpec.from_evaluator(evaluator)
        ranges = shard_ranges(todo, size)
        shortcut = evaluator.runner.plans_shortcut(points)
        shards = [PointShard(spec, points.rows(a, b, keep_directions=shortcut), ref, a, shortcut) for a, b in ranges]
        for i, (loss, acc) in iter_shards(evaluate_shard, shards, backend):
            yield np.arange(*ranges[i]), loss, acc

    def count(n: int) -> None:
        evaluator.points_evaluated += n

    return fill_points(len(points), evaluator.points_key(points, ref), evaluator.cache, compute,
                       label=label, progress=evaluator.options.progress, on_done=count)
