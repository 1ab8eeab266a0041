"""Permutation alignment of models (Git Re-Basin, Ainsworth et al. 2023; Entezari et al. 2022).

* :mod:`.graph` (with :mod:`.rules`, :mod:`.units`, :mod:`.spec`) -- permutation groups of any
  model, found from its traced ATen graph, plus those of multi-head attention blocks
  (:mod:`.attention`: heads, query/key and value/output dimensions); :mod:`.permute` applies
  permutations.
* :mod:`.weight_matching`, :mod:`.activation_matching`, :mod:`.align` -- alignment of a model to
  a reference and of groups (MergeMany).

This layer sits below :mod:`landscape.geometry` (``interpolate(..., align=...)`` and
``group_barrier(..., align=...)`` align their endpoints with it) and above the evaluator.
"""
from .align import Alignment, align, align_group, match
from .graph import PermutationError, PermutationSpec, discover
from .permute import apply_permutation, random_permutations

__all__ = ["Alignment", "PermutationError", "PermutationSpec", "align", "align_group", "apply_permutation",
           "discover", "match", "random_permutations"]
