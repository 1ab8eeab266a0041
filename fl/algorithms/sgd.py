"""Functional local SGD.

The pieces of a client update (state split, forward pass through
``torch.func.functional_call`` or through the module bound to the client's tensors for a whole
update, seeded mini-batches, an SGD step equal to ``torch.optim.SGD``'s) and :func:`local_sgd`,
FedAvg's local training.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from ..outputs import logits_of
from .contexts import LocalContext, State
from .proximal import proximal_gradient

ExtraLoss = Callable[[State, Tensor, Tensor, Tensor], "Tensor | None"]
LossFn = Callable[[Tensor, Tensor], Tensor]


def split_state(module: nn.Module, state: Mapping[str, Tensor], device: torch.device | None = None
                ) -> tuple[State, State]:
    """Fresh copies of ``state`` split into trainable leaves and buffers.

    A parameter the module shares under several names (tied input and output embeddings) is
    copied once: the first name (``named_parameters()``'s) holds it, and every other name maps to
    the same tensor among the buffers, so the tie holds and its gradient is taken once.

    Parameters
    ----------
    module : nn.Module
        Its ``named_parameters()`` with ``requires_grad`` name the trainable entries.
    state : Mapping[str, Tensor]
        The state to copy.
    device : torch.device, optional
        Where the copies go (default: where the tensors are).

    Returns
    -------
    tuple[State, State]
        (trainable parameters as ``nn.Parameter``, buffers, frozen parameters and the other names
        of tied parameters).
    """
    names = {n for n, p in module.named_parameters() if p.requires_grad}
    first: dict[int, str] = {}
    aliases = {n: first[id(p)] for n, p in module.named_parameters(remove_duplicate=False)
               if first.setdefault(id(p), n) != n and first[id(p)] in state and n in state}
    params: State = {}
    buffers: State = {}
    for name, t in state.items():
        if name in aliases:
            continue
        t = t.detach().to(device).clone() if device is not None else t.detach().clone()
        if name in names:
            params[name] = nn.Parameter(t)
        else:
            buffers[name] = t
    for alias, name in aliases.items():
        buffers[alias] = params[name] if name in params else buffers[name]
    return params, buffers


def forward(module: nn.Module, params: Mapping[str, Tensor], buffers: Mapping[str, Tensor],
            x: Tensor) -> Tensor:
    """``module(x)`` computed with the given tensors (``torch.func.functional_call``).

    Parameters
    ----------
    module : nn.Module
        The architecture.
    params, buffers : Mapping[str, Tensor]
        Its tensors; BatchNorm in train mode updates the running statistics in ``buffers``
        in place.
    x : Tensor
        A batch of inputs.

    Returns
    -------
    Tensor
        The logits (the ``"logits"`` of a Hugging Face ``ModelOutput``).
    """
    return logits_of(functional_call(module, {**params, **buffers}, (x,)))


@contextmanager
def bound(module: nn.Module, params: State, buffers: State) -> Iterator[Callable[[Tensor], Tensor]]:
    """A forward pass through ``module`` holding ``params`` and ``buffers`` themselves, for a block.

    The same function as :func:`forward` with these tensors, without re-binding them at every
    call: while the block runs, the module's parameters and buffers *are* the given tensor
    objects (``load_state_dict(assign=True)``), so in-place SGD steps and BatchNorm updates
    reach them directly, and tied names given one tensor stay tied; the module's own tensors are
    put back afterwards, also on an error. Where the names differ from the module's state, every
    call goes through :func:`forward` instead.

    Parameters
    ----------
    module : nn.Module
        The architecture.
    params : State
        Trainable tensors as ``nn.Parameter`` objects (bound as they are; :func:`split_state`).
    buffers : State
        Buffers and frozen parameters.

    Returns
    -------
    Iterator[Callable[[Tensor], Tensor]]
        ``x -> logits``.
    """
    own = module.state_dict(keep_vars=True)
    if set(own) != set(params) | set(buffers):
        yield lambda x: forward(module, params, buffers, x)
        return
    module.load_state_dict({**params, **buffers}, assign=True)
    try:
        yield lambda x: logits_of(module(x))
    finally:
        module.load_state_dict(own, assign=True)


def minibatches(n: int, batch_size: int, epochs: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Index tensors (CPU) of shuffled mini-batches, a fresh permutation per epoch.

    Parameters
    ----------
    n : int
        Number of samples (none: no batches).
    batch_size : int
        Batch size; the last batch of an epoch may be smaller.
    epochs : int
        Number of passes.
    generator : torch.Generator
        Source of the permutations.

    Returns
    -------
    Iterator[Tensor]
        ``epochs * ceil(n / batch_size)`` index tensors.
    """
    if n <= 0:
        return
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator)
        yield from perm.split(batch_size)


