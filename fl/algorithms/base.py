"""Contract between the FL round loop (``fl.engine``) and an algorithm plug-in.

An algorithm is a subclass of :class:`Algorithm` with a class attribute ``name`` (the
string users pass to ``fl.run``) and ``options`` (its own options with their defaults).
``fl.algorithms`` discovers every such class in the modules listed in
``fl.algorithms.MODULES``; nothing else needs registering.

One training round ``r`` (rounds are 1..T; round 0 is the initial model) runs:

1. ``sampled = engine's sample (seed, r)``; ``clients = participants(r, sampled)``.
2. ``server_state = begin_round(RoundContext)`` (optional extra work before training,
   e.g. FLOCO's projection, which may train clients through ``ctx.train``).
3. For each client ``k`` in ``clients``: ``client_update(LocalContext) -> ClientUpdate``.
   The context holds the *received* model (``global_state``), the algorithm's
   ``server_state``, the client's persisted ``client_state`` ({} the first time), its
   training tensors on the device, a CPU ``torch.Generator`` seeded from
   ``(run seed, "client", r, k)``, and the round's ``lr`` (from :meth:`Algorithm.lr`, so a per-round
   schedule such as IMA's mild exploration lives there) and ``local_epochs``.
   The default ``client_update`` runs :func:`local_sgd` with :meth:`Algorithm.extra_loss`
   added to the cross-entropy (FedProx's proximal term, FedGuCci's connectivity loss).
   Override ``client_update`` for custom training (SAM, model pools); reuse the pieces
   :func:`split_state`, :func:`forward`, :func:`minibatches`, :func:`sgd_step`,
   :func:`local_sgd`.
4. ``global_state, server_state = aggregate(global_state, updates, server_state, r)``;
   the default is the data-size-weighted average of the whole state_dict
   (:func:`weighted_average`, FedAvg).
5. The engine evaluates the new global model on the test set, calls
   ``local_metrics(EvalContext)`` (personalised methods return ``"local_accuracy"``) and
   writes the round's files.

State and what is stored (all tensors, safetensors; never pickles):

* ``global_state``: the *training-architecture* state (``build_module(template)``).
* ``server_state``: ``dict[str, Tensor]`` written per round to ``state/round_XXXX`` in the
  run dir and returned by ``Run.algorithm_state(r)``; put anchors, simplex endpoints,
  client points, IMA windows, model pools here. Prefix keys with the algorithm name.
* ``ClientUpdate.client_state``: per-client state kept on the server between rounds
  (optimizer moments, personal models, subregions). ``None`` leaves it unchanged. The
  engine keeps the latest one of every client on disk for resume.
* Everything random must come from a generator given to you (``ctx.generator``) or one
  made with :func:`make_generator` from the run seed and your own keys; never the global
  RNG. Then a resumed run equals an uninterrupted one bit for bit.

Different architectures (FLOCO's simplex classifier): return the training module from
``build_module(template)`` and implement ``export_state``, which maps a training state to
the *plain* template architecture. The engine stores exported states as the global and
client checkpoints (so ``Run.module()`` loads them and the landscape tools analyse them),
and, when ``build_module`` returned a module other than ``template``, also the training
global state under ``train/round_XXXX`` for resume (``Run.training_state(r)``). For FLOCO,
export the classifier at the simplex centre (or a client's point) and keep the endpoints
in ``server_state``.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from landscape.infra.errors import ConfigError

State = dict[str, Tensor]
ExtraLoss = Callable[[State, Tensor, Tensor, Tensor], "Tensor | None"]
LossFn = Callable[[Tensor, Tensor], Tensor]


# --------------------------------------------------------------------------- seeds
def derive_seed(*keys: int | str) -> int:
    """A 63-bit seed from a tuple of integer or string keys (e.g. run seed, round, client)."""
    words = [int(k) if not isinstance(k, str) else
             int.from_bytes(hashlib.sha256(k.encode()).digest()[:4], "little") for k in keys]
    if any(w < 0 for w in words):
        raise ConfigError(f"seed keys must be non-negative, got {keys}")
    return int(np.random.SeedSequence(words).generate_state(2, dtype=np.uint32).view(np.uint64)[0]
               >> np.uint64(1))


def make_generator(*keys: int | str) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from ``keys`` (see :func:`derive_seed`)."""
    gen = torch.Generator()
    gen.manual_seed(derive_seed(*keys))
    return gen


