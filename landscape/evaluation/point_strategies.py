"""The two ways of computing the summed metrics of a chunk of points: a loop and ``vmap``.

* :class:`LoopStrategy` -- one point at a time through a private copy of the template whose
  parameters and buffers are views into one flat tensor: a point is set with a single
  ``copy_`` and the module is called directly, so a point costs about as much as plain forward
  passes (``functional_call`` per batch cost about 2x that for a small MLP on CPU). On CPU with
  cross-entropy the output ``Linear`` returns class-major logits scored along the samples
  (:mod:`~landscape.evaluation.class_major_scoring`); the input-layer expansion
  (:mod:`~landscape.evaluation.input_layer_shortcut`) plugs into the same copy.
* :class:`VmapStrategy` -- a chunk of stacked points at once through ``torch.func.vmap`` over
  ``functional_call``: much faster for small models on a GPU, slower on CPU.

Both return a ``(P, 2)`` float64 tensor of per-point (summed loss, number correct) on the
device, without synchronising with the host.
"""
from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
from torch import nn
from torch.func import vmap

from ..infra.errors import ConfigError
from ..space.params import ParameterSpace
from ..space.subsets import entries_at
from .class_major_scoring import install_class_major_head
from .input_layer_shortcut import InputLayerShortcut
from .inputs import ModelInputs, call_model
from .options import OutputSelector
from .scoring import Scorer, select_output

#: The loop scores a point's outputs over all batches in one call when they fit in this.
CONCAT_OUTPUT_BYTES = 64 << 20
#: Class-major logits of several points are stacked and scored together up to this size: large
#: enough that a digits point set (72 kB a point) needs a few dozen scoring calls, small enough
#: that the stack and the scoring's temporaries stay in cache and are never ``mmap``-sized fresh
#: allocations (a 31 MB stack streamed its temporaries through memory and made the plane's time
#: depend on the C allocator's state: up to 2.5x slower in some processes).
CLASS_MAJOR_GROUP_BYTES = 1 << 20
Batches = Sequence[tuple[ModelInputs, torch.Tensor]]


def maybe_compile(fn: Callable[..., torch.Tensor], compile: bool | str) -> Callable[..., torch.Tensor]:
    """``torch.compile(fn)`` when asked (``True`` or a backend name), else ``fn``.

    Parameters
    ----------
    fn
        The function to compile.
    compile
        ``False`` (no compilation), ``True`` (default backend) or a backend name.

    Returns
    -------
    callable
        The compiled function, or ``fn`` itself.
    """
    if compile is False:
        return fn
    return torch.compile(fn, **({} if compile is True else {"backend": compile}))


