"""Reading a stored run.

:func:`load_run` and :class:`Run` (configuration, metrics, checkpoints and data,
read lazily from the run folder).
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from landscape.infra.errors import CheckpointError, ConfigError

from .config import check_stored_config
from .convergence import Convergence, assess
from .manifest import Manifest, verify
from .rundir import checked_partition, saves_clients
from .store import RunStore, State
from .template import build_template
from .tracking import track_table


def load_run(path: str | os.PathLike, *, module: nn.Module | None = None) -> "Run":
    """Open a stored run (complete or not).

    Parameters
    ----------
    path : str or os.PathLike
        The run folder.
    module : nn.Module, optional
        The architecture of a run trained with a custom module (zoo models are rebuilt
        from the configuration).

    Returns
    -------
    Run
        The run.

    Raises
    ------
    ConfigError
        When the folder's config.json is not a configuration of this version.
    CheckpointError
        When a file is damaged, or the folder differs from its manifest (:mod:`fl.manifest`):
        a checkpoint, metrics record or the configuration edited, replaced, swapped, missing
        or added.
    """
    return Run(path, module=module)


class Run:
    """A stored FL run: configuration, metrics and checkpoints (read lazily from ``path``).

    Parameters
    ----------
    path : str or os.PathLike
        The run folder.
    module : nn.Module, optional
        The architecture of a custom-model run.
    """

    def __init__(self, path: str | os.PathLike, *, module: nn.Module | None = None):
        self.store = RunStore(path)
        self.path = self.store.path
        self.config: dict[str, Any] = check_stored_config(self.store.read_config(), str(self.store.config_path))
        self._module = module
        self._bundle: Any = None
        self._manifest: Manifest | None = None
        self._partition: tuple[list[np.ndarray], list[np.ndarray]] | None = None
        last = self.store.read_progress()
        if last is not None:
            self._verified(last)

    def __repr__(self) -> str:
        last = self.store.read_progress()
        state = "complete" if self.complete else f"{last if last is not None else 'no'} rounds stored"
        return f"Run({str(self.path)!r}, {self.config['algorithm']} on {self.config['dataset']}, {state})"

    # ------------------------------------------------------------------- info
    @property
    def complete(self) -> bool:
        """True once every round of the configuration is stored."""
        return self.store.is_complete()

    @property
    def rounds(self) -> list[int]:
        """Rounds with a stored global model: 0 (initial) .. last complete round."""
        last = self.store.read_progress()
        return [] if last is None else list(range(last + 1))

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """One dict per complete round: ``round``, ``test_loss``, ``test_accuracy``, ...."""
        return self.store.read_metrics()

    def track(self) -> Any:
        """The landscape measures tracked during training (``fl.run(..., track=fl.Track())``).

        Returns
        -------
        TrackTable
            One row per tracked round (:class:`landscape.results.tracking.TrackTable`):
            ``table["trace"]``, ``table.columns``, ``table.to_pandas()``.

        Raises
        ------
        ConfigError
            When the run was not tracked.
        """
        return track_table(self.metrics, self.config)

    def convergence(self) -> Convergence:
        """Whether the global test accuracy has stopped rising (:func:`fl.convergence.assess`).

        Returns
        -------
        Convergence
            ``converged``, the slope over the last 10% of rounds (at least 5) and the plateau.
        """
        return assess(self.metrics)

    def _verified(self, round: int) -> Manifest:
        """The manifest, checked against the folder up to ``round`` at least."""
        if self._manifest is None or self._manifest.checked < round:
            self._manifest = verify(self.store, max(round, self.store.read_progress() or 0))
        return self._manifest

    def _read(self, round: int, path: Path, optional: bool = False) -> State:
        """A checkpoint of ``round``, which must be the file its manifest entry names."""
        digest = self._verified(round).digest_of(path)
        if optional:
            return self.store.read_optional_state(path, digest)
        return self.store.read_state(path, digest)

    def _round(self, round: int) -> int:
        rounds = self.rounds
        if not rounds:
            raise CheckpointError(self.path, "holds no complete round yet")
        try:
            return rounds[round] if round < 0 else rounds[rounds.index(round)]
        except (IndexError, ValueError):
            raise ConfigError(f"round {round} is not stored in {self.path}; stored rounds are "
                              f"{rounds[0]}..{rounds[-1]}") from None

    # ----------------------------------------------------------------- models
    def module(self) -> nn.Module:
        """A fresh module of the run's plain architecture with its initial weights.

        Returns
        -------
        nn.Module
            A new module (a copy of the custom module given to :func:`load_run`); for a run
            started from ``init`` weights, holding the stored initial model (round 0).
        """
        module = copy.deepcopy(self._module) if self._module is not None else build_template(self.config, None)
        if self.config["init"] is not None:
            module.load_state_dict(self.global_state(0))
        return module

    def checkpoint(self, round: int = -1) -> Path:
        """Path of the global model's checkpoint after ``round``.

        Parameters
        ----------
        round : int
            A stored round (negative: from the end).

        Returns
        -------
        Path
            The safetensors file.
        """
        return self.store.global_path(self._round(round))

    def global_state(self, round: int = -1) -> State:
        """The global model after ``round`` (round 0: initial; for IMA, the IMA model once active).

        Parameters
        ----------
        round : int
            A stored round (negative: from the end).

        Returns
        -------
        State
            The state_dict of the plain architecture.
        """
        r = self._round(round)
        return self._read(r, self.store.global_path(r))

    def client_checkpoints(self, round: int = -1) -> dict[int, Path]:
        """Paths of the client models trained in ``round`` (see ``save_clients``).

        Parameters
        ----------
        round : int
            A stored round (negative: from the end).

        Returns
        -------
        dict[int, Path]
            Client id -> file; empty for round 0.
        """
        r = self._round(round)
        folder = self.store.client_path(r, 0).parent
        if r == 0:
            return {}
        found = self.store.client_checkpoints(r)  # strict names, no links
        trained = self.metrics[r].get("clients", []) if saves_clients(self.config, r) else []
        missing = sorted(set(trained) - set(found))
        if missing:
            raise CheckpointError(self.store.client_path(r, missing[0]), f"is missing: metrics.jsonl lists client "
                                  f"{missing[0]} as trained in round {r} and save_clients="
                                  f"{self.config['save_clients']!r} keeps its model; restore the file")
        if not found:
            raise CheckpointError(folder, f"client models of round {r} were not stored "
                                          f"(save_clients={self.config['save_clients']!r})")
        return found

    def client_states(self, round: int = -1) -> dict[int, State]:
        """The client models trained in ``round``; their aggregate is :meth:`global_state`.

        Parameters
        ----------
        round : int
            A stored round (negative: from the end).

        Returns
        -------
        dict[int, State]
            Client id -> state_dict (parameters the run froze, stored only with the global
            model, filled in from it).
        """
        r = self._round(round)
        clients = {k: self._read(r, p) for k, p in self.client_checkpoints(r).items()}
        frozen = self.config.get("frozen")
        if not frozen or not clients:
            return clients
        shared = self.global_state(r)  # a client checkpoint stores only the trained parameters
        return {k: {n: state[n] if n in state else shared[n] for n in shared} for k, state in clients.items()}

    def algorithm_state(self, round: int = -1) -> State:
        """The algorithm's server state after ``round`` (IMA window, anchors, endpoints, ...).

        Parameters
        ----------
        round : int
            A stored round (negative: from the end).

        Returns
        -------
        State
            Empty when the algorithm keeps none.
        """
        r = self._round(round)
        return self._read(r, self.store.state_path(r), optional=True)

    def kept_client_states(self) -> dict[int, State]:
        """The per-client states the server keeps after the last stored round.

        Ditto's personal models, for instance; only the latest round's are stored.

        Returns
        -------
        dict[int, State]
            Client id -> state; empty when the algorithm keeps none.
        """
        r = self._round(-1)
        return self.store.read_client_states(r, self._verified(r).digest_of(self.store.client_state_path(r)))

    def training_state(self, round: int = -1) -> State:
        """The global state in the training architecture.

        It differs from :meth:`global_state` only for algorithms that train another
        architecture, e.g. FLOCO.

        Parameters
        ----------
        round : int
            A stored round (negative: from the end).

        Returns
        -------
        State
            The training-architecture state_dict.
        """
        r = self._round(round)
        path = self.store.train_path(r)
        return self._read(r, path if path.exists() else self.store.global_path(r))

    # ------------------------------------------------------------------- data
    def _data(self) -> Any:
        if self._bundle is None:
            from .datasets import load_dataset

            self._bundle = load_dataset(self.config["dataset"], root=self.config.get("data_root"),
                                        download=False)
        return self._bundle

    def client_datasets(self) -> dict[int, TensorDataset]:
        """Each client's training data.

        Returns
        -------
        dict[int, TensorDataset]
            Client id -> dataset.
        """
        return self._partition_datasets(0)

    def client_test_datasets(self) -> dict[int, TensorDataset]:
        """Each client's local test split (empty unless ``local_test_fraction`` > 0).

        Returns
        -------
        dict[int, TensorDataset]
            Client id -> dataset.
        """
        return self._partition_datasets(1)

    def _partition_datasets(self, part: int) -> dict[int, TensorDataset]:
        """Client id -> dataset of part ``part`` of the stored partition (0: training, 1: local test).

        Checked against the partition drawn from the run's seed (once per ``Run``).
        """
        b = self._data()
        if self._partition is None:
            self._partition = checked_partition(self.store, self.config, b.train_y.numpy())
        parts = self._partition[part]
        return {k: TensorDataset(b.train_x[torch.as_tensor(p)], b.train_y[torch.as_tensor(p)])
                for k, p in enumerate(parts)}

    def test_dataset(self) -> TensorDataset:
        """The global test set.

        Returns
        -------
        TensorDataset
            Inputs and labels.
        """
        b = self._data()
        return TensorDataset(b.test_x, b.test_y)
