"""Registry of FL algorithms: ``name`` -> class.

An algorithm registers itself when its class is created (``Algorithm.__init_subclass__``
calls :func:`register` for every subclass that sets ``name``). :func:`registry` first
imports every module of this package (and of any folder appended to its ``__path__``), so
an algorithm is one file: put it in ``fl/algorithms/`` and it is found; a class defined
elsewhere is registered once its module is imported.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from landscape.infra.registry import Registry

if TYPE_CHECKING:
    from .base import Algorithm

#: Every FL algorithm by name; discovery imports every module of this package.
ALGORITHMS: Registry[type["Algorithm"]] = Registry("algorithm", package=__package__)


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
    ALGORITHMS.add(cls.name, cls)


def unregister(name: str) -> None:
    """Remove an algorithm (e.g. one defined in a notebook or a test); unknown names are ignored.

    Parameters
    ----------
    name : str
        Its registered name.
    """
    ALGORITHMS.remove(name)


def registry() -> dict[str, type["Algorithm"]]:
    """All algorithms by name.

    Returns
    -------
    dict[str, type[Algorithm]]
        Name -> class, sorted by name.
    """
    return dict(sorted(ALGORITHMS.entries().items()))


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
    return ALGORITHMS.get(name)
