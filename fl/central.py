"""Central (non-federated) training: mini-batch SGD on one training set, optionally with FedGuCci's connectivity loss.

The models of FedGuCci Sec. 3 (transitivity of linear mode connectivity) are trained centrally,
each from its own initialisation: :class:`Trainer` trains them, with the connectivity loss to
a fixed anchor (Eq. 8) or without, under a constant or a cosine-annealed learning rate
(:func:`learning_rates`), and stores each model under a name that says how it was trained
(:meth:`Trainer.cached`). Seeds derive from ``(seed, key)`` (:func:`key_seed`), so a model is
the same on every platform and run, and the vanilla and the connectivity model of one key
see the same initialisation and data order.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F

from landscape.infra.errors import ConfigError
from landscape.space.checkpoints import load_state_dict, save_state_dict

from .algorithms.fedgucci import connectivity_loss
from .algorithms.sgd import minibatches, sgd_step
from .models import build_model

#: Learning-rate schedules of :class:`Trainer`.
SCHEDULES = ("constant", "cosine")


def key_seed(seed: int, *keys: str) -> int:
    """A 63-bit seed for ``(seed, *keys)`` (SHA-256; the same on every platform and run)."""
    digest = hashlib.sha256("/".join([str(seed), *keys]).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def learning_rates(lr: float, steps: int, schedule: str) -> list[float]:
    """The learning rate of each of ``steps`` SGD steps under ``schedule``.

    ``"constant"``: ``lr`` throughout; ``"cosine"`` (Loshchilov & Hutter 2017, Eq. 5 with one
    period): the rates ``torch.optim.lr_scheduler.CosineAnnealingLR`` sets over ``steps`` steps,
    read from the scheduler itself, so they are its values to the last bit (it computes them
    recursively, ``lr_t = lr_{t-1} (1 + cos(pi t / T)) / (1 + cos(pi (t-1) / T))``).

    Parameters
    ----------
    lr : float
        The initial learning rate.
    steps : int
        Number of SGD steps ``T``.
    schedule : str
        One of :data:`SCHEDULES`.

    Returns
    -------
    list[float]
        The rate of step ``t`` at index ``t``.

    Raises
    ------
    ConfigError
        For a schedule not in :data:`SCHEDULES`.
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if schedule == "constant":
        return [lr] * steps
    holder = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(holder, steps)
    rates = []
    for _ in range(steps):
        rates.append(float(holder.param_groups[0]["lr"]))
        holder.step()
        scheduler.step()
    return rates


@dataclass
class Trainer:
    """Central mini-batch SGD (momentum 0.9) on a training set.

    Optionally with FedGuCci's connectivity loss to a fixed anchor (Eq. 8: ``CE(w) + beta *
    CE(alpha w + (1 - alpha) w_anc)``, one ``alpha ~ U[0, 1]`` per mini-batch).

    ``schedule``: ``"constant"`` keeps ``lr``; ``"cosine"`` anneals it per step from ``lr`` to 0
    over the whole run (``lr_t = lr (1 + cos(pi t / T)) / 2``, Loshchilov & Hutter 2017), so the
    run ends at a point where training has stopped moving.
    """

    x: torch.Tensor
    y: torch.Tensor
    input_shape: tuple[int, ...]
    epochs: int
    lr: float
    batch_size: int
    seed: int
    model: str = "mlp"
    schedule: str = "constant"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")

    def init(self, key: str) -> torch.nn.Module:
        """The model initialised from ``key`` (its own random initialisation)."""
        return build_model(self.model, num_classes=10, input_shape=self.input_shape, seed=key_seed(self.seed, key))

    def train(self, key: str, *, anchor: Mapping[str, torch.Tensor] | None = None, beta: float = 0.0,
              steps: int | None = None, on_epoch: Callable[[int, torch.nn.Module], None] | None = None
              ) -> dict[str, torch.Tensor]:
        """Train the model initialised from ``key``.

        The data order also depends on ``key`` only, so the vanilla and the connectivity model of
        one key differ only by the loss. ``steps``: one pass over ``steps * batch_size`` random
        samples instead of ``epochs``. ``on_epoch(epoch, module)`` is called after every epoch
        (1-based), e.g. to record a learning curve; it must not change the module.
        """
        module = self.init(key).train()
        data_gen = torch.Generator().manual_seed(key_seed(self.seed, key, "data"))
        alpha_gen = torch.Generator().manual_seed(key_seed(self.seed, key, "alpha"))
        x, y = self.x, self.y
        if steps is not None:
            keep = torch.randperm(len(y), generator=data_gen)[:steps * self.batch_size]
            x, y = x[keep], y[keep]
        params = dict(module.named_parameters())
        trainable = {n: p for n, p in params.items() if p.requires_grad}  # what torch.optim.SGD would step
        buffers = {n: b for n, b in (anchor or {}).items() if n not in params}  # BN statistics of the anchor
        rates = iter(self.rates(1 if steps is not None else self.epochs, len(y)))
        momentum: dict[str, torch.Tensor] = {}
        for epoch in range(1 if steps is not None else self.epochs):
            for idx in minibatches(len(y), self.batch_size, 1, data_gen):
                loss = F.cross_entropy(module(x[idx]), y[idx])
                if anchor is not None and beta > 0:  # Eq. 7, one alpha ~ U[0, 1] per mini-batch
                    alphas = torch.rand(1, generator=alpha_gen, dtype=torch.float64)
                    loss = loss + beta * connectivity_loss(module, params, anchor, buffers, x[idx], y[idx], alphas)
                grads = torch.autograd.grad(loss, list(trainable.values()), allow_unused=True)
                sgd_step(trainable, dict(zip(trainable, grads)), momentum, lr=next(rates), momentum=0.9)
            if on_epoch is not None:
                on_epoch(epoch + 1, module)
        return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def rates(self, epochs: int, samples: int) -> list[float]:
        """The learning rate of every SGD step of ``epochs`` epochs over ``samples`` samples (:func:`learning_rates`).

        The schedule :meth:`train` follows: ``epochs * ceil(samples / batch_size)`` steps.
        """
        return learning_rates(self.lr, epochs * -(-samples // self.batch_size), self.schedule)

    def file_name(self, key: str, tag: str = "vanilla") -> str:
        """The stem under which :meth:`cached` stores ``key``'s model.

        The model, epochs, learning rate and schedule, batch size, seed, data size, key and
        ``tag``.
        """
        sched = "" if self.schedule == "constant" else f"-{self.schedule}"
        return (f"{self.model}-n{len(self.y)}-e{self.epochs}-lr{self.lr}{sched}-b{self.batch_size}-seed{self.seed}-"
                f"{key}-{tag}").replace(" ", "_")

    def cached(self, folder: Path, key: str, tag: str = "vanilla", **kwargs: Any) -> dict[str, torch.Tensor]:
        """``train(key, **kwargs)`` stored in ``folder`` as :meth:`file_name` and re-read by a later call.

        ``tag`` must name what ``kwargs`` change, e.g. the anchor and beta.
        """
        path = Path(folder) / f"{self.file_name(key, tag)}.safetensors"
        if path.exists():
            return load_state_dict(path)
        state = self.train(key, **kwargs)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_state_dict(state, path)
        return state
