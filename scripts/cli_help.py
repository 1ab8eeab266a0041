"""The docs site's Command line page (``cli.md``): the ``--help`` of ``fl-run`` and of every ``landscape`` command.

The page is generated from the parsers themselves (``landscape_cli.main.build_parser`` and
``fl.cli.build_parser``) when the site is built (``scripts/docs_hooks.py``), so it says exactly
what the installed commands accept and a new flag or command needs no committed page regenerated.
To read it without building the site::

    .venv/bin/python scripts/cli_help.py               # prints the page
    .venv/bin/python scripts/cli_help.py --out cli.md  # writes it to a file
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

#: help text is wrapped at this width whatever the terminal, so the page is reproducible
COLUMNS = 100

INTRO = """# Command line

Two console commands are installed with the package: `landscape` (analysis: paths, planes, group
barriers, curvature, decomposition, claim checks, reports; `landscape train` starts an FL run)
and `fl-run` (FL runs only; the same flags as `landscape train`). Both print one line
`PROG: error: ...` and exit with status 2 on a user error; `landscape check` exits 0 when the
claim holds and 1 when it does not.

Common patterns:

```bash
fl-run --algorithm fedgucci --rounds 20 --out runs/fedgucci --beta 1.0
fl-run --recipe fedgucci-mnist1d --out runs/x   # a paper's settings (fl-run --list-recipes: all)
landscape path  --run runs/fedgucci --models client:0 client:1 --out out/
landscape plane --run runs/fedgucci --resolution 41 --out out/
landscape hessian --module mlp --checkpoints a.pt --data digits --k 5
landscape check shared-basin --run runs/fedgucci
landscape report --run runs/fedgucci         # runs/fedgucci/report/index.html
```

Models come either from a run folder (`--run DIR --round R --models global client:3`, see
[the run folder](run-folder.md)) or from a module spec and checkpoint files (`--module mlp
--checkpoints a.pt b.safetensors --data digits` or `--data file.npz`). Point metrics are cached
in a cache folder (`--cache`, see [the cache](cache.md)), figures go to `--out`, numbers to stdout
(`--json` for JSON).

The sections below are the commands' own `--help`, generated from the parsers when this site is
built (`scripts/cli_help.py` prints the same page).
"""


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every parser to document, with its command line, in the order of the page.

    Returns
    -------
    list[tuple[str, argparse.ArgumentParser]]
        ``("fl-run", parser)``, ``("landscape", parser)``, then ``("landscape path", ...)``
        and so on, subcommands of subcommands included (``landscape check transitivity``).
    """
    from fl.cli import build_parser as fl_parser
    from landscape_cli.main import build_parser as landscape_parser

    found: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        found.append((name, parser))
        for action in parser._actions:  # argparse has no public accessor for its subcommands
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(f"{name} {sub_name}", sub)

    walk("fl-run", fl_parser())
    walk("landscape", landscape_parser())
    return found


def recipes_section() -> str:
    """A table per recipe of ``fl.RECIPES`` (``fl-run --recipe NAME``): each setting, its value and source.

    Returns
    -------
    str
        Markdown.
    """
    from fl import RECIPES

    parts = ["## Recipes (`fl-run --recipe NAME`)\n",
             "Each recipe is a paper's training setting; explicit flags override it, and the run's "
             "`config.json` records the recipe's name and the resolved values.\n"]
    for name, recipe in RECIPES.items():
        rows = [f"| `{key}` | `{value!r}` | {recipe.sources.get(key, '')} |" for key, value in recipe.settings.items()]
        notes = f" {recipe.notes}" if recipe.notes else ""
        parts.append(f"### `{name}`\n\n{recipe.paper}.{notes}\n\n| setting | value | source |\n|---|---|---|\n"
                     + "\n".join(rows) + "\n")
    return "\n".join(parts)


def render() -> str:
    """The text of the Command line page.

    Returns
    -------
    str
        The introduction, then one section per command with its ``--help`` in a code block.
    """
    os.environ["COLUMNS"] = str(COLUMNS)  # argparse reads the width from the environment
    parts = [INTRO]
    for name, parser in _parsers():
        parser.prog = name
        text = parser.format_help().rstrip()
        parts.append(f"## `{name}`\n\n```text\n{text}\n```\n")
    parts.append(recipes_section())
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    """Print the page, or write it with ``--out``.

    Parameters
    ----------
    argv : list[str], optional
        Command-line arguments (default ``sys.argv[1:]``).

    Returns
    -------
    int
        0.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the page to this file instead of printing it")
    args = parser.parse_args(argv)
    text = render()
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
