"""Exact shortcut for the layer that reads the data: its output is affine in the weights.

A point of a path or plane is ``origin + sum_k c_k d_k``. A ``Linear`` or ``Conv`` layer that
is applied to the input batch itself (or a reshaped view of it, e.g. after ``Flatten``) gives

    layer(x; W_o + sum_k c_k W_k, b_o + sum_k c_k b_k) = layer(x; W_o, b_o) + sum_k c_k layer(x; W_k, b_k)

so its ``k + 1`` outputs per batch are computed once per point set and a point costs at most
``k`` scaled additions over the layer's output instead of its matrix product or convolution
(the same value to float rounding). Every point writes its output into the same buffer per
batch (unless the module's output or a hook could keep it), so the loop allocates no new
sample x unit matrix for the layer: a fresh allocation of that size is served by ``mmap``
when the C allocator's threshold is below it, and every point would pay page faults on it.
The sum over all but the first direction is kept while it
stays the same, so along a plane's rows a point costs one addition. For an MLP on flattened
images the first layer is a large share of the work (3,072 inputs per unit on CIFAR). The
shortcut is taken when the layer reads many inputs per output (``fan_in >=
MIN_FAN_IN_PER_TERM * (k + 1)``; not on a 3-channel 3x3 convolution) and the ``k + 1``
outputs and the partial sums fit a quarter of the memory budget.

Safety: a layer qualifies only if it is an exact ``nn.Linear``/``nn.ConvNd`` (no subclass,
hooks or parametrisation), called once per forward pass, on a tensor that shares the memory
of the batch (so a later call with the same address, shape, strides and dtype can only be
that batch). Any other call falls back to the layer's own forward at the point's weights,
which the flat module always holds.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from ..space.params import ParameterSpace
from .inputs import output_tensors

#: A layer is expanded when ``fan_in >= MIN_FAN_IN_PER_TERM * (directions + 1)``: each term
#: of the expansion reads and writes the layer output once, a multiply-add per element.
MIN_FAN_IN_PER_TERM = 16
LAYER_TYPES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


class InputLayerShortcut:
    """Replaces the forward of the qualifying input layers of ``module`` by the expansion.

    ``module`` is the evaluator's private flat-view copy; the expansion is for the points
    ``origin + coeffs @ directions``, and ``set(coeffs)`` selects the point before each
    forward pass.

    Nothing is installed when the layers' ``k + 2`` outputs per batch exceed ``budget_bytes``
    (then :attr:`active` is False).

    Parameters
    ----------
    module
        The evaluator's private copy of the model (its layers' ``forward`` is overridden).
    space
        Its parameter space (to find each layer's weights in the flat vectors).
    batches
        The device-resident ``(x, y)`` batches; the expansion holds only for these tensors.
    origin
        Flat vector of the point set's origin.
    directions
        ``(k, D)`` directions of the point set.
    budget_bytes
        Memory the precomputed outputs and partial sums may take.

    Attributes
    ----------
    layers
        Names of the expanded layers.
    """

    def __init__(self, module: nn.Module, space: ParameterSpace, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 origin: torch.Tensor, directions: torch.Tensor, budget_bytes: int):
        self._coeffs: list[float] | None = None
        self._restore: list[nn.Module] = []
        self.layers: list[str] = []  # names of the expanded layers
        k = directions.shape[0]
        inputs = _record_inputs(module, batches, k)
        needed = sum((k + 2) * _output_bytes(layer, xs) for layer, xs in inputs.items())  # + partial sums
        if needed > budget_bytes:
            return
        device, dtype = batches[0][0].device, batches[0][0].dtype
        for name, layer in module.named_modules():
            if layer not in inputs:
                continue
            weights = [_layer_weights(space, name, layer, v.to(device, dtype)) for v in (origin, *directions)]
            table = {_signature(x): [_apply(layer, x, *w) for w in weights] for x in inputs[layer]}
            self._install(layer, table, reuse=_output_is_internal(module, layer, batches[0][0][:2]))
            self.layers.append(name)

    @property
    def active(self) -> bool:
        """Whether any layer is expanded."""
        return bool(self._restore)

    def set(self, coeffs: Sequence[float] | None) -> None:
        """Coefficients of the point the next forward passes evaluate (None: no shortcut).

        Parameters
        ----------
        coeffs
            The point's ``k`` coefficients over the directions, or None to run the layers'
            own forward (at the weights the module holds).
        """
        self._coeffs = None if coeffs is None else list(coeffs)

    def remove(self) -> None:
        """Give the layers their own forward back."""
        for layer in self._restore:
            del layer.forward  # the class's forward again (plain layers have no instance forward)
        self._restore.clear()

    def _install(self, layer: nn.Module, table: dict[tuple, list[torch.Tensor]], reuse: bool) -> None:
        own = layer.forward
        partial: dict[tuple, tuple[list[float], torch.Tensor]] = {}
        buffers: dict[tuple, torch.Tensor] = {}

        def forward(x: torch.Tensor) -> torch.Tensor:
            key = _signature(x)
            outputs = table.get(key)
            if outputs is None or self._coeffs is None:
                return own(x)
            first, rest = self._coeffs[0], self._coeffs[1:]
            cached = partial.get(key)
            if cached is None or cached[0] != rest:  # a plane's row shares all but the first
                cached = partial[key] = (rest, _combine(outputs[0], rest, outputs[2:]))
            base = cached[1]
            if not reuse:
                return torch.add(base, outputs[1], alpha=first) if first else base.clone()
            out = buffers.get(key)
            if out is None:
                out = buffers[key] = torch.empty_like(base)
            return torch.add(base, outputs[1], alpha=first, out=out) if first else out.copy_(base)

        layer.forward = forward
        self._restore.append(layer)


def _combine(base: torch.Tensor, coeffs: Sequence[float], terms: Sequence[torch.Tensor]) -> torch.Tensor:
    """``base + sum_k coeffs[k] terms[k]`` as a new tensor."""
    out = base.clone()
    for c, t in zip(coeffs, terms):
        if c:
            out.add_(t, alpha=c)
    return out


def _record_inputs(module: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
                   k: int) -> dict[nn.Module, list[torch.Tensor]]:
    """Qualifying layers and their inputs, one per batch.

    A probe on two samples finds the layers that read the data, then one forward pass per
    batch records their inputs.
    """
    candidates = [m for m in module.modules() if type(m) in LAYER_TYPES and _plain(m)
                  and _fan_in(m) >= MIN_FAN_IN_PER_TERM * (k + 1)]
    if candidates:
        candidates = list(_reading(module, candidates, [batches[0][0][:2]]))
    return _reading(module, candidates, [x for x, _ in batches]) if candidates else {}


def _reading(module: nn.Module, candidates: list[nn.Module], inputs: list[torch.Tensor]
             ) -> dict[nn.Module, list[torch.Tensor]]:
    """Those of ``candidates`` called exactly once per forward pass on the input, with that tensor.

    Called, for every input, on a tensor sharing the memory of the input.
    """
    calls: dict[nn.Module, list[torch.Tensor]] = {}

    def hook(layer: nn.Module, args: tuple) -> None:
        calls.setdefault(layer, []).append(args[0])

    qualified: dict[nn.Module, list[torch.Tensor]] = {m: [] for m in candidates}
    handles = [m.register_forward_pre_hook(hook) for m in candidates]
    try:
        with torch.no_grad():
            for x in inputs:
                calls.clear()
                module(x)
                for m in list(qualified):
                    seen = calls.get(m, [])
                    if len(seen) == 1 and _shares_memory(seen[0], x):
                        qualified[m].append(seen[0])
                    else:
                        del qualified[m]
    finally:
        for h in handles:
            h.remove()
    return qualified


def _output_is_internal(module: nn.Module, layer: nn.Module, x: torch.Tensor) -> bool:
    """Whether ``layer``'s output can be written into one buffer reused by every point.

    True when no module has hooks (which might keep an activation) and no tensor of the
    module's output shares memory with the layer's output on ``x`` (a linear model's output
    layer reads the data: its logits are stacked over points and must stay distinct).
    """
    if any(m._forward_hooks or m._forward_pre_hooks for m in module.modules()):
        return False
    seen: list[torch.Tensor] = []
    handle = layer.register_forward_hook(lambda _m, _a, out: seen.append(out))
    try:
        with torch.no_grad():
            result = module(x)
    finally:
        handle.remove()
    stored = {seen[0].untyped_storage().data_ptr()} if seen else set()
    return not any(t.untyped_storage().data_ptr() in stored for t in output_tensors(result))


def _plain(layer: nn.Module) -> bool:
    """No hooks, parametrisations or extra parameters: the forward is the textbook one."""
    return (set(layer._parameters) <= {"weight", "bias"} and not layer._forward_hooks
            and not layer._forward_pre_hooks and not hasattr(layer, "parametrizations")
            and "forward" not in vars(layer))


def _fan_in(layer: nn.Module) -> int:
    w = layer.weight
    return int(math.prod(w.shape[1:]))


def _shares_memory(t: torch.Tensor, x: torch.Tensor) -> bool:
    return (t.dtype == x.dtype and t.device == x.device and t.numel() == x.numel()
            and t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            and t.data_ptr() == x.data_ptr())


def _signature(x: torch.Tensor) -> tuple:
    return x.data_ptr(), tuple(x.shape), x.stride(), x.dtype


def _layer_weights(space: ParameterSpace, name: str, layer: nn.Module, vec: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of ``layer`` in the flat vector ``vec``."""
    def part(attr: str) -> torch.Tensor | None:
        if layer._parameters.get(attr) is None:
            return None
        key = f"{name}.{attr}" if name else attr
        entry = space._by_name[space.aliases.get(key, key)]
        return vec[entry.offset:entry.offset + entry.numel].view(entry.shape)

    return part("weight"), part("bias")


def _apply(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if isinstance(layer, nn.Linear):
        return nn.functional.linear(x, weight, bias)
    return layer._conv_forward(x, weight, bias)


def _output_bytes(layer: nn.Module, inputs: list[torch.Tensor]) -> int:
    """Bytes of the layer's outputs on ``inputs`` (from a one-sample call each)."""
    with torch.no_grad():
        return sum(layer(x[:1]).numel() * x.shape[0] * x.element_size() for x in inputs)
