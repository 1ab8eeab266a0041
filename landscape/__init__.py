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

try:  # curvature and decomposition (landscape/curvature.py, landscape/decomposition.py)
    from .curvature import hessian_density, hessian_eigenvalues, hessian_trace  # noqa: F401
    from .decomposition import decompose  # noqa: F401
    __all__ += ["hessian_density", "hessian_eigenvalues", "hessian_trace", "decompose"]
except ImportError:  # pragma: no cover - only while those modules are being written
    pass
