"""The plain FedAvg aggregate of a stored round, beside the aggregate the run's rule produced.

A run trained with a robust ``aggregator`` (:mod:`fl.algorithms.robust`) stores the rule's
global model; :func:`plain_aggregate` recomputes, from the round's stored client models, the
sample-weighted mean FedAvg would have sent, so the two can be compared on the landscape (the
barrier between them, their distance).
"""
from __future__ import annotations

import os

from landscape.infra.errors import ConfigError

from .algorithms.averaging import sample_weighted_average
from .algorithms.contexts import ClientUpdate
from .reader import Run
from .rundir import saves_clients
from .store import State


def plain_aggregate(run: Run | str | os.PathLike, round: int = -1) -> State:
    """FedAvg's mean ``sum_k n_k / sum_j n_j * w_k`` of a round's stored client models.

    ``n_k`` is client ``k``'s number of training samples (the weight FedAvg gives it); frozen
    parameters (a LoRA base) and integer entries are treated as FedAvg treats them
    (:func:`fl.algorithms.averaging.sample_weighted_average`), relative to the global model the
    round started from. The client models are those :meth:`fl.reader.Run.client_states` returns
    (the plain architecture: for FLOCO, each client's model at its simplex point).

    Parameters
    ----------
    run : Run, str or os.PathLike
        A stored run or its folder.
    round : int
        A stored training round (negative: from the end; round 0 trains no client).

    Returns
    -------
    State
        The plain aggregate, a state_dict of the run's architecture.

    Raises
    ------
    ConfigError
        For round 0, a round that is not stored, or a round whose client models the run did not
        keep (``save_clients``).
    CheckpointError
        When a stored client model is missing or damaged.

    Examples
    --------
    The barrier between the plain mean and the median the run sent in round 2:

    >>> run = fl.run("fedavg", aggregator="median", clients=3, rounds=2)  # doctest: +SKIP
    >>> ev = landscape.Evaluator(run.module(), run.test_dataset())  # doctest: +SKIP
    >>> landscape.interpolate(fl.plain_aggregate(run, 2), run.global_state(2), ev)  # doctest: +SKIP
    """
    run = run if isinstance(run, Run) else Run(run)
    stored = run.rounds
    if not stored or not -len(stored) <= round < len(stored):
        raise ConfigError(f"round {round} is not stored in {run.path}; name a training round 1..{max(stored or [0])}")
    r = stored[round]
    if r == 0:
        raise ConfigError("round 0 is the initial model and trains no client; name a training round 1.."
                          f"{stored[-1]}")
    if not saves_clients(run.config, r):
        raise ConfigError(f"{run.path} kept no client models of round {r} (save_clients="
                          f"{run.config['save_clients']!r}), so its plain aggregate cannot be computed; rerun with "
                          f"save_clients='all' or a list holding {r}")
    sizes = {k: len(data) for k, data in run.client_datasets().items()}
    updates = {k: ClientUpdate(state, sizes[k]) for k, state in run.client_states(r).items()}
    return sample_weighted_average(run.global_state(r - 1), updates, keep=frozenset(run.config.get("frozen") or ()))
