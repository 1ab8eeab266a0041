"""Public entry points of the FL engine: :func:`run`, :func:`load_run` and :class:`Run`.

``fl.run`` trains and stores a run (see ``fl.store`` for the directory layout) and
returns a :class:`Run`; rerunning the same configuration into the same directory resumes
an interrupted run from its last complete round, or just returns a finished one.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from landscape.infra.errors import CheckpointError, ConfigError, DataError

from . import algorithms
from .algorithms.base import Algorithm, derive_seed
from .algorithms.ima import IMA
from .engine import BACKENDS, Engine, Federation
from .evaluation import resolve_device
from .store import RunStore, State

CONFIG_VERSION = 1

#: Engine options accepted by ``fl.run`` besides the algorithm's own, with defaults.
ENGINE_OPTIONS: dict[str, Any] = {
    "momentum": 0.0,            # SGD momentum of local training
    "weight_decay": 0.0,        # SGD weight decay of local training
    "lr_decay": 0.0,            # per-round decay gamma: lr_r = lr * (1 - gamma)^(r - 1)
    "save_clients": "all",      # "all" | "last" | "none" | list of rounds whose client models are stored
    "eval_batch_size": 1024,
    "local_test_fraction": 0.0,  # share of each client's data held out as its local test split
    "partition_options": {},    # extra keyword arguments of fl.partition.partition
    "data_root": None,          # folder of torchvision datasets
    "download": False,          # allow torchvision downloads
    "ima": False,               # True or a dict of IMA options: IMA on top of the algorithm
    "backend": "sequential",    # "sequential" | "vectorized" (all clients of a round at once, fl.vectorized)
                                # | "loky" | "processes" | "ray" | "dask" (client updates on workers)
    "n_jobs": None,             # workers of a parallel back end (default 2)
}
#: Options that affect only this process, never stored or compared.
RUNTIME_OPTIONS: dict[str, Any] = {"progress": None, "on_round": None}
#: Config keys that may differ when a stored run is resumed or reopened.
VOLATILE = ("device", "data_root", "download", "backend", "n_jobs")


def run(algorithm: str = "fedavg", *, dataset: str = "digits", model: str | nn.Module | None = None,
        clients: int = 10, rounds: int = 20, participation: float = 1.0, local_epochs: int = 1,
        batch_size: int = 32, lr: float = 0.05, partition: str = "dirichlet", alpha: float = 0.5,
        seed: int = 0, out: str | os.PathLike | None = None, device: str = "auto",
        **options: Any) -> "Run":
    """Train ``algorithm`` for ``rounds`` rounds and return the stored :class:`Run`.

    ``model``: a zoo name (default ``fl.models.default_model(dataset)``) or an
    ``nn.Module`` whose current weights are the initial model (then pass the module to
    :func:`load_run` again to rebuild it). ``out``: the run directory; ``None`` means
    ``./runs/<algorithm>-<dataset>-seed<seed>-<config digest>``, so the same call
    finds its earlier run. Options: the algorithm's own (e.g. ``mu`` for FedProx; for
    ``"ima"`` ``window``, ``start_round``, ``schedule``, ...), the engine options of
    :data:`ENGINE_OPTIONS` (``ima=True`` or ``ima={...}`` adds IMA to any algorithm),
    ``backend`` (``"sequential"``, or ``"vectorized"``: a round's clients trained at once
    with ``torch.func``, same results to floating-point tolerance, see :mod:`fl.vectorized`),
    ``progress`` (tqdm bar; default: when stderr is a terminal) and ``on_round`` (a
    callback ``f(round, metrics)`` after each stored round). Unknown options raise
    ``ConfigError`` listing the valid ones; a directory holding a run with another
    configuration raises ``ConfigError``.
    """
    from .datasets import load_dataset

    runtime = {k: options.pop(k) for k in list(options) if k in RUNTIME_OPTIONS}
    config, alg = build_config(algorithm, dataset=dataset, model=model, clients=clients, rounds=rounds,
                               participation=participation, local_epochs=local_epochs,
                               batch_size=batch_size, lr=lr, partition=partition, alpha=alpha,
                               seed=seed, device=device, options=options)
    bundle = load_dataset(config["dataset"], root=config["data_root"], download=config["download"])
    config["num_classes"] = int(bundle.num_classes)
    config["input_shape"] = [int(d) for d in bundle.input_shape]
    template = _template(config, model)
    _check_model_fits(template, bundle)
    if config["model"].startswith("custom:"):  # tell two custom models of one class apart
        config["model_digest"] = _state_digest(template.state_dict())
    path = Path(out) if out is not None else Path("runs") / (
        f"{algorithm}-{dataset}-seed{seed}-{config_digest(config)}")
    store = RunStore(path)
    dev = resolve_device(device)
    with store.lock():
        if _prepare_dir(store, config):
            train_parts, test_parts = store.read_partition()
        else:
            train_parts, test_parts = _split(config, bundle.train_y.numpy())
            store.write_config(config)  # first: a folder with this config and no progress restarts cleanly
            store.write_partition(train_parts, test_parts)
        if not store.is_complete():
            data = Federation.build(bundle, train_parts, test_parts, dev)
            Engine(config, store, alg, template, data, dev, runtime.get("progress"),
                   runtime.get("on_round")).run()
    return Run(path, module=model if isinstance(model, nn.Module) else None)


def build_config(algorithm: str, *, dataset: str, model: Any, clients: int, rounds: int,
                 participation: float, local_epochs: int, batch_size: int, lr: float, partition: str,
                 alpha: float, seed: int, device: str, options: Mapping[str, Any]
                 ) -> tuple[dict[str, Any], Algorithm]:
    """The full, validated run configuration and the algorithm object it describes."""
    from .models import default_model

    if not isinstance(algorithm, str):
        raise ConfigError(f"algorithm must be a name, got {type(algorithm).__name__}")
    cls = algorithms.get(algorithm)
    _positive_int("clients", clients)
    _positive_int("rounds", rounds, allow_zero=True)
    _positive_int("local_epochs", local_epochs)
    _positive_int("batch_size", batch_size)
    _positive_int("seed", seed, allow_zero=True)
    if not (isinstance(participation, (int, float)) and 0 < participation <= 1):
        raise ConfigError(f"participation must be in (0, 1], got {participation!r}")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ConfigError(f"lr must be a positive number, got {lr!r}")
    if not (isinstance(alpha, (int, float)) and alpha > 0):
        raise ConfigError(f"alpha must be positive, got {alpha!r}")
    valid = sorted({*ENGINE_OPTIONS, *RUNTIME_OPTIONS, *cls.options})
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)} for algorithm {algorithm!r}; "
                          f"valid options: {', '.join(valid)}")
    engine = {**ENGINE_OPTIONS, **cls.engine_defaults,
              **{k: v for k, v in options.items() if k in ENGINE_OPTIONS}}
    _check_engine(engine)
    if isinstance(model, nn.Module) or callable(model):
        model_name = f"custom:{type(model).__name__ if isinstance(model, nn.Module) else model.__name__}"
    else:
        model_name = default_model(dataset) if model is None else str(model)
    config: dict[str, Any] = {
        "version": CONFIG_VERSION, "algorithm": algorithm, "dataset": dataset, "model": model_name,
        "clients": int(clients), "rounds": int(rounds), "participation": float(participation),
        "local_epochs": int(local_epochs), "batch_size": int(batch_size), "lr": float(lr),
        "partition": partition, "alpha": float(alpha), "seed": int(seed), "device": str(device),
        **{k: v for k, v in engine.items() if k != "ima"},
    }
    config["options"] = cls.resolve_options({k: v for k, v in options.items() if k in cls.options}, config)
    config["ima"] = None
    if engine["ima"] not in (False, None):
        if cls is IMA:
            raise ConfigError("algorithm 'ima' already is IMA on FedAvg; drop the ima= option")
        given = {} if engine["ima"] is True else engine["ima"]
        if not isinstance(given, Mapping):
            raise ConfigError(f"ima must be True or a dict of IMA options, got {engine['ima']!r}")
        bad = sorted(set(given) - set(IMA.options))
        if bad:
            raise ConfigError(f"unknown IMA option(s) {', '.join(bad)}; valid: {', '.join(sorted(IMA.options))}")
        config["ima"] = IMA.resolve_options(dict(given), config)
    config = json.loads(json.dumps(config))  # exactly what config.json will hold
    return config, make_algorithm(config)


def make_algorithm(config: Mapping[str, Any]) -> Algorithm:
    """The algorithm object of a stored configuration (IMA wrapper included)."""
    cls = algorithms.get(config["algorithm"])
    alg = cls(config["options"], config)
    if config.get("ima"):
        alg = IMA(config["ima"], config, base=alg)
    return alg


def config_digest(config: Mapping[str, Any]) -> str:
    """Short digest of the parts of a configuration that determine the results."""
    stable = {k: v for k, v in config.items() if k not in VOLATILE}
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:10]


def _state_digest(state: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name, t in state.items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _positive_int(name: str, value: Any, allow_zero: bool = False) -> None:
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_engine(engine: Mapping[str, Any]) -> None:
    for key in ("momentum", "weight_decay", "lr_decay"):
        if not isinstance(engine[key], (int, float)) or engine[key] < 0:
            raise ConfigError(f"{key} must be a number >= 0, got {engine[key]!r}")
    if engine["lr_decay"] >= 1:
        raise ConfigError(f"lr_decay is the per-round decay rate gamma in [0, 1), got {engine['lr_decay']}")
    mode = engine["save_clients"]
    if not (mode in ("all", "last", "none") or
            (isinstance(mode, (list, tuple)) and all(isinstance(r, int) for r in mode))):
        raise ConfigError(f"save_clients must be 'all', 'last', 'none' or a list of rounds, got {mode!r}")
    if not 0 <= float(engine["local_test_fraction"]) < 1:
        raise ConfigError(f"local_test_fraction must be in [0, 1), got {engine['local_test_fraction']!r}")
    _positive_int("eval_batch_size", engine["eval_batch_size"])
    if engine["backend"] not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {engine['backend']!r}")
    if not isinstance(engine["partition_options"], Mapping):
        raise ConfigError("partition_options must be a dict of keyword arguments of fl.partition.partition")


def _prepare_dir(store: RunStore, config: Mapping[str, Any]) -> bool:
    """True when ``store`` already holds this run (to resume or reopen); False for a new one.

    Raises ``ConfigError`` when the folder holds another run or unrelated files."""
    if store.config_path.exists():
        old = store.read_config()
        diff = sorted(k for k in set(old) | set(config) if k not in VOLATILE and old.get(k) != config.get(k))
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


def _check_model_fits(template: nn.Module, bundle: Any) -> None:
    """``DataError`` before any file is written when the model cannot classify the data."""
    x = bundle.train_x[:2]
    try:
        with torch.no_grad():
            out = copy.deepcopy(template).eval()(x)
    except Exception as exc:  # any shape error of the user's model
        raise DataError(f"the model cannot be applied to {bundle.name} inputs of shape {tuple(x.shape[1:])}: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    if out.ndim != 2 or out.shape[1] < bundle.num_classes:
        raise DataError(f"the model outputs shape {tuple(out.shape[1:])} per sample but {bundle.name} has "
                        f"{bundle.num_classes} classes: it needs at least {bundle.num_classes} logits")


def _split(config: Mapping[str, Any], labels: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Client partition (seeded by the run seed) and the optional local test splits."""
    from .partition import partition, train_val_split

    parts = partition(labels, config["clients"], config["partition"], alpha=config["alpha"],
                      seed=config["seed"], **config["partition_options"])
    if config["local_test_fraction"] > 0:
        return train_val_split(parts, float(config["local_test_fraction"]),
                               seed=derive_seed(config["seed"], "local_test") % 2**32)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts], [np.zeros(0, np.int64) for _ in parts]


