"""The public names of ``landscape`` as type checkers see them equal the names it exports lazily."""
from __future__ import annotations

import ast
from pathlib import Path

import landscape

SOURCE = Path(landscape.__file__)


def type_checking_imports() -> dict[str, str]:
    """Name -> module (relative to the package) of the imports under ``if TYPE_CHECKING:``."""
    tree = ast.parse(SOURCE.read_text())
    blocks = [node for node in tree.body if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
              and node.test.id == "TYPE_CHECKING"]
    assert len(blocks) == 1, "landscape/__init__.py has one `if TYPE_CHECKING:` block"
    out: dict[str, str] = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for alias in node.names:
            assert alias.asname is None
            out[alias.name] = node.module or ""
    return out


def test_the_type_checking_mirror_equals_the_lazy_exports() -> None:
    mirror = type_checking_imports()
    lazy = dict(landscape._EXPORTS)  # noqa: SLF001 - the package's own table, read by its own test
    assert sorted(set(lazy) - set(mirror)) == [], "exported lazily but invisible to type checkers"
    assert sorted(set(mirror) - set(lazy)) == [], "seen by type checkers but not exported"
    assert {n: m for n, m in mirror.items() if lazy[n] != m} == {}, "a name comes from another module"


def test_every_mirrored_name_resolves_to_the_object_the_facade_returns() -> None:
    import importlib

    for name, module in type_checking_imports().items():
        assert getattr(importlib.import_module(f"landscape.{module}"), name) is getattr(landscape, name)
