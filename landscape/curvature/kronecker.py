r"""The per-layer statistics of K-FAC and EKFAC: layer inputs and backpropagated output gradients.

For a layer ``s = W a + b`` (an ``nn.Linear``; an ``nn.Conv2d`` applies it at every output
position ``t`` to the unfolded input patch ``a_t``) the weight and bias form one matrix
``[W, b]`` acting on the input with the bias as a homogeneous coordinate, ``a_t <- [a_t, 1]``
(Martens & Grosse 2015, section 3). The curvature ``C = (1/N) sum_n sum_k vec(D_nk) vec(D_nk)^T``
of the layer's parameters is a sum over samples ``n`` and backpropagated columns ``k`` of the
outer products of the pseudo-gradients ``D_nk = sum_t g_nkt a_nt^T``, ``g_nkt = d(f_n . q_nk) / d s_nt``
the gradient of the layer's output for an output-space vector ``q_nk`` (:func:`output_columns`):

* ``fisher_type="type-2"``: the columns of a square root ``S_n`` of the loss's output Hessian,
  ``S_n S_n^T = H_n`` (cross-entropy ``S = diag(sqrt p) - p sqrt(p)^T``, the summed squared error
  ``S = sqrt(2) I``): ``C`` is the layer's block of the GGN ``(1/N) sum_n J_n^T H_n J_n``;
* ``"mc"``: the output gradients ``s_nm / sqrt(M)`` of the loss at ``M`` labels drawn from the
  model's predictive distribution (those of ``kind="fisher"``): the Monte-Carlo Fisher's block;
* ``"empirical"``: the output gradient of the per-sample loss at the data's label: the empirical
  Fisher's block.

:func:`backpropagated` gives, batch by batch, the inputs ``a`` ``(B, T, in)`` and the output
gradients ``g`` ``(K, B, T, out)`` of every layer, by hooks on the evaluator's private copy of the
model (removed afterwards) and one backward pass per column ``k``; the operators of :mod:`.kfac`
reduce them to the Kronecker factors and EKFAC's scalings. Convolutions use the "expand"
convention (Grosse & Martens 2016; Eschenhagen et al. 2023): the ``T`` output positions are
treated as extra samples, as are the leading dimensions of a ``Linear`` layer's ``(B, ..., in)``
input. Only ``nn.Linear`` and ``nn.Conv2d`` (``groups=1``, zero padding) are supported; a selected
parameter of any other layer (norms, embeddings, ...) is refused in one line naming it.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from ..evaluation.losses import IGNORE_INDEX
from ..infra.errors import ConfigError
from .gauss_newton import output_loss

#: The ``fisher_type`` values: the expectation that the Kronecker factors approximate.
FISHER_TYPES = ("type-2", "mc", "empirical")
#: The losses whose output Hessian (type-2) and predictive distribution (mc) are known here.
OUTPUT_HESSIAN_LOSSES = ("cross_entropy", "mse")


@dataclass
class KroneckerLayer:
    """One block of K-FAC: the selected weight and/or bias of one ``nn.Linear`` or ``nn.Conv2d``.

    Attributes
    ----------
    name : str
        The module's name in the model.
    module : nn.Module
        The evaluator's copy of the module (the hooks go on it).
    weight, bias : slice or None
        Where the weight (flattened, ``(out, in)`` row-major, a convolution's ``(out, in * k1 * k2)``)
        and the bias lie in the operator's ``theta``; None when not selected.
    out_features, in_features : int
        ``W``'s rows and columns.
    inputs, probes : list of torch.Tensor
        During a hooked forward pass: the module's input, and the zero tensor added to its output
        (whose gradient is the output's).
    """

    name: str
    module: nn.Module
    weight: slice | None = None
    bias: slice | None = None
    out_features: int = 0
    in_features: int = 0
    inputs: list[torch.Tensor] = field(default_factory=list)
    probes: list[torch.Tensor] = field(default_factory=list)

    @property
    def columns(self) -> int:
        """Columns of the block's matrix ``[W, b]``: ``in_features`` if the weight is selected, plus 1 for the bias."""
        return (self.in_features if self.weight is not None else 0) + (1 if self.bias is not None else 0)

    def patches(self, a: torch.Tensor) -> torch.Tensor:
        """The layer's input as ``(B, T, columns)``: unfolded patches or flattened positions, with the bias's 1.

        Parameters
        ----------
        a : torch.Tensor
            The module's input, ``(B, ..., in)`` or ``(B, C, H, W)``.

        Returns
        -------
        torch.Tensor
            ``(B, T, columns)``.
        """
        if isinstance(self.module, nn.Conv2d):
            m = self.module
            a = nn.functional.unfold(a, m.kernel_size, dilation=m.dilation, padding=_int_padding(m), stride=m.stride)
            a = a.transpose(1, 2)
        else:
            a = a.reshape(a.shape[0], -1, a.shape[-1])
        parts = ([a] if self.weight is not None else []) + ([a.new_ones(*a.shape[:2], 1)] if self.bias is not None
                                                             else [])
        return torch.cat(parts, -1)

    def positions(self, g: torch.Tensor) -> torch.Tensor:
        """A gradient of the layer's output as ``(B, T, out)``.

        Parameters
        ----------
        g : torch.Tensor
            Shaped as the module's output.

        Returns
        -------
        torch.Tensor
            ``(B, T, out)``.
        """
        if isinstance(self.module, nn.Conv2d):
            return g.flatten(2).transpose(1, 2)
        return g.reshape(g.shape[0], -1, g.shape[-1])


def kronecker_layers(op: Any) -> list[KroneckerLayer]:
    """The blocks of the operator's selected parameters, one per ``nn.Linear`` / ``nn.Conv2d`` layer.

    Parameters
    ----------
    op : CurvatureOperator
        Gives the selected parameters (``names``, ``numels``) and the evaluator's module.

    Returns
    -------
    list of KroneckerLayer
        In the order of the layers' first parameter in ``theta``.

    Raises
    ------
    ConfigError
        A selected parameter outside an ``nn.Linear`` or ``nn.Conv2d`` (named, with its layer's type),
        or a convolution with ``groups > 1``, non-zero padding mode or uneven ``"same"`` padding.
    """
    root = op.evaluator.module
    layers: dict[str, KroneckerLayer] = {}
    offset = 0
    for name, numel in zip(op.names, op.numels):
        owner, _, attr = name.rpartition(".")
        module = root.get_submodule(owner)
        if not isinstance(module, (nn.Linear, nn.Conv2d)) or attr not in ("weight", "bias"):
            raise ConfigError(f"kind={op.kind!r} supports the parameters of nn.Linear and nn.Conv2d layers only; "
                              f"{name!r} belongs to a {type(module).__name__}: select the supported layers "
                              "with params= (e.g. params=['fc*']) or use kind='ggn'")
        if isinstance(module, nn.Conv2d):
            _check_conv(name, module)
        layer = layers.setdefault(owner, KroneckerLayer(owner, module, out_features=int(module.weight.shape[0]),
                                                        in_features=int(module.weight[0].numel())))
        setattr(layer, attr, slice(offset, offset + numel))
        offset += numel
    return list(layers.values())


def _check_conv(name: str, module: nn.Conv2d) -> None:
    if module.groups != 1:
        raise ConfigError(f"kind K-FAC supports nn.Conv2d with groups=1 only; {name!r} has groups={module.groups}")
    if module.padding_mode != "zeros":
        raise ConfigError(f"kind K-FAC supports nn.Conv2d with zero padding only; {name!r} has "
                          f"padding_mode={module.padding_mode!r}")
    _int_padding(module)


def _int_padding(m: nn.Conv2d) -> tuple[int, int]:
    """The convolution's padding as integers (``"same"`` padding must be even on both sides)."""
    if not isinstance(m.padding, str):
        return tuple(m.padding)
    if m.padding == "valid":
        return (0, 0)
    pads = [d * (k - 1) for k, d in zip(m.kernel_size, m.dilation)]
    if any(p % 2 for p in pads):
        raise ConfigError(f"kind K-FAC needs even padding: padding='same' of a {tuple(m.kernel_size)} kernel with "
                          f"dilation {tuple(m.dilation)} pads unevenly; give the padding as integers")
    return pads[0] // 2, pads[1] // 2


def check_fisher_type(op: Any, fisher_type: str) -> None:
    """Refuse a loss without what ``fisher_type`` needs, in one line.

    Parameters
    ----------
    op : CurvatureOperator
        Gives the evaluator (its loss).
    fisher_type : str
        One of :data:`FISHER_TYPES`.

    Raises
    ------
    ConfigError
        A token loss (any type), or a loss other than cross-entropy and MSE for type-2 and mc.
    """
    ev = op.evaluator
    if ev.loss.tokens:
        raise ConfigError(f"kind={op.kind!r} does not support the token loss {ev.loss_name!r} (its samples are tokens, "
                          "not inputs); use kind='ggn'")
    if fisher_type != "empirical" and ev.loss_name not in OUTPUT_HESSIAN_LOSSES:
        raise ConfigError(f"kind={op.kind!r} with fisher_type={fisher_type!r} needs the cross_entropy or mse loss, "
                          f"got {ev.loss_name!r}; use fisher_type='empirical'")


def sample_weights(op: Any, y: torch.Tensor) -> torch.Tensor:
    """1 for a sample whose target counts, 0 for a cross-entropy label of -100 (ignored, as in the loss).

    Parameters
    ----------
    op : CurvatureOperator
        Gives the evaluator's loss.
    y : torch.Tensor
        A batch of targets.

    Returns
    -------
    torch.Tensor
        ``(B,)`` in the operator's dtype.
    """
    if op.evaluator.loss_name == "cross_entropy" and not torch.is_floating_point(y) and y.ndim == 1:
        return (y != IGNORE_INDEX).to(op.dtype)
    return torch.ones(len(y), dtype=op.dtype, device=y.device)


def output_columns(op: Any, fisher_type: str, index: int, out: torch.Tensor, y: torch.Tensor,
                   draws: list[torch.Tensor]) -> torch.Tensor:
    """The output-space vectors ``q_nk`` to backpropagate, ``(K, B, C)`` (see the module's docstring).

    Parameters
    ----------
    op : CurvatureOperator
        Gives the evaluator's loss.
    fisher_type : str
        One of :data:`FISHER_TYPES`.
    index : int
        The batch's position (selects its drawn labels for ``"mc"``).
    out, y : torch.Tensor
        The batch's outputs (detached) and targets.
    draws : list of torch.Tensor
        Per batch, the labels drawn for ``"mc"`` (as ``kind="fisher"`` draws them).

    Returns
    -------
    torch.Tensor
        ``sum_k q_nk q_nk^T`` is ``H_n`` (type-2), its Monte-Carlo estimate (mc) or ``s_n s_n^T``
        at the data's label (empirical).

    Raises
    ------
    ConfigError
        Outputs other than ``(batch, classes)`` for type-2 and mc.
    """
    weights = sample_weights(op, y)
    if fisher_type == "empirical":
        leaf = out.detach().requires_grad_()
        with torch.enable_grad():
            per_sample = op.evaluator.loss.per_sample(leaf, y)
            return torch.autograd.grad(per_sample.sum(), leaf)[0].unsqueeze(0)
    if out.ndim != 2:
        raise ConfigError(f"kind={op.kind!r} with fisher_type={fisher_type!r} needs outputs (batch, classes), got "
                          f"shape {tuple(out.shape)}; use fisher_type='empirical' or kind='ggn'")
    if fisher_type == "mc":
        s = output_loss(op.evaluator, op.kind).sampled_gradients(out, y, draws[index])
        return s / math.sqrt(s.shape[0])
    if op.evaluator.loss_name == "mse":
        root = math.sqrt(2.0) * torch.eye(out.shape[1], dtype=out.dtype, device=out.device).expand(len(out), -1, -1)
    else:
        p = torch.softmax(out, 1)
        root = torch.diag_embed(p.sqrt()) - p[:, :, None] * p.sqrt()[:, None, :]
    return (root * weights[:, None, None]).permute(2, 0, 1)


@contextmanager
def _hooked(layers: list[KroneckerLayer]) -> Iterator[None]:
    """Record each layer's input, and add a zero probe to its output whose gradient is the output's."""
    def pre(layer: KroneckerLayer, module: nn.Module, args: tuple) -> None:
        if layer.inputs:
            raise ConfigError(f"K-FAC needs each layer called once per forward pass; {layer.name!r} is called again "
                              "(a layer shared across calls); leave it out with params=")
        layer.inputs.append(args[0].detach())

    def post(layer: KroneckerLayer, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        probe = torch.zeros_like(output, requires_grad=True)
        layer.probes.append(probe)
        return output + probe  # d(...)/d probe = d(...)/d output, untouched by in-place ops downstream

    handles = []
    try:
        for layer in layers:
            handles.append(layer.module.register_forward_pre_hook(lambda m, a, layer=layer: pre(layer, m, a)))
            handles.append(layer.module.register_forward_hook(lambda m, a, o, layer=layer: post(layer, m, a, o)))
        yield
    finally:
        for handle in handles:
            handle.remove()
        for layer in layers:
            layer.inputs.clear()
            layer.probes.clear()


def backpropagated(op: Any, layers: list[KroneckerLayer], fisher_type: str, draws: list[torch.Tensor]
                   ) -> Iterator[tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]]:
    """Per batch: the sample weights, each layer's inputs ``(B, T, columns)`` and output gradients ``(K, B, T, out)``.

    Parameters
    ----------
    op : CurvatureOperator
        The operator (its evaluator's batches, its point ``theta``).
    layers : list of KroneckerLayer
        The layers, from :func:`kronecker_layers`.
    fisher_type : str
        One of :data:`FISHER_TYPES`.
    draws : list of torch.Tensor
        The drawn labels of ``"mc"`` per batch (empty otherwise).

    Yields
    ------
    tuple
        ``(weights (B,), inputs per layer, output gradients per layer)``; the gradients are those of
        ``f_n . q_nk`` for the columns of :func:`output_columns` (not divided by ``N``).
    """
    for index, (x, y) in enumerate(op.evaluator.batches):
        with _hooked(layers), torch.enable_grad():
            out = op.outputs(op.theta, x)
            columns = output_columns(op, fisher_type, index, out.detach(), y, draws)
            probes = [layer.probes[0] for layer in layers]
            grads: list[list[torch.Tensor]] = [[] for _ in layers]
            for k, column in enumerate(columns):
                for i, g in enumerate(torch.autograd.grad(out, probes, column, retain_graph=k < len(columns) - 1,
                                                          allow_unused=True)):
                    grads[i].append(torch.zeros_like(probes[i]) if g is None else g)
            inputs = [layer.patches(layer.inputs[0]) for layer in layers]
        yield (sample_weights(op, y), inputs,
               [torch.stack([layer.positions(g) for g in gs]) for layer, gs in zip(layers, grads)])
