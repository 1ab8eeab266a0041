"""FL algorithms, one file each, found by the registry (:mod:`fl.algorithms.registry`).

``registry()`` lists them (name -> class), ``get(name)`` returns one. The contract an
algorithm implements is :class:`~fl.algorithms.base.Algorithm`; a
:class:`~fl.algorithms.wrapper.Wrapper` (IMA) is composed around another algorithm.
"""
from __future__ import annotations

from .base import Algorithm, ClientUpdate, EvalContext, LocalContext, RoundContext
from .registry import get, register, registry, unregister
from .wrapper import Wrapper

__all__ = ["Algorithm", "ClientUpdate", "EvalContext", "LocalContext", "RoundContext", "Wrapper",
           "get", "register", "registry", "unregister"]
