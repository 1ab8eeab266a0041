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

from typing import Callable, TypeVar

from ..infra.errors import ConfigError
from ..infra.options import did_you_mean

F = TypeVar("F", bound=Callable)

#: name -> eigen-solver (k largest eigenpairs of a symmetric operator)
EIGEN_SOLVERS: dict[str, Callable] = {}
#: name -> trace estimator
TRACE_ESTIMATORS: dict[str, Callable] = {}
#: name -> curvature operator class (Hessian, GGN, Fisher, ...)
OPERATOR_KINDS: dict[str, Callable] = {}


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
#: ``@operator_kind("name")`` registers a curvature operator class
operator_kind = _registrar(OPERATOR_KINDS, "a curvature operator class")


def lookup(table: dict[str, Callable], name: str, what: str) -> Callable:
    """The method registered as ``name``, or a ConfigError listing the registered ones.

    Parameters
    ----------
    table
        :data:`EIGEN_SOLVERS`, :data:`TRACE_ESTIMATORS` or :data:`OPERATOR_KINDS`.
    name
        The method name.
    what
        What the table holds, for the message.

    Returns
    -------
    callable

    Raises
    ------
    ConfigError
        ``name`` is not registered (one line, with the closest registered name if any).
    """
    if name not in table:
        raise ConfigError(f"unknown {what} {name!r}{did_you_mean(name, table)}: use one of "
                          f"{', '.join(sorted(table))}")
    return table[name]
