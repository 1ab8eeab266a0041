"""What the examples write into the docs pages: their tables and the conditions they were measured in.

An example run with ``--doc`` stores its ``tables.json`` as ``docs/data/<name>.json`` and rewrites the
parts of its docs page between :func:`doc_markers` from that file, so the numbers a page quotes are the
ones the script printed; ``tests/test_docs_blocks.py`` checks that the page is what the stored file gives
and that it was stored with the example's current defaults.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]


def doc_markers(name: str, part: str, script: str | None = None) -> tuple[str, str]:
    """The two lines around a part of a docs page that ``examples/<name>.py --doc`` writes.

    Parameters
    ----------
    name : str
        The example's name (its results are ``docs/data/<name>.json``).
    part : str
        Which part (a page may hold several: a table, a paragraph).
    script : str, optional
        The script that writes it, relative to the repository (default ``examples/<name>.py``).

    Returns
    -------
    tuple[str, str]
        The opening and the closing HTML comment.
    """
    script = script or f"examples/{name}.py"
    return (f"<!-- {part}: written by {script} --doc from docs/data/{name}.json; do not edit by hand -->",
            f"<!-- end of the {part} {script} --doc writes -->")


def splice(page: str, name: str, parts: Mapping[str, str], script: str | None = None) -> str:
    """``page`` with the text between the :func:`doc_markers` of each part replaced.

    Parameters
    ----------
    page : str
        The text of a docs page holding the markers of every part once.
    name : str
        The example's name.
    parts : Mapping[str, str]
        Part -> its Markdown.
    script : str, optional
        The script that writes them (:func:`doc_markers`).

    Returns
    -------
    str

    Raises
    ------
    ValueError
        When the page lacks a marker.
    """
    for part, body in parts.items():
        begin, end = doc_markers(name, part, script)
        if page.count(begin) != 1 or page.count(end) != 1:
            raise ValueError(f"the page needs the lines {begin!r} and {end!r} once each around {name}'s {part}")
        head, rest = page.split(begin)
        page = f"{head}{begin}\n\n{body.strip()}\n\n{end}{rest.split(end)[1]}"
    return page


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Mapping[str, str] | None = None) -> str:
    """Rows of an example's table as a Markdown table, cells as the example prints them.

    Parameters
    ----------
    rows : sequence of Mapping
        The rows, as stored in ``tables.json``.
    columns : Mapping[str, str], optional
        Header -> key of the rows (default: every key, as its own header).

    Returns
    -------
    str
    """
    from _common import format_cell

    columns = columns or {k: k for k in rows[0]}
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(format_cell(row[key]) for key in columns.values()) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def conditions(payload: Mapping[str, Any]) -> str:
    """How long an example's run took and on what: the sentence a docs page quotes with its numbers.

    Parameters
    ----------
    payload : Mapping
        The contents of an example's ``tables.json``.

    Returns
    -------
    str
    """
    env = payload["environment"]
    load = "" if env["load_average"] is None else f", 1-minute load average {env['load_average']:.1f} at the start"
    return (f"{payload['seconds']:.1f} s from the end of the imports to the last file written, on a machine with "
            f"{env['cpus']} CPU cores, with {env['threads']} torch thread{'s' if env['threads'] != 1 else ''} "
            f"(torch {env['torch']}{load})")


def differences(args: argparse.Namespace, parser: argparse.ArgumentParser, ignore: Sequence[str] = ("out", "doc")
                ) -> list[str]:
    """The options of ``args`` that are not ``parser``'s defaults: a page quotes a run with the defaults.

    Parameters
    ----------
    args : argparse.Namespace or Mapping
        Parsed options (or their ``vars``, as stored in ``tables.json``).
    parser : argparse.ArgumentParser
        The example's parser (``_common.build_parser``).
    ignore : sequence of str
        Options that do not change the numbers.

    Returns
    -------
    list[str]
        ``"name=value (default default)"`` per difference, an option missing from ``args`` included.
    """
    given = dict(args) if isinstance(args, Mapping) else vars(args)
    defaults = vars(parser.parse_args([]))
    return [f"{k}={given.get(k, '<missing>')!r} (default {v!r})" for k, v in sorted(defaults.items())
            if k not in ignore and given.get(k, object()) != v]


def add_doc_option(parser: argparse.ArgumentParser, page: str) -> None:
    """Add ``--doc``: after the run, :func:`publish` its tables (an example with the page's parts only).

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The example's parser.
    page : str
        The page it rewrites, relative to ``docs/``.
    """
    parser.add_argument("--doc", action="store_true",
                        help=f"then store tables.json under docs/data/ and rewrite the numbers and figures of "
                             f"docs/{page} from it (with the defaults only)")


def doc_refusal(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str | None:
    """Why ``--doc`` is refused for these arguments: a page quotes a run with the example's defaults.

    Parameters
    ----------
    args : argparse.Namespace
        The parsed arguments.
    parser : argparse.ArgumentParser
        The example's parser.

    Returns
    -------
    str or None
        None when ``--doc`` is not given or every option that changes the numbers is its default.
    """
    changed = differences(args, parser)
    if not getattr(args, "doc", False) or not changed:
        return None
    return f"--doc writes the page from a run with the defaults; given {', '.join(changed)}"


def publish(name: str, out: Path, render: Callable[[Mapping[str, Any]], Mapping[str, str]], page: str,
            figures: Sequence[str] = (), script: str | None = None) -> list[Path]:
    """Store an example's ``tables.json`` as ``docs/data/<name>.json`` and rewrite parts of a page from it.

    Parameters
    ----------
    name : str
        The example's name.
    out : Path
        The example's output folder, holding ``tables.json`` and the figures.
    render : callable
        Part -> Markdown (:func:`splice`), from the stored payload.
    page : str
        The page, relative to ``docs/``.
    figures : sequence of str
        Files of ``out`` copied to ``docs/figures/``.
    script : str, optional
        The script that writes them, when not ``examples/<name>.py`` (:func:`doc_markers`).

    Returns
    -------
    list[Path]
        The files written.
    """
    text = (Path(out) / "tables.json").read_text(encoding="utf-8")
    stored, path = ROOT / "docs" / "data" / f"{name}.json", ROOT / "docs" / page
    stored.parent.mkdir(exist_ok=True)
    stored.write_text(text, encoding="utf-8")
    page_text = splice(path.read_text(encoding="utf-8"), name, render(json.loads(text)), script)
    path.write_text(page_text, encoding="utf-8")
    copies = [ROOT / "docs" / "figures" / f for f in figures]
    for source, target in zip(figures, copies):
        shutil.copyfile(Path(out) / source, target)
    return [stored, path, *copies]
