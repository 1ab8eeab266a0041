"""The run-folder protocol of ``fl.run``.

Whether a folder holds this run (resume or reopen), another one (refused), unrelated files or
run files without a run configuration (refused) or nothing yet (start), the client split
written with a new run and checked on every read, and the rounds whose client models a run
keeps. The file layout itself is :mod:`fl.store`'s.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from landscape.infra.errors import CheckpointError, ConfigError

from .algorithms.seeds import derive_seed
from .config import check_stored_config, config_differences
from .manifest import Manifest
from .store import RunStore


def prepare_dir(store: RunStore, config: Mapping[str, Any]) -> bool:
    """Decide what to do with a run folder.

    Parameters
    ----------
    store : RunStore
        The folder.
    config : Mapping[str, Any]
        The requested configuration.

    Returns
    -------
    bool
        True when the folder already holds this run (to resume or reopen); False for a new
        run (also a folder whose earlier start was killed before its first progress mark).

    Raises
    ------
    ConfigError
        When the folder holds a run with another configuration, a config.json of another
        version or schema (files that are not an FL run are refused before the folder is
        locked, by :func:`refuse_foreign`).
    """
    if store.config_path.exists():
        old = check_stored_config(store.read_config(), str(store.config_path))
        diff = config_differences(old, config)
        if diff:
            details = "; ".join(f"{k}: stored {old.get(k)!r}, requested {config.get(k)!r}" for k in diff)
            raise ConfigError(f"{store.path} holds a run with another configuration ({details}); "
                              "choose another out= or delete that folder")
        if store.read_progress() is not None:
            return True
    return False


def refuse_foreign(store: RunStore) -> None:
    """Refuse a folder that holds files but no run configuration, before anything is written.

    A run writes its config.json first, so a folder of files (a partition, metrics,
    checkpoints, notes) without one holds no run of this engine and is never touched; a
    config.json that is not a run configuration, or complete rounds without the manifest
    every run writes with them, are refused by reading them.

    Parameters
    ----------
    store : RunStore
        The folder (it need not exist).

    Raises
    ------
    ConfigError
        Naming up to five of the files found.
    CheckpointError
        When config.json is a link or not a readable run configuration, or complete rounds
        have no readable manifest.
    """
    if not store.path.is_dir():
        return
    if store.config_path.exists() or store.config_path.is_symlink():
        store.read_config()
        if store.read_progress() is not None:
            Manifest.read(store)  # complete rounds without a manifest: not a run of this version
        return
    others = sorted(p.name for p in store.path.iterdir() if not p.name.startswith("."))
    if others:
        raise ConfigError(f"{store.path} is not empty and is not an FL run directory (holds "
                          f"{', '.join(others[:5])}, but no config.json); nothing was changed: choose an "
                          "empty or new folder")


def checked_partition(store: RunStore, config: Mapping[str, Any], labels: np.ndarray
                      ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The stored partition, refused unless it is the one drawn from the run's seed and configuration.

    Parameters
    ----------
    store : RunStore
        The run folder.
    config : Mapping[str, Any]
        The stored configuration.
    labels : np.ndarray
        The training labels of the run's dataset.

    Returns
    -------
    tuple[list[np.ndarray], list[np.ndarray]]
        Training and local test index arrays, one per client (as :func:`split_clients`).

    Raises
    ------
    CheckpointError
        Naming partition.npz and the first client whose indices differ.
    """
    stored = store.read_partition(len(labels))
    for kind, got, want in zip(("training", "local test"), stored, split_clients(config, labels)):
        for k, (g, w) in enumerate(zip(got, want)):
            if not np.array_equal(g, w):
                raise CheckpointError(store.partition_path, f"client {k}'s {kind} indices differ from the partition "
                                                            "drawn from the run's seed and configuration (the file "
                                                            "was edited or swapped); restore it, or rerun into a new "
                                                            "folder")
    return stored


def saves_clients(config: Mapping[str, Any], round: int) -> bool:
    """Whether a run keeps the client models trained in ``round`` (its ``save_clients``).

    Parameters
    ----------
    config : Mapping[str, Any]
        The run configuration (``save_clients``: "all", "last", "none" or a list of rounds;
        ``rounds``).
    round : int
        A training round (round 0 trains no client).

    Returns
    -------
    bool
        True when the client models of ``round`` are stored.
    """
    mode = config["save_clients"]
    if round < 1 or mode == "none":
        return False
    return mode == "all" or (mode == "last" and round == int(config["rounds"])) or \
        (isinstance(mode, list) and round in mode)


def split_clients(config: Mapping[str, Any], labels: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The client partition (seeded by the run seed) and the optional local test splits.

    Parameters
    ----------
    config : Mapping[str, Any]
        The run configuration (``clients``, ``partition``, ``alpha``, ``partition_options``,
        ``seed``, ``local_test_fraction``).
    labels : np.ndarray
        Training labels.

    Returns
    -------
    tuple[list[np.ndarray], list[np.ndarray]]
        Sorted training index arrays and local test index arrays (empty arrays when no
        local test split is held out), one per client.
    """
    from .partition import partition, train_val_split

    parts = partition(labels, config["clients"], config["partition"], alpha=config["alpha"],
                      seed=config["seed"], **config["partition_options"])
    if config["local_test_fraction"] > 0:
        return train_val_split(parts, float(config["local_test_fraction"]),
                               seed=derive_seed(config["seed"], "local_test") % 2**32)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts], [np.zeros(0, np.int64) for _ in parts]
