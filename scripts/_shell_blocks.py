"""Checks of the shell blocks of the documentation: every command names a program and options that exist.

A ``landscape`` or ``fl-run`` command must parse with the installed command's parser; ``python FILE``
(or ``.venv/bin/python FILE``) must name a file of the repository in which every ``--flag`` given is
declared (or in its folder's ``_*.py`` helpers); ``python -m MODULE`` an importable module; ``make TARGET``
a target of the Makefile. Other programs must be in :data:`EXTERNAL`.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import shlex

from _blocks import ROOT, Block

#: programs of shell blocks that are not this repository's (Flower, clusters, the shell's own)
EXTERNAL = {"pip", "flwr", "ray", "dask", "torchrun", "pkill", "cp", "git", "mkdocs"}


def shell_commands(code: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped, split at ``&&``, ``;``, ``|``.

    Parameters
    ----------
    code : str
        A shell block.

    Returns
    -------
    list[list[str]]
        Each command's words, environment assignments and ``nice``/``time`` prefixes removed.
    """
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words = list(lexer)
        current: list[str] = []
        for word in words + [";"]:
            if set(word) <= set(";&|"):
                while current and (re.match(r"^\w+=", current[0]) or current[0] in ("nice", "time")):
                    current = current[3:] if current[:2] == ["nice", "-n"] else current[1:]
                commands += [current] if current else []
                current = []
            else:
                current.append(word)
    return commands


def parses(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """Whether ``parser`` accepts ``args``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        A command's parser.
    args : list[str]
        Its arguments.

    Returns
    -------
    str or None
        None when it does, else the parser's error line.
    """
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(args)
        except SystemExit as exc:
            if exc.code:
                return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"status {exc.code}"
    return None


def command_problem(words: list[str]) -> str | None:
    """What is wrong with one shell command of a page (None: nothing found).

    Parameters
    ----------
    words : list[str]
        The command and its arguments.

    Returns
    -------
    str or None
    """
    program, args = words[0], words[1:]
    if program in ("landscape", "fl-run"):
        from fl.cli import build_parser as fl_parser
        from landscape_cli.main import build_parser as landscape_parser

        return parses((landscape_parser if program == "landscape" else fl_parser)(), args)
    if program == "make":
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
        unknown = [a for a in args if a not in targets]
        return f"no Makefile target {unknown}" if unknown else None
    if program.split("/")[-1] in ("python", "python3"):
        if args[:1] == ["-m"]:
            return None if importlib.util.find_spec(args[1]) else f"no module {args[1]}"
        script = ROOT / args[0]
        if not script.is_file():
            return f"no file {args[0]} in the repository"
        known = "".join(p.read_text(encoding="utf-8") for p in [script, *script.parent.glob("_*.py")])
        flags = [a.split("=")[0] for a in args[1:] if a.startswith("--")]
        unknown = [f for f in flags if f'"{f}"' not in known]
        return f"{args[0]} has no option {', '.join(unknown)}" if unknown else None
    return None if program in EXTERNAL else f"unknown program {program!r} (add it to EXTERNAL if it is not ours)"


def shell_problems(block: Block) -> list[str]:
    """:func:`command_problem` for every command of a shell block.

    Parameters
    ----------
    block : Block
        A ``bash`` block.

    Returns
    -------
    list[str]
        ``page:line: command: problem`` per problem.
    """
    found = []
    for words in shell_commands(block.code):
        problem = command_problem(words)
        if problem:
            found.append(f"{block.label}: `{shlex.join(words)}`: {problem}")
    return found
