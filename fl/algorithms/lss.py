"""Local Superior Soups (LSS; Chen et al., NeurIPS 2024, Algorithm 1, Sec. 3.3).

Each client builds, from the model it received ``f_p``, a pool of models trained one after
another; member ``i`` starts at the uniform mean of the pool so far and is the only one
updated while it trains. Every step uses a random convex combination of the pool
(Sec. 3.3.1, ``alpha ~ Dirichlet(concentration * 1)``, one draw per step, or the mean loss
over ``interp_samples`` draws) and minimises (Algorithm 1 line 7)

    CE(sum_j alpha_j f_j; B) + lambda_a * dist(f_a, f_p) - lambda_d * div(f_a, pool)

(affinity Eq. 5 pulls towards ``f_p``, diversity Eq. 4 pushes away from the other members).

Formulations. The default uses the official code's squared distances and coefficient scale:
``distance="sq_l2"`` (squared L2 over all trainable tensors) for the affinity and for the
mean distance to the other members (``diversity_measure="mean"``), with the code's
coefficients ``affinity = diversity = 1e-3``. ``diversity_measure="volume"`` is the official
code's diversity term itself: the Cayley-Menger determinant of the squared distances between
all members, the active one included, ``|det CM| / (((n-1)!)^2 2^(n-1))``, i.e. the squared
volume of their simplex; it grows like distance^(2(n-1)) and, measured on the digits MLP
(4 members, 20 rounds), came to dominate the task gradient in some rounds, hence not the
default. The paper's literal form (Sec. 3.3.2-3.3.3, App. E.1) is ``distance="l2",
diversity_measure="mean", affinity=3, diversity=3``: unsquared L2 (``sqrt(|d|^2 + 1e-12)``,
smooth at 0) and the mean distance to the other members. Coefficients do not carry over
between formulations.

Scale warning: the unsquared L2 terms have gradients of norm ``lambda`` whatever the model
size, so the paper's ``lambda = 3`` (tuned for a pre-trained ResNet-18 with Adam) swamps the
task gradient of a small randomly initialised model, which then stays near chance, while the
code's ``1e-3`` on squared distances gives gradients of about 1% of the task gradient (measured
on MNIST-1D), which change nothing. Hence the calibration.

Calibration (``regulariser_calibration=c``; our formulation, not the paper's): at every step the
regularisers' gradient with respect to the active member, ``g_r = grad(lambda_a dist - lambda_d
div)`` (Algorithm 1 line 7, Eq. 4-5), is rescaled to norm ``c * |g_t|``, where ``g_t`` is that
step's task-loss gradient (its norm is a detached number): the update direction is ``g_t + c
|g_t| g_r / |g_r|``. One scale multiplies both terms, so ``affinity : diversity`` still sets
their mix and signs, and ``c`` their strength. The paper's analysis only bounds the
regularisers' step by a constant (Assumption B.4), which enters the local-step budget of Eq. 3
and Theorem 3.1; here the step is a fixed fraction of the task gradient instead. A step at which
``|g_r|`` or ``|g_t|`` is exactly 0 has no direction to rescale, and the regulariser is skipped
at that step (client metric ``regulariser_skipped_steps`` counts them): the first trained
member's first step, which starts at ``f_p`` where both terms are stationary, and, with
diversity alone, the next member's first step, which starts at the only other member. (A later
member starts at the float64 pool mean rounded to the model's dtype, where the mean-distance
diversity gradient is rounding-sized but not 0: it is rescaled like any other for that step.)
Any ``c < 1`` keeps every plain gradient step a descent direction of the batch's task loss,
``<g_t, g_t + g_r> >= (1 - c) |g_t|^2``, at most ``arcsin c`` away from ``g_t``.

Default ``regulariser_calibration`` 0.1: a mini-batch's ``g_t`` carries sampling noise that
partly cancels over steps, while ``g_r`` changes slowly and points much the same way step after
step, so even a tenth of it moves the pool far. Measured on the ``lss-mnist1d`` setting
(``mnist1d_cnn``, 5 clients, Adam 5e-4, 4 members of 8 epochs; first round, seed 0) with the
paper's form (``distance="l2"``, ``affinity = diversity``): ``pool_mean_distance`` 1.07 without
regularisers, 1.67 / 1.91 / 1.82 at ``c`` = 0.1 / 0.25 / 0.5; test accuracy 0.228 without, 0.234
/ 0.191 / 0.118 with. After the recipe's third round, at ``c = 0.1``: distance 0.93 against
0.44, accuracy 0.332 against 0.373 (one seed): the pool spreads twice as far, at some cost in
accuracy. With the squared distances at equal weights the two terms' gradients sum, for every
member after the first, to ``2 lambda (mean(other members) - f_p)`` whatever ``f_a`` (its
dependence cancels): a constant push, which moved the distance by 4% only at ``c = 0.1``.
``regulariser_calibration=None``: the coefficients are absolute weights, as in the paper and the
official code.

Metrics (client metrics, averaged over the clients by sample count into the round's
metrics): ``regulariser_gradient_ratio`` = sum over steps of the norm of the regularisers'
gradient as added to the update / sum over the same steps of ``|g_t|`` (steps with large task
gradients weigh most, so a member that has fitted its data does not count as dominated; the
steps are those with a regulariser, less the skipped ones); with calibration it is measured on
the rescaled gradient and reads ``c`` up to float32 rounding. When a member's ratio exceeds 1 the
first time in a run, the update emits a ``RuntimeWarning`` naming it. ``pool_mean_distance`` =
mean over all pairs of the client's final pool (the frozen ``f_p`` included under
``"anchor_frozen"``) of the unsquared L2 distance over the trainable tensors (absent with one
pool entry).

Compute: with ``budget="per_member"`` (default, the paper's) every member trains
``epochs_per_member`` epochs, so a client makes ``members * epochs_per_member`` epochs of
steps, each with ``interp_samples`` forward passes. FedAvg at the same step budget is
``fl.run("fedavg", local_epochs=members * epochs_per_member)``. ``budget="split"`` instead
splits the run's ``local_epochs`` of mini-batches (drawn exactly as FedAvg draws them) into
``members`` consecutive chunks, one per member: LSS then takes exactly FedAvg's number of
gradient steps on the same batches (a compute-matched comparison, one gradient per step).
``budget="official"`` is the released code's schedule: member 0 trains ``epochs_per_member``
epochs with a step per batch; every added member trains ``epochs_per_member // 8`` epochs (one
for the paper's 8) and steps only at every ``accumulation``-th batch of an epoch (the code's
15). The code clears the gradient at every batch, so such a step uses its own batch's
gradient only, with the task loss summed over the ``interp_samples`` combinations (the code's
``loss.div`` result is discarded) and divided by ``accumulation``; the regularisers keep
their coefficients. Those are reproduced as written. An epoch of fewer than ``accumulation``
batches therefore gives an added member no step at all (client metric
``added_member_steps``): with small clients, the code's LSS is member 0's training copied
``members - 1`` times, i.e. FedAvg with the affinity term.

``pool_seed`` (docs/methods/lss.md): ``"anchor_trained"`` (default, the official code's
reading): ``members`` trained models, the first a trainable copy of ``f_p`` (task loss and
affinity only, there are no other members yet); ``"anchor_frozen"`` (Algorithm 1 read
literally): the frozen ``f_p`` is pool member 0 and is part of the interpolation and of the
final average, followed by ``members`` trained models. Defaults: ``members`` 4,
``epochs_per_member`` = the run's local epochs (the paper's 8 "steps" are epochs), optimiser
SGD with the run's lr/momentum/weight decay (``optimizer="adam"`` for the paper's Adam; pass
``lr=5e-4``). BatchNorm buffers are shared by all members and updated by the interpolated
forward passes (as in the official code).

Stored (``Run.algorithm_state(r)``): ``lss.pool.{client}.{i}.{name}`` for each stored
client's pool members (i = 0 first), trainable tensors only; ``store_pools`` is True (all
clients), False, or a list of client ids.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import warnings
from typing import Any, Literal, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from landscape.infra.options import Options, option

from .base import (
    Algorithm,
    ClientUpdate,
    LocalContext,
    State,
    forward,
    make_generator,
    minibatches,
    split_state,
    weighted_average,
)
from .proximal import squared_distance
from .simplex import sample_uniform_simplex

PREFIX = "lss."
POOL_SEEDS = ("anchor_trained", "anchor_frozen")
DISTANCES = ("l2", "sq_l2")
DIVERSITY_MEASURES = ("mean", "volume")
OPTIMIZERS = ("sgd", "adam")
BUDGETS = ("per_member", "split", "official")


def distance(a: Mapping[str, Tensor], b: Mapping[str, Tensor], kind: str = "l2") -> Tensor:
    """L2 distance ``sqrt(sum |a - b|^2 + 1e-12)`` over the tensors of ``a`` (``"sq_l2"``: squared)."""
    sq = squared_distance(a, b)
    return sq if kind == "sq_l2" else torch.sqrt(sq + 1e-12)


def simplex_volume_sq(members: Sequence[Mapping[str, Tensor]]) -> Tensor:
    """Squared volume of the simplex spanned by ``members``.

    The Cayley-Menger determinant of their squared pairwise L2 distances, ``|det CM| /
    (((n-1)!)^2 2^(n-1))`` (official code).
    """
    n = len(members)
    device = next(iter(members[0].values())).device
    cm = torch.zeros(n + 1, n + 1, dtype=torch.float64, device=device)
    cm[0, 1:] = 1.0
    cm[1:, 0] = 1.0
    for i, j in itertools.combinations(range(n), 2):
        cm[i + 1, j + 1] = cm[j + 1, i + 1] = distance(members[i], members[j], "sq_l2").double()
    return torch.linalg.det(cm).abs() / (math.factorial(n - 1) ** 2 * 2 ** (n - 1))


def _norm(tensors: Sequence[Tensor]) -> float:
    """Global L2 norm of a sequence of tensors."""
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors])))


def calibrate(reg_grads: Sequence[Tensor], task_norm: float, fraction: float) -> tuple[Tensor, ...] | None:
    """The regularisers' gradient rescaled to norm ``fraction * task_norm`` (same direction).

    Parameters
    ----------
    reg_grads : Sequence[Tensor]
        Gradient of the regularisers with respect to the active member, one tensor per parameter.
    task_norm : float
        Norm of the task-loss gradient at the same step (a number: no gradient flows through it).
    fraction : float
        Target ratio of the two norms (the ``regulariser_calibration`` option).

    Returns
    -------
    tuple[Tensor, ...] or None
        The rescaled tensors, or None when either norm is 0 (nothing to rescale: the step is
        taken without the regularisers).
    """
    reg_norm = _norm(reg_grads)
    if reg_norm == 0.0 or task_norm == 0.0:
        return None
    scale = fraction * task_norm / reg_norm
    return tuple(g * scale for g in reg_grads)


def mean_pairwise_distance(pool: Sequence[Mapping[str, Tensor]]) -> float | None:
    """Mean unsquared L2 distance over all pairs of pool members (None with fewer than two).

    Parameters
    ----------
    pool : Sequence[Mapping[str, Tensor]]
        The members (trainable tensors), in any order.

    Returns
    -------
    float or None
        ``mean_{i<j} |f_i - f_j|``, summed in float64; None when there is no pair.
    """
    pairs = list(itertools.combinations(pool, 2))
    if not pairs:
        return None
    return sum(math.sqrt(float(sum(((a[n].double() - b[n].double()) ** 2).sum() for n in a)))
               for a, b in pairs) / len(pairs)


def mix(pool: Sequence[Mapping[str, Tensor]], weights: Tensor) -> State:
    """``sum_j weights_j * pool_j`` for every tensor."""
    return {n: sum(w * m[n] for w, m in zip(weights.tolist(), pool)) for n in pool[0]}


def pool_mean(pool: Sequence[Mapping[str, Tensor]]) -> State:
    """Uniform weight average of the pool (float64 accumulation)."""
    return weighted_average(list(pool), [1.0] * len(pool))


@dataclasses.dataclass(frozen=True)
class LSSOptions(Options):
    """Options of LSS (Chen et al., NeurIPS 2024)."""

    members: int = option(4, ge=1, le=1000, help="trained pool members per client", source="LSS Algorithm 1")
    affinity: float = option(1e-3, ge=0, le=1e4, help="affinity weight lambda_a", source="LSS Eq. 5; official code")
    diversity: float = option(1e-3, ge=0, le=1e4, help="diversity weight lambda_d", source="LSS Eq. 4; official code")
    distance: Literal[DISTANCES] = option("sq_l2", help="distance of the affinity term",  # type: ignore[valid-type]
                                          source="official code (sq_l2); paper: l2")
    diversity_measure: Literal[DIVERSITY_MEASURES] = option(  # type: ignore[valid-type]
        "mean", help="mean distance to the other members (paper) or simplex volume (official code)",
        source="LSS Eq. 4")
    pool_seed: Literal[POOL_SEEDS] = option("anchor_trained", help="how the pool starts",  # type: ignore[valid-type]
                                            source="LSS Algorithm 1 / official code")
    interp_samples: int = option(1, ge=1, le=1000, help="random convex combinations per step",
                                 source="LSS Sec. 3.3.1")
    concentration: float = option(1.0, gt=0, le=1e4, help="Dirichlet concentration of the combinations",
                                  source="LSS Sec. 3.3.1 (uniform)")
    epochs_per_member: int | None = option(None, ge=1, le=10_000, help="epochs per member (default: the "
                                           "run's local epochs)", source="LSS Sec. 4 (8 epochs)")
    budget: Literal[BUDGETS] = option("per_member", help="per_member: epochs_per_member each; split: the "  # type: ignore[valid-type]
                                      "run's local epochs split over the members; official: the official "
                                      "code's schedule (see fl.algorithms.lss)", source="ours / official code")
    accumulation: int = option(15, ge=1, le=10_000, help="budget=official: an added member steps at every "
                               "accumulation-th batch of an epoch", source="official code (15)")
    optimizer: Literal[OPTIMIZERS] = option("sgd", help="local optimiser (paper: adam)",  # type: ignore[valid-type]
                                            source="LSS Sec. 4")
    regulariser_calibration: float | None = option(
        0.1, gt=0, le=100, help="scale the regularisers' gradient to this fraction of the task gradient's norm "
        "at every step (None, on the command line -o regulariser_calibration=null: the coefficients are "
        "absolute)", source="ours (0.1: see fl.algorithms.lss)")
    store_pools: bool | list[int] = option(True, ge=0, help="store the pools: true, false or a JSON list "
                                           "of client ids", source="ours")

    def resolved(self, config: Mapping[str, Any]) -> "LSSOptions":
        """``epochs_per_member`` defaults to the run's local epochs.

        Parameters
        ----------
        config : Mapping[str, Any]
            The run configuration.

        Returns
        -------
        LSSOptions
            The options with the derived defaults set.
        """
        if self.epochs_per_member is not None:
            return self
        return dataclasses.replace(self, epochs_per_member=int(config["local_epochs"]))


class LSS(Algorithm):
    """LSS: each client sends the average of a pool of interpolation-trained models."""

    name = "lss"
    Options = LSSOptions
    _warned = False  # set on the instance after the first regulariser-dominance warning

    def _stores(self, client: int) -> bool:
        stored = self.opts.store_pools
        return stored if isinstance(stored, bool) else client in stored

    def _optimizer(self, ctx: LocalContext, params: list[Tensor]) -> torch.optim.Optimizer:
        if self.opts.optimizer == "adam":
            return torch.optim.Adam(params, lr=ctx.lr, weight_decay=ctx.weight_decay)
        return torch.optim.SGD(params, lr=ctx.lr, momentum=ctx.momentum, weight_decay=ctx.weight_decay)

    def _diversity(self, active: State, pool: Sequence[State]) -> Tensor:
        """Eq. 4: mean distance to the other members, or the code's simplex volume term."""
        if self.opts.diversity_measure == "volume":
            return simplex_volume_sq([*pool, active]).to(next(iter(active.values())).dtype)
        return sum(distance(active, m, self.opts.distance) for m in pool) / len(pool)

    def _member_batches(self, ctx: LocalContext) -> list[list[tuple[Tensor, bool]]]:
        """Mini-batch index tensors of each member, each with whether an optimiser step follows it.

        ``epochs_per_member`` epochs each, the run's ``local_epochs`` of batches split into
        ``members`` consecutive chunks, or the official code's schedule (module docstring).
        """
        members, epochs = int(self.opts.members), int(self.opts.epochs_per_member)
        if self.opts.budget == "split":
            batches = list(minibatches(len(ctx.y), ctx.batch_size, ctx.local_epochs, ctx.generator))
            bounds = [round(i * len(batches) / members) for i in range(members + 1)]
            return [[(b, True) for b in batches[a:z]] for a, z in zip(bounds, bounds[1:])]
        if self.opts.budget == "per_member":
            return [[(b, True) for b in minibatches(len(ctx.y), ctx.batch_size, epochs, ctx.generator)]
                    for _ in range(members)]
        every = int(self.opts.accumulation)
        schedule = [[(b, True) for b in minibatches(len(ctx.y), ctx.batch_size, epochs, ctx.generator)]]
        for _ in range(members - 1):
            schedule.append([(b, (j + 1) % every == 0) for _ in range(epochs // 8)
                             for j, b in enumerate(minibatches(len(ctx.y), ctx.batch_size, 1, ctx.generator))])
        return schedule

    def _task_divisor(self, member: int) -> int:
        """What the summed task loss of a step is divided by (the code's scaling under ``budget="official"``)."""
        if self.opts.budget == "official" and member > 0:
            return int(self.opts.accumulation)
        return int(self.opts.interp_samples)

    def _regulariser(self, active: State, anchor: State, pool: Sequence[State]) -> Tensor | None:
        """``lambda_a * dist(f_a, f_p) - lambda_d * div(f_a, pool)``; None when both are off."""
        o = self.opts
        terms = []
        if o.affinity > 0:
            terms.append(o.affinity * distance(active, anchor, o.distance))
        if pool and o.diversity > 0:
            terms.append(-o.diversity * self._diversity(active, pool))
        return sum(terms) if terms else None

    def client_update(self, ctx: LocalContext) -> ClientUpdate:
        """Algorithm 1: train the pool member by member, upload its uniform average.

        The gradients of the task loss and of the regularisers are taken separately, so that
        their norms can be compared (metric ``regulariser_gradient_ratio``; a
        ``RuntimeWarning`` when a member's summed regulariser norm exceeds its summed task norm)
        and, with ``regulariser_calibration``, the regularisers' gradient rescaled (:func:`calibrate`).
        """
        o = self.opts
        anchor, buffers = split_state(ctx.module, ctx.global_state, ctx.device)
        anchor = {n: t.detach() for n, t in anchor.items()}
        pool: list[State] = [anchor] if o.pool_seed == "anchor_frozen" else []
        alpha_gen = make_generator(self.seed, "lss-alpha", ctx.round, ctx.client)
        ctx.module.train()
        total = torch.zeros((), dtype=torch.float64, device=ctx.device)
        seen = 0
        norms = [0.0, 0.0]  # summed |grad reg| and |grad CE| over the client's steps
        skipped = 0  # calibrated steps taken without the regularisers (a zero gradient)
        added_steps = 0  # optimiser steps of the members after the first
        for i, batches in enumerate(self._member_batches(ctx)):
            start = pool_mean(pool) if pool else anchor
            active = {n: t.detach().clone().requires_grad_(True) for n, t in start.items()}
            params = list(active.values())
            opt = self._optimizer(ctx, params)
            member = [0.0, 0.0]
            for idx, step in batches:
                idx = idx.to(ctx.device)
                x, y = ctx.x[idx], ctx.y[idx]
                members = pool + [active]
                summed = torch.zeros((), device=ctx.device)
                for alpha in sample_uniform_simplex(len(members), int(o.interp_samples), alpha_gen,
                                                    float(o.concentration)).double():
                    summed = summed + F.cross_entropy(forward(ctx.module, mix(members, alpha), buffers, x), y)
                total += summed.detach().double() / int(o.interp_samples) * len(y)
                seen += len(y)
                if not step:  # the official schedule's skipped batch: its gradient is discarded
                    continue
                grads = torch.autograd.grad(summed / self._task_divisor(i), params)
                reg = self._regulariser(active, anchor, pool)
                if reg is not None:
                    reg_grads: tuple[Tensor, ...] | None = torch.autograd.grad(reg, params)
                    task_norm = _norm(grads)
                    if o.regulariser_calibration is not None:
                        reg_grads = calibrate(reg_grads, task_norm, float(o.regulariser_calibration))
                    if reg_grads is None:
                        skipped += 1
                    else:
                        member[0] += _norm(reg_grads)
                        member[1] += task_norm
                        grads = tuple(g + h for g, h in zip(grads, reg_grads))
                for p, g in zip(params, grads):
                    p.grad = g
                opt.step()
                added_steps += i > 0
            if member[0] > member[1] and not self._warned:
                self._warned = True  # once per run: the metric records every round's ratio
                warnings.warn(f"lss: the affinity/diversity regularisers dominate the task loss gradient for "
                              f"member {i} of client {ctx.client} in round {ctx.round} (sum over its steps of "
                              f"|grad reg| / of |grad CE| = {member[0] / max(member[1], 1e-12):.3g}, "
                              f"distance={o.distance!r}, "
                              f"diversity_measure={o.diversity_measure!r}, affinity={o.affinity}, "
                              f"diversity={o.diversity}, "
                              f"regulariser_calibration={o.regulariser_calibration}); the model may not "
                              "learn: lower the coefficients (or regulariser_calibration) "
                              "(warned once per run; the client metric regulariser_gradient_ratio has every "
                              "round's value)", RuntimeWarning, stacklevel=2)
            norms = [norms[0] + member[0], norms[1] + member[1]]
            pool.append({n: t.detach() for n, t in active.items()})
        averaged = pool_mean(pool)
        state = {n: (averaged[n] if n in averaged else buffers[n]) for n in ctx.global_state}
        kept = ({f"{PREFIX}pool.{i}.{n}": t for i, m in enumerate(pool) for n, t in m.items()}
                if self._stores(ctx.client) else None)
        metrics = {"train_loss": float(total) / max(seen, 1), "added_member_steps": float(added_steps)}
        if norms[1] > 0:
            metrics["regulariser_gradient_ratio"] = norms[0] / norms[1]
        if o.regulariser_calibration is not None:
            metrics["regulariser_skipped_steps"] = float(skipped)
        spread = mean_pairwise_distance(pool)
        if spread is not None:
            metrics["pool_mean_distance"] = spread
        return ClientUpdate(state, len(ctx.y), kept, metrics)

    def aggregate(self, global_state: State, updates: Mapping[int, ClientUpdate], server_state: State,
                  round: int) -> tuple[State, State]:
        """FedAvg of the pool averages; this round's stored pools become the server state."""
        new, _ = super().aggregate(global_state, updates, server_state, round)
        pools: State = {}
        for k in sorted(updates):
            if self._stores(k) and updates[k].client_state:
                head = f"{PREFIX}pool."
                pools.update({f"{head}{k}.{key[len(head):]}": t for key, t in updates[k].client_state.items()
                              if key.startswith(head)})
        return new, pools


def client_pools(server_state: Mapping[str, Tensor]) -> dict[int, list[State]]:
    """``{client: [member state, ...]}`` from a stored LSS server state."""
    head = f"{PREFIX}pool."
    out: dict[int, dict[int, State]] = {}
    for key, t in server_state.items():
        if key.startswith(head):
            client, member, name = key[len(head):].split(".", 2)
            out.setdefault(int(client), {}).setdefault(int(member), {})[name] = t
    return {k: [members[i] for i in sorted(members)] for k, members in sorted(out.items())}
