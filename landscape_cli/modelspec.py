"""Models named on the command line: module specs and checkpoint lists.

A **module spec** is a zoo name of the FL engine (``mlp``, ``fedgucci_cnn``, ...; also
written ``fl.models:mlp``), ``package.module:factory`` or ``path/to/file.py:factory``. A
factory is any callable returning an ``nn.Module`` (a class or a function); it receives
``input_shape`` and ``num_classes`` when its signature names them, plus the user's keyword
arguments. The ``fl`` package is imported lazily, only for zoo models.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any, Mapping

from torch import nn

from landscape import CheckpointError, ConfigError


def build_module(spec: str, *, input_shape: tuple[int, ...], num_classes: int,
                 kwargs: Mapping[str, Any] | None = None, seed: int = 0) -> nn.Module:
    """An ``nn.Module`` from a module spec (see the module docstring).

    Parameters
    ----------
    spec : str
        Zoo name, ``package.module:factory`` or ``file.py:factory``.
    input_shape : tuple[int, ...]
        Shape of one input sample (passed to factories that name ``input_shape``).
    num_classes : int
        Number of outputs (passed to factories that name ``num_classes``).
    kwargs : Mapping[str, Any], optional
        Further keyword arguments of the factory (zoo models take none).
    seed : int
        Initialisation seed of a zoo model.

    Returns
    -------
    nn.Module

    Raises
    ------
    ConfigError
        Unknown zoo name, import failure, a factory that cannot be called with these
        arguments or that does not return an ``nn.Module``.
    """
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
    except Exception as exc:  # the user's factory failed: report it on one line
        raise ConfigError(f"--module {spec}: the factory raised {type(exc).__name__}: {exc}") from None
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
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the user's file failed to run: report it on one line
            raise ConfigError(f"--module: running {target} raised {type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            if isinstance(exc, ModuleNotFoundError) and exc.name and (target + ".").startswith(exc.name + "."):
                raise ConfigError(_unknown_module(target, attr)) from None  # the spec's module does not exist
            raise ConfigError(f"cannot import {target!r}: {exc}") from None
        except Exception as exc:  # the module raised while being imported
            raise ConfigError(f"--module: importing {target} raised {type(exc).__name__}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
            raise ConfigError(f"{target} has no attribute {attr!r}; callables there: {', '.join(names[:20])}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{target}:{attr} is not callable")
    return obj


def _unknown_module(target: str, attr: str) -> str:
    """The message for a ``package.module:factory`` spec whose module does not exist.

    The spec syntax, and the closest known prefix (torchvision's models for ``tv``, as ``fl-run``
    names them).
    """
    prefixes = {"fl.models": "fl.models", "torchvision.models": "torchvision.models",
                "torchvision": "torchvision.models", "tv": "torchvision.models"}
    close = difflib.get_close_matches(target, list(prefixes), n=1, cutoff=0.6)
    hint = f" (did you mean '{prefixes[close[0]]}:{attr}'?)" if close else ""
    return (f"--module {target}:{attr}: cannot import {target!r}: there is no such module{hint}; a module spec "
            f"is a zoo name such as mlp, 'package.module:factory' or 'path/to/file.py:factory', e.g. "
            f"'torchvision.models:resnet18' with --module-kwargs '{{\"num_classes\": 10}}'")


def _parameters(factory: Any) -> set[str]:
    try:
        return set(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return set()


def checkpoint_models(paths: list[str], labels: list[str] | None = None) -> dict[str, Any]:
    """Checkpoint files by label.

    Parameters
    ----------
    paths : list[str]
        Checkpoint files (read later, by the analysis).
    labels : list[str], optional
        One name per file (default: the file stems, made unique).

    Returns
    -------
    dict[str, Path]
        Label -> path.

    Raises
    ------
    ConfigError, CheckpointError
        A label count that does not match, or a missing file.
    """
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
