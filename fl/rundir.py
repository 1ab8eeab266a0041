"""The run-folder protocol of ``fl.run``: whether a folder holds this run (resume or reopen),
another one (refused), unrelated files (refused) or nothing yet (start), and the client split
written with a new run. The file layout itself is :mod:`fl.store`'s."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from landscape import ConfigError

from .algorithms.seeds import derive_seed
from .config import check_stored_config, config_differences
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
        version or schema, or files that are not an FL run.
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
    others = [p.name for p in store.path.iterdir() if not p.name.startswith(".")
              and p.name != store.partition_path.name] if store.path.exists() else []  # a partition alone: killed start
    if others and not store.config_path.exists():
        raise ConfigError(f"{store.path} is not empty and is not an FL run directory "
                          f"(holds {', '.join(sorted(others)[:5])}); choose an empty or new folder")
    return False


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
