"""Checks of the papers' landscape claims on the user's own models; each returns a :class:`Verdict`.

``outcome`` holds the one verdict vocabulary, :class:`Outcome`; ``verdict`` the :class:`Verdict`
and :func:`replicate` (a check over several seeds or pairs, with the spread); ``checks`` the
paper claims; ``connectivity`` "connected modulo permutation" and "connected by a curve".
Figures of a verdict's evidence are drawn by ``figures.verdicts.verdict_figure``.
"""
from ..results.barriers import DEFAULT_THRESHOLD
from .checks import flatter, group_connectivity, shared_basin, transitivity
from .connectivity import connected_by_curve, connected_modulo_permutation, group_connected_modulo_permutation
from .outcome import Outcome
from .verdict import Verdict, replicate

__all__ = ["DEFAULT_THRESHOLD", "Outcome", "Verdict", "connected_by_curve", "connected_modulo_permutation", "flatter",
           "group_connected_modulo_permutation", "group_connectivity", "replicate", "shared_basin", "transitivity"]
