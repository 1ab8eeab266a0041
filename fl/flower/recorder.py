"""The run folder of a Flower federation (:class:`FlowerRecorder`), for either Flower API.

The recorder creates the folder before the federation starts: the configuration, the client
partition of one of ``fl``'s datasets (seeded by ``seed``) and the initial model (round 0).
Each recorded round holds the global model, its test loss and accuracy on the dataset's test
split (``fl.evaluation.evaluate``), the clients' numeric training metrics and, on the rounds
``save_clients`` names, the client models under their partition ids. :func:`fl.load_run`,
``landscape report --run`` and ``landscape.claims`` then work on the folder as on one of
``fl.run``.

Inside a Message-API ``ServerApp``, create it from the run configuration
(:meth:`FlowerRecorder.from_run_config`), so that it also works when ``flwr run`` starts the
``ServerApp`` in a process of its own.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from landscape.infra.errors import ConfigError

from ..datasets import load_dataset
from ..evaluation import evaluate
from ..initial import apply_init
from ..manifest import record_round
from ..resolve import build_config
from ..rundir import prepare_dir, refuse_foreign, saves_clients, split_clients
from ..store import RunStore, check_round_finite
from ..template import build_template, check_model_fits
from ..tracker import tracker_for
from ..update_checks import is_server_field

#: the table of a Flower app's run configuration that holds ``fl``'s settings
#: (``[tool.flwr.app.config.fl]`` in pyproject.toml; Flower flattens it to keys ``"fl.<name>"``)
CONFIG_PREFIX = "fl."

Arrays = Sequence[np.ndarray] | Mapping[str, Any]


def settings_from_run_config(run_config: Mapping[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The run folder and ``fl`` settings in a Flower run configuration.

    Keys ``"fl.<name>"`` are read (``-`` in a name stands for ``_``: ``fl.save-clients``);
    ``fl.run-dir`` names the run folder. Other keys belong to the user's app and are ignored.

    Parameters
    ----------
    run_config : Mapping[str, Any]
        ``context.run_config`` of a ``ServerApp``.

    Returns
    -------
    tuple[Path, dict[str, Any]]
        The run folder and the settings (``fl.run``'s keyword arguments).

    Raises
    ------
    ConfigError
        When ``fl.run-dir`` is missing.

    Examples
    --------
    >>> settings_from_run_config({"fl.run-dir": "runs/a", "fl.save-clients": "all", "lr": 0.1})
    (PosixPath('runs/a'), {'save_clients': 'all'})
    """
    settings = {key[len(CONFIG_PREFIX):].replace("-", "_"): value for key, value in run_config.items()
                if key.startswith(CONFIG_PREFIX)}
    if "run_dir" not in settings:
        raise ConfigError(f"the Flower run configuration has no {CONFIG_PREFIX}run-dir (the run folder); "
                          "add run-dir to [tool.flwr.app.config.fl] or pass --run-config \"fl.run-dir='...'\"")
    return Path(str(settings.pop("run_dir"))), settings


