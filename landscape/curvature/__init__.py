"""Curvature: symmetric operators (the Hessian of an evaluator's loss), eigen-solvers, trace
estimators and spectral densities.

* ``operators`` -- the operator interface and the Hessian-vector products;
* ``registry`` -- eigen-solvers and trace estimators by name (a new method goes in a module
  here, decorated with ``@eigen_solver`` / ``@trace_estimator``);
* ``lanczos``, ``power`` -- eigen-solvers; ``trace`` -- trace estimators; ``density`` -- SLQ;
* ``functions`` -- the public functions at one point; ``along`` -- along paths and on planes.
* ``views`` -- the loss along the top eigenvectors; ``blocks`` -- curvature per block of parameters.
* ``sharpness`` -- worst-case sharpness in a ball around the weights (``landscape.sharpness``).
"""
from .along import curvature_along_path, curvature_plane
from .blocks import curvature_by_block
from .functions import hessian_density, hessian_eigen, hessian_eigenvalues, hessian_trace
from .views import eigen_line, eigen_plane

__all__ = ["curvature_along_path", "curvature_by_block", "curvature_plane", "eigen_line", "eigen_plane",
           "hessian_density", "hessian_eigen", "hessian_eigenvalues", "hessian_trace"]
