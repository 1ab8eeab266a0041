"""What the examples write into the docs pages: their tables and the conditions they were measured in.

An example run with ``--doc`` stores its ``tables.json`` as ``docs/data/<name>.json`` and rewrites the
part of its docs page between :func:`doc_markers` from that file, so the numbers a page quotes are the
ones the script printed; ``tests/test_docs_blocks.py`` checks that the page is what the stored file gives.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]


def doc_markers(name: str) -> tuple[str, str]:
    """The two lines around the part of a docs page that ``examples/<name>.py --doc`` writes.

    Parameters
    ----------
    name : str
        The example's name.

    Returns
    -------
    tuple[str, str]
        The opening and the closing HTML comment.
    """
    return (f"<!-- written by examples/{name}.py --doc from docs/data/{name}.json; do not edit by hand -->",
            f"<!-- end of what examples/{name}.py --doc writes -->")


def splice(page: str, name: str, body: str) -> str:
    """``page`` with the part between :func:`doc_markers` replaced by ``body``.

    Parameters
    ----------
    page : str
        The text of a docs page holding both markers once.
    name : str
        The example's name.
    body : str
        Markdown.

    Returns
    -------
    str

    Raises
    ------
    ValueError
        When the page lacks a marker.
    """
    begin, end = doc_markers(name)
    if page.count(begin) != 1 or page.count(end) != 1:
        raise ValueError(f"the page needs the lines {begin!r} and {end!r} once each around {name}'s output")
    head, rest = page.split(begin)
    return f"{head}{begin}\n\n{body.strip()}\n\n{end}{rest.split(end)[1]}"


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


def publish(name: str, out: Path, render: Callable[[Mapping[str, Any]], str], figures: Sequence[str] = ()
            ) -> list[Path]:
    """Store an example's ``tables.json`` as ``docs/data/<name>.json`` and rewrite ``docs/<name>.md`` from it.

    Parameters
    ----------
    name : str
        The example's name, also the page's (``docs/<name>.md``).
    out : Path
        The example's output folder, holding ``tables.json`` and the figures.
    render : callable
        The page's part between :func:`doc_markers`, from the stored payload.
    figures : sequence of str
        Files of ``out`` copied to ``docs/figures/``.

    Returns
    -------
    list[Path]
        The files written.
    """
    text = (Path(out) / "tables.json").read_text(encoding="utf-8")
    stored, page = ROOT / "docs" / "data" / f"{name}.json", ROOT / "docs" / f"{name}.md"
    stored.parent.mkdir(exist_ok=True)
    stored.write_text(text, encoding="utf-8")
    page.write_text(splice(page.read_text(encoding="utf-8"), name, render(json.loads(text))), encoding="utf-8")
    copies = [ROOT / "docs" / "figures" / f for f in figures]
    for source, target in zip(figures, copies):
        shutil.copyfile(Path(out) / source, target)
    return [stored, page, *copies]
