"""Loss-landscape and mode-connectivity analysis.

The public names (see ``docs/api.md``) are loaded lazily (PEP 562): ``import landscape`` costs
almost nothing, and ``landscape.interpolate`` imports the geometry modules on first use. This lets
``fl`` and ``figures`` import the infrastructure layer (``landscape.infra``) and the parameter
utilities (``landscape.space``) without loading the analysis core.

Layout (one subpackage per concept):

* ``infra`` -- errors, atomic and link-safe file writes, parallel back ends, digests, devices.
* ``space`` -- parameter spaces (models as flat vectors), point sets, checkpoint loading.
* ``results`` -- frozen result classes, grouped by domain, and the barrier formulas.
* ``cache`` -- the HDF5 result cache.
* ``evaluation`` -- the :class:`Evaluator`: options, losses, BatchNorm modes, loop/vmap strategies,
  exact CPU shortcuts, sharded evaluation.
* ``alignment`` -- permutation alignment (Git Re-Basin) of models and groups.
* ``geometry`` -- linear paths, planes, groups of models, basins.
* ``curvature`` -- curvature operators (Hessian, GGN, Fisher), eigen-solvers, trace estimators, spectral
  densities, sharpness.
* ``decomposition`` -- the IMA bias-variance-covariance decomposition and representation similarity.
* ``connectivity`` -- REPAIR, learned curves and simplexes.
* ``merging`` -- model merging (soups, task arithmetic, TIES, DARE, SLERP) checked on the landscape.
* ``claims`` -- verdicts on the papers' claims.

The list is the order of the layers: a subpackage imports only itself and those above it in the
list (an import through this facade counts as one of the module defining the name);
``tests/test_layering.py`` checks it.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    # infrastructure
    "LandscapeError": "infra.errors", "ArchitectureMismatchError": "infra.errors",
    "CacheError": "infra.errors", "CheckpointError": "infra.errors", "ConfigError": "infra.errors",
    "DataError": "infra.errors", "NonFiniteWeightsError": "infra.errors",
    "TrainingDivergedError": "infra.errors",
    "BatchNormWarning": "infra.errors", "NonFiniteLossWarning": "infra.errors",
    "FileWriteError": "infra.errors", "MetaDeviceError": "infra.errors", "WeightOverflowError": "infra.errors",
    "CurvatureError": "infra.errors", "DistributedError": "infra.errors",
    "JobEstimate": "infra.estimate",
    # parameter spaces and checkpoints
    "ParameterSpace": "space.params", "load_state_dict": "space.checkpoints",
    "save_state_dict": "space.checkpoints",
    # evaluation
    "Evaluator": "evaluation.evaluator",
    # geometry
    "interpolate": "geometry.paths", "barrier_matrix": "geometry.paths",
    "plane": "geometry.planes", "random_plane": "geometry.planes", "pca_plane": "geometry.planes",
    "group_barrier": "geometry.groups", "group_barrier_by_size": "geometry.groups",
    "GroupSizeResult": "results.group_size", "basin": "geometry.basin", "BasinResult": "results.basin",
    # curvature
    "hessian_eigen": "curvature.functions", "hessian_eigenvalues": "curvature.functions",
    "hessian_trace": "curvature.functions", "hessian_density": "curvature.functions",
    "curvature_operator": "curvature.at_point",
    "inverse_product": "curvature.inverse", "curvature_diagonal": "curvature.diagonal",
    "curvature_along_path": "curvature.along", "curvature_plane": "curvature.along",
    "eigen_line": "curvature.views", "eigen_plane": "curvature.views", "curvature_by_block": "curvature.blocks",
    "EigenLine": "results.curvature_views", "BlockCurvature": "results.curvature_views",
    "sharpness": "curvature.sharpness", "SharpnessResult": "results.sharpness",
    # decomposition
    "decompose": "decomposition.ima", "decompose_run": "decomposition.ima",
    "averaging_curve": "decomposition.similarity", "cka_matrix": "decomposition.similarity",
    "linear_cka": "decomposition.similarity",
    # claims and results
    "Verdict": "claims.verdict", "Outcome": "claims.outcome",
    "Metrics": "results.geometry", "PathResult": "results.geometry", "GroupResult": "results.geometry",
    "BarrierMatrix": "results.geometry", "PlaneResult": "results.geometry",
    "PlaneDiagnostics": "results.plane_diagnostics",
    "HessianEigen": "results.curvature", "TraceEstimate": "results.curvature",
    "InverseProduct": "results.curvature", "DiagonalEstimate": "results.curvature",
    "SpectralDensity": "results.curvature", "CurvatureProfile": "results.curvature",
    "CurvaturePlane": "results.curvature", "Eigenvalues": "results.curvature",
    "Decomposition": "results.decomposition", "AveragingCurve": "results.decomposition",
    "CKAMatrix": "results.decomposition",
    # cache
    "Cache": "cache.store",
    # connectivity: permutation alignment, REPAIR, learned curves and simplexes (docs/connectivity.md)
    "align": "alignment.align", "align_group": "alignment.align", "curve": "connectivity.curves",
    "simplex": "connectivity.simplex", "repaired_interpolate": "connectivity.repair",
    "CurveResult": "results.connectivity", "SimplexResult": "results.connectivity",
    "PermutationError": "alignment.graph",
    "check_alignment": "alignment.check", "AlignmentCheck": "results.alignment",
    "connected_modulo_permutation": "claims.connectivity", "connected_by_curve": "claims.connectivity",
    "group_connected_modulo_permutation": "claims.connectivity",
    # merging (docs/merging.md)
    "merge": "merging.merge", "MergeResult": "results.merging",
}

if TYPE_CHECKING:  # the lazy exports spelled out for type checkers (tests/test_public_names.py)
    from .alignment.align import align, align_group
    from .alignment.check import check_alignment
    from .alignment.graph import PermutationError
    from .cache.store import Cache
    from .claims.connectivity import (
        connected_by_curve,
        connected_modulo_permutation,
        group_connected_modulo_permutation,
    )
    from .claims.outcome import Outcome
    from .claims.verdict import Verdict
    from .connectivity.curves import curve
    from .connectivity.repair import repaired_interpolate
    from .connectivity.simplex import simplex
    from .curvature.along import curvature_along_path, curvature_plane
    from .curvature.at_point import curvature_operator
    from .curvature.blocks import curvature_by_block
    from .curvature.diagonal import curvature_diagonal
    from .curvature.functions import hessian_density, hessian_eigen, hessian_eigenvalues, hessian_trace
    from .curvature.inverse import inverse_product
    from .curvature.sharpness import sharpness
    from .curvature.views import eigen_line, eigen_plane
    from .decomposition.ima import decompose, decompose_run
    from .decomposition.similarity import averaging_curve, cka_matrix, linear_cka
    from .evaluation.evaluator import Evaluator
    from .geometry.basin import basin
    from .geometry.groups import group_barrier, group_barrier_by_size
    from .geometry.paths import barrier_matrix, interpolate
    from .geometry.planes import pca_plane, plane, random_plane
    from .infra.errors import (
        ArchitectureMismatchError,
        BatchNormWarning,
        CacheError,
        CheckpointError,
        ConfigError,
        CurvatureError,
        DataError,
        DistributedError,
        FileWriteError,
        LandscapeError,
        MetaDeviceError,
        NonFiniteLossWarning,
        NonFiniteWeightsError,
        TrainingDivergedError,
        WeightOverflowError,
    )
    from .infra.estimate import JobEstimate
    from .merging.merge import merge
    from .results.alignment import AlignmentCheck
    from .results.basin import BasinResult
    from .results.connectivity import CurveResult, SimplexResult
    from .results.curvature import (
        CurvaturePlane,
        CurvatureProfile,
        DiagonalEstimate,
        Eigenvalues,
        HessianEigen,
        InverseProduct,
        SpectralDensity,
        TraceEstimate,
    )
    from .results.curvature_views import BlockCurvature, EigenLine
    from .results.decomposition import AveragingCurve, CKAMatrix, Decomposition
    from .results.geometry import BarrierMatrix, GroupResult, Metrics, PathResult, PlaneResult
    from .results.group_size import GroupSizeResult
    from .results.merging import MergeResult
    from .results.plane_diagnostics import PlaneDiagnostics
    from .results.sharpness import SharpnessResult
    from .space.checkpoints import load_state_dict, save_state_dict
    from .space.params import ParameterSpace

#: subpackages reachable as attributes (``landscape.claims.transitivity``)
_SUBPACKAGES = ("infra", "space", "evaluation", "alignment", "geometry", "curvature", "decomposition", "claims",
                "results", "cache", "connectivity", "merging")

__all__ = sorted(_EXPORTS) + ["claims"]


def __getattr__(name: str) -> Any:
    """Import a public name (or a subpackage) on first access (PEP 562)."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'landscape' has no attribute {name!r}")


def __dir__() -> list[str]:
    """Public names, for tab completion."""
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBPACKAGES))
