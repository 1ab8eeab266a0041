"""The option tables of the API contract page (``docs/api.md``): one table per option set of the Python API.

Every :class:`landscape.infra.options.Options` class defined in ``landscape`` and ``fl`` (the
command line's own groups, in ``landscape_cli`` and ``fl.cli``, are on the Command line page) gets
a table of its fields: name, type, default, range (bounds or choices), help and source, all read
from the field declarations, so the page says what the code accepts. Choices drawn from a
registry read "any registered ..." (the help names the built-in ones). When the site is built
(``scripts/docs_hooks.py``) the tables fill the block between the two markers of the page; the
committed page keeps the block empty, so a new option needs no committed file regenerated. To read
the tables without building the site::

    .venv/bin/python scripts/option_tables.py          # prints the tables
"""
from __future__ import annotations

import argparse
import ast
import collections.abc
import importlib
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "api.md"
BEGIN = "<!-- option tables: filled in by scripts/option_tables.py when the site is built -->"
END = "<!-- end of the option tables -->"
#: Packages whose option sets are documented, and modules left out (command-line only groups).
PACKAGES = ("landscape", "fl")
SKIP_MODULES = ("fl.cli",)
#: A Sphinx cross-reference in a docstring (``:class:`~pkg.Name```): Markdown shows the name in code.
ROLE = re.compile(r":\w+:`(~?)([\w.]+)`")

sys.path.insert(0, str(ROOT))


def option_sets() -> list[type]:
    """The option sets to document, in the order of their modules' paths and of their definitions.

    Returns
    -------
    list[type]
        Subclasses of ``Options`` with at least one field (found by reading the source of every
        module of :data:`PACKAGES`, so an option set is listed without being registered anywhere).
    """
    from landscape.infra.options import Options

    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            if module in SKIP_MODULES:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = [node.name for node in tree.body if isinstance(node, ast.ClassDef)
                     and any("Options" in ast.unparse(base) for base in node.bases)]
            if not names:
                continue
            loaded = importlib.import_module(module)
            found += [cls for cls in (getattr(loaded, n) for n in names)
                      if isinstance(cls, type) and issubclass(cls, Options) and cls.fields()]
    return found


def type_text(tp: Any) -> str:
    """A short spelling of an annotation: ``int``, ``float | None``, ``'a' | 'b'``, ``list[str]``.

    Parameters
    ----------
    tp : Any
        The annotation.

    Returns
    -------
    str
    """
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is collections.abc.Callable:
        return "callable"
    if origin is not None and args:
        return f"{origin.__name__}[{', '.join(type_text(a) for a in args)}]"
    if tp is type(None):
        return "None"
    if tp is typing.Any:
        return "any"
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def table(cls: type) -> str:
    """The Markdown section of one option set: heading, what it configures, one row per field.

    Parameters
    ----------
    cls : type
        An ``Options`` subclass.

    Returns
    -------
    str
    """
    from landscape.infra.options import field_default
    from landscape.infra.registry import Registry
    from landscape.infra.values import choice_names, describe_range

    doc = ROLE.sub(lambda m: f"`{m[2].rsplit('.', 1)[-1] if m[1] else m[2]}`",
                   (cls.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "))
    lines = [f"### `{cls.__module__}.{cls.__name__}`", "", doc]
    if cls.configures:
        lines += ["", "Keyword arguments of " + ", ".join(f"`{name}`" for name in cls.configures) + "."]
    lines += ["", "| name | type | default | range | help | source |", "|---|---|---|---|---|---|"]
    types_ = cls.types()
    for name, field in cls.fields().items():
        meta = field.metadata
        default = field_default(field)
        if isinstance(meta.get("choices"), Registry):  # what is registered at run time changes no table
            bounds = f"any registered {meta['choices'].kind}"
        else:
            choices = choice_names(meta)
            bounds = describe_range(meta) or (", ".join(f"`{c}`" for c in choices) if choices else "")
        cells = [f"`{name}`", f"`{type_text(types_[name])}`", f"`{default!r}`", bounds, meta["help"],
                 meta.get("source") or ""]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def render(page: str) -> str:
    """``page`` with the block between the markers replaced by the current tables.

    Parameters
    ----------
    page : str
        The text of ``docs/api.md``.

    Returns
    -------
    str

    Raises
    ------
    SystemExit
        When the page lacks the markers.
    """
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{PAGE} has no {BEGIN!r} ... {END!r} block")
    head, rest = page.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    return f"{head}{BEGIN}\n\n{tables()}\n{END}{tail}"


def tables() -> str:
    """Every option set's table, in the order of :func:`option_sets`.

    Returns
    -------
    str
        Markdown.
    """
    return "\n".join(table(cls) for cls in option_sets())


def main(argv: list[str] | None = None) -> int:
    """Print the option tables.

    Parameters
    ----------
    argv : list[str], optional
        Command-line arguments (default ``sys.argv[1:]``; none are taken).

    Returns
    -------
    int
        0.
    """
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    print(tables())
    return 0


if __name__ == "__main__":
    sys.exit(main())
