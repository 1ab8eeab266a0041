"""Loss-landscape and mode-connectivity analysis.

Public API (see API.md): :class:`Evaluator`, :func:`interpolate`, :func:`group_barrier`,
:func:`barrier_matrix`, :func:`plane`, :func:`random_plane`, :func:`pca_plane`, the Hessian
functions and :func:`decompose`, the result classes and :class:`Cache`.
"""
from . import claims
from .basin import BasinResult, basin
from .cache import Cache
from .checkpoints import load_state_dict, save_state_dict
from .errors import (ArchitectureMismatchError, CacheError, CheckpointError, ConfigError, DataError,
                     LandscapeError, NonFiniteWeightsError)
from .evaluator import Evaluator
from .groups import GroupSizeResult, group_barrier, group_barrier_by_size
from .params import ParameterSpace
from .paths import barrier_matrix, interpolate
from .planes import pca_plane, plane, random_plane
from .claims import Verdict
from .results import BarrierMatrix, GroupResult, Metrics, PathResult, PlaneResult

__all__ = [
    "ArchitectureMismatchError", "BarrierMatrix", "BasinResult", "Verdict", "basin", "claims", "Cache", "CacheError", "CheckpointError", "ConfigError",
    "DataError", "Evaluator", "GroupResult", "GroupSizeResult", "LandscapeError", "Metrics",
    "NonFiniteWeightsError", "ParameterSpace", "PathResult", "PlaneResult", "barrier_matrix",
    "group_barrier", "group_barrier_by_size", "interpolate", "load_state_dict", "pca_plane", "plane",
    "random_plane", "save_state_dict",
]

from .curvature import (curvature_along_path, curvature_plane, hessian_density, hessian_eigen,
                        hessian_eigenvalues, hessian_trace)
from .curvature_results import (AveragingCurve, CKAMatrix, CurvaturePlane, CurvatureProfile, Decomposition,
                                HessianEigen, SpectralDensity, TraceEstimate)
from .decomposition import averaging_curve, cka_matrix, decompose, decompose_run, linear_cka

__all__ += [
    "AveragingCurve", "CKAMatrix", "CurvaturePlane", "CurvatureProfile", "Decomposition", "HessianEigen",
    "SpectralDensity", "TraceEstimate", "averaging_curve", "cka_matrix", "curvature_along_path",
    "curvature_plane", "decompose", "decompose_run", "hessian_density", "hessian_eigen",
    "hessian_eigenvalues", "hessian_trace", "linear_cka",
]
