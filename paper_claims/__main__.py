"""``python -m paper_claims``: the claims command (:mod:`paper_claims.cli`)."""
import sys

from .cli import main

sys.exit(main())
