"""The architecture, checked from the import graph of the source (no module is imported here).

* the analysis core (``landscape``) never imports ``fl``, ``figures`` or ``landscape_cli``, not even
  inside a function;
* ``fl`` uses only the core's infrastructure layer and parameter utilities (``landscape.infra``,
  ``landscape.space``), so ``import fl`` does not load the analysis core (imports inside a
  function are allowed where listed: the aligned algorithm's alignment, the measures of landscape
  tracking, ``FL_LAZY_EXCEPTIONS``);
* ``figures`` uses the core's results, claims and infrastructure, never the engine;
* ``paper_claims`` (the papers' claims, measured: it trains with ``fl`` and measures with
  ``landscape``) sits above both; nothing else in the packages imports it, and it imports
  neither ``figures`` nor ``landscape_cli``;
* inside the core and in ``fl``, names are imported from the modules that define them, never
  through the facade (``from landscape import ConfigError`` is for users);
* the core's subpackages are layers, ``LAYERS`` from the bottom up: a subpackage imports only
  its own layer and those below it, counting imports inside functions and imports through the
  package facade (``from landscape import interpolate`` is an import of ``landscape.geometry.paths``);
* ``import figures`` does not load the evaluator;
* the project's modules form no import cycle (facade imports resolved; imports only needed for
  type checking excluded);
* no module imports another module's private (underscore) name;
* a module longer than one sitting's reading (420 lines) is reported with a warning, one longer
  than 700 lines fails.
"""
from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("landscape", "fl", "figures", "landscape_cli", "paper_claims")
MAX_LINES = 420
#: Beyond this no module is one concept.
HARD_MAX_LINES = 700


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
_FACADE = (ROOT / "landscape" / "__init__.py").read_text()
#: The core's public names: name -> defining module relative to ``landscape``.
EXPORTS: dict[str, str] = ast.literal_eval(
    _FACADE.split("_EXPORTS: dict[str, str] = ", 1)[1].split("\n}\n", 1)[0] + "\n}")
#: The core's subpackages from the bottom layer up.
LAYERS = ("infra", "space", "results", "cache", "evaluation", "alignment", "geometry", "curvature",
          "decomposition", "connectivity", "merging", "claims")