@dataclass
class LocalResult:
    """Result of :func:`local_sgd`.

    Parameters
    ----------
    state : State
        Trained state (parameters and buffers, detached, on the device).
    loss : float
        Sample-weighted mean of the loss function over all steps.
    momentum : State
        SGD momentum buffers by parameter name.
    """

    state: State
    loss: float
    momentum: State


@torch.no_grad()
def sgd_step(params: Mapping[str, Tensor], grads: Mapping[str, Tensor | None], momentum_buf: State,
             *, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
    """One in-place SGD step, as ``torch.optim.SGD`` (dampening 0, no Nesterov).

    ``d = g + wd * w``; ``b = d`` (first step) or ``b = momentum * b + d``; ``w -= lr * b``.

    Parameters
    ----------
    params : Mapping[str, Tensor]
        Parameters, updated in place.
    grads : Mapping[str, Tensor | None]
        Their gradients; parameters whose gradient is None are skipped.
    momentum_buf : State
        Momentum buffers, updated in place (created on the first step).
    lr, momentum, weight_decay : float
        SGD settings.
    """
    for name, p in params.items():
        g = grads.get(name)
        if g is None:
            continue
        d = g.add(p, alpha=weight_decay) if weight_decay else g
        if momentum:
            buf = momentum_buf.get(name)
            if buf is None:
                buf = momentum_buf[name] = d.detach().clone()
            else:
                buf.mul_(momentum).add_(d)
            d = buf
        p.add_(d, alpha=-lr)


def local_sgd(ctx: LocalContext, *, state: Mapping[str, Tensor] | None = None,
              extra_loss: ExtraLoss | None = None, loss_fn: LossFn = F.cross_entropy,
              momentum_state: Mapping[str, Tensor] | None = None, lr: float | None = None,
              epochs: int | None = None, module: nn.Module | None = None,
              proximal: tuple[Mapping[str, Tensor], float] | None = None) -> LocalResult:
    """Mini-batch SGD on the client's data.

    FedAvg's local step (FedProx Eq. 2 with the proximal term as ``extra_loss`` or ``proximal``).

    The loss of a batch is ``loss_fn(logits, y) + extra_loss(params, x, y, logits)``, plus the
    proximal term ``c/2 ||w - anchor||^2`` when ``proximal = (anchor, c)`` (its gradient is added
    directly, :func:`~fl.algorithms.proximal.proximal_gradient`); batches come from
    ``ctx.generator`` (:func:`minibatches`), steps from :func:`sgd_step` with ``ctx.momentum``
    and ``ctx.weight_decay``.

    Parameters
    ----------
    ctx : LocalContext
        The client's context.
    state : Mapping[str, Tensor], optional
        Starting state (default ``ctx.global_state``).
    extra_loss : ExtraLoss, optional
        ``f(params, x, y, logits)`` added to the loss (None: nothing added).
    loss_fn : LossFn
        The data loss (default cross-entropy).
    momentum_state : Mapping[str, Tensor], optional
        Momentum buffers to restore (e.g. kept in the client state).
    lr : float, optional
        Learning rate (default ``ctx.lr``).
    epochs : int, optional
        Epochs (default ``ctx.local_epochs``).
    module : nn.Module, optional
        Architecture (default ``ctx.module``).
    proximal : tuple[Mapping[str, Tensor], float], optional
        The anchor and coefficient of a proximal term (Ditto's and FLOCO+'s personal models).

    Returns
    -------
    LocalResult
        Trained state, mean data loss (the proximal term excluded) and final momentum buffers.
    """
    module = module if module is not None else ctx.module
    module.train()
    start = state if state is not None else ctx.global_state
    params, buffers = split_state(module, start, ctx.device)
    buf: State = {k: v.to(ctx.device).clone() for k, v in (momentum_state or {}).items() if k in params}
    step_lr = ctx.lr if lr is None else lr
    names = list(params)
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    seen = 0
    with bound(module, params, buffers) as model:
        for idx in minibatches(len(ctx.y), ctx.batch_size, ctx.local_epochs if epochs is None else epochs,
                               ctx.generator):
            idx = idx.to(ctx.device)
            x, y = ctx.x[idx], ctx.y[idx]
            logits = model(x)
            loss = loss_fn(logits, y)
            objective = loss
            if extra_loss is not None:
                extra = extra_loss(params, x, y, logits)
                if extra is not None:
                    objective = objective + extra
            grads = dict(zip(names, torch.autograd.grad(objective, [params[n] for n in names], allow_unused=True)))
            if proximal is not None:
                pull = proximal_gradient(params, *proximal)
                grads = {n: pull[n] if g is None else g + pull[n] for n, g in grads.items()}
            sgd_step(params, grads, buf, lr=step_lr, momentum=ctx.momentum, weight_decay=ctx.weight_decay)
            total += loss.detach().double() * len(y)
            seen += len(y)
    trained = {**params, **buffers}
    return LocalResult({name: trained[name].detach() for name in start}, float(total) / max(seen, 1), buf)
