"""The evaluation engine: loss and accuracy of many points in parameter space.

The template module is copied (the user's module is never touched); ``vmap`` calls the copy
with ``torch.func.functional_call``, the loop a flat-view copy (below). Data stay on the device; per-point sums of losses and
correct predictions are accumulated on the device and moved to the host once per chunk.
Losses are sums over samples divided by the sample count.

Strategies: ``loop`` (one point at a time, all batches) and ``vmap`` (a chunk of stacked
points at once). The loop runs a second private copy of the template whose parameters and
buffers are views into one flat tensor: a point is set with a single ``copy_`` and the
module is called directly, so its per-point cost is essentially that of plain forward
passes (``functional_call`` per batch cost about 2x that for a small MLP on CPU).
Two exact CPU shortcuts of the loop (same values to float rounding; tested against
``load_state_dict`` references): a ``Linear``/``Conv`` layer that reads the data directly
is expanded over the point set's directions (:mod:`landscape.input_layer`; a plane point
then costs two scaled additions over its output instead of its product; ``input_shortcut=
False`` turns it off, ``shortcut_layers`` names the expanded layers), and for cross-entropy
the output ``Linear`` produces class-major logits scored along the samples
(:mod:`landscape.class_major`; ``class_major_head`` names it).
``auto`` uses the loop on CPU (vmap is measured 2.5-5x slower there) and elsewhere times
both per point on the first points of the first chunk that fit vmap's memory; the choice
is recorded in ``strategy`` and ``strategy_reason``.

Speed options: ``autocast`` (``torch.bfloat16`` or ``torch.float16``: forward passes under
``torch.autocast``, losses in the evaluation dtype; recorded in the cache key) and
``compile`` (``True`` or a ``torch.compile`` backend name: the loop's per-batch step,
forward and metrics in one graph, or the vmapped metrics function). Chunks are sized from
half the free device memory (or ``memory_budget``); an out-of-memory error in a chunk is
caught and the chunk retried in halves (the smaller chunk size is kept).

BatchNorm modes (recorded in every cache key):
``interpolate`` buffers move with the parameters (they are part of the flat vector);
``keep`` buffers of the reference model (path start, plane origin, first group member);
``recompute`` running statistics re-estimated at each point: reset, cumulative average over
``bn_batches`` batches of ``bn_data`` (default: the evaluation data) in train mode, then eval.

An Evaluator sets the weights of its private module copy in place: use one per thread.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from ..cache.store import Cache, make_key
from .data import DeviceData, check_targets, prepare_data
from ..infra.errors import ConfigError, DataError
from .class_major import ClassMetrics, install_class_major_head
from .input_layer import InputLayerShortcut
from ..space.params import ModelLike, ParameterSpace, vector_digest
from ..space.points import PointSet
from ..results.base import Metrics

ALGORITHM_VERSION = "evaluator-1"
BN_MODES = ("interpolate", "keep", "recompute")
STRATEGIES = ("auto", "loop", "vmap")
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: The loop scores a point's outputs over all batches in one call when they fit in this.
CONCAT_OUTPUT_BYTES = 64 << 20


def resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def per_sample_loss_fn(loss: str | LossFn) -> LossFn:
    """Per-sample loss by name (``cross_entropy``, ``mse``, ``nll``) or a user callable."""
    if callable(loss):
        return loss
    if loss == "cross_entropy":
        return lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    if loss == "nll":
        return lambda out, y: nn.functional.nll_loss(out, y, reduction="none")
    if loss == "mse":
        def mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            if not torch.is_floating_point(y):
                y = nn.functional.one_hot(y, out.shape[-1]).to(out.dtype)
            return ((out - y) ** 2).reshape(out.shape[0], -1).sum(-1)
        return mse
    raise ConfigError(f"unknown loss {loss!r}: use 'cross_entropy', 'mse', 'nll' or a callable "
                      "(outputs, targets) -> per-sample losses")


def loss_identity(loss: str | LossFn) -> str:
    """Name of a loss for fingerprints: a callable's name plus a digest of its code and settings.

    Two different lambdas share a name, so the digest covers the bytecode, constants and
    plain-valued closure variables of functions (also inside ``functools.partial``, with its
    arguments) and the plain-valued attributes of callable objects such as
    ``nn.CrossEntropyLoss(reduction="none")``. Values read from globals are not covered.
    """
    plain = (bool, int, float, str, tuple, type(None))
    if isinstance(loss, str):
        return loss
    target = getattr(loss, "func", loss)
    name = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__qualname__)}"
    h = hashlib.sha256()
    code = getattr(target, "__code__", None)
    if code is not None:
        h.update(code.co_code)
        h.update(repr(code.co_consts).encode())
        cells = [c.cell_contents for c in getattr(target, "__closure__", None) or ()]
        h.update(repr([v for v in cells if isinstance(v, plain)]).encode())
    settings = {k: v for k, v in vars(loss).items() if isinstance(v, plain)
                } if hasattr(loss, "__dict__") and code is None else {}
    h.update(repr((getattr(loss, "args", ()), getattr(loss, "keywords", {}), sorted(settings.items()))).encode())
    return f"{name}:{h.hexdigest()[:12]}"


class Evaluator:
    """Loss and accuracy of points in the parameter space of ``module`` on ``data``."""

    def __init__(self, module: nn.Module, data: Any, *, loss: str | LossFn = "cross_entropy",
                 device: str | torch.device = "auto", bn: str = "interpolate",
                 bn_batches: int | None = None, bn_data: Any = None, dtype: torch.dtype | None = None,
                 cache: str | Cache | None = None, progress: bool | None = None,
                 strategy: str = "auto", chunk_size: int | None = None, batch_size: int | None = None,
                 memory_budget: int | None = None, autocast: torch.dtype | None = None,
                 compile: bool | str = False, backend: Any = None, n_jobs: int | None = None,
                 input_shortcut: bool = True):
        if bn not in BN_MODES:
            raise ConfigError(f"bn must be one of {BN_MODES}, got {bn!r}")
        if strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if not isinstance(module, nn.Module):
            raise ConfigError(f"module must be an nn.Module (the architecture), got {type(module).__name__}")
        self.device = resolve_device(device)
        self.dtype = dtype or torch.float32
        self.space = ParameterSpace(module)
        self.module = copy.deepcopy(module).to(self.device, self.dtype).eval()
        self.loss_name = loss_identity(loss)
        self.per_sample_loss = per_sample_loss_fn(loss)
        self._summed_loss = _summed_cross_entropy if loss == "cross_entropy" else None
        self.bn = bn
        self.data: DeviceData = prepare_data(data, self.device, self.dtype, batch_size)
        self.batches = self.data.batches
        self.num_samples = self.data.num_samples
        self._bn_layers = [name for name, m in self.module.named_modules()
                           if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        self.bn_batches = bn_batches
        self.bn_data = (self.data if bn_data is None
                        else prepare_data(bn_data, self.device, self.dtype, batch_size))
        self._bn_module = self._make_bn_module() if bn == "recompute" and self._bn_layers else None
        self.cache = Cache(cache) if isinstance(cache, (str, bytes)) or hasattr(cache, "__fspath__") else cache
        self.progress = progress
        self.requested_strategy = strategy
        self.strategy: str | None = None if strategy == "auto" else strategy
        self.strategy_reason = "requested" if strategy != "auto" else ""
        self.chunk_size = chunk_size
        self.memory_budget = memory_budget
        self.points_evaluated = 0
        self._fixed = {k: v.to(self.device) for k, v in self.space.fixed.items()}
        if autocast is not None and autocast not in (torch.bfloat16, torch.float16):
            raise ConfigError(f"autocast must be torch.bfloat16, torch.float16 or None, got {autocast!r}")
        if not isinstance(compile, (bool, str)):
            raise ConfigError(f"compile must be True, False or a torch.compile backend name, got {compile!r}")
        self.autocast = autocast
        self.compile = compile
        self.backend = backend  # None: this process; else a landscape.distributed back end
        self.n_jobs = n_jobs
        self._flat: tuple[nn.Module, torch.Tensor, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] | None = None
        self._vmapped: Callable[..., torch.Tensor] | None = None
        self.input_shortcut = input_shortcut
        self._shortcut: InputLayerShortcut | None = None
        self.shortcut_layers: list[str] = []  # input layers expanded in the last evaluate_points
        self.class_major_head: str | None = None  # output layer computed class-major (CPU)
        self._check_data()

    # ------------------------------------------------------------------ basics
    def forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Outputs of the template at ``params`` (state_dict-named tensors), eval mode."""
        return functional_call(self.module, {**self._fixed, **params}, (x,), tie_weights=True)

    def _check_data(self) -> None:
        x, y = self.batches[0]
        template = {k: v.to(self.device, self.dtype) for k, v in self.space.unflatten(
            self.space.flatten(self.module.state_dict(), check_finite=False)).items()}
        try:
            with torch.no_grad():
                out = self.forward(template, x[:2])
        except Exception as exc:  # any shape error of the user's model
            raise DataError(f"the model cannot be applied to inputs of shape {tuple(x.shape[1:])}: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
        for _, yb in self.batches:
            check_targets(out, yb, self.loss_name)
        per_point = self.num_samples * out[0].numel() * out.element_size() if out.ndim else 0
        self._targets = (torch.cat([yb for _, yb in self.batches])
                         if len(self.batches) > 1 and 0 < per_point <= CONCAT_OUTPUT_BYTES else None)
        self._class_metrics = None
        if (self.device.type == "cpu" and self.loss_name == "cross_entropy" and out.ndim == 2
                and not torch.is_floating_point(yb) and self.compile is False
                and per_point <= CONCAT_OUTPUT_BYTES):  # bounds its (C, N) label masks too
            self._class_metrics = ClassMetrics(out.shape[1])
            self._class_metrics.prepare([yb for _, yb in self.batches]
                                        + ([self._targets] if self._targets is not None else []))

    def fingerprint(self) -> dict[str, Any]:
        """Everything about this evaluator that determines a metric value."""
        return {
            "data": self.data.fingerprint, "loss": self.loss_name, "bn": self.bn,
            "bn_batches": self.bn_batches if self.bn == "recompute" else None,
            "bn_data": self.bn_data.fingerprint if self.bn == "recompute" else None,
            "dtype": str(self.dtype), "space": self.space.layout_digest(), "version": ALGORITHM_VERSION,
            **({"autocast": str(self.autocast)} if self.autocast is not None else {}),
        }

    def vector(self, model: ModelLike) -> torch.Tensor:
        """Flat vector of a model-like in this evaluator's space (float64 on CPU)."""
        return self.space.to_vector(model, dtype=torch.float64)

    # -------------------------------------------------------------- public API
    def evaluate(self, models: Sequence[ModelLike] | ModelLike | torch.Tensor) -> Metrics:
        """Loss and accuracy of each model (model-likes, or a (P, D) tensor of flat vectors).

        A single model-like (module, state_dict or path) gives metrics of length one.
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

        With a ``backend`` (``"loky"``, ``"ray"``, ``"dask"``, ...), the missing points are sharded
        over workers by :mod:`landscape.distributed`; this process stays the only cache writer.
        """
        if self.backend is not None:
            from .sharded import evaluate_points_distributed

            return evaluate_points_distributed(self, points, reference=reference, label=label,
                                               backend=self.backend, n_jobs=self.n_jobs)
        n = len(points)
        ref = (reference if reference is not None else points.origin).to(torch.float64)
        key = self.points_key(points, ref)
        if self.cache is not None:
            loss, acc, done = self.cache.points(key, n)
        else:
            loss, acc, done = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool)
        todo = np.flatnonzero(~done)
        if todo.size == 0:
            return loss, acc
        ref_dev = ref.to(self.device, self.dtype)
        bar = self._progress_bar(todo.size, label)
        self._shortcut = self._make_shortcut(points, todo.size)
        try:
            pos = 0
            while pos < todo.size:
                size = self._chunk_size(points)
                run = _contiguous_run(todo, pos, size)
                idx = todo[pos:pos + run]
                try:
                    l, a = self._evaluate_chunk(points, int(idx[0]), int(idx[-1]) + 1, ref_dev)
                except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
                    if run == 1 or not _is_out_of_memory(exc):
                        raise
                    torch.cuda.empty_cache()
                    self.chunk_size = max(1, run // 2)  # retry this chunk in halves
                    continue
                loss[idx], acc[idx] = l, a
                self.points_evaluated += idx.size
                if self.cache is not None:
                    self.cache.add_points(key, n, idx, l, a, {"label": label})
                pos += run
                if bar is not None:
                    bar.update(run)
        finally:
            if self._shortcut is not None:
                self._shortcut.remove()
                self._shortcut = None
            if bar is not None:
                bar.close()
            if self.cache is not None:
                self.cache.flush()
        return loss, acc

    def points_key(self, points: PointSet, reference: torch.Tensor) -> str:
        spec = {"points": points.digest(), **self.fingerprint()}
        if self.bn == "keep" and self.space.has_buffers:
            spec["reference"] = vector_digest(reference[~self.space.param_mask])
        return make_key(spec)

    # --------------------------------------------------------------- internals
    def _progress_bar(self, total: int, label: str):
        show = self.progress if self.progress is not None else sys.stderr.isatty()
        if not show or total < 2:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=label, unit="pt", leave=False)

    def _chunk_size(self, points: PointSet) -> int:
        if self.chunk_size is not None:
            return self.chunk_size
        return self._fitting_chunk(self.strategy or "loop")

    def _fitting_chunk(self, strategy: str) -> int:
        """Points per chunk that fit the memory budget (half the free device memory unless
        ``memory_budget``): flat vectors, plus the activations of every point for vmap."""
        budget = self.memory_budget or _default_budget(self.device)
        per_point = self.space.size * torch.tensor([], dtype=self.dtype).element_size() * 3
        if strategy == "vmap":
            per_point += self._activation_bytes()
        return int(max(1, min(256, budget // max(per_point, 1))))

    def _activation_bytes(self) -> int:
        if not hasattr(self, "_act_bytes"):
            total = 0

            def hook(_m, _i, out):
                nonlocal total
                if isinstance(out, torch.Tensor):
                    total += out.numel() * out.element_size()

            handles = [m.register_forward_hook(hook) for m in self.module.modules()]
            try:
                with torch.no_grad():
                    x = max(self.batches, key=lambda b: len(b[0]))[0]
                    self.module(x)
            finally:
                for h in handles:
                    h.remove()
            self._act_bytes = 2 * total
        return self._act_bytes

    def _evaluate_chunk(self, points: PointSet, start: int, stop: int, ref: torch.Tensor
                        ) -> tuple[np.ndarray, np.ndarray]:
        vecs = self._apply_bn_mode(points.chunk(start, stop, self.device, self.dtype), ref)
        coeffs = points.coeffs[start:stop].tolist()
        if self.strategy is None:
            return self._autotune(vecs, coeffs)
        return self._run(vecs, coeffs, self.strategy)

    def _make_shortcut(self, points: PointSet, todo: int) -> InputLayerShortcut | None:
        """The input-layer expansion (:mod:`landscape.input_layer`) for the loop over
        ``points``, when enabled, applicable (no autocast or compile) and worth its set-up."""
        k = points.directions.shape[0]
        self.shortcut_layers = []
        if (not self.input_shortcut or self.strategy == "vmap" or self.autocast is not None
                or self.compile is not False or todo < 4 * (k + 1)):
            return None
        module, _, _ = self._flat_module()
        shortcut = InputLayerShortcut(module, self.space, self.batches, points.origin, points.directions,
                                      (self.memory_budget or _default_budget(self.device)) // 4)
        self.shortcut_layers = list(shortcut.layers)
        return shortcut if shortcut.active else None

    def _run(self, vecs: torch.Tensor, coeffs: list[list[float]], strategy: str) -> tuple[np.ndarray, np.ndarray]:
        amp = (torch.autocast(self.device.type, dtype=self.autocast) if self.autocast is not None
               else contextlib.nullcontext())
        with torch.no_grad(), amp:
            sums = self._sums_loop(vecs, coeffs) if strategy == "loop" else self._sums_vmap(vecs)
        host = sums.double().cpu().numpy()  # the one synchronisation per chunk
        return host[:, 0] / self.num_samples, host[:, 1] / self.num_samples

    def _autotune(self, vecs: torch.Tensor, coeffs: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
        if self.device.type == "cpu":
            self.strategy, self.strategy_reason = "loop", "cpu: vmap measured slower than a loop on CPU"
            return self._run(vecs, coeffs, "loop")
        return self._measure_strategies(vecs, coeffs)

    def _measure_strategies(self, vecs: torch.Tensor, coeffs: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
        """Time loop and vmap per point on the first ``n`` points (``n``: what vmap fits in
        memory), keep the faster, and return the metrics of ``vecs`` computed with it."""
        n = min(len(vecs), self._fitting_chunk("vmap"))  # vmap holds n points' activations
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
        parts = [self._run(vecs[i:i + step], coeffs[i:i + step], self.strategy) for i in range(0, len(vecs), step)]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _flat_module(self) -> tuple[nn.Module, torch.Tensor, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
        """(private module, its flat state tensor, ``step(x, y)`` -> (summed loss, correct) of a
        batch at the current state), built once; with ``compile`` the step is one compiled
        graph (forward and metrics fused).

        Every floating-point parameter and buffer of the copy is a view into the flat tensor
        (layout of ``self.space``); tied weights stay one Parameter; integer buffers are the
        template's. Setting a point is ``flat.copy_(vec)``."""
        if self._flat is None:
            module = copy.deepcopy(self.module).eval()
            flat = torch.zeros(self.space.size, device=self.device, dtype=self.dtype)
            tensors: dict[str, torch.Tensor] = {}
            for e in self.space.entries:
                view = flat[e.offset:e.offset + e.numel].view(e.shape)
                tensors[e.name] = nn.Parameter(view, requires_grad=False) if e.kind == "parameter" else view
            for name in [*tensors, *self.space.aliases]:
                tensor = tensors[self.space.aliases.get(name, name)]
                owner, _, attr = name.rpartition(".")
                sub = module.get_submodule(owner)
                if attr in sub._parameters:
                    sub._parameters[attr] = tensor
                else:
                    sub._buffers[attr] = tensor
            if self._class_metrics is not None:  # CPU, cross-entropy, eager
                self.class_major_head = install_class_major_head(module, self.batches[0][0][:2])

            def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return torch.stack(self._batch_metrics(module(x), y, class_major=self.compile is False))

            self._flat = (module, flat, self._maybe_compile(step))
        return self._flat

    def _maybe_compile(self, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        if self.compile is False:
            return fn
        return torch.compile(fn, **({} if self.compile is True else {"backend": self.compile}))

    def _batch_metrics(self, logits: torch.Tensor, y: torch.Tensor, class_major: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed loss in float64, number correct) of one batch; logits in the evaluation dtype.
        ``class_major`` (the eager loop): scored by :class:`ClassMetrics` where it applies."""
        logits = logits.to(self.dtype)
        if class_major and self._class_metrics is not None:
            scored = self._class_metrics(logits, y)
            if scored is not None:
                return scored
        if self._summed_loss is not None:
            return self._summed_loss(logits, y), _correct(logits, y)
        return self.per_sample_loss(logits, y).sum(dtype=torch.float64), _correct(logits, y)

    def _sums_loop(self, vecs: torch.Tensor, coeffs: list[list[float]]) -> torch.Tensor:
        """Per point: one ``copy_`` into the flat module (and its coefficients to the
        input-layer shortcut), forward passes over all batches; the outputs of a point are
        concatenated and scored at once when they are small (``CONCAT_OUTPUT_BYTES``; eager
        only), else batch by batch. No host synchronisation."""
        module, flat, step = self._flat_module()
        if self.class_major_head is not None and (self._targets is not None or len(self.batches) == 1):
            return self._sums_class_major(module, flat, vecs, coeffs)
        concat = self._targets is not None and self.compile is False
        sums: list[torch.Tensor] = []
        for vec, c in zip(vecs, coeffs):
            self._set_point(flat, vec, c)
            if concat:
                sums.append(torch.stack(self._batch_metrics(self._concat_outputs(module), self._targets,
                                                            class_major=True)))
            else:
                sums.extend(step(x, y) for x, y in self.batches)
        return torch.stack(sums).view(len(vecs), -1, 2).sum(1)

    def _set_point(self, flat: torch.Tensor, vec: torch.Tensor, coeffs: list[float]) -> None:
        flat.copy_(vec)
        if self._shortcut is not None:
            self._shortcut.set(coeffs)

    def _sums_class_major(self, module: nn.Module, flat: torch.Tensor, vecs: torch.Tensor,
                          coeffs: list[list[float]]) -> torch.Tensor:
        """The loop with a class-major output layer: the ``(C, N)`` logits of up to
        ``CONCAT_OUTPUT_BYTES`` worth of points are stacked and scored by one
        :meth:`ClassMetrics.scores` call; points with non-finite losses are rescored
        row-major (the usual NaN and infinity semantics)."""
        y = self._targets if self._targets is not None else self.batches[0][1]
        per_point = self._class_metrics.num_classes * y.shape[0] * torch.finfo(self.dtype).bits // 8
        group = max(1, CONCAT_OUTPUT_BYTES // per_point)
        parts: list[torch.Tensor] = []
        for start in range(0, len(vecs), group):
            cols = []
            for vec, c in zip(vecs[start:start + group], coeffs[start:start + group]):
                self._set_point(flat, vec, c)
                outs = [module(x).t() for x, _ in self.batches]  # (C, n) views, contiguous from the head
                cols.append(outs[0] if len(outs) == 1 else torch.cat(outs, 1))
            stacked = torch.stack(cols).to(self.dtype)
            scores = self._class_metrics.scores(stacked, y)
            for j in torch.nonzero(~torch.isfinite(scores[:, 0])).flatten().tolist():
                scores[j] = torch.stack(self._batch_metrics(stacked[j].t(), y))
            parts.append(scores)
        return torch.cat(parts)

    def _concat_outputs(self, module: nn.Module) -> torch.Tensor:
        """Outputs of every batch as one tensor, class-major when :class:`ClassMetrics` scores them."""
        if self._class_metrics is not None:
            return torch.cat([module(x).t() for x, _ in self.batches], 1).t()
        return torch.cat([module(x) for x, _ in self.batches])

    def _sums_vmap(self, vecs: torch.Tensor) -> torch.Tensor:
        if self._vmapped is None:
            def metrics(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                return torch.stack(self._batch_metrics(self.forward(p, x), y))

            self._vmapped = self._maybe_compile(vmap(metrics, in_dims=(0, None, None)))
        params = self.space.unflatten(vecs)
        out = torch.zeros(len(vecs), 2, device=self.device, dtype=torch.float64)
        for x, y in self.batches:
            out += self._vmapped(params, x, y)
        return out

    def _apply_bn_mode(self, vecs: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        if not self.space.has_buffers or self.bn == "interpolate":
            return vecs
        buffers = ~self.space.param_mask.to(self.device)
        vecs = vecs.clone()
        vecs[:, buffers] = ref[buffers]
        if self.bn == "recompute" and self._bn_module is not None:
            for i in range(len(vecs)):
                vecs[i] = self._recompute_bn(vecs[i])
        return vecs

    def _make_bn_module(self) -> nn.Module:
        module = copy.deepcopy(self.module).eval()
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.train()
                m.momentum = None  # cumulative average over the given batches
        return module

    def _recompute_bn(self, vec: torch.Tensor) -> torch.Tensor:
        """Re-estimate BN running statistics at ``vec`` (reset, cumulative average, eval)."""
        state = {k: v.clone() for k, v in self.space.unflatten(vec).items()}
        state.update({k: v.clone() for k, v in self._fixed.items()})
        for layer in self._bn_layers:
            state[f"{layer}.running_mean"].zero_()
            state[f"{layer}.running_var"].fill_(1.0)
            if f"{layer}.num_batches_tracked" in state:
                state[f"{layer}.num_batches_tracked"].zero_()
        batches = self.bn_data.batches if self.bn_batches is None else self.bn_data.batches[:self.bn_batches]
        with torch.no_grad():
            for x, _ in batches:
                functional_call(self._bn_module, state, (x,), tie_weights=True)
        return self.space.flatten(state, dtype=self.dtype, check_finite=False).to(self.device)


def _correct(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if torch.is_floating_point(y) or logits.ndim < 2:
        return torch.full((), float("nan"), dtype=torch.float64, device=logits.device)
    return (logits.argmax(-1) == y).sum().double()  # integer count, then one cast (cheaper on CPU)


def _summed_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sum of per-sample cross-entropies of one batch, reduced inside the kernel in the
    evaluation dtype (ATen's pairwise summation), then float64: on CPU about a third
    cheaper than per-sample losses summed in float64, same value to float rounding."""
    return nn.functional.cross_entropy(logits, y, reduction="sum").double()


def _is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA (and CPU allocator) out-of-memory errors."""
    text = str(exc)
    return (isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text
            or "can't allocate memory" in text)


def _contiguous_run(todo: np.ndarray, pos: int, size: int) -> int:
    """Length (<= size) of the run of consecutive indices starting at ``todo[pos]``."""
    run = 1
    while run < size and pos + run < todo.size and todo[pos + run] == todo[pos] + run:
        run += 1
    return run


def _default_budget(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.5)
    return 1 << 30
