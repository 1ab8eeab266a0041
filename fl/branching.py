"""Start a run from the stored rounds of another run: :func:`branch`.

Some algorithms train exactly as another one until a round. IMA (Zhou et al., TMC 2024,
Algorithm 1) is its base algorithm (FedAvg for ``"ima"``) until ``start_round - 1``: same
client sampling, learning rate, local training and aggregation, so the same global models.
A run of IMA can therefore take those rounds from a stored run of FedAvg with the same
settings instead of training them again. :func:`branch` copies them (global models, client
checkpoints, metrics records), rebuilds the algorithm's server state from them
(:meth:`~fl.algorithms.base.Algorithm.branch_state`: IMA's window), and trains the rest.
A run of the source's own algorithm and settings with more ``rounds`` is a *continuation*:
it takes every stored round of the source and trains on (FedAvg to 2R from a run of R), when
the learning-rate schedule does not depend on ``rounds`` (checked).
The branched run is the run ``fl.run`` would train from round 1, file for file; only the
copied rounds' recorded times are the source's. ``tests/test_branching.py`` checks this
bit for bit.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from torch import nn

from landscape.infra.errors import ConfigError

from .api import open_run
from .config import volatile_keys
from .convergence import schedule
from .engine import Engine
from .reader import Run, load_run
from .resolve import make_algorithm

#: Configuration keys allowed to differ between a branch and its source (the algorithm's own).
ALGORITHM_KEYS = ("algorithm", "options", "ima")


def branch(source: Run | str | os.PathLike, algorithm: str | None = None, *, through: int | None = None,
           recipe: str | None = None, model: str | nn.Module | None = None, out: str | os.PathLike | None = None,
           progress: bool | None = None, on_round: Callable[[int, dict], None] | None = None,
           **settings: Any) -> Run:
    """``fl.run`` with rounds 1..``through`` copied from ``source`` instead of trained.

    Parameters
    ----------
    source : Run, str or os.PathLike
        A stored run (or its folder) of the algorithm the new one trains as through round
        ``through`` (:meth:`~fl.algorithms.base.Algorithm.branch_base`; FedAvg for IMA), with
        the same settings otherwise, and at least ``through`` rounds stored; or a complete
        run of the same algorithm and settings with fewer ``rounds`` (a continuation).
    through : int, optional
        The last round taken from ``source``: at most, and by default, the last round the
        algorithm trains as the source's (IMA: ``start_round - 1``).
    algorithm, recipe, model, out, progress, on_round, **settings
        As for :func:`fl.run`.

    Returns
    -------
    Run
        The stored run; equal to ``fl.run`` with the same arguments. A folder that already
        holds rounds of this run is resumed (or reopened) as ``fl.run`` would.

    Raises
    ------
    ConfigError
        When the algorithm does not train as the source's through ``through``, a setting
        differs from the source's (the first one named), the source has not stored round
        ``through``, or it keeps per-client states of later rounds only.

    Examples
    --------
    >>> fedavg = fl.run("fedavg", recipe="ima-mnist1d", seed=0)       # doctest: +SKIP
    >>> ima = fl.branch(fedavg, "ima", recipe="ima-mnist1d", seed=0)  # doctest: +SKIP

    ``ima`` equals ``fl.run("ima", recipe="ima-mnist1d", seed=0)``, which trains 400 rounds;
    the branch trains rounds 300..400 only.
    """
    src = source if isinstance(source, Run) else load_run(source)
    with open_run(algorithm, recipe=recipe, model=model, out=out, **settings) as opened:
        if opened.data is not None:
            engine = Engine(opened.config, opened.store, opened.algorithm, opened.template, opened.data,
                            opened.device, progress, on_round)
            if opened.store.read_progress() is None:
                last = check_branch(src, opened.config, opened.algorithm, through)
                engine.replay(src, last)
            engine.run()
    return Run(opened.store.path, module=model if isinstance(model, nn.Module) else None)


def continued_rounds(source: Run, config: dict[str, Any]) -> int:
    """The rounds a continuation copies: all of ``source``'s, when the longer run trains them identically.

    A run of the source's algorithm and settings with more ``rounds`` trains its first rounds as
    the source did when nothing of a round depends on ``rounds`` but the learning rate, which
    the two schedules (``fl.convergence.schedule``) must then give equal over those rounds.

    Parameters
    ----------
    source : Run
        The shorter run (complete).
    config : dict[str, Any]
        The longer run's resolved configuration.

    Returns
    -------
    int
        The source's last round.

    Raises
    ------
    ConfigError
        When the longer run is not longer, the source is not complete, or the schedules differ.
    """
    last = int(source.config["rounds"])
    if int(config["rounds"]) <= last or not source.rounds or source.rounds[-1] != last:
        raise ConfigError(f"a continuation of {source.path} needs it complete and more than its {last} rounds, "
                          f"got rounds={config['rounds']}")
    if schedule(source.config, last) != schedule(config, int(config["rounds"]))[:last]:
        raise ConfigError(f"the learning-rate schedule of {config['rounds']} rounds differs from the source's over "
                          f"its {last} rounds (it depends on the number of rounds): train the run from round 1")
    return last


def check_branch(source: Run, config: dict[str, Any], algorithm: Any, through: int | None) -> int:
    """The last round to copy; refuses a branch whose copied rounds would differ from trained ones.

    Parameters
    ----------
    source : Run
        The run the rounds come from.
    config : dict[str, Any]
        The new run's resolved configuration.
    algorithm : Algorithm
        The new run's algorithm: one that trains as the source's through a round
        (``branch_base``), or the source's own with more rounds (a continuation,
        :func:`continued_rounds`).
    through : int or None
        The last round to copy (None: the last one the algorithm trains as the source's).

    Returns
    -------
    int
        The last round to copy.

    Raises
    ------
    ConfigError
        As for :func:`branch`.
    """
    base, last = algorithm.branch_base()
    src_alg = make_algorithm(source.config)
    name = f"{algorithm.label!r}"
    skip = set(volatile_keys()) | set(ALGORITHM_KEYS)
    if base is None and (algorithm.label, algorithm.opts) == (src_alg.label, src_alg.opts):
        base, last = src_alg, continued_rounds(source, config)  # the same algorithm, continued to more rounds
        skip.add("rounds")
    if base is None:
        raise ConfigError(f"algorithm {name} trains as no other algorithm in any round; nothing to branch from")
    if (base.label, base.opts) != (src_alg.label, src_alg.opts):
        raise ConfigError(f"algorithm {name} trains as {base.label!r} with options {base.opts}, but the source "
                          f"{source.path} ran {src_alg.label!r} with options {src_alg.opts}")
    through = last if through is None else through
    if not 0 <= through <= last:
        raise ConfigError(f"algorithm {name} trains as {base.label!r} through round {last} only; "
                          f"through={through} must be in 0..{last}")
    for key in sorted(set(config) | set(source.config)):
        if key not in skip and config.get(key) != source.config.get(key):
            raise ConfigError(f"setting {key!r} is {config.get(key)!r} here but {source.config.get(key)!r} in the "
                              f"source {source.path}; a branch takes every setting but the algorithm's from it")
    stored = source.rounds
    if not stored or stored[-1] < through:
        raise ConfigError(f"the source {source.path} stores rounds up to {stored[-1] if stored else 'none'}; "
                          f"through={through} needs round {through}")
    if through < stored[-1] and source.kept_client_states():
        raise ConfigError(f"the source {source.path} keeps per-client states of its last round "
                          f"({stored[-1]}) only; branch through that round, not {through}")
    return through
