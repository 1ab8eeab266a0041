"""Frozen result classes (numpy arrays plus the spec that produced them), grouped by domain.

* ``base`` -- :class:`Result` (cache records, summaries) and the registry of result types;
* ``geometry`` -- metrics, paths, groups, barrier matrices, planes;
* ``curvature`` -- Hessian eigenvalues, traces, densities, curvature along paths and planes;
* ``curvature_views`` -- the loss along a Hessian eigenvector, curvature per parameter block;
* ``decomposition`` -- the IMA decomposition, averaging curves, CKA matrices;
* ``sharpness`` -- worst-case sharpness in a ball around the weights.
"""
from .base import RESULT_TYPES, Result, register
from .curvature import (CurvaturePlane, CurvatureProfile, Eigenvalues, HessianEigen, SpectralDensity,
                        TraceEstimate)
from .curvature_views import BlockCurvature, EigenLine
from .decomposition import AveragingCurve, CKAMatrix, Decomposition
from .geometry import BarrierMatrix, GroupResult, Metrics, PathResult, PlaneResult
from .sharpness import SharpnessResult

__all__ = ["RESULT_TYPES", "AveragingCurve", "BarrierMatrix", "BlockCurvature", "CKAMatrix", "CurvaturePlane", "CurvatureProfile",
           "Decomposition", "EigenLine", "Eigenvalues", "GroupResult", "HessianEigen", "Metrics", "PathResult", "PlaneResult",
           "Result", "SharpnessResult", "SpectralDensity", "TraceEstimate",
           "register"]
