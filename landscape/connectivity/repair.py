"""REPAIR and BatchNorm reset of interpolated models (Jordan et al. 2022).

Interpolating two aligned networks shrinks the variance of hidden activations ("variance
collapse", Jordan et al. section 3), which causes much of the barrier left after alignment.
REPAIR (section 4) gives every hidden channel of the interpolated model ``(1 - alpha) A +
alpha B`` the interpolated statistics of the endpoints,
``mu = (1 - alpha) mu_A + alpha mu_B`` and ``sigma = (1 - alpha) sigma_A + alpha sigma_B``,
measured on data, and folds the correction into the layer's weights: for channel ``c`` with
measured ``(m_c, s_c)``, ``W_c <- W_c sigma_c / s_c`` and ``b_c <- (b_c - m_c) sigma_c / s_c
+ mu_c``. Corrected channels are the outputs of hidden ``Linear``/``ConvNd`` layers with a
bias and of affine ``GroupNorm``/``LayerNorm`` (1-D) layers; BatchNorm layers get their
running statistics re-estimated instead ("reset", Jordan et al. section 5.3). Statistics are
taken on one batch of up to ``samples`` inputs in a single pass whose hooks apply every
correction as they go, so each layer is measured with its inputs already corrected.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..evaluation.batches import first_inputs
from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError
from ..infra.registry import Registry
from ..results.geometry import PathResult

#: REPAIR methods by name: ``layers(model, x) -> names`` of the layers whose output channels get
#: the interpolated statistics (BatchNorm layers are reset by every method). A method is one
#: registration, here or in any module that imports this one.
REPAIR_METHODS: Registry[Callable[[nn.Module, torch.Tensor], list[str]]] = Registry("REPAIR method")
_EPS = 1e-5


def repair_points(module: nn.Module) -> list[str]:
    """Names of the modules whose output channels REPAIR renormalises (Jordan et al. 2022, Sec. 4).

    Parameters
    ----------
    module : torch.nn.Module
        The model to inspect.

    Returns
    -------
    list[str]
        Names of ``Linear``/``ConvNd`` layers with a bias and of affine ``GroupNorm`` and 1-D
        ``LayerNorm`` layers, in module order.
    """
    out = []
    for name, m in module.named_modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) and m.bias is not None:
            out.append(name)
        elif isinstance(m, nn.GroupNorm) and m.affine:
            out.append(name)
        elif isinstance(m, nn.LayerNorm) and m.elementwise_affine and m.bias is not None \
                and len(m.normalized_shape) == 1:
            out.append(name)
    return out


def _channels(m: nn.Module, out: torch.Tensor) -> torch.Tensor:
    """Output as (channels, observations)."""
    axis = -1 if isinstance(m, (nn.Linear, nn.LayerNorm)) else 1
    return out.movedim(axis, 0).reshape(out.shape[axis], -1)


def channel_stats(module: nn.Module, names: Sequence[str], x: torch.Tensor) -> dict[str, tuple[torch.Tensor, ...]]:
    """Per-channel mean and standard deviation of each named module's output on ``x`` (eval mode).

    Parameters
    ----------
    module : torch.nn.Module
        The model to run (put in eval mode).
    names : Sequence[str]
        Modules whose outputs are measured.
    x : torch.Tensor
        One batch of inputs.

    Returns
    -------
    dict[str, tuple[torch.Tensor, ...]]
        Module name -> (mean, std) per output channel, float64 (population standard deviation).
    """
    stats: dict[str, tuple[torch.Tensor, ...]] = {}
    mods = dict(module.named_modules())
    hooks = [mods[n].register_forward_hook(
        lambda m, _i, out, n=n: stats.__setitem__(n, _moments(_channels(m, out)))) for n in names]
    try:
        with torch.no_grad():
            module.eval()(x)
    finally:
        for h in hooks:
            h.remove()
    return stats


def _moments(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = z.double()
    return z.mean(1), z.std(1, unbiased=False)


def _is_output(module: nn.Module, name: str, x: torch.Tensor) -> bool:
    seen: list[torch.Tensor] = []
    hook = dict(module.named_modules())[name].register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        with torch.no_grad():
            final = module.eval()(x[:2])
    finally:
        hook.remove()
    return any(s is final for s in seen)


def repair_model(model: nn.Module, targets: dict[str, tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor, *,
                 reset_bn: bool = True) -> nn.Module:
    """A copy of ``model`` whose named channels have the ``targets`` (mean, std) on ``x``.

    Parameters
    ----------
    model : torch.nn.Module
        The interpolated model (not modified).
    targets : dict[str, tuple[torch.Tensor, torch.Tensor]]
        Module name -> (mean, std) per output channel (empty for a BatchNorm reset only).
    x : torch.Tensor
        One batch of inputs.
    reset_bn : bool
        Re-estimate BatchNorm running statistics in the same pass.

    Returns
    -------
    nn.Module
        The repaired copy, in eval mode.
    """
    out = copy.deepcopy(model).eval()
    mods = dict(out.named_modules())
    measured: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def correct(name: str):
        def hook(m: nn.Module, _i: Any, y: torch.Tensor) -> torch.Tensor:
            mean, std = _moments(_channels(m, y))
            measured[name] = (mean, std)
            tm, ts = targets[name]
            scale = (ts / (std + _EPS)).to(y.dtype)
            shift = (tm - mean * ts / (std + _EPS)).to(y.dtype)
            shape = [1] * y.ndim
            shape[-1 if isinstance(m, (nn.Linear, nn.LayerNorm)) else 1] = -1
            return y * scale.reshape(shape) + shift.reshape(shape)
        return hook

    bns = [m for m in out.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)] if reset_bn else []
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    hooks = [mods[n].register_forward_hook(correct(n)) for n in targets]
    try:
        with torch.no_grad():
            out(x)
    finally:
        for h in hooks:
            h.remove()
    for bn in bns:
        bn.momentum = 0.1
        bn.eval()
    with torch.no_grad():
        for name, (mean, std) in measured.items():
            m, (tm, ts) = mods[name], targets[name]
            scale = ts / (std + _EPS)
            shape = (-1,) + (1,) * (m.weight.ndim - 1)
            m.weight.mul_(scale.reshape(shape).to(m.weight.dtype))
            m.bias.copy_(((m.bias.double() - mean) * scale + tm).to(m.bias.dtype))
    return out


def repaired_interpolate(a: Any, b: Any, evaluator: PointEvaluator, *, data: Any, alphas: int | Sequence[float] = 21,
                         method: str = "repair", samples: int = 1024) -> PathResult:
    """Loss and accuracy along ``(1 - alpha) a + alpha b`` with every point repaired.

    Parameters
    ----------
    a, b : model-like
        Model-likes of the evaluator's architecture (align ``b`` to ``a`` first).
    evaluator : PointEvaluator
        Evaluates the repaired points (use ``bn="interpolate"``: the repaired running
        statistics are part of each point).
    data : data, optional
        Inputs for the statistics (training data; the first ``samples`` inputs are used).
    alphas : int or sequence of float
        Number of evenly spaced points on [0, 1], or the values.
    method : str
        ``"repair"`` (REPAIR plus BatchNorm reset) or ``"reset"`` (BatchNorm reset only).
    samples : int
        Number of inputs the statistics are measured on.

    Returns
    -------
    PathResult
        ``spec["repair"]`` records the method, the sample count and the repaired layers.

    Raises
    ------
    ConfigError
        If ``method`` is unknown or the evaluator's ``bn`` is not ``"interpolate"``.
    """
    layers = REPAIR_METHODS.get(method)
    if evaluator.bn != "interpolate":
        raise ConfigError(f"repaired points carry their own BatchNorm statistics: use an Evaluator with "
                          f"bn='interpolate', not {evaluator.bn!r}")
    grid = np.linspace(0.0, 1.0, int(alphas)) if isinstance(alphas, (int, np.integer)) else \
        np.asarray(alphas, dtype=np.float64).reshape(-1)
    space, template = evaluator.space, evaluator.module
    va, vb = evaluator.vector(a), evaluator.vector(b)
    x = first_inputs(data, samples).float()
    base = copy.deepcopy(template).cpu().float()
    names = layers(base, x)
    ends = []
    for v in (va, vb):
        base.load_state_dict(space.state_dict(v))
        ends.append(channel_stats(base, names, x))
    vectors = []
    for alpha in grid:
        targets = {n: tuple((1 - alpha) * ends[0][n][k] + alpha * ends[1][n][k] for k in range(2)) for n in names}
        base.load_state_dict(space.state_dict((1 - alpha) * va + alpha * vb))
        fixed = repair_model(base, targets, x)
        vectors.append(space.to_vector(fixed, dtype=torch.float64))
    metrics = evaluator.evaluate(torch.stack(vectors))
    return PathResult(alphas=grid, loss=metrics.loss, accuracy=metrics.accuracy,
                      spec={"kind": "path", "evaluator": evaluator.fingerprint(),
                            "repair": {"method": method, "samples": int(len(x)), "layers": names}})


@REPAIR_METHODS.register("repair")
def hidden_repair_points(model: nn.Module, x: torch.Tensor) -> list[str]:
    """REPAIR (Jordan et al. 2022, Sec. 4): every :func:`repair_points` layer except the output layer.

    Parameters
    ----------
    model : nn.Module
        The interpolated model.
    x : torch.Tensor
        Inputs (to tell which layer produces the output).

    Returns
    -------
    list[str]
        The names of the layers to renormalise.
    """
    return [n for n in repair_points(model) if not _is_output(model, n, x)]


@REPAIR_METHODS.register("reset")
def no_repair_points(model: nn.Module, x: torch.Tensor) -> list[str]:
    """BatchNorm reset only (Jordan et al. 2022, Sec. 5.3): no layer is renormalised.

    Parameters
    ----------
    model : nn.Module
        The interpolated model (unused).
    x : torch.Tensor
        Inputs (unused).

    Returns
    -------
    list[str]
        No names.
    """
    return []
