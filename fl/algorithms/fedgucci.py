"""FedGuCci and FedGuCci+ (Li et al., ICLR draft / KDD '25).

"Improving Group Connectivity for Generalization of Federated Deep Learning".

Anchor pool (Eq. 11/12): in round ``t`` every client uses the ``N = anchors`` most recent
global models, the one it just received included: ``{w_g^j : j = max(1, t-N+1) .. t}``.
Local objective (Eq. 12/13), one mini-batch ``B``:

    L(w; B) + beta / |W_anc| * sum_j L(alpha_j w + (1 - alpha_j) w_anc,j; B)

with the anchors fixed (no gradient) and ``alpha_j ~ U[0, 1]`` drawn per step and anchor
(Eq. 7, Monte-Carlo over ``alpha_samples`` draws). The gradient of a connectivity term
w.r.t. ``w`` is ``alpha * grad L`` at the interpolated point. All parameters are
interpolated; BatchNorm buffers of the interpolated model are those of the newest anchor
(copied, so the local model's statistics are untouched), as in the official code.

Options (paper defaults unless marked [code]):

* ``beta`` 0.1 ([code] default; the paper gives none). ``anchors`` N = 1, the official code's
  default (``group_model_num``; the papers give no value, only that N > 1 gives a more
  connected region than the current global model alone, Sec. 3.3): by default the pool is the
  model the client just received. Pass ``anchors=N`` for the sliding window of Eq. 11.
* ``alpha_sampler``: ``"uniform"`` (paper) or ``"fixed"`` (value ``fixed_alpha``, 0.5 in [code]).
* ``update``: ``"joint"`` (one optimiser step on Eq. 12 per batch, paper) or
  ``"sequential"`` ([code], §3.5: a cross-entropy step, then one step per anchor on
  ``beta / N * L(interpolated)``, newest anchor first).
* ``calibration`` tau and ``sam_rho``: FedGuCci+ (§4): FedLC logit calibration
  ``CE(z - tau * n_c^{-1/4}, y)`` with ``n_c`` the client's class counts (absent classes are
  masked), used in every loss term; SAM (FedSAM) with radius ``rho``: ascend to
  ``w + rho g / |g|_2``, take the gradient there, step from ``w``. SAM wraps every optimiser
  step. ``"fedgucci+"`` sets tau = 0.1 and rho = 0.05 ([code] defaults); ``"fedgucci"`` has
  both 0. FedGuCci+ comes in two readings: the paper's (``update="joint"``, the default: one
  SAM step on the whole Eq. 12 objective per batch) and the official code's
  (``update="sequential"``: N + 1 SAM steps per batch, the calibrated CE first, then one per
  anchor, each with its own ascent). The code's SAM branch also lets the interpolated
  model's gradients accumulate between its two backward passes; that quirk is not
  reproduced (each SAM step here uses the gradient at the perturbed point only).

Stored per round (``Run.algorithm_state(r)``): ``fedgucci.anchor.{i}.{name}`` (i = 0 oldest)
and ``fedgucci.anchor_rounds``: anchor ``i`` is ``Run.global_state(anchor_rounds[i])``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Literal, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from landscape.infra.errors import ConfigError
from landscape.infra.options import Options, option

from .base import (
    Algorithm,
    ClientUpdate,
    LocalContext,
    LossFn,
    RoundContext,
    State,
    forward,
    make_generator,
    minibatches,
    sgd_step,
    split_state,
)
from .sgd import bound

PREFIX = "fedgucci."
ALPHA_SAMPLERS = ("uniform", "fixed")
UPDATES = ("joint", "sequential")


def calibrated_cross_entropy(labels: Tensor, num_classes: int, tau: float) -> LossFn:
    """FedLC logit calibration.

    ``CE(z - tau * n^{-1/4}, y)`` with ``n`` the per-class counts of ``labels`` (classes with
    no samples get ``-inf`` logits, i.e. are masked).
    """
    if tau == 0:
        return F.cross_entropy
    counts = torch.bincount(labels, minlength=num_classes).to(torch.float32)
    offset = tau * counts.pow(-0.25)

    def loss(logits: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(logits - offset.to(logits.dtype), y)

    return loss


def interpolate(params: Mapping[str, Tensor], anchor: Mapping[str, Tensor], alpha: float) -> State:
    """``alpha * w + (1 - alpha) * w_anc`` for every trainable tensor; the anchor is detached."""
    return {n: alpha * p + (1 - alpha) * anchor[n].detach() for n, p in params.items()}


def connectivity_loss(module: nn.Module, params: Mapping[str, Tensor], anchor: Mapping[str, Tensor],
                      buffers: Mapping[str, Tensor], x: Tensor, y: Tensor, alphas: Tensor,
                      loss_fn: LossFn = F.cross_entropy) -> Tensor:
    """Monte-Carlo estimate of Eq. 7, ``mean_s L(alpha_s w + (1 - alpha_s) w_anc)`` on one batch.

    ``buffers`` are copied for every forward pass (BatchNorm statistics are not changed).
    """
    total = torch.zeros((), device=x.device)
    for a in alphas.tolist():
        theta = interpolate(params, anchor, a)
        total = total + loss_fn(forward(module, theta, {n: b.clone() for n, b in buffers.items()}, x), y)
    return total / len(alphas)


def sam_gradients(params: Mapping[str, Tensor], objective: Callable[[], Tensor], rho: float
                  ) -> tuple[Tensor, dict[str, Tensor | None]]:
    """The gradient an optimiser step on ``objective`` takes (SAM with radius ``rho`` when ``rho > 0``).

    ``g = grad f(w)``; with SAM (FedSAM) the gradient at the ascent point ``w + rho g / |g|_2``
    instead, the parameters being back at ``w`` on return.

    Parameters
    ----------
    params : Mapping[str, Tensor]
        The trainable leaves ``w`` (shifted in place and back for SAM).
    objective : callable
        ``() -> f(w)``, a scalar built from ``params``.
    rho : float
        SAM radius (0: the plain gradient).

    Returns
    -------
    tuple[Tensor, dict[str, Tensor | None]]
        ``f(w)`` (detached) and the gradient per name (None where ``f`` does not use it).

    Examples
    --------
    >>> w = {"w": torch.tensor([3.0, 4.0], requires_grad=True)}
    >>> value, g = sam_gradients(w, lambda: 0.5 * (w["w"] ** 2).sum(), rho=0.5)
    >>> float(value), g["w"].tolist()                       # grad at w + 0.5 * w / |w|
    (12.5, [3.299999952316284, 4.400000095367432])
    """
    names = list(params)

    def gradients() -> tuple[Tensor, dict[str, Tensor | None]]:
        value = objective()
        grads = torch.autograd.grad(value, [params[n] for n in names], allow_unused=True)
        return value.detach(), dict(zip(names, grads))

    value, grads = gradients()
    if rho <= 0:
        return value, grads
    found = [g for g in grads.values() if g is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in found]))
    scale = rho / (norm + 1e-12)
    with torch.no_grad():
        shifts = {n: g * scale for n, g in grads.items() if g is not None}
        for n, e in shifts.items():
            params[n].add_(e)
    try:
        return value, gradients()[1]
    finally:
        with torch.no_grad():
            for n, e in shifts.items():
                params[n].sub_(e)


@dataclasses.dataclass(frozen=True)
class FedGuCciOptions(Options):
    """Options of FedGuCci (Li et al., KDD '25)."""

    beta: float = option(0.1, ge=0, le=1e4, help="weight beta of the connectivity loss",
                         source="official code (the paper gives none)")
    anchors: int = option(1, ge=1, le=10_000, help="anchor pool size N (most recent global models)",
                          source="official code default (FedGuCci Eq. 11 gives no value)")
    alpha_sampler: Literal[ALPHA_SAMPLERS] = option("uniform", help="how alpha is drawn: uniform U[0,1] "  # type: ignore[valid-type]
                                                    "(paper) or fixed", source="FedGuCci Eq. 7")
    fixed_alpha: float = option(0.5, ge=0, le=1, help="alpha of alpha_sampler 'fixed'", source="official code")
    alpha_samples: int = option(1, ge=1, le=10_000, help="Monte-Carlo draws of alpha per step and anchor",
                                source="FedGuCci Eq. 7")
    update: Literal[UPDATES] = option("joint", help="joint: one step on Eq. 12 per batch (paper); "  # type: ignore[valid-type]
                                      "sequential: the official code's steps", source="FedGuCci Sec. 3.5")
    calibration: float = option(0.0, ge=0, le=100, help="FedLC logit calibration tau (FedGuCci+)",
                                source="FedGuCci Sec. 4")
    sam_rho: float = option(0.0, ge=0, le=100, help="SAM radius rho (FedGuCci+)", source="FedGuCci Sec. 4")


@dataclasses.dataclass(frozen=True)
class FedGuCciPlusOptions(FedGuCciOptions):
    """Options of FedGuCci+: FedGuCci's with calibration and SAM on."""

    calibration: float = option(0.1, ge=0, le=100, help="FedLC logit calibration tau",
                                source="official code default")
    sam_rho: float = option(0.05, ge=0, le=100, help="SAM radius rho", source="official code default")


class FedGuCci(Algorithm):
    """FedGuCci: local SGD plus the connectivity loss to the last ``anchors`` global models."""

    name = "fedgucci"
    Options = FedGuCciOptions

    # -- anchor pool (Eq. 11) -------------------------------------------------------
    def begin_round(self, ctx: RoundContext) -> State:
        """Append the model broadcast this round to the pool and keep the newest ``anchors`` entries.

        The broadcast model is ``Run.global_state(round - 1)``.
        """
        pool, rounds = anchor_pool(ctx.server_state)
        pool.append({n: t.detach().clone() for n, t in ctx.global_state.items()})
        rounds.append(ctx.round - 1)
        keep = int(self.opts.anchors)
        pool, rounds = pool[-keep:], rounds[-keep:]
        state = {k: v for k, v in ctx.server_state.items() if not k.startswith(PREFIX)}
        for i, anchor in enumerate(pool):
            state.update({f"{PREFIX}anchor.{i}.{n}": t for n, t in anchor.items()})
        state[f"{PREFIX}anchor_rounds"] = torch.tensor(rounds, dtype=torch.int64)
        return state

    # -- local training (Eq. 12) ----------------------------------------------------
    def _alphas(self, generator: torch.Generator) -> Tensor:
        n = int(self.opts.alpha_samples)
        if self.opts.alpha_sampler == "fixed":
            return torch.full((n,), self.opts.fixed_alpha, dtype=torch.float64)
        return torch.rand(n, generator=generator, dtype=torch.float64)

    def client_update(self, ctx: LocalContext) -> ClientUpdate:
        """Local SGD on Eq. 12 (``train_loss``: the local, calibrated when tau > 0, CE)."""
        beta, rho = self.opts.beta, self.opts.sam_rho
        loss_fn = calibrated_cross_entropy(ctx.y, ctx.num_classes, self.opts.calibration)
        params, buffers = split_state(ctx.module, ctx.global_state, ctx.device)
        anchors = anchor_pool(ctx.server_state)[0][::-1] if beta > 0 else []  # newest first
        if beta > 0 and not anchors:
            raise ConfigError("fedgucci: no anchor models in the server state; begin_round must run first")
        anchor_buffers = {n: anchors[0][n] for n in buffers} if anchors else {}
        weight = beta / max(len(anchors), 1)
        # alpha has its own stream, so the data order equals FedAvg's for the same seed
        alpha_gen = make_generator(self.seed, "fedgucci-alpha", ctx.round, ctx.client)
        momentum: State = {}

        def step(objective: Callable[[], Tensor]) -> None:  # one optimiser step (torch.optim.SGD's)
            grads = sam_gradients(params, objective, rho)[1]
            sgd_step(params, grads, momentum, lr=ctx.lr, momentum=ctx.momentum, weight_decay=ctx.weight_decay)

        ctx.module.train()
        total = torch.zeros((), dtype=torch.float64, device=ctx.device)
        seen = 0
        with bound(ctx.module, params, buffers) as model:
            for idx in minibatches(len(ctx.y), ctx.batch_size, ctx.local_epochs, ctx.generator):
                idx = idx.to(ctx.device)
                x, y = ctx.x[idx], ctx.y[idx]
                alphas = [self._alphas(alpha_gen) for _ in anchors]
                ce_value: list[Tensor] = []

                def ce() -> Tensor:
                    value = loss_fn(model(x), y)
                    ce_value.append(value.detach())
                    return value

                def conn(j: int) -> Tensor:
                    return weight * connectivity_loss(ctx.module, params, anchors[j], anchor_buffers, x, y,
                                                      alphas[j], loss_fn)

                if self.opts.update == "joint" and anchors:
                    step(lambda: ce() + sum(conn(j) for j in range(len(anchors))))
                else:
                    step(ce)
                    for j in range(len(anchors)):
                        step(lambda j=j: conn(j))
                total += ce_value[0].double() * len(y)
                seen += len(y)
        trained = {n: t.detach() for n, t in {**params, **buffers}.items()}
        state = {n: trained[n] for n in ctx.global_state}
        return ClientUpdate(state, len(ctx.y), None, {"train_loss": float(total) / max(seen, 1)})


class FedGuCciPlus(FedGuCci):
    """FedGuCci+ (§4): FedGuCci with FedLC logit calibration (tau 0.1) and SAM (rho 0.05)."""

    name = "fedgucci+"
    Options = FedGuCciPlusOptions


def anchor_pool(server_state: Mapping[str, Tensor]) -> tuple[list[State], list[int]]:
    """The anchors (oldest first) and the stored rounds they are the global model of."""
    key = f"{PREFIX}anchor_rounds"
    if key not in server_state:
        return [], []
    rounds = [int(r) for r in server_state[key].tolist()]
    pool: list[State] = [{} for _ in rounds]
    head = f"{PREFIX}anchor."
    for name, t in server_state.items():
        if name.startswith(head):
            index, _, tensor_name = name[len(head):].partition(".")
            pool[int(index)][tensor_name] = t
    return pool, rounds