class LoopStrategy:
    """Per-point evaluation through a flat-view copy of the template.

    Parameters
    ----------
    template
        The evaluator's private template copy (eval mode, on the device).
    space
        Its parameter space.
    batches
        Device-resident ``(x, y)`` batches.
    scorer
        Scores a batch of outputs.
    targets
        All targets concatenated when a point's outputs are small enough to score at once
        (``CONCAT_OUTPUT_BYTES``), else ``None``.
    output
        Selector of the logits in the model's output.
    compile
        ``torch.compile`` the per-batch step (``True`` or a backend name).
    """

    def __init__(self, template: nn.Module, space: ParameterSpace, batches: Batches, scorer: Scorer,
                 targets: torch.Tensor | None, output: OutputSelector, compile: bool | str):
        self.space = space
        self.batches = batches
        self.scorer = scorer
        self.targets = targets
        self.output = output
        self.compile = compile
        self.module, self.flat = self._flat_copy(template, space)
        self.class_major_head: str | None = None
        if scorer.class_metrics is not None and compile is False and output is None:
            self.class_major_head = install_class_major_head(self.module, batches[0][0][:2])
        self.shortcut: InputLayerShortcut | None = None
        self.index: torch.Tensor | None = None  # the subset the current points move (set by sums)

        def step(x: ModelInputs, y: torch.Tensor) -> torch.Tensor:
            return torch.stack(self.scorer(self.outputs(x), y, class_major=self.compile is False))

        self.step = maybe_compile(step, compile)

    @staticmethod
    def _flat_copy(template: nn.Module, space: ParameterSpace) -> tuple[nn.Module, torch.Tensor]:
        """A copy whose floating-point parameters and buffers are views into one flat tensor (layout of ``space``).

        Tied weights stay one Parameter; integer buffers are the template's.
        """
        module = copy.deepcopy(template).eval()
        ref = next(iter(template.state_dict().values()), torch.zeros(()))
        flat = torch.zeros(space.size, device=ref.device, dtype=_float_dtype(template))
        tensors: dict[str, torch.Tensor] = {}
        for e in space.entries:
            view = e.view(flat)
            tensors[e.name] = nn.Parameter(view, requires_grad=False) if e.kind == "parameter" else view
        for name in [*tensors, *space.aliases]:
            tensor = tensors[space.aliases.get(name, name)]
            owner, _, attr = name.rpartition(".")
            sub = module.get_submodule(owner)
            setattr(sub, attr, tensor)  # replaces the parameter or buffer of that name in place
        return module, flat

    def outputs(self, x: ModelInputs) -> torch.Tensor:
        """The logits of the current point on inputs ``x``.

        Parameters
        ----------
        x
            A batch of model inputs on the device (a tensor, or a tuple or dict of tensors).

        Returns
        -------
        torch.Tensor
            The selected output (see :func:`~landscape.evaluation.scoring.select_output`).
        """
        return select_output(call_model(self.module, x), self.output)

    def sums(self, vecs: torch.Tensor, coeffs: list[list[float]], index: torch.Tensor | None = None
             ) -> torch.Tensor:
        """Per-point (summed loss, correct) of ``vecs``.

        Parameters
        ----------
        vecs
            ``(P, D)`` flat vectors on the device, in the evaluation dtype; with ``index``,
            ``(P, S)``: the entries at ``index`` only, the rest of every point being the base
            set by :meth:`set_base`.
        coeffs
            Each point's coefficients over the point set's directions (for the input-layer
            shortcut).
        index
            Positions of a parameter subset (None: full vectors).

        Returns
        -------
        torch.Tensor
            ``(P, 2)`` float64.
        """
        self.index = index
        if self.class_major_head is not None and (self.targets is not None or len(self.batches) == 1):
            return self._sums_class_major(vecs, coeffs)
        concat = self.targets is not None and self.compile is False
        sums: list[torch.Tensor] = []
        for vec, c in zip(vecs, coeffs):
            self.set_point(vec, c)
            if concat:
                outs = torch.cat([self.outputs(x) for x, _ in self.batches])
                sums.append(torch.stack(self.scorer(outs, self.targets)))
            else:
                sums.extend(self.step(x, y) for x, y in self.batches)
        return torch.stack(sums).view(len(vecs), -1, 2).sum(1)

    def set_base(self, base: torch.Tensor) -> None:
        """Load the full vector that subset points (``sums(..., index=...)``) change at their index only.

        Parameters
        ----------
        base
            ``(D,)`` on the device, in the evaluation dtype.
        """
        self.flat.copy_(base)

    def set_point(self, vec: torch.Tensor, coeffs: list[float]) -> None:
        """Load a point into the flat copy (and its coefficients into the input-layer shortcut).

        Parameters
        ----------
        vec
            The point's flat vector on the device, in the evaluation dtype (its subset
            entries when :meth:`sums` was given an index).
        coeffs
            Its coefficients over the point set's directions.
        """
        if self.index is None:
            self.flat.copy_(vec)
        else:
            self.flat.index_copy_(0, self.index, vec)
        if self.shortcut is not None:
            self.shortcut.set(coeffs)

    def _sums_class_major(self, vecs: torch.Tensor, coeffs: list[list[float]]) -> torch.Tensor:
        """The loop with a class-major output layer.

        The ``(C, N)`` logits of up to ``CLASS_MAJOR_GROUP_BYTES`` worth of points are stacked
        and scored by one ``ClassMetrics.scores`` call; points with non-finite losses are
        rescored row-major (the usual NaN and infinity semantics).
        """
        metrics = self.scorer.class_metrics
        y = self.targets if self.targets is not None else self.batches[0][1]
        per_point = metrics.num_classes * y.shape[0] * torch.finfo(self.scorer.dtype).bits // 8
        group = max(1, CLASS_MAJOR_GROUP_BYTES // per_point)
        parts: list[torch.Tensor] = []
        for start in range(0, len(vecs), group):
            cols = []
            for vec, c in zip(vecs[start:start + group], coeffs[start:start + group]):
                self.set_point(vec, c)
                outs = [self.module(x).t() for x, _ in self.batches]  # (C, n) views from the head
                cols.append(outs[0] if len(outs) == 1 else torch.cat(outs, 1))
            stacked = torch.stack(cols).to(self.scorer.dtype)
            scores = metrics.scores(stacked, y)
            for j in torch.nonzero(~torch.isfinite(scores[:, 0])).flatten().tolist():
                scores[j] = torch.stack(self.scorer(stacked[j].t(), y))
            parts.append(scores)
        return torch.cat(parts)


class VmapStrategy:
    """A chunk of points at once: ``vmap`` over ``functional_call``.

    Parameters
    ----------
    forward
        ``forward(params, x) -> logits`` with ``params`` keyed like the template's state_dict
        (``x`` a tensor, or a tuple or dict of tensors).
    space
        The parameter space (to unflatten stacked vectors).
    batches
        Device-resident ``(x, y)`` batches.
    scorer
        Scores a batch of outputs.
    compile
        ``torch.compile`` the vmapped metrics (``True`` or a backend name).
    """

    def __init__(self, forward: Callable[[dict[str, torch.Tensor], ModelInputs], torch.Tensor],
                 space: ParameterSpace, batches: Batches, scorer: Scorer, compile: bool | str):
        self.space = space
        self.batches = batches

        def metrics(p: dict[str, torch.Tensor], fixed: dict[str, torch.Tensor], x: ModelInputs,
                    y: torch.Tensor) -> torch.Tensor:
            return torch.stack(scorer(forward({**fixed, **p}, x), y))

        self.vmapped = maybe_compile(vmap(metrics, in_dims=(0, None, None, None)), compile)

    def sums(self, vecs: torch.Tensor) -> torch.Tensor:
        """Per-point (summed loss, correct) of ``(P, D)`` device vectors, as ``(P, 2)`` float64.

        Parameters
        ----------
        vecs
            ``(P, D)`` flat vectors on the device, in the evaluation dtype.

        Returns
        -------
        torch.Tensor
            ``(P, 2)`` float64 sums over all batches.
        """
        return self._sums(self.space.unflatten(vecs), {}, len(vecs), vecs.device)

    def subset_sums(self, moving: torch.Tensor, base: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Per-point (summed loss, correct) of subset points: only the subset's tensors are stacked.

        Parameters
        ----------
        moving
            ``(P, S)`` the points' entries at ``index`` (whole tensors of the space).
        base
            ``(D,)`` every point's value elsewhere.
        index
            ``(S,)`` positions of the subset in the flat vector.

        Returns
        -------
        torch.Tensor
            ``(P, 2)`` float64 sums over all batches.
        """
        stacked = {e.name: moving[:, start:start + e.numel].reshape(len(moving), *e.shape)
                   for e, start in entries_at(self.space, index)}
        fixed = {k: v for k, v in self.space.unflatten(base).items() if k not in stacked}
        return self._sums(stacked, fixed, len(moving), moving.device)

    def _sums(self, stacked: dict[str, torch.Tensor], fixed: dict[str, torch.Tensor], count: int,
              device: torch.device) -> torch.Tensor:
        out = torch.zeros(count, 2, device=device, dtype=torch.float64)
        for x, y in self.batches:
            out += self.vmapped(stacked, fixed, x, y)
        return out


def private_copy(module: nn.Module) -> nn.Module:
    """A deep copy of the user's template, with a clear error for modules that cannot be copied.

    Parameters
    ----------
    module
        The user's template module (never modified).

    Returns
    -------
    nn.Module
        The copy.

    Raises
    ------
    ConfigError
        The module cannot be deep-copied (for example the deprecated ``weight_norm``).
    """
    try:
        return copy.deepcopy(module)
    except RuntimeError as exc:
        if "weight_norm" in str(exc) or any(hasattr(m, "weight_g") for m in module.modules()):
            raise ConfigError("the model uses the deprecated torch.nn.utils.weight_norm, which cannot be "
                              "copied; re-create it with torch.nn.utils.parametrizations.weight_norm") from None
        raise ConfigError(f"the model cannot be copied (copy.deepcopy failed: {exc}); the evaluator "
                          "needs a private copy of the template") from None


def _float_dtype(module: nn.Module) -> torch.dtype:
    for t in module.state_dict().values():
        if torch.is_floating_point(t):
            return t.dtype
    return torch.float32
