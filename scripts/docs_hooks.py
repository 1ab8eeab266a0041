"""MkDocs hooks (``mkdocs.yml``: ``hooks``): the pages generated from the code when the site is built.

* ``cli.md``, the Command line page: every command's ``--help`` (:mod:`cli_help`);
* the option tables of ``api.md``, between its two markers (:mod:`option_tables`).

Nothing generated is committed, so a new flag, command or option needs no page regenerated.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: Pages that exist only in the built site, generated from the code.
GENERATED_PAGES = ("cli.md",)


def script(name: str) -> ModuleType:
    """A module of ``scripts/`` by name, loaded from its file.

    Parameters
    ----------
    name : str
        ``"cli_help"`` or ``"option_tables"``.

    Returns
    -------
    types.ModuleType
    """
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location(f"docs_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the site's files.

    Parameters
    ----------
    files : mkdocs.structure.files.Files
        The pages found in ``docs/``.
    config : mkdocs.config.defaults.MkDocsConfig
        The site's configuration.

    Returns
    -------
    mkdocs.structure.files.Files

    Raises
    ------
    mkdocs.exceptions.PluginError
        When ``docs/`` holds a file of a generated page's name (a copy written by hand or by
        ``cli_help.py --out``), which would shadow the generated one.
    """
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    for page in GENERATED_PAGES:
        if files.get_file_from_path(page) is not None:
            raise PluginError(f"docs/{page} is generated when the site is built: delete the copy in docs/")
    files.append(File.generated(config, "cli.md", content=script("cli_help").render()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Fill the option tables of ``api.md``; other pages pass unchanged.

    Parameters
    ----------
    markdown : str
        The page's Markdown.
    page : mkdocs.structure.pages.Page
        The page.
    config, files
        The site's configuration and files (unused).

    Returns
    -------
    str
    """
    if page.file.src_uri != "api.md":
        return markdown
    return script("option_tables").render(markdown)
