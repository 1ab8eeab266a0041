"""Checks of the papers' landscape claims on the user's own models; each returns a :class:`Verdict`."""
from .verdicts import DEFAULT_THRESHOLD, Verdict, flatter, group_connectivity, shared_basin, transitivity

__all__ = ["DEFAULT_THRESHOLD", "Verdict", "flatter", "group_connectivity", "shared_basin", "transitivity"]
