"""The evaluation engine: loss and accuracy of many points in parameter space.

The template module is copied (the user's module is never touched). Data stay on the device;
per-point sums of losses and correct predictions are accumulated on the device and moved to
the host once per chunk. Losses are sums over samples divided by the sample count.

The pieces, one module each: options (:mod:`.options`), losses (:mod:`.losses`), scoring of a
batch (:mod:`.scoring`), BatchNorm modes (:mod:`.batchnorm`), the loop and vmap strategies
(:mod:`.point_strategies`), the exact CPU shortcuts (:mod:`.input_layer_shortcut`, :mod:`.class_major_scoring`),
memory budgets (:mod:`.memory`), the cached fill loop (:mod:`.point_filling`) and sharded
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

import os
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..cache.store import Cache, make_key
from ..infra.devices import resolve_device
from ..infra.errors import BatchNormWarning, ConfigError, DataError
from ..results import Metrics
from ..space.params import ModelLike, ParameterSpace, vector_digest
from ..space.points import PointSet, check_headroom
from . import point_strategies
from .batchnorm import BatchNormModes
from .chunk_runner import ChunkRunner
from .class_major_scoring import ClassMetrics
from .data import DeviceData, check_targets, prepare_data
from .inputs import BatchFn, ModelInputs, describe, flat_hint, functional_forward, leading
from .losses import loss_identity
from .memory import activation_bytes, default_budget, fitting_chunk
from .options import EvaluatorOptions
from .point_filling import fill_points
from .point_strategies import LoopStrategy, private_copy
from .scoring import Scorer, scoring_plan, select_output

ALGORITHM_VERSION = "evaluator-2"


class Evaluator:
    """Loss and accuracy of points in the parameter space of ``module`` on ``data``.

    Parameters
    ----------
    module
        Template ``nn.Module`` giving the architecture; never modified.
    data
        A ``DataLoader``, a ``Dataset`` or a tuple ``(inputs, targets)`` of tensors; batches may
        be pairs, tuples or dicts such as ``{"input_ids", "attention_mask", "labels"}``
        (:mod:`~landscape.evaluation.inputs`).
    batch_fn
        ``batch -> (model_inputs, targets)`` for batches of other forms; model inputs may be a
        tensor, a tuple (positional arguments) or a dict (keyword arguments).
    bn_data
        Data for ``bn="recompute"`` (default: ``data``, with a warning, since re-estimating
        statistics on evaluation data is rarely what is wanted).
    cache
        Path of an HDF5 cache, a :class:`~landscape.cache.Cache`, or ``None``.
    options
        An :class:`EvaluatorOptions`; keyword options override its fields.
    **kwargs
        Any field of :class:`EvaluatorOptions` (``loss``, ``metric``, ``device``, ``bn``, ``bn_batches``,
        ``dtype``, ``strategy``, ``chunk_size``, ``batch_size``, ``memory_budget``,
        ``autocast``, ``compile``, ``backend``, ``n_jobs``, ``input_shortcut``, ``progress``,
        ``flush_interval``, ``output``).

    Raises
    ------
    ConfigError
        An invalid option.
    DataError
        The model cannot be applied to the data, or the labels do not fit its outputs.

    Examples
    --------
    The mean squared error of ``y = w x`` on ``x = 1, 2, 3`` with ``y = 2x``: zero at ``w = 2``,
    ``(1 + 4 + 9) / 3`` at ``w = 1``; points are state dicts, modules, checkpoints or flat vectors.

    >>> import torch, landscape
    >>> x, y = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[2.0], [4.0], [6.0]])
    >>> ev = landscape.Evaluator(torch.nn.Linear(1, 1, bias=False), (x, y), loss="mse", progress=False)
    >>> ev.evaluate([{"weight": torch.tensor([[2.0]])}, {"weight": torch.tensor([[1.0]])}]).loss
    array([0.        , 4.66666667])
    """

    def __init__(self, module: nn.Module, data: Any, *, bn_data: Any = None,
                 cache: str | os.PathLike | Cache | None = None, options: EvaluatorOptions | None = None,
                 batch_fn: BatchFn | None = None, **kwargs: Any):
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
        self.module = private_copy(module).to(self.device, self.dtype).eval()
        self.loss_name = loss_identity(opts.loss)
        self.bn = opts.bn
        self.batch_fn = batch_fn  # also maps the batches of training data (curves) and alignment inputs
        self.data: DeviceData = prepare_data(data, self.device, self.dtype, opts.batch_size, batch_fn=batch_fn)
        self.batches = self.data.batches
        self.num_samples = self.data.num_samples
        self.bn_batches = opts.bn_batches
        self.bn_data = (self.data if bn_data is None
                        else prepare_data(bn_data, self.device, self.dtype, opts.batch_size, batch_fn=batch_fn))
        self.cache = (Cache(cache, flush_interval=opts.flush_interval)
                      if isinstance(cache, (str, bytes, os.PathLike)) else cache)
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
        targets, class_metrics = self._check_data()
        self.scorer = Scorer(opts.loss, self.loss_name, self.dtype, class_metrics, opts.metric)
        #: Targets that count over all of the data (samples, or non-ignored tokens): the loss's divisor.
        self.num_targets = sum(self.scorer.loss.count(y) for _, y in self.batches)
        if self.num_targets == 0:
            raise DataError(f"every label is ignored (-100): loss={self.loss_name!r} has no target to evaluate")
        self.runner = ChunkRunner(self, targets)
        self._warned_batchnorm = False
        self._activation_bytes: int | None = None

    # ------------------------------------------------------------------ options as attributes
    @property
    def requested_strategy(self) -> str:
        """The strategy asked for (``auto``, ``loop`` or ``vmap``)."""
        return self.options.strategy

    @property
    def per_sample_loss(self):
        """The per-sample loss function ``(outputs, targets) -> losses``."""
        return self.scorer.per_sample_loss

    @property
    def strategy(self) -> str | None:
        """The strategy in use (``loop`` or ``vmap``; None until ``auto`` has chosen)."""
        return self.runner.strategy

    @property
    def strategy_reason(self) -> str:
        """Why that strategy: requested, the device, or the measured times per point."""
        return self.runner.strategy_reason

    @property
    def shortcut_layers(self) -> list[str]:
        """Input layers expanded by the exact input-layer shortcut in the last evaluation."""
        return self.runner.shortcut_layers

    @property
    def loop(self) -> LoopStrategy:
        """The loop strategy (its flat-view module copy), built on first use."""
        return self.runner.loop

    @property
    def concatenates_outputs(self) -> bool:
        """True when the loop scores a point's outputs over all batches in one call."""
        return self.runner.targets is not None

    @property
    def class_major_head(self) -> str | None:
        """Name of the output layer computed class-major by the loop (CPU), or None."""
        return self.loop.class_major_head

    def measure_strategies(self, vecs: torch.Tensor, coeffs: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
        """Time loop and vmap on the first points of ``vecs`` and keep the faster.

        See :meth:`.chunk_runner.ChunkRunner.measure_strategies`.

        Parameters
        ----------
        vecs, coeffs
            ``(P, D)`` device vectors (BatchNorm mode applied) and their coefficients.

        Returns
        -------
        tuple of numpy.ndarray
            The metrics of ``vecs``, computed with the chosen strategy.
        """
        return self.runner.measure_strategies(vecs, coeffs)

    # ------------------------------------------------------------------ basics
    @property
    def loss(self) -> Any:
        """The resolved loss: ``per_sample(outputs, targets)`` and ``count(targets)``."""
        return self.scorer.loss

    def forward(self, params: dict[str, torch.Tensor], x: ModelInputs, *, module: nn.Module | None = None
                ) -> torch.Tensor:
        """Logits of the template at ``params`` (state_dict-named tensors), eval mode.

        Parameters
        ----------
        params
            Tensors keyed like the template's state_dict (those outside the flat vector,
            such as integer buffers, are filled in).
        x
            A batch of model inputs on the evaluation device (tensor, tuple or dict of tensors).
        module
            Another copy of the architecture to run (e.g. one in train mode); default the template.

        Returns
        -------
        torch.Tensor
            The logits (selected with ``output`` when the forward returns a container).
        """
        return select_output(functional_forward(self.module if module is None else module,
                                                {**self.fixed, **params}, x), self.options.output)

    def _check_data(self) -> tuple[torch.Tensor | None, ClassMetrics | None]:
        x, _ = self.batches[0]
        template = {k: v.to(self.device, self.dtype) for k, v in self.space.unflatten(
            self.space.flatten(self.module.state_dict(), check_finite=False)).items()}
        try:
            with torch.no_grad():
                raw = functional_forward(self.module, {**self.fixed, **template}, leading(x, 2))
        except Exception as exc:  # any shape error of the user's model
            hint = flat_hint(lambda z: functional_forward(self.module, {**self.fixed, **template}, z), leading(x, 2))
            raise DataError(f"the model cannot be applied to inputs of {describe(x)}: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}{hint}") from None
        out = select_output(raw, self.options.output)
        for _, yb in self.batches:
            check_targets(out, yb, self.loss_name)
        return scoring_plan(out, self.batches, self.num_samples, self.device, self.loss_name, self.options.compile,
                            point_strategies.CONCAT_OUTPUT_BYTES, self.options.metric)

    def fingerprint(self) -> dict[str, Any]:
        """Everything about this evaluator that determines a metric value.

        Returns
        -------
        dict
            Data fingerprint, loss, metric (when not accuracy), BatchNorm mode (and its data),
            dtype, parameter layout, algorithm version and autocast dtype: the inputs of every
            cache key.
        """
        return {
            "data": self.data.fingerprint, "loss": self.loss_name, "bn": self.bn,
            "bn_batches": self.bn_batches if self.bn == "recompute" else None,
            "bn_data": self.bn_data.fingerprint if self.bn == "recompute" else None,
            "dtype": str(self.dtype), "space": self.space.layout_digest(), "version": ALGORITHM_VERSION,
            "batchnorm_layers": len(self.batchnorm.layers),
            **({"autocast": str(self.options.autocast)} if self.options.autocast is not None else {}),
            **({"metric": self.options.metric} if self.options.metric != "accuracy" else {}),
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

        Raises
        ------
        WeightOverflowError
            The weights are so large that point arithmetic overflows the evaluation dtype.
        """
        vec = self.space.to_vector(model, dtype=torch.float64)
        source = (str(model) if isinstance(model, (str, os.PathLike)) else "a flat vector"
                  if isinstance(model, torch.Tensor) else "a state_dict" if isinstance(model, Mapping)
                  else type(model).__name__)
        check_headroom(vec, self.dtype, source)
        return vec

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
                        label: str = "points", input_shortcut: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
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
        input_shortcut
            Whether the exact input-layer shortcut computes the points (None: decided from
            ``points`` as a whole, never from which of them are missing; a shard of a larger
            set passes the whole set's decision so that it takes the same code path).

        Returns
        -------
        tuple of numpy.ndarray
            ``(loss, accuracy)`` per point.
        """
        if self.options.backend is not None:
            from .sharded import evaluate_points_distributed

            return evaluate_points_distributed(self, points, reference=reference, label=label,
                                               backend=self.options.backend, n_jobs=self.options.n_jobs)
        ref = (reference if reference is not None else points.origin).to(torch.float64)
        ref_dev = ref.to(self.device, self.dtype)

        return fill_points(len(points), self.points_key(points, ref), self.cache,
                           lambda todo: self.runner.runs(points, todo, ref_dev, input_shortcut), label=label,
                           progress=self.options.progress, on_done=self._count)

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

    def warn_interpolated_batchnorm(self) -> None:
        """Warn, once per evaluator, that BatchNorm running statistics are interpolated with the weights.

        Called by the geometry functions (paths, planes, groups): under ``bn="interpolate"`` the
        averaged statistics rarely match the averaged network's activations, which can inflate
        barriers between independently trained BatchNorm models several-fold.
        """
        if self.bn == "interpolate" and self.batchnorm.layers and not self._warned_batchnorm:
            self._warned_batchnorm = True
            warnings.warn(f"the model has {len(self.batchnorm.layers)} BatchNorm layer(s) and bn='interpolate' "
                          "averages their running statistics with the weights, which can decide a barrier; "
                          "compare with bn='recompute' and bn_data=<training data> (docs/batchnorm.md)",
                          BatchNormWarning, stacklevel=3)

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
        """Estimated activation memory of one point (see :func:`.memory.activation_bytes`).

        Returns
        -------
        int
            Bytes (computed once, then remembered).
        """
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
