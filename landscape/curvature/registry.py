"""Registries of the curvature methods: eigen-solvers, trace estimators and operator kinds, by name.

A new method is one function in a module of this package, decorated with
:func:`eigen_solver` or :func:`trace_estimator`; a new kind of curvature operator is one subclass
of :class:`~landscape.curvature.operators.CurvatureOperator`, decorated with
:func:`operator_kind` (the ``kind=`` values and the CLI's ``--kind`` choices). The public functions
(:func:`~landscape.curvature.functions.hessian_eigen`, ``hessian_trace``) and the CLI's
``--method`` choices find it here. Every solver sees only the operator interface
(:class:`~landscape.curvature.linear.SymmetricOperator`), so it works on a Hessian and on an
explicit matrix alike.

Solver signature: ``solver(op, k, *, tol, max_iter, generator, return_vectors) -> Eigenpairs``.
Estimator signature: ``estimator(op, *, tol, max_iter, generator, min_samples) -> TraceEstimate``.
Operator kind: ``cls(evaluator, point, *, params, include_frozen, check_determinism, **options)``.
"""
from __future__ import annotations

from typing import Callable

from ..infra.registry import Registry

#: name -> eigen-solver (k largest eigenpairs of a symmetric operator)
EIGEN_SOLVERS: Registry[Callable] = Registry("eigen-solver", package=__package__)
#: name -> trace estimator
TRACE_ESTIMATORS: Registry[Callable] = Registry("trace estimator", package=__package__)
#: name -> curvature operator class (Hessian, GGN, Fisher, ...)
OPERATOR_KINDS: Registry[Callable] = Registry("curvature kind", package=__package__)

#: ``@eigen_solver("name")`` registers an eigen-solver (the ``method=`` value that selects it)
eigen_solver = EIGEN_SOLVERS.register
#: ``@trace_estimator("name")`` registers a trace estimator (the ``method=`` value that selects it)
trace_estimator = TRACE_ESTIMATORS.register
#: ``@operator_kind("name")`` registers a curvature operator class (the ``kind=`` value that selects it)
operator_kind = OPERATOR_KINDS.register