def _template(config: Mapping[str, Any], model: Any) -> nn.Module:
    from .models import build_model

    if str(config["model"]).startswith("custom:"):
        if model is None:
            raise ConfigError(f"this run was trained with a custom model ({config['model']}); "
                              "pass that nn.Module as model=")
        return build_model(model, num_classes=config["num_classes"],
                           input_shape=tuple(config["input_shape"]), seed=config["seed"])
    return build_model(config["model"], num_classes=config["num_classes"],
                       input_shape=tuple(config["input_shape"]), seed=config["seed"])


def load_run(path: str | os.PathLike, *, module: nn.Module | None = None) -> "Run":
    """Open a stored run (complete or not). ``module``: the architecture of a run trained
    with a custom ``nn.Module`` (zoo models are rebuilt from the configuration)."""
    return Run(path, module=module)


class Run:
    """A stored FL run: configuration, metrics and checkpoints (read lazily from ``path``)."""

    def __init__(self, path: str | os.PathLike, *, module: nn.Module | None = None):
        self.store = RunStore(path)
        self.path = self.store.path
        self.config: dict[str, Any] = self.store.read_config()
        self._module = module
        self._bundle: Any = None

    def __repr__(self) -> str:
        last = self.store.read_progress()
        state = "complete" if self.complete else f"{last if last is not None else 'no'} rounds stored"
        return f"Run({str(self.path)!r}, {self.config['algorithm']} on {self.config['dataset']}, {state})"

    # ------------------------------------------------------------------- info
    @property
    def complete(self) -> bool:
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
        """A fresh ``nn.Module`` of the run's (plain) architecture, with its initial weights."""
        if self._module is not None:
            return copy.deepcopy(self._module)
        return _template(self.config, None)

    def checkpoint(self, round: int = -1) -> Path:
        """Path of the global model's checkpoint after ``round``."""
        return self.store.global_path(self._round(round))

    def global_state(self, round: int = -1) -> State:
        """Global model after ``round`` (round 0: initial); for IMA, the IMA model once active."""
        return self.store.read_state(self.checkpoint(round))

    def client_checkpoints(self, round: int = -1) -> dict[int, Path]:
        """Paths of the client models trained in ``round`` (see option ``save_clients``)."""
        r = self._round(round)
        folder = self.store.client_path(r, 0).parent
        if r == 0:
            return {}
        if not folder.is_dir():
            raise CheckpointError(folder, f"client models of round {r} were not stored "
                                          f"(save_clients={self.config['save_clients']!r})")
        return {int(p.stem.split("_")[1]): p for p in sorted(folder.glob("client_*.safetensors"))}

    def client_states(self, round: int = -1) -> dict[int, State]:
        """``{client id: state_dict}`` of the clients trained in ``round``; their
        aggregate is :meth:`global_state` of that round."""
        return {k: self.store.read_state(p) for k, p in self.client_checkpoints(round).items()}

    def algorithm_state(self, round: int = -1) -> State:
        """The algorithm's server state after ``round`` (IMA window, anchors, endpoints...)."""
        return self.store.read_optional_state(self.store.state_path(self._round(round)))

    def training_state(self, round: int = -1) -> State:
        """Global state in the training architecture (differs from :meth:`global_state` only
        for algorithms that train another architecture, e.g. FLOCO)."""
        r = self._round(round)
        path = self.store.train_path(r)
        return self.store.read_state(path if path.exists() else self.store.global_path(r))

    # ------------------------------------------------------------------- data
    def _data(self) -> Any:
        if self._bundle is None:
            from .datasets import load_dataset

            self._bundle = load_dataset(self.config["dataset"], root=self.config.get("data_root"),
                                        download=False)
        return self._bundle

    def client_datasets(self) -> dict[int, TensorDataset]:
        """``{client id: TensorDataset}`` of each client's training data."""
        b = self._data()
        train, _ = self.store.read_partition()
        return {k: TensorDataset(b.train_x[torch.as_tensor(p)], b.train_y[torch.as_tensor(p)])
                for k, p in enumerate(train)}

    def client_test_datasets(self) -> dict[int, TensorDataset]:
        """Each client's local test split (empty unless ``local_test_fraction`` > 0)."""
        b = self._data()
        _, test = self.store.read_partition()
        return {k: TensorDataset(b.train_x[torch.as_tensor(p)], b.train_y[torch.as_tensor(p)])
                for k, p in enumerate(test)}

    def test_dataset(self) -> TensorDataset:
        b = self._data()
        return TensorDataset(b.test_x, b.test_y)
