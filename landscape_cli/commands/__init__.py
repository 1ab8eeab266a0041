"""The commands of ``landscape``, one module each.

A command module has ``register(sub)``, which adds its parser to the subcommands and sets
``func`` to the function that runs it (``args -> exit status``). :data:`COMMANDS` lists
them in the order of ``landscape --help``; a new command is a module plus its name here.
"""
from __future__ import annotations

import importlib
from types import ModuleType

COMMANDS = ("train", "path", "plane", "group", "hessian", "trace", "density", "decompose", "check", "report",
            "align", "curve")


def command_modules() -> list[ModuleType]:
    """The command modules, in :data:`COMMANDS` order.

    Returns
    -------
    list[ModuleType]
        Each with a ``register(sub)`` function.
    """
    return [importlib.import_module(f"{__name__}.{name}") for name in COMMANDS]
