"""Models and data named on the command line: module specs, checkpoint lists, data specs, FL runs.

* **module spec**: a zoo name of the FL engine (``mlp``, ``fedgucci_cnn``, ...; also written
  ``fl.models:mlp``), ``package.module:factory`` or ``path/to/file.py:factory``. A factory is
  any callable returning an ``nn.Module`` (a class or a function); it receives
  ``input_shape`` and ``num_classes`` when its signature names them, plus the user's
  keyword arguments.
* **data spec**: ``digits`` or another dataset of the FL engine (``mnist``, ``cifar10``, ...,
  read from a local root, never downloaded here), or a ``.pt`` file of ``(inputs, targets)``
  tensors (read with ``weights_only=True``) or a ``.npz`` file (read without pickles).
* **run selectors** for an FL run directory: ``global``, ``client:K``, ``clients`` (every
  client trained in the round), each optionally ``@R`` for another round than ``--round``.

This is the command-line layer: it imports the ``fl`` package lazily, only for zoo models,
FL datasets and runs.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from landscape.infra.errors import CheckpointError, ConfigError, DataError

TensorPair = tuple[torch.Tensor, torch.Tensor]
_INPUT_KEYS = ("inputs", "x", "data", "images", "features")
_TARGET_KEYS = ("targets", "y", "labels", "target", "label")
_SELECTOR = re.compile(r"^(global|clients|client:(\d+))(?:@(-?\d+))?$")


# ---------------------------------------------------------------------------- modules
def build_module(spec: str, *, input_shape: tuple[int, ...], num_classes: int,
                 kwargs: Mapping[str, Any] | None = None, seed: int = 0) -> nn.Module:
    """An ``nn.Module`` from a module spec (see the module docstring)."""
    kwargs = dict(kwargs or {})
    target, _, attr = spec.rpartition(":") if ":" in spec else ("", "", spec)
    if target in ("", "fl.models") and _is_zoo(attr):
        from fl.models import build_model

        if kwargs:
            raise ConfigError(f"zoo model {attr!r} takes no keyword arguments; got {sorted(kwargs)}")
        return build_model(attr, num_classes=num_classes, input_shape=tuple(input_shape), seed=seed)
    if not target:
        from fl.models import MODELS

        raise ConfigError(f"unknown model {spec!r}: use a zoo name ({', '.join(MODELS)}) or "
                          "'package.module:factory' or 'file.py:factory'")
    factory = _resolve(target, attr)
    params = _parameters(factory)
    if "input_shape" in params:
        kwargs.setdefault("input_shape", tuple(input_shape))
    if "num_classes" in params:
        kwargs.setdefault("num_classes", num_classes)
    try:
        module = factory(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"cannot call {spec} with {sorted(kwargs)}: {exc}. Pass its arguments "
                          "with --module-kwargs '{\"name\": value}'") from None
    if not isinstance(module, nn.Module):
        raise ConfigError(f"{spec} returned a {type(module).__name__}, not an nn.Module")
    return module


def _is_zoo(name: str) -> bool:
    try:
        from fl.models import MODELS
    except ImportError:  # pragma: no cover - fl ships with this toolkit
        return False
    return name in MODELS


def _resolve(target: str, attr: str) -> Any:
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ConfigError(f"module file {target} not found")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise ConfigError(f"cannot import {target!r}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
            raise ConfigError(f"{target} has no attribute {attr!r}; callables there: {', '.join(names[:20])}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{target}:{attr} is not callable")
    return obj


def _parameters(factory: Any) -> set[str]:
    try:
        return set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return set()


# ------------------------------------------------------------------------------- data
def load_data(spec: str, *, split: str = "test", root: str | None = None) -> TensorPair:
    """``(inputs, targets)`` for a dataset name (``split`` = ``train``/``test``) or a tensor file."""
    if split not in ("train", "test"):
        raise ConfigError(f"split must be 'train' or 'test', got {split!r}")
    path = Path(spec)
    if path.suffix in (".pt", ".pth", ".npz"):
        return load_tensor_file(path)
    from fl.datasets import load_dataset

    bundle = load_dataset(spec, root=root, download=False)
    return (bundle.train_x, bundle.train_y) if split == "train" else (bundle.test_x, bundle.test_y)


def load_tensor_file(path: str | Path) -> TensorPair:
    """``(inputs, targets)`` from ``.pt``/``.pth`` (weights only, no pickles) or ``.npz`` (no pickles).

    Accepted layouts: a pair ``(inputs, targets)``, or a mapping with an inputs key
    (``inputs``, ``x``, ``data``, ``images``, ``features``) and a targets key (``targets``,
    ``y``, ``labels``, ...); an ``.npz`` may also hold exactly two unnamed arrays.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} not found")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                obj: Any = {k: npz[k] for k in npz.files}
        except (ValueError, OSError) as exc:
            raise DataError(f"{path}: not a readable .npz file without pickled objects: {exc}") from None
        if set(obj) == {"arr_0", "arr_1"}:
            obj = (obj["arr_0"], obj["arr_1"])
    else:
        try:
            obj = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises assorted errors on pickles and garbage
            raise DataError(f"{path}: cannot be read as tensors with weights_only=True "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                            "save a tuple (inputs, targets) of tensors") from None
    if isinstance(obj, Mapping):
        x = next((obj[k] for k in _INPUT_KEYS if k in obj), None)
        y = next((obj[k] for k in _TARGET_KEYS if k in obj), None)
        if x is None or y is None:
            raise DataError(f"{path}: a mapping of data needs an inputs key {_INPUT_KEYS} and a targets key "
                            f"{_TARGET_KEYS}; found {sorted(obj)}")
        obj = (x, y)
    if not isinstance(obj, (tuple, list)) or len(obj) != 2:
        raise DataError(f"{path}: expected (inputs, targets), found {type(obj).__name__}")
    x, y = (torch.as_tensor(t) for t in obj)
    if len(x) != len(y):
        raise DataError(f"{path}: {len(x)} inputs but {len(y)} targets")
    if not torch.is_floating_point(y):
        y = y.long()
    return x, y