def _project_targets(target: str, names: list[str]) -> list[str]:
    """Project modules an import statement reaches.

    ``from pkg import sub`` reaches ``pkg.sub``; ``from landscape import name`` reaches the
    module the facade loads ``name`` from.
    """
    if target == "landscape":
        return [f"landscape.{EXPORTS[n]}" if n in EXPORTS else f"landscape.{n}" for n in names
                if n in EXPORTS or f"landscape.{n}" in MODULES]
    out = [target] if target in MODULES else []
    out += [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
    return out


def layer_violations(graph: dict[str, list[tuple[str, list[str], int]]]) -> list[str]:
    """Imports of the core that reach a higher layer than their own (see ``LAYERS``)."""
    def layer(module: str) -> int | None:
        parts = module.split(".")
        return LAYERS.index(parts[1]) if parts[0] == "landscape" and len(parts) > 1 and parts[1] in LAYERS else None

    bad = []
    for m, imports in graph.items():
        own = layer(m)
        if own is None:
            continue
        for target, names, line in imports:
            for t in _project_targets(target, names):
                if (to := layer(t)) is not None and to > own:
                    bad.append(f"{m}:{line} imports {t} ({LAYERS[own]} < {LAYERS[to]})")
    return bad


def test_the_core_never_imports_the_engine_figures_or_cli():
    bad = [f"{m}:{line} imports {t}" for m, imports in GRAPH.items() if m.split(".")[0] == "landscape"
           for t, _, line in imports if t.split(".")[0] in ("fl", "figures", "landscape_cli")]
    assert not bad, bad


#: The imports of the analysis core in ``fl``, each inside a function (``import fl`` still loads
#: nothing of the core; test below): the aligned algorithm's aligner, and the measures and table of
#: landscape tracking during training.
FL_LAZY_EXCEPTIONS = {("fl.algorithms.aligned", "landscape.alignment"),
                      ("fl.tracker", "landscape.evaluation.evaluator"), ("fl.tracker", "landscape.geometry.paths"),
                      ("fl.tracker", "landscape.geometry.groups"), ("fl.tracker", "landscape.curvature.functions"),
                      ("fl.tracker", "landscape.curvature.sharpness"), ("fl.tracking", "landscape.results.tracking")}


def _top_level_lines(module: str) -> set[int]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    return {node.lineno for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}


def test_paper_claims_sits_above_the_core_and_the_engine():
    up = [f"{m}:{line} imports {t}" for m, imports in GRAPH.items() if m.split(".")[0] != "paper_claims"
          for t, _, line in imports if t.split(".")[0] == "paper_claims"]
    down = [f"{m}:{line} imports {t}" for m, imports in GRAPH.items() if m.split(".")[0] == "paper_claims"
            for t, _, line in imports if t.split(".")[0] in ("figures", "landscape_cli")]
    assert not up and not down, up + down


def test_importing_paper_claims_loads_no_torch():
    """The claims command pins the CPU kernels before torch is imported: the package and its command load none."""
    code = "import sys, paper_claims, paper_claims.cli, paper_claims.definitions; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "False", out


def test_fl_uses_only_the_infrastructure_layer_of_the_core():
    exports = EXPORTS
    allowed = ("landscape.infra", "landscape.space")
    bad = []
    for m, imports in GRAPH.items():
        if m.split(".")[0] != "fl":
            continue
        for target, names, line in imports:
            if (m, target) in FL_LAZY_EXCEPTIONS:
                assert line not in _top_level_lines(m), f"{m}:{line} imports {target} at module level"
            elif target == "landscape":
                bad += [f"{m}:{line} landscape.{n}" for n in names
                        if not exports.get(n, "").startswith(("infra", "space"))]
            elif target.startswith("landscape.") and not target.startswith(allowed):
                bad.append(f"{m}:{line} {target}")
    assert not bad, bad


def test_importing_fl_loads_nothing_of_the_analysis_core():
    code = ("import sys, fl, fl.algorithms.aligned; print(sorted({m.split('.')[1] for m in sys.modules "
            "if m.startswith('landscape.')} - {'infra', 'space'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "[]", out


def test_figures_use_results_claims_and_infrastructure_only():
    allowed = ("landscape.results", "landscape.claims", "landscape.infra", "landscape.space",
               "landscape.geometry.basin", "landscape.connectivity")
    bad = [f"{m}:{line} {t}" for m, imports in GRAPH.items() if m.split(".")[0] == "figures"
           for t, _, line in imports
           if (t.startswith("landscape.") and not t.startswith(allowed)) or t.split(".")[0] in ("fl", "landscape_cli")]
    assert not bad, bad


def test_the_cores_subpackages_are_layers():
    assert set(LAYERS) == {m.split(".")[1] for m in MODULES if m.count(".") >= 1 and m.startswith("landscape.")
                           and (ROOT / "landscape" / m.split(".")[1]).is_dir()}
    bad = layer_violations(GRAPH)
    assert not bad, bad


def test_a_planted_facade_import_of_a_higher_layer_is_caught():
    planted = {**GRAPH, "landscape.results.base": [*GRAPH["landscape.results.base"], ("landscape", ["interpolate"], 1)]}
    assert layer_violations(planted) == ["landscape.results.base:1 imports landscape.geometry.paths "
                                         "(results < geometry)"]


def facade_imports(graph: dict[str, list[tuple[str, list[str], int]]]) -> list[str]:
    """Imports through the ``landscape`` facade inside the core (below the facade) and in ``fl``."""
    return [f"{m}:{line} imports {', '.join(names) or 'landscape'} through the facade"
            for m, imports in graph.items() if m != "landscape" and m.split(".")[0] in ("landscape", "fl")
            for target, names, line in imports if target == "landscape"]


def test_the_core_and_fl_import_from_the_defining_modules_not_the_facade():
    bad = facade_imports(GRAPH)
    assert not bad, bad


def test_a_planted_facade_import_inside_the_package_is_caught():
    planted = {**GRAPH, "landscape.connectivity.curves": [*GRAPH["landscape.connectivity.curves"],
                                                          ("landscape", ["ConfigError"], 3)],
               "fl.engine": [*GRAPH["fl.engine"], ("landscape", [], 5)]}
    assert sorted(facade_imports(planted)) == [
        "fl.engine:5 imports landscape through the facade",
        "landscape.connectivity.curves:3 imports ConfigError through the facade"]


def test_importing_figures_does_not_load_the_evaluator():
    code = "import sys, figures; print(sorted(m for m in sys.modules if m.startswith('landscape.evaluation')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.strip() == "[]", out


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
    """Above ``MAX_LINES`` a warning asks whether the module holds two concepts; above ``HARD_MAX_LINES`` it fails.

    Modules are split where their concepts part, not to meet a number: a module a little over the
    reading length that holds one concept stays whole, and the warning says so in the test report.
    """
    lines = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    where = MODULES[module].relative_to(ROOT)
    assert lines <= HARD_MAX_LINES, f"{where} has {lines} lines: split it where its concepts part"
    if lines > MAX_LINES:
        warnings.warn(f"{where} has {lines} lines (more than one sitting's {MAX_LINES}): split it if it holds "
                      "two concepts", UserWarning, stacklevel=1)
