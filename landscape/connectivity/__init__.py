"""Mode connectivity beyond the straight line.

* :mod:`.graph` (with :mod:`.rules`, :mod:`.units`) -- permutation groups of any model, found
  from its traced ATen graph; :mod:`.permute` applies permutations.
* :mod:`.weight_matching`, :mod:`.activation_matching`, :mod:`.align` -- Git Re-Basin alignment
  of a model to a reference and of groups (MergeMany).
* :mod:`.repair` -- REPAIR and BatchNorm reset of interpolated models.
* :mod:`.shapes`, :mod:`.trainer`, :mod:`.curves`, :mod:`.simplex`, :mod:`.results` -- learned
  Bezier curves, polygonal chains and simplexes for any model.
* :mod:`.verdicts` -- "connected modulo permutation" and "connected by a curve".
* :mod:`.commands` -- entry points for command-line tools.
"""
from .align import Alignment, align, align_group, match
from .commands import align_file, curve_summary
from .curves import curve, curve_plane
from .graph import PermutationError, PermutationSpec, discover
from .permute import apply_permutation, random_permutations
from .repair import repaired_interpolate
from .results import CurveResult, SimplexResult
from .simplex import simplex
from .verdicts import connected_by_curve, connected_modulo_permutation, group_connected_modulo_permutation

__all__ = ["Alignment", "CurveResult", "PermutationError", "PermutationSpec", "SimplexResult", "align",
           "align_file", "align_group", "apply_permutation", "connected_by_curve", "connected_modulo_permutation",
           "curve", "curve_plane", "curve_summary", "discover", "group_connected_modulo_permutation", "match",
           "random_permutations",
           "repaired_interpolate", "simplex"]
