"""The evaluation engine: loss and accuracy of many points in parameter space.

The template module is copied (the user's module is never touched). Data stay on the device;
per-point sums of losses and correct predictions are accumulated on the device and moved to
the host once per chunk. Losses are sums over samples divided by the sample count.

The pieces, one module each: options (:mod:`.options`), losses (:mod:`.losses`), scoring of a
batch (:mod:`.scoring`), BatchNorm modes (:mod:`.batchnorm`), the loop and vmap strategies
(:mod:`.strategies`), the exact CPU shortcuts (:mod:`.input_layer`, :mod:`.class_major`),
memory budgets (:mod:`.memory`), the cached fill loop (:mod:`.resumable`) and sharded
evaluation over workers (:mod:`.sharded`).

``strategy="auto"`` uses the loop on CPU (vmap is measured 2.5-5x slower there) and elsewhere
times both per point on the first points of the first chunk that fit vmap's memory; the choice
is recorded in ``strategy`` and ``strategy_reason``. Chunks are sized from the memory budget,
and the loop's chunks also from ``flush_interval``: finished points reach the cache at least
that often, so a killed run loses seconds of work. An out-of-memory error in a chunk is caught
and the chunk retried in halves.

An Evaluator sets the weights of its private module copy in place: use one per thread.
"""
from __future__ import annotations

import contextlib
import copy
import os
import time
import warnings
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from ..cache.store import Cache, make_key
from ..infra.devices import resolve_device
from ..infra.errors import ConfigError, DataError
from ..results import Metrics
from ..space.params import ModelLike, ParameterSpace, vector_digest
from ..space.points import PointSet
from .batchnorm import BatchNormModes
from .class_major import ClassMetrics
from .data import DeviceData, check_targets, prepare_data
from .input_layer import InputLayerShortcut
from .losses import loss_identity
from .memory import activation_bytes, default_budget, fitting_chunk, is_out_of_memory
from .options import EvaluatorOptions
from .resumable import contiguous_run, fill_points
from .scoring import Scorer, select_output
from . import strategies
from .strategies import LoopStrategy, VmapStrategy

ALGORITHM_VERSION = "evaluator-1"


