"""``landscape``: loss-landscape analysis from the command line.

Subcommands: ``train`` (an FL run, as ``fl-run``), ``path``, ``plane``, ``group``, ``hessian``,
``trace``, ``density``, ``decompose``, ``check`` (a paper claim), ``report`` (an HTML report
of an FL run), ``align`` (Git Re-Basin) and ``curve`` (a trained Bezier curve or chain); each is
a module of :mod:`landscape_cli.commands`.

Models come from an FL run (``--run DIR --round R --models global client:3 ...``) or from
a module spec and checkpoint files (``--module mlp --checkpoints a.pt b.pt --data digits``).
Point metrics are cached in an HDF5 cache folder (``--cache``, default ``<out>/landscape_cache``),
so a rerun or an interrupted run only computes what is missing; result objects are stored
there too. Figures go to ``--out``; a table of numbers goes to stdout (``--json`` for JSON),
and the same numbers to ``<out>/<command>.json``. User errors print one line
``landscape: error: ...`` and exit with status 2; ``check`` exits 0 when the claim holds
and 1 when it does not; ``align --check`` exits 0 when a random permutation of the model's
traced groups leaves its outputs unchanged and 1 when it changes them.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from landscape import LandscapeError
from landscape.infra.commandline import internal_error
from landscape_cli.commands import COMMANDS
from landscape_cli.output import warning_lines
from landscape_cli.parsing import Parser


def build_parser() -> argparse.ArgumentParser:
    """The ``landscape`` parser with every command of :data:`landscape_cli.commands.COMMANDS`.

    Returns
    -------
    argparse.ArgumentParser
        Its usage errors print one line and exit with status 2.
    """
    parser = Parser(prog="landscape", description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                    epilog="Run 'landscape COMMAND --help' for the options of a command.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    for name in COMMANDS.names():
        COMMANDS.get(name)(sub)
    return parser


def error_line(exc: BaseException) -> str:
    """One line describing a user-input error.

    Parameters
    ----------
    exc : BaseException
        A ``LandscapeError``, ``OSError`` or ``ValueError``.

    Returns
    -------
    str
        ``landscape: error: ...`` with the message's whitespace (newlines included) collapsed;
        for an ``OSError`` the file name and the system's reason.
    """
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return "landscape: error: " + " ".join(text.split())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``landscape`` console command.

    Parameters
    ----------
    argv : Sequence[str], optional
        Arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The command's status (``check``: 0 holds, 1 does not); 2 for a user error, printed as
        one line on stderr, and for an unexpected exception (one line asking for a report, never a
        traceback); 130 when interrupted.
    """
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help (0) or a usage error (2, already printed on one line)
            return int(exc.code or 0)
        with warning_lines():
            return args.func(args)
    except BrokenPipeError:  # stdout closed early (e.g. piped into head): the files are written anyway
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (LandscapeError, OSError, ValueError) as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("landscape: interrupted; rerun the same command to reuse the cached points", file=sys.stderr)
        return 130
    except Exception as exc:  # last resort: one line instead of a traceback
        print(f"landscape: error: {internal_error(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
