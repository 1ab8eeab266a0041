"""Mode connectivity beyond the straight line.

* :mod:`.repair` -- REPAIR and BatchNorm reset of interpolated models.
* :mod:`.shapes`, :mod:`.trainer`, :mod:`.curves`, :mod:`.simplex`, :mod:`.results` -- learned
  Bezier curves, polygonal chains and simplexes for any model.

Permutation alignment (Git Re-Basin) lives one layer lower, in :mod:`landscape.alignment`, so
that linear paths and group barriers can align their endpoints; its public names are also
importable from here. The verdicts "connected modulo permutation" and "connected by a curve"
are claims: :mod:`landscape.claims.connectivity`.
"""
from ..alignment.align import Alignment, align, align_group, match
from ..alignment.check import check_alignment
from ..alignment.graph import PermutationError, PermutationSpec, discover
from ..alignment.permute import apply_permutation, random_permutations
from ..results.alignment import AlignmentCheck
from ..results.connectivity import CurveResult, SimplexResult
from .curves import curve, curve_plane
from .repair import repaired_interpolate
from .simplex import simplex

__all__ = ["Alignment", "AlignmentCheck", "CurveResult", "PermutationError", "PermutationSpec", "SimplexResult",
           "align", "align_group", "apply_permutation", "check_alignment", "curve", "curve_plane", "discover", "match",
           "random_permutations", "repaired_interpolate", "simplex"]
