"""Frozen result classes (numpy arrays plus the spec that produced them), grouped by domain.

* ``base`` -- :class:`Result` (cache records, summaries) and the registry of result types;
* ``barriers`` -- the barrier formulas (FedGuCci Eq. 3/4, 9/10) on metric arrays;
* ``geometry`` -- metrics, paths, groups, barrier matrices, planes (``plane_diagnostics``, ``vtk``);
* ``group_size`` -- group barriers against the group size; ``basin`` -- basin analyses;
* ``connectivity`` -- learned curves and simplexes (``curve_shapes``: their coefficients);
* ``curvature`` -- Hessian eigenvalues, traces, densities, curvature along paths and planes;
* ``curvature_views`` -- the loss along a Hessian eigenvector, curvature per parameter block;
* ``decomposition`` -- the IMA decomposition, averaging curves, CKA matrices;
* ``sharpness`` -- worst-case sharpness in a ball around the weights;
* ``merging`` -- a merged model and its measurements on the landscape;
* ``alignment`` -- whether permutation alignment is valid for an architecture (a permutation check);
* ``tracking`` -- the landscape measures a federated run recorded at its tracked rounds (``fl.Track``).
"""
from .alignment import AlignmentCheck
from .base import RESULT_TYPES, Result, register
from .basin import BasinResult
from .connectivity import CurveResult, SimplexResult
from .curvature import CurvaturePlane, CurvatureProfile, Eigenvalues, HessianEigen, SpectralDensity, TraceEstimate
from .curvature_views import BlockCurvature, EigenLine
from .decomposition import AveragingCurve, CKAMatrix, Decomposition
from .geometry import BarrierMatrix, GroupResult, Metrics, PathResult, PlaneResult
from .group_size import GroupSizeResult
from .merging import MergeResult
from .sharpness import SharpnessResult
from .tracking import TrackTable

__all__ = ["RESULT_TYPES", "AlignmentCheck", "AveragingCurve", "BarrierMatrix", "BasinResult", "BlockCurvature",
           "CKAMatrix", "CurvaturePlane", "CurvatureProfile", "CurveResult", "Decomposition", "EigenLine",
           "Eigenvalues", "GroupResult", "GroupSizeResult", "HessianEigen", "MergeResult", "Metrics", "PathResult",
           "PlaneResult", "Result", "SharpnessResult", "SimplexResult", "SpectralDensity", "TraceEstimate",
           "TrackTable", "register"]
