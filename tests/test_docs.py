"""Every documentation pointer in the repository leads to a file that exists in it.

Docstrings, verdict references, examples and pages mention ``docs/<page>.md``; users have only
the repository, so each such page must exist, Markdown links between pages must resolve, and
nothing may point at specification files that are not shipped. The generated pages (the command
line, the option tables) exist only in the built site and are generated from the code, and every ``landscape``/``fl``/
``figures`` name a page or the README mentions must exist in the code.
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: folders that are not part of the repository's sources (environments, outputs, caches; hidden
#: folders such as other virtual environments are skipped too)
SKIP_DIRS = {".git", ".venv", "venv", "runs", "site", "report", "examples_out", "build", "dist",
             "__pycache__", ".pytest_cache", ".hypothesis", "node_modules"}
#: ``docs/xxx.md`` anywhere in a text (a docstring, a verdict's reference, a page)
DOC_MENTION = re.compile(r"(?<![\w./-])docs/[\w./-]+?\.md\b")
#: relative Markdown links between pages: ``[text](page.md)`` or ``[text](page.md#anchor)``
MD_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)\s]*)?\)")
#: pointers to files outside the repository (the spec folder, the shared contract)
FORBIDDEN = [re.compile(p) for p in (
    r"\.\./" + "shared", r"shared/" + "API\\.md",
    r"(?<![\w/-])" + "reference/" + r"([\w.-]+\.md|\s*$)",            # a spec file (also split over lines)
    # a spec file by its bare name (``ima.md section 4.2``); links between pages (``](ima.md)``) are fine
    r"(?<![\w/.-])(?<!\]\()" + r"(fedgucci|floco|ima|lss|landscape-tools|fl-frameworks)\.md\b")]


def source_files() -> list[Path]:
    """Python and Markdown files of the repository (environments and outputs excluded).

    Returns
    -------
    list[Path]
        Sorted paths under the repository root.
    """
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")
                   and d != "site-packages"]
        found += [Path(folder) / f for f in files if f.endswith((".py", ".md"))]
    return sorted(found)


def test_source_files_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in source_files()}
    assert {"README.md", "landscape/__init__.py", "fl/algorithms/fedgucci.py", "docs/index.md"} <= names


def test_every_docs_mention_exists() -> None:
    this = Path(__file__).resolve()
    missing = []
    for path in source_files():
        if path.resolve() == this:  # its own examples of bad pointers
            continue
        for mention in DOC_MENTION.findall(path.read_text(encoding="utf-8", errors="replace")):
            if not (ROOT / mention).is_file() and mention.removeprefix("docs/") not in HOOKS.GENERATED_PAGES:
                missing.append(f"{path.relative_to(ROOT)}: {mention}")
    assert not missing, "pointers to missing pages:\n" + "\n".join(missing)


def test_markdown_links_resolve() -> None:
    broken = []
    for path in source_files():
        if path.suffix != ".md":
            continue
        for target in MD_LINK.findall(path.read_text(encoding="utf-8")):
            resolved = (path.parent / target).resolve()
            generated = resolved.parent == ROOT / "docs" and resolved.name in HOOKS.GENERATED_PAGES
            if "://" not in target and not resolved.is_file() and not generated:
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_no_pointer_outside_the_repository() -> None:
    this = Path(__file__).resolve()
    offending = []
    for path in source_files():
        if path.resolve() == this:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if any(p.search(line) for p in FORBIDDEN):
                offending.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not offending, "pointers outside the repository:\n" + "\n".join(offending)


def test_checks_catch_what_they_should() -> None:
    """The patterns match the mistakes they exist for (and not the pages' own names)."""
    text = "see docs/methods/nowhere.md and docs/barriers.md; docs/api.md#x"
    assert DOC_MENTION.findall(text) == ["docs/methods/nowhere.md", "docs/barriers.md", "docs/api.md"]
    assert not (ROOT / "docs/methods/nowhere.md").exists()
    bad = ["See `../" + "shared/API.md`", "reference/" + "ima.md section 1.4", "the shared/" + "API.md contract",
           "drawn as a triangle; reference/", "SimpleCNN (fedgucci" + ".md §5.2)", "IMA (" + "ima.md 3.3)"]
    assert all(any(p.search(b) for p in FORBIDDEN) for b in bad)
    good = ["docs/methods/fedgucci.md; reference=...", "see [IMA](ima.md)", "docs/methods/ima.md section 2",
            "the reference/expected value"]
    assert not any(p.search(g) for p in FORBIDDEN for g in good)
    assert MD_LINK.findall("[a](barriers.md#group) [b](https://x.org/y.md) [c](api.md)") == \
        ["barriers.md", "https://x.org/y.md", "api.md"]


def test_verdict_references_name_existing_pages() -> None:
    from landscape.claims import checks

    text = Path(checks.__file__).read_text(encoding="utf-8")
    references = re.findall(r'reference="([^"]+)"', text)
    assert references, "the claim checks lost their references"
    for reference in references:
        pages = DOC_MENTION.findall(reference)
        assert pages and all((ROOT / p).is_file() for p in pages), reference


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"test_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOKS = _script("docs_hooks")


def test_cli_page_is_generated_from_the_parsers() -> None:
    module = _script("cli_help")
    old = os.environ.get("COLUMNS")
    try:
        page = module.render()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    for command in ("fl-run", "landscape path", "landscape plane", "landscape check transitivity"):
        assert f"## `{command}`" in page
    assert "--flatten" in page and "## Recipes" in page


def test_option_tables_are_generated_from_the_option_sets() -> None:
    module = _script("option_tables")
    committed = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    built = HOOKS.on_page_markdown(committed, SimpleNamespace(file=SimpleNamespace(src_uri="api.md")), None, None)
    tables = built.split(module.BEGIN, 1)[1].split(module.END, 1)[0]
    for name in ("evaluation.options.EvaluatorOptions", "geometry.options.PlaneOptions",
                 "curvature.options.EigenOptions", "claims.options.SharedBasinOptions", "fl.config.RunConfig",
                 "fl.algorithms.fedprox.FedProxOptions"):
        assert f"{name}`" in tables, name
    assert "| `resolution` | `int` | `21` | >= 2 | grid points per axis |" in tables
    assert "RunCommandOptions" not in tables  # the command line's own groups are on cli.md
    other = HOOKS.on_page_markdown("# x", SimpleNamespace(file=SimpleNamespace(src_uri="index.md")), None, None)
    assert other == "# x"


def test_no_generated_page_is_committed() -> None:
    """Generated content lives only in the built site: a new flag or option regenerates no committed file."""
    module = _script("option_tables")
    committed = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert committed.split(module.BEGIN, 1)[1].split(module.END, 1)[0].strip() == ""
    for page in HOOKS.GENERATED_PAGES:
        assert not (ROOT / "docs" / page).exists(), page
        assert f" {page}" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "scripts/docs_hooks.py" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


@pytest.mark.parametrize("page", ["index.md", "api.md", "barriers.md", "batchnorm.md", "cli.md", "run-folder.md",
                                  "cache.md", "methods/fedgucci.md", "methods/floco.md", "methods/ima.md",
                                  "methods/lss.md", "methods/landscape.md", "claims.md"])
def test_page_is_in_the_site_navigation(page: str) -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert ((ROOT / "docs" / page).is_file() or page in HOOKS.GENERATED_PAGES) and f" {page}" in nav


#: a dotted name of the packages in a page (``landscape.claims.transitivity``, ``fl.run``)
DOTTED = re.compile(r"(?<![\w./-])((?:landscape|fl|figures)(?:\.[A-Za-z_]\w*)+)")
#: ``from package.module import a, b`` in a page's code
FROM_IMPORT = re.compile(r"^\s*from ((?:landscape|fl|figures)(?:\.[\w.]+)?) import ([\w, ]+)$", re.M)


def module_file_exists(module: str) -> bool:
    """Whether ``module`` is a module of the repository's packages (found without importing it).

    Parameters
    ----------
    module : str
        Dotted module name.

    Returns
    -------
    bool
    """
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent is not a package, or cannot be imported
        return False


def resolve(dotted: str) -> bool:
    """Whether ``dotted`` names an importable module or an attribute of one.

    Parameters
    ----------
    dotted : str
        ``package.module.attribute...``.

    Returns
    -------
    bool
        True also for a module that exists but needs an optional dependency that is not
        installed (``fl.flower`` without ``flwr``): its names cannot be checked here.
    """
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ImportError as exc:
            if getattr(exc, "name", None) != module and module_file_exists(module):
                return True  # the module is there; a dependency of it (an optional extra) is not
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_names_in_the_pages_exist() -> None:
    pages = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
    missing = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        names = {d for d in DOTTED.findall(text) if d.rsplit(".", 1)[-1] not in ("md", "py", "h5", "json", "jsonl")}
        for module, imported in FROM_IMPORT.findall(text):
            names |= {f"{module}.{n.strip()}" for n in imported.split(",") if n.strip()}
        missing += [f"{page.relative_to(ROOT)}: {name}" for name in sorted(names) if not resolve(name)]
    assert not missing, "names the code does not have:\n" + "\n".join(missing)


def test_name_check_catches_a_stale_name() -> None:
    assert resolve("landscape.claims.transitivity") and resolve("fl.run") and resolve("landscape.interpolate")
    assert not resolve("landscape.distributed.map_calls") and not resolve("landscape.hessian_curvature")
    assert resolve("landscape.curve") and resolve("landscape.align")  # the planned names of the API contract exist
    assert FROM_IMPORT.findall("from landscape.connectivity import align, match\n") == \
        [("landscape.connectivity", "align, match")]
    assert FROM_IMPORT.findall("from flwr.server import ServerApp\n") == []
    assert not DOTTED.findall("flwr.server.ServerApp and fl_x.y")
