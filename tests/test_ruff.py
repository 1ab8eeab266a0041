"""The code base passes ruff with the rules configured in ``pyproject.toml`` (``[tool.ruff]``).

pyflakes (F), pycodestyle (E, W), import order (I) and pydocstyle in the numpy convention (D,
with D417: every parameter named in a ``Parameters`` section), 120 columns. ruff is in the
``test`` extra, so this test runs wherever the suite does.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Everything with Python source: the packages, the tests and the runnable scripts.
PATHS = ("landscape", "fl", "figures", "landscape_cli", "paper_claims", "tests", "examples", "benchmarks", "scripts")


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m ruff check --no-cache`` with ``args``, run from the repository root."""
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_code_base_is_clean() -> None:
    assert all((ROOT / p).is_dir() for p in PATHS)
    result = _ruff(*PATHS)
    assert result.returncode == 0, f"ruff found problems:\n{result.stdout}{result.stderr}"


def test_the_configured_rules_catch_a_planted_file(tmp_path: Path) -> None:
    bad = tmp_path / "planted.py"
    bad.write_text('"""A module."""\nimport sys\nimport os\n\n\ndef public(a: int) -> int:\n'
                   f'    return a  # {"x" * 120}\n\n\n'
                   'def documented(a: int, b: int) -> int:\n    """Sum.\n\n    Parameters\n    ----------\n'
                   '    a : int\n        A term.\n\n    Returns\n    -------\n    int\n    """\n    return a + b\n')
    result = _ruff("--config", str(ROOT / "pyproject.toml"), str(bad))
    codes = {line.split(" ")[1] for line in result.stdout.splitlines() if line.startswith(str(bad))}
    assert result.returncode == 1
    assert codes == {"I001", "F401", "D103", "E501", "D417"}, result.stdout
