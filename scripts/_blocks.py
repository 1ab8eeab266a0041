"""The code blocks of the documentation pages and what can be checked about them without running them.

A page says what each ```` ```python ```` block is with an HTML comment on the line above its opening
fence (``scripts/docs_blocks.py`` describes the convention); :func:`extract` reads the blocks with
their markers and :func:`python_problems` checks a block's names against its marker.
"""
from __future__ import annotations

import ast
import builtins
import re
import symtable
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the marker kinds a comment above a block may give (no comment: "run"; "output" marks a text block)
KINDS = ("fragment", "slow", "signatures", "output")
#: ``<!-- kind: note -->`` (the note may be empty for ``signatures``)
MARKER = re.compile(r"^<!--\s*(\w+)\s*:?\s*(.*?)\s*-->$")
FENCE = re.compile(r"^\s*```(\w*)\s*$")
#: names a block may use without defining them
PREDEFINED = set(dir(builtins)) | {"__name__", "__file__", "__doc__"}


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page.

    Attributes
    ----------
    page : str
        The page's path relative to the repository (``docs/sharpness.md``).
    line : int
        Line of the opening fence (1-based).
    lang : str
        The fence's language (``python``, ``bash``, ...; empty when none).
    code : str
        The block's text.
    kind : str
        ``"run"``, or the marker above it: ``"fragment"``, ``"slow"``, ``"signatures"``, ``"output"``.
    note : str
        The marker's text (what a fragment needs, why a block is slow).
    """

    page: str
    line: int
    lang: str
    code: str
    kind: str = "run"
    note: str = ""

    @property
    def label(self) -> str:
        """``page:line`` of the opening fence."""
        return f"{self.page}:{self.line}"

    @property
    def padded(self) -> str:
        """The code preceded by blank lines, so that line numbers are the page's."""
        return "\n" * self.line + self.code


def pages() -> list[Path]:
    """``README.md`` and every page under ``docs/``.

    Returns
    -------
    list[Path]
    """
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def extract(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of a Markdown page, with the marker above each.

    Parameters
    ----------
    path : Path
        A Markdown file.
    root : Path
        The folder the blocks' page names are relative to (the repository).

    Returns
    -------
    list[Block]

    Raises
    ------
    ValueError
        For a marker of an unknown kind, or a fence that is never closed.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    page = path.resolve().relative_to(root.resolve()).as_posix()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a code fence that is never closed")
        kind, note = "run", ""
        marker = MARKER.match(lines[i - 1].strip()) if i else None
        if marker:
            kind, note = marker.groups()
            if kind not in KINDS:
                raise ValueError(f"{page}:{i}: unknown block marker {kind!r} (one of {', '.join(KINDS)})")
        code = textwrap.dedent("\n".join(lines[i + 1:end]) + "\n")
        found.append(Block(page, i + 1, opening.group(1), code, kind, note))
        i = end + 1
    return found


def all_blocks(paths: list[Path] | None = None) -> list[Block]:
    """The blocks of ``paths`` (default: every page).

    Parameters
    ----------
    paths : list[Path], optional
        Pages.

    Returns
    -------
    list[Block]
    """
    return [b for p in (paths or pages()) for b in extract(p)]


def undefined_names(code: str) -> set[str]:
    """Names the code reads at module level (or as globals of its functions) but never binds.

    Parameters
    ----------
    code : str
        Python source that compiles.

    Returns
    -------
    set[str]
        Builtins excluded.
    """
    table = symtable.symtable(code, "<block>", "exec")
    bound = {s.get_name() for s in table.get_symbols() if s.is_local()}
    used, stack = set(), [table]
    while stack:
        t = stack.pop()
        used |= {s.get_name() for s in t.get_symbols() if s.is_referenced() and s.is_global()}
        stack += t.get_children()
    return used - bound - PREDEFINED


def syntax_error(block: Block) -> str | None:
    """Why a Python block does not compile (None: it does).

    Parameters
    ----------
    block : Block
        A ``python`` block.

    Returns
    -------
    str or None
    """
    try:
        compile(block.padded, block.page, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"{block.page}:{exc.lineno}: does not compile ({exc.msg}); a listing is marked <!-- signatures -->"
    return None


def python_problems(block: Block) -> list[str]:
    """What is wrong with a Python block, found without running it.

    Parameters
    ----------
    block : Block
        A ``python`` block that is not a signature listing.

    Returns
    -------
    list[str]
        One line per problem (empty: fine).
    """
    error = syntax_error(block)
    if error:
        return [error]
    missing = sorted(undefined_names(block.code))
    if not missing:
        return []
    names = ", ".join(f"`{n}`" for n in missing)
    if block.kind != "fragment":
        return [f"{block.label}: uses {names} without defining them: define them in the block, or mark it "
                f"<!-- fragment: needs {names} ... -->"]
    declared = {n for quoted in re.findall(r"`([^`]+)`", block.note) for n in re.findall(r"[A-Za-z_]\w*", quoted)}
    undeclared = [n for n in missing if n not in declared]
    return [f"{block.label}: the fragment's comment does not name {', '.join(f'`{n}`' for n in undeclared)}, "
            "which it uses without defining"] if undeclared else []


def import_statements(block: Block) -> list[tuple[int, str]]:
    """The import statements of a Python block, with their lines on the page.

    Parameters
    ----------
    block : Block
        A block that compiles.

    Returns
    -------
    list[tuple[int, str]]
        ``(line, "from x import y")``, relative imports excluded.
    """
    tree = ast.parse(block.padded)
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
            if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and not node.level)]
