"""argparse pieces shared by every command: one-line errors and help formatting.

The flags themselves are generated from option sets (:func:`landscape.infra.flags.add_option_flags`),
whose value converters raise :class:`argparse.ArgumentTypeError`; argparse then prints
``landscape: error: argument --span: span must be > 0 ..., got 0`` on one line, so every message
names the offending option.
"""
from __future__ import annotations

import argparse
import sys


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``landscape: error: ...`` and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        """Print ``message`` on one line of stderr and exit with status 2.

        Parameters
        ----------
        message : str
            argparse's description of the problem (it names the option).
        """
        text = " ".join(message.split())
        print(f"landscape: error: {text} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(2)


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help that shows defaults, except None, False and those the help text already names."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if (action.default is None or action.default is False or action.default is argparse.SUPPRESS
                or "default" in (action.help or "")):
            return action.help
        return super()._get_help_string(action)
