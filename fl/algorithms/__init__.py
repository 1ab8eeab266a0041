"""Registry of FL algorithms: ``name`` -> :class:`~fl.algorithms.base.Algorithm` subclass.

Every subclass with a ``name`` defined in one of ``MODULES`` is registered; a module that
is not present is skipped. ``get(name)`` raises ``ConfigError`` listing the known names.
"""
from __future__ import annotations

import importlib
import inspect

from landscape.infra.errors import ConfigError

from .base import Algorithm, ClientUpdate, EvalContext, LocalContext, RoundContext

MODULES = ("fedavg", "fedprox", "ima", "fedgucci", "floco", "lss")


def registry() -> dict[str, type[Algorithm]]:
    """All available algorithms by name."""
    found: dict[str, type[Algorithm]] = {}
    for mod_name in MODULES:
        full = f"{__name__}.{mod_name}"
        try:
            module = importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name == full:
                continue
            raise
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, Algorithm) and obj.__module__ == full
                    and obj.__dict__.get("name")):
                found[obj.name] = obj
    return found


def get(name: str) -> type[Algorithm]:
    """The algorithm class registered as ``name``."""
    algorithms = registry()
    if name not in algorithms:
        raise ConfigError(f"unknown algorithm {name!r}; available: {', '.join(sorted(algorithms))}")
    return algorithms[name]


__all__ = ["Algorithm", "ClientUpdate", "EvalContext", "LocalContext", "RoundContext", "MODULES",
           "get", "registry"]