class Evaluator:
    """Loss and accuracy of points in the parameter space of ``module`` on ``data``.

    Parameters
    ----------
    module
        Template ``nn.Module`` giving the architecture; never modified.
    data
        A ``DataLoader``, a ``Dataset`` or a tuple ``(inputs, targets)`` of tensors.
    bn_data
        Data for ``bn="recompute"`` (default: ``data``, with a warning, since re-estimating
        statistics on evaluation data is rarely what is wanted).
    cache
        Path of an HDF5 cache, a :class:`~landscape.cache.Cache`, or ``None``.
    options
        An :class:`EvaluatorOptions`; keyword options override its fields.
    **kwargs
        Any field of :class:`EvaluatorOptions` (``loss``, ``device``, ``bn``, ``bn_batches``,
        ``dtype``, ``strategy``, ``chunk_size``, ``batch_size``, ``memory_budget``,
        ``autocast``, ``compile``, ``backend``, ``n_jobs``, ``input_shortcut``, ``progress``,
        ``flush_interval``, ``output``).

    Raises
    ------
    ConfigError
        An invalid option.
    DataError
        The model cannot be applied to the data, or the labels do not fit its outputs.
    """

    def __init__(self, module: nn.Module, data: Any, *, bn_data: Any = None,
                 cache: str | os.PathLike | Cache | None = None, options: EvaluatorOptions | None = None,
                 **kwargs: Any):
        unknown = set(kwargs) - set(EvaluatorOptions.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown Evaluator option(s) {sorted(unknown)}; the options are "
                              f"{sorted(EvaluatorOptions.__dataclass_fields__)}")
        self.options = (options or EvaluatorOptions()).replace(**kwargs)
        if not isinstance(module, nn.Module):
            raise ConfigError(f"module must be an nn.Module (the architecture), got {type(module).__name__}")
        opts = self.options
        self.device = resolve_device(opts.device)
        self.dtype = opts.dtype or torch.float32
        self.space = ParameterSpace(module)
        self.module = _private_copy(module).to(self.device, self.dtype).eval()
        self.loss_name = loss_identity(opts.loss)
        self.bn = opts.bn
        self.data: DeviceData = prepare_data(data, self.device, self.dtype, opts.batch_size)
        self.batches = self.data.batches
        self.num_samples = self.data.num_samples
        self.bn_batches = opts.bn_batches
        self.bn_data = (self.data if bn_data is None
                        else prepare_data(bn_data, self.device, self.dtype, opts.batch_size))
        self.cache = (Cache(cache, flush_interval=opts.flush_interval)
                      if isinstance(cache, (str, bytes, os.PathLike)) else cache)
        self.strategy: str | None = None if opts.strategy == "auto" else opts.strategy
        self.strategy_reason = "requested" if opts.strategy != "auto" else ""
        self.chunk_size = opts.chunk_size
        self.memory_budget = opts.memory_budget
        self.points_evaluated = 0
        self.fixed = {k: v.to(self.device) for k, v in self.space.fixed.items()}
        self.batchnorm = BatchNormModes(self.module, self.space, self.bn, self.bn_data, self.bn_batches,
                                        self.fixed)
        if self.bn == "recompute" and self.batchnorm.layers and bn_data is None:
            warnings.warn("bn='recompute' without bn_data re-estimates BatchNorm statistics on the "
                          "evaluation data itself; pass bn_data=<training data> (see docs/batchnorm.md)",
                          stacklevel=2)
        self.shortcut_layers: list[str] = []  # input layers expanded in the last evaluate_points
        self._loop: LoopStrategy | None = None
        self._vmap: VmapStrategy | None = None
        self._shortcut: InputLayerShortcut | None = None
        self._targets, class_metrics = self._check_data()
        self.scorer = Scorer(opts.loss, self.loss_name, self.dtype, class_metrics)
        self._activation_bytes: int | None = None

    # ------------------------------------------------------------------ options as attributes
    @property
    def requested_strategy(self) -> str:
        """The strategy asked for (``auto``, ``loop`` or ``vmap``)."""
        return self.options.strategy

    @property
    def autocast(self) -> torch.dtype | None:
        """The autocast dtype, or None."""
        return self.options.autocast

    @property
    def compile(self) -> bool | str:
        """The ``torch.compile`` setting."""
        return self.options.compile

    @property
    def backend(self) -> Any:
        """The back end sharding missing points over workers, or None (this process)."""
        return self.options.backend

    @property
    def n_jobs(self) -> int | None:
        """Workers of the back end."""
        return self.options.n_jobs

    @property
    def progress(self) -> bool | None:
        """Whether a progress bar is shown (None: when on a terminal)."""
        return self.options.progress

    @property
    def per_sample_loss(self):
        """The per-sample loss function ``(outputs, targets) -> losses``."""
        return self.scorer.per_sample_loss

    @property
    def concatenates_outputs(self) -> bool:
        """True when the loop scores a point's outputs over all batches in one call."""
        return self._targets is not None

    @property
    def class_major_head(self) -> str | None:
        """Name of the output layer computed class-major by the loop (CPU), or None."""
        return self._loop.class_major_head if self._loop is not None else None

    # ------------------------------------------------------------------ basics
    def forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Logits of the template at ``params`` (state_dict-named tensors), eval mode.

        Parameters
        ----------
        params
            Tensors keyed like the template's state_dict (those outside the flat vector,
            such as integer buffers, are filled in).
        x
            A batch of inputs on the evaluation device.

        Returns
        -------
        torch.Tensor
            The logits (selected with ``output`` when the forward returns a container).
        """
        out = functional_call(self.module, {**self.fixed, **params}, (x,), tie_weights=True)
        return select_output(out, self.options.output)

    def _check_data(self) -> tuple[torch.Tensor | None, ClassMetrics | None]:
        x, y = self.batches[0]
        template = {k: v.to(self.device, self.dtype) for k, v in self.space.unflatten(
            self.space.flatten(self.module.state_dict(), check_finite=False)).items()}
        try:
            with torch.no_grad():
                raw = functional_call(self.module, {**self.fixed, **template}, (x[:2],), tie_weights=True)
        except Exception as exc:  # any shape error of the user's model
            raise DataError(f"the model cannot be applied to inputs of shape {tuple(x.shape[1:])}: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        out = select_output(raw, self.options.output)
        for _, yb in self.batches:
            check_targets(out, yb, self.loss_name)
        per_point = self.num_samples * out[0].numel() * out.element_size() if out.ndim else 0
        targets = (torch.cat([yb for _, yb in self.batches])
                   if len(self.batches) > 1 and 0 < per_point <= strategies.CONCAT_OUTPUT_BYTES else None)
        metrics = None
        if (self.device.type == "cpu" and self.loss_name == "cross_entropy" and out.ndim == 2
                and not torch.is_floating_point(yb) and self.compile is False
                and per_point <= strategies.CONCAT_OUTPUT_BYTES):  # bounds its (C, N) label masks too
            metrics = ClassMetrics(out.shape[1])
            metrics.prepare([yb for _, yb in self.batches] + ([targets] if targets is not None else []))
        return targets, metrics

    def fingerprint(self) -> dict[str, Any]:
        """Everything about this evaluator that determines a metric value.

        Returns
        -------
        dict
            Data fingerprint, loss, BatchNorm mode (and its data), dtype, parameter layout,
            algorithm version and autocast dtype: the inputs of every cache key.
        """
        return {
            "data": self.data.fingerprint, "loss": self.loss_name, "bn": self.bn,
            "bn_batches": self.bn_batches if self.bn == "recompute" else None,
            "bn_data": self.bn_data.fingerprint if self.bn == "recompute" else None,
            "dtype": str(self.dtype), "space": self.space.layout_digest(), "version": ALGORITHM_VERSION,
            **({"autocast": str(self.autocast)} if self.autocast is not None else {}),
            **({"output": repr(self.options.output)} if self.options.output is not None else {}),
        }

    def vector(self, model: ModelLike) -> torch.Tensor:
        """Flat vector of a model-like in this evaluator's space (float64 on CPU).

        Parameters
        ----------
        model
            An ``nn.Module``, a state_dict or a checkpoint path.

        Returns
        -------
        torch.Tensor
        """
        return self.space.to_vector(model, dtype=torch.float64)

    # -------------------------------------------------------------- public API
    def evaluate(self, models: Sequence[ModelLike] | ModelLike | torch.Tensor) -> Metrics:
        """Loss and accuracy of each model.

        Parameters
        ----------
        models
            Model-likes, one model-like, or a ``(P, D)`` tensor of flat vectors.

        Returns
        -------
        Metrics
            ``loss`` and ``accuracy`` arrays, one entry per model.
        """
        if isinstance(models, (nn.Module, Mapping, str, os.PathLike)):
            models = [models]
        vecs = models if isinstance(models, torch.Tensor) else self.space.stack(models, dtype=torch.float64)
        if vecs.ndim == 1:
            vecs = vecs.unsqueeze(0)
        loss, acc = self.evaluate_points(PointSet.explicit(vecs.to(torch.float64)), reference=vecs[0])
        return Metrics(loss=loss, accuracy=acc, spec={"evaluator": self.fingerprint()})

    def evaluate_points(self, points: PointSet, *, reference: torch.Tensor | None = None,
                        label: str = "points") -> tuple[np.ndarray, np.ndarray]:
        """Metrics of every point; cached points are read, missing ones computed chunk by chunk.

        With a ``backend`` (``"loky"``, ``"ray"``, ``"dask"``, ...), the missing points are
        sharded over workers (:mod:`landscape.evaluation.sharded`); this process stays the only
        cache writer.

        Parameters
        ----------
        points
            The point set.
        reference
            Reference point for ``bn="keep"`` (default: the point set's origin).
        label
            Progress-bar label.

        Returns
        -------
        tuple of numpy.ndarray
            ``(loss, accuracy)`` per point.
        """
        if self.backend is not None:
            from .sharded import evaluate_points_distributed

            return evaluate_points_distributed(self, points, reference=reference, label=label,
                                               backend=self.backend, n_jobs=self.n_jobs)
        ref = (reference if reference is not None else points.origin).to(torch.float64)
        ref_dev = ref.to(self.device, self.dtype)

        def compute(todo: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
            self._shortcut = self._make_shortcut(points, todo.size)
            try:
                yield from self._compute_runs(points, todo, ref_dev)
            finally:
                if self._shortcut is not None:
                    self._shortcut.remove()
                    self._shortcut = None
                if self._loop is not None:
                    self._loop.shortcut = None

        return fill_points(len(points), self.points_key(points, ref), self.cache, compute, label=label,
                           progress=self.progress, on_done=self._count)

    def points_key(self, points: PointSet, reference: torch.Tensor) -> str:
        """Cache key of a point set evaluated with this evaluator.

        Parameters
        ----------
        points
            The point set.
        reference
            Its reference point (its buffers enter the key under ``bn="keep"``).

        Returns
        -------
        str
        """
        spec = {"points": points.digest(), **self.fingerprint()}
        if self.bn == "keep" and self.space.has_buffers:
            spec["reference"] = vector_digest(reference[~self.space.param_mask])
        return make_key(spec)

    def apply_bn_mode(self, vecs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """Flat vectors with their BatchNorm buffers set by this evaluator's mode.

        Parameters
        ----------
        vecs
            ``(P, D)`` vectors on the evaluation device.
        reference
            ``(D,)`` reference point (for ``keep``).

        Returns
        -------
        torch.Tensor
        """
        return self.batchnorm.apply(vecs, reference)

    def activation_bytes(self) -> int:
        """Estimated activation memory of one point (see :func:`.memory.activation_bytes`)."""
        if self._activation_bytes is None:
            self._activation_bytes = activation_bytes(self.module, self.batches)
        return self._activation_bytes

    def chunk_limit(self, strategy: str) -> int:
        """Points per chunk that fit the memory budget under ``strategy`` (``loop`` or ``vmap``).

        Parameters
        ----------
        strategy
            ``"loop"`` or ``"vmap"`` (vmap holds every point's activations).

        Returns
        -------
        int
        """
        extra = self.activation_bytes() if strategy == "vmap" else 0
        return fitting_chunk(self.space.size, self.dtype, self.memory_budget or default_budget(self.device), extra)

    # --------------------------------------------------------------- internals
    def _count(self, n: int) -> None:
        self.points_evaluated += n

    def _compute_runs(self, points: PointSet, todo: np.ndarray, ref: torch.Tensor
                      ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Runs of consecutive missing points, each small enough to fit memory and, for the
        loop, to finish within ``flush_interval`` seconds (measured on the previous run)."""
        pos, per_point = 0, None
        while pos < todo.size:
            size = self.chunk_size or self.chunk_limit(self.strategy or "loop")
            if self.strategy != "vmap" and self.chunk_size is None:
                size = min(size, 4 if per_point is None else max(1, int(self.options.flush_interval / per_point)))
            run = contiguous_run(todo, pos, size)
            idx = todo[pos:pos + run]
            start = time.perf_counter()
            try:
                loss, acc = self._evaluate_chunk(points, int(idx[0]), int(idx[-1]) + 1, ref)
            except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
                if run == 1 or not is_out_of_memory(exc):
                    raise
                torch.cuda.empty_cache()
                self.chunk_size = max(1, run // 2)  # retry this chunk in halves
                continue
            per_point = max((time.perf_counter() - start) / run, 1e-6)
            pos += run
            yield idx, loss, acc

    def _evaluate_chunk(self, points: PointSet, start: int, stop: int, ref: torch.Tensor
                        ) -> tuple[np.ndarray, np.ndarray]:
        vecs = self.batchnorm.apply(points.chunk(start, stop, self.device, self.dtype), ref)
        coeffs = points.coeffs[start:stop].tolist()
        if self.strategy is None:
            return self._autotune(vecs, coeffs)
        return self._run(vecs, coeffs, self.strategy)

    @property
    def loop(self) -> LoopStrategy:
        """The loop strategy (its flat-view module copy), built on first use."""
        if self._loop is None:
            self._loop = LoopStrategy(self.module, self.space, self.batches, self.scorer, self._targets,
                                      self.options.output, self.compile)
        return self._loop

    def _make_shortcut(self, points: PointSet, todo: int) -> InputLayerShortcut | None:
        """The input-layer expansion for the loop over ``points``, when enabled, applicable
        (no autocast, compile or output selector) and worth its set-up."""
        k = points.directions.shape[0]
        self.shortcut_layers = []
        if (not self.options.input_shortcut or self.strategy == "vmap" or self.autocast is not None
                or self.compile is not False or self.options.output is not None or todo < 4 * (k + 1)):
            return None
        loop = self.loop
        shortcut = InputLayerShortcut(loop.module, self.space, self.batches, points.origin, points.directions,
                                      (self.memory_budget or default_budget(self.device)) // 4)
        self.shortcut_layers = list(shortcut.layers)
        if not shortcut.active:
            return None
        loop.shortcut = shortcut
        return shortcut

    def _run(self, vecs: torch.Tensor, coeffs: list[list[float]], strategy: str) -> tuple[np.ndarray, np.ndarray]:
        amp = (torch.autocast(self.device.type, dtype=self.autocast) if self.autocast is not None
               else contextlib.nullcontext())
        with torch.no_grad(), amp:
            if strategy == "loop":
                sums = self.loop.sums(vecs, coeffs)
            else:
                if self._vmap is None:
                    self._vmap = VmapStrategy(self.forward, self.space, self.batches, self.scorer, self.compile)
                sums = self._vmap.sums(vecs)
        host = sums.double().cpu().numpy()  # the one synchronisation per chunk
        return host[:, 0] / self.num_samples, host[:, 1] / self.num_samples

    def _autotune(self, vecs: torch.Tensor, coeffs: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
        if self.device.type == "cpu":
            self.strategy, self.strategy_reason = "loop", "cpu: vmap measured slower than a loop on CPU"
            return self._run(vecs, coeffs, "loop")
        return self.measure_strategies(vecs, coeffs)

    def measure_strategies(self, vecs: torch.Tensor, coeffs: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
        """Time loop and vmap per point on the first points of ``vecs``, keep the faster.

        Parameters
        ----------
        vecs
            ``(P, D)`` device vectors (BatchNorm mode applied).
        coeffs
            Their coefficients.

        Returns
        -------
        tuple of numpy.ndarray
            The metrics of ``vecs`` computed with the chosen strategy (recorded in
            ``strategy`` and ``strategy_reason``).
        """
        n = min(len(vecs), self.chunk_limit("vmap"))  # vmap holds n points' activations
        per_point = {}
        for strategy in ("loop", "vmap"):
            self._run(vecs[:1], coeffs[:1], strategy)  # warm-up (compilation, cuDNN algorithm choice)
            t0 = time.perf_counter()
            self._run(vecs[:n], coeffs[:n], strategy)  # synchronises (host copy of the sums)
            per_point[strategy] = (time.perf_counter() - t0) / n
        self.strategy = min(per_point, key=per_point.get)
        self.strategy_reason = f"measured on {n} points: " + ", ".join(
            f"{k} {v * 1e3:.2f} ms/point" for k, v in per_point.items())
        step = n if self.strategy == "vmap" else len(vecs)
        if self.strategy == "vmap" and self._shortcut is not None:
            self._shortcut.remove()
            self._shortcut, self.shortcut_layers = None, []
            self.loop.shortcut = None
        parts = [self._run(vecs[i:i + step], coeffs[i:i + step], self.strategy) for i in range(0, len(vecs), step)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _private_copy(module: nn.Module) -> nn.Module:
    """A deep copy of the user's template, with a clear error for modules that cannot be copied."""
    try:
        return copy.deepcopy(module)
    except RuntimeError as exc:
        if "weight_norm" in str(exc) or any(hasattr(m, "weight_g") for m in module.modules()):
            raise ConfigError("the model uses the deprecated torch.nn.utils.weight_norm, which cannot be "
                              "copied; re-create it with torch.nn.utils.parametrizations.weight_norm") from None
        raise ConfigError(f"the model cannot be copied (copy.deepcopy failed: {exc}); the evaluator "
                          "needs a private copy of the template") from None