# ------------------------------------------------------------------------ contexts
@dataclass
class LocalContext:
    """Everything a client update may use. Tensors in the state dicts are on ``device``;
    do not modify ``global_state`` or ``server_state`` in place."""

    round: int
    client: int
    global_state: State          # the model the client received (training architecture)
    server_state: State          # algorithm server state (read-only here)
    client_state: State          # this client's persisted state ({} the first time)
    x: Tensor                    # client training inputs, on device
    y: Tensor                    # client training labels, on device
    generator: torch.Generator   # CPU generator seeded from (run seed, "client", round, client)
    lr: float                    # learning rate of this round (Algorithm.lr)
    local_epochs: int
    batch_size: int
    momentum: float
    weight_decay: float
    module: nn.Module            # training-architecture module on device, for functional_call
    options: Mapping[str, Any]   # resolved options of the algorithm
    config: Mapping[str, Any]    # full run configuration
    device: torch.device
    num_classes: int


@dataclass
class ClientUpdate:
    """What a client sends back. ``state`` is the full trained state_dict (CPU or device)."""

    state: State
    num_samples: int
    client_state: State | None = None          # None: keep the persisted one unchanged
    metrics: dict[str, float] = field(default_factory=dict)  # e.g. {"train_loss": ...}


@dataclass
class RoundContext:
    """Passed to :meth:`Algorithm.begin_round`. ``train(clients, tag)`` runs
    ``client_update`` for those clients from ``global_state`` with generators seeded from
    (seed, round, client, tag); the client states it returns are *not* persisted."""

    round: int
    global_state: State
    server_state: State
    sampled: list[int]
    num_clients: int
    train: Callable[[Sequence[int], str], dict[int, ClientUpdate]]


@dataclass
class EvalContext:
    """Passed to :meth:`Algorithm.local_metrics` after aggregation.

    ``client_data`` maps every client to its local test split (inputs, labels) on the
    device; it is empty unless the run holds out one (option ``local_test_fraction``).
    ``test_data`` is the global test set on the device.
    ``evaluate(state, x, y)`` returns (mean loss, accuracy) of a training-architecture
    state (or of a state for another module passed as ``module=``)."""

    round: int
    global_state: State
    server_state: State
    client_states: dict[int, State]
    updates: dict[int, ClientUpdate]
    client_data: dict[int, tuple[Tensor, Tensor]]
    test_data: tuple[Tensor, Tensor]
    evaluate: Callable[..., tuple[float, float]]
    module: nn.Module
    device: torch.device


