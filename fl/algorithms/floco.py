"""FLOCO (Grinwald, Wiesner & Nakajima, "Federated Learning over Connected Modes", NeurIPS 2024).

Architecture (Sec. 3.1, Eq. 6): the model's final ``nn.Linear`` becomes a
:class:`SimplexLinear` with ``vertices`` weight matrices ``W_1..W_V`` (its endpoints; a
shared bias); its weight at ``alpha`` in the simplex is ``sum_m alpha_m W_m``. All other
layers are ordinary, trained and averaged as in FedAvg. ``vertices`` counts the simplex's
vertices: the paper's M is the simplex *dimension*, with M + 1 vertices, so the paper's
M = 6 is ``vertices=7`` (the default); the authors' code and the Flower README count
vertices directly (their ``endpoints: 10`` is ``vertices=10``).

Endpoint initialisation (``endpoint_init``; Algorithm 1 only says ``initialize_simplex``):
``"independent"`` (default) draws every endpoint on its own, Xavier-normal ``N(0, 2/(in+out))``,
as both official implementations do (``_initialize_weight``: ``xavier_normal_`` under seed
``seed + m``, in FL-bench's ``src/server/floco.py`` and the Flower baseline's ``floco/model.py``):
the endpoints are as far apart as independent initialisations and the centre is not the template's
classifier. ``"centred"``: the template's classifier plus zero-mean noise of ``nn.Linear``'s scale,
so the centre is the template's classifier and the initial global model equals every other
algorithm's. Both draw from the run seed (:meth:`Floco.initial_endpoints`).

Local training (Eq. 7/10): one ``alpha`` per mini-batch, before subregion assignment from
Dirichlet(1) (uniform on the simplex), afterwards uniform on the client's subregion
``R_k = {a in simplex : |a - alpha_k|_1 <= rho}`` (``subregion_sampler="exact"``; the
authors' sampler is ``"reference"``). Autodiff gives Eq. 10's ``alpha_m``-scaled endpoint
gradients. Aggregation (Eq. 11): ``aggregation="participants"`` (default, both official
implementations) is FedAvg over the round's participants, weights ``N_k / sum_{j in S} N_j``;
``aggregation="literal"`` is Eq. 11 as printed, ``theta <- theta + sum_{k in S} N_k / N *
delta_k`` with ``N`` the samples of *all* clients (a damped step under partial participation;
equal to the default under full participation). Every tensor follows the same rule. A robust
``aggregator`` (``fl.algorithms.robust``) replaces the participants' mean; ``literal`` takes only
``aggregator="mean"`` (with or without ``clip_norm``).

BatchNorm (``local_buffers``): False (default) averages the buffers with everything else;
True keeps them local as in the authors' configurations: each client trains and is evaluated
with its own running statistics (kept in its client state, the received ones the first time),
the server never overwrites them, and the global model carries the sample-weighted mean of
the participants' buffers only for the global test evaluation.

Subregion assignment at round ``tau`` (Sec. 3.2, Algorithm 1, FL-bench variant): before
that round's training every client runs one probe update from the global model (whole
simplex, not aggregated); the endpoint updates are stacked, reduced by PCA to ``endpoints``
coordinates ``kappa_k`` (sign convention: the largest-magnitude entry of each principal
axis is positive), projected onto scaled simplices ``z`` (Eq. 9) on the grid
``z in linspace(1e-4, 1, 1000)``; the scale minimising the Riesz 2-energy of the normalised
points (Eq. 8, pair distances clamped at 1e-4) gives ``alpha_k``. Training in round
``tau`` already uses the subregions. ``tau`` defaults to ``max(1, round(0.2 * rounds))``
(the paper's 100 of 500 rounds), ``rho`` to 0.1.

Evaluation (Sec. 3.4): the global model is the simplex centre; ``local_accuracy`` is each
client's model at ``alpha_k`` (the centre before ``tau``) on its local test split
(``local_test_fraction`` defaults to 0.2 here), unweighted mean over clients.

Checkpoints: the global checkpoint is the plain architecture at the simplex centre; each
client checkpoint is that client's personalised model at its point ``alpha_k`` (the centre
before ``tau``): for FLOCO its trained upload, for FLOCO+ its personal model, with its own
buffers under ``local_buffers``; ``point_state`` materialises any other point.
``Run.algorithm_state(r)`` holds
``floco.endpoints`` (E, out, in), and once assigned ``floco.points`` (K, E),
``floco.kappa``, ``floco.z`` and ``floco.energy`` (the Riesz curve over the grid).

FLOCO+ (App. C, FLOCO plus Ditto-style personal models) is :mod:`fl.algorithms.floco_plus`.
"""
from __future__ import annotations

