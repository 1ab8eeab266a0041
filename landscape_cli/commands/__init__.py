"""The commands of ``landscape``, one module each.

A command module decorates its ``register(sub)`` with ``@COMMANDS.register(name)``;
``register`` adds the command's parser to the subcommands and sets ``func`` to the function
that runs it (``args -> exit status``). :data:`COMMANDS` imports every module of this package
before it answers, so a new command is one module here; ``landscape --help`` lists the
commands by name.
"""
from __future__ import annotations

from typing import Any, Callable

from landscape.infra.registry import Registry

#: command name -> its ``register(sub)`` function.
COMMANDS: Registry[Callable[[Any], None]] = Registry("command", package=__name__)
