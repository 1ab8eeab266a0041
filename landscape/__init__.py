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
* ``claims`` -- verdicts on the papers' claims.

The list is the order of the layers: a subpackage imports only itself and those above it in the
list (an import through this facade counts as one of the module defining the name);
``tests/test_layering.py`` checks it.
"""
from __future__ import annotations

import importlib
from typing import Any

#: public name -> module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    # infrastructure
    "LandscapeError": "infra.errors", "ArchitectureMismatchError": "infra.errors",
    "CacheError": "infra.errors", "CheckpointError": "infra.errors", "ConfigError": "infra.errors",
    "DataError": "infra.errors", "NonFiniteWeightsError": "infra.errors",
    "TrainingDivergedError": "infra.errors",
    "BatchNormWarning": "infra.errors", "NonFiniteLossWarning": "infra.errors",
    "FileWriteError": "infra.errors", "MetaDeviceError": "infra.errors", "WeightOverflowError": "infra.errors",
    "CurvatureError": "infra.errors",
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
    "curvature_along_path": "curvature.along", "curvature_plane": "curvature.along",
    "eigen_line": "curvature.views", "eigen_plane": "curvature.views", "curvature_by_block": "curvature.blocks",
    "EigenLine": "results.curvature_views", "BlockCurvature": "results.curvature_views",
    "sharpness": "curvature.sharpness", "SharpnessResult": "results.sharpness",
    # decomposition
    "decompose": "decomposition.ima", "decompose_run": "decomposition.ima",
    "averaging_curve": "decomposition.similarity", "cka_matrix": "decomposition.similarity",
    "linear_cka": "decomposition.similarity",
    # claims and results
    "Verdict": "claims.verdict",
    "Metrics": "results.geometry", "PathResult": "results.geometry", "GroupResult": "results.geometry",
    "BarrierMatrix": "results.geometry", "PlaneResult": "results.geometry",
    "PlaneDiagnostics": "results.plane_diagnostics",
    "HessianEigen": "results.curvature", "TraceEstimate": "results.curvature",
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
    "connected_modulo_permutation": "claims.connectivity", "connected_by_curve": "claims.connectivity",
    "group_connected_modulo_permutation": "claims.connectivity",
}

#: subpackages reachable as attributes (``landscape.claims.transitivity``)
_SUBPACKAGES = ("infra", "space", "evaluation", "alignment", "geometry", "curvature", "decomposition", "claims",
                "results", "cache", "connectivity")

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
