"""Checks of the papers' landscape claims on the user's own models; each returns a :class:`Verdict`.

``verdict`` holds the :class:`Verdict` and :func:`replicate` (a check over several seeds or
pairs, with the spread); ``checks`` the paper claims. Figures of a verdict's evidence are drawn
by ``figures.verdicts.verdict_figure``.
"""
from .checks import flatter, group_connectivity, shared_basin, transitivity
from .verdict import DEFAULT_THRESHOLD, Verdict, replicate

__all__ = ["DEFAULT_THRESHOLD", "Verdict", "flatter", "group_connectivity", "replicate", "shared_basin",
           "transitivity"]
