"""The architecture, checked from the import graph of the source (no module is imported here).

* the analysis core (``landscape``) never imports ``fl``, ``figures`` or ``landscape_cli``, not even
  inside a function;
* ``fl`` uses only the core's infrastructure layer and parameter utilities (``landscape.infra``,
  ``landscape.space``), so ``import fl`` does not load the analysis core;
* ``figures`` uses the core's results, claims and infrastructure, never the engine;
* the project's modules form no import cycle (imports only needed for type checking excluded);
* no module imports another module's private (underscore) name;
* no module is much longer than one sitting's reading (420 lines).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("landscape", "fl", "figures", "landscape_cli")
MAX_LINES = 420


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, imported names, line) of every import, at any depth, except TYPE_CHECKING ones."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_lines(tree)
    found = []
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((_resolve(module, path, node), [a.name for a in node.names], node.lineno))
    return found


MODULES = _modules()
GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _project_targets(target: str, names: list[str]) -> list[str]:
    """Project modules an import statement reaches (``from pkg import sub`` reaches ``pkg.sub``)."""
    out = [target] if target in MODULES else []
    out += [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
    return out


def test_the_core_never_imports_the_engine_figures_or_cli():
    bad = [f"{m}:{line} imports {t}" for m, imports in GRAPH.items() if m.split(".")[0] == "landscape"
           for t, _, line in imports if t.split(".")[0] in ("fl", "figures", "landscape_cli")]
    assert not bad, bad


def test_fl_uses_only_the_infrastructure_layer_of_the_core():
    exports_src = (ROOT / "landscape" / "__init__.py").read_text()
    exports = ast.literal_eval(exports_src.split("_EXPORTS: dict[str, str] = ", 1)[1].split("\n}\n", 1)[0] + "\n}")
    allowed = ("landscape.infra", "landscape.space")
    bad = []
    for m, imports in GRAPH.items():
        if m.split(".")[0] != "fl":
            continue
        for target, names, line in imports:
            if target == "landscape":
                bad += [f"{m}:{line} landscape.{n}" for n in names if not exports.get(n, "").startswith(("infra", "space"))]
            elif target.startswith("landscape.") and not target.startswith(allowed):
                bad.append(f"{m}:{line} {target}")
    assert not bad, bad


def test_figures_use_results_claims_and_infrastructure_only():
    allowed = ("landscape.results", "landscape.claims", "landscape.infra", "landscape.space", "landscape.geometry.basin",
               "landscape.connectivity")
    bad = [f"{m}:{line} {t}" for m, imports in GRAPH.items() if m.split(".")[0] == "figures"
           for t, _, line in imports
           if (t.startswith("landscape.") and not t.startswith(allowed)) or t.split(".")[0] in ("fl", "landscape_cli")]
    assert not bad, bad


def test_no_import_cycles():
    edges = {m: sorted({t for target, names, _ in imports for t in _project_targets(target, names)
                        if t != m and not m.startswith(t + ".")})  # a submodule importing its package's __init__
             for m, imports in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in edges.get(node, []):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, [" -> ".join(c) for c in cycles]


def test_no_module_imports_a_private_name_of_another():
    bad = [f"{m}:{line} from {t} import {n}" for m, imports in GRAPH.items() for t, names, line in imports
           for n in names if n.startswith("_") and not n.startswith("__") and t.split(".")[0] in PACKAGES]
    assert not bad, bad


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_are_short_enough_to_read_in_one_sitting(module):
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module].relative_to(ROOT)} has {lines} lines"
