"""What the analysis commands share: their parent parser and how a command parser is made."""
from __future__ import annotations

import argparse
from typing import Any, Callable

from landscape_cli.evaluator_flags import add_evaluator_arguments
from landscape_cli.inputs import EPILOG_INPUTS, add_input_arguments
from landscape_cli.output import add_output_arguments
from landscape_cli.parsing import Formatter, Parser

Command = Callable[[argparse.Namespace], int]


def analysis_parent() -> argparse.ArgumentParser:
    """A parent parser with the ``models and data``, ``evaluation`` and ``output`` groups.

    Returns
    -------
    argparse.ArgumentParser
        Without help of its own (``add_help=False``), to pass as ``parents=[...]``.
    """
    parent = argparse.ArgumentParser(add_help=False)
    add_input_arguments(parent)
    add_evaluator_arguments(parent)
    add_output_arguments(parent)
    return parent


def add_analysis_command(sub: Any, name: str, *, help: str, func: Command,
                         parents: tuple[argparse.ArgumentParser, ...] = (), **defaults: Any) -> Parser:
    """Add an analysis command (models, data, evaluation and output flags) to ``sub``.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The subcommand set (of ``landscape`` or of ``landscape check``).
    name : str
        Command name.
    help : str
        One line for the command list.
    func : Callable[[argparse.Namespace], int]
        Runs the command and returns its exit status.
    parents : tuple[argparse.ArgumentParser, ...]
        Extra parent parsers (e.g. the Lanczos options).
    **defaults
        Values for ``set_defaults``: ``nmodels=(least, most)``, ``default_models`` (run
        selectors used without ``--models``), ``keep_clients``.

    Returns
    -------
    Parser
        The new command's parser, to add its own flags to.
    """
    parser = sub.add_parser(name, parents=[analysis_parent(), *parents], formatter_class=Formatter,
                            epilog=EPILOG_INPUTS, help=help, description=help)
    parser.set_defaults(func=func, **defaults)
    return parser
