"""How an evaluator computes a chunk of points.

Runs sized by memory and time, the loop or vmap strategy (chosen by device or by timing), the
input-layer shortcut, and out-of-memory retries.

:class:`ChunkRunner` belongs to one :class:`~landscape.evaluation.evaluator.Evaluator` and reads
its public attributes (device, dtype, space, batches, scorer, options, BatchNorm modes).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import numpy as np
import torch

from ..space.points import PointSet
from .input_layer_shortcut import InputLayerShortcut
from .memory import default_budget, is_out_of_memory
from .point_filling import contiguous_run
from .point_strategies import LoopStrategy, VmapStrategy


class ChunkRunner:
    """Computes runs of missing points for an evaluator.

    Parameters
    ----------
    evaluator
        The evaluator (its options decide the strategy, chunk sizes and shortcuts).
    targets
        All targets concatenated, when the loop scores a point's outputs at once.

    Attributes
    ----------
    strategy
        ``"loop"``, ``"vmap"`` or None until ``auto`` has chosen.
    strategy_reason
        Why that strategy (requested, the device, or the measured times).
    shortcut_layers
        Input layers expanded in the last evaluation.
    """

    def __init__(self, evaluator: Any, targets: torch.Tensor | None):
        self.ev = evaluator
        self.targets = targets
        requested = evaluator.options.strategy
        self.strategy: str | None = None if requested == "auto" else requested
        self.strategy_reason = "requested" if requested != "auto" else ""
        self.shortcut_layers: list[str] = []
        self._loop: LoopStrategy | None = None
        self._vmap: VmapStrategy | None = None
        self._shortcut: InputLayerShortcut | None = None
        self._subset_base: torch.Tensor | None = None

    @property
    def loop(self) -> LoopStrategy:
        """The loop strategy (its flat-view module copy), built on first use."""
        if self._loop is None:
            ev = self.ev
            self._loop = LoopStrategy(ev.module, ev.space, ev.batches, ev.scorer, self.targets,
                                      ev.options.output, ev.options.compile)
        return self._loop

    def runs(self, points: PointSet, todo: np.ndarray, ref: torch.Tensor, input_shortcut: bool | None = None
             ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``(indices, loss, accuracy)`` for runs of the missing points ``todo``.

        Parameters
        ----------
        points
            The point set.
        todo
            Sorted indices of the points to compute.
        ref
            The reference point on the device (for ``bn="keep"``).
        input_shortcut
            Use the input-layer shortcut (None: :meth:`plans_shortcut` of ``points``).

        Yields
        ------
        tuple of numpy.ndarray
        """
        wanted = self.plans_shortcut(points) if input_shortcut is None else input_shortcut
        self.shortcut_layers = []
        self._shortcut = self._make_shortcut(points) if wanted else None
        self._subset_base = None  # a subset's full base, built once per evaluation
        try:
            yield from self._runs(points, todo, ref)
        finally:
            self._subset_base = None
            if self._shortcut is not None:
                self._shortcut.remove()
                self._shortcut = None
            if self._loop is not None:
                self._loop.shortcut = None

    def _runs(self, points: PointSet, todo: np.ndarray, ref: torch.Tensor
                      ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Runs of consecutive missing points, each small enough to fit memory and time.

        Small enough to fit memory and, for the loop, to finish within ``flush_interval``
        seconds (measured on the previous run).
        """
        pos, per_point = 0, None
        while pos < todo.size:
            size = self.ev.chunk_size or self.ev.chunk_limit(self.strategy or "loop")
            if self.strategy != "vmap" and self.ev.chunk_size is None:
                size = min(size, 4 if per_point is None else max(1, int(self.ev.options.flush_interval / per_point)))
            run = contiguous_run(todo, pos, size)
            idx = todo[pos:pos + run]
            start = time.perf_counter()
            try:
                loss, acc = self._evaluate_chunk(points, int(idx[0]), int(idx[-1]) + 1, ref)
            except (torch.cuda.OutOfMemoryError, RuntimeError) as exc:
                if run == 1 or not is_out_of_memory(exc):
                    raise
                torch.cuda.empty_cache()
                self.ev.chunk_size = max(1, run // 2)  # retry this chunk in halves
                continue
            per_point = max((time.perf_counter() - start) / run, 1e-6)
            pos += run
            yield idx, loss, acc

    def _evaluate_chunk(self, points: PointSet, start: int, stop: int, ref: torch.Tensor
                        ) -> tuple[np.ndarray, np.ndarray]:
        ev = self.ev
        coeffs = points.coeffs[start:stop].tolist()
        if self.strategy is None and ev.device.type == "cpu":
            self.strategy, self.strategy_reason = "loop", "cpu: vmap measured slower than a loop on CPU"
        if self.moves_subset_only(points):
            if self._subset_base is None:
                self._subset_base = ev.batchnorm.apply(points.origin.to(ev.device, ev.dtype).unsqueeze(0), ref)[0]
            base = self._subset_base
            index = points.index.to(ev.device)  # type: ignore[union-attr]
            if self.strategy == "loop":
                self.loop.set_base(base)
            return self._run(points.moving(start, stop, ev.device, ev.dtype), coeffs, self.strategy, index, base)
        vecs = ev.batchnorm.apply(points.chunk(start, stop, ev.device, ev.dtype), ref)
        if self.strategy is None:
            return self.measure_strategies(vecs, coeffs)
        return self._run(vecs, coeffs, self.strategy)

    def moves_subset_only(self, points: PointSet) -> bool:
        """Whether the loop can keep one full base and write each point's subset entries only.

        True for a parameter subset's points once the strategy is chosen (the loop, or ``vmap``
        without ``torch.compile``) when the BatchNorm mode sets no buffer per point (buffers
        outside the subset are then the base's for every point): memory and time then scale with
        the subset, not the model.

        Parameters
        ----------
        points
            The point set.

        Returns
        -------
        bool
        """
        bn = self.ev.batchnorm
        chosen = self.strategy == "loop" or (self.strategy == "vmap" and self.ev.options.compile is False)
        if points.index is None or not chosen or bn.train_module is not None:
            return False
        return not (bn.active and bool((~self.ev.space.param_mask[points.index]).any()))

    def plans_shortcut(self, points: PointSet) -> bool:
        """Whether the input-layer expansion is worth its set-up for ``points``.

        Enabled, applicable (loop strategy, tensor inputs, no autocast, compile or output
        selector, full-size directions rather than a parameter subset's) and at least
        ``4 (k + 1)`` points. Decided from the whole set, never from which of its
        points are missing, so an interrupted, resumed or sharded evaluation computes every
        point on the same code path as an uninterrupted one (bit-identical results).

        Parameters
        ----------
        points
            The whole point set.

        Returns
        -------
        bool
        """
        opts = self.ev.options
        k = points.directions.shape[0]
        return bool(opts.input_shortcut and self.strategy != "vmap" and opts.autocast is None and points.index is None
                    and isinstance(self.ev.batches[0][0], torch.Tensor)
                    and opts.compile is False and opts.output is None and len(points) >= 4 * (k + 1))

    def _make_shortcut(self, points: PointSet) -> InputLayerShortcut | None:
        """The input-layer expansion for the loop over ``points`` (None when no layer qualifies)."""
        loop = self.loop
        shortcut = InputLayerShortcut(loop.module, self.ev.space, self.ev.batches, points.origin, points.directions,
                                      (self.ev.memory_budget or default_budget(self.ev.device)) // 4)
        self.shortcut_layers = list(shortcut.layers)
        if not shortcut.active:
            return None
        loop.shortcut = shortcut
        return shortcut

    def _run(self, vecs: torch.Tensor, coeffs: list[list[float]], strategy: str,
             index: torch.Tensor | None = None, base: torch.Tensor | None = None) -> tuple[np.ndarray, np.ndarray]:
        autocast = self.ev.options.autocast
        amp = (torch.autocast(self.ev.device.type, dtype=autocast) if autocast is not None
               else contextlib.nullcontext())
        with torch.no_grad(), amp:
            if strategy == "loop":
                sums = self.loop.sums(vecs, coeffs, index)
            else:
                if self._vmap is None:
                    ev = self.ev
                    self._vmap = VmapStrategy(ev.forward, ev.space, ev.batches, ev.scorer, ev.options.compile)
                sums = self._vmap.sums(vecs) if index is None else self._vmap.subset_sums(vecs, base, index)
        host = sums.double().cpu().numpy() / self.ev.num_targets  # the one synchronisation per chunk
        return host[:, 0], self.ev.scorer.metric.finish(host[:, 0], host[:, 1])

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
        n = min(len(vecs), self.ev.chunk_limit("vmap"))  # vmap holds n points' activations
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