import copy
import dataclasses
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Literal, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from landscape.infra.errors import ConfigError
from landscape.infra.options import Options, option

from .base import (
    Algorithm,
    ClientUpdate,
    EvalContext,
    LocalContext,
    LocalResult,
    RoundContext,
    State,
    local_sgd,
    make_generator,
)
from .simplex import (
    SUBREGION_SAMPLERS,
    assign_points,
    pca_scores,
    sample_subregion,
    sample_uniform_simplex,
    simplex_centre,
)

PREFIX = "floco."
AGGREGATIONS = ("participants", "literal")
ENDPOINT_INITS = ("independent", "centred")


class SimplexLinear(nn.Module):
    """Linear layer with weight ``sum_m alpha_m W_m`` (FLOCO Eq. 6) and a shared bias.

    ``alpha`` is a buffer (the evaluated point, the centre by default). While training,
    ``alpha_sampler`` (when set) supplies a fresh point for every forward pass.
    """

    def __init__(self, in_features: int, out_features: int, endpoints: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.endpoints = nn.Parameter(torch.zeros(endpoints, out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.register_buffer("alpha", simplex_centre(endpoints))
        self.alpha_sampler: Callable[[], Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        """``x W(alpha)^T + b`` with ``W(alpha) = sum_m alpha_m W_m`` (a sampled ``alpha`` while training)."""
        alpha = self.alpha_sampler() if self.training and self.alpha_sampler is not None else self.alpha
        weight = torch.einsum("m,moi->oi", alpha.to(self.endpoints), self.endpoints)
        return F.linear(x, weight, self.bias)

    def extra_repr(self) -> str:
        """Sizes, number of endpoints and whether there is a bias."""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"endpoints={self.endpoints.shape[0]}, bias={self.bias is not None}")


@contextmanager
def sampling(layer: SimplexLinear, points: Tensor) -> Iterator[None]:
    """Within the block, training forward passes of ``layer`` use ``points`` one by one."""
    rows = iter(points)

    def next_point() -> Tensor:
        try:
            return next(rows)
        except StopIteration:
            raise ConfigError("FLOCO drew fewer simplex points than training steps") from None

    layer.alpha_sampler = next_point
    try:
        yield
    finally:
        layer.alpha_sampler = None


# ------------------------------------------------------------------------- algorithm
@dataclasses.dataclass(frozen=True)
class FlocoOptions(Options):
    """Options of FLOCO (Grinwald et al., NeurIPS 2024)."""

    vertices: int = option(7, ge=2, le=10_000, help="vertices of the classifier simplex (the paper's M + 1; "
                           "its M = 6 is 7)", source="FLOCO Sec. 3.1, Eq. 6 (M = 6)")
    tau: int | None = option(None, ge=1, help="round of the subregion assignment (default max(1, round(0.2 T)))",
                             source="FLOCO Sec. 3.2 (100 of 500 rounds)")
    rho: float = option(0.1, gt=0, le=2, help="L1 radius of a client's subregion", source="FLOCO Sec. 3.2")
    subregion_sampler: Literal[SUBREGION_SAMPLERS] = option(  # type: ignore[valid-type]
        "exact", help="exact: uniform on the subregion; reference: the authors' sampler",
        source="FLOCO Eq. 7 / official code")
    aggregation: Literal[AGGREGATIONS] = option(  # type: ignore[valid-type]
        "participants", help="participants: weights N_k / sum over participants (official code); literal: "
        "Eq. 11's N_k / N over all clients", source="FLOCO Eq. 11")
    local_buffers: bool = option(False, help="keep BatchNorm buffers on the clients (authors' configs)",
                                 source="official code configs")
    endpoint_init: Literal[ENDPOINT_INITS] = option(  # type: ignore[valid-type]
        "independent", help="independent: every endpoint drawn on its own, Xavier-normal; centred: the "
        "template's classifier plus zero-mean uniform noise (the centre is the template's classifier)",
        source="official code: xavier_normal_ per endpoint (FL-bench and Flower)")

    def resolved(self, config: Mapping[str, Any]) -> "FlocoOptions":
        """``tau`` defaults to ``max(1, round(0.2 * rounds))``.

        Parameters
        ----------
        config : Mapping[str, Any]
            The run configuration.

        Returns
        -------
        FlocoOptions
            The options with the derived defaults set.
        """
        if self.tau is not None:
            return self
        return dataclasses.replace(self, tau=max(1, round(0.2 * int(config["rounds"]))))


class Floco(Algorithm):
    """FLOCO: a simplex of classifiers; clients train on subregions from round ``tau``."""

    name = "floco"
    Options = FlocoOptions
    engine_defaults = {"local_test_fraction": 0.2}
    personalised = True

    def __init__(self, options: Mapping[str, Any], config: Mapping[str, Any]):
        super().__init__(options, config)
        if self.opts.aggregation == "literal" and self.aggregator.rule != "mean":
            raise ConfigError(f"floco aggregation='literal' weights the updates by sample counts and cannot use "
                              f"aggregator={self.aggregator.rule!r}; set aggregation='participants' or "
                              "aggregator='mean'")
        self.n = int(self.opts.vertices)
        self.classifier = ""
        self.template_keys: list[str] = []
        self.buffer_keys: list[str] = []

    # -- architecture -------------------------------------------------------------
    def build_module(self, template: nn.Module) -> nn.Module:
        """A copy of ``template`` whose final ``nn.Linear`` is a :class:`SimplexLinear`.

        Its endpoints are those of :meth:`initial_endpoints`, its bias the template's (shared).
        """
        from ..models import classifier_name

        self.classifier = classifier_name(template)
        self.template_keys = list(template.state_dict().keys())
        self.buffer_keys = [n for n, _ in template.named_buffers()]
        linear = template.get_submodule(self.classifier)
        layer = SimplexLinear(linear.in_features, linear.out_features, self.n, linear.bias is not None)
        with torch.no_grad():
            layer.endpoints.copy_(self.initial_endpoints(linear.weight.detach()))
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        module = copy.deepcopy(template)
        parent, _, child = self.classifier.rpartition(".")
        setattr(module.get_submodule(parent) if parent else module, child, layer)
        return module

    def initial_endpoints(self, weight: Tensor) -> Tensor:
        """The ``(vertices, out, in)`` endpoints before round 1 (``endpoint_init``).

        ``"independent"``: endpoint ``m`` is Xavier-normal, ``N(0, 2 / (in + out))``, from its own
        stream ``(seed, "floco-endpoint", m)`` (the official code: seed ``seed + m``).
        ``"centred"``: ``W + d_m - mean_j d_j``, ``d_m ~ U(-1/sqrt(in), 1/sqrt(in))``, whose
        centre is the template's weight ``W`` (up to float rounding).

        Parameters
        ----------
        weight : Tensor
            The template classifier's weight ``(out, in)``.

        Returns
        -------
        Tensor
            The endpoints, in ``weight``'s dtype.
        """
        out_features, in_features = weight.shape
        if self.opts.endpoint_init == "independent":
            std = math.sqrt(2.0 / (in_features + out_features))
            draws = [torch.randn(weight.shape, generator=make_generator(self.seed, "floco-endpoint", m)) * std
                     for m in range(self.n)]
            return torch.stack(draws).to(weight)
        gen = make_generator(self.seed, "floco-endpoints")
        bound = 1.0 / math.sqrt(in_features)
        spread = (torch.rand((self.n, *weight.shape), generator=gen) * 2 - 1) * bound
        return weight + spread - spread.mean(dim=0, keepdim=True)

    def point_state(self, state: Mapping[str, Tensor], alpha: Tensor) -> State:
        """The plain-architecture state of a training state at simplex point ``alpha``."""
        c = self.classifier
        endpoints = state[f"{c}.endpoints"]
        weight = torch.einsum("m,moi->oi", alpha.to(endpoints), endpoints)
        out = {}
        for key in self.template_keys:
            out[key] = weight if key == f"{c}.weight" else state[key]
        return out

    def export_state(self, state: State, server_state: State, client: int | None = None,
                     client_state: State | None = None) -> State:
        """The global model at the simplex centre (Sec. 3.4).

        A client's personalised model (:meth:`client_model`) at its point ``alpha_k`` (the
        centre before assignment).
        """
        if client is None:
            return self.point_state(state, simplex_centre(self.n))
        point = self.client_point(server_state, client)
        return self.point_state(self.client_model(state, client_state),
                                simplex_centre(self.n) if point is None else point)

    def client_model(self, upload: State, client_state: State | None) -> State:
        """The training state exported for a client: FLOCO's trained upload."""
        return upload

    def init_server_state(self, global_state: State) -> State:
        """The server's copy of the simplex endpoints, taken from ``global_state``."""
        return {f"{PREFIX}endpoints": global_state[f"{self.classifier}.endpoints"].detach().clone()}

    # -- subregion assignment ---------------------------------------------------------
    def begin_round(self, ctx: RoundContext) -> State:
        """Record the clients' total sample count (Eq. 11's N); at round ``tau`` assign the subregions (Sec. 3.2)."""
        ctx = dataclasses.replace(ctx, server_state={
            **ctx.server_state, f"{PREFIX}total_samples": torch.tensor(sum(ctx.client_sizes), dtype=torch.float64)})
        if ctx.round != int(self.opts.tau) or f"{PREFIX}points" in ctx.server_state:
            return ctx.server_state
        key = f"{self.classifier}.endpoints"
        probes = ctx.train(list(range(ctx.num_clients)), "floco-probe")
        signals = torch.stack([(probes[k].state[key] - ctx.global_state[key]).flatten()
                               for k in range(ctx.num_clients)])
        kappa = pca_scores(signals, self.n)
        points, z, energy, _ = assign_points(kappa)
        device = ctx.global_state[key].device
        return {**ctx.server_state, f"{PREFIX}points": points.float().to(device),
                f"{PREFIX}kappa": kappa.float().to(device), f"{PREFIX}z": torch.tensor(z, device=device),
                f"{PREFIX}energy": energy.float().to(device)}

    def client_point(self, server_state: Mapping[str, Tensor], client: int) -> Tensor | None:
        """``alpha_k`` once assigned, else ``None``."""
        points = server_state.get(f"{PREFIX}points")
        return None if points is None else points[client].detach().cpu()

    def draw_points(self, ctx: LocalContext, count: int, generator: torch.Generator) -> Tensor:
        """``count`` training points: Dirichlet(1) before assignment, ``R_k`` afterwards."""
        centre = self.client_point(ctx.server_state, ctx.client)
        if centre is None:
            return sample_uniform_simplex(self.n, count, generator).to(ctx.device)
        return sample_subregion(centre, float(self.opts.rho), count, generator,
                                self.opts.subregion_sampler).to(ctx.device)

    # -- local training ---------------------------------------------------------------
    def simplex_sgd(self, ctx: LocalContext, generator: torch.Generator, **kwargs: Any) -> LocalResult:
        """:func:`local_sgd` with a simplex point from :meth:`draw_points` for every step.

        Parameters
        ----------
        ctx : LocalContext
            The client's context.
        generator : torch.Generator
            Draws the points.
        **kwargs
            Arguments of :func:`local_sgd` (``epochs`` defaults to the run's local epochs).

        Returns
        -------
        LocalResult
        """
        epochs = kwargs.get("epochs") or ctx.local_epochs
        steps = epochs * math.ceil(len(ctx.y) / ctx.batch_size)
        layer = ctx.module.get_submodule(self.classifier)
        with sampling(layer, self.draw_points(ctx, steps, generator)):
            return local_sgd(ctx, **kwargs)

    def received(self, ctx: LocalContext) -> State:
        """The model a client starts from.

        The global one, with the client's own BatchNorm buffers under ``local_buffers``
        (once it has some).
        """
        own = {n: ctx.client_state[PREFIX + "buffer." + n] for n in self.buffer_keys
               if PREFIX + "buffer." + n in ctx.client_state}
        return {**ctx.global_state, **own} if self.opts.local_buffers else ctx.global_state

    def kept_buffers(self, trained: State) -> State:
        """The client-state entries holding a client's buffers (none without ``local_buffers``)."""
        if not self.opts.local_buffers:
            return {}
        return {PREFIX + "buffer." + n: trained[n].detach() for n in self.buffer_keys}

    def client_update(self, ctx: LocalContext) -> ClientUpdate:
        """Local SGD with a simplex point drawn per step (:meth:`draw_points`: the client's subregion once assigned)."""
        alpha_gen = make_generator(self.seed, "floco-alpha", ctx.round, ctx.client)
        result = self.simplex_sgd(ctx, alpha_gen, state=self.received(ctx))
        kept = self.kept_buffers(result.state)
        return ClientUpdate(result.state, len(ctx.y), kept or None, {"train_loss": result.loss})

    def aggregate(self, global_state: State, updates: Mapping[int, ClientUpdate], server_state: State,
                  round: int) -> tuple[State, State]:
        """Eq. 11 (participant-normalised, or literal with the total N); the global point stays the centre.

        ``participants`` is :meth:`combine` (so any ``aggregator`` applies); ``literal`` steps by
        the (clipped, with ``clip_norm``) updates weighted by ``N_k / N``.
        """
        new = self.combine(global_state, updates)
        if self.opts.aggregation == "literal" and updates:
            total = float(server_state.get(f"{PREFIX}total_samples", 0.0))
            if total <= 0:
                raise ConfigError("floco aggregation='literal' needs the clients' sample counts "
                                  "(RoundContext.client_sizes); the engine passed none")
            clipped = self.aggregator.clip(global_state, updates, keep=self.frozen)
            for key, g in global_state.items():
                if g.is_floating_point():
                    step = sum(u.num_samples / total * (u.state[key].double() - g.double()) for u in clipped.values())
                    new[key] = (g.double() + step).to(g.dtype)
        alpha_key = f"{self.classifier}.alpha"
        new[alpha_key] = global_state[alpha_key].clone()
        endpoints = new[f"{self.classifier}.endpoints"].detach().clone()
        return new, {**server_state, f"{PREFIX}endpoints": endpoints}

    # -- evaluation -------------------------------------------------------------------
    def personal_state(self, ctx: EvalContext, client: int) -> State:
        """The training state evaluated for ``client``'s local accuracy.

        The global one (with the client's own buffers under ``local_buffers``).
        """
        own = ctx.client_states.get(client, {})
        return {**ctx.global_state, **{n: own[PREFIX + "buffer." + n] for n in self.buffer_keys
                                       if PREFIX + "buffer." + n in own}}

    def local_metrics(self, ctx: EvalContext) -> dict[str, float]:
        """Mean over clients of loss and accuracy at ``alpha_k`` on the local test splits."""
        if not ctx.client_data:
            return {}
        losses, accs = [], []
        alpha_key = f"{self.classifier}.alpha"
        for k, (x, y) in sorted(ctx.client_data.items()):
            point = self.client_point(ctx.server_state, k)
            state = dict(self.personal_state(ctx, k))
            if point is not None:
                state[alpha_key] = point.to(state[alpha_key])
            loss, acc = ctx.evaluate(state, x, y)
            losses.append(loss)
            accs.append(acc)
        return {"local_loss": sum(losses) / len(losses), "local_accuracy": sum(accs) / len(accs)}
