"""One way to make a name extensible: a registry of named objects, found live.

Every extension point of the project (FL algorithms, alignment and REPAIR methods, curvature
kinds, result types, command-line commands) is a :class:`Registry`. An extension is one file:
it registers itself when its module is imported, and a registry built with ``package=`` imports
every module of that package (and of folders appended to the package's ``__path__``) before it
answers, so dropping a module into the package is enough. Unknown names get one line naming the
closest known name and the list.

>>> shapes = Registry("shape")
>>> @shapes.register("square")
... def square(x): return x * x
>>> shapes.get("square")(3)
9
>>> shapes.names()
('square',)
>>> shapes.get("sqare")
Traceback (most recent call last):
...
landscape.infra.errors.ConfigError: unknown shape 'sqare' (did you mean 'square'?); available: square
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Generic, Iterator, TypeVar

from .errors import ConfigError
from .options import did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    """Named objects of one kind, with live discovery and did-you-mean errors.

    Parameters
    ----------
    kind : str
        What the names name, for messages (``"algorithm"``, ``"alignment method"``).
    package : str, optional
        A package whose modules register into this registry when imported; every lookup
        imports them all first (discovery), so an extension is one module in that package.
    """

    def __init__(self, kind: str, *, package: str | None = None):
        self.kind = kind
        self.package = package
        self._entries: dict[str, T] = {}

    def add(self, name: str, obj: T) -> T:
        """Register ``obj`` as ``name``.

        Parameters
        ----------
        name : str
            The name users pass.
        obj : T
            The registered object. An object of the same module and qualified name replaces an
            earlier one (a reloaded module).

        Returns
        -------
        T
            ``obj``, so that ``add`` can end a decorator.

        Raises
        ------
        TypeError
            When another object already holds the name.
        """
        old = self._entries.get(name)
        if old is not None and _origin(old) != _origin(obj):
            raise TypeError(f"{self.kind} name {name!r} of {'.'.join(_origin(obj))} is already taken by "
                            f"{'.'.join(_origin(old))}")
        self._entries[name] = obj
        return obj

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator registering the decorated object as ``name``.

        Parameters
        ----------
        name : str
            The name users pass.

        Returns
        -------
        Callable
            The decorator (it returns the object unchanged).
        """
        return lambda obj: self.add(name, obj)

    def remove(self, name: str) -> None:
        """Forget ``name`` (an extension defined in a notebook or a test); unknown names are ignored.

        Parameters
        ----------
        name : str
            The registered name.
        """
        self._entries.pop(name, None)

    def discover(self) -> None:
        """Import every module of ``package`` (each registers what it defines); nothing without one."""
        if self.package is None:
            return
        package = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")

    def entries(self) -> dict[str, T]:
        """Every registered object by name, after discovery.

        Returns
        -------
        dict[str, T]
            Name -> object, in the order of registration.
        """
        self.discover()
        return dict(self._entries)

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted, after discovery.

        Returns
        -------
        tuple[str, ...]
        """
        return tuple(sorted(self.entries()))

    def find(self, name: str) -> T | None:
        """The object registered as ``name``, or None; discovery runs only for a name not yet known.

        Parameters
        ----------
        name : str
            Its name.

        Returns
        -------
        T or None
        """
        if name not in self._entries:
            self.discover()
        return self._entries.get(name)

    def get(self, name: str) -> T:
        """The object registered as ``name``.

        Parameters
        ----------
        name : str
            Its name.

        Returns
        -------
        T

        Raises
        ------
        ConfigError
            For a name that is not a string or not registered (with the closest known name).
        """
        if not isinstance(name, str):
            raise ConfigError(f"{self.kind} must be a name, got {type(name).__name__}")
        found = self.find(name)
        if found is None:
            known = sorted(self._entries)
            raise ConfigError(f"unknown {self.kind} {name!r}{did_you_mean(name, known)}; "
                              f"available: {', '.join(known)}")
        return found

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.find(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _origin(obj: object) -> tuple[str, str]:
    """Module and qualified name of a registered object (or of its class)."""
    target = obj if hasattr(obj, "__qualname__") else type(obj)
    return getattr(target, "__module__", "?"), getattr(target, "__qualname__", "?")