# ----------------------------------------------------------------------- algorithm
class Algorithm:
    """Base class of FL algorithms; FedAvg's behaviour unless overridden (see module doc)."""

    name: ClassVar[str] = ""
    #: The algorithm's own options and their defaults (users pass them to ``fl.run``).
    options: ClassVar[Mapping[str, Any]] = {}
    #: Defaults this algorithm changes among the engine options (e.g. local_test_fraction).
    engine_defaults: ClassVar[Mapping[str, Any]] = {}
    #: True when ``local_metrics`` reports personalised accuracy.
    personalised: ClassVar[bool] = False

    def __init__(self, options: Mapping[str, Any], config: Mapping[str, Any]):
        self.opts: dict[str, Any] = dict(options)
        self.config = config
        self.seed = int(config["seed"])

    @classmethod
    def resolve_options(cls, given: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults filled in and values checked (override to validate; raise ConfigError).

        ``given`` holds only keys of ``cls.options`` (the engine rejects unknown ones)."""
        return {**cls.options, **given}

    # -- architecture and state -------------------------------------------------
    def build_module(self, template: nn.Module) -> nn.Module:
        """The module trained by this algorithm (default: the template itself)."""
        return template

    def export_state(self, state: State, server_state: State, client: int | None = None,
                     client_state: State | None = None) -> State:
        """Map a training state to the plain template architecture (default: identity)."""
        return state

    def init_server_state(self, global_state: State) -> State:
        """Algorithm server state before round 1 (default: none)."""
        return {}

    # -- schedules ---------------------------------------------------------------
    def lr(self, round: int) -> float:
        """Client learning rate of training round ``round`` (1-based):
        ``lr * lr_decay ** (round - 1)`` (``lr_decay`` = 1 - gamma of IMA §7.1.3)."""
        return float(self.config["lr"]) * (1.0 - float(self.config["lr_decay"])) ** (round - 1)

    def local_epochs(self, round: int) -> int:
        return int(self.config["local_epochs"])

    # -- round hooks -------------------------------------------------------------
    def participants(self, round: int, sampled: list[int]) -> list[int]:
        """Clients that train this round (default: the sampled ones)."""
        return sampled

    def begin_round(self, ctx: RoundContext) -> State:
        """Server work before local training; returns the server state (default: as is)."""
        return ctx.server_state

    def client_update(self, ctx: LocalContext) -> ClientUpdate:
        """Local SGD on cross-entropy plus :meth:`extra_loss`."""
        def extra(params: State, x: Tensor, y: Tensor, logits: Tensor) -> Tensor | None:
            return self.extra_loss(ctx, params, x, y, logits)

        result = local_sgd(ctx, extra_loss=extra)
        return ClientUpdate(result.state, len(ctx.y), None, {"train_loss": result.loss})

    def extra_loss(self, ctx: LocalContext, params: State, x: Tensor, y: Tensor,
                   logits: Tensor) -> Tensor | None:
        """Term added to the mini-batch cross-entropy; ``params`` are the trainable leaves."""
        return None

    def aggregate(self, global_state: State, updates: Mapping[int, ClientUpdate],
                  server_state: State, round: int) -> tuple[State, State]:
        """FedAvg: ``w = sum_k n_k / sum_j n_j * w_k`` over the whole state_dict."""
        return sample_weighted_average(global_state, updates), server_state

    def local_metrics(self, ctx: EvalContext) -> dict[str, float]:
        """Personalised metrics, e.g. ``{"local_accuracy": ..., "local_loss": ...}``."""
        return {}


# ------------------------------------------------------------------ state helpers
def sample_weighted_average(global_state: State, updates: Mapping[int, ClientUpdate]) -> State:
    """FedAvg's mean of the participants' states weighted by their sample counts. A round
    whose participants hold no samples at all (possible with ``min_size=0`` partitions)
    carries no information: the global state is kept."""
    ids = sorted(updates)
    counts = [updates[k].num_samples for k in ids]
    if ids and sum(counts) == 0:
        return {k: v.clone() for k, v in global_state.items()}
    return weighted_average([updates[k].state for k in ids], counts, like=global_state)


def weighted_average(states: Sequence[Mapping[str, Tensor]], weights: Sequence[float],
                     like: Mapping[str, Tensor] | None = None) -> State:
    """``sum_i (w_i / sum_j w_j) * state_i`` for every entry (FedAvg, IMA Eq. 5 window mean).

    Floating-point entries are accumulated in float64 in the order given and cast back to
    their dtype; integer entries (``num_batches_tracked``) become the rounded weighted mean.
    ``like`` (optional) gives the key order and device of the result.
    """
    if not states:
        raise ConfigError("cannot average an empty list of models")
    w = torch.tensor([float(v) for v in weights], dtype=torch.float64)
    if len(w) != len(states) or (w < 0).any() or w.sum() <= 0:
        raise ConfigError(f"averaging weights must be non-negative with a positive sum, got {weights}")
    w = w / w.sum()
    ref = like if like is not None else states[0]
    out: State = {}
    for name, target in ref.items():
        acc = torch.zeros(target.shape, dtype=torch.float64, device=target.device)
        for wi, s in zip(w.tolist(), states):
            acc += wi * s[name].to(target.device, torch.float64)
        out[name] = acc.to(target.dtype) if torch.is_floating_point(target) else acc.round().to(target.dtype)
    return out


def split_state(module: nn.Module, state: Mapping[str, Tensor], device: torch.device | None = None
                ) -> tuple[State, State]:
    """Fresh copies of ``state`` split into trainable leaf tensors (``requires_grad``) and
    buffers, following ``module.named_parameters()``."""
    names = {n for n, p in module.named_parameters() if p.requires_grad}
    params: State = {}
    buffers: State = {}
    for name, t in state.items():
        t = t.detach().to(device).clone() if device is not None else t.detach().clone()
        if name in names:
            params[name] = t.requires_grad_(True)
        else:
            buffers[name] = t
    return params, buffers


def forward(module: nn.Module, params: Mapping[str, Tensor], buffers: Mapping[str, Tensor],
            x: Tensor) -> Tensor:
    """``module(x)`` with the given tensors (``torch.func.functional_call``); BatchNorm in
    train mode updates the running statistics in ``buffers`` in place."""
    return functional_call(module, {**params, **buffers}, (x,))


def minibatches(n: int, batch_size: int, epochs: int, generator: torch.Generator
                ) -> Iterator[Tensor]:
    """Index tensors (CPU) of shuffled mini-batches, a fresh permutation per epoch; the
    last batch of an epoch may be smaller."""
    if n <= 0:
        return
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator)
        yield from perm.split(batch_size)


@dataclass
class LocalResult:
    state: State                  # trained state (params and buffers, detached, on device)
    loss: float                   # sample-weighted mean of loss_fn over all steps
    momentum: State               # SGD momentum buffers by parameter name


@torch.no_grad()
def sgd_step(params: Mapping[str, Tensor], grads: Mapping[str, Tensor | None], momentum_buf: State,
             *, lr: float, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
    """One in-place SGD step, as ``torch.optim.SGD`` (dampening 0, no Nesterov):
    ``d = g + wd * w``; ``b = d`` (first step) or ``b = momentum * b + d``; ``w -= lr * b``.
    Parameters whose gradient is None are skipped; ``momentum_buf`` is updated in place."""
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
              epochs: int | None = None, module: nn.Module | None = None) -> LocalResult:
    """Mini-batch SGD (:func:`sgd_step` with ``ctx.momentum``, ``ctx.weight_decay``) from
    ``state`` (default ``ctx.global_state``) on ``ctx.x, ctx.y``. The loss of a batch is
    ``loss_fn(logits, y) + extra_loss(params, x, y, logits)`` (FedAvg's local step; FedProx
    Eq. 2 with the proximal term as ``extra_loss``). Shuffling uses ``ctx.generator``.
    ``momentum_state`` restores momentum buffers (e.g. kept in the client state); the
    final buffers are returned."""
    module = module if module is not None else ctx.module
    module.train()
    start = state if state is not None else ctx.global_state
    params, buffers = split_state(module, start, ctx.device)
    buf: State = {k: v.to(ctx.device).clone() for k, v in (momentum_state or {}).items() if k in params}
    step_lr = ctx.lr if lr is None else lr
    names = list(params)
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    seen = 0
    for idx in minibatches(len(ctx.y), ctx.batch_size, ctx.local_epochs if epochs is None else epochs,
                           ctx.generator):
        idx = idx.to(ctx.device)
        x, y = ctx.x[idx], ctx.y[idx]
        logits = forward(module, params, buffers, x)
        loss = loss_fn(logits, y)
        objective = loss
        if extra_loss is not None:
            extra = extra_loss(params, x, y, logits)
            if extra is not None:
                objective = objective + extra
        grads = torch.autograd.grad(objective, [params[n] for n in names], allow_unused=True)
        sgd_step(params, dict(zip(names, grads)), buf, lr=step_lr, momentum=ctx.momentum,
                 weight_decay=ctx.weight_decay)
        total += loss.detach().double() * len(y)
        seen += len(y)
    trained = {**params, **buffers}
    return LocalResult({name: trained[name].detach() for name in start}, float(total) / max(seen, 1), buf)