class FlowerRecorder:
    """The run folder of a Flower federation over one of ``fl``'s datasets.

    Parameters
    ----------
    out : str or os.PathLike
        The run folder (created; an existing run folder of another configuration is refused).
    model : str or nn.Module, optional
        A zoo name (default: the dataset's model) or the module whose current weights are the
        initial model (pass it to :func:`fl.load_run` to reopen the run).
    algorithm : str
        The ``fl`` algorithm the strategy's aggregation corresponds to (``"fedavg"``).
    **settings : Any
        :class:`fl.RunConfig` fields: ``dataset``, ``clients``, ``rounds``, ``seed``,
        ``partition``, ``alpha``, ``save_clients`` ("all", "last", "none" or a list of rounds), ...

    Raises
    ------
    ConfigError
        For an unknown setting, or a folder that holds another run or a finished one.
    """

    def __init__(self, out: str | os.PathLike, *, model: str | nn.Module | None = None,
                 algorithm: str = "fedavg", **settings: Any):
        config, _ = build_config(algorithm, model=model, **settings)
        bundle = load_dataset(config["dataset"], root=config["data_root"], download=config["download"])
        config["num_classes"] = int(bundle.num_classes)
        config["input_shape"] = [int(d) for d in bundle.input_shape]
        self.module = build_template(config, model if isinstance(model, nn.Module) else None)
        check_model_fits(self.module, bundle)
        apply_init(self.module, config)
        self.config, self.store = config, RunStore(out)
        self.test_x, self.test_y = bundle.test_x, bundle.test_y
        refuse_foreign(self.store)  # before the lock file is created in it
        with self.store.lock():
            if prepare_dir(self.store, config):
                raise ConfigError(f"{self.store.path} already holds a recorded run; choose another folder")
            train_parts, test_parts = split_clients(config, bundle.train_y.numpy())
            self.store.write_config(config)
            self.store.write_partition(train_parts, test_parts)
        self.keys = list(self.module.state_dict())
        self.tracker = tracker_for(config, self.module, bundle.train_x, bundle.train_y, train_parts,
                                   torch.device("cpu"), self.store)
        self.manifest: dict[str, Any] | None = None  # as last recorded (record_round's ``previous``)

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], *, model: str | nn.Module | None = None
                        ) -> "FlowerRecorder":
        """A recorder configured by a Flower run configuration (:func:`settings_from_run_config`).

        Parameters
        ----------
        run_config : Mapping[str, Any]
            ``context.run_config`` inside the ``ServerApp``'s ``main``.
        model : str or nn.Module, optional
            As for the constructor.

        Returns
        -------
        FlowerRecorder
            The recorder of ``fl.run-dir``.

        Raises
        ------
        ConfigError
            As for :func:`settings_from_run_config` and the constructor.
        """
        out, settings = settings_from_run_config(run_config)
        return cls(out, model=model, **settings)

    @property
    def path(self) -> Path:
        """The run folder."""
        return self.store.path

    @property
    def rounds(self) -> int:
        """The number of training rounds of the run's configuration."""
        return int(self.config["rounds"])

    def initial_arrays(self) -> list[np.ndarray]:
        """The initial model as a list of arrays in ``state_dict`` order."""
        return [t.detach().cpu().numpy() for t in self.module.state_dict().values()]

    def initial_state(self) -> dict[str, torch.Tensor]:
        """The initial model's state dict (a copy)."""
        return {k: t.detach().clone() for k, t in self.module.state_dict().items()}

    def state(self, arrays: Arrays) -> dict[str, torch.Tensor]:
        """A state dict of the run's model from Flower's arrays.

        Parameters
        ----------
        arrays : list of np.ndarray or Mapping[str, array-like]
            Arrays in ``state_dict`` order (legacy API) or a state dict (an
            ``ArrayRecord.to_torch_state_dict()`` of the Message API).

        Returns
        -------
        dict[str, torch.Tensor]
            The state, in the model's dtypes.

        Raises
        ------
        ConfigError
            When the names, number or shapes of the arrays do not match the model.
        """
        reference = self.module.state_dict()
        if isinstance(arrays, Mapping):
            if list(arrays) != self.keys:
                missing = sorted(set(self.keys) - set(arrays)) or sorted(set(arrays) - set(self.keys))
                raise ConfigError(f"Flower sent tensors {sorted(arrays)[:3]}...; the run's model has other names "
                                  f"(first difference: {missing[:1] or 'the order'}); send model.state_dict()")
            pairs = list(arrays.items())
        else:
            if len(arrays) != len(self.keys):
                raise ConfigError(f"Flower sent {len(arrays)} arrays; the run's model has {len(self.keys)} tensors "
                                  "(send model.state_dict() values in order)")
            pairs = list(zip(self.keys, arrays))
        out = {}
        for key, arr in pairs:
            if tuple(arr.shape) != tuple(reference[key].shape):
                raise ConfigError(f"array for {key} has shape {tuple(arr.shape)}, the model's is "
                                  f"{tuple(reference[key].shape)}")
            tensor = arr.detach().clone() if isinstance(arr, torch.Tensor) else torch.as_tensor(np.array(arr))
            out[key] = tensor.to(reference[key].dtype)
        return out

    def saves_clients(self, round: int) -> bool:
        """Whether the client models of ``round`` are stored (the ``save_clients`` setting).

        Parameters
        ----------
        round : int
            A round.

        Returns
        -------
        bool
            True when ``save_clients`` names it.
        """
        return saves_clients(self.config, round)

    def tracks(self, round: int) -> bool:
        """Whether ``round`` is tracked (``track`` setting, :class:`fl.Track`): its client models are needed.

        Parameters
        ----------
        round : int
            A round.

        Returns
        -------
        bool
            True when the run is tracked and ``round`` is one of its tracked rounds.
        """
        return self.tracker is not None and self.tracker.due(round)

    def record(self, round: int, global_model: Arrays, clients: Mapping[int, Arrays] | None = None,
               fit_metrics: Mapping[str, float] | None = None, dropped: Mapping[Any, str] | None = None) -> None:
        """Write round ``round``: client models (when stored), the global model, metrics, progress.

        Every array is converted and checked before the first file is written, so a round is
        stored whole or not at all.

        Parameters
        ----------
        round : int
            0 for the initial model, then Flower's server round.
        global_model : list of np.ndarray or Mapping[str, array-like]
            The aggregated model (see :meth:`state`).
        clients : Mapping[int, arrays], optional
            Partition id -> the client's model trained in this round (stored when ``save_clients``
            names the round; on a tracked round, the tracked barriers and spread are theirs and the
            record lists them as ``clients``).
        fit_metrics : Mapping[str, float], optional
            Aggregated client metrics, stored in the round's record; the server's own fields
            (``test_accuracy``, ``round``, ...: :func:`fl.update_checks.is_server_field`) are
            left out, so a client cannot set them.
        dropped : Mapping, optional
            Client -> why its reply was refused (recorded as ``dropped`` and ``dropped_reasons``;
            a client named by its node, not a partition id, is counted in the reasons only).

        Raises
        ------
        ConfigError
            For arrays that do not fit the model, or a round beyond the configured rounds.
        RunDivergedError
            When the global model or a metric is not finite (nothing of the round is written).
        """
        if not 0 <= round <= self.rounds:
            raise ConfigError(f"round {round} is outside the run's rounds 0..{self.rounds}; set the recorder's "
                              "rounds to the federation's number of rounds")
        start = time.perf_counter()
        state = self.state(global_model)
        loss, accuracy = evaluate(self.module, state, self.test_x, self.test_y,
                                  batch_size=int(self.config["eval_batch_size"]))
        record: dict[str, Any] = {"round": int(round), "test_loss": loss, "test_accuracy": accuracy,
                                  **{k: float(v) for k, v in (fit_metrics or {}).items() if not is_server_field(k)}}
        if dropped:
            ids = sorted(int(k) for k in dropped if str(k).isdigit() and int(k) < int(self.config["clients"]))
            record.update(dropped=ids, dropped_reasons=[f"client {k}: {v}" for k, v in sorted(dropped.items())])
        record["time"] = time.perf_counter() - start
        check_round_finite(round, state, record)
        tracked = self.tracks(round)
        stored = {k: self.state(arrays) for k, arrays in (clients or {}).items()} \
            if self.saves_clients(round) or tracked else {}
        bad = [k for k in stored if not (isinstance(k, int) and 0 <= k < int(self.config["clients"]))]
        if bad:
            raise ConfigError(f"client {bad[0]!r} is not a partition id of the run's {self.config['clients']} clients")
        if tracked and self.tracker is not None:
            stored = dict(sorted(stored.items()))
            record.update({"clients": list(stored)} if round else {}, **self.tracker.record(round, state, stored))
        stored = stored if self.saves_clients(round) else {}
        for k, client_state in stored.items():
            self.store.write_state(self.store.client_path(round, k), client_state)
        self.store.write_state(self.store.global_path(round), state)
        self.store.append_metrics(record)
        self.manifest = record_round(self.store, round, record, self.manifest)
        self.store.mark(round, complete=round == self.rounds)
