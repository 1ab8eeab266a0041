"""Curvature: operators, eigen-solvers, trace estimators and spectral densities.

The operators are the Hessian, GGN and Fisher of an evaluator's loss.

* ``linear`` -- the operator interface every solver sees, and explicit matrices;
* ``operators`` -- the curvature operator base class; the kinds, one file each with its options:
  ``hessian`` (Hessian-vector products), ``gauss_newton`` (the GGN and the Monte-Carlo Fisher),
  ``empirical_fisher``, ``kfac`` (K-FAC and EKFAC, with ``kronecker``: their per-layer statistics);
  ``at_point`` -- :func:`curvature_operator`, an operator of any kind at a
  model, its ``kind_options`` checked against the kind's declared options;
* ``registry`` -- eigen-solvers, trace estimators and operator kinds by name (a new method goes in
  a module here, decorated with ``@eigen_solver`` / ``@trace_estimator`` / ``@operator_kind``);
* ``lanczos``, ``power`` -- eigen-solvers; ``trace`` -- trace estimators; ``density`` -- SLQ; each
  takes any operator (``lanczos_top(op, k, generator=...)``, ``hutchpp(op, generator=...)``,
  ``slq(op, steps, runs, generator=...)``);
* ``inverse`` -- ``(C + damping I)^{-1} b`` by conjugate gradients; ``diagonal`` -- ``diag(C)``,
  Hutchinson's estimate or exact; both take any operator;
* ``functions`` -- the public functions at one point; ``along`` -- along paths and on planes.
* ``views`` -- the loss along the top eigenvectors; ``blocks`` -- curvature per block of parameters.
* ``sharpness`` -- worst-case sharpness in a ball around the weights (``landscape.sharpness``).
* ``distributed`` -- products summed over the ranks of a ``torch.distributed`` process group
  (:func:`distributed_operator`); ``distributed_launch`` -- starts the worker processes itself
  (:func:`distributed_curvature`, :func:`distributed_hessian_eigenvalues`).
"""
from .along import curvature_along_path, curvature_plane
from .at_point import curvature_operator
from .blocks import curvature_by_block
from .density import slq
from .diagonal import curvature_diagonal
from .distributed import distributed_operator
from .distributed_launch import distributed_curvature, distributed_hessian_eigenvalues
from .functions import hessian_density, hessian_eigen, hessian_eigenvalues, hessian_trace
from .inverse import inverse_product
from .lanczos import lanczos_top
from .power import power_iteration
from .trace import hutchinson, hutchpp
from .views import eigen_line, eigen_plane

__all__ = ["curvature_along_path", "curvature_by_block", "curvature_diagonal", "curvature_operator", "curvature_plane",
           "distributed_curvature", "distributed_hessian_eigenvalues", "distributed_operator", "eigen_line",
           "eigen_plane", "hessian_density", "hessian_eigen", "hessian_eigenvalues", "hessian_trace", "hutchinson",
           "hutchpp", "inverse_product", "lanczos_top", "power_iteration", "slq"]
