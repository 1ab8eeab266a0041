"""Local Superior Soups (LSS; Chen et al., NeurIPS 2024, Algorithm 1, Sec. 3.3).

Each client builds, from the model it received ``f_p``, a pool of models trained one after
another; member ``i`` starts at the uniform mean of the pool so far and is the only one
updated while it trains. Every step uses a random convex combination of the pool
(Sec. 3.3.1, ``alpha ~ Dirichlet(concentration * 1)``, one draw per step, or the mean loss
over ``interp_samples`` draws) and minimises

    CE(sum_j alpha_j f_j; B) + lambda_a * dist(f_a, f_p) - lambda_d * mean_{n != a} dist(f_a, f_n)

(affinity Eq. 5 pulls towards ``f_p``, diversity Eq. 4 pushes away from the other members;
``dist`` is the L2 norm over all trainable tensors, ``sqrt(|d|^2 + 1e-12)`` so it is smooth
at 0; ``distance="sq_l2"`` uses squared distances as the official code's affinity).
``diversity_measure="volume"`` replaces the mean distance by the official code's term, the
Cayley-Menger determinant of the squared distances between all members (the active one
included), ``|det CM| / (((n-1)!)^2 2^(n-1))``, i.e. the squared volume of their simplex.
The client uploads the uniform weight average of its pool; the server is FedAvg.

Scale warning: the unsquared L2 terms have gradients of norm ``lambda`` whatever the model
size, so the paper's ``lambda = 3`` (tuned for a pre-trained ResNet-18 with Adam) dominates
the task gradient of small models: on the digits MLP it keeps training near chance, while
``affinity = diversity = 0.03`` trains well (see the tests).

``pool_seed`` (reference/lss.md §1.2): ``"anchor_trained"`` (default, the official code's
reading): ``members`` trained models, the first a trainable copy of ``f_p`` (task loss and
affinity only, there are no other members yet); ``"anchor_frozen"`` (Algorithm 1 read
literally): the frozen ``f_p`` is pool member 0 and is part of the interpolation and of the
final average, followed by ``members`` trained models. Defaults: ``members`` 4,
``affinity`` = ``diversity`` = 3 (paper), ``epochs_per_member`` = the run's local epochs (the
paper's 8 "steps" are epochs), optimiser SGD with the run's lr/momentum/weight decay
(``optimizer="adam"`` for the paper's Adam; pass ``lr=5e-4``). BatchNorm buffers are shared
by all members and updated by the interpolated forward passes (as in the official code).

Stored (``Run.algorithm_state(r)``): ``lss.pool.{client}.{i}.{name}`` for each stored
client's pool members (i = 0 first), trainable tensors only; ``store_pools`` is True (all
clients), False, or a list of client ids.
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from landscape.infra.errors import ConfigError

from .base import (Algorithm, ClientUpdate, LocalContext, State, forward, make_generator, minibatches,
                   split_state, weighted_average)
from .simplex import sample_uniform_simplex

PREFIX = "lss."
POOL_SEEDS = ("anchor_trained", "anchor_frozen")
DISTANCES = ("l2", "sq_l2")
DIVERSITY_MEASURES = ("mean", "volume")
OPTIMIZERS = ("sgd", "adam")


def distance(a: Mapping[str, Tensor], b: Mapping[str, Tensor], kind: str = "l2") -> Tensor:
    """L2 distance ``sqrt(sum |a - b|^2 + 1e-12)`` over the tensors of ``a`` (``"sq_l2"``: squared)."""
    sq = sum(((t - b[n]) ** 2).sum() for n, t in a.items())
    return sq if kind == "sq_l2" else torch.sqrt(sq + 1e-12)


def simplex_volume_sq(members: Sequence[Mapping[str, Tensor]]) -> Tensor:
    """Squared volume of the simplex spanned by ``members``: the Cayley-Menger determinant of
    their squared pairwise L2 distances, ``|det CM| / (((n-1)!)^2 2^(n-1))`` (official code)."""
    n = len(members)
    device = next(iter(members[0].values())).device
    cm = torch.zeros(n + 1, n + 1, dtype=torch.float64, device=device)
    cm[0, 1:] = 1.0
    cm[1:, 0] = 1.0
    for i, j in itertools.combinations(range(n), 2):
        cm[i + 1, j + 1] = cm[j + 1, i + 1] = distance(members[i], members[j], "sq_l2").double()
    return torch.linalg.det(cm).abs() / (math.factorial(n - 1) ** 2 * 2 ** (n - 1))


def mix(pool: Sequence[Mapping[str, Tensor]], weights: Tensor) -> State:
    """``sum_j weights_j * pool_j`` for every tensor."""
    return {n: sum(w * m[n] for w, m in zip(weights.tolist(), pool)) for n in pool[0]}


def pool_mean(pool: Sequence[Mapping[str, Tensor]]) -> State:
    """Uniform weight average of the pool (float64 accumulation)."""
    return weighted_average(list(pool), [1.0] * len(pool))


class LSS(Algorithm):
    """LSS: each client sends the average of a pool of interpolation-trained models."""

    name = "lss"
    options = {"members": 4, "affinity": 3.0, "diversity": 3.0, "distance": "l2",
               "diversity_measure": "mean", "pool_seed": "anchor_trained", "interp_samples": 1,
               "concentration": 1.0, "epochs_per_member": None, "optimizer": "sgd", "store_pools": True}

    @classmethod
    def resolve_options(cls, given: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        opts = super().resolve_options(given, config)
        if opts["epochs_per_member"] is None:
            opts["epochs_per_member"] = int(config["local_epochs"])
        for key in ("members", "interp_samples", "epochs_per_member"):
            if isinstance(opts[key], bool) or not isinstance(opts[key], int) or opts[key] < 1:
                raise ConfigError(f"lss option {key} must be a positive integer, got {opts[key]!r}")
        for key in ("affinity", "diversity", "concentration"):
            if not isinstance(opts[key], (int, float)) or isinstance(opts[key], bool) or opts[key] < 0:
                raise ConfigError(f"lss option {key} must be a number >= 0, got {opts[key]!r}")
        if opts["concentration"] == 0:
            raise ConfigError("lss option concentration must be positive")
        for key, allowed in (("distance", DISTANCES), ("diversity_measure", DIVERSITY_MEASURES),
                             ("pool_seed", POOL_SEEDS), ("optimizer", OPTIMIZERS)):
            if opts[key] not in allowed:
                raise ConfigError(f"lss option {key} must be one of {allowed}, got {opts[key]!r}")
        stored = opts["store_pools"]
        if not (isinstance(stored, bool) or (isinstance(stored, (list, tuple))
                                             and all(isinstance(k, int) for k in stored))):
            raise ConfigError(f"lss option store_pools must be True, False or a list of client ids, "
                              f"got {stored!r}")
        return opts

    def _stores(self, client: int) -> bool:
        stored = self.opts["store_pools"]
        return stored if isinstance(stored, bool) else client in stored

    def _optimizer(self, ctx: LocalContext, params: list[Tensor]) -> torch.optim.Optimizer:
        if self.opts["optimizer"] == "adam":
            return torch.optim.Adam(params, lr=ctx.lr, weight_decay=ctx.weight_decay)
        return torch.optim.SGD(params, lr=ctx.lr, momentum=ctx.momentum, weight_decay=ctx.weight_decay)

    def _diversity(self, active: State, pool: Sequence[State]) -> Tensor:
        """Eq. 4: mean distance to the other members, or the code's simplex volume term."""
        if self.opts["diversity_measure"] == "volume":
            return simplex_volume_sq([*pool, active]).to(next(iter(active.values())).dtype)
        return sum(distance(active, m, self.opts["distance"]) for m in pool) / len(pool)

    def client_update(self, ctx: LocalContext) -> ClientUpdate:
        """Algorithm 1: train the pool member by member, upload its uniform average."""
        o = self.opts
        anchor, buffers = split_state(ctx.module, ctx.global_state, ctx.device)
        anchor = {n: t.detach() for n, t in anchor.items()}
        pool: list[State] = [anchor] if o["pool_seed"] == "anchor_frozen" else []
        alpha_gen = make_generator(self.seed, "lss-alpha", ctx.round, ctx.client)
        ctx.module.train()
        total = torch.zeros((), dtype=torch.float64, device=ctx.device)
        seen = 0
        for _ in range(int(o["members"])):
            start = pool_mean(pool) if pool else anchor
            active = {n: t.detach().clone().requires_grad_(True) for n, t in start.items()}
            opt = self._optimizer(ctx, list(active.values()))
            for idx in minibatches(len(ctx.y), ctx.batch_size, int(o["epochs_per_member"]), ctx.generator):
                idx = idx.to(ctx.device)
                x, y = ctx.x[idx], ctx.y[idx]
                members = pool + [active]
                task = torch.zeros((), device=ctx.device)
                for alpha in sample_uniform_simplex(len(members), int(o["interp_samples"]), alpha_gen,
                                                    float(o["concentration"])).double():
                    task = task + F.cross_entropy(forward(ctx.module, mix(members, alpha), buffers, x), y)
                task = task / int(o["interp_samples"])
                objective = task + o["affinity"] * distance(active, anchor, o["distance"])
                if pool and o["diversity"] > 0:
                    objective = objective - o["diversity"] * self._diversity(active, pool)
                opt.zero_grad(set_to_none=True)
                objective.backward()
                opt.step()
                total += task.detach().double() * len(y)
                seen += len(y)
            pool.append({n: t.detach() for n, t in active.items()})
        averaged = pool_mean(pool)
        state = {n: (averaged[n] if n in averaged else buffers[n]) for n in ctx.global_state}
        kept = ({f"{PREFIX}pool.{i}.{n}": t for i, m in enumerate(pool) for n, t in m.items()}
                if self._stores(ctx.client) else None)
        return ClientUpdate(state, len(ctx.y), kept, {"train_loss": float(total) / max(seen, 1)})

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
