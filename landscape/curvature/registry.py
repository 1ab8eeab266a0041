"""Registries of the curvature methods: eigen-solvers and trace estimators, by name.

A new method is one function in a module of this package, decorated with
:func:`eigen_solver` or :func:`trace_estimator`; the public functions
(:func:`~landscape.curvature.functions.hessian_eigen`, ``hessian_trace``) and the CLI's
``--method`` choices find it here. Every solver sees only the operator interface
(:class:`~landscape.curvature.operators.SymmetricOperator`), so it works on a Hessian and on an
explicit matrix alike.

Solver signature: ``solver(op, k, *, tol, max_iter, generator, return_vectors) -> Eigenpairs``.
Estimator signature: ``estimator(op, *, tol, max_iter, generator, min_samples) -> TraceEstimate``.
"""
from __future__ import annotations

from typing import Callable, TypeVar

from ..infra.errors import ConfigError

F = TypeVar("F", bound=Callable)

#: name -> eigen-solver (k largest eigenpairs of a symmetric operator)
EIGEN_SOLVERS: dict[str, Callable] = {}
#: name -> trace estimator
TRACE_ESTIMATORS: dict[str, Callable] = {}


def _registrar(table: dict[str, Callable], what: str) -> Callable[[str], Callable[[F], F]]:
    def decorator(name: str) -> Callable[[F], F]:
        def register(fn: F) -> F:
            table[name] = fn
            return fn
        return register
    decorator.__doc__ = f"""Register {what} under ``name`` (the ``method=`` value that selects it).

    Parameters
    ----------
    name
        The method name.

    Returns
    -------
    callable
        A decorator returning the function unchanged.
    """
    return decorator


#: ``@eigen_solver("name")`` registers an eigen-solver
eigen_solver = _registrar(EIGEN_SOLVERS, "an eigen-solver")
#: ``@trace_estimator("name")`` registers a trace estimator
trace_estimator = _registrar(TRACE_ESTIMATORS, "a trace estimator")


def lookup(table: dict[str, Callable], name: str, what: str) -> Callable:
    """The method registered as ``name``, or a ConfigError listing the registered ones.

    Parameters
    ----------
    table
        :data:`EIGEN_SOLVERS` or :data:`TRACE_ESTIMATORS`.
    name
        The method name.
    what
        What the table holds, for the message.

    Returns
    -------
    callable
    """
    if name not in table:
        raise ConfigError(f"unknown {what} {name!r}: use one of {', '.join(sorted(table))}")
    return table[name]
