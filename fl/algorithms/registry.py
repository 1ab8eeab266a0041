"""Registry of FL algorithms: ``name`` -> class.

An algorithm registers itself when its class is created (``Algorithm.__init_subclass__``
calls :func:`register` for every subclass that sets ``name``). :func:`registry` first
imports every module of this package (and of any folder appended to its ``__path__``), so
an algorithm is one file: put it in ``fl/algorithms/`` and it is found; a class defined
elsewhere is registered once its module is imported.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from landscape import ConfigError

from landscape.infra.options import did_you_mean

if TYPE_CHECKING:
    from .base import Algorithm

_REGISTRY: dict[str, type["Algorithm"]] = {}


def register(cls: type["Algorithm"]) -> None:
    """Add ``cls`` under ``cls.name``.

    Parameters
    ----------
    cls : type[Algorithm]
        The class; a class of the same module and qualified name replaces an earlier one
        (a reloaded module).

    Raises
    ------
    TypeError
        When another class already holds the name.
    """
    old = _REGISTRY.get(cls.name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise TypeError(f"algorithm name {cls.name!r} of {cls.__module__}.{cls.__qualname__} is already "
                        f"taken by {old.__module__}.{old.__qualname__}")
    _REGISTRY[cls.name] = cls


def unregister(name: str) -> None:
    """Remove an algorithm (e.g. one defined in a notebook or a test); unknown names are ignored.

    Parameters
    ----------
    name : str
        Its registered name.
    """
    _REGISTRY.pop(name, None)


def discover() -> None:
    """Import every module of the package (each algorithm module registers its classes)."""
    package = importlib.import_module(__package__)
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{__package__}.{info.name}")


def registry() -> dict[str, type["Algorithm"]]:
    """All algorithms by name.

    Returns
    -------
    dict[str, type[Algorithm]]
        Name -> class, sorted by name.
    """
    discover()
    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> type["Algorithm"]:
    """The algorithm class registered as ``name``.

    Parameters
    ----------
    name : str
        Its name, e.g. ``"fedavg"``.

    Returns
    -------
    type[Algorithm]
        The class.

    Raises
    ------
    ConfigError
        For an unknown name (with the closest known one and the list).
    """
    if not isinstance(name, str):
        raise ConfigError(f"algorithm must be a name, got {type(name).__name__}")
    known = registry()
    if name not in known:
        raise ConfigError(f"unknown algorithm {name!r}{did_you_mean(name, known)}; available: {', '.join(known)}")
    return known[name]
