"""Training points of parameter space that are combinations of a few flat vectors ("knots").

A learned curve or simplex is ``w = c @ K``: ``K`` stacks the knots (fixed endpoints and
trainable bends or vertices, flat vectors of the evaluator's :class:`~landscape.ParameterSpace`)
and ``c`` are coefficients drawn at every minibatch (a curve parameter ``t``, barycentric
coordinates). The forward pass is the model's own, through ``torch.func.functional_call``
on the unflattened point, so no "curve version" of the architecture is needed (Garipov et al.
2018, section 3.2, train the curve by stochastic estimates of ``E_t L(phi(t))``; Benton et
al. 2021, section 4, the same over a simplex). Only parameter entries of trainable knots are
optimised; buffers (BatchNorm running statistics) are passed as copies and not learned, and
the model runs in train mode (BatchNorm uses batch statistics, as in both papers).
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable

import torch

from ..evaluation.batches import all_pairs, minibatches
from ..evaluation.data import check_targets
from ..evaluation.inputs import map_tensors
from ..evaluation.protocol import PointEvaluator
from ..infra.errors import ConfigError, TrainingDivergedError
from ..space.subsets import Subspace

Sampler = Callable[[torch.Generator], torch.Tensor]


def train_knots(evaluator: PointEvaluator, knots: torch.Tensor, trainable: list[bool], sampler: Sampler, data: Any, *,
                epochs: int, lr: float, momentum: float = 0.9, batch_size: int = 128, weight_decay: float = 0.0,
                seed: int = 0, regulariser: Callable[[torch.Tensor], torch.Tensor] | None = None,
                what: str = "training", subset: Subspace | None = None, reference: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, list[float]]:
    """Optimise the trainable knots by SGD on ``E_c L(c @ K)`` over ``data``.

    Parameters
    ----------
    evaluator : PointEvaluator
        Gives the architecture, parameter space, loss, device and dtype.
    knots : torch.Tensor
        (m, D) flat vectors, or (m, S) vectors of ``subset``; rows with ``trainable[i]`` False
        stay exactly as given.
    trainable : list of bool
        One flag per knot; True marks a knot the optimiser updates.
    sampler : Sampler
        Draws one coefficient vector (m,) per minibatch from its generator.
    data : data, optional
        Training data (tuple, Dataset or DataLoader).
    epochs, batch_size : int
        SGD passes over ``data`` and minibatch size.
    lr, momentum, weight_decay : float
        SGD learning rate, momentum and weight decay (on the trainable knots' parameter entries).
    seed : int
        Seeds the minibatch order and the coefficient draws (own ``torch.Generator``).
    regulariser : callable, optional
        Optional extra term of the trainable knots' parameter entries (added to the loss).
    what : str
        What is trained, for the message of a divergence (e.g. ``"curve training"``).
    subset : Subspace, optional
        A parameter subset (``params=``): the knots live in it, and every point is
        ``reference`` with the subset's entries replaced by ``c @ K``.
    reference : torch.Tensor, optional
        (D,) the full vector outside ``subset`` (required with it).

    Returns
    -------
    (knots, history)
        The trained knots (float64, CPU; the shape of ``knots``) and the mean training loss
        of every epoch.

    Raises
    ------
    TrainingDivergedError
        When a minibatch loss or the trained knots become NaN or infinite (a learning rate
        too large); nothing is returned.
    DataError
        When the training labels do not fit the model's outputs.
    """
    if epochs < 0 or lr <= 0 or batch_size < 1:
        raise ConfigError(f"need epochs >= 0, lr > 0 and batch_size >= 1, got {epochs}, {lr}, {batch_size}")
    if len(trainable) != len(knots) or not any(trainable):
        raise ConfigError("at least one knot must be trainable, and trainable needs one flag per knot")
    device, dtype, space = evaluator.device, evaluator.dtype, evaluator.space
    if subset is not None and reference is None:
        raise ConfigError("training knots of a parameter subset needs the reference vector outside it")
    mask = (space.param_mask if subset is None else subset.param_mask).to(device)
    outside = None if subset is None else space.unflatten(reference.to(device, dtype))
    x_all, y_all = all_pairs(data, evaluator.batch_fn)
    x_all = map_tensors(x_all, lambda t: t.to(device, dtype if torch.is_floating_point(t) else t.dtype))
    y_all = y_all.to(device)
    loss_fn = evaluator.loss
    module = copy.deepcopy(evaluator.module).train()
    base = knots.to(device, dtype)
    train_idx = [i for i, t in enumerate(trainable) if t]
    free = torch.nn.Parameter(base[train_idx][:, mask].clone())
    opt = torch.optim.SGD([free], lr=lr, momentum=momentum, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    history = []
    settings = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay}
    # dropout draws from the global generator: a private, seeded one makes the training repeatable
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for epoch in range(epochs):
            total, count = 0.0, 0
            for xb, yb in minibatches(x_all, y_all, batch_size, gen):
                coeffs = sampler(gen).to(device, dtype)
                rows = base[train_idx].clone()
                rows[:, mask] = free
                point = coeffs[[i for i in range(len(base)) if not trainable[i]]] @ base[[not t for t in trainable]] \
                    + coeffs[train_idx] @ rows
                if outside is None:
                    tensors = space.unflatten(point)
                    state = {e.name: (tensors[e.name] if e.kind == "parameter" else tensors[e.name].detach().clone())
                             for e in space.entries}
                else:
                    state = {**{k: v.detach().clone() for k, v in outside.items()}, **subset.unflatten(point)}
                out = evaluator.forward(state, xb, module=module)
                if count == 0 and epoch == 0:
                    check_targets(out, y_all, evaluator.loss_name)
                loss = loss_fn.per_sample(out, yb).sum() / max(loss_fn.count(yb), 1)  # mean over counted targets
                if regulariser is not None:
                    loss = loss + regulariser(free)
                value = float(loss.detach())
                if not math.isfinite(value):
                    raise TrainingDivergedError(what, epoch, ["loss"], settings)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total += value * len(yb)
                count += len(yb)
            if not bool(torch.isfinite(free).all()):
                raise TrainingDivergedError(what, epoch, ["weights"], settings)
            history.append(total / max(count, 1))
    out_knots = knots.detach().double().cpu().clone()  # fixed knots exactly as given
    rows = out_knots[train_idx]
    rows[:, mask.cpu()] = free.detach().double().cpu()
    out_knots[train_idx] = rows
    return out_knots, history
