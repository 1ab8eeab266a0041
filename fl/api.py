"""Public entry points of the FL engine: :func:`run`, :func:`load_run` and :class:`Run`.

``fl.run`` trains and stores a run (see ``fl.store`` for the folder layout) and returns a
:class:`Run`; rerunning the same configuration into the same folder resumes an interrupted
run from its last complete round, or just returns a finished one.
"""
from __future__ import annotations

import inspect
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch import nn

from landscape.infra.devices import resolve_device
from landscape.infra.estimate import JobEstimate
from landscape.infra.options import field_default

from .algorithms.base import Algorithm
from .config import RunConfig
from .engine import Engine
from .estimate import estimate_run
from .federation import Federation
from .reader import Run, load_run
from .resolve import build_config, make_algorithm
from .resolved_run import resolve_run
from .rundir import checked_partition, prepare_dir, refuse_foreign, split_clients
from .store import RunStore
from .tracking import Track


def run(algorithm: str | None = None, *, recipe: str | None = None, model: str | nn.Module | None = None,
        out: str | os.PathLike | None = None, progress: bool | None = None,
        on_round: Callable[[int, dict], None] | None = None, dry_run: bool = False,
        **settings: Any) -> Run | JobEstimate:
    """Train ``algorithm`` and return the stored :class:`Run` (resuming or reopening one).

    Parameters
    ----------
    algorithm : str, optional
        A registered algorithm (``fl-run --list-algorithms``); default: the recipe's, else
        ``"fedavg"``.
    recipe : str, optional
        A key of ``fl.RECIPES``: its settings are applied first, the arguments passed here
        override them; config.json records the name and the resolved values.
    model : str, nn.Module or None
        A zoo name (default: the dataset's model) or an ``nn.Module`` whose current weights
        are the initial model unless ``init`` names other weights (pass it to :func:`load_run`
        again to rebuild it).
    out : str or os.PathLike, optional
        The run folder; default ``./runs/<algorithm>-<dataset>-seed<seed>-<config digest>``,
        so the same call finds its earlier run.
    progress : bool, optional
        Show a tqdm bar (default: when stderr is a terminal).
    on_round : callable, optional
        ``f(round, metrics)`` called after each stored round.
    dry_run : bool
        Train and write nothing: return what the run will cost (:func:`fl.estimate.estimate_run`).
    **settings : Any
        Every field of :class:`fl.config.RunConfig` (``dataset``, ``clients``, ``rounds``,
        ``init``, ``participation``, ``local_epochs``, ``batch_size``, ``lr``, ``momentum``,
        ``weight_decay``, ``lr_decay``, ``partition``, ``alpha``, ``partition_options``,
        ``local_test_fraction``, ``seed``, ``device``, ``backend``, ``n_jobs``,
        ``save_clients``, ``eval_batch_size``, ``data_root``, ``download``, ``ima``,
        ``aggregator``, ``aggregator_options``, ``clip_norm``: :mod:`fl.algorithms.robust`; ``track``:
        an :class:`fl.Track`, landscape measures recorded during training, :mod:`fl.tracking`) and
        the algorithm's options (its ``Options`` dataclass, e.g. ``mu`` for FedProx).

    Returns
    -------
    Run or JobEstimate
        The stored run; with ``dry_run=True`` the :class:`~landscape.infra.estimate.JobEstimate`
        (local steps, evaluations, memory, rounds already stored, time).

    Raises
    ------
    ConfigError
        For an unknown setting (with the closest valid name), a wrong type, a non-finite or
        out-of-range value, or a folder holding another run or files but no run.
    CheckpointError
        When a stored run to resume or reopen is damaged or differs from its manifest or from
        the partition drawn from its seed (:mod:`fl.manifest`).
    DataError
        When the model cannot classify the dataset.
    InitMismatchError
        When the weights of ``init`` do not fit the model (:mod:`fl.initial`, which also lists
        the ``CheckpointError`` and ``NonFiniteWeightsError`` cases of ``init``).
    """
    if dry_run:
        return estimate_run(algorithm, recipe=recipe, model=model, out=out, **settings)
    with open_run(algorithm, recipe=recipe, model=model, out=out, **settings) as opened:
        if opened.data is not None:
            Engine(opened.config, opened.store, opened.algorithm, opened.template, opened.data, opened.device,
                   progress, on_round).run()
    return Run(opened.store.path, module=model if isinstance(model, nn.Module) else None)


@dataclass(frozen=True)
class OpenedRun:
    """A run folder set up for training, while :func:`open_run` holds its lock.

    Parameters
    ----------
    config : dict[str, Any]
        The resolved configuration (as stored in config.json).
    algorithm : Algorithm
        The configured algorithm.
    template : nn.Module
        The plain architecture with the initial weights.
    store : RunStore
        The run folder.
    device : torch.device
        Where training runs.
    data : Federation or None
        The data on the device; None when the run is already complete.
    """

    config: dict[str, Any]
    algorithm: Algorithm
    template: nn.Module
    store: RunStore
    device: torch.device
    data: Federation | None


@contextmanager
def open_run(algorithm: str | None = None, *, recipe: str | None = None, model: str | nn.Module | None = None,
             out: str | os.PathLike | None = None, **settings: Any) -> Iterator[OpenedRun]:
    """Resolve a run's configuration and set up (or reopen) its folder, holding its lock.

    :func:`run` trains the opened run with the engine; ``fl.flower`` trains it on a Flower
    federation. The arguments are :func:`run`'s.

    Parameters
    ----------
    algorithm, recipe, model, out, **settings
        As for :func:`run`.

    Yields
    ------
    OpenedRun
        The configuration, algorithm, initial model, folder and data.

    Raises
    ------
    ConfigError, CheckpointError, DataError, InitMismatchError
        As for :func:`run`.
    """
    resolved = resolve_run(algorithm, recipe=recipe, model=model, out=out, **settings)
    config, alg, template, bundle = resolved.config, resolved.algorithm, resolved.template, resolved.bundle
    store = RunStore(resolved.path)
    device = resolve_device(config["device"])
    refuse_foreign(store)  # before the lock file is created in it
    with store.lock():
        if prepare_dir(store, config):
            train_parts, test_parts = checked_partition(store, config, bundle.train_y.numpy())
        else:
            train_parts, test_parts = split_clients(config, bundle.train_y.numpy())
            store.write_config(config)  # first: a folder with this config and no progress restarts cleanly
            store.write_partition(train_parts, test_parts)
        data = None if store.is_complete() else Federation.build(bundle, train_parts, test_parts, device)
        yield OpenedRun(config, alg, template, store, device, data)


def _documented_signature() -> inspect.Signature:
    """``run``'s signature as help() and IDEs show it: every RunConfig field with its default.

    The function itself takes them through ``**settings`` so that it knows which were passed
    explicitly (those override a recipe's settings).
    """
    own = inspect.signature(run).parameters
    types_ = {**RunConfig.types(), "track": Track | dict[str, Any] | bool | None}
    fields = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=field_default(f), annotation=types_[n])
              for n, f in RunConfig.fields().items() if n not in own]
    head = [own["algorithm"].replace(default="fedavg")] + [own[n] for n in ("recipe", "model", "out")]
    tail = [own[n] for n in ("progress", "on_round", "dry_run")]
    options = inspect.Parameter("options", inspect.Parameter.VAR_KEYWORD, annotation=Any)
    return inspect.Signature([*head, *fields, *tail, options], return_annotation=Run)


run.__signature__ = _documented_signature()  # type: ignore[attr-defined]

__all__ = ["OpenedRun", "Run", "build_config", "load_run", "make_algorithm", "open_run", "run"]
