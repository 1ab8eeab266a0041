"""The ``evaluation`` flags, generated from :class:`landscape.evaluation.options.EvaluatorOptions`.

Every field of the dataclass becomes ``--field-name`` through
:func:`landscape.infra.flags.add_option_flags` (help, choices, bounds and parser as declared with
:func:`landscape.infra.options.option`), so the command line offers exactly the options of the
Python API and validates them the same way. A field whose metadata says ``cli=False`` is
Python-only; ``progress`` is expressed by ``--quiet``.
"""
from __future__ import annotations

import argparse

from landscape.evaluation.options import EvaluatorOptions
from landscape.infra.flags import add_option_flags, option_values

#: Options the command line expresses with another flag (the option -> that flag).
ELSEWHERE = {"progress": "--quiet"}


def add_evaluator_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per evaluator option to an ``evaluation`` group of ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        A parent parser shared by the analysis commands.
    """
    group = parser.add_argument_group("evaluation", "options of the evaluation engine (landscape.Evaluator)")
    add_option_flags(group, EvaluatorOptions, skip=tuple(ELSEWHERE))


def evaluator_options(args: argparse.Namespace) -> EvaluatorOptions:
    """The validated evaluator options of parsed command-line arguments.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed arguments of a command whose parser includes :func:`add_evaluator_arguments`
        and the ``--quiet`` flag.

    Returns
    -------
    EvaluatorOptions
        One field per flag, ``progress=False`` with ``--quiet``.

    Raises
    ------
    ConfigError
        From the dataclass's own validation (naming the option).
    """
    values = option_values(EvaluatorOptions, args)
    return EvaluatorOptions(**{**values, "progress": False if args.quiet else None})
