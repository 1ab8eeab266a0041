"""The plug-in contract between the FL round loop (``fl.engine``) and an algorithm.

An algorithm is one file in ``fl/algorithms/``: a subclass of :class:`Algorithm` with a
class attribute ``name`` (what users pass to ``fl.run``) and ``Options``, a frozen dataclass
of its options declared with :func:`landscape.infra.options.option` (help, paper source, range). The
class registers itself (``fl.algorithms.registry``); the command line, the validation and
the configuration digest are generated from ``Options``.

One training round ``r`` (rounds are 1..T; round 0 is the initial model) runs:

1. ``sampled`` = the engine's sample of ``(seed, r)``; ``clients = participants(r, sampled)``.
2. ``server_state = begin_round(RoundContext)`` (optional work before training, e.g.
   FLOCO's projection, which may train clients through ``ctx.train``).
3. For each client ``k``: ``client_update(LocalContext) -> ClientUpdate``. The default runs
   :func:`~fl.algorithms.sgd.local_sgd` with :meth:`Algorithm.extra_loss` added to the
   cross-entropy (FedProx's proximal term). Override ``client_update`` for other training
   (SAM, model pools), reusing the pieces of :mod:`fl.algorithms.sgd`.
4. ``global_state, server_state = aggregate(global_state, updates, server_state, r)``;
   the default is :meth:`Algorithm.combine`: the run's aggregation rule (``aggregator``,
   default FedAvg's data-size-weighted average; :mod:`fl.algorithms.robust`). An algorithm
   that overrides ``aggregate`` combines its client updates with ``combine`` too, so every
   rule and ``clip_norm`` apply to it.
5. The engine evaluates the new global model, calls ``local_metrics(EvalContext)``
   (personalised methods return ``"local_accuracy"``) and writes the round's files.

State (all tensors, stored as safetensors; never pickles):

* ``global_state``: the training-architecture state (``build_module(template)``).
* ``server_state``: ``dict[str, Tensor]`` stored per round (``Run.algorithm_state(r)``):
  anchors, endpoints, windows, pools. Prefix keys with the algorithm name.
* ``ClientUpdate.client_state``: per-client state kept on the server between rounds;
  ``None`` leaves it unchanged.
* Randomness only from ``ctx.generator`` or :func:`make_generator` of the run seed and
  your own keys, never the global RNG: a resumed run then equals an uninterrupted one.

Another architecture (FLOCO's simplex classifier): return it from ``build_module`` and
implement ``export_state`` (training state -> plain template state); the engine stores
exported states as checkpoints and the training state under ``train/`` for resume.

Composition: a :class:`~fl.algorithms.wrapper.Wrapper` (IMA) is composed around a base
algorithm and delegates every hook it does not change.

The names below are re-exported here so a plug-in imports its whole toolbox from one module.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping

from torch import Tensor, nn

from landscape.infra.options import Options

from ..config import RunConfig
from .averaging import sample_weighted_average, weighted_average
from .contexts import ClientUpdate, EvalContext, LocalContext, RoundContext, State
from .registry import register
from .robust import Aggregator
from .seeds import derive_seed, make_generator
from .sgd import ExtraLoss, LocalResult, LossFn, forward, local_sgd, minibatches, sgd_step, split_state


@dataclasses.dataclass(frozen=True)
class NoOptions(Options):
    """The option set of an algorithm without options."""


class Algorithm:
    """Base class of FL algorithms; FedAvg's behaviour unless overridden (see the module doc).

    Class attributes
    ----------------
    name : str
        Registered name; a class without one (a base class) is not registered.
    Options : type[Options]
        Frozen dataclass of the algorithm's options (default: none).
    engine_defaults : Mapping[str, Any]
        Run settings whose default this algorithm changes (e.g. ``local_test_fraction``).
    personalised : bool
        True when ``local_metrics`` reports personalised accuracy.
    vectorizable : bool
        True when the client update is :func:`local_sgd` with an :meth:`extra_loss` that
        depends only on the parameters and the received model (not on the mini-batch), so
        ``fl.vectorized`` can train all clients of a round at once. A class that defines
        its own ``client_update`` is not vectorisable unless it says so again.
    wraps : bool
        True for a wrapper composed around a base algorithm (``fl.algorithms.wrapper``).

    Parameters
    ----------
    options : Mapping[str, Any]
        The resolved options (:meth:`resolve_options`), kept typed as ``self.opts`` (an
        instance of ``Options``: ``self.opts.mu``).
    config : Mapping[str, Any]
        The run configuration.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type[Options]] = NoOptions
    engine_defaults: ClassVar[Mapping[str, Any]] = {}
    personalised: ClassVar[bool] = False
    vectorizable: ClassVar[bool] = False
    wraps: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "client_update" in cls.__dict__ and "vectorizable" not in cls.__dict__:
            cls.vectorizable = False
        clash = sorted(set(cls.Options.fields()) & set(RunConfig.fields()))
        if clash:
            raise TypeError(f"{cls.__qualname__}.Options field {clash[0]!r} shadows the fl.run setting of that "
                            "name; rename the option")
        if cls.__dict__.get("name"):
            register(cls)

    def __init__(self, options: Mapping[str, Any], config: Mapping[str, Any]):
        self.opts: Any = self.Options.from_mapping(options, owner=f"{self.name} option ")
        self.config = config
        self.seed = int(config["seed"])
        #: parameters the run does not train (``requires_grad=False``: a LoRA model's base); never averaged
        self.frozen = frozenset(config.get("frozen") or ())
        #: the run's aggregation of client updates (``aggregator``, ``aggregator_options``, ``clip_norm``)
        self.aggregator = Aggregator.from_config(config)

    @property
    def label(self) -> str:
        """The name shown in messages (a wrapper adds its base: ``"ima on fedprox"``)."""
        return self.name

    @classmethod
    def resolve_options(cls, given: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
        """Validate the options a user gave and fill in the defaults.

        Parameters
        ----------
        given : Mapping[str, Any]
            Option name -> value (keys of ``cls.Options``).
        config : Mapping[str, Any]
            The run configuration (for defaults derived from it, ``Options.resolved``).

        Returns
        -------
        dict[str, Any]
            Every option with its value, JSON-ready (what config.json stores).

        Raises
        ------
        ConfigError
            For an unknown option, a wrong type, a non-finite number or a value out of range.
        """
        owner = f"{cls.name} option "
        resolved = cls.Options.from_mapping(given, owner=owner).resolved(config)
        return cls.Options.from_mapping(resolved.to_dict(), owner=owner).to_dict()

    # -- architecture and state -------------------------------------------------
    def build_module(self, template: nn.Module) -> nn.Module:
        """The module this algorithm trains.

        Parameters
        ----------
        template : nn.Module
            The run's plain architecture with its initial weights.

        Returns
        -------
        nn.Module
            The training module (default: ``template`` itself).
        """
        return template

    def export_state(self, state: State, server_state: State, client: int | None = None,
                     client_state: State | None = None) -> State:
        """Map a training state to the plain template architecture.

        Parameters
        ----------
        state : State
            A training-architecture state.
        server_state : State
            The server state of the round.
        client : int, optional
            The client whose model this is (None: the global model).
        client_state : State, optional
            That client's persisted state.

        Returns
        -------
        State
            The plain-architecture state (default: ``state``).
        """
        return state

    def init_server_state(self, global_state: State) -> State:
        """The server state before round 1.

        Parameters
        ----------
        global_state : State
            The initial training state.

        Returns
        -------
        State
            Default: empty.
        """
        return {}

    # -- branching (fl.branch) -------------------------------------------------------
    def branch_base(self) -> tuple["Algorithm | None", int]:
        """The algorithm this one trains exactly as, and through which round.

        Returns
        -------
        tuple[Algorithm or None, int]
            ``(base, R)``: with the same run settings, rounds 1..R of this algorithm sample,
            train, aggregate and store what ``base`` does, so :func:`fl.branch` may copy them
            from a stored run of ``base``. Default ``(None, 0)``: no such algorithm.
        """
        return None, 0

    def branch_state(self, round: int, source_state: State, global_state: Callable[[int], State]) -> State:
        """The server state after ``round``, rebuilt from a run of :meth:`branch_base`'s algorithm.

        Parameters
        ----------
        round : int
            A round up to the one :meth:`branch_base` names.
        source_state : State
            The source run's server state after ``round``.
        global_state : callable
            ``f(r)``: the source run's stored global model after round ``r <= round``.

        Returns
        -------
        State
            Default: ``source_state`` (the base's state is this algorithm's).
        """
        return source_state

    # -- schedules ---------------------------------------------------------------
    def lr(self, round: int) -> float:
        """Client learning rate of a training round.

        ``lr * (1 - lr_decay)^(round - 1)`` (IMA Sec. 7.1.3's exponential decay with
        rate gamma = ``lr_decay``).

        Parameters
        ----------
        round : int
            Training round (1-based).

        Returns
        -------
        float
            The learning rate.
        """
        return float(self.config["lr"]) * (1.0 - float(self.config["lr_decay"])) ** (round - 1)

    def local_epochs(self, round: int) -> int:
        """Local epochs of a training round.

        Parameters
        ----------
        round : int
            Training round (1-based).

        Returns
        -------
        int
            Default: the run's ``local_epochs``.
        """
        return int(self.config["local_epochs"])

    # -- round hooks -------------------------------------------------------------
    def participants(self, round: int, sampled: list[int]) -> list[int]:
        """The clients that train this round.

        Parameters
        ----------
        round : int
            Training round.
        sampled : list[int]
            The engine's sample.

        Returns
        -------
        list[int]
            Default: ``sampled``.
        """
        return sampled

    def begin_round(self, ctx: RoundContext) -> State:
        """Server work before local training.

        Parameters
        ----------
        ctx : RoundContext
            The round's context.

        Returns
        -------
        State
            The server state for this round (default: unchanged).
        """
        return ctx.server_state

    def client_update(self, ctx: LocalContext) -> ClientUpdate:
        """Local SGD on cross-entropy plus :meth:`extra_loss` (FedAvg; FedProx Eq. 2).

        Parameters
        ----------
        ctx : LocalContext
            The client's context.

        Returns
        -------
        ClientUpdate
            Trained state, sample count and ``train_loss``.
        """
        def extra(params: State, x: Tensor, y: Tensor, logits: Tensor) -> Tensor | None:
            return self.extra_loss(ctx, params, x, y, logits)

        result = local_sgd(ctx, extra_loss=extra)
        return ClientUpdate(result.state, len(ctx.y), None, {"train_loss": result.loss})

    def extra_loss(self, ctx: LocalContext, params: State, x: Tensor, y: Tensor,
                   logits: Tensor) -> Tensor | None:
        """Term added to a mini-batch's cross-entropy by the default client update.

        Parameters
        ----------
        ctx : LocalContext
            The client's context.
        params : State
            The trainable leaves being optimised.
        x, y, logits : Tensor
            The batch and the model's outputs on it.

        Returns
        -------
        Tensor or None
            A scalar to add, or None (default) for nothing.
        """
        return None

    def combine(self, global_state: State, updates: Mapping[int, ClientUpdate]) -> State:
        """The client updates combined by the run's aggregation rule (:attr:`aggregator`).

        FedAvg ``w = sum_k n_k / sum_j n_j * w_k`` (McMahan et al. 2017) by default; the robust
        rules and clipping of :mod:`fl.algorithms.robust` when configured. Frozen parameters
        (``self.frozen``) keep the broadcast values: only the trained subset is aggregated.

        Parameters
        ----------
        global_state : State
            The model broadcast this round.
        updates : Mapping[int, ClientUpdate]
            Client id -> update.

        Returns
        -------
        State
            The aggregate.
        """
        return self.aggregator(global_state, updates, keep=self.frozen)

    def aggregate(self, global_state: State, updates: Mapping[int, ClientUpdate],
                  server_state: State, round: int) -> tuple[State, State]:
        """The server step: :meth:`combine` of the client updates (FedAvg by default).

        Parameters
        ----------
        global_state : State
            The model broadcast this round.
        updates : Mapping[int, ClientUpdate]
            Client id -> update.
        server_state : State
            The server state of the round.
        round : int
            Training round.

        Returns
        -------
        tuple[State, State]
            The new global state and server state.
        """
        return self.combine(global_state, updates), server_state

    def local_metrics(self, ctx: EvalContext) -> dict[str, float]:
        """Personalised metrics, e.g. ``{"local_accuracy": ..., "local_loss": ...}``.

        Parameters
        ----------
        ctx : EvalContext
            The evaluation context.

        Returns
        -------
        dict[str, float]
            Default: none.
        """
        return {}


__all__ = ["Algorithm", "ClientUpdate", "EvalContext", "ExtraLoss", "LocalContext", "LocalResult", "LossFn",
           "NoOptions", "RoundContext", "State", "derive_seed", "forward", "local_sgd", "make_generator",
           "minibatches", "sample_weighted_average", "sgd_step", "split_state", "weighted_average"]
