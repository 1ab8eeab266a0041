"""Permutation alignment of models (Git Re-Basin, Ainsworth et al. 2023; Entezari et al. 2022).

* :mod:`.graph` (with :mod:`.rules`, :mod:`.units`, :mod:`.spec`) -- permutation groups of any
  model, found from its traced ATen graph, plus those of multi-head attention blocks
  (:mod:`.attention`: heads, query/key and value/output dimensions); :mod:`.permute` applies
  permutations.
* :mod:`.weight_matching`, :mod:`.activation_matching`, :mod:`.align` -- alignment of a model to
  a reference and of groups (MergeMany).
* :mod:`.check` -- whether alignment is valid for an architecture: a random permutation of every
  traced group must leave the outputs unchanged; the units no group permutes, and why.
* :mod:`.state_aligner` -- weight matching of state_dicts, registered in
  :mod:`landscape.infra.state_aligners` on import, for the layers (and the FL engine) below this one.

This layer sits below :mod:`landscape.geometry` (``interpolate(..., align=...)`` and
``group_barrier(..., align=...)`` align their endpoints with it) and above the evaluator.
"""
from .align import Alignment, align, align_group, match
from .check import check_alignment
from .graph import PermutationError, PermutationSpec, discover
from .permute import apply_permutation, random_permutations
from .state_aligner import WeightAligner

__all__ = ["Alignment", "PermutationError", "PermutationSpec", "WeightAligner", "align", "align_group",
           "apply_permutation", "check_alignment", "discover", "match", "random_permutations"]