def infer_classes(targets: torch.Tensor) -> int:
    """Number of classes of integer labels (max + 1); 1 output per target column otherwise."""
    if torch.is_floating_point(targets):
        return int(targets.shape[1]) if targets.ndim > 1 else 1
    return int(targets.max()) + 1


# ------------------------------------------------------------------------- checkpoints
def checkpoint_models(paths: list[str], labels: list[str] | None = None) -> dict[str, Any]:
    """label -> checkpoint path (labels default to the file stems, made unique)."""
    if labels is not None and len(labels) != len(paths):
        raise ConfigError(f"{len(labels)} labels for {len(paths)} checkpoints")
    out: dict[str, Any] = {}
    for i, p in enumerate(paths):
        if not Path(p).exists():
            raise CheckpointError(p, "file not found")
        label = labels[i] if labels is not None else Path(p).stem
        while label in out:
            label = f"{label}#{i}"
        out[label] = Path(p)
    return out


# ------------------------------------------------------------------------------ FL runs
def open_run(path: str) -> Any:
    """An FL run directory as a :class:`fl.Run`."""
    import fl

    if not Path(path).is_dir():
        raise ConfigError(f"run directory {path} not found")
    return fl.load_run(path)


def run_models(run: Any, selectors: list[str], round: int = -1) -> dict[str, Any]:
    """label -> state_dict for run selectors (``global``, ``client:K``, ``clients``, ``...@R``)."""
    out: dict[str, Any] = {}
    for sel in selectors:
        m = _SELECTOR.match(sel.strip())
        if m is None:
            raise ConfigError(f"bad model selector {sel!r}: use global, client:K or clients, optionally @ROUND")
        r = int(m.group(3)) if m.group(3) is not None else round
        suffix = f" @{r}" if m.group(3) is not None else ""
        if m.group(1) == "global":
            out[f"global{suffix}"] = run.global_state(r)
            continue
        clients = run.client_states(r)
        if not clients:
            raise ConfigError(f"round {r} has no client models (round 0 is the initial model); pick another --round")
        if m.group(1) == "clients":
            out.update({f"client {k}{suffix}": s for k, s in clients.items()})
        else:
            k = int(m.group(2))
            if k not in clients:
                raise ConfigError(f"client {k} did not train in round {r}; trained: {sorted(clients)}")
            out[f"client {k}{suffix}"] = clients[k]
    return out


def run_data(run: Any, split: str = "test") -> TensorPair:
    """The run's test set, the union of its clients' training data (``train``) or ``client:K``."""
    if split == "test":
        return _tensors(run.test_dataset())
    datasets = run.client_datasets()
    if split == "train":
        parts = [_tensors(d) for d in datasets.values()]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    m = re.match(r"^client:(\d+)$", split)
    if m and int(m.group(1)) in datasets:
        return _tensors(datasets[int(m.group(1))])
    raise ConfigError(f"split {split!r}: use test, train or client:K with K in {sorted(datasets)}")


def run_client_data(run: Any) -> dict[int, TensorPair]:
    """Each client's training data as tensors."""
    return {k: _tensors(d) for k, d in run.client_datasets().items()}


def _tensors(dataset: Any) -> TensorPair:
    if hasattr(dataset, "tensors") and len(dataset.tensors) >= 2:
        return dataset.tensors[0], dataset.tensors[1]
    xs, ys = zip(*(dataset[i] for i in range(len(dataset))))
    return torch.stack(list(xs)), torch.as_tensor(ys)
