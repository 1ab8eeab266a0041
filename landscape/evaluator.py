"""The evaluation engine: loss and accuracy of many points in parameter space.

The template module is copied once (the user's module is never touched) and called with
``torch.func.functional_call``. Data stay on the device; per-point sums of losses and
correct predictions are accumulated on the device and moved to the host once per chunk.
Losses are sums over samples divided by the sample count.

Strategies: ``loop`` (one point at a time, all batches) and ``vmap`` (a chunk of stacked
points at once). ``auto`` uses the loop on CPU (vmap is measured 2.5-5x slower there) and
times both on the first chunk elsewhere; the choice is recorded in ``strategy`` and
``strategy_reason``.

BatchNorm modes (recorded in every cache key):
``interpolate`` buffers move with the parameters (they are part of the flat vector);
``keep`` buffers of the reference model (path start, plane origin, first group member);
``recompute`` running statistics re-estimated at each point: reset, cumulative average over
``bn_batches`` batches of ``bn_data`` (default: the evaluation data) in train mode, then eval.
"""
from __future__ import annotations

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

from .cache import Cache, make_key
from .data import DeviceData, check_targets, prepare_data
from .errors import ConfigError, DataError
from .params import ModelLike, ParameterSpace, vector_digest
from .points import PointSet
from .results import Metrics

ALGORITHM_VERSION = "evaluator-1"
BN_MODES = ("interpolate", "keep", "recompute")
STRATEGIES = ("auto", "loop", "vmap")
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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
                 memory_budget: int | None = None):
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

    def fingerprint(self) -> dict[str, Any]:
        """Everything about this evaluator that determines a metric value."""
        return {
            "data": self.data.fingerprint, "loss": self.loss_name, "bn": self.bn,
            "bn_batches": self.bn_batches if self.bn == "recompute" else None,
            "bn_data": self.bn_data.fingerprint if self.bn == "recompute" else None,
            "dtype": str(self.dtype), "space": self.space.layout_digest(), "version": ALGORITHM_VERSION,
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
        """Metrics of every point; cached points are read, missing ones computed chunk by chunk."""
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
        try:
            pos = 0
            while pos < todo.size:
                size = self._chunk_size(points)
                run = _contiguous_run(todo, pos, size)
                idx = todo[pos:pos + run]
                try:
                    l, a = self._evaluate_chunk(points, int(idx[0]), int(idx[-1]) + 1, ref_dev)
                except torch.cuda.OutOfMemoryError:
                    if run == 1:
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
        budget = self.memory_budget or _default_budget(self.device)
        per_point = self.space.size * torch.tensor([], dtype=self.dtype).element_size() * 3
        if self.strategy == "vmap":
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
        if self.strategy is None:
            return self._autotune(vecs)
        return self._run(vecs, self.strategy)

    def _run(self, vecs: torch.Tensor, strategy: str) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            sums = self._sums_loop(vecs) if strategy == "loop" else self._sums_vmap(vecs)
        host = sums.double().cpu().numpy()  # the one synchronisation per chunk
        return host[:, 0] / self.num_samples, host[:, 1] / self.num_samples

    def _autotune(self, vecs: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        if self.device.type == "cpu":
            self.strategy, self.strategy_reason = "loop", "cpu: vmap measured slower than a loop on CPU"
            return self._run(vecs, "loop")
        timings = {}
        result = None
        for strategy in ("loop", "vmap"):
            self._run(vecs[:1], strategy)  # warm-up
            torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            result = self._run(vecs, strategy)
            timings[strategy] = time.perf_counter() - t0
        self.strategy = min(timings, key=timings.get)
        self.strategy_reason = "measured on first chunk: " + ", ".join(
            f"{k} {v * 1e3:.1f} ms" for k, v in timings.items())
        return result

    def _sums_loop(self, vecs: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(len(vecs), 2, device=self.device, dtype=torch.float64)
        for i, vec in enumerate(vecs):
            params = self.space.unflatten(vec)
            for x, y in self.batches:
                logits = self.forward(params, x)
                out[i, 0] += self.per_sample_loss(logits, y).sum(dtype=torch.float64)
                out[i, 1] += _correct(logits, y)
        return out

    def _sums_vmap(self, vecs: torch.Tensor) -> torch.Tensor:
        params = self.space.unflatten(vecs)
        out = torch.zeros(len(vecs), 2, device=self.device, dtype=torch.float64)

        def metrics(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = self.forward(p, x)
            return torch.stack([self.per_sample_loss(logits, y).sum(dtype=torch.float64),
                                _correct(logits, y)])

        batched = vmap(metrics, in_dims=(0, None, None))
        for x, y in self.batches:
            out += batched(params, x, y)
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
    return (logits.argmax(-1) == y).sum(dtype=torch.float64)


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
