"""Curvature: Hessian-vector-product operators, eigen-solvers, trace estimators and spectral densities."""
from .functions import (curvature_along_path, curvature_plane, hessian_density, hessian_eigen,
                        hessian_eigenvalues, hessian_trace)

__all__ = ["curvature_along_path", "curvature_plane", "hessian_density", "hessian_eigen",
           "hessian_eigenvalues", "hessian_trace"]
