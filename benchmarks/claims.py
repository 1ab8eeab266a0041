"""Measure the papers' claims and write docs/claims.md: a thin entry to ``python -m paper_claims``.

Kept for the command lines of earlier pages; the measurement, its options and ``--dry-run``
live in the ``paper_claims`` package (``python -m paper_claims --help``).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout installed before the package existed

from paper_claims.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
